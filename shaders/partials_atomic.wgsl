// row_stats_verify's chunk partials (binding 5): twelve words per (row, chunk), the fields of
// RowStats in order, stored and loaded as atomics. The last workgroup of a request reads the
// partials the request's other workgroups wrote, and WGSL orders memory between workgroups only
// through atomics (with the device-scope barriers around the count, as block_wide_settle does).
// After the partials, from word `params.settle_base`: one count per request (row_stats_verify.wgsl).
@group(0) @binding(5) var<storage, read_write> partial_words: array<atomic<u32>>;

// Stores chunk partial i (row-major, num_chunks per row).
fn store_partial(i: u32, st: RowStats) {
    let w = 12u * i;
    atomicStore(&partial_words[w], bitcast<u32>(st.t_max));
    atomicStore(&partial_words[w + 1u], bitcast<u32>(st.t_sum));
    atomicStore(&partial_words[w + 2u], st.t_arg);
    atomicStore(&partial_words[w + 3u], st.flags);
    atomicStore(&partial_words[w + 4u], bitcast<u32>(st.t_at_d));
    atomicStore(&partial_words[w + 5u], bitcast<u32>(st.q_max));
    atomicStore(&partial_words[w + 6u], bitcast<u32>(st.q_sum));
    atomicStore(&partial_words[w + 7u], bitcast<u32>(st.q_at_d));
    atomicStore(&partial_words[w + 8u], bitcast<u32>(st.raw_max));
    atomicStore(&partial_words[w + 9u], bitcast<u32>(st.raw_sum));
    atomicStore(&partial_words[w + 10u], bitcast<u32>(st.t_ent));
    atomicStore(&partial_words[w + 11u], bitcast<u32>(st.rho));
}

// Chunk partial i, as store_partial wrote it (verify_request.wgsl reads the partials through it).
fn load_partial(i: u32) -> RowStats {
    let w = 12u * i;
    var st: RowStats;
    st.t_max = bitcast<f32>(atomicLoad(&partial_words[w]));
    st.t_sum = bitcast<f32>(atomicLoad(&partial_words[w + 1u]));
    st.t_arg = atomicLoad(&partial_words[w + 2u]);
    st.flags = atomicLoad(&partial_words[w + 3u]);
    st.t_at_d = bitcast<f32>(atomicLoad(&partial_words[w + 4u]));
    st.q_max = bitcast<f32>(atomicLoad(&partial_words[w + 5u]));
    st.q_sum = bitcast<f32>(atomicLoad(&partial_words[w + 6u]));
    st.q_at_d = bitcast<f32>(atomicLoad(&partial_words[w + 7u]));
    st.raw_max = bitcast<f32>(atomicLoad(&partial_words[w + 8u]));
    st.raw_sum = bitcast<f32>(atomicLoad(&partial_words[w + 9u]));
    st.t_ent = bitcast<f32>(atomicLoad(&partial_words[w + 10u]));
    st.rho = bitcast<f32>(atomicLoad(&partial_words[w + 11u]));
    return st;
}

// row_stats_verify's chunk partials (binding 5): twelve words per (row, chunk), the fields of
// RowStats in order, stored and loaded as atomics. The last workgroup of a request reads the
// partials the request's other workgroups wrote. WGSL's atomics are relaxed and its
// storageBarrier is workgroup-scoped, so the language alone does not promise that the last
// workgroup sees them; what does is how naga translates the barriers around the count
// (docs/design.md, "The last workgroup's handoff"), as for block_wide_settle.
// Only the words some decision reads are stored and loaded: an atomic access is never dropped by
// the compiler, and the merge's chain of folds waits for its loads. Draft softmaxes only with
// draft logits, raw sums and entropy numerators only in the pipelines that keep them (never
// built here today: the host takes verify's dispatch for them), the drafted token's values only
// from the one chunk that holds them (load_drafted_values), ρ never (verify writes it to merged
// rows). Fields not loaded are left at 0 (q_max at -inf, as row_stats leaves it without draft
// logits); nothing reads them where they are not loaded.
// After the partials, from word `params.settle_base`: one count per request (row_stats_verify.wgsl).
@group(0) @binding(5) var<storage, read_write> partial_words: array<atomic<u32>>;

// verify_request's fold_run takes fold_run8 (a run's loads at once, its folds without branches):
// a partial here is the 4 to 6 words a decision reads (row_stats_verify on an H200: R = 1
// sampled batches 0.98x).
const BRANCHLESS_RUN_FOLDS: bool = true;

// Stores chunk partial i (row-major, num_chunks per row).
fn store_partial(i: u32, st: RowStats) {
    let w = 12u * i;
    atomicStore(&partial_words[w], bitcast<u32>(st.t_max));
    atomicStore(&partial_words[w + 1u], bitcast<u32>(st.t_sum));
    atomicStore(&partial_words[w + 2u], st.t_arg);
    atomicStore(&partial_words[w + 3u], st.flags);
    atomicStore(&partial_words[w + 4u], bitcast<u32>(st.t_at_d));
    atomicStore(&partial_words[w + 7u], bitcast<u32>(st.q_at_d));
    if (params.draft_kind == DRAFT_LOGITS) {
        atomicStore(&partial_words[w + 5u], bitcast<u32>(st.q_max));
        atomicStore(&partial_words[w + 6u], bitcast<u32>(st.q_sum));
    }
    if (RAW_SUMS) {
        atomicStore(&partial_words[w + 8u], bitcast<u32>(st.raw_max));
        atomicStore(&partial_words[w + 9u], bitcast<u32>(st.raw_sum));
    }
    if (ENTROPY) {
        atomicStore(&partial_words[w + 10u], bitcast<u32>(st.t_ent));
    }
}

// Chunk partial i's fields that the merge folds, as store_partial wrote them.
fn load_partial(i: u32) -> RowStats {
    let w = 12u * i;
    var st: RowStats;
    st.t_max = bitcast<f32>(atomicLoad(&partial_words[w]));
    st.t_sum = bitcast<f32>(atomicLoad(&partial_words[w + 1u]));
    st.t_arg = atomicLoad(&partial_words[w + 2u]);
    st.flags = atomicLoad(&partial_words[w + 3u]);
    st.q_max = bitcast<f32>(NEG_INF_BITS);
    if (params.draft_kind == DRAFT_LOGITS) {
        st.q_max = bitcast<f32>(atomicLoad(&partial_words[w + 5u]));
        st.q_sum = bitcast<f32>(atomicLoad(&partial_words[w + 6u]));
    }
    if (RAW_SUMS) {
        st.raw_max = bitcast<f32>(atomicLoad(&partial_words[w + 8u]));
        st.raw_sum = bitcast<f32>(atomicLoad(&partial_words[w + 9u]));
    }
    if (ENTROPY) {
        st.t_ent = bitcast<f32>(atomicLoad(&partial_words[w + 10u]));
    }
    return st;
}

// Chunk partial i's values at the drafted token (target, draft).
fn load_drafted_values(i: u32) -> vec2<f32> {
    let w = 12u * i;
    return vec2<f32>(
        bitcast<f32>(atomicLoad(&partial_words[w + 4u])),
        bitcast<f32>(atomicLoad(&partial_words[w + 7u])),
    );
}

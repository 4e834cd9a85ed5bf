// verify_runs_lanes — where row_stats_verify's tail keeps verify_request's row-run folds in
// the pipelines past SHARED_RUNS_FROM_CHUNKS chunks (src/gpu/shape.rs, `SPECIAL_SHARED_RUNS`):
// row_stats' lane arrays (sh_*), free once the workgroup's own chunks are done (the count's
// workgroupUniformLoad is a barrier after their last use). Every workgroup of the pass
// allocates the workgroup memory the module declares, though only the last of each request
// runs the tail: without an array of its own for the folds (3 KB), an H200 verified batches of
// 1,280-1,520 chunks here at 0.93-1.00x of verify's own dispatch, and at 1.07-1.17x with it,
// even where the array sat in a branch the pipeline's constants ruled out. Smaller batches keep
// verify_runs_own.wgsl, 1.01x faster there. The fields are those load_partial loads; the others
// are 0, as it leaves them.

fn put_run(i: u32, st: RowStats) {
    sh_m[i] = st.t_max;
    sh_s[i] = st.t_sum;
    sh_a[i] = st.t_arg;
    sh_f[i] = st.flags;
    sh_qm[i] = st.q_max;
    sh_qs[i] = st.q_sum;
    sh_wm[i] = st.raw_max;
    sh_ws[i] = st.raw_sum;
    sh_e[i] = st.t_ent;
}

fn run_at(i: u32) -> RowStats {
    var st: RowStats;
    st.t_max = sh_m[i];
    st.t_sum = sh_s[i];
    st.t_arg = sh_a[i];
    st.flags = sh_f[i];
    st.q_max = sh_qm[i];
    st.q_sum = sh_qs[i];
    st.raw_max = sh_wm[i];
    st.raw_sum = sh_ws[i];
    st.t_ent = sh_e[i];
    return st;
}

// verify_runs_own — where verify_request keeps its row-run folds (one a lane, 64): an array of
// their own. Appended to verify and to row_stats_verify's pipelines of at most
// SHARED_RUNS_FROM_CHUNKS chunks (src/gpu/shape.rs); verify_runs_lanes.wgsl is the other choice.
var<workgroup> run_sh: array<RowStats, 64>;

fn put_run(i: u32, st: RowStats) {
    run_sh[i] = st;
}

fn run_at(i: u32) -> RowStats {
    return run_sh[i];
}

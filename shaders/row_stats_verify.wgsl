// row_stats_verify — row_stats' `block`, and the last workgroup of each request verifies it.
// CPU twins: src/cpu/row_stats.rs, then src/cpu/verify.rs. Pipeline label:
// specdec.row_stats_verify.block_verify.
//
// The module is row_stats.wgsl (the statistics, unchanged: the same chunks in the same order,
// so the same partials), partials_atomic.wgsl (the partials as atomic words),
// verify_request.wgsl (verify's `main`, as a function), put_logprobs.wgsl and the row-run
// folds' slots (verify_runs_own.wgsl, or verify_runs_lanes.wgsl past SHARED_RUNS_FROM_CHUNKS
// chunks), then this entry. Each workgroup computes its chunks' partials as `block` does, then
// counts itself for its request (a count per request after the partials, which the host zeroes
// before the pass). The workgroup that brings the count to the request's total, stats_blocks x
// its rows, verifies the request exactly as verify's `main` would: the same merge of the
// partials in the statistics contract's order, the same decisions, the same tasks, rows and
// output. The host then dispatches no verify: one dispatch boundary and verify's own chain of
// loads fewer per call (as block_wide_settle does for all-greedy batches). The host takes this
// kernel only where the device binds its fourteen storage buffers (`Shape::verify_in_stats`).

// The bindings verify_request.wgsl names besides requests (binding 3, row_stats.wgsl): verify's
// draft ids, rates, tasks, output, merged rows and block masses.
@group(0) @binding(9) var<storage, read> draft_ids: array<i32>;
@group(0) @binding(10) var<storage, read> rates: array<f32>;
@group(0) @binding(11) var<storage, read_write> tasks: array<Task>;
@group(0) @binding(12) var<storage, read_write> out_words: array<u32>;
@group(0) @binding(13) var<storage, read_write> row_stats: array<RowStats>;
@group(0) @binding(14) var<storage, read> masses: array<f32>;

// verify_request's lanes: `block_verify`'s 64.
const VERIFY_WG: u32 = 64u;

var<workgroup> rv_last: u32;

@compute @workgroup_size(64)
fn block_verify(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let job = row_job(wid.x, wid.y);
    stats_chunks(job, lane);
    let r = row_info[job.row].x;
    let rows = requests[r].num_drafts + 1u;
    // Publish this workgroup's partials, then count it; the last of the request's
    // stats_blocks x rows workgroups goes on.
    storageBarrier();
    if (lane == 0u) {
        let done = atomicAdd(&partial_words[params.settle_base + r], 1u) + 1u;
        rv_last = select(0u, 1u, done == params.stats_blocks * rows);
    }
    if (workgroupUniformLoad(&rv_last) == 0u) {
        return;
    }
    storageBarrier();
    verify_request(r, lane);
}

// verify — merges each row's chunk statistics, then verifies the request (SPEC §3 rules 1–6).
// CPU twin: src/cpu/verify.rs. Pipeline labels: specdec.verify.main / .block_settle.
// One workgroup of 64 per request. Each row's decision depends on that row alone, so the lanes
// take the rows in parallel: merge the chunk partials (in runs of chunks, the statistics contract
// of common.wgsl; a lane per run, then a lane per row) into `row_stats`, decide the draft, and record the first rejection with an atomic
// minimum. Then lane 0 settles the row where the request stopped (requests whose rows all fit one
// group of the merge settle from its registers, settle_from_registers). The kernel never reads the
// logits, so its cost does not grow with the vocabulary.
//
// Draft i: greedy requests accept iff d_i == argmax; synthetic ones iff u_i < rate_i; the
// others iff u_i · q_i(d_i) < p_i(d_i) (rule 2; q = 1 for one-hot drafts). A -1 draft, q(d) = 0
// or NaN, and a non-finite target row always reject. The request stops at the first draft not
// accepted: greedy requests emit the argmax there, the rest leave a Task for the residual pass
// (only that one row is ever resampled). All accepted: the bonus row gets the same treatment.
// The status describes the row where the request stopped.
//
// Block requests (rule 5) decide jointly from ρ_j (stored in row_stats[row].rho) and the
// masses R_j. With one-hot drafts R_j has a closed form and `main` decides at once. With a draft
// distribution `main` only stores ρ and marks the task TASK_PENDING_BLOCK; block_mass.wgsl sums
// R_j, and the `block_settle` entry (one workgroup of 64 per request, idle for the others)
// decides and settles exactly as `main` would.
//
// Output layout (u32 words):  [ tokens: R × out_stride (i32, -1 padded) | num_emitted: R | status: R ]

// `params` (binding 0, or immediate data): params_uniform.wgsl / params_immediate.wgsl.
@group(0) @binding(1) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(2) var<storage, read> chunk_stats: array<RowStats>;
@group(0) @binding(3) var<storage, read> draft_ids: array<i32>;
@group(0) @binding(4) var<storage, read> rates: array<f32>;
@group(0) @binding(5) var<storage, read_write> tasks: array<Task>;
@group(0) @binding(6) var<storage, read_write> out_words: array<u32>;
@group(0) @binding(7) var<storage, read_write> row_stats: array<RowStats>;
// Chunk partials of the block masses R_j (block_mass.wgsl), read by block_settle only.
@group(0) @binding(8) var<storage, read> masses: array<f32>;

// Pipeline specialisations, as in row_stats (the same SPECIAL_* bits pick them): RAW_SUMS merges
// the raw sums (raw logprobs), ENTROPY the entropy numerators (typical acceptance). Off, their
// rescaling (an exp per chunk each) is not compiled in: the merge is a chain of dependent folds,
// so every exp in it adds latency to each request.
override RAW_SUMS: bool = false;
override ENTROPY: bool = false;

// WIDE (all-greedy batches whose requests have many chunk partials): `main` takes the device's
// workgroup size, so the greedy merge's loops wait out fewer rounds of loads (a memory latency
// each). Otherwise 64 lanes, as the ordered merge's runs take (8 runs of at most 8 rows).
override WIDE: bool = false;
override VERIFY_WG: u32 = select(64u, max(WG, 64u), WIDE);

// A partial here is a whole 48-byte RowStats: fold_run8 (a run's loads at once) made verify's
// pass slower, 10.3-12.3 -> 13.7-15.8 us at R = 8, k = 8, V = 151,936 on an H200, so verify
// folds `fold` by `fold` after rounds of 4 loads.
const BRANCHLESS_RUN_FOLDS: bool = false;

// Chunk partial i, as row_stats wrote it (verify_request.wgsl reads the partials through it).
fn load_partial(i: u32) -> RowStats {
    return chunk_stats[i];
}

// Chunk partial i's values at the drafted token (target, draft).
fn load_drafted_values(i: u32) -> vec2<f32> {
    let holder = chunk_stats[i];
    return vec2<f32>(holder.t_at_d, holder.q_at_d);
}

// The merge, the decisions and the settling: verify_request.wgsl, with put_logprobs.wgsl and
// verify_runs_own.wgsl (appended to this file).

@compute @workgroup_size(VERIFY_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    verify_request(wid.x, lane);
}

// Block requests with a draft distribution, after block_mass: every lane computes the same τ,
// then the request is settled as `main` settles the others. Every lane reads the task before
// the barrier: lane 0's settle_stop rewrites it, and a lane of a group that ran later would
// otherwise find the request settled and leave its output slots unwritten (seen on lavapipe,
// which runs 8 lanes at a time: slots 8 and up of a request with 9 or more).
@compute @workgroup_size(64)
fn block_settle(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let r = wid.x;
    let pending = tasks[r].kind == TASK_PENDING_BLOCK;
    storageBarrier();
    if (!pending) {
        return;
    }
    let info = requests[r];
    settle(r, lane, 64u, info, block_stop(info), true);
}

// ---- Tree batches (crate::tree; CPU: src/cpu/tree.rs) ----------------------------------------
//
// For a tree batch `draft_ids` is bound to the tree table and `rates` to the tree values that
// block_mass.wgsl's `tree` entry filled (layouts there and in src/gpu/tree.rs); `num_drafts` of a
// request is its node count, row `row_offset + s` is its slot s (the root, then node s − 1).
//
// `tree_merge`: one workgroup per request, lanes over its rows: each row's chunk partials merged
// into row_stats (nothing drafted per row: a row's children are read by `tree`).
// `tree_walk`: one workgroup per request, lane 0 only (a walk is a few dozen scalar steps): from
// the root, the children of the current slot are tried in order under the request's rule, the
// first accepted one becomes the current slot; where none is, the walk stops and leaves the
// residual pass a task, a ρ (row_stats[row].rho) and a race header. Accept uniform of the j-th
// child tried at depth d: word j of the accept stream at position + d.

@compute @workgroup_size(64)
fn tree_merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    merge_tree_rows(wid.x, lane);
}

// Request r's rows' chunk partials merged into row_stats, the lanes taking the rows in turn.
fn merge_tree_rows(r: u32, lane: u32) {
    let info = requests[r];
    let greedy = (info.flags & REQ_GREEDY) != 0u;
    for (var i = lane; i <= info.num_drafts; i += 64u) {
        let row = info.row_offset + i;
        row_stats[row] = merge_row(row, -1, !greedy, info.inv_temperature);
    }
}

// `tree_merge` and `tree_walk` in one dispatch, for batches with no masses to sum in between
// (children without q, or greedy requests only): one dispatch fewer, as a chain has.
@compute @workgroup_size(64)
fn tree_merge_walk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    merge_tree_rows(wid.x, lane);
    storageBarrier();
    workgroupBarrier();
    if (lane == 0u) {
        walk_tree(wid.x);
    }
}

fn tree_word(i: u32) -> u32 {
    return bitcast<u32>(draft_ids[i]);
}

// First word of the accepted-nodes region (after the packed output); the race headers follow
// it at + R × out_stride, the children's tokens at + 8 R after those.
fn tree_scratch() -> u32 {
    var base = params.num_requests * params.out_stride + 2u * params.num_requests;
    if ((params.flags & PARAM_LOGPROBS) != 0u) {
        base += 2u * params.num_requests * params.out_stride;
    }
    return base;
}

// The outcome at one slot: the accepted child's slot (NO_INDEX: none), and what the residual
// pass then samples from.
struct TreeStep {
    next: u32,
    kind: u32,
    rho: f32,
    excluded: u32,
    status: u32,
}

// p(y) of a child's logit l at a row, as p_at_draft computes it.
fn tree_p(info: ReqInfo, st: RowStats, l: f32) -> f32 {
    return exp((l - st.t_max) * info.inv_temperature) / st.t_sum;
}

fn tree_u(info: ReqInfo, pos: vec2<u32>, j: u32) -> f32 {
    return uniform_open(random_words(info, pos, STREAM_ACCEPT, j / 4u)[j % 4u]);
}

// The children of slot row `g` (first `cb`, `cc` of them), tried in order (the non-greedy rules).
fn tree_try(info: ReqInfo, g: u32, st: RowStats, pos: vec2<u32>, cb: u32, cc: u32) -> TreeStep {
    var step = TreeStep(NO_INDEX, TASK_FROM_TARGET, 1.0, 0u, 0u);
    let children = 8u * params.total_rows;
    if (cc == 0u) {
        return step;
    }
    if (params.draft_kind == DRAFT_NONE) {
        // p(c_j) under p with the earlier siblings removed: u · (1 − Σ p(c_i)) < p(c_j).
        var removed = 0.0;
        for (var j = 0u; j < cc; j += 1u) {
            let c = tree_word(children + cb + j);
            let p = tree_p(info, st, rates[3u * c]);
            if (tree_u(info, pos, j) * (1.0 - removed) < p) {
                step.next = c;
                return step;
            }
            removed = removed + p;
        }
        step.kind = TASK_ONE_HOT_RESIDUAL;
        step.excluded = cc;
        return step;
    }
    if (params.draft_kind == DRAFT_LOGITS && draft_row_nonfinite(st)) {
        step.status = STATUS_DRAFT_NONFINITE;
        return step;
    }
    var rho = 1.0;
    for (var j = 0u; j < cc; j += 1u) {
        let c = tree_word(children + cb + j);
        let token = tree_word(8u * c + 4u);
        let p = tree_p(info, st, rates[3u * c]);
        var q = 0.0;
        if (params.draft_kind == DRAFT_PROBS) {
            q = sanitize_prob(rates[3u * c + 1u]);
        } else if (token < params.draft_vocab) {
            q = exp((rates[3u * c + 1u] - st.q_max) * info.inv_temperature) / st.q_sum;
        }
        let u = tree_u(info, pos, j);
        var accept = false;
        if (j == 0u) {
            accept = q > 0.0 && u * q < p;
        } else {
            let mass = rates[3u * c + 2u];
            if (is_nan(mass) || mass <= 0.0) {
                break; // the residual is empty: the race falls back to p
            }
            accept = q > 0.0 && u * q * mass < max(rho * p - q, 0.0);
            if (!accept) {
                rho = rho / (1.0 + mass);
            }
        }
        if (accept) {
            step.next = c;
            return step;
        }
    }
    step.kind = TASK_BLOCK_RESIDUAL;
    step.rho = rho;
    return step;
}

@compute @workgroup_size(64)
fn tree_walk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    if (lane == 0u) {
        walk_tree(wid.x);
    }
}

// The walk of request r (see above), by one invocation.
fn walk_tree(r: u32) {
    let info = requests[r];
    let greedy = (info.flags & REQ_GREEDY) != 0u;
    let children = 8u * params.total_rows;
    let nodes = tree_scratch();
    var g = info.row_offset;
    var count = 0u;
    var step = TreeStep(NO_INDEX, TASK_NONE, 1.0, 0u, 0u);
    var final_token = -1;
    var final_lp = nan_pair();
    loop {
        let st = row_stats[g];
        let cb = tree_word(8u * g + 2u);
        let cc = tree_word(8u * g + 3u);
        if (row_nonfinite(st)) {
            step = TreeStep(NO_INDEX, TASK_NONE, 1.0, 0u, STATUS_ALL_MASKED);
            if ((st.flags & (ROW_T_NAN | ROW_T_POSINF)) != 0u) {
                step.status = STATUS_TARGET_NONFINITE;
            }
            final_token = i32(st.t_arg);
            break;
        }
        if (greedy) {
            step = TreeStep(NO_INDEX, TASK_NONE, 1.0, 0u, 0u);
            for (var j = 0u; j < cc; j += 1u) {
                let c = tree_word(children + cb + j);
                if (tree_word(8u * c + 4u) == st.t_arg) {
                    step.next = c;
                    break;
                }
            }
            if (step.next == NO_INDEX) {
                final_token = i32(st.t_arg);
                final_lp = logprobs_of(info, st, st.t_max);
            }
        } else {
            step = tree_try(info, g, st, row_position(info, tree_word(8u * g + 1u)), cb, cc);
        }
        if (step.next == NO_INDEX) {
            break;
        }
        let slot = info.out_offset + count;
        out_words[slot] = tree_word(8u * step.next + 4u);
        put_logprobs(slot, logprobs_of(info, st, rates[3u * step.next]));
        out_words[nodes + slot] = step.next - info.row_offset - 1u;
        count += 1u;
        g = step.next;
    }
    // The emitted slot (the residual pass fills a sampled token and its logprobs), padding.
    let last = info.out_offset + count;
    out_words[last] = bitcast<u32>(final_token);
    put_logprobs(last, final_lp);
    for (var j = count; j < params.out_stride; j += 1u) {
        if (j > count) {
            put_padding(info, j);
        }
        out_words[nodes + info.out_offset + j] = bitcast<u32>(-1);
    }
    row_stats[g].rho = step.rho;
    tasks[r] = Task(step.kind, g - info.row_offset, -1, last);
    let header = nodes + params.num_requests * params.out_stride + 8u * r;
    out_words[header] = tree_word(8u * g + 1u);
    out_words[header + 1u] = select(STREAM_RESIDUAL, STREAM_BONUS, tree_word(8u * g + 3u) == 0u);
    out_words[header + 2u] = tree_word(8u * g + 5u);
    out_words[header + 3u] = tree_word(8u * g + 2u);
    out_words[header + 4u] = step.excluded;
    let base = params.num_requests * params.out_stride;
    out_words[base + r] = count + 1u;
    out_words[base + params.num_requests + r] = step.status;
}

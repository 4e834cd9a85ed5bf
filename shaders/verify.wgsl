// verify — merges each row's chunk statistics, then runs the per-request verification loop
// (SPEC §3 rules 1–4). CPU twin: src/cpu/verify.rs. Pipeline label: specdec.verify.main.
// One workgroup of 64 per request: the lanes merge the request's rows (chunk partials folded in
// chunk order, the statistics contract of common.wgsl) into `row_stats`, then lane 0 runs the
// loop. It never reads the logits, so its cost is independent of the vocabulary size.
//
// For each draft i in order: greedy requests accept iff d_i == argmax; synthetic ones iff
// u_i < rate_i; the others iff u_i · q_i(d_i) < p_i(d_i) (rule 2; q = 1 for one-hot drafts). A -1
// draft, q(d) = 0 or NaN, and a non-finite target row always reject. At the first rejection the
// request stops: greedy requests emit the argmax here, the rest leave a Task for the residual
// pass (only that one row is ever resampled). All accepted: the bonus row gets the same treatment.
//
// Output layout (u32 words):  [ tokens: R × out_stride (i32, -1 padded) | num_emitted: R | status: R ]

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(2) var<storage, read> chunk_stats: array<RowStats>;
@group(0) @binding(3) var<storage, read> draft_ids: array<i32>;
@group(0) @binding(4) var<storage, read> rates: array<f32>;
@group(0) @binding(5) var<storage, read_write> tasks: array<Task>;
@group(0) @binding(6) var<storage, read_write> out_words: array<u32>;
@group(0) @binding(7) var<storage, read_write> row_stats: array<RowStats>;

// Rescaled sum of one side of a merge; a -inf side contributes nothing (avoids -inf - -inf).
fn rescale(m: f32, s: f32, m_new: f32, inv_t: f32) -> f32 {
    if (is_neg_inf(m)) {
        return 0.0;
    }
    return s * exp((m - m_new) * inv_t);
}

// Folds the chunk partials of `row` in chunk order; the drafted token's values come from the
// chunk that holds it.
fn merge_row(row: u32, drafted: i32, with_sum: bool, inv_t: f32) -> RowStats {
    var acc = chunk_stats[row * params.num_chunks];
    for (var c = 1u; c < params.num_chunks; c += 1u) {
        let o = chunk_stats[row * params.num_chunks + c];
        let m_new = max(acc.t_max, o.t_max);
        if (with_sum) {
            acc.t_sum = rescale(acc.t_max, acc.t_sum, m_new, inv_t) + rescale(o.t_max, o.t_sum, m_new, inv_t);
        }
        if (o.t_max > acc.t_max || (o.t_max == acc.t_max && o.t_arg < acc.t_arg)) {
            acc.t_arg = o.t_arg;
        }
        acc.t_max = m_new;
        let qm_new = max(acc.q_max, o.q_max);
        acc.q_sum = rescale(acc.q_max, acc.q_sum, qm_new, inv_t) + rescale(o.q_max, o.q_sum, qm_new, inv_t);
        acc.q_max = qm_new;
        acc.flags |= o.flags;
    }
    if (acc.t_arg == NO_INDEX) {
        acc.t_arg = 0u;
    }
    if (drafted >= 0) {
        let holder = chunk_stats[row * params.num_chunks + u32(drafted) / CHUNK];
        acc.t_at_d = holder.t_at_d;
        acc.q_at_d = holder.q_at_d;
    }
    return acc;
}

fn row_nonfinite(st: RowStats) -> bool {
    return (st.flags & (ROW_T_NAN | ROW_T_POSINF)) != 0u || is_neg_inf(st.t_max);
}

fn draft_row_nonfinite(st: RowStats) -> bool {
    return (st.flags & (ROW_Q_NAN | ROW_Q_POSINF)) != 0u || is_neg_inf(st.q_max);
}

// A draft probability is usable when it is finite and >= 0; anything else counts as 0.
fn sanitize_prob(x: f32) -> f32 {
    if (is_nan(x) || is_pos_inf(x) || x < 0.0) {
        return 0.0;
    }
    return x;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let r = wid.x;
    let info = requests[r];
    let k = info.num_drafts;
    let greedy = (info.flags & REQ_GREEDY) != 0u;
    for (var i = lane; i <= k; i += 64u) {
        var drafted = -1;
        if (i < k) {
            drafted = draft_ids[info.draft_offset + i];
        }
        row_stats[info.row_offset + i] = merge_row(info.row_offset + i, drafted, !greedy, info.inv_temperature);
    }
    storageBarrier();
    workgroupBarrier();
    if (lane != 0u) {
        return;
    }
    let synthetic = (info.flags & REQ_SYNTHETIC) != 0u;
    let inv_t = info.inv_temperature;

    var status = 0u;
    var accepted = 0u;
    var task = Task(TASK_NONE, 0u, -1, 0u);
    var final_token = -1;
    var stopped = false;
    for (var i = 0u; i < k; i += 1u) {
        let st = row_stats[info.row_offset + i];
        if (row_nonfinite(st)) {
            status |= STATUS_TARGET_NONFINITE;
            final_token = i32(st.t_arg);
            stopped = true;
            break;
        }
        let d = draft_ids[info.draft_offset + i];
        // Draft logits with NaN / +inf (or all -inf) give no usable q: such a row rejects and
        // the request resamples from p.
        var q_usable = true;
        if (!greedy && params.draft_kind == DRAFT_LOGITS && draft_row_nonfinite(st)) {
            status |= STATUS_DRAFT_NONFINITE;
            q_usable = false;
        }
        var accept = false;
        if ((info.flags & REQ_FAULT_REJECT_ALL) != 0u) {
            accept = false;
        } else if (synthetic) {
            let u = uniform_open(random_words(info, row_position(info, i), STREAM_ACCEPT, 0u).x);
            accept = d >= 0 && u < rates[info.draft_offset + i];
        } else if (greedy) {
            accept = d >= 0 && u32(d) == st.t_arg;
        } else {
            var p_d = 0.0;
            if (d >= 0) {
                p_d = exp((st.t_at_d - st.t_max) * inv_t) / st.t_sum;
            }
            var q_d = 1.0;
            if (params.draft_kind == DRAFT_PROBS) {
                q_d = sanitize_prob(st.q_at_d);
            } else if (params.draft_kind == DRAFT_LOGITS) {
                if (!q_usable) {
                    q_d = 0.0;
                } else if (d >= 0 && u32(d) < params.draft_vocab) {
                    q_d = exp((st.q_at_d - st.q_max) * inv_t) / st.q_sum;
                } else {
                    q_d = 0.0;
                }
            }
            let u = uniform_open(random_words(info, row_position(info, i), STREAM_ACCEPT, 0u).x);
            // Rule 2: accept iff u · q(d) < p(d); q(d) = 0 (or NaN, sanitised to 0) rejects.
            accept = d >= 0 && q_d > 0.0 && u * q_d < p_d;
        }
        if (!accept) {
            stopped = true;
            if (greedy) {
                final_token = i32(st.t_arg);
            } else if ((info.flags & REQ_FAULT_REJECT_ALL) != 0u || d < 0 || !q_usable) {
                task = Task(TASK_FROM_TARGET, i, d, 0u);
            } else if (params.draft_kind == DRAFT_NONE) {
                task = Task(TASK_ONE_HOT_RESIDUAL, i, d, 0u);
            } else {
                task = Task(TASK_DRAFT_RESIDUAL, i, d, 0u);
            }
            break;
        }
        out_words[info.out_offset + i] = bitcast<u32>(d);
        accepted += 1u;
    }
    if (!stopped) {
        let st = row_stats[info.row_offset + k];
        if (row_nonfinite(st)) {
            status |= STATUS_TARGET_NONFINITE;
            final_token = i32(st.t_arg);
        } else if (greedy) {
            final_token = i32(st.t_arg);
        } else {
            task = Task(TASK_FROM_TARGET, k, -1, 0u);
        }
    }
    task.slot = info.out_offset + accepted;
    tasks[r] = task;
    // Every slot is written: accepted drafts, the emitted token (or -1 until the residual pass
    // fills it), then -1 padding.
    out_words[info.out_offset + accepted] = bitcast<u32>(final_token);
    for (var j = accepted + 1u; j < params.out_stride; j += 1u) {
        out_words[info.out_offset + j] = bitcast<u32>(-1);
    }
    let base = params.num_requests * params.out_stride;
    out_words[base + r] = accepted + 1u;
    out_words[base + params.num_requests + r] = status;
}

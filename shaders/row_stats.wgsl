// row_stats — one pass over every target row (and draft-logit row) of a window, per vocab block.
// CPU twin: src/cpu/row_stats.rs. Pipeline labels: specdec.row_stats.block / specdec.row_stats.merge.
//
// Dispatch `block`: x = vocab block, y = row within the window. Each invocation walks its block
// with stride WG (coalesced loads), keeping an online (max, Σexp, argmax); the workgroup then
// folds its lanes with a tree (lane i takes lane i+s for s = WG/2 .. 1), and lane 0 writes the
// block's RowStats. Dispatch `merge`: one invocation per global row folds its blocks in order.
//
// NaN rules (the same in the twin): a NaN logit counts as -inf for max / argmax / Σexp and sets
// ROW_T_NAN; +inf sets ROW_T_POSINF. A row with either flag, or whose max is -inf (all -inf),
// is non-finite: the verify pass stops the request there and emits the row's argmax.
// Argmax ties go to the lowest index; an all -inf / NaN row reports index 0.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> target_logits: array<f32>;
@group(0) @binding(2) var<storage, read> draft_values: array<f32>;
@group(0) @binding(3) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(4) var<storage, read> row_info: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> block_stats: array<RowStats>;
@group(0) @binding(6) var<storage, read_write> row_stats: array<RowStats>;

// Online softmax state of one lane: max m, s = Σ exp((x - m) * inv_t), argmax a, flags.
struct Acc {
    m: f32,
    s: f32,
    a: u32,
    flags: u32,
}

var<workgroup> sh_m: array<f32, MAX_WG>;
var<workgroup> sh_s: array<f32, MAX_WG>;
var<workgroup> sh_a: array<u32, MAX_WG>;
var<workgroup> sh_f: array<u32, MAX_WG>;
var<workgroup> sh_qm: array<f32, MAX_WG>;
var<workgroup> sh_qs: array<f32, MAX_WG>;

fn acc_new() -> Acc {
    return Acc(bitcast<f32>(NEG_INF_BITS), 0.0, NO_INDEX, 0u);
}

// Adds x (at index y, visited in increasing y within a lane) to the state.
// `with_sum` is false for greedy rows: only max / argmax are needed, no exp.
fn acc_push(acc: Acc, x: f32, y: u32, inv_t: f32, with_sum: bool, nan_flag: u32, inf_flag: u32) -> Acc {
    var r = acc;
    if (is_nan(x)) {
        r.flags |= nan_flag;
        return r;
    }
    if (is_pos_inf(x)) {
        r.flags |= inf_flag;
    }
    if (x > r.m) {
        if (with_sum) {
            r.s = r.s * exp((r.m - x) * inv_t) + 1.0;
        }
        r.m = x;
        r.a = y;
    } else if (with_sum && !is_neg_inf(x)) {
        r.s += exp((x - r.m) * inv_t);
    }
    return r;
}

// Rescaled sum of one side of a merge; a -inf side contributes nothing (avoids -inf - -inf).
fn rescale(m: f32, s: f32, m_new: f32, inv_t: f32) -> f32 {
    if (is_neg_inf(m)) {
        return 0.0;
    }
    return s * exp((m - m_new) * inv_t);
}

// argmax merge: larger value wins, equal values go to the lower index.
fn takes_other(m_self: f32, a_self: u32, m_other: f32, a_other: u32) -> bool {
    return m_other > m_self || (m_other == m_self && a_other < a_self);
}

@compute @workgroup_size(WG)
fn block(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let block_id = wid.x;
    let local_row = wid.y;
    let row = params.row_begin + local_row;
    let info4 = row_info[row];
    let req = requests[info4.x];
    let k_row = info4.y;
    let drafted = bitcast<i32>(info4.z);
    let greedy = (req.flags & REQ_GREEDY) != 0u;
    let inv_t = req.inv_temperature;
    let with_sum = !greedy;
    // Draft logits are reduced alongside the target row when the row scores a draft.
    let has_q_row = params.draft_kind == DRAFT_LOGITS && k_row < req.num_drafts && !greedy;

    let begin = block_id * params.block_len;
    let end = min(begin + params.block_len, params.vocab);
    let t_base = params.t_elem_base + local_row * params.vocab;
    let d_row = info4.w;
    let d_base = params.d_elem_base + (d_row - params.d_row_begin) * params.draft_vocab;

    var t = acc_new();
    var q = acc_new();
    for (var y = begin + lane; y < end; y += WG) {
        t = acc_push(t, target_logits[t_base + y], y, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF);
        if (has_q_row && y < params.draft_vocab) {
            q = acc_push(q, draft_values[d_base + y], y, inv_t, true, ROW_Q_NAN, ROW_Q_POSINF);
        }
    }
    sh_m[lane] = t.m;
    sh_s[lane] = t.s;
    sh_a[lane] = t.a;
    sh_f[lane] = t.flags | q.flags;
    sh_qm[lane] = q.m;
    sh_qs[lane] = q.s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            let o = lane + stride;
            let m_new = max(sh_m[lane], sh_m[o]);
            if (with_sum) {
                sh_s[lane] = rescale(sh_m[lane], sh_s[lane], m_new, inv_t) + rescale(sh_m[o], sh_s[o], m_new, inv_t);
            }
            if (takes_other(sh_m[lane], sh_a[lane], sh_m[o], sh_a[o])) {
                sh_a[lane] = sh_a[o];
            }
            sh_m[lane] = m_new;
            sh_f[lane] = sh_f[lane] | sh_f[o];
            if (has_q_row) {
                let qm_new = max(sh_qm[lane], sh_qm[o]);
                sh_qs[lane] = rescale(sh_qm[lane], sh_qs[lane], qm_new, inv_t) + rescale(sh_qm[o], sh_qs[o], qm_new, inv_t);
                sh_qm[lane] = qm_new;
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        var out: RowStats;
        out.t_max = sh_m[0];
        out.t_sum = sh_s[0];
        out.t_arg = sh_a[0];
        out.flags = sh_f[0];
        out.q_max = sh_qm[0];
        out.q_sum = sh_qs[0];
        out.t_at_d = 0.0;
        out.q_at_d = 0.0;
        // The values at the drafted token come from the one block that holds it.
        if (drafted >= 0 && u32(drafted) >= begin && u32(drafted) < end) {
            let dt = u32(drafted);
            out.t_at_d = target_logits[t_base + dt];
            if (params.draft_kind != DRAFT_NONE && dt < params.draft_vocab) {
                out.q_at_d = draft_values[d_base + dt];
            }
        }
        block_stats[row * params.num_blocks + block_id] = out;
    }
}

@compute @workgroup_size(WG)
fn merge(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    if (row >= params.total_rows) {
        return;
    }
    let info4 = row_info[row];
    let req = requests[info4.x];
    let drafted = bitcast<i32>(info4.z);
    let inv_t = req.inv_temperature;
    let with_sum = (req.flags & REQ_GREEDY) == 0u;
    var acc = block_stats[row * params.num_blocks];
    for (var b = 1u; b < params.num_blocks; b += 1u) {
        let o = block_stats[row * params.num_blocks + b];
        let m_new = max(acc.t_max, o.t_max);
        if (with_sum) {
            acc.t_sum = rescale(acc.t_max, acc.t_sum, m_new, inv_t) + rescale(o.t_max, o.t_sum, m_new, inv_t);
        }
        if (takes_other(acc.t_max, acc.t_arg, o.t_max, o.t_arg)) {
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
        let holder = block_stats[row * params.num_blocks + u32(drafted) / params.block_len];
        acc.t_at_d = holder.t_at_d;
        acc.q_at_d = holder.q_at_d;
    }
    row_stats[row] = acc;
}

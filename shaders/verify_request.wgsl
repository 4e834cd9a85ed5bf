// verify_request — one request's verification, shared by verify.wgsl (`main`: a workgroup per
// request after row_stats) and row_stats_verify.wgsl (the last row_stats workgroup of each
// request). What it does and the rules: verify.wgsl's header. The including module declares
// the bindings it names (params, requests, draft_ids, rates, tasks, out_words, row_stats,
// masses), the RAW_SUMS / ENTROPY overrides, `load_partial(i)`: chunk partial i (row-major,
// num_chunks per row) as row_stats wrote it, at least the fields the merge folds, and
// `load_drafted_values(i)`: its values at the drafted token (t_at_d, q_at_d), and the workgroup
// slots of the row-run folds (one a lane, 64): `put_run(i, st)` and `run_at(i)`, which gives back
// at least the fields `fold` reads and load_partial's t_at_d / q_at_d, and the constant
// `BRANCHLESS_RUN_FOLDS` (fold_run).

// Folds chunk partial `o` into `acc` (chunk order: `acc` holds the chunks before `o`).
fn fold(acc_in: RowStats, o: RowStats, with_sum: bool, inv_t: f32) -> RowStats {
    var acc = acc_in;
    let m_new = max(acc.t_max, o.t_max);
    if (with_sum) {
        // (t_ent is 0 on rows that do not keep it, and stays 0 here.)
        if (ENTROPY) {
            acc.t_ent = rescale_ent(acc.t_max, acc.t_sum, acc.t_ent, m_new, inv_t) + rescale_ent(o.t_max, o.t_sum, o.t_ent, m_new, inv_t);
        }
        acc.t_sum = rescale(acc.t_max, acc.t_sum, m_new, inv_t) + rescale(o.t_max, o.t_sum, m_new, inv_t);
    }
    // takes_other's rule (common.wgsl) written out: through the function, row_stats_verify's
    // second text took 1.11-1.13x at R = 8, k = 4, V = 151,936 on an H200 (docs/performance.md).
    if (o.t_max > acc.t_max || (o.t_max == acc.t_max && o.t_arg < acc.t_arg)) {
        acc.t_arg = o.t_arg;
    }
    acc.t_max = m_new;
    // Only draft logits have a softmax to merge (q_max / q_sum are unused otherwise).
    if (params.draft_kind == DRAFT_LOGITS) {
        let qm_new = max(acc.q_max, o.q_max);
        acc.q_sum = rescale(acc.q_max, acc.q_sum, qm_new, inv_t) + rescale(o.q_max, o.q_sum, qm_new, inv_t);
        acc.q_max = qm_new;
    }
    if (RAW_SUMS) {
        let wm_new = max(acc.raw_max, o.raw_max);
        acc.raw_sum = rescale(acc.raw_max, acc.raw_sum, wm_new, 1.0) + rescale(o.raw_max, o.raw_sum, wm_new, 1.0);
        acc.raw_max = wm_new;
    }
    acc.flags |= o.flags;
    return acc;
}

// Chunks per run of a row's fold (the statistics contract, common.wgsl): at least 8, and at
// most 8 runs per row.
fn run_len() -> u32 {
    return max(8u, (params.num_chunks + 7u) / 8u);
}

// Folds chunk partials [c0, c1) of `row` in chunk order. Where the including module's
// BRANCHLESS_RUN_FOLDS is set, a run of at most 8 chunks (every run of a row of at most 64
// chunks, V <= 262,144) without raw sums or entropy folds through fold_run8; otherwise loads go
// out 4 at a time before they are folded, so a run costs a few memory latencies, not one per
// chunk.
fn fold_run(row: u32, c0: u32, c1: u32, with_sum: bool, inv_t: f32) -> RowStats {
    let base = row * params.num_chunks;
    if (BRANCHLESS_RUN_FOLDS && !RAW_SUMS && !ENTROPY && c1 - c0 <= 8u) {
        return fold_run8(base + c0, c1 - c0, with_sum, inv_t);
    }
    var acc = load_partial(base + c0);
    var c = c0 + 1u;
    for (; c + 4u <= c1; c += 4u) {
        let o0 = load_partial(base + c);
        let o1 = load_partial(base + c + 1u);
        let o2 = load_partial(base + c + 2u);
        let o3 = load_partial(base + c + 3u);
        acc = fold(acc, o0, with_sum, inv_t);
        acc = fold(acc, o1, with_sum, inv_t);
        acc = fold(acc, o2, with_sum, inv_t);
        acc = fold(acc, o3, with_sum, inv_t);
    }
    for (; c < c1; c += 1u) {
        acc = fold(acc, load_partial(base + c), with_sum, inv_t);
    }
    return acc;
}

// fold_run for a run of n <= 8 partials from partial `first`: the same operations as n - 1
// folds, in the same order, written without branches: the running maxima first (a max each),
// then the sums, whose exps depend on the maxima alone, then the argmax rule and the flags.
// All 8 loads go out first; past n the last partial is loaded again and not folded (select
// keeps the state). Fold by fold through `fold`, a run's folds cost row_stats_verify's tail
// about 1.5 us at R = 1 on an H200; this form took the call 0.98x (docs/performance.md).
// The target and draft sides share run_maxima8 and run_sum8 (arrays indexed by constants
// only, so they stay in registers; timed against the sides written out in full,
// docs/performance.md).
fn fold_run8(first: u32, n: u32, with_sum: bool, inv_t: f32) -> RowStats {
    let last = first + n - 1u;
    var acc = load_partial(first);
    let p1 = load_partial(min(first + 1u, last));
    let p2 = load_partial(min(first + 2u, last));
    let p3 = load_partial(min(first + 3u, last));
    let p4 = load_partial(min(first + 4u, last));
    let p5 = load_partial(min(first + 5u, last));
    let p6 = load_partial(min(first + 6u, last));
    let p7 = load_partial(min(first + 7u, last));
    let v = array<bool, 8>(true, n > 1u, n > 2u, n > 3u, n > 4u, n > 5u, n > 6u, n > 7u);
    let t_maxes = array<f32, 8>(acc.t_max, p1.t_max, p2.t_max, p3.t_max, p4.t_max, p5.t_max, p6.t_max, p7.t_max);
    let m = run_maxima8(t_maxes, v);
    if (with_sum) {
        let t_sums = array<f32, 8>(acc.t_sum, p1.t_sum, p2.t_sum, p3.t_sum, p4.t_sum, p5.t_sum, p6.t_sum, p7.t_sum);
        acc.t_sum = run_sum8(t_sums, t_maxes, m, inv_t, v);
    }
    var a = acc.t_arg;
    a = arg_step(m[0], a, p1, v[1]);
    a = arg_step(m[1], a, p2, v[2]);
    a = arg_step(m[2], a, p3, v[3]);
    a = arg_step(m[3], a, p4, v[4]);
    a = arg_step(m[4], a, p5, v[5]);
    a = arg_step(m[5], a, p6, v[6]);
    a = arg_step(m[6], a, p7, v[7]);
    acc.t_arg = a;
    acc.t_max = m[7];
    if (params.draft_kind == DRAFT_LOGITS) {
        let q_maxes = array<f32, 8>(acc.q_max, p1.q_max, p2.q_max, p3.q_max, p4.q_max, p5.q_max, p6.q_max, p7.q_max);
        let q_sums = array<f32, 8>(acc.q_sum, p1.q_sum, p2.q_sum, p3.q_sum, p4.q_sum, p5.q_sum, p6.q_sum, p7.q_sum);
        let qm = run_maxima8(q_maxes, v);
        acc.q_sum = run_sum8(q_sums, q_maxes, qm, inv_t, v);
        acc.q_max = qm[7];
    }
    acc.flags |= select(0u, p1.flags, v[1]) | select(0u, p2.flags, v[2]) | select(0u, p3.flags, v[3])
        | select(0u, p4.flags, v[4]) | select(0u, p5.flags, v[5]) | select(0u, p6.flags, v[6])
        | select(0u, p7.flags, v[7]);
    return acc;
}

// One softmax side's running maxima over a run of fold_run8: element 0 is the first partial's
// maximum, element i the maximum after folding partial i (`maxes[i]`; kept where `v[i]` marks it
// past the run).
fn run_maxima8(maxes: array<f32, 8>, v: array<bool, 8>) -> array<f32, 8> {
    let m1 = next_max(maxes[0], maxes[1], v[1]);
    let m2 = next_max(m1, maxes[2], v[2]);
    let m3 = next_max(m2, maxes[3], v[3]);
    let m4 = next_max(m3, maxes[4], v[4]);
    let m5 = next_max(m4, maxes[5], v[5]);
    let m6 = next_max(m5, maxes[6], v[6]);
    let m7 = next_max(m6, maxes[7], v[7]);
    return array<f32, 8>(maxes[0], m1, m2, m3, m4, m5, m6, m7);
}

// One softmax side's sum over a run of fold_run8: the partials' sums `sums` (maxima `maxes`)
// folded one by one from the first, in fold's order, with the running maxima `m` of
// run_maxima8.
fn run_sum8(sums: array<f32, 8>, maxes: array<f32, 8>, m: array<f32, 8>, inv_t: f32, v: array<bool, 8>) -> f32 {
    var s = sums[0];
    s = side_step(s, m[0], m[1], maxes[1], sums[1], inv_t, v[1]);
    s = side_step(s, m[1], m[2], maxes[2], sums[2], inv_t, v[2]);
    s = side_step(s, m[2], m[3], maxes[3], sums[3], inv_t, v[3]);
    s = side_step(s, m[3], m[4], maxes[4], sums[4], inv_t, v[4]);
    s = side_step(s, m[4], m[5], maxes[5], sums[5], inv_t, v[5]);
    s = side_step(s, m[5], m[6], maxes[6], sums[6], inv_t, v[6]);
    s = side_step(s, m[6], m[7], maxes[7], sums[7], inv_t, v[7]);
    return s;
}

// A running maximum after folding a partial of maximum `o` (kept as `m` where the partial is
// past the run).
fn next_max(m: f32, o: f32, valid: bool) -> f32 {
    return select(m, max(m, o), valid);
}

// One fold of a softmax side's sum, as `fold` computes it: rescale(m, s, m_new) +
// rescale(om, os, m_new) (common.wgsl), each rescale written as a select instead of rescale's
// branch, as the whole of fold_run8 is written: the form measured against `fold`'s.
fn side_step(s: f32, m: f32, m_new: f32, om: f32, os: f32, inv_t: f32, valid: bool) -> f32 {
    let mine = select(s * exp((m - m_new) * inv_t), 0.0, is_neg_inf(m));
    let other = select(os * exp((om - m_new) * inv_t), 0.0, is_neg_inf(om));
    return select(s, mine + other, valid);
}

// fold's argmax rule for partial `o` against a state of maximum m and argmax a (written out, as
// in `fold`).
fn arg_step(m: f32, a: u32, o: RowStats, valid: bool) -> u32 {
    let takes = o.t_max > m || (o.t_max == m && o.t_arg < a);
    return select(a, o.t_arg, valid && takes);
}

// Merges the chunk partials of `row` on one lane: each run in chunk order, then the runs in run
// order (the order `main` reaches with a lane per run). The drafted token's values come from the
// chunk that holds it.
fn merge_row(row: u32, drafted: i32, with_sum: bool, inv_t: f32) -> RowStats {
    let n = params.num_chunks;
    let run = run_len();
    var acc = fold_run(row, 0u, min(run, n), with_sum, inv_t);
    for (var c0 = run; c0 < n; c0 += run) {
        acc = fold(acc, fold_run(row, c0, min(c0 + run, n), with_sum, inv_t), with_sum, inv_t);
    }
    return finish_row(acc, drafted, drafted_values(row, drafted));
}

// The end of a row's merge, whichever way it merged: a row with no maximum anywhere (all -inf)
// points at token 0, and the drafted token's values `at_d` (drafted_values) replace the merged
// ones.
fn finish_row(merged: RowStats, drafted: i32, at_d: vec2<f32>) -> RowStats {
    var st = merged;
    if (st.t_arg == NO_INDEX) {
        st.t_arg = 0u;
    }
    if (drafted >= 0) {
        st.t_at_d = at_d.x;
        st.q_at_d = at_d.y;
    }
    return st;
}

// The drafted token's values of `row` (target and draft), from the one chunk that holds it;
// zero for the bonus row, as row_stats leaves every chunk's values there.
fn drafted_values(row: u32, drafted: i32) -> vec2<f32> {
    if (drafted < 0) {
        return vec2<f32>(0.0);
    }
    return load_drafted_values(row * params.num_chunks + u32(drafted) / CHUNK);
}

// The drafted token at row i of a request (-1 at the bonus row).
fn drafted_at(info: ReqInfo, i: u32) -> i32 {
    if (i < info.num_drafts) {
        return draft_ids[info.draft_offset + i];
    }
    return -1;
}

// Stores row i's merged statistics and records what the request's decision needs from it: a
// non-finite row (the target's, and the draft's when `check_draft`), and a draft not accepted.
fn record_row(info: ReqInfo, i: u32, st: RowStats, drafted: i32, check_draft: bool) {
    row_stats[info.row_offset + i] = st;
    let draft_row = i < info.num_drafts;
    if (row_nonfinite(st) || (check_draft && draft_row && draft_row_nonfinite(st))) {
        atomicOr(&any_nonfinite, 1u);
    }
    if (draft_row && !row_outcome(info, i, st, drafted).accept) {
        atomicMin(&first_stop, i);
    }
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

// p(d) at a row from its statistics (0 for an invalid draft).
fn p_at_draft(info: ReqInfo, st: RowStats, d: i32) -> f32 {
    if (d < 0) {
        return 0.0;
    }
    return exp((st.t_at_d - st.t_max) * info.inv_temperature) / st.t_sum;
}

// The decision at one draft row, from its statistics alone (rows are decided in parallel; the
// request stops at the first row that does not accept).
struct Outcome {
    accept: bool,
    nonfinite: bool, // the target row is non-finite
    q_usable: bool,  // false: draft logits non-finite, resample from p
}

fn row_outcome(info: ReqInfo, i: u32, st: RowStats, d: i32) -> Outcome {
    var o = Outcome(false, false, true);
    if (row_nonfinite(st)) {
        o.nonfinite = true;
        return o;
    }
    let greedy = (info.flags & REQ_GREEDY) != 0u;
    let inv_t = info.inv_temperature;
    // Draft logits with NaN / +inf (or all -inf) give no usable q: such a row rejects and the
    // request resamples from p.
    if (!greedy && params.draft_kind == DRAFT_LOGITS && draft_row_nonfinite(st)) {
        o.q_usable = false;
    }
    if ((info.flags & REQ_FAULT_REJECT_ALL) != 0u) {
        o.accept = false;
    } else if ((info.flags & REQ_SYNTHETIC) != 0u) {
        let u = uniform_open(random_words(info, row_position(info, i), STREAM_ACCEPT, 0u).x);
        o.accept = d >= 0 && u < rates[info.draft_offset + i];
    } else if (greedy) {
        o.accept = d >= 0 && u32(d) == st.t_arg;
    } else if ((info.flags & REQ_TYPICAL) != 0u) {
        // Typical acceptance (lossy): p(d) > min(epsilon, delta exp(-H)), H the entropy of p.
        let h = log(st.t_sum) - st.t_ent / st.t_sum;
        let threshold = min(info.typical_epsilon, info.typical_delta * exp(-h));
        o.accept = d >= 0 && p_at_draft(info, st, d) > threshold;
    } else {
        var p_d = 0.0;
        if (d >= 0) {
            p_d = exp((st.t_at_d - st.t_max) * inv_t) / st.t_sum;
        }
        var q_d = 1.0;
        if (params.draft_kind == DRAFT_PROBS) {
            q_d = sanitize_prob(st.q_at_d);
        } else if (params.draft_kind == DRAFT_LOGITS) {
            if (!o.q_usable) {
                q_d = 0.0;
            } else if (d >= 0 && u32(d) < params.draft_vocab) {
                q_d = exp((st.q_at_d - st.q_max) * inv_t) / st.q_sum;
            } else {
                q_d = 0.0;
            }
        }
        let u = uniform_open(random_words(info, row_position(info, i), STREAM_ACCEPT, 0u).x);
        // Rule 2: accept iff u · q(d) < p(d); q(d) = 0 (or NaN, sanitised to 0) rejects.
        o.accept = d >= 0 && q_d > 0.0 && u * q_d < p_d;
    }
    return o;
}

// q(d) at a draft row for the block rule's ratio p(d) / q(d): 1 for one-hot drafts, the
// probability (NaN / +inf / negative count as 0), or softmax of the draft logits (0 past the
// draft vocabulary). 0 makes ρ 0 from that row on, as rule 2 rejects such a draft.
fn q_at_draft(info: ReqInfo, st: RowStats, d: i32) -> f32 {
    if (params.draft_kind == DRAFT_PROBS) {
        return sanitize_prob(st.q_at_d);
    }
    if (params.draft_kind == DRAFT_LOGITS) {
        if (d < 0 || u32(d) >= params.draft_vocab) {
            return 0.0;
        }
        return exp((st.q_at_d - st.q_max) * info.inv_temperature) / st.q_sum;
    }
    return 1.0;
}

// Stores ρ_j, the ρ entering row j, in row_stats[row_offset + j].rho for j = 0 ..= k:
// ρ_0 = 1, ρ_j = min(1, ρ_{j-1} p_{j-1}(d) / q_{j-1}(d)), 0 for an invalid draft or q(d) = 0.
// (With one-hot drafts q = 1 and the ratio is p(d) exactly.)
fn store_rhos(info: ReqInfo) {
    var rho = 1.0;
    row_stats[info.row_offset].rho = rho;
    for (var j = 1u; j <= info.num_drafts; j += 1u) {
        let st = row_stats[info.row_offset + j - 1u];
        let d = draft_ids[info.draft_offset + j - 1u];
        let q = q_at_draft(info, st, d);
        if (d < 0 || !(q > 0.0)) {
            rho = 0.0;
        } else {
            rho = min(rho * (p_at_draft(info, st, d) / q), 1.0);
        }
        row_stats[info.row_offset + j].rho = rho;
    }
}

// Marks with ROW_MASS_DUE the rows j (1 <= j < k) of a block request with a draft distribution
// whose mass R_j can change τ = max{ j : u_j <= h_j }; block_mass sums only those rows, so a
// request reads its rows a second time only where the decision needs them. Three facts decide
// it without any R_j:
// - h_k = ρ_k needs no mass: with u_k <= ρ_k, τ = k whatever the R_j are, and no row is due.
// - h_j = 1 where ρ_j = 1, whatever R_j (block_stop: R / (R + 0) = 1, or a denominator of 0):
//   draft j is accepted for certain, so τ >= j and neither R_j nor the masses below matter.
//   The walk down from k - 1 stops there.
// - h_j <= ρ_j: R_j = Σ max(ρ_j p - q, 0) <= ρ_j Σ p = ρ_j, and R / (R + 1 - ρ) grows with R.
//   In f32, R_j exceeds ρ_j by the rounding of its sum and of the row's normaliser (their
//   chains of additions and rescalings are at most a few thousand long up to 2^24 entries) and
//   by exp's error (WGSL: 3 + 2|x| ulp): about 1 % relatively in the worst case, far inside the
//   margin of 1/8; h's division adds a few ulp. So u_j > ρ_j · MASS_BOUND (1.125) rejects
//   draft j for certain.
// block_stop takes R = 0 for the rows not due: that gives h = 0 (rejected) where ρ < 1, the same
// decision. ρ_j = 0 gives R_j = 0 and h_j = 0: never due. The twin marks the same rows
// (src/cpu/verify.rs), so τ and the masses' buffer agree bit for bit.
// Returns NO_INDEX when some row is due; otherwise τ, which the walk has then decided (block_stop
// gives the same: k where u_k <= ρ_k, else the row the walk stopped at (ρ = 1, h = 1), else 0,
// every other row being rejected), and the request skips block_mass and block_settle.
fn mark_due_masses(info: ReqInfo) -> u32 {
    let k = info.num_drafts;
    if (k == 0u) {
        return 0u;
    }
    let u_k = uniform_open(random_words(info, row_position(info, k - 1u), STREAM_ACCEPT, 0u).x);
    if (u_k <= row_stats[info.row_offset + k].rho) {
        return k;
    }
    var any = false;
    var tau = 0u;
    for (var j = k - 1u; j >= 1u; j -= 1u) {
        let rho = row_stats[info.row_offset + j].rho;
        if (rho == 1.0) {
            tau = j;
            break;
        }
        let u = uniform_open(random_words(info, row_position(info, j - 1u), STREAM_ACCEPT, 0u).x);
        if (rho > 0.0 && u <= rho * MASS_BOUND) {
            row_stats[info.row_offset + j].flags |= ROW_MASS_DUE;
            any = true;
        }
    }
    return select(tau, NO_INDEX, any);
}

// R_j of a draft distribution: the chunk partials of block_mass, folded in chunk order.
fn folded_mass(row: u32) -> f32 {
    let base = row * params.num_chunks;
    var m = masses[base];
    for (var c = 1u; c < params.num_chunks; c += 1u) {
        m = m + masses[base + c];
    }
    return m;
}

// Block verification (SPEC §3 rule 5): the number of drafts kept, tau = max{ j : u_j <= h_j }
// (0 if none), from the stored ρ_j. h_j = R_j / (R_j + 1 - ρ_j) (1 when the denominator is 0)
// for j < k, h_k = ρ_k. R_j is ρ_j (1 - p_j(d_j)) for one-hot drafts (closed form), else the
// mass from block_mass for the rows it summed (ROW_MASS_DUE), 0 for the others: they are not
// accepted either way (mark_due_masses). Sequential in j.
fn block_stop(info: ReqInfo) -> u32 {
    let k = info.num_drafts;
    var tau = 0u;
    for (var j = 1u; j <= k; j += 1u) {
        let rho = row_stats[info.row_offset + j].rho;
        var h = rho;
        if (j < k) {
            var r = 0.0;
            if (params.draft_kind == DRAFT_NONE) {
                let d_next = draft_ids[info.draft_offset + j];
                r = rho * (1.0 - p_at_draft(info, row_stats[info.row_offset + j], d_next));
            } else if ((row_stats[info.row_offset + j].flags & ROW_MASS_DUE) != 0u) {
                r = folded_mass(info.row_offset + j);
            }
            // 1 - ρ first: exact for ρ >= 1/2, and h = 1 exactly where ρ = 1 (mark_due_masses
            // relies on it); (r + 1) - ρ would cancel where r is small.
            let den = r + (1.0 - rho);
            h = 1.0;
            if (den > 0.0) {
                h = r / den;
            }
        }
        let u = uniform_open(random_words(info, row_position(info, j - 1u), STREAM_ACCEPT, 0u).x);
        if (u <= h) {
            tau = j;
        }
    }
    return tau;
}

var<workgroup> first_stop: atomic<u32>;
var<workgroup> any_nonfinite: atomic<u32>;

// Greedy requests (without raw logprobs) need of each row only its maximum, the lowest index
// holding it and the flags, none of which depends on the order of the merge. So their rows
// merge in parallel: every lane takes some of the request's chunk partials, the row's maximum
// is an atomic max over order-preserving keys, its index an atomic min over the partials that
// hold it. Two rounds of loads and three barriers, where the ordered fold waits out a memory
// latency per four chunks of a run, then folds the runs.
var<workgroup> g_key: array<atomic<u32>, 64>;
var<workgroup> g_arg: array<atomic<u32>, 64>;
var<workgroup> g_flags: array<atomic<u32>, 64>;
// The request's row count, whether it is greedy and whether it takes the block rule, as
// workgroup-uniform values.
var<workgroup> wg_req: vec3<u32>;
// 1: a block request whose decision waits for block_mass (some mass is due).
var<workgroup> wg_pending: u32;

// VERIFY_WG, the calling workgroup's size: declared by the including module.

// A lane's own row after its merge (merge_greedy_rows, or `main`'s ordered merge): its merged
// statistics and its drafted token (-1 at the bonus row), for settle_from_registers.
struct MergedRow {
    st: RowStats,
    drafted: i32,
}

// Greedy request `info`'s rows merged in parallel (see g_key), written to row_stats, and
// decided as `main`'s loop decides them. Every lane calls it; `rows` (k + 1) is uniform. Lane i
// loads its row's drafted token and the values at it before the merge's loads are waited for,
// so they cost no memory latency of their own. Returns, on lane i < rows, row i of the last group
// of 64 rows (all of them when rows <= 64).
fn merge_greedy_rows(info: ReqInfo, lane: u32, rows: u32) -> MergedRow {
    let n = params.num_chunks;
    var mine: MergedRow;
    for (var g = 0u; g < rows; g += 64u) {
        let count = min(64u, rows - g);
        let first = (info.row_offset + g) * n;
        let i = g + lane;
        var drafted = -1;
        var at_d = vec2<f32>(0.0);
        if (lane < count) {
            drafted = drafted_at(info, i);
            at_d = drafted_values(info.row_offset + i, drafted);
            atomicStore(&g_key[lane], 0u);
            atomicStore(&g_arg[lane], NO_INDEX);
            atomicStore(&g_flags[lane], 0u);
        }
        workgroupBarrier();
        for (var p = lane; p < count * n; p += VERIFY_WG) {
            let o = load_partial(first + p);
            atomicMax(&g_key[p / n], order_key(o.t_max));
            atomicOr(&g_flags[p / n], o.flags);
        }
        workgroupBarrier();
        for (var p = lane; p < count * n; p += VERIFY_WG) {
            let o = load_partial(first + p);
            if (order_key(o.t_max) == atomicLoad(&g_key[p / n])) {
                atomicMin(&g_arg[p / n], o.t_arg);
            }
        }
        workgroupBarrier();
        if (lane < count) {
            var st: RowStats;
            st.t_max = from_order_key(atomicLoad(&g_key[lane]));
            st.t_arg = atomicLoad(&g_arg[lane]);
            st.flags = atomicLoad(&g_flags[lane]);
            st.q_max = bitcast<f32>(NEG_INF_BITS);
            // t_at_d and q_at_d are zero as the ordered merge leaves them at the bonus row.
            st = finish_row(st, drafted, at_d);
            // Greedy decisions never read the draft row (its q_max is left at -inf).
            record_row(info, i, st, drafted, false);
            mine = MergedRow(st, drafted);
        }
        // The next group reuses the arrays; after the last, first_stop is final.
        workgroupBarrier();
    }
    return mine;
}

// Settles a request whose rows were merged in one group, lane i holding row i (`mine`), as
// `settle` does from row_stats: lane j writes slot j (its own row's draft where it was accepted),
// the lane of the stopping row what settle's lane 0 writes. No round trip through row_stats and
// draft_ids after the merge (the pass's last dependent loads at small batches).
fn settle_from_registers(r: u32, lane: u32, info: ReqInfo, mine: MergedRow, stop: u32, block: bool) {
    for (var j = lane; j < params.out_stride; j += VERIFY_WG) {
        if (j < stop) {
            // j < stop <= k: lane j holds row j.
            put_accepted(info, j, mine.drafted, mine.st);
        } else if (j > stop) {
            put_padding(info, j);
        }
    }
    if (lane == stop) {
        settle_stop(r, info, stop, mine.st, mine.drafted, block);
    }
}

// Verifies request r with the calling workgroup's VERIFY_WG lanes (every lane calls it, in
// uniform control flow: it holds the barriers): its rows' chunk partials merged, each draft
// decided, and the request settled (or left to block_mass / the residual pass).
fn verify_request(r: u32, lane: u32) {
    let info = requests[r];
    let k = info.num_drafts;
    let greedy = (info.flags & REQ_GREEDY) != 0u;
    // Block requests decide jointly (below) unless a row is non-finite (target, or draft logits):
    // then the standard rule, which stops at that row with its status.
    let block_rule = (info.flags & REQ_BLOCK) != 0u;
    if (lane == 0u) {
        atomicStore(&first_stop, k);
        atomicStore(&any_nonfinite, 0u);
        wg_req = vec3<u32>(k + 1u, select(0u, 1u, greedy && !RAW_SUMS), select(0u, 1u, block_rule));
    }
    let req = workgroupUniformLoad(&wg_req);
    if (req.y != 0u) {
        let mine = merge_greedy_rows(info, lane, req.x);
        if (req.x <= 64u) {
            settle_from_registers(r, lane, info, mine, atomicLoad(&first_stop), false);
            return;
        }
    }
    // Otherwise a lane per run of chunks, then a lane per row folds its runs and decides its
    // draft. (Loops guarded by `req.y == 0u`, not an else branch: written as if/else, the H200's
    // verify ran 1.11x slower for sampled requests,
    // benches/results/nvidia-h200-vulkan-verify-loop-form-*.)
    let n = params.num_chunks;
    let run = run_len();
    let runs = (n + run - 1u) / run;
    let rows_per = 64u / runs;
    var mine: MergedRow;
    for (var first = 0u; first < req.x && req.y == 0u; first += rows_per) {
        let i = first + lane / runs;
        let c0 = (lane % runs) * run;
        let own = first + lane;
        let owner = lane < rows_per && own <= k;
        // The row owner's drafted token and the values at it go out before the runs' partials
        // are waited for, as merge_greedy_rows loads them.
        var drafted = -1;
        var at_d = vec2<f32>(0.0);
        if (owner) {
            drafted = drafted_at(info, own);
            at_d = drafted_values(info.row_offset + own, drafted);
        }
        if (lane < rows_per * runs && i <= k) {
            put_run(lane, fold_run(info.row_offset + i, c0, min(c0 + run, n), !greedy, info.inv_temperature));
        }
        workgroupBarrier();
        if (owner) {
            var acc = run_at(lane * runs);
            for (var j = 1u; j < runs; j += 1u) {
                acc = fold(acc, run_at(lane * runs + j), !greedy, info.inv_temperature);
            }
            let st = finish_row(acc, drafted, at_d);
            record_row(info, own, st, drafted, params.draft_kind == DRAFT_LOGITS);
            mine = MergedRow(st, drafted);
        }
        workgroupBarrier();
    }
    // A request that settles from the registers without the block rule reads nothing another
    // lane wrote to storage, only the workgroup's atomics: it needs no storage barrier.
    let via_storage = req.z != 0u || req.x > rows_per;
    if (via_storage) {
        storageBarrier();
    }
    workgroupBarrier();
    let block = block_rule && !greedy && atomicLoad(&any_nonfinite) == 0u;
    if (lane == 0u) {
        wg_pending = 0u;
    }
    if (block && lane == 0u) {
        store_rhos(info);
        // One-hot drafts, and draft distributions whose decision needs no mass, decide here.
        if (params.draft_kind == DRAFT_NONE) {
            atomicStore(&first_stop, block_stop(info));
        } else {
            let tau = mark_due_masses(info);
            if (tau == NO_INDEX) {
                wg_pending = 1u;
            } else {
                atomicStore(&first_stop, tau);
            }
        }
    }
    if (via_storage) {
        storageBarrier();
    }
    workgroupBarrier();
    if (wg_pending != 0u) {
        // Some R_j can change τ: block_mass sums it, then block_settle finishes the request.
        if (lane == 0u) {
            tasks[r] = Task(TASK_PENDING_BLOCK, 0u, -1, info.out_offset);
        }
        return;
    }
    if (req.x <= rows_per) {
        // One group of rows: lane i still holds row i.
        settle_from_registers(r, lane, info, mine, atomicLoad(&first_stop), block);
        return;
    }
    settle(r, lane, VERIFY_WG, info, atomicLoad(&first_stop), block);
}

// Writes request r's output for a stop at row `stop` (drafts 0 .. stop-1 accepted): the
// accepted tokens and their logprobs, -1 padding, then (lane 0) the row where it stopped — a
// rejection, a non-finite row, or the bonus row — and its residual task.
fn settle(r: u32, lane: u32, lanes: u32, info: ReqInfo, stop: u32, block: bool) {
    // Accepted drafts, then -1 padding after the emitted slot; every slot is written.
    // (Slot `stop` belongs to settle_stop on lane 0, or to the residual pass.)
    for (var j = lane; j < params.out_stride; j += lanes) {
        if (j < stop) {
            put_accepted(info, j, draft_ids[info.draft_offset + j], row_stats[info.row_offset + j]);
        } else if (j > stop) {
            put_padding(info, j);
        }
    }
    if (lane != 0u) {
        return;
    }
    settle_stop(r, info, stop, row_stats[info.row_offset + stop], drafted_at(info, stop), block);
}

// Output slot j (< stop) of a request: its accepted draft `token` and the logprobs from its
// row's statistics `st`. settle and settle_from_registers differ only in where `token` and `st`
// come from (storage or the merge's registers); the arguments are loaded inside their caller's
// branch, so no slot past `stop` loads anything.
fn put_accepted(info: ReqInfo, j: u32, token: i32, st: RowStats) {
    out_words[info.out_offset + j] = bitcast<u32>(token);
    put_logprobs(info.out_offset + j, logprobs_of(info, st, st.t_at_d));
}

// Output slot j past the emitted one (of settle, settle_from_registers and walk_tree): -1
// padding, NaN logprobs.
fn put_padding(info: ReqInfo, j: u32) {
    out_words[info.out_offset + j] = bitcast<u32>(-1);
    put_logprobs(info.out_offset + j, nan_pair());
}

// Settle's part for the row where request r stopped (statistics `st`, drafted token `d`, -1 at
// the bonus row): its token or residual task, its logprobs, the emitted count and the status.
fn settle_stop(r: u32, info: ReqInfo, stop: u32, st: RowStats, d: i32, block: bool) {
    let k = info.num_drafts;
    let greedy = (info.flags & REQ_GREEDY) != 0u;
    var status = 0u;
    var task = Task(TASK_NONE, stop, -1, info.out_offset + stop);
    var final_token = -1;
    // NaN unless settled here (greedy) or by the residual pass (sampled).
    put_logprobs(info.out_offset + stop, nan_pair());
    if (row_nonfinite(st)) {
        // NaN / +inf is a numeric failure; a row that is all -inf (after the controls, which
        // never empty a finite row) was masked entirely by the caller.
        if ((st.flags & (ROW_T_NAN | ROW_T_POSINF)) != 0u) {
            status |= STATUS_TARGET_NONFINITE;
        } else {
            status |= STATUS_ALL_MASKED;
        }
        final_token = i32(st.t_arg);
    } else if (stop < k) {
        var o = Outcome(false, false, true);
        if (!block) {
            o = row_outcome(info, stop, st, d);
        }
        if (!o.q_usable) {
            status |= STATUS_DRAFT_NONFINITE;
        }
        if (greedy || (info.flags & REQ_TYPICAL) != 0u) {
            // Greedy, and typical acceptance's fallback: the argmax.
            final_token = i32(st.t_arg);
            put_logprobs(info.out_offset + stop, logprobs_of(info, st, st.t_max));
        } else if ((info.flags & REQ_FAULT_REJECT_ALL) != 0u || d < 0 || !o.q_usable) {
            task.kind = TASK_FROM_TARGET;
            task.draft_token = d;
        } else if (params.draft_kind == DRAFT_NONE) {
            // (Block too: max(ρ p - δ_d, 0) is p without d, whatever ρ.)
            task.kind = TASK_ONE_HOT_RESIDUAL;
            task.draft_token = d;
        } else if (block) {
            task.kind = TASK_BLOCK_RESIDUAL;
            task.draft_token = d;
        } else {
            task.kind = TASK_DRAFT_RESIDUAL;
            task.draft_token = d;
        }
    } else if (greedy) {
        final_token = i32(st.t_arg);
        put_logprobs(info.out_offset + stop, logprobs_of(info, st, st.t_max));
    } else {
        task.kind = TASK_FROM_TARGET;
    }
    tasks[r] = task;
    // The emitted token (or -1 until the residual pass fills it).
    out_words[info.out_offset + stop] = bitcast<u32>(final_token);
    let base = params.num_requests * params.out_stride;
    out_words[base + r] = stop + 1u;
    out_words[base + params.num_requests + r] = status;
}


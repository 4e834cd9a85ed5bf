//! CPU twin of `shaders/verify.wgsl`: the per-row decisions and the settling of the row where
//! the request stopped, with the same rules.

use crate::batch::Plan;
use crate::layout::*;
use crate::rng::{random_words, row_position, uniform_open, STREAM_ACCEPT};

fn row_nonfinite(st: &RowStats) -> bool {
    st.flags & (ROW_T_NAN | ROW_T_POSINF) != 0 || st.t_max == f32::NEG_INFINITY
}

fn draft_row_nonfinite(st: &RowStats) -> bool {
    st.flags & (ROW_Q_NAN | ROW_Q_POSINF) != 0 || st.q_max == f32::NEG_INFINITY
}

/// A draft probability is usable when finite and ≥ 0; anything else counts as 0.
pub(crate) fn sanitize_prob(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY || x < 0.0 {
        0.0
    } else {
        x
    }
}

/// The accept uniform `u_i` of row `i` of request `info`.
pub fn accept_uniform(info: &ReqInfo, i: u32) -> f32 {
    uniform_open(
        random_words(
            info.seed(),
            row_position(info.position(), i),
            STREAM_ACCEPT,
            0,
        )[0],
    )
}

/// The decision at one draft row, from its statistics alone (mirrors `row_outcome` in the WGSL).
struct Outcome {
    accept: bool,
    nonfinite: bool,
    q_usable: bool,
}

fn row_outcome(plan: &Plan, info: &ReqInfo, i: u32, st: &RowStats, d: i32) -> Outcome {
    let mut o = Outcome {
        accept: false,
        nonfinite: false,
        q_usable: true,
    };
    if row_nonfinite(st) {
        o.nonfinite = true;
        return o;
    }
    let greedy = info.flags & REQ_GREEDY != 0;
    let inv_t = info.inv_temperature;
    if !greedy && plan.draft_kind == DRAFT_LOGITS && draft_row_nonfinite(st) {
        o.q_usable = false;
    }
    o.accept = if info.flags & REQ_FAULT_REJECT_ALL != 0 {
        false
    } else if info.flags & REQ_SYNTHETIC != 0 {
        d >= 0 && accept_uniform(info, i) < plan.rates[(info.draft_offset + i) as usize]
    } else if greedy {
        d >= 0 && d as u32 == st.t_arg
    } else if info.flags & REQ_TYPICAL != 0 {
        // Typical acceptance (lossy): p(d) > min(ε, δ exp(−H)), H the entropy of p.
        let h = st.t_sum.ln() - st.t_ent / st.t_sum;
        let threshold = info.typical_epsilon.min(info.typical_delta * (-h).exp());
        d >= 0 && p_at_draft(info, st, d) > threshold
    } else {
        let p_d = if d >= 0 {
            ((st.t_at_d - st.t_max) * inv_t).exp() / st.t_sum
        } else {
            0.0
        };
        let q_d = match plan.draft_kind {
            DRAFT_PROBS => sanitize_prob(st.q_at_d),
            DRAFT_LOGITS => {
                if !o.q_usable {
                    0.0
                } else if d >= 0 && (d as u32) < plan.draft_vocab {
                    ((st.q_at_d - st.q_max) * inv_t).exp() / st.q_sum
                } else {
                    0.0
                }
            }
            _ => 1.0,
        };
        // Rule 2: accept iff u · q(d) < p(d); q(d) = 0 (or NaN, sanitised to 0) rejects.
        d >= 0 && q_d > 0.0 && accept_uniform(info, i) * q_d < p_d
    };
    o
}

/// The (processed, raw) logprobs of a token with logit `l` at a row with statistics `st`, NaN
/// where the request did not ask (mirrors `logprobs_of` in the WGSL).
pub(crate) fn logprobs_of(info: &ReqInfo, st: &RowStats, l: f32) -> (f32, f32) {
    let processed = if info.flags & REQ_LOGPROBS == 0 {
        f32::NAN
    } else if info.flags & REQ_GREEDY != 0 {
        0.0 // a point mass at the argmax
    } else {
        (l - st.t_max) * info.inv_temperature - st.t_sum.ln()
    };
    let raw = if info.flags & REQ_RAW_LOGPROBS == 0 {
        f32::NAN
    } else {
        (l - st.raw_max) - st.raw_sum.ln()
    };
    (processed, raw)
}

/// Writes the logprobs of output slot `slot` (no-op when the batch has no logprob regions).
pub(crate) fn put_logprobs(plan: &Plan, out_words: &mut [u32], slot: usize, lp: (f32, f32)) {
    if !plan.has_logprobs() {
        return;
    }
    let n = plan.num_requests();
    let base = n * plan.out_stride + 2 * n;
    out_words[base + slot] = lp.0.to_bits();
    out_words[base + n * plan.out_stride + slot] = lp.1.to_bits();
}

/// p(d) at a row from its statistics (0 for an invalid draft).
fn p_at_draft(info: &ReqInfo, st: &RowStats, d: i32) -> f32 {
    if d < 0 {
        0.0
    } else {
        ((st.t_at_d - st.t_max) * info.inv_temperature).exp() / st.t_sum
    }
}

/// q(d) at a draft row for the block rule's ratio p(d) / q(d) (mirrors `q_at_draft` in the
/// WGSL): 1 for one-hot drafts, the sanitised probability, or softmax of the draft logits (0
/// past the draft vocabulary).
fn q_at_draft(plan: &Plan, info: &ReqInfo, st: &RowStats, d: i32) -> f32 {
    match plan.draft_kind {
        DRAFT_PROBS => sanitize_prob(st.q_at_d),
        DRAFT_LOGITS => {
            if d < 0 || d as u32 >= plan.draft_vocab {
                0.0
            } else {
                ((st.q_at_d - st.q_max) * info.inv_temperature).exp() / st.q_sum
            }
        }
        _ => 1.0,
    }
}

/// Stores ρ_j, the ρ entering row j, in `rho` of the request's rows (mirrors `store_rhos`):
/// ρ_0 = 1, ρ_j = min(1, ρ_{j−1} p_{j−1}(d) / q_{j−1}(d)), 0 for an invalid draft or q(d) = 0.
fn store_rhos(plan: &Plan, info: &ReqInfo, stats: &mut [RowStats]) {
    let base = info.row_offset as usize;
    let mut rho = 1.0f32;
    stats[base].rho = rho;
    for j in 1..=info.num_drafts as usize {
        let st = &stats[base + j - 1];
        let d = plan.draft_ids[info.draft_offset as usize + j - 1];
        let q = q_at_draft(plan, info, st, d);
        rho = if d < 0 || q.is_nan() || q <= 0.0 {
            0.0
        } else {
            (rho * (p_at_draft(info, st, d) / q)).min(1.0)
        };
        stats[base + j].rho = rho;
    }
}

/// Block verification (SPEC §3 rule 5): the number of drafts kept, τ = max{ j : u_j ≤ h_j }
/// (0 if none), from the stored ρ_j, mirroring `block_stop` in the WGSL. h_j = R_j / (R_j + 1 −
/// ρ_j) (1 when the denominator is 0) for j < k, h_k = ρ_k; R_j = ρ_j (1 − p_j(d_j)) for one-hot
/// drafts (closed form), else `masses[row]` from the block_mass twin (0 when ρ_j = 0).
pub(crate) fn block_stop(plan: &Plan, info: &ReqInfo, stats: &[RowStats], masses: &[f32]) -> u32 {
    let k = info.num_drafts;
    let mut tau = 0;
    for j in 1..=k {
        let g = (info.row_offset + j) as usize;
        let rho = stats[g].rho;
        let h = if j < k {
            let r = if plan.draft_kind == DRAFT_NONE {
                let d_next = plan.draft_ids[(info.draft_offset + j) as usize];
                rho * (1.0 - p_at_draft(info, &stats[g], d_next))
            } else if rho > 0.0 {
                masses[g]
            } else {
                0.0
            };
            let den = r + 1.0 - rho;
            if den > 0.0 {
                r / den
            } else {
                1.0
            }
        } else {
            rho
        };
        if accept_uniform(info, j - 1) <= h {
            tau = j;
        }
    }
    tau
}

/// Verifies request `r` (verify's `main` entry): merges nothing (the twin's rows are whole),
/// decides, writes its accepted tokens, padding, num_emitted and status into `out_words`
/// (layout `[tokens | num_emitted | status]`) and returns its residual task. The request stops
/// at the first draft not accepted; the status describes that row. A block request with a draft
/// distribution only gets its ρ stored and returns `TASK_PENDING_BLOCK`: [`block_settle`]
/// finishes it once the masses are known.
pub fn request(plan: &Plan, r: usize, stats: &mut [RowStats], out_words: &mut [u32]) -> Task {
    let info = &plan.reqs[r];
    let k = info.num_drafts;
    let draft = |i: u32| plan.draft_ids[(info.draft_offset + i) as usize];
    let row = |i: u32| (info.row_offset + i) as usize;
    // Block requests decide jointly unless a row is non-finite (target, or draft logits): then
    // the standard rule, which stops at that row with its status.
    let any_nonfinite = (0..=k).any(|i| {
        let st = &stats[row(i)];
        row_nonfinite(st) || (i < k && plan.draft_kind == DRAFT_LOGITS && draft_row_nonfinite(st))
    });
    let block = info.flags & REQ_BLOCK != 0 && info.flags & REQ_GREEDY == 0 && !any_nonfinite;
    if block {
        store_rhos(plan, info, stats);
        if plan.draft_kind != DRAFT_NONE {
            return Task {
                kind: TASK_PENDING_BLOCK,
                local_row: 0,
                draft_token: -1,
                slot: info.out_offset,
            };
        }
    }
    let stop = if block {
        block_stop(plan, info, stats, &[])
    } else {
        (0..k)
            .find(|&i| !row_outcome(plan, info, i, &stats[row(i)], draft(i)).accept)
            .unwrap_or(k)
    };
    settle(plan, r, stats, stop, block, out_words)
}

/// Finishes a block request left pending by [`request`] (verify's `block_settle` entry), with
/// `masses[row]` the folded R of its rows 1 .. k−1 where ρ > 0.
pub fn block_settle(
    plan: &Plan,
    r: usize,
    stats: &[RowStats],
    masses: &[f32],
    out_words: &mut [u32],
) -> Task {
    let stop = block_stop(plan, &plan.reqs[r], stats, masses);
    settle(plan, r, stats, stop, true, out_words)
}

/// Writes request `r`'s output for a stop at row `stop` and returns the residual task (the
/// `settle` function of the WGSL).
fn settle(
    plan: &Plan,
    r: usize,
    row_stats: &[RowStats],
    stop: u32,
    block: bool,
    out_words: &mut [u32],
) -> Task {
    let info = &plan.reqs[r];
    let k = info.num_drafts;
    let greedy = info.flags & REQ_GREEDY != 0;
    let draft = |i: u32| plan.draft_ids[(info.draft_offset + i) as usize];
    for j in 0..plan.out_stride as u32 {
        let slot = (info.out_offset + j) as usize;
        if j < stop {
            out_words[slot] = draft(j) as u32;
            let st = &row_stats[(info.row_offset + j) as usize];
            put_logprobs(plan, out_words, slot, logprobs_of(info, st, st.t_at_d));
        } else {
            if j > stop {
                out_words[slot] = -1i32 as u32;
            }
            put_logprobs(plan, out_words, slot, (f32::NAN, f32::NAN));
        }
    }
    let st = &row_stats[(info.row_offset + stop) as usize];
    let mut status = 0u32;
    let mut task = Task {
        kind: TASK_NONE,
        local_row: stop,
        draft_token: -1,
        slot: info.out_offset + stop,
    };
    let mut final_token = -1i32;
    if row_nonfinite(st) {
        status |= if st.flags & (ROW_T_NAN | ROW_T_POSINF) != 0 {
            STATUS_TARGET_NONFINITE
        } else {
            STATUS_ALL_MASKED
        };
        final_token = st.t_arg as i32; // its logprob stays NaN
    } else if stop < k {
        let d = draft(stop);
        let o = if block {
            // The block decision already happened; the settling below only needs q usable.
            Outcome {
                accept: false,
                nonfinite: false,
                q_usable: true,
            }
        } else {
            row_outcome(plan, info, stop, st, d)
        };
        if !o.q_usable {
            status |= STATUS_DRAFT_NONFINITE;
        }
        if greedy || info.flags & REQ_TYPICAL != 0 {
            // Greedy, and typical acceptance's fallback: the argmax.
            final_token = st.t_arg as i32;
            let lp = logprobs_of(info, st, st.t_max);
            put_logprobs(plan, out_words, task.slot as usize, lp);
        } else {
            task.kind = if info.flags & REQ_FAULT_REJECT_ALL != 0 || d < 0 || !o.q_usable {
                TASK_FROM_TARGET
            } else if plan.draft_kind == DRAFT_NONE {
                // (Block too: max(ρ p − δ_d, 0) is p without d, whatever ρ.)
                TASK_ONE_HOT_RESIDUAL
            } else if block {
                TASK_BLOCK_RESIDUAL
            } else {
                TASK_DRAFT_RESIDUAL
            };
            task.draft_token = d;
        }
    } else if greedy {
        final_token = st.t_arg as i32;
        let lp = logprobs_of(info, st, st.t_max);
        put_logprobs(plan, out_words, task.slot as usize, lp);
    } else {
        task.kind = TASK_FROM_TARGET;
    }
    out_words[task.slot as usize] = final_token as u32;
    let n = plan.num_requests();
    let base = n * plan.out_stride;
    out_words[base + r] = stop + 1;
    out_words[base + n + r] = status;
    task
}

/// Output status bits (mirrors `STATUS_*` in the WGSL).
pub(crate) const STATUS_TARGET_NONFINITE: u32 = 1;
pub(crate) const STATUS_DRAFT_NONFINITE: u32 = 2;
pub(crate) const STATUS_EMPTY_RESIDUAL: u32 = 4;
pub(crate) const STATUS_ALL_MASKED: u32 = 8;

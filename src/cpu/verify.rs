//! CPU twin of `shaders/verify.wgsl`: the per-request verification loop, line for line.

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

/// Verifies request `r`: writes its accepted tokens, padding, num_emitted and status into
/// `out_words` (layout `[tokens | num_emitted | status]`) and returns its residual task.
pub fn request(plan: &Plan, r: usize, row_stats: &[RowStats], out_words: &mut [u32]) -> Task {
    let info = &plan.reqs[r];
    let k = info.num_drafts;
    let greedy = info.flags & REQ_GREEDY != 0;
    let synthetic = info.flags & REQ_SYNTHETIC != 0;
    let reject_all = info.flags & REQ_FAULT_REJECT_ALL != 0;
    let inv_t = info.inv_temperature;
    let draft_kind = plan.draft_kind;

    let mut status = 0u32;
    let mut accepted = 0u32;
    let mut task = Task {
        kind: TASK_NONE,
        local_row: 0,
        draft_token: -1,
        slot: 0,
    };
    let mut final_token = -1i32;
    let mut stopped = false;
    for i in 0..k {
        let st = &row_stats[(info.row_offset + i) as usize];
        if row_nonfinite(st) {
            status |= STATUS_TARGET_NONFINITE;
            final_token = st.t_arg as i32;
            stopped = true;
            break;
        }
        let d = plan.draft_ids[(info.draft_offset + i) as usize];
        let mut q_usable = true;
        if !greedy && draft_kind == DRAFT_LOGITS && draft_row_nonfinite(st) {
            status |= STATUS_DRAFT_NONFINITE;
            q_usable = false;
        }
        let accept = if reject_all {
            false
        } else if synthetic {
            d >= 0 && accept_uniform(info, i) < plan.rates[(info.draft_offset + i) as usize]
        } else if greedy {
            d >= 0 && d as u32 == st.t_arg
        } else {
            let p_d = if d >= 0 {
                ((st.t_at_d - st.t_max) * inv_t).exp() / st.t_sum
            } else {
                0.0
            };
            let q_d = match draft_kind {
                DRAFT_PROBS => sanitize_prob(st.q_at_d),
                DRAFT_LOGITS => {
                    if !q_usable {
                        0.0
                    } else if d >= 0 && (d as u32) < plan.draft_vocab {
                        ((st.q_at_d - st.q_max) * inv_t).exp() / st.q_sum
                    } else {
                        0.0
                    }
                }
                _ => 1.0,
            };
            let u = accept_uniform(info, i);
            // Rule 2: accept iff u · q(d) < p(d); q(d) = 0 (or NaN, sanitised to 0) rejects.
            d >= 0 && q_d > 0.0 && u * q_d < p_d
        };
        if !accept {
            stopped = true;
            if greedy {
                final_token = st.t_arg as i32;
            } else {
                let kind = if reject_all || d < 0 || !q_usable {
                    TASK_FROM_TARGET
                } else if draft_kind == DRAFT_NONE {
                    TASK_ONE_HOT_RESIDUAL
                } else {
                    TASK_DRAFT_RESIDUAL
                };
                task = Task {
                    kind,
                    local_row: i,
                    draft_token: d,
                    slot: 0,
                };
            }
            break;
        }
        out_words[(info.out_offset + i) as usize] = d as u32;
        accepted += 1;
    }
    if !stopped {
        let st = &row_stats[(info.row_offset + k) as usize];
        if row_nonfinite(st) {
            status |= STATUS_TARGET_NONFINITE;
            final_token = st.t_arg as i32;
        } else if greedy {
            final_token = st.t_arg as i32;
        } else {
            task = Task {
                kind: TASK_FROM_TARGET,
                local_row: k,
                draft_token: -1,
                slot: 0,
            };
        }
    }
    task.slot = info.out_offset + accepted;
    out_words[(info.out_offset + accepted) as usize] = final_token as u32;
    for j in accepted + 1..plan.out_stride as u32 {
        out_words[(info.out_offset + j) as usize] = -1i32 as u32;
    }
    let n = plan.num_requests();
    let base = n * plan.out_stride;
    out_words[base + r] = accepted + 1;
    out_words[base + n + r] = status;
    task
}

/// Output status bits (mirrors `STATUS_*` in the WGSL).
pub(crate) const STATUS_TARGET_NONFINITE: u32 = 1;
pub(crate) const STATUS_DRAFT_NONFINITE: u32 = 2;
pub(crate) const STATUS_EMPTY_RESIDUAL: u32 = 4;

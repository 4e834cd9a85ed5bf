//! CPU twin of `shaders/residual_argmax.wgsl`: the exponential race over one row.
//! Ties go to the lowest index, so a plain left-to-right scan gives the GPU's answer without
//! emulating its blocks and lanes.

use crate::batch::Plan;
use crate::cpu::verify::{logprobs_of, put_logprobs, sanitize_prob, STATUS_EMPTY_RESIDUAL};
use crate::layout::*;
use crate::rng::{
    exp1_from_w, log_race_key, log_race_may, random_words, row_position, w_from_bits,
    STREAM_ACCEPT, STREAM_BONUS, STREAM_RESIDUAL,
};

#[inline]
fn better(key: f32, idx: u32, best_key: f32, best_idx: u32) -> bool {
    key > best_key || (key == best_key && idx < best_idx)
}

/// The noise stream of a task (bonus rows and residual rows draw from disjoint streams).
fn stream_of(info: &ReqInfo, task: &Task) -> u32 {
    if info.flags & REQ_FAULT_SHARED_NOISE != 0 {
        STREAM_ACCEPT
    } else if task.local_row == info.num_drafts {
        STREAM_BONUS
    } else {
        STREAM_RESIDUAL
    }
}

/// The best candidate of the race over `target` (the task's row) for request `info`.
/// `draft` is the task's draft row (probabilities or logits per `plan.draft_kind`) when the task
/// subtracts q.
pub fn candidate(
    plan: &Plan,
    info: &ReqInfo,
    task: &Task,
    st: &RowStats,
    target: &[f32],
    draft: Option<&[f32]>,
    cuts: (f32, f32),
) -> Candidate {
    let use_q = task.kind == TASK_DRAFT_RESIDUAL || task.kind == TASK_BLOCK_RESIDUAL;
    let excluded = [task.draft_token];
    let race = Race {
        pos: row_position(info.position(), task.local_row),
        stream: stream_of(info, task),
        // ρ scales p before q is subtracted (block residual); 1 otherwise, which changes nothing.
        rho: if task.kind == TASK_BLOCK_RESIDUAL {
            st.rho
        } else {
            1.0
        },
        draft: if use_q { draft } else { None },
        excluded: if task.kind == TASK_ONE_HOT_RESIDUAL {
            &excluded
        } else {
            &[]
        },
    };
    race_row(plan, info, st, target, &race, cuts)
}

/// What one exponential race samples from, beyond the row and its statistics: the residual is
/// `max(ρ p − q, 0)` when `draft` holds the q row (keys r(y)/e(y)), else `p` with the
/// `excluded` tokens removed (log-domain keys, [`log_race_key`]).
/// Chains describe it by their task ([`candidate`]); trees (`cpu::tree`) by the node where the
/// walk stopped, whose rejected children may be several tokens.
pub(crate) struct Race<'a> {
    /// The row's counter position (SPEC §5).
    pub pos: [u32; 2],
    /// `STREAM_RESIDUAL` or `STREAM_BONUS` (`STREAM_ACCEPT` only for the shared-noise fault).
    pub stream: u32,
    /// Scale of p before q is subtracted.
    pub rho: f32,
    /// The draft row (probabilities or logits per `plan.draft_kind`) to subtract, if any.
    pub draft: Option<&'a [f32]>,
    /// Tokens whose residual weight is 0, ascending (rejected siblings without a distribution).
    pub excluded: &'a [i32],
}

/// The best candidate of the race over `target` described by `race`.
pub(crate) fn race_row(
    plan: &Plan,
    info: &ReqInfo,
    st: &RowStats,
    target: &[f32],
    race: &Race<'_>,
    (cut, dcut): (f32, f32),
) -> Candidate {
    let inv_t = info.inv_temperature;
    let q_logits = plan.draft_kind == DRAFT_LOGITS;
    let mut best = Candidate::default();
    let mut words = [0u32; 4];
    // The next excluded token not yet passed: one comparison per entry however many there are.
    let mut next_excluded = race.excluded.iter().copied().filter(|&t| t >= 0).peekable();
    // One division per row, as the kernel does.
    let (inv_sum, inv_qsum) = (1.0 / st.t_sum, 1.0 / st.q_sum);
    for (y, &l_raw) in target.iter().enumerate() {
        // Entries below the cut-offs have p = 0 (and q = 0 for draft logits).
        let l = if l_raw < cut {
            f32::NEG_INFINITY
        } else {
            l_raw
        };
        if y % 4 == 0 {
            words = random_words(info.seed(), race.pos, race.stream, (y / 4) as u32);
        }
        let w = w_from_bits(words[y % 4]);
        if race.draft.is_none() {
            // Log-domain keys (the kernel's race_step): p's candidates are r's plus the excluded
            // tokens, so one test against r's bound settles both.
            let excluded = next_excluded.peek() == Some(&(y as i32));
            if excluded {
                next_excluded.next();
            }
            if l == f32::NEG_INFINITY || l.is_nan() {
                continue; // p = 0
            }
            let z = l * inv_t;
            if log_race_may(z, w, best.r_key) {
                let key = log_race_key(z, w);
                if !excluded && better(key, y as u32, best.r_key, best.r_idx) {
                    best.r_key = key;
                    best.r_idx = y as u32;
                    best.r_logit = l;
                }
                if better(key, y as u32, best.p_key, best.p_idx) {
                    best.p_key = key;
                    best.p_idx = y as u32;
                    best.p_logit = l;
                }
            }
            continue;
        }
        let p = ((l - st.t_max) * inv_t).exp() * inv_sum;
        let mut res = p;
        if let Some(draft) = race.draft {
            let mut q = 0.0;
            if y < plan.draft_vocab as usize {
                let v = draft[y];
                q = if q_logits {
                    let v = if v < dcut { f32::NEG_INFINITY } else { v };
                    ((v - st.q_max) * inv_t).exp() * inv_qsum
                } else {
                    sanitize_prob(v)
                };
            }
            res = (race.rho * p - q).max(0.0);
        }
        // e ≥ w: a key r/e can only beat the best B if r > B·w (the kernel's rule, padded by
        // 1.001 as `log_race_may` is, so that no key within rounding of B is skipped).
        let r_may = res > 0.0 && res * 1.001 > best.r_key * w;
        let p_may = p > 0.0 && p * 1.001 > best.p_key * w;
        if r_may || p_may {
            let e = exp1_from_w(w);
            let (rk, pk) = (res / e, p / e);
            if r_may && better(rk, y as u32, best.r_key, best.r_idx) {
                best.r_key = rk;
                best.r_idx = y as u32;
                best.r_logit = l;
            }
            if p_may && better(pk, y as u32, best.p_key, best.p_idx) {
                best.p_key = pk;
                best.p_idx = y as u32;
                best.p_logit = l;
            }
        }
    }
    best
}

/// Writes the sampled token of request `r` from its (merged) candidate, as the `merge` entry does.
pub fn finish(
    plan: &Plan,
    r: usize,
    task: &Task,
    best: &Candidate,
    st: &RowStats,
    out_words: &mut [u32],
) {
    if task.kind == TASK_NONE {
        return;
    }
    let mut token = best.r_idx;
    let mut logit = best.r_logit;
    if token == NO_INDEX {
        token = best.p_idx;
        logit = best.p_logit;
        let n = plan.num_requests();
        out_words[n * plan.out_stride + n + r] |= STATUS_EMPTY_RESIDUAL;
    }
    if token == NO_INDEX {
        token = st.t_arg;
        logit = st.t_max;
    }
    out_words[task.slot as usize] = token;
    put_logprobs(
        plan,
        out_words,
        task.slot as usize,
        logprobs_of(&plan.reqs[r], st, logit),
    );
}

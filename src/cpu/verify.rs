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

/// Marks with `ROW_MASS_DUE` the rows j (1 ≤ j < k) of a block request with a draft
/// distribution whose mass R_j can change τ (mirrors `mark_due_masses` in the WGSL, which gives
/// the reasons): none when u_k ≤ ρ_k (τ = k); else, walking down from k − 1 and stopping at the
/// first row with ρ_j = 1 (h_j = 1: accepted whatever R_j), those with ρ_j > 0 and
/// u_j ≤ ρ_j · `bound` (`MASS_BOUND`; `h_j ≤ ρ_j` up to rounding). A test passes a smaller
/// bound as a negative control.
///
/// Returns `None` when some row is due; otherwise τ, which the walk has then decided (k where
/// u_k ≤ ρ_k, else the row it stopped at, else 0), and [`request`] settles at once.
pub(crate) fn mark_due_masses(info: &ReqInfo, stats: &mut [RowStats], bound: f32) -> Option<u32> {
    let k = info.num_drafts;
    let base = info.row_offset as usize;
    if k == 0 {
        return Some(0);
    }
    if accept_uniform(info, k - 1) <= stats[base + k as usize].rho {
        return Some(k);
    }
    let (mut any, mut tau) = (false, 0);
    for j in (1..k).rev() {
        let st = &mut stats[base + j as usize];
        if st.rho == 1.0 {
            tau = j;
            break;
        }
        if st.rho > 0.0 && accept_uniform(info, j - 1) <= st.rho * bound {
            st.flags |= ROW_MASS_DUE;
            any = true;
        }
    }
    (!any).then_some(tau)
}

/// Block verification (SPEC §3 rule 5): the number of drafts kept, τ = max{ j : u_j ≤ h_j }
/// (0 if none), from the stored ρ_j, mirroring `block_stop` in the WGSL. h_j = R_j / (R_j + 1 −
/// ρ_j) (1 when the denominator is 0) for j < k, h_k = ρ_k; R_j = ρ_j (1 − p_j(d_j)) for one-hot
/// drafts (closed form), else `masses[row]` from the block_mass twin for the rows it summed
/// (`ROW_MASS_DUE`), 0 for the others (not accepted either way, [`mark_due_masses`]).
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
            } else if stats[g].flags & ROW_MASS_DUE != 0 {
                masses[g]
            } else {
                0.0
            };
            // 1 − ρ first, as the kernel: h = 1 exactly where ρ = 1 (`mark_due_masses`).
            let den = r + (1.0 - rho);
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
/// distribution whose decision needs some mass R_j ([`mark_due_masses`]) only gets its ρ and
/// due rows stored and returns `TASK_PENDING_BLOCK`: [`block_settle`] finishes it once the
/// masses are known.
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
    // Draft distributions wait for block_mass where some mass is due; the rest decide here.
    let mut walked = None;
    if block {
        store_rhos(plan, info, stats);
        if plan.draft_kind != DRAFT_NONE {
            walked = mark_due_masses(info, stats, MASS_BOUND);
            if walked.is_none() {
                return Task {
                    kind: TASK_PENDING_BLOCK,
                    local_row: 0,
                    draft_token: -1,
                    slot: info.out_offset,
                };
            }
        }
    }
    let stop = if let Some(tau) = walked {
        tau
    } else if block {
        block_stop(plan, info, stats, &[])
    } else {
        (0..k)
            .find(|&i| !row_outcome(plan, info, i, &stats[row(i)], draft(i)).accept)
            .unwrap_or(k)
    };
    settle(plan, r, stats, stop, block, out_words)
}

/// Finishes a block request left pending by [`request`] (verify's `block_settle` entry), with
/// `masses[row]` the folded R of its rows marked `ROW_MASS_DUE`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Fault, Request, Rule, SamplingParams, Shape};
    use crate::cpu::{block_mass, cutoffs, row_cuts, row_input, row_stats};

    /// A block batch with draft probabilities whose drafts range from near copies of the
    /// target (ρ near 1, where the bound is tight) to unrelated rows (ρ near 0): target logits
    /// 2·N(0, 1)-like, draft logits the target's plus noise of scale `[0.02, 0.2, 1, 4][r % 4]`,
    /// drafts the draft's argmax or a random token.
    struct Case {
        plan: Plan,
        target: Vec<f32>,
        draft: Vec<f32>,
    }

    fn case(n: usize, k: u32, v: usize) -> Case {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut unit = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 + 0.5) / (1u64 << 24) as f32
        };
        let mut normal = move || -> f32 { (0..4).map(|_| unit()).sum::<f32>() * 1.7 - 3.4 };
        let (mut target, mut draft, mut ids) = (Vec::new(), Vec::new(), Vec::new());
        let mut requests = Vec::new();
        for r in 0..n {
            let noise = [0.02f32, 0.2, 1.0, 4.0][r % 4];
            for j in 0..=k {
                let t: Vec<f32> = (0..v).map(|_| 2.0 * normal()).collect();
                if j < k {
                    let d: Vec<f32> = t.iter().map(|x| x + noise * normal()).collect();
                    let m = d.iter().cloned().fold(f32::MIN, f32::max);
                    let e: Vec<f32> = d.iter().map(|x| (x - m).exp()).collect();
                    let sum: f32 = e.iter().sum();
                    let top = d.iter().position(|&x| x == m).unwrap();
                    let pick = (normal().abs() * 40.0) as usize % v;
                    ids.push(if (r / 4) % 2 == 0 { top } else { pick } as i32);
                    draft.extend(e.iter().map(|x| x / sum));
                }
                target.extend(t);
            }
            requests.push(Request {
                num_drafts: k,
                params: SamplingParams {
                    rule: Rule::Block,
                    ..SamplingParams::seeded([1.0, 0.7][r % 2], r as u64)
                },
                position: 17 * r as u64,
            });
        }
        let shape = Shape {
            vocab: v as u32,
            requests: &requests,
            draft_ids: &ids,
            draft_kind: DRAFT_PROBS,
            draft_vocab: None,
            rates: None,
        };
        let plan = Plan::new(&shape, Fault::None, || 0).expect("plan");
        Case {
            plan,
            target,
            draft,
        }
    }

    /// τ of every request with the masses of `due` rows only (the others NaN, so that reading
    /// one would show), against τ with every mass summed; returns (differences, rows summed,
    /// rows that the full rule sums).
    fn compare(c: &Case, bound: f32) -> (usize, usize, usize) {
        let plan = &c.plan;
        let v = plan.vocab as usize;
        let cuts = cutoffs(plan, &c.target, Some(&c.draft));
        let mut stats: Vec<RowStats> = (0..plan.total_rows)
            .map(|g| {
                row_stats::row(&row_input(
                    plan,
                    g,
                    &c.target,
                    Some(&c.draft),
                    (&cuts, false),
                ))
            })
            .collect();
        for info in &plan.reqs {
            store_rhos(plan, info, &mut stats);
        }
        let mass = |st: &RowStats, g: usize| {
            let info = &plan.reqs[plan.row_info[g][0] as usize];
            let d_row = plan.row_info[g][3] as usize;
            let q = &c.draft[d_row * v..(d_row + 1) * v];
            let t = &c.target[g * v..(g + 1) * v];
            block_mass::row_mass(plan, info, st, t, q, row_cuts(plan, &cuts, g))
        };
        let (mut diffs, mut lazy_rows, mut full_rows) = (0, 0, 0);
        // Each request marks and reads only its own rows.
        let (mut full, mut lazy) = (stats.clone(), stats);
        let mut full_masses = vec![f32::NAN; plan.total_rows];
        let mut lazy_masses = vec![f32::NAN; plan.total_rows];
        for info in &plan.reqs {
            let rows = info.row_offset as usize..(info.row_offset + info.num_drafts + 1) as usize;
            for g in rows.clone().skip(1).take(info.num_drafts as usize - 1) {
                if full[g].rho > 0.0 {
                    full[g].flags |= ROW_MASS_DUE;
                    full_masses[g] = mass(&full[g], g);
                    full_rows += 1;
                }
            }
            let walked = mark_due_masses(info, &mut lazy, bound);
            for g in rows {
                if lazy[g].flags & ROW_MASS_DUE != 0 {
                    lazy_masses[g] = mass(&lazy[g], g);
                    lazy_rows += 1;
                }
            }
            let want = block_stop(plan, info, &full, &full_masses);
            // Where no row is due the walk has decided τ itself.
            let got = walked.unwrap_or_else(|| block_stop(plan, info, &lazy, &lazy_masses));
            if got != want || block_stop(plan, info, &lazy, &lazy_masses) != want {
                diffs += 1;
            }
        }
        (diffs, lazy_rows, full_rows)
    }

    /// The block rule sums only the masses that can change τ, and τ (from the masses summed, and
    /// the walk's own where none is due) is the one every mass gives, on 4,000 requests from near
    /// copies to unrelated drafts; a bound below ρ (a rule that skips masses it needs) must change
    /// some τ.
    #[test]
    fn masses_are_summed_only_where_they_can_change_the_decision() {
        let c = case(4000, 6, 96);
        let (diffs, lazy_rows, full_rows) = compare(&c, MASS_BOUND);
        assert_eq!(diffs, 0, "τ changed where a mass was skipped");
        assert!(
            lazy_rows * 2 < full_rows,
            "{lazy_rows} of {full_rows} masses summed: the rule skips too few to matter"
        );
        assert!(
            lazy_rows > 0,
            "no mass summed: the test never exercises the bound"
        );
        let (bad, _, _) = compare(&c, 0.5);
        assert!(
            bad > 0,
            "a bound of 0.5 skips needed masses, yet every τ agreed"
        );
    }
}

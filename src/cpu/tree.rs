//! Tree verification on the CPU (the rules of `crate::tree`): the chain backend's statistics
//! pass over every row, then one walk per request from the root down the accepted path, then the
//! exponential race over the row where the walk stopped. The statistics, the per-token
//! probabilities, the residual masses and the race are the chain code's, so a tree that is a
//! chain gives the chain verifier's tokens bit for bit.

use super::block_mass::row_mass;
use super::residual_argmax::{race_row, Race};
use super::row_stats::{self, masked};
use super::verify::{logprobs_of, sanitize_prob, STATUS_ALL_MASKED, STATUS_DRAFT_NONFINITE};
use super::verify::{STATUS_EMPTY_RESIDUAL, STATUS_TARGET_NONFINITE};
use super::{cutoffs, parallel_chunks, row_cuts, row_input};
use crate::batch::{Plan, Status, TreePlan, TreeShape};
use crate::layout::*;
use crate::rng::STREAM_RESIDUAL;
use crate::rng::{random_words, row_position, uniform_open, STREAM_ACCEPT, STREAM_BONUS};
use crate::tree::{TreeFault, TreeOutput, TreeVerdict};

/// The cut-offs and the statistics of every row of a checked tree batch.
fn prepare(
    tp: &TreePlan,
    target: &[f32],
    draft: Option<&[f32]>,
    threads: usize,
) -> (Vec<f32>, Vec<RowStats>) {
    let plan = &tp.plan;
    let cuts = cutoffs(plan, target, draft);
    let mut stats = vec![RowStats::default(); plan.total_rows];
    let raw = plan.logprob_flags() & PARAM_RAW != 0;
    parallel_chunks(&mut stats, threads, |first, chunk| {
        for (i, st) in chunk.iter_mut().enumerate() {
            let input = row_input(plan, first + i, target, draft, (&cuts, raw));
            *st = row_stats::row(&input);
        }
    });
    (cuts, stats)
}

/// The residual mass each child's test uses, per global slot (NaN where no test uses one): for
/// every node whose children were drawn from q (not greedy, finite row, usable q), child `j ≥ 1`
/// gets `M_j` of the recursion `try_drawn` follows, for every `j` whatever the draws (as the GPU
/// sums them). Test hook: the GPU's masses are compared with these.
pub(crate) fn sibling_masses(tp: &TreePlan, target: &[f32], draft: Option<&[f32]>) -> Vec<f32> {
    let plan = &tp.plan;
    let (cuts, stats) = prepare(tp, target, draft, 1);
    let rows = Rows {
        plan,
        stats: &stats,
        target,
        draft,
        cuts: &cuts,
        fault: tp.fault,
    };
    let mut out = vec![f32::NAN; plan.total_rows];
    for (r, tree) in tp.trees.iter().enumerate() {
        let info = &plan.reqs[r];
        for s in 0..tree.depth.len() {
            let g = info.row_offset as usize + s;
            let st = &stats[g];
            let finite =
                st.flags & (ROW_T_NAN | ROW_T_POSINF) == 0 && st.t_max != f32::NEG_INFINITY;
            let q_ok = plan.draft_kind != DRAFT_LOGITS
                || (st.flags & (ROW_Q_NAN | ROW_Q_POSINF) == 0 && st.q_max != f32::NEG_INFINITY);
            let Some(q_row) = rows.draft_row(g) else {
                continue;
            };
            if info.flags & REQ_GREEDY != 0 || !finite || !q_ok {
                continue;
            }
            let mut rho = 1.0f32;
            for &c in tree.children_of(s).iter().skip(1) {
                let mass = residual_mass(&rows, info, g, q_row, rho, row_cuts(plan, &cuts, g));
                out[info.row_offset as usize + 1 + c as usize] = mass;
                rho /= 1.0 + mass;
            }
        }
    }
    out
}

/// Verifies every request of a checked tree batch.
pub(crate) fn run(
    tp: &TreePlan,
    target: &[f32],
    draft: Option<&[f32]>,
    threads: usize,
) -> TreeOutput {
    let plan = &tp.plan;
    let (cuts, stats) = prepare(tp, target, draft, threads);
    let rows = Rows {
        plan,
        stats: &stats,
        target,
        draft,
        cuts: &cuts,
        fault: tp.fault,
    };
    let mut verdicts: Vec<Option<TreeVerdict>> = vec![None; plan.num_requests()];
    parallel_chunks(&mut verdicts, threads, |first, chunk| {
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = Some(walk(&rows, first + i, &tp.trees[first + i]));
        }
    });
    TreeOutput {
        requests: verdicts.into_iter().flatten().collect(),
    }
}

/// Everything a walk reads.
struct Rows<'a> {
    plan: &'a Plan,
    stats: &'a [RowStats],
    target: &'a [f32],
    draft: Option<&'a [f32]>,
    cuts: &'a [f32],
    fault: TreeFault,
}

impl Rows<'_> {
    fn target_row(&self, g: usize) -> &[f32] {
        let v = self.plan.vocab as usize;
        &self.target[g * v..(g + 1) * v]
    }
    /// The q row of global target row `g`, if it has one.
    fn draft_row(&self, g: usize) -> Option<&[f32]> {
        let d_row = self.plan.row_info[g][3];
        let dv = self.plan.draft_vocab as usize;
        match (self.draft, d_row) {
            (Some(d), row) if row != NO_INDEX => {
                Some(&d[row as usize * dv..(row as usize + 1) * dv])
            }
            _ => None,
        }
    }
}

/// The accept uniform of the `j`-th child tried at a row: word `j` of the accept stream there
/// (word 0 is the chain's `accept_uniform`).
fn child_uniform(info: &ReqInfo, pos: [u32; 2], j: usize) -> f32 {
    uniform_open(random_words(info.seed(), pos, STREAM_ACCEPT, (j / 4) as u32)[j % 4])
}

/// How the children of one node were settled.
enum Step {
    /// This child (a node index) was accepted.
    Accept(u32),
    /// None was: sample from the residual `max(ρ p − q, 0)` (with `q`) or from `p` without the
    /// excluded tokens.
    Reject { rho: f32, with_q: bool, status: u32 },
}

/// What the walk emits at one row: the token, its (processed, raw) logprobs, status bits.
struct Emit {
    token: i32,
    lp: (f32, f32),
    status: u32,
}

/// The walk of request `r` from the root down the accepted path.
fn walk(rows: &Rows<'_>, r: usize, tree: &TreeShape) -> TreeVerdict {
    let plan = rows.plan;
    let info = &plan.reqs[r];
    let greedy = info.flags & REQ_GREEDY != 0;
    let (mut accepted, mut tokens, mut lps) = (Vec::new(), Vec::new(), Vec::new());
    let mut slot = 0usize;
    let last = loop {
        let g = info.row_offset as usize + slot;
        let st = &rows.stats[g];
        let kids = tree.children_of(slot);
        let pos = row_position(info.position(), tree.depth[slot]);
        if st.flags & (ROW_T_NAN | ROW_T_POSINF) != 0 || st.t_max == f32::NEG_INFINITY {
            let status = if st.flags & (ROW_T_NAN | ROW_T_POSINF) != 0 {
                STATUS_TARGET_NONFINITE
            } else {
                STATUS_ALL_MASKED
            };
            let lp = (f32::NAN, f32::NAN);
            break Emit {
                token: st.t_arg as i32,
                lp,
                status,
            };
        }
        let step = if greedy {
            match kids
                .iter()
                .find(|&&c| tree.tokens[c as usize] == st.t_arg as i32)
            {
                Some(&c) => Step::Accept(c),
                None => {
                    let lp = logprobs_of(info, st, st.t_max);
                    break Emit {
                        token: st.t_arg as i32,
                        lp,
                        status: 0,
                    };
                }
            }
        } else if kids.is_empty() {
            Step::Reject {
                rho: 1.0,
                with_q: false,
                status: 0,
            }
        } else if plan.draft_kind == DRAFT_NONE {
            try_plain(rows, info, g, pos, tree, kids)
        } else {
            try_drawn(rows, info, g, pos, tree, kids)
        };
        match step {
            Step::Accept(c) => {
                accepted.push(c);
                tokens.push(tree.tokens[c as usize]);
                lps.push(logprobs_of(
                    info,
                    st,
                    logit_of(rows, g, tree.tokens[c as usize]),
                ));
                slot = c as usize + 1;
            }
            Step::Reject {
                rho,
                with_q,
                status,
            } => {
                let mut excluded: Vec<i32> =
                    kids.iter().map(|&c| tree.tokens[c as usize]).collect();
                excluded.sort_unstable();
                let race = Race {
                    pos,
                    stream: if kids.is_empty() {
                        STREAM_BONUS
                    } else {
                        STREAM_RESIDUAL
                    },
                    rho,
                    draft: if with_q { rows.draft_row(g) } else { None },
                    // Only children given without q leave the residual p without them; with
                    // q, the residual is max(ρ p − q, 0), or p itself where q is unusable.
                    excluded: if plan.draft_kind == DRAFT_NONE {
                        &excluded
                    } else {
                        &[]
                    },
                };
                break sample(rows, info, g, &race, status);
            }
        }
    };
    tokens.push(last.token);
    lps.push(last.lp);
    TreeVerdict {
        accepted_nodes: accepted,
        tokens,
        status: Status(last.status),
        seed: info.seed(),
        logprobs: (info.flags & REQ_LOGPROBS != 0).then(|| lps.iter().map(|l| l.0).collect()),
        raw_logprobs: (info.flags & REQ_RAW_LOGPROBS != 0)
            .then(|| lps.iter().map(|l| l.1).collect()),
    }
}

/// The logit of `token` at row `g` under the row's cut-off, as the statistics pass records a
/// drafted token's (`t_at_d`).
fn logit_of(rows: &Rows<'_>, g: usize, token: i32) -> f32 {
    masked(
        rows.target_row(g)[token as usize],
        row_cuts(rows.plan, rows.cuts, g).0,
    )
}

/// p(y) at a row, as the chain verifier computes it for a drafted token.
fn p_of(rows: &Rows<'_>, info: &ReqInfo, g: usize, token: i32) -> f32 {
    let st = &rows.stats[g];
    ((logit_of(rows, g, token) - st.t_max) * info.inv_temperature).exp() / st.t_sum
}

/// Children given without a distribution: child `j` is accepted with probability
/// `p(c_j) / (1 − Σ_{i<j} p(c_i))`, the mass of the residual its earlier siblings left.
fn try_plain(
    rows: &Rows<'_>,
    info: &ReqInfo,
    g: usize,
    pos: [u32; 2],
    tree: &TreeShape,
    kids: &[u32],
) -> Step {
    let mut removed = 0.0f32;
    for (j, &c) in kids.iter().enumerate() {
        let p = p_of(rows, info, g, tree.tokens[c as usize]);
        let left = if rows.fault == TreeFault::NoSiblingRenormalisation {
            1.0
        } else {
            1.0 - removed
        };
        // For j = 0 this is the chain's one-hot test `u · 1 < p(d)`, bit for bit.
        if child_uniform(info, pos, j) * left < p {
            return Step::Accept(c);
        }
        removed += p;
    }
    Step::Reject {
        rho: 1.0,
        with_q: false,
        status: 0,
    }
}

/// Children drawn i.i.d. from `q` (SpecInfer's multi-step speculative sampling). The residual
/// after `j` rejections is `max(ρ_j p − q, 0)` up to its mass `M_j`: ρ_1 = 1 and
/// ρ_{j+1} = ρ_j / (1 + M_j), since `norm(max(p_j − q, 0))` with `p_j = max(ρ_j p − q, 0) / M_j`
/// is `max(ρ_j p − (1 + M_j) q, 0)` up to scale. Child `j ≥ 1` is accepted iff
/// `u · q(c) · M_j < max(ρ_j p(c) − q(c), 0)`; child 0 iff `u · q(c) < p(c)`, the chain's test.
fn try_drawn(
    rows: &Rows<'_>,
    info: &ReqInfo,
    g: usize,
    pos: [u32; 2],
    tree: &TreeShape,
    kids: &[u32],
) -> Step {
    let plan = rows.plan;
    let st = &rows.stats[g];
    let greedy = info.flags & REQ_GREEDY != 0;
    if !greedy
        && plan.draft_kind == DRAFT_LOGITS
        && (st.flags & (ROW_Q_NAN | ROW_Q_POSINF) != 0 || st.q_max == f32::NEG_INFINITY)
    {
        // Unusable draft logits: every child rejected, the token from p (as for chains).
        return Step::Reject {
            rho: 1.0,
            with_q: false,
            status: STATUS_DRAFT_NONFINITE,
        };
    }
    let Some(q_row) = rows.draft_row(g) else {
        return Step::Reject {
            rho: 1.0,
            with_q: false,
            status: 0,
        };
    };
    let cuts = row_cuts(plan, rows.cuts, g);
    let q_of = |token: i32| -> f32 {
        let y = token as usize;
        if y >= plan.draft_vocab as usize {
            0.0
        } else if plan.draft_kind == DRAFT_LOGITS {
            ((masked(q_row[y], cuts.1) - st.q_max) * info.inv_temperature).exp() / st.q_sum
        } else {
            sanitize_prob(q_row[y])
        }
    };
    let mut rho = 1.0f32;
    for (j, &c) in kids.iter().enumerate() {
        let token = tree.tokens[c as usize];
        let (p, q) = (p_of(rows, info, g, token), q_of(token));
        let u = child_uniform(info, pos, j);
        let accept = if j == 0 || rows.fault == TreeFault::UnrenormalisedAccept {
            q > 0.0 && u * q < p
        } else {
            let mass = residual_mass(rows, info, g, q_row, rho, cuts);
            if mass.is_nan() || mass <= 0.0 {
                // The residual is empty (p_j = q up to rounding): the race falls back to p.
                break;
            }
            let accept = q > 0.0 && u * q * mass < (rho * p - q).max(0.0);
            if !accept {
                rho /= 1.0 + mass;
            }
            accept
        };
        if accept {
            return Step::Accept(c);
        }
    }
    Step::Reject {
        rho,
        with_q: true,
        status: 0,
    }
}

/// `M = Σ_y max(ρ p(y) − q(y), 0)` of row `g`, summed in the block rule's order.
fn residual_mass(
    rows: &Rows<'_>,
    info: &ReqInfo,
    g: usize,
    q_row: &[f32],
    rho: f32,
    cuts: (f32, f32),
) -> f32 {
    let mut st = rows.stats[g];
    st.rho = rho;
    row_mass(rows.plan, info, &st, rows.target_row(g), q_row, cuts)
}

/// The race over row `g`, and the token it emits (the residual's winner; p's if the residual
/// has no mass, flagged; the argmax if neither has).
fn sample(rows: &Rows<'_>, info: &ReqInfo, g: usize, race: &Race<'_>, status: u32) -> Emit {
    let st = &rows.stats[g];
    let cuts = row_cuts(rows.plan, rows.cuts, g);
    let best = race_row(rows.plan, info, st, rows.target_row(g), race, cuts);
    let mut status = status;
    let (mut token, mut logit) = (best.r_idx, best.r_logit);
    if token == NO_INDEX {
        token = best.p_idx;
        logit = best.p_logit;
        status |= STATUS_EMPTY_RESIDUAL;
    }
    if token == NO_INDEX {
        token = st.t_arg;
        logit = st.t_max;
    }
    Emit {
        token: token as i32,
        lp: logprobs_of(info, st, logit),
        status,
    }
}

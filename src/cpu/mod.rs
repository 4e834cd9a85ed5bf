//! The CPU backend: the twin of every kernel, run over host slices. It is a real backend for
//! machines without a GPU driver and the oracle of the GPU tests. Work is split over threads by
//! rows; the result does not depend on the thread count.

pub mod block_mass;
pub mod cutoff;
pub mod gather_rows;
pub mod residual_argmax;
pub mod row_stats;
pub mod tree;
pub mod verify;

use crate::batch::Plan;
use crate::layout::*;
use row_stats::RowInput;

/// How the CPU backend runs.
#[derive(Clone, Copy, Debug)]
pub struct TwinShape {
    /// Worker threads (1 = the calling thread only).
    pub threads: usize,
}

/// The cut-offs of every row (target rows, then draft rows) under the requests' top-k / top-p /
/// min-p, as the cutoff kernel leaves them; empty when no request filters.
pub(crate) fn cutoffs(plan: &Plan, target: &[f32], draft: Option<&[f32]>) -> Vec<f32> {
    if !plan.filters() {
        return Vec::new();
    }
    let v = plan.vocab as usize;
    let dv = plan.draft_vocab as usize;
    let mut cuts = vec![f32::NEG_INFINITY; plan.total_rows + plan.total_drafts];
    for (g, &[r, _, _, d_row]) in plan.row_info.iter().enumerate() {
        let info = &plan.reqs[r as usize];
        if info.flags & REQ_FILTER == 0 || info.flags & REQ_GREEDY != 0 {
            continue;
        }
        cuts[g] = cutoff::row_cutoff(&target[g * v..(g + 1) * v], info);
        if let (Some(d), true) = (draft, plan.draft_kind == DRAFT_LOGITS && d_row != NO_INDEX) {
            let d_row = d_row as usize;
            cuts[plan.total_rows + d_row] =
                cutoff::row_cutoff(&d[d_row * dv..(d_row + 1) * dv], info);
        }
    }
    cuts
}

/// The cut-off of target row `g` and of its draft row (−inf when nothing is cut).
pub(crate) fn row_cuts(plan: &Plan, cuts: &[f32], g: usize) -> (f32, f32) {
    if cuts.is_empty() {
        return (f32::NEG_INFINITY, f32::NEG_INFINITY);
    }
    let d_row = plan.row_info[g][3];
    let dcut = if d_row != NO_INDEX {
        cuts[plan.total_rows + d_row as usize]
    } else {
        f32::NEG_INFINITY
    };
    (cuts[g], dcut)
}

/// The inputs of one row of the statistics pass. `raw` is the batch's `PARAM_RAW` (every row
/// keeps the raw sums when some request asks for raw logprobs), computed once per batch by the
/// caller: it scans every request.
pub(crate) fn row_input<'a>(
    plan: &Plan,
    g: usize,
    target: &'a [f32],
    draft: Option<&'a [f32]>,
    (cuts, raw): (&[f32], bool),
) -> RowInput<'a> {
    let (cut, dcut) = row_cuts(plan, cuts, g);
    let v = plan.vocab as usize;
    let dv = plan.draft_vocab as usize;
    let [r, k_row, drafted, d_row] = plan.row_info[g];
    let info = &plan.reqs[r as usize];
    let greedy = info.flags & REQ_GREEDY != 0;
    let drafted = drafted as i32;
    let draft_row = if d_row != NO_INDEX {
        draft.map(|d| &d[d_row as usize * dv..(d_row as usize + 1) * dv])
    } else {
        None
    };
    let scores_draft = k_row < info.num_drafts;
    RowInput {
        target: &target[g * v..(g + 1) * v],
        draft_logits: if plan.draft_kind == DRAFT_LOGITS && scores_draft && !greedy {
            draft_row
        } else {
            None
        },
        draft_values: if drafted >= 0 { draft_row } else { None },
        drafted,
        greedy,
        inv_t: info.inv_temperature,
        cut,
        dcut,
        draft_is_logits: plan.draft_kind == DRAFT_LOGITS,
        raw,
        ent: info.flags & REQ_TYPICAL != 0,
    }
}

/// Runs a checked batch on the CPU and returns the packed output words
/// `[tokens | num_emitted | status]`, exactly as the GPU leaves them.
pub(crate) fn run(
    plan: &Plan,
    target: &[f32],
    draft: Option<&[f32]>,
    shape: TwinShape,
) -> Vec<u32> {
    let n = plan.num_requests();
    let v = plan.vocab as usize;
    let dv = plan.draft_vocab as usize;
    let cuts = cutoffs(plan, target, draft);
    let mut stats = vec![RowStats::default(); plan.total_rows];
    let raw = plan.logprob_flags() & PARAM_RAW != 0;
    parallel_chunks(&mut stats, shape.threads, |first, chunk| {
        for (i, st) in chunk.iter_mut().enumerate() {
            let input = row_input(plan, first + i, target, draft, (&cuts, raw));
            *st = row_stats::row(&input);
        }
    });
    let mut words = vec![0u32; plan.out_words()];
    let mut tasks: Vec<Task> = (0..n)
        .map(|r| verify::request(plan, r, &mut stats, &mut words))
        .collect();
    if tasks.iter().any(|t| t.kind == TASK_PENDING_BLOCK) {
        // Block requests with a draft distribution whose decision needs some mass: the masses
        // of the rows verify marked (`ROW_MASS_DUE`), then the joint decision, as block_mass and
        // block_settle do.
        let mut masses = vec![f32::NAN; plan.total_rows];
        parallel_chunks(&mut masses, shape.threads, |first, chunk| {
            for (i, m) in chunk.iter_mut().enumerate() {
                let g = first + i;
                let [r, k_row, _, d_row] = plan.row_info[g];
                let info = &plan.reqs[r as usize];
                if tasks[r as usize].kind != TASK_PENDING_BLOCK
                    || k_row == 0
                    || k_row >= info.num_drafts
                    || stats[g].flags & ROW_MASS_DUE == 0
                {
                    continue;
                }
                let (Some(d), d_row) = (draft, d_row as usize) else {
                    continue;
                };
                *m = block_mass::row_mass(
                    plan,
                    info,
                    &stats[g],
                    &target[g * v..(g + 1) * v],
                    &d[d_row * dv..(d_row + 1) * dv],
                    row_cuts(plan, &cuts, g),
                );
            }
        });
        for (r, task) in tasks.iter_mut().enumerate() {
            if task.kind == TASK_PENDING_BLOCK {
                *task = verify::block_settle(plan, r, &stats, &masses, &mut words);
            }
        }
    }
    let mut best = vec![Candidate::default(); n];
    parallel_chunks(&mut best, shape.threads, |first, chunk| {
        for (i, c) in chunk.iter_mut().enumerate() {
            let r = first + i;
            let task = &tasks[r];
            if task.kind == TASK_NONE {
                continue;
            }
            let info = &plan.reqs[r];
            let g = (info.row_offset + task.local_row) as usize;
            let d_row = (info.draft_offset + task.local_row) as usize;
            let draft_row = if task.kind == TASK_DRAFT_RESIDUAL || task.kind == TASK_BLOCK_RESIDUAL
            {
                draft.map(|d| &d[d_row * dv..(d_row + 1) * dv])
            } else {
                None
            };
            *c = residual_argmax::candidate(
                plan,
                info,
                task,
                &stats[g],
                &target[g * v..(g + 1) * v],
                draft_row,
                row_cuts(plan, &cuts, g),
            );
        }
    });
    for r in 0..n {
        let g = (plan.reqs[r].row_offset + tasks[r].local_row) as usize;
        residual_argmax::finish(plan, r, &tasks[r], &best[r], &stats[g], &mut words);
    }
    words
}

/// Applies `f(first_index, chunk)` to `threads` contiguous chunks of `items` in parallel.
pub(crate) fn parallel_chunks<T: Send>(
    items: &mut [T],
    threads: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let threads = threads.max(1).min(items.len().max(1));
    if threads == 1 {
        f(0, items);
        return;
    }
    let per = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (c, chunk) in items.chunks_mut(per).enumerate() {
            let f = &f;
            scope.spawn(move || f(c * per, chunk));
        }
    });
}

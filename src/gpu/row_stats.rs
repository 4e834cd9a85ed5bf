//! Pass 2: row_stats (`shaders/row_stats.wgsl`). Per window, per (row, block of chunks): the
//! max and the sums of the target (and draft) softmax, masked by the cut-offs when some request
//! filters. Reads the caller's rows, requests, row_info and cutoffs; writes `block_stats` (one
//! 48-byte partial per (row, chunk)) for verify to merge.

use super::bindings::{entry, params_entry, with_params};
use super::pipelines::{
    SPECIAL_ENTROPY, SPECIAL_HALF_WORDS, SPECIAL_MAX_ONLY, SPECIAL_PLAIN_BF16, SPECIAL_PLAIN_F16,
    SPECIAL_PLAIN_F32, SPECIAL_RAW, SPECIAL_WIDE,
};
use super::shape::Shape;
use super::windows::WindowRows;
use super::workspace::Workspace;
use super::{GpuBackend, GpuRows};
use crate::batch::Plan;
use crate::layout::*;
use crate::shaders::Kernel;

/// row_stats' bindings: Params, target and draft rows, requests, row_info, the block statistics
/// it writes, the vec4 views of the target and draft rows, the cut-offs.
pub(super) fn layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    with_params(8, &[5])
}

/// row_stats_verify's bindings: row_stats' (binding 5 holds the partials as words, then a
/// count per request), then verify's draft ids, rates, tasks, output, merged rows and block
/// masses at 9–14.
pub(super) fn verify_layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    with_params(14, &[5, 11, 12, 13])
}

/// The row_stats specialisation of a batch: raw sums when some request asks for raw logprobs,
/// the entropy numerator when some request uses typical acceptance, and when nothing is cut,
/// plain loads for the target's element type (f32 only when the draft rows are f32 too; the
/// half paths read draft rows of any type, two lanes an invocation from `half_min_chunks`
/// chunks, below it a lane an invocation, `SPECIAL_HALF_WORDS`, where no sums are raw or
/// entropy's);
/// and for an all-greedy batch without raw sums, the maximum alone (`MAX_ONLY`), over the
/// device's workgroup size (`WIDE`) for batches of at most `wide_max_chunks` chunks.
pub(super) fn special(
    plan: &Plan,
    filters: bool,
    (target, draft): (GpuRows<'_>, Option<GpuRows<'_>>),
    half_min_chunks: usize,
    wide_max_chunks: usize,
) -> u32 {
    let raw = if plan.logprob_flags() & PARAM_RAW != 0 {
        SPECIAL_RAW
    } else {
        0
    };
    let ent = if plan.reqs.iter().any(|r| r.flags & REQ_TYPICAL != 0) {
        SPECIAL_ENTROPY
    } else {
        0
    };
    // The half paths' invocations play two lanes each (one 16-byte load is two lanes' groups),
    // so small batches get half the invocations: on an H200 at R = 1, k = 4 (5 rows of 151,936,
    // 190 chunks) bf16 rows took 32.7 µs that way and 26.8 µs through the dtype-dispatching
    // loads (two processes of one run), while from R = 32 (6,080 chunks) the half path was
    // 1.2-2.1x faster (benches/results/nvidia-h200-vulkan-half-rows-*). Below `half_min_chunks`
    // chunks the half words run instead: a lane an invocation as for f32 rows, without the
    // dtype dispatch (bf16 GPU time 0.88-0.94x of the dispatching loads at R = 1, H200,
    // docs/performance.md). The raw and entropy sums keep the dispatching loads there, sparing
    // their pipelines.
    let chunks = plan.total_rows * (plan.vocab.div_ceil(CHUNK as u32) as usize);
    let small = chunks < half_min_chunks;
    let half_words = if small { SPECIAL_HALF_WORDS } else { 0 };
    let plain = match target.dtype {
        _ if filters => 0,
        crate::Dtype::F16 | crate::Dtype::Bf16 if small && raw | ent != 0 => 0,
        crate::Dtype::F32 if draft.is_none_or(|d| d.dtype == crate::Dtype::F32) => {
            SPECIAL_PLAIN_F32
        }
        crate::Dtype::F32 => 0,
        crate::Dtype::F16 => SPECIAL_PLAIN_F16 | half_words,
        crate::Dtype::Bf16 => SPECIAL_PLAIN_BF16 | half_words,
    };
    // An all-greedy batch keeps of each row only its maximum, the index holding it and the
    // flags; compiling the sums out of the pipeline took greedy GPU time to 0.93x (0.88-0.97x)
    // on an H200 (`docs/performance.md`), where the runtime test alone kept their registers.
    let max_only = if raw | ent == 0 && plan.reqs.iter().all(|r| r.flags & REQ_GREEDY != 0) {
        SPECIAL_MAX_ONLY
    } else {
        0
    };
    // Small all-greedy batches reduce each chunk over the whole workgroup: one round of loads
    // per lane instead of four. On an H200 row_stats took 0.87-0.99x up to 1,024 chunks and
    // 1.00-1.25x above, where the batch no longer fits the GPU in one wave and the wider tree's
    // barriers cost more than the rounds of loads they save (`docs/performance.md`). The half
    // paths of two lanes an invocation keep their own layout.
    let pairs = plain & (SPECIAL_PLAIN_F16 | SPECIAL_PLAIN_BF16) != 0 && half_words == 0;
    let wide = if max_only != 0 && !pairs && chunks <= wide_max_chunks {
        SPECIAL_WIDE
    } else {
        0
    };
    raw | ent | plain | max_only | wide
}

impl GpuBackend {
    /// The fewest chunks for which half-precision rows take their plain path of two lanes an
    /// invocation: half the workgroups a pass aims for (4,096 by default). Below it they take
    /// the half words. On an H200 (bf16 target rows, V = 151,936) the half words were faster up
    /// to 2,664 chunks (R = 8, k = 4: 0.78-0.80x) and the pairs from 5,920 (R = 32, k = 4 sampled
    /// 0.95-0.96x, though greedy 1.11x there; R = 128 0.80-0.95x), one run,
    /// `benches/results/nvidia-h200-vulkan-bf16-half-words.csv`.
    pub(super) fn half_min_chunks(&self) -> usize {
        (self.target_workgroups / 2) as usize
    }

    /// The most chunks for which an all-greedy batch takes row_stats' `WIDE` pipeline
    /// (`VerifierOptions::wide_greedy_chunks`; 0: never, as on devices whose workgroups are no
    /// wider than the contract's 64 lanes).
    pub(super) fn wide_max_chunks(&self) -> usize {
        if self.kernels.wg as usize > CHUNK_LANES {
            self.wide_greedy_chunks as usize
        } else {
            0
        }
    }

    /// The fewest chunks of an all-greedy batch settled in row_stats on one-chunk workgroups
    /// that takes the narrow settle (`VerifierOptions::narrow_greedy_chunks`; 0: never, as
    /// where half the device's workgroup size is no wider than the contract's 64 lanes).
    pub(super) fn narrow_min_chunks(&self) -> u64 {
        match self.narrow_greedy_chunks {
            0 => 0,
            _ if self.kernels.wg / 2 <= CHUNK_LANES as u32 => 0,
            n => u64::from(n),
        }
    }

    /// Chunks per row_stats workgroup for `rows` rows of `vocab`: about `target_workgroups`
    /// workgroups in all. Tuning only: the statistics never depend on it.
    pub fn block_chunks(&self, vocab: u32, rows: usize) -> u32 {
        let chunks = vocab.div_ceil(CHUNK as u32);
        let total = chunks as u64 * rows as u64;
        (total.div_ceil(u64::from(self.target_workgroups)) as u32).clamp(1, chunks)
    }

    /// One row_stats bind group per window. Where the batch settles in row_stats
    /// (`Shape::settle_in_stats`), binding 5 is the output buffer, not the chunk partials.
    pub(super) fn row_stats_groups(
        &self,
        ws: &Workspace,
        shape: &Shape,
        rows: &[WindowRows<'_>],
    ) -> Vec<wgpu::BindGroup> {
        let results = if shape.settle_in_stats {
            ws.out.get()
        } else {
            ws.block_stats.get()
        };
        rows.iter()
            .map(|r| {
                let mut entries = vec![
                    params_entry(ws),
                    r.target(),
                    r.draft(&self.kernels.dummy),
                    ws.meta_entry(3, ws.meta_at.requests),
                    ws.meta_entry(4, ws.meta_at.row_info),
                    entry(5, results),
                    r.target_vec4(&self.kernels.dummy),
                    r.draft_vec4(&self.kernels.dummy),
                    entry(8, ws.cutoffs.get()),
                ];
                if !shape.verify_in_stats {
                    return self.bind_group(ws, Kernel::RowStats, "specdec.row_stats", &entries);
                }
                // verify's bindings besides the requests (verify.rs, `verify_group`).
                entries.extend([
                    ws.meta_entry(9, ws.meta_at.draft_ids),
                    ws.meta_entry(10, ws.meta_at.rates),
                    entry(11, ws.tasks.get()),
                    entry(12, ws.out.get()),
                    entry(13, ws.row_stats.get()),
                    entry(14, self.block_masses(ws, shape)),
                ]);
                self.bind_group(
                    ws,
                    Kernel::RowStatsVerify,
                    "specdec.row_stats_verify",
                    &entries,
                )
            })
            .collect()
    }

    /// Dispatches row_stats over every window: `stats_blocks` × the window's rows.
    pub(super) fn record_row_stats(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        groups: &[wgpu::BindGroup],
    ) {
        let (kernel, entry) = match (shape.special & SPECIAL_WIDE != 0, shape.settle_in_stats) {
            _ if shape.verify_in_stats => (Kernel::RowStatsVerify, "block_verify"),
            // Blocks of several chunks fold them as one (`block_wide_settle_blocks`); blocks of
            // one keep the entry without that loop, which cost them up to 8 % (H200).
            (true, true) if shape.block_chunks > 1 => {
                (Kernel::RowStats, "block_wide_settle_blocks")
            }
            (true, true) => (Kernel::RowStats, "block_wide_settle"),
            (true, false) => (Kernel::RowStats, "block_wide"),
            _ => (Kernel::RowStats, "block"),
        };
        let special = if shape.shared_runs {
            shape.special | super::pipelines::SPECIAL_SHARED_RUNS
        } else if shape.narrow_settle && entry == "block_wide_settle" {
            shape.special | super::pipelines::SPECIAL_NARROW
        } else {
            shape.special
        };
        pass.set_pipeline(self.special_pipeline(kernel, entry, special));
        for (i, w) in shape.windows.iter().enumerate() {
            shape.slots.bind(pass, &groups[i], i);
            pass.dispatch_workgroups(shape.stats_blocks, (w.row_end - w.row_begin) as u32, 1);
        }
    }
}

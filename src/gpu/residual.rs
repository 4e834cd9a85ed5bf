//! Pass 5: residual_argmax (`shaders/residual_argmax.wgsl`). Samples the one token each
//! non-greedy request still needs, by an exponential race (Gumbel-max) over the rejected row's
//! residual or the bonus row: `block` writes one candidate per (request, vocabulary block) to
//! `candidates`, `merge` picks the winner per request and writes it to `out`. Reads the caller's
//! rows, requests, verify's row statistics and tasks, and the cut-offs.

use super::bindings::{entry, params_entry, with_params};
use super::shape::Shape;
use super::windows::WindowRows;
use super::workspace::Workspace;
use super::GpuBackend;
use crate::shaders::Kernel;

/// residual_argmax' bindings: Params, target and draft rows, requests, row statistics, tasks,
/// then the candidates and output it writes, and the cut-offs.
pub(super) fn layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    with_params(8, &[6, 7])
}

impl GpuBackend {
    /// Vocabulary entries per residual_argmax workgroup for `requests` requests of `vocab`: about
    /// `target_workgroups / 16` workgroups in all (at least 4 entries per lane), a multiple of 4,
    /// and few enough blocks for one dispatch dimension. Any value gives the same tokens (the
    /// argmax does not depend on how it is split). Longer blocks raise each workgroup's race
    /// bound sooner and let more lanes take the quad tests (at least 4 quads a lane), so more
    /// quads are settled without their per-entry test: on an H200, a sixteenth took GPU time to
    /// 0.957x of a quarter (the residual pass 0.85x at R = 32, 0.88x at R = 128), an eighth and a
    /// thirty-second 0.98-0.99x, a sixty-fourth 1.03x (`docs/performance.md`).
    pub fn residual_block_len(&self, vocab: u32, requests: usize) -> u32 {
        let max_blocks = self
            .kernels
            .device
            .limits()
            .max_compute_workgroups_per_dimension
            .max(1);
        let lanes = 4 * self.kernels.wg;
        let want = (u64::from(vocab) * requests as u64)
            .div_ceil(u64::from(self.target_workgroups / 16).max(1));
        let len = (want.min(u64::from(vocab)) as u32)
            .next_multiple_of(lanes)
            .max(lanes);
        len.max(vocab.div_ceil(max_blocks).next_multiple_of(4))
    }

    /// One residual_argmax bind group per window. The early race reads the draft ids at binding
    /// 2 (its one-hot batches have no draft values there).
    pub(super) fn residual_groups(
        &self,
        ws: &Workspace,
        shape: &Shape,
        rows: &[WindowRows<'_>],
    ) -> Vec<wgpu::BindGroup> {
        rows.iter()
            .map(|r| {
                self.bind_group(
                    ws,
                    Kernel::ResidualArgmax,
                    "specdec.residual_argmax",
                    &[
                        params_entry(ws),
                        r.target(),
                        if shape.early {
                            ws.meta_entry(2, ws.meta_at.draft_ids)
                        } else {
                            r.draft(&self.kernels.dummy)
                        },
                        ws.meta_entry(3, ws.meta_at.requests),
                        entry(4, ws.row_stats.get()),
                        entry(5, ws.tasks.get()),
                        entry(6, ws.candidates.get()),
                        entry(7, ws.out.get()),
                        entry(8, ws.cutoffs.get()),
                    ],
                )
            })
            .collect()
    }

    /// The bind groups of the early race beside row_stats: `residual` itself, except where
    /// row_stats_verify verifies the batch (`Shape::verify_in_stats`). That kernel writes the
    /// merged rows, the tasks and the output, which the race binds (4, 5, 7) but never reads in
    /// its early form (its tasks come from the row, `early_task`, and log-domain keys need no
    /// row statistics); bound there, they would make the pass order the race after row_stats
    /// instead of beside it (one-hot R = 1 1.19-1.25x on an H200, `docs/performance.md`). So
    /// the race binds the dummies there, and `merge` the real buffers through `residual`.
    pub(super) fn early_race_groups(
        &self,
        ws: &Workspace,
        shape: &Shape,
        rows: &[WindowRows<'_>],
        residual: &[wgpu::BindGroup],
    ) -> Vec<wgpu::BindGroup> {
        if !(shape.early && shape.verify_in_stats) {
            return residual.to_vec();
        }
        rows.iter()
            .map(|r| {
                self.bind_group(
                    ws,
                    Kernel::ResidualArgmax,
                    "specdec.residual_argmax.early",
                    &[
                        params_entry(ws),
                        r.target(),
                        ws.meta_entry(2, ws.meta_at.draft_ids),
                        ws.meta_entry(3, ws.meta_at.requests),
                        entry(4, &self.kernels.dummy),
                        entry(5, &self.kernels.dummy),
                        entry(6, ws.candidates.get()),
                        entry(7, &self.kernels.dummy_rw),
                        entry(8, ws.cutoffs.get()),
                    ],
                )
            })
            .collect()
    }

    /// Dispatches residual_argmax's `block` over every window: one workgroup per (vocabulary
    /// block, request, candidate row). Called twice per pass: `beside_stats` right after
    /// row_stats, where only the early race (`Shape::early`) dispatches (it writes only the
    /// candidates, which nothing before it touches, so wgpu orders it after nothing and the two
    /// run side by side), and after verify, where every other race does. An all-greedy batch
    /// has nothing to resample and dispatches nothing.
    pub(super) fn record_residual_blocks(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        groups: &[wgpu::BindGroup],
        beside_stats: bool,
    ) {
        if !shape.needs_residual || shape.early != beside_stats {
            return;
        }
        let special = shape.residual_special();
        pass.set_pipeline(self.special_pipeline(Kernel::ResidualArgmax, "block", special));
        for (i, w) in shape.windows.iter().enumerate() {
            shape.slots.bind(pass, &groups[i], i);
            let requests = (w.req_end - w.req_begin) as u32;
            pass.dispatch_workgroups(shape.num_blocks, requests, shape.candidate_rows);
        }
    }

    /// Dispatches residual_argmax's `merge`: one workgroup per request (nothing for an
    /// all-greedy batch).
    pub(super) fn record_residual_merge(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        groups: &[wgpu::BindGroup],
    ) {
        if !shape.needs_residual {
            return;
        }
        // The blocks' pipeline's specialisation: of its constants only EARLY (where the
        // candidates are) changes the merge, whose half-row pipelines are not built (it reads
        // no rows).
        let special = shape.residual_special() & !shape.half_race;
        pass.set_pipeline(self.special_pipeline(Kernel::ResidualArgmax, "merge", special));
        shape.slots.bind(pass, &groups[0], 0);
        pass.dispatch_workgroups(shape.n as u32, 1, 1);
    }
}

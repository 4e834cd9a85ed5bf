//! Pass 3: verify (`shaders/verify.wgsl`). One workgroup per request merges its rows'
//! statistics, decides acceptance (rejection sampling, greedy, synthetic, typical; block
//! verification in two steps), and writes the accepted tokens, statuses and logprobs to `out`,
//! the per-row statistics to `row_stats` and the residual tasks to `tasks`. Its `block_settle`
//! entry takes the joint decision of block requests once block_mass has their masses.

use super::bindings::{bound, entry, params_entry, with_params};
use super::pipelines::{SPECIAL_ENTROPY, SPECIAL_RAW, SPECIAL_WIDE};
use super::shape::Shape;
use super::workspace::Workspace;
use super::GpuBackend;
use crate::shaders::Kernel;

/// verify's bindings: Params, requests, block statistics, draft ids, synthetic rates, then the
/// tasks, output and row statistics it writes, and the block masses.
pub(super) fn layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    with_params(8, &[5, 6, 7])
}

impl GpuBackend {
    /// verify's one bind group (it reads the whole batch through the first window's slot).
    pub(super) fn verify_group(&self, ws: &Workspace, shape: &Shape) -> wgpu::BindGroup {
        let tables = [
            ws.meta_part(ws.meta_at.draft_ids),
            ws.meta_part(ws.meta_at.rates),
            self.block_masses(ws, shape).as_entire_buffer_binding(),
        ];
        self.verify_group_over(ws, tables)
    }

    /// The block masses verify's block rule reads (block_mass' output) where the batch has
    /// requests that need them, else the dummy: bound by verify and by row_stats_verify.
    pub(super) fn block_masses<'a>(&'a self, ws: &'a Workspace, shape: &Shape) -> &'a wgpu::Buffer {
        if shape.block_masses {
            ws.masses.get()
        } else {
            &self.kernels.dummy
        }
    }

    /// verify's bind group with `tables` at bindings 3, 4 and 8 (draft ids, rates, block
    /// masses for chains; the tree table, the tree values and nothing for trees).
    pub(super) fn verify_group_over(
        &self,
        ws: &Workspace,
        tables: [wgpu::BufferBinding<'_>; 3],
    ) -> wgpu::BindGroup {
        let [ids, rates, masses] = tables;
        self.bind_group(
            ws,
            Kernel::Verify,
            "specdec.verify",
            &[
                params_entry(ws),
                ws.meta_entry(1, ws.meta_at.requests),
                entry(2, ws.block_stats.get()),
                bound(3, ids),
                bound(4, rates),
                entry(5, ws.tasks.get()),
                entry(6, ws.out.get()),
                entry(7, ws.row_stats.get()),
                bound(8, masses),
            ],
        )
    }

    /// verify merges the same optional sums (raw, entropy) as row_stats leaves: the same
    /// specialisation, less the load path; and the greedy merge over the device's workgroup
    /// size (`SPECIAL_WIDE`) where the shape says so.
    fn verify_special(shape: &Shape) -> u32 {
        let wide = if shape.verify_wide { SPECIAL_WIDE } else { 0 };
        shape.special & (SPECIAL_RAW | SPECIAL_ENTROPY) | wide
    }

    /// Dispatches verify's `main`: one workgroup per request.
    pub(super) fn record_verify(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        group: &wgpu::BindGroup,
    ) {
        self.record_verify_entry(pass, shape, group, "main");
    }

    /// Dispatches verify's `block_settle` (after block_mass): the joint decision of block
    /// requests with a draft distribution.
    pub(super) fn record_block_settle(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        group: &wgpu::BindGroup,
    ) {
        self.record_verify_entry(pass, shape, group, "block_settle");
    }

    /// One workgroup per request of verify's `entry`, in the batch's specialisation.
    fn record_verify_entry(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        group: &wgpu::BindGroup,
        entry: &'static str,
    ) {
        pass.set_pipeline(self.special_pipeline(
            Kernel::Verify,
            entry,
            Self::verify_special(shape),
        ));
        shape.slots.bind(pass, group, 0);
        pass.dispatch_workgroups(shape.n as u32, 1, 1);
    }
}

//! Pass 4: block_mass (`shaders/block_mass.wgsl`). Only for batches with block requests that
//! give a draft distribution: per (row, chunk), the partial of
//! `R_j = Σ_y max(ρ_j p_{j+1}(y) − q_{j+1}(y), 0)`. Reads the caller's rows, requests, row_info,
//! verify's row statistics and the cut-offs; writes `masses` for verify's `block_settle`.

use super::bindings::{bound, entry, params_entry, with_params};
use super::shape::Shape;
use super::windows::WindowRows;
use super::workspace::Workspace;
use super::GpuBackend;
use crate::shaders::Kernel;

/// block_mass' bindings: Params, target and draft rows, requests, row_info, row statistics,
/// cut-offs, and the masses it writes.
pub(super) fn layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    with_params(7, &[7])
}

impl GpuBackend {
    /// One block_mass bind group per window (none when the batch has no block masses).
    pub(super) fn block_mass_groups(
        &self,
        ws: &Workspace,
        shape: &Shape,
        rows: &[WindowRows<'_>],
    ) -> Vec<wgpu::BindGroup> {
        if !shape.block_masses {
            return Vec::new();
        }
        self.mass_groups_over(ws, rows, ws.meta_part(ws.meta_at.row_info))
    }

    /// One block_mass bind group per window with `table` at binding 4 (`row_info` for chains,
    /// the tree table for trees; `masses` holds the block masses or the tree values).
    pub(super) fn mass_groups_over(
        &self,
        ws: &Workspace,
        rows: &[WindowRows<'_>],
        table: wgpu::BufferBinding<'_>,
    ) -> Vec<wgpu::BindGroup> {
        rows.iter()
            .map(|r| {
                self.bind_group(
                    ws,
                    Kernel::BlockMass,
                    "specdec.block_mass",
                    &[
                        params_entry(ws),
                        r.target(),
                        r.draft(&self.kernels.dummy),
                        ws.meta_entry(3, ws.meta_at.requests),
                        bound(4, table.clone()),
                        entry(5, ws.row_stats.get()),
                        entry(6, ws.cutoffs.get()),
                        entry(7, ws.masses.get()),
                    ],
                )
            })
            .collect()
    }

    /// Dispatches block_mass over every window: one workgroup per (chunk, row).
    pub(super) fn record_block_mass(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        groups: &[wgpu::BindGroup],
    ) {
        let plain = shape.plain_loads();
        pass.set_pipeline(self.special_pipeline(Kernel::BlockMass, "main", plain));
        for (i, w) in shape.windows.iter().enumerate() {
            shape.slots.bind(pass, &groups[i], i);
            pass.dispatch_workgroups(shape.num_chunks, (w.row_end - w.row_begin) as u32, 1);
        }
    }
}

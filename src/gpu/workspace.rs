//! Step 3: the pooled workspace. The buffers one in-flight verification writes and reads
//! (metadata, statistics, cut-offs, candidates, packed output, readback, upload staging), grown to
//! the batch and reused across calls through a small pool.

use super::shape::Shape;
use super::GpuBackend;
use crate::batch::Plan;

/// A buffer that grows (to the next power of two) when a batch needs more.
pub(super) struct Grow {
    buffer: Option<wgpu::Buffer>,
    usage: wgpu::BufferUsages,
    label: &'static str,
}

impl Grow {
    fn new(label: &'static str, usage: wgpu::BufferUsages) -> Self {
        Grow {
            buffer: None,
            usage,
            label,
        }
    }
    pub(super) fn ensure(&mut self, device: &wgpu::Device, bytes: u64) -> &wgpu::Buffer {
        let bytes = bytes.max(16).next_multiple_of(16);
        if self.buffer.as_ref().is_none_or(|b| b.size() < bytes) {
            self.buffer = Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(self.label),
                size: bytes.next_power_of_two(),
                usage: self.usage,
                mapped_at_creation: false,
            }));
        }
        self.buffer.as_ref().expect("just ensured")
    }
    pub(super) fn get(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("ensured before use")
    }
}

/// The buffers of one in-flight verification, pooled and reused across calls.
pub(crate) struct Workspace {
    pub(super) params: Grow,
    pub(super) requests: Grow,
    pub(super) row_info: Grow,
    pub(super) draft_ids: Grow,
    pub(super) rates: Grow,
    pub(super) block_stats: Grow,
    pub(super) row_stats: Grow,
    pub(super) tasks: Grow,
    pub(super) candidates: Grow,
    pub(super) masses: Grow,
    pub(super) cutoffs: Grow,
    pub(super) cut_state: Grow,
    pub(super) out: Grow,
    pub(super) readback: Grow,
    pub(super) upload_target: Grow,
    pub(super) upload_draft: Grow,
}

impl Workspace {
    fn new() -> Self {
        use wgpu::BufferUsages as U;
        let storage = U::STORAGE | U::COPY_DST;
        Workspace {
            params: Grow::new("specdec.params", U::UNIFORM | U::COPY_DST),
            requests: Grow::new("specdec.requests", storage),
            row_info: Grow::new("specdec.row_info", storage),
            draft_ids: Grow::new("specdec.draft_ids", storage),
            rates: Grow::new("specdec.rates", storage),
            block_stats: Grow::new("specdec.block_stats", storage),
            row_stats: Grow::new("specdec.row_stats", storage),
            tasks: Grow::new("specdec.tasks", storage),
            candidates: Grow::new("specdec.candidates", storage),
            // COPY_SRC: the tree values are read back by a test hook (tree_masses_blocking).
            masses: Grow::new("specdec.masses", storage | U::COPY_SRC),
            cutoffs: Grow::new("specdec.cutoffs", storage | U::COPY_SRC),
            cut_state: Grow::new("specdec.cut_state", U::STORAGE),
            out: Grow::new("specdec.out", storage | U::COPY_SRC),
            readback: Grow::new("specdec.readback", U::MAP_READ | U::COPY_DST),
            upload_target: Grow::new("specdec.upload_target", storage),
            upload_draft: Grow::new("specdec.upload_draft", storage),
        }
    }
}

impl GpuBackend {
    pub(crate) fn take_workspace(&self) -> Workspace {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_else(Workspace::new)
    }

    pub(crate) fn give_back(&self, ws: Workspace) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a burst of concurrent calls must not keep its buffers forever.
        if pool.len() < 4 {
            pool.push(ws);
        }
    }

    /// Returns a workspace to the pool after a call that completed; after a failed one (a
    /// timeout, a lost device) the GPU may still use its buffers, so it is dropped instead (wgpu
    /// frees them once the GPU is done).
    pub(crate) fn give_back_if_ok<T, E>(&self, ws: Workspace, result: &Result<T, E>) {
        if result.is_ok() {
            self.give_back(ws);
        }
    }

    /// Grows the workspace to what `plan` in `shape` needs. Block masses, the cut-offs' scratch
    /// and the cut-offs themselves are only sized for batches that run their passes (the others
    /// bind the dummy or a minimum-size buffer they never read).
    pub(super) fn ensure_workspace(&self, ws: &mut Workspace, plan: &Plan, shape: &Shape) {
        let dev = &self.device;
        let n = shape.n;
        let slots = (shape.windows.len() + shape.cut.group_slots).max(1);
        ws.params.ensure(dev, shape.slot_size * slots as u64);
        ws.requests.ensure(dev, (n * 64) as u64);
        ws.row_info.ensure(dev, (plan.total_rows * 16) as u64);
        ws.draft_ids.ensure(dev, (plan.total_drafts * 4) as u64);
        ws.rates.ensure(dev, (plan.rates.len() * 4) as u64);
        ws.block_stats.ensure(
            dev,
            plan.total_rows as u64 * u64::from(shape.num_chunks) * 48,
        );
        ws.row_stats.ensure(dev, (plan.total_rows * 48) as u64);
        ws.tasks.ensure(dev, (n * 16) as u64);
        ws.candidates
            .ensure(dev, n as u64 * u64::from(shape.num_blocks) * 32);
        ws.cutoffs.ensure(dev, (shape.cut.words * 4) as u64);
        // Block masses: a partial per (row, chunk), only for batches with block requests that
        // give a draft distribution (the others bind the dummy).
        if shape.block_masses {
            ws.masses.ensure(
                dev,
                plan.total_rows as u64 * u64::from(shape.num_chunks) * 4,
            );
        }
        if shape.filters {
            ws.cut_state
                .ensure(dev, shape.cut.state_bytes(plan.total_rows));
        }
        ws.out.ensure(dev, (shape.out_words * 4) as u64);
        ws.readback.ensure(dev, (shape.out_words * 4) as u64);
    }
}

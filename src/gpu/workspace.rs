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
    /// Whether `b` is this buffer.
    fn is(&self, b: &wgpu::Buffer) -> bool {
        self.buffer.as_ref() == Some(b)
    }
}

/// A bind group's identity: its kernel's layout and every buffer range it binds (binding,
/// buffer, offset, size; `u64::MAX` for "to the end").
#[derive(PartialEq, Eq)]
pub(super) struct GroupKey {
    kernel: crate::shaders::Kernel,
    ranges: Vec<(u32, wgpu::Buffer, u64, u64)>,
}

/// Bind groups kept by a workspace (see `GpuBackend::bind_group`); cleared when it holds more.
const MAX_KEPT_GROUPS: usize = 32;

/// Where each part of a call's metadata sits in [`Workspace::meta`]: byte offset and size.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MetaLayout {
    /// The Params slots (one per window, then one per cutoff group).
    pub params: (u64, u64),
    /// The request table.
    pub requests: (u64, u64),
    /// The row table.
    pub row_info: (u64, u64),
    /// The draft token ids.
    pub draft_ids: (u64, u64),
    /// The synthetic rates.
    pub rates: (u64, u64),
}

impl MetaLayout {
    /// The parts one after another, each from a multiple of `align` (the device's storage and
    /// uniform offset alignment) and at least 16 bytes (a binding is never empty).
    pub fn new(
        align: u64,
        params: u64,
        requests: u64,
        row_info: u64,
        draft_ids: u64,
        rates: u64,
    ) -> Self {
        let mut at = 0u64;
        let mut part = |bytes: u64| {
            let size = bytes.max(16).next_multiple_of(16);
            let offset = at;
            at = (offset + size).next_multiple_of(align);
            (offset, size)
        };
        MetaLayout {
            params: part(params),
            requests: part(requests),
            row_info: part(row_info),
            draft_ids: part(draft_ids),
            rates: part(rates),
        }
    }

    /// Bytes the metadata buffer needs.
    pub fn end(&self) -> u64 {
        self.rates.0 + self.rates.1
    }
}

/// The buffers of one in-flight verification, pooled and reused across calls.
pub(crate) struct Workspace {
    /// Every part of a call's metadata (Params slots, requests, rows, draft ids, rates) in one
    /// buffer, written by one `queue.write_buffer`: wgpu creates, maps and frees a staging
    /// buffer for each write, and five writes per call cost host time on every call.
    pub(super) meta: Grow,
    /// Where the parts of the last call's metadata sit in `meta`.
    pub(super) meta_at: MetaLayout,
    /// A tree batch's node table (chains keep their draft ids in `meta`).
    pub(super) tree_table: Grow,
    /// Bind groups of earlier calls over this workspace's own buffers, by what they bind.
    groups: std::sync::Mutex<Vec<(GroupKey, wgpu::BindGroup)>>,
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
            meta: Grow::new("specdec.meta", storage | U::UNIFORM),
            meta_at: MetaLayout::default(),
            tree_table: Grow::new("specdec.tree_table", storage),
            groups: std::sync::Mutex::new(Vec::new()),
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

    /// Drops the kept bind groups: after a recording failed, one of them may be a group whose
    /// creation failed validation, and reusing it would fail the next call that binds the same
    /// ranges.
    pub(crate) fn forget_groups(&self) {
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Whether `b` is one of this workspace's buffers.
    fn owns(&self, b: &wgpu::Buffer) -> bool {
        [
            &self.meta,
            &self.tree_table,
            &self.block_stats,
            &self.row_stats,
            &self.tasks,
            &self.candidates,
            &self.masses,
            &self.cutoffs,
            &self.cut_state,
            &self.out,
            &self.upload_target,
            &self.upload_draft,
        ]
        .iter()
        .any(|g| g.is(b))
    }

    /// One part of the metadata as a buffer binding.
    pub(super) fn meta_part(&self, part: (u64, u64)) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: self.meta.get(),
            offset: part.0,
            size: std::num::NonZeroU64::new(part.1),
        }
    }

    /// A bind group entry over one part of the metadata.
    pub(super) fn meta_entry(&self, binding: u32, part: (u64, u64)) -> wgpu::BindGroupEntry<'_> {
        super::bindings::bound(binding, self.meta_part(part))
    }
}

impl GpuBackend {
    /// A bind group for `kernel` over `entries` (buffer bindings only). When every buffer it
    /// binds is the workspace's own or the backend's dummy, the group is kept in the workspace
    /// and the next call that binds the same ranges reuses it: creating bind groups is host time
    /// on every call, and a pooled workspace binds the same buffers call after call (a decode
    /// loop of one batch shape binds the same ranges too). Groups over a caller's buffers are
    /// made afresh each call and not kept, so a workspace never keeps a caller's buffer alive.
    pub(super) fn bind_group(
        &self,
        ws: &Workspace,
        kernel: crate::shaders::Kernel,
        label: &'static str,
        entries: &[wgpu::BindGroupEntry<'_>],
    ) -> wgpu::BindGroup {
        let ranges: Option<Vec<_>> = entries
            .iter()
            .map(|e| match &e.resource {
                wgpu::BindingResource::Buffer(b)
                    if ws.owns(b.buffer) || *b.buffer == self.dummy =>
                {
                    let size = b.size.map_or(u64::MAX, |s| s.get());
                    Some((e.binding, b.buffer.clone(), b.offset, size))
                }
                _ => None,
            })
            .collect();
        let key = ranges.map(|ranges| GroupKey { kernel, ranges });
        let mut kept = ws.groups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = &key {
            if let Some((_, g)) = kept.iter().find(|(held, _)| held == k) {
                return g.clone();
            }
        }
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &self.layouts[&kernel],
            entries,
        });
        if let Some(k) = key {
            if kept.len() >= MAX_KEPT_GROUPS {
                kept.clear();
            }
            kept.push((k, group.clone()));
        }
        group
    }

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
        ws.meta_at = MetaLayout::new(
            shape.align.max(shape.slot_size),
            shape.slot_size * slots as u64,
            (n * 64) as u64,
            (plan.total_rows * 16) as u64,
            (plan.total_drafts * 4) as u64,
            (plan.rates.len() * 4) as u64,
        );
        ws.meta.ensure(dev, ws.meta_at.end());
        ws.block_stats.ensure(
            dev,
            plan.total_rows as u64 * u64::from(shape.num_chunks) * 48,
        );
        ws.row_stats.ensure(dev, (plan.total_rows * 48) as u64);
        ws.tasks.ensure(dev, (n * 16) as u64);
        let cand_rows = n as u64 * u64::from(shape.candidate_rows);
        ws.candidates
            .ensure(dev, cand_rows * u64::from(shape.num_blocks) * 32);
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

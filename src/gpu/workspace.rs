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
/// buffer, offset, size; `u64::MAX` for "to the end"); `callers` when one of those buffers is
/// the caller's.
#[derive(PartialEq, Eq)]
pub(super) struct GroupKey {
    kernel: crate::shaders::Kernel,
    ranges: Vec<(u32, wgpu::Buffer, u64, u64)>,
    callers: bool,
}

/// Bind groups kept by a workspace (see `GpuBackend::bind_group`); cleared when it holds more.
const MAX_KEPT_GROUPS: usize = 32;

/// The bind groups a workspace keeps, and the caller's buffers they may bind.
#[derive(Default)]
struct KeptGroups {
    groups: Vec<(GroupKey, wgpu::BindGroup)>,
    /// The buffers of the caller (target rows, draft rows) that the workspace's last call bound,
    /// and `GpuBackend::buffer_epoch` when it bound them.
    callers: Vec<wgpu::Buffer>,
    epoch: u64,
}

impl KeptGroups {
    /// Drops every group over a caller's buffer and the buffers themselves.
    fn drop_callers(&mut self) {
        self.groups.retain(|(k, _)| !k.callers);
        self.callers.clear();
    }
}

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
    /// Bind groups of earlier calls, by what they bind: over this workspace's own buffers, and
    /// over the caller's buffers of its last call (`GpuBackend::bind_callers`).
    groups: std::sync::Mutex<KeptGroups>,
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
            groups: std::sync::Mutex::new(KeptGroups::default()),
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
        let mut kept = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        kept.groups.clear();
        kept.callers.clear();
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
    /// Names the caller's buffers (target rows, draft rows) a call over `ws` binds, before its
    /// bind groups are made. Groups over other caller buffers, kept from the workspace's earlier
    /// calls, are dropped with their references to those buffers: a workspace keeps at most one
    /// call's caller buffers alive. Groups kept before [`GpuBackend::forget_buffers`] are
    /// dropped too.
    pub(super) fn bind_callers(&self, ws: &Workspace, buffers: &[&wgpu::Buffer]) {
        let epoch = self.buffer_epoch.load(std::sync::atomic::Ordering::Acquire);
        // Host batches bind the workspace's own upload buffers: no caller buffer to keep.
        let buffers: Vec<&wgpu::Buffer> = buffers.iter().copied().filter(|b| !ws.owns(b)).collect();
        let mut kept = ws.groups.lock().unwrap_or_else(|p| p.into_inner());
        let same = kept.epoch == epoch
            && kept.callers.len() == buffers.len()
            && kept.callers.iter().zip(&buffers).all(|(a, b)| a == *b);
        if !same {
            kept.drop_callers();
            kept.callers = buffers.into_iter().cloned().collect();
            kept.epoch = epoch;
        }
    }

    /// Lets go of every caller buffer the pooled workspaces keep alive through their bind
    /// groups; workspaces in flight drop theirs at their next call (`bind_callers`).
    pub(crate) fn forget_buffers(&self) {
        self.buffer_epoch
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        for ws in self.pool.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            ws.groups
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drop_callers();
        }
    }

    /// Caller buffers the pooled workspaces keep alive through their bind groups.
    pub(crate) fn kept_caller_buffers(&self) -> usize {
        let pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.iter()
            .map(|ws| {
                let kept = ws.groups.lock().unwrap_or_else(|p| p.into_inner());
                kept.callers.len()
            })
            .sum()
    }

    /// A bind group for `kernel` over `entries` (buffer bindings only). When every buffer it
    /// binds is the workspace's own, the backend's dummy or a caller buffer named by
    /// `bind_callers` for this call, the group is kept in the workspace and the next call that
    /// binds the same ranges reuses it: creating a bind group costs wgpu ~5 µs of host time on
    /// an H200's host (2-4 groups over the caller's rows per call, 9-20 µs of its 50-100 µs of
    /// host work; `docs/performance.md`), and a decode loop of one batch shape binds the same
    /// ranges call after call. The price: the caller's buffers of a workspace's last call stay
    /// allocated until a call binds others, [`crate::Verifier::forget_buffers`] or the verifier
    /// is dropped.
    pub(super) fn bind_group(
        &self,
        ws: &Workspace,
        kernel: crate::shaders::Kernel,
        label: &'static str,
        entries: &[wgpu::BindGroupEntry<'_>],
    ) -> wgpu::BindGroup {
        let mut kept = ws.groups.lock().unwrap_or_else(|p| p.into_inner());
        let mut callers = false;
        let ranges: Option<Vec<_>> = entries
            .iter()
            .map(|e| match &e.resource {
                wgpu::BindingResource::Buffer(b) => {
                    let own = ws.owns(b.buffer)
                        || *b.buffer == self.kernels.dummy
                        || *b.buffer == self.kernels.dummy_rw;
                    let caller = !own && kept.callers.iter().any(|c| c == b.buffer);
                    callers |= caller;
                    let size = b.size.map_or(u64::MAX, |s| s.get());
                    (own || caller).then(|| (e.binding, b.buffer.clone(), b.offset, size))
                }
                _ => None,
            })
            .collect();
        let key = ranges.map(|ranges| GroupKey {
            kernel,
            ranges,
            callers,
        });
        if let Some(k) = &key {
            if let Some((_, g)) = kept.groups.iter().find(|(held, _)| held == k) {
                return g.clone();
            }
        }
        // Where the variant takes the Params as immediate data, the layout has no binding 0.
        let immediates = self.kernels.variant.immediates && kernel.takes_params();
        let entries: Vec<_> = entries
            .iter()
            .filter(|e| !(immediates && e.binding == super::bindings::PARAMS_BINDING))
            .cloned()
            .collect();
        let group = self
            .kernels
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(label),
                layout: &self.kernels.layouts[&kernel],
                entries: &entries,
            });
        self.groups_made
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(k) = key {
            if kept.groups.len() >= MAX_KEPT_GROUPS {
                kept.groups.clear();
            }
            kept.groups.push((k, group.clone()));
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
        let dev = &self.kernels.device;
        let n = shape.n;
        let slots = (shape.windows.len() + shape.cut.group_slots).max(1);
        ws.meta_at = MetaLayout::new(
            shape.align.max(shape.slots.slot_size),
            shape.slots.slot_size * slots as u64,
            (n * 64) as u64,
            (plan.total_rows * 16) as u64,
            (plan.total_drafts * 4) as u64,
            (plan.rates.len() * 4) as u64,
        );
        ws.meta.ensure(dev, ws.meta_at.end());
        // (48 bytes a partial either way; row_stats_verify's counts after them.)
        let counts = if shape.verify_in_stats { n } else { 0 };
        ws.block_stats.ensure(
            dev,
            plan.total_rows as u64 * u64::from(shape.num_chunks) * 48 + counts as u64 * 4,
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
        ws.out.ensure(
            dev,
            ((shape.out_words + shape.settle_words(plan)) * 4) as u64,
        );
        ws.readback.ensure(dev, (shape.out_words * 4) as u64);
    }
}

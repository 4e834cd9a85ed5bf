//! The host checks of a GPU verification, run before anything is recorded: the caller's
//! buffers (usage, alignment, size) and the batch's fit to the device (a row within one storage
//! binding, the requests within one dispatch). Reads the plan and the device limits; writes
//! nothing.

use super::{GpuBackend, GpuRows};
use crate::batch::Plan;
use crate::error::Error;

/// Checks the caller's target and draft buffers: storage usage, an offset aligned to the
/// element size, and room for every row the plan reads.
pub(super) fn check_buffers(
    plan: &Plan,
    target: GpuRows<'_>,
    draft: Option<GpuRows<'_>>,
) -> Result<(), Error> {
    let v = u64::from(plan.vocab);
    let dv = u64::from(plan.draft_vocab);
    for (what, rows, vocab, b) in [
        ("target logits", plan.total_rows, v, Some(target)),
        ("draft", plan.total_drafts, dv, draft),
    ] {
        let size = b.map_or(4, |b| b.dtype.size());
        if let Some(b) = b {
            if !b.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
                return Err(Error::BufferUsage { what });
            }
            if !b.offset.is_multiple_of(size) {
                return Err(Error::MisalignedOffset {
                    what,
                    offset: b.offset,
                });
            }
            let needed = b.offset + rows as u64 * vocab * size;
            if needed > b.buffer.size() {
                return Err(Error::BufferTooSmall {
                    what,
                    needed,
                    size: b.buffer.size(),
                });
            }
        }
    }
    Ok(())
}

impl GpuBackend {
    /// Checks that one row fits a storage binding and the requests one dispatch; returns the
    /// most rows one window may hold.
    pub(super) fn check_fit(
        &self,
        plan: &Plan,
        target: GpuRows<'_>,
        draft: Option<GpuRows<'_>>,
    ) -> Result<usize, Error> {
        let limits = self.kernels.device.limits();
        let align = u64::from(limits.min_storage_buffer_offset_alignment);
        let row_bytes = u64::from(plan.vocab) * target.dtype.size();
        let d_row_bytes = u64::from(plan.draft_vocab) * draft.map_or(4, |d| d.dtype.size());
        // A window binds the same rows of the target and of the draft: the larger row decides.
        let bind_row = row_bytes.max(if draft.is_some() { d_row_bytes } else { 0 });
        if bind_row + align > self.max_binding {
            return Err(Error::RowTooLarge {
                row_bytes: bind_row,
                max_binding: self.max_binding,
            });
        }
        let max_dim = limits.max_compute_workgroups_per_dimension as usize;
        let max_rows = (((self.max_binding - align) / bind_row) as usize).min(max_dim);
        let n = plan.num_requests();
        if n > max_dim || n.div_ceil(self.kernels.wg as usize) > max_dim {
            return Err(Error::BatchTooLarge {
                reason: format!(
                    "{} rows exceed one dispatch of this device",
                    plan.total_rows
                ),
            });
        }
        Ok(max_rows)
    }
}

/// Checks a GPU buffer of draft ids against the plan: `COPY_SRC` usage (the ids are copied
/// into the workspace), a 4-byte aligned offset, and room for every draft of the batch.
pub(super) fn check_device_ids(plan: &Plan, ids: super::DeviceIds<'_>) -> Result<(), Error> {
    let bad = |detail: String| Err(Error::DraftIdBuffer { detail });
    if !ids.buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
        return bad("the buffer was created without BufferUsages::COPY_SRC".into());
    }
    if !ids.offset.is_multiple_of(4) {
        return bad(format!("byte offset {} is not a multiple of 4", ids.offset));
    }
    let needed = ids.offset + plan.total_drafts as u64 * 4;
    if needed > ids.buffer.size() {
        return bad(format!(
            "{} drafts need {needed} bytes from offset 0, the buffer has {}",
            plan.total_drafts,
            ids.buffer.size()
        ));
    }
    Ok(())
}

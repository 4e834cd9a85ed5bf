//! Step 4: the upload of a host batch. Copies the caller's host slices (target and draft logits)
//! into the workspace's staging buffers, then records and submits the verification over them;
//! and, for every recorded verification, writes the plan's metadata (Params slots, requests,
//! row_info, draft ids, rates) into the workspace.

use super::bindings::{scoped, PARAMS_BYTES};
use super::shape::Shape;
use super::windows::{bind_window, WindowRows};
use super::workspace::Workspace;
use super::{GpuBackend, GpuRows, Timestamps};
use crate::batch::Plan;
use crate::error::Error;

impl GpuBackend {
    /// Uploads host slices into the workspace's upload buffers (pooled), for the host-slice API.
    pub(crate) fn upload(
        &self,
        ws: &mut Workspace,
        target: crate::Logits<'_>,
        draft: Option<crate::Logits<'_>>,
    ) -> Result<(), Error> {
        let max = self.kernels.device.limits().max_buffer_size;
        let bytes = target.bytes().len() as u64;
        if bytes > max {
            return Err(Error::BatchTooLarge {
                reason: format!(
                    "{bytes} bytes of target logits exceed this device's max_buffer_size {max}; \
                     split the batch"
                ),
            });
        }
        for (grow, rows) in [
            (&mut ws.upload_target, Some(target)),
            (&mut ws.upload_draft, draft),
        ] {
            let Some(rows) = rows else { continue };
            let data = rows.bytes();
            // Copies move whole 4-byte words: an odd count of half values gets one pad value.
            let padded = (data.len() as u64).next_multiple_of(4);
            let buf = grow.ensure(&self.kernels.device, padded);
            let whole = data.len() / 4 * 4;
            self.kernels.queue.write_buffer(buf, 0, &data[..whole]);
            if whole < data.len() {
                let mut tail = [0u8; 4];
                tail[..data.len() - whole].copy_from_slice(&data[whole..]);
                self.kernels.queue.write_buffer(buf, whole as u64, &tail);
            }
        }
        Ok(())
    }

    /// Uploads a host-slice batch and records it into a fresh encoder; returns the submission.
    pub(crate) fn submit_host(
        &self,
        ws: &mut Workspace,
        plan: &Plan,
        target: crate::Logits<'_>,
        draft: Option<crate::Logits<'_>>,
    ) -> Result<wgpu::SubmissionIndex, Error> {
        self.submit_uploaded(ws, target, draft, |g, encoder, ws, src| {
            g.record(encoder, ws, plan, src, Timestamps::None)
        })
    }

    /// Uploads host rows into the workspace, lets `record` record over them into a fresh
    /// encoder, and submits it (the host paths of chains and trees).
    pub(crate) fn submit_uploaded(
        &self,
        ws: &mut Workspace,
        target: crate::Logits<'_>,
        draft: Option<crate::Logits<'_>>,
        record: impl FnOnce(
            &Self,
            &mut wgpu::CommandEncoder,
            &mut Workspace,
            super::Sources<'_>,
        ) -> Result<(), Error>,
    ) -> Result<wgpu::SubmissionIndex, Error> {
        self.upload(ws, target, draft)?;
        let mut encoder =
            self.kernels
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("specdec.verify"),
                });
        // wgpu buffers are reference-counted handles: clones let `record` borrow the workspace
        // mutably while reading from its upload buffers.
        let t_buf = ws.upload_target.get().clone();
        let d_buf = draft.map(|_| ws.upload_draft.get().clone());
        let t = GpuRows::f32(&t_buf, 0).with_dtype(target.dtype());
        let d = d_buf
            .as_ref()
            .zip(draft)
            .map(|(b, d)| GpuRows::f32(b, 0).with_dtype(d.dtype()));
        let src = super::Sources {
            target: t,
            draft: d,
            ids: None,
        };
        record(self, &mut encoder, ws, src)?;
        scoped(&self.kernels.device, || {
            self.kernels.queue.submit([encoder.finish()])
        })
        .map_err(|e| self.lift(e))
    }

    /// Writes the Params slots (one per window, then one per cutoff group) and the plan's
    /// tables into `ws`, keeps the slots' Params in `shape.slots` where the variant hands them
    /// to the dispatches as immediate data; returns the rows each window binds.
    pub(super) fn write_metadata<'a>(
        &self,
        ws: &Workspace,
        plan: &Plan,
        shape: &mut Shape,
        target: GpuRows<'a>,
        draft: Option<GpuRows<'a>>,
    ) -> Vec<WindowRows<'a>> {
        let windows = &shape.windows;
        let base = shape.base_params(plan);
        let slot = shape.slots.slot_size as usize;
        let mut slots = vec![0u8; slot * (windows.len() + shape.cut.groups.len()).max(1)];
        let mut rows = Vec::with_capacity(windows.len());
        let mut window_params = Vec::with_capacity(windows.len());
        for w in windows {
            let (r, p) = bind_window(w, plan, target, draft, shape.align, shape.filters, &base);
            rows.push(r);
            window_params.push(p);
        }
        let group_params = shape.cut.group_params(windows, &window_params, plan.vocab);
        for (i, p) in window_params.iter().chain(&group_params).enumerate() {
            slots[i * slot..i * slot + PARAMS_BYTES].copy_from_slice(bytemuck::bytes_of(p));
        }
        if windows.is_empty() {
            slots[..PARAMS_BYTES].copy_from_slice(bytemuck::bytes_of(&base));
        }
        // Only immediate data needs the values again at each dispatch; the uniform slots bind
        // by offset.
        shape.slots.params = if !shape.slots.immediates {
            Vec::new()
        } else if windows.is_empty() {
            vec![base]
        } else {
            window_params.into_iter().chain(group_params).collect()
        };
        // Every part into one buffer with one write (see `Workspace::meta`).
        let at = ws.meta_at;
        let mut meta = vec![0u8; at.end() as usize];
        for (part, bytes) in [
            (at.params, &slots[..]),
            (at.requests, bytemuck::cast_slice(&plan.reqs)),
            (at.row_info, bytemuck::cast_slice(&plan.row_info)),
            (at.draft_ids, bytemuck::cast_slice(&plan.draft_ids)),
            (at.rates, bytemuck::cast_slice(&plan.rates)),
        ] {
            let from = part.0 as usize;
            meta[from..from + bytes.len()].copy_from_slice(bytes);
        }
        self.kernels.queue.write_buffer(ws.meta.get(), 0, &meta);
        rows
    }
}

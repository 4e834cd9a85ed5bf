//! The wgpu backend: adapter selection, the pipeline cache, pooled workspaces, recording a
//! verification into a command encoder, and the readback.

mod adapter;
mod bindings;
mod diagnostics;
mod pipelines;
mod readback;
mod upload;
mod windows;
mod workspace;

pub(crate) use adapter::{enumerate, rank_adapters, workgroup_size};
pub use adapter::{required_limits, select_adapter};
pub(crate) use bindings::{entry, layout_entry, ranged, scoped, storage};
pub(crate) use readback::MapFlag;
pub(crate) use workspace::Workspace;

use crate::batch::Plan;
use crate::error::Error;
use crate::layout::*;
use crate::shaders::Kernel;
use adapter::STORAGE_BUFFERS_NEEDED;
use bindings::{PARAMS_BYTES, PARAM_SLOT};
use pipelines::{
    build_pipelines, Layouts, Pipelines, SPECIAL_ENTROPY, SPECIAL_PLAIN_F32, SPECIAL_RAW,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use windows::{dtype_bits, plan_windows, window_range};

/// Words of one row's slot in the cutoff kernel's scratch (STATE_WORDS in cutoff.wgsl): its
/// stage and radix-select state, then a 256-bin histogram of 64-bit (hi, lo) sums.
const CUT_STATE_WORDS: u64 = 528;
/// Target rows per cutoff dispatch group: the scratch holds one group's slots (both sides:
/// 17 MiB), bounded whatever the batch; larger windows are cut in groups run one after another.
const CUT_GROUP_ROWS: usize = 4096;
/// Fewest row entries per cutoff `scan` workgroup, per lane: below this the workgroup's
/// histogram clear and flush cost more than its share of the row.
const CUT_MIN_PER_LANE: u32 = 8;

/// A logits (or draft) buffer of the caller, with the byte offset of its first row and its
/// element type.
#[derive(Clone, Copy, Debug)]
pub struct GpuRows<'a> {
    /// The buffer (needs `BufferUsages::STORAGE`).
    pub buffer: &'a wgpu::Buffer,
    /// Byte offset of the first row; a multiple of the element size (4 for f32, 2 for halves).
    pub offset: u64,
    /// Element type of the rows.
    pub dtype: crate::Dtype,
}

impl<'a> GpuRows<'a> {
    /// f32 rows starting `offset` bytes into `buffer`.
    pub fn f32(buffer: &'a wgpu::Buffer, offset: u64) -> Self {
        GpuRows {
            buffer,
            offset,
            dtype: crate::Dtype::F32,
        }
    }
    /// The same rows read as `dtype`.
    pub fn with_dtype(self, dtype: crate::Dtype) -> Self {
        GpuRows { dtype, ..self }
    }
}

/// The draft distribution of a GPU-resident batch (rows in a GPU buffer).
pub type GpuDraft<'a> = crate::Draft<GpuRows<'a>>;

/// GPU timestamps of a recorded verification (profiling; needs `Features::TIMESTAMP_QUERY`).
#[derive(Debug, Default)]
pub enum Timestamps<'a> {
    /// None.
    #[default]
    None,
    /// At the beginning and the end of the one compute pass holding every dispatch.
    Pass(wgpu::ComputePassTimestampWrites<'a>),
    /// One pass per kernel (row_stats, verify, residual_argmax.block, residual_argmax.merge),
    /// timestamps `first + 2i` (begin) and `first + 2i + 1` (end) of `query_set`: 8 queries.
    PerKernel {
        /// The query set.
        query_set: &'a wgpu::QuerySet,
        /// Index of the first of the 8 queries.
        first: u32,
    },
}

/// The device, its pipelines and the workspace pool.
pub(crate) struct GpuBackend {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    wg: u32,
    target_workgroups: u32,
    max_binding: u64,
    timeout: Duration,
    layouts: Layouts,
    pipelines: Pipelines,
    /// The shader variant the pipelines were built from.
    pub variant: crate::shaders::Variant,
    pool: Mutex<Vec<Workspace>>,
    dummy: wgpu::Buffer,
    lost: Arc<Mutex<Option<String>>>,
    owns_device: bool,
    uncaptured: Arc<AtomicBool>,
}

impl GpuBackend {
    /// Builds every pipeline on `device` and, when the device is ours (`owns_device`), installs
    /// the handlers that keep wgpu's errors and a device loss from panicking the host.
    pub fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
        opts: &crate::VerifierOptions,
        owns_device: bool,
    ) -> Result<Self, Error> {
        let limits = device.limits();
        if limits.max_storage_buffers_per_shader_stage < STORAGE_BUFFERS_NEEDED {
            return Err(Error::RequestDevice {
                detail: format!(
                    "the device allows {} storage buffers per stage; the kernels need {}",
                    limits.max_storage_buffers_per_shader_stage, STORAGE_BUFFERS_NEEDED
                ),
            });
        }
        let lost = Arc::new(Mutex::new(None));
        let uncaptured = Arc::new(AtomicBool::new(false));
        if owns_device {
            // Our own device: nothing may reach wgpu's default handler, which panics.
            let flag = uncaptured.clone();
            device.on_uncaptured_error(Arc::new(move |_e: wgpu::Error| {
                flag.store(true, Ordering::SeqCst);
            }));
            let lost_c = lost.clone();
            device.set_device_lost_callback(move |reason, message| {
                *lost_c.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(format!("{reason:?}: {message}"));
            });
        }
        let wg = workgroup_size(&limits, opts.workgroup_size.unwrap_or(256));
        let max_binding = opts
            .max_binding_bytes
            .map_or(limits.max_storage_buffer_binding_size, |m| {
                m.min(limits.max_storage_buffer_binding_size)
            });
        let variant = crate::shaders::Variant {
            int64: opts.shader_int64 && device.features().contains(wgpu::Features::SHADER_INT64),
        };
        let (layouts, pipelines, dummy) = scoped(&device, || {
            let (layouts, pipelines) = build_pipelines(&device, variant, wg);
            let dummy = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("specdec.dummy"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            (layouts, pipelines, dummy)
        })?;
        Ok(GpuBackend {
            device,
            queue,
            info,
            wg,
            target_workgroups: opts.target_workgroups,
            max_binding,
            timeout: opts.timeout,
            layouts,
            pipelines,
            variant,
            pool: Mutex::new(Vec::new()),
            dummy,
            lost,
            owns_device,
            uncaptured,
        })
    }

    /// Vocabulary entries per residual_argmax workgroup for `requests` requests of `vocab`: about
    /// `target_workgroups / 4` workgroups in all (at least 4 entries per lane), a multiple of 4,
    /// and few enough blocks for one dispatch dimension. Any value gives the same tokens (the
    /// argmax does not depend on how it is split).
    pub fn residual_block_len(&self, vocab: u32, requests: usize) -> u32 {
        let max_blocks = self
            .device
            .limits()
            .max_compute_workgroups_per_dimension
            .max(1);
        let lanes = 4 * self.wg;
        let want = (u64::from(vocab) * requests as u64)
            .div_ceil(u64::from(self.target_workgroups / 4).max(1));
        let len = (want.min(u64::from(vocab)) as u32)
            .next_multiple_of(lanes)
            .max(lanes);
        len.max(vocab.div_ceil(max_blocks).next_multiple_of(4))
    }

    /// Row entries per cutoff `scan` workgroup for `rows` filtered rows of `vocab`: about
    /// `target_workgroups` workgroups in all, at least `CUT_MIN_PER_LANE` entries per lane, a
    /// multiple of the workgroup size, and few enough slices per row for one dispatch
    /// dimension. Tuning only: the cut-offs never depend on it (integer histograms).
    pub fn cut_slice(&self, vocab: u32, rows: usize) -> u32 {
        let max_slices = u64::from(
            self.device
                .limits()
                .max_compute_workgroups_per_dimension
                .max(1),
        );
        let want = (u64::from(vocab) * rows as u64).div_ceil(u64::from(self.target_workgroups));
        let least = u64::from(vocab).div_ceil(max_slices);
        let slice = want
            .min(u64::from(vocab))
            .max(least)
            .max(u64::from(self.wg * CUT_MIN_PER_LANE));
        (slice.next_multiple_of(u64::from(self.wg))).min(u64::from(u32::MAX / 2)) as u32
    }

    /// Chunks per row_stats workgroup for `rows` rows of `vocab`: about `target_workgroups`
    /// workgroups in all. Tuning only: the statistics never depend on it.
    pub fn block_chunks(&self, vocab: u32, rows: usize) -> u32 {
        let chunks = vocab.div_ceil(CHUNK as u32);
        let total = chunks as u64 * rows as u64;
        (total.div_ceil(u64::from(self.target_workgroups)) as u32).clamp(1, chunks)
    }

    fn check_alive(&self) -> Result<(), Error> {
        if let Some(reason) = self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(Error::DeviceLost { detail: reason });
        }
        Ok(())
    }

    /// Records the whole verification of `plan` over `target` / `draft` into `encoder`, leaving
    /// the packed output in `ws.out` and a copy queued into `ws.readback`.
    pub(crate) fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        ws: &mut Workspace,
        plan: &Plan,
        target: GpuRows<'_>,
        draft: Option<GpuRows<'_>>,
        timestamps: Timestamps<'_>,
    ) -> Result<(), Error> {
        self.check_alive()?;
        let v = u64::from(plan.vocab);
        let dv = u64::from(plan.draft_vocab);
        let t_size = target.dtype.size();
        let d_size = draft.map_or(4, |d| d.dtype.size());
        let row_bytes = v * t_size;
        let limits = self.device.limits();
        let align = u64::from(limits.min_storage_buffer_offset_alignment);
        // Host checks of the caller's buffers, before anything is recorded.
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
        // A window binds the same rows of the target and of the draft: the larger row decides.
        let bind_row = row_bytes.max(if draft.is_some() { dv * d_size } else { 0 });
        if bind_row + align > self.max_binding {
            return Err(Error::RowTooLarge {
                row_bytes: bind_row,
                max_binding: self.max_binding,
            });
        }
        let max_dim = limits.max_compute_workgroups_per_dimension as usize;
        let max_rows = (((self.max_binding - align) / bind_row) as usize).min(max_dim);
        let n = plan.num_requests();
        if n > max_dim || n.div_ceil(self.wg as usize) > max_dim {
            return Err(Error::BatchTooLarge {
                reason: format!(
                    "{} rows exceed one dispatch of this device",
                    plan.total_rows
                ),
            });
        }
        let windows = plan_windows(plan, max_rows);
        let block_len = self.residual_block_len(plan.vocab, n);
        let num_blocks = plan.vocab.div_ceil(block_len);
        let num_chunks = plan.vocab.div_ceil(CHUNK as u32);
        let block_chunks = self.block_chunks(plan.vocab, plan.total_rows);
        let stats_blocks = num_chunks.div_ceil(block_chunks);

        // Metadata and scratch buffers.
        let dev = &self.device;
        let slot_size = PARAM_SLOT.max(u64::from(limits.min_uniform_buffer_offset_alignment));
        let cut_group_count = if plan.filters() {
            plan.total_rows.div_ceil(CUT_GROUP_ROWS) + windows.len()
        } else {
            0
        };
        ws.params.ensure(
            dev,
            slot_size * (windows.len() + cut_group_count).max(1) as u64,
        );
        ws.requests.ensure(dev, (n * 64) as u64);
        ws.row_info.ensure(dev, (plan.total_rows * 16) as u64);
        ws.draft_ids.ensure(dev, (plan.total_drafts * 4) as u64);
        ws.rates.ensure(dev, (plan.rates.len() * 4) as u64);
        ws.block_stats
            .ensure(dev, plan.total_rows as u64 * u64::from(num_chunks) * 48);
        ws.row_stats.ensure(dev, (plan.total_rows * 48) as u64);
        ws.tasks.ensure(dev, (n * 16) as u64);
        ws.candidates
            .ensure(dev, n as u64 * u64::from(num_blocks) * 32);
        let filters = plan.filters();
        let special = if plan.logprob_flags() & PARAM_RAW != 0 {
            SPECIAL_RAW
        } else {
            0
        } | if plan.reqs.iter().any(|r| r.flags & REQ_TYPICAL != 0) {
            SPECIAL_ENTROPY
        } else {
            0
        } | if !filters
            && target.dtype == crate::Dtype::F32
            && draft.is_none_or(|d| d.dtype == crate::Dtype::F32)
        {
            SPECIAL_PLAIN_F32
        } else {
            0
        };
        // Cut-offs only exist when some request filters; otherwise the buffer is bound unread
        // (row_stats and the residual pass check PARAM_CUTOFF) and its minimum size will do.
        let cut_words = if filters {
            plan.total_rows + plan.total_drafts
        } else {
            0
        };
        ws.cutoffs.ensure(dev, (cut_words * 4) as u64);
        // Block masses: a partial per (row, chunk), only for batches with block requests that
        // give a draft distribution (the others bind the dummy).
        let block_masses = plan.block_masses();
        if block_masses {
            ws.masses
                .ensure(dev, plan.total_rows as u64 * u64::from(num_chunks) * 4);
        }
        // The cutoff pass: its scratch slots (target rows, then draft rows), the entries per scan
        // workgroup, the scan workgroups per row, the sides (draft-logit rows are cut too) and
        // the (scan, pick) rounds: max, then min-p, four top-k and four top-p rounds when some
        // request of the batch asks for them (rows that need fewer wait at DONE, for free).
        let cut_logits = plan.draft_kind == DRAFT_LOGITS;
        let cut_rows = plan.total_rows + if cut_logits { plan.total_drafts } else { 0 };
        let cut_len = plan
            .vocab
            .max(if cut_logits { plan.draft_vocab } else { 0 });
        let cut_slice = self.cut_slice(cut_len, cut_rows);
        let cut_slices = cut_len.div_ceil(cut_slice);
        let cut_sides = if cut_logits { 2 } else { 1 };
        let cut_steps = {
            let filtered = || plan.reqs.iter().filter(|r| r.flags & REQ_FILTER != 0);
            1 + u32::from(filtered().any(|r| r.log_min_p != f32::NEG_INFINITY))
                + 4 * u32::from(filtered().any(|r| r.top_k != 0))
                + 4 * u32::from(filtered().any(|r| r.top_p < 1.0))
        };
        if filters {
            ws.cut_state.ensure(
                dev,
                plan.total_rows.min(CUT_GROUP_ROWS) as u64
                    * u64::from(cut_sides)
                    * CUT_STATE_WORDS
                    * 4,
            );
        }
        // The cutoff's row groups: (window, first row, end row), each with its own Params slot
        // after the windows' slots.
        let cut_groups: Vec<(usize, usize, usize)> = if filters {
            windows
                .iter()
                .enumerate()
                .flat_map(|(i, w)| {
                    (w.row_begin..w.row_end)
                        .step_by(CUT_GROUP_ROWS)
                        .map(move |a| (i, a, (a + CUT_GROUP_ROWS).min(w.row_end)))
                })
                .collect()
        } else {
            Vec::new()
        };
        let out_words = plan.out_words();
        ws.out.ensure(dev, (out_words * 4) as u64);
        ws.readback.ensure(dev, (out_words * 4) as u64);

        let base = Params {
            vocab: plan.vocab,
            draft_vocab: plan.draft_vocab,
            block_len,
            num_blocks,
            draft_kind: plan.draft_kind,
            num_requests: n as u32,
            out_stride: plan.out_stride as u32,
            total_rows: plan.total_rows as u32,
            num_chunks,
            block_chunks,
            stats_blocks,
            cut_slice,
            ..Params::default()
        };
        let mut slots = vec![0u8; (slot_size as usize) * (windows.len() + cut_groups.len()).max(1)];
        let mut bindings = Vec::with_capacity(windows.len());
        let mut window_params = Vec::with_capacity(windows.len());
        for (i, w) in windows.iter().enumerate() {
            let (t_range, t_base) = window_range(target, w.row_begin, w.row_end, row_bytes, align);
            let (d_range, d_base) = match draft {
                Some(d) if w.d_row_end > w.d_row_begin => {
                    let (r, b) = window_range(d, w.d_row_begin, w.d_row_end, dv * d_size, align);
                    (Some((d.buffer, r)), b)
                }
                _ => (None, 0),
            };
            // 16-byte loads when every row of the window starts on a 16-byte boundary (f32 only).
            let vec4 = t_size == 4
                && d_size == 4
                && plan.vocab.is_multiple_of(4)
                && t_range.1 >= 16
                && t_base.is_multiple_of(4)
                && d_range.is_none_or(|(_, (_, size))| {
                    plan.draft_vocab.is_multiple_of(4) && d_base.is_multiple_of(4) && size >= 16
                });
            let p = Params {
                flags: if vec4 { PARAM_VEC4 } else { 0 }
                    | if filters { PARAM_CUTOFF } else { 0 }
                    | dtype_bits(target.dtype, 0)
                    | plan.logprob_flags()
                    | draft.map_or(0, |d| dtype_bits(d.dtype, 2)),
                row_begin: w.row_begin as u32,
                row_count: (w.row_end - w.row_begin) as u32,
                t_elem_base: t_base,
                d_row_begin: w.d_row_begin as u32,
                d_elem_base: d_base,
                req_begin: w.req_begin as u32,
                req_count: (w.req_end - w.req_begin) as u32,
                ..base
            };
            let at = i * slot_size as usize;
            slots[at..at + PARAMS_BYTES].copy_from_slice(bytemuck::bytes_of(&p));
            bindings.push((t_range, d_range));
            window_params.push(p);
        }
        // A cutoff group reads its window's bindings from its own first row on; its draft rows
        // are still addressed from the window's first draft row.
        for (g, &(i, a, b)) in cut_groups.iter().enumerate() {
            let w = &windows[i];
            let p = Params {
                row_begin: a as u32,
                row_count: (b - a) as u32,
                t_elem_base: window_params[i].t_elem_base + ((a - w.row_begin) as u32) * plan.vocab,
                ..window_params[i]
            };
            let at = (windows.len() + g) * slot_size as usize;
            slots[at..at + PARAMS_BYTES].copy_from_slice(bytemuck::bytes_of(&p));
        }
        if windows.is_empty() {
            slots[..PARAMS_BYTES].copy_from_slice(bytemuck::bytes_of(&base));
        }
        let q = &self.queue;
        q.write_buffer(ws.params.get(), 0, &slots);
        q.write_buffer(ws.requests.get(), 0, bytemuck::cast_slice(&plan.reqs));
        q.write_buffer(ws.row_info.get(), 0, bytemuck::cast_slice(&plan.row_info));
        q.write_buffer(ws.draft_ids.get(), 0, bytemuck::cast_slice(&plan.draft_ids));
        q.write_buffer(ws.rates.get(), 0, bytemuck::cast_slice(&plan.rates));

        let ws = &*ws;
        scoped(dev, || {
            let params_entry = wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: ws.params.get(),
                    offset: 0,
                    size: std::num::NonZeroU64::new(PARAMS_BYTES as u64),
                }),
            };
            let mut stats_groups = Vec::new();
            let mut residual_groups = Vec::new();
            let mut cutoff_groups = Vec::new();
            let mut mass_groups = Vec::new();
            for (t_range, d_range) in &bindings {
                let t = ranged(1, target.buffer, t_range.0, t_range.1);
                // The vec4 views need at least one whole vec4; smaller windows never take the
                // vec4 path (PARAM_VEC4 is off for them) and bind the dummy instead.
                let t4 = if t_range.1 >= 16 {
                    ranged(6, target.buffer, t_range.0, t_range.1)
                } else {
                    entry(6, &self.dummy)
                };
                let (d, d4) = match d_range {
                    Some((buf, (off, size))) => (
                        ranged(2, buf, *off, *size),
                        if *size >= 16 {
                            ranged(7, buf, *off, *size)
                        } else {
                            entry(7, &self.dummy)
                        },
                    ),
                    None => (entry(2, &self.dummy), entry(7, &self.dummy)),
                };
                if filters {
                    cutoff_groups.push(dev.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("specdec.cutoff"),
                        layout: &self.layouts[&Kernel::Cutoff],
                        entries: &[
                            params_entry.clone(),
                            t.clone(),
                            d.clone(),
                            entry(3, ws.requests.get()),
                            entry(4, ws.row_info.get()),
                            entry(5, ws.cutoffs.get()),
                            entry(6, ws.cut_state.get()),
                        ],
                    }));
                }
                stats_groups.push(dev.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("specdec.row_stats"),
                    layout: &self.layouts[&Kernel::RowStats],
                    entries: &[
                        params_entry.clone(),
                        t.clone(),
                        d.clone(),
                        entry(3, ws.requests.get()),
                        entry(4, ws.row_info.get()),
                        entry(5, ws.block_stats.get()),
                        t4,
                        d4,
                        entry(8, ws.cutoffs.get()),
                    ],
                }));
                if block_masses {
                    mass_groups.push(dev.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("specdec.block_mass"),
                        layout: &self.layouts[&Kernel::BlockMass],
                        entries: &[
                            params_entry.clone(),
                            t.clone(),
                            d.clone(),
                            entry(3, ws.requests.get()),
                            entry(4, ws.row_info.get()),
                            entry(5, ws.row_stats.get()),
                            entry(6, ws.cutoffs.get()),
                            entry(7, ws.masses.get()),
                        ],
                    }));
                }
                residual_groups.push(dev.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("specdec.residual_argmax"),
                    layout: &self.layouts[&Kernel::ResidualArgmax],
                    entries: &[
                        params_entry.clone(),
                        t,
                        d,
                        entry(3, ws.requests.get()),
                        entry(4, ws.row_stats.get()),
                        entry(5, ws.tasks.get()),
                        entry(6, ws.candidates.get()),
                        entry(7, ws.out.get()),
                        entry(8, ws.cutoffs.get()),
                    ],
                }));
            }
            let verify_group = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("specdec.verify"),
                layout: &self.layouts[&Kernel::Verify],
                entries: &[
                    params_entry.clone(),
                    entry(1, ws.requests.get()),
                    entry(2, ws.block_stats.get()),
                    entry(3, ws.draft_ids.get()),
                    entry(4, ws.rates.get()),
                    entry(5, ws.tasks.get()),
                    entry(6, ws.out.get()),
                    entry(7, ws.row_stats.get()),
                    if block_masses {
                        entry(8, ws.masses.get())
                    } else {
                        entry(8, &self.dummy)
                    },
                ],
            });
            // One compute pass holds every dispatch (wgpu orders dispatches that share buffers),
            // except when profiling per kernel: then each kernel gets its own timed pass. An
            // all-greedy batch has nothing to resample: its residual phases dispatch nothing.
            let needs_residual = plan.reqs.iter().any(|r| r.flags & REQ_GREEDY == 0);
            let phases: [&dyn Fn(&mut wgpu::ComputePass<'_>); 4] = [
                &|pass| {
                    // Requests with top-k / top-p / min-p first get their rows' cut-offs (timed
                    // with row_stats when profiling per kernel).
                    if filters {
                        // Per row group: init, then (scan, pick) per stage. The groups reuse the
                        // scratch one after another (wgpu orders dispatches sharing a buffer).
                        for (g, &(i, a, b)) in cut_groups.iter().enumerate() {
                            let rows = (b - a) as u32;
                            pass.set_bind_group(
                                0,
                                &cutoff_groups[i],
                                &[((windows.len() + g) as u64 * slot_size) as u32],
                            );
                            pass.set_pipeline(self.pipeline(Kernel::Cutoff, "init"));
                            pass.dispatch_workgroups(1, rows, cut_sides);
                            for _ in 0..cut_steps {
                                pass.set_pipeline(self.pipeline(Kernel::Cutoff, "scan"));
                                pass.dispatch_workgroups(cut_slices, rows, cut_sides);
                                pass.set_pipeline(self.pipeline(Kernel::Cutoff, "pick"));
                                pass.dispatch_workgroups(1, rows, cut_sides);
                            }
                        }
                    }
                    pass.set_pipeline(self.special_pipeline(Kernel::RowStats, "block", special));
                    for (i, w) in windows.iter().enumerate() {
                        pass.set_bind_group(0, &stats_groups[i], &[(i as u64 * slot_size) as u32]);
                        pass.dispatch_workgroups(stats_blocks, (w.row_end - w.row_begin) as u32, 1);
                    }
                },
                &|pass| {
                    let verify_special = special & (SPECIAL_RAW | SPECIAL_ENTROPY);
                    pass.set_pipeline(self.special_pipeline(
                        Kernel::Verify,
                        "main",
                        verify_special,
                    ));
                    pass.set_bind_group(0, &verify_group, &[0]);
                    pass.dispatch_workgroups(n as u32, 1, 1);
                    if block_masses {
                        // Block requests with a draft distribution: their masses R_j, then the
                        // joint decision (timed with verify when profiling per kernel).
                        pass.set_pipeline(self.pipeline(Kernel::BlockMass, "main"));
                        for (i, w) in windows.iter().enumerate() {
                            pass.set_bind_group(
                                0,
                                &mass_groups[i],
                                &[(i as u64 * slot_size) as u32],
                            );
                            pass.dispatch_workgroups(
                                num_chunks,
                                (w.row_end - w.row_begin) as u32,
                                1,
                            );
                        }
                        pass.set_pipeline(self.special_pipeline(
                            Kernel::Verify,
                            "block_settle",
                            verify_special,
                        ));
                        pass.set_bind_group(0, &verify_group, &[0]);
                        pass.dispatch_workgroups(n as u32, 1, 1);
                    }
                },
                &|pass| {
                    if !needs_residual {
                        return;
                    }
                    pass.set_pipeline(self.pipeline(Kernel::ResidualArgmax, "block"));
                    for (i, w) in windows.iter().enumerate() {
                        pass.set_bind_group(
                            0,
                            &residual_groups[i],
                            &[(i as u64 * slot_size) as u32],
                        );
                        pass.dispatch_workgroups(num_blocks, (w.req_end - w.req_begin) as u32, 1);
                    }
                },
                &|pass| {
                    if !needs_residual {
                        return;
                    }
                    pass.set_pipeline(self.pipeline(Kernel::ResidualArgmax, "merge"));
                    pass.set_bind_group(0, &residual_groups[0], &[0]);
                    pass.dispatch_workgroups(n as u32, 1, 1);
                },
            ];
            if !windows.is_empty() {
                match timestamps {
                    Timestamps::PerKernel { query_set, first } => {
                        for (i, phase) in phases.iter().enumerate() {
                            let mut pass =
                                encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                                    label: Some("specdec.verify_phase"),
                                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                                        query_set,
                                        beginning_of_pass_write_index: Some(first + 2 * i as u32),
                                        end_of_pass_write_index: Some(first + 2 * i as u32 + 1),
                                    }),
                                });
                            phase(&mut pass);
                        }
                    }
                    other => {
                        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("specdec.verify_pass"),
                            timestamp_writes: match other {
                                Timestamps::Pass(w) => Some(w),
                                _ => None,
                            },
                        });
                        for phase in phases {
                            phase(&mut pass);
                        }
                    }
                }
            }
            encoder.copy_buffer_to_buffer(
                ws.out.get(),
                0,
                ws.readback.get(),
                0,
                (out_words * 4) as u64,
            );
        })
        .map_err(|e| self.lift(e))
    }

    /// [`GpuBackend::diagnose`] for an error already typed.
    fn lift(&self, e: Error) -> Error {
        match e {
            Error::Gpu { detail } => self.diagnose(detail),
            other => other,
        }
    }

    /// Turns a failure into `DeviceLost` when the device is gone: wgpu reports the loss through
    /// its callback (our own devices) only once polled, and a destroyed device refuses
    /// submissions without an error scope seeing it (the wait then names a submission that was
    /// "not returned by a successful submission"). The loss is sticky: later calls fail fast.
    pub(crate) fn diagnose(&self, detail: String) -> Error {
        let _ = self.device.poll(wgpu::PollType::Poll);
        if let Err(lost) = self.check_alive() {
            return lost;
        }
        let refused = detail.contains("not been returned by a successful submission");
        let invalid =
            detail.contains("Device is invalid") || detail.to_lowercase().contains("device lost");
        if refused || invalid {
            let reason = format!(
                "the device refused work ({})",
                detail.lines().next().unwrap_or_default()
            );
            *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
            return Error::DeviceLost { detail: reason };
        }
        Error::Gpu { detail }
    }
}

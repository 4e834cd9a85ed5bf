//! The wgpu backend. The files follow a verification through the GPU:
//!
//! 1. [`adapter`]: find and rank an adapter, negotiate the limits;
//! 2. [`pipelines`]: the pipeline cache, described once per device, each pipeline built once;
//! 3. [`workspace`]: the pooled buffers of one in-flight verification;
//! 4. [`upload`]: a host batch copied in, the plan's metadata written;
//! 5. [`checks`], [`shape`], [`windows`]: the host checks, the grid of every pass, the row
//!    windows that fit one storage binding;
//! 6. one file per pass, each with its `record_*` beside its bind group layout: [`cutoff`] →
//!    [`row_stats`] → [`verify`] → [`block_mass`] → [`residual`] (residual_argmax);
//! 7. [`readback`]: map, wait, copy the packed words out.
//!
//! [`bindings`] holds the small binding functions and the error scope, [`diagnostics`] the
//! rng_check and read-bandwidth kernels. [`GpuBackend::record`] calls the steps in that order.

mod adapter;
mod bindings;
mod block_mass;
mod checks;
mod cutoff;
mod diagnostics;
mod pipelines;
mod probes;
mod readback;
mod residual;
mod row_stats;
mod shape;
mod subgroups;
mod tree;
mod upload;
mod verify;
mod windows;
mod workspace;

pub(crate) use adapter::{enumerate, optional_features, rank_adapters, workgroup_size};
pub use adapter::{required_limits, select_adapter};
pub(crate) use bindings::{entry, layout_entry, ranged, scoped, storage};
pub(crate) use readback::{spin_poll, MapFlag};
pub(crate) use tree::{decode_tree, tree_readback_words};
pub(crate) use workspace::Workspace;

use crate::batch::Plan;
use crate::error::Error;
use adapter::STORAGE_BUFFERS_NEEDED;
use pipelines::{build_pipelines, Layouts, Pipelines};
use shape::Shape;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// Draft token ids that live in a GPU buffer ([`crate::Verifier::record_device_drafts`]):
/// `Σ num_drafts` i32 from byte `offset` of `buffer`, in the batch's draft order.
#[derive(Clone, Copy, Debug)]
pub struct DeviceIds<'a> {
    /// The buffer (needs `BufferUsages::COPY_SRC`).
    pub buffer: &'a wgpu::Buffer,
    /// Byte offset of the first id; a multiple of 4.
    pub offset: u64,
}

/// The caller's buffers a recorded verification reads: the target rows, the draft rows, and
/// the draft ids when they live on the GPU.
#[derive(Clone, Copy)]
pub(crate) struct Sources<'a> {
    pub target: GpuRows<'a>,
    pub draft: Option<GpuRows<'a>>,
    pub ids: Option<DeviceIds<'a>>,
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

/// What every backend over one device shares ([`GpuBackend::retuned`]): the device, its
/// compiled kernels, the buffers bound where a binding is unused, and the device's state (lost,
/// or an uncaptured error seen). Built once, by [`GpuBackend::new`].
pub(crate) struct DeviceKernels {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    wg: u32,
    layouts: Layouts,
    pipelines: Pipelines,
    /// The shader variant the pipelines were built from.
    pub variant: crate::shaders::Variant,
    /// Bound where a kernel's binding is never read (read-only storage bindings).
    dummy: wgpu::Buffer,
    /// Bound where a writable binding is never touched: a buffer of its own, since one buffer
    /// may not be bound read-only and writable in one dispatch.
    dummy_rw: wgpu::Buffer,
    lost: Arc<Mutex<Option<String>>>,
    owns_device: bool,
    uncaptured: Arc<AtomicBool>,
    /// Held by a verifier's host-path calls on wgpu's OpenGL backend
    /// (`Verifier::serialize`): one lock per device, since every verifier over it
    /// (`Verifier::with_tuning`) shares its one GL context.
    pub gl_calls: Mutex<()>,
}

/// The device's kernels (shared), this verifier's tuning, and its workspace pool and counters.
pub(crate) struct GpuBackend {
    pub kernels: Arc<DeviceKernels>,
    target_workgroups: u32,
    /// `VerifierOptions::early_race_entries`, its default resolved for this adapter.
    early_race_entries: u64,
    /// `VerifierOptions::wide_greedy_chunks`, its default resolved for this adapter.
    wide_greedy_chunks: u32,
    /// `VerifierOptions::narrow_greedy_chunks`, its default resolved for this adapter.
    narrow_greedy_chunks: u32,
    /// `VerifierOptions::fused_greedy`.
    fused_greedy: bool,
    /// `VerifierOptions::fused_verify_chunks`, its default resolved for this adapter (0 where
    /// the device has no row_stats_verify pipelines).
    fused_verify_chunks: u32,
    max_binding: u64,
    timeout: Duration,
    /// `VerifierOptions::spin_wait`, its default resolved for this adapter.
    spin_wait: Duration,
    pool: Mutex<Vec<Workspace>>,
    /// Bumped by [`GpuBackend::forget_buffers`]: a workspace whose caller groups are older
    /// drops them at its next call.
    buffer_epoch: std::sync::atomic::AtomicU64,
    /// Bind groups made by `bind_group` (kept or not), for the tests of their reuse.
    pub groups_made: std::sync::atomic::AtomicU64,
    /// Calls recorded with the batch settled in row_stats (`Shape::settle_in_stats`), for the
    /// tests that must exercise that path.
    pub settled_in_stats: std::sync::atomic::AtomicU64,
    /// Calls recorded with the batch verified in row_stats (`Shape::verify_in_stats`), for the
    /// tests that must exercise that path.
    pub verified_in_stats: std::sync::atomic::AtomicU64,
    /// Calls recorded with half target rows read as half words (`SPECIAL_HALF_WORDS`), for the
    /// tests that must exercise that path.
    pub half_words_in_stats: std::sync::atomic::AtomicU64,
    /// Calls recorded with the narrow settle (`Shape::narrow_settle`), for its tests.
    pub narrow_settles: std::sync::atomic::AtomicU64,
}

impl GpuBackend {
    /// Describes every pipeline on `device` (built now with `PipelineBuild::Eager` and on GL, else
    /// each at its first dispatch) and, when the device is ours (`owns_device`), installs
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
        let variant = crate::shaders::Variant {
            int64: opts.shader_int64 && device.features().contains(wgpu::Features::SHADER_INT64),
            subgroup_lanes: subgroup_lanes(&device, &queue, &info, opts.subgroups),
            immediates: opts.immediates
                && device.features().contains(wgpu::Features::IMMEDIATES)
                && device.limits().max_immediate_size as usize >= bindings::PARAMS_BYTES,
            f16_unpack: opts.f16_unpack && probes::f16_unpack_is_exact(&device, &queue),
        };
        let (layouts, pipelines, [dummy, dummy_rw]) = scoped(&device, || {
            let (layouts, pipelines) = build_pipelines(&device, variant, wg, opts.shader_checks);
            (layouts, pipelines, dummies(&device))
        })?;
        // On wgpu's OpenGL backend every call waits for the one GL context, and wgpu panics
        // after a second of waiting: a call compiling a pipeline there would hold the context
        // for that long while other threads' calls wait, so GL builds every pipeline now.
        if info.backend == wgpu::Backend::Gl || opts.pipelines == crate::PipelineBuild::Eager {
            pipelines.build_all(&device, info.backend)?;
        }
        let kernels = DeviceKernels {
            device,
            queue,
            info,
            wg,
            layouts,
            pipelines,
            variant,
            dummy,
            dummy_rw,
            lost,
            owns_device,
            uncaptured,
            gl_calls: Mutex::new(()),
        };
        Ok(GpuBackend::over(Arc::new(kernels), opts))
    }

    fn check_alive(&self) -> Result<(), Error> {
        if let Some(reason) = self
            .kernels
            .lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(Error::DeviceLost { detail: reason });
        }
        Ok(())
    }

    /// Builds every pipeline of the device's kernels not built yet ([`Pipelines::build_all`];
    /// none on GL, where they were all built when the kernels were made).
    pub fn build_all_pipelines(&self) -> Result<(), Error> {
        let k = &self.kernels;
        k.pipelines.build_all(&k.device, k.info.backend)
    }

    /// Pipelines built so far on the device, and pipelines described.
    pub fn pipeline_counts(&self) -> (usize, usize) {
        self.kernels.pipelines.counts()
    }

    /// A backend on the same device, sharing its compiled kernels, with the tuning of `opts`
    /// (target workgroups, the fused paths' bounds, `max_binding_bytes`, the timeout and the
    /// spin-wait); its workspace pool, kept bind groups and counters start empty. The caller
    /// checks that `opts` asks for the same kernels. The device's loss and uncaptured-error
    /// flags are shared: one device, one state.
    pub fn retuned(&self, opts: &crate::VerifierOptions) -> GpuBackend {
        GpuBackend::over(self.kernels.clone(), opts)
    }

    /// A backend over `kernels` with the tuning of `opts`, an empty pool and zeroed counters:
    /// what `new` and `retuned` share.
    fn over(kernels: Arc<DeviceKernels>, opts: &crate::VerifierOptions) -> GpuBackend {
        let has_fused_verify = kernels
            .layouts
            .contains_key(&crate::shaders::Kernel::RowStatsVerify);
        let tuning = Tuning::resolve(&kernels.info, opts, has_fused_verify);
        let max_binding = max_binding(&kernels.device.limits(), opts);
        GpuBackend {
            kernels,
            target_workgroups: opts.target_workgroups,
            early_race_entries: tuning.early_race_entries,
            wide_greedy_chunks: tuning.wide_greedy_chunks,
            narrow_greedy_chunks: tuning.narrow_greedy_chunks,
            fused_greedy: opts.fused_greedy,
            fused_verify_chunks: tuning.fused_verify_chunks,
            max_binding,
            timeout: opts.timeout,
            spin_wait: tuning.spin_wait,
            pool: Mutex::new(Vec::new()),
            buffer_epoch: std::sync::atomic::AtomicU64::new(0),
            groups_made: std::sync::atomic::AtomicU64::new(0),
            verified_in_stats: std::sync::atomic::AtomicU64::new(0),
            settled_in_stats: std::sync::atomic::AtomicU64::new(0),
            half_words_in_stats: std::sync::atomic::AtomicU64::new(0),
            narrow_settles: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Records the whole verification of `plan` over `target` / `draft` into `encoder`, leaving
    /// the packed output in `ws.out` and a copy queued into `ws.readback`. The steps, in data-flow
    /// order: host checks, the workspace sized and its metadata written, then the passes
    /// (cutoff → row_stats → verify → block_mass → residual_argmax) and the readback copy.
    pub(crate) fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        ws: &mut Workspace,
        plan: &Plan,
        src: Sources<'_>,
        timestamps: Timestamps<'_>,
    ) -> Result<(), Error> {
        let Sources {
            target,
            draft,
            ids: device_ids,
        } = src;
        self.check_alive()?;
        // Host checks of the caller's buffers, before anything is recorded.
        checks::check_buffers(plan, target, draft)?;
        if let Some(ids) = device_ids {
            checks::check_device_ids(plan, ids)?;
        }
        let max_rows = self.check_fit(plan, target, draft)?;
        let mut shape = Shape::new(self, plan, (target, draft), max_rows, false);
        self.ensure_workspace(ws, plan, &shape);
        let rows = self.write_metadata(ws, plan, &mut shape, target, draft);
        let ws = &*ws;
        self.bind_callers(ws, &callers(target, draft));
        scoped(&self.kernels.device, || {
            if let Some(ids) = device_ids {
                Self::record_device_ids(encoder, ws, plan, ids);
            }
            if shape.settle_in_stats {
                self.settled_in_stats.fetch_add(1, Ordering::Relaxed);
                // block_wide_settle's counts start at 0 (the last workgroup of a request is
                // the one that brings its count to the request's total).
                let counts = (shape.out_words + shape.settle_words(plan) - shape.n) as u64 * 4;
                encoder.clear_buffer(ws.out.get(), counts, Some(shape.n as u64 * 4));
            }
            if shape.narrow_settle {
                self.narrow_settles.fetch_add(1, Ordering::Relaxed);
            }
            if shape.special & pipelines::SPECIAL_HALF_WORDS != 0 {
                self.half_words_in_stats.fetch_add(1, Ordering::Relaxed);
            }
            if shape.verify_in_stats {
                self.verified_in_stats.fetch_add(1, Ordering::Relaxed);
                // block_verify's counts start at 0, as block_wide_settle's.
                let counts = shape.partial_words(plan) as u64 * 4;
                encoder.clear_buffer(ws.block_stats.get(), counts, Some(shape.n as u64 * 4));
            }
            let cutoff = self.cutoff_groups(ws, &shape, &rows);
            let stats = self.row_stats_groups(ws, &shape, &rows);
            let masses = self.block_mass_groups(ws, &shape, &rows);
            let residual = self.residual_groups(ws, &shape, &rows);
            let early = self.early_race_groups(ws, &shape, &rows, &residual);
            // verify's group, where a verify entry runs: `main` unless row_stats settled or
            // verified the batch, `block_settle` for block requests with a draft distribution.
            let in_stats = shape.settle_in_stats || shape.verify_in_stats;
            let verify = (!in_stats || shape.block_masses).then(|| self.verify_group(ws, &shape));
            let phases: [&dyn Fn(&mut wgpu::ComputePass<'_>); 4] = [
                &|pass| {
                    // The cut-offs are timed with row_stats when profiling per kernel.
                    self.record_cutoff(pass, &shape, &cutoff);
                    self.record_row_stats(pass, &shape, &stats);
                    // The early race beside row_stats, not after it (timed with it when
                    // profiling per kernel).
                    self.record_residual_blocks(pass, &shape, &early, true);
                },
                &|pass| {
                    // (Nothing where row_stats settled or verified the batch; the phase stays,
                    // empty, so that per-kernel timings keep their columns.)
                    let Some(verify) = &verify else { return };
                    if !in_stats {
                        self.record_verify(pass, &shape, verify);
                    }
                    if shape.block_masses {
                        // Block requests with a draft distribution: their masses R_j, then the
                        // joint decision (timed with verify when profiling per kernel).
                        self.record_block_mass(pass, &shape, &masses);
                        self.record_block_settle(pass, &shape, verify);
                    }
                },
                &|pass| self.record_residual_blocks(pass, &shape, &residual, false),
                &|pass| self.record_residual_merge(pass, &shape, &residual),
            ];
            if !shape.windows.is_empty() {
                record_phases(encoder, &phases, timestamps);
            }
            Self::record_readback_copy(encoder, ws, shape.out_words);
        })
        .map_err(|e| self.lift(e))
    }

    /// Copies draft ids from the caller's GPU buffer over the placeholders `write_metadata` put
    /// in the workspace: the draft id table, and the drafted token of each draft's row in the
    /// row table (`row_info[row].z`, which row_stats reads). Recorded before the passes, so in
    /// encoder order after the metadata writes (queue writes land before the submission).
    fn record_device_ids(
        encoder: &mut wgpu::CommandEncoder,
        ws: &Workspace,
        plan: &Plan,
        ids: DeviceIds<'_>,
    ) {
        let total = plan.total_drafts as u64 * 4;
        if total == 0 {
            return;
        }
        let meta = ws.meta.get();
        let (ids_at, rows_at) = (ws.meta_at.draft_ids.0, ws.meta_at.row_info.0);
        encoder.copy_buffer_to_buffer(ids.buffer, ids.offset, meta, ids_at, total);
        for (row, info) in plan.row_info.iter().enumerate() {
            if info[3] != crate::layout::NO_INDEX {
                let from = ids.offset + u64::from(info[3]) * 4;
                let to = rows_at + row as u64 * 16 + 8;
                encoder.copy_buffer_to_buffer(ids.buffer, from, meta, to, 4);
            }
        }
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
        let _ = self.kernels.device.poll(wgpu::PollType::Poll);
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
            *self.kernels.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
            return Error::DeviceLost { detail: reason };
        }
        Error::Gpu { detail }
    }
}

/// The bytes one storage binding may cover: `VerifierOptions::max_binding_bytes` within the
/// device's limit.
fn max_binding(limits: &wgpu::Limits, opts: &crate::VerifierOptions) -> u64 {
    opts.max_binding_bytes
        .map_or(limits.max_storage_buffer_binding_size, |m| {
            m.min(limits.max_storage_buffer_binding_size)
        })
}

/// The tuning options a backend runs with, their defaults resolved for the adapter.
struct Tuning {
    early_race_entries: u64,
    wide_greedy_chunks: u32,
    narrow_greedy_chunks: u32,
    fused_verify_chunks: u32,
    spin_wait: Duration,
}

impl Tuning {
    /// The tuning measured on a discrete GPU (an H200) applies on discrete GPUs; elsewhere each
    /// of its options left `None` is off: the early race pays where a small batch leaves most
    /// of the GPU idle, while an integrated GPU or a software adapter shares its bandwidth and
    /// cores between the two passes (`VerifierOptions::with_discrete_tuning`). The fused verify
    /// is off where the device has no row_stats_verify pipelines.
    fn resolve(
        info: &wgpu::AdapterInfo,
        opts: &crate::VerifierOptions,
        has_fused_verify: bool,
    ) -> Tuning {
        let tuned = if info.device_type == wgpu::DeviceType::DiscreteGpu {
            opts.clone().with_discrete_tuning()
        } else {
            opts.clone()
        };
        Tuning {
            early_race_entries: tuned.early_race_entries.unwrap_or(0),
            wide_greedy_chunks: tuned.wide_greedy_chunks.unwrap_or(0),
            narrow_greedy_chunks: tuned.narrow_greedy_chunks.unwrap_or(0),
            fused_verify_chunks: if has_fused_verify {
                tuned.fused_verify_chunks.unwrap_or(0)
            } else {
                0
            },
            spin_wait: tuned.spin_wait.unwrap_or(Duration::ZERO),
        }
    }
}

/// The backend's `dummy` (read-only bindings; 64 bytes, one element of every array it stands in
/// for, a RowStats being 48) and `dummy_rw` (writable bindings).
fn dummies(device: &wgpu::Device) -> [wgpu::Buffer; 2] {
    [("specdec.dummy", 64), ("specdec.dummy_rw", 16)].map(|(label, size)| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    })
}

/// The caller's buffers a verification binds: the target rows' and the draft rows'.
pub(super) fn callers<'a>(
    target: GpuRows<'a>,
    draft: Option<GpuRows<'a>>,
) -> Vec<&'a wgpu::Buffer> {
    std::iter::once(target.buffer)
        .chain(draft.map(|d| d.buffer))
        .collect()
}

/// Records the four phases (cutoff + row_stats, verify + block_mass, residual_argmax.block,
/// residual_argmax.merge). One compute pass holds every dispatch (wgpu orders dispatches that
/// share buffers), except when profiling per kernel: then each phase gets its own timed pass.
pub(super) fn record_phases(
    encoder: &mut wgpu::CommandEncoder,
    phases: &[&dyn Fn(&mut wgpu::ComputePass<'_>); 4],
    timestamps: Timestamps<'_>,
) {
    match timestamps {
        Timestamps::PerKernel { query_set, first } => {
            for (i, phase) in phases.iter().enumerate() {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
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

/// The subgroup width the kernels' folds may shuffle across on `device` (the variant's
/// `subgroup_lanes`): the adapter's smallest subgroup size where the options allow subgroups,
/// the device has `SUBGROUP`, the width is more than one lane, and the device's subgroups
/// follow the local index ([`subgroups`]); else 0, the portable folds.
fn subgroup_lanes(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    info: &wgpu::AdapterInfo,
    allowed: bool,
) -> u32 {
    let lanes = info.subgroup_min_size.min(wgpu::MAXIMUM_SUBGROUP_MAX_SIZE);
    if allowed
        && lanes > 1
        && device.features().contains(wgpu::Features::SUBGROUP)
        && subgroups::device_layout_is_ordered(device, queue, lanes)
    {
        lanes
    } else {
        0
    }
}

//! The wgpu backend: adapter selection, the pipeline cache, pooled workspaces, recording a
//! verification into a command encoder, and the readback.

use crate::batch::Plan;
use crate::error::Error;
use crate::layout::*;
use crate::shaders::Kernel;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Storage buffers the widest kernel binds in one stage (residual_argmax: 7).
const STORAGE_BUFFERS_NEEDED: u32 = 8;
/// Bytes of one Params slot; a multiple of every adapter's uniform offset alignment (≤ 256).
const PARAM_SLOT: u64 = 256;
/// Words of one row's slot in the cutoff kernel's scratch (STATE_WORDS in cutoff.wgsl): its
/// stage and radix-select state, then a 256-bin histogram of 64-bit (hi, lo) sums.
const CUT_STATE_WORDS: u64 = 528;
/// Target rows per cutoff dispatch group: the scratch holds one group's slots (both sides:
/// 17 MiB), bounded whatever the batch; larger windows are cut in groups run one after another.
const CUT_GROUP_ROWS: usize = 4096;
/// Fewest row entries per cutoff `scan` workgroup, per lane: below this the workgroup's
/// histogram clear and flush cost more than its share of the row.
const CUT_MIN_PER_LANE: u32 = 8;
/// Bytes of `Params`.
const PARAMS_BYTES: usize = std::mem::size_of::<Params>();

/// Every adapter of the backends `WGPU_BACKEND` allows (all by default), filtered by
/// `WGPU_ADAPTER_NAME` (case-insensitive substring) when it is set.
pub(crate) fn enumerate() -> Vec<wgpu::Adapter> {
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    let wanted = std::env::var("WGPU_ADAPTER_NAME")
        .ok()
        .map(|s| s.to_lowercase());
    pollster::block_on(instance.enumerate_adapters(backends))
        .into_iter()
        .filter(|a| match &wanted {
            Some(w) => a.get_info().name.to_lowercase().contains(w.as_str()),
            None => true,
        })
        .collect()
}

/// Indices of `adapters`, best first: discrete, integrated, virtual, other, CPU (software); native
/// APIs before OpenGL.
pub(crate) fn rank_adapters(adapters: &[wgpu::Adapter]) -> Vec<usize> {
    let rank = |a: &wgpu::Adapter| {
        let i = a.get_info();
        let ty = match i.device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        };
        (ty, u8::from(i.backend == wgpu::Backend::Gl))
    };
    let mut idx: Vec<usize> = (0..adapters.len()).collect();
    idx.sort_by_key(|&i| rank(&adapters[i]));
    idx
}

/// Finds the adapter `Verifier::new` uses: `WGPU_BACKEND` limits the backends,
/// `WGPU_ADAPTER_NAME` (case-insensitive substring) picks one by name; otherwise the best by type
/// (discrete, integrated, virtual, other, CPU/software), native APIs before OpenGL.
pub fn select_adapter() -> Result<wgpu::Adapter, Error> {
    let mut adapters = enumerate();
    match rank_adapters(&adapters).first() {
        Some(&i) => Ok(adapters.swap_remove(i)),
        None => Err(Error::NoAdapter {
            detail: format!(
                "backends {:?}{}: none found",
                wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all()),
                std::env::var("WGPU_ADAPTER_NAME")
                    .map(|w| format!(", WGPU_ADAPTER_NAME={w:?}"))
                    .unwrap_or_default()
            ),
        }),
    }
}

/// The limits we ask of an adapter: WebGPU's downlevel defaults, raised to what the adapter
/// offers for the sizes that decide how much one binding / dispatch can hold.
pub fn required_limits(adapter: &wgpu::Limits) -> Result<wgpu::Limits, Error> {
    if adapter.max_storage_buffers_per_shader_stage < STORAGE_BUFFERS_NEEDED {
        return Err(Error::RequestDevice {
            detail: format!(
                "the kernels bind {STORAGE_BUFFERS_NEEDED} storage buffers per stage, the adapter \
                 allows {}",
                adapter.max_storage_buffers_per_shader_stage
            ),
        });
    }
    let mut l = wgpu::Limits::downlevel_defaults();
    l.max_storage_buffers_per_shader_stage = STORAGE_BUFFERS_NEEDED;
    l.max_storage_buffer_binding_size = adapter.max_storage_buffer_binding_size;
    l.max_buffer_size = adapter.max_buffer_size;
    l.max_compute_workgroups_per_dimension = adapter.max_compute_workgroups_per_dimension;
    l.max_compute_invocations_per_workgroup = adapter.max_compute_invocations_per_workgroup;
    l.max_compute_workgroup_size_x = adapter.max_compute_workgroup_size_x;
    Ok(l)
}

/// A pipeline cache key: kernel, entry point, workgroup size (the `WG` override) and the
/// kernel's feature overrides (`SPECIAL_*` bits: row_stats' raw sums and entropy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PipelineKey {
    kernel: Kernel,
    entry: &'static str,
    wg: u32,
    special: u32,
}

/// row_stats specialisation: also sum the raw rows (raw logprobs).
const SPECIAL_RAW: u32 = 1;
/// row_stats specialisation: also keep the entropy numerator (typical acceptance).
const SPECIAL_ENTROPY: u32 = 2;
/// row_stats specialisation: f32 rows and no cut-off (plain loads, no mask).
const SPECIAL_PLAIN_F32: u32 = 4;

/// The specialisations a kernel is built in. row_stats' optional sums are `override` constants,
/// not runtime flags: a runtime branch kept their registers live and cost 40% of row_stats on
/// an H200 even when off (measured with `bench`), a pipeline per combination costs nothing.
fn specials(kernel: Kernel) -> &'static [u32] {
    match kernel {
        // Every combination of SPECIAL_RAW, SPECIAL_ENTROPY and SPECIAL_PLAIN_F32.
        Kernel::RowStats => &[0, 1, 2, 3, 4, 5, 6, 7],
        // verify merges the same optional sums (raw, entropy) as row_stats leaves: the same
        // specialisation keeps their rescaling out of the chunk merge when they are off.
        Kernel::Verify => &[0, 1, 2, 3],
        _ => &[0],
    }
}

/// A buffer that grows (to the next power of two) when a batch needs more.
struct Grow {
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
    fn ensure(&mut self, device: &wgpu::Device, bytes: u64) -> &wgpu::Buffer {
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
    fn get(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("ensured before use")
    }
}

/// The buffers of one in-flight verification, pooled and reused across calls.
pub(crate) struct Workspace {
    params: Grow,
    requests: Grow,
    row_info: Grow,
    draft_ids: Grow,
    rates: Grow,
    block_stats: Grow,
    row_stats: Grow,
    tasks: Grow,
    candidates: Grow,
    masses: Grow,
    cutoffs: Grow,
    cut_state: Grow,
    out: Grow,
    readback: Grow,
    upload_target: Grow,
    upload_draft: Grow,
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
            masses: Grow::new("specdec.masses", storage),
            cutoffs: Grow::new("specdec.cutoffs", storage | U::COPY_SRC),
            cut_state: Grow::new("specdec.cut_state", U::STORAGE),
            out: Grow::new("specdec.out", storage | U::COPY_SRC),
            readback: Grow::new("specdec.readback", U::MAP_READ | U::COPY_DST),
            upload_target: Grow::new("specdec.upload_target", storage),
            upload_draft: Grow::new("specdec.upload_draft", storage),
        }
    }
}

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

/// `Params::flags` bits of a target (shift 0) or draft (shift 2) element type.
fn dtype_bits(dtype: crate::Dtype, shift: u32) -> u32 {
    match dtype {
        crate::Dtype::F32 => 0,
        crate::Dtype::F16 => PARAM_T_F16 << shift,
        crate::Dtype::Bf16 => PARAM_T_BF16 << shift,
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

/// A range of target rows whose logits fit one storage binding, with the draft rows and the
/// requests that go with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub row_begin: usize,
    pub row_end: usize,
    pub d_row_begin: usize,
    pub d_row_end: usize,
    pub req_begin: usize,
    pub req_end: usize,
}

/// Splits the rows into windows of at most `max_rows` rows.
pub(crate) fn plan_windows(plan: &Plan, max_rows: usize) -> Vec<Window> {
    let mut windows = Vec::new();
    let mut begin = 0;
    while begin < plan.total_rows {
        let end = (begin + max_rows).min(plan.total_rows);
        let (mut d_begin, mut d_end) = (usize::MAX, 0);
        for info in &plan.row_info[begin..end] {
            if info[3] != NO_INDEX {
                d_begin = d_begin.min(info[3] as usize);
                d_end = d_end.max(info[3] as usize + 1);
            }
        }
        if d_end == 0 {
            d_begin = 0;
        }
        windows.push(Window {
            row_begin: begin,
            row_end: end,
            d_row_begin: d_begin,
            d_row_end: d_end,
            req_begin: plan.row_info[begin][0] as usize,
            req_end: plan.row_info[end - 1][0] as usize + 1,
        });
        begin = end;
    }
    windows
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
    layouts: HashMap<Kernel, wgpu::BindGroupLayout>,
    pipelines: HashMap<PipelineKey, wgpu::ComputePipeline>,
    /// The shader variant the pipelines were built from.
    pub variant: crate::shaders::Variant,
    pool: Mutex<Vec<Workspace>>,
    dummy: wgpu::Buffer,
    lost: Arc<Mutex<Option<String>>>,
    owns_device: bool,
    uncaptured: Arc<AtomicBool>,
}

/// A compute-stage bind group layout entry of `ty` at `binding`.
///
/// `pub(crate)` so that `speculative::gather_rows`, which builds its own pipeline outside
/// [`GpuBackend`], lays out its bindings with the same helpers instead of a copy.
pub(crate) fn layout_entry(binding: u32, ty: wgpu::BindingType) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty,
        count: None,
    }
}

/// A storage buffer binding type (no dynamic offset, no minimum size).
///
/// `pub(crate)` for `speculative::gather_rows` (see [`layout_entry`]).
pub(crate) fn storage(read_only: bool) -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Storage { read_only },
        has_dynamic_offset: false,
        min_binding_size: None,
    }
}

fn params_uniform() -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Uniform,
        has_dynamic_offset: true,
        min_binding_size: std::num::NonZeroU64::new(std::mem::size_of::<Params>() as u64),
    }
}

/// The explicit bind group layout of a kernel. The verification kernels bind the Params slot
/// (dynamic offset) at 0 and storage buffers at 1–5, 1–7 or 1–8; `writable` lists the read-write ones.
fn kernel_layout_entries(kernel: Kernel) -> Vec<wgpu::BindGroupLayoutEntry> {
    let with_params = |last: u32, writable: &[u32]| {
        let mut v = vec![layout_entry(0, params_uniform())];
        v.extend((1..=last).map(|b| layout_entry(b, storage(!writable.contains(&b)))));
        v
    };
    match kernel {
        Kernel::Cutoff => with_params(6, &[5, 6]),
        Kernel::RowStats => with_params(8, &[5]),
        Kernel::Verify => with_params(8, &[5, 6, 7]),
        Kernel::BlockMass => with_params(7, &[7]),
        Kernel::ResidualArgmax => with_params(8, &[6, 7]),
        Kernel::RngCheck => vec![
            layout_entry(0, storage(true)),
            layout_entry(1, storage(true)),
            layout_entry(2, storage(false)),
        ],
        Kernel::ReadBandwidth => vec![
            layout_entry(0, storage(true)),
            layout_entry(1, storage(false)),
        ],
    }
}

/// Runs `f` inside validation and out-of-memory error scopes and turns a captured error into
/// `Error::Gpu` (wgpu's default handler would panic the host app).
///
/// `pub(crate)` so that `speculative::gather_rows` wraps its object creation and recording in the same
/// scopes instead of a copy; it maps the `Error::Gpu` it gets to its own `SpecError::Gpu`.
pub(crate) fn scoped<T>(device: &wgpu::Device, f: impl FnOnce() -> T) -> Result<T, Error> {
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    let v = pollster::block_on(validation.pop());
    let o = pollster::block_on(oom.pop());
    match v.or(o) {
        Some(e) => Err(Error::Gpu {
            detail: e.to_string(),
        }),
        None => Ok(value),
    }
}

/// The `WG` override to build with: `requested`, at most 256 and the device's workgroup limits
/// (`max_compute_invocations_per_workgroup`, `max_compute_workgroup_size_x`), rounded to a power
/// of two (up, then halved if that passes the limit). 0 only on a device whose limits allow no
/// compute at all.
///
/// `pub(crate)` so that `speculative::gather_rows` picks its workgroup size the same way as the
/// verifier's kernels instead of a copy of this clamp.
pub(crate) fn workgroup_size(limits: &wgpu::Limits, requested: u32) -> u32 {
    let max_wg = limits
        .max_compute_invocations_per_workgroup
        .min(limits.max_compute_workgroup_size_x)
        .min(256);
    let wg = requested.min(max_wg).max(1).next_power_of_two();
    if wg > max_wg {
        wg / 2
    } else {
        wg
    }
}

impl GpuBackend {
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
        let built = scoped(&device, || {
            let mut layouts = HashMap::new();
            let mut pipelines = HashMap::new();
            for kernel in Kernel::ALL {
                let label = format!("specdec.{}", kernel.name());
                let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(&label),
                    source: wgpu::ShaderSource::Wgsl(kernel.source(variant).into()),
                });
                let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(&label),
                    entries: &kernel_layout_entries(kernel),
                });
                let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some(&label),
                    bind_group_layouts: &[Some(&bgl)],
                    immediate_size: 0,
                });
                for (&entry, &special) in kernel
                    .entry_points()
                    .iter()
                    .flat_map(|e| specials(kernel).iter().map(move |s| (e, s)))
                {
                    let mut constants = vec![("WG", f64::from(wg))];
                    if kernel == Kernel::Verify {
                        constants.push(("RAW_SUMS", f64::from(special & SPECIAL_RAW)));
                        constants.push(("ENTROPY", f64::from((special & SPECIAL_ENTROPY) >> 1)));
                    }
                    if kernel == Kernel::RowStats {
                        constants.push(("RAW_SUMS", f64::from(special & SPECIAL_RAW)));
                        constants.push(("ENTROPY", f64::from((special & SPECIAL_ENTROPY) >> 1)));
                        constants
                            .push(("PLAIN_F32", f64::from((special & SPECIAL_PLAIN_F32) >> 2)));
                    }
                    let pipeline =
                        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(&format!("{label}.{entry}")),
                            layout: Some(&pl),
                            module: &module,
                            entry_point: Some(entry),
                            compilation_options: wgpu::PipelineCompilationOptions {
                                constants: &constants,
                                zero_initialize_workgroup_memory: false,
                            },
                            cache: None,
                        });
                    pipelines.insert(
                        PipelineKey {
                            kernel,
                            entry,
                            wg,
                            special,
                        },
                        pipeline,
                    );
                }
                layouts.insert(kernel, bgl);
            }
            let dummy = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("specdec.dummy"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            (layouts, pipelines, dummy)
        })?;
        let (layouts, pipelines, dummy) = built;
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

    fn pipeline(&self, kernel: Kernel, entry: &'static str) -> &wgpu::ComputePipeline {
        self.special_pipeline(kernel, entry, 0)
    }

    fn special_pipeline(
        &self,
        kernel: Kernel,
        entry: &'static str,
        special: u32,
    ) -> &wgpu::ComputePipeline {
        &self.pipelines[&PipelineKey {
            kernel,
            entry,
            wg: self.wg,
            special,
        }]
    }

    fn check_alive(&self) -> Result<(), Error> {
        if let Some(reason) = self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(Error::DeviceLost { detail: reason });
        }
        Ok(())
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

    /// Uploads host slices into the workspace's upload buffers (pooled), for the host-slice API.
    pub(crate) fn upload(
        &self,
        ws: &mut Workspace,
        target: crate::Logits<'_>,
        draft: Option<crate::Logits<'_>>,
    ) -> Result<(), Error> {
        let max = self.device.limits().max_buffer_size;
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
            let buf = grow.ensure(&self.device, padded);
            let whole = data.len() / 4 * 4;
            self.queue.write_buffer(buf, 0, &data[..whole]);
            if whole < data.len() {
                let mut tail = [0u8; 4];
                tail[..data.len() - whole].copy_from_slice(&data[whole..]);
                self.queue.write_buffer(buf, whole as u64, &tail);
            }
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

    /// Starts mapping the readback of a recorded verification; the returned flag is set by
    /// wgpu's callback once the copy has landed.
    pub(crate) fn start_map(&self, ws: &Workspace, words: usize) -> MapFlag {
        let flag: MapFlag = Arc::new(Mutex::new(None));
        if words > 0 {
            let flag_c = flag.clone();
            ws.readback.get().slice(..(words * 4) as u64).map_async(
                wgpu::MapMode::Read,
                move |r| {
                    *flag_c.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                },
            );
        } else {
            *flag.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ok(()));
        }
        flag
    }

    /// Blocks until `submission` is done (bounded by the timeout).
    pub(crate) fn wait(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<(), Error> {
        match self.device.poll(wgpu::PollType::Wait {
            submission_index: submission,
            timeout: Some(self.timeout),
        }) {
            Ok(_) => self.check_alive(),
            Err(wgpu::PollError::Timeout) => Err(Error::Timeout {
                waited: self.timeout,
            }),
            Err(e) => Err(self.diagnose(e.to_string())),
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

    /// Waits for `submission`, then for the readback's map callback, and copies the words out.
    /// With several threads on one device, the thread whose poll completes our submission may
    /// run our callback a moment after our own wait returned, so the flag is polled (and the
    /// thread yields) until it is set, within the timeout.
    pub(crate) fn wait_for_map(
        &self,
        submission: Option<wgpu::SubmissionIndex>,
        ws: &Workspace,
        words: usize,
        flag: &MapFlag,
    ) -> Result<VerifyWords, Error> {
        let start = std::time::Instant::now();
        self.wait(submission)?;
        loop {
            if let Some(w) = self.collect(ws, words, flag)? {
                return Ok(w);
            }
            if start.elapsed() > self.timeout {
                return Err(Error::Timeout {
                    waited: self.timeout,
                });
            }
            self.poll_once()?;
            std::thread::yield_now();
        }
    }

    /// One non-blocking poll, for the async path.
    pub(crate) fn poll_once(&self) -> Result<(), Error> {
        let _ = self.device.poll(wgpu::PollType::Poll);
        self.check_alive()
    }

    /// The call's timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Copies the mapped readback out once `flag` is set. `Ok(None)` while still pending.
    pub(crate) fn collect(
        &self,
        ws: &Workspace,
        words: usize,
        flag: &MapFlag,
    ) -> Result<Option<VerifyWords>, Error> {
        let state = flag.lock().unwrap_or_else(|p| p.into_inner()).take();
        match state {
            None => return Ok(None),
            Some(Err(e)) => {
                self.check_alive()?;
                return Err(Error::Gpu {
                    detail: format!("readback failed: {e}"),
                });
            }
            Some(Ok(())) => {}
        }
        if words == 0 {
            return Ok(Some(Vec::new()));
        }
        let slice = ws.readback.get().slice(..(words * 4) as u64);
        let out = {
            let view = slice.get_mapped_range().map_err(|e| Error::Gpu {
                detail: format!("readback mapping: {e}"),
            })?;
            bytemuck::cast_slice::<u8, u32>(&view).to_vec()
        };
        ws.readback.get().unmap();
        if self.owns_device && self.uncaptured.swap(false, Ordering::SeqCst) {
            return Err(Error::Gpu {
                detail: "an uncaptured wgpu error was reported during the call".into(),
            });
        }
        Ok(Some(out))
    }

    /// The output buffer of a workspace (packed words) — for callers that keep results on the GPU.
    pub(crate) fn output_buffer(ws: &Workspace) -> &wgpu::Buffer {
        ws.out.get()
    }

    /// Reads back the first `n` cut-offs the last verification in `ws` left (test hook; blocks).
    pub(crate) fn read_cutoffs(&self, ws: &Workspace, n: usize) -> Result<Vec<f32>, Error> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let bytes = (n * 4) as u64;
        let read = scoped(&self.device, || {
            let read = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("specdec.cutoffs.read"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut encoder = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("specdec.cutoffs.read"),
                });
            encoder.copy_buffer_to_buffer(ws.cutoffs.get(), 0, &read, 0, bytes);
            self.queue.submit([encoder.finish()]);
            read
        })
        .map_err(|e| self.lift(e))?;
        let flag: MapFlag = Arc::new(Mutex::new(None));
        let flag_c = flag.clone();
        read.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            *flag_c.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        });
        self.wait(None)?;
        match flag.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(Ok(())) => {}
            other => {
                return Err(Error::Gpu {
                    detail: format!("cut-off readback failed: {other:?}"),
                })
            }
        }
        let out =
            bytemuck::cast_slice::<u8, f32>(&read.slice(..).get_mapped_range().map_err(|e| {
                Error::Gpu {
                    detail: format!("cut-off readback mapping: {e}"),
                }
            })?)
            .to_vec();
        Ok(out)
    }

    /// Uploads a host-slice batch and records it into a fresh encoder; returns the submission.
    pub(crate) fn submit_host(
        &self,
        ws: &mut Workspace,
        plan: &Plan,
        target: crate::Logits<'_>,
        draft: Option<crate::Logits<'_>>,
    ) -> Result<wgpu::SubmissionIndex, Error> {
        self.upload(ws, target, draft)?;
        let mut encoder = self
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
        self.record(&mut encoder, ws, plan, t, d, Timestamps::None)?;
        scoped(&self.device, || self.queue.submit([encoder.finish()])).map_err(|e| self.lift(e))
    }

    /// Records the read-bandwidth kernel over all of `data` (a multiple of 16 bytes) with
    /// `workgroups` workgroups, optionally timed.
    pub(crate) fn record_read_bandwidth(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        data: &wgpu::Buffer,
        sink: &wgpu::Buffer,
        workgroups: u32,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) {
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("specdec.read_bandwidth"),
            layout: &self.layouts[&Kernel::ReadBandwidth],
            entries: &[entry(0, data), entry(1, sink)],
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("specdec.read_bandwidth"),
            timestamp_writes: timestamps,
        });
        pass.set_pipeline(self.pipeline(Kernel::ReadBandwidth, "main"));
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(workgroups, 1, 1);
    }

    /// Runs the rng_check kernel: for each counter (quad, pos_lo, stream, pos_hi) under `seed`,
    /// 12 words: Philox words, uniform bits, Exp(1) bits.
    pub(crate) fn rng_check(&self, seed: u64, counters: &[[u32; 4]]) -> Result<Vec<u32>, Error> {
        use wgpu::util::DeviceExt;
        let dev = &self.device;
        let req = ReqInfo {
            seed_lo: seed as u32,
            seed_hi: (seed >> 32) as u32,
            ..ReqInfo::default()
        };
        let bytes = (counters.len() * 48) as u64;
        let counters_buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("specdec.rng_check.counters"),
            contents: bytemuck::cast_slice(counters),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let req_buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("specdec.rng_check.key"),
            contents: bytemuck::bytes_of(&req),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let out = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specdec.rng_check.out"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specdec.rng_check.read"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let index = scoped(dev, || {
            let group = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("specdec.rng_check"),
                layout: &self.layouts[&Kernel::RngCheck],
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: counters_buf.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: req_buf.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: out.as_entire_binding(),
                    },
                ],
            });
            let mut encoder = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("specdec.rng_check"),
            });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                });
                pass.set_pipeline(self.pipeline(Kernel::RngCheck, "main"));
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(counters.len().div_ceil(self.wg as usize) as u32, 1, 1);
            }
            encoder.copy_buffer_to_buffer(&out, 0, &read, 0, bytes);
            self.queue.submit([encoder.finish()])
        })?;
        let slice = read.slice(..);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: Some(self.timeout),
            })
            .map_err(|_| Error::Timeout {
                waited: self.timeout,
            })?;
        let view = slice.get_mapped_range().map_err(|e| Error::Gpu {
            detail: format!("readback mapping: {e}"),
        })?;
        let words = bytemuck::cast_slice::<u8, u32>(&view).to_vec();
        Ok(words)
    }
}

/// A bind group entry over the whole of `buffer`.
///
/// `pub(crate)` for `speculative::gather_rows` (see [`layout_entry`]).
pub(crate) fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

/// A bind group entry over `size` bytes of `buffer` from byte `offset`.
///
/// `pub(crate)` for `speculative::gather_rows`, which binds chunks of the caller's buffers the same way
/// (see [`layout_entry`]).
pub(crate) fn ranged(
    binding: u32,
    buffer: &wgpu::Buffer,
    offset: u64,
    size: u64,
) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset,
            size: std::num::NonZeroU64::new(size),
        }),
    }
}

/// Packed output words `[tokens | num_emitted | status]`.
pub(crate) type VerifyWords = Vec<u32>;

/// Set by the map callback: `Some(result)` once the readback is mapped (or failed).
pub(crate) type MapFlag = Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>>;

/// The binding range (offset, size) of rows `[begin, end)` of `rows` and the element index of
/// row `begin` inside it: the offset is rounded down to the storage offset alignment.
fn window_range(
    rows: GpuRows<'_>,
    begin: usize,
    end: usize,
    row_bytes: u64,
    align: u64,
) -> ((u64, u64), u32) {
    let start = rows.offset + begin as u64 * row_bytes;
    let stop = rows.offset + end as u64 * row_bytes;
    let aligned = start - start % align;
    // Bindings cover whole 4-byte words (an odd count of half values ends mid-word).
    let size = (stop - aligned)
        .next_multiple_of(4)
        .min(rows.buffer.size() - aligned);
    (
        (aligned, size),
        ((start - aligned) / rows.dtype.size()) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::workgroup_size;

    /// The shared clamp gives what `speculative::gather_rows` computed on its own before it used it (the
    /// largest power of two within `min(limits, 256)`, at least 1 there), and never passes the
    /// limits for any request.
    #[test]
    fn workgroup_size_is_a_power_of_two_within_the_limits() {
        for limit in 0..=1100u32 {
            for (inv, x) in [(limit, 1024), (1024, limit), (limit, limit)] {
                let limits = wgpu::Limits {
                    max_compute_invocations_per_workgroup: inv,
                    max_compute_workgroup_size_x: x,
                    ..wgpu::Limits::default()
                };
                let max_wg = limit.clamp(1, 256);
                let gather_before = 1u32 << (31 - max_wg.leading_zeros());
                assert_eq!(
                    workgroup_size(&limits, 256).max(1),
                    gather_before,
                    "{limit}"
                );
                for requested in [0, 1, 3, 32, 48, 64, 100, 256, 300, 1024] {
                    let wg = workgroup_size(&limits, requested);
                    if limit == 0 {
                        assert_eq!(wg, 0);
                        continue;
                    }
                    assert!(
                        wg.is_power_of_two() && wg <= limit.min(256),
                        "{limit} {requested}"
                    );
                }
            }
        }
    }
}

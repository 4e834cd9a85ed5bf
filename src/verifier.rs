//! `Verifier`: the one entry point. Built once per device; verifies batches from host slices or
//! records into the caller's command encoder over the caller's GPU buffers.

mod tree;
pub use tree::{GpuTreeBatch, PendingTree};

use crate::batch::{check_rows, Fault, Logits, Plan, Request, Shape, VerifyBatch, VerifyOutput};
use crate::cpu::{self, TwinShape};
use crate::error::Error;
use crate::gpu::{self, DeviceIds, GpuBackend, GpuDraft, GpuRows, MapFlag, Timestamps, Workspace};
use rand_pcg::rand_core::{Rng, SeedableRng};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Options of a [`Verifier`]. `Default` is right for almost everyone.
#[derive(Clone, Debug)]
pub struct VerifierOptions {
    /// How many workgroups a pass over the logits aims for (default 8192): enough to fill a large
    /// GPU at small batches, few enough to keep each one busy at large batches. All-greedy
    /// batches of 4,096 chunks or more on the wide reduction (`wide_greedy_chunks`) aim for
    /// half as many workgroups, of at least three chunks each (faster on an H200). Tuning only:
    /// the results never depend on it.
    pub target_workgroups: u32,
    /// One-hot batches (no draft values) whose sampled requests' draft rows hold at most this
    /// many vocabulary entries in all (0 turns it off) race every row while the statistics pass
    /// runs, instead of the chosen row after verify: the race needs no row statistics there, so
    /// it overlaps row_stats and leaves the chain a dispatch shorter, at the cost of racing
    /// k + 1 rows per request instead of one. `None` (the default) is 1,250,000 on adapters
    /// wgpu reports as discrete GPUs, where an H200 stopped gaining (`docs/performance.md`), and
    /// off elsewhere: an integrated GPU or a software adapter shares its bandwidth and cores
    /// between the two passes, so the extra rows would cost time there instead of filling idle
    /// units (not measured). Tuning only: the tokens never depend on it.
    pub early_race_entries: Option<u64>,
    /// All-greedy batches (no raw logprobs) of at most this many chunks (4,096-entry pieces of
    /// a row; 0 turns it off) reduce each chunk over the device's workgroup size instead of 64
    /// lanes: a row's maximum and the lowest index holding it do not depend on the order of
    /// the fold, and each lane then waits out one round of loads instead of four. While it is
    /// not 0, all-greedy requests with more than 128 chunk partials also merge them over as
    /// many lanes, at any batch size. `None` (the default) is `target_workgroups / 8` (1,024)
    /// on adapters wgpu reports as discrete GPUs, where an H200's greedy GPU time took
    /// 0.86-1.01x up to 1,024 chunks and 0.99-1.17x with the wide chunks above it
    /// (`docs/performance.md`), and off elsewhere: llvmpipe, which runs a workgroup's lanes on
    /// one CPU thread, took 1.6-2.5x as long, and integrated GPUs are not measured. Batches
    /// that settle in the statistics pass (`fused_greedy`) take the wide reduction at any size
    /// while this is not 0. Tuning only: the tokens never depend on it.
    pub wide_greedy_chunks: Option<u32>,
    /// All-greedy batches of f32 rows settled in the statistics pass (`fused_greedy`) on
    /// workgroups of one chunk each (below 4,096 chunks at the default `target_workgroups`)
    /// with at least this many chunks (0 turns it off) reduce each chunk over half the
    /// device's workgroup size (128 lanes of 256): twice as many of those workgroups fit on
    /// the GPU at once, so a batch that would take more than one wave of full-width workgroups
    /// takes fewer. `None` (the default) is 1,024 on adapters wgpu reports as discrete GPUs,
    /// where an H200 held about 1,056 full-width workgroups at once and its greedy GPU time
    /// took 0.87-0.94x from 1,280 to 2,736 chunks, 0.97-1.00x from 320 to 608 and 1.02-1.10x
    /// at R = 1 with 76-342 chunks (`docs/performance.md`), and off elsewhere (not measured).
    /// Needs a workgroup size of 256 or more. Tuning only: the tokens never depend on it.
    pub narrow_greedy_chunks: Option<u32>,
    /// All-greedy chain batches (not trees) with at most 64 rows a request (f32 rows, or halves
    /// below the half path's size) are decided inside the statistics pass while
    /// `wide_greedy_chunks` is not 0, whatever their size: they take the wide reduction, and the
    /// last row_stats workgroup of each request merges its rows and writes its tokens, so the
    /// verify kernel is not dispatched (default true). On an H200 greedy GPU time took
    /// 0.76-0.83x up to 1,024 chunks and 0.92-0.99x from 1,280 to 43,776 (R = 128, k = 8,
    /// V = 151,936), 1.07-1.09x at 2,736 (R = 8, k = 8 there) (`docs/performance.md`). Tuning
    /// only: the outputs are the same bits.
    pub fused_greedy: bool,
    /// Chain batches that sample (not trees, not all-greedy, without raw logprobs or typical
    /// acceptance) of at most this many chunk partials (rows × ⌈V / 4096⌉) are verified inside
    /// the statistics pass: the last row_stats workgroup of each request merges its rows'
    /// partials and decides its drafts exactly as the verify kernel would, so verify is not
    /// dispatched (the early race, `early_race_entries`, still runs beside the statistics pass).
    /// `None` (the default) is 1,536 on adapters wgpu reports as discrete GPUs, where an H200's
    /// sampled GPU time took 0.85-0.98x up to 1,024 chunks, 0.93-1.00x from 1,280 to 1,520
    /// (verify's folds kept in row_stats' lane arrays there) and 1.00-1.11x from 2,048 (the
    /// tail's workgroup memory and atomics cost every workgroup), and off elsewhere (not measured);
    /// 0 turns it off. Needs a device that binds 14 storage buffers per stage. Tuning only: the
    /// outputs are the same bits.
    pub fused_verify_chunks: Option<u32>,
    /// Invocations per workgroup of the residual pass; default 256, lowered to a power of two
    /// within the device's limits.
    pub workgroup_size: Option<u32>,
    /// Cap on the bytes one storage binding may cover, below the device's
    /// `max_storage_buffer_binding_size` (None = the device's). Larger batches are split into
    /// row windows, and the cutoff pass's rows into groups whose scratch fits; results do not
    /// change. Mostly for tests of that chunking.
    pub max_binding_bytes: Option<u64>,
    /// How long a call waits for the GPU before returning [`Error::Timeout`]. Default 60 s.
    pub timeout: Duration,
    /// How long a blocking read ([`Verifier::read_blocking`], [`Verifier::verify_blocking`])
    /// polls the device in a loop for its result before it sleeps in the driver's wait. Waking
    /// from that wait is slow: on an H200's machine a round trip through wgpu took 84-104 µs
    /// sleeping and 57 µs polling, and whole calls 0.76x as long (R = 1: 0.64x) when polling
    /// (`docs/performance.md`). The price is a CPU core kept busy for up to this long per call:
    /// there, polling cost the calling thread about the whole call in CPU time, 1.7x what
    /// sleeping cost (a median 52 µs more per call, up to 306 µs for 128 requests of 8 drafts).
    /// `None` (the default) is 1 ms on adapters wgpu reports as discrete GPUs, longer than the
    /// calls measured there up to 128 requests of 4 drafts, and 0 (sleep at once) elsewhere: a
    /// software adapter runs the kernels on the cores a loop would take, and integrated GPUs are
    /// not measured. The async [`Verifier::read`] polls between yields to its executor whatever
    /// this is.
    pub spin_wait: Option<Duration>,
    /// Use 64-bit integer multiplies in the random-number generator when the device offers
    /// `SHADER_INT64` (default true; `Verifier::new` asks for the feature when the adapter has
    /// it). Same results either way; false forces the portable path.
    pub shader_int64: bool,
    /// Fold lane states across subgroups in registers (subgroup shuffles) where the device
    /// offers `SUBGROUP` (default true; `Verifier::new` asks for the feature when the adapter
    /// has it). Same results either way: the folds keep their order; false forces every fold
    /// level through workgroup memory.
    pub subgroups: bool,
    /// Hand the kernels their per-window parameters as immediate data (push constants) set
    /// with each dispatch, where the device offers `IMMEDIATES` with room for them
    /// (`Verifier::new` then asks for the feature), instead of a slot of a uniform buffer that
    /// each kernel first loads from memory. Same results either way. Default false: on an
    /// NVIDIA H200 through Vulkan every dispatch took about 1 µs longer with them (GPU time
    /// 1.055x, R = 1 1.07x; `docs/performance.md`). Devices that keep push constants in
    /// registers may gain one memory round per dispatch; `specdec bench --immediates` measures
    /// it on yours.
    pub immediates: bool,
    /// Widen f16 rows with the device's `unpack2x16float` (one conversion per value) where a
    /// check when the verifier is made finds it exact for every one of the 65,536 binary16
    /// values, else with integer operations (default true). The same results either way; the
    /// check runs one small kernel when the device's kernels are built. On an H200 it took f16
    /// calls to 0.84x the GPU time of the integer widening, as fast as bf16 rows
    /// (`docs/performance.md`). False forces the integer widening.
    pub f16_unpack: bool,
    /// The runtime checks naga compiles into every kernel, or `None` (the default) for the
    /// measured choice: index clamps everywhere, and wgpu's loop-bounding counter everywhere
    /// except row_stats and residual_argmax. Their loops run to bounds the host validates
    /// before each call, and on an H200 the counter cost residual_argmax 10-20 % and row_stats
    /// 1-3 %, while dropping it made the verify kernel slower (`docs/performance.md`). Results
    /// never depend on this; `Some(wgpu::ShaderRuntimeChecks::unchecked())` also drops the
    /// index clamps (wgpu's trust model: an out-of-bounds access would be undefined behaviour
    /// on the GPU; our kernels index only below sizes the host checks).
    pub shader_checks: Option<wgpu::ShaderRuntimeChecks>,
    /// When a GPU verifier builds its compute pipelines: each at the first call that needs it
    /// (`OnDemand`, the default), or all of them when the verifier is made (`Eager`). Results
    /// never depend on it. On wgpu's OpenGL backend every pipeline is built when the verifier
    /// is made, whatever this says ([`PipelineBuild`]).
    pub pipelines: PipelineBuild,
    /// Threads of the CPU backend; default: the machine's available parallelism.
    pub cpu_threads: Option<usize>,
    /// Seed of the generator that draws seeds for requests with `seed: None`; default from the
    /// clock (calls with `None` seeds then differ run to run, as they should).
    pub seed_source: Option<u64>,
    /// Where [`Verifier::auto`] runs (default: a real GPU if there is one, else the CPU
    /// backend); the environment variable `SPECDEC_DEVICE=cpu|gpu|auto` overrides it.
    pub device: crate::DeviceChoice,
    #[doc(hidden)]
    /// Deliberately wrong sampler, only for the negative controls of statistical tests.
    pub fault: Fault,
}

impl Default for VerifierOptions {
    fn default() -> Self {
        VerifierOptions {
            target_workgroups: 8192,
            early_race_entries: None,
            wide_greedy_chunks: None,
            narrow_greedy_chunks: None,
            fused_greedy: true,
            fused_verify_chunks: None,
            workgroup_size: None,
            shader_int64: true,
            subgroups: true,
            immediates: false,
            f16_unpack: true,
            shader_checks: None,
            pipelines: PipelineBuild::OnDemand,
            max_binding_bytes: None,
            timeout: Duration::from_secs(60),
            spin_wait: None,
            cpu_threads: None,
            seed_source: None,
            device: crate::DeviceChoice::Auto,
            fault: Fault::None,
        }
    }
}

/// When a GPU verifier builds its compute pipelines ([`VerifierOptions::pipelines`]). The
/// kernels come in about ninety specialisations (entry points, row types, optional sums, the
/// fused paths), of which one program's calls dispatch a handful; the driver compiles each one
/// on the thread that builds it, from milliseconds on a discrete GPU to a few hundred on a
/// software adapter (lavapipe: about 18 s for all of them on two cores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PipelineBuild {
    /// Each pipeline at the first call that dispatches it, on that call's thread; the call
    /// fails with [`Error::Gpu`] if the driver rejects it. A verifier is ready at once, and a
    /// program compiles only what its calls use, at the cost of a slower first call of each
    /// kind (a first sampled batch, a first top-p request, a first bf16 batch): on an H200
    /// with NVIDIA's shader cache cold, 0.2 s for a first greedy call and up to 3.3 s for a
    /// first top-p call, 4-16 ms once the driver has cached them, against 6-9 s for `Eager`
    /// (`examples/first_calls`, `docs/design.md`). A program that must never stall on a call
    /// makes one warm-up call of each kind it serves, or asks for `Eager`. On wgpu's
    /// OpenGL backend, `Eager` instead: every call there waits for its one GL context, which a
    /// compiling call would hold while other threads' calls wait (wgpu gives up after a second).
    #[default]
    OnDemand,
    /// Every pipeline when the verifier is made, on up to eight threads: no call compiles, and
    /// a driver that rejects any specialisation fails [`Verifier::new`] instead of the first
    /// call that needs it.
    Eager,
}

/// `VerifierOptions::early_race_entries` on a discrete GPU when the options leave it `None`:
/// where an H200 stopped gaining from the early race (`docs/performance.md`).
const EARLY_RACE_ENTRIES: u64 = 1_250_000;

/// `VerifierOptions::fused_verify_chunks` on a discrete GPU when the options leave it `None`:
/// an H200 gained up to 1,520 chunks (0.93-1.00x from 1,280, with verify's folds in row_stats'
/// lane arrays there) and lost from 2,048 (1.00-1.11x; `docs/performance.md`).
const FUSED_VERIFY_CHUNKS: u32 = 1536;

/// `VerifierOptions::narrow_greedy_chunks` on a discrete GPU when the options leave it `None`:
/// about one wave of full-width workgroups on an H200, from which the narrow settle gained
/// (0.87-0.94x from 1,280 chunks; `docs/performance.md`).
const NARROW_GREEDY_CHUNKS: u32 = 1024;

/// `VerifierOptions::spin_wait` on a discrete GPU when the options leave it `None`: longer than
/// the whole calls measured on an H200 up to 128 requests of 4 drafts (60-350 µs,
/// `benches/results/nvidia-h200-vulkan-spin-wait.csv`).
const SPIN_WAIT: Duration = Duration::from_millis(1);

impl VerifierOptions {
    /// These options with the tuning of discrete GPUs filled in wherever they leave it `None`:
    /// `early_race_entries` 1,250,000, `wide_greedy_chunks` `target_workgroups / 8` (1,024),
    /// `narrow_greedy_chunks` 1,024, `fused_verify_chunks` 1,536 and `spin_wait` 1 ms; fields
    /// already set are kept.
    ///
    /// A GPU verifier applies this by itself on adapters wgpu reports as discrete GPUs, and
    /// leaves those options off elsewhere. Calling it applies the same tuning on any adapter: an
    /// integrated GPU to try against its defaults (`specdec bench` takes each option), or a
    /// software adapter, where the test suite runs the discrete GPUs' code paths
    /// (`SPECDEC_TEST_TUNING=discrete`, or `fused` for those paths at any batch size, as CI
    /// does). Tuning only: the outputs are the same bits either way.
    ///
    /// ```
    /// use specdec::VerifierOptions;
    /// let opts = VerifierOptions {
    ///     fused_verify_chunks: Some(0), // set: kept (the fused verify stays off)
    ///     ..VerifierOptions::default()
    /// }
    /// .with_discrete_tuning();
    /// assert_eq!(opts.fused_verify_chunks, Some(0));
    /// assert_eq!(opts.early_race_entries, Some(1_250_000));
    /// assert_eq!(opts.wide_greedy_chunks, Some(1024));
    /// assert_eq!(opts.spin_wait, Some(std::time::Duration::from_millis(1)));
    /// ```
    pub fn with_discrete_tuning(mut self) -> Self {
        self.early_race_entries.get_or_insert(EARLY_RACE_ENTRIES);
        self.wide_greedy_chunks
            .get_or_insert(self.target_workgroups / 8);
        self.narrow_greedy_chunks
            .get_or_insert(NARROW_GREEDY_CHUNKS);
        self.fused_verify_chunks.get_or_insert(FUSED_VERIFY_CHUNKS);
        self.spin_wait.get_or_insert(SPIN_WAIT);
        self
    }
}

enum Backend {
    Cpu(TwinShape),
    Gpu(Box<GpuBackend>),
}

/// Verifies batches of speculative drafts (SPEC §3) on a GPU through wgpu, or on the CPU twin.
///
/// `Verifier` is `Send + Sync`: one instance may serve several threads at once. What is shared is
/// the device, the pipelines (each built once) and a small pool of work buffers; each call takes its
/// own buffers from the pool, so concurrent calls do not wait for one another on the host.
pub struct Verifier {
    backend: Backend,
    opts: VerifierOptions,
    seeds: Mutex<rand_pcg::Pcg64>,
}

/// A batch whose logits already live in GPU buffers of the verifier's device.
#[derive(Clone, Copy, Debug)]
pub struct GpuVerifyBatch<'a> {
    /// Vocabulary size `V`.
    pub vocab_size: u32,
    /// The requests, in output order.
    pub requests: &'a [Request],
    /// Σ num_drafts draft ids (host memory; uploaded with the call's metadata).
    pub draft_token_ids: &'a [i32],
    /// Σ (num_drafts + 1) rows × V target logits (f32, f16 or bf16: [`GpuRows::dtype`]),
    /// starting at the given byte offset.
    pub target_logits: GpuRows<'a>,
    /// The draft distribution.
    pub draft: GpuDraft<'a>,
    /// Columns of a draft row when the draft vocabulary is smaller (see
    /// [`VerifyBatch::draft_vocab_size`]); `None`: `vocab_size`.
    pub draft_vocab_size: Option<u32>,
    /// Conditional acceptance rates for synthetic requests (see [`VerifyBatch::synthetic_rates`]).
    pub synthetic_rates: Option<&'a [f32]>,
}

/// A verification recorded into a command encoder. Submit the encoder, then pass this to
/// [`Verifier::read_blocking`] (or [`Verifier::read`]) for the host copy, or use
/// [`PendingVerify::output_buffer`] directly on the GPU.
pub struct PendingVerify {
    ws: Workspace,
    plan: Plan,
}

impl PendingVerify {
    /// The GPU buffer holding the packed result: `R × stride` i32 tokens, then `R` u32
    /// num_emitted, then `R` u32 status words (see [`PendingVerify::layout`]).
    pub fn output_buffer(&self) -> &wgpu::Buffer {
        GpuBackend::output_buffer(&self.ws)
    }
    /// `(num_requests, stride)` of the packed result: tokens at word 0, num_emitted at word
    /// `R·stride`, status at `R·stride + R`.
    pub fn layout(&self) -> (usize, usize) {
        (self.plan.num_requests(), self.plan.out_stride)
    }
}

impl Verifier {
    /// A verifier where the backend policy puts it ([`crate::device`]): a real GPU if there is
    /// one, otherwise the CPU backend (a software adapter such as llvmpipe is slower than the
    /// CPU backend, so it is used only when asked for). `SPECDEC_DEVICE=cpu|gpu|auto` and
    /// [`VerifierOptions::device`] override the choice.
    pub fn auto(opts: VerifierOptions) -> Result<Verifier, Error> {
        let decision = crate::device::decide(opts.device)?;
        if decision.use_cpu {
            return Ok(Verifier::cpu(opts));
        }
        Verifier::new(opts)
    }

    /// A GPU verifier on the adapter chosen by [`gpu::select_adapter`] (honours `WGPU_BACKEND`
    /// and `WGPU_ADAPTER_NAME`), with limits negotiated within what the adapter offers.
    pub fn new(opts: VerifierOptions) -> Result<Verifier, Error> {
        check_options(&opts)?;
        let adapter = gpu::select_adapter()?;
        let limits = gpu::required_limits(&adapter.limits())?;
        let features = gpu::optional_features(&adapter, &opts);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("specdec"),
            required_features: features,
            required_limits: limits,
            ..Default::default()
        }))
        .map_err(|e| Error::RequestDevice {
            detail: e.to_string(),
        })?;
        let backend = GpuBackend::new(device, queue, adapter.get_info(), &opts, true)?;
        Ok(Self::build(Backend::Gpu(Box::new(backend)), opts))
    }

    /// A GPU verifier on a device the app already has (the usual case: its model runs there).
    /// The device must allow 8 storage buffers per shader stage. The app's error handlers are
    /// left alone; every call of ours runs inside error scopes.
    pub fn with_device(
        device: wgpu::Device,
        queue: wgpu::Queue,
        opts: VerifierOptions,
    ) -> Result<Verifier, Error> {
        check_options(&opts)?;
        let info = device.adapter_info();
        let backend = GpuBackend::new(device, queue, info, &opts, false)?;
        Ok(Self::build(Backend::Gpu(Box::new(backend)), opts))
    }

    /// A verifier on the CPU twin of the kernels: for machines without a GPU driver, and the
    /// oracle of the GPU tests.
    pub fn cpu(opts: VerifierOptions) -> Verifier {
        let threads = opts
            .cpu_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let shape = TwinShape { threads };
        Self::build(Backend::Cpu(shape), opts)
    }

    /// A verifier with other tuning on this one's device and compiled kernels, without
    /// building them again (seconds per verifier on a software adapter): `opts` may change
    /// what never changes results (`target_workgroups`, `early_race_entries`,
    /// `wide_greedy_chunks`, `narrow_greedy_chunks`, `fused_greedy`, `fused_verify_chunks`,
    /// `max_binding_bytes`,
    /// `timeout`, `spin_wait`, `seed_source`, `cpu_threads`; `pipelines`: `Eager` builds the
    /// pipelines the device's kernels have not built yet), but not the kernels themselves:
    /// `workgroup_size`, `shader_int64`, `subgroups`, `immediates`, `f16_unpack` and
    /// `shader_checks` must be
    /// this verifier's, else [`Error::InvalidOptions`] names the first that differs. The two
    /// verifiers are independent (own buffers, own seeds) and share the device: its loss ends
    /// both (`opts.device` is not consulted). On the CPU backend this is [`Verifier::cpu`] with
    /// `opts`.
    pub fn with_tuning(&self, opts: VerifierOptions) -> Result<Verifier, Error> {
        check_options(&opts)?;
        let Backend::Gpu(g) = &self.backend else {
            return Ok(Verifier::cpu(opts));
        };
        let mine = &self.opts;
        let differs = [
            ("workgroup_size", mine.workgroup_size != opts.workgroup_size),
            ("shader_int64", mine.shader_int64 != opts.shader_int64),
            ("subgroups", mine.subgroups != opts.subgroups),
            ("immediates", mine.immediates != opts.immediates),
            ("f16_unpack", mine.f16_unpack != opts.f16_unpack),
            (
                "shader_checks",
                checks_key(mine.shader_checks) != checks_key(opts.shader_checks),
            ),
        ];
        if let Some((name, _)) = differs.iter().find(|(_, d)| *d) {
            return Err(Error::InvalidOptions {
                detail: format!(
                    "with_tuning keeps the kernels: VerifierOptions::{name} must be this \
                     verifier's (build a new Verifier for other kernels)"
                ),
            });
        }
        let backend = g.retuned(&opts);
        if opts.pipelines == PipelineBuild::Eager {
            backend.build_all_pipelines()?;
        }
        Ok(Self::build(Backend::Gpu(Box::new(backend)), opts))
    }

    fn build(backend: Backend, opts: VerifierOptions) -> Verifier {
        let seed = opts.seed_source.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ (std::process::id() as u64).rotate_left(32)
        });
        Verifier {
            backend,
            opts,
            seeds: Mutex::new(rand_pcg::Pcg64::seed_from_u64(seed)),
        }
    }

    /// On wgpu's OpenGL backend every call runs on one EGL context, submit executes the work
    /// while holding it, and a thread that waits for the context longer than wgpu's lock timeout
    /// (one second) panics inside wgpu. So the blocking host path runs one call at a time there,
    /// and a long verification on one thread makes the others wait here instead. Other backends
    /// take no lock: their calls run concurrently.
    fn serialize(&self) -> Option<MutexGuard<'_, ()>> {
        match &self.backend {
            Backend::Gpu(g) if g.kernels.info.backend == wgpu::Backend::Gl => {
                Some(g.kernels.gl_calls.lock().unwrap_or_else(|e| e.into_inner()))
            }
            _ => None,
        }
    }

    pub(crate) fn gpu_backend(&self) -> Option<&GpuBackend> {
        match &self.backend {
            Backend::Gpu(g) => Some(g),
            Backend::Cpu(_) => None,
        }
    }

    /// True when this verifier runs on a GPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self.backend, Backend::Gpu(_))
    }

    /// The adapter of a GPU verifier.
    pub fn adapter_info(&self) -> Option<&wgpu::AdapterInfo> {
        match &self.backend {
            Backend::Gpu(g) => Some(&g.kernels.info),
            Backend::Cpu(_) => None,
        }
    }

    /// The device and queue of a GPU verifier (to create buffers for the GPU-resident path).
    pub fn device(&self) -> Option<(&wgpu::Device, &wgpu::Queue)> {
        match &self.backend {
            Backend::Gpu(g) => Some((&g.kernels.device, &g.kernels.queue)),
            Backend::Cpu(_) => None,
        }
    }

    /// One line saying where verification runs, e.g. `GPU: llvmpipe (LLVM 15.0.6, 256 bits)
    /// (Vulkan, Cpu)` or `CPU backend (2 threads)`.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Gpu(g) => format!(
                "GPU: {} ({:?}, {:?}{})",
                g.kernels.info.name,
                g.kernels.info.backend,
                g.kernels.info.device_type,
                g.kernels.variant.describe()
            ),
            Backend::Cpu(s) => format!("CPU backend ({} threads)", s.threads),
        }
    }

    /// The options this verifier was built with.
    pub fn options(&self) -> &VerifierOptions {
        &self.opts
    }

    fn plan(&self, shape: &Shape<'_>) -> Result<Plan, Error> {
        let mut rng = self.seeds.lock().unwrap_or_else(|p| p.into_inner());
        Plan::new(shape, self.opts.fault, || rng.next_u64())
    }

    fn host_plan<'b>(&self, batch: &VerifyBatch<'b>) -> Result<(Plan, Option<Logits<'b>>), Error> {
        let (kind, draft) = batch.draft.split();
        let plan = self.plan(&Shape {
            vocab: batch.vocab_size,
            requests: batch.requests,
            draft_ids: batch.draft_token_ids,
            draft_kind: kind,
            draft_vocab: batch.draft_vocab_size,
            rates: batch.synthetic_rates,
        })?;
        check_rows(
            batch.target_logits.len(),
            plan.total_rows,
            plan.vocab,
            false,
        )?;
        if let Some(d) = draft {
            check_rows(d.len(), plan.total_drafts, plan.draft_vocab, true)?;
        }
        Ok((plan, draft))
    }

    /// Verifies a batch held in host memory; blocks until the result is back.
    /// On a GPU: one upload, one submission, one readback.
    pub fn verify_blocking(&self, batch: &VerifyBatch<'_>) -> Result<VerifyOutput, Error> {
        let (plan, draft) = self.host_plan(batch)?;
        match &self.backend {
            Backend::Cpu(shape) => {
                let (t, d) = (batch.target_logits.to_f32(), draft.map(|d| d.to_f32()));
                Ok(plan.decode_output(&cpu::run(&plan, &t, d.as_deref(), *shape)))
            }
            Backend::Gpu(g) => {
                if plan.num_requests() == 0 {
                    return Ok(plan.decode_output(&[]));
                }
                let _serial = self.serialize();
                let mut ws = g.take_workspace();
                let result = (|| {
                    let index = g.submit_host(&mut ws, &plan, batch.target_logits, draft)?;
                    let words = out_words(&plan);
                    let flag = g.start_map(&ws, words);
                    let w = g.wait_for_map(Some(index), &ws, words, &flag)?;
                    Ok(plan.decode_output(&w))
                })();
                g.give_back_if_ok(ws, &result);
                result
            }
        }
    }

    /// Test and debugging hook: whether a verification of `batch` on this verifier races its
    /// rows beside the statistics pass (`VerifierOptions::early_race_entries`); always false on
    /// the CPU backend.
    #[doc(hidden)]
    pub fn takes_early_race(&self, batch: &VerifyBatch<'_>) -> Result<bool, Error> {
        let (plan, _) = self.host_plan(batch)?;
        Ok(match &self.backend {
            Backend::Cpu(_) => false,
            Backend::Gpu(g) => g.takes_early_race(&plan),
        })
    }

    /// Test and debugging hook: the logit cut-off of every row (target rows, then draft rows)
    /// under the requests' top-k / top-p / min-p, as the backend computed them during a
    /// verification of `batch` (−inf where nothing is cut; empty when no request filters).
    #[doc(hidden)]
    pub fn cutoffs_blocking(&self, batch: &VerifyBatch<'_>) -> Result<Vec<f32>, Error> {
        let (plan, draft) = self.host_plan(batch)?;
        if !plan.filters() {
            return Ok(Vec::new());
        }
        match &self.backend {
            Backend::Cpu(_) => {
                let (t, d) = (batch.target_logits.to_f32(), draft.map(|d| d.to_f32()));
                Ok(cpu::cutoffs(&plan, &t, d.as_deref()))
            }
            Backend::Gpu(g) => {
                let _serial = self.serialize();
                let mut ws = g.take_workspace();
                let result = (|| {
                    let index = g.submit_host(&mut ws, &plan, batch.target_logits, draft)?;
                    g.wait(Some(index))?;
                    let mut cuts = g.read_cutoffs(&ws, plan.total_rows + plan.total_drafts)?;
                    // The cutoff kernel cuts draft rows only when they are logits, and no kernel
                    // reads a cut-off of draft probabilities, so those slots hold whatever the
                    // workspace held: nothing is cut there.
                    if plan.draft_kind != crate::layout::DRAFT_LOGITS {
                        cuts[plan.total_rows..].fill(f32::NEG_INFINITY);
                    }
                    Ok(cuts)
                })();
                g.give_back_if_ok(ws, &result);
                result
            }
        }
    }

    /// Verifies a batch held in host memory without blocking the executor: the GPU is polled
    /// each time the future is polled (wgpu makes progress only when polled on native), and the
    /// future yields in between. The CPU backend computes in place.
    pub async fn verify(&self, batch: &VerifyBatch<'_>) -> Result<VerifyOutput, Error> {
        let (plan, draft) = self.host_plan(batch)?;
        match &self.backend {
            Backend::Cpu(shape) => {
                let (t, d) = (batch.target_logits.to_f32(), draft.map(|d| d.to_f32()));
                Ok(plan.decode_output(&cpu::run(&plan, &t, d.as_deref(), *shape)))
            }
            Backend::Gpu(g) => {
                if plan.num_requests() == 0 {
                    return Ok(plan.decode_output(&[]));
                }
                let mut ws = g.take_workspace();
                let submitted = g.submit_host(&mut ws, &plan, batch.target_logits, draft);
                let result = match submitted {
                    Ok(_) => {
                        let words = out_words(&plan);
                        let flag = g.start_map(&ws, words);
                        ReadFuture {
                            g,
                            ws: &ws,
                            words,
                            flag,
                            start: Instant::now(),
                        }
                        .await
                        .map(|w| plan.decode_output(&w))
                    }
                    Err(e) => Err(e),
                };
                g.give_back_if_ok(ws, &result);
                result
            }
        }
    }

    /// Records the whole verification into `encoder`, reading the caller's logits buffers in
    /// place (one storage binding per row window; offsets are byte offsets, multiples of 4).
    /// The metadata (requests, draft ids) is written with `queue.write_buffer`, so it lands with
    /// the next submission. Nothing is submitted here: submit the encoder, then call
    /// [`Verifier::read_blocking`] / [`Verifier::read`], or consume
    /// [`PendingVerify::output_buffer`] on the GPU.
    ///
    /// The bind groups over the caller's buffers are kept and reused by the next call that
    /// binds the same ranges of the same buffers (a decode loop's calls do), which saves wgpu's
    /// bind-group creation on every call. They hold a reference: the buffers of a call stay
    /// allocated after the caller drops them, until a later call binds other buffers, until
    /// [`Verifier::forget_buffers`], or until the verifier is dropped.
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        batch: &GpuVerifyBatch<'_>,
    ) -> Result<PendingVerify, Error> {
        self.record_timed(encoder, batch, Timestamps::None)
    }

    /// [`Verifier::record`] with GPU timestamps (for profiling; the device needs
    /// `Features::TIMESTAMP_QUERY`): around the one compute pass that holds every dispatch, or
    /// around each kernel in a pass of its own.
    pub fn record_timed(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        batch: &GpuVerifyBatch<'_>,
        timestamps: Timestamps<'_>,
    ) -> Result<PendingVerify, Error> {
        self.record_inner(encoder, batch, timestamps, None)
    }

    /// [`Verifier::record`] with the draft token ids read from a GPU buffer, for drafts that
    /// never came to the host (a draft model sampling on the GPU, its tokens fed straight to
    /// the target). `batch.draft_token_ids` still gives the count, `Σ num_drafts`; its values
    /// are placeholders, checked like ids but replaced on the GPU by the `Σ num_drafts` i32 at
    /// `ids` (copied in the encoder before the verification's passes, so they may be written
    /// earlier in the same encoder). The GPU ids are not checked: each must be in
    /// `0..vocab_size`, as a verifier's or sampler's output is.
    pub fn record_device_drafts(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        batch: &GpuVerifyBatch<'_>,
        ids: DeviceIds<'_>,
    ) -> Result<PendingVerify, Error> {
        self.record_inner(encoder, batch, Timestamps::None, Some(ids))
    }

    fn record_inner(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        batch: &GpuVerifyBatch<'_>,
        timestamps: Timestamps<'_>,
        ids: Option<DeviceIds<'_>>,
    ) -> Result<PendingVerify, Error> {
        let Backend::Gpu(g) = &self.backend else {
            return Err(Error::NotGpu);
        };
        let (kind, draft) = batch.draft.split();
        let plan = self.plan(&Shape {
            vocab: batch.vocab_size,
            requests: batch.requests,
            draft_ids: batch.draft_token_ids,
            draft_kind: kind,
            draft_vocab: batch.draft_vocab_size,
            rates: batch.synthetic_rates,
        })?;
        let mut ws = g.take_workspace();
        if plan.num_requests() > 0 {
            let src = gpu::Sources {
                target: batch.target_logits,
                draft,
                ids,
            };
            if let Err(e) = g.record(encoder, &mut ws, &plan, src, timestamps) {
                ws.forget_groups();
                g.give_back(ws);
                return Err(e);
            }
        }
        Ok(PendingVerify { ws, plan })
    }

    /// Ends a recorded verification whose result is not needed on the host (its output was
    /// used on the GPU, e.g. copied into the next call's input), returning its buffers to the
    /// verifier's pool. Call it after the encoder that holds the verification was submitted
    /// (or dropped): a later recording may then reuse the buffers, which the queue orders after
    /// the submission. Dropping the `PendingVerify` instead frees its buffers.
    pub fn release(&self, pending: PendingVerify) {
        if let Backend::Gpu(g) = &self.backend {
            g.give_back(pending.ws);
        }
    }

    /// Lets go of the caller's buffers that the verifier keeps alive through the bind groups
    /// of its last calls ([`Verifier::record`]): call it after dropping a large logits buffer
    /// whose memory should be freed before the next call. A call in flight lets go of its
    /// buffers at its workspace's next call. Nothing to do on the CPU backend.
    pub fn forget_buffers(&self) {
        if let Backend::Gpu(g) = &self.backend {
            g.forget_buffers();
        }
    }

    /// Test hook: bind groups made so far, and the caller buffers the pooled workspaces keep
    /// alive through kept groups (`(0, 0)` on the CPU backend).
    #[doc(hidden)]
    pub fn bind_group_counts(&self) -> (u64, usize) {
        match &self.backend {
            Backend::Gpu(g) => (
                g.groups_made.load(std::sync::atomic::Ordering::Relaxed),
                g.kept_caller_buffers(),
            ),
            Backend::Cpu(_) => (0, 0),
        }
    }

    /// Test hook: the compute pipelines built so far on this verifier's device, and the
    /// pipelines its kernels describe (`(0, 0)` on the CPU backend).
    #[doc(hidden)]
    pub fn pipeline_counts(&self) -> (usize, usize) {
        match &self.backend {
            Backend::Gpu(g) => g.pipeline_counts(),
            Backend::Cpu(_) => (0, 0),
        }
    }

    /// A GPU backend's path counter for the test hooks below (0 on the CPU backend).
    fn gpu_count(&self, counter: impl Fn(&GpuBackend) -> &std::sync::atomic::AtomicU64) -> u64 {
        match &self.backend {
            Backend::Gpu(g) => counter(g).load(std::sync::atomic::Ordering::Relaxed),
            Backend::Cpu(_) => 0,
        }
    }

    /// Test hook: calls whose all-greedy batch was settled inside row_stats
    /// (`VerifierOptions::fused_greedy`; 0 on the CPU backend).
    #[doc(hidden)]
    pub fn fused_greedy_calls(&self) -> u64 {
        self.gpu_count(|g| &g.settled_in_stats)
    }

    /// Test hook: calls whose batch was verified inside row_stats
    /// (`VerifierOptions::fused_verify_chunks`; 0 on the CPU backend).
    #[doc(hidden)]
    pub fn fused_verify_calls(&self) -> u64 {
        self.gpu_count(|g| &g.verified_in_stats)
    }

    /// Test hook: calls whose all-greedy batch was settled inside row_stats over half the
    /// workgroup size (`VerifierOptions::narrow_greedy_chunks`; 0 on the CPU backend).
    #[doc(hidden)]
    pub fn narrow_greedy_calls(&self) -> u64 {
        self.gpu_count(|g| &g.narrow_settles)
    }

    /// Test hook: calls whose half-precision target rows row_stats read as half words, a lane
    /// of the statistics contract an invocation (small batches; 0 on the CPU backend).
    #[doc(hidden)]
    pub fn half_words_calls(&self) -> u64 {
        self.gpu_count(|g| &g.half_words_in_stats)
    }

    /// Reads back a recorded verification after its encoder was submitted. Blocks (bounded by
    /// the timeout).
    pub fn read_blocking(&self, pending: PendingVerify) -> Result<VerifyOutput, Error> {
        let Backend::Gpu(g) = &self.backend else {
            return Err(Error::NotGpu);
        };
        let PendingVerify { ws, plan } = pending;
        let words = out_words(&plan);
        let result = (|| {
            let flag = g.start_map(&ws, words);
            let w = g.wait_for_map(None, &ws, words, &flag)?;
            Ok(plan.decode_output(&w))
        })();
        g.give_back_if_ok(ws, &result);
        result
    }

    /// Async twin of [`Verifier::read_blocking`].
    pub async fn read(&self, pending: PendingVerify) -> Result<VerifyOutput, Error> {
        let Backend::Gpu(g) = &self.backend else {
            return Err(Error::NotGpu);
        };
        let PendingVerify { ws, plan } = pending;
        let words = out_words(&plan);
        let flag = g.start_map(&ws, words);
        let result = ReadFuture {
            g,
            ws: &ws,
            words,
            flag,
            start: Instant::now(),
        }
        .await
        .map(|w| plan.decode_output(&w));
        g.give_back_if_ok(ws, &result);
        result
    }

    /// Test hook: the rng_check kernel's output for `counters` under `seed` (12 words each: four
    /// Philox words, the uniform's bits, four Exp(1) bit patterns, padding).
    #[doc(hidden)]
    pub fn rng_check(&self, seed: u64, counters: &[[u32; 4]]) -> Result<Vec<u32>, Error> {
        match &self.backend {
            Backend::Gpu(g) => g.rng_check(seed, counters),
            Backend::Cpu(_) => Err(Error::NotGpu),
        }
    }
}

fn out_words(plan: &Plan) -> usize {
    plan.out_words()
}

/// `ShaderRuntimeChecks` as a comparable value: wgpu 30 derives no `PartialEq` for it, and its
/// `Debug` form names every field, so a field a later wgpu adds is compared too.
fn checks_key(c: Option<wgpu::ShaderRuntimeChecks>) -> Option<String> {
    c.map(|c| format!("{c:?}"))
}

fn check_options(opts: &VerifierOptions) -> Result<(), Error> {
    if opts.target_workgroups == 0 {
        return Err(Error::BatchTooLarge {
            reason: "VerifierOptions::target_workgroups must be at least 1".into(),
        });
    }
    Ok(())
}

/// Polls the device until the readback is mapped, yielding between polls.
struct ReadFuture<'a> {
    g: &'a GpuBackend,
    ws: &'a Workspace,
    words: usize,
    flag: MapFlag,
    start: Instant,
}

impl Future for ReadFuture<'_> {
    type Output = Result<Vec<u32>, Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Err(e) = self.g.poll_once() {
            return Poll::Ready(Err(e));
        }
        match self.g.collect(self.ws, self.words, &self.flag) {
            Ok(Some(w)) => Poll::Ready(Ok(w)),
            Err(e) => Poll::Ready(Err(e)),
            Ok(None) if self.start.elapsed() > self.g.timeout() => {
                Poll::Ready(Err(Error::Timeout {
                    waited: self.g.timeout(),
                }))
            }
            Ok(None) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

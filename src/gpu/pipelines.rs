//! Step 2: the pipeline cache. Every kernel's shader module, explicit bind group layout and
//! compute pipelines, built once per device and keyed by kernel, entry point, workgroup size and
//! specialisation (`override` constants). Reads the WGSL sources; writes device objects only.

use super::GpuBackend;
use crate::shaders::Kernel;
use std::collections::HashMap;

/// A pipeline cache key: kernel, entry point, workgroup size (the `WG` override) and the
/// kernel's feature overrides (`SPECIAL_*` bits: row_stats' raw sums and entropy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct PipelineKey {
    kernel: Kernel,
    entry: &'static str,
    wg: u32,
    special: u32,
}

/// row_stats specialisation: also sum the raw rows (raw logprobs).
pub(super) const SPECIAL_RAW: u32 = 1;
/// row_stats specialisation: also keep the entropy numerator (typical acceptance).
pub(super) const SPECIAL_ENTROPY: u32 = 2;
/// Specialisation of f32 rows: plain loads in cutoff, residual_argmax and block_mass; in
/// row_stats only without a cut-off (it also skips the mask there).
pub(super) const SPECIAL_PLAIN_F32: u32 = 4;
/// row_stats specialisation: f16 target rows and no cut-off (8 entries per 16-byte load).
pub(super) const SPECIAL_PLAIN_F16: u32 = 8;
/// row_stats specialisation: bf16 target rows and no cut-off (8 entries per 16-byte load).
pub(super) const SPECIAL_PLAIN_BF16: u32 = 16;
/// row_stats specialisation: every request greedy and no raw sums, so each row's maximum, its
/// index and the flags are all it keeps (no softmax sums, no draft rows).
pub(super) const SPECIAL_MAX_ONLY: u32 = 32;
/// residual_argmax specialisation: no task subtracts q (one-hot drafts, not a tree), so every
/// race is keyed in the log domain and the linear keys' code is compiled out.
pub(super) const SPECIAL_LOG_KEYS: u32 = 64;
/// residual_argmax specialisation (with `SPECIAL_LOG_KEYS`): the early race, every row of a
/// small one-hot batch raced beside row_stats, the merge reading the stopping row's candidates.
pub(super) const SPECIAL_EARLY: u32 = 128;

/// Specialisation of all-greedy batches: with `SPECIAL_MAX_ONLY`, row_stats' `block_wide`
/// entry reduces each chunk over the device's workgroup size instead of the contract's 64
/// lanes; in verify, the greedy merge takes as many lanes (`VERIFY_WG`). A row's maximum and
/// the lowest index holding it do not depend on the order of the fold, so the results are the
/// same bits.
pub(super) const SPECIAL_WIDE: u32 = 256;

/// row_stats specialisation (with `SPECIAL_PLAIN_F16` or `SPECIAL_PLAIN_BF16`): the half rows
/// read by the f32 paths' lanes, one lane of the statistics contract per invocation and a group
/// of four entries from two 32-bit words, instead of an invocation playing two lanes from one
/// 16-byte load. The small batches that take it are bound by latency, not bytes, and playing two
/// lanes halves their workgroups' invocations.
pub(super) const SPECIAL_HALF_WORDS: u32 = 1024;

/// row_stats_verify specialisation: verify's row-run folds kept in row_stats' lane arrays
/// instead of an array of their own, so the pass's workgroups allocate less workgroup memory
/// (`Shape::shared_runs`). Not an `override`: these pipelines come from a text of their own
/// (`Kernel::source_with`).
pub(super) const SPECIAL_SHARED_RUNS: u32 = 512;

/// row_stats specialisation (with `SPECIAL_MAX_ONLY | SPECIAL_WIDE` and f32 rows, entry
/// `block_wide_settle` only): the wide reduction over half the device's workgroup size
/// (`Shape::narrow_settle`). Twice as many of its workgroups fit on the GPU at once, so batches
/// of one-chunk workgroups that would take more than one wave of full-width ones take fewer.
pub(super) const SPECIAL_NARROW: u32 = 4096;

/// The specialisations a kernel is built in. row_stats' optional sums are `override` constants,
/// not runtime flags: a runtime branch kept their registers live and cost 40% of row_stats on
/// an H200 even when off (measured with `bench`), a pipeline per combination costs nothing.
fn specials(kernel: Kernel) -> &'static [u32] {
    match kernel {
        // Every combination of SPECIAL_RAW and SPECIAL_ENTROPY with none or one of the
        // SPECIAL_PLAIN_* bits; SPECIAL_MAX_ONLY (never with the sums) with each load path,
        // and with SPECIAL_WIDE for f32 or dtype-dispatched rows; the half words (1024) for
        // half rows without the sums, with and without SPECIAL_MAX_ONLY and SPECIAL_WIDE; the
        // narrow settle (4096) for f32 rows.
        Kernel::RowStats => &[
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 32, 36, 40, 48, 288, 292, 1032,
            1040, 1064, 1072, 1320, 1328, 4388,
        ],
        // verify merges the same optional sums (raw, entropy) as row_stats leaves: the same
        // specialisation keeps their rescaling out of the chunk merge when they are off.
        // SPECIAL_WIDE only without them (an all-greedy batch without raw sums).
        Kernel::Verify => &[0, 1, 2, 3, SPECIAL_WIDE],
        // row_stats with verify in its last workgroups: the load paths without the optional
        // sums (batches with raw logprobs or typical acceptance take verify's dispatch), each
        // with verify's folds in an array of their own or in row_stats' lane arrays, so
        // building a device compiles twelve more row_stats pipelines, not thirty-six.
        Kernel::RowStatsVerify => &[
            0,
            SPECIAL_PLAIN_F32,
            SPECIAL_PLAIN_F16,
            SPECIAL_PLAIN_BF16,
            SPECIAL_PLAIN_F16 | SPECIAL_HALF_WORDS,
            SPECIAL_PLAIN_BF16 | SPECIAL_HALF_WORDS,
            SPECIAL_SHARED_RUNS,
            SPECIAL_SHARED_RUNS | SPECIAL_PLAIN_F32,
            SPECIAL_SHARED_RUNS | SPECIAL_PLAIN_F16,
            SPECIAL_SHARED_RUNS | SPECIAL_PLAIN_BF16,
            SPECIAL_SHARED_RUNS | SPECIAL_PLAIN_F16 | SPECIAL_HALF_WORDS,
            SPECIAL_SHARED_RUNS | SPECIAL_PLAIN_BF16 | SPECIAL_HALF_WORDS,
        ],
        // cutoff, residual_argmax and block_mass read f32 rows without the dtype dispatch, with
        // or without filters (residual pass 0.97x, top-p calls 0.95x on an H200,
        // `docs/performance.md`); residual_argmax also without the linear keys' code, and
        // then also as the early race; and its race (not the merge, which reads no rows) half
        // target rows with f32 or no draft rows without the dispatch either.
        Kernel::Cutoff | Kernel::BlockMass => &[0, SPECIAL_PLAIN_F32],
        Kernel::ResidualArgmax => &[
            0,
            SPECIAL_PLAIN_F32,
            SPECIAL_PLAIN_F16,
            SPECIAL_PLAIN_BF16,
            SPECIAL_LOG_KEYS,
            SPECIAL_PLAIN_F32 | SPECIAL_LOG_KEYS,
            SPECIAL_PLAIN_F16 | SPECIAL_LOG_KEYS,
            SPECIAL_PLAIN_BF16 | SPECIAL_LOG_KEYS,
            SPECIAL_LOG_KEYS | SPECIAL_EARLY,
            SPECIAL_PLAIN_F32 | SPECIAL_LOG_KEYS | SPECIAL_EARLY,
            SPECIAL_PLAIN_F16 | SPECIAL_LOG_KEYS | SPECIAL_EARLY,
            SPECIAL_PLAIN_BF16 | SPECIAL_LOG_KEYS | SPECIAL_EARLY,
        ],
        _ => &[0],
    }
}

/// The explicit bind group layout of a kernel, kept beside the kernel's `record_*` function. The
/// verification kernels bind the Params slot (dynamic offset) at 0 and storage buffers at 1–6,
/// 1–7 or 1–8 ([`super::bindings::with_params`]).
fn kernel_layout_entries(kernel: Kernel) -> Vec<wgpu::BindGroupLayoutEntry> {
    match kernel {
        Kernel::Cutoff => super::cutoff::layout_entries(),
        Kernel::RowStats => super::row_stats::layout_entries(),
        Kernel::RowStatsVerify => super::row_stats::verify_layout_entries(),
        Kernel::Verify => super::verify::layout_entries(),
        Kernel::BlockMass => super::block_mass::layout_entries(),
        Kernel::ResidualArgmax => super::residual::layout_entries(),
        Kernel::RngCheck => super::diagnostics::rng_check_layout_entries(),
        Kernel::ReadBandwidth => super::diagnostics::read_bandwidth_layout_entries(),
    }
}

impl GpuBackend {
    pub(super) fn pipeline(&self, kernel: Kernel, entry: &'static str) -> &wgpu::ComputePipeline {
        self.special_pipeline(kernel, entry, 0)
    }

    pub(super) fn special_pipeline(
        &self,
        kernel: Kernel,
        entry: &'static str,
        special: u32,
    ) -> &wgpu::ComputePipeline {
        self.kernels.pipelines.get(
            &self.kernels.device,
            PipelineKey {
                kernel,
                entry,
                wg: self.kernels.wg,
                special,
            },
        )
    }
}

/// The runtime checks of `kernel` when the options name none: naga's index clamps always; wgpu's
/// loop-bounding counter (a guard against infinite loops, which no kernel here has) where
/// [`Kernel::loop_bounding_by_default`] keeps it.
pub(super) fn default_checks(kernel: Kernel) -> wgpu::ShaderRuntimeChecks {
    wgpu::ShaderRuntimeChecks {
        force_loop_bounding: kernel.loop_bounding_by_default(),
        ..wgpu::ShaderRuntimeChecks::checked()
    }
}

/// The explicit bind group layout of every kernel, by kernel.
pub(super) type Layouts = HashMap<Kernel, wgpu::BindGroupLayout>;

/// The compute pipelines of one device, by key: each one's description, and the pipeline once
/// built. A verifier builds them all when it is made ([`Pipelines::build_all`],
/// `PipelineBuild::Eager`) or each at the first call that dispatches it (`OnDemand`, the
/// default): a call needs a handful of the ~90 specialisations, and the driver compiles each
/// one on the calling thread (on lavapipe a verifier's ~18 s of creation, on any GPU the
/// specialisations a program never takes).
pub(super) struct Pipelines {
    jobs: HashMap<PipelineKey, Job>,
}

impl Pipelines {
    /// The pipeline of `key`, built on this thread if no call built it before. Inside a
    /// call's error scopes (`record` runs in `scoped`), so a driver's error building it on
    /// demand fails the call that needed it. Panics for a key [`build_pipelines`] never
    /// described: the record functions ask only for the combinations `specials` lists.
    pub fn get(&self, device: &wgpu::Device, key: PipelineKey) -> &wgpu::ComputePipeline {
        let job = self
            .jobs
            .get(&key)
            .unwrap_or_else(|| panic!("no pipeline is described for {key:?}"));
        job.built.get_or_init(|| job.build(device))
    }

    /// Builds every pipeline not yet built, on up to eight threads, each taking the next job
    /// not taken; on wgpu's OpenGL `backend` on this thread alone, since every call there
    /// waits for the one GL context (and wgpu panics after a second of waiting). wgpu's error
    /// scopes belong to the thread that pushed them, so each worker wraps its jobs in scopes of
    /// its own and the first error any of them saw is returned.
    pub fn build_all(
        &self,
        device: &wgpu::Device,
        backend: wgpu::Backend,
    ) -> Result<(), crate::Error> {
        let threads = if backend == wgpu::Backend::Gl {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
        };
        let jobs: Vec<&Job> = self.jobs.values().collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let worker = || {
            super::bindings::scoped(device, || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                job.built.get_or_init(|| job.build(device));
            })
        };
        if threads <= 1 {
            return worker();
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads.min(jobs.len()))
                .map(|_| s.spawn(worker))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect::<Result<Vec<()>, _>>()
        })?;
        Ok(())
    }

    /// Pipelines built so far, and pipelines described.
    pub fn counts(&self) -> (usize, usize) {
        let built = self
            .jobs
            .values()
            .filter(|j| j.built.get().is_some())
            .count();
        (built, self.jobs.len())
    }
}

/// Describes every kernel's layout and pipelines (every entry point, every specialisation) for
/// workgroup size `wg`, with naga's runtime `checks` (`None`: [`default_checks`]), and builds
/// the modules and layouts; the pipelines are built by [`Pipelines::get`] or
/// [`Pipelines::build_all`]. Call inside an error scope: creation errors of the modules and
/// layouts are reported there.
pub(super) fn build_pipelines(
    device: &wgpu::Device,
    variant: crate::shaders::Variant,
    wg: u32,
    checks: Option<wgpu::ShaderRuntimeChecks>,
) -> (Layouts, Pipelines) {
    let mut layouts = HashMap::new();
    let mut jobs = HashMap::new();
    let storage_buffers = device.limits().max_storage_buffers_per_shader_stage;
    for kernel in Kernel::ALL {
        // row_stats_verify binds more storage buffers than the other kernels; a device that
        // cannot bind them verifies in verify's own dispatch (`Shape::verify_in_stats`).
        if kernel == Kernel::RowStatsVerify
            && storage_buffers < super::adapter::STORAGE_BUFFERS_FUSED
        {
            continue;
        }
        let label = format!("specdec.{}", kernel.name());
        let checks = checks.unwrap_or_else(|| default_checks(kernel));
        let module_of = |lane_runs: bool| {
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(kernel.source_with(variant, lane_runs).into()),
            };
            // SAFETY: the checks only guard against out-of-bounds indices and unbounded loops.
            // Every index of our kernels stays below sizes the host validates before a call
            // (`checks.rs`, the window plan), and every loop runs to a bound taken from those
            // sizes, so dropping the checks (`VerifierOptions::shader_checks`) changes no access.
            unsafe { device.create_shader_module_trusted(desc, checks) }
        };
        let module = module_of(false);
        // row_stats_verify's SPECIAL_SHARED_RUNS pipelines come from its second text.
        let lane_runs = (kernel == Kernel::RowStatsVerify).then(|| module_of(true));
        // With Params as immediate data the layout has no binding 0, and the pipeline layout
        // holds the immediate data instead.
        let immediates = variant.immediates && kernel.takes_params();
        let mut entries = kernel_layout_entries(kernel);
        entries.retain(|e| !(immediates && e.binding == super::bindings::PARAMS_BINDING));
        let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: if immediates {
                super::bindings::PARAMS_BYTES as u32
            } else {
                0
            },
        });
        layouts.insert(kernel, bgl);
        for &entry in kernel.entry_points() {
            for &special in specials(kernel) {
                if !built(kernel, entry, special) {
                    continue;
                }
                let module = match &lane_runs {
                    Some(m) if special & SPECIAL_SHARED_RUNS != 0 => m,
                    _ => &module,
                };
                let key = PipelineKey {
                    kernel,
                    entry,
                    wg,
                    special,
                };
                let job = Job {
                    entry,
                    label: format!("{label}.{entry}"),
                    layout: pl.clone(),
                    module: module.clone(),
                    constants: override_constants(kernel, wg, special, variant),
                    built: std::sync::OnceLock::new(),
                };
                jobs.insert(key, job);
            }
        }
    }
    (layouts, Pipelines { jobs })
}

/// One compute pipeline of [`Pipelines`]: its entry point, label, layout, module and
/// constants, and the pipeline once built.
struct Job {
    entry: &'static str,
    label: String,
    layout: wgpu::PipelineLayout,
    module: wgpu::ShaderModule,
    constants: Vec<(&'static str, f64)>,
    built: std::sync::OnceLock<wgpu::ComputePipeline>,
}

impl Job {
    fn build(&self, device: &wgpu::Device) -> wgpu::ComputePipeline {
        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&self.label),
            layout: Some(&self.layout),
            module: &self.module,
            entry_point: Some(self.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &self.constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        })
    }
}

/// Whether `entry` is built in `special`: row_stats' `block_wide` and
/// `block_wide_settle(_blocks)` are the `SPECIAL_WIDE` pipelines' entries, `block` everyone
/// else's (a wide `block` or a narrow `block_wide` would never be dispatched), and
/// `SPECIAL_NARROW` only `block_wide_settle`; cutoff's `SPECIAL_PLAIN_F32` only for its scans,
/// the entries that read rows in bulk (`record_cutoff` dispatches `init` and the picks
/// unspecialised); residual_argmax's half rows only for its race (`record_residual_merge`
/// leaves those bits out).
fn built(kernel: Kernel, entry: &str, special: u32) -> bool {
    match kernel {
        Kernel::RowStats if special & SPECIAL_NARROW != 0 => entry == "block_wide_settle",
        Kernel::RowStats => entry.starts_with("block_wide") == (special & SPECIAL_WIDE != 0),
        Kernel::Cutoff => special & SPECIAL_PLAIN_F32 == 0 || entry.starts_with("scan"),
        Kernel::ResidualArgmax => {
            special & (SPECIAL_PLAIN_F16 | SPECIAL_PLAIN_BF16) == 0 || entry == "block"
        }
        _ => true,
    }
}

/// The `override` constants of one pipeline: the workgroup size, the subgroup width the folds
/// may use (`SG_LANES`, 1 without subgroups), and the specialisation bits
/// as the 0/1 constants of the kernels that have them.
fn override_constants(
    kernel: Kernel,
    wg: u32,
    special: u32,
    variant: crate::shaders::Variant,
) -> Vec<(&'static str, f64)> {
    // The narrow settle runs row_stats' wide reduction over half the device's workgroup size.
    let wg = if kernel == Kernel::RowStats && special & SPECIAL_NARROW != 0 {
        wg / 2
    } else {
        wg
    };
    let mut constants = vec![
        ("WG", f64::from(wg)),
        ("SG_LANES", f64::from(variant.sg_lanes())),
    ];
    if kernel == Kernel::Verify {
        constants.push(("RAW_SUMS", f64::from(special & SPECIAL_RAW)));
        constants.push(("ENTROPY", f64::from((special & SPECIAL_ENTROPY) >> 1)));
        constants.push(("WIDE", f64::from((special & SPECIAL_WIDE) >> 8)));
    }
    if matches!(
        kernel,
        Kernel::Cutoff | Kernel::ResidualArgmax | Kernel::BlockMass
    ) {
        constants.push(("PLAIN_F32", f64::from((special & SPECIAL_PLAIN_F32) >> 2)));
    }
    if kernel == Kernel::ResidualArgmax {
        constants.push(("LOG_KEYS", f64::from((special & SPECIAL_LOG_KEYS) >> 6)));
        constants.push(("EARLY", f64::from((special & SPECIAL_EARLY) >> 7)));
        let half = special & (SPECIAL_PLAIN_F16 | SPECIAL_PLAIN_BF16);
        constants.push(("PLAIN_F16", f64::from((special & SPECIAL_PLAIN_F16) >> 3)));
        constants.push(("PLAIN_BF16", f64::from((special & SPECIAL_PLAIN_BF16) >> 4)));
        constants.push(("DRAFT_F32", f64::from(u8::from(half != 0))));
    }
    if matches!(kernel, Kernel::RowStats | Kernel::RowStatsVerify) {
        constants.push(("RAW_SUMS", f64::from(special & SPECIAL_RAW)));
        constants.push(("ENTROPY", f64::from((special & SPECIAL_ENTROPY) >> 1)));
        constants.push(("PLAIN_F32", f64::from((special & SPECIAL_PLAIN_F32) >> 2)));
        constants.push(("PLAIN_F16", f64::from((special & SPECIAL_PLAIN_F16) >> 3)));
        constants.push(("PLAIN_BF16", f64::from((special & SPECIAL_PLAIN_BF16) >> 4)));
        constants.push(("MAX_ONLY", f64::from((special & SPECIAL_MAX_ONLY) >> 5)));
        constants.push((
            "HALF_WORDS",
            f64::from((special & SPECIAL_HALF_WORDS) >> 10),
        ));
    }
    constants
}

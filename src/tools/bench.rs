//! The benchmark of the verify step, shared by `benches/verify.rs` and the `specdec
//! bench` command: one code path. For each grid point it first checks the GPU result against the
//! CPU twin on that input, then times the GPU work with timestamp queries (median of `reps` after
//! warm-up) and whole calls (metadata upload, encode, submit, readback), and compares with the
//! memory-bandwidth ceilings measured by the same run and with vLLM's anchors on an H200.

use crate::{
    Draft, Error, GpuDraft, GpuRows, GpuVerifyBatch, Logits, Request, Rule, SamplingParams,
    Verifier, VerifierOptions, VerifyBatch, VerifyOutput,
};
use std::fmt::Write as _;
use std::time::Instant;

/// vLLM's measured kernels on one H200 (`shared/anchors/vllm-h200.csv`), embedded so the binary
/// is self-contained.
pub const ANCHORS_CSV: &str = include_str!("../../benches/anchors/vllm-h200.csv");

/// The shape of the benchmark's logit rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchRows {
    /// Every entry 2·N(0, 1): the vLLM anchors' inputs; every entry carries softmax mass.
    Normal,
    /// Rows shaped like a small LLM's (SmolLM2-135M's rows measured a median standard deviation
    /// of 3.8 and a maximum about 21 above the median): 3.8·N(0, 1), and one entry in 16,384
    /// (by index) raised by 14. Most entries then lie more than 22 / T below the row's maximum
    /// (zero mass in the cutoff's fixed point; races they cannot win).
    Peaked,
    /// 2·N(0, 1) rounded to multiples of 1/4, like logits of a coarse number format: thousands of
    /// entries share each value, the value at a top-p cut-off too (the cutoff pass's bins of
    /// equal entries).
    Coarse,
}

impl BenchRows {
    /// Fills `out` with rows of this shape from `seed`.
    fn fill(self, out: &mut [f32], seed: u64) {
        match self {
            BenchRows::Normal => fill_normal(out, seed, 2.0),
            BenchRows::Peaked => {
                fill_normal(out, seed, 3.8);
                for (i, x) in out.iter_mut().enumerate() {
                    // A multiplicative hash of the index: one entry in 16,384 (about 9 of a
                    // 151,936-entry row; a 32,000-entry row may have none).
                    if (i as u32).wrapping_mul(2_654_435_761) >> 18 == 0 {
                        *x += 14.0;
                    }
                }
            }
            BenchRows::Coarse => {
                fill_normal(out, seed, 2.0);
                for x in out.iter_mut() {
                    *x = (*x * 4.0).round() / 4.0;
                }
            }
        }
    }

    /// What the progress line says the rows are.
    fn describe(self) -> &'static str {
        match self {
            BenchRows::Normal => "2·N(0,1)",
            BenchRows::Peaked => "peaked: 3.8·N(0,1), 1 in 16,384 raised by 14",
            BenchRows::Coarse => "coarse: 2·N(0,1) rounded to multiples of 1/4",
        }
    }
}

/// What a grid point verifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchMode {
    /// Temperature 0, argmax verification.
    Greedy,
    /// Temperature 1, draft probabilities (Σk rows × V).
    DraftProbs,
    /// Temperature 1, draft logits (Σk rows × V).
    DraftLogits,
    /// Temperature 1, one-hot drafts (no draft rows).
    OneHot,
}

impl BenchMode {
    /// Every mode.
    pub const ALL: [BenchMode; 4] = [
        BenchMode::Greedy,
        BenchMode::DraftProbs,
        BenchMode::DraftLogits,
        BenchMode::OneHot,
    ];
    /// Name in tables and CSV.
    pub fn name(self) -> &'static str {
        match self {
            BenchMode::Greedy => "greedy",
            BenchMode::DraftProbs => "draft_probs",
            BenchMode::DraftLogits => "draft_logits",
            BenchMode::OneHot => "one_hot",
        }
    }
    /// The anchors' mode this one is compared with.
    pub fn anchor_mode(self) -> &'static str {
        match self {
            BenchMode::Greedy => "greedy",
            BenchMode::DraftProbs | BenchMode::DraftLogits => "random_with_draft_probs",
            BenchMode::OneHot => "random_ngram",
        }
    }
    /// Parses a name.
    pub fn parse(s: &str) -> Option<BenchMode> {
        BenchMode::ALL.into_iter().find(|m| m.name() == s)
    }
    fn has_draft_rows(self) -> bool {
        matches!(self, BenchMode::DraftProbs | BenchMode::DraftLogits)
    }
}

/// The grid and the repetitions.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Requests per batch (R).
    pub batches: Vec<u32>,
    /// Drafts per request (k).
    pub ks: Vec<u32>,
    /// Vocabulary sizes (V).
    pub vocabs: Vec<u32>,
    /// Modes.
    pub modes: Vec<BenchMode>,
    /// Timed repetitions per point (median reported).
    pub reps: usize,
    /// Untimed repetitions first.
    pub warmup: usize,
    /// Repetitions of the copy-to-host + CPU baseline (0: skip it).
    pub baseline_reps: usize,
    /// The baseline is slow (seconds per point at large shapes): it runs at this k only …
    pub baseline_k: u32,
    /// … and this vocabulary only (every R and mode).
    pub baseline_vocab: u32,
    /// `VerifierOptions::target_workgroups` of the verifier under test.
    pub target_workgroups: u32,
    /// `VerifierOptions::early_race_entries` of the verifier under test (`None`: its default).
    pub early_race_entries: Option<u64>,
    /// `VerifierOptions::wide_greedy_chunks` of the verifier under test (`None`: its default).
    pub wide_greedy_chunks: Option<u32>,
    /// `VerifierOptions::narrow_greedy_chunks` of the verifier under test (`None`: its default).
    pub narrow_greedy_chunks: Option<u32>,
    /// `VerifierOptions::fused_greedy` of the verifier under test.
    pub fused_greedy: bool,
    /// `VerifierOptions::fused_verify_chunks` of the verifier under test (`None`: its default).
    pub fused_verify_chunks: Option<u32>,
    /// `VerifierOptions::spin_wait` of the verifier under test (`None`: its default); the
    /// round-trip floor waits the same way.
    pub spin_wait: Option<std::time::Duration>,
    /// `VerifierOptions::shader_int64` of the verifier under test.
    pub shader_int64: bool,
    /// `VerifierOptions::subgroups` of the verifier under test.
    pub subgroups: bool,
    /// `VerifierOptions::immediates` of the verifier under test.
    pub immediates: bool,
    /// `VerifierOptions::f16_unpack` of the verifier under test.
    pub f16_unpack: bool,
    /// `VerifierOptions::pipelines` of the verifier under test. The timings are the same
    /// either way (every point's pipelines are built in its warm-up calls); the creation time
    /// printed differs.
    pub pipelines: crate::PipelineBuild,
    /// `VerifierOptions::workgroup_size` of the verifier under test (`None`: its default).
    pub workgroup_size: Option<u32>,
    /// `VerifierOptions::shader_checks` of the verifier under test (`None`: the tuned default).
    pub shader_checks: Option<wgpu::ShaderRuntimeChecks>,
    /// `top_p` of every non-greedy request (1.0: off); below 1 the cutoff pass runs.
    pub top_p: f32,
    /// `top_k` of every non-greedy request (0: off); above 0 the cutoff pass runs.
    pub top_k: u32,
    /// `min_p` of every non-greedy request (0: off); above 0 the cutoff pass runs.
    pub min_p: f32,
    /// Element type of the target logits (values rounded to it first, so the twin sees the same
    /// numbers); draft rows stay f32.
    pub target_dtype: crate::Dtype,
    /// Every non-greedy request uses [`Rule::Block`] (with draft probabilities or logits this
    /// runs the block_mass pass and verify's block_settle entry).
    pub block: bool,
    /// The shape of the target and draft rows.
    pub rows: BenchRows,
    /// Seconds the run may spend warming the GPU before timing: it measures the read ceiling
    /// for at least 10 s (or this long, if shorter) and until three measurements in a row agree
    /// within 3 % (a freshly started GPU can read at about half speed for several seconds).
    /// 0: one measurement, no wait.
    pub warm_s: f64,
    /// Milliseconds of read-kernel work right before each point is timed, after its CPU-twin
    /// check (0: none). The twin check of a large point keeps the GPU idle for seconds, and a
    /// GPU that idles lowers its clocks; this brings it back to the state the warm-up left.
    pub rewarm_ms: u64,
}

impl BenchConfig {
    /// The options of the verifier under test (the device's optional features follow them).
    fn options(&self) -> VerifierOptions {
        VerifierOptions {
            target_workgroups: self.target_workgroups,
            early_race_entries: self.early_race_entries,
            wide_greedy_chunks: self.wide_greedy_chunks,
            narrow_greedy_chunks: self.narrow_greedy_chunks,
            fused_greedy: self.fused_greedy,
            fused_verify_chunks: self.fused_verify_chunks,
            spin_wait: self.spin_wait,
            shader_checks: self.shader_checks,
            workgroup_size: self.workgroup_size,
            shader_int64: self.shader_int64,
            subgroups: self.subgroups,
            immediates: self.immediates,
            f16_unpack: self.f16_unpack,
            pipelines: self.pipelines,
            ..VerifierOptions::default()
        }
    }

    /// The full grid (the vLLM anchors' grid).
    pub fn full() -> Self {
        BenchConfig {
            batches: vec![1, 8, 32, 128],
            ks: vec![1, 4, 8],
            vocabs: vec![32000, 128256, 151936, 262144],
            modes: BenchMode::ALL.to_vec(),
            reps: 50,
            warmup: 5,
            baseline_reps: 3,
            baseline_k: 4,
            baseline_vocab: 151_936,
            target_workgroups: VerifierOptions::default().target_workgroups,
            early_race_entries: VerifierOptions::default().early_race_entries,
            wide_greedy_chunks: VerifierOptions::default().wide_greedy_chunks,
            narrow_greedy_chunks: VerifierOptions::default().narrow_greedy_chunks,
            fused_greedy: VerifierOptions::default().fused_greedy,
            fused_verify_chunks: VerifierOptions::default().fused_verify_chunks,
            spin_wait: VerifierOptions::default().spin_wait,
            shader_int64: true,
            subgroups: true,
            immediates: VerifierOptions::default().immediates,
            f16_unpack: VerifierOptions::default().f16_unpack,
            pipelines: VerifierOptions::default().pipelines,
            shader_checks: None,
            workgroup_size: None,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            target_dtype: crate::Dtype::F32,
            block: false,
            rows: BenchRows::Normal,
            warm_s: 60.0,
            rewarm_ms: 300,
        }
    }
    /// A small grid for software adapters and the CPU backend (minutes, not hours, on 2 cores):
    /// the full grid's options, fewer points and repetitions, no baseline and no warm-up spin.
    pub fn quick() -> Self {
        BenchConfig {
            batches: vec![1, 8, 32],
            ks: vec![1, 4],
            vocabs: vec![32000],
            reps: 5,
            warmup: 1,
            baseline_reps: 0,
            baseline_vocab: 32_000,
            warm_s: 0.0,
            rewarm_ms: 0,
            ..Self::full()
        }
    }
}

/// One measured grid point.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// Mode.
    pub mode: BenchMode,
    /// R.
    pub batch: u32,
    /// k.
    pub k: u32,
    /// V.
    pub vocab: u32,
    /// Median GPU time of one verify call from timestamp queries, µs (CPU backend: wall time).
    pub gpu_us: f64,
    /// Median whole call (metadata upload, encode, submit, wait, readback), µs.
    pub call_us: f64,
    /// Bytes of logits the call must read once.
    pub bytes: u64,
    /// bytes / gpu_us.
    pub gbps: f64,
    /// Median of copying the logits to host memory and verifying there with the CPU twin, µs.
    pub baseline_us: Option<f64>,
    /// Requests whose tokens differed from the CPU twin (0 expected; only near-threshold random
    /// decisions may differ).
    pub mismatches: usize,
    /// The anchor's (vLLM MRV2) `graph_us` and `median_us` at this point, if it has one.
    pub anchor: Option<(f64, f64)>,
    /// Median GPU time of each kernel in a pass of its own (row_stats, verify,
    /// residual_argmax.block, residual_argmax.merge), µs, when timestamps are available.
    pub kernels_us: Option<[f64; 4]>,
    /// Median host time to record and submit one call (the rest of `call_us` is waiting), µs.
    pub host_us: f64,
    /// CPU time of the calling thread per whole call, the mean over the timed calls, µs: what a
    /// call costs the host's cores, waiting included (reads that poll spend it; reads that sleep
    /// do not). `None` on the CPU backend (its work runs on other threads) and where the system
    /// does not report it (Linux's `/proc/thread-self/schedstat`).
    pub cpu_us: Option<f64>,
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// Adapter name (or "CPU backend").
    pub adapter: String,
    /// Backend (Vulkan, Metal, …, or cpu).
    pub backend: String,
    /// UTC date of the run, YYYY-MM-DD.
    pub date: String,
    /// Device-to-device copy bandwidth, GB/s, counting bytes read + written.
    pub copy_gbps: f64,
    /// Read bandwidth of a plain 16-byte-load reduction kernel, GB/s (the realistic ceiling),
    /// once the warm-up found it stable; every point's fraction of it is against this value.
    pub read_gbps: f64,
    /// The read ceiling measured again after the last point (drift during the run).
    pub read_gbps_end: f64,
    /// Every read-ceiling measurement of the warm-up, in order.
    pub warm_reads: Vec<f64>,
    /// Whether GPU times come from timestamp queries.
    pub timestamps: bool,
    /// The kernels' variant: 64-bit multiplies, subgroup folds, Params as immediates (all off
    /// on the CPU backend).
    pub variant: crate::shaders::Variant,
    /// The smallest whole round trip through wgpu on this device, median µs: write 64 bytes,
    /// one dispatch of one workgroup, copy 256 bytes to a mappable buffer, map and read them.
    /// What a whole call cannot go below; `None` on the CPU backend. It waits for the map as the
    /// verifier's blocking reads do: polling for up to `floor_spin_us`, then sleeping.
    pub floor_us: Option<f64>,
    /// The verifier's `spin_wait` in µs, which the floor's wait used too.
    pub floor_spin_us: f64,
    /// The dispatch-chain floor: GPU time of one timed compute pass of 1 to 4 dependent
    /// dispatches that do almost nothing, at a few workgroup counts. What a pass of that many
    /// dependent kernels cannot go below on this device, whatever the kernels do; empty without
    /// timestamp queries and on the CPU backend.
    pub chain_floor: Vec<ChainFloor>,
    /// The points.
    pub rows: Vec<BenchRow>,
}

/// One measurement of [`BenchReport::chain_floor`].
#[derive(Clone, Copy, Debug)]
pub struct ChainFloor {
    /// Workgroups per dispatch.
    pub workgroups: u32,
    /// Dependent dispatches in the pass.
    pub dispatches: u32,
    /// Median GPU time of the pass, µs (timestamps at its beginning and end).
    pub gpu_us: f64,
}

/// Workgroup counts of the dispatch-chain floor: one workgroup (verify and the residual merge
/// at R = 1) and 256 (about what row_stats and the residual race dispatch at R = 1).
const CHAIN_WORKGROUPS: [u32; 2] = [1, 256];

/// The most dependent dispatches the floor measures: a sampled batch's pass has four.
const CHAIN_MAX_DISPATCHES: u32 = 4;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// UTC date from the system clock (civil-from-days, proleptic Gregorian).
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The anchor (vLLM MRV2) for a point: (graph_us, median_us).
pub fn anchor(mode: BenchMode, batch: u32, k: u32, vocab: u32) -> Option<(f64, f64)> {
    ANCHORS_CSV.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split(',').collect();
        (f.len() >= 7
            && f[0] == "vllm_mrv2"
            && f[1] == mode.anchor_mode()
            && f[2].parse() == Ok(batch)
            && f[3].parse() == Ok(k)
            && f[4].parse() == Ok(vocab))
        .then(|| Some((f[6].parse().ok()?, f[5].parse().ok()?)))
        .flatten()
    })
}

/// Fills `out` with `scale`·N(0, 1) in parallel (Box–Muller over Philox words, deterministic).
fn fill_normal(out: &mut [f32], seed: u64, scale: f32) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = out.len().div_ceil(threads).max(1).next_multiple_of(2);
    std::thread::scope(|s| {
        for (c, chunk) in out.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (i, pair) in chunk.chunks_mut(2).enumerate() {
                    let w = crate::rng::philox4x32_10(
                        [i as u32, c as u32, 7, 0],
                        [seed as u32, (seed >> 32) as u32],
                    );
                    let u1 = crate::rng::uniform_open(w[0]) as f64;
                    let u2 = crate::rng::uniform_open(w[1]) as f64;
                    let r = (-2.0 * u1.ln()).sqrt();
                    let t = std::f64::consts::TAU * u2;
                    pair[0] = scale * (r * t.cos()) as f32;
                    if pair.len() > 1 {
                        pair[1] = scale * (r * t.sin()) as f32;
                    }
                }
            });
        }
    });
}

/// Row-wise softmax of `logits` (rows of `v`) into `out`, in parallel.
fn softmax_rows(logits: &[f32], v: usize, out: &mut Vec<f32>) {
    out.resize(logits.len(), 0.0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows = logits.len() / v;
    let per_rows = rows.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (src, dst) in logits
            .chunks(per_rows * v)
            .zip(out.chunks_mut(per_rows * v))
        {
            s.spawn(move || {
                for (a, b) in src.chunks(v).zip(dst.chunks_mut(v)) {
                    let m = a.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0f64;
                    for (x, y) in a.iter().zip(b.iter_mut()) {
                        *y = (x - m).exp();
                        sum += *y as f64;
                    }
                    let inv = (1.0 / sum) as f32;
                    b.iter_mut().for_each(|y| *y *= inv);
                }
            });
        }
    });
}

/// Drafts like the anchors': the row's argmax with probability 0.7, otherwise a uniform token.
fn drafts_for(target: &[f32], v: usize, r: usize, k: usize, seed: u64) -> Vec<i32> {
    let mut d = Vec::with_capacity(r * k);
    for req in 0..r {
        for i in 0..k {
            let row = &target[(req * (k + 1) + i) * v..][..v];
            let w = crate::rng::philox4x32_10([req as u32, i as u32, 9, 0], [seed as u32, 0]);
            let token = if crate::rng::uniform_open(w[0]) < 0.7 {
                (0..v).fold(0, |b, j| if row[j] > row[b] { j } else { b })
            } else {
                w[1] as usize % v
            };
            d.push(token as i32);
        }
    }
    d
}

fn requests_for(mode: BenchMode, r: usize, k: u32, cfg: &BenchConfig) -> Vec<Request> {
    let t = if mode == BenchMode::Greedy { 0.0 } else { 1.0 };
    let rule = if cfg.block { Rule::Block } else { Rule::Exact };
    (0..r)
        .map(|i| Request {
            num_drafts: k,
            params: SamplingParams {
                rule,
                ..SamplingParams::seeded(t, 1000 + i as u64)
                    .with_top_p(cfg.top_p)
                    .with_top_k(cfg.top_k)
                    .with_min_p(cfg.min_p)
            },
            position: 64 * i as u64,
        })
        .collect()
}

fn mismatches(a: &VerifyOutput, b: &VerifyOutput) -> usize {
    (0..a.len())
        .filter(|&r| a.emitted(r) != b.emitted(r))
        .count()
}

/// The GPU side of a benchmark run: the device, the verifier under test and its CPU twin, the
/// logits (on the host and uploaded) and the timestamp buffers.
struct GpuBench {
    device: wgpu::Device,
    queue: wgpu::Queue,
    verifier: Verifier,
    cpu: Verifier,
    period_ns: f64,
    /// Target logits, `max R · (max k + 1) · max V` values (rounded to `--bf16` / `--f16`).
    host_t: Vec<f32>,
    /// Draft logits, `max R · max k · max V` values.
    host_d: Vec<f32>,
    /// Bytes per target logit on the GPU (2 for bf16 and f16, else 4).
    t_size: usize,
    t_buf: wgpu::Buffer,
    d_buf: wgpu::Buffer,
    p_buf: wgpu::Buffer,
    /// Timestamp queries, when the adapter has them.
    query: Option<wgpu::QuerySet>,
    resolve: wgpu::Buffer,
    q_read: wgpu::Buffer,
}

/// The device of a benchmark run on the adapter `Verifier::new` picks, with timestamp queries
/// (when the adapter has them), SHADER_INT64 and SUBGROUP (when the grid asks and the adapter has
/// them).
fn bench_device(
    cfg: &BenchConfig,
) -> Result<(wgpu::AdapterInfo, wgpu::Device, wgpu::Queue, bool), Error> {
    let adapter = crate::gpu::select_adapter()?;
    let info = adapter.get_info();
    let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
    let optional = crate::gpu::optional_features(&adapter, &cfg.options());
    let limits = crate::gpu::required_limits(&adapter.limits())?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("specdec.bench"),
        required_features: optional
            | if timestamps {
                wgpu::Features::TIMESTAMP_QUERY
            } else {
                wgpu::Features::empty()
            },
        required_limits: limits,
        ..Default::default()
    }))
    .map_err(|e| Error::RequestDevice {
        detail: e.to_string(),
    })?;
    Ok((info, device, queue, timestamps))
}

/// The binary16 bits of `x`, mantissa truncated; magnitudes below the smallest normal
/// (2^-14) become a signed zero, above the largest finite the largest finite (the benchmark's
/// 2·N(0,1) logits never reach either end).
fn f16_truncated(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127;
    match e {
        ..-14 => sign,
        16.. => sign | 0x7bff,
        _ => sign | (((e + 15) as u16) << 10) | ((b >> 13) & 0x3ff) as u16,
    }
}

impl GpuBench {
    /// Generates the largest point's logits, uploads them and creates the timestamp buffers.
    fn new(
        cfg: &BenchConfig,
        device: wgpu::Device,
        queue: wgpu::Queue,
        timestamps: bool,
        progress: &mut impl FnMut(&str),
    ) -> Result<GpuBench, Error> {
        // The options under test (the device `bench_device` created has their features).
        let made = Instant::now();
        let verifier = Verifier::with_device(device.clone(), queue.clone(), cfg.options())?;
        let (built, described) = verifier.pipeline_counts();
        progress(&format!(
            "verifier made in {:.1} ms ({built} of {described} pipelines built with it{})",
            made.elapsed().as_secs_f64() * 1e3,
            if built < described {
                ", the rest at their first call"
            } else {
                ""
            }
        ));
        let cpu = Verifier::cpu(VerifierOptions::default());
        let period_ns = f64::from(queue.get_timestamp_period());

        let max_r = *cfg.batches.iter().max().unwrap_or(&1) as usize;
        let max_k = *cfg.ks.iter().max().unwrap_or(&1) as usize;
        let max_v = *cfg.vocabs.iter().max().unwrap_or(&1) as usize;
        let t_len = max_r * (max_k + 1) * max_v;
        let d_len = max_r * max_k * max_v;
        progress(&format!(
            "generating {:.2} GB of logits ({})",
            ((t_len + d_len) * 4) as f64 / 1e9,
            cfg.rows.describe()
        ));
        let mut host_t = vec![0f32; t_len];
        cfg.rows.fill(&mut host_t, 1);
        // The target rows as the GPU reads them (16-bit types: bits), and their exact widening.
        let half_bits: Vec<u16> = match cfg.target_dtype {
            crate::Dtype::F32 => Vec::new(),
            crate::Dtype::Bf16 => host_t.iter().map(|x| (x.to_bits() >> 16) as u16).collect(),
            crate::Dtype::F16 => host_t.iter().map(|&x| f16_truncated(x)).collect(),
        };
        for (x, &h) in host_t.iter_mut().zip(&half_bits) {
            *x = match cfg.target_dtype {
                crate::Dtype::F16 => crate::f16_to_f32(h),
                _ => crate::bf16_to_f32(h),
            };
        }
        let t_size = cfg.target_dtype.size() as usize;
        let mut host_d = vec![0f32; d_len];
        cfg.rows.fill(&mut host_d, 2);
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let make = |label, bytes: usize| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (bytes as u64).max(16).next_multiple_of(16),
                usage: storage,
                mapped_at_creation: false,
            })
        };
        let t_buf = make("bench.target", t_len * t_size);
        let d_buf = make("bench.draft_logits", d_len * 4);
        let p_buf = make("bench.draft_probs", d_len * 4);
        if !half_bits.is_empty() {
            let mut bytes: Vec<u8> = bytemuck::cast_slice(&half_bits).to_vec();
            bytes.resize(bytes.len().next_multiple_of(4), 0);
            queue.write_buffer(&t_buf, 0, &bytes);
        } else {
            queue.write_buffer(&t_buf, 0, bytemuck::cast_slice(&host_t));
        }
        queue.write_buffer(&d_buf, 0, bytemuck::cast_slice(&host_d));
        queue.submit([]);
        let (query, resolve, q_read) = timestamp_buffers(&device, cfg.reps, timestamps);
        Ok(GpuBench {
            device,
            queue,
            verifier,
            cpu,
            period_ns,
            host_t,
            host_d,
            t_size,
            t_buf,
            d_buf,
            p_buf,
            query,
            resolve,
            q_read,
        })
    }

    /// Measures one grid point: correctness against the CPU twin first, then whole calls, then
    /// GPU time from timestamps around the verify pass and around each kernel.
    fn point(
        &self,
        cfg: &BenchConfig,
        mode: BenchMode,
        (r, k, v): (u32, u32, u32),
        drafts: &[i32],
        probs: &mut Vec<f32>,
    ) -> Result<BenchRow, Error> {
        let (vu, ru, ku) = (v as usize, r as usize, k as usize);
        let n_t = ru * (ku + 1) * vu;
        let n_d = ru * ku * vu;
        let requests = requests_for(mode, ru, k, cfg);
        let draft_host: Option<&[f32]> = match mode {
            BenchMode::DraftProbs => {
                softmax_rows(&self.host_d[..n_d], vu, probs);
                self.queue
                    .write_buffer(&self.p_buf, 0, bytemuck::cast_slice(probs));
                Some(probs)
            }
            BenchMode::DraftLogits => Some(&self.host_d[..n_d]),
            _ => None,
        };
        let gpu_batch = GpuVerifyBatch {
            vocab_size: v,
            requests: &requests,
            draft_token_ids: drafts,
            target_logits: GpuRows::f32(&self.t_buf, 0).with_dtype(cfg.target_dtype),
            draft: match mode {
                BenchMode::DraftProbs => GpuDraft::Probs(GpuRows::f32(&self.p_buf, 0)),
                BenchMode::DraftLogits => GpuDraft::Logits(GpuRows::f32(&self.d_buf, 0)),
                _ => GpuDraft::OneHot,
            },
            draft_vocab_size: None,
            synthetic_rates: None,
        };
        let host_batch = VerifyBatch {
            vocab_size: v,
            requests: &requests,
            draft_token_ids: drafts,
            target_logits: Logits::F32(&self.host_t[..n_t]),
            draft: match (mode, draft_host) {
                (BenchMode::DraftProbs, Some(d)) => Draft::Probs(Logits::F32(d)),
                (BenchMode::DraftLogits, Some(d)) => Draft::Logits(Logits::F32(d)),
                _ => Draft::OneHot,
            },
            draft_vocab_size: None,
            synthetic_rates: None,
        };
        // 1. Correctness first: the GPU against the CPU twin on this input.
        let got = self.one_call(&gpu_batch)?;
        let want = self.cpu.verify_blocking(&host_batch)?;
        let bad = mismatches(&got, &want);
        // 2. Whole calls, on a GPU brought back up to speed after the twin's seconds.
        self.rewarm(cfg.rewarm_ms)?;
        let WholeCalls {
            mut calls,
            mut host,
            cpu_us,
        } = self.whole_calls(cfg, &gpu_batch)?;
        // 3. GPU time from timestamps around the verify pass, then each kernel in a timed pass
        // of its own (where the time goes).
        let whole = self.timed(cfg, &gpu_batch, 1, &|qs, i| {
            crate::Timestamps::Pass(wgpu::ComputePassTimestampWrites {
                query_set: qs,
                beginning_of_pass_write_index: Some(2 * i),
                end_of_pass_write_index: Some(2 * i + 1),
            })
        })?;
        let gpu_us = whole.map_or_else(|| median(&mut calls.clone()), |m| m[0]);
        let call_us = median(&mut calls);
        let kernels_us = self
            .timed(cfg, &gpu_batch, 4, &|qs, i| crate::Timestamps::PerKernel {
                query_set: qs,
                first: QUERIES_PER_CALL * i,
            })?
            .map(|m| [m[0], m[1], m[2], m[3]]);
        let host_us = median(&mut host);
        let bytes = (n_t * self.t_size + if mode.has_draft_rows() { n_d * 4 } else { 0 }) as u64;
        Ok(BenchRow {
            mode,
            batch: r,
            k,
            vocab: v,
            gpu_us,
            call_us,
            bytes,
            gbps: bytes as f64 / gpu_us / 1e3,
            baseline_us: None,
            mismatches: bad,
            anchor: anchor(mode, r, k, v),
            kernels_us,
            host_us,
            cpu_us,
        })
    }

    /// Keeps the GPU busy with the read kernel over the target buffer for `ms` milliseconds,
    /// one submission of 64 dispatches at a time.
    fn rewarm(&self, ms: u64) -> Result<(), Error> {
        if ms == 0 {
            return Ok(());
        }
        let g = self.verifier.gpu_backend().expect("GPU verifier");
        let sink = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench.rewarm_sink"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let start = Instant::now();
        while start.elapsed().as_millis() < u128::from(ms) {
            let mut enc = self.device.create_command_encoder(&Default::default());
            for _ in 0..64 {
                g.record_read_bandwidth(&mut enc, &self.t_buf, &sink, 1056, None);
            }
            wait_for(&self.device, self.queue.submit([enc.finish()]), 60)?;
        }
        Ok(())
    }

    /// The verifier's `spin_wait`, resolved for this adapter.
    fn spin_wait(&self) -> std::time::Duration {
        self.verifier
            .gpu_backend()
            .map_or(std::time::Duration::ZERO, |g| g.spin_wait())
    }

    /// [`BenchReport::floor_us`]: the median of `reps` smallest round trips, after 20 untimed.
    fn round_trip_floor(&self, reps: usize) -> Result<f64, Error> {
        let g = self.verifier.gpu_backend().expect("GPU verifier");
        let buffer = |label, size, usage| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let data = buffer(
            "bench.floor_data",
            256,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        );
        let sink = buffer("bench.floor_sink", 16, wgpu::BufferUsages::STORAGE);
        let read = buffer(
            "bench.floor_read",
            256,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let mut times = Vec::with_capacity(reps);
        for i in 0..reps + 20 {
            let t0 = Instant::now();
            self.queue.write_buffer(&data, 0, &[i as u8; 64]);
            let mut enc = self.device.create_command_encoder(&Default::default());
            g.record_read_bandwidth(&mut enc, &data, &sink, 1, None);
            enc.copy_buffer_to_buffer(&data, 0, &read, 0, 256);
            let idx = self.queue.submit([enc.finish()]);
            map_u64(&self.device, &read, idx, g.spin_wait())?;
            if i >= 20 {
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(median(&mut times))
    }

    /// [`BenchReport::chain_floor`]: for each of [`CHAIN_WORKGROUPS`] and 1 ..=
    /// [`CHAIN_MAX_DISPATCHES`] dependent dispatches, the median GPU time of `reps` timed passes
    /// of the read kernel over 4 KiB, each submitted and waited for alone as the verifier's
    /// timed calls are. Empty without timestamp queries.
    fn dispatch_chain_floor(&self, reps: usize) -> Result<Vec<ChainFloor>, Error> {
        let Some(qs) = &self.query else {
            return Ok(Vec::new());
        };
        let g = self.verifier.gpu_backend().expect("GPU verifier");
        let data = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench.chain_data"),
            size: 4096,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let sink = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench.chain_sink"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let mut out = Vec::new();
        for &workgroups in &CHAIN_WORKGROUPS {
            for dispatches in 1..=CHAIN_MAX_DISPATCHES {
                // Untimed passes first, so the pipeline and the clocks are settled.
                for _ in 0..20 {
                    let mut enc = self.device.create_command_encoder(&Default::default());
                    g.record_read_chain(&mut enc, &data, &sink, workgroups, dispatches, None);
                    wait_for(&self.device, self.queue.submit([enc.finish()]), 60)?;
                }
                for i in 0..reps as u32 {
                    let mut enc = self.device.create_command_encoder(&Default::default());
                    let ts = wgpu::ComputePassTimestampWrites {
                        query_set: qs,
                        beginning_of_pass_write_index: Some(2 * i),
                        end_of_pass_write_index: Some(2 * i + 1),
                    };
                    g.record_read_chain(&mut enc, &data, &sink, workgroups, dispatches, Some(ts));
                    wait_for(&self.device, self.queue.submit([enc.finish()]), 60)?;
                }
                let ticks = resolve_ticks(
                    &self.device,
                    &self.queue,
                    qs,
                    2 * reps as u32,
                    &self.resolve,
                    &self.q_read,
                )?;
                out.push(ChainFloor {
                    workgroups,
                    dispatches,
                    gpu_us: phase_medians(&ticks, 1, self.period_ns)[0],
                });
            }
        }
        Ok(out)
    }

    /// One whole verify call: record, submit, read back.
    fn one_call(&self, batch: &GpuVerifyBatch<'_>) -> Result<VerifyOutput, Error> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        let pending = self.verifier.record(&mut enc, batch)?;
        self.queue.submit([enc.finish()]);
        self.verifier.read_blocking(pending)
    }

    /// `cfg.warmup` untimed calls, then `cfg.reps` timed ones: the whole call and its record +
    /// submit of each (µs), and the calling thread's CPU time per call over them.
    fn whole_calls(
        &self,
        cfg: &BenchConfig,
        batch: &GpuVerifyBatch<'_>,
    ) -> Result<WholeCalls, Error> {
        for _ in 0..cfg.warmup {
            self.one_call(batch)?;
        }
        let mut calls = Vec::with_capacity(cfg.reps);
        let mut host = Vec::with_capacity(cfg.reps);
        let cpu0 = thread_cpu_ns();
        for _ in 0..cfg.reps {
            let t0 = Instant::now();
            let mut enc = self.device.create_command_encoder(&Default::default());
            let pending = self.verifier.record(&mut enc, batch)?;
            self.queue.submit([enc.finish()]);
            host.push(t0.elapsed().as_secs_f64() * 1e6);
            self.verifier.read_blocking(pending)?;
            calls.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        let cpu_us = cpu0
            .zip(thread_cpu_ns())
            .map(|(a, b)| b.saturating_sub(a) as f64 / 1e3 / cfg.reps.max(1) as f64);
        Ok(WholeCalls {
            calls,
            host,
            cpu_us,
        })
    }

    /// The median µs of each of `phases` timed phases over `cfg.reps` calls, or `None` without
    /// timestamp queries.
    fn timed(
        &self,
        cfg: &BenchConfig,
        batch: &GpuVerifyBatch<'_>,
        phases: u32,
        stamps: &dyn Fn(&wgpu::QuerySet, u32) -> crate::Timestamps<'_>,
    ) -> Result<Option<Vec<f64>>, Error> {
        let Some(qs) = &self.query else {
            return Ok(None);
        };
        timed_medians(
            &self.device,
            &self.queue,
            &self.verifier,
            batch,
            cfg.reps,
            phases,
            qs,
            &self.resolve,
            &self.q_read,
            self.period_ns,
            stamps,
        )
        .map(Some)
    }

    /// Step 4, the baseline users have today: copy the logits to the host and verify there, for
    /// the rows at `baseline_k` and `baseline_vocab`. It runs after every timed point: its
    /// gigabytes of mapped host memory slowed the GPU timings that followed it on the H200
    /// (seen 2026-11-21), so it must not precede them.
    fn baselines(
        &self,
        cfg: &BenchConfig,
        rows: &mut [BenchRow],
        probs: &mut Vec<f32>,
        progress: &mut impl FnMut(&str),
    ) -> Result<(), Error> {
        let (ru, ku, vu) = (
            *cfg.batches.iter().max().unwrap_or(&1) as usize,
            cfg.baseline_k as usize,
            cfg.baseline_vocab as usize,
        );
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench.baseline_staging"),
            size: ((ru * (2 * ku + 1) * vu * 4) as u64).next_multiple_of(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for row in rows
            .iter_mut()
            .filter(|r| r.k == cfg.baseline_k && r.vocab == cfg.baseline_vocab)
        {
            let (v, r, k, mode) = (row.vocab, row.batch, row.k, row.mode);
            let (vu, ru, ku) = (v as usize, r as usize, k as usize);
            let (n_t, n_d) = (ru * (ku + 1) * vu, ru * ku * vu);
            let drafts = drafts_for(
                &self.host_t[..n_t],
                vu,
                ru,
                ku,
                u64::from(v) ^ u64::from(r << 8) ^ u64::from(k),
            );
            let requests = requests_for(mode, ru, k, cfg);
            if mode == BenchMode::DraftProbs {
                softmax_rows(&self.host_d[..n_d], vu, probs);
                self.queue
                    .write_buffer(&self.p_buf, 0, bytemuck::cast_slice(probs));
            }
            let host_batch = VerifyBatch {
                vocab_size: v,
                requests: &requests,
                draft_token_ids: &drafts,
                target_logits: Logits::F32(&self.host_t[..n_t]),
                draft: Draft::OneHot,
                draft_vocab_size: None,
                synthetic_rates: None,
            };
            let src = match mode {
                BenchMode::DraftProbs => Some(&self.p_buf),
                BenchMode::DraftLogits => Some(&self.d_buf),
                _ => None,
            };
            row.baseline_us = Some(baseline(
                &self.device,
                &self.queue,
                &self.cpu,
                &host_batch,
                &self.t_buf,
                n_t,
                mode,
                src,
                n_d,
                &staging,
                cfg.baseline_reps,
            )?);
            progress(&format!(
                "baseline {} R={r} k={k} V={v}: copy logits to host + CPU verify {:.0} us",
                mode.name(),
                row.baseline_us.unwrap_or(f64::NAN)
            ));
        }
        Ok(())
    }
}

/// Timestamp queries each timed call may take: a begin and an end for each of the four per-kernel
/// passes (`Timestamps::PerKernel`).
const QUERIES_PER_CALL: u32 = 8;

/// The query set (`QUERIES_PER_CALL` timestamps per call, `reps` calls) and its resolve and
/// readback buffers.
fn timestamp_buffers(
    device: &wgpu::Device,
    reps: usize,
    timestamps: bool,
) -> (Option<wgpu::QuerySet>, wgpu::Buffer, wgpu::Buffer) {
    let query = timestamps.then(|| {
        device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("bench.timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: QUERIES_PER_CALL * reps.max(1) as u32,
        })
    });
    // 8 bytes per timestamp.
    let q_bytes = 8 * u64::from(QUERIES_PER_CALL) * reps.max(1) as u64;
    let resolve = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench.resolve"),
        size: q_bytes,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let q_read = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench.resolve_read"),
        size: q_bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    (query, resolve, q_read)
}

/// Runs the grid on the GPU chosen like `Verifier::new` (timestamps when the adapter has them).
/// `progress` receives one line per finished point.
pub fn run_gpu(cfg: &BenchConfig, mut progress: impl FnMut(&str)) -> Result<BenchReport, Error> {
    let (info, device, queue, timestamps) = bench_device(cfg)?;
    let b = GpuBench::new(cfg, device, queue, timestamps, &mut progress)?;
    // Ceilings: device-to-device copy (read + write bytes) and a plain read kernel.
    let (copy_gbps, read_gbps, warm_reads) = warm_ceilings(cfg, &b, timestamps, &mut progress)?;
    progress(&format!(
        "{}: copy {copy_gbps:.0} GB/s (read+write), read kernel {read_gbps:.0} GB/s",
        info.name
    ));
    let floor_us = b.round_trip_floor(200)?;
    let floor_spin_us = b.spin_wait().as_secs_f64() * 1e6;
    progress(&format!(
        "round-trip floor {floor_us:.1} µs (reads poll up to {floor_spin_us:.0} µs)"
    ));
    let chain_floor = b.dispatch_chain_floor(cfg.reps)?;
    if !chain_floor.is_empty() {
        progress(&format!(
            "dispatch-chain floor: {}",
            chain_summary(&chain_floor)
        ));
    }
    let mut rows = Vec::new();
    let mut probs = Vec::new();
    for &v in &cfg.vocabs {
        for &k in &cfg.ks {
            for &r in &cfg.batches {
                let (vu, ru, ku) = (v as usize, r as usize, k as usize);
                let target = &b.host_t[..ru * (ku + 1) * vu];
                let seed = u64::from(v) ^ u64::from(r << 8) ^ u64::from(k);
                let drafts = drafts_for(target, vu, ru, ku, seed);
                for &mode in &cfg.modes {
                    let row = b.point(cfg, mode, (r, k, v), &drafts, &mut probs)?;
                    progress(&row_line(&row, read_gbps));
                    rows.push(row);
                }
            }
        }
    }
    if cfg.baseline_reps > 0 {
        b.baselines(cfg, &mut rows, &mut probs, &mut progress)?;
    }
    let (_, read_gbps_end) = ceilings(&b.verifier, &b.t_buf, timestamps, b.period_ns)?;
    progress(&format!(
        "read kernel after the last point: {read_gbps_end:.0} GB/s ({:+.1} % against the start)",
        100.0 * (read_gbps_end / read_gbps - 1.0)
    ));
    Ok(BenchReport {
        adapter: info.name.clone(),
        variant: b
            .verifier
            .gpu_backend()
            .map_or_else(Default::default, |g| g.kernels.variant),
        backend: format!("{:?}", info.backend),
        date: today(),
        copy_gbps,
        read_gbps,
        read_gbps_end,
        warm_reads,
        timestamps,
        floor_us: Some(floor_us),
        floor_spin_us,
        chain_floor,
        rows,
    })
}

/// Runs `reps` timed calls of `batch`, call `i` writing `2 · phases` timestamps from index
/// `2 · phases · i` as `stamps(qs, i)` lays them out, and returns the median duration of each
/// phase in µs.
#[allow(clippy::too_many_arguments)]
fn timed_medians(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    verifier: &Verifier,
    batch: &GpuVerifyBatch<'_>,
    reps: usize,
    phases: u32,
    qs: &wgpu::QuerySet,
    resolve: &wgpu::Buffer,
    read: &wgpu::Buffer,
    period_ns: f64,
    stamps: &dyn Fn(&wgpu::QuerySet, u32) -> crate::Timestamps<'_>,
) -> Result<Vec<f64>, Error> {
    for i in 0..reps as u32 {
        let mut enc = device.create_command_encoder(&Default::default());
        let pending = verifier.record_timed(&mut enc, batch, stamps(qs, i))?;
        queue.submit([enc.finish()]);
        verifier.read_blocking(pending)?;
    }
    let ticks = resolve_ticks(device, queue, qs, 2 * phases * reps as u32, resolve, read)?;
    Ok(phase_medians(&ticks, phases as usize, period_ns))
}

/// `ticks` as repetitions of `phases` (begin, end) timestamp pairs: each phase's median duration
/// in µs.
fn phase_medians(ticks: &[u64], phases: usize, period_ns: f64) -> Vec<f64> {
    let mut per: Vec<Vec<f64>> = vec![Vec::with_capacity(ticks.len() / (2 * phases)); phases];
    for rep in ticks.chunks(2 * phases) {
        for (k, p) in per.iter_mut().enumerate() {
            p.push(rep[2 * k + 1].wrapping_sub(rep[2 * k]) as f64 * period_ns / 1e3);
        }
    }
    per.into_iter().map(|mut v| median(&mut v)).collect()
}

/// Resolves the first `count` timestamps of `qs` and reads them back.
fn resolve_ticks(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    qs: &wgpu::QuerySet,
    count: u32,
    resolve: &wgpu::Buffer,
    read: &wgpu::Buffer,
) -> Result<Vec<u64>, Error> {
    let mut enc = device.create_command_encoder(&Default::default());
    enc.resolve_query_set(qs, 0..count, resolve, 0);
    enc.copy_buffer_to_buffer(resolve, 0, read, 0, 8 * u64::from(count));
    let idx = queue.submit([enc.finish()]);
    let mut t = map_u64(device, read, idx, std::time::Duration::ZERO)?;
    t.truncate(count as usize);
    Ok(t)
}

/// Waits up to `secs` seconds for submission `idx` to finish on `device`.
fn wait_for(device: &wgpu::Device, idx: wgpu::SubmissionIndex, secs: u64) -> Result<(), Error> {
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(idx),
            timeout: Some(std::time::Duration::from_secs(secs)),
        })
        .map(|_| ())
        .map_err(|e| Error::Gpu {
            detail: e.to_string(),
        })
}

/// The words of `buf` once submission `idx` is done, polling for up to `spin` before sleeping.
fn map_u64(
    device: &wgpu::Device,
    buf: &wgpu::Buffer,
    idx: wgpu::SubmissionIndex,
    spin: std::time::Duration,
) -> Result<Vec<u64>, Error> {
    let slice = buf.slice(..);
    let mapped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = mapped.clone();
    slice.map_async(wgpu::MapMode::Read, move |_| {
        flag.store(true, std::sync::atomic::Ordering::Release);
    });
    // Poll first for up to `spin`, as the verifier's blocking reads do, then sleep.
    let is_mapped = || mapped.load(std::sync::atomic::Ordering::Acquire);
    let polled = crate::gpu::spin_poll(device, spin, || Ok(is_mapped().then_some(())))?;
    if polled.is_none() && !is_mapped() {
        wait_for(device, idx, 60)?;
    }
    let out = {
        let view = slice.get_mapped_range().map_err(|e| Error::Gpu {
            detail: e.to_string(),
        })?;
        bytemuck::cast_slice::<u8, u64>(&view).to_vec()
    };
    buf.unmap();
    Ok(out)
}

/// Copy bandwidth (read + write bytes over wall time of 8 back-to-back copies in one submission)
/// and the best read-kernel bandwidth over a few grid sizes (timestamps when available).
/// Seconds the warm-up lasts at least (when `cfg.warm_s` allows): the first process on a
/// freshly started H200 read at ~1,700 GB/s for several consecutive measurements, agreeing within
/// 3 %, before jumping to ~4,150 within the same process, so a stable ceiling alone does not
/// show that the GPU is warm.
const MIN_WARM_S: f64 = 10.0;

/// The ceilings once the GPU is warm: the read ceiling measured for at least [`MIN_WARM_S`] and
/// until three measurements in a row agree within 3 %, for at most `cfg.warm_s` seconds (printed
/// as it goes; a run that never settles says so and times anyway). Returns the last copy and
/// read ceilings and every read measurement.
fn warm_ceilings(
    cfg: &BenchConfig,
    b: &GpuBench,
    timestamps: bool,
    progress: &mut impl FnMut(&str),
) -> Result<(f64, f64, Vec<f64>), Error> {
    let start = Instant::now();
    let mut reads = Vec::new();
    let mut last_line = -1.0f64;
    loop {
        let (copy, read) = ceilings(&b.verifier, &b.t_buf, timestamps, b.period_ns)?;
        reads.push(read);
        if cfg.warm_s <= 0.0 {
            return Ok((copy, read, reads));
        }
        let n = reads.len();
        let (lo, hi) = range(&reads[n.saturating_sub(3)..]);
        let stable = n >= 3 && hi <= 1.03 * lo;
        // One line per second is enough to see the GPU come up to speed.
        let t = start.elapsed().as_secs_f64();
        if t.floor() > last_line {
            last_line = t.floor();
            progress(&format!(
                "warm-up {n} ({t:.1} s): read kernel {read:.0} GB/s"
            ));
        }
        if stable && t >= MIN_WARM_S.min(cfg.warm_s) {
            progress(&format!(
                "warm-up: {n} reads in {t:.1} s, the last three {lo:.0}..{hi:.0} GB/s"
            ));
            return Ok((copy, read, reads));
        }
        if t > cfg.warm_s {
            progress(&format!(
                "warm-up: the read ceiling did not settle within {} s (last three {lo:.0}..{hi:.0} \
                 GB/s); timing anyway",
                cfg.warm_s
            ));
            return Ok((copy, read, reads));
        }
    }
}

fn ceilings(
    verifier: &Verifier,
    src: &wgpu::Buffer,
    timestamps: bool,
    period_ns: f64,
) -> Result<(f64, f64), Error> {
    let g = verifier.gpu_backend().expect("GPU verifier");
    let (device, queue) = (&g.kernels.device, &g.kernels.queue);
    let bytes = (src.size() / 2).clamp(16, 1 << 30) & !15;
    let dst = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench.copy_dst"),
        size: bytes,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let sink = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench.sink"),
        size: 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let wait = |idx| wait_for(device, idx, 120);
    let mut copy = Vec::new();
    for _ in 0..4 {
        let mut enc = device.create_command_encoder(&Default::default());
        for _ in 0..8 {
            enc.copy_buffer_to_buffer(src, 0, &dst, 0, bytes);
        }
        let t0 = Instant::now();
        wait(queue.submit([enc.finish()]))?;
        copy.push(8.0 * 2.0 * bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    let copy_gbps = copy.iter().cloned().fold(0.0, f64::max);
    // The read kernel reads `dst` (bytes, a multiple of 16).
    let qs = timestamps.then(|| {
        device.create_query_set(&wgpu::QuerySetDescriptor {
            label: None,
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        })
    });
    let resolve = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut best = 0.0f64;
    for workgroups in [264u32, 1056, 2112, 4224] {
        let mut times = Vec::new();
        for _ in 0..7 {
            let mut enc = device.create_command_encoder(&Default::default());
            let ts = qs.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                query_set: q,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            });
            g.record_read_bandwidth(&mut enc, &dst, &sink, workgroups, ts);
            if let Some(q) = &qs {
                enc.resolve_query_set(q, 0..2, &resolve, 0);
                enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, 16);
            }
            let t0 = Instant::now();
            let idx = queue.submit([enc.finish()]);
            if qs.is_some() {
                let t = map_u64(device, &read, idx, std::time::Duration::ZERO)?;
                times.push(t[1].wrapping_sub(t[0]) as f64 * period_ns / 1e9);
            } else {
                wait(idx)?;
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        best = best.max(bytes as f64 / median(&mut times) / 1e9);
    }
    Ok((copy_gbps, best))
}

/// Median wall time of copying a point's logits (and draft rows) to host memory through
/// `staging` and verifying them with the CPU twin there.
#[allow(clippy::too_many_arguments)]
fn baseline(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    cpu: &Verifier,
    batch: &VerifyBatch<'_>,
    t_buf: &wgpu::Buffer,
    n_t: usize,
    mode: BenchMode,
    draft_src: Option<&wgpu::Buffer>,
    n_d: usize,
    staging: &wgpu::Buffer,
    reps: usize,
) -> Result<f64, Error> {
    let total = (n_t + if draft_src.is_some() { n_d } else { 0 }) * 4;
    let mut times = Vec::new();
    let mut host = vec![0f32; total / 4];
    for _ in 0..reps {
        let t0 = Instant::now();
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(t_buf, 0, staging, 0, (n_t * 4) as u64);
        if let Some(src) = draft_src {
            enc.copy_buffer_to_buffer(src, 0, staging, (n_t * 4) as u64, (n_d * 4) as u64);
        }
        let idx = queue.submit([enc.finish()]);
        let slice = staging.slice(..total as u64);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        wait_for(device, idx, 120)?;
        {
            let view = slice.get_mapped_range().map_err(|e| Error::Gpu {
                detail: e.to_string(),
            })?;
            host.copy_from_slice(bytemuck::cast_slice::<u8, f32>(&view));
        }
        staging.unmap();
        let (t, d) = host.split_at(n_t);
        let b = VerifyBatch {
            target_logits: Logits::F32(t),
            draft: match mode {
                BenchMode::DraftProbs => Draft::Probs(Logits::F32(d)),
                BenchMode::DraftLogits => Draft::Logits(Logits::F32(d)),
                _ => Draft::OneHot,
            },
            ..*batch
        };
        cpu.verify_blocking(&b)?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut times))
}

/// Runs the grid on the CPU backend: "GPU time" and "whole call" are both the wall time of a
/// verify call on host slices; the ceilings are the host's copy and read bandwidth.
pub fn run_cpu(cfg: &BenchConfig, mut progress: impl FnMut(&str)) -> Result<BenchReport, Error> {
    let cpu = Verifier::cpu(VerifierOptions::default());
    let max_r = *cfg.batches.iter().max().unwrap_or(&1) as usize;
    let max_k = *cfg.ks.iter().max().unwrap_or(&1) as usize;
    let max_v = *cfg.vocabs.iter().max().unwrap_or(&1) as usize;
    let mut host_t = vec![0f32; max_r * (max_k + 1) * max_v];
    cfg.rows.fill(&mut host_t, 1);
    let mut host_d = vec![0f32; max_r * max_k * max_v];
    cfg.rows.fill(&mut host_d, 2);
    let (copy_gbps, read_gbps) = host_ceilings(&host_t);
    progress(&format!(
        "CPU backend: host copy {copy_gbps:.1} GB/s (read+write), parallel read {read_gbps:.1} GB/s; logits {}",
        cfg.rows.describe()
    ));
    let mut rows = Vec::new();
    let mut probs = Vec::new();
    for &v in &cfg.vocabs {
        for &k in &cfg.ks {
            for &r in &cfg.batches {
                let (vu, ru, ku) = (v as usize, r as usize, k as usize);
                let (n_t, n_d) = (ru * (ku + 1) * vu, ru * ku * vu);
                let drafts = drafts_for(
                    &host_t[..n_t],
                    vu,
                    ru,
                    ku,
                    u64::from(v) ^ u64::from(r << 8) ^ u64::from(k),
                );
                for &mode in &cfg.modes {
                    let requests = requests_for(mode, ru, k, cfg);
                    if mode == BenchMode::DraftProbs {
                        softmax_rows(&host_d[..n_d], vu, &mut probs);
                    }
                    let batch = VerifyBatch {
                        vocab_size: v,
                        requests: &requests,
                        draft_token_ids: &drafts,
                        target_logits: Logits::F32(&host_t[..n_t]),
                        draft: match mode {
                            BenchMode::DraftProbs => Draft::Probs(Logits::F32(&probs)),
                            BenchMode::DraftLogits => Draft::Logits(Logits::F32(&host_d[..n_d])),
                            _ => Draft::OneHot,
                        },
                        draft_vocab_size: None,
                        synthetic_rates: None,
                    };
                    for _ in 0..cfg.warmup {
                        cpu.verify_blocking(&batch)?;
                    }
                    let mut times = Vec::new();
                    for _ in 0..cfg.reps {
                        let t0 = Instant::now();
                        cpu.verify_blocking(&batch)?;
                        times.push(t0.elapsed().as_secs_f64() * 1e6);
                    }
                    let t = median(&mut times);
                    let bytes = ((n_t + if mode.has_draft_rows() { n_d } else { 0 }) * 4) as u64;
                    let row = BenchRow {
                        mode,
                        batch: r,
                        k,
                        vocab: v,
                        gpu_us: t,
                        call_us: t,
                        bytes,
                        gbps: bytes as f64 / t / 1e3,
                        baseline_us: None,
                        mismatches: 0,
                        anchor: anchor(mode, r, k, v),
                        kernels_us: None,
                        host_us: t,
                        cpu_us: None,
                    };
                    progress(&row_line(&row, read_gbps));
                    rows.push(row);
                }
            }
        }
    }
    Ok(BenchReport {
        adapter: format!(
            "CPU backend ({} threads)",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        ),
        backend: "cpu".into(),
        date: today(),
        copy_gbps,
        read_gbps,
        // The host's ceilings are measured once: no clocks to wait for.
        read_gbps_end: read_gbps,
        warm_reads: vec![read_gbps],
        timestamps: false,
        variant: Default::default(),
        floor_us: None,
        floor_spin_us: 0.0,
        chain_floor: Vec::new(),
        rows,
    })
}

/// Host memcpy (read + write) and parallel read bandwidth over `data`.
fn host_ceilings(data: &[f32]) -> (f64, f64) {
    let mut dst = vec![0f32; data.len()];
    let mut copy = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        dst.copy_from_slice(data);
        copy = copy.max(2.0 * (data.len() * 4) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&dst);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = data.len().div_ceil(threads).max(1);
    let mut read = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let hs: Vec<_> = data
                .chunks(per)
                .map(|c| s.spawn(move || c.iter().sum::<f32>()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        std::hint::black_box(total);
        read = read.max((data.len() * 4) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    (copy, read)
}

/// The timed whole calls of one point: wall time per call and the host's part of it (µs), and
/// the calling thread's CPU time per call (`BenchRow::cpu_us`).
struct WholeCalls {
    calls: Vec<f64>,
    host: Vec<f64>,
    cpu_us: Option<f64>,
}

/// The CPU time the calling thread has run, ns: the first field of Linux's
/// `/proc/thread-self/schedstat` (`None` elsewhere, or where the kernel does not keep it). Read
/// once before and once after a run of calls, so its cost (a file read) is not per call.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn row_line(r: &BenchRow, read_gbps: f64) -> String {
    let anchor = r.anchor.map_or("       -".to_string(), |(g, _)| {
        format!("{:>7.1}x", g / r.gpu_us)
    });
    let kernels = r.kernels_us.map_or(String::new(), |k| {
        format!(
            "  [stats {:.1} verify {:.1} resid {:.1} merge {:.1} host {:.1}{}]",
            k[0],
            k[1],
            k[2],
            k[3],
            r.host_us,
            r.cpu_us.map_or(String::new(), |c| format!(" cpu {c:.1}"))
        )
    });
    format!(
        "{:<13} R={:<4} k={:<2} V={:<7} gpu {:>9.1} us  call {:>9.1} us  {:>7.1} GB/s ({:>5.1}% of read bw)  vs vLLM graph {}  mismatches {}{kernels}",
        r.mode.name(),
        r.batch,
        r.k,
        r.vocab,
        r.gpu_us,
        r.call_us,
        r.gbps,
        100.0 * r.gbps / read_gbps,
        anchor,
        r.mismatches
    )
}

/// The smallest and largest of `values`.
fn range(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)))
}

/// `chain` as one line: per workgroup count, the GPU µs of 1, 2, … dependent dispatches.
fn chain_summary(chain: &[ChainFloor]) -> String {
    let mut parts = Vec::new();
    for &wg in &CHAIN_WORKGROUPS {
        let times: Vec<String> = chain
            .iter()
            .filter(|c| c.workgroups == wg)
            .map(|c| format!("{} {:.2}", c.dispatches, c.gpu_us))
            .collect();
        if !times.is_empty() {
            parts.push(format!(
                "{wg} workgroup{} per dispatch: {} µs",
                if wg == 1 { "" } else { "s" },
                times.join(" / ")
            ));
        }
    }
    format!("{} (dispatches µs)", parts.join("; "))
}

/// The warm-up's read measurements in a few words: how many, the first, the range.
fn warm_summary(reads: &[f64]) -> String {
    let (lo, hi) = range(reads);
    match reads.first() {
        None => "none".into(),
        Some(first) => format!(
            "{} reads, first {first:.0} GB/s, range {lo:.0}..{hi:.0}",
            reads.len()
        ),
    }
}

impl BenchReport {
    /// A readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ =
            writeln!(
            s,
            "adapter: {} ({}{}), {}; copy bw {:.0} GB/s (read+write), read-kernel bw {:.0} GB/s \
             ({:.0} after the last point; warm-up: {}); round-trip floor {}; dispatch-chain \
             floor {}; GPU time from {}",
            self.adapter,
            self.backend,
            self.variant.describe(),
            self.date,
            self.copy_gbps,
            self.read_gbps,
            self.read_gbps_end,
            warm_summary(&self.warm_reads),
            self.floor_us.map_or("-".to_string(), |f| format!(
                "{f:.1} µs (reads poll up to {:.0} µs)",
                self.floor_spin_us
            )),
            if self.chain_floor.is_empty() {
                "-".to_string()
            } else {
                chain_summary(&self.chain_floor)
            },
            if self.timestamps { "timestamp queries" } else { "wall clock" }
        );
        let _ = writeln!(
            s,
            "| mode | R | k | V | GPU µs | vLLM graph µs | ours/vLLM | call µs | vLLM eager µs | GB/s | % copy bw | % read bw | CPU baseline µs | twin mismatches |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &self.rows {
            let (ag, am) = r.anchor.map_or(("-".into(), "-".into()), |(g, m)| {
                (format!("{g:.1}"), format!("{m:.1}"))
            });
            let ratio = r
                .anchor
                .map_or("-".into(), |(g, _)| format!("{:.2}", r.gpu_us / g));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.1} | {} | {} | {:.1} | {} | {:.1} | {:.1}% | {:.1}% | {} | {} |",
                r.mode.name(),
                r.batch,
                r.k,
                r.vocab,
                r.gpu_us,
                ag,
                ratio,
                r.call_us,
                am,
                r.gbps,
                100.0 * r.gbps / self.copy_gbps,
                100.0 * r.gbps / self.read_gbps,
                r.baseline_us.map_or("-".into(), |b| format!("{b:.0}")),
                r.mismatches
            );
        }
        s
    }

    /// CSV, one row per point, with the adapter on every row.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "adapter,backend,date,mode,batch,k,vocab,gpu_us,call_us,bytes,GBps,frac_of_copy_bw,frac_of_read_bw,baseline_us,anchor_graph_us,anchor_median_us,twin_mismatches,row_stats_us,verify_us,residual_us,residual_merge_us,host_us,call_over_floor,cpu_us\n",
        );
        for r in &self.rows {
            let (ag, am) = r.anchor.map_or((String::new(), String::new()), |(g, m)| {
                (g.to_string(), m.to_string())
            });
            let _ = writeln!(
                s,
                "\"{}\",{},{},{},{},{},{},{:.2},{:.2},{},{:.1},{:.4},{:.4},{},{},{},{},{},{:.2},{},{}",
                self.adapter.replace('"', "'"),
                self.backend,
                self.date,
                r.mode.name(),
                r.batch,
                r.k,
                r.vocab,
                r.gpu_us,
                r.call_us,
                r.bytes,
                r.gbps,
                r.gbps / self.copy_gbps,
                r.gbps / self.read_gbps,
                r.baseline_us.map_or(String::new(), |b| format!("{b:.1}")),
                ag,
                am,
                r.mismatches,
                r.kernels_us.map_or(",,,".to_string(), |k| format!(
                    "{:.2},{:.2},{:.2},{:.2}",
                    k[0], k[1], k[2], k[3]
                )),
                r.host_us,
                self.floor_us
                    .map_or(String::new(), |f| format!("{:.3}", r.call_us / f)),
                r.cpu_us.map_or(String::new(), |c| format!("{c:.1}"))
            );
        }
        s
    }

    /// An SVG plot: GPU time against batch, one panel per mode, ours (solid) beside the anchor's
    /// graph time (dashed), one colour per k, at the largest anchored vocabulary of the run.
    pub fn svg(&self) -> String {
        let vocab = self
            .rows
            .iter()
            .filter(|r| r.anchor.is_some())
            .map(|r| r.vocab)
            .filter(|&v| v == 151_936)
            .chain(self.rows.iter().map(|r| r.vocab))
            .next()
            .unwrap_or(0);
        let modes: Vec<BenchMode> = BenchMode::ALL
            .into_iter()
            .filter(|m| self.rows.iter().any(|r| r.mode == *m))
            .collect();
        let (pw, ph, pad) = (360.0, 260.0, 50.0);
        let width = pad + modes.len() as f64 * (pw + pad);
        let height = ph + 2.0 * pad + 40.0;
        let pts: Vec<&BenchRow> = self.rows.iter().filter(|r| r.vocab == vocab).collect();
        let ys: Vec<f64> = pts
            .iter()
            .flat_map(|r| [Some(r.gpu_us), r.anchor.map(|a| a.0)])
            .flatten()
            .collect();
        let (ymin, ymax) = (
            ys.iter()
                .cloned()
                .fold(f64::INFINITY, f64::min)
                .max(1e-3)
                .log10()
                .floor(),
            ys.iter()
                .cloned()
                .fold(0.0, f64::max)
                .max(1e-3)
                .log10()
                .ceil(),
        );
        let ymax = if ymax <= ymin { ymin + 1.0 } else { ymax };
        let xs: Vec<u32> = {
            let mut b: Vec<u32> = pts.iter().map(|r| r.batch).collect();
            b.sort_unstable();
            b.dedup();
            b
        };
        let xmax = (*xs.last().unwrap_or(&1) as f64).log2().max(1.0);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{pad}" y="20" font-size="14">specdec GPU time per verify call vs vLLM MRV2 (dashed), V={vocab}, {} ({})</text>"#,
            self.adapter, self.date
        );
        let frame = SvgFrame {
            pw,
            ph,
            y0: pad,
            xmax,
            ymin,
            ymax,
        };
        for (pi, &mode) in modes.iter().enumerate() {
            let x0 = pad + pi as f64 * (pw + pad);
            svg_panel(&mut s, &frame, x0, mode, &pts, &xs);
        }
        let _ = writeln!(
            s,
            r#"<text x="{pad}" y="{}">y: µs (log), x: batch R (log). Solid: specdec (timestamp queries). Dashed: vLLM MRV2 graph_us on an H200.</text></svg>"#,
            height - 10.0
        );
        s
    }

    /// A file stem for this run, named by what was measured and never by date (the CSV's `date`
    /// column keeps that): `<adapter slug>-<backend slug>-<grid>[-<what differs>…]`, where
    /// `<grid>` is `grid` (the full grid) or `quick-grid` (`quick`: [`BenchConfig::quick`]), and
    /// each option of `cfg` that differs from that grid adds a suffix, in a fixed order (see
    /// [`config_suffixes`]), e.g. `nvidia-h200-vulkan-grid`,
    /// `llvmpipe-llvm-15-0-6-256-bits-vulkan-quick-grid-bf16-top-p-0.9` or
    /// `cpu-backend-16-threads-cpu-quick-grid`. Repetition and warm-up counts add none: they
    /// change how well a point is measured, not what.
    pub fn file_stem(&self, cfg: &BenchConfig, quick: bool) -> String {
        let base = if quick {
            BenchConfig::quick()
        } else {
            BenchConfig::full()
        };
        let mut parts = vec![slug(&self.adapter), slug(&self.backend)];
        parts.push(if quick { "quick-grid" } else { "grid" }.into());
        parts.extend(config_suffixes(cfg, &base));
        parts.retain(|p| !p.is_empty());
        parts.join("-")
    }
}

/// `s` as a file-name part: lowercase ASCII alphanumerics, every run of other characters one
/// '-', none at either end.
fn slug(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    mapped
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// `values` as one file-name part: `name-v1-v2…`.
fn list_part<T: std::fmt::Display>(name: &str, values: &[T]) -> String {
    let mut part = name.to_string();
    for v in values {
        part.push_str(&format!("-{v}"));
    }
    part
}

/// The name `--shader-checks` takes for `c` (the checks it does not set stay at their default).
fn checks_name(c: &wgpu::ShaderRuntimeChecks) -> &'static str {
    match (c.bounds_checks, c.force_loop_bounding) {
        (true, true) => "all",
        (true, false) => "no-loop-bounds",
        (false, true) => "no-index-checks",
        (false, false) => "none",
    }
}

/// One file-name part per option of `cfg` that changes what is measured and differs from
/// `base`, named after its command-line flag (values kept as given, so `--top-p 0.9` is
/// `top-p-0.9`), in a fixed order so that one command line always gives one name.
fn config_suffixes(cfg: &BenchConfig, base: &BenchConfig) -> Vec<String> {
    let mut parts = Vec::new();
    if cfg.batches != base.batches {
        parts.push(list_part("batch", &cfg.batches));
    }
    if cfg.ks != base.ks {
        parts.push(list_part("k", &cfg.ks));
    }
    if cfg.vocabs != base.vocabs {
        parts.push(list_part("vocab", &cfg.vocabs));
    }
    if cfg.modes != base.modes {
        let names: Vec<_> = cfg.modes.iter().map(|m| slug(m.name())).collect();
        parts.push(names.join("-"));
    }
    match cfg.target_dtype {
        crate::Dtype::F32 => {}
        crate::Dtype::F16 => parts.push("f16".into()),
        crate::Dtype::Bf16 => parts.push("bf16".into()),
    }
    if cfg.block {
        parts.push("block".into());
    }
    match cfg.rows {
        BenchRows::Normal => {}
        BenchRows::Peaked => parts.push("peaked-rows".into()),
        BenchRows::Coarse => parts.push("coarse-rows".into()),
    }
    if cfg.top_p != base.top_p {
        parts.push(format!("top-p-{}", cfg.top_p));
    }
    if cfg.top_k != base.top_k {
        parts.push(format!("top-k-{}", cfg.top_k));
    }
    if cfg.min_p != base.min_p {
        parts.push(format!("min-p-{}", cfg.min_p));
    }
    parts.extend(option_suffixes(cfg, base));
    parts
}

/// The parts of [`config_suffixes`] for the verifier's options (`VerifierOptions`).
fn option_suffixes(cfg: &BenchConfig, base: &BenchConfig) -> Vec<String> {
    let mut parts = Vec::new();
    let mut flag = |on: bool, name: &str| {
        if on {
            parts.push(name.to_string());
        }
    };
    flag(cfg.shader_int64 != base.shader_int64, "portable");
    flag(cfg.subgroups != base.subgroups, "no-subgroups");
    flag(cfg.immediates != base.immediates, "immediates");
    flag(cfg.f16_unpack != base.f16_unpack, "no-f16-unpack");
    flag(cfg.pipelines != base.pipelines, "eager-pipelines");
    flag(cfg.fused_greedy != base.fused_greedy, "no-fused-greedy");
    let numbers = [
        (
            "target-wgs",
            Some(cfg.target_workgroups),
            Some(base.target_workgroups),
        ),
        ("workgroup-size", cfg.workgroup_size, base.workgroup_size),
        (
            "fused-verify",
            cfg.fused_verify_chunks,
            base.fused_verify_chunks,
        ),
        (
            "wide-greedy",
            cfg.wide_greedy_chunks,
            base.wide_greedy_chunks,
        ),
        (
            "narrow-greedy",
            cfg.narrow_greedy_chunks,
            base.narrow_greedy_chunks,
        ),
    ];
    for (name, value, default) in numbers {
        if let Some(v) = value.filter(|_| value != default) {
            parts.push(format!("{name}-{v}"));
        }
    }
    if let Some(v) = cfg
        .early_race_entries
        .filter(|_| cfg.early_race_entries != base.early_race_entries)
    {
        parts.push(format!("early-race-{v}"));
    }
    if let Some(d) = cfg.spin_wait.filter(|_| cfg.spin_wait != base.spin_wait) {
        parts.push(format!("spin-us-{}", d.as_micros()));
    }
    if let Some(c) = &cfg.shader_checks {
        parts.push(format!("shader-checks-{}", checks_name(c)));
    }
    parts
}

/// `stem` itself if neither `stem.csv` nor `stem.svg` exists yet, else the first free
/// `stem-2`, `stem-3`, …: a second run of the same command keeps the first one's files.
fn free_stem(stem: &std::path::Path) -> std::path::PathBuf {
    let taken = |p: &std::path::Path| ["csv", "svg"].iter().any(|ext| with_ext(p, ext).exists());
    if !taken(stem) {
        return stem.to_path_buf();
    }
    (2u32..)
        .map(|n| {
            let mut s = stem.as_os_str().to_owned();
            s.push(format!("-{n}"));
            std::path::PathBuf::from(s)
        })
        .find(|p| !taken(p))
        .expect("some numbered stem is free")
}

/// `stem` with `.ext` appended: not `Path::with_extension`, which would replace a stem's own
/// dot (`top-p-0.9` would become `top-p-0.csv`).
fn with_ext(stem: &std::path::Path, ext: &str) -> std::path::PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(format!(".{ext}"));
    s.into()
}

/// The axes every panel of [`BenchReport::svg`] shares: panel size, top edge, log2 of the
/// largest R, and the decades of the µs axis.
struct SvgFrame {
    pw: f64,
    ph: f64,
    y0: f64,
    xmax: f64,
    ymin: f64,
    ymax: f64,
}

/// One mode's panel at `x0`: frame, grid, R labels, and per k our line (solid) and the anchor's
/// (dashed).
fn svg_panel(
    s: &mut String,
    f: &SvgFrame,
    x0: f64,
    mode: BenchMode,
    pts: &[&BenchRow],
    xs: &[u32],
) {
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let SvgFrame {
        pw,
        ph,
        y0,
        xmax,
        ymin,
        ymax,
    } = *f;
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}">{}</text>"#,
        x0 + 5.0,
        y0 + 15.0,
        mode.name()
    );
    let px = |b: u32| x0 + (b as f64).log2() / xmax * pw;
    let py = |us: f64| y0 + ph - (us.max(1e-3).log10() - ymin) / (ymax - ymin) * ph;
    for d in (ymin as i32)..=(ymax as i32) {
        let y = py(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            x0 + pw,
            x0 - 3.0,
            y + 4.0,
            10f64.powi(d)
        );
    }
    for &b in xs {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">R={b}</text>"#,
            px(b),
            y0 + ph + 15.0
        );
    }
    let mut ks: Vec<u32> = pts.iter().map(|r| r.k).collect();
    ks.sort_unstable();
    ks.dedup();
    for (ci, &k) in ks.iter().enumerate() {
        let color = colors[ci % colors.len()];
        let line: Vec<&&BenchRow> = pts.iter().filter(|r| r.mode == mode && r.k == k).collect();
        let ours: Vec<String> = line
            .iter()
            .map(|r| format!("{:.1},{:.1}", px(r.batch), py(r.gpu_us)))
            .collect();
        let theirs: Vec<String> = line
            .iter()
            .filter_map(|r| {
                r.anchor
                    .map(|a| format!("{:.1},{:.1}", px(r.batch), py(a.0)))
            })
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            ours.join(" ")
        );
        if !theirs.is_empty() {
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5" stroke-dasharray="5,4"/>"#,
                theirs.join(" ")
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" fill="{color}">k={k}</text>"#,
            x0 + pw - 40.0,
            y0 + 15.0 + 14.0 * ci as f64
        );
    }
}

/// Help text of the benchmark command (`specdec bench` and `cargo bench --bench verify`).
pub const HELP: &str = "\
Benchmark the verify step on this machine (checks every point against the CPU twin first).

Options:
  --quick             small grid: R 1,8,32 x k 1,4 x V 32000, 5 reps (software adapters, CPU)
  --cpu               run the CPU backend instead of the GPU
  --batch 1,8,32,128  requests per batch      --k 1,4,8          drafts per request
  --vocab 32000,...   vocabulary sizes         --modes greedy,draft_probs,draft_logits,one_hot
  --reps N            timed calls per point (at most 512)   --no-baseline  skip copy-to-host + CPU baseline
  --portable          do not use SHADER_INT64  --target-wgs N     workgroups a pass aims for
  --no-subgroups      fold every level through workgroup memory (VerifierOptions::subgroups)
  --immediates        Params as immediate data, not uniform slots (VerifierOptions::immediates)
  --no-f16-unpack     widen f16 rows with integer operations (VerifierOptions::f16_unpack)
  --eager-pipelines   build every pipeline with the verifier (PipelineBuild::Eager), not at the
                      first call of each kind; prints how long the verifier took to make
  --workgroup-size N  invocations per workgroup of the residual, cutoff and block-mass passes
  --early-race N      one-hot batches of at most N entries in sampled draft rows race beside
                      row_stats (VerifierOptions::early_race_entries; 0 = off; default:
                      1,250,000 on discrete GPUs, else off)
  --wide-greedy N     all-greedy batches of at most N chunks reduce over whole workgroups
                      (VerifierOptions::wide_greedy_chunks; 0 = off; default: 1,024 on discrete
                      GPUs, else off); batches that settle in row_stats do at any size unless 0
  --narrow-greedy N   all-greedy batches settled in row_stats on one-chunk workgroups, from N
                      chunks, reduce each chunk over half the workgroup size (VerifierOptions::
                      narrow_greedy_chunks; 0 = off; default: 1,024 on discrete GPUs, else off)
  --no-fused-greedy   all-greedy batches run verify's dispatch instead of settling in
                      row_stats (VerifierOptions::fused_greedy)
  --fused-verify N    sampled batches of at most N chunks are verified by row_stats' last
                      workgroups, without verify's dispatch (VerifierOptions::
                      fused_verify_chunks; 0 = off; default: 1,024 on discrete GPUs, else off)
  --spin-us N         a blocking read polls the device for up to N µs before it sleeps
                      (VerifierOptions::spin_wait; 0 = sleep at once; default: 1,000 on discrete
                      GPUs, else 0); the round-trip floor waits the same way
  --shader-checks C   naga's runtime checks in every kernel: all, no-loop-bounds,
                      no-index-checks or none (default: per kernel, VerifierOptions::shader_checks)
  --top-p P           top_p of sampled requests (runs the cutoff pass; default 1 = off)
  --top-k K           top_k of sampled requests (runs the cutoff pass; default 0 = off)
  --min-p P           min_p of sampled requests (runs the cutoff pass; default 0 = off)
  --bf16, --f16       target logits as bfloat16 / IEEE half (draft rows stay f32)
  --block             sampled requests use block verification (Rule::Block)
  --rows R            logit rows: normal (2·N(0,1), default), peaked (shaped like a small
                      LLM's: 3.8·N(0,1), 1 entry in 16,384 raised by 14) or coarse (normal
                      rounded to multiples of 1/4: thousands of ties at a top-p cut-off)
  --warm-s S          before timing, read for at least 10 s (S if less) and until the read
                      ceiling is stable (three within 3 %), at most S s (default 60; --quick 0)
  --rewarm-ms N       read-kernel work before each point is timed, after its twin check
                      (default 300; --quick 0): the GPU lowers its clocks while the twin runs
  --out DIR           where the CSV and SVG go (default benches/results), named by what was
                      measured, never by date: <adapter>-<backend>-grid or -quick-grid, then
                      one part per option above that differs (e.g. -bf16, -block, -top-p-0.9);
                      an existing name gets -2, -3, ... instead of being overwritten
";

/// A parsed command line: the grid, where the files go, whether the CPU backend runs, and
/// whether the grid started from `--quick`'s (the files' names say which).
struct BenchArgs {
    cfg: BenchConfig,
    out: std::path::PathBuf,
    cpu: bool,
    quick: bool,
}

/// `flag`'s comma-separated list of numbers.
fn parse_list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("{flag}: {x:?} is not a number"))
        })
        .collect()
}

/// `--shader-checks`' value.
fn parse_checks(s: &str) -> Result<Option<wgpu::ShaderRuntimeChecks>, String> {
    let all = wgpu::ShaderRuntimeChecks::checked();
    Ok(Some(match s {
        "all" => all,
        "no-loop-bounds" => wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            ..all
        },
        "no-index-checks" => wgpu::ShaderRuntimeChecks {
            bounds_checks: false,
            ..all
        },
        "none" => wgpu::ShaderRuntimeChecks::unchecked(),
        other => {
            return Err(format!(
                "--shader-checks: {other:?} (all, no-loop-bounds, no-index-checks, none)"
            ))
        }
    }))
}

/// `flag`'s single number.
fn parse_one<T: std::str::FromStr>(flag: &str, s: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{flag}: {s:?} is not a number"))
}

/// Parses the benchmark's options; `Ok(None)` asks for the help text.
fn parse_args(args: &[String]) -> Result<Option<BenchArgs>, String> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut cfg = if quick {
        BenchConfig::quick()
    } else {
        BenchConfig::full()
    };
    let mut out = std::path::PathBuf::from("benches/results");
    let mut cpu = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--quick" => {}
            "--cpu" => cpu = true,
            "--no-baseline" => cfg.baseline_reps = 0,
            "--portable" => cfg.shader_int64 = false,
            "--no-subgroups" => cfg.subgroups = false,
            "--immediates" => cfg.immediates = true,
            "--no-f16-unpack" => cfg.f16_unpack = false,
            "--eager-pipelines" => cfg.pipelines = crate::PipelineBuild::Eager,
            "--no-fused-greedy" => cfg.fused_greedy = false,
            "--fused-verify" => {
                cfg.fused_verify_chunks = Some(parse_one("--fused-verify", &value()?)?);
            }
            "--shader-checks" => cfg.shader_checks = parse_checks(&value()?)?,
            "--workgroup-size" => {
                cfg.workgroup_size = Some(parse_one("--workgroup-size", &value()?)?)
            }
            "--bf16" => cfg.target_dtype = crate::Dtype::Bf16,
            "--f16" => cfg.target_dtype = crate::Dtype::F16,
            "--block" => cfg.block = true,
            "--rows" => {
                cfg.rows = match value()?.as_str() {
                    "normal" => BenchRows::Normal,
                    "peaked" => BenchRows::Peaked,
                    "coarse" => BenchRows::Coarse,
                    other => return Err(format!("--rows {other}: normal, peaked or coarse")),
                }
            }
            "--top-p" => cfg.top_p = parse_one("--top-p", &value()?)?,
            "--top-k" => cfg.top_k = parse_one("--top-k", &value()?)?,
            "--min-p" => cfg.min_p = parse_one("--min-p", &value()?)?,
            "--reps" => cfg.reps = parse_one("--reps", &value()?)?,
            "--warm-s" => cfg.warm_s = parse_one("--warm-s", &value()?)?,
            "--rewarm-ms" => cfg.rewarm_ms = parse_one("--rewarm-ms", &value()?)?,
            "--batch" => cfg.batches = parse_list("--batch", &value()?)?,
            "--k" => cfg.ks = parse_list("--k", &value()?)?,
            "--vocab" => cfg.vocabs = parse_list("--vocab", &value()?)?,
            "--target-wgs" => cfg.target_workgroups = parse_one("--target-wgs", &value()?)?,
            "--early-race" => {
                cfg.early_race_entries = Some(parse_one("--early-race", &value()?)?);
            }
            "--spin-us" => {
                let us: u64 = parse_one("--spin-us", &value()?)?;
                cfg.spin_wait = Some(std::time::Duration::from_micros(us));
            }
            "--wide-greedy" => {
                cfg.wide_greedy_chunks = Some(parse_one("--wide-greedy", &value()?)?);
            }
            "--narrow-greedy" => {
                cfg.narrow_greedy_chunks = Some(parse_one("--narrow-greedy", &value()?)?);
            }
            "--out" => out = value()?.into(),
            "--modes" => {
                cfg.modes = value()?
                    .split(',')
                    .map(|m| {
                        BenchMode::parse(m).ok_or_else(|| {
                            format!(
                                "unknown mode {m:?} (greedy, draft_probs, draft_logits, one_hot)"
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown option {other:?}; see --help")),
        }
    }
    check_config(&cfg)?;
    Ok(Some(BenchArgs {
        cfg,
        out,
        cpu,
        quick,
    }))
}

/// Every value of the grid in range, before any work: a bad value is a usage error (exit code
/// 2), never a panic or a table of NaN halfway through a run.
fn check_config(cfg: &BenchConfig) -> Result<(), String> {
    if cfg.batches.is_empty() || cfg.ks.is_empty() || cfg.vocabs.is_empty() || cfg.modes.is_empty()
    {
        return Err("empty grid: --batch, --k, --vocab and --modes need at least one value".into());
    }
    let max_k = crate::MAX_DRAFTS_PER_REQUEST;
    if let Some(r) = cfg.batches.iter().find(|&&r| r == 0) {
        return Err(format!("--batch {r}: a batch holds at least 1 request"));
    }
    if let Some(k) = cfg.ks.iter().find(|&&k| k == 0 || k > max_k) {
        return Err(format!(
            "--k {k}: drafts per request must be in 1..={max_k}"
        ));
    }
    if let Some(v) = cfg.vocabs.iter().find(|&&v| v == 0 || v > i32::MAX as u32) {
        return Err(format!(
            "--vocab {v}: the vocabulary must be in 1..={}",
            i32::MAX
        ));
    }
    if cfg.reps == 0 {
        return Err("--reps 0: at least 1 timed call per point".into());
    }
    // Each timed call takes QUERIES_PER_CALL timestamp queries of one query set, which holds at
    // most wgpu::QUERY_SET_MAX_QUERIES.
    let max_reps = (wgpu::QUERY_SET_MAX_QUERIES / QUERIES_PER_CALL) as usize;
    if cfg.reps > max_reps {
        return Err(format!(
            "--reps {}: at most {max_reps} timed calls per point",
            cfg.reps
        ));
    }
    if let Some(w) = cfg.workgroup_size.filter(|w| !(1..=256).contains(w)) {
        return Err(format!(
            "--workgroup-size {w}: 1..=256 (rounded to a power of two)"
        ));
    }
    if !(cfg.warm_s >= 0.0 && cfg.warm_s.is_finite()) {
        return Err(format!("--warm-s {}: seconds, 0 or more", cfg.warm_s));
    }
    if !(cfg.top_p > 0.0 && cfg.top_p <= 1.0) {
        return Err(format!(
            "--top-p {}: must be in (0, 1]; 1 turns it off",
            cfg.top_p
        ));
    }
    if !(0.0..=1.0).contains(&cfg.min_p) {
        return Err(format!(
            "--min-p {}: must be in [0, 1]; 0 turns it off",
            cfg.min_p
        ));
    }
    if cfg.target_workgroups == 0 {
        return Err("--target-wgs 0: a pass aims for at least 1 workgroup".into());
    }
    Ok(())
}

/// Runs the benchmark command line `args` (without the program name); returns the exit code.
/// Progress and the table go to stdout, errors to stderr as one line each.
pub fn main_with_args(args: &[String]) -> i32 {
    let BenchArgs {
        cfg,
        out,
        cpu,
        quick,
    } = match parse_args(args) {
        Ok(Some(p)) => p,
        Ok(None) => {
            print!("{HELP}");
            return 0;
        }
        Err(e) => {
            eprintln!("specdec bench: {e}");
            return 2;
        }
    };
    let progress = |line: &str| println!("{line}");
    let report = if cpu {
        run_cpu(&cfg, progress)
    } else {
        run_gpu(&cfg, progress)
    };
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("specdec bench: {e}");
            return 1;
        }
    };
    println!("\n{}", report.table());
    let stem = out.join(report.file_stem(&cfg, quick));
    let written = std::fs::create_dir_all(&out).and_then(|_| {
        // Chosen after the folder exists; an earlier result with this name is kept.
        let stem = free_stem(&stem);
        std::fs::write(with_ext(&stem, "csv"), report.csv())?;
        std::fs::write(with_ext(&stem, "svg"), report.svg())?;
        Ok(stem)
    });
    let stem = match written {
        Ok(stem) => stem,
        Err(e) => {
            eprintln!("specdec bench: cannot write {}: {e}", stem.display());
            return 1;
        }
    };
    println!("wrote {}.csv and .svg", stem.display());
    let bad: usize = report.rows.iter().map(|r| r.mismatches).sum();
    println!("twin mismatches over the grid: {bad}");
    if report
        .rows
        .iter()
        .any(|r| r.mode == BenchMode::Greedy && r.mismatches > 0)
    {
        eprintln!("specdec bench: greedy results differ from the CPU twin");
        return 1;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report with no points, from `adapter` on `backend`.
    fn empty_report(adapter: &str, backend: &str) -> BenchReport {
        BenchReport {
            adapter: adapter.into(),
            backend: backend.into(),
            date: "2026-11-28".into(),
            copy_gbps: 0.0,
            read_gbps: 0.0,
            read_gbps_end: 0.0,
            warm_reads: Vec::new(),
            timestamps: false,
            variant: crate::shaders::Variant::default(),
            floor_us: None,
            floor_spin_us: 0.0,
            chain_floor: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Result files are named by adapter, backend and what was measured, never by date.
    #[test]
    fn file_stem_names_what_was_measured_not_the_date() {
        let gpu = empty_report("llvmpipe (LLVM 15.0.6, 256 bits)", "Vulkan");
        let full = gpu.file_stem(&BenchConfig::full(), false);
        assert_eq!(full, "llvmpipe-llvm-15-0-6-256-bits-vulkan-grid");
        assert!(!full.contains("2026"), "{full}");
        let quick = gpu.file_stem(&BenchConfig::quick(), true);
        assert_eq!(quick, "llvmpipe-llvm-15-0-6-256-bits-vulkan-quick-grid");
        let mut cfg = BenchConfig::quick();
        cfg.target_dtype = crate::Dtype::Bf16;
        cfg.top_p = 0.9;
        cfg.block = true;
        assert_eq!(
            gpu.file_stem(&cfg, true),
            "llvmpipe-llvm-15-0-6-256-bits-vulkan-quick-grid-bf16-block-top-p-0.9"
        );
        cfg = BenchConfig::quick();
        cfg.batches = vec![1];
        cfg.modes = vec![BenchMode::Greedy, BenchMode::DraftLogits];
        cfg.rows = BenchRows::Peaked;
        cfg.subgroups = false;
        assert_eq!(
            gpu.file_stem(&cfg, true),
            "llvmpipe-llvm-15-0-6-256-bits-vulkan-quick-grid-batch-1-greedy-draft-logits-peaked-rows-no-subgroups"
        );
        let cpu = empty_report("CPU backend (2 threads)", "cpu");
        assert_eq!(
            cpu.file_stem(&BenchConfig::quick(), true),
            "cpu-backend-2-threads-cpu-quick-grid"
        );
    }

    /// A second result with the same name gets `-2`, then `-3`; the earlier files stay.
    #[test]
    fn free_stem_skips_names_already_written() {
        let dir = std::env::temp_dir().join(format!("specdec-bench-stem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stem = dir.join("a-vulkan-quick-grid-top-p-0.9");
        assert_eq!(free_stem(&stem), stem);
        std::fs::write(with_ext(&stem, "csv"), "").unwrap();
        let second = free_stem(&stem);
        assert_eq!(second, dir.join("a-vulkan-quick-grid-top-p-0.9-2"));
        std::fs::write(with_ext(&second, "svg"), "").unwrap();
        assert_eq!(
            free_stem(&stem),
            dir.join("a-vulkan-quick-grid-top-p-0.9-3")
        );
        assert!(with_ext(&stem, "csv").ends_with("a-vulkan-quick-grid-top-p-0.9.csv"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Peaked rows are 3.8·N(0, 1) with about one entry in 16,384 raised by exactly 14.
    #[test]
    fn peaked_rows_raise_one_entry_in_16384() {
        let n = 1 << 20;
        let mut peaked = vec![0f32; n];
        BenchRows::Peaked.fill(&mut peaked, 3);
        let mut plain = vec![0f32; n];
        fill_normal(&mut plain, 3, 3.8);
        let raised: Vec<usize> = (0..n).filter(|&i| peaked[i] != plain[i]).collect();
        assert!(
            (32..=128).contains(&raised.len()),
            "{} raised of {n}",
            raised.len()
        );
        assert!(raised.iter().all(|&i| peaked[i] == plain[i] + 14.0));
        let mut normal = vec![0f32; n];
        BenchRows::Normal.fill(&mut normal, 3);
        let mut two = vec![0f32; n];
        fill_normal(&mut two, 3, 2.0);
        assert_eq!(normal, two, "normal rows are 2·N(0, 1)");
        let mut coarse = vec![0f32; n];
        BenchRows::Coarse.fill(&mut coarse, 3);
        assert!(coarse
            .iter()
            .zip(&two)
            .all(|(&c, &t)| c * 4.0 == (c * 4.0).round() && (c - t).abs() <= 0.125));
    }
}

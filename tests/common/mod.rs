//! Shared pieces of the integration tests: the GPU verifier (never skipped silently), seeded
//! input generators, and an owned batch type.
#![allow(dead_code)]

use rand_pcg::rand_core::{Rng, SeedableRng};
use specdec::{
    Draft, Logits, Request, SamplingParams, Verifier, VerifierOptions, VerifyBatch, VerifyOutput,
};
use std::io::Write as _;
use std::sync::OnceLock;

/// The GPU verifier shared by a test binary. No adapter is a test failure, unless
/// `SPECDEC_SKIP_GPU=1` is set, in which case the skip is printed and `None` returned.
///
/// `SPECDEC_TEST_TUNING` ([`test_options`]) builds it with the tuning of discrete GPUs
/// ([`VerifierOptions::with_discrete_tuning`]: the early race, the wide greedy reduction, greedy
/// batches settled and sampled batches verified in row_stats, polled reads), so that a software
/// adapter, which leaves them off by default, runs the code paths a discrete GPU takes.
pub fn gpu() -> Option<&'static Verifier> {
    static GPU: OnceLock<Option<Verifier>> = OnceLock::new();
    GPU.get_or_init(|| {
        if std::env::var("SPECDEC_SKIP_GPU").as_deref() == Ok("1") {
            eprintln!("SKIPPED GPU part: SPECDEC_SKIP_GPU=1");
            return None;
        }
        let made = match std::env::var("SPECDEC_TEST_LIMITS").as_deref() {
            // The strictest limits a WebGPU implementation may give (128 MiB bindings, 256
            // invocations, 16 KiB workgroup storage, 8 storage buffers per stage).
            // Every pipeline built, so validated under those limits, with the verifier.
            Ok("webgpu") => {
                with_limits_built(wgpu::Limits::default(), specdec::PipelineBuild::Eager)
            }
            Ok(other) if !other.is_empty() => {
                panic!("SPECDEC_TEST_LIMITS={other:?}: use webgpu or leave it unset")
            }
            _ => Verifier::new(test_options()),
        };
        match made {
            Ok(v) => {
                let tuning = match std::env::var("SPECDEC_TEST_TUNING") {
                    Ok(t) if !t.is_empty() => format!(" with SPECDEC_TEST_TUNING={t}"),
                    _ => String::new(),
                };
                eprintln!("GPU tests run on {}{tuning}", v.describe());
                Some(v)
            }
            Err(e) => {
                panic!("GPU tests need an adapter (set SPECDEC_SKIP_GPU=1 to skip explicitly): {e}")
            }
        }
    })
    .as_ref()
}

/// A verifier with the tuning of `opts` on [`gpu`]'s device and kernels
/// ([`Verifier::with_tuning`]): a test that varies only options that never change results
/// needs no kernels of its own: each would build its pipelines again (a software adapter takes
/// ~18 s for all of them).
/// `opts` must ask for the default kernels. Panics without a GPU: call [`gpu`] first.
pub fn gpu_tuned(opts: VerifierOptions) -> Verifier {
    gpu()
        .expect("gpu_tuned after gpu() gave a verifier")
        .with_tuning(opts)
        .unwrap()
}

/// The options of [`gpu`]'s verifier, by `SPECDEC_TEST_TUNING`: unset, the defaults;
/// `discrete`, the tuning of discrete GPUs on any adapter; `fused`, that tuning without its size
/// limits, so that every batch that can race early, settle or be verified in row_stats does,
/// the batteries' calls of thousands of rows included (a discrete GPU takes those paths only up
/// to 1,536 chunk partials, which the batteries' calls exceed).
pub fn test_options() -> VerifierOptions {
    let tuned = VerifierOptions::default().with_discrete_tuning();
    match std::env::var("SPECDEC_TEST_TUNING").as_deref() {
        Ok("discrete") => tuned,
        Ok("fused") => VerifierOptions {
            early_race_entries: Some(u64::MAX),
            fused_verify_chunks: Some(u32::MAX),
            ..tuned
        },
        Ok(other) if !other.is_empty() => {
            panic!("SPECDEC_TEST_TUNING={other:?}: use discrete, fused or leave it unset")
        }
        _ => VerifierOptions::default(),
    }
}

/// Whether the tests run with the fused paths at any size (`SPECDEC_TEST_TUNING=fused`): the
/// GPU == twin tests then also run calls that can take them, and require that they did.
pub fn fused_tuning() -> bool {
    std::env::var("SPECDEC_TEST_TUNING").as_deref() == Ok("fused")
}

/// The GPU for a thorough statistical tier: the χ² batteries on the GPU itself, which take
/// minutes on a software adapter. They run with `SPECDEC_THOROUGH=1`; without it the tier is
/// skipped, saying so and how to run it, and `None` is returned. The default tier proves the GPU
/// equal to the CPU twin on the batteries' own requests (see [`twin_differences`]) while the
/// batteries run on the twin: GPU == twin and twin exact imply GPU exact.
pub fn thorough_gpu(test_binary: &str, test: &str) -> Option<&'static Verifier> {
    if std::env::var("SPECDEC_THOROUGH").as_deref() != Ok("1") {
        // Written to the process's stderr handle, not with eprintln!: the test harness captures
        // the print macros of passing tests, and a skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED thorough GPU tier {test_binary}::{test} (χ² on the GPU; the GPU == twin tests \
             stand in for it); run it with SPECDEC_THOROUGH=1 cargo test --release --test \
             {test_binary} -- {test}"
        );
        return None;
    }
    gpu()
}

/// Logprobs of the same tokens from two backends agree: both absent, or equally long and equal
/// to f32 rounding of `exp` / `log` (NaN where either is NaN).
pub fn logprobs_close(a: Option<&[f32]>, b: Option<&[f32]>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| {
                    x.is_nan() && y.is_nan() || (x - y).abs() <= 1e-5 * (1.0 + x.abs())
                })
        }
        _ => false,
    }
}

/// Compares a GPU output with the twin's on the same batch, request by request: emitted tokens,
/// status and seed exactly; logprobs (when asked) to f32 rounding of `exp`/`log`. Returns the
/// requests that differ, each with what differed, for the caller to bound and print.
pub fn twin_differences(gpu: &VerifyOutput, twin: &VerifyOutput) -> Vec<(usize, String)> {
    assert_eq!(
        gpu.num_emitted.len(),
        twin.num_emitted.len(),
        "request count"
    );
    let close = logprobs_close;
    let mut out = Vec::new();
    for r in 0..twin.num_emitted.len() {
        if gpu.emitted(r) != twin.emitted(r) {
            out.push((
                r,
                format!("tokens {:?} vs twin {:?}", gpu.emitted(r), twin.emitted(r)),
            ));
        } else if gpu.status[r] != twin.status[r] || gpu.seeds[r] != twin.seeds[r] {
            out.push((r, "status or seed differ".to_string()));
        } else if !close(gpu.emitted_logprobs(r), twin.emitted_logprobs(r))
            || !close(gpu.emitted_raw_logprobs(r), twin.emitted_raw_logprobs(r))
        {
            out.push((r, "logprobs differ beyond f32 rounding".to_string()));
        }
    }
    out
}

/// Asserts that a GPU output has its twin's tokens, statuses, seeds and logprobs
/// (`twin_differences` empty), naming the case in the failure.
#[track_caller]
pub fn assert_matches_twin(gpu: &VerifyOutput, twin: &VerifyOutput, case: impl std::fmt::Display) {
    let diff = twin_differences(gpu, twin);
    assert!(diff.is_empty(), "{case}: {diff:?}");
}

/// A GPU verifier on a device requested with exactly `limits` (not the adapter's maxima), its
/// pipelines built on demand.
pub fn with_limits(limits: wgpu::Limits) -> Result<Verifier, specdec::Error> {
    with_limits_built(limits, specdec::PipelineBuild::OnDemand)
}

/// [`with_limits`] with the pipelines built as `build` says. `Eager` validates every pipeline
/// under `limits` when the verifier is made (what limits change is pipeline and binding
/// validation), not only those the tests dispatch.
pub fn with_limits_built(
    limits: wgpu::Limits,
    build: specdec::PipelineBuild,
) -> Result<Verifier, specdec::Error> {
    let adapter = specdec::select_adapter()?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("specdec.tests.limits"),
        required_limits: limits,
        ..Default::default()
    }))
    .map_err(|e| specdec::Error::RequestDevice {
        detail: e.to_string(),
    })?;
    let opts = VerifierOptions {
        pipelines: build,
        ..test_options()
    };
    Verifier::with_device(device, queue, opts)
}

/// A CPU verifier mirroring the GPU's default dispatch shape.
pub fn cpu() -> Verifier {
    Verifier::cpu(VerifierOptions::default())
}

/// A small seeded generator for test inputs.
pub struct Gen(pub rand_pcg::Pcg64);

impl Gen {
    pub fn new(seed: u64) -> Self {
        Gen(rand_pcg::Pcg64::seed_from_u64(seed))
    }
    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(1e-300);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// `n` logits drawn as scale·N(0, 1).
    pub fn logits(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (scale * self.normal()) as f32).collect()
    }
    /// Samples an index from (unnormalised) weights.
    pub fn sample(&mut self, w: &[f64]) -> usize {
        let total: f64 = w.iter().sum();
        let mut u = self.unit() * total;
        for (i, &x) in w.iter().enumerate() {
            if u < x {
                return i;
            }
            u -= x;
        }
        w.iter().rposition(|&x| x > 0.0).unwrap_or(0)
    }
}

/// Softmax of `logits / t` in f64.
pub fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// An owned batch.
#[derive(Clone, Debug)]
pub struct Owned {
    pub vocab: u32,
    pub requests: Vec<Request>,
    pub drafts: Vec<i32>,
    pub target: Vec<f32>,
    pub draft_kind: u8, // 0 one-hot, 1 probs, 2 logits
    pub draft: Vec<f32>,
    pub rates: Option<Vec<f32>>,
    /// Draft row length when smaller than `vocab` (None: `vocab`).
    pub draft_vocab: Option<u32>,
}

impl Owned {
    /// Appends `o`'s requests (same vocabulary and draft kind) after this batch's: the GPU's cost
    /// per call is mostly fixed on a software adapter, so the twin tests send few large calls.
    pub fn append(&mut self, o: &Owned) {
        assert_eq!(
            (self.vocab, self.draft_kind, self.draft_vocab),
            (o.vocab, o.draft_kind, o.draft_vocab),
            "appended batches share their shape"
        );
        self.requests.extend(&o.requests);
        self.drafts.extend(&o.drafts);
        self.target.extend(&o.target);
        self.draft.extend(&o.draft);
        match (&mut self.rates, &o.rates) {
            (Some(a), Some(b)) => a.extend(b),
            (None, None) => {}
            _ => panic!("appended batches both have synthetic rates or neither"),
        }
    }

    pub fn batch(&self) -> VerifyBatch<'_> {
        VerifyBatch {
            vocab_size: self.vocab,
            requests: &self.requests,
            draft_token_ids: &self.drafts,
            target_logits: Logits::F32(&self.target),
            draft: match self.draft_kind {
                0 => Draft::OneHot,
                1 => Draft::Probs(Logits::F32(&self.draft)),
                _ => Draft::Logits(Logits::F32(&self.draft)),
            },
            draft_vocab_size: self.draft_vocab,
            synthetic_rates: self.rates.as_deref(),
        }
    }

    /// A random batch like the anchors': logits 2·N(0,1), drafts = argmax w.p. `p_argmax`, else
    /// uniform; `ks` drafts per request; temperatures from `temps` cycled.
    pub fn random(
        g: &mut Gen,
        vocab: u32,
        ks: &[u32],
        temps: &[f32],
        draft_kind: u8,
        p_argmax: f64,
    ) -> Owned {
        let v = vocab as usize;
        let mut requests = Vec::new();
        let mut drafts = Vec::new();
        let mut target = Vec::new();
        let mut draft = Vec::new();
        for (r, &k) in ks.iter().enumerate() {
            let t = temps[r % temps.len()];
            requests.push(Request {
                num_drafts: k,
                params: SamplingParams {
                    temperature: t,
                    seed: Some(g.u64()),
                    ..SamplingParams::default()
                },
                position: g.u64() % 100_000,
            });
            for i in 0..=k {
                let row = g.logits(v, 2.0);
                if i < k {
                    let argmax = row
                        .iter()
                        .enumerate()
                        .fold(
                            (0, f32::NEG_INFINITY),
                            |b, (j, &x)| if x > b.1 { (j, x) } else { b },
                        )
                        .0;
                    let d = if g.unit() < p_argmax {
                        argmax
                    } else {
                        g.below(v)
                    };
                    drafts.push(d as i32);
                    match draft_kind {
                        1 => {
                            let dl = g.logits(v, 2.0);
                            draft.extend(softmax(&dl, 1.0).iter().map(|&x| x as f32));
                        }
                        2 => draft.extend(g.logits(v, 2.0)),
                        _ => {}
                    }
                }
                target.extend(row);
            }
        }
        Owned {
            vocab,
            requests,
            drafts,
            target,
            draft_kind,
            draft,
            rates: None,
            draft_vocab: None,
        }
    }
}

/// Runs `f` on the CPU backend, then on the GPU (unless explicitly skipped).
pub fn each_backend(f: impl Fn(&Verifier)) {
    f(&cpu());
    if let Some(g) = gpu() {
        f(g);
    }
}

/// One explicit request: parameters, drafts, target rows (drafts + 1).
pub type ExplicitRequest = (SamplingParams, Vec<i32>, Vec<Vec<f32>>);

/// Builds a batch from explicit rows: each request is (params, drafts, target rows).
pub fn explicit(vocab: u32, reqs: &[ExplicitRequest]) -> Owned {
    let mut o = Owned {
        vocab,
        requests: Vec::new(),
        drafts: Vec::new(),
        target: Vec::new(),
        draft_kind: 0,
        draft: Vec::new(),
        rates: None,
        draft_vocab: None,
    };
    for (i, (params, drafts, rows)) in reqs.iter().enumerate() {
        assert_eq!(rows.len(), drafts.len() + 1);
        o.requests.push(Request {
            num_drafts: drafts.len() as u32,
            params: *params,
            position: 10 * i as u64,
        });
        o.drafts.extend(drafts);
        for row in rows {
            assert_eq!(row.len(), vocab as usize);
            o.target.extend(row);
        }
    }
    o
}

/// A row of `vocab` logits with the given (index, value) set and `rest` elsewhere.
pub fn row(vocab: usize, rest: f32, set: &[(usize, f32)]) -> Vec<f32> {
    let mut r = vec![rest; vocab];
    for &(i, v) in set {
        r[i] = v;
    }
    r
}

/// The sampling controls of a request, as the tests' sort-based reference reads them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Controls {
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
}

impl Controls {
    pub const OFF: Controls = Controls {
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    };
    pub fn apply(self, p: SamplingParams) -> SamplingParams {
        p.with_top_k(self.top_k)
            .with_top_p(self.top_p)
            .with_min_p(self.min_p)
    }
}

/// The sort-based reference of the controls (`SamplingParams` docs), in f64: min-p, then top-k
/// over what is left, then top-p over the renormalised rest, every cut defined by values (ties
/// kept). Returns the kept mask and whether a cut sits within rounding of its threshold (then a
/// backend working in f32 / fixed point may legitimately decide the other way).
pub fn kept_reference(row: &[f32], t: f64, c: Controls) -> (Vec<bool>, bool) {
    let mut ambiguous = false;
    let m = row
        .iter()
        .filter(|x| !x.is_nan())
        .cloned()
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut kept: Vec<bool> = row.iter().map(|x| x.is_finite()).collect();
    if c.min_p > 0.0 {
        let ln = (c.min_p as f64).ln();
        for (y, k) in kept.iter_mut().enumerate() {
            let z = (row[y] as f64 - m) / t;
            // The maxima pass exactly ((m − m)/T = 0 ≥ ln(min_p)); others may sit on the edge.
            if row[y] as f64 != m && (z - ln).abs() < 1e-5 {
                ambiguous = true;
            }
            *k &= z >= ln;
        }
    }
    if c.top_k > 0 {
        let mut vals: Vec<f32> = (0..row.len())
            .filter(|&y| kept[y])
            .map(|y| row[y])
            .collect();
        if vals.len() > c.top_k as usize {
            vals.sort_by(|a, b| b.partial_cmp(a).unwrap());
            let v = vals[c.top_k as usize - 1];
            for (y, k) in kept.iter_mut().enumerate() {
                *k &= row[y] >= v;
            }
        }
    }
    if c.top_p < 1.0 {
        let w: Vec<f64> = (0..row.len())
            .map(|y| {
                if kept[y] {
                    ((row[y] as f64 - m) / t).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        let goal = c.top_p as f64 * total;
        let mut vals: Vec<f32> = (0..row.len())
            .filter(|&y| kept[y])
            .map(|y| row[y])
            .collect();
        vals.sort_by(|a, b| b.partial_cmp(a).unwrap());
        vals.dedup();
        // What a backend may get wrong: f32 rounding of the goal and of exp, and the 2^-31
        // fixed-point truncation of each entry's mass (relative to the max, as `w` is here).
        let tol = 2e-7 * total + row.len() as f64 * 1e-9;
        let mut cum = 0.0;
        let mut cut = f32::NEG_INFINITY;
        for v in vals {
            let before = cum;
            let group: f64 = (0..row.len())
                .filter(|&y| kept[y] && row[y] == v)
                .map(|y| w[y])
                .sum();
            cum += group;
            if (cum - goal).abs() <= tol || (before - goal).abs() <= tol {
                ambiguous = true;
            }
            if cum >= goal {
                cut = v;
                break;
            }
        }
        for (y, k) in kept.iter_mut().enumerate() {
            *k &= row[y] >= cut;
        }
    }
    (kept, ambiguous)
}

/// The processed distribution of a row: softmax(l / t) over the reference's kept set.
pub fn processed(row: &[f32], t: f64, c: Controls) -> Vec<f64> {
    let (kept, _) = kept_reference(row, t, c);
    let masked: Vec<f32> = row
        .iter()
        .zip(&kept)
        .map(|(&x, &k)| if k { x } else { f32::NEG_INFINITY })
        .collect();
    softmax(&masked, t)
}

/// Requests of one setting, and of all settings of a test, that may differ between `gpu` and the
/// CPU twin in the GPU == twin tests. On Mesa's llvmpipe, the adapter CI runs, the twin is
/// measured bit-exact, so nothing may differ there. Elsewhere SPEC §5 lets `exp`/`log` differ by
/// an ulp, so a decision within rounding of its threshold may go the other way: with the same
/// seeds the two outputs are coupled, and 1 differing request in 1,024 bounds the total variation
/// between the GPU's law and the twin's far below what a χ² battery resolves.
pub fn twin_slack(gpu: &Verifier) -> (usize, usize) {
    if gpu.describe().contains("llvmpipe") {
        (0, 0)
    } else {
        (1, 3)
    }
}

/// Deterministic values in `[-1, 1)` with every 37th one ×8, so blocks have outliers that set
/// their scale (splitmix64).
pub fn outlier_values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|i| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if i % 37 == 0 {
                u * 8.0
            } else {
                u
            }
        })
        .collect()
}

/// The first index where `a` and `b` differ in any bit, with both values.
pub fn first_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .map(|i| (i, a[i], b[i]))
}

/// The fused paths a run took (calls settled / verified in row_stats), printed; with
/// `SPECDEC_TEST_TUNING=fused` the fused verify must have run at least once, so that a run
/// meant to test it cannot pass without reaching it. (No battery is all-greedy, so none can
/// require the greedy settle; `exact` tests that path.)
pub fn assert_fused_verify_taken(g: &Verifier) {
    let (s, v) = (g.fused_greedy_calls(), g.fused_verify_calls());
    // To the stderr handle, not eprintln!: the harness captures the print macros of passing
    // tests, and CI's log should show that the paths were taken.
    let _ = writeln!(
        std::io::stderr(),
        "calls settled in row_stats: {s}, verified in row_stats: {v}"
    );
    if fused_tuning() {
        assert!(v > 0, "no sampled call was verified in row_stats");
    }
}

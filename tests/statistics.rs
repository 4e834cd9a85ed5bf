//! Distribution tests of SPEC §4: both halves of the exactness identity by χ² at an exact
//! quantile, the acceptance rate within 6 standard errors of Σ min(p, q), the emitted-length
//! histogram against P(A ≥ j) = Π β_i, the bonus token against p — each beside a negative
//! control (a deliberately wrong sampler) that the same test rejects.
//!
//! Tiers. The batteries and their negative controls run on the CPU twin, over every draft kind ×
//! control × temperature. On the GPU the default tier proves equality with the twin on the
//! batteries' own requests (`gpu_matches_the_twin_*`), and that the comparison catches an
//! injected fault: GPU == twin and twin exact ⇒ GPU exact. The χ² batteries on the GPU itself
//! (minutes on a software adapter) are the thorough tier, skipped with a printed line unless
//! `SPECDEC_THOROUGH=1`: `SPECDEC_THOROUGH=1 cargo test --release --test statistics`.

mod common;
use common::*;
use specdec::tools::stats::{binomial_z, chi_square_gof, GofOutcome};
use specdec::{
    Fault, Logits, Request, SamplingParams, Verifier, VerifierOptions, VerifyBatch, VerifyOutput,
};

/// Significance of every χ² test: a correct sampler fails one with probability 1e-6.
const ALPHA: f64 = 1e-6;
/// Requests per verify call on the GPU (its cost per call is mostly fixed on a software adapter)
/// and on the twin (whose cost per request grows with the batch: `Plan::logprob_flags` scans
/// every request, once per row). The requests are the same either way: `run` draws them from
/// one generator with no draws between calls, and a request's tokens do not depend on its batch.
const REQUESTS_PER_CALL: usize = 8192;
const TWIN_REQUESTS_PER_CALL: usize = 512;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    OneHot,
    Probs,
    Logits,
}

/// A fixed verification problem: k + 1 target rows, k draft rows, a temperature.
struct Problem {
    vocab: usize,
    k: usize,
    temperature: f32,
    mode: Mode,
    target: Vec<Vec<f32>>,
    /// Probabilities (Probs) or logits (Logits) of each draft row; for OneHot, unused.
    draft: Vec<Vec<f32>>,
    /// For OneHot: the fixed drafted tokens.
    fixed: Vec<i32>,
    /// Top-k / top-p / min-p of every request (applied to the target rows and draft logits).
    controls: Controls,
}

impl Problem {
    fn new(mode: Mode, k: usize, temperature: f32, controls: Controls, seed: u64) -> Problem {
        let vocab = 6;
        let mut g = Gen::new(seed);
        // Logits drawn at scale 1.5·T: every temperature then sees a comparably spread p (the
        // kernels still divide by T), so the controls cut something at each of them.
        let scale = 1.5 * f64::from(temperature).max(0.1);
        let target: Vec<Vec<f32>> = (0..=k).map(|_| g.logits(vocab, scale)).collect();
        // Draft logits near the target's (a draft model that mostly agrees), so acceptances and
        // rejections both happen at every temperature.
        let draft: Vec<Vec<f32>> = (0..k)
            .map(|i| {
                let l: Vec<f32> = target[i]
                    .iter()
                    .map(|&x| x + (0.5 * scale * g.normal()) as f32)
                    .collect();
                // Draft probabilities are taken as given (the drafter's own, unfiltered
                // distribution); draft logits get the request's controls like the target.
                if mode == Mode::Probs {
                    processed(&l, f64::from(temperature), Controls::OFF)
                        .iter()
                        .map(|&x| x as f32)
                        .collect()
                } else {
                    l
                }
            })
            .collect();
        // One-hot drafts: the second most likely token at row 0 when it is not rare (rejections
        // are common), else the most likely; the most likely one after it (so every draft is
        // accepted often enough to see the bonus).
        let fixed = target
            .iter()
            .take(k)
            .enumerate()
            .map(|(i, row)| {
                let p = processed(row, temperature as f64, controls);
                let mut idx: Vec<usize> = (0..vocab).collect();
                idx.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
                let second = i == 0 && p[idx[1]] >= 0.1;
                idx[usize::from(second)] as i32
            })
            .collect();
        Problem {
            vocab,
            k,
            temperature,
            mode,
            target,
            draft,
            fixed,
            controls,
        }
    }
    /// Target distribution p_i (f64), after the controls (sort-based reference).
    fn p(&self, i: usize) -> Vec<f64> {
        processed(&self.target[i], self.temperature as f64, self.controls)
    }
    /// Draft distribution q_i (f64).
    fn q(&self, i: usize) -> Vec<f64> {
        match self.mode {
            Mode::OneHot => (0..self.vocab)
                .map(|y| f64::from(y as i32 == self.fixed[i]))
                .collect(),
            // A draft row shorter than the vocabulary (a smaller draft vocabulary): q = 0 past it.
            Mode::Probs => {
                let s: f64 = self.draft[i].iter().map(|&x| x as f64).sum();
                let mut q: Vec<f64> = self.draft[i].iter().map(|&x| x as f64 / s).collect();
                q.resize(self.vocab, 0.0);
                q
            }
            Mode::Logits => {
                let mut q = processed(&self.draft[i], self.temperature as f64, self.controls);
                q.resize(self.vocab, 0.0);
                q
            }
        }
    }
    /// β_i = Σ min(p_i, q_i).
    fn beta(&self, i: usize) -> f64 {
        self.p(i).iter().zip(self.q(i)).map(|(a, b)| a.min(b)).sum()
    }
}

/// One trial: the drafts proposed and the tokens emitted.
struct Trial {
    drafts: Vec<i32>,
    emitted: Vec<i32>,
}

/// The data of one verify call: `r` trials of a problem.
struct Call {
    requests: Vec<Request>,
    drafts: Vec<i32>,
    target: Vec<f32>,
    draft: Vec<f32>,
}

impl Call {
    /// `r` trials of `pb` (drafts sampled from `qs`, one seed per trial), drawn from `g`.
    fn new(pb: &Problem, qs: &[Vec<f64>], r: usize, g: &mut Gen) -> Call {
        let mut c = Call {
            requests: Vec::with_capacity(r),
            drafts: Vec::with_capacity(r * pb.k),
            target: Vec::with_capacity(r * (pb.k + 1) * pb.vocab),
            draft: Vec::new(),
        };
        for _ in 0..r {
            c.requests.push(Request {
                num_drafts: pb.k as u32,
                params: pb
                    .controls
                    .apply(SamplingParams::seeded(pb.temperature, g.u64())),
                position: g.u64() % 1_000_000,
            });
            for (i, q) in qs.iter().enumerate() {
                c.drafts.push(if pb.mode == Mode::OneHot {
                    pb.fixed[i]
                } else {
                    g.sample(q) as i32
                });
                if pb.mode != Mode::OneHot {
                    c.draft.extend_from_slice(&pb.draft[i]);
                }
            }
            for row in &pb.target {
                c.target.extend_from_slice(row);
            }
        }
        c
    }

    fn batch<'a>(&'a self, pb: &Problem) -> VerifyBatch<'a> {
        VerifyBatch {
            vocab_size: pb.vocab as u32,
            requests: &self.requests,
            draft_token_ids: &self.drafts,
            target_logits: Logits::F32(&self.target),
            draft: match pb.mode {
                Mode::OneHot => specdec::Draft::OneHot,
                Mode::Probs => specdec::Draft::Probs(Logits::F32(&self.draft)),
                Mode::Logits => specdec::Draft::Logits(Logits::F32(&self.draft)),
            },
            draft_vocab_size: pb
                .draft
                .first()
                .filter(|row| row.len() < pb.vocab)
                .map(|row| row.len() as u32),
            synthetic_rates: None,
        }
    }
}

/// Runs `n` independent trials of the problem (drafts sampled from q, one seed per trial).
fn run(v: &Verifier, pb: &Problem, n: usize, seed: u64) -> Vec<Trial> {
    let mut g = Gen::new(seed);
    let qs: Vec<Vec<f64>> = (0..pb.k).map(|i| pb.q(i)).collect();
    let mut trials = Vec::with_capacity(n);
    while trials.len() < n {
        let per_call = if v.is_gpu() {
            REQUESTS_PER_CALL
        } else {
            TWIN_REQUESTS_PER_CALL
        };
        let r = per_call.min(n - trials.len());
        let call = Call::new(pb, &qs, r, &mut g);
        let out = v.verify_blocking(&call.batch(pb)).expect("verify");
        for i in 0..r {
            trials.push(Trial {
                drafts: call.drafts[i * pb.k..(i + 1) * pb.k].to_vec(),
                emitted: out.emitted(i).to_vec(),
            });
        }
    }
    trials
}

/// The outcome of every check on one run.
struct Checks {
    halves: GofOutcome,
    acceptance_z: f64,
    lengths: GofOutcome,
    /// None when no trial accepted every draft.
    bonus: Option<GofOutcome>,
}

impl Checks {
    fn all_pass(&self) -> bool {
        self.halves.passed()
            && self.acceptance_z.abs() <= 6.0
            && self.lengths.passed()
            && self.bonus.is_some_and(|b| b.passed())
    }
}

fn check(pb: &Problem, trials: &[Trial]) -> Checks {
    let v = pb.vocab;
    let (p0, q0) = (pb.p(0), pb.q(0));
    // Position 0, both halves: cells (accepted, y) and (rejected, y).
    let mut cells = vec![0u64; 2 * v];
    let mut accepted0 = 0u64;
    let mut lengths = vec![0u64; pb.k + 1];
    let mut bonus = vec![0u64; v];
    for t in trials {
        let a = t.emitted.len() - 1;
        lengths[a] += 1;
        let y = t.emitted[0] as usize;
        if a >= 1 {
            assert_eq!(
                t.emitted[0], t.drafts[0],
                "an accepted token must be the draft"
            );
            accepted0 += 1;
            cells[y] += 1;
        } else {
            cells[v + y] += 1;
        }
        if a == pb.k {
            bonus[t.emitted[pb.k] as usize] += 1;
        }
        for (i, &tok) in t.emitted.iter().enumerate().take(a) {
            assert_eq!(tok, t.drafts[i]);
        }
    }
    let mut expected: Vec<f64> = (0..v).map(|y| p0[y].min(q0[y])).collect();
    expected.extend((0..v).map(|y| (p0[y] - q0[y]).max(0.0)));
    let halves = chi_square_gof(&cells, &expected, ALPHA);
    let beta0 = pb.beta(0);
    let acceptance_z = binomial_z(accepted0, trials.len() as u64, beta0);
    // P(A = j) = Π_{i<j} β_i · (1 − β_j), P(A = k) = Π β_i.
    let betas: Vec<f64> = (0..pb.k).map(|i| pb.beta(i)).collect();
    let mut len_probs = Vec::new();
    let mut prefix = 1.0;
    for b in &betas {
        len_probs.push(prefix * (1.0 - b));
        prefix *= b;
    }
    len_probs.push(prefix);
    let lengths = chi_square_gof(&lengths, &len_probs, ALPHA);
    let bonus = (bonus.iter().sum::<u64>() > 0).then(|| chi_square_gof(&bonus, &pb.p(pb.k), ALPHA));
    Checks {
        halves,
        acceptance_z,
        lengths,
        bonus,
    }
}

fn with_fault(base: Option<&Verifier>, fault: Fault) -> Option<Verifier> {
    let opts = VerifierOptions {
        fault,
        ..VerifierOptions::default()
    };
    match base {
        None => Some(Verifier::cpu(opts)),
        Some(v) => Some(v.with_tuning(opts).expect("second GPU verifier")),
    }
}

/// The full battery for one mode on one backend (`gpu = None` means the CPU backend).
fn battery(
    mode: Mode,
    temperature: f32,
    controls: Controls,
    gpu: Option<&Verifier>,
    n: usize,
    seed: u64,
) {
    let pb = Problem::new(mode, 2, temperature, controls, seed);
    let cpu_v = cpu();
    let v = gpu.unwrap_or(&cpu_v);
    let good = check(&pb, &run(v, &pb, n, seed ^ 1));
    println!(
        "{mode:?} T={temperature} {controls:?} on {}: β0={:.4}\n  halves {}\n  acceptance z = {:.2}\n  lengths {}\n  bonus {}",
        v.describe(),
        pb.beta(0),
        good.halves,
        good.acceptance_z,
        good.lengths,
        good.bonus.map_or("none observed".to_string(), |b| b.to_string())
    );
    assert!(good.halves.passed(), "halves: {}", good.halves);
    assert!(
        good.acceptance_z.abs() <= 6.0,
        "acceptance z {}",
        good.acceptance_z
    );
    assert!(good.lengths.passed(), "lengths: {}", good.lengths);
    let bonus = good.bonus.expect("some trials accept every draft");
    assert!(bonus.passed(), "bonus: {bonus}");

    // Negative control 1: always reject and sample from p — the marginal is right, the halves
    // and the acceptance are not.
    let bad_v = with_fault(gpu, Fault::RejectAllFromTarget).unwrap();
    let bad = check(&pb, &run(&bad_v, &pb, n, seed ^ 2));
    println!(
        "  control reject-all: halves {} | z {:.1} | lengths {}",
        bad.halves, bad.acceptance_z, bad.lengths
    );
    assert!(
        !bad.halves.passed(),
        "the halves test must reject an always-reject sampler"
    );
    assert!(
        bad.acceptance_z.abs() > 6.0,
        "the acceptance test must reject an always-reject sampler"
    );
    assert!(
        !bad.lengths.passed(),
        "the length test must reject an always-reject sampler"
    );
    assert!(!bad.all_pass());

    // Negative control 3 (controls only): a sampler that ignores the controls, checked against
    // the processed distributions, must fail. The control must matter on this problem.
    if controls != Controls::OFF {
        let plain = softmax(&pb.target[0], f64::from(temperature));
        let tv: f64 = 0.5
            * pb.p(0)
                .iter()
                .zip(&plain)
                .map(|(a, b)| (a - b).abs())
                .sum::<f64>();
        // n·TV draws land on cut tokens under the wrong sampler: each one fails the test.
        assert!(
            tv * n as f64 > 50.0,
            "{controls:?} barely changes p at T={temperature} (TV {tv:.5})"
        );
        let unfiltered = Problem {
            controls: Controls::OFF,
            target: pb.target.clone(),
            draft: pb.draft.clone(),
            fixed: pb.fixed.clone(),
            ..pb
        };
        let ignored = check(&pb, &run(v, &unfiltered, n, seed ^ 6));
        println!(
            "  control ignores-controls: halves {} | lengths {}",
            ignored.halves, ignored.lengths
        );
        assert!(
            !ignored.all_pass(),
            "the battery must reject a sampler that ignores {controls:?}"
        );
    }
}

/// The problem of [`shared_noise_control`]: the residual max(p − q, 0) splits evenly between
/// tokens 0 and 4.
fn shared_noise_problem() -> Problem {
    let p = [0.3f64, 0.2, 0.15, 0.05, 0.25, 0.05];
    let q = [0.1f32, 0.25, 0.2, 0.05, 0.05, 0.35];
    let ln_p: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
    Problem {
        vocab: 6,
        k: 1,
        temperature: 1.0,
        mode: Mode::Probs,
        target: vec![ln_p.clone(), ln_p],
        draft: vec![q.to_vec()],
        fixed: vec![0],
        controls: Controls::OFF,
    }
}

/// Negative control 2: residual noise shared with the accept draw. The problem is built so the
/// correlation shows: the residual max(p − q, 0) splits evenly between tokens 0 and 4, and the
/// likely rejections happen at large u, which (shared bits) makes token 0's noise large.
fn shared_noise_control(gpu: Option<&Verifier>, n: usize, seed: u64) {
    let pb = shared_noise_problem();
    let good = check(&pb, &run(&cpu(), &pb, n, seed ^ 4));
    assert!(
        good.halves.passed(),
        "the correct sampler passes this problem: {}",
        good.halves
    );
    let bad_v = with_fault(gpu, Fault::SharedNoise).unwrap();
    let bad = check(&pb, &run(&bad_v, &pb, n, seed ^ 3));
    println!(
        "control shared-noise on {}: halves {}",
        bad_v.describe(),
        bad.halves
    );
    assert!(
        !bad.halves.passed(),
        "the halves test must reject shared noise: {}",
        bad.halves
    );
}

const N_CPU: usize = 60_000;
const N_GPU: usize = 40_000;

#[test]
fn one_hot_cpu() {
    battery(Mode::OneHot, 1.0, Controls::OFF, None, N_CPU, 11);
    battery(Mode::OneHot, 0.5, Controls::OFF, None, N_CPU, 12);
}

#[test]
fn draft_probs_cpu() {
    battery(Mode::Probs, 1.0, Controls::OFF, None, N_CPU, 21);
    shared_noise_control(None, N_CPU, 22);
}

#[test]
fn draft_logits_cpu() {
    battery(Mode::Logits, 1.0, Controls::OFF, None, N_CPU, 31);
    battery(Mode::Logits, 2.0, Controls::OFF, None, N_CPU, 32);
}

#[test]
fn one_hot_gpu() {
    let Some(g) = thorough_gpu("statistics", "one_hot_gpu") else {
        return;
    };
    battery(Mode::OneHot, 1.0, Controls::OFF, Some(g), N_GPU, 41);
}

#[test]
fn draft_probs_gpu() {
    let Some(g) = thorough_gpu("statistics", "draft_probs_gpu") else {
        return;
    };
    battery(Mode::Probs, 1.0, Controls::OFF, Some(g), N_GPU, 51);
    shared_noise_control(Some(g), N_GPU, 52);
}

#[test]
fn draft_logits_gpu() {
    let Some(g) = thorough_gpu("statistics", "draft_logits_gpu") else {
        return;
    };
    battery(Mode::Logits, 0.7, Controls::OFF, Some(g), N_GPU, 61);
}

/// A draft vocabulary smaller than the target's (V = 8, V_draft = 6): tokens 6 and 7 have q = 0,
/// so they are only ever emitted as recovered tokens.
fn padded_problem(mode: Mode, seed: u64) -> Problem {
    let mut g = Gen::new(seed);
    let target: Vec<Vec<f32>> = (0..3).map(|_| g.logits(8, 1.2)).collect();
    let draft: Vec<Vec<f32>> = (0..2)
        .map(|_| {
            let l = g.logits(6, 1.2);
            if mode == Mode::Probs {
                softmax(&l, 1.0).iter().map(|&x| x as f32).collect()
            } else {
                l
            }
        })
        .collect();
    Problem {
        vocab: 8,
        k: 2,
        temperature: 1.0,
        mode,
        target,
        draft,
        fixed: vec![0, 0],
        controls: Controls::OFF,
    }
}

/// On [`padded_problem`] both halves, the acceptance and the lengths must still hold.
fn padded_vocab(gpu: Option<&Verifier>, mode: Mode, seed: u64) {
    let pb = padded_problem(mode, seed);
    let cpu_v = cpu();
    let v = gpu.unwrap_or(&cpu_v);
    let c = check(
        &pb,
        &run(v, &pb, if gpu.is_some() { N_GPU } else { N_CPU }, seed ^ 5),
    );
    println!(
        "{mode:?} V=8, V_draft=6 on {}: halves {} | z {:.2} | lengths {}",
        v.describe(),
        c.halves,
        c.acceptance_z,
        c.lengths
    );
    assert!(c.halves.passed() && c.acceptance_z.abs() <= 6.0 && c.lengths.passed());
}

#[test]
fn smaller_draft_vocabulary_cpu() {
    padded_vocab(None, Mode::Probs, 71);
    padded_vocab(None, Mode::Logits, 72);
}

#[test]
fn smaller_draft_vocabulary_gpu() {
    let Some(g) = thorough_gpu("statistics", "smaller_draft_vocabulary_gpu") else {
        return;
    };
    padded_vocab(Some(g), Mode::Probs, 73);
    padded_vocab(Some(g), Mode::Logits, 74);
}

/// The three controls the grids use on V = 6 rows: each cuts something at every temperature.
const TOP_K: Controls = Controls {
    top_k: 2,
    top_p: 1.0,
    min_p: 0.0,
};
const TOP_P: Controls = Controls {
    top_k: 0,
    top_p: 0.6,
    min_p: 0.0,
};
const MIN_P: Controls = Controls {
    top_k: 0,
    top_p: 1.0,
    min_p: 0.3,
};

/// Every rule × {plain, top-k, top-p, min-p} × T ∈ {0.3, 1, 2} on the CPU twin: both halves,
/// acceptance, lengths and bonus, with the reject-all and ignores-the-controls negative controls.
fn controls_grid(mode: Mode, seed: u64) {
    for (i, c) in [Controls::OFF, TOP_K, TOP_P, MIN_P].into_iter().enumerate() {
        for (j, t) in [0.3f32, 1.0, 2.0].into_iter().enumerate() {
            battery(mode, t, c, None, N_CPU, seed + 10 * i as u64 + j as u64);
        }
    }
}

#[test]
fn controls_grid_one_hot_cpu() {
    controls_grid(Mode::OneHot, 1000);
}

#[test]
fn controls_grid_draft_probs_cpu() {
    controls_grid(Mode::Probs, 2000);
}

#[test]
fn controls_grid_draft_logits_cpu() {
    controls_grid(Mode::Logits, 3000);
}

/// On the GPU each control once per draft kind, across the temperatures (lavapipe runs these
/// slowly; the full grid runs on the twin, which the GPU matches bit for bit elsewhere).
#[test]
fn controls_gpu() {
    let Some(g) = thorough_gpu("statistics", "controls_gpu") else {
        return;
    };
    battery(Mode::OneHot, 0.3, TOP_K, Some(g), N_GPU / 2, 4001);
    battery(Mode::Probs, 1.0, TOP_P, Some(g), N_GPU / 2, 4002);
    battery(Mode::Logits, 2.0, MIN_P, Some(g), N_GPU / 2, 4003);
}

// ---------------------------------------------------------------------------------------------
// GPU == twin on the batteries' own requests: what the default tier runs on the GPU.
// ---------------------------------------------------------------------------------------------

/// Trials per setting in the GPU == twin tests: the first half exactly as `run` builds them, the
/// second with every other request also asking for logprobs (raw ones on half of those); and
/// settings per verify call (the GPU's cost per call is mostly fixed on a software adapter).
const N_TWIN: usize = 1024;
const SETTINGS_PER_CALL: usize = 2;

/// `N_TWIN` trials of `pb` drawn like a battery's (see `N_TWIN`).
fn twin_call(pb: &Problem, seed: u64) -> Call {
    let mut g = Gen::new(seed);
    let qs: Vec<Vec<f64>> = (0..pb.k).map(|i| pb.q(i)).collect();
    let mut call = Call::new(pb, &qs, N_TWIN / 2, &mut g);
    let asking = Call::new(pb, &qs, N_TWIN / 2, &mut g);
    for (i, r) in asking.requests.iter().enumerate() {
        call.requests.push(if i % 2 == 1 {
            Request {
                params: r.params.with_logprobs(i % 4 == 3),
                ..*r
            }
        } else {
            *r
        });
    }
    call.drafts.extend(asking.drafts);
    call.target.extend(asking.target);
    call.draft.extend(asking.draft);
    call
}

impl Call {
    /// The same trials, none asking for logprobs.
    fn without_logprobs(&self) -> Call {
        Call {
            requests: (self.requests.iter())
                .map(|r| Request {
                    params: SamplingParams {
                        logprobs: false,
                        raw_logprobs: false,
                        ..r.params
                    },
                    ..*r
                })
                .collect(),
            drafts: self.drafts.clone(),
            target: self.target.clone(),
            draft: self.draft.clone(),
        }
    }

    /// Appends `o`'s trials (of a problem of the same shape).
    fn append(&mut self, o: Call) {
        self.requests.extend(o.requests);
        self.drafts.extend(o.drafts);
        self.target.extend(o.target);
        self.draft.extend(o.draft);
    }
}

/// The outputs of `call` on `v` (every trial's shape as `pb`'s).
fn output(v: &Verifier, pb: &Problem, call: &Call) -> VerifyOutput {
    let out = v.verify_blocking(&call.batch(pb)).expect("verify");
    assert!(
        out.logprobs.is_some() && out.raw_logprobs.is_some(),
        "the second half asks for logprobs"
    );
    out
}

/// The problem's label in a report.
fn label(pb: &Problem) -> String {
    format!(
        "{:?} T={} {:?} V={} k={}",
        pb.mode, pb.temperature, pb.controls, pb.vocab, pb.k
    )
}

/// Problems of one shape (vocabulary, drafts, draft kind and rows' length) share a call.
fn same_shape(a: &Problem, b: &Problem) -> bool {
    (a.vocab, a.k, a.mode, a.draft.first().map(Vec::len))
        == (b.vocab, b.k, b.mode, b.draft.first().map(Vec::len))
}

/// Every battery setting of this file (draft kind × {plain, top-k, top-p, min-p} × T ∈ {0.3, 1,
/// 2}, the smaller draft vocabulary, the shared-noise problem) on the GPU and on the twin: the
/// same requests give the same tokens, statuses and seeds, and logprobs equal to f32 rounding.
/// The χ² batteries then run on the twin, which is exact: GPU == twin and twin exact ⇒ GPU
/// exact, on thousands of requests instead of minutes of GPU sampling.
#[test]
fn gpu_matches_the_twin_on_every_battery_setting() {
    let Some(g) = gpu() else { return };
    let twin = cpu();
    let mut problems = Vec::new();
    for (m, mode) in [Mode::OneHot, Mode::Probs, Mode::Logits]
        .into_iter()
        .enumerate()
    {
        for (i, c) in [Controls::OFF, TOP_K, TOP_P, MIN_P].into_iter().enumerate() {
            for (j, t) in [0.3f32, 1.0, 2.0].into_iter().enumerate() {
                let seed = 5000 + 100 * m as u64 + 10 * i as u64 + j as u64;
                problems.push((Problem::new(mode, 2, t, c, seed), seed));
            }
        }
    }
    problems.push((padded_problem(Mode::Probs, 73), 73));
    problems.push((padded_problem(Mode::Logits, 74), 74));
    problems.push((shared_noise_problem(), 52));
    // Problems of one shape, SETTINGS_PER_CALL at a time, in one call.
    let mut calls: Vec<(Call, Vec<&Problem>)> = Vec::new();
    for (pb, seed) in &problems {
        let call = twin_call(pb, seed ^ 7);
        match calls.last_mut() {
            Some((c, pbs)) if pbs.len() < SETTINGS_PER_CALL && same_shape(pbs[0], pb) => {
                c.append(call);
                pbs.push(pb);
            }
            _ => calls.push((call, vec![pb])),
        }
    }
    // With the fused paths on at any size (`SPECDEC_TEST_TUNING=fused`), every call a second
    // time without logprobs: a batch that asks for them is never verified in row_stats.
    let passes: &[bool] = if common::fused_tuning() {
        &[true, false]
    } else {
        &[true]
    };
    let (mut total, mut worst, mut report) = (0, 0, Vec::new());
    for (&logprobs, (call, pbs)) in passes
        .iter()
        .flat_map(|l| calls.iter().map(move |c| (l, c)))
    {
        let differ = if logprobs {
            twin_differences(&output(g, pbs[0], call), &output(&twin, pbs[0], call))
        } else {
            let call = call.without_logprobs();
            let batch = call.batch(pbs[0]);
            let got = g.verify_blocking(&batch).expect("GPU");
            twin_differences(&got, &twin.verify_blocking(&batch).expect("twin"))
        };
        let mut per = vec![0usize; pbs.len()];
        for (r, what) in differ {
            per[r / N_TWIN] += 1;
            report.push(format!(
                "{}{} request {}: {what}",
                label(pbs[r / N_TWIN]),
                if logprobs { "" } else { " (no logprobs)" },
                r % N_TWIN
            ));
        }
        total += per.iter().sum::<usize>();
        worst = worst.max(per.into_iter().max().unwrap_or(0));
    }
    println!(
        "{} vs the twin: {} settings × {N_TWIN} battery requests × {} passes, {total} requests \
         differ",
        g.describe(),
        problems.len(),
        passes.len()
    );
    for line in &report {
        println!("  {line}");
    }
    common::assert_fused_verify_taken(g);
    let (per_setting, in_all) = common::twin_slack(g);
    assert!(
        total <= in_all && worst <= per_setting,
        "the GPU differs from the twin:\n{}",
        report.join("\n")
    );
}

/// The comparison has teeth, and the negative controls' samplers agree too: a GPU verifier with
/// an injected fault equals the twin with the same fault on every draft kind, and differs from
/// the correct twin on many requests.
#[test]
fn gpu_matches_the_twin_under_each_fault_and_the_comparison_catches_a_fault() {
    let Some(g) = gpu() else { return };
    let twin = cpu();
    for fault in [Fault::RejectAllFromTarget, Fault::SharedNoise] {
        let bad_gpu = with_fault(Some(g), fault).unwrap();
        let bad_twin = with_fault(None, fault).unwrap();
        for (m, mode) in [Mode::OneHot, Mode::Probs, Mode::Logits]
            .into_iter()
            .enumerate()
        {
            // No controls: every row keeps several tokens, so the residual noise matters.
            let pb = Problem::new(mode, 2, 1.0, Controls::OFF, 6100 + m as u64);
            let call = twin_call(&pb, 6200 + m as u64);
            let bad = output(&bad_gpu, &pb, &call);
            let same = twin_differences(&bad, &output(&bad_twin, &pb, &call));
            assert!(
                same.len() <= common::twin_slack(g).0,
                "{fault:?} {mode:?}: {same:?}"
            );
            let caught = twin_differences(&bad, &output(&twin, &pb, &call)).len();
            println!(
                "{fault:?} {mode:?}: the faulty GPU differs from the correct twin on {caught} of \
                 {N_TWIN} requests"
            );
            assert!(
                caught * 20 >= N_TWIN,
                "{fault:?} {mode:?}: the comparison must catch the fault ({caught} of {N_TWIN})"
            );
        }
    }
}

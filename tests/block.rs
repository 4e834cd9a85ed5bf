//! Block verification (SPEC §3 rule 5): exactness per position — every position's
//! token, completed with fresh target draws where the step stopped, follows p_i, and pairs of
//! positions follow p_i × p_j — on both backends, beside the standard rule on the same inputs;
//! the mean accepted length of both against its exact value (with one-hot drafts both rules
//! reach the same optimum, Σ_j Π_{i≤j} p_i(d_i); with a draft distribution the block rule's is
//! computed by enumerating every draft sequence, and it is higher); a wrong residual that the
//! same tests reject; greedy requests unaffected. With draft probabilities and draft logits the
//! exactness battery covers every control × temperature on the twin.
//!
//! Tiers. The χ² batteries and their negative controls run on the CPU twin; on the GPU the
//! default tier proves equality with the twin on the batteries' own requests
//! (`*_matches_the_twin_*`), which catches an injected fault: GPU == twin and twin exact ⇒ GPU
//! exact. The χ² batteries on the GPU itself (minutes on a software adapter) are the thorough
//! tier, skipped with a printed line unless `SPECDEC_THOROUGH=1`:
//! `SPECDEC_THOROUGH=1 cargo test --release --test block`.

mod common;
use common::*;
use specdec::tools::stats::chi_square_gof;
use specdec::{Fault, Rule, SamplingParams, Verifier, VerifierOptions};
use std::fmt::Write as _;

const ALPHA: f64 = 1e-6;
const V: usize = 5;
const K: usize = 3;

/// The one-hot problem: the rows of [`dist_problem`] with the fixed drafts
/// [`ONE_HOT_DRAFTS`], tokens of moderate probability, so rejections are common and the block
/// rule has something to rescue.
fn problem() -> (Vec<Vec<f32>>, Vec<i32>) {
    (
        dist_problem().0,
        ONE_HOT_DRAFTS.iter().map(|&d| d as i32).collect(),
    )
}

/// The one-hot problem as a [`Setting`]: T = 1, no controls.
const ONE_HOT: Setting = Setting {
    kind: 0,
    t: 1.0,
    c: Controls::OFF,
};

struct Run {
    /// Tokens of every position 0..=K: emitted ones, then fresh draws from p_i.
    seqs: Vec<[usize; K + 1]>,
    accepted: Vec<usize>,
}

/// `n` steps of `rule` on the one-hot problem.
fn run(v: &Verifier, rule: Rule, n: usize, seed: u64) -> Run {
    run_dist(v, rule, ONE_HOT, n, seed)
}

/// Every position's marginal and the pairs (0, 1), (1, 2), (0, 3) against the product law
/// of the one-hot problem at T = 1.
fn exact(r: &Run) -> Result<(), String> {
    exact_against(r, &ONE_HOT.ps())
}

/// Every position's marginal against `ps[i]` and the pairs (0, 1), (1, 2), (0, 3) against the
/// product law.
fn exact_against(r: &Run, ps: &[Vec<f64>]) -> Result<(), String> {
    for i in 0..=K {
        let mut c = vec![0u64; V];
        for s in &r.seqs {
            c[s[i]] += 1;
        }
        let t = chi_square_gof(&c, &ps[i], ALPHA);
        if !t.passed() {
            return Err(format!("position {i}: {t}"));
        }
    }
    for (a, b) in [(0, 1), (1, 2), (0, 3)] {
        let mut c = vec![0u64; V * V];
        for s in &r.seqs {
            c[s[a] * V + s[b]] += 1;
        }
        let e: Vec<f64> = (0..V * V).map(|x| ps[a][x / V] * ps[b][x % V]).collect();
        let t = chi_square_gof(&c, &e, ALPHA);
        if !t.passed() {
            return Err(format!("pair ({a}, {b}): {t}"));
        }
    }
    Ok(())
}

fn mean(x: &[usize]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().sum::<usize>() as f64 / n;
    let var = x.iter().map(|&a| (a as f64 - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, (var / n).sqrt())
}

fn battery(v: &Verifier, bad: &Verifier, n: usize, seed: u64) {
    let block = run(v, Rule::Block, n, seed);
    let standard = run(v, Rule::Exact, n, seed + 1);
    exact(&block).unwrap_or_else(|e| panic!("{}: block rule not exact: {e}", v.describe()));
    exact(&standard).unwrap_or_else(|e| panic!("{}: standard rule: {e}", v.describe()));
    let (mb, sb) = mean(&block.accepted);
    let (ms, ss) = mean(&standard.accepted);
    println!(
        "{}: mean accepted drafts (k = {K}) block {mb:.4} ± {sb:.4}, standard {ms:.4} ± {ss:.4} \
         ({n} trials each)",
        v.describe()
    );
    // With one-hot drafts the most any rule can accept is the chance that the target would
    // produce the drafts itself: E[accepted] = Σ_j Π_{i<=j} p_i(d_i) for both rules (the block
    // rule gains only with a draft distribution). Both must sit on it; block never below.
    let (rows, drafts) = problem();
    let mut want = 0.0;
    let mut prod = 1.0;
    for i in 0..K {
        prod *= softmax(&rows[i], 1.0)[drafts[i] as usize];
        want += prod;
    }
    for (name, m, se) in [("block", mb, sb), ("standard", ms, ss)] {
        let z = (m - want) / se;
        assert!(z.abs() < 6.0, "{name} mean {m} vs exact {want} (z {z:.1})");
    }
    assert!(
        mb > ms - 4.0 * (sb * sb + ss * ss).sqrt(),
        "block below standard: {mb} vs {ms}"
    );
    // Negative control: the block decision with the token after it drawn from p, not from the
    // residual. The same exactness test must reject it.
    let wrong = run(bad, Rule::Block, n, seed + 2);
    let e = exact(&wrong);
    println!("  control residual-from-p: {e:?}");
    assert!(
        e.is_err(),
        "the exactness test must reject a block sampler with the wrong residual"
    );
}

fn faulty(gpu: bool) -> Verifier {
    let opts = VerifierOptions {
        fault: Fault::RejectAllFromTarget,
        ..VerifierOptions::default()
    };
    if gpu {
        gpu_tuned(opts)
    } else {
        Verifier::cpu(opts)
    }
}

#[test]
fn block_is_exact_at_the_optimum_cpu() {
    battery(&cpu(), &faulty(false), 60_000, 1);
}

#[test]
fn block_is_exact_at_the_optimum_gpu() {
    let Some(g) = thorough_gpu("block", "block_is_exact_at_the_optimum_gpu") else {
        return;
    };
    battery(g, &faulty(true), 24_000, 2);
}

#[test]
fn block_requests_are_deterministic_and_greedy_ignores_the_rule() {
    let (rows, drafts) = problem();
    each_backend(|v| {
        let greedy = SamplingParams {
            rule: Rule::Block,
            ..SamplingParams::greedy()
        };
        let b = explicit(V as u32, &[(greedy, drafts.clone(), rows.clone())]);
        let plain = explicit(
            V as u32,
            &[(SamplingParams::greedy(), drafts.clone(), rows.clone())],
        );
        assert_eq!(
            v.verify_blocking(&b.batch()).unwrap().tokens,
            v.verify_blocking(&plain.batch()).unwrap().tokens
        );
        let s = SamplingParams {
            rule: Rule::Block,
            ..SamplingParams::seeded(1.0, 9)
        };
        let b = explicit(V as u32, &[(s, drafts.clone(), rows.clone())]);
        assert_eq!(
            v.verify_blocking(&b.batch()).unwrap(),
            v.verify_blocking(&b.batch()).unwrap()
        );
    });
    // GPU and twin agree on the block decision for many seeds.
    if let Some(g) = gpu() {
        let reqs: Vec<_> = (0..500)
            .map(|i| {
                (
                    SamplingParams {
                        rule: Rule::Block,
                        ..SamplingParams::seeded(1.0, i)
                    },
                    drafts.clone(),
                    rows.clone(),
                )
            })
            .collect();
        let b = explicit(V as u32, &reqs);
        assert_eq!(
            g.verify_blocking(&b.batch()).unwrap(),
            cpu().verify_blocking(&b.batch()).unwrap()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Block verification with a draft distribution (probabilities or logits).
// ---------------------------------------------------------------------------------------------

/// Target rows p_0..p_K and draft distributions q_0..q_{K−1} that differ from them (so
/// rejections are common and a later draft can rescue an earlier one). At T = 1 the exact mean
/// accepted drafts are 1.6790 (block) and 1.4735 (standard).
fn dist_problem() -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let p: [[f64; V]; K + 1] = [
        [0.35, 0.25, 0.2, 0.15, 0.05],
        [0.1, 0.45, 0.2, 0.15, 0.1],
        [0.3, 0.3, 0.2, 0.1, 0.1],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ];
    let q: [[f64; V]; K] = [
        [0.1, 0.5, 0.2, 0.1, 0.1],
        [0.3, 0.2, 0.1, 0.3, 0.1],
        [0.1, 0.2, 0.5, 0.1, 0.1],
    ];
    let ln = |r: &[f64]| r.iter().map(|x| x.ln() as f32).collect::<Vec<f32>>();
    (
        p.iter().map(|r| ln(r)).collect(),
        q.iter().map(|r| ln(r)).collect(),
    )
}

/// The drafts of the one-hot setting (kind 0) of the distribution tests.
const ONE_HOT_DRAFTS: [usize; K] = [1, 1, 0];

/// One setting of the distribution tests: how the draft is given (0 one-hot at
/// [`ONE_HOT_DRAFTS`], 1 probabilities, 2 logits), the temperature and the controls.
#[derive(Clone, Copy, Debug)]
struct Setting {
    kind: u8,
    t: f32,
    c: Controls,
}

impl Setting {
    /// The processed target distributions p_0..p_K.
    fn ps(&self) -> Vec<Vec<f64>> {
        let (rows, lq) = dist_problem();
        // The drafts are drawn from the test's reference of the controls: a cut within rounding
        // of its threshold could be decided the other way by the verifier, and the test would
        // then sample from a q the verifier does not use.
        let checked = if self.kind == 2 { &lq[..] } else { &[] };
        for r in rows.iter().chain(checked) {
            let (_, ambiguous) = kept_reference(r, f64::from(self.t), self.c);
            assert!(
                !ambiguous,
                "{self:?}: a cut sits on its threshold; choose other controls"
            );
        }
        rows.iter()
            .map(|r| processed(r, f64::from(self.t), self.c))
            .collect()
    }
    /// The distributions the drafts are drawn from: the given probabilities, or the draft
    /// logits processed like the target's (temperature and controls).
    fn qs(&self) -> Vec<Vec<f64>> {
        let (_, lq) = dist_problem();
        lq.iter()
            .zip(ONE_HOT_DRAFTS)
            .map(|(r, d)| {
                if self.kind == 0 {
                    (0..V).map(|y| if y == d { 1.0 } else { 0.0 }).collect()
                } else if self.kind == 1 {
                    r.iter().map(|&x| f64::from(x.exp())).collect()
                } else {
                    processed(r, f64::from(self.t), self.c)
                }
            })
            .collect()
    }
    /// The draft rows handed to the verifier (none for one-hot drafts).
    fn draft_rows(&self) -> Vec<f32> {
        if self.kind == 0 {
            return Vec::new();
        }
        let (_, lq) = dist_problem();
        lq.iter()
            .flat_map(|r| r.iter().map(|&x| if self.kind == 1 { x.exp() } else { x }))
            .collect()
    }
}

/// `m` requests of `rule` in setting `s`, one step each: drafts drawn from `qs` by `g`, the rows
/// of [`dist_problem`], `draft_rows` repeated per request.
fn dist_batch(
    rule: Rule,
    s: Setting,
    qs: &[Vec<f64>],
    draft_rows: &[f32],
    m: usize,
    g: &mut Gen,
) -> Owned {
    let (rows, _) = dist_problem();
    let reqs: Vec<_> = (0..m)
        .map(|_| {
            let drafts = qs.iter().map(|q| g.sample(q) as i32).collect();
            let params = s.c.apply(SamplingParams {
                rule,
                ..SamplingParams::seeded(s.t, g.u64())
            });
            (params, drafts, rows.clone())
        })
        .collect();
    let mut b = explicit(V as u32, &reqs);
    b.draft_kind = s.kind;
    b.draft = (0..m).flat_map(|_| draft_rows.iter().copied()).collect();
    for (i, r) in b.requests.iter_mut().enumerate() {
        r.position = (i as u64 * 7919) % 100_000;
    }
    b
}

/// `n` steps of `rule` in `setting`: drafts drawn from the q's, one request per step.
fn run_dist(v: &Verifier, rule: Rule, s: Setting, n: usize, seed: u64) -> Run {
    let (ps, qs) = (s.ps(), s.qs());
    let draft_rows = s.draft_rows();
    let mut g = Gen::new(seed);
    let mut out = Run {
        seqs: Vec::new(),
        accepted: Vec::new(),
    };
    while out.seqs.len() < n {
        // 2048 requests per call: with the controls' cutoff pass a call of 8192 on lavapipe,
        // sharing 2 cores with other test threads, once outlasted the verifier's 60 s timeout.
        let m = 2048.min(n - out.seqs.len());
        let b = dist_batch(rule, s, &qs, &draft_rows, m, &mut g);
        let o = v.verify_blocking(&b.batch()).expect("verify");
        for r in 0..m {
            let e = o.emitted(r);
            let mut seq = [0usize; K + 1];
            for (i, slot) in seq.iter_mut().enumerate() {
                *slot = if i < e.len() {
                    e[i] as usize
                } else {
                    g.sample(&ps[i])
                };
            }
            out.seqs.push(seq);
            out.accepted.push(o.accepted(r));
        }
    }
    out
}

/// The exact mean accepted drafts of the block rule and of the standard rule, in f64: the
/// block rule's by enumerating every draft sequence (weight Π q_i(d_i)) with
/// P(τ = j) = h_j Π_{i>j} (1 − h_i); the standard rule's as Σ_j Π_{i≤j} β_i,
/// β_i = Σ_y min(p_i(y), q_i(y)).
fn exact_means(ps: &[Vec<f64>], qs: &[Vec<f64>]) -> (f64, f64) {
    let mut block = 0.0;
    for code in 0..V.pow(K as u32) {
        let d: Vec<usize> = (0..K).map(|i| code / V.pow(i as u32) % V).collect();
        let w: f64 = (0..K).map(|i| qs[i][d[i]]).product();
        if w == 0.0 {
            continue;
        }
        let mut rho = vec![1.0f64];
        for j in 1..=K {
            let prev = rho[j - 1];
            rho.push((prev * ps[j - 1][d[j - 1]] / qs[j - 1][d[j - 1]]).min(1.0));
        }
        let h: Vec<f64> = (0..=K)
            .map(|j| {
                if j == K {
                    return rho[K];
                }
                let r: f64 = (0..V)
                    .map(|y| (rho[j] * ps[j][y] - qs[j][y]).max(0.0))
                    .sum();
                let den = r + 1.0 - rho[j];
                if den > 0.0 {
                    r / den
                } else {
                    1.0
                }
            })
            .collect();
        let e: f64 = (1..=K)
            .map(|j| j as f64 * h[j] * ((j + 1)..=K).map(|i| 1.0 - h[i]).product::<f64>())
            .sum();
        block += w * e;
    }
    let mut standard = 0.0;
    let mut prod = 1.0;
    for i in 0..K {
        prod *= (0..V).map(|y| ps[i][y].min(qs[i][y])).sum::<f64>();
        standard += prod;
    }
    (block, standard)
}

/// Block vs standard with a draft distribution at T = 1: both exact per position, both means
/// on their exact values, the block rule's clearly higher; and the wrong-residual control
/// rejected.
fn gain_battery(v: &Verifier, bad: &Verifier, kind: u8, n: usize, seed: u64) {
    let s = Setting {
        kind,
        t: 1.0,
        c: Controls::OFF,
    };
    let ps = s.ps();
    let block = run_dist(v, Rule::Block, s, n, seed);
    let standard = run_dist(v, Rule::Exact, s, n, seed + 1);
    let what = if kind == 1 { "probabilities" } else { "logits" };
    exact_against(&block, &ps)
        .unwrap_or_else(|e| panic!("{} draft {what}: block rule not exact: {e}", v.describe()));
    exact_against(&standard, &ps)
        .unwrap_or_else(|e| panic!("{} draft {what}: standard rule: {e}", v.describe()));
    let (mb, sb) = mean(&block.accepted);
    let (ms, ss) = mean(&standard.accepted);
    let (eb, es) = exact_means(&ps, &s.qs());
    println!(
        "{}: draft {what}, k = {K}, {n} trials each: mean accepted drafts block {mb:.4} ± {sb:.4} \
         (exact {eb:.4}), standard {ms:.4} ± {ss:.4} (exact {es:.4})",
        v.describe()
    );
    assert!(
        eb > es + 0.1,
        "the problem must let the block rule gain: {eb} vs {es}"
    );
    for (name, m, se, want) in [("block", mb, sb, eb), ("standard", ms, ss, es)] {
        let z = (m - want) / se;
        assert!(z.abs() < 6.0, "{name} mean {m} vs exact {want} (z {z:.1})");
    }
    let z = (mb - ms) / (sb * sb + ss * ss).sqrt();
    assert!(
        z > 6.0,
        "block must accept more than standard: {mb} vs {ms} (z {z:.1})"
    );
    let wrong = run_dist(bad, Rule::Block, s, n, seed + 2);
    let e = exact_against(&wrong, &ps);
    println!("  control residual-from-p: {e:?}");
    assert!(
        e.is_err(),
        "the exactness test must reject a block sampler with the wrong residual"
    );
}

#[test]
fn block_with_draft_distributions_gains_and_stays_exact_cpu() {
    for kind in [1, 2] {
        gain_battery(&cpu(), &faulty(false), kind, 60_000, 10 + u64::from(kind));
    }
}

#[test]
fn block_with_draft_distributions_gains_and_stays_exact_gpu() {
    let Some(g) = thorough_gpu(
        "block",
        "block_with_draft_distributions_gains_and_stays_exact_gpu",
    ) else {
        return;
    };
    let bad = faulty(true);
    for kind in [1, 2] {
        gain_battery(g, &bad, kind, 24_000, 20 + u64::from(kind));
    }
}

/// The controls of the grid: each cuts tokens from most rows of `dist_problem` (min-p keeps
/// the uniform bonus row whole), yet leaves the first row two tokens or more at T = 0.3 (at
/// min-p 0.5 it keeps one there: p and the residual then coincide, and no test can tell a right
/// sampler from the wrong-residual control). No cut sits on a threshold (`run_dist` checks):
/// min-p 0.2 or top-p 0.7 would, on the draft rows at T = 1.
const GRID_CONTROLS: [(&str, Controls); 4] = [
    ("plain", Controls::OFF),
    (
        "top-k 3",
        Controls {
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
        },
    ),
    (
        "top-p 0.75",
        Controls {
            top_k: 0,
            top_p: 0.75,
            min_p: 0.0,
        },
    ),
    (
        "min-p 0.25",
        Controls {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.25,
        },
    ),
];

/// Exactness of the block rule over draft kind × controls × temperature, each with its
/// wrong-residual control rejected by the same test.
fn grid(v: &Verifier, bad: &Verifier, kinds: &[u8], temps: &[f32], n: usize) {
    let mut failures = String::new();
    let mut seed = 100;
    for &kind in kinds {
        for &(name, c) in &GRID_CONTROLS {
            for &t in temps {
                seed += 3;
                let s = Setting { kind, t, c };
                let ps = s.ps();
                if let Err(e) = exact_against(&run_dist(v, Rule::Block, s, n, seed), &ps) {
                    let _ = writeln!(failures, "kind {kind} {name} T {t}: {e}");
                }
                let control = exact_against(&run_dist(bad, Rule::Block, s, n, seed + 1), &ps);
                if control.is_ok() {
                    let _ = writeln!(
                        failures,
                        "kind {kind} {name} T {t}: the wrong-residual control passed"
                    );
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}:\n{failures}", v.describe());
}

#[test]
fn block_grid_of_controls_and_temperatures_cpu() {
    grid(&cpu(), &faulty(false), &[0, 1, 2], &[0.3, 1.0, 2.0], 20_000);
}

#[test]
fn block_grid_of_controls_and_temperatures_gpu() {
    let Some(g) = thorough_gpu("block", "block_grid_of_controls_and_temperatures_gpu") else {
        return;
    };
    grid(g, &faulty(true), &[1, 2], &[1.0], 12_000);
}

#[test]
fn block_with_a_draft_distribution_matches_the_twin_and_falls_back_on_bad_draft_rows() {
    let (rows, lq) = dist_problem();
    let s = Setting {
        kind: 2,
        t: 1.0,
        c: Controls::OFF,
    };
    let qs = s.qs();
    let mut g = Gen::new(5);
    for kind in [1u8, 2] {
        let reqs: Vec<_> = (0..400)
            .map(|i| {
                let drafts: Vec<i32> = qs.iter().map(|q| g.sample(q) as i32).collect();
                let params = if i % 3 == 0 {
                    SamplingParams::seeded(0.7, i).with_top_k(4)
                } else {
                    SamplingParams::seeded(1.3, i)
                };
                (
                    SamplingParams {
                        rule: Rule::Block,
                        ..params
                    },
                    drafts,
                    rows.clone(),
                )
            })
            .collect();
        let mut b = explicit(V as u32, &reqs);
        b.draft_kind = kind;
        let one: Vec<f32> = lq
            .iter()
            .flat_map(|r| r.iter().map(|&x| if kind == 1 { x.exp() } else { x }))
            .collect();
        b.draft = (0..reqs.len()).flat_map(|_| one.iter().copied()).collect();
        let want = cpu().verify_blocking(&b.batch()).expect("twin");
        assert_eq!(want, cpu().verify_blocking(&b.batch()).expect("twin again"));
        if let Some(gv) = gpu() {
            assert_eq!(gv.verify_blocking(&b.batch()).expect("gpu"), want);
        }
        // A NaN draft logit in request 1's second draft row: that request falls back to the
        // standard rule (status DRAFT_NONFINITE where it stops there); the others are untouched.
        if kind == 2 {
            let mut bad = b.clone();
            bad.draft[K * V + V + 2] = f32::NAN;
            each_backend(|v| {
                let o = v.verify_blocking(&bad.batch()).expect("verify");
                for r in [0, 2, 3] {
                    assert_eq!(o.emitted(r), want.emitted(r), "request {r}");
                }
                assert!(o.accepted(1) <= 1, "request 1 must stop by its bad row");
                if o.accepted(1) == 1 {
                    assert!(o.status[1].contains(specdec::Status::DRAFT_NONFINITE));
                }
            });
        }
    }
}

/// Requests per setting and rule in the GPU == twin test, and settings per verify call.
const N_TWIN: usize = 512;
const SETTINGS_PER_CALL: usize = 4;

/// The twin-test batches of one draft kind: every control × T ∈ {0.3, 1, 2} × rule, `N_TWIN`
/// requests each (logprobs asked on every other one), `SETTINGS_PER_CALL` settings per batch,
/// each labelled.
fn twin_batches(kind: u8, g: &mut Gen) -> Vec<(Owned, Vec<String>)> {
    let mut out: Vec<(Owned, Vec<String>)> = Vec::new();
    for &(name, c) in &GRID_CONTROLS {
        for t in [0.3f32, 1.0, 2.0] {
            let s = Setting { kind, t, c };
            // `ps` checks that no cut sits on its threshold.
            let (_, qs) = (s.ps(), s.qs());
            for rule in [Rule::Block, Rule::Exact] {
                let mut b = dist_batch(rule, s, &qs, &s.draft_rows(), N_TWIN, g);
                for (i, r) in b
                    .requests
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| i % 2 == 1)
                {
                    r.params = r.params.with_logprobs(i % 4 == 3);
                }
                let label = format!("kind {kind} {name} T {t} {rule:?}");
                match out.last_mut() {
                    Some((o, labels)) if labels.len() < SETTINGS_PER_CALL => {
                        o.append(&b);
                        labels.push(label);
                    }
                    _ => out.push((b, vec![label])),
                }
            }
        }
    }
    out
}

/// Every setting of the grid (draft kind × controls × T ∈ {0.3, 1, 2}, both rules) on the GPU
/// and on the twin: the same requests give the same tokens, statuses and seeds, and logprobs
/// (asked on every other request) equal to f32 rounding; the wrong-residual control on the GPU
/// equals the twin's and differs from the correct twin. The grid's χ² batteries run on the twin,
/// which is exact: GPU == twin and twin exact ⇒ GPU exact. SPEC §5 lets a decision within an
/// ulp of its threshold go either way on another GPU: one such request per setting is allowed
/// (a total variation of 1/512, far below what the batteries resolve); lavapipe had none.
#[test]
fn block_matches_the_twin_on_every_grid_setting() {
    let Some(g) = gpu() else { return };
    let (twin, bad_gpu, bad_twin) = (cpu(), faulty(true), faulty(false));
    let mut gen = Gen::new(900);
    let (mut settings, mut total, mut worst, mut report) = (0, 0, 0, Vec::new());
    let (mut caught, mut faulted) = (0, 0);
    for kind in [0u8, 1, 2] {
        for (call, (b, labels)) in twin_batches(kind, &mut gen).into_iter().enumerate() {
            let want = twin.verify_blocking(&b.batch()).expect("twin");
            let got = g.verify_blocking(&b.batch()).expect("GPU");
            let mut per = vec![0usize; labels.len()];
            for (r, what) in twin_differences(&got, &want) {
                per[r / N_TWIN] += 1;
                report.push(format!(
                    "{} request {}: {what}",
                    labels[r / N_TWIN],
                    r % N_TWIN
                ));
            }
            settings += labels.len();
            total += per.iter().sum::<usize>();
            worst = worst.max(per.into_iter().max().unwrap_or(0));
            // The wrong-residual control on one call per kind: four settings of the grid.
            if call == 0 {
                let bad = bad_gpu.verify_blocking(&b.batch()).expect("GPU");
                let same =
                    twin_differences(&bad, &bad_twin.verify_blocking(&b.batch()).expect("twin"));
                assert!(
                    same.len() <= labels.len(),
                    "kind {kind}: the faulty GPU and twin differ: {same:?}"
                );
                caught += twin_differences(&bad, &want).len();
                faulted += b.requests.len();
            }
        }
    }
    println!(
        "{} vs the twin: {settings} settings × {N_TWIN} requests, {total} differ; the \
         wrong-residual GPU differs from the correct twin on {caught} of {faulted}",
        g.describe()
    );
    common::assert_fused_verify_taken(g);
    assert!(
        worst <= common::twin_slack(g).0 && total <= common::twin_slack(g).1,
        "the GPU differs from the twin:\n{}",
        report.join("\n")
    );
    assert!(
        caught * 20 >= faulted,
        "the comparison must catch the wrong-residual fault ({caught} of {faulted})"
    );
}

/// Block requests with a draft distribution and more output slots than a group of lanes that a
/// device may run ahead of the others (k = 12: 13 slots; lavapipe runs 8 lanes at a time), with
/// drafts close to the target so that τ needs block_mass' masses and `block_settle` settles the
/// request: every lane writes its slots, none may find the request settled by lane 0 already,
/// so the output equals the twin's.
#[test]
fn long_block_requests_with_draft_distributions_settle_every_slot() {
    let Some(gv) = gpu() else { return };
    let (v, k) = (3000usize, 12usize);
    let mut g = Gen::new(77);
    for kind in [1u8, 2] {
        let mut o = Owned::random(
            &mut g,
            v as u32,
            &[k as u32; 24],
            &[1.0, 0.7, 1.3],
            kind,
            0.8,
        );
        for r in o.requests.iter_mut() {
            r.params.rule = Rule::Block;
        }
        // Draft row j (request j / k, position j % k) is the target row it drafts for, perturbed.
        for j in 0..o.draft.len() / v {
            let t = (j / k) * (k + 1) + j % k;
            let row: Vec<f32> = o.target[t * v..(t + 1) * v]
                .iter()
                .map(|&x| x + 0.3 * g.normal() as f32)
                .collect();
            let row = match kind {
                1 => softmax(&row, 1.0).into_iter().map(|x| x as f32).collect(),
                _ => row,
            };
            o.draft[j * v..(j + 1) * v].copy_from_slice(&row);
        }
        let want = cpu().verify_blocking(&o.batch()).unwrap();
        let long = (0..o.requests.len())
            .filter(|&r| want.accepted(r) >= 8)
            .count();
        println!("kind {kind}: {long} of 24 requests accept 8 drafts or more");
        assert!(long > 0, "kind {kind}: no request reaches the later slots");
        assert_matches_twin(
            &gv.verify_blocking(&o.batch()).unwrap(),
            &want,
            format!("kind {kind}"),
        );
    }
}

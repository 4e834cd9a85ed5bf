//! Block verification (issue 3, SPEC §3 rule 5) with one-hot drafts: exactness per position —
//! every position's token, completed with fresh target draws where the step stopped, follows
//! p_i, and pairs of positions follow p_i × p_j — on both backends, beside the standard rule
//! on the same inputs; the mean accepted length of both against its exact value (with one-hot
//! drafts both rules reach the same optimum, Σ_j Π_{i≤j} p_i(d_i)); a wrong residual
//! that the same tests reject; greedy requests unaffected.

mod common;
use common::*;
use specdec::stats::chi_square_gof;
use specdec::{Fault, Rule, SamplingParams, Verifier, VerifierOptions};

const ALPHA: f64 = 1e-6;
const V: usize = 5;
const K: usize = 3;

/// Fixed rows and drafts: draft tokens of moderate probability, so rejections are common and
/// the block rule has something to rescue.
fn problem() -> (Vec<Vec<f32>>, Vec<i32>) {
    let p: [[f64; V]; K + 1] = [
        [0.35, 0.25, 0.2, 0.15, 0.05],
        [0.1, 0.45, 0.2, 0.15, 0.1],
        [0.3, 0.3, 0.2, 0.1, 0.1],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ];
    let rows = p
        .iter()
        .map(|r| r.iter().map(|x| x.ln() as f32).collect())
        .collect();
    (rows, vec![1, 1, 0])
}

struct Run {
    /// Tokens of every position 0..=K: emitted ones, then fresh draws from p_i.
    seqs: Vec<[usize; K + 1]>,
    accepted: Vec<usize>,
}

fn run(v: &Verifier, rule: Rule, n: usize, seed: u64) -> Run {
    let (rows, drafts) = problem();
    let ps: Vec<Vec<f64>> = rows.iter().map(|r| softmax(r, 1.0)).collect();
    let mut g = Gen::new(seed);
    let mut out = Run {
        seqs: Vec::new(),
        accepted: Vec::new(),
    };
    while out.seqs.len() < n {
        let m = 8192.min(n - out.seqs.len());
        let reqs: Vec<_> = (0..m)
            .map(|_| {
                (
                    SamplingParams {
                        rule,
                        ..SamplingParams::seeded(1.0, g.u64())
                    },
                    drafts.clone(),
                    rows.clone(),
                )
            })
            .collect();
        let mut b = explicit(V as u32, &reqs);
        for (i, r) in b.requests.iter_mut().enumerate() {
            r.position = (i as u64 * 7919) % 100_000;
        }
        let o = v.verify_blocking(&b.batch()).expect("verify");
        for r in 0..m {
            let e = o.emitted(r);
            let mut s = [0usize; K + 1];
            for (i, slot) in s.iter_mut().enumerate() {
                *slot = if i < e.len() {
                    e[i] as usize
                } else {
                    g.sample(&ps[i])
                };
            }
            out.seqs.push(s);
            out.accepted.push(o.accepted(r));
        }
    }
    out
}

/// Every position's marginal and the pairs (0, 1), (1, 2), (0, 3) against the product law.
fn exact(r: &Run) -> Result<(), String> {
    let (rows, _) = problem();
    let ps: Vec<Vec<f64>> = rows.iter().map(|r| softmax(r, 1.0)).collect();
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
        Verifier::new(opts).expect("second GPU verifier")
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
    let Some(g) = gpu() else { return };
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

#[test]
fn block_with_a_draft_distribution_is_refused() {
    let (rows, drafts) = problem();
    let s = SamplingParams {
        rule: Rule::Block,
        ..SamplingParams::seeded(1.0, 9)
    };
    let mut b = explicit(V as u32, &[(s, drafts, rows)]);
    b.draft_kind = 1;
    b.draft = vec![0.2; K * V];
    let err = cpu().verify_blocking(&b.batch()).unwrap_err();
    assert!(matches!(err, specdec::Error::Unsupported { .. }), "{err}");
}

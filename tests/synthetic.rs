//! Synthetic mode (SPEC §3 rule 4): the empirical per-position acceptance rates equal the
//! conditional rates given, within 6 standard errors, on both backends; the mean-length schedule
//! gives its mean; a deliberately wrong schedule (unconditional rates passed as conditional) is
//! rejected by the same test.

mod common;
use common::*;
use specdec::synthetic::{conditional_for_mean_length, conditional_from_unconditional};
use specdec::tools::stats::binomial_z;
use specdec::{Rule, Verifier, VerifyOutput};

/// Runs `n` synthetic requests with `k` drafts and `rates` (conditional, one per position).
fn run(v: &Verifier, rates: &[f32], n: usize, seed: u64) -> Vec<VerifyOutput> {
    let k = rates.len() as u32;
    let vocab = 64u32;
    let mut g = Gen::new(seed);
    let mut outs = Vec::new();
    let mut done = 0;
    while done < n {
        let r = 4096.min(n - done);
        let mut b = Owned::random(
            &mut g,
            vocab,
            &vec![k; r],
            &[1.0, 0.0],
            (done % 3) as u8,
            0.5,
        );
        for req in &mut b.requests {
            req.params.rule = Rule::Synthetic;
        }
        b.rates = Some(rates.repeat(r));
        outs.push(v.verify_blocking(&b.batch()).unwrap());
        done += r;
    }
    outs
}

/// z-scores of the per-position conditional acceptance against `rates`.
fn position_z(outs: &[VerifyOutput], rates: &[f32]) -> Vec<f64> {
    let k = rates.len();
    let (mut reached, mut accepted) = (vec![0u64; k], vec![0u64; k]);
    for o in outs {
        for r in 0..o.len() {
            let a = o.accepted(r);
            for i in 0..k.min(a + 1) {
                reached[i] += 1;
                if i < a {
                    accepted[i] += 1;
                }
            }
        }
    }
    (0..k)
        .map(|i| binomial_z(accepted[i], reached[i], rates[i] as f64))
        .collect()
}

#[test]
fn per_position_rates_match_on_both_backends() {
    let rates = conditional_from_unconditional(&[0.9, 0.7, 0.5, 0.3]).unwrap();
    each_backend(|v: &Verifier| {
        let z = position_z(&run(v, &rates, 20_000, 1), &rates);
        println!("{}: per-position z {z:?}", v.describe());
        assert!(z.iter().all(|z| z.abs() <= 6.0), "{z:?}");
        // Negative control: the unconditional rates used as if they were conditional.
        let wrong = [0.9f32, 0.7, 0.5, 0.3];
        let zw = position_z(&run(v, &wrong, 20_000, 2), &rates);
        assert!(
            zw.iter().any(|z| z.abs() > 6.0),
            "the test must reject a wrong schedule: {zw:?}"
        );
    });
}

#[test]
fn mean_length_schedule_gives_its_mean() {
    let c = conditional_for_mean_length(6, 3.4).unwrap();
    each_backend(|v: &Verifier| {
        let outs = run(v, &c, 10_000, 3);
        let (mut sum, mut n) = (0u64, 0u64);
        for o in &outs {
            for r in 0..o.len() {
                let e = o.num_emitted[r] as u64;
                assert!(
                    e == 3 || e == 4,
                    "minimum variance: 3 or 4 tokens per step, got {e}"
                );
                sum += e;
                n += 1;
            }
        }
        let mean = sum as f64 / n as f64;
        // Emitted = 3 + Bernoulli(0.4): standard error sqrt(0.24 / n).
        let se = (0.24 / n as f64).sqrt();
        assert!(
            (mean - 3.4).abs() <= 6.0 * se,
            "mean {mean} vs 3.4 (se {se})"
        );
    });
}

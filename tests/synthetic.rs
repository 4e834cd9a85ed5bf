//! Synthetic mode (SPEC §3 rule 4): the empirical per-position acceptance rates equal the
//! conditional rates given, within 6 standard errors; the mean-length schedule
//! gives its mean; a deliberately wrong schedule (unconditional rates passed as conditional) is
//! rejected by the same test.
//!
//! Tiers: the batteries run on the CPU twin; the GPU is proven equal to the twin on the
//! batteries' own requests. The batteries on the GPU itself are the thorough tier, skipped with a
//! printed line unless `SPECDEC_THOROUGH=1 cargo test --release --test synthetic`.

mod common;
use common::*;
use specdec::synthetic::{conditional_for_mean_length, conditional_from_unconditional};
use specdec::tools::stats::binomial_z;
use specdec::{Rule, Verifier, VerifyOutput};

/// `r` synthetic requests with drafts of `kind` (0 one-hot, 1 probabilities, 2 logits), T = 1
/// and T = 0 alternating, and `rates` (conditional, one per position).
fn batch(g: &mut Gen, rates: &[f32], r: usize, kind: u8) -> Owned {
    let k = rates.len() as u32;
    let mut b = Owned::random(g, 64, &vec![k; r], &[1.0, 0.0], kind, 0.5);
    for req in &mut b.requests {
        req.params.rule = Rule::Synthetic;
    }
    b.rates = Some(rates.repeat(r));
    b
}

/// Runs `n` synthetic requests with `rates`, calls of 4096 cycling through the draft kinds.
fn run(v: &Verifier, rates: &[f32], n: usize, seed: u64) -> Vec<VerifyOutput> {
    let mut g = Gen::new(seed);
    let mut outs = Vec::new();
    let mut done = 0;
    while done < n {
        let r = 4096.min(n - done);
        let b = batch(&mut g, rates, r, (done % 3) as u8);
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

/// Per-position rates within 6 standard errors, and the wrong-schedule control rejected.
fn rates_battery(v: &Verifier) {
    let rates = conditional_from_unconditional(&[0.9, 0.7, 0.5, 0.3]).unwrap();
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
}

#[test]
fn per_position_rates_match_cpu() {
    rates_battery(&cpu());
}

#[test]
fn per_position_rates_match_gpu() {
    let Some(g) = thorough_gpu("synthetic", "per_position_rates_match_gpu") else {
        return;
    };
    rates_battery(g);
}

/// The mean-length schedule: 3 or 4 tokens per step (minimum variance), mean 3.4.
fn mean_length_battery(v: &Verifier) {
    let c = conditional_for_mean_length(6, 3.4).unwrap();
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
}

#[test]
fn mean_length_schedule_gives_its_mean_cpu() {
    mean_length_battery(&cpu());
}

#[test]
fn mean_length_schedule_gives_its_mean_gpu() {
    let Some(g) = thorough_gpu("synthetic", "mean_length_schedule_gives_its_mean_gpu") else {
        return;
    };
    mean_length_battery(g);
}

/// The batteries' requests (every draft kind, greedy and sampled; the right schedule, the wrong
/// one and the mean-length one) give the same outputs on the GPU and on the twin, which the
/// batteries above prove right: GPU == twin and twin exact ⇒ GPU exact. One differing request
/// per batch is allowed (SPEC §5: an `exp` ulp may flip a resample at its threshold on another
/// GPU); lavapipe had none.
#[test]
fn gpu_matches_the_twin_on_the_battery_requests() {
    let Some(g) = gpu() else { return };
    let schedules = [
        conditional_from_unconditional(&[0.9, 0.7, 0.5, 0.3]).unwrap(),
        vec![0.9f32, 0.7, 0.5, 0.3],
        conditional_for_mean_length(6, 3.4).unwrap(),
    ];
    let mut gen = Gen::new(4);
    // One call per draft kind, the three schedules' requests appended (the GPU's cost per call is
    // mostly fixed on a software adapter).
    for kind in 0..3u8 {
        let mut b = batch(&mut gen, &schedules[0], 1024, kind);
        for rates in &schedules[1..] {
            b.append(&batch(&mut gen, rates, 1024, kind));
        }
        let want = cpu().verify_blocking(&b.batch()).unwrap();
        let differ = twin_differences(&g.verify_blocking(&b.batch()).unwrap(), &want);
        for (i, rates) in schedules.iter().enumerate() {
            let mine: Vec<_> = differ.iter().filter(|(r, _)| r / 1024 == i).collect();
            println!(
                "rates {rates:?}, draft kind {kind}: {} of 1024 requests differ",
                mine.len()
            );
            assert!(
                mine.len() <= common::twin_slack(g).0,
                "rates {rates:?} kind {kind}: {mine:?}"
            );
        }
    }
    common::assert_fused_verify_taken(g);
}

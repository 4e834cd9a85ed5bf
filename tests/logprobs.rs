//! Logprobs of the emitted tokens: under the processed distribution (temperature,
//! top-k / top-p / min-p; 0 for greedy) and under the raw logits, against an f64 reference on
//! both backends; NaN where nothing was asked or nothing emitted; absent when no request asks.

mod common;
use common::*;
use specdec::{SamplingParams, Status, Verifier};

/// A mixed batch where every request asks for both kinds of logprobs; request i's controls.
fn batch(seed: u64, kind: u8) -> (Owned, Vec<Controls>) {
    let mut g = Gen::new(seed);
    let mut o = Owned::random(
        &mut g,
        40,
        &[3, 0, 2, 4, 1, 3, 2, 2],
        &[0.0, 1.0, 0.7, 2.0],
        kind,
        0.6,
    );
    let mut controls = Vec::new();
    for (i, r) in o.requests.iter_mut().enumerate() {
        let c = if i % 3 == 1 {
            Controls {
                top_k: 6,
                top_p: 0.9,
                min_p: 0.02,
            }
        } else {
            Controls::OFF
        };
        r.params = c.apply(r.params).with_logprobs(true);
        controls.push(c);
    }
    (o, controls)
}

fn check(v: &Verifier, o: &Owned, controls: &[Controls]) -> usize {
    let out = v.verify_blocking(&o.batch()).unwrap();
    let vocab = o.vocab as usize;
    let (mut row0, mut checked) = (0usize, 0usize);
    for (r, req) in o.requests.iter().enumerate() {
        let t = req.params.temperature as f64;
        let lp = out.emitted_logprobs(r).expect("asked for logprobs");
        let raw = out.emitted_raw_logprobs(r).expect("asked for raw logprobs");
        for (i, &y) in out.emitted(r).iter().enumerate() {
            let row = &o.target[(row0 + i) * vocab..(row0 + i + 1) * vocab];
            let want_raw = softmax(row, 1.0)[y as usize].ln();
            let want = if t == 0.0 {
                0.0
            } else {
                processed(row, t, controls[r])[y as usize].ln()
            };
            assert!(
                (f64::from(lp[i]) - want).abs() < 2e-4 * (1.0 + want.abs()),
                "{}: request {r} slot {i} token {y}: logprob {} vs {want}",
                v.describe(),
                lp[i]
            );
            assert!(
                (f64::from(raw[i]) - want_raw).abs() < 2e-4 * (1.0 + want_raw.abs()),
                "{}: request {r} slot {i}: raw logprob {} vs {want_raw}",
                v.describe(),
                raw[i]
            );
            checked += 1;
        }
        // Slots after the emitted ones are NaN.
        let all = out.logprobs.as_ref().unwrap();
        for j in out.num_emitted[r] as usize..out.stride {
            assert!(all[r * out.stride + j].is_nan());
        }
        row0 += req.num_drafts as usize + 1;
    }
    checked
}

#[test]
fn logprobs_match_the_reference() {
    each_backend(|v| {
        let mut n = 0;
        for kind in 0..3u8 {
            for seed in 0..4 {
                let (o, c) = batch(10 * seed + u64::from(kind), kind);
                n += check(v, &o, &c);
            }
        }
        println!(
            "{}: {n} emitted tokens' logprobs match the f64 reference",
            v.describe()
        );
        assert!(n > 100);
    });
}

/// The GPU's logprobs equal the twin's to f32 rounding, and the tokens exactly.
#[test]
fn gpu_logprobs_agree_with_the_twin() {
    let Some(g) = gpu() else { return };
    let (o, _) = batch(99, 2);
    let a = cpu().verify_blocking(&o.batch()).unwrap();
    let b = g.verify_blocking(&o.batch()).unwrap();
    assert_eq!(a.tokens, b.tokens);
    for (x, y) in a.logprobs.unwrap().iter().zip(b.logprobs.unwrap()) {
        assert!(
            x.is_nan() && y.is_nan() || (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
            "{x} vs {y}"
        );
    }
}

#[test]
fn nothing_asked_nothing_returned() {
    each_backend(|v| {
        let (mut o, _) = batch(5, 1);
        // Only request 0 asks, and only for processed logprobs.
        for (i, r) in o.requests.iter_mut().enumerate() {
            r.params.logprobs = i == 0;
            r.params.raw_logprobs = false;
        }
        let out = v.verify_blocking(&o.batch()).unwrap();
        assert!(out
            .emitted_logprobs(0)
            .unwrap()
            .iter()
            .all(|x| x.is_finite()));
        assert!(out
            .emitted_raw_logprobs(0)
            .unwrap()
            .iter()
            .all(|x| x.is_nan()));
        for r in 1..o.requests.len() {
            assert!(out.emitted_logprobs(r).unwrap().iter().all(|x| x.is_nan()));
        }
        for r in o.requests.iter_mut() {
            r.params.logprobs = false;
        }
        let out = v.verify_blocking(&o.batch()).unwrap();
        assert!(out.logprobs.is_none() && out.raw_logprobs.is_none());
    });
}

/// A NaN row and an all −inf row: the request stops there and that slot's logprob is NaN.
#[test]
fn nonfinite_rows_have_nan_logprobs() {
    let lp = SamplingParams::seeded(1.0, 3).with_logprobs(true);
    let g = SamplingParams::greedy().with_logprobs(true);
    let mut nan = row(5, 0.0, &[(2, 1.0)]);
    nan[4] = f32::NAN;
    let o = explicit(
        5,
        &[
            (lp, vec![], vec![nan]),
            (g, vec![], vec![row(5, f32::NEG_INFINITY, &[])]),
            (
                g,
                vec![1],
                vec![row(5, 0.0, &[(1, 3.0)]), row(5, 0.0, &[(3, 2.0)])],
            ),
        ],
    );
    each_backend(|v| {
        let out = v.verify_blocking(&o.batch()).unwrap();
        assert!(out.status[0].contains(Status::TARGET_NONFINITE));
        assert!(out.emitted_logprobs(0).unwrap()[0].is_nan());
        assert_eq!(out.status[1], Status::ALL_MASKED);
        assert!(out.emitted_raw_logprobs(1).unwrap()[0].is_nan());
        // Greedy: accepted draft 1 and the bonus argmax 3, each a point mass (0); raw values
        // are log_softmax.
        assert_eq!(out.emitted(2), &[1, 3]);
        assert_eq!(out.emitted_logprobs(2).unwrap(), &[0.0, 0.0]);
        let want = -(1.0f64 + 4.0 * (-3.0f64).exp()).ln();
        let got = out.emitted_raw_logprobs(2).unwrap()[0] as f64;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    });
}

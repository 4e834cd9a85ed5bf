//! Typical acceptance (Medusa; lossy and opt-in): accept iff
//! p(d) > min(ε, δ·exp(−H(p))), argmax at the first rejection — against an f64 reference on
//! random rows (entropy included, with top-k / min-p on some requests) on both backends, and on
//! explicit rows.

mod common;
use common::*;
use specdec::{Rule, SamplingParams, Verifier};

fn params(t: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        rule: Rule::Typical,
        ..SamplingParams::seeded(t, seed)
    }
}

/// The reference: drafts kept and the token emitted at the first rejection (None when every
/// draft is kept: the bonus is sampled), or None for the whole request when a decision sits
/// within rounding of its threshold.
fn reference(
    rows: &[Vec<f32>],
    drafts: &[i32],
    p: &SamplingParams,
    c: Controls,
) -> Option<(usize, Option<i32>)> {
    let t = p.temperature as f64;
    for (i, &d) in drafts.iter().enumerate() {
        let pr = processed(&rows[i], t, c);
        let h: f64 = -pr
            .iter()
            .filter(|&&x| x > 0.0)
            .map(|&x| x * x.ln())
            .sum::<f64>();
        let thr = (p.typical_epsilon as f64).min(p.typical_delta as f64 * (-h).exp());
        let pd = if d >= 0 { pr[d as usize] } else { 0.0 };
        if (pd - thr).abs() < 1e-5 * (1.0 + thr) {
            return None;
        }
        if pd <= thr {
            let argmax = (0..pr.len()).fold(0, |b, y| if pr[y] > pr[b] { y } else { b });
            return Some((i, Some(argmax as i32)));
        }
    }
    Some((drafts.len(), None))
}

fn sweep(v: &Verifier, seed: u64) -> usize {
    let mut g = Gen::new(seed);
    let vocab = 60;
    let mut reqs = Vec::new();
    let mut controls = Vec::new();
    for i in 0..300 {
        let k = 1 + g.below(4);
        let t = [0.5f32, 1.0, 1.7][i % 3];
        // Peaked rows of varied entropy; drafts from the top few tokens so both outcomes occur.
        let scale = 1.0 + 3.0 * g.unit();
        let rows: Vec<Vec<f32>> = (0..=k).map(|_| g.logits(vocab, scale)).collect();
        let drafts: Vec<i32> = rows[..k]
            .iter()
            .map(|r| {
                let mut idx: Vec<usize> = (0..vocab).collect();
                idx.sort_by(|&a, &b| r[b].partial_cmp(&r[a]).unwrap());
                idx[g.below(4)] as i32
            })
            .collect();
        let c = if i % 4 == 3 {
            Controls {
                top_k: 10,
                top_p: 1.0,
                min_p: 0.01,
            }
        } else {
            Controls::OFF
        };
        controls.push(c);
        reqs.push((c.apply(params(t, g.u64())), drafts, rows));
    }
    let b = explicit(vocab as u32, &reqs);
    let out = v.verify_blocking(&b.batch()).unwrap();
    let (mut checked, mut accepted, mut rejected) = (0, 0, 0);
    for (r, (p, drafts, rows)) in reqs.iter().enumerate() {
        let Some((keep, token)) = reference(rows, drafts, p, controls[r]) else {
            continue;
        };
        assert_eq!(out.accepted(r), keep, "{}: request {r}", v.describe());
        if let Some(tok) = token {
            assert_eq!(
                out.emitted(r)[keep],
                tok,
                "{}: request {r} fallback",
                v.describe()
            );
            rejected += 1;
        } else {
            accepted += 1;
        }
        checked += 1;
    }
    println!("{}: {checked} requests match the reference ({accepted} fully accepted, {rejected} stopped)", v.describe());
    assert!(checked > 250 && accepted > 10 && rejected > 10);
    checked
}

#[test]
fn typical_acceptance_matches_the_reference() {
    each_backend(|v| {
        sweep(v, 1);
        sweep(v, 2);
    });
}

#[test]
fn explicit_rows() {
    each_backend(|v| {
        // Uniform over 4: H = ln 4, threshold min(0.09, 0.3 / 4) = 0.075 < p(d) = 0.25: accept.
        // Peaked: p(1) ≈ 4.5e-5, H ≈ 0.0006: threshold ≈ 0.09: reject, emit the argmax 0.
        let uniform = row(4, 0.0, &[]);
        let peaked = row(4, 0.0, &[(0, 10.0)]);
        let b = explicit(
            4,
            &[
                (
                    params(1.0, 1),
                    vec![2],
                    vec![uniform.clone(), peaked.clone()],
                ),
                (
                    params(1.0, 2),
                    vec![1],
                    vec![peaked.clone(), uniform.clone()],
                ),
                // δ = 0: the threshold is 0, every valid draft is accepted; −1 never is.
                (
                    SamplingParams {
                        typical_delta: 0.0,
                        ..params(1.0, 3)
                    },
                    vec![3, -1],
                    vec![peaked.clone(), peaked.clone(), uniform.clone()],
                ),
            ],
        );
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(
            out.emitted(0),
            &[2, 0],
            "accepted, then the bonus from the peaked row"
        );
        assert_eq!(out.emitted(1), &[0], "rejected: the argmax");
        assert_eq!(
            out.emitted(2),
            &[3, 0],
            "δ = 0 accepts token 3; the −1 draft falls back"
        );
    });
}

#[test]
fn epsilon_zero_accepts_every_draft_with_positive_probability() {
    each_backend(|v| {
        let eps0 = |seed| SamplingParams {
            typical_epsilon: 0.0,
            ..params(1.0, seed)
        };
        // Peaked: p(0) ≈ 1, p(1..3) ≈ 4.5e-5 each — far below the default threshold (≈ 0.09),
        // yet above 0.
        let uniform = row(4, 0.0, &[]);
        let peaked = row(4, 0.0, &[(0, 10.0)]);
        let b = explicit(
            4,
            &[
                // ε = 0: both unlikely drafts are kept, the bonus comes from the last row.
                (
                    eps0(1),
                    vec![3, 2],
                    vec![peaked.clone(), peaked.clone(), uniform.clone()],
                ),
                // top_k = 1 masks every token but the argmax: draft 3 has p = 0 exactly and is
                // rejected even at threshold 0; the argmax 0 is emitted in its place.
                (
                    eps0(2).with_top_k(1),
                    vec![0, 3],
                    vec![peaked.clone(), peaked.clone(), peaked.clone()],
                ),
                // A −1 draft (no draft) is never accepted.
                (eps0(3), vec![-1], vec![peaked.clone(), uniform.clone()]),
                // The control: the same unlikely draft at the default ε is rejected.
                (
                    params(1.0, 4),
                    vec![3],
                    vec![peaked.clone(), uniform.clone()],
                ),
            ],
        );
        let out = v.verify_blocking(&b.batch()).unwrap();
        let d = v.describe();
        assert_eq!(out.accepted(0), 2, "{d}: ε = 0 keeps p(d) ≈ 4.5e-5");
        assert_eq!(&out.emitted(0)[..2], &[3, 2], "{d}");
        assert_eq!(out.emitted(1), &[0, 0], "{d}: the masked draft is rejected");
        assert_eq!(out.emitted(2), &[0], "{d}: −1 falls back to the argmax");
        assert_eq!(out.emitted(3), &[0], "{d}: the default ε rejects it");
    });
}

#[test]
fn bad_typical_parameters_are_refused() {
    for (e, d) in [
        (-0.01f32, 0.3f32),
        (f32::NAN, 0.3),
        (1.5, 0.3),
        (0.09, -1.0),
        (0.09, f32::NAN),
    ] {
        let p = SamplingParams {
            typical_epsilon: e,
            typical_delta: d,
            ..params(1.0, 1)
        };
        let b = explicit(4, &[(p, vec![], vec![row(4, 0.0, &[])])]);
        let err = cpu().verify_blocking(&b.batch()).unwrap_err();
        assert!(err.to_string().contains("typical"), "{err}");
    }
}

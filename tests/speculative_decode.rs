//! The decode loop end to end on a deterministic mock LM: speculative greedy output equals plain
//! greedy output (1,000 random prompts, several proposers, both scorer paths, CPU verifier; a
//! smaller run on the GPU verifier), and speculative sampling's output distribution equals
//! autoregressive sampling's (χ² at the exact 1e-7 quantile, per position and jointly), with a
//! deliberately wrong decode loop as negative control.

mod common;
mod speculative_mock;

use common::*;
use specdec::speculative::{
    BatchExpansion, DecodeFault, DecoderConfig, DraftModelProposer, GenRequest, Generation,
    Metrics, NgramProposer, NoProposer, Proposer, RowKind, Sequences, SpecDecoder, Speculation,
    StopReason, TargetModel,
};
use specdec::tools::stats::chi_square_gof;
use specdec::{SamplingParams, Verifier};
use speculative_mock::*;
use std::time::{Duration, Instant};

const V: usize = 48;
const EOS: u32 = 3;

fn greedy_requests(n: usize, seed: u64) -> Vec<GenRequest> {
    let mut g = Gen::new(seed);
    (0..n)
        .map(|_| {
            let len = 1 + g.below(30);
            // Prompts from a small alphabet repeat themselves, as real prompts do.
            let alphabet = 4 + g.below(V - 4);
            let prompt: Vec<u32> = (0..len).map(|_| g.below(alphabet) as u32).collect();
            GenRequest::new(prompt, SamplingParams::greedy(), g.below(40))
        })
        .collect()
}

fn reference(lm: &MockLm, reqs: &[GenRequest]) -> Vec<Generation> {
    reqs.iter()
        .map(|r| {
            let tokens = reference_greedy(lm, &r.prompt, r.max_len, &[EOS]);
            let stop = if tokens.last() == Some(&EOS) {
                StopReason::Eos
            } else {
                StopReason::MaxLen
            };
            Generation { tokens, stop }
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Prop {
    Plain,
    Ngram(usize, usize),
    Draft(RowKind, f32),
}

#[derive(Clone, Copy, Debug)]
enum Scorer {
    MultiQuery,
    Expansion,
}

fn run(
    verifier: &Verifier,
    lm: MockLm,
    reqs: &[GenRequest],
    prop: Prop,
    scorer: Scorer,
    config: DecoderConfig,
) -> (Vec<Generation>, Metrics) {
    let mut proposer: Box<dyn Proposer> = match prop {
        Prop::Plain => Box::new(NoProposer),
        Prop::Ngram(lo, hi) => Box::new(NgramProposer::new(lo, hi).unwrap()),
        Prop::Draft(kind, noise) => {
            Box::new(DraftModelProposer::new(MockDraft::new(lm, noise, kind)))
        }
    };
    let mut dec = SpecDecoder::new(verifier, config);
    let out = match scorer {
        Scorer::MultiQuery => {
            let mut target = Sequences::new(vec![MockSeq::new(lm); reqs.len()]);
            let out = dec.generate(&mut target, proposer.as_mut(), reqs).unwrap();
            // Rolled back after every step: a request that ran to its length cap has exactly
            // its sequence minus the last token (emitted, never fed) in the cache; one that hit
            // EOS among accepted drafts may hold the drafts after it. Either way the cache holds
            // the sequence, never a rejected draft.
            for ((m, r), o) in target.models.iter().zip(reqs).zip(&out) {
                let full: Vec<u32> = r.prompt.iter().chain(&o.tokens).copied().collect();
                if o.stop == StopReason::MaxLen && !o.tokens.is_empty() {
                    assert_eq!(m.cache.len(), full.len() - 1);
                }
                let n = m.cache.len().min(full.len());
                assert_eq!(m.cache[..n], full[..n], "the cache holds the sequence");
            }
            out
        }
        Scorer::Expansion => {
            let mut target = BatchExpansion::new(lm);
            dec.generate(&mut target as &mut dyn TargetModel, proposer.as_mut(), reqs)
                .unwrap()
        }
    };
    (out, dec.metrics().clone())
}

/// Every step speculates: these tests count drafts, calls and steps of the verification path,
/// which `Speculation::WhilePaying` would trade for plain steps wherever the mock's timing
/// favours them (the policy has tests of its own below).
fn greedy_config(k: usize) -> DecoderConfig {
    DecoderConfig {
        num_drafts: k,
        eos: vec![EOS],
        speculation: Speculation::Always,
        ..DecoderConfig::default()
    }
}

const GREEDY_CASES: [(Prop, Scorer, usize); 6] = [
    (Prop::Ngram(1, 3), Scorer::MultiQuery, 4),
    (Prop::Ngram(2, 4), Scorer::Expansion, 6),
    (Prop::Draft(RowKind::Probs, 1.5), Scorer::MultiQuery, 3),
    (Prop::Draft(RowKind::OneHot, 1.5), Scorer::Expansion, 5),
    (Prop::Draft(RowKind::Logits, 1.5), Scorer::MultiQuery, 2),
    (Prop::Ngram(1, 1), Scorer::MultiQuery, 1),
];

fn check_greedy(verifier: &Verifier, n: usize, cases: &[(Prop, Scorer, usize)]) {
    let lm = MockLm::peaked(V);
    let reqs = greedy_requests(n, 2024);
    let want = reference(&lm, &reqs);
    let eos_stops = want.iter().filter(|g| g.stop == StopReason::Eos).count();
    assert!(
        eos_stops > 0 && eos_stops < n,
        "both stop reasons occur ({eos_stops})"
    );
    let (plain, plain_m) = run(
        verifier,
        lm,
        &reqs,
        Prop::Plain,
        Scorer::MultiQuery,
        greedy_config(4),
    );
    assert_eq!(plain, want, "plain greedy through the decoder");
    eprintln!("plain greedy on {}\n{plain_m}", verifier.describe());
    assert_eq!(plain_m.proposed, 0);
    assert_eq!(plain_m.mean_acceptance_length(), Some(1.0));
    for &(prop, scorer, k) in cases {
        let (got, m) = run(verifier, lm, &reqs, prop, scorer, greedy_config(k));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g, w,
                "{prop:?} {scorer:?} k={k}: request {i} ({:?})",
                reqs[i]
            );
        }
        eprintln!("{prop:?} {scorer:?} k={k} on {}\n{m}", verifier.describe());
        // Both paths of the verifier were exercised, and speculation saved target calls.
        assert!(m.accepted > 0 && m.accepted < m.proposed, "{prop:?}: {m}");
        assert!(m.target_calls < plain_m.target_calls, "{prop:?}: {m}");
        assert!(m.request_steps < plain_m.request_steps, "{prop:?}: {m}");
        assert_eq!(m.appended, plain_m.appended);
        assert_eq!(m.target_calls, m.verify_calls);
        assert!(m.tokens_per_second().is_some_and(|t| t > 0.0), "{m}");
        let table = m.to_string();
        assert!(table.contains("| target calls |") && table.contains("| draft position |"));
        assert!(m.proposed_at.len() <= k);
    }
}

#[test]
fn speculative_greedy_equals_plain_greedy_cpu_1000_prompts() {
    check_greedy(&cpu(), 1000, &GREEDY_CASES);
}

#[test]
fn speculative_greedy_equals_plain_greedy_gpu() {
    let Some(g) = gpu() else { return };
    check_greedy(g, 48, &GREEDY_CASES[..3]);
}

#[test]
fn decoder_rejects_bad_requests_and_proposals() {
    let v = cpu();
    let lm = MockLm::peaked(V);
    let mut dec = SpecDecoder::new(&v, greedy_config(2));
    let mut target = BatchExpansion::new(lm);
    let empty = [GenRequest::new(vec![], SamplingParams::greedy(), 4)];
    let e = dec
        .generate(&mut target, &mut NoProposer, &empty)
        .unwrap_err();
    assert!(e.to_string().contains("empty prompt"), "{e}");
    // A prompt already at its cap generates nothing.
    let full = [GenRequest::new(vec![1, 2], SamplingParams::greedy(), 0)];
    let out = dec.generate(&mut target, &mut NoProposer, &full).unwrap();
    assert_eq!(out[0].tokens, Vec::<u32>::new());
    assert_eq!(out[0].stop, StopReason::MaxLen);
    // Metrics accumulate over generate calls until reset.
    let one = [GenRequest::new(vec![5, 6, 7], SamplingParams::greedy(), 3)];
    dec.reset_metrics();
    dec.generate(&mut target, &mut NoProposer, &one).unwrap();
    dec.generate(&mut target, &mut NoProposer, &one).unwrap();
    assert_eq!(dec.metrics().appended, 6);
    assert_eq!(dec.metrics().target_calls, 6);
    dec.reset_metrics();
    assert_eq!(dec.metrics(), &Metrics::default());
    // A proposer that ignores its cap is caught before scoring.
    struct Greedy;
    impl Proposer for Greedy {
        fn propose(
            &mut self,
            seqs: &[specdec::speculative::SeqView<'_>],
            k: usize,
            out: &mut specdec::speculative::Proposals,
        ) -> Result<(), specdec::speculative::SpecError> {
            out.begin(RowKind::OneHot, 0);
            for _ in seqs {
                out.push(&vec![1; k + 1], &[])?;
            }
            Ok(())
        }
    }
    let reqs = [GenRequest::new(vec![1, 2], SamplingParams::greedy(), 8)];
    let e = dec.generate(&mut target, &mut Greedy, &reqs).unwrap_err();
    assert!(e.to_string().contains("more than its cap"), "{e}");
}

// ---- when to speculate ----

/// A target whose calls take `per_call + per_row × rows` of wall time, as a real model's do.
struct Timed {
    inner: Sequences<MockSeq>,
    per_call: Duration,
    per_row: Duration,
}

impl TargetModel for Timed {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn forward(
        &mut self,
        inputs: &[specdec::speculative::ScoreInput<'_>],
        out: &mut [f32],
    ) -> Result<(), specdec::speculative::ModelError> {
        let rows: usize = inputs.iter().map(|i| i.rows()).sum();
        std::thread::sleep(self.per_call + self.per_row * rows as u32);
        self.inner.forward(inputs, out)
    }
    fn truncate(&mut self, seq: usize, len: usize) -> Result<(), specdec::speculative::ModelError> {
        self.inner.truncate(seq, len)
    }
}

/// Drafts that are always wrong: each request's first draft is one past the target's argmax, so
/// every step accepts nothing; `.1` is what `catches_up` answers.
struct WrongDrafts(MockLm, bool);

impl Proposer for WrongDrafts {
    fn propose(
        &mut self,
        seqs: &[specdec::speculative::SeqView<'_>],
        k: usize,
        out: &mut specdec::speculative::Proposals,
    ) -> Result<(), specdec::speculative::SpecError> {
        out.begin(RowKind::OneHot, 0);
        for s in seqs {
            let cap = specdec::speculative::proposal_cap(s.tokens.len(), s.max_len, k);
            let wrong = (self.0.greedy_next(s.tokens) + 1) % self.0.vocab as u32;
            out.push(&vec![wrong; cap], &[])?;
        }
        Ok(())
    }
    fn catches_up(&self) -> bool {
        self.1
    }
}

/// One request of `new_tokens` tokens through a timed target with `prop`; returns the output,
/// the metrics and the wall time.
fn timed_run(
    prop: &mut dyn Proposer,
    params: SamplingParams,
    speculation: Speculation,
    (per_call, per_row): (Duration, Duration),
    new_tokens: usize,
) -> (Vec<u32>, Metrics, Duration) {
    let lm = MockLm::peaked(V);
    let v = cpu();
    let mut dec = SpecDecoder::new(
        &v,
        DecoderConfig {
            num_drafts: 4,
            speculation,
            ..DecoderConfig::default()
        },
    );
    let mut target = Timed {
        inner: Sequences::new(vec![MockSeq::new(lm)]),
        per_call,
        per_row,
    };
    let req = [GenRequest::new(vec![7, 9, 11], params, new_tokens)];
    let t0 = Instant::now();
    let out = dec.generate(&mut target, prop, &req).unwrap();
    let took = t0.elapsed();
    (out[0].tokens.clone(), dec.metrics().clone(), took)
}

const ROW_COSTS: (Duration, Duration) = (Duration::ZERO, Duration::from_micros(1500));
const CALL_COSTS: (Duration, Duration) = (Duration::from_millis(3), Duration::ZERO);

/// Rejected drafts on a target whose every row costs as much as a call: speculation can only
/// lose (5 rows for 1 token), so the default decoder falls back to plain steps, keeps the greedy
/// output, and takes well under the time of speculating on every step.
#[test]
fn speculation_stops_where_it_loses() {
    let lm = MockLm::peaked(V);
    let want = reference_greedy(&lm, &[7, 9, 11], 3 + 300, &[]);
    let run = |catches_up, speculation| {
        let greedy = SamplingParams::greedy();
        let mut drafts = WrongDrafts(lm, catches_up);
        timed_run(&mut drafts, greedy, speculation, ROW_COSTS, 300)
    };
    let (always, am, at) = run(false, Speculation::Always);
    let (paying, pm, pt) = run(false, Speculation::WhilePaying);
    eprintln!("always: {at:?}, {am}\nwhile paying: {pt:?}, {pm}");
    assert_eq!(always, want);
    assert_eq!(
        paying, want,
        "switching to plain steps changed the greedy output"
    );
    assert_eq!(am.plain_steps, 0);
    assert_eq!(am.accepted, 0);
    assert!(
        pm.plain_steps * 10 >= pm.target_calls * 8,
        "only {} of {} steps were plain",
        pm.plain_steps,
        pm.target_calls
    );
    assert!(pt * 2 < at, "while paying {pt:?}, always {at:?}");
    assert!(pm.to_string().contains("steps without drafts"));
    // A lookup is tried again now and then; a proposer that must catch up on the steps it
    // missed is not, once plain steps measured faster: it drafts in the first step and the
    // two compared ones only.
    assert!(
        pm.target_calls - pm.plain_steps > 3,
        "a lookup was never tried again: {pm}"
    );
    let (stateful, sm, _) = run(true, Speculation::WhilePaying);
    assert_eq!(stateful, want);
    assert_eq!(sm.target_calls - sm.plain_steps, 3, "{sm}");
}

/// Drafts that are always right on a target whose calls cost the same at any row count:
/// speculation wins ~5×, and the default decoder keeps it, trying plain steps rarely (two to
/// start with, then about 1/32 of the time).
#[test]
fn speculation_continues_where_it_pays() {
    let lm = MockLm::peaked(V);
    let want = reference_greedy(&lm, &[7, 9, 11], 3 + 300, &[]);
    let mut oracle = DraftModelProposer::new(MockDraft::new(lm, 0.0, RowKind::OneHot));
    let (got, m, _) = timed_run(
        &mut oracle,
        SamplingParams::greedy(),
        Speculation::WhilePaying,
        CALL_COSTS,
        300,
    );
    eprintln!("{m}");
    assert_eq!(got, want);
    assert_eq!(
        m.accepted, m.proposed,
        "the oracle's drafts are the target's argmax"
    );
    assert!(m.plain_steps >= 1, "plain decoding was never measured");
    assert!(
        m.plain_steps * 8 <= m.target_calls,
        "{} of {} steps were plain",
        m.plain_steps,
        m.target_calls
    );
}

/// A sampled request always speculates (the way a step is taken would otherwise depend on
/// timing, and a seeded run's tokens with it), so a seeded run replays even where drafts lose.
#[test]
fn sampled_requests_always_speculate_and_replay() {
    let lm = MockLm::peaked(V);
    let params = SamplingParams::seeded(0.8, 31);
    let run = || {
        timed_run(
            &mut WrongDrafts(lm, false),
            params,
            Speculation::WhilePaying,
            (Duration::ZERO, Duration::from_micros(200)),
            40,
        )
    };
    let (a, am, _) = run();
    let (b, _, _) = run();
    assert_eq!(a, b, "a seeded sampled run did not replay");
    assert_eq!(am.plain_steps, 0);
    assert!(am.proposed > 0);
}

// ---- distribution ----

/// Significance of every χ² test here.
const ALPHA: f64 = 1e-7;
/// Tokens generated per trial (positions tested).
const J: usize = 4;
const TRIALS: usize = 30_000;
const DV: usize = 6;
const TEMPERATURE: f32 = 1.0;

fn dist_lm() -> MockLm {
    MockLm {
        vocab: DV,
        salt: 77,
        peak: 1.5,
        noise: 2.0,
        order: 2,
        weak_every: 3,
    }
}

const PROMPT: [u32; 5] = [1, 4, 2, 1, 4];

/// Exact probabilities of every continuation of J tokens (index = base-DV digits, first token
/// most significant) under plain autoregressive sampling from the mock.
fn exact_joint(lm: &MockLm) -> Vec<f64> {
    let mut probs = vec![0.0; DV.pow(J as u32)];
    fn walk(lm: &MockLm, ctx: &mut Vec<u32>, depth: usize, p: f64, idx: usize, out: &mut [f64]) {
        if depth == J {
            out[idx] = p;
            return;
        }
        let q = lm.probs(ctx, f64::from(TEMPERATURE));
        for (y, &py) in q.iter().enumerate() {
            ctx.push(y as u32);
            walk(lm, ctx, depth + 1, p * py, idx * DV + y, out);
            ctx.pop();
        }
    }
    walk(lm, &mut PROMPT.to_vec(), 0, 1.0, 0, &mut probs);
    probs
}

/// Runs `trials` sampled generations of J tokens; returns whether every test passed, and the
/// outcomes' descriptions.
fn distribution_passes(
    verifier: &Verifier,
    prop: Prop,
    scorer: Scorer,
    k: usize,
    fault: DecodeFault,
    seed_base: u64,
    trials: usize,
) -> (bool, String, Metrics) {
    let lm = dist_lm();
    let reqs: Vec<GenRequest> = (0..trials)
        .map(|i| {
            GenRequest::new(
                PROMPT.to_vec(),
                SamplingParams::seeded(TEMPERATURE, seed_base + i as u64),
                J,
            )
        })
        .collect();
    let config = DecoderConfig {
        num_drafts: k,
        fault,
        ..DecoderConfig::default()
    };
    let (out, m) = run(verifier, lm, &reqs, prop, scorer, config);
    let joint = exact_joint(&lm);
    let mut joint_counts = vec![0u64; joint.len()];
    let mut pos_counts = vec![vec![0u64; DV]; J];
    for g in &out {
        assert_eq!(g.tokens.len(), J);
        let mut idx = 0;
        for (j, &t) in g.tokens.iter().enumerate() {
            assert!((t as usize) < DV);
            pos_counts[j][t as usize] += 1;
            idx = idx * DV + t as usize;
        }
        joint_counts[idx] += 1;
    }
    let mut ok = true;
    let mut report = String::new();
    for (j, counts) in pos_counts.iter().enumerate() {
        // Marginal of position j: sum the joint over the other positions.
        let mut marginal = vec![0.0; DV];
        for (idx, &p) in joint.iter().enumerate() {
            marginal[(idx / DV.pow((J - 1 - j) as u32)) % DV] += p;
        }
        let o = chi_square_gof(counts, &marginal, ALPHA);
        ok &= o.passed();
        report += &format!("position {j}: {o}\n");
    }
    let o = chi_square_gof(&joint_counts, &joint, ALPHA);
    ok &= o.passed();
    report += &format!("joint: {o}\n");
    (ok, report, m)
}

#[test]
fn speculative_sampling_keeps_the_target_distribution() {
    let v = cpu();
    let cases = [
        (Prop::Plain, Scorer::Expansion, 0),
        (Prop::Draft(RowKind::Probs, 3.0), Scorer::MultiQuery, 3),
        (Prop::Draft(RowKind::Logits, 3.0), Scorer::Expansion, 2),
        (Prop::Ngram(1, 2), Scorer::Expansion, 3),
    ];
    for (i, (prop, scorer, k)) in cases.into_iter().enumerate() {
        let (ok, report, m) = distribution_passes(
            &v,
            prop,
            scorer,
            k,
            DecodeFault::None,
            1_000_000 * i as u64,
            TRIALS,
        );
        eprintln!("{prop:?} {scorer:?} k={k}\n{report}{m}");
        assert!(ok, "{prop:?} k={k}: {report}");
        if k > 0 {
            // Rejections happened (the residual was used) and so did acceptances.
            assert!(m.accepted > 0 && m.accepted < m.proposed, "{m}");
            assert!(m.draft_efficiency().unwrap() < 0.95, "{m}");
        }
    }
}

#[test]
fn negative_controls_wrong_loops_are_detected() {
    let v = cpu();
    let faults = [
        DecodeFault::EmitDraftOnReject,
        DecodeFault::ResampleFromTarget,
    ];
    for (i, fault) in faults.into_iter().enumerate() {
        let (ok, report, m) = distribution_passes(
            &v,
            Prop::Draft(RowKind::Probs, 3.0),
            Scorer::MultiQuery,
            3,
            fault,
            77_000_000 + 1_000_000 * i as u64,
            TRIALS,
        );
        eprintln!("{fault:?}\n{report}{m}");
        assert!(
            !ok,
            "{fault:?}: the wrong decode loop must fail the same test: {report}"
        );
    }
}

#[test]
fn speculative_sampling_keeps_the_target_distribution_gpu() {
    let Some(g) = gpu() else { return };
    let (ok, report, m) = distribution_passes(
        g,
        Prop::Draft(RowKind::Probs, 3.0),
        Scorer::MultiQuery,
        3,
        DecodeFault::None,
        5_000_000,
        // Fewer trials than on the CPU: lavapipe verifies ~10× slower than the CPU backend.
        TRIALS / 3,
    );
    eprintln!("GPU\n{report}{m}");
    assert!(ok, "{report}");
    assert!(m.accepted > 0 && m.accepted < m.proposed, "{m}");
}

//! Bad input is rejected on the host, before any dispatch, with a typed error whose message says
//! what is wrong — on both backends.

mod common;
use common::*;
use specdec::{
    Draft, Error, Request, Rule, SamplingParams, Verifier, VerifierOptions, VerifyBatch,
    MAX_DRAFTS_PER_REQUEST,
};

fn base() -> Owned {
    let mut g = Gen::new(1);
    Owned::random(&mut g, 16, &[2, 0, 1], &[1.0, 0.0], 0, 0.5)
}

fn expect_err(v: &Verifier, b: &VerifyBatch<'_>, check: impl Fn(&Error) -> bool, needle: &str) {
    let e = v
        .verify_blocking(b)
        .expect_err("bad input must be rejected");
    assert!(check(&e), "{}: unexpected error {e:?}", v.describe());
    let msg = e.to_string();
    assert!(
        msg.contains(needle),
        "message {msg:?} should mention {needle:?}"
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    each_backend(|v: &Verifier| {
        let b = base();
        // Target rows vs requests.
        let mut x = b.clone();
        x.target.truncate(x.target.len() - 16);
        expect_err(
            v,
            &x.batch(),
            |e| {
                matches!(
                    e,
                    Error::TargetRowCount {
                        expected_rows: 6,
                        ..
                    }
                )
            },
            "Σ(num_drafts + 1) = 6",
        );
        // Draft ids vs drafts.
        let mut x = b.clone();
        x.drafts.pop();
        expect_err(
            v,
            &x.batch(),
            |e| {
                matches!(
                    e,
                    Error::DraftIdCount {
                        expected: 3,
                        got: 2
                    }
                )
            },
            "add up to 3",
        );
        // Ids out of range, both sides.
        for bad in [16, -2, i32::MAX] {
            let mut x = b.clone();
            x.drafts[1] = bad;
            expect_err(
                v,
                &x.batch(),
                |e| matches!(e, Error::TokenOutOfRange { index: 1, .. }),
                "outside [-1, 16)",
            );
        }
        // Temperatures.
        for t in [f32::NAN, -0.5, f32::INFINITY] {
            let mut x = b.clone();
            x.requests[2].params.temperature = t;
            expect_err(
                v,
                &x.batch(),
                |e| matches!(e, Error::InvalidTemperature { request: 2, .. }),
                "finite and >= 0",
            );
        }
        // Vocabulary 0.
        let mut x = b.clone();
        x.vocab = 0;
        expect_err(
            v,
            &x.batch(),
            |e| matches!(e, Error::InvalidVocab { vocab_size: 0 }),
            "vocab_size 0",
        );
        // Too many drafts.
        let mut x = b.clone();
        x.requests[0].num_drafts = MAX_DRAFTS_PER_REQUEST + 1;
        expect_err(
            v,
            &x.batch(),
            |e| matches!(e, Error::TooManyDrafts { request: 0, .. }),
            "at most 1024",
        );
        // Draft rows mismatched.
        let mut x = b.clone();
        x.draft_kind = 1;
        x.draft = vec![0.1; 2 * 16];
        expect_err(
            v,
            &x.batch(),
            |e| {
                matches!(
                    e,
                    Error::DraftRowCount {
                        expected_rows: 3,
                        ..
                    }
                )
            },
            "one per draft",
        );
        // Synthetic without / with wrong rates.
        let mut x = b.clone();
        x.requests[0].params.rule = Rule::Synthetic;
        expect_err(
            v,
            &x.batch(),
            |e| matches!(e, Error::SyntheticRates { .. }),
            "synthetic_rates is None",
        );
        x.rates = Some(vec![0.5; 2]);
        expect_err(
            v,
            &x.batch(),
            |e| matches!(e, Error::SyntheticRates { .. }),
            "one rate each",
        );
        x.rates = Some(vec![0.5, 1.5, 0.5]);
        expect_err(
            v,
            &x.batch(),
            |e| matches!(e, Error::SyntheticRates { .. }),
            "rate[1] = 1.5",
        );
        x.rates = Some(vec![0.5, f32::NAN, 0.5]);
        expect_err(
            v,
            &x.batch(),
            |e| matches!(e, Error::SyntheticRates { .. }),
            "not a probability",
        );
    });
}

#[test]
fn empty_batch_is_valid() {
    each_backend(|v: &Verifier| {
        let out = v
            .verify_blocking(&VerifyBatch {
                vocab_size: 10,
                requests: &[],
                draft_token_ids: &[],
                target_logits: &[],
                draft: Draft::OneHot,
                synthetic_rates: None,
            })
            .unwrap();
        assert!(out.is_empty());
        assert!(out.tokens.is_empty());
    });
}

#[test]
fn at_least_128_drafts_per_request_are_supported() {
    each_backend(|v: &Verifier| {
        let mut g = Gen::new(2);
        let b = Owned::random(&mut g, 64, &[200, 128], &[1.0], 1, 1.0);
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.stride, 201);
        assert!(out.num_emitted.iter().all(|&n| (1..=201).contains(&n)));
    });
}

#[test]
fn gpu_buffer_errors_are_caught_before_recording() {
    let Some(v) = gpu() else { return };
    let (device, _) = v.device().unwrap();
    let b = base();
    let buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let batch = |offset| specdec::GpuVerifyBatch {
        vocab_size: b.vocab,
        requests: &b.requests,
        draft_token_ids: &b.drafts,
        target_logits: specdec::GpuRows {
            buffer: &buf,
            offset,
        },
        draft: specdec::GpuDraft::OneHot,
        synthetic_rates: None,
    };
    let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    match v.record(&mut enc, &batch(0)) {
        Err(Error::BufferTooSmall {
            needed: 384,
            size: 256,
            ..
        }) => {}
        other => panic!("expected BufferTooSmall, got {:?}", other.err()),
    }
    match v.record(&mut enc, &batch(2)) {
        Err(Error::MisalignedOffset { offset: 2, .. }) => {}
        other => panic!("expected MisalignedOffset, got {:?}", other.err()),
    }
    // The CPU backend cannot record.
    let c = Verifier::cpu(VerifierOptions::default());
    assert!(matches!(c.record(&mut enc, &batch(0)), Err(Error::NotGpu)));
}

#[allow(dead_code)]
fn unused(_: Request, _: SamplingParams) {}

//! The bad-input catalogue: every case is a typed error whose message says what is
//! wrong, found on the host before anything is dispatched, on both backends, with no panic.

mod common;
use common::*;
use specdec::{
    Draft, Error, GpuDraft, GpuRows, GpuVerifyBatch, Logits, PipelineBuild, Rule, Verifier,
    VerifierOptions, VerifyBatch, MAX_DRAFTS_PER_REQUEST,
};

/// 3 requests (2, 0 and 1 drafts: 6 target rows, 3 draft rows) over a 16-token vocabulary.
fn base() -> Owned {
    let mut g = Gen::new(1);
    Owned::random(&mut g, 16, &[2, 0, 1], &[1.0, 0.0], 0, 0.5)
}

type Mutate = fn(&mut Owned);
type Matches = fn(&Error) -> bool;

/// (name, how to break the base batch, the error expected, a phrase its message must contain)
fn host_cases() -> Vec<(&'static str, Mutate, Matches, &'static str)> {
    vec![
        (
            "one target row missing",
            |b| b.target.truncate(5 * 16),
            |e| {
                matches!(
                    e,
                    Error::TargetRowCount {
                        expected_rows: 6,
                        ..
                    }
                )
            },
            "need Σ(num_drafts + 1) = 6 rows",
        ),
        (
            "one target row too many",
            |b| b.target.extend([0.0; 16]),
            |e| matches!(e, Error::TargetRowCount { .. }),
            "= 7 rows of 16",
        ),
        (
            "target not a whole number of rows",
            |b| b.target.push(0.0),
            |e| matches!(e, Error::TargetRowCount { .. }),
            "(+1 extra)",
        ),
        (
            "empty target with requests",
            |b| b.target.clear(),
            |e| matches!(e, Error::TargetRowCount { .. }),
            "0 values",
        ),
        (
            "a draft id missing",
            |b| {
                b.drafts.pop();
            },
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
        ),
        (
            "a draft id too many",
            |b| b.drafts.push(1),
            |e| {
                matches!(
                    e,
                    Error::DraftIdCount {
                        expected: 3,
                        got: 4
                    }
                )
            },
            "has 4 ids",
        ),
        (
            "draft id = V",
            |b| b.drafts[0] = 16,
            |e| {
                matches!(
                    e,
                    Error::TokenOutOfRange {
                        index: 0,
                        token: 16,
                        ..
                    }
                )
            },
            "outside [-1, 16)",
        ),
        (
            "draft id = -2",
            |b| b.drafts[1] = -2,
            |e| matches!(e, Error::TokenOutOfRange { index: 1, .. }),
            "or -1 for an invalid draft",
        ),
        (
            "draft id = i32::MIN",
            |b| b.drafts[2] = i32::MIN,
            |e| matches!(e, Error::TokenOutOfRange { index: 2, .. }),
            "draft_token_ids[2]",
        ),
        (
            "draft id = i32::MAX",
            |b| b.drafts[2] = i32::MAX,
            |e| matches!(e, Error::TokenOutOfRange { .. }),
            "2147483647",
        ),
        (
            "temperature NaN",
            |b| b.requests[0].params.temperature = f32::NAN,
            |e| matches!(e, Error::InvalidTemperature { request: 0, .. }),
            "finite and >= 0",
        ),
        (
            "temperature negative",
            |b| b.requests[1].params.temperature = -0.5,
            |e| matches!(e, Error::InvalidTemperature { request: 1, .. }),
            "temperature -0.5",
        ),
        (
            "temperature +inf",
            |b| b.requests[2].params.temperature = f32::INFINITY,
            |e| matches!(e, Error::InvalidTemperature { request: 2, .. }),
            "(0 means greedy)",
        ),
        (
            "temperature -inf",
            |b| b.requests[2].params.temperature = f32::NEG_INFINITY,
            |e| matches!(e, Error::InvalidTemperature { .. }),
            "-inf",
        ),
        ("temperature -0.0 is greedy, fine", |_| {}, |_| false, ""),
        (
            "vocab 0",
            |b| b.vocab = 0,
            |e| matches!(e, Error::InvalidVocab { vocab_size: 0 }),
            "vocab_size 0",
        ),
        (
            "vocab above i32::MAX",
            |b| b.vocab = u32::MAX,
            |e| matches!(e, Error::InvalidVocab { .. }),
            "between 1 and",
        ),
        (
            "too many drafts",
            |b| b.requests[0].num_drafts = MAX_DRAFTS_PER_REQUEST + 1,
            |e| {
                matches!(
                    e,
                    Error::TooManyDrafts {
                        request: 0,
                        num_drafts: 1025
                    }
                )
            },
            "at most 1024",
        ),
        (
            "u32::MAX drafts",
            |b| b.requests[1].num_drafts = u32::MAX,
            |e| matches!(e, Error::TooManyDrafts { request: 1, .. }),
            "split the proposal",
        ),
        (
            "draft probability rows missing",
            |b| {
                b.draft_kind = 1;
                b.draft = vec![0.1; 2 * 16];
            },
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
        ),
        (
            "draft probability rows too many",
            |b| {
                b.draft_kind = 1;
                b.draft = vec![0.1; 4 * 16];
            },
            |e| matches!(e, Error::DraftRowCount { .. }),
            "= 4 rows",
        ),
        (
            "draft logits not whole rows",
            |b| {
                b.draft_kind = 2;
                b.draft = vec![0.1; 3 * 16 + 5];
            },
            |e| matches!(e, Error::DraftRowCount { .. }),
            "(+5 extra)",
        ),
        (
            "draft logits absent",
            |b| {
                b.draft_kind = 2;
                b.draft.clear();
            },
            |e| matches!(e, Error::DraftRowCount { .. }),
            "0 values",
        ),
        (
            "synthetic without rates",
            |b| b.requests[0].params.rule = Rule::Synthetic,
            |e| matches!(e, Error::SyntheticRates { .. }),
            "synthetic_rates is None",
        ),
        (
            "synthetic rates too few",
            |b| {
                b.requests[0].params.rule = Rule::Synthetic;
                b.rates = Some(vec![0.5; 2]);
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "2 rates given",
        ),
        (
            "synthetic rates too many",
            |b| {
                b.requests[0].params.rule = Rule::Synthetic;
                b.rates = Some(vec![0.5; 4]);
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "one rate each",
        ),
        (
            "synthetic rate above 1",
            |b| {
                b.requests[0].params.rule = Rule::Synthetic;
                b.rates = Some(vec![0.5, 1.5, 0.5]);
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "rate[1] = 1.5",
        ),
        (
            "synthetic rate negative",
            |b| {
                b.requests[0].params.rule = Rule::Synthetic;
                b.rates = Some(vec![-0.1, 0.5, 0.5]);
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "rate[0] = -0.1",
        ),
        (
            "synthetic rate NaN",
            |b| {
                b.requests[2].params.rule = Rule::Synthetic;
                b.rates = Some(vec![0.5, 0.5, f32::NAN]);
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "not a probability",
        ),
        (
            "draft probabilities given for a batch with no drafts",
            |b| {
                for r in &mut b.requests {
                    r.num_drafts = 0;
                }
                b.drafts.clear();
                b.target.truncate(3 * 16);
                b.draft_kind = 1;
                b.draft = vec![0.5; 16];
            },
            |e| {
                matches!(
                    e,
                    Error::DraftRowCount {
                        expected_rows: 0,
                        ..
                    }
                )
            },
            "Σ num_drafts = 0 rows",
        ),
        (
            "greedy synthetic request without rates",
            |b| {
                b.requests[1].params.rule = Rule::Synthetic;
                b.requests[1].params.temperature = 0.0;
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "give one conditional rate per draft",
        ),
        (
            "rates of the wrong length with a k = 0 synthetic request",
            |b| {
                b.requests[1].params.rule = Rule::Synthetic;
                b.rates = Some(vec![]);
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "0 rates given",
        ),
        (
            "draft vocabulary larger than the target's",
            |b| {
                b.draft_kind = 1;
                b.draft = vec![0.1; 3 * 17];
                b.draft_vocab = Some(17);
            },
            |e| {
                matches!(
                    e,
                    Error::InvalidDraftVocab {
                        draft_vocab: 17,
                        vocab: 16
                    }
                )
            },
            "not a larger one",
        ),
        (
            "draft vocabulary 0",
            |b| {
                b.draft_kind = 2;
                b.draft_vocab = Some(0);
            },
            |e| matches!(e, Error::InvalidDraftVocab { draft_vocab: 0, .. }),
            "between 1 and",
        ),
        (
            "draft rows of the target's length with a smaller draft vocabulary",
            |b| {
                b.draft_kind = 2;
                b.draft = vec![0.1; 3 * 16];
                b.draft_vocab = Some(12);
            },
            |e| matches!(e, Error::DraftRowCount { vocab_size: 12, .. }),
            "rows of 12",
        ),
        (
            "synthetic rate +inf",
            |b| {
                b.requests[2].params.rule = Rule::Synthetic;
                b.rates = Some(vec![0.5, f32::INFINITY, 0.5]);
            },
            |e| matches!(e, Error::SyntheticRates { .. }),
            "inf",
        ),
    ]
}

#[test]
fn bad_host_inputs_are_typed_errors() {
    let cases = host_cases();
    each_backend(|v: &Verifier| {
        for (name, mutate, matches, needle) in &cases {
            let mut b = base();
            mutate(&mut b);
            if *name == "temperature -0.0 is greedy, fine" {
                b.requests[0].params.temperature = -0.0;
                let out = v
                    .verify_blocking(&b.batch())
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(out.len(), 3);
                continue;
            }
            let e = v.verify_blocking(&b.batch()).expect_err(name);
            assert!(matches(&e), "{name} on {}: unexpected {e:?}", v.describe());
            let msg = e.to_string();
            assert!(
                msg.contains(needle),
                "{name}: message {msg:?} should mention {needle:?}"
            );
        }
    });
    println!(
        "{} host-input cases, each on every backend (10 GPU-buffer and option cases follow)",
        cases.len()
    );
    assert!(cases.len() >= 36);
}

#[test]
fn empty_batch_is_valid() {
    each_backend(|v: &Verifier| {
        let out = v
            .verify_blocking(&VerifyBatch {
                vocab_size: 10,
                requests: &[],
                draft_token_ids: &[],
                target_logits: Logits::F32(&[]),
                draft: Draft::OneHot,
                draft_vocab_size: None,
                synthetic_rates: None,
            })
            .unwrap();
        assert!(out.is_empty() && out.tokens.is_empty());
    });
}

#[test]
fn at_least_128_drafts_per_request_are_supported() {
    each_backend(|v: &Verifier| {
        let mut g = Gen::new(2);
        let b = Owned::random(&mut g, 64, &[MAX_DRAFTS_PER_REQUEST, 128], &[1.0], 1, 1.0);
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.stride, 1025);
        assert!(out.num_emitted.iter().all(|&n| (1..=1025).contains(&n)));
    });
}

#[test]
fn bad_options_are_typed_errors() {
    let Some(_) = gpu() else { return };
    let e = Verifier::new(VerifierOptions {
        target_workgroups: 0,
        ..Default::default()
    })
    .err()
    .expect("0 workgroups is refused");
    assert!(e.to_string().contains("target_workgroups"), "{e}");
}

#[test]
fn with_tuning_refuses_other_kernels_and_keeps_the_tokens() {
    let Some(v) = gpu() else { return };
    // Each option that selects the kernels is refused by name, and so is a bad tuning.
    let kernel_options = [
        (
            "workgroup_size",
            VerifierOptions {
                workgroup_size: Some(64),
                ..Default::default()
            },
        ),
        (
            "shader_int64",
            VerifierOptions {
                shader_int64: false,
                ..Default::default()
            },
        ),
        (
            "subgroups",
            VerifierOptions {
                subgroups: false,
                ..Default::default()
            },
        ),
        (
            "immediates",
            VerifierOptions {
                immediates: true,
                ..Default::default()
            },
        ),
        (
            "f16_unpack",
            VerifierOptions {
                f16_unpack: false,
                ..Default::default()
            },
        ),
        (
            "shader_checks",
            VerifierOptions {
                shader_checks: Some(wgpu::ShaderRuntimeChecks::unchecked()),
                ..Default::default()
            },
        ),
        (
            "target_workgroups",
            VerifierOptions {
                target_workgroups: 0,
                ..Default::default()
            },
        ),
    ];
    for (name, opts) in kernel_options {
        let e = v.with_tuning(opts).err().expect("refused");
        assert!(
            e.to_string().contains(name),
            "{name}: the error names it: {e}"
        );
        if name != "target_workgroups" {
            assert!(matches!(e, Error::InvalidOptions { .. }), "{name}: {e:?}");
        }
    }
    // Other tuning on the same kernels: the twin's tokens, its own counters, and the first
    // verifier unaffected.
    let mut g = Gen::new(5);
    let b = Owned::random(&mut g, 3000, &[4, 0, 2], &[1.0, 0.0], 1, 0.6);
    let want = cpu().verify_blocking(&b.batch()).unwrap();
    let tuned = v
        .with_tuning(VerifierOptions {
            target_workgroups: 3,
            max_binding_bytes: Some(2 * 3000 * 4 + 256),
            ..test_options()
        })
        .unwrap();
    assert_eq!(tuned.describe(), v.describe());
    assert_eq!(tuned.verify_blocking(&b.batch()).unwrap(), want);
    assert_eq!(v.verify_blocking(&b.batch()).unwrap(), want);
    // On the CPU backend it is a CPU verifier with the options.
    let c = cpu().with_tuning(VerifierOptions::default()).unwrap();
    assert!(c.device().is_none());
    assert_eq!(c.verify_blocking(&b.batch()).unwrap(), want);
}

/// `PipelineBuild::OnDemand` (the default) builds no pipeline with the verifier and only the
/// pipelines a call dispatches; `Eager` through `with_tuning` builds the rest on the shared
/// kernels; on GL every pipeline is built with the verifier. The tokens are the twin's in
/// every case. Fails if a call builds every pipeline, or none, or `Eager` leaves one out.
#[test]
fn pipelines_are_built_on_demand_or_all_at_once() {
    let Some(v) = gpu() else { return };
    let gl = v.adapter_info().unwrap().backend == wgpu::Backend::Gl;
    let (_, total) = v.pipeline_counts();
    assert!(total > 50, "{total} pipelines described");
    if gl || v.options().pipelines == PipelineBuild::Eager {
        // GL (the one GL context) and the WebGPU-limits rerun (eager, to validate every
        // pipeline under those limits) built everything with the verifier.
        assert_eq!(
            v.pipeline_counts(),
            (total, total),
            "built with the verifier"
        );
        eprintln!("every pipeline built with the verifier here (GL or Eager): {total}");
        return;
    }
    let fresh = Verifier::new(VerifierOptions {
        pipelines: PipelineBuild::OnDemand,
        ..test_options()
    })
    .unwrap();
    assert_eq!(
        fresh.pipeline_counts(),
        (0, total),
        "none built with the verifier"
    );
    let mut g = Gen::new(6);
    let b = Owned::random(&mut g, 3000, &[4, 0, 2], &[1.0, 0.0], 1, 0.6);
    let want = cpu().verify_blocking(&b.batch()).unwrap();
    assert_eq!(fresh.verify_blocking(&b.batch()).unwrap(), want);
    let (after_call, _) = fresh.pipeline_counts();
    assert!(
        after_call > 0 && after_call < total / 4,
        "a call builds the passes it dispatches: {after_call} of {total}"
    );
    // The same call again compiles nothing.
    assert_eq!(fresh.verify_blocking(&b.batch()).unwrap(), want);
    assert_eq!(fresh.pipeline_counts().0, after_call);
    let eager = fresh
        .with_tuning(VerifierOptions {
            pipelines: PipelineBuild::Eager,
            ..test_options()
        })
        .unwrap();
    assert_eq!(
        eager.pipeline_counts(),
        (total, total),
        "Eager builds the rest"
    );
    assert_eq!(
        fresh.pipeline_counts(),
        (total, total),
        "on the shared kernels"
    );
    assert_eq!(eager.verify_blocking(&b.batch()).unwrap(), want);
}

fn storage_buffer(device: &wgpu::Device, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test"),
        size,
        usage,
        mapped_at_creation: false,
    })
}

#[test]
fn gpu_buffer_errors_are_caught_before_recording() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().unwrap();
    let b = base();
    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let small = storage_buffer(device, 256, storage);
    let big = storage_buffer(device, 4096, storage);
    queue.write_buffer(&big, 0, &[0u8; 4096]);
    let batch = |t: GpuRows<'_>, d: GpuDraft<'_>| -> Result<(), Error> {
        let gb = GpuVerifyBatch {
            vocab_size: b.vocab,
            requests: &b.requests,
            draft_token_ids: &b.drafts,
            target_logits: t,
            draft: d,
            draft_vocab_size: None,
            synthetic_rates: None,
        };
        let mut enc = device.create_command_encoder(&Default::default());
        v.record(&mut enc, &gb).map(|_| ())
    };
    let rows = |buffer, offset| GpuRows::f32(buffer, offset);
    let mut cases = 0;
    // Target too small (6 rows × 16 × 4 = 384 bytes).
    assert!(matches!(
        batch(rows(&small, 0), GpuDraft::OneHot),
        Err(Error::BufferTooSmall {
            needed: 384,
            size: 256,
            ..
        })
    ));
    cases += 1;
    // Offset pushes the rows past the end.
    assert!(matches!(
        batch(rows(&big, 3800), GpuDraft::OneHot),
        Err(Error::BufferTooSmall { .. })
    ));
    cases += 1;
    // Misaligned target offset.
    assert!(matches!(
        batch(rows(&big, 2), GpuDraft::OneHot),
        Err(Error::MisalignedOffset {
            what: "target logits",
            offset: 2
        })
    ));
    cases += 1;
    // Draft buffer too small (3 rows = 192 bytes) and misaligned draft offset.
    assert!(matches!(
        batch(rows(&big, 0), GpuDraft::Probs(rows(&big, 4000))),
        Err(Error::BufferTooSmall { what: "draft", .. })
    ));
    cases += 1;
    assert!(matches!(
        batch(rows(&big, 0), GpuDraft::Logits(rows(&big, 6))),
        Err(Error::MisalignedOffset { what: "draft", .. })
    ));
    cases += 1;
    // A buffer without STORAGE usage is refused on the host.
    let no_storage = storage_buffer(device, 4096, wgpu::BufferUsages::COPY_DST);
    let e = batch(rows(&no_storage, 0), GpuDraft::OneHot)
        .expect_err("a buffer without STORAGE usage is refused");
    assert!(
        matches!(
            e,
            Error::BufferUsage {
                what: "target logits"
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("BufferUsages::STORAGE"), "{e}");
    cases += 1;
    // A buffer from another device is NOT in this catalogue: wgpu 30 does not tell which
    // device a buffer belongs to, and a buffer of another wgpu instance was seen to be silently
    // taken for one of ours (wgpu-core resolves it in the wrong registry). The README says so.
    // The CPU backend cannot record.
    let c = Verifier::cpu(VerifierOptions::default());
    let gb = GpuVerifyBatch {
        vocab_size: b.vocab,
        requests: &b.requests,
        draft_token_ids: &b.drafts,
        target_logits: rows(&big, 0),
        draft: GpuDraft::OneHot,
        draft_vocab_size: None,
        synthetic_rates: None,
    };
    let mut enc = device.create_command_encoder(&Default::default());
    assert!(matches!(c.record(&mut enc, &gb), Err(Error::NotGpu)));
    cases += 1;
    // A row larger than one binding allows.
    let tiny = gpu_tuned(VerifierOptions {
        max_binding_bytes: Some(32),
        ..Default::default()
    });
    let e = tiny
        .verify_blocking(&b.batch())
        .expect_err("a 64-byte row does not fit a 32-byte binding");
    assert!(
        matches!(e, Error::RowTooLarge { row_bytes: 64, .. }),
        "{e:?}"
    );
    cases += 1;
    // More requests than one dispatch dimension.
    let n = 70_000usize;
    let many = Owned {
        vocab: 1,
        requests: vec![
            specdec::Request {
                num_drafts: 0,
                params: specdec::SamplingParams::greedy(),
                position: 0
            };
            n
        ],
        drafts: vec![],
        target: vec![0.0; n],
        draft_kind: 0,
        draft: vec![],
        rates: None,
        draft_vocab: None,
    };
    let e = v
        .verify_blocking(&many.batch())
        .expect_err("70,000 requests exceed one dispatch dimension");
    assert!(matches!(e, Error::BatchTooLarge { .. }), "{e:?}");
    assert_eq!(
        cpu().verify_blocking(&many.batch()).unwrap().len(),
        n,
        "the CPU backend has no such limit"
    );
    cases += 1;
    println!("{cases} GPU-buffer cases");
}

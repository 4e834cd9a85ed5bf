//! The GPU decode loop (`specdec::models::GpuDecoder`) on SmolLM2-135M: the target and a
//! layer-skip draft forward on the GPU, the verifier reads the target's rows in the same command
//! encoder, only token ids come back.
//!
//! - greedy speculative output (draft model, n-gram drafts) equals greedy plain output, token for
//!   token;
//! - sampled drafts keep their rows on the GPU as the verifier's `q`: the target as its own
//!   draft has `q == p` bit for bit, so every draft must be accepted (a wrong or stale `q` row
//!   rejects some), while a third of its layers must reject some (the negative control);
//! - plain decoding, which records windows of tokens ahead (each forward fed the previous token
//!   on the GPU), equals a forward-and-argmax loop one token at a time, stops at an
//!   end-of-sequence token inside a window, and replays when seeded;
//! - n-gram steps recorded ahead on a guess of the previous step's outcome keep the output
//!   plain greedy's;
//! - n-gram trees (tree attention in the target's forward, tree verification, the accepted
//!   path's cache entries moved into place) keep greedy output plain greedy's, and a seeded
//!   sampled tree run replays;
//! - a seeded sampled run is reproducible; bad configurations are typed errors.
//!
//! The target is the model's first `SHORT` blocks except in the n-gram tests, which need a model
//! that copies text.
//!
//! Needs the weights (`examples/fetch-models.sh smollm2`) and a GPU adapter (lavapipe in CI:
//! `WGPU_BACKEND=vulkan WGPU_ADAPTER_NAME=llvmpipe XDG_RUNTIME_DIR=/tmp RAYON_NUM_THREADS=1
//! cargo test --release --features candle --test gpu_decode`). No adapter is a failure unless
//! `SPECDEC_SKIP_GPU=1` (the skip is printed).

mod common;

use std::sync::{Arc, OnceLock};

use specdec::models::{
    argmax, models_dir, GpuDecodeConfig, GpuDecoder, GpuModel, GpuModelError, GpuModelOptions,
    GpuProposer, GpuSequence, Weights, PLAIN_WINDOW, SMOLLM2_FILE,
};
use specdec::speculative::{NgramProposer, NgramTreeProposer, Speculation, StopReason};
use specdec::{SamplingParams, Verifier, VerifierOptions};

/// A short Python function (SmolLM2 ids) whose continuation repeats some of it.
const PROMPT: &[u32] = &[
    1604, 3987, 24, 94, 727, 472, 585, 304, 2067, 216, 34, 42, 448, 1003, 304, 472,
];
const NEW_TOKENS: usize = 12;
/// Blocks of the target in the tests of the decode loop's machinery (equal outputs, replays,
/// drafts whose q is p): a prefix of the model is a model too, with the same kernels, at about
/// 0.4× the cost of a forward on lavapipe. The n-gram tests keep every block: they need a
/// model that copies text.
const SHORT: usize = 8;

fn gpu_model() -> Option<Arc<GpuModel>> {
    static M: OnceLock<Option<Arc<GpuModel>>> = OnceLock::new();
    M.get_or_init(|| {
        let v = common::gpu()?;
        let (device, queue) = v.device().expect("common::gpu() is a GPU verifier");
        let path = models_dir().join(SMOLLM2_FILE);
        let w = Weights::load(&path).unwrap_or_else(|e| {
            panic!(
                "cannot load SmolLM2 from {}: {e}\nfetch it with `examples/fetch-models.sh \
                 smollm2` (or point SPECDEC_MODELS at its directory)",
                path.display()
            )
        });
        let m = GpuModel::load(
            w.path(),
            w.config(),
            device,
            queue,
            &GpuModelOptions::default(),
        )
        .unwrap_or_else(|e| panic!("loading SmolLM2 onto the GPU: {e}"));
        Some(Arc::new(m))
    })
    .clone()
}

/// A decoder whose target is the first `layers` blocks of `model`.
fn decoder(
    model: &Arc<GpuModel>,
    layers: usize,
    proposer: GpuProposer,
    k: usize,
) -> Result<GpuDecoder<'static>, GpuModelError> {
    let verifier = common::gpu().expect("gpu_model() found one");
    GpuDecoder::new(
        verifier,
        GpuSequence::with_layers(model.clone(), layers).unwrap(),
        proposer,
        GpuDecodeConfig {
            num_drafts: k,
            // These tests count the speculative path's drafts, guesses and calls; the default
            // policy's plain runs have a test of their own.
            speculation: Speculation::Always,
            ..Default::default()
        },
    )
}

fn layer_skip(model: &Arc<GpuModel>, layers: usize) -> GpuProposer {
    GpuProposer::Model(Box::new(
        GpuSequence::with_layers(model.clone(), layers).unwrap(),
    ))
}

#[test]
fn greedy_speculative_output_equals_plain_output() {
    let Some(model) = gpu_model() else { return };
    let layers = SHORT;
    let mut plain = decoder(&model, layers, GpuProposer::None, 4).unwrap();
    let want = plain
        .generate(PROMPT, SamplingParams::greedy(), NEW_TOKENS)
        .unwrap();
    assert_eq!(want.tokens.len(), NEW_TOKENS);
    assert_eq!(plain.metrics().proposed, 0);
    assert_eq!(plain.metrics().target_calls, NEW_TOKENS as u64);

    let proposers = [
        (
            "layer-skip draft, a third of the layers",
            layer_skip(&model, layers / 3),
        ),
        ("the target as its own draft", layer_skip(&model, layers)),
        (
            "n-gram drafts",
            GpuProposer::Ngram(NgramProposer::new(1, 3).unwrap()),
        ),
    ];
    for (name, proposer) in proposers {
        let mut spec = decoder(&model, layers, proposer, 3).unwrap();
        let got = spec
            .generate(PROMPT, SamplingParams::greedy(), NEW_TOKENS)
            .unwrap();
        let m = spec.metrics();
        eprintln!(
            "{name}: {} target calls for {} tokens, {} of {} drafts accepted",
            m.target_calls, m.appended, m.accepted, m.proposed
        );
        assert_eq!(got, want, "{name}: speculative greedy != plain greedy");
        assert_eq!(m.appended, NEW_TOKENS as u64);
        assert!(m.accepted <= m.proposed);
        if name.starts_with("the target as") {
            // Its drafts are the target's own argmaxes, fed the right tokens (including the
            // first draft of each step, recorded ahead for every outcome): all accepted.
            assert!(m.proposed > 0);
            assert_eq!(m.accepted, m.proposed, "{name}: a draft was rejected");
        }
    }
}

#[test]
fn plain_decoding_runs_ahead_and_equals_one_token_at_a_time() {
    let Some(model) = gpu_model() else { return };
    let vocab = model.config().vocab_size;
    // Three windows: the second and third are fed their first token from the GPU.
    let n = 2 * PLAIN_WINDOW + 4;
    let mut seq = GpuSequence::with_layers(model.clone(), SHORT).unwrap();
    let logits = seq.forward_blocking(PROMPT).unwrap();
    let mut want = vec![argmax(&logits[(PROMPT.len() - 1) * vocab..])];
    while want.len() < n {
        let l = seq.forward_blocking(&want[want.len() - 1..]).unwrap();
        want.push(argmax(&l));
    }
    let mut plain = decoder(&model, SHORT, GpuProposer::None, 4).unwrap();
    let got = plain.generate(PROMPT, SamplingParams::greedy(), n).unwrap();
    assert_eq!(got.tokens, want, "plain decoding != one token at a time");
    assert_eq!(got.stop, StopReason::MaxLen);
    assert_eq!(plain.metrics().target_calls, n as u64);
    // An end-of-sequence token inside the second window (its first occurrence) stops there;
    // the windows recorded past it are dropped, and the next generation, fed the text so far,
    // continues exactly.
    let j = (PLAIN_WINDOW + 1..n - 1)
        .find(|&j| !want[..j].contains(&want[j]))
        .expect("a token that does not occur earlier");
    let verifier = common::gpu().expect("gpu_model() found one");
    let mut eos = GpuDecoder::new(
        verifier,
        GpuSequence::with_layers(model.clone(), SHORT).unwrap(),
        GpuProposer::None,
        GpuDecodeConfig {
            eos: vec![want[j]],
            ..Default::default()
        },
    )
    .unwrap();
    let stopped = eos.generate(PROMPT, SamplingParams::greedy(), n).unwrap();
    assert_eq!(stopped.tokens, want[..=j], "stopped at {j}");
    assert_eq!(stopped.stop, StopReason::Eos);
    let prompt: Vec<u32> = PROMPT.iter().chain(&want[..=j]).copied().collect();
    let rest = plain
        .generate(&prompt, SamplingParams::greedy(), n - j - 1)
        .unwrap();
    assert_eq!(rest.tokens, want[j + 1..]);
    // Seeded sampling replays; another seed is a different text (the negative control). Two
    // windows: the second is fed its first token from the GPU.
    let m = PLAIN_WINDOW + 2;
    let a = plain
        .generate(PROMPT, SamplingParams::seeded(1.0, 3), m)
        .unwrap();
    let b = plain
        .generate(PROMPT, SamplingParams::seeded(1.0, 3), m)
        .unwrap();
    let c = plain
        .generate(PROMPT, SamplingParams::seeded(1.0, 4), m)
        .unwrap();
    assert_eq!(a, b, "a seeded plain run did not replay");
    assert_ne!(a.tokens, c.tokens, "two seeds gave the same {m} tokens");
}

/// The default policy (`Speculation::WhilePaying`) mixes plain runs into a greedy generation
/// with a draft model: its first steps take the two ways in turn, so a run of 40 tokens has at
/// least one plain run, and the output is plain greedy's (the draft model, which plain runs
/// leave behind, catches up when it drafts again). N-gram drafts keep speculating by default,
/// with the same output.
#[test]
fn plain_runs_of_the_default_policy_keep_greedy_output() {
    let Some(model) = gpu_model() else { return };
    let n = 40;
    let mut plain = decoder(&model, SHORT, GpuProposer::None, 4).unwrap();
    let want = plain.generate(PROMPT, SamplingParams::greedy(), n).unwrap();
    let verifier = common::gpu().expect("gpu_model() found one");
    let proposers = [
        ("draft model", layer_skip(&model, 4)),
        (
            "n-gram",
            GpuProposer::Ngram(NgramProposer::new(1, 3).unwrap()),
        ),
    ];
    for (name, proposer) in proposers {
        let target = GpuSequence::with_layers(model.clone(), SHORT).unwrap();
        let mut spec =
            GpuDecoder::new(verifier, target, proposer, GpuDecodeConfig::default()).unwrap();
        let got = spec.generate(PROMPT, SamplingParams::greedy(), n).unwrap();
        let m = spec.metrics();
        eprintln!(
            "{name}: {} plain runs, {} target calls, {} of {} drafts accepted",
            m.plain_steps, m.target_calls, m.accepted, m.proposed
        );
        assert_eq!(got, want, "{name}: greedy with plain runs != plain greedy");
        assert_eq!(m.appended, n as u64);
        if name == "draft model" {
            assert!(m.plain_steps >= 1, "no plain run was taken");
            assert!(m.proposed > 0, "no draft was proposed");
        } else {
            assert_eq!(m.plain_steps, 0, "n-gram drafts took a plain run");
        }
    }
}

/// On text that repeats itself, n-gram steps are recorded during the previous step on the guess
/// that it accepts every draft, and submitted when its readback confirms that: the output is
/// still plain greedy's.
#[test]
fn ngram_steps_guessed_ahead_equal_plain_greedy() {
    let Some(model) = gpu_model() else { return };
    // A function, then the request to write it again with one name changed: the model copies.
    let text = "def mean(values):\n    total = 0\n    count = 0\n    for v in values:\n        \
                total += v\n        count += 1\n    return total / count\n\n\n# The same \
                function, with `total` renamed to `acc`:\ndef mean(values):\n    acc = 0\n";
    let weights = Weights::load(models_dir().join(SMOLLM2_FILE)).expect("loaded above");
    let prompt = weights.tokenizer().encode(text);
    let n = 24;
    let layers = model.config().layers;
    let mut plain = decoder(&model, layers, GpuProposer::None, 4).unwrap();
    let want = plain
        .generate(&prompt, SamplingParams::greedy(), n)
        .unwrap();
    let ngram = GpuProposer::Ngram(NgramProposer::new(1, 3).unwrap());
    let mut spec = decoder(&model, layers, ngram, 4).unwrap();
    let got = spec.generate(&prompt, SamplingParams::greedy(), n).unwrap();
    let m = spec.metrics();
    eprintln!(
        "{} target calls, {} of {} drafts accepted, {} steps guessed ahead",
        m.target_calls,
        m.accepted,
        m.proposed,
        spec.guessed_steps()
    );
    assert_eq!(got, want, "n-gram greedy != plain greedy");
    assert!(spec.guessed_steps() > 0, "no step was guessed ahead");
}

/// n-gram trees on the GPU: greedy output equals plain greedy's, on a prompt where later
/// occurrences disagree with the first, so that steps accept paths other than the first child's
/// (whose cache entries must move), with steps recorded ahead on a guess; a seeded sampled run
/// replays.
#[test]
fn ngram_tree_decoding_equals_plain_greedy() {
    let Some(model) = gpu_model() else { return };
    let text = "def mean(values):\n    total = 0\n    count = 0\n    for v in values:\n        \
                total += v\n        count += 1\n    return total / count\n\n\ndef total(values):\n\
                \x20   acc = 0\n    for v in values:\n        acc += v\n    return acc\n\n\n\
                # The first function again, with `count` renamed to `n`:\ndef mean(values):\n";
    let weights = Weights::load(models_dir().join(SMOLLM2_FILE)).expect("loaded above");
    let prompt = weights.tokenizer().encode(text);
    let n = 32;
    let layers = model.config().layers;
    let mut plain = decoder(&model, layers, GpuProposer::None, 4).unwrap();
    let want = plain
        .generate(&prompt, SamplingParams::greedy(), n)
        .unwrap();
    let tree = || GpuProposer::NgramTree(NgramTreeProposer::new(1, 3, 4, 24).unwrap());
    let mut spec = decoder(&model, layers, tree(), 6).unwrap();
    let got = spec.generate(&prompt, SamplingParams::greedy(), n).unwrap();
    let m = spec.metrics().clone();
    eprintln!(
        "n-gram tree: {} target calls for {} tokens, {} accepted, {} steps guessed ahead",
        m.target_calls,
        m.appended,
        m.accepted,
        spec.guessed_steps()
    );
    assert_eq!(got, want, "n-gram tree greedy != plain greedy");
    assert!(m.accepted > 0, "no tree node was accepted");
    assert!(spec.guessed_steps() > 0, "no tree step was guessed ahead");
    assert!(m.target_calls < n as u64);
    let params = SamplingParams::seeded(0.8, 11);
    let a = spec.generate(&prompt, params, 8).unwrap();
    let b = spec.generate(&prompt, params, 8).unwrap();
    assert_eq!(a, b, "a seeded sampled tree run did not replay");
    assert_eq!(a.tokens.len(), 8);
}

#[test]
fn sampled_drafts_keep_q_on_the_gpu_and_a_seeded_run_replays() {
    let Some(model) = gpu_model() else { return };
    let layers = SHORT;
    let params = SamplingParams::seeded(1.0, 7);
    // q == p bit for bit: u · q(d) < p(d) holds for every u < 1, so nothing may be rejected.
    let mut same = decoder(&model, layers, layer_skip(&model, layers), 3).unwrap();
    let a = same.generate(PROMPT, params, NEW_TOKENS).unwrap();
    let m = same.metrics().clone();
    eprintln!(
        "own draft, T = 1: {} of {} drafts accepted",
        m.accepted, m.proposed
    );
    assert!(m.proposed > 0);
    assert_eq!(
        m.accepted, m.proposed,
        "a draft whose q equals p was rejected"
    );
    // Replay: the same seed gives the same tokens.
    same.reset_metrics();
    let b = same.generate(PROMPT, params, NEW_TOKENS).unwrap();
    assert_eq!(a, b, "a seeded sampled run did not replay");
    // Negative control: a third of the layers is a different q; it must reject some drafts,
    // which shows the test above can fail.
    let mut other = decoder(&model, layers, layer_skip(&model, (layers / 3).max(1)), 3).unwrap();
    let c = other.generate(PROMPT, params, NEW_TOKENS).unwrap();
    let m = other.metrics();
    eprintln!(
        "third-of-layers draft, T = 1: {} of {} drafts accepted",
        m.accepted, m.proposed
    );
    assert!(
        m.accepted < m.proposed,
        "a different draft model accepted every draft"
    );
    assert_eq!(c.tokens.len(), NEW_TOKENS);
}

#[test]
fn bad_configurations_are_typed_errors() {
    let Some(model) = gpu_model() else { return };
    // A CPU verifier cannot read GPU rows.
    let cpu = Verifier::cpu(VerifierOptions::default());
    let e = GpuDecoder::new(
        &cpu,
        GpuSequence::new(model.clone()).unwrap(),
        GpuProposer::None,
        GpuDecodeConfig::default(),
    )
    .err()
    .expect("a CPU verifier was taken");
    assert!(matches!(e, GpuModelError::Invalid(_)), "{e}");
    // More drafts than one forward scores.
    let e = decoder(&model, SHORT, GpuProposer::None, 64)
        .err()
        .expect("k = 64 was taken");
    assert!(matches!(e, GpuModelError::Invalid(_)), "{e}");
    // An empty prompt.
    let mut d = decoder(&model, SHORT, GpuProposer::None, 2).unwrap();
    let e = d.generate(&[], SamplingParams::greedy(), 4).unwrap_err();
    assert!(matches!(e, GpuModelError::Invalid(_)), "{e}");
}

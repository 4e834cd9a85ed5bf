//! Speculative decoding with real models: Qwen2.5-Coder-1.5B verifies the drafts of
//! Qwen2.5-Coder-0.5B (or SmolLM2 verifies its own first layers), beside plain decoding of the
//! same prompt as the baseline. Where the backend policy finds a real GPU (`specdec info`), both
//! run on it: the models' forward passes through `specdec::models::GpuModel` and the decode loop
//! through `GpuDecoder`, with the target's logits verified where they are. Otherwise (or with
//! `--cpu`) the models run on the CPU (`specdec::models::Model`: the project's Q8_0 matmul where
//! the CPU has AVX-512 VNNI, candle's kernels elsewhere) and the loop is `specdec::speculative`'s
//! `SpecDecoder`.
//!
//! ```text
//! examples/fetch-models.sh qwen
//! cargo run --release --features candle --example speculative -- "Write a Python function that merges two sorted lists."
//! cargo run --release --features candle --example speculative -- --self 12 "The capital of France is"
//! ```
//!
//! Options: `--cpu` the CPU path even with a GPU, `--k N` drafts per step (4), `--tokens N` new
//! tokens (64), `--self N` SmolLM2 with a
//! layer-skip draft of its first N blocks instead of the Qwen pair, `--temperature T`
//! (0 = greedy; then the output must equal plain greedy decoding, which is checked), `--seed S`.
//! Both models are loaded with `requantize_to_q8_0`, which matters only where candle's kernels run
//! (its Q5_0/Q4_1 dot products are scalar, which would make the 0.5B draft slower than the 1.5B
//! target).

use std::process::ExitCode;
use std::time::Instant;

use std::sync::Arc;

use specdec::models::{
    generate, models_dir, GenerateOptions, GpuDecodeConfig, GpuDecoder, GpuModel, GpuModelOptions,
    GpuProposer, GpuSequence, GreedyDraft, LoadOptions, Model, Weights, QWEN_0_5B_FILE,
    QWEN_1_5B_FILE, SMOLLM2_FILE,
};
use specdec::speculative::{
    DecoderConfig, DraftModelProposer, GenRequest, Sequences, SpecDecoder, Speculation,
};
use specdec::{DeviceChoice, SamplingParams, Verifier, VerifierOptions};

fn main() -> ExitCode {
    // Before any thread: keeps Mesa's Vulkan layer quiet on machines without a desktop login.
    specdec::device::quiet_vulkan_device_select();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("speculative: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut k, mut new_tokens, mut self_layers, mut temperature, mut seed) =
        (4usize, 64usize, None, 0.0f32, 1u64);
    let mut force_cpu = false;
    let mut prompt = None;
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--k" => k = value("--k")?.parse()?,
            "--tokens" => new_tokens = value("--tokens")?.parse()?,
            "--self" => self_layers = Some(value("--self")?.parse::<usize>()?),
            "--temperature" => temperature = value("--temperature")?.parse()?,
            "--seed" => seed = value("--seed")?.parse()?,
            "--cpu" => force_cpu = true,
            _ if a.starts_with("--") => return Err(format!("unknown option {a}").into()),
            _ if prompt.is_none() => prompt = Some(a),
            _ => return Err(format!("unexpected argument {a}").into()),
        }
    }
    let prompt = prompt
        .unwrap_or_else(|| "Write a Python function that merges two sorted lists.".to_string());
    let load = LoadOptions {
        requantize_to_q8_0: true,
        ..LoadOptions::default()
    };
    let started = Instant::now();
    let (target_weights, draft_template) = match self_layers {
        Some(n) => {
            let w = Weights::load_with(models_dir().join(SMOLLM2_FILE), &load)?;
            let draft = Model::layer_skip(w.clone(), n)?;
            (w, draft)
        }
        None => {
            let t = Weights::load_with(models_dir().join(QWEN_1_5B_FILE), &load)?;
            let d = Weights::load_with(models_dir().join(QWEN_0_5B_FILE), &load)?;
            (t, Model::new(d))
        }
    };
    println!(
        "target {} ({} layers), draft {} layers, loaded in {:.1} s",
        target_weights.path().display(),
        target_weights.config().layers,
        draft_template.layers(),
        started.elapsed().as_secs_f64()
    );
    let tok = target_weights.tokenizer();
    let ids = tok.encode(&format!(
        "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ));
    let mut eos: Vec<u32> = tok.eos_token().into_iter().collect();
    eos.extend(tok.token_id("<|im_end|>"));
    eos.extend(tok.token_id("<|endoftext|>"));

    let params = if temperature > 0.0 {
        SamplingParams::seeded(temperature, seed)
    } else {
        SamplingParams::greedy()
    };
    let run = Run {
        ids,
        eos,
        k,
        new_tokens,
        params,
    };
    let gpu = if force_cpu {
        None
    } else {
        let v = Verifier::auto(VerifierOptions::default())?;
        println!("backend: {}", v.describe());
        v.is_gpu().then_some(v)
    };
    let (plain, spec) = match &gpu {
        Some(verifier) => run_gpu(
            verifier,
            &target_weights,
            &draft_template,
            self_layers,
            &run,
        )?,
        None => run_cpu(&target_weights, draft_template, &run)?,
    };
    let (plain_tok_s, spec_tok_s) = (plain.1, spec.1);
    println!("---- plain ({} tokens)", plain.0.len());
    println!("{}", tok.decode(&plain.0));
    println!("---- speculative ({} tokens)", spec.0.len());
    println!("{}", tok.decode(&spec.0));
    println!("----");
    println!("{}", spec.2);
    let ratio = spec_tok_s / plain_tok_s;
    println!(
        "plain: {plain_tok_s:.2} tokens/s; speculative: {spec_tok_s:.2} tokens/s; speed-up {ratio:.2}×"
    );
    // A step emits `per_step` tokens and costs `per_step / ratio` plain tokens' time.
    let per_step = spec.3;
    let step_cost = per_step / ratio;
    if ratio < 1.0 {
        println!(
            "speculation does not pay on this machine: a step emitted {per_step:.2} tokens on \
             average but took as long as {step_cost:.2} plain tokens (its draft forwards, the \
             target's k + 1-row call and the verification); a cheaper draft (--self N: the \
             target's first N layers) or drafts accepted more often would pay more (greedy \
             decoding falls back to plain steps once it has measured them faster: the table's \
             'steps without drafts'; before that it tried both)"
        );
    } else {
        println!(
            "speculation pays here: a step emitted {per_step:.2} tokens in the time of \
             {step_cost:.2} plain tokens"
        );
    }
    if temperature == 0.0 {
        if spec.0 != plain.0 {
            return Err("greedy speculative output differs from plain greedy decoding".into());
        }
        println!("greedy speculative output == plain greedy output");
    }
    Ok(())
}

/// What both paths decode.
struct Run {
    ids: Vec<u32>,
    eos: Vec<u32>,
    k: usize,
    new_tokens: usize,
    params: SamplingParams,
}

/// Tokens, tokens per second, the metrics table, and tokens per target call.
type Outcome = (Vec<u32>, f64, String, f64);

/// Both models and the loop on the GPU; plain decoding is the decoder without drafts (the same
/// kernels, each token fed to the next forward on the GPU), and each
/// is run once untimed first (pipelines, buffers, clocks).
fn run_gpu(
    verifier: &Verifier,
    target_weights: &Arc<Weights>,
    draft_template: &Model,
    self_layers: Option<usize>,
    run: &Run,
) -> Result<(Outcome, Outcome), Box<dyn std::error::Error>> {
    let (device, queue) = verifier.device().ok_or("the verifier has no GPU")?;
    let opts = GpuModelOptions::default();
    let load = |w: &Weights| GpuModel::load(w.path(), w.config(), device, queue, &opts);
    let target = Arc::new(load(target_weights)?);
    let draft = match self_layers {
        Some(n) => GpuSequence::with_layers(target.clone(), n)?,
        None => GpuSequence::new(Arc::new(load(draft_template.weights())?))?,
    };
    let config = GpuDecodeConfig {
        num_drafts: run.k,
        eos: run.eos.clone(),
        synthetic_rates: None,
        speculation: Speculation::WhilePaying,
    };
    let mut plain = GpuDecoder::new(
        verifier,
        GpuSequence::new(target.clone())?,
        GpuProposer::None,
        config.clone(),
    )?;
    let proposer = GpuProposer::Model(Box::new(draft));
    let mut spec = GpuDecoder::new(verifier, GpuSequence::new(target)?, proposer, config)?;
    let outcome = |d: &mut GpuDecoder<'_>| -> Result<Outcome, Box<dyn std::error::Error>> {
        d.generate(&run.ids, run.params, run.new_tokens.min(8))?;
        d.reset_metrics();
        let out = d.generate(&run.ids, run.params, run.new_tokens)?;
        let m = d.metrics();
        let decode = (m.propose_time + m.score_time).as_secs_f64();
        Ok((
            out.tokens.clone(),
            out.tokens.len() as f64 / decode,
            m.to_string(),
            m.appended as f64 / m.target_calls.max(1) as f64,
        ))
    };
    Ok((outcome(&mut plain)?, outcome(&mut spec)?))
}

/// Both models on the CPU through candle, the loop through `SpecDecoder` with a CPU verifier.
fn run_cpu(
    target_weights: &Arc<Weights>,
    draft_template: Model,
    run: &Run,
) -> Result<(Outcome, Outcome), Box<dyn std::error::Error>> {
    // Baseline: plain decoding with the target alone.
    let mut plain_model = Model::new(target_weights.clone());
    let plain_opts = GenerateOptions {
        max_new_tokens: run.new_tokens,
        temperature: run.params.temperature,
        seed: run.params.seed.unwrap_or(1),
        stop_tokens: run.eos.clone(),
    };
    let t0 = Instant::now();
    let plain = generate(&mut plain_model, &run.ids, &plain_opts)?;
    let plain_s = t0.elapsed().as_secs_f64();
    drop(plain_model);

    // Speculative: the same target as a one-slot Sequences, the draft behind GreedyDraft.
    let verifier = Verifier::auto(VerifierOptions {
        device: DeviceChoice::from_env()
            .transpose()?
            .unwrap_or(DeviceChoice::Cpu),
        ..VerifierOptions::default()
    })?;
    let mut decoder = SpecDecoder::new(
        &verifier,
        DecoderConfig {
            num_drafts: run.k,
            eos: run.eos.clone(),
            ..DecoderConfig::default()
        },
    );
    let mut target = Sequences::new(vec![Model::new(target_weights.clone())]);
    let mut proposer = DraftModelProposer::new(GreedyDraft::new(draft_template));
    let request = GenRequest::new(run.ids.clone(), run.params, run.new_tokens);
    let t0 = Instant::now();
    let out = decoder.generate(&mut target, &mut proposer, &[request])?;
    let spec_s = t0.elapsed().as_secs_f64();
    let n = (plain.tokens.len(), out[0].tokens.len());
    let m = decoder.metrics();
    Ok((
        (plain.tokens, n.0 as f64 / plain_s, String::new(), 1.0),
        (
            out[0].tokens.clone(),
            n.1 as f64 / spec_s,
            m.to_string(),
            m.appended as f64 / m.target_calls.max(1) as f64,
        ),
    ))
}

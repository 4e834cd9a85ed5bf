//! Speculative decoding with real models: Qwen2.5-Coder-1.5B verifies the drafts of
//! Qwen2.5-Coder-0.5B (or SmolLM2 verifies its own first layers) through `specdec::spec`'s
//! `SpecDecoder`, beside plain greedy decoding of the same prompt as the baseline.
//!
//! ```text
//! examples/fetch-models.sh qwen
//! cargo run --release --features candle --example speculative -- "Write a Python function that merges two sorted lists."
//! cargo run --release --features candle --example speculative -- --self 12 "The capital of France is"
//! ```
//!
//! Options: `--k N` drafts per step (4), `--tokens N` new tokens (64), `--self N` SmolLM2 with a
//! layer-skip draft of its first N blocks instead of the Qwen pair, `--temperature T`
//! (0 = greedy; then the output must equal plain greedy decoding, which is checked), `--seed S`.
//! Both models are loaded with `requantize_to_q8_0` (see the README: candle's Q5_0/Q4_1 dot
//! products are scalar, which would make the 0.5B draft slower than the 1.5B target).

use std::process::ExitCode;
use std::time::Instant;

use specdec::models::{
    generate, models_dir, GenerateOptions, GreedyDraft, LoadOptions, Model, Weights,
    QWEN_0_5B_FILE, QWEN_1_5B_FILE, SMOLLM2_FILE,
};
use specdec::speculative::{DecoderConfig, DraftModelProposer, GenRequest, Sequences, SpecDecoder};
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
    let mut prompt = None;
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--k" => k = value("--k")?.parse()?,
            "--tokens" => new_tokens = value("--tokens")?.parse()?,
            "--self" => self_layers = Some(value("--self")?.parse::<usize>()?),
            "--temperature" => temperature = value("--temperature")?.parse()?,
            "--seed" => seed = value("--seed")?.parse()?,
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

    // Baseline: plain decoding with the target alone.
    let mut plain_model = Model::new(target_weights.clone());
    let plain_opts = GenerateOptions {
        max_new_tokens: new_tokens,
        temperature,
        seed,
        stop_tokens: eos.clone(),
    };
    let t0 = Instant::now();
    let plain = generate(&mut plain_model, &ids, &plain_opts)?;
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
            num_drafts: k,
            eos,
            ..DecoderConfig::default()
        },
    );
    let mut target = Sequences::new(vec![Model::new(target_weights.clone())]);
    let mut proposer = DraftModelProposer::new(GreedyDraft::new(draft_template));
    let params = if temperature > 0.0 {
        SamplingParams::seeded(temperature, seed)
    } else {
        SamplingParams::greedy()
    };
    let request = GenRequest::new(ids.clone(), params, new_tokens);
    let t0 = Instant::now();
    let out = decoder.generate(&mut target, &mut proposer, &[request])?;
    let spec_s = t0.elapsed().as_secs_f64();

    println!("---- plain ({} tokens)", plain.tokens.len());
    println!("{}", tok.decode(&plain.tokens));
    println!("---- speculative ({} tokens)", out[0].tokens.len());
    println!("{}", tok.decode(&out[0].tokens));
    println!("----");
    println!("{}", decoder.metrics());
    println!(
        "plain: {:.2} tokens/s ({} tokens in {plain_s:.1} s, prefill included); speculative: \
         {:.2} tokens/s ({} tokens in {spec_s:.1} s); speed-up {:.2}×",
        plain.tokens.len() as f64 / plain_s,
        plain.tokens.len(),
        out[0].tokens.len() as f64 / spec_s,
        out[0].tokens.len(),
        (out[0].tokens.len() as f64 / spec_s) / (plain.tokens.len() as f64 / plain_s)
    );
    if temperature == 0.0 {
        if out[0].tokens != plain.tokens {
            return Err("greedy speculative output differs from plain greedy decoding".into());
        }
        println!("greedy speculative output == plain greedy output");
    }
    Ok(())
}

//! Plain decoding with one real model: the sanity check of the forward pass and the baseline
//! speed that speculative decoding is compared against.
//!
//! ```text
//! examples/fetch-models.sh smollm2
//! cargo run --release --features candle --example generate -- smollm2 "def fibonacci(n):"
//! cargo run --release --features candle --example generate -- qwen-1.5b --chat "Write a Python function that reverses a string."
//! ```
//!
//! Arguments: `MODEL [PROMPT] [--chat] [--tokens N] [--temperature T] [--seed S]
//! [--layers N] [--rope pairs|halves] [--q8] [--kernel auto|q8rows|candle] [--nll]`. MODEL is `smollm2`, `qwen-0.5b`, `qwen-1.5b` or a path to
//! a GGUF file. `--chat` wraps the prompt in the ChatML template both model families use.
//! `--layers N` decodes with the layer-skip draft (first N blocks). `--rope` overrides the rope
//! pairing (to check which one a file needs). `--q8` re-quantizes Q4_1/Q5_0/Q5_1 matrices to Q8_0
//! at load (`LoadOptions::requantize_to_q8_0`: candle's Q8_0 kernel is SIMD, those are scalar).
//! `--kernel` picks the CPU matmul (`LoadOptions::kernel`). `--nll` generates nothing: it prints
//! the mean negative log-likelihood per token (and the perplexity) of PROMPT, or of a fixed
//! English + Python passage without one, to compare kernels and formats by accuracy.

use std::process::ExitCode;

use specdec::models::{
    generate, model_file, GenerateOptions, LoadOptions, MatmulKernel, Model, RopeStyle, Weights,
};

/// The `--nll` passage when no prompt is given: English prose, then Python.
const PASSAGE: &str = "The library keeps a small cache of recently used pages so that a second \
read of the same page is served from memory. When the cache is full, the page used least \
recently is dropped.\n\ndef evict(cache, capacity):\n    while len(cache) > capacity:\n        \
oldest = min(cache, key=lambda k: cache[k].last_used)\n        del cache[oldest]\n";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("generate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut model_arg = None;
    let mut prompt = None;
    let mut chat = false;
    let mut options = GenerateOptions {
        max_new_tokens: 64,
        ..GenerateOptions::default()
    };
    let mut layers = None;
    let mut nll = false;
    let mut load = LoadOptions::default();
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--chat" => chat = true,
            "--q8" => load.requantize_to_q8_0 = true,
            "--nll" => nll = true,
            "--kernel" => {
                load.kernel = match value("--kernel")?.as_str() {
                    "auto" => MatmulKernel::Auto,
                    "q8rows" => MatmulKernel::Q8Rows,
                    "candle" => MatmulKernel::Candle,
                    other => return Err(format!("--kernel auto|q8rows|candle, not {other}").into()),
                }
            }
            "--tokens" => options.max_new_tokens = value("--tokens")?.parse()?,
            "--temperature" => options.temperature = value("--temperature")?.parse()?,
            "--seed" => options.seed = value("--seed")?.parse()?,
            "--layers" => layers = Some(value("--layers")?.parse::<usize>()?),
            "--rope" => {
                load.rope_style = Some(match value("--rope")?.as_str() {
                    "pairs" => RopeStyle::AdjacentPairs,
                    "halves" => RopeStyle::RotateHalves,
                    other => return Err(format!("--rope pairs|halves, not {other}").into()),
                })
            }
            _ if a.starts_with("--") => return Err(format!("unknown option {a}").into()),
            _ if model_arg.is_none() => model_arg = Some(a),
            _ if prompt.is_none() => prompt = Some(a),
            _ => return Err(format!("unexpected argument {a}").into()),
        }
    }
    let model_arg = model_arg.ok_or(
        "usage: generate MODEL [PROMPT] [--chat] [--tokens N] [--temperature T] [--seed S] \
         [--layers N] [--rope pairs|halves] [--q8] [--kernel auto|q8rows|candle] [--nll]; \
         MODEL: smollm2 | qwen-0.5b | qwen-1.5b | FILE.gguf",
    )?;
    let path = model_file(&model_arg);
    let prompt =
        prompt.unwrap_or_else(|| if nll { PASSAGE } else { "def fibonacci(n):" }.to_string());

    let started = std::time::Instant::now();
    let weights = Weights::load_with(&path, &load)?;
    let cfg = weights.config();
    println!(
        "{}: {:?}, {} layers, width {}, {} heads / {} kv, vocab {}, rope {:?}, loaded in {:.2} s",
        path.display(),
        cfg.architecture,
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.kv_heads,
        cfg.vocab_size,
        cfg.rope_style,
        started.elapsed().as_secs_f64()
    );
    let tok = weights.tokenizer();
    let text = if chat {
        format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
    } else {
        prompt.clone()
    };
    let ids = tok.encode(&text);
    options.stop_tokens.extend(tok.eos_token());
    options.stop_tokens.extend(tok.token_id("<|im_end|>"));
    options.stop_tokens.extend(tok.token_id("<|endoftext|>"));
    let mut model = match layers {
        Some(n) => Model::layer_skip(weights.clone(), n)?,
        None => Model::new(weights.clone()),
    };
    if nll {
        return print_nll(&mut model, &ids);
    }
    println!(
        "prompt: {} tokens, {} layers run",
        ids.len(),
        model.layers()
    );
    let out = generate(&mut model, &ids, &options)?;
    println!("----");
    println!(
        "{}{}",
        if chat { "" } else { &prompt },
        tok.decode(&out.tokens)
    );
    println!("----");
    println!(
        "{} new tokens; prefill {} tokens in {:.3} s ({:.1} tokens/s); decode {:.2} tokens/s \
         ({} threads)",
        out.tokens.len(),
        ids.len(),
        out.prefill.as_secs_f64(),
        ids.len() as f64 / out.prefill.as_secs_f64(),
        out.decode_tokens_per_s().unwrap_or(f64::NAN),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    Ok(())
}

/// Mean negative log-likelihood per token of `ids[1..]` given the tokens before each, in one
/// forward (teacher forcing), in nats.
fn print_nll(model: &mut Model, ids: &[u32]) -> Result<(), Box<dyn std::error::Error>> {
    if ids.len() < 2 {
        return Err("--nll needs a text of at least 2 tokens".into());
    }
    let vocab = model.vocab_size();
    let logits = model.forward(ids)?;
    let mut total = 0f64;
    for (i, &next) in ids[1..].iter().enumerate() {
        let row = &logits[i * vocab..(i + 1) * vocab];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        total += max + sum.ln() - row[next as usize] as f64;
    }
    let mean = total / (ids.len() - 1) as f64;
    println!(
        "mean NLL {mean:.4} nats per token over {} tokens; perplexity {:.3}",
        ids.len() - 1,
        mean.exp()
    );
    Ok(())
}

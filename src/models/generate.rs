//! Plain decoding with one model, token by token: the baseline speculative decoding is compared
//! against.

use std::time::{Duration, Instant};

use super::error::ModelError;
use super::model::Model;
use crate::rng;

/// How [`generate`] picks each token.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Stop after this many new tokens.
    pub max_new_tokens: usize,
    /// 0 for greedy (argmax, lowest id on ties); otherwise sample from `softmax(logits / T)`.
    pub temperature: f32,
    /// Seed of the sampler (ignored when greedy). The draw at position `p` uses the counter-based
    /// generator of [`crate::rng`] at `(seed, p)`, so a run is reproducible and independent of
    /// how the prompt was fed.
    pub seed: u64,
    /// Stop after emitting any of these (e.g. the tokenizer's EOS or `<|im_end|>`).
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 64,
            temperature: 0.0,
            seed: 0,
            stop_tokens: Vec::new(),
        }
    }
}

/// What [`generate`] produced and how long it took.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens (including a stop token if one ended the run).
    pub tokens: Vec<u32>,
    /// Time of the forward over the prompt (including picking the first token).
    pub prefill: Duration,
    /// Time of the one-token forwards after it.
    pub decode: Duration,
}

impl Generation {
    /// Tokens per second of the decode phase (one forward per token); `None` below two tokens.
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        let steps = self.tokens.len().checked_sub(1).filter(|&n| n > 0)?;
        Some(steps as f64 / self.decode.as_secs_f64())
    }
}

/// Feeds `prompt` (appended to whatever `model` already holds) and then generates up to
/// `max_new_tokens`, one forward per token. The model's cache holds prompt and output afterwards
/// except the last emitted token, which has not been fed.
pub fn generate(
    model: &mut Model,
    prompt: &[u32],
    options: &GenerateOptions,
) -> Result<Generation, ModelError> {
    let mut tokens = Vec::new();
    if options.max_new_tokens == 0 {
        return Ok(Generation {
            tokens,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
        });
    }
    let started = Instant::now();
    // Only the last row is needed: skip the output head on the rest of the prompt.
    let logits = model.forward_last(prompt, 1)?;
    let mut next = pick(&logits, options, model.len() as u64);
    let prefill = started.elapsed();
    let started = Instant::now();
    loop {
        tokens.push(next);
        if tokens.len() >= options.max_new_tokens || options.stop_tokens.contains(&next) {
            break;
        }
        let logits = model.forward(&[next])?;
        next = pick(&logits, options, model.len() as u64);
    }
    Ok(Generation {
        tokens,
        prefill,
        decode: started.elapsed(),
    })
}

fn pick(logits: &[f32], options: &GenerateOptions, position: u64) -> u32 {
    if options.temperature <= 0.0 {
        argmax(logits)
    } else {
        let u = rng::uniform_open(
            rng::random_words(options.seed, rng::row_position(position, 0), 0, 0)[0],
        );
        sample(logits, options.temperature, u)
    }
}

/// Index of the largest logit; the lowest index wins ties and NaN is never chosen (the
/// verifier's greedy rule).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// Inverse-CDF draw from `softmax(logits / temperature)` with the uniform `u` in (0, 1).
pub fn sample(logits: &[f32], temperature: f32, u: f32) -> u32 {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logits
        .iter()
        .map(|&v| {
            if v.is_nan() {
                0.0
            } else {
                (f64::from(v - max) / f64::from(temperature)).exp()
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let target = f64::from(u) * total;
    let mut acc = 0.0;
    let mut last_positive = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            last_positive = i;
        }
        acc += w;
        if acc > target {
            return i as u32;
        }
    }
    // Rounding left the target past the sum: the last token with weight.
    last_positive as u32
}

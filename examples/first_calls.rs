//! What building pipelines on demand costs a program: the time to make a GPU verifier, then the
//! first and the second call of each kind (greedy, one-hot drafts, draft probabilities, draft
//! logits, the block rule, top-p 0.9), with `PipelineBuild::OnDemand` (the default: a first
//! call compiles the pipelines it dispatches) or `Eager` (every pipeline built with the
//! verifier). Run each in a process of its own: the driver's shader cache (NVIDIA's, Mesa's)
//! would make the second build cheap; `__GL_SHADER_DISK_CACHE=0` turns NVIDIA's off.
//!
//! ```text
//! cargo run --release --example first_calls -- [ondemand|eager] [requests] [drafts] [vocab]
//! ```
//! (default `ondemand 1 4 32000`)

use specdec::{
    Draft, Logits, PipelineBuild, Request, Rule, SamplingParams, Verifier, VerifierOptions,
    VerifyBatch,
};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    specdec::device::quiet_vulkan_device_select();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pipelines = match args.first().map(String::as_str) {
        None | Some("ondemand") => PipelineBuild::OnDemand,
        Some("eager") => PipelineBuild::Eager,
        Some(other) => {
            return Err(format!("{other:?}: the first argument is ondemand or eager").into())
        }
    };
    let num = |i: usize, default: usize| -> Result<usize, String> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse()
                .map_err(|e| format!("{a:?}: a whole number ({e})"))
        })
    };
    let (n, k, vocab) = (num(1, 1)?, num(2, 4)?, num(3, 32_000)?);
    if n == 0 || k == 0 || vocab < 2 {
        return Err("at least 1 request, 1 draft and a vocabulary of 2".into());
    }
    let t0 = Instant::now();
    let v = Verifier::new(VerifierOptions {
        pipelines,
        ..VerifierOptions::default()
    })?;
    let (built, total) = v.pipeline_counts();
    println!(
        "{}: verifier made in {:.1} ms, {built} of {total} pipelines built ({pipelines:?})",
        v.describe(),
        ms(t0)
    );
    // Rows with a clear maximum at a different index per row, drafts that match it half the time.
    let rows = n * (k + 1);
    let target: Vec<f32> = (0..rows * vocab)
        .map(|i| ((i * 2_654_435_761) % 1_000) as f32 / 250.0)
        .collect();
    let drafts: Vec<i32> = (0..n * k).map(|i| ((i * 7_919) % vocab) as i32).collect();
    let q_probs: Vec<f32> = vec![1.0 / vocab as f32; n * k * vocab];
    let q_logits: Vec<f32> = target[..n * k * vocab].to_vec();
    let kinds: [(&str, f32, Rule, Option<f32>, u8); 6] = [
        ("greedy", 0.0, Rule::Exact, None, 0),
        ("one-hot drafts", 1.0, Rule::Exact, None, 0),
        ("draft probabilities", 1.0, Rule::Exact, None, 1),
        ("draft logits", 1.0, Rule::Exact, None, 2),
        ("block rule, draft probabilities", 1.0, Rule::Block, None, 1),
        (
            "top-p 0.9, draft probabilities",
            1.0,
            Rule::Exact,
            Some(0.9),
            1,
        ),
    ];
    for (name, temperature, rule, top_p, draft) in kinds {
        let requests: Vec<Request> = (0..n)
            .map(|i| Request {
                num_drafts: k as u32,
                params: SamplingParams {
                    rule,
                    top_p: top_p.unwrap_or(1.0),
                    ..SamplingParams::seeded(temperature, i as u64)
                },
                position: 0,
            })
            .collect();
        let batch = VerifyBatch {
            vocab_size: vocab as u32,
            requests: &requests,
            draft_token_ids: &drafts,
            target_logits: Logits::F32(&target),
            draft: match draft {
                0 => Draft::OneHot,
                1 => Draft::Probs(Logits::F32(&q_probs)),
                _ => Draft::Logits(Logits::F32(&q_logits)),
            },
            draft_vocab_size: None,
            synthetic_rates: None,
        };
        let before = v.pipeline_counts().0;
        let t = Instant::now();
        v.verify_blocking(&batch)?;
        let first = ms(t);
        let after = v.pipeline_counts().0;
        let t = Instant::now();
        v.verify_blocking(&batch)?;
        println!(
            "{name:<32} first call {first:8.1} ms ({} pipelines built), second {:6.1} ms",
            after - before,
            ms(t)
        );
    }
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

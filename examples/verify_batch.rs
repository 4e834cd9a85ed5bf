//! The main job: verify a realistic batch (8 requests, 4 drafts each, a 32,000-token vocabulary,
//! logits drawn like the benchmark anchors', drafts equal to the target argmax with probability
//! 0.7) with every rule mixed in one call, and print what each request emits.
//!
//! Runs where the backend policy puts it (`Verifier::auto`, the choice `specdec info` explains:
//! a real GPU if there is one, else the CPU backend; `SPECDEC_DEVICE`, `WGPU_BACKEND` and
//! `WGPU_ADAPTER_NAME` override it) and prints that choice and its reason. Then it checks the
//! result against the CPU twin (on the CPU backend: against a one-thread twin, whose result must
//! not depend on the thread count either).
//!
//! ```text
//! cargo run --release --example verify_batch
//! ```

use specdec::{
    Draft, Logits, Request, Rule, SamplingParams, Verifier, VerifierOptions, VerifyBatch,
};
use std::time::Instant;

/// SplitMix64: a tiny deterministic generator for the example's inputs.
struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        let (u1, u2) = (self.unit().max(1e-300), self.unit());
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

fn main() {
    // First, before any thread starts: on a machine without a desktop login, Mesa's Vulkan
    // device-select layer would print an error line about XDG_RUNTIME_DIR while the adapters are
    // surveyed (see `specdec::device`).
    specdec::device::quiet_vulkan_device_select();
    let vocab = 32_000usize;
    let (r, k) = (8usize, 4u32);
    let mut rng = Mix(2026);
    let rows = r * (k as usize + 1);
    let target: Vec<f32> = (0..rows * vocab).map(|_| 2.0 * rng.normal()).collect();
    let mut drafts = Vec::new();
    for req in 0..r {
        for i in 0..k as usize {
            let row = &target[(req * (k as usize + 1) + i) * vocab..][..vocab];
            let argmax = (0..vocab).fold(0, |b, j| if row[j] > row[b] { j } else { b });
            let d = if rng.unit() < 0.7 {
                argmax
            } else {
                (rng.next() % vocab as u64) as usize
            };
            drafts.push(d as i32);
        }
    }
    // Requests 0–1 greedy, 2–5 random at several temperatures, 6 synthetic, 7 with a -1 draft.
    let temps = [0.0, 0.0, 1.0, 0.7, 1.3, 1.0, 1.0, 1.0];
    let requests: Vec<Request> = (0..r)
        .map(|i| Request {
            num_drafts: k,
            params: SamplingParams {
                temperature: temps[i],
                seed: Some(1000 + i as u64),
                rule: if i == 6 { Rule::Synthetic } else { Rule::Exact },
                ..SamplingParams::default()
            },
            position: 100 + 10 * i as u64,
        })
        .collect();
    drafts[7 * k as usize + 2] = -1;
    let rates = vec![0.8f32; r * k as usize];
    let batch = VerifyBatch {
        vocab_size: vocab as u32,
        requests: &requests,
        draft_token_ids: &drafts,
        target_logits: Logits::F32(&target),
        draft: Draft::OneHot,
        draft_vocab_size: None,
        synthetic_rates: Some(&rates),
    };

    // The same decision `Verifier::auto` takes, asked for first so that its reason can be shown.
    let opts = VerifierOptions::default();
    match specdec::device::decide(opts.device) {
        Ok(decision) => println!("backend: {decision}"),
        Err(e) => println!("backend: {e}"),
    }
    let verifier = match Verifier::auto(opts) {
        Ok(v) => v,
        Err(e) => {
            println!("no GPU available ({e}); running on the CPU backend instead");
            Verifier::cpu(VerifierOptions::default())
        }
    };
    println!("verifier: {}", verifier.describe());
    println!(
        "batch: {r} requests x {k} drafts, vocab {vocab}, one-hot drafts, {:.1} MB of logits",
        (rows * vocab * 4) as f64 / 1e6
    );

    let _ = verifier.verify_blocking(&batch).expect("warm-up verify");
    let t0 = Instant::now();
    let out = verifier.verify_blocking(&batch).expect("verify");
    let took = t0.elapsed();
    println!("\n req  rule        T    accepted  emitted tokens                      status");
    for (i, &t) in temps.iter().enumerate() {
        let rule = match requests[i].params.rule {
            Rule::Synthetic => "synthetic",
            _ if t == 0.0 => "greedy",
            _ => "rejection",
        };
        println!(
            " {i:>3}  {rule:<10} {:>4.1}  {:>4}/{k}    {:<36}{}",
            t,
            out.accepted(i),
            format!("{:?}", out.emitted(i)),
            out.status[i]
        );
    }
    let emitted: u32 = out.num_emitted.iter().sum();
    println!(
        "\n{emitted} tokens emitted from {} drafts ({:.2} per request); whole call {:.2} ms",
        r * k as usize,
        emitted as f64 / r as f64,
        took.as_secs_f64() * 1e3
    );

    let (twin_name, twin) = if verifier.is_gpu() {
        ("CPU twin", Verifier::cpu(VerifierOptions::default()))
    } else {
        let one = VerifierOptions {
            cpu_threads: Some(1),
            ..VerifierOptions::default()
        };
        ("CPU twin (1 thread)", Verifier::cpu(one))
    };
    let want = twin.verify_blocking(&batch).expect("cpu twin");
    if want == out {
        println!("{twin_name}: identical tokens");
    } else {
        println!("{twin_name}: DIFFERENT tokens (see README, near-threshold cases)");
        std::process::exit(1);
    }
}

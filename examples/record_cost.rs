//! The host cost of recording one verification over GPU-resident rows: the time
//! `Verifier::record` and `CommandEncoder::finish` take, median of 2,000 recordings in each of
//! three rounds, nothing submitted (the rows are never read). This is the part of a call's host
//! time that specdec's own code and wgpu's validation spend, without the driver's submission.
//!
//! ```text
//! cargo run --release --example record_cost -- [requests] [drafts] [vocab]   # default 1 4 32000
//! ```

use specdec::{
    GpuDraft, GpuRows, GpuVerifyBatch, Request, SamplingParams, Verifier, VerifierOptions,
};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("arguments are whole numbers (requests drafts vocab): {e}"))?;
    let arg = |i: usize, default: u32| args.get(i).copied().unwrap_or(default);
    let (n, k, vocab) = (arg(0, 1) as usize, arg(1, 4), arg(2, 32_000));
    if n == 0 || k == 0 || vocab == 0 {
        return Err("requests, drafts and vocab must be at least 1".into());
    }
    let v = Verifier::new(VerifierOptions::default())?;
    let (device, _) = v.device().ok_or("no GPU backend")?;
    let rows = |count: usize| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("record_cost.rows"),
            size: (count * vocab as usize * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (target, draft) = (rows(n * (k as usize + 1)), rows(n * k as usize));
    let requests: Vec<Request> = (0..n)
        .map(|i| Request {
            num_drafts: k,
            params: SamplingParams::seeded(1.0, i as u64),
            position: 0,
        })
        .collect();
    let drafts: Vec<i32> = (0..n * k as usize)
        .map(|i| i as i32 % vocab as i32)
        .collect();
    let batch = GpuVerifyBatch {
        vocab_size: vocab,
        requests: &requests,
        draft_token_ids: &drafts,
        target_logits: GpuRows::f32(&target, 0),
        draft: GpuDraft::Probs(GpuRows::f32(&draft, 0)),
        draft_vocab_size: None,
        synthetic_rates: None,
    };
    println!(
        "{} — {n} requests × {k} drafts, vocabulary {vocab}, draft probabilities",
        v.describe()
    );
    for round in 1..=3 {
        let mut t = Vec::with_capacity(2000);
        for _ in 0..2000 {
            let t0 = Instant::now();
            let mut enc = device.create_command_encoder(&Default::default());
            let pending = v.record(&mut enc, &batch)?;
            let commands = enc.finish();
            t.push(t0.elapsed().as_secs_f64() * 1e6);
            drop(commands);
            v.release(pending);
        }
        t.sort_by(f64::total_cmp);
        println!(
            "round {round}: record + finish median {:.1} µs (p10 {:.1}, p90 {:.1})",
            t[1000], t[200], t[1800]
        );
    }
    Ok(())
}

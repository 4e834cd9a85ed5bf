//! Where a GPU forward call's time goes: the 1-row and 5-row call cost of the Qwen2.5 1.5B shape
//! (pseudo-random weights) over its first 1, 2, 4 .. 28 layers, of the same shape with a 256-token
//! vocabulary (no LM head cost), and of a tiny model with 28 layers (hidden 64: almost nothing but
//! the fixed cost of its dispatches). The slope over layers is a layer's cost; the tiny model's
//! slope is the per-layer dispatch overhead.
//!
//! ```text
//! cargo run --release --features candle --example gpu_forward_layers
//! ```
//!
//! Wall clock per call from recording to a blocking wait, median of 20 after 3 warm-up calls.
use specdec::models::{Config, GpuModel, GpuModelOptions, GpuSequence};
use std::sync::Arc;
use std::time::Instant;

/// The Qwen2.5 1.5B shape with other sizes.
fn cfg(layers: usize, hidden: usize, ffn: usize, heads: usize, vocab: usize) -> Config {
    Config {
        layers,
        hidden,
        ffn,
        heads,
        head_dim: hidden / heads,
        vocab_size: vocab,
        context_length: 4096,
        ..Config::known_shape("qwen-1.5b").expect("a known shape")
    }
}

/// Median wall time (ms) of a `rows`-token forward appended after `base` cached positions.
fn time(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    seq: &mut GpuSequence,
    rows: usize,
    base: usize,
) -> f64 {
    let toks: Vec<u32> = (0..rows as u32).map(|i| i * 13 + 5).collect();
    let mut v = Vec::new();
    for i in 0..23 {
        let t = Instant::now();
        let mut enc = device.create_command_encoder(&Default::default());
        seq.record(&mut enc, &toks, rows).unwrap();
        let s = queue.submit([enc.finish()]);
        device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(s),
                timeout: None,
            })
            .unwrap();
        seq.truncate(base).unwrap();
        if i >= 3 {
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let adapter = specdec::select_adapter().unwrap();
    let limits = specdec::required_limits(&adapter.limits()).unwrap();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_limits: limits,
        ..Default::default()
    }))
    .unwrap();
    println!("adapter {}", adapter.get_info().name);
    let shapes = [
        ("qwen-1.5b", cfg(28, 1536, 8960, 12, 151_936)),
        ("tiny-28-layers", cfg(28, 64, 128, 2, 256)),
        ("qwen-1.5b-vocab256", cfg(28, 1536, 8960, 12, 256)),
    ];
    for (name, c) in shapes {
        let m = Arc::new(
            GpuModel::random(&c, 1, &device, &queue, &GpuModelOptions::default()).unwrap(),
        );
        for layers in [1usize, 2, 4, 8, 16, 28] {
            let mut seq = GpuSequence::with_layers(m.clone(), layers).unwrap();
            let prefix: Vec<u32> = (0..64u32).map(|i| i * 7 % c.vocab_size as u32).collect();
            seq.forward_blocking(&prefix).unwrap();
            let t1 = time(&device, &queue, &mut seq, 1, 64);
            let t5 = time(&device, &queue, &mut seq, 5, 64);
            println!("{name} layers {layers:2}: 1 row {t1:7.3} ms, 5 rows {t5:7.3} ms");
        }
    }
}

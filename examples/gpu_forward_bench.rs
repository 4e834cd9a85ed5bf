//! Cost of one GPU forward call (`specdec::models::GpuSequence`) by the number of rows it
//! scores: the price of verifying `k` drafts plus the bonus position in one call against
//! decoding one token.
//!
//! ```text
//! cargo run --release --features candle --example gpu_forward_bench -- smollm2
//! cargo run --release --features candle --example gpu_forward_bench -- random-qwen-1.5b --rows 1,2,3,5,9
//! ```
//!
//! Arguments: `MODEL [--rows 1,2,3,5,9] [--iters N] [--context N] [--lanes L] [--unrolled | --rolled]
//! [--profile]`. MODEL is `smollm2`,
//! `qwen-0.5b`, `qwen-1.5b`, a GGUF path, or `random-qwen-0.5b` / `random-qwen-1.5b` /
//! `random-smollm2`: the real shapes with pseudo-random weights, for machines without the model
//! files. Each call appends `rows` tokens after a `context`-token prefix (default 128) and is
//! truncated back, so every timed call sees the same cache length. Before timing, every row of
//! every multi-row call is checked bit-identical to a one-row call at the same position.
//! Wall clock per call, from recording to a blocking wait on the device (and, apart, the
//! host's recording of the dispatches into the encoder); the median of `iters` calls (default
//! 20) after 3 warm-up calls. Uses `WGPU_BACKEND` / `WGPU_ADAPTER_NAME` to pick
//! the adapter like the rest of the crate. `--lanes` and `--unrolled` / `--rolled` set
//! [`GpuModelOptions::matmul_lanes`] and [`GpuModelOptions::matmul_unrolled`]. `--profile` then
//! prints each row count's GPU time by kernel (timestamp queries, each dispatch in a pass of its
//! own) and the whole call's GPU time in one pass.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use specdec::models::{model_file, Config, GpuModel, GpuModelOptions, GpuSequence, Weights};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_forward_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Args {
    model: String,
    rows: Vec<usize>,
    iters: usize,
    context: usize,
    lanes: Option<u32>,
    unrolled: Option<bool>,
    profile: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut a = Args {
        model: String::new(),
        rows: vec![1, 2, 3, 5, 9],
        iters: 20,
        context: 128,
        lanes: None,
        unrolled: None,
        profile: false,
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--rows" => {
                a.rows = value("--rows")?
                    .split(',')
                    .map(|s| s.parse().map_err(|_| format!("bad row count {s:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--lanes" => a.lanes = Some(value("--lanes")?.parse().map_err(|_| "bad --lanes")?),
            "--unrolled" => a.unrolled = Some(true),
            "--rolled" => a.unrolled = Some(false),
            "--profile" => a.profile = true,
            "--iters" => a.iters = value("--iters")?.parse().map_err(|_| "bad --iters")?,
            "--context" => a.context = value("--context")?.parse().map_err(|_| "bad --context")?,
            other if a.model.is_empty() && !other.starts_with("--") => a.model = other.to_string(),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.model.is_empty() {
        return Err(
            "usage: gpu_forward_bench MODEL [--rows 1,2,3,5,9] [--iters N] [--context N]".into(),
        );
    }
    Ok(a)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let adapter = specdec::select_adapter()?;
    let info = adapter.get_info();
    let limits = specdec::required_limits(&adapter.limits())?;
    // Timestamps where the adapter has them (--profile needs them).
    let required_features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
    if args.profile && required_features.is_empty() {
        return Err("--profile needs an adapter with timestamp queries".into());
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("specdec.gpu_forward_bench"),
        required_limits: limits,
        required_features,
        ..Default::default()
    }))?;
    let t0 = Instant::now();
    let options = GpuModelOptions {
        matmul_lanes: args.lanes,
        matmul_unrolled: args.unrolled,
        ..GpuModelOptions::default()
    };
    let model = if let Some(name) = args.model.strip_prefix("random-") {
        let config = Config::known_shape(name).ok_or(format!("no shape for {name:?}"))?;
        GpuModel::random(&config, 1, &device, &queue, &options)?
    } else {
        let path = model_file(&args.model);
        let w = Weights::load(&path)?;
        GpuModel::load(&path, w.config(), &device, &queue, &options)?
    };
    let model = Arc::new(model);
    let c = model.config().clone();
    println!(
        "{} on {} ({:?}): {} layers, hidden {}, ffn {}, vocab {}; {:.1} MB of Q8_0 weights \
         ({:.3} bytes per weight), head in {} part(s); matmul forms: {:?}; loaded in {:.1} s",
        args.model,
        info.name,
        info.backend,
        c.layers,
        c.hidden,
        c.ffn,
        c.vocab_size,
        model.weight_bytes() as f64 / 1e6,
        1.125,
        model.head_parts(),
        model.matmul_forms(),
        t0.elapsed().as_secs_f64()
    );
    let prefix: Vec<u32> = (0..args.context)
        .map(|i| (i * 7919 % c.vocab_size) as u32)
        .collect();
    let mut seq = GpuSequence::new(model.clone())?;
    for chunk in prefix.chunks(64) {
        seq.forward_blocking(chunk)?;
    }
    let draft: Vec<u32> = (0..16)
        .map(|i| (1000 + 37 * i) as u32 % c.vocab_size as u32)
        .collect();
    // Row r of every call alone: the first r tokens in one call, then token r in a one-row call.
    let mut singles = Vec::new();
    for r in 0..args
        .rows
        .iter()
        .max()
        .copied()
        .unwrap_or(1)
        .min(draft.len())
    {
        let len = seq.len();
        if r > 0 {
            seq.forward_blocking(&draft[..r])?;
        }
        singles.push(seq.forward_blocking(&draft[r..r + 1])?);
        seq.truncate(len)?;
    }
    println!("rows | ms per call (median) | min ms | of which recording | rows/s | cost vs 1 row");
    let mut base = None;
    for &rows in &args.rows {
        let tokens = &draft[..rows.min(draft.len())];
        let got = forward_and_back(&mut seq, tokens)?;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (r, single) in singles.iter().enumerate().take(tokens.len()) {
            if bits(&got[r * c.vocab_size..(r + 1) * c.vocab_size]) != bits(single) {
                let what = format!("{rows}-row call: row {r} differs from its one-row call");
                return Err(what.into());
            }
        }
        let mut times = Vec::with_capacity(args.iters);
        let mut recording = Vec::with_capacity(args.iters);
        for i in 0..args.iters + 3 {
            let t = Instant::now();
            let mut encoder = device.create_command_encoder(&Default::default());
            seq.record(&mut encoder, tokens, tokens.len())?;
            let commands = encoder.finish();
            let recorded = t.elapsed().as_secs_f64() * 1e3;
            let s = queue.submit([commands]);
            device.poll(wgpu::PollType::Wait {
                submission_index: Some(s),
                timeout: None,
            })?;
            seq.truncate(args.context)?;
            if i >= 3 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
                recording.push(recorded);
            }
        }
        times.sort_by(f64::total_cmp);
        recording.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let base_ms = *base.get_or_insert(median);
        println!(
            "{:4} | {:20.3} | {:6.3} | {:18.3} | {:6.0} | {:.2}×",
            tokens.len(),
            median,
            times[0],
            recording[recording.len() / 2],
            tokens.len() as f64 / median * 1e3,
            median / base_ms
        );
    }
    if args.profile {
        for &rows in &args.rows {
            profile(&mut seq, &draft[..rows.min(draft.len())], args.context)?;
        }
    }
    Ok(())
}

/// Prints the GPU time of a `tokens.len()`-row call by kernel (median of 5 profiled calls, each
/// dispatch in a pass of its own) and of the whole call in one pass.
fn profile(
    seq: &mut GpuSequence,
    tokens: &[u32],
    context: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut runs = Vec::new();
    for _ in 0..5 {
        runs.push(seq.profile_blocking(tokens, tokens.len())?);
        seq.truncate(context)?;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let total = median(runs.iter().map(|r| r.total_ns).collect());
    println!(
        "profile, {} row(s): whole call {:.3} ms of GPU time in one pass",
        tokens.len(),
        total / 1e6
    );
    for (i, (name, _, count)) in runs[0].kernels.iter().enumerate() {
        let ns = median(runs.iter().map(|r| r.kernels[i].1).collect());
        println!(
            "  {name:16} {count:5} dispatches {:9.3} ms {:8.2} µs each",
            ns / 1e6,
            ns / 1e3 / *count as f64
        );
    }
    Ok(())
}

/// Forwards `tokens` after the prefix, reads the logits, truncates back.
fn forward_and_back(
    seq: &mut GpuSequence,
    tokens: &[u32],
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let len = seq.len();
    let out = seq.forward_blocking(tokens)?;
    seq.truncate(len)?;
    Ok(out)
}

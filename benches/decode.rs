//! End-to-end decoding speed on a GPU: plain decoding against speculative decoding with the same
//! kernels (`specdec::models::GpuDecoder`), alternated A/B in one process so that the GPU's state
//! hits both alike, and the verifier's share of a decode step.
//!
//! ```text
//! cargo bench --features candle --bench decode -- smollm2 --draft ngram --prompt code-edit
//! cargo bench --features candle --bench decode -- qwen-1.5b --draft qwen-0.5b
//! cargo bench --features candle --bench decode -- random-qwen-1.5b --draft random-qwen-0.5b \
//!     --synthetic 0.88,0.75,0.75,0.67
//! cargo bench --features candle --bench decode -- smollm2 --draft ngram-tree:4:24 --k 6
//! ```
//!
//! Arguments: `TARGET [--draft none|ngram|ngram-tree:M:N|layers:N|MODEL] [--k 4] [--tokens 64]
//! [--rounds 3]
//! [--prompt code-edit|python|prose] [--temperature T] [--synthetic A1,A2,..] [--csv PATH]`.
//! `ngram-tree:M:N` drafts n-gram trees (`GpuProposer::NgramTree`: up to `M` earlier occurrences
//! merged into at most `N` nodes, depth `k`) and alternates three decoders per round: plain, the
//! n-gram chain of depth `k`, and the tree; it writes a row for the chain and one for the tree
//! (the same plain column), and at temperature 0 fails unless all three emit the same text.
//! At a temperature above 0 round `r` samples with seed `r + 1`, so that rounds are different
//! samples of text (use more rounds: chains and trees draw differently, and one sample decides
//! how much of the text is copied).
//! A model is `smollm2`, `qwen-0.5b`, `qwen-1.5b` (files of `examples/fetch-models.sh`), a GGUF
//! path, or `random-<name>`: the real shape with pseudo-random weights, for machines without
//! the files. Random weights make meaningless text, so they need `--synthetic`: the per-position
//! acceptance rates (fraction of steps that accept more than `i` drafts, as
//! `speculative::Metrics` reports them) measured with the real weights; the verifier then uses
//! `Rule::Synthetic` with the matching conditional rates, and every other cost (forwards,
//! statistics, readbacks) is the real one.
//!
//! `--cpu` runs the same comparison on the CPU path (`specdec::models::Model` and
//! `speculative::SpecDecoder` with a CPU verifier; real weights only), rows with `backend = cpu`;
//! `--kernel` picks its matmul (`auto`, the default, `q8rows` or `candle`: `MatmulKernel`).
//!
//! Output: one table row per configuration and, with `--csv`, the row appended to the CSV
//! (`model, draft, proposer, backend, adapter, k, plain_tok_s, spec_tok_s, accepted_per_step,
//! verify_share, prompt, temperature, rounds, speculation, tokens`; CSVs written before the last
//! five columns existed have ten, before the last two thirteen). `--cpu` runs and GPU runs with
//! a draft model write rows in pairs: the decoder speculating on every step (`speculation =
//! always`) and its default, which takes plain steps (runs, on the GPU) where they are faster
//! (`while-paying`; its `accepted_per_step` counts each plain token as a target call). tok/s is the median over rounds of generated tokens per second of decode
//! time (the prompt's prefill excluded); `accepted_per_step` is the mean of accepted drafts per
//! target call; `verify_share` is the verifier's GPU time on the step's `k + 1` rows (timestamp
//! queries where the adapter has them, else the wall time of a verify-only submission, an upper
//! bound) over the mean wall time of a speculative step.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specdec::models::{
    model_file, Config, GpuDecodeConfig, GpuDecoder, GpuModel, GpuModelOptions, GpuProposer,
    GpuSequence, Weights,
};
use specdec::speculative::{NgramProposer, NgramTreeProposer, Speculation};
use specdec::{Draft, GpuRows, GpuVerifyBatch, Request, Rule, SamplingParams, Verifier};

#[path = "common/prompts.rs"]
mod prompts;
use prompts::prompt_text;

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; this harness has no use for it.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match parse(&args).and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("decode bench: {e}");
            ExitCode::from(2)
        }
    }
}

struct Args {
    target: String,
    draft: String,
    k: usize,
    tokens: usize,
    rounds: usize,
    prompt: String,
    temperature: f32,
    synthetic: Option<Vec<f32>>,
    csv: Option<String>,
    cpu: bool,
    /// The CPU matmul kernel of `--cpu` runs.
    kernel: specdec::models::MatmulKernel,
}

fn number<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{name}: {v:?} is not a valid value"))
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        target: String::new(),
        draft: "none".into(),
        k: 4,
        tokens: 64,
        rounds: 3,
        prompt: "code-edit".into(),
        temperature: 0.0,
        synthetic: None,
        csv: None,
        cpu: false,
        kernel: specdec::models::MatmulKernel::Auto,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--draft" => a.draft = value("--draft")?,
            "--k" => a.k = number("--k", &value("--k")?)?,
            "--tokens" => a.tokens = number("--tokens", &value("--tokens")?)?,
            "--rounds" => a.rounds = number("--rounds", &value("--rounds")?)?,
            "--prompt" => a.prompt = value("--prompt")?,
            "--temperature" => a.temperature = number("--temperature", &value("--temperature")?)?,
            "--csv" => a.csv = Some(value("--csv")?),
            "--cpu" => a.cpu = true,
            "--kernel" => {
                a.kernel = match value("--kernel")?.as_str() {
                    "auto" => specdec::models::MatmulKernel::Auto,
                    "q8rows" => specdec::models::MatmulKernel::Q8Rows,
                    "candle" => specdec::models::MatmulKernel::Candle,
                    other => {
                        return Err(format!("--kernel: auto, q8rows or candle, not {other:?}"))
                    }
                }
            }
            "--synthetic" => {
                let v = value("--synthetic")?;
                let rates = v.split(',').map(|s| number("--synthetic", s));
                a.synthetic = Some(rates.collect::<Result<_, _>>()?);
            }
            other if a.target.is_empty() && !other.starts_with("--") => a.target = other.into(),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.target.is_empty() {
        return Err(
            "usage: decode TARGET [--draft none|ngram|layers:N|MODEL] [--k 4] \
                    [--tokens 64] [--rounds 3] [--prompt code-edit|python|prose] \
                    [--temperature T] [--synthetic A1,A2,..] [--csv PATH] \
                    [--cpu [--kernel auto|q8rows|candle]]"
                .into(),
        );
    }
    if a.k == 0 || a.tokens == 0 || a.rounds == 0 {
        return Err("--k, --tokens and --rounds must be at least 1".into());
    }
    if !(a.temperature >= 0.0 && a.temperature.is_finite()) {
        return Err(format!(
            "--temperature {} must be finite and ≥ 0",
            a.temperature
        ));
    }
    let random = a.target.starts_with("random-");
    if a.cpu && (random || a.draft.starts_with("random-") || a.synthetic.is_some()) {
        return Err("--cpu runs the real weights: no random- models, no --synthetic".into());
    }
    if a.draft.starts_with("ngram-tree:") {
        tree_proposer(&a.draft)?;
        if a.cpu || a.synthetic.is_some() {
            return Err(
                "ngram-tree runs on the GPU with real weights (no --cpu: the CPU's \
                        trees are benches/tree_decode.rs; no --synthetic: trees verify with \
                        Rule::Exact)"
                    .into(),
            );
        }
    }
    if a.cpu && a.draft == "none" {
        return Err("--cpu compares plain decoding with a proposer: give --draft".into());
    }
    if random && a.synthetic.is_none() {
        return Err(
            "random weights make meaningless text: give --synthetic with the acceptance \
                    rates measured with the real weights"
                .into(),
        );
    }
    if let Some(r) = &a.synthetic {
        if r.len() != a.k || r.iter().any(|x| !(0.0..=1.0).contains(x)) {
            return Err(format!("--synthetic needs k = {} rates in [0, 1]", a.k));
        }
    }
    Ok(a)
}

/// A loaded model and, for real weights, the CPU-side weights (for the tokenizer).
struct Loaded {
    gpu: Arc<GpuModel>,
    weights: Option<Arc<Weights>>,
}

fn load(name: &str, seed: u64, verifier: &Verifier) -> Result<Loaded, Box<dyn std::error::Error>> {
    let (device, queue) = verifier.device().ok_or("the verifier has no GPU")?;
    let options = GpuModelOptions::default();
    if let Some(shape_name) = name.strip_prefix("random-") {
        let config =
            Config::known_shape(shape_name).ok_or(format!("no shape for {shape_name:?}"))?;
        let gpu = GpuModel::random(&config, seed, device, queue, &options)?;
        return Ok(Loaded {
            gpu: Arc::new(gpu),
            weights: None,
        });
    }
    let path = model_file(name);
    let w = Weights::load(&path)?;
    let gpu = GpuModel::load(&path, w.config(), device, queue, &options)?;
    Ok(Loaded {
        gpu: Arc::new(gpu),
        weights: Some(w),
    })
}

fn prompt_ids(target: &Loaded, name: &str) -> Result<Vec<u32>, String> {
    let text = prompt_text(name)?;
    Ok(match &target.weights {
        Some(w) => w.tokenizer().encode(text),
        // Random weights: any ids; the synthetic rule decides acceptance.
        None => (0..64)
            .map(|i| (i * 7919 % target.gpu.config().vocab_size) as u32)
            .collect(),
    })
}

fn proposer(a: &Args, target: &Loaded, verifier: &Verifier) -> Result<GpuProposer, String> {
    let p = match a.draft.as_str() {
        "none" => GpuProposer::None,
        "ngram" => GpuProposer::Ngram(NgramProposer::new(1, 3).map_err(|e| e.to_string())?),
        d if d.starts_with("ngram-tree:") => GpuProposer::NgramTree(tree_proposer(d)?),
        d if d.starts_with("layers:") => {
            let n = number("--draft layers:N", &d["layers:".len()..])?;
            let seq = GpuSequence::with_layers(target.gpu.clone(), n).map_err(|e| e.to_string())?;
            GpuProposer::Model(Box::new(seq))
        }
        model => {
            let m = load(model, 2, verifier).map_err(|e| format!("draft {model}: {e}"))?;
            let seq = GpuSequence::new(m.gpu).map_err(|e| e.to_string())?;
            GpuProposer::Model(Box::new(seq))
        }
    };
    Ok(p)
}

/// `ngram-tree:M:N` → the n-gram tree proposer with `M` matches and `N` nodes.
fn tree_proposer(draft: &str) -> Result<NgramTreeProposer, String> {
    let spec = &draft["ngram-tree:".len()..];
    let (m, n) = spec
        .split_once(':')
        .ok_or(format!("--draft {draft}: ngram-tree:M:N (matches, nodes)"))?;
    let (m, n) = (number("ngram-tree M", m)?, number("ngram-tree N", n)?);
    NgramTreeProposer::new(1, 3, m, n).map_err(|e| e.to_string())
}

/// One measured generation: tokens per second of decode time, and its metrics.
struct Run {
    tokens: Vec<u32>,
    tok_s: f64,
    steps: u64,
    accepted: u64,
    step_time: Duration,
    /// Steps recorded ahead on a guess (`GpuDecoder::guessed_steps`).
    guessed: u64,
    /// Per step: the host's drafting and recording (`propose_time`), and the rest until the
    /// emitted tokens are read (`score_time`).
    record: Duration,
    wait: Duration,
    /// Plain runs taken instead of steps (`Metrics::plain_steps`, `Speculation::WhilePaying`).
    plain_runs: u64,
}

impl Run {
    /// Steps, guessed steps and the per-step split, for the progress lines.
    fn detail(&self) -> String {
        format!(
            "{} steps, {} guessed ahead; per step {:.3} ms recording + {:.3} ms waiting",
            self.steps,
            self.guessed,
            self.record.as_secs_f64() * 1e3,
            self.wait.as_secs_f64() * 1e3
        )
    }
}

fn generate(
    decoder: &mut GpuDecoder<'_>,
    prompt: &[u32],
    params: SamplingParams,
    tokens: usize,
) -> Result<Run, Box<dyn std::error::Error>> {
    decoder.reset_metrics();
    let guessed = decoder.guessed_steps();
    let out = decoder.generate(prompt, params, tokens)?;
    let m = decoder.metrics();
    let decode = m.propose_time + m.score_time;
    let steps = m.target_calls.max(1) as u32;
    Ok(Run {
        guessed: decoder.guessed_steps() - guessed,
        record: m.propose_time / steps,
        wait: m.score_time / steps,
        tok_s: out.tokens.len() as f64 / decode.as_secs_f64(),
        tokens: out.tokens,
        steps: m.target_calls,
        accepted: m.accepted,
        step_time: decode / (m.target_calls.max(1) as u32),
        plain_runs: m.plain_steps,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The verifier's time on one step's `k + 1` rows with the run's rule and parameters: GPU
/// timestamps around its compute pass where the device has them (median of 20), else the wall
/// time of a verify-only submission and its readback.
fn verify_time(
    verifier: &Verifier,
    vocab: usize,
    k: usize,
    params: SamplingParams,
    rates: Option<&[f32]>,
) -> Result<(Duration, &'static str), Box<dyn std::error::Error>> {
    let (device, queue) = verifier.device().ok_or("the verifier has no GPU")?;
    let rows = k + 1;
    // Logits of the magnitude a model produces; their values do not change the work done.
    let logits: Vec<f32> = (0..rows * vocab)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0 * 8.0)
        .collect();
    let buffer = wgpu::util::DeviceExt::create_buffer_init(
        device,
        &wgpu::util::BufferInitDescriptor {
            label: Some("decode bench logits"),
            contents: bytemuck::cast_slice(&logits),
            usage: wgpu::BufferUsages::STORAGE,
        },
    );
    let drafts: Vec<i32> = (0..k as i32).map(|i| i * 17 + 3).collect();
    let request = [Request {
        num_drafts: k as u32,
        params,
        position: 100,
    }];
    let batch = GpuVerifyBatch {
        vocab_size: vocab as u32,
        requests: &request,
        draft_token_ids: &drafts,
        target_logits: GpuRows::f32(&buffer, 0),
        draft: Draft::OneHot,
        draft_vocab_size: None,
        synthetic_rates: rates,
    };
    let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
    let query = timestamps.then(|| {
        device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("decode bench verify"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        })
    });
    let resolve = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("decode bench resolve"),
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("decode bench read"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut times = Vec::new();
    for i in 0..25 {
        let t = Instant::now();
        let mut enc = device.create_command_encoder(&Default::default());
        let pending = match &query {
            Some(q) => {
                let writes = wgpu::ComputePassTimestampWrites {
                    query_set: q,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                };
                let p =
                    verifier.record_timed(&mut enc, &batch, specdec::Timestamps::Pass(writes))?;
                enc.resolve_query_set(q, 0..2, &resolve, 0);
                enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, 16);
                p
            }
            None => verifier.record(&mut enc, &batch)?,
        };
        queue.submit([enc.finish()]);
        verifier.read_blocking(pending)?;
        let wall = t.elapsed();
        let took = if query.is_some() {
            read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
            device.poll(wgpu::PollType::wait_indefinitely())?;
            let ticks: Vec<u64> = {
                let view = read
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| format!("{e:?}"))?;
                bytemuck::cast_slice(&view).to_vec()
            };
            read.unmap();
            let ns =
                ticks[1].saturating_sub(ticks[0]) as f64 * f64::from(queue.get_timestamp_period());
            Duration::from_nanos(ns as u64)
        } else {
            wall
        };
        if i >= 5 {
            times.push(took.as_secs_f64());
        }
    }
    let how = if query.is_some() {
        "GPU timestamps"
    } else {
        "wall clock"
    };
    Ok((Duration::from_secs_f64(median(times)), how))
}

fn run(a: &Args) -> Result<(), String> {
    if a.cpu {
        return run_cpu(a).map_err(|e| e.to_string());
    }
    run_inner(a).map_err(|e| e.to_string())
}

/// The CPU path: plain decoding and speculative decoding through `SpecDecoder` with a CPU
/// verifier, alternated per round: plain, speculating on every step (`Speculation::Always`) and
/// the default `Speculation::WhilePaying`; a row for each speculative decoder, with the same
/// plain column. All run the same loop (plain is `k = 0`) with the target's prompt prefilled
/// before the clock starts; the draft model's own prefill of the prompt falls in the first
/// speculative step (it counts against speculation).
fn run_cpu(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    use specdec::models::{GreedyDraft, Model};
    use specdec::speculative::{
        DecoderConfig, DraftModelProposer, GenRequest, Proposer, Sequences, SpecDecoder,
        Speculation,
    };
    let options = specdec::models::LoadOptions {
        kernel: a.kernel,
        ..Default::default()
    };
    let weights = Weights::load_with(model_file(&a.target), &options)?;
    let prompt = weights.tokenizer().encode(prompt_text(&a.prompt)?);
    let params = if a.temperature > 0.0 {
        SamplingParams::seeded(a.temperature, 1)
    } else {
        SamplingParams::greedy()
    };
    let verifier = Verifier::cpu(specdec::VerifierOptions::default());
    let threads = rayon_threads();
    eprintln!("CPU path ({threads} threads); target {}", a.target);
    let draft_model = |draft: &str| -> Result<Option<Model>, Box<dyn std::error::Error>> {
        Ok(match draft {
            "none" | "ngram" => None,
            d if d.starts_with("layers:") => {
                let n = number("--draft layers:N", &d["layers:".len()..])?;
                Some(Model::layer_skip(weights.clone(), n)?)
            }
            model => Some(Model::new(Weights::load_with(model_file(model), &options)?)),
        })
    };
    let template = draft_model(&a.draft)?;
    type Run = (f64, specdec::speculative::Metrics, Vec<u32>);
    let generate =
        |k: usize, speculation: Speculation| -> Result<Run, Box<dyn std::error::Error>> {
            let mut model = Model::new(weights.clone());
            model.forward(&prompt[..prompt.len() - 1])?;
            let mut target = Sequences::new(vec![model]);
            // Plain decoding (k = 0) never asks its proposer for drafts.
            let mut proposer: Box<dyn Proposer> = match &template {
                Some(t) if k > 0 => Box::new(DraftModelProposer::new(GreedyDraft::new(t.clone()))),
                _ => Box::new(NgramProposer::new(1, 3)?),
            };
            let mut decoder = SpecDecoder::new(
                &verifier,
                DecoderConfig {
                    num_drafts: k,
                    speculation,
                    ..DecoderConfig::default()
                },
            );
            let request = GenRequest::new(prompt.clone(), params, a.tokens);
            let out = decoder.generate(&mut target, proposer.as_mut(), &[request])?;
            let m = decoder.metrics().clone();
            let rate = out[0].tokens.len() as f64 / m.elapsed.as_secs_f64();
            Ok((rate, m, out[0].tokens.clone()))
        };
    // Warm-up: allocations, caches, the CPU's clocks.
    let _ = generate(a.k.min(2), Speculation::Always)?;
    let ways = [
        ("always", Speculation::Always),
        ("while-paying", Speculation::WhilePaying),
    ];
    let mut plain = Vec::new();
    let mut spec: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut last = [None, None];
    for round in 0..a.rounds {
        let (p, _, plain_tokens) = generate(0, Speculation::Always)?;
        plain.push(p);
        let mut line = format!("round {round}: plain {p:.2} tok/s");
        for (i, &(name, way)) in ways.iter().enumerate() {
            let (s, m, tokens) = generate(a.k, way)?;
            if a.temperature == 0.0 && plain_tokens != tokens {
                return Err(format!(
                    "speculative greedy output ({name}) differs from plain greedy output"
                )
                .into());
            }
            line += &format!(
                ", {name} {s:.2} tok/s ({} of {} steps plain)",
                m.plain_steps, m.target_calls
            );
            spec[i].push(s);
            last[i] = Some(m);
        }
        eprintln!("{line}");
    }
    let plain = median(plain);
    println!("{}", Row::HEADER);
    for (i, &(name, _)) in ways.iter().enumerate() {
        let m = last[i].take().expect("at least one round");
        let decode = m.elapsed.as_secs_f64();
        let row = Row {
            model: a.target.clone(),
            draft: a.draft.clone(),
            proposer: proposer_kind(&a.draft).into(),
            backend: "cpu".into(),
            adapter: cpu_adapter(a.kernel, threads),
            k: a.k,
            plain_tok_s: plain,
            spec_tok_s: median(std::mem::take(&mut spec[i])),
            accepted_per_step: m.accepted as f64 / m.target_calls.max(1) as f64,
            verify_share: Some(m.verify_time.as_secs_f64() / decode),
            prompt: a.prompt.clone(),
            temperature: a.temperature,
            rounds: a.rounds,
            speculation: name,
            tokens: a.tokens,
        };
        println!("{}", row.csv());
        println!(
            "{name}: speed-up {:.2}x; verify {:.1} % of the speculative run",
            row.spec_tok_s / row.plain_tok_s,
            row.verify_share.unwrap_or(f64::NAN) * 100.0
        );
        if let Some(path) = &a.csv {
            row.append(path)?;
            eprintln!("appended to {path}");
        }
    }
    Ok(())
}

/// Threads candle's CPU kernels use (`RAYON_NUM_THREADS`, else the machine's cores).
/// The `adapter` column of a `--cpu` row: the kernel, its instruction set, the threads.
fn cpu_adapter(kernel: specdec::models::MatmulKernel, threads: usize) -> String {
    let threads = if threads == 1 {
        "1 thread".to_string()
    } else {
        format!("{threads} threads")
    };
    match kernel.resolve() {
        specdec::models::MatmulKernel::Q8Rows if specdec::models::CpuKernel::simd_available() => {
            format!("q8rows AVX-512 VNNI, {threads}")
        }
        specdec::models::MatmulKernel::Q8Rows => format!("q8rows portable, {threads}"),
        _ => format!("candle, {threads}"),
    }
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A GPU verifier on a device with timestamp queries where the adapter has them, so that
/// `verify_share` is the verifier's GPU time rather than the wall time of a submission.
fn timed_verifier() -> Result<Verifier, Box<dyn std::error::Error>> {
    let adapter = specdec::select_adapter()?;
    let limits = specdec::required_limits(&adapter.limits())?;
    let features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("decode bench"),
        required_features: features,
        required_limits: limits,
        ..Default::default()
    }))?;
    Ok(Verifier::with_device(device, queue, Default::default())?)
}

/// The rounds of one speculative decoder: tok/s per round and the counters summed.
#[derive(Default)]
struct Series {
    tok_s: Vec<f64>,
    steps: u64,
    accepted: u64,
    step_time: Duration,
}

impl Series {
    fn add(&mut self, r: &Run) {
        self.tok_s.push(r.tok_s);
        self.steps += r.steps;
        self.accepted += r.accepted;
        self.step_time += r.step_time;
    }
}

fn run_inner(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let verifier = timed_verifier()?;
    let info = verifier.adapter_info().cloned().ok_or("no GPU adapter")?;
    eprintln!(
        "adapter: {} ({:?}); loading {}",
        info.name, info.backend, a.target
    );
    let target = load(&a.target, 1, &verifier)?;
    let prompt = prompt_ids(&target, &a.prompt)?;
    let vocab = target.gpu.config().vocab_size;
    let mut params = if a.temperature > 0.0 {
        SamplingParams::seeded(a.temperature, 1)
    } else {
        SamplingParams::greedy()
    };
    let rates = match &a.synthetic {
        Some(r) => {
            params = SamplingParams::seeded(a.temperature.max(1.0), 1);
            params.rule = Rule::Synthetic;
            Some(specdec::synthetic::conditional_from_unconditional(r)?)
        }
        None => None,
    };
    let config = GpuDecodeConfig {
        num_drafts: a.k,
        eos: Vec::new(),
        synthetic_rates: rates.clone(),
        speculation: Speculation::Always,
    };
    let seq = || GpuSequence::new(target.gpu.clone());
    let mut plain = GpuDecoder::new(&verifier, seq()?, GpuProposer::None, config.clone())?;
    let mut spec = GpuDecoder::new(
        &verifier,
        seq()?,
        proposer(a, &target, &verifier)?,
        config.clone(),
    )?;
    // A draft-model run also times the decoder's default, which takes plain runs where they
    // are faster (`Speculation::WhilePaying`), in the same rounds; with n-gram drafts the
    // default speculates on every step, as `spec` does.
    let mut paying = match proposer(a, &target, &verifier)? {
        p @ GpuProposer::Model(_) => Some(GpuDecoder::new(
            &verifier,
            seq()?,
            p,
            GpuDecodeConfig {
                speculation: Speculation::WhilePaying,
                ..config.clone()
            },
        )?),
        _ => None,
    };
    // A tree run also times the n-gram chain of the same depth, in the same rounds.
    let tree = a.draft.starts_with("ngram-tree:");
    let mut chain = match tree {
        true => {
            let ngram = GpuProposer::Ngram(NgramProposer::new(1, 3)?);
            Some(GpuDecoder::new(&verifier, seq()?, ngram, config)?)
        }
        false => None,
    };
    // Warm-up: pipelines, buffers and the GPU's clocks; the text shows what is being decoded.
    generate(&mut plain, &prompt, params, a.tokens.min(16))?;
    if let Some(c) = &mut chain {
        generate(c, &prompt, params, a.tokens.min(16))?;
    }
    let text = spec.generate(&prompt, params, a.tokens)?.tokens;
    if let Some(w) = &target.weights {
        eprintln!("continuation: {:?}", w.tokenizer().decode(&text));
    }
    let (mut plain_tok_s, mut s_spec, mut s_chain) = (vec![], Series::default(), Series::default());
    let mut s_paying = Series::default();
    for round in 0..a.rounds {
        // Sampled text differs from seed to seed, and chains and trees draw differently: each
        // round is one more sample (the same seed for all decoders of the round).
        let params = match params.seed {
            Some(_) if a.temperature > 0.0 && a.synthetic.is_none() => SamplingParams {
                seed: Some(round as u64 + 1),
                ..params
            },
            _ => params,
        };
        let p = generate(&mut plain, &prompt, params, a.tokens)?;
        let s = generate(&mut spec, &prompt, params, a.tokens)?;
        let c = chain
            .as_mut()
            .map(|c| generate(c, &prompt, params, a.tokens))
            .transpose()?;
        let w = paying
            .as_mut()
            .map(|d| generate(d, &prompt, params, a.tokens))
            .transpose()?;
        eprintln!(
            "round {round}: plain {:.1} tok/s, speculative {:.1} tok/s ({} drafts accepted; \
             {}){}",
            p.tok_s,
            s.tok_s,
            s.accepted,
            s.detail(),
            c.as_ref().map_or(String::new(), |c| format!(
                "; chain {:.1} tok/s ({})",
                c.tok_s,
                c.detail()
            )) + &w.as_ref().map_or(String::new(), |w| format!(
                "; while paying {:.1} tok/s ({} plain runs)",
                w.tok_s, w.plain_runs
            ))
        );
        if params.temperature == 0.0 {
            let same = |r: &Run| r.tokens == p.tokens;
            if !same(&s)
                || c.as_ref().is_some_and(|c| !same(c))
                || w.as_ref().is_some_and(|w| !same(w))
            {
                return Err("greedy speculative output differs from plain greedy output".into());
            }
        }
        plain_tok_s.push(p.tok_s);
        s_spec.add(&s);
        if let Some(c) = &c {
            s_chain.add(c);
        }
        if let Some(w) = &w {
            s_paying.add(w);
        }
    }
    let m = spec.metrics();
    let per_position: Vec<String> = (0..a.k)
        .map(|i| {
            m.acceptance_rate(i)
                .map_or("-".into(), |r| format!("{r:.3}"))
        })
        .collect();
    eprintln!(
        "acceptance per position (last round; steps accepting more than i drafts): {}",
        per_position.join(",")
    );
    let (verify, how) = verify_time(&verifier, vocab, a.k, params, rates.as_deref())?;
    let plain = median(plain_tok_s);
    let row = |draft: &str, s: Series, speculation: &'static str| {
        let step_time = s.step_time / a.rounds as u32;
        Row {
            model: a.target.clone(),
            draft: draft.into(),
            proposer: proposer_kind(draft).into(),
            backend: format!("{:?}", info.backend).to_lowercase(),
            adapter: info.name.clone(),
            k: a.k,
            plain_tok_s: plain,
            spec_tok_s: median(s.tok_s),
            accepted_per_step: s.accepted as f64 / s.steps.max(1) as f64,
            // A chain step's verifier time; a tree's rows differ (benches/tree_verify.rs).
            verify_share: (!draft.starts_with("ngram-tree"))
                .then(|| verify.as_secs_f64() / step_time.as_secs_f64()),
            prompt: a.prompt.clone(),
            temperature: a.temperature,
            rounds: a.rounds,
            speculation,
            tokens: a.tokens,
        }
    };
    let mut rows = vec![];
    if chain.is_some() {
        rows.push(row("ngram", s_chain, "always"));
    }
    rows.push(row(&a.draft, s_spec, "always"));
    if paying.is_some() {
        rows.push(row(&a.draft, s_paying, "while-paying"));
    }
    println!("{}", Row::HEADER);
    for row in &rows {
        println!("{}", row.csv());
        println!(
            "{}: speed-up {:.2}x; {:.2} accepted per step",
            row.draft,
            row.spec_tok_s / row.plain_tok_s,
            row.accepted_per_step
        );
    }
    println!(
        "chain verify {:.1} us ({how}) on k + 1 rows",
        verify.as_secs_f64() * 1e6
    );
    if let Some(path) = &a.csv {
        for row in &rows {
            row.append(path)?;
        }
        eprintln!("appended to {path}");
    }
    Ok(())
}

fn proposer_kind(draft: &str) -> &'static str {
    match draft {
        "none" => "none",
        "ngram" => "ngram",
        d if d.starts_with("ngram-tree:") => "ngram-tree",
        d if d.starts_with("layers:") => "layer-skip",
        _ => "draft-model",
    }
}

/// One line of the results CSV.
struct Row {
    model: String,
    draft: String,
    proposer: String,
    backend: String,
    adapter: String,
    k: usize,
    plain_tok_s: f64,
    spec_tok_s: f64,
    accepted_per_step: f64,
    /// Empty for tree rows.
    verify_share: Option<f64>,
    prompt: String,
    temperature: f32,
    rounds: usize,
    /// `always` (every step proposes) or `while-paying` (the decoders' default,
    /// `Speculation::WhilePaying`).
    speculation: &'static str,
    /// Tokens generated per run (`--tokens`).
    tokens: usize,
}

impl Row {
    const HEADER: &'static str = "model,draft,proposer,backend,adapter,k,plain_tok_s,spec_tok_s,\
                                  accepted_per_step,verify_share,prompt,temperature,rounds,\
                                  speculation,tokens";

    fn csv(&self) -> String {
        format!(
            "{},{},{},{},\"{}\",{},{:.2},{:.2},{:.3},{},{},{},{},{},{}",
            self.model,
            self.draft,
            self.proposer,
            self.backend,
            self.adapter.replace('"', "'"),
            self.k,
            self.plain_tok_s,
            self.spec_tok_s,
            self.accepted_per_step,
            self.verify_share
                .map_or(String::new(), |v| format!("{v:.4}")),
            self.prompt,
            self.temperature,
            self.rounds,
            self.speculation,
            self.tokens
        )
    }

    /// Appends the row, writing the header first when the file is new or empty.
    fn append(&self, path: &str) -> std::io::Result<()> {
        use std::io::Write;
        let new = std::fs::metadata(path).map_or(true, |m| m.len() == 0);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if new {
            writeln!(f, "{}", Self::HEADER)?;
        }
        writeln!(f, "{}", self.csv())
    }
}

//! Tree against chain speculation on the CPU: plain decoding, n-gram chains and n-gram trees
//! through one decode loop (`specdec::models::generate_tree`), alternated round by round in one
//! process, so that each sees the machine alike.
//!
//! ```text
//! cargo bench --features candle --bench tree_decode -- smollm2 --prompt fields
//! ```
//!
//! Arguments: `MODEL [--prompt code-edit|fields|python|prose] [--tokens 64] [--rounds 3]
//! [--depth 6] [--matches 8] [--nodes 64] [--temperature T] [--kernel auto|q8rows|candle]
//! [--csv PATH]`. A model is `smollm2`, `qwen-0.5b`, `qwen-1.5b` or a GGUF path. The chain is
//! the tree proposer with one match (the n-gram proposer's chain); the tree merges up to
//! `--matches` earlier occurrences into at most `--nodes` nodes. Greedy runs (the default) stop
//! with an error if either emits other text than plain decoding.
//!
//! `--draft MODEL|layers:N [--branching 2] [--width 4]` drafts with a model instead
//! (`models::DraftTreeProposer`): the chain is its greedy chain, the tree adds per level the
//! `--width` best of each deepest node's top `--branching` continuations (the `matches` and
//! `nodes` columns then hold branching and width, and the `drafter` column names the draft):
//!
//! ```text
//! cargo bench --features candle --bench tree_decode -- qwen-1.5b --draft qwen-0.5b --depth 4
//! ```
//!
//! Output: per mode the median tok/s over rounds (decode time, prefill excluded), generated
//! tokens per target call, draft nodes per call, and the ratio to plain decoding; with `--csv`
//! the rows are appended (`model, prompt, mode, adapter, depth, matches, nodes, tok_s,
//! tokens_per_call, nodes_per_call, vs_plain, drafter`; CSVs from before the last column have
//! eleven).

use std::process::ExitCode;

use specdec::models::{generate_tree, generate_tree_with, DraftTreeProposer};
use specdec::models::{model_file, LoadOptions, MatmulKernel, Model, Weights};
use specdec::models::{TreeGenOptions, TreeGeneration};
use specdec::speculative::NgramTreeProposer;
use specdec::SamplingParams;

#[path = "common/prompts.rs"]
mod prompts;

struct Args {
    model: String,
    prompt: String,
    tokens: usize,
    rounds: usize,
    depth: usize,
    matches: usize,
    nodes: usize,
    temperature: f32,
    kernel: MatmulKernel,
    csv: Option<String>,
    /// A draft model (`MODEL` or `layers:N`): chains and trees drafted by it instead of n-grams.
    draft: Option<String>,
    branching: usize,
    width: usize,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match parse(&args).map_err(|e| e.into()).and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tree_decode bench: {e}");
            ExitCode::from(2)
        }
    }
}

fn number<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{name} needs a number, got {v:?}"))
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        model: String::new(),
        prompt: "fields".into(),
        tokens: 64,
        rounds: 3,
        depth: 6,
        matches: 8,
        nodes: 64,
        temperature: 0.0,
        kernel: MatmulKernel::Auto,
        csv: None,
        draft: None,
        branching: 2,
        width: 4,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--prompt" => a.prompt = value()?,
            "--tokens" => a.tokens = number(arg, &value()?)?,
            "--rounds" => a.rounds = number(arg, &value()?)?,
            "--depth" => a.depth = number(arg, &value()?)?,
            "--matches" => a.matches = number(arg, &value()?)?,
            "--nodes" => a.nodes = number(arg, &value()?)?,
            "--temperature" => a.temperature = number(arg, &value()?)?,
            "--csv" => a.csv = Some(value()?),
            "--draft" => a.draft = Some(value()?),
            "--branching" => a.branching = number(arg, &value()?)?,
            "--width" => a.width = number(arg, &value()?)?,
            "--kernel" => {
                a.kernel = match value()?.as_str() {
                    "auto" => MatmulKernel::Auto,
                    "q8rows" => MatmulKernel::Q8Rows,
                    "candle" => MatmulKernel::Candle,
                    k => return Err(format!("unknown --kernel {k:?}: auto, q8rows or candle")),
                }
            }
            "--help" | "-h" => return Err("see the header of benches/tree_decode.rs".into()),
            m if !m.starts_with('-') && a.model.is_empty() => a.model = m.into(),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.model.is_empty() || a.rounds == 0 || a.tokens == 0 {
        return Err("usage: tree_decode MODEL [--prompt P] [--tokens N] [--rounds R] ...".into());
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The CSV header.
const HEADER: &str = "model,prompt,mode,adapter,depth,matches,nodes,tok_s,tokens_per_call,\
                      nodes_per_call,vs_plain,drafter";

/// The three drafters compared: none, the chain, the tree.
const MODES: [&str; 3] = ["plain", "chain", "tree"];

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let load = LoadOptions {
        kernel: a.kernel,
        ..Default::default()
    };
    let weights = Weights::load_with(model_file(&a.model), &load)?;
    let prompt = weights.tokenizer().encode(prompts::prompt_text(&a.prompt)?);
    let params = if a.temperature > 0.0 {
        SamplingParams::seeded(a.temperature, 1)
    } else {
        SamplingParams::greedy()
    };
    let mut model = Model::new(weights.clone());
    let options = |mode: &str| -> Result<TreeGenOptions, Box<dyn std::error::Error>> {
        let proposer = match mode {
            "chain" => Some(NgramTreeProposer::new(1, 3, 1, a.nodes)?),
            "tree" => Some(NgramTreeProposer::new(1, 3, a.matches, a.nodes)?),
            _ => None,
        };
        Ok(TreeGenOptions {
            max_new_tokens: a.tokens,
            params,
            proposer,
            depth: a.depth,
            verify_threads: 1,
        })
    };
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let adapter = format!("cpu-{:?}-{threads}-threads", a.kernel.resolve()).to_lowercase();
    eprintln!(
        "{} on {adapter}, prompt {:?}, {} tokens",
        a.model, a.prompt, a.tokens
    );
    // With a draft model: its greedy chain and its tree, each proposer with its own cache.
    let mut drafts = match &a.draft {
        Some(d) => {
            let draft = || -> Result<Model, Box<dyn std::error::Error>> {
                Ok(match d.strip_prefix("layers:") {
                    Some(n) => Model::layer_skip(weights.clone(), number("--draft layers:N", n)?)?,
                    None => Model::new(Weights::load_with(model_file(d), &load)?),
                })
            };
            let chain = DraftTreeProposer::new(draft()?, 1, 1)?;
            Some((
                chain,
                DraftTreeProposer::new(draft()?, a.branching, a.width)?,
            ))
        }
        None => None,
    };
    let mut generate = |mode: &str| -> Result<TreeGeneration, Box<dyn std::error::Error>> {
        let plain = options("plain")?;
        Ok(match (&mut drafts, mode) {
            (Some((c, _)), "chain") => generate_tree_with(&mut model, &prompt, &plain, c)?,
            (Some((_, t)), "tree") => generate_tree_with(&mut model, &prompt, &plain, t)?,
            _ => generate_tree(&mut model, &prompt, &options(mode)?)?,
        })
    };
    generate("tree")?; // warm-up
    let mut runs: Vec<Vec<TreeGeneration>> = vec![Vec::new(); MODES.len()];
    for round in 0..a.rounds {
        // Rotate the order so that no mode always runs first.
        for i in 0..MODES.len() {
            let m = (i + round) % MODES.len();
            let out = generate(MODES[m])?;
            eprintln!(
                "round {round} {:>5}: {:7.2} tok/s, {:.2} tokens per call",
                MODES[m],
                out.tokens_per_second(),
                out.tokens_per_call()
            );
            runs[m].push(out);
        }
        if a.temperature == 0.0
            && runs
                .iter()
                .any(|r| r[round].tokens != runs[0][round].tokens)
        {
            return Err("greedy outputs differ between plain, chain and tree decoding".into());
        }
    }
    let plain = median(runs[0].iter().map(|r| r.tokens_per_second()).collect());
    println!("{HEADER}");
    let drafter = a.draft.as_deref().unwrap_or("ngram");
    let mut lines = Vec::new();
    for (m, mode) in MODES.iter().enumerate() {
        let rs = &runs[m];
        let tok_s = median(rs.iter().map(|r| r.tokens_per_second()).collect());
        let calls: usize = rs.iter().map(|r| r.target_calls).sum();
        let tokens: usize = rs.iter().map(|r| r.tokens.len()).sum();
        let nodes: usize = rs.iter().map(|r| r.nodes_scored).sum();
        // For a draft model: branching and width; for n-grams: matches and nodes.
        let (matches, nodes_col) = match (a.draft.is_some(), *mode) {
            (true, "tree") => (a.branching, a.width),
            (true, _) => (1, 1),
            (false, "tree") => (a.matches, a.nodes),
            (false, _) => (1, a.nodes),
        };
        let line = format!(
            "{},{},{mode},{adapter},{},{matches},{nodes_col},{tok_s:.2},{:.3},{:.2},{:.3},{drafter}",
            a.model,
            a.prompt,
            a.depth,
            tokens as f64 / calls as f64,
            nodes as f64 / calls as f64,
            tok_s / plain
        );
        println!("{line}");
        lines.push(line);
    }
    if let Some(path) = &a.csv {
        use std::io::Write as _;
        let new = !std::path::Path::new(path).exists();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if new {
            writeln!(f, "{HEADER}")?;
        }
        for l in lines {
            writeln!(f, "{l}")?;
        }
        eprintln!("appended to {path}");
    }
    Ok(())
}

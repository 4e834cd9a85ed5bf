//! Cost of a verifier's target call on the CPU by its row count: one forward of 1, 2, 3, 5 and 9
//! tokens after a 12-token prefix, for each CPU matmul kernel, the kernels and row counts
//! alternated call by call so that a change in machine load hits all of them alike.
//!
//! ```text
//! cargo bench --features candle --bench cpu_calls -- [MODEL ...] [--rows 1,2,3,5,9]
//!     [--iters N] [--kernels q8rows,candle] [--csv PATH]
//! ```
//!
//! MODEL: `smollm2`, `qwen-0.5b`, `qwen-1.5b` (files from `examples/fetch-models.sh`) or a GGUF
//! path; default `smollm2`. `RAYON_NUM_THREADS` sets the threads (recorded in the CSV). Each
//! line gives the median call in ms and its ratio to the same kernel's 1-row call. The CSV gets
//! `model, kernel, threads, rows, call_ms, vs_one_row` per cell.

use std::io::Write;
use std::time::Instant;

use specdec::models::{model_file, CpuKernel, LoadOptions, MatmulKernel, Model, Weights};

/// The prefix and the drafted tokens come from this text (12 + 9 tokens needed in every
/// tokenizer).
const PROMPT: &str = "def quicksort(items):\n    if len(items) <= 1:\n        return items\n    \
pivot = items[len(items) // 2]\n    left = [x for x in items if x < pivot]\n    middle = [x for x \
in items if x == pivot]\n";

struct Args {
    models: Vec<String>,
    rows: Vec<usize>,
    iters: usize,
    kernels: Vec<MatmulKernel>,
    csv: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        models: Vec::new(),
        rows: vec![1, 2, 3, 5, 9],
        iters: 7,
        kernels: vec![MatmulKernel::Q8Rows, MatmulKernel::Candle],
        csv: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--rows" => {
                a.rows = value()?
                    .split(',')
                    .map(|r| r.parse().map_err(|_| format!("--rows: bad count {r:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "--iters" => {
                a.iters = value()?
                    .parse()
                    .map_err(|_| "--iters: not a count".to_string())?;
            }
            "--kernels" => {
                a.kernels = value()?
                    .split(',')
                    .map(|k| match k {
                        "q8rows" => Ok(MatmulKernel::Q8Rows),
                        "candle" => Ok(MatmulKernel::Candle),
                        other => Err(format!("--kernels: q8rows or candle, not {other:?}")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--csv" => a.csv = Some(value()?),
            // `cargo bench` passes --bench to every bench target.
            "--bench" => {}
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            model => a.models.push(model.to_string()),
        }
    }
    if a.models.is_empty() {
        a.models.push("smollm2".into());
    }
    if a.rows.contains(&0) || a.iters == 0 || a.kernels.is_empty() {
        return Err("--rows, --iters and --kernels must be non-empty and non-zero".into());
    }
    Ok(a)
}

fn kernel_name(k: MatmulKernel) -> &'static str {
    match k {
        MatmulKernel::Q8Rows => "q8rows",
        MatmulKernel::Candle => "candle",
        MatmulKernel::Auto => "auto",
    }
}

/// Seconds of one forward of `tokens` on a fork of `base`.
fn time_call(base: &Model, tokens: &[u32]) -> Result<f64, Box<dyn std::error::Error>> {
    let mut m = base.clone();
    let started = Instant::now();
    m.forward(tokens)?;
    Ok(started.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let threads = rayon::current_num_threads();
    eprintln!(
        "{threads} threads; AVX-512 VNNI path: {}",
        CpuKernel::simd_available()
    );
    let mut csv = match &a.csv {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        ),
        None => None,
    };
    if let Some(f) = csv.as_mut() {
        if f.metadata()?.len() == 0 {
            writeln!(f, "model,kernel,threads,rows,call_ms,vs_one_row")?;
        }
    }
    let most = *a.rows.iter().max().expect("rows checked non-empty");
    for name in &a.models {
        let path = model_file(name);
        let mut bases = Vec::new();
        for &kernel in &a.kernels {
            let started = Instant::now();
            let options = LoadOptions {
                kernel,
                ..LoadOptions::default()
            };
            let weights = Weights::load_with(&path, &options)?;
            eprintln!(
                "{name}, {}: loaded in {:.1} s",
                kernel_name(kernel),
                started.elapsed().as_secs_f64()
            );
            let tokens = weights.tokenizer().encode(PROMPT);
            if tokens.len() < 12 + most {
                return Err(format!("{name}: the prompt has only {} tokens", tokens.len()).into());
            }
            let mut base = Model::new(weights);
            base.forward_last(&tokens[..12], 1)?;
            bases.push((kernel, base, tokens[12..12 + most].to_vec()));
        }
        // Warm-up: one call of each shape and kernel.
        for (_, base, drafts) in &bases {
            for &rows in &a.rows {
                time_call(base, &drafts[..rows])?;
            }
        }
        let mut times = vec![vec![Vec::new(); a.rows.len()]; bases.len()];
        for i in 0..a.iters {
            for (r, &rows) in a.rows.iter().enumerate() {
                for (b, (_, base, drafts)) in bases.iter().enumerate() {
                    times[b][r].push(time_call(base, &drafts[..rows])?);
                }
            }
            eprint!("\r{name}: round {} of {}", i + 1, a.iters);
        }
        eprintln!();
        println!("{name}: ms per call (÷ 1 row), median of {}", a.iters);
        for (b, (kernel, _, _)) in bases.iter().enumerate() {
            let one = median(times[b][0].clone());
            let mut line = format!("{:>8}", kernel_name(*kernel));
            for (r, &rows) in a.rows.iter().enumerate() {
                let ms = median(times[b][r].clone()) * 1e3;
                line += &format!("  {rows}: {ms:>7.1} ({:.2}×)", ms / one / 1e3);
                if let Some(f) = csv.as_mut() {
                    writeln!(
                        f,
                        "{name},{},{threads},{rows},{ms:.2},{:.3}",
                        kernel_name(*kernel),
                        ms / one / 1e3
                    )?;
                }
            }
            println!("{line}");
        }
    }
    Ok(())
}

fn main() {
    let code = match parse().map_err(|e| e.into()).and_then(|a| run(&a)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cpu_calls: {e}");
            2
        }
    };
    std::process::exit(code);
}

//! The verify-step benchmark (issue 5): one command, one self-contained binary.
//!
//! ```text
//! cargo bench --bench verify                 # full grid on the GPU Verifier::new would pick
//! cargo bench --bench verify -- --quick      # small grid (software adapters)
//! cargo bench --bench verify -- --cpu --quick
//! ```
//! Options: `--quick`, `--cpu`, `--reps N`, `--batch 1,8`, `--k 1,4`, `--vocab 32000`,
//! `--modes greedy,one_hot`, `--no-baseline`, `--portable` (no SHADER_INT64), `--target-wgs N`, `--out DIR` (default
//! `benches/results`).
//! Writes `DIR/<date>-<adapter>.csv` and `.svg` and prints a table.

use specdec::bench::{run_cpu, run_gpu, BenchConfig, BenchMode};

fn list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',').filter_map(|x| x.trim().parse().ok()).collect()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut cfg = if args.iter().any(|a| a == "--quick") {
        BenchConfig::quick()
    } else {
        BenchConfig::full()
    };
    let mut out = std::path::PathBuf::from("benches/results");
    let mut cpu = false;
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--quick" => {}
            "--cpu" => cpu = true,
            "--no-baseline" => cfg.baseline_reps = 0,
            "--portable" => cfg.shader_int64 = false,
            "--reps" => {
                cfg.reps = value.parse().expect("--reps N");
                i += 1;
            }
            "--batch" => {
                cfg.batches = list(&value);
                i += 1;
            }
            "--k" => {
                cfg.ks = list(&value);
                i += 1;
            }
            "--vocab" => {
                cfg.vocabs = list(&value);
                i += 1;
            }
            "--modes" => {
                cfg.modes = value
                    .split(',')
                    .map(|m| BenchMode::parse(m).unwrap_or_else(|| panic!("unknown mode {m}")))
                    .collect();
                i += 1;
            }
            "--target-wgs" => {
                cfg.target_workgroups = value.parse().expect("--target-wgs N");
                i += 1;
            }
            "--out" => {
                out = value.into();
                i += 1;
            }
            "-h" | "--help" => {
                println!("see the doc comment of benches/verify.rs");
                return;
            }
            other => {
                eprintln!("unknown option {other}");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let progress = |line: &str| println!("{line}");
    let report = if cpu {
        run_cpu(&cfg, progress)
    } else {
        run_gpu(&cfg, progress)
    };
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            std::process::exit(1);
        }
    };
    println!("\n{}", report.table());
    std::fs::create_dir_all(&out).expect("create output directory");
    let stem = out.join(report.file_stem());
    std::fs::write(stem.with_extension("csv"), report.csv()).expect("write csv");
    std::fs::write(stem.with_extension("svg"), report.svg()).expect("write svg");
    println!("wrote {}.csv and .svg", stem.display());
    let bad: usize = report.rows.iter().map(|r| r.mismatches).sum();
    if report
        .rows
        .iter()
        .any(|r| r.mode == BenchMode::Greedy && r.mismatches > 0)
    {
        eprintln!("greedy results differ from the CPU twin");
        std::process::exit(1);
    }
    println!("twin mismatches over the grid: {bad}");
}

//! The verify-step benchmark: one command, one self-contained binary. The same code
//! runs as `specdec bench`.
//!
//! ```text
//! cargo bench --bench verify                 # full grid on the GPU Verifier::new would pick
//! cargo bench --bench verify -- --quick      # small grid (software adapters)
//! cargo bench --bench verify -- --quick --cpu
//! ```
//! `--help` lists the options. Writes `benches/results/<adapter>-<backend>-grid.csv` and `.svg`
//! (named by what was measured, never by date; `--help` says how).

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    std::process::exit(specdec::tools::bench::main_with_args(&args));
}

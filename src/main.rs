//! `specdec`: which backend, is it exact here, how fast here — one command each.
//!
//! ```text
//! specdec info        every adapter, the limits and features we use, and which backend runs
//! specdec selftest    the statistical self-test on the chosen backend (exit code 0 = passed)
//! specdec bench       the benchmark of the verify step on this machine
//! ```

use specdec::device::{decide, DeviceChoice};
use specdec::tools::selftest::{self, Size, CHECKS};
use specdec::{Fault, Verifier, VerifierOptions};
use std::io::Write;

const HELP: &str = "\
specdec — speculative-decoding verification on any GPU (wgpu), with a CPU twin

Usage: specdec <command> [options]

Commands:
  info       every adapter wgpu sees, the limits and features specdec uses, and the backend it
             would choose (and why)
  selftest   exactness self-test on the chosen backend: exact cases, distribution checks, replay,
             batch invariance, GPU vs CPU twin; exit code 0 only if everything passed
  bench      benchmark the verify step on this machine (see `specdec bench --help`)

Environment: SPECDEC_DEVICE=cpu|gpu|auto forces the backend; WGPU_BACKEND (vulkan, metal, dx12,
gl) limits the GPU APIs; WGPU_ADAPTER_NAME picks an adapter by name.
";

const INFO_HELP: &str = "\
Usage: specdec info [--json]

Lists every adapter wgpu sees (name, backend, type, driver, the limits and features specdec uses),
which one specdec would choose and why, and whether the CPU backend would be used instead.
";

const SELFTEST_HELP: &str = "\
Usage: specdec selftest [--quick | --thorough] [--cpu | --gpu] [--json]

Runs the self-test on the backend `specdec info` names (or the one forced with --cpu / --gpu):
on a GPU, first every kernel pipeline built (a driver that rejects one fails here, naming it),
then exact cases (greedy paths, forced outcomes, -1 drafts, zero-draft neighbours, NaN rows),
distribution checks for one-hot drafts, draft probabilities and draft logits (both halves by
chi-square at an exact 1e-6 quantile, acceptance within 6 standard errors), seeded replay, batch
invariance and GPU vs CPU twin agreement. Default size: about a minute on a laptop GPU;
--quick: seconds; --thorough: 5x the default. Exit code 0 only if every check passed.
";

fn main() {
    // Before any adapter survey and any other thread: keeps Mesa's Vulkan layer from printing
    // an error line about XDG_RUNTIME_DIR on machines without a desktop login.
    specdec::device::quiet_vulkan_device_select();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        None | Some("-h") | Some("--help") | Some("help") => {
            print!("{HELP}");
            0
        }
        Some("info") => info(&args[1..]),
        Some("selftest") => selftest_cmd(&args[1..]),
        Some("bench") => specdec::tools::bench::main_with_args(&args[1..]),
        Some(other) => {
            eprintln!("specdec: unknown command {other:?}; try `specdec --help`");
            2
        }
    };
    std::process::exit(code);
}

fn info(args: &[String]) -> i32 {
    let mut json = false;
    for a in args {
        match a.as_str() {
            "--json" => json = true,
            "-h" | "--help" => {
                print!("{INFO_HELP}");
                return 0;
            }
            other => {
                eprintln!("specdec info: unknown option {other:?}; see --help");
                return 2;
            }
        }
    }
    let decision = match decide(DeviceChoice::Auto) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("specdec info: {e}");
            return 1;
        }
    };
    if json {
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let adapters: Vec<String> = decision
            .adapters
            .iter()
            .map(|a| {
                format!(
                    "{{\"name\":\"{}\",\"backend\":\"{}\",\"type\":\"{}\",\"driver\":\"{}\",\"software\":{},\"usable\":{},\"max_storage_binding\":{},\"max_buffer\":{},\"storage_buffers_per_stage\":{},\"max_invocations\":{},\"shader_int64\":{},\"timestamp_query\":{},\"subgroup\":{}}}",
                    esc(&a.name), a.backend, a.device_type, esc(&a.driver), a.software, a.usable, a.max_storage_binding, a.max_buffer,
                    a.storage_buffers_per_stage, a.max_invocations, a.int64, a.timestamps, a.subgroups
                )
            })
            .collect();
        println!(
            "{{\"adapters\":[{}],\"chosen_gpu\":{},\"use_cpu\":{},\"reason\":\"{}\"}}",
            adapters.join(","),
            decision.gpu.map_or("null".to_string(), |i| format!(
                "\"{}\"",
                esc(&decision.adapters[i].name)
            )),
            decision.use_cpu,
            esc(&decision.reason)
        );
        return 0;
    }
    if decision.adapters.is_empty() {
        println!("adapters: none (no Vulkan / Metal / DX12 / GL driver found)");
    }
    for (i, a) in decision.adapters.iter().enumerate() {
        let mark = if decision.gpu == Some(i) && !decision.use_cpu {
            "*"
        } else {
            " "
        };
        println!(
            "{mark} [{i}] {} — {} {}{}",
            a.name,
            a.backend,
            a.device_type,
            if a.software { " (software)" } else { "" }
        );
        println!(
            "        driver: {}",
            if a.driver.is_empty() { "-" } else { &a.driver }
        );
        println!(
            "        max storage binding {} MiB, max buffer {} MiB, {} storage buffers/stage (need 8){}, {} invocations/workgroup",
            a.max_storage_binding >> 20,
            a.max_buffer >> 20,
            a.storage_buffers_per_stage,
            if a.usable { "" } else { " — too few, unusable" },
            a.max_invocations
        );
        println!(
            "        features: SHADER_INT64 {}, TIMESTAMP_QUERY {}, SUBGROUP {}",
            yes(a.int64),
            yes(a.timestamps),
            yes(a.subgroups)
        );
    }
    println!();
    println!("choice: {decision}");
    0
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn selftest_cmd(args: &[String]) -> i32 {
    let mut size = Size::Normal;
    let mut json = false;
    let mut device = DeviceChoice::Auto;
    let mut fault = Fault::None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => size = Size::Quick,
            "--thorough" => size = Size::Thorough,
            "--json" => json = true,
            "--cpu" => device = DeviceChoice::Cpu,
            "--gpu" => device = DeviceChoice::Gpu,
            // Hidden, for the tests of the self-test itself: a deliberately broken sampler
            // that the distribution checks must catch.
            "--inject-fault" => {
                fault = match it.next().map(String::as_str) {
                    Some("reject-all") => Fault::RejectAllFromTarget,
                    Some("shared-noise") => Fault::SharedNoise,
                    other => {
                        eprintln!("specdec selftest: --inject-fault takes reject-all or shared-noise, not {other:?}");
                        return 2;
                    }
                }
            }
            "-h" | "--help" => {
                print!("{SELFTEST_HELP}");
                return 0;
            }
            other => {
                eprintln!("specdec selftest: unknown option {other:?}; see --help");
                return 2;
            }
        }
    }
    if device != DeviceChoice::Auto {
        // The flag wins over the environment for this command.
        std::env::remove_var("SPECDEC_DEVICE");
    }
    // Every pipeline built with the verifier: the checks below dispatch some of them, and a
    // driver that rejects any other would otherwise fail only a later program's first call of
    // that kind.
    let opts = VerifierOptions {
        device,
        fault,
        pipelines: specdec::PipelineBuild::Eager,
        ..VerifierOptions::default()
    };
    let verifier = match Verifier::auto(opts) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("specdec selftest: {e}");
            return 1;
        }
    };
    let backend = verifier.describe();
    if !json {
        println!("specdec selftest on {backend}");
    }
    let total = CHECKS.len();
    let results = selftest::run(&verifier, size, |i, name| {
        if !json {
            let done = 20 * i / total;
            eprint!(
                "\r[{}{}] {}/{} {:<28}",
                "#".repeat(done),
                ".".repeat(20 - done),
                i + 1,
                total,
                name
            );
            let _ = std::io::stderr().flush();
        }
    });
    let passed = results.iter().all(|r| r.passed);
    if json {
        println!("{}", selftest::to_json(&backend, &results));
    } else {
        eprintln!("\r[{}] {total}/{total} done{:<24}", "#".repeat(20), "");
        println!("\n| check | result | seconds | detail |");
        println!("|---|---|---|---|");
        for r in &results {
            println!(
                "| {} | {} | {:.1} | {} |",
                r.name,
                if r.passed { "pass" } else { "FAIL" },
                r.seconds,
                r.detail
            );
        }
        let failed = results.iter().filter(|r| !r.passed).count();
        println!("\n{} passed, {} failed", total - failed, failed);
    }
    if passed {
        0
    } else {
        1
    }
}

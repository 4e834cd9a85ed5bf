//! The `specdec` command: every subcommand's exit code and output, on the CPU backend and on the
//! GPU the tests pin (lavapipe in CI), and a deliberately broken sampler that `selftest` must fail.

use std::process::{Command, Output};

fn specdec(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_specdec"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run specdec")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn skip_gpu() -> bool {
    let skip = std::env::var("SPECDEC_SKIP_GPU").as_deref() == Ok("1");
    if skip {
        eprintln!("SKIPPED GPU part: SPECDEC_SKIP_GPU=1");
    }
    skip
}

#[test]
fn help_on_every_subcommand() {
    for args in [
        &["--help"][..],
        &["info", "--help"],
        &["selftest", "--help"],
        &["bench", "--help"],
    ] {
        let o = specdec(args, &[]);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("Usage") || text(&o).contains("Options"),
            "{args:?} prints usage: {}",
            text(&o)
        );
    }
}

#[test]
fn bad_usage_is_one_line_and_exit_2() {
    for args in [
        &["frobnicate"][..],
        &["info", "--bogus"],
        &["selftest", "--inject-fault", "nope"],
        &["bench", "--k"],
    ] {
        let o = specdec(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err:?}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn bench_refuses_every_out_of_range_value_before_any_work() {
    let too_many = (specdec::MAX_DRAFTS_PER_REQUEST + 1).to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--batch", "0"], "--batch 0"),
        (&["--batch", "1,0,8"], "--batch 0"),
        (&["--batch", ""], "--batch"),
        (&["--k", "0"], "--k 0"),
        (&["--k", &too_many], "--k"),
        (&["--vocab", "0"], "--vocab 0"),
        (&["--vocab", "4294967295"], "--vocab"),
        (&["--reps", "0"], "--reps 0"),
        (&["--reps", "1500"], "--reps 1500: at most 512"),
        (&["--reps", "-1"], "--reps"),
        (&["--reps", "2,3"], "--reps"),
        (&["--top-p", "0"], "--top-p"),
        (&["--top-p", "1.5"], "--top-p"),
        (&["--top-p", "NaN"], "--top-p"),
        (&["--top-p", "x"], "--top-p"),
        (&["--top-k", "-1"], "--top-k"),
        (&["--top-k", "0.5"], "--top-k"),
        (&["--min-p", "1.5"], "--min-p"),
        (&["--min-p", "NaN"], "--min-p"),
        (&["--min-p", "-0.1"], "--min-p"),
        (&["--target-wgs", "0"], "--target-wgs 0"),
        (&["--modes", "greedy,"], "unknown mode"),
        (&["--rows", "flat"], "--rows flat"),
    ];
    for &(bad, names) in cases {
        for backend in [&["--cpu"][..], &[]] {
            let args: Vec<&str> = ["bench", "--quick"]
                .iter()
                .chain(backend)
                .chain(bad)
                .copied()
                .collect();
            let o = specdec(&args, &[]);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err:?}");
            assert!(
                err.starts_with("specdec bench: ") && err.contains(names),
                "{args:?}: {err}"
            );
            assert!(
                o.stdout.is_empty(),
                "{args:?}: no work before the check: {}",
                text(&o)
            );
        }
    }
}

/// The environment of a newcomer's shell on a machine without a desktop login: no
/// `XDG_RUNTIME_DIR`, no Wayland, no backend or adapter pinned.
fn bare_shell(c: &mut Command) -> &mut Command {
    for k in [
        "XDG_RUNTIME_DIR",
        "WAYLAND_DISPLAY",
        "WAYLAND_SOCKET",
        "NODEVICE_SELECT",
        "MESA_VK_DEVICE_SELECT",
        "DRI_PRIME",
        "WGPU_BACKEND",
        "WGPU_ADAPTER_NAME",
        "SPECDEC_DEVICE",
    ] {
        c.env_remove(k);
    }
    c
}

#[test]
fn the_first_run_prints_no_error_line() {
    // Mesa's Vulkan device-select layer prints an XDG_RUNTIME_DIR error through libwayland
    // during the adapter survey unless `device::quiet_vulkan_device_select` ran first.
    let o = bare_shell(&mut Command::new(env!("CARGO_BIN_EXE_specdec")))
        .arg("info")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("choice:"), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.is_empty(), "specdec info wrote to stderr: {err:?}");
    // The example a newcomer runs first, once on the policy's choice and once forced onto a GPU
    // (the adapter survey, then the GPU verifier's own).
    let example = std::path::Path::new(env!("CARGO_BIN_EXE_specdec"))
        .parent()
        .unwrap()
        .join("examples/verify_batch");
    if !example.exists() {
        eprintln!(
            "SKIPPED example part: {} is not built (cargo build --release --examples)",
            example.display()
        );
        return;
    }
    let mut runs = vec![(None, "CPU twin")];
    if !skip_gpu() {
        runs.push((Some("gpu"), "CPU twin: identical tokens"));
    }
    for (device, twin) in runs {
        let mut c = Command::new(&example);
        bare_shell(&mut c);
        if let Some(d) = device {
            c.env("SPECDEC_DEVICE", d);
        }
        let o = c.output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(o.status.success(), "{device:?}: {}", text(&o));
        assert!(
            err.is_empty(),
            "{device:?}: the example wrote to stderr: {err:?}"
        );
        assert!(
            out.starts_with("backend: ") && out.lines().next().unwrap().contains(": "),
            "{device:?}: the first line names the backend and the reason: {out}"
        );
        assert!(out.contains(twin), "{device:?}: {out}");
        assert!(out.contains("identical tokens"), "{device:?}: {out}");
    }
}

#[test]
fn info_names_adapters_and_the_choice() {
    let o = specdec(&["info"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("choice:"), "{t}");
    assert!(t.contains("storage buffers/stage"), "{t}");
    let forced = specdec(&["info"], &[("SPECDEC_DEVICE", "cpu")]);
    assert!(
        text(&forced).contains("choice: CPU backend: requested"),
        "{}",
        text(&forced)
    );
    let json = specdec(&["info", "--json"], &[]);
    let j = String::from_utf8_lossy(&json.stdout);
    assert!(
        j.starts_with("{\"adapters\":[") && j.contains("\"use_cpu\":"),
        "{j}"
    );
    let bad = specdec(&["info"], &[("SPECDEC_DEVICE", "tpu")]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad).contains("not one of cpu, gpu, auto"),
        "{}",
        text(&bad)
    );
}

#[test]
fn selftest_passes_on_the_cpu_backend() {
    let o = specdec(&["selftest", "--quick", "--cpu"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("11 passed, 0 failed"), "{}", text(&o));
}

#[test]
fn selftest_fails_with_a_broken_sampler() {
    let o = specdec(
        &[
            "selftest",
            "--quick",
            "--cpu",
            "--inject-fault",
            "reject-all",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let j = String::from_utf8_lossy(&o.stdout);
    assert!(j.contains("\"passed\":false"), "{j}");
    for name in ["dist.one_hot", "dist.draft_probs", "dist.draft_logits"] {
        assert!(
            j.contains(&format!("{{\"name\":\"{name}\",\"passed\":false")),
            "{name} must catch the always-reject sampler: {j}"
        );
    }
    // Noise shared between the accept test and the resample: the marginal stays plausible, the
    // halves do not.
    let o = specdec(
        &[
            "selftest",
            "--quick",
            "--cpu",
            "--inject-fault",
            "shared-noise",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("FAIL"), "{}", text(&o));
}

#[test]
fn selftest_passes_on_the_gpu() {
    if skip_gpu() {
        return;
    }
    let o = specdec(&["selftest", "--quick", "--gpu"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("selftest on GPU"), "{t}");
    assert!(t.contains("11 passed, 0 failed"), "{t}");
}

#[test]
fn a_pipeline_the_driver_rejects_is_a_gpu_error_not_a_panic() {
    // The selftest builds every pipeline with its verifier (`PipelineBuild::Eager`) on several
    // threads, each worker in error scopes of its own (wgpu's scopes belong to the thread that
    // pushed them): a kernel whose entry point is missing must still make `Verifier::new`
    // return `Error::Gpu` naming it, so the command says so on one line and exits with 1.
    // verify.wgsl with `block_settle` renamed, through SPECDEC_SHADER_DIR. Then the same kernel
    // built on demand (the default, as `bench` builds it): the first call that dispatches
    // `block_settle` (the block rule with draft probabilities) fails with that error, and a
    // call that does not need it is not affected.
    if skip_gpu() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("specdec-broken-kernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/verify.wgsl"))
        .unwrap();
    assert!(src.contains("fn block_settle("), "the entry point to break");
    let broken = src.replace("fn block_settle(", "fn block_settle_renamed(");
    std::fs::write(dir.join("verify.wgsl"), broken).unwrap();
    let env = [("SPECDEC_SHADER_DIR", dir.to_str().unwrap())];
    let o = specdec(&["selftest", "--quick", "--gpu"], &env);
    assert_names_the_missing_entry(&o, "specdec selftest: GPU error");
    assert!(text(&o).starts_with("specdec selftest: GPU error"));
    // On demand: greedy calls never build block_settle, the block rule's first call does.
    let out = dir.join("out");
    let out_s = out.to_str().unwrap();
    let bench = |modes: &[&str]| {
        let mut args = vec![
            "bench", "--quick", "--batch", "1", "--k", "2", "--reps", "2",
        ];
        args.extend_from_slice(&["--no-baseline", "--out", out_s]);
        args.extend_from_slice(modes);
        specdec(&args, &env)
    };
    let o = bench(&["--modes", "greedy"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("twin mismatches over the grid: 0"), "{t}");
    assert!(
        t.contains("pipelines built with it, the rest at their first call"),
        "{t}"
    );
    let o = bench(&["--modes", "draft_probs", "--block"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_names_the_missing_entry(&o, "specdec bench: GPU error");
}

/// A command that stopped on the missing `block_settle`: exit code 1, `what`, the entry point
/// named, no panic.
fn assert_names_the_missing_entry(o: &Output, what: &str) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains(what), "{t}");
    assert!(
        t.contains("Unable to find entry point 'block_settle'"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
}

/// The GPU bench's dispatch-chain floor line: for 1 and 256 workgroups, a positive GPU time for
/// each of 1 to 4 dependent dispatches.
fn assert_chain_floor(out: &str) {
    let line = out
        .lines()
        .find(|l| l.starts_with("dispatch-chain floor: "))
        .unwrap_or_else(|| panic!("no dispatch-chain floor line:\n{out}"));
    for (part, wg) in line.split("; ").zip(["1 workgroup ", "256 workgroups "]) {
        assert!(part.contains(wg), "{line}");
        let times = part
            .split(": ")
            .last()
            .unwrap()
            .trim_end_matches(" (dispatches µs)");
        let pairs: Vec<(u32, f64)> = times
            .trim_end_matches(" µs")
            .split(" / ")
            .map(|p| {
                let (n, t) = p.split_once(' ').unwrap_or_else(|| panic!("{line}"));
                (n.parse().unwrap(), t.parse().unwrap())
            })
            .collect();
        assert_eq!(
            pairs.iter().map(|p| p.0).collect::<Vec<_>>(),
            [1, 2, 3, 4],
            "{line}"
        );
        assert!(pairs.iter().all(|p| p.1 > 0.0), "{line}");
    }
}

/// The bench CSV's `cpu_us` column: on Linux a positive CPU time per call for every GPU row (the
/// calling thread at least records and submits), empty for the CPU backend's rows.
fn assert_cpu_time(body: &str) {
    let mut lines = body.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = header
        .iter()
        .position(|&h| h == "cpu_us")
        .expect("a cpu_us column");
    for line in lines {
        // The adapter name comes first, quoted (it may hold commas); no other cell is.
        let rest = line.strip_prefix('"').expect("a quoted adapter name");
        let end = rest.find('"').expect("the adapter name's closing quote");
        let mut cells = vec![&rest[..end]];
        cells.extend(rest[end + 1..].strip_prefix(',').unwrap().split(','));
        assert_eq!(cells.len(), header.len(), "{line}");
        let cpu = cells[at];
        if cells[1] == "cpu" || !cfg!(target_os = "linux") {
            assert!(cpu.is_empty(), "{line}");
        } else {
            let us: f64 = cpu.parse().unwrap_or_else(|_| panic!("cpu_us of {line}"));
            assert!(us > 0.0, "{line}");
        }
    }
}

#[test]
fn bench_runs_a_tiny_grid_on_both_backends() {
    let dir = std::env::temp_dir().join(format!("specdec-cli-bench-{}", std::process::id()));
    let dir_s = dir.to_string_lossy().to_string();
    let mut runs = vec![vec![
        "bench", "--quick", "--cpu", "--batch", "1", "--k", "1", "--reps", "2", "--rows", "peaked",
        "--out", &dir_s,
    ]];
    if !skip_gpu() {
        runs.push(vec![
            "bench",
            "--quick",
            "--batch",
            "2",
            "--k",
            "2",
            "--reps",
            "2",
            "--modes",
            "greedy,draft_logits",
            "--out",
            &dir_s,
        ]);
    }
    for args in runs {
        let o = specdec(&args, &[]);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("twin mismatches over the grid: 0"),
            "{}",
            text(&o)
        );
        if !args.contains(&"--cpu") {
            assert_chain_floor(&text(&o));
        }
        if args.contains(&"peaked") {
            assert!(text(&o).contains("logits peaked"), "{}", text(&o));
        }
    }
    let csvs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "csv"))
        .collect();
    assert!(!csvs.is_empty(), "a CSV was written");
    for e in csvs {
        let body = std::fs::read_to_string(e.path()).unwrap();
        assert!(body.starts_with("adapter,backend,date,mode"), "{body}");
        assert!(body.lines().count() >= 2);
        assert_cpu_time(&body);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

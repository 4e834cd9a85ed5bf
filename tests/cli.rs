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
fn bench_runs_a_tiny_grid_on_both_backends() {
    let dir = std::env::temp_dir().join(format!("specdec-cli-bench-{}", std::process::id()));
    let dir_s = dir.to_string_lossy().to_string();
    let mut runs = vec![vec![
        "bench", "--quick", "--cpu", "--batch", "1", "--k", "1", "--reps", "2", "--out", &dir_s,
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
    }
    let _ = std::fs::remove_dir_all(&dir);
}

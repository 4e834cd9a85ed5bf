//! Reliability: adversarial numbers, a time-boxed fuzzer over the host API, device loss,
//! timeouts, 10,000 calls without memory growth, and use from several threads.

mod common;
use common::*;
use specdec::{Error, Status, Verifier, VerifierOptions, VerifyOutput};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

/// What must always hold (SPEC §4): ids in [0, V); accepted tokens are the drafts and never -1;
/// every slot after the emitted ones is -1; no emitted token has target probability 0 (logit
/// -inf or NaN), unless the row was flagged non-finite (then no token has a defined p).
fn check_invariants(b: &Owned, out: &VerifyOutput) -> Result<(), String> {
    let v = b.vocab as usize;
    let (mut row, mut drow) = (0usize, 0usize);
    for (r, req) in b.requests.iter().enumerate() {
        let k = req.num_drafts as usize;
        let n = out.num_emitted[r] as usize;
        if !(1..=k + 1).contains(&n) {
            return Err(format!("request {r}: {n} emitted of k = {k}"));
        }
        let e = out.emitted(r);
        for (i, &t) in e.iter().enumerate() {
            if t < 0 || t as usize >= v {
                return Err(format!("request {r}: token {t} outside [0, {v})"));
            }
            if i + 1 < n && t != b.drafts[drow + i] {
                return Err(format!(
                    "request {r}: accepted token {t} is not draft {}",
                    b.drafts[drow + i]
                ));
            }
            let l = b.target[(row + i) * v + t as usize];
            let flagged = (out.status[r].contains(Status::TARGET_NONFINITE)
                || out.status[r].contains(Status::ALL_MASKED))
                && i + 1 == n;
            if !flagged && (l.is_nan() || l == f32::NEG_INFINITY) {
                return Err(format!(
                    "request {r}: token {t} at position {i} has target probability 0 (logit {l})"
                ));
            }
        }
        if out.tokens[r * out.stride + n..(r + 1) * out.stride]
            .iter()
            .any(|&t| t != -1)
        {
            return Err(format!(
                "request {r}: a slot after the emitted tokens is not -1"
            ));
        }
        row += k + 1;
        drow += k;
    }
    Ok(())
}

/// A batch with adversarial values sprinkled in: `special` picks from NaN, ±inf, huge, denormal.
fn adversarial(g: &mut Gen, vocab: u32, ks: &[u32], kind: u8, rate: f64) -> Owned {
    let mut b = Owned::random(g, vocab, ks, &[0.0, 1.0, 0.3, 2.0, 1e-6, 1e6], kind, 0.6);
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        3.0e38,
        -3.0e38,
        1.0e-40,
        -1.0e-40,
        0.0,
    ];
    for x in b.target.iter_mut() {
        if g.unit() < rate {
            *x = specials[g.below(specials.len())];
        }
    }
    // Whole rows of -inf now and then.
    let v = vocab as usize;
    let rows = b.target.len() / v;
    for _ in 0..rows / 5 {
        let r = g.below(rows);
        b.target[r * v..(r + 1) * v].fill(f32::NEG_INFINITY);
    }
    match kind {
        1 => {
            // Unnormalised, negative, NaN, infinite probabilities; q(d) = 0 exactly at times.
            for x in b.draft.iter_mut() {
                let u = g.unit();
                if u < rate {
                    *x = [f32::NAN, -0.5, f32::INFINITY, 0.0, 7.0][g.below(5)];
                } else if u < 2.0 * rate {
                    *x *= 5.0;
                }
            }
            let (mut drow, dv) = (0usize, v);
            for &k in ks {
                for i in 0..k as usize {
                    let d = b.drafts[drow + i];
                    if d >= 0 && g.unit() < 0.2 {
                        b.draft[(drow + i) * dv + d as usize] = 0.0;
                    }
                }
                drow += k as usize;
            }
        }
        2 => {
            for x in b.draft.iter_mut() {
                if g.unit() < rate {
                    *x = specials[g.below(specials.len())];
                }
            }
        }
        _ => {}
    }
    b
}

#[test]
fn adversarial_numbers_keep_the_invariants() {
    let mut cases = 0;
    each_backend(|v: &Verifier| {
        let mut g = Gen::new(13);
        for vocab in [2u32, 7, 300, 4097] {
            for kind in 0..3u8 {
                for rate in [0.0, 0.01, 0.2, 1.0] {
                    let b = adversarial(&mut g, vocab, &[0, 1, 3, 2, 5], kind, rate);
                    let out = v
                        .verify_blocking(&b.batch())
                        .unwrap_or_else(|e| panic!("V={vocab} kind={kind} rate={rate}: {e}"));
                    if let Err(msg) = check_invariants(&b, &out) {
                        panic!("{} V={vocab} kind={kind} rate={rate}: {msg}", v.describe());
                    }
                }
            }
        }
    });
    cases += 4 * 3 * 4;
    println!("{cases} adversarial batches per backend");
}

#[test]
fn nan_rows_are_reported_per_request() {
    each_backend(|v: &Verifier| {
        let mut g = Gen::new(14);
        let mut b = Owned::random(&mut g, 50, &[2, 2], &[1.0, 0.0], 0, 0.9);
        b.target[3 * 50 + 7] = f32::NAN; // request 1, row 0
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert!(out.status[1].contains(Status::TARGET_NONFINITE));
        assert_eq!(out.num_emitted[1], 1);
        assert!(
            !out.status[0].contains(Status::TARGET_NONFINITE),
            "the neighbour is not affected"
        );
    });
}

/// Random shapes, modes, temperatures and special values for a bounded time
/// (`SPECDEC_FUZZ_SECS`, default 20): invariants on both backends, greedy requests identical
/// between GPU and CPU, and no panic. Longer by hand: `SPECDEC_FUZZ_SECS=600 cargo test --release
/// --test reliability fuzz -- --nocapture`.
#[test]
fn fuzz_the_host_api() {
    let secs: u64 = std::env::var("SPECDEC_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("SPECDEC_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026);
    let mut g = Gen::new(seed);
    let c = cpu();
    let gpu_v = gpu();
    let t0 = Instant::now();
    let (mut runs, mut greedy_compared) = (0u64, 0u64);
    while t0.elapsed() < Duration::from_secs(secs) {
        let vocab = 1 + g.below(3000) as u32;
        let r = g.below(10);
        let ks: Vec<u32> = (0..r).map(|_| g.below(7) as u32).collect();
        let kind = g.below(3) as u8;
        let rate = [0.0, 0.001, 0.05, 0.5][g.below(4)];
        let mut b = adversarial(&mut g, vocab, &ks, kind, rate);
        // Invalid drafts now and then.
        for d in b.drafts.iter_mut() {
            if g.unit() < 0.05 {
                *d = -1;
            }
        }
        let want = c
            .verify_blocking(&b.batch())
            .unwrap_or_else(|e| panic!("run {runs} (seed {seed}): CPU error {e}"));
        check_invariants(&b, &want).unwrap_or_else(|m| panic!("run {runs} (seed {seed}) CPU: {m}"));
        if let Some(gv) = gpu_v {
            let got = gv
                .verify_blocking(&b.batch())
                .unwrap_or_else(|e| panic!("run {runs} (seed {seed}): GPU error {e}"));
            check_invariants(&b, &got)
                .unwrap_or_else(|m| panic!("run {runs} (seed {seed}) GPU: {m}"));
            for (i, req) in b.requests.iter().enumerate() {
                if req.params.temperature == 0.0 {
                    assert_eq!(
                        got.emitted(i),
                        want.emitted(i),
                        "run {runs} (seed {seed}): greedy request {i} differs"
                    );
                    greedy_compared += 1;
                }
            }
        }
        runs += 1;
    }
    println!("fuzz: {runs} executions in {secs} s (seed {seed}), {greedy_compared} greedy requests compared GPU vs CPU, 0 findings");
    assert!(runs > 10, "the fuzzer must actually run");
}

#[test]
fn a_lost_device_gives_device_lost_and_a_new_verifier_recovers() {
    if gpu().is_none() {
        return;
    }
    let mut g = Gen::new(15);
    let b = Owned::random(&mut g, 500, &[3, 2], &[1.0, 0.0], 1, 0.7);
    let v = Verifier::new(VerifierOptions::default()).unwrap();
    let want = v.verify_blocking(&b.batch()).unwrap();
    v.device().unwrap().0.destroy();
    for attempt in 0..2 {
        match v.verify_blocking(&b.batch()) {
            Err(Error::DeviceLost { detail }) => assert!(!detail.is_empty()),
            other => panic!("attempt {attempt} after destroy: expected DeviceLost, got {other:?}"),
        }
    }
    let fresh = Verifier::new(VerifierOptions::default()).unwrap();
    assert_eq!(
        fresh.verify_blocking(&b.batch()).unwrap(),
        want,
        "a new Verifier recovers"
    );
}

#[test]
fn losing_the_device_during_a_call_is_an_error_not_a_panic() {
    if gpu().is_none() {
        return;
    }
    let mut g = Gen::new(16);
    let b = Owned::random(&mut g, 32000, &[8; 16], &[1.0], 2, 0.7);
    let v = std::sync::Arc::new(Verifier::new(VerifierOptions::default()).unwrap());
    let v2 = v.clone();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        v2.device().unwrap().0.destroy();
    });
    let result = v.verify_blocking(&b.batch());
    killer.join().unwrap();
    match result {
        Ok(out) => check_invariants(&b, &out).unwrap(), // finished before the loss
        Err(Error::DeviceLost { .. }) | Err(Error::Gpu { .. }) => {}
        Err(other) => panic!("unexpected {other:?}"),
    }
    assert!(
        matches!(v.verify_blocking(&b.batch()), Err(Error::DeviceLost { .. })),
        "later calls report the loss"
    );
}

#[test]
fn a_wait_past_the_timeout_is_a_timeout_error_and_the_verifier_goes_on() {
    if gpu().is_none() {
        return;
    }
    let mut g = Gen::new(17);
    let big = Owned::random(&mut g, 32000, &[8; 32], &[1.0], 2, 0.7);
    let v = gpu_tuned(VerifierOptions {
        timeout: Duration::from_nanos(1),
        ..Default::default()
    });
    let want = cpu().verify_blocking(&big.batch()).unwrap();
    // The readback takes a result that is already there before it looks at the clock, so a
    // call can beat even a 1 ns timeout: OpenGL runs the recorded work inside `submit` (wgpu's
    // GL backend has no asynchronous queue), and an H200 finished this batch before the first
    // check in about one call of twelve. A result is allowed, if it is the right one. Where the
    // queue runs asynchronously, at least one of several calls must time out, with the
    // timeout it was given.
    let info = v.adapter_info().expect("a GPU verifier");
    let submit_is_synchronous = info.backend == wgpu::Backend::Gl;
    let calls = if submit_is_synchronous { 1 } else { 8 };
    let mut timeouts = 0;
    for call in 0..calls {
        match v.verify_blocking(&big.batch()) {
            Err(Error::Timeout { waited }) => {
                assert_eq!(waited, Duration::from_nanos(1));
                timeouts += 1;
            }
            Ok(out) => assert_eq!(
                out, want,
                "{:?}, call {call}: a result inside the timeout must be right",
                info.backend
            ),
            Err(other) => panic!(
                "{:?}, call {call}: expected Timeout, got {other:?}",
                info.backend
            ),
        }
    }
    assert!(
        submit_is_synchronous || timeouts > 0,
        "{:?}: none of {calls} calls under a 1 ns timeout timed out",
        info.backend
    );
    // A patient verifier on a fresh device gives the right answer.
    let ok = Verifier::new(VerifierOptions::default()).unwrap();
    assert_eq!(ok.verify_blocking(&big.batch()).unwrap(), want);
}

#[test]
fn a_long_spin_wait_ends_when_the_result_is_back() {
    // A blocking read polls for up to `spin_wait` before it sleeps. It must return as soon as
    // the result is mapped, with the twin's tokens: three calls under a 30 s budget take well
    // under its 90 s (a loop that missed the result would spend the budget, then sleep).
    if gpu().is_none() {
        return;
    }
    let mut g = Gen::new(18);
    let b = Owned::random(&mut g, 5000, &[3, 2], &[1.0, 0.0], 1, 0.7);
    let want = cpu().verify_blocking(&b.batch()).unwrap();
    let v = gpu_tuned(VerifierOptions {
        spin_wait: Some(Duration::from_secs(30)),
        ..Default::default()
    });
    let start = std::time::Instant::now();
    for call in 0..3 {
        assert_eq!(v.verify_blocking(&b.batch()).unwrap(), want, "call {call}");
    }
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "three polled calls took {took:?}"
    );
}

/// The Rust heap's live bytes, counted by this test binary's allocator: the memory test's exact
/// measure. RSS alone misses a leak that fills memory the allocator already holds (a leak of
/// 40 MB over the test's calls once moved RSS by 3.8 MB).
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting what it hands out and takes back in `LIVE_BYTES`.
struct Counting;

// SAFETY: every method forwards to `System` with the caller's own arguments and only adds
// bookkeeping after it, so `System`'s guarantees carry over unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (that is, from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`, with the caller's contract for `realloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The process's resident set in KiB (`VmRSS`, which the kernel states in kB whatever the page
/// size); None where there is no /proc (not Linux).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Set in the child process that runs the memory test alone.
const ALONE: &str = "SPECDEC_TEST_ALONE";

/// RSS counts the whole process, and the other tests of this binary run beside this one on
/// other threads: on CI they once added 78 MB inside the measured window while the calls
/// themselves added none. So the calls run in a child process of this test binary that runs
/// this one test and nothing else.
#[test]
fn ten_thousand_calls_without_memory_growth() {
    if std::env::var_os(ALONE).is_none() {
        let name = "ten_thousand_calls_without_memory_growth";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .expect("start this test binary again to run the memory test alone");
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "the memory test failed in its own process"
        );
        assert!(
            stdout.contains("1 passed"),
            "the child process did not run the memory test"
        );
        return;
    }
    let Some(v) = gpu() else { return };
    let mut g = Gen::new(18);
    // A pool of varied batches (shapes, modes, temperatures), reused round-robin.
    let batches: Vec<Owned> = (0..24)
        .map(|i| {
            let ks: Vec<u32> = (0..1 + i % 4).map(|j| ((i + j) % 5) as u32).collect();
            Owned::random(
                &mut g,
                [64, 500, 33][i % 3],
                &ks,
                &[0.0, 1.0, 0.7],
                (i % 3) as u8,
                0.7,
            )
        })
        .collect();
    let first: Vec<VerifyOutput> = batches
        .iter()
        .map(|b| v.verify_blocking(&b.batch()).unwrap())
        .collect();
    for i in 0..1000 {
        v.verify_blocking(&batches[i % batches.len()].batch())
            .unwrap();
    }
    let before = (LIVE_BYTES.load(Ordering::Relaxed), rss_kib());
    let t0 = Instant::now();
    for i in 0..10_000 {
        let out = v
            .verify_blocking(&batches[i % batches.len()].batch())
            .unwrap();
        if i % 997 == 0 {
            assert_eq!(
                out,
                first[i % batches.len()],
                "call {i} differs from the first run"
            );
        }
    }
    let took = t0.elapsed().as_secs_f64();
    let after = (LIVE_BYTES.load(Ordering::Relaxed), rss_kib());
    let fresh = Verifier::new(VerifierOptions::default()).unwrap();
    for (b, f) in batches.iter().zip(&first) {
        assert_eq!(
            &fresh.verify_blocking(&b.batch()).unwrap(),
            f,
            "a fresh verifier gives the same results"
        );
    }
    let heap = after.0 - before.0;
    let rss = match (before.1, after.1) {
        (Some(b), Some(a)) => format!(
            "RSS {b} KiB before, {a} KiB after ({:+} KiB)",
            a as i64 - b as i64
        ),
        _ => "RSS not readable on this OS (no /proc/self/status)".to_string(),
    };
    println!(
        "10,000 calls in {took:.1} s on {}: the Rust heap {heap:+} bytes; {rss}",
        v.describe()
    );
    assert!(
        heap <= 64 * 1024,
        "the Rust heap grew by {heap} bytes over 10,000 calls"
    );
    // The driver's own allocations (C code, outside the counting allocator) show only in RSS.
    if let (Some(b), Some(a)) = (before.1, after.1) {
        assert!(
            a <= b + 16 * 1024,
            "RSS grew by {} KiB over 10,000 calls",
            a - b
        );
    }
}

/// Many small calls of changing shapes from three threads at once on one verifier: each call's
/// readback callback may run on another thread's poll (this once surfaced as a false timeout),
/// and tiny vocabularies bind windows smaller than one vec4 (once a validation error).
#[test]
fn concurrent_calls_of_changing_shapes() {
    each_backend(|v: &Verifier| {
        std::thread::scope(|s| {
            for t in 0..3u64 {
                s.spawn(move || {
                    for i in 0..400u64 {
                        let vocab = 1 + ((i * 7919 + t * 104_729) % 3000) as u32;
                        let mut g = Gen::new(i * 3 + t);
                        let b = Owned::random(
                            &mut g,
                            vocab,
                            &[(i % 5) as u32],
                            &[if i % 2 == 0 { 0.0 } else { 1.0 }],
                            (i % 3) as u8,
                            0.5,
                        );
                        let out = v
                            .verify_blocking(&b.batch())
                            .unwrap_or_else(|e| panic!("thread {t} call {i} (V={vocab}): {e}"));
                        check_invariants(&b, &out)
                            .unwrap_or_else(|m| panic!("thread {t} call {i}: {m}"));
                    }
                });
            }
        });
    });
}

#[test]
fn several_threads_share_one_verifier() {
    each_backend(|v: &Verifier| {
        let mut g = Gen::new(19);
        let batches: Vec<Owned> = (0..8)
            .map(|i| {
                Owned::random(
                    &mut g,
                    700,
                    &[i % 4, 2, 3],
                    &[1.0, 0.0, 0.5],
                    (i % 3) as u8,
                    0.7,
                )
            })
            .collect();
        let want: Vec<VerifyOutput> = batches
            .iter()
            .map(|b| v.verify_blocking(&b.batch()).unwrap())
            .collect();
        std::thread::scope(|s| {
            for t in 0..4 {
                let (batches, want) = (&batches, &want);
                s.spawn(move || {
                    for round in 0..25 {
                        let i = (t * 7 + round) % batches.len();
                        assert_eq!(
                            v.verify_blocking(&batches[i].batch()).unwrap(),
                            want[i],
                            "thread {t} round {round}"
                        );
                    }
                });
            }
        });
    });
}

/// Cut-off readbacks (the `cutoffs_blocking` hook) from three threads at once on one device,
/// beside a thread whose calls poll it without pause (`spin_wait`): each readback's map
/// callback may run on another thread's poll, after the reading thread's own wait returned;
/// every read must still give the twin's cut-offs.
#[test]
fn cut_off_readbacks_from_several_threads() {
    let Some(v) = gpu() else { return };
    let spinner = gpu_tuned(VerifierOptions {
        spin_wait: Some(Duration::from_secs(1)),
        ..test_options()
    });
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut g = Gen::new(41);
    let batches: Vec<Owned> = (0..6u32)
        .map(|i| {
            let mut o = Owned::random(&mut g, 2000 + 37 * i, &[2, 1], &[1.0, 0.8], 1, 0.5);
            for r in o.requests.iter_mut() {
                r.params = r.params.with_top_k(20).with_top_p(0.9);
            }
            o
        })
        .collect();
    let bits = |c: Vec<f32>| c.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
    let want: Vec<Vec<u32>> = batches
        .iter()
        .map(|b| bits(cpu().cutoffs_blocking(&b.batch()).unwrap()))
        .collect();
    std::thread::scope(|s| {
        let (spinner, done, first) = (&spinner, &done, &batches[0]);
        s.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                spinner.verify_blocking(&first.batch()).unwrap();
            }
        });
        let readers: Vec<_> = (0..3)
            .map(|t| {
                let (batches, want) = (&batches, &want);
                s.spawn(move || {
                    for round in 0..150 {
                        let i = (t * 5 + round) % batches.len();
                        let got = v
                            .cutoffs_blocking(&batches[i].batch())
                            .unwrap_or_else(|e| panic!("thread {t} round {round}: {e}"));
                        assert_eq!(bits(got), want[i], "thread {t} round {round}");
                    }
                })
            })
            .collect();
        let outcome: Vec<_> = readers.into_iter().map(|h| h.join()).collect();
        done.store(true, Ordering::Relaxed);
        for r in outcome {
            r.unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
    });
}

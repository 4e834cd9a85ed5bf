//! Reproducibility promises of SPEC §5: seeded replay; a request's tokens do not depend on its
//! batch (alone, mixed, reordered, chunked into row windows, recorded at an offset); GPU vs CPU
//! agreement on greedy and random paths.

mod common;
use common::*;
use specdec::{
    DeviceIds, Error, GpuDraft, GpuRows, GpuVerifyBatch, Verifier, VerifierOptions, VerifyOutput,
};

/// Splits an owned batch into its requests (each a batch of one).
fn singles(b: &Owned) -> Vec<Owned> {
    let v = b.vocab as usize;
    let (mut row, mut drow) = (0usize, 0usize);
    let mut out = Vec::new();
    for req in &b.requests {
        let k = req.num_drafts as usize;
        out.push(Owned {
            vocab: b.vocab,
            requests: vec![*req],
            drafts: b.drafts[drow..drow + k].to_vec(),
            target: b.target[row * v..(row + k + 1) * v].to_vec(),
            draft_kind: b.draft_kind,
            draft: if b.draft_kind == 0 {
                Vec::new()
            } else {
                b.draft[drow * v..(drow + k) * v].to_vec()
            },
            rates: b.rates.as_ref().map(|r| r[drow..drow + k].to_vec()),
            draft_vocab: None,
        });
        row += k + 1;
        drow += k;
    }
    out
}

/// Concatenates single-request batches in the given order.
fn concat(parts: &[&Owned]) -> Owned {
    let mut o = parts[0].clone();
    o.requests.clear();
    o.drafts.clear();
    o.target.clear();
    o.draft.clear();
    for p in parts {
        o.requests.extend(&p.requests);
        o.drafts.extend(&p.drafts);
        o.target.extend(&p.target);
        o.draft.extend(&p.draft);
    }
    o
}

fn mixed(seed: u64, kind: u8) -> Owned {
    let mut g = Gen::new(seed);
    Owned::random(
        &mut g,
        1500,
        &[3, 0, 5, 1, 2, 4, 0, 3],
        &[1.0, 0.0, 0.7, 1.5],
        kind,
        0.6,
    )
}

#[test]
fn seeded_replay_is_identical() {
    each_backend(|v: &Verifier| {
        for kind in 0..3 {
            let b = mixed(1 + kind as u64, kind);
            assert_eq!(
                v.verify_blocking(&b.batch()).unwrap(),
                v.verify_blocking(&b.batch()).unwrap()
            );
        }
    });
}

#[test]
fn unseeded_requests_draw_fresh_seeds_and_report_them() {
    each_backend(|v: &Verifier| {
        let mut b = mixed(5, 0);
        for r in &mut b.requests {
            r.params.seed = None;
        }
        let first = v.verify_blocking(&b.batch()).unwrap();
        let second = v.verify_blocking(&b.batch()).unwrap();
        assert_ne!(first.seeds, second.seeds, "None draws a new seed each call");
        // Replaying with the reported seeds reproduces the first call exactly.
        for (r, s) in b.requests.iter_mut().zip(&first.seeds) {
            r.params.seed = Some(*s);
        }
        assert_eq!(v.verify_blocking(&b.batch()).unwrap(), first);
    });
}

fn request_tokens(out: &VerifyOutput, r: usize) -> (Vec<i32>, specdec::Status) {
    (out.emitted(r).to_vec(), out.status[r])
}

#[test]
fn tokens_do_not_depend_on_the_batch() {
    each_backend(|v: &Verifier| {
        for kind in 0..3 {
            let b = mixed(10 + kind as u64, kind);
            let full = v.verify_blocking(&b.batch()).unwrap();
            let parts = singles(&b);
            // Alone.
            for (r, p) in parts.iter().enumerate() {
                let alone = v.verify_blocking(&p.batch()).unwrap();
                assert_eq!(
                    request_tokens(&alone, 0),
                    request_tokens(&full, r),
                    "request {r} alone, kind {kind}"
                );
            }
            // Reordered (reversed) and mixed with other requests.
            let rev: Vec<&Owned> = parts.iter().rev().collect();
            let reversed = v.verify_blocking(&concat(&rev).batch()).unwrap();
            let n = parts.len();
            for r in 0..n {
                assert_eq!(
                    request_tokens(&reversed, n - 1 - r),
                    request_tokens(&full, r),
                    "reordered, kind {kind}"
                );
            }
            let other = mixed(99, kind);
            let others = singles(&other);
            let interleaved: Vec<&Owned> = parts
                .iter()
                .zip(&others)
                .flat_map(|(a, b)| [b, a])
                .collect();
            let mixed_out = v.verify_blocking(&concat(&interleaved).batch()).unwrap();
            for r in 0..n {
                assert_eq!(
                    request_tokens(&mixed_out, 2 * r + 1),
                    request_tokens(&full, r),
                    "mixed, kind {kind}"
                );
            }
        }
    });
}

#[test]
fn chunked_row_windows_give_identical_tokens() {
    let Some(g) = gpu() else { return };
    // Windows of at most 3 rows (plus alignment slack) force many bindings per call.
    let small = gpu_tuned(VerifierOptions {
        max_binding_bytes: Some(3 * 1500 * 4 + 256),
        ..VerifierOptions::default()
    });
    for kind in 0..3 {
        let b = mixed(20 + kind as u64, kind);
        let whole = g.verify_blocking(&b.batch()).unwrap();
        assert_eq!(
            small.verify_blocking(&b.batch()).unwrap(),
            whole,
            "kind {kind}"
        );
        assert_eq!(
            cpu().verify_blocking(&b.batch()).unwrap(),
            whole,
            "kind {kind} vs CPU"
        );
    }
}

#[test]
fn gpu_resident_path_reads_callers_buffers_at_an_offset() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().unwrap();
    for kind in 0..3u8 {
        let b = mixed(30 + kind as u64, kind);
        let expect = v.verify_blocking(&b.batch()).unwrap();
        // The logits sit 28 bytes into the buffer (not a multiple of the 256-byte binding
        // alignment), the draft rows 1 KiB + 4 bytes in.
        let make = |data: &[f32], offset: u64| {
            let buf = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("test.logits"),
                size: offset + (data.len() * 4) as u64 + 64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            queue.write_buffer(&buf, offset, bytemuck::cast_slice(data));
            buf
        };
        let t = make(&b.target, 28);
        let d = make(if b.draft.is_empty() { &[0.0] } else { &b.draft }, 1028);
        let rows = |buffer, offset| GpuRows::f32(buffer, offset);
        let batch = GpuVerifyBatch {
            vocab_size: b.vocab,
            requests: &b.requests,
            draft_token_ids: &b.drafts,
            target_logits: rows(&t, 28),
            draft: match kind {
                0 => GpuDraft::OneHot,
                1 => GpuDraft::Probs(rows(&d, 1028)),
                _ => GpuDraft::Logits(rows(&d, 1028)),
            },
            draft_vocab_size: None,
            synthetic_rates: None,
        };
        let mut encoder =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let pending = v.record(&mut encoder, &batch).unwrap();
        let (n, stride) = pending.layout();
        assert_eq!((n, stride), (b.requests.len(), expect.stride));
        queue.submit([encoder.finish()]);
        assert_eq!(v.read_blocking(pending).unwrap(), expect, "kind {kind}");
    }
}

/// Draft ids read from a GPU buffer (`Verifier::record_device_drafts`) give the tokens of the
/// same ids given on the host, for every draft kind and a batch of several requests; the
/// placeholders alone (the ids not copied) give other tokens; a buffer that cannot serve is a
/// typed error.
#[test]
fn draft_ids_on_the_gpu_equal_draft_ids_on_the_host() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().unwrap();
    for kind in 0..3u8 {
        let b = mixed(60 + kind as u64, kind);
        let expect = v.verify_blocking(&b.batch()).unwrap();
        let make = |bytes: &[u8], usage| {
            let buf = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("test.buffer"),
                size: (bytes.len() as u64).next_multiple_of(4) + 64,
                usage: usage | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            queue.write_buffer(&buf, 0, bytes);
            buf
        };
        let storage = wgpu::BufferUsages::STORAGE;
        let t = make(bytemuck::cast_slice(&b.target), storage);
        let d = make(bytemuck::cast_slice(&b.draft), storage);
        // The ids 8 bytes into their buffer.
        let mut id_bytes = vec![0u8; 8];
        id_bytes.extend_from_slice(bytemuck::cast_slice(&b.drafts));
        let ids = make(&id_bytes, wgpu::BufferUsages::COPY_SRC);
        // Placeholders that differ from the ids (and stay in the vocabulary).
        let placeholders: Vec<i32> = b.drafts.iter().map(|&t| (t + 1) % b.vocab as i32).collect();
        let batch = GpuVerifyBatch {
            vocab_size: b.vocab,
            requests: &b.requests,
            draft_token_ids: &placeholders,
            target_logits: GpuRows::f32(&t, 0),
            draft: match kind {
                0 => GpuDraft::OneHot,
                1 => GpuDraft::Probs(GpuRows::f32(&d, 0)),
                _ => GpuDraft::Logits(GpuRows::f32(&d, 0)),
            },
            draft_vocab_size: None,
            synthetic_rates: None,
        };
        let run_on = |v: &Verifier, from: Option<DeviceIds<'_>>| {
            let mut encoder = device.create_command_encoder(&Default::default());
            let pending = match from {
                Some(ids) => v.record_device_drafts(&mut encoder, &batch, ids).unwrap(),
                None => v.record(&mut encoder, &batch).unwrap(),
            };
            queue.submit([encoder.finish()]);
            v.read_blocking(pending).unwrap()
        };
        let run = |from: Option<DeviceIds<'_>>| run_on(v, from);
        let from = DeviceIds {
            buffer: &ids,
            offset: 8,
        };
        assert_eq!(run(Some(from)), expect, "kind {kind}");
        if kind == 0 {
            // The early one-hot race reads the draft ids from the metadata the copy fills.
            let early = Verifier::with_device(
                device.clone(),
                queue.clone(),
                VerifierOptions {
                    early_race_entries: Some(u64::MAX),
                    ..VerifierOptions::default()
                },
            )
            .unwrap();
            assert!(early.takes_early_race(&b.batch()).unwrap());
            assert_eq!(run_on(&early, Some(from)), expect, "early race");
        }
        // Negative control: the placeholders verified as they are.
        assert_ne!(
            run(None),
            expect,
            "kind {kind}: the placeholders gave the same tokens"
        );
        // A buffer without COPY_SRC, a misaligned offset, too few bytes.
        let no_copy = make(&id_bytes, wgpu::BufferUsages::empty());
        let short = make(&id_bytes[..12], wgpu::BufferUsages::COPY_SRC);
        for (buffer, offset) in [(&no_copy, 8), (&ids, 6), (&short, 8)] {
            let mut encoder = device.create_command_encoder(&Default::default());
            let got = v.record_device_drafts(&mut encoder, &batch, DeviceIds { buffer, offset });
            assert!(
                matches!(got, Err(Error::DraftIdBuffer { .. })),
                "kind {kind}: {:?}",
                got.err()
            );
        }
    }
}

#[test]
fn async_verify_equals_blocking() {
    each_backend(|v: &Verifier| {
        let b = mixed(40, 1);
        let a = pollster::block_on(v.verify(&b.batch())).unwrap();
        assert_eq!(a, v.verify_blocking(&b.batch()).unwrap());
    });
}

#[test]
fn gpu_agrees_with_the_cpu_twin() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut gen = Gen::new(50);
    let (mut requests, mut differing, mut greedy_requests) = (0usize, 0usize, 0usize);
    for round in 0..12 {
        let kind = (round % 3) as u8;
        let vocab = [1000u32, 32000, 5003][round % 3];
        let ks: Vec<u32> = (0..24).map(|i| (i % 6) as u32).collect();
        let b = Owned::random(&mut gen, vocab, &ks, &[0.0, 1.0, 0.6, 1.4], kind, 0.7);
        let (a, o) = (
            c.verify_blocking(&b.batch()).unwrap(),
            g.verify_blocking(&b.batch()).unwrap(),
        );
        for r in 0..b.requests.len() {
            requests += 1;
            let greedy = b.requests[r].params.temperature == 0.0;
            greedy_requests += greedy as usize;
            if a.emitted(r) != o.emitted(r) {
                assert!(
                    !greedy,
                    "greedy paths must agree exactly (round {round}, request {r})"
                );
                differing += 1;
            }
        }
    }
    println!("GPU vs CPU twin: {differing} of {requests} requests differ ({greedy_requests} greedy, all identical)");
    // Disagreements can only come from decisions within rounding of their threshold (exp/ln
    // ulps); more than 1% would mean a real divergence.
    assert!(
        differing * 100 <= requests,
        "{differing} of {requests} differ"
    );
}

#[test]
fn early_race_gives_the_tokens_of_the_race_after_verify() {
    // Small one-hot batches race every row beside the statistics pass (early_race_entries);
    // the tokens must be those of the race over the row verify chose, whatever the batch:
    // rejections and bonus rows, greedy requests among sampled ones, ragged k, filters, row
    // windows.
    let Some(_) = gpu() else { return };
    let with = |entries: u64, max_binding_bytes: Option<u64>| {
        gpu_tuned(VerifierOptions {
            early_race_entries: Some(entries),
            max_binding_bytes,
            ..VerifierOptions::default()
        })
    };
    let late = with(0, None);
    let early = with(u64::MAX, None);
    let early_windows = with(u64::MAX, Some(3 * 1500 * 4 + 256));
    let (mut bonus, mut resampled) = (0usize, 0usize);
    for seed in 0..6u64 {
        let mut g = Gen::new(700 + seed);
        // p_argmax 1.0 at a low temperature accepts most drafts (bonus rows); 0.3 rejects most.
        let p_argmax = [1.0, 0.3][seed as usize % 2];
        let temps = [[0.05, 0.0, 0.1, 0.02], [1.0, 0.0, 0.7, 1.5]][seed as usize % 2];
        let mut b = Owned::random(&mut g, 1500, &[3, 0, 5, 1, 2, 4, 0, 3], &temps, 0, p_argmax);
        if seed >= 4 {
            // Filters: the cut-offs the early race reads come from the pass before it.
            for (i, r) in b.requests.iter_mut().enumerate() {
                r.params = match i % 3 {
                    0 => r.params.with_top_k(40),
                    1 => r.params.with_top_p(0.8),
                    _ => r.params,
                };
            }
        }
        // (A check that can fail: the verifiers take the paths they are named for.)
        assert!(early.takes_early_race(&b.batch()).unwrap(), "seed {seed}");
        assert!(!late.takes_early_race(&b.batch()).unwrap(), "seed {seed}");
        let want = late.verify_blocking(&b.batch()).unwrap();
        assert_eq!(
            early.verify_blocking(&b.batch()).unwrap(),
            want,
            "seed {seed}"
        );
        assert_eq!(
            early_windows.verify_blocking(&b.batch()).unwrap(),
            want,
            "seed {seed}, row windows"
        );
        assert_eq!(
            cpu().verify_blocking(&b.batch()).unwrap(),
            want,
            "seed {seed} vs CPU"
        );
        for (r, req) in b.requests.iter().enumerate() {
            if req.params.temperature > 0.0 {
                let n = want.emitted(r).len();
                bonus += (n == req.num_drafts as usize + 1) as usize;
                resampled += (n <= req.num_drafts as usize) as usize;
            }
        }
    }
    // Both kinds of early-raced row must have decided some request, or the test proves little.
    assert!(
        bonus >= 3 && resampled >= 3,
        "bonus {bonus}, resampled {resampled}"
    );
}

//! The parts of the speculative decoder, one by one: the n-gram proposer's match rule, the
//! draft-model proposer's top-1 semantics, the batch-expansion index maths, the gather kernel
//! against its CPU twin (GPU, never skipped silently), its shader validation, and the metrics.

mod common;
mod speculative_mock;

use common::*;
use specdec::speculative::{
    gather_rows_cpu, proposal_cap, BatchExpansion, DraftModelProposer, ExpansionLayout, GatherRows,
    Metrics, NgramProposer, Proposals, Proposer, RowKind, ScoreInput, SeqView, Sequences,
    SpecError, TargetModel,
};
use specdec::{GpuRows, SamplingParams};
use speculative_mock::*;

fn view(tokens: &[u32], max_len: usize) -> SeqView<'_> {
    SeqView {
        request: 0,
        tokens,
        max_len,
        params: SamplingParams::greedy(),
    }
}

fn propose_one(p: &mut impl Proposer, tokens: &[u32], max_len: usize, k: usize) -> Vec<u32> {
    let mut out = Proposals::default();
    p.propose(&[view(tokens, max_len)], k, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out.lens[0] as usize, out.tokens.len());
    out.tokens.clone()
}

#[test]
fn ngram_no_match_proposes_nothing() {
    let mut p = NgramProposer::new(1, 3).unwrap();
    assert_eq!(
        propose_one(&mut p, &[1, 2, 3, 4, 5], 100, 4),
        Vec::<u32>::new()
    );
    // A single token has no earlier occurrence of anything.
    assert_eq!(propose_one(&mut p, &[7], 100, 4), Vec::<u32>::new());
    assert_eq!(p.find(&[1, 2, 3, 4, 5]), None);
}

#[test]
fn ngram_most_recent_occurrence_wins() {
    let mut p = NgramProposer::new(1, 1).unwrap();
    // "9" occurs at 0 (followed by 1 1 1) and at 4 (followed by 2 2 2); the suffix is the last 9.
    let t = [9, 1, 1, 1, 9, 2, 2, 2, 9];
    assert_eq!(p.find(&t), Some((1, 4)));
    assert_eq!(propose_one(&mut p, &t, 100, 3), vec![2, 2, 2]);
    assert_eq!(propose_one(&mut p, &t, 100, 2), vec![2, 2]);
}

#[test]
fn ngram_longest_n_first_then_falls_back() {
    let mut p = NgramProposer::new(1, 3).unwrap();
    // Suffix 3-gram [5, 6, 7] occurs at 0 (followed by 8); the more recent 1-gram 7 at 6 (followed
    // by 1) loses because longer n-grams are tried first.
    let t = [5, 6, 7, 8, 0, 0, 7, 1, 5, 6, 7];
    assert_eq!(p.find(&t), Some((3, 0)));
    assert_eq!(propose_one(&mut p, &t, 100, 2), vec![8, 0]);
    // No 3-gram or 2-gram match: falls back to the 1-gram, most recent occurrence.
    let t = [3, 7, 4, 9, 7, 2, 1, 7];
    assert_eq!(p.find(&t), Some((1, 4)));
    assert_eq!(propose_one(&mut p, &t, 100, 3), vec![2, 1, 7]);
    // With n_min = 2 the 1-gram is not used.
    let mut p2 = NgramProposer::new(2, 3).unwrap();
    assert_eq!(p2.find(&t), None);
    assert_eq!(propose_one(&mut p2, &t, 100, 3), Vec::<u32>::new());
    // 2-gram fallback when no 3-gram matches.
    let t = [1, 4, 6, 2, 9, 4, 6];
    assert_eq!(p2.find(&t), Some((2, 1)));
    assert_eq!(propose_one(&mut p2, &t, 100, 4), vec![2, 9, 4, 6]);
}

#[test]
fn ngram_match_at_the_end_is_cut_by_the_sequence() {
    let mut p = NgramProposer::new(1, 2).unwrap();
    // Most recent earlier occurrence of [3, 4] starts at 2 and overlaps the suffix (which
    // starts at 4): its continuation is what is left of the sequence, [3, 4], not k tokens.
    let t = [3, 4, 3, 4, 3, 4];
    assert_eq!(p.find(&t), Some((2, 2)));
    assert_eq!(propose_one(&mut p, &t, 100, 5), vec![3, 4]);
    // An occurrence right before the suffix: one token of continuation.
    let t = [8, 8, 8];
    assert_eq!(p.find(&t), Some((2, 0)));
    assert_eq!(propose_one(&mut p, &t, 100, 5), vec![8]);
}

#[test]
fn ngram_max_length_cut() {
    let mut p = NgramProposer::new(1, 1).unwrap();
    let t = [1, 2, 3, 4, 5, 6, 1]; // proposes [2, 3, 4, 5, ...]
    assert_eq!(propose_one(&mut p, &t, 100, 4), vec![2, 3, 4, 5]);
    // len 7, max_len 10: at most 10 - 7 - 1 = 2 drafts.
    assert_eq!(propose_one(&mut p, &t, 10, 4), vec![2, 3]);
    // One short of the cap: a plain step.
    assert_eq!(propose_one(&mut p, &t, 8, 4), Vec::<u32>::new());
    assert_eq!(propose_one(&mut p, &t, 7, 4), Vec::<u32>::new());
    assert_eq!(propose_one(&mut p, &t, 3, 4), Vec::<u32>::new());
    assert_eq!(proposal_cap(7, 10, 4), 2);
    assert_eq!(proposal_cap(7, 100, 4), 4);
    assert_eq!(proposal_cap(7, 8, 4), 0);
    assert_eq!(proposal_cap(9, 8, 4), 0);
}

#[test]
fn ngram_is_batched_and_reuses_buffers() {
    let mut p = NgramProposer::new(1, 3).unwrap();
    let a = [1u32, 2, 3, 1, 2];
    let b = [5u32, 6];
    let c = [7u32, 7, 7, 7, 7, 7];
    let seqs = [view(&a, 100), view(&b, 100), view(&c, 8)];
    let mut out = Proposals::default();
    p.propose(&seqs, 3, &mut out).unwrap();
    assert_eq!(out.lens, vec![3, 0, 1]);
    assert_eq!(out.tokens, vec![3, 1, 2, 7]);
    assert_eq!(out.kind, RowKind::OneHot);
    assert!(out.rows.is_empty());
    let caps = (out.lens.capacity(), out.tokens.capacity());
    for _ in 0..10 {
        p.propose(&seqs, 3, &mut out).unwrap();
    }
    assert_eq!((out.lens.capacity(), out.tokens.capacity()), caps);
    assert_eq!(out.tokens, vec![3, 1, 2, 7]);
    assert!(matches!(
        NgramProposer::new(0, 2),
        Err(SpecError::Invalid(_))
    ));
    assert!(matches!(
        NgramProposer::new(3, 2),
        Err(SpecError::Invalid(_))
    ));
}

#[test]
fn draft_model_proposer_has_top1_semantics() {
    let lm = MockLm::peaked(16);
    for kind in [RowKind::OneHot, RowKind::Probs, RowKind::Logits] {
        let mut p = DraftModelProposer::new(MockDraft::new(lm, 0.5, kind));
        let a = [1u32, 2, 3];
        let b = [4u32, 5, 6, 7, 8];
        let c = [9u32; 4];
        let mut seqs = [view(&a, 100), view(&b, 7), view(&c, 5)];
        seqs[0].params = SamplingParams::seeded(1.0, 3);
        let mut out = Proposals::default();
        p.propose(&seqs, 4, &mut out).unwrap();
        // Caps: 4, 7 - 5 - 1 = 1, 5 - 4 - 1 = 0.
        assert_eq!(out.lens, vec![4, 1, 0], "{kind:?}");
        let row = if kind == RowKind::OneHot { 0 } else { 16 };
        assert_eq!(out.rows.len(), 5 * row);
        assert_eq!(out.kind, kind);
        assert_eq!(p.model().calls, 1, "one call per step for the whole batch");
    }
}

/// A draft model that ignores its caps and returns rows of the wrong length on request.
struct Unruly {
    extra: usize,
    bad_rows: bool,
}

impl specdec::speculative::DraftModel for Unruly {
    fn row_kind(&self) -> RowKind {
        RowKind::Probs
    }
    fn vocab_size(&self) -> usize {
        4
    }
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        caps: &[usize],
        out: &mut Proposals,
    ) -> Result<(), specdec::speculative::ModelError> {
        for (i, _) in seqs.iter().enumerate() {
            let n = caps[i] + self.extra;
            let toks: Vec<u32> = (0..n as u32).collect();
            let rows = vec![0.25f32; n * 4 - usize::from(self.bad_rows && n > 0)];
            out.push(&toks, &rows)?;
        }
        Ok(())
    }
}

#[test]
fn draft_model_proposer_cuts_and_checks() {
    let a = [1u32, 2, 3];
    let seqs = [view(&a, 100), view(&a, 5)];
    let mut out = Proposals::default();
    let mut p = DraftModelProposer::new(Unruly {
        extra: 2,
        bad_rows: false,
    });
    p.propose(&seqs, 3, &mut out).unwrap();
    assert_eq!(out.lens, vec![3, 1]);
    assert_eq!(out.tokens, vec![0, 1, 2, 0]);
    assert_eq!(out.rows.len(), 4 * 4);
    let mut bad = DraftModelProposer::new(Unruly {
        extra: 0,
        bad_rows: true,
    });
    let e = bad.propose(&seqs, 3, &mut out).unwrap_err();
    assert!(matches!(e, SpecError::Model(_)), "{e}");
}

#[test]
fn expansion_layout_matches_the_documented_example() {
    let l = ExpansionLayout::new(&[2, 0, 1]);
    assert_eq!(l.contraction, vec![0, 1, 2, 5, 3, 4]);
    assert_eq!(l.expansion, vec![0, 1, 2, 4, 5, 3]);
    assert_eq!(
        l.queries,
        vec![(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (1, 0)]
    );
}

#[test]
fn expand_then_contract_is_the_identity() {
    let mut g = Gen::new(11);
    let mut l = ExpansionLayout::default();
    let cases: Vec<Vec<u32>> = vec![
        vec![],
        vec![0],
        vec![0, 0, 0],
        vec![5],
        vec![3, 0, 0, 2, 1, 0, 7],
    ];
    let random = (0..200).map(|_| {
        let n = g.below(12);
        (0..n).map(|_| g.below(6) as u32).collect::<Vec<u32>>()
    });
    for lens in cases.into_iter().chain(random) {
        l.build(&lens);
        let rows: usize = lens.iter().map(|&k| k as usize + 1).sum();
        assert_eq!(l.rows(), rows);
        // Both index lists are permutations and inverse to each other.
        let mut seen = vec![false; rows];
        for g_row in 0..rows {
            let e = l.contraction[g_row] as usize;
            assert!(!seen[e]);
            seen[e] = true;
            assert_eq!(l.expansion[e] as usize, g_row);
        }
        // Expanded order: spec requests first (request order), each with prefixes 0..=k; then the
        // k = 0 requests in request order.
        let mut want = Vec::new();
        for (r, &k) in lens.iter().enumerate().filter(|(_, &k)| k > 0) {
            want.extend((0..=k).map(|j| (r as u32, j)));
        }
        want.extend(
            lens.iter()
                .enumerate()
                .filter(|(_, &k)| k == 0)
                .map(|(r, _)| (r as u32, 0)),
        );
        assert_eq!(l.queries, want);
        let v = 3;
        let x: Vec<f32> = (0..rows * v).map(|i| i as f32 + 0.5).collect();
        let mut e = vec![0f32; rows * v];
        let mut y = vec![0f32; rows * v];
        l.expand(&x, &mut e, v);
        l.contract(&e, &mut y, v);
        assert_eq!(x, y, "lens {lens:?}");
    }
}

#[test]
fn batch_expansion_scores_equal_the_multi_query_layout() {
    let lm = MockLm::peaked(32);
    let mut g = Gen::new(5);
    let seqs: Vec<Vec<u32>> = (0..9)
        .map(|_| (0..1 + g.below(10)).map(|_| g.below(32) as u32).collect())
        .collect();
    let drafts: Vec<Vec<u32>> = (0..9)
        .map(|i| (0..(i % 4)).map(|_| g.below(32) as u32).collect())
        .collect();
    let inputs: Vec<ScoreInput<'_>> = seqs
        .iter()
        .zip(&drafts)
        .enumerate()
        .map(|(i, (s, d))| ScoreInput {
            seq: i,
            tokens: s,
            drafts: d,
        })
        .collect();
    let rows: usize = inputs.iter().map(|i| i.rows()).sum();
    let mut a = vec![0f32; rows * 32];
    let mut b = vec![1f32; rows * 32];
    BatchExpansion::new(lm).forward(&inputs, &mut a).unwrap();
    let mut multi = Sequences::new(vec![MockSeq::new(lm); 9]);
    multi.forward(&inputs, &mut b).unwrap();
    assert_eq!(a, b);
    // And each row is what the model says after tokens ++ drafts[..i].
    let mut at = 0;
    let mut row = vec![0f32; 32];
    for input in &inputs {
        for i in 0..=input.drafts.len() {
            lm.logits(input.tokens, &input.drafts[..i], &mut row);
            assert_eq!(&a[at * 32..(at + 1) * 32], &row[..]);
            at += 1;
        }
    }
    // The multi-query models cached tokens ++ drafts; rolling back keeps the prefix.
    for (m, (s, d)) in multi.models.iter().zip(seqs.iter().zip(&drafts)) {
        assert_eq!(m.cache.len(), s.len() + d.len());
    }
    multi.truncate(3, 2).unwrap();
    assert_eq!(multi.models[3].cache, seqs[3][..2].to_vec());
}

/// Runs the gather kernel on the GPU over fresh buffers at the given byte offsets and returns the
/// destination rows.
fn gpu_gather(
    gather: &GatherRows,
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    src: &[f32],
    (src_off, dst_off): (u64, u64),
    indices: &[u32],
    row_len: usize,
) -> Vec<f32> {
    use wgpu::util::DeviceExt;
    use wgpu::BufferUsages as U;
    let mut bytes = vec![0u8; src_off as usize];
    bytes.extend_from_slice(bytemuck::cast_slice(src));
    let src_buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("specdec.tests.gather_src"),
        contents: &bytes,
        usage: U::STORAGE,
    });
    let out_bytes = (indices.len() * row_len * 4) as u64;
    let size = (dst_off + out_bytes).next_multiple_of(4).max(4);
    let dst_buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("specdec.tests.gather_dst"),
        size,
        usage: U::STORAGE | U::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("specdec.tests.gather_read"),
        size,
        usage: U::MAP_READ | U::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    gather
        .record(
            &mut enc,
            GpuRows::f32(&src_buf, src_off),
            src.len() / row_len.max(1),
            GpuRows::f32(&dst_buf, dst_off),
            indices,
            row_len,
        )
        .unwrap();
    enc.copy_buffer_to_buffer(&dst_buf, 0, &read, 0, size);
    let index = queue.submit([enc.finish()]);
    let slice = read.slice(..);
    slice.map_async(wgpu::MapMode::Read, |_| {});
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: Some(std::time::Duration::from_secs(60)),
        })
        .unwrap();
    let view = slice.get_mapped_range().unwrap();
    let words: &[f32] = bytemuck::cast_slice(&view);
    words[dst_off as usize / 4..dst_off as usize / 4 + indices.len() * row_len].to_vec()
}

#[test]
fn gpu_gather_equals_the_cpu_twin() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().expect("a GPU verifier");
    let full = GatherRows::new(device).unwrap();
    let mut g = Gen::new(99);
    // (row_len, source rows, destination rows, byte offsets, binding cap in bytes)
    let cases: [(usize, usize, usize, u64, u64, Option<u64>); 6] = [
        (1, 1, 1, 0, 0, None),
        (7, 13, 20, 12, 260, None),
        (300, 40, 70, 4, 1028, None),
        // Bindings capped so that chunks hold a few rows: row counts straddle the chunk size.
        (64, 50, 97, 0, 0, Some(64 * 4 * 5 + 256)),
        (65, 33, 64, 36, 8, Some(65 * 4 * 4 + 256)),
        (1000, 9, 31, 1024, 4, Some(1000 * 4 + 256)),
    ];
    for (row_len, src_rows, dst_rows, src_off, dst_off, cap) in cases {
        let gather = match cap {
            Some(c) => GatherRows::new(device).unwrap().with_max_binding_bytes(c),
            None => GatherRows::new(device).unwrap(),
        };
        // Random bit patterns, NaN payloads and denormals included: the copy is bit-exact.
        let src: Vec<f32> = (0..src_rows * row_len)
            .map(|_| f32::from_bits(g.u64() as u32))
            .collect();
        let indices: Vec<u32> = (0..dst_rows).map(|_| g.below(src_rows) as u32).collect();
        let mut want = vec![0f32; dst_rows * row_len];
        gather_rows_cpu(&src, &mut want, &indices, row_len);
        let offsets = (src_off, dst_off);
        let got = gpu_gather(&gather, device, queue, &src, offsets, &indices, row_len);
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&got), bits(&want), "row_len {row_len}, cap {cap:?}");
    }
    // A contraction of batch-expanded rows, as the scorer uses it.
    let l = ExpansionLayout::new(&[3, 0, 2, 0, 5, 1]);
    let vocab = 257;
    let expanded: Vec<f32> = (0..l.rows() * vocab).map(|i| i as f32).collect();
    let mut want = vec![0f32; l.rows() * vocab];
    l.contract(&expanded, &mut want, vocab);
    let got = gpu_gather(
        &full,
        device,
        queue,
        &expanded,
        (0, 0),
        &l.contraction,
        vocab,
    );
    assert_eq!(got, want);
}

#[test]
fn gpu_gather_rejects_bad_input_on_the_host() {
    let Some(v) = gpu() else { return };
    let (device, _) = v.device().expect("a GPU verifier");
    let gather = GatherRows::new(device).unwrap();
    let mk = |size: u64, usage: wgpu::BufferUsages| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specdec.tests.gather_bad"),
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let s = wgpu::BufferUsages::STORAGE;
    let a = mk(64, s);
    let b = mk(64, s);
    let no_storage = mk(64, wgpu::BufferUsages::COPY_DST);
    let rows = |buffer, offset| GpuRows::f32(buffer, offset);
    let mut enc = device.create_command_encoder(&Default::default());
    let cases = [
        (rows(&a, 0), 4, rows(&b, 0), vec![4u32], "past the"),
        (rows(&a, 2), 4, rows(&b, 0), vec![0], "multiple of 4"),
        (rows(&a, 0), 5, rows(&b, 0), vec![0], "need"),
        (rows(&a, 0), 4, rows(&b, 0), vec![0; 5], "need"),
        (rows(&a, 0), 4, rows(&a, 0), vec![0], "different buffers"),
        (rows(&no_storage, 0), 4, rows(&b, 0), vec![0], "STORAGE"),
    ];
    for (src, n, dst, idx, msg) in cases {
        let e = gather.record(&mut enc, src, n, dst, &idx, 4).unwrap_err();
        assert!(matches!(e, SpecError::Invalid(_)), "{e}");
        assert!(e.to_string().contains(msg), "{e} should say {msg:?}");
    }
}

#[test]
fn gather_rows_shader_validates_and_translates_to_spirv() {
    use naga::back::{pipeline_constants, spv};
    let (module, info) = specdec::shaders::validate_gather_rows().unwrap_or_else(|e| panic!("{e}"));
    assert!(module.entry_points.iter().any(|e| e.name == "main"));
    for wg in [32u32, 64, 256] {
        let mut constants = naga::back::PipelineConstants::default();
        constants.insert("WG".to_string(), f64::from(wg));
        let (m, i) = pipeline_constants::process_overrides(
            &module,
            &info,
            Some((naga::ShaderStage::Compute, "main")),
            &constants,
        )
        .unwrap();
        let ep = m.entry_points.iter().find(|e| e.name == "main").unwrap();
        assert_eq!(ep.workgroup_size, [wg, 1, 1]);
        let words = spv::write_vec(
            &m,
            &i,
            &spv::Options {
                lang_version: (1, 3),
                ..Default::default()
            },
            Some(&spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: "main".into(),
            }),
        )
        .unwrap();
        assert_eq!(words[0], 0x0723_0203, "SPIR-V magic");
        spirv_val(&words, wg);
    }
}

/// Runs `spirv-val --target-env vulkan1.1` on the module when it is installed (CI installs it;
/// with `CI=true` a missing validator fails, elsewhere the skip is printed).
fn spirv_val(words: &[u32], wg: u32) {
    let found = std::process::Command::new("spirv-val")
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "spirv-val not found but CI=true (install spirv-tools)"
        );
        eprintln!("SKIPPED spirv-val for gather_rows: not installed (Debian spirv-tools)");
        return;
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("spec");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("gather_rows.main.wg{wg}.spv"));
    std::fs::write(&file, bytemuck::cast_slice::<u32, u8>(words)).unwrap();
    let out = std::process::Command::new("spirv-val")
        .args(["--target-env", "vulkan1.1"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "spirv-val rejects {}: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn metrics_rates_and_table() {
    let mut m = Metrics::default();
    m.record_step(4, 2);
    m.record_step(4, 4);
    m.record_step(2, 0);
    m.record_step(0, 0);
    assert_eq!(m.request_steps, 4);
    assert_eq!(m.proposed, 10);
    assert_eq!(m.accepted, 6);
    assert_eq!(m.emitted, 10);
    assert_eq!(m.proposed_at, vec![3, 3, 2, 2]);
    assert_eq!(m.accepted_at, vec![2, 2, 1, 1]);
    assert_eq!(m.acceptance_rate(0), Some(2.0 / 3.0));
    assert_eq!(m.acceptance_rate(3), Some(0.5));
    assert_eq!(m.acceptance_rate(4), None);
    assert_eq!(m.mean_acceptance_length(), Some(2.5));
    assert_eq!(m.draft_efficiency(), Some(0.6));
    assert_eq!(m.system_efficiency(), Some(10.0 / 14.0));
    assert_eq!(m.tokens_per_second(), None);
    let table = m.to_string();
    assert!(
        table.contains("| draft efficiency (accepted / proposed) | 0.600 |"),
        "{table}"
    );
    assert!(table.contains("| 0 | 3 | 2 | 0.667 |"), "{table}");
    assert_eq!(Metrics::default().draft_efficiency(), None);
}

/// The GPU-resident scorer path: batch-expanded logits in a GPU buffer, contracted by the gather
/// kernel into a second buffer and verified there with `Verifier::record`, give the tokens of the
/// host path (contraction by the twin, `verify_blocking` on the CPU backend). Greedy requests, so
/// the two backends must agree exactly.
#[test]
fn gpu_contraction_feeds_the_verifier() {
    use wgpu::util::DeviceExt;
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().expect("a GPU verifier");
    let gather = GatherRows::new(device).unwrap();
    let vocab = 1000usize;
    let lens = [3u32, 0, 2, 0, 5, 1];
    let layout = ExpansionLayout::new(&lens);
    let mut g = Gen::new(3);
    let expanded = g.logits(layout.rows() * vocab, 2.0);
    let mut rows = vec![0f32; expanded.len()];
    layout.contract(&expanded, &mut rows, vocab);
    // Drafts: the argmax of their row half of the time, so some are accepted.
    let mut drafts = Vec::new();
    let mut at = 0usize;
    for &k in &lens {
        for i in 0..k as usize {
            let row = &rows[(at + i) * vocab..(at + i + 1) * vocab];
            let d = if g.unit() < 0.5 {
                argmax(row)
            } else {
                g.below(vocab)
            };
            drafts.push(d as i32);
        }
        at += k as usize + 1;
    }
    let requests: Vec<specdec::Request> = lens
        .iter()
        .enumerate()
        .map(|(r, &k)| specdec::Request {
            num_drafts: k,
            params: SamplingParams::greedy(),
            position: 100 + r as u64,
        })
        .collect();
    let host = cpu()
        .verify_blocking(&specdec::VerifyBatch {
            vocab_size: vocab as u32,
            requests: &requests,
            draft_token_ids: &drafts,
            target_logits: specdec::Logits::F32(&rows),
            draft: specdec::Draft::OneHot,
            draft_vocab_size: None,
            synthetic_rates: None,
        })
        .unwrap();
    let src = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("specdec.tests.expanded"),
        contents: bytemuck::cast_slice(&expanded),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let dst = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("specdec.tests.contracted"),
        size: (rows.len() * 4 + 256) as u64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    let dst_rows = GpuRows::f32(&dst, 256);
    gather
        .record(
            &mut enc,
            GpuRows::f32(&src, 0),
            layout.rows(),
            dst_rows,
            &layout.contraction,
            vocab,
        )
        .unwrap();
    let pending = v
        .record(
            &mut enc,
            &specdec::GpuVerifyBatch {
                vocab_size: vocab as u32,
                requests: &requests,
                draft_token_ids: &drafts,
                target_logits: dst_rows,
                draft: specdec::Draft::OneHot,
                draft_vocab_size: None,
                synthetic_rates: None,
            },
        )
        .unwrap();
    queue.submit([enc.finish()]);
    let on_gpu = v.read_blocking(pending).unwrap();
    assert_eq!(on_gpu.tokens, host.tokens);
    assert_eq!(on_gpu.num_emitted, host.num_emitted);
    assert!(
        host.num_emitted.iter().any(|&n| n > 1),
        "some drafts accepted"
    );
}

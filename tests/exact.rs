//! Exact cases with known answers (SPEC §4 "exact oracles"), each on the CPU backend and on the
//! GPU: greedy paths, -1 drafts, zero-draft requests beside many, one-hot targets, disjoint
//! supports, p == q, forced synthetic outcomes, non-finite rows, empty residuals, 128 drafts.

mod common;
use common::*;
use specdec::{Rule, SamplingParams, Status, Verifier, VerifyOutput};

const NEG: f32 = f32::NEG_INFINITY;

fn greedy() -> SamplingParams {
    SamplingParams::greedy()
}

#[test]
fn greedy_accept_and_reject_paths() {
    each_backend(|v: &Verifier| {
        let rows = vec![
            row(10, 0.0, &[(3, 5.0)]),
            row(10, 0.0, &[(7, 5.0)]),
            row(10, 0.0, &[(1, 5.0)]),
            row(10, 0.0, &[(9, 5.0)]),
        ];
        let b = explicit(
            10,
            &[
                (greedy(), vec![3, 7, 1], rows.clone()), // all accepted + bonus
                (greedy(), vec![3, 7, 2], rows.clone()), // last rejected
                (greedy(), vec![4, 7, 1], rows.clone()), // first rejected
                (greedy(), vec![3, 0, 1], rows),         // middle rejected
            ],
        );
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.emitted(0), &[3, 7, 1, 9], "{}", v.describe());
        assert_eq!(out.emitted(1), &[3, 7, 1]);
        assert_eq!(out.emitted(2), &[3]);
        assert_eq!(out.emitted(3), &[3, 7]);
        assert_eq!(out.stride, 4);
        assert_eq!(
            &out.tokens[8..12],
            &[3, -1, -1, -1],
            "padding after the emitted tokens"
        );
        assert!(out.status.iter().all(|s| s.is_ok()));
    });
}

#[test]
fn greedy_ties_go_to_the_lowest_index() {
    each_backend(|v: &Verifier| {
        let r = row(9000, 0.0, &[(5000, 2.0), (8999, 2.0), (4100, 2.0)]);
        let b = explicit(
            9000,
            &[
                (greedy(), vec![], vec![r.clone()]),
                (greedy(), vec![5000], vec![r.clone(), r]),
            ],
        );
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.emitted(0), &[4100]);
        assert_eq!(
            out.emitted(1),
            &[4100],
            "5000 ties with 4100 but is not the lowest index"
        );
    });
}

#[test]
fn greedy_ties_between_signed_zeros_go_to_the_lowest_index() {
    // -0.0 and +0.0 are equal logits: the maximum 0 is held first (index 100, chunk 0) by -0.0
    // and later (index 5000, chunk 1) by +0.0, so the argmax is 100 on every backend, whichever
    // way the chunks are merged (in order, or in parallel through order keys of the values).
    each_backend(|v: &Verifier| {
        let mut r = row(9000, -1.0, &[(5000, 0.0)]);
        r[100] = -0.0;
        let mut later = r.clone();
        later[100] = 0.0;
        later[5000] = -0.0;
        let b = explicit(
            9000,
            &[
                (greedy(), vec![], vec![r.clone()]),
                (greedy(), vec![5000], vec![r, later.clone()]),
                (greedy(), vec![], vec![later]),
            ],
        );
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.emitted(0), &[100], "{}", v.describe());
        assert_eq!(out.emitted(1), &[100], "{}", v.describe());
        assert_eq!(out.emitted(2), &[100], "{}", v.describe());
    });
}

#[test]
fn minus_one_drafts_are_always_rejected() {
    each_backend(|v: &Verifier| {
        // p puts all mass on token 2: a real draft of 2 would always be accepted.
        let rows = vec![row(6, NEG, &[(2, 0.0)]), row(6, NEG, &[(2, 0.0)])];
        let b = explicit(
            6,
            &[
                (greedy(), vec![-1], rows.clone()),
                (SamplingParams::seeded(1.0, 5), vec![-1], rows.clone()),
                (SamplingParams::seeded(1.0, 6), vec![2], rows),
            ],
        );
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.emitted(0), &[2]);
        assert_eq!(out.emitted(1), &[2], "rejected -1, resampled from p");
        assert_eq!(
            out.emitted(2),
            &[2, 2],
            "a real draft of the certain token is accepted"
        );
    });
}

#[test]
fn zero_draft_requests_beside_requests_with_many() {
    each_backend(|v: &Verifier| {
        let vocab = 40;
        let mut g = Gen::new(3);
        let mut reqs = Vec::new();
        for &k in &[0usize, 128, 0, 5] {
            let rows: Vec<Vec<f32>> = (0..=k).map(|_| g.logits(vocab, 2.0)).collect();
            // Greedy drafts equal to each row's argmax: all accepted.
            let drafts = rows[..k]
                .iter()
                .map(|r| (0..vocab).fold(0, |b, j| if r[j] > r[b] { j } else { b }) as i32)
                .collect();
            reqs.push((greedy(), drafts, rows));
        }
        let b = explicit(vocab as u32, &reqs);
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.num_emitted, vec![1, 129, 1, 6]);
        assert_eq!(out.stride, 129);
        for r in [0, 2] {
            assert!(out.tokens[r * 129 + 1..(r + 1) * 129]
                .iter()
                .all(|&t| t == -1));
        }
        assert_eq!(&out.emitted(1)[..128], &b.drafts[..128]);
    });
}

#[test]
fn one_hot_targets_are_certain() {
    each_backend(|v: &Verifier| {
        let certain = |t: usize| row(8, NEG, &[(t, 1.5)]);
        let mut reqs = Vec::new();
        for seed in 0..20u64 {
            // Draft of the certain token: accepted; any other draft: rejected, resampled to it.
            reqs.push((
                SamplingParams::seeded(1.0, seed),
                vec![4, 6],
                vec![certain(4), certain(1), certain(7)],
            ));
        }
        let out = v.verify_blocking(&explicit(8, &reqs).batch()).unwrap();
        for r in 0..20 {
            assert_eq!(out.emitted(r), &[4, 1], "{}", v.describe());
        }
    });
}

#[test]
fn disjoint_supports_always_reject_and_resample_from_p() {
    each_backend(|v: &Verifier| {
        let vocab = 6;
        let p_row = row(vocab, NEG, &[(0, 0.0), (1, 0.5), (2, 1.0)]);
        let q = [0.0f32, 0.0, 0.0, 0.2, 0.3, 0.5];
        let mut b = explicit(vocab as u32, &[]);
        let mut g = Gen::new(9);
        for r in 0..200u64 {
            b.requests.push(specdec::Request {
                num_drafts: 1,
                params: SamplingParams::seeded(1.0, r),
                position: r,
            });
            b.drafts.push(3 + g.below(3) as i32);
            b.target.extend(&p_row);
            b.target.extend(&p_row);
            b.draft.extend(q);
        }
        b.draft_kind = 1;
        let out = v.verify_blocking(&b.batch()).unwrap();
        let mut seen = [0; 3];
        for r in 0..200 {
            let e = out.emitted(r);
            assert_eq!(e.len(), 1, "a draft outside p's support is never accepted");
            assert!((0..3).contains(&e[0]), "the residual is p's support");
            seen[e[0] as usize] += 1;
        }
        assert!(
            seen.iter().all(|&c| c > 10),
            "all of p's support is sampled: {seen:?}"
        );
    });
}

#[test]
fn equal_distributions_always_accept() {
    each_backend(|v: &Verifier| {
        let mut g = Gen::new(4);
        let mut b = Owned::random(
            &mut g,
            300,
            &[4, 4, 4, 4, 4, 4, 4, 4],
            &[1.0, 0.6, 1.7],
            2,
            0.5,
        );
        // Draft logits identical to the target rows: q == p bit for bit, so u·q < p always.
        let v_ = 300;
        let mut draft = Vec::new();
        for r in 0..8 {
            let base = r * 5 * v_;
            draft.extend_from_slice(&b.target[base..base + 4 * v_]);
        }
        b.draft = draft;
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.num_emitted, vec![5; 8], "{}", v.describe());
    });
}

#[test]
fn synthetic_rates_zero_and_one_force_the_outcome() {
    each_backend(|v: &Verifier| {
        let mut g = Gen::new(5);
        let mut b = Owned::random(&mut g, 100, &[3, 3, 3, 3], &[1.0, 0.0], 0, 0.0);
        for r in &mut b.requests {
            r.params.rule = Rule::Synthetic;
        }
        b.rates = Some(vec![
            1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0,
        ]);
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert_eq!(out.num_emitted, vec![4, 1, 2, 3], "{}", v.describe());
        assert_eq!(
            &out.emitted(0)[..3],
            &b.drafts[..3],
            "synthetic acceptance keeps the drafts"
        );
    });
}

#[test]
fn non_finite_rows_give_a_status_and_an_in_range_token() {
    each_backend(|v: &Verifier| {
        let fine = row(7, 0.0, &[(2, 3.0)]);
        let nan = row(7, 0.0, &[(1, f32::NAN), (5, 1.0)]);
        let all_neg = row(7, NEG, &[]);
        let pos_inf = row(7, 0.0, &[(6, f32::INFINITY), (3, 1.0)]);
        let t1 = SamplingParams::seeded(1.0, 1);
        let b = explicit(
            7,
            &[
                // Row 0 is certain (p(2) = 1), so the request always reaches the NaN row.
                (
                    t1,
                    vec![2, 2],
                    vec![row(7, NEG, &[(2, 3.0)]), nan.clone(), fine.clone()],
                ),
                (greedy(), vec![2], vec![fine.clone(), all_neg.clone()]),
                (t1, vec![], vec![pos_inf]),
                (t1, vec![], vec![all_neg]),
                (greedy(), vec![], vec![fine]),
            ],
        );
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert!(out.status[0].contains(Status::TARGET_NONFINITE));
        assert_eq!(
            out.emitted(0),
            &[2, 5],
            "NaN counts as -inf; the finite argmax is emitted"
        );
        assert_eq!(
            out.emitted(1),
            &[2, 0],
            "greedy accepts, then the all -inf bonus row gives index 0"
        );
        assert_eq!(
            out.status[1],
            Status::ALL_MASKED,
            "all -inf is masking, not NaN"
        );
        assert_eq!(out.emitted(2), &[6], "+inf wins");
        assert!(out.status[2].contains(Status::TARGET_NONFINITE));
        assert_eq!(out.emitted(3), &[0]);
        assert_eq!(out.status[3], Status::ALL_MASKED);
        assert!(out.status[4].is_ok(), "a healthy neighbour is unaffected");
        assert_eq!(out.emitted(4), &[2]);
    });
}

#[test]
fn non_finite_draft_logits_reject_and_resample_from_p() {
    each_backend(|v: &Verifier| {
        let p = row(5, NEG, &[(1, 0.0), (3, 0.0)]);
        let mut b = explicit(
            5,
            &[(SamplingParams::seeded(1.0, 2), vec![1], vec![p.clone(), p])],
        );
        b.draft_kind = 2;
        b.draft = row(5, 0.0, &[(0, f32::NAN)]);
        let out = v.verify_blocking(&b.batch()).unwrap();
        assert!(out.status[0].contains(Status::DRAFT_NONFINITE));
        assert_eq!(out.num_emitted[0], 1);
        assert!([1, 3].contains(&out.emitted(0)[0]));
    });
}

#[test]
fn empty_residual_falls_back_to_p() {
    each_backend(|v: &Verifier| {
        // Unnormalised q >= p everywhere: a rejection leaves max(p - q, 0) = 0.
        let p = row(2, 0.0, &[]);
        let mut reqs = Vec::new();
        for s in 0..64 {
            reqs.push((
                SamplingParams::seeded(1.0, s),
                vec![0],
                vec![p.clone(), p.clone()],
            ));
        }
        let mut b = explicit(2, &reqs);
        b.draft_kind = 1;
        b.draft = [0.9f32, 0.9].repeat(64);
        let out = v.verify_blocking(&b.batch()).unwrap();
        let rejected: Vec<usize> = (0..64).filter(|&r| out.num_emitted[r] == 1).collect();
        assert!(
            !rejected.is_empty() && rejected.len() < 64,
            "accept rate 0.5/0.9: {}",
            rejected.len()
        );
        for r in 0..64 {
            assert_eq!(
                out.status[r].contains(Status::EMPTY_RESIDUAL),
                rejected.contains(&r)
            );
            assert!((0..2).contains(&out.emitted(r)[0]));
        }
    });
}

#[test]
fn vocab_sizes_around_the_block_length_match_the_twin() {
    let Some(g) = gpu() else { return };
    let mut gen = Gen::new(8);
    for vocab in [1u32, 3, 4095, 4096, 4097, 8193] {
        for kind in 0..3u8 {
            let b = Owned::random(&mut gen, vocab, &[2, 0, 3], &[0.0, 1.0, 0.8], kind, 0.7);
            let a = cpu().verify_blocking(&b.batch()).unwrap();
            let c = g.verify_blocking(&b.batch()).unwrap();
            assert_eq!(a, c, "vocab {vocab} kind {kind}");
        }
    }
}

#[test]
fn a_padded_target_vocabulary_matches_the_twin() {
    // Qwen2.5's case: the target pads to 152,064 entries, the draft has 151,936.
    let Some(g) = gpu() else { return };
    let mut gen = Gen::new(9);
    for kind in [1u8, 2] {
        let mut b = Owned::random(&mut gen, 152_064, &[3, 0, 2], &[1.0, 0.7], kind, 0.7);
        b.draft_vocab = Some(151_936);
        let rows = b.draft.len() / 152_064;
        b.draft = b
            .draft
            .chunks(152_064)
            .flat_map(|r| r[..151_936].to_vec())
            .collect();
        assert_eq!(b.draft.len(), rows * 151_936);
        // A draft id past the draft vocabulary has q = 0: always rejected.
        b.drafts[0] = 152_000;
        let a = cpu().verify_blocking(&b.batch()).unwrap();
        assert_eq!(
            a.num_emitted[0], 1,
            "a draft the draft model cannot propose is rejected"
        );
        assert_eq!(g.verify_blocking(&b.batch()).unwrap(), a, "kind {kind}");
    }
}

#[test]
fn long_residual_blocks_match_the_twin() {
    // With a target of 4 workgroups a pass, each residual block spans a whole row: every lane
    // races 40 quads and the quad tests (residual_argmax's log_quad_may and linear_quad_may)
    // skip most of them once the workgroup's bound has risen. They must skip only quads that
    // race_step would have settled without a key: the tokens equal the twin's, which tests
    // every entry. Mostly rejected drafts (many races), four temperatures, top-p on every
    // other request (entries below the cut-off), all three draft kinds.
    if gpu().is_none() {
        return;
    }
    let v = gpu_tuned(specdec::VerifierOptions {
        target_workgroups: 4,
        ..specdec::VerifierOptions::default()
    });
    let mut gen = Gen::new(13);
    for round in 0..2 {
        for kind in 0..3u8 {
            let mut b = Owned::random(
                &mut gen,
                40_000,
                &[2, 0, 5, 1, 3, 0, 4, 2],
                &[0.6, 1.0, 1.7, 0.3],
                kind,
                0.2,
            );
            for r in b.requests.iter_mut().skip(round).step_by(2) {
                r.params = r.params.with_top_p(0.8);
            }
            let want = cpu().verify_blocking(&b.batch()).unwrap();
            let got = v.verify_blocking(&b.batch()).unwrap();
            assert_matches_twin(&got, &want, format_args!("round {round}, kind {kind}"));
        }
    }
}

#[test]
fn many_residual_blocks_per_request_match_the_twin() {
    // 64-lane workgroups and a large workgroup target give 256-entry residual blocks: 274 per
    // row at V = 70,000, so each lane of the residual merge folds four or five blocks. Every
    // block's winner must be in the merge (fails with a lane's later blocks left out).
    if gpu().is_none() {
        return;
    }
    let v = Verifier::new(specdec::VerifierOptions {
        workgroup_size: Some(64),
        target_workgroups: 1 << 20,
        ..specdec::VerifierOptions::default()
    })
    .unwrap();
    let mut gen = Gen::new(17);
    for kind in 0..3u8 {
        let b = Owned::random(
            &mut gen,
            70_000,
            &[2, 3, 1, 0],
            &[1.0, 0.7, 1.3, 0.9],
            kind,
            0.3,
        );
        let want = cpu().verify_blocking(&b.batch()).unwrap();
        let got = v.verify_blocking(&b.batch()).unwrap();
        assert_matches_twin(&got, &want, format_args!("kind {kind}"));
    }
}

#[test]
fn every_shader_check_setting_matches_the_twin() {
    // `VerifierOptions::shader_checks` changes what naga compiles around each access and loop,
    // never a result: all checks, none, and the per-kernel default agree with the twin.
    let Some(g) = gpu() else { return };
    let mut gen = Gen::new(10);
    let batches: Vec<Owned> = (0..3u8)
        .map(|kind| Owned::random(&mut gen, 5000, &[3, 0, 2], &[0.0, 1.0, 0.8], kind, 0.7))
        .collect();
    for checks in [
        wgpu::ShaderRuntimeChecks::checked(),
        wgpu::ShaderRuntimeChecks::unchecked(),
    ] {
        let v = Verifier::new(specdec::VerifierOptions {
            shader_checks: Some(checks),
            ..specdec::VerifierOptions::default()
        })
        .unwrap();
        for (kind, b) in batches.iter().enumerate() {
            let want = cpu().verify_blocking(&b.batch()).unwrap();
            assert_eq!(
                v.verify_blocking(&b.batch()).unwrap(),
                want,
                "{checks:?}, kind {kind}"
            );
            assert_eq!(
                g.verify_blocking(&b.batch()).unwrap(),
                want,
                "default, kind {kind}"
            );
        }
    }
}

#[test]
fn subgroup_and_portable_folds_match_the_twin() {
    // `VerifierOptions::subgroups` changes how row_stats' and block_mass' lane trees exchange
    // states (shuffles below the adapter's smallest subgroup size, or workgroup memory at every
    // level), never a result. Where the device offers SUBGROUP the default verifier must take
    // the shuffles, or this test would compare the portable folds with themselves. Both run the
    // wide greedy reduction too (`wide_greedy_chunks`), off by default on software adapters.
    let Some(g) = gpu() else { return };
    let (device, _) = g.device().expect("a GPU verifier has a device");
    let has_subgroups = device.features().contains(wgpu::Features::SUBGROUP);
    assert_eq!(
        g.describe().contains("subgroup folds"),
        has_subgroups,
        "{}",
        g.describe()
    );
    let mut gen = Gen::new(12);
    let mut batches: Vec<Owned> = (0..3u8)
        .map(|kind| {
            Owned::random(
                &mut gen,
                9000,
                &[3, 0, 5, 1],
                &[0.0, 1.0, 0.7, 1.3],
                kind,
                0.6,
            )
        })
        .collect();
    // All greedy: the MAX_ONLY statistics and, with wide_greedy_chunks, the wide reduction.
    batches.push(Owned::random(&mut gen, 9000, &[4, 2], &[0.0, 0.0], 0, 0.6));
    for subgroups in [true, false] {
        let v = Verifier::new(specdec::VerifierOptions {
            subgroups,
            wide_greedy_chunks: Some(1024),
            ..specdec::VerifierOptions::default()
        })
        .unwrap();
        assert_eq!(
            v.describe().contains("subgroup folds"),
            subgroups && has_subgroups,
            "{}",
            v.describe()
        );
        for (i, b) in batches.iter().enumerate() {
            let want = cpu().verify_blocking(&b.batch()).unwrap();
            assert_eq!(
                v.verify_blocking(&b.batch()).unwrap(),
                want,
                "subgroups {subgroups}, batch {i}"
            );
        }
    }
}

#[test]
fn params_as_immediates_and_as_uniform_slots_match_the_twin() {
    // `VerifierOptions::immediates` changes how each dispatch gets its window's Params
    // (immediate data set with it, or a dynamic offset into the uniform slots), never a result.
    // The batches use several windows (each its own slot) and, with top-k / top-p, cutoff
    // groups (slots after the windows'), with the block rule on some requests (block_mass and
    // block_settle): a dispatch handed another slot's Params, or none (wgpu zeroes immediate
    // data whenever the pipeline layout changes), reads the wrong rows. The default verifier
    // takes the uniform slots; asked for immediates it must take them wherever the adapter
    // offers IMMEDIATES, or this test would compare the uniform path with itself.
    let Some(g) = gpu() else { return };
    assert!(
        !g.describe().contains("Params as immediates"),
        "{}",
        g.describe()
    );
    let has_immediates = specdec::select_adapter()
        .unwrap()
        .features()
        .contains(wgpu::Features::IMMEDIATES);
    const V: u32 = 9000;
    let mut gen = Gen::new(14);
    let mut batches: Vec<Owned> = (0..3u8)
        .map(|kind| {
            Owned::random(
                &mut gen,
                V,
                &[3, 0, 5, 1, 2],
                &[0.0, 1.0, 0.7, 1.3],
                kind,
                0.6,
            )
        })
        .collect();
    for (i, b) in batches.iter_mut().enumerate() {
        for (j, r) in b.requests.iter_mut().enumerate() {
            match (i + j) % 4 {
                1 => r.params = r.params.with_top_p(0.8),
                2 => r.params = r.params.with_top_k(40),
                3 => r.params.rule = Rule::Block,
                _ => {}
            }
        }
    }
    batches.push(Owned::random(&mut gen, V, &[4, 2, 6], &[0.0, 0.0], 0, 0.6));
    for immediates in [true, false] {
        let v = Verifier::new(specdec::VerifierOptions {
            immediates,
            // Three rows per window: every batch spans several windows.
            max_binding_bytes: Some(3 * u64::from(V) * 4 + 256),
            ..specdec::VerifierOptions::default()
        })
        .unwrap();
        assert_eq!(
            v.describe().contains("Params as immediates"),
            immediates && has_immediates,
            "{}",
            v.describe()
        );
        for (i, b) in batches.iter().enumerate() {
            let want = cpu().verify_blocking(&b.batch()).unwrap();
            let got = v.verify_blocking(&b.batch()).unwrap();
            assert_matches_twin(
                &got,
                &want,
                format_args!("immediates {immediates}, batch {i}"),
            );
        }
    }
}

#[test]
fn greedy_batches_settled_in_row_stats_match_verify_and_the_twin() {
    // `VerifierOptions::fused_greedy`: all-greedy batches on the wide reduction are decided by
    // row_stats' last workgroup per request instead of verify. The batches hold every greedy
    // outcome: drafts that are the argmax and others, -1 drafts, 0-draft requests, rows with a
    // NaN, a +inf or nothing but -inf (statuses), logprobs asked by some requests, and
    // several windows (a request's workgroups in two dispatches). Both settings must give the
    // twin's outputs, and the fused one must have taken the path (a batch with a request of
    // 64 rows or more falls back to verify), over the full workgroup size and, with
    // `narrow_greedy_chunks`, over half of it.
    let Some(_) = gpu() else { return };
    const V: u32 = 9000;
    let v = V as usize;
    let mut gen = Gen::new(15);
    let mut batches = Vec::new();
    for p_argmax in [0.95, 0.5] {
        let mut b = Owned::random(&mut gen, V, &[3, 0, 5, 1, 8, 2], &[0.0], 0, p_argmax);
        b.drafts[4] = -1;
        b.requests[1].params = b.requests[1].params.with_logprobs(false);
        b.requests[4].params = b.requests[4].params.with_logprobs(false);
        batches.push(b);
    }
    // Special rows: request 0's second row has a NaN, request 2's first row a +inf, request
    // 4's fourth row nothing but -inf (rows: 0-3 request 0, 4 request 1, 5-10 request 2, 11-12
    // request 3, 13-21 request 4, 22-24 request 5).
    let mut special = Owned::random(&mut gen, V, &[3, 0, 5, 1, 8, 2], &[0.0], 0, 1.0);
    special.target[v + 17] = f32::NAN;
    special.target[5 * v + 4000] = f32::INFINITY;
    let row = 13 + 3;
    special.target[row * v..(row + 1) * v].fill(f32::NEG_INFINITY);
    special.requests[4].params = special.requests[4].params.with_logprobs(false);
    batches.push(special);
    let long = Owned::random(&mut gen, V, &[2, 70], &[0.0], 0, 0.9);
    for (fused, narrow) in [(true, false), (true, true), (false, true)] {
        for windows in [false, true] {
            let v = gpu_tuned(specdec::VerifierOptions {
                fused_greedy: fused,
                wide_greedy_chunks: Some(1 << 20),
                narrow_greedy_chunks: Some(u32::from(narrow)),
                max_binding_bytes: windows.then_some(3 * u64::from(V) * 4 + 256),
                ..specdec::VerifierOptions::default()
            });
            for (i, b) in batches.iter().enumerate() {
                let want = cpu().verify_blocking(&b.batch()).unwrap();
                let (before, narrow_before) = (v.fused_greedy_calls(), v.narrow_greedy_calls());
                let got = v.verify_blocking(&b.batch()).unwrap();
                assert_eq!(
                    v.fused_greedy_calls() - before,
                    u64::from(fused),
                    "fused {fused}, windows {windows}, batch {i}"
                );
                assert_eq!(
                    v.narrow_greedy_calls() - narrow_before,
                    u64::from(fused && narrow),
                    "fused {fused}, narrow {narrow}, windows {windows}, batch {i}"
                );
                assert_matches_twin(
                    &got,
                    &want,
                    format_args!("fused {fused}, narrow {narrow}, windows {windows}, batch {i}"),
                );
            }
            let before = v.fused_greedy_calls();
            let got = v.verify_blocking(&long.batch()).unwrap();
            assert_eq!(
                v.fused_greedy_calls(),
                before,
                "a 71-row request goes to verify"
            );
            assert_matches_twin(
                &got,
                &cpu().verify_blocking(&long.batch()).unwrap(),
                format_args!("fused {fused}, windows {windows}, long"),
            );
        }
    }
}

#[test]
fn sampled_batches_verified_in_row_stats_match_verify_and_the_twin() {
    // `VerifierOptions::fused_verify`: chain batches that sample are verified by row_stats'
    // last workgroup per request (row_stats_verify) instead of verify's dispatch. The batches
    // hold every draft kind, greedy requests beside sampled ones, top-k / top-p cut-offs, block
    // requests (one-hot: decided at once; with a draft distribution: left to block_mass and
    // block_settle), synthetic rates, -1 drafts, 0-draft requests, a request of 71 rows (more
    // than the workgroup's lanes), rows with a NaN, a +inf or nothing but -inf, logprobs asked
    // by some requests, several windows (a request's workgroups in several dispatches), and a
    // batch past 1,024 chunk partials (verify's folds in row_stats' lane arrays).
    // Both settings must give the twin's outputs, and the fused one must take the path wherever
    // the device binds its 14 storage buffers (batches with raw logprobs fall back to verify).
    let Some(_) = gpu() else { return };
    let binds_all = specdec::select_adapter()
        .unwrap()
        .limits()
        .max_storage_buffers_per_shader_stage
        >= 14;
    eprintln!("device binds 14 storage buffers: {binds_all}");
    const V: u32 = 9000;
    let v = V as usize;
    let mut gen = Gen::new(16);
    let mut batches = Vec::new();
    for kind in 0..3u8 {
        let mut b = Owned::random(
            &mut gen,
            V,
            &[3, 0, 5, 1, 8, 2, 4],
            &[1.0, 0.0, 0.7, 1.3],
            kind,
            0.6,
        );
        b.drafts[4] = -1;
        for (j, r) in b.requests.iter_mut().enumerate() {
            match j % 4 {
                1 => r.params = r.params.with_top_p(0.8),
                2 => r.params = r.params.with_top_k(40),
                3 => r.params.rule = Rule::Block,
                _ => {}
            }
            if j % 3 == 0 {
                r.params = r.params.with_logprobs(false);
            }
        }
        // Special rows: request 0's second row has a NaN, request 2's first row a +inf,
        // request 4's fourth row nothing but -inf (rows: 0-3 request 0, 4 request 1, 5-10
        // request 2, 11-12 request 3, 13-21 request 4).
        b.target[v + 17] = f32::NAN;
        b.target[5 * v + 4000] = f32::INFINITY;
        b.target[16 * v..17 * v].fill(f32::NEG_INFINITY);
        batches.push(b);
    }
    let mut synthetic = Owned::random(&mut gen, V, &[3, 2, 4], &[1.0, 0.8], 1, 0.5);
    for r in &mut synthetic.requests {
        r.params.rule = Rule::Synthetic;
    }
    synthetic.rates = Some((0..9).map(|i| [0.0, 1.0, 0.5][i % 3]).collect());
    batches.push(synthetic);
    batches.push(Owned::random(&mut gen, V, &[2, 70], &[0.9], 2, 0.9));
    // Past 1,024 chunk partials (366 rows of 3 chunks) the fused tail keeps its row-run folds
    // in row_stats' lane arrays (`SHARED_RUNS`); draft logits, so the draft softmax is folded
    // there too.
    batches.push(Owned::random(
        &mut gen,
        V,
        &[60, 60, 60, 60, 60, 60],
        &[0.9, 1.0],
        2,
        0.7,
    ));
    let mut raw = Owned::random(&mut gen, V, &[2, 3], &[1.0], 1, 0.5);
    raw.requests[0].params = raw.requests[0].params.with_logprobs(true);
    // (fused, row windows, early race): the early race beside row_stats takes the one-hot batch
    // (the first) where it is on, and binds dummies for what the fused tail writes.
    for (fused, windows, early) in [
        (true, false, false),
        (true, true, false),
        (true, false, true),
        (false, false, false),
        (false, true, true),
    ] {
        let v = gpu_tuned(specdec::VerifierOptions {
            fused_verify_chunks: Some(if fused { u32::MAX } else { 0 }),
            early_race_entries: Some(if early { u64::MAX } else { 0 }),
            max_binding_bytes: windows.then_some(3 * u64::from(V) * 4 + 256),
            ..specdec::VerifierOptions::default()
        });
        let setting = format!("fused {fused}, windows {windows}, early {early}");
        for (i, b) in batches.iter().chain([&raw]).enumerate() {
            let want = cpu().verify_blocking(&b.batch()).unwrap();
            let before = v.fused_verify_calls();
            let got = v.verify_blocking(&b.batch()).unwrap();
            let takes = fused && binds_all && i < batches.len();
            assert_eq!(
                v.fused_verify_calls() - before,
                u64::from(takes),
                "{setting}, batch {i} (the last has raw logprobs)"
            );
            assert_matches_twin(&got, &want, format_args!("{setting}, batch {i}"));
        }
        if early {
            assert!(
                v.takes_early_race(&batches[0].batch()).unwrap(),
                "{setting}: the one-hot batch races beside row_stats"
            );
        }
    }
}

#[test]
fn requests_with_more_rows_than_lanes_match_the_twin() {
    // verify's lanes take a request's rows 64 at a time, each folding its row's chunk partials
    // in order. At V = 70,000 (18 chunks) a request with 70 drafts has 71 rows, so lane 6 takes
    // two. Every row's maximum is planted in a chunk that moves from row to row, and every draft
    // is the row's argmax: a partial skipped changes a greedy token, and a partial folded twice
    // changes the logprobs (which carry each row's softmax sum).
    let Some(g) = gpu() else { return };
    let mut gen = Gen::new(11);
    const V: usize = 70_000;
    const CHUNKS: usize = V.div_ceil(4096);
    for kind in 0..3u8 {
        let mut b = Owned::random(
            &mut gen,
            V as u32,
            &[70, 3, 0, 9],
            &[0.0, 0.9, 1.0],
            kind,
            1.0,
        );
        for i in 0..=70usize {
            // Chunk i mod 18; the last chunk holds 372 entries.
            let y = (i % CHUNKS) * 4096 + 7;
            b.target[i * V + y] = 40.0;
            if i < 70 {
                b.drafts[i] = y as i32;
            }
        }
        for r in &mut b.requests {
            r.params.logprobs = true;
        }
        let want = cpu().verify_blocking(&b.batch()).unwrap();
        assert_eq!(want.num_emitted[0], 71, "every greedy draft is the argmax");
        let got = g.verify_blocking(&b.batch()).unwrap();
        assert_matches_twin(&got, &want, format_args!("kind {kind}"));
    }
}

#[test]
fn greedy_rows_of_many_partials_per_lane_match_the_twin() {
    // verify merges a greedy request's chunk partials in parallel: the 64 lanes take the
    // partials in turn, an atomic max finds each row's maximum, then the partials holding it
    // offer their index. At V = 2,200,000 (538 chunks) each lane takes many partials of a row.
    // Row 0's maximum lies only in chunk 530; row 1's maximum is tied between chunk 2 and chunk
    // 520: the lowest index wins, so the draft of the later one is rejected. A partial skipped,
    // or an index step that reads another partial than the maximum step, changes a token.
    let Some(g) = gpu() else { return };
    let mut gen = Gen::new(12);
    const V: usize = 2_200_000;
    let mut b = Owned::random(&mut gen, V as u32, &[2], &[0.0], 0, 0.0);
    let only = 530 * 4096 + 11;
    b.target[only] = 40.0;
    b.drafts[0] = only as i32;
    let (low, high) = (2 * 4096 + 5, 520 * 4096 + 9);
    b.target[V + low] = 40.0;
    b.target[V + high] = 40.0;
    b.drafts[1] = high as i32;
    let want = cpu().verify_blocking(&b.batch()).unwrap();
    assert_eq!(
        want.emitted(0),
        &[only as i32, low as i32],
        "the twin accepts the second round's maximum and rejects the later tie"
    );
    let got = g.verify_blocking(&b.batch()).unwrap();
    assert_matches_twin(&got, &want, "many partials per lane");
}

#[test]
fn greedy_batches_of_many_chunks_over_wide_workgroups_match_the_twin() {
    // From 4,096 chunks the wide greedy reduction gives each row_stats workgroup at least three
    // chunks and aims for half of `target_workgroups` (fewer, longer workgroups than it asks
    // for), with a shorter last block where a row's chunks do not divide evenly: 104 requests
    // of 5 rows of V = 32,000 (8 chunks, the last ragged) are 4,160 chunks, three workgroups a
    // row of 3, 3 and 2 chunks with the default target, two of 5 and 3 with a target of 2,048.
    // A chunk left out or reduced twice changes a token, and a workgroup miscounted leaves a
    // request unsettled (its tokens then differ from the twin's).
    let Some(_) = gpu() else { return };
    let mut gen = Gen::new(47);
    let b = Owned::random(&mut gen, 32_000, &[4; 104], &[0.0], 0, 0.7);
    let want = cpu().verify_blocking(&b.batch()).unwrap();
    assert!(
        want.num_emitted.iter().any(|&n| n > 1) && want.num_emitted.contains(&1),
        "some requests accept drafts and some reject the first"
    );
    for target_workgroups in [8192, 2048] {
        let wide = gpu_tuned(specdec::VerifierOptions {
            wide_greedy_chunks: Some(512),
            target_workgroups,
            ..Default::default()
        });
        let got = wide.verify_blocking(&b.batch()).unwrap();
        assert_matches_twin(
            &got,
            &want,
            format_args!("wide greedy reduction, 4,160 chunks, target {target_workgroups}"),
        );
    }
}

#[test]
fn small_greedy_batches_over_wide_workgroups_match_the_twin() {
    // Small all-greedy batches (up to `wide_greedy_chunks`) reduce each chunk over the
    // device's whole workgroup in row_stats, and requests with more than 128 chunk partials
    // merge them over as many lanes in verify (`SPECIAL_WIDE`): 13 rows of 38 chunks here, 342
    // partials in the first request. Each row's maximum sits at an offset of its chunk that
    // another lane and another of the lane's loads reads, every third row with a tie later in
    // the same chunk (the lowest index wins), and the drafts are those maxima, so every row is
    // decided. The second round adds a NaN row and a +inf row. A lane, a load or a partial left
    // out of either fold changes a token or a status. V = 150,001 takes the element loads and
    // a ragged last chunk, with one row's maximum on its last entry; bf16 copies of the rows
    // take the dtype-dispatching loads. The wide reductions are asked for explicitly (by
    // default they run on discrete GPUs only), and must also give the tokens of the 64-lane
    // ones.
    let Some(_) = gpu() else { return };
    let with = |chunks| {
        gpu_tuned(specdec::VerifierOptions {
            wide_greedy_chunks: Some(chunks),
            ..Default::default()
        })
    };
    let (wide, narrow) = (with(512), with(0));
    let mut gen = Gen::new(31);
    for vocab in [151_936u32, 150_001] {
        let v = vocab as usize;
        for round in 0..2 {
            let mut b = Owned::random(&mut gen, vocab, &[8, 3], &[0.0], 0, 0.0);
            let mut expected = Vec::new();
            for r in 0..13 {
                let chunk = (r * 7) % v.div_ceil(4096);
                let mut at = (chunk * 4096 + (r * 1301 + 5) % 4096).min(v - 1);
                if r == 6 {
                    at = v - 1;
                }
                b.target[r * v + at] = 50.0;
                if r % 3 == 1 {
                    let tie = (chunk * 4096 + (r * 1301 + 5 + 2600) % 4096).min(v - 1);
                    b.target[r * v + tie] = 50.0;
                    at = at.min(tie);
                }
                expected.push(at as i32);
            }
            // Rows 0..=8 are request 0's (drafts 0..8), rows 9..=12 request 1's (drafts 8..11).
            for (d, row) in (0..8).chain(9..12).enumerate() {
                b.drafts[d] = expected[row];
            }
            if round == 1 {
                b.target[3 * v + 77] = f32::NAN;
                b.target[10 * v + 4097] = f32::INFINITY;
            }
            let want = cpu().verify_blocking(&b.batch()).unwrap();
            if round == 0 {
                assert_eq!(
                    want.emitted(0),
                    &expected[0..9],
                    "every draft is the argmax"
                );
                assert_eq!(want.emitted(1), &expected[9..13]);
            } else {
                assert_eq!(
                    want.num_emitted,
                    vec![4, 2],
                    "the NaN row and the +inf row stop"
                );
            }
            // The same rows as bf16 (truncated bits; the maxima, NaN and +inf survive), which
            // a batch this small reads through the dtype-dispatching loads.
            let bits: Vec<u16> = b
                .target
                .iter()
                .map(|x| (x.to_bits() >> 16) as u16)
                .collect();
            let half = specdec::VerifyBatch {
                target_logits: specdec::Logits::Bf16(&bits),
                ..b.batch()
            };
            let want_half = cpu().verify_blocking(&half).unwrap();
            assert_eq!(want_half.tokens, want.tokens, "the planted maxima decide");
            for (name, g) in [("wide", &wide), ("64 lanes", &narrow)] {
                let got = g.verify_blocking(&b.batch()).unwrap();
                assert_matches_twin(
                    &got,
                    &want,
                    format_args!("{name}, V = {vocab}, round {round}"),
                );
                let got = g.verify_blocking(&half).unwrap();
                assert_matches_twin(
                    &got,
                    &want_half,
                    format_args!("{name}, bf16, V = {vocab}, round {round}"),
                );
            }
        }
    }
}

#[test]
fn a_reused_verifier_gives_every_request_its_residual_token() {
    // A verifier reused across shapes (its pooled workspace still holds the last call's
    // candidates, tasks and output words) and windows of three rows (a request's residual blocks
    // in one window's dispatch, the other requests' in others) must give the twin's tokens and
    // statuses every time. In the second round the target's mass sits on the last entry, so the
    // winning candidate is the last block's: a block left out of the merge changes the token.
    if gpu().is_none() {
        return;
    }
    let mut gen = Gen::new(12);
    let shapes: [(u32, &[u32]); 4] = [
        (70_000, &[3, 0, 5, 1, 2, 4]),
        (5000, &[2]),
        (70_000, &[1, 1]),
        (4097, &[0, 3, 8]),
    ];
    let windows = specdec::VerifierOptions {
        max_binding_bytes: Some(3 * 70_000 * 4 + 256),
        ..specdec::VerifierOptions::default()
    };
    for (name, opts) in [
        ("default", specdec::VerifierOptions::default()),
        ("windows", windows),
    ] {
        let v = gpu_tuned(opts);
        for round in 0..2 {
            for (vocab, ks) in shapes {
                for kind in 0..3u8 {
                    let mut b = Owned::random(&mut gen, vocab, ks, &[1.0, 0.8], kind, 0.5);
                    if round == 1 {
                        // The target's mass on the last entry: the winner sits in the last block.
                        for row in b.target.chunks_mut(vocab as usize) {
                            row[vocab as usize - 1] = 40.0;
                        }
                    }
                    let want = cpu().verify_blocking(&b.batch()).unwrap();
                    let got = v.verify_blocking(&b.batch()).unwrap();
                    assert_matches_twin(
                        &got,
                        &want,
                        format_args!("{name}, round {round}, V {vocab}, ks {ks:?}, kind {kind}"),
                    );
                }
            }
        }
    }
}

/// `o`'s rows in two new GPU buffers of `v`'s device (target, draft).
fn in_buffers(v: &Verifier, o: &Owned) -> (wgpu::Buffer, wgpu::Buffer) {
    let (device, queue) = v.device().unwrap();
    let make = |rows: &[f32]| {
        let buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("test.rows"),
            size: (rows.len().max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&buf, 0, bytemuck::cast_slice(rows));
        buf
    };
    (make(&o.target), make(&o.draft))
}

/// `o` verified by `v` in place, over its rows in `bufs` (draft probabilities).
fn verify_gpu_rows(v: &Verifier, o: &Owned, bufs: &(wgpu::Buffer, wgpu::Buffer)) -> VerifyOutput {
    let (device, queue) = v.device().unwrap();
    let batch = specdec::GpuVerifyBatch {
        vocab_size: o.vocab,
        requests: &o.requests,
        draft_token_ids: &o.drafts,
        target_logits: specdec::GpuRows::f32(&bufs.0, 0),
        draft: specdec::GpuDraft::Probs(specdec::GpuRows::f32(&bufs.1, 0)),
        draft_vocab_size: None,
        synthetic_rates: None,
    };
    let mut encoder = device.create_command_encoder(&Default::default());
    let pending = v.record(&mut encoder, &batch).unwrap();
    queue.submit([encoder.finish()]);
    v.read_blocking(pending).unwrap()
}

#[test]
fn bind_groups_over_the_callers_buffers_are_reused_for_those_buffers_only() {
    // Calls over GPU-resident rows reuse the bind groups of an earlier call that bound the same
    // ranges of the same buffers, and only those: two batches of one shape in two pairs of
    // buffers must each give their own twin's tokens (a group matched on the ranges alone
    // would read the other pair's rows), a repeated call must make no group, and a workspace
    // must keep only its last call's buffers alive, none after `forget_buffers`.
    if gpu().is_none() {
        return;
    }
    let v = gpu_tuned(specdec::VerifierOptions::default());
    let mut gen = Gen::new(41);
    let a = Owned::random(&mut gen, 6000, &[3, 1, 2], &[1.0, 0.7], 1, 0.3);
    let mut b = Owned::random(&mut gen, 6000, &[3, 1, 2], &[1.0, 0.7], 1, 0.3);
    b.requests.clone_from(&a.requests);
    b.drafts.clone_from(&a.drafts);
    let (want_a, want_b) = (
        cpu().verify_blocking(&a.batch()).unwrap(),
        cpu().verify_blocking(&b.batch()).unwrap(),
    );
    assert_ne!(
        want_a.tokens, want_b.tokens,
        "the two pairs must tell their rows apart"
    );
    let (bufs_a, bufs_b) = (in_buffers(&v, &a), in_buffers(&v, &b));
    let check = |o: &Owned, bufs, want: &VerifyOutput, what: &str| {
        assert_matches_twin(&verify_gpu_rows(&v, o, bufs), want, what);
        v.bind_group_counts()
    };
    let (first, kept) = check(&a, &bufs_a, &want_a, "first call over a");
    assert_eq!(kept, 2, "a's target and draft buffers are kept");
    let (again, _) = check(&a, &bufs_a, &want_a, "second call over a");
    assert_eq!(again, first, "a repeated call makes no bind group");
    let (other, kept) = check(&b, &bufs_b, &want_b, "b, other buffers of the same ranges");
    assert!(other > again, "other buffers get groups of their own");
    assert_eq!(kept, 2, "b's buffers replace a's");
    let (back, _) = check(&a, &bufs_a, &want_a, "a after b");
    assert!(back > other, "a's groups were let go with a's buffers");
    v.forget_buffers();
    assert_eq!(
        v.bind_group_counts().1,
        0,
        "forget_buffers lets every caller buffer go"
    );
    let (after, kept) = check(&a, &bufs_a, &want_a, "a after forget_buffers");
    assert!(after > back, "groups made again after forget_buffers");
    assert_eq!(kept, 2);
}

//! Top-k, top-p and min-p: the cut-off of every row against the sort-based reference
//! (`common::kept_reference`) on random rows with and without ties, at vocabulary sizes that
//! straddle the chunk (4095, 4096, 4097) and at 262,144, on the CPU twin and on the GPU; the tie
//! rule on explicit rows; cut tokens never emitted; greedy unaffected; bad values refused.

mod common;
use common::*;
use specdec::{
    Draft, Error, Logits, Request, SamplingParams, Verifier, VerifierOptions, VerifyBatch,
};

/// A random control setting (each of the three on or off, and their combinations).
fn random_controls(g: &mut Gen, v: usize) -> Controls {
    let ks = [0u32, 0, 1, 2, 5, 40, v as u32, v as u32 + 3];
    let ps = [1.0f32, 1.0, 0.5, 0.9, 0.99, 0.2];
    let mins = [0.0f32, 0.0, 0.01, 0.1, 0.5, 1.0];
    Controls {
        top_k: ks[g.below(ks.len())],
        top_p: ps[g.below(ps.len())],
        min_p: mins[g.below(mins.len())],
    }
}

/// A row with many ties (values on a coarse grid) or a continuous one; a few −inf entries.
fn random_row(g: &mut Gen, v: usize, ties: bool) -> Vec<f32> {
    let mut row = g.logits(v, 2.0);
    if ties {
        for x in &mut row {
            *x = (*x * 2.0).round() / 2.0;
        }
    }
    if v > 8 {
        for _ in 0..v / 50 {
            let y = g.below(v);
            row[y] = f32::NEG_INFINITY;
        }
    }
    row
}

/// Random requests with one draft each and draft logits, so both target and draft rows get
/// cut-offs. Returns the batch and each request's controls.
fn batch(seed: u64, v: usize, n: usize) -> (Owned, Vec<Controls>) {
    let mut g = Gen::new(seed);
    let temps = [0.3f32, 1.0, 2.0];
    let mut o = Owned {
        vocab: v as u32,
        requests: Vec::new(),
        drafts: Vec::new(),
        target: Vec::new(),
        draft_kind: 2,
        draft: Vec::new(),
        rates: None,
        draft_vocab: None,
    };
    let mut controls = Vec::new();
    for i in 0..n {
        let c = random_controls(&mut g, v);
        controls.push(c);
        let t = temps[i % 3];
        o.requests.push(Request {
            num_drafts: 1,
            params: c.apply(SamplingParams::seeded(t, g.u64())),
            position: i as u64,
        });
        o.drafts.push(g.below(v) as i32);
        for _ in 0..2 {
            let ties = g.unit() < 0.5;
            o.target.extend(random_row(&mut g, v, ties));
        }
        let ties = g.unit() < 0.5;
        o.draft.extend(random_row(&mut g, v, ties));
    }
    (o, controls)
}

/// How many of two equally long lists of cut-offs differ in their bits.
fn bit_differences(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// Compares every row's cut-off with the reference; returns (rows checked, ambiguous rows).
fn check_against_reference(v: &Verifier, o: &Owned, controls: &[Controls]) -> (usize, usize) {
    let cuts = v.cutoffs_blocking(&o.batch()).expect("cutoffs");
    let vocab = o.vocab as usize;
    let total_rows = o.target.len() / vocab;
    assert_eq!(cuts.len(), total_rows + o.drafts.len());
    let (mut checked, mut ambiguous) = (0, 0);
    for (r, c) in controls.iter().enumerate() {
        let t = o.requests[r].params.temperature as f64;
        // Request r owns target rows 2r, 2r + 1 and draft row r.
        let rows = [
            (&o.target[2 * r * vocab..(2 * r + 1) * vocab], cuts[2 * r]),
            (
                &o.target[(2 * r + 1) * vocab..(2 * r + 2) * vocab],
                cuts[2 * r + 1],
            ),
            (&o.draft[r * vocab..(r + 1) * vocab], cuts[total_rows + r]),
        ];
        for (which, (row, cut)) in rows.into_iter().enumerate() {
            let (kept, amb) = kept_reference(row, t, *c);
            checked += 1;
            if amb {
                ambiguous += 1;
                continue;
            }
            let got: Vec<bool> = row.iter().map(|&x| x.is_finite() && x >= cut).collect();
            if got != kept {
                let diff: Vec<usize> = (0..vocab).filter(|&y| got[y] != kept[y]).collect();
                panic!(
                    "{}: request {r} row {which} (V={vocab}, T={t}, {c:?}): cut {cut} keeps {} \
                     tokens, the reference {}; first differing entries {:?}",
                    v.describe(),
                    got.iter().filter(|&&k| k).count(),
                    kept.iter().filter(|&&k| k).count(),
                    &diff[..diff.len().min(8)]
                );
            }
        }
    }
    (checked, ambiguous)
}

fn reference_sweep(v: &Verifier, sizes: &[usize], per_size: usize, seed: u64) {
    for (i, &vocab) in sizes.iter().enumerate() {
        let (o, controls) = batch(seed + i as u64, vocab, per_size);
        let (checked, ambiguous) = check_against_reference(v, &o, &controls);
        println!(
            "{} V={vocab}: {checked} rows match the reference ({ambiguous} within rounding of a \
             threshold, not compared)",
            v.describe()
        );
        assert!(
            ambiguous * 20 <= checked,
            "too many ambiguous rows ({ambiguous} of {checked}): the test lost its teeth"
        );
    }
}

/// A GPU verifier aiming at one workgroup in all: every cutoff scan workgroup takes a whole row.
fn whole_row_scans() -> Verifier {
    gpu_tuned(VerifierOptions {
        target_workgroups: 1,
        ..VerifierOptions::default()
    })
}

const SIZES: [usize; 9] = [1, 2, 3, 7, 64, 257, 4095, 4096, 4097];

#[test]
fn cutoffs_match_the_sort_reference_cpu() {
    reference_sweep(&cpu(), &SIZES, 60, 100);
}

#[test]
fn cutoffs_match_the_sort_reference_gpu() {
    let Some(g) = gpu() else { return };
    reference_sweep(g, &SIZES, 60, 200);
}

/// The GPU's cut-offs equal the twin's bit for bit (away from rounding ties of exp).
#[test]
fn gpu_cutoffs_equal_the_twin() {
    let Some(g) = gpu() else { return };
    for (i, &vocab) in [7usize, 4097].iter().enumerate() {
        let (o, _) = batch(300 + i as u64, vocab, 60);
        let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
        let b = g.cutoffs_blocking(&o.batch()).unwrap();
        let differ = bit_differences(&a, &b);
        assert_eq!(
            differ,
            0,
            "V={vocab}: {differ} of {} cut-offs differ",
            a.len()
        );
    }
}

/// The cut-offs do not depend on how the GPU splits the rows: many small scan workgroups per
/// row (32 lanes, 256 entries each) and windows of two rows give the twin's cut-offs bit for bit.
#[test]
fn gpu_cutoffs_do_not_depend_on_the_split() {
    if gpu().is_none() {
        return;
    }
    let vocab = 4097usize;
    let split = Verifier::new(VerifierOptions {
        workgroup_size: Some(32),
        target_workgroups: 1 << 20,
        max_binding_bytes: Some(2 * vocab as u64 * 4 + 256),
        ..VerifierOptions::default()
    })
    .unwrap();
    let (o, _) = batch(400, vocab, 24);
    let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
    let b = split.cutoffs_blocking(&o.batch()).unwrap();
    let differ = bit_differences(&a, &b);
    assert_eq!(differ, 0, "{differ} of {} cut-offs differ", a.len());
}

/// The largest scan slices: with one workgroup as the target a scan workgroup takes a whole row,
/// and its top-p histogram sums up to 200,000 masses. Rows of equal logits give every entry the
/// largest mass (2^31 in fixed point), so the 64-bit sums carry into their high word again and
/// again; the cut-offs must equal the twin's bit for bit.
#[test]
fn gpu_cutoffs_with_the_largest_slices_equal_the_twin() {
    if gpu().is_none() {
        return;
    }
    let vocab = 200_000usize;
    let big = whole_row_scans();
    let (mut o, _) = batch(31, vocab, 3);
    // Request 0's target rows flat, request 1's first row flat but for one entry.
    for x in &mut o.target[..2 * vocab] {
        *x = 1.5;
    }
    for x in &mut o.target[2 * vocab..3 * vocab] {
        *x = -0.25;
    }
    o.target[2 * vocab + 7] = 3.0;
    for r in &mut o.requests {
        r.params = r.params.with_top_p(0.9);
    }
    let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
    let b = big.cutoffs_blocking(&o.batch()).unwrap();
    let differ = bit_differences(&a, &b);
    assert_eq!(
        differ,
        0,
        "{differ} of {} cut-offs differ: {a:?} vs {b:?}",
        a.len()
    );
    assert!(
        a[0].is_finite(),
        "a flat row keeps everything at its one value"
    );
}

/// A top-p cut-off decided by the smallest fixed-point masses: the scans must count every entry
/// whose mass exp((l − max) / T) · 2^31 truncates to 1 or more. Rows: one entry at 0, 1,000 at
/// −21 (mass ≈ 1.6, truncated to 1 each), the rest at −23 (mass 0). top_p = 1 − 2^-22 needs all
/// but about 512 of the 2^31 + 1,000 units, so the −21 entries must be kept: the cut-off is −21,
/// and 0 if the scans lost the entries of mass 1 (a scan skipping entries more than 18 below the
/// max fails here).
#[test]
fn a_top_p_cut_off_in_the_smallest_masses_equals_the_twin() {
    let Some(g) = gpu() else { return };
    let vocab = 5000usize;
    let (mut o, _) = batch(41, vocab, 1);
    let mut row = vec![-23.0f32; vocab];
    row[0] = 0.0;
    for x in &mut row[1..=1000] {
        *x = -21.0;
    }
    o.target = [row.clone(), row.clone()].concat();
    o.draft = row;
    o.requests[0].params = SamplingParams::seeded(1.0, 5).with_top_p(1.0 - 2f32.powi(-22));
    let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
    assert!(
        a.iter().all(|&c| c == -21.0),
        "the twin keeps the entries of mass 1: {a:?}"
    );
    let b = g.cutoffs_blocking(&o.batch()).unwrap();
    assert_eq!(bit_differences(&a, &b), 0, "{a:?} vs {b:?}");
}

/// The ways to a cut-off inside its value bin, for top-p and top-k. Rows: the max at 0, `n`
/// distinct entries packed within 0.004 around `centre` (one value bin), spread over the row, and
/// the rest at −30 (no mass); `params(n)` puts the cut-off in the middle of the pack (top_p = 0.5,
/// or top_k = 1 + n / 2). The bin's entries are gathered into the row's scratch list (n = 3,000 by
/// default); with a whole row per scan workgroup (`target_workgroups: 1`) one workgroup finds
/// more than the 1,024 it collects before adding them to the list, and adds the rest one by one;
/// with a 96 KiB binding the list holds fewer than n = 6,000, and the bin is selected from the row
/// itself. A fourth case packs 5,000 equal entries at `centre` (no rounds needed). Each cut-off
/// must equal the twin's bit for bit and lie inside the pack.
fn crowded_bin_cut_offs_equal_the_twin(centre: f32, params: impl Fn(usize) -> SamplingParams) {
    if gpu().is_none() {
        return;
    }
    let vocab = 20_000usize;
    let whole_rows = whole_row_scans();
    let short_lists = gpu_tuned(VerifierOptions {
        max_binding_bytes: Some(96 << 10),
        ..VerifierOptions::default()
    });
    let row = |n: usize, spread: f32, shift: f32| {
        let mut row = vec![-30.0f32; vocab];
        row[0] = 0.0;
        let step = (vocab - 1) / n;
        for i in 0..n {
            row[1 + i * step] = centre + shift + (i as f32 - n as f32 / 2.0) * spread;
        }
        row
    };
    let cases = [
        (3000usize, 1.0e-6f32, gpu().unwrap()),
        (3000, 1.0e-6, &whole_rows),
        (6000, 6.0e-7, &short_lists),
        (5000, 0.0, gpu().unwrap()),
    ];
    for (n, spread, v) in cases {
        let (mut o, _) = batch(53, vocab, 1);
        o.target = [row(n, spread, 0.0), row(n, spread, 0.25)].concat();
        o.draft = row(n, spread, -0.25);
        o.requests[0].params = params(n);
        let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
        for (&c, shift) in a.iter().zip([0.0f32, 0.25, -0.25]) {
            let pack = (centre + shift - 0.002, centre + shift + 0.002);
            assert!(
                c >= pack.0 && c <= pack.1,
                "n = {n}: the twin's cut-off {c} is not inside the pack {pack:?}"
            );
        }
        let b = v.cutoffs_blocking(&o.batch()).unwrap();
        assert_eq!(
            bit_differences(&a, &b),
            0,
            "n = {n}, {}: {a:?} vs {b:?}",
            v.describe()
        );
    }
}

/// Top-p's bins are 1/256 of z = (max − l) / T over the span: the packs around −2 lie inside one.
#[test]
fn top_p_cut_offs_inside_a_crowded_bin_equal_the_twin() {
    crowded_bin_cut_offs_equal_the_twin(-2.0, |_| SamplingParams::seeded(1.0, 5).with_top_p(0.5));
}

/// Top-k's bins are eighths of an octave of max − l: the packs around −2.1 (distances 2.1, 1.85
/// and 2.35) lie inside [2, 2.25), [1.75, 1.875) and [2.25, 2.5).
#[test]
fn top_k_cut_offs_inside_a_crowded_bin_equal_the_twin() {
    crowded_bin_cut_offs_equal_the_twin(-2.1, |n| {
        SamplingParams::seeded(1.0, 5).with_top_k(1 + n as u32 / 2)
    });
}

/// Top-k then top-p: where every entry from top-k's chosen bin up fits the scratch list (the
/// default and whole-row cases, and the equal entries), top-p is selected from that list; with
/// the short lists it scans the row as top-p alone does. The masses put top-p's cut-off among
/// the pack entries top-k kept (the max weighs 1, each of them e^-2.1 ≈ 0.12).
#[test]
fn top_k_then_top_p_cut_offs_inside_a_crowded_bin_equal_the_twin() {
    crowded_bin_cut_offs_equal_the_twin(-2.1, |n| {
        SamplingParams::seeded(1.0, 5)
            .with_top_k(1 + n as u32 / 2)
            .with_top_p(0.9)
    });
}

/// Top-k cut-offs in the lowest of its value bins, which holds every entry more than 2^15.75
/// below the max: a max 10^5 above N(0, 2) entries (all of them in that bin), and finite masks
/// at −f32::MAX whose distance to the max overflows to +inf, with k reaching past and into them.
#[test]
fn top_k_cut_offs_past_the_bins_equal_the_twin() {
    let Some(v) = gpu() else { return };
    let vocab = 5000usize;
    let mut g = Gen::new(61);
    let mut far_max = g.logits(vocab, 2.0);
    far_max[17] = 1.0e5;
    let mut masked = g.logits(vocab, 2.0);
    for y in (0..vocab).step_by(97) {
        masked[y] = -f32::MAX;
    }
    masked[3] = 30.0;
    for (row, k) in [
        (&far_max, 100u32),
        (&far_max, 4000),
        (&masked, 40),
        (&masked, vocab as u32 - 20),
        (&masked, vocab as u32 - 60),
    ] {
        let (mut o, _) = batch(67, vocab, 1);
        o.target = [row.clone(), row.clone()].concat();
        o.draft = row.clone();
        o.requests[0].params = SamplingParams::seeded(1.0, 5).with_top_k(k);
        let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
        // The k-th largest value, ties kept: fewer than k entries above it, at least k from it
        // up. A cut-off at the least finite value reads as −inf (nothing cut).
        let c = a[0].max(-f32::MAX);
        let above = row.iter().filter(|&&x| x > c).count();
        let kept = row.iter().filter(|&&x| x >= c).count();
        assert!(
            above < k as usize && kept >= k as usize,
            "k = {k}: the twin's cut-off {c} keeps {kept}, {above} above it"
        );
        let b = v.cutoffs_blocking(&o.batch()).unwrap();
        assert_eq!(bit_differences(&a, &b), 0, "k = {k}: {a:?} vs {b:?}");
    }
}

/// Top-k's candidates past the 2,048 keys `pick` keeps in workgroup memory: one row of 131,072
/// N(0, 2) entries in 64 slices of 2,048, where k = 200 bounds each slice's candidates at about
/// the top sixth of its entries (the 201st largest of 256 lanes' maxima of 8), so the list holds
/// some 20,000 keys and `pick` selects from the list itself; also with min-p's bound below the
/// 200th value and with top-p after top-k.
#[test]
fn top_k_cut_offs_from_a_long_candidate_list_equal_the_twin() {
    let Some(v) = gpu() else { return };
    let vocab = 131_072usize;
    let row = Gen::new(71).logits(vocab, 2.0);
    let (mut o, _) = batch(73, vocab, 1);
    o.target = [row.clone(), row.clone()].concat();
    o.draft = row.clone();
    for params in [
        SamplingParams::seeded(1.0, 5).with_top_k(200),
        SamplingParams::seeded(1.0, 5)
            .with_top_k(200)
            .with_min_p(0.02),
        SamplingParams::seeded(1.0, 5)
            .with_top_k(200)
            .with_top_p(0.9),
    ] {
        o.requests[0].params = params;
        let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
        let c = a[0];
        let kept = row.iter().filter(|&&x| x >= c).count();
        assert!(
            (1..=200).contains(&kept),
            "{params:?}: the twin's cut-off {c} keeps {kept}"
        );
        let b = v.cutoffs_blocking(&o.batch()).unwrap();
        assert_eq!(bit_differences(&a, &b), 0, "{params:?}: {a:?} vs {b:?}");
    }
}

/// Small batches whose every filtered request sets a top-k take longer slices for the candidates
/// (`candidate_slice` in src/gpu/cutoff.rs): 20 requests of V = 32,000 with 60 cut rows (target
/// and draft logits) are scanned in 5 slices of 7,424 entries per row instead of 16 of 2,048, so
/// each lane's maximum for the bound comes from the slice's first 4,096 entries only. Top-k
/// alone, with min-p and with top-p after it, at three temperatures, rows with and without
/// ties: the GPU's cut-offs must equal the twin's bit for bit, and the twin's must cut.
#[test]
fn top_k_cut_offs_from_longer_slices_equal_the_twin() {
    let Some(v) = gpu() else { return };
    let vocab = 32_000usize;
    let (mut o, _) = batch(81, vocab, 20);
    for (i, r) in o.requests.iter_mut().enumerate() {
        let p = SamplingParams::seeded([0.7f32, 1.0, 1.5][i % 3], 9 + i as u64).with_top_k(40);
        r.params = match i % 3 {
            0 => p,
            1 => p.with_min_p(0.05),
            _ => p.with_top_p(0.95),
        };
    }
    let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
    let rows = o.target.chunks(vocab).chain(o.draft.chunks(vocab));
    for (row, &c) in rows.zip(&a) {
        let kept = row.iter().filter(|&&x| x >= c).count();
        assert!(kept < vocab, "the twin's cut-off {c} keeps the whole row");
    }
    let b = v.cutoffs_blocking(&o.batch()).unwrap();
    assert_eq!(bit_differences(&a, &b), 0, "{a:?} vs {b:?}");
}

/// Min-p's bound is the least float that passes: rows holding the max and the 80 consecutive
/// floats around the threshold m + T · ln(min_p), at several T and min_p. The entries kept must
/// be exactly those x with (x − m) · (1 / T) ≥ ln(min_p) in f32 (the library's inverse
/// temperature and logarithm), the cut-off must pass while the float below it fails, and the GPU's
/// cut-offs must equal the twin's bit for bit.
#[test]
fn min_p_keeps_exactly_the_entries_that_pass_at_the_boundary() {
    let vocab = 200usize;
    let m = 3.0f32;
    for (t, min_p) in [(1.0f32, 0.1f32), (0.7, 0.05), (1.3, 0.5), (2.0, 0.01)] {
        let inv_t = 1.0f32 / t;
        let lp = f64::from(min_p).ln() as f32;
        let passes = |x: f32| (x - m) * inv_t >= lp;
        let mut row = vec![-30.0f32; vocab];
        row[0] = m;
        let mut x = m + lp * t;
        for _ in 0..40 {
            x = x.next_down();
        }
        for y in &mut row[1..=80] {
            *y = x;
            x = x.next_up();
        }
        let (mut o, _) = batch(71, vocab, 1);
        o.target = [row.clone(), row.clone()].concat();
        o.draft = row.clone();
        o.requests[0].params = SamplingParams::seeded(t, 5).with_min_p(min_p);
        let a = cpu().cutoffs_blocking(&o.batch()).unwrap();
        let c = a[0];
        assert!(
            passes(c) && !passes(c.next_down()),
            "T = {t}, min_p = {min_p}: the cut-off {c} is not the least passing value"
        );
        let kept: Vec<bool> = row.iter().map(|&x| x >= c).collect();
        let want: Vec<bool> = row.iter().map(|&x| passes(x)).collect();
        assert_eq!(kept, want, "T = {t}, min_p = {min_p}, cut-off {c}");
        assert!(
            kept[1..=80].iter().any(|&k| k) && !kept[1..=80].iter().all(|&k| k),
            "the boundary lies inside the window"
        );
        if let Some(g) = gpu() {
            let b = g.cutoffs_blocking(&o.batch()).unwrap();
            assert_eq!(bit_differences(&a, &b), 0, "T = {t}: {a:?} vs {b:?}");
        }
    }
}

#[test]
fn a_262144_vocabulary() {
    let vocab = 262_144;
    let mut g = Gen::new(7);
    let settings = [
        Controls {
            top_k: 50,
            ..Controls::OFF
        },
        Controls {
            top_p: 0.9,
            ..Controls::OFF
        },
        Controls {
            min_p: 0.05,
            ..Controls::OFF
        },
        Controls {
            top_k: 1000,
            top_p: 0.95,
            min_p: 0.01,
        },
    ];
    let mut o = Owned {
        vocab: vocab as u32,
        requests: Vec::new(),
        drafts: Vec::new(),
        target: Vec::new(),
        draft_kind: 0,
        draft: Vec::new(),
        rates: None,
        draft_vocab: None,
    };
    for (i, c) in settings.iter().enumerate() {
        o.requests.push(Request {
            num_drafts: 0,
            params: c.apply(SamplingParams::seeded(1.0, i as u64)),
            position: 0,
        });
        o.target.extend(random_row(&mut g, vocab, i % 2 == 0));
    }
    each_backend(|v| {
        let cuts = v.cutoffs_blocking(&o.batch()).unwrap();
        for (r, c) in settings.iter().enumerate() {
            let row = &o.target[r * vocab..(r + 1) * vocab];
            let (kept, amb) = kept_reference(row, 1.0, *c);
            let got: Vec<bool> = row.iter().map(|&x| x.is_finite() && x >= cuts[r]).collect();
            let (n_got, n_ref) = (
                got.iter().filter(|&&k| k).count(),
                kept.iter().filter(|&&k| k).count(),
            );
            println!("{}: {c:?} keeps {n_got} (reference {n_ref})", v.describe());
            if amb {
                // The threshold is within rounding of a group boundary: one token either way.
                assert!(n_got.abs_diff(n_ref) <= 1, "{}: {c:?}", v.describe());
            } else {
                assert!(got == kept, "{}: {c:?} keeps another set", v.describe());
            }
        }
    });
}

/// Exact oracles for the tie rule: every entry equal to the cut-off value is kept.
#[test]
fn ties_at_the_cut_off_are_kept() {
    let v = 8;
    let r = [3.0f32, 1.0, 3.0, 0.0, 3.0, -1.0, 1.0, 2.0];
    let cases: Vec<(Controls, f32)> = vec![
        // top-k = 2: the 2nd largest value is 3, held three times: all three kept.
        (
            Controls {
                top_k: 2,
                ..Controls::OFF
            },
            3.0,
        ),
        // top-k = 4: the 4th largest is 2 (3, 3, 3, 2).
        (
            Controls {
                top_k: 4,
                ..Controls::OFF
            },
            2.0,
        ),
        // top-k = 5: the 5th largest is 1, held twice: six kept.
        (
            Controls {
                top_k: 5,
                ..Controls::OFF
            },
            1.0,
        ),
        // min-p = 1: only the maxima (all three).
        (
            Controls {
                min_p: 1.0,
                ..Controls::OFF
            },
            3.0,
        ),
        // top-p tiny: the first group (three 3s) already holds it, and it is kept whole.
        (
            Controls {
                top_p: 0.01,
                ..Controls::OFF
            },
            3.0,
        ),
        // top-k larger than the row: nothing cut.
        (
            Controls {
                top_k: 100,
                ..Controls::OFF
            },
            f32::NEG_INFINITY,
        ),
    ];
    each_backend(|verifier| {
        for (c, want) in &cases {
            let o = explicit(
                v,
                &[(
                    c.apply(SamplingParams::seeded(1.0, 1)),
                    vec![],
                    vec![r.to_vec()],
                )],
            );
            let cuts = verifier.cutoffs_blocking(&o.batch()).unwrap();
            assert_eq!(cuts[0], *want, "{}: {c:?}", verifier.describe());
        }
    });
}

/// Over many seeds no request ever emits a token the controls removed, accepted or sampled, at
/// every rule (one-hot, probabilities, logits).
#[test]
fn cut_tokens_are_never_emitted() {
    each_backend(|v| {
        for kind in 0..3u8 {
            let (mut o, _) = batch(400 + u64::from(kind), 50, 200);
            o.draft_kind = kind;
            if kind == 1 {
                // Probabilities: the softmax of the logits, as the drafter would give them.
                for row in o.draft.chunks_mut(50) {
                    let p = softmax(row, 1.0);
                    for (x, y) in row.iter_mut().zip(p) {
                        *x = y as f32;
                    }
                }
            }
            let cuts = v.cutoffs_blocking(&o.batch()).unwrap();
            let out = v.verify_blocking(&o.batch()).unwrap();
            for r in 0..o.requests.len() {
                for (i, &y) in out.emitted(r).iter().enumerate() {
                    let g = 2 * r + i;
                    let l = o.target[g * 50 + y as usize];
                    assert!(
                        l >= cuts[g],
                        "{} kind {kind}: request {r} emitted cut token {y}",
                        v.describe()
                    );
                }
            }
        }
    });
}

/// Greedy requests ignore the controls (they never change the argmax) and get no cut-off pass.
#[test]
fn greedy_ignores_the_controls() {
    let (o, _) = batch(500, 33, 40);
    let mut greedy = o.clone();
    let mut plain = o.clone();
    for (a, b) in greedy.requests.iter_mut().zip(plain.requests.iter_mut()) {
        a.params.temperature = 0.0;
        *b = *a;
        b.params = SamplingParams::greedy();
    }
    each_backend(|v| {
        assert_eq!(
            v.verify_blocking(&greedy.batch()).unwrap().tokens,
            v.verify_blocking(&plain.batch()).unwrap().tokens
        );
        assert!(v.cutoffs_blocking(&greedy.batch()).unwrap().is_empty());
    });
}

#[test]
fn out_of_range_controls_are_refused() {
    let bad = [
        SamplingParams::seeded(1.0, 0).with_top_p(0.0),
        SamplingParams::seeded(1.0, 0).with_top_p(1.5),
        SamplingParams::seeded(1.0, 0).with_top_p(f32::NAN),
        SamplingParams::seeded(1.0, 0).with_min_p(-0.1),
        SamplingParams::seeded(1.0, 0).with_min_p(1.01),
        SamplingParams::seeded(1.0, 0).with_min_p(f32::NAN),
    ];
    for p in bad {
        let requests = [Request {
            num_drafts: 0,
            params: p,
            position: 0,
        }];
        let logits = [0.0f32; 4];
        let err = cpu()
            .verify_blocking(&VerifyBatch {
                vocab_size: 4,
                requests: &requests,
                draft_token_ids: &[],
                target_logits: Logits::F32(&logits),
                draft: Draft::OneHot,
                draft_vocab_size: None,
                synthetic_rates: None,
            })
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidSampling { request: 0, .. }),
            "{p:?}: {err}"
        );
        assert!(err.to_string().contains("must be in"), "{err}");
    }
}

//! Row independence of candle's CPU quantized matmul (`MatmulKernel::Candle`; the default kernel's
//! own tests are in tests/cpu_matmul.rs), which `LoadOptions::split_invariant` relies
//! on to run a verifier's `k + 1` rows in one matmul call instead of `k + 1` calls: for every
//! weight format the model batches, row `i` of an `m`-row call must be bit-identical to the
//! 1-row call of row `i`, and close to the product with the dequantized weights. Then the same
//! identity end to end on SmolLM2 (batched matmuls == one row per call), and an ignored timing
//! of both (`cargo test --release --features candle --test cpu_rows -- --ignored --nocapture`);
//! the Qwen 0.5B ones also need `examples/fetch-models.sh qwen`.
//!
//! The SmolLM2 tests need `examples/fetch-models.sh smollm2`; a missing file fails them.

mod common;

use common::{first_difference, outlier_values};
use std::sync::Arc;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use specdec::models::{
    models_dir, LoadOptions, MatmulKernel, Model, Weights, QWEN_0_5B_FILE, SMOLLM2_FILE,
};

/// Rows of a verifier call: up to 8 drafts and the bonus position.
const MAX_ROWS: usize = 9;

/// The formats the model runs with all rows in one call on this architecture (its
/// `invariant_rows`), with the most rows it puts in one call.
fn batched_formats() -> Vec<(GgmlDType, usize)> {
    let mut f = vec![
        (GgmlDType::Q4_1, usize::MAX),
        (GgmlDType::Q5_0, usize::MAX),
        (GgmlDType::Q5_1, usize::MAX),
        (GgmlDType::Q2K, usize::MAX),
        (GgmlDType::Q3K, usize::MAX),
    ];
    if cfg!(target_arch = "x86_64") {
        f.extend([
            (GgmlDType::Q4_0, usize::MAX),
            (GgmlDType::Q5K, usize::MAX),
            (GgmlDType::Q8_0, usize::MAX),
            (GgmlDType::Q4K, 31),
        ]);
    }
    f
}

/// `(k, n)` pairs: `k` a multiple of the format's block, `n` odd (the 1–3 tail columns of
/// `k_quants::matmul`) and a multiple of 16 with `k` a multiple of 256 (x86's repacked tiles).
fn shapes(dtype: GgmlDType) -> &'static [(usize, usize)] {
    if dtype.block_size() == 256 {
        &[(256, 17), (512, 33), (256, 48)]
    } else {
        &[(96, 17), (256, 33), (512, 48)]
    }
}

/// A quantized `[n, k]` weight and its dequantized values, row-major.
fn weight(dtype: GgmlDType, k: usize, n: usize, seed: u64) -> (QMatMul, Vec<f32>) {
    let dense = Tensor::from_vec(outlier_values(n * k, seed), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&dense, dtype).unwrap();
    let deq = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let w = QMatMul::from_qtensor(q).unwrap();
    assert!(
        matches!(w, QMatMul::QTensor(_)),
        "{dtype:?} was dequantized"
    );
    (w, deq)
}

/// `x · wᵀ` for the `m` rows in `x`.
fn matmul(w: &QMatMul, x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let x = Tensor::from_slice(x, (m, k), &Device::Cpu).unwrap();
    w.forward(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// Row counts tried: 1..=9 and, where the model allows more, 31 (Q4_K's cap) or 33.
fn row_counts(cap: usize) -> Vec<usize> {
    let mut r: Vec<usize> = (1..=MAX_ROWS).collect();
    r.push(cap.min(33));
    r
}

#[test]
fn every_row_of_a_batched_call_equals_its_one_row_call() {
    let mut checked = 0;
    for (dtype, cap) in batched_formats() {
        for (s, &(k, n)) in shapes(dtype).iter().enumerate() {
            let (w, _) = weight(dtype, k, n, 1 + s as u64);
            let counts = row_counts(cap);
            let most = *counts.iter().max().unwrap();
            let x = outlier_values(most * k, 100 + s as u64);
            let singles: Vec<Vec<f32>> = (0..most)
                .map(|i| matmul(&w, &x[i * k..(i + 1) * k], 1, k))
                .collect();
            for m in counts {
                let out = matmul(&w, &x[..m * k], m, k);
                for (i, single) in singles.iter().enumerate().take(m) {
                    let row = &out[i * n..(i + 1) * n];
                    if let Some((c, a, b)) = first_difference(row, single) {
                        panic!(
                            "{dtype:?} k={k} n={n}: row {i} of a {m}-row call differs from its \
                             1-row call at column {c}: {a:e} vs {b:e}"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn batched_rows_are_close_to_the_dequantized_f32_product() {
    for (dtype, _) in batched_formats() {
        for (s, &(k, n)) in shapes(dtype).iter().enumerate() {
            let (w, deq) = weight(dtype, k, n, 1 + s as u64);
            let x = outlier_values(MAX_ROWS * k, 100 + s as u64);
            let out = matmul(&w, &x, MAX_ROWS, k);
            for i in 0..MAX_ROWS {
                let xr = &x[i * k..(i + 1) * k];
                let x_max = xr.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                for c in 0..n {
                    let wr = &deq[c * k..(c + 1) * k];
                    let exact: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    // The activations are rounded to 8 bits per block (Q8_0 / Q8_1 / Q8_K):
                    // each error is at most half a step, x_max / 254, times |w|.
                    let l1: f64 = wr.iter().map(|v| v.abs() as f64).sum();
                    let tol = l1 * x_max / 200.0 + 1e-4;
                    let got = out[i * n + c] as f64;
                    assert!(
                        (got - exact).abs() <= tol,
                        "{dtype:?} k={k} n={n} row {i} col {c}: {got} vs f32 reference {exact} \
                         (tolerance {tol:e})"
                    );
                }
            }
        }
    }
}

/// Negative controls: the bitwise comparison must see a change of summation order, and each
/// format's output must follow a change of its input row, so the identity above is not
/// comparing results that could not differ.
#[test]
fn the_bitwise_comparison_rejects_a_changed_sum_or_input() {
    let (k, n) = (512, 33);
    let (_, deq) = weight(GgmlDType::Q8_0, k, n, 7);
    let x = outlier_values(k, 8);
    let forward: Vec<f32> = (0..n)
        .map(|c| (0..k).map(|j| x[j] * deq[c * k + j]).sum())
        .collect();
    let reverse: Vec<f32> = (0..n)
        .map(|c| (0..k).rev().map(|j| x[j] * deq[c * k + j]).sum())
        .collect();
    assert!(
        first_difference(&forward, &reverse).is_some(),
        "forward and reverse f32 sums of 33 dot products of length 512 agreed to the bit"
    );

    for (dtype, _) in batched_formats() {
        let (k, n) = shapes(dtype)[1];
        let (w, _) = weight(dtype, k, n, 2);
        let x = outlier_values(MAX_ROWS * k, 101);
        let single = matmul(&w, &x[..k], 1, k);
        // Row 0 with its first value moved by 1/32 of the row's largest magnitude: enough to
        // change its 8-bit code in every activation format.
        let mut moved = x.clone();
        let x_max = x[..k].iter().fold(0f32, |m, v| m.max(v.abs()));
        moved[1] += x_max / 32.0;
        let out = matmul(&w, &moved, MAX_ROWS, k);
        assert!(
            first_difference(&out[..n], &single).is_some(),
            "{dtype:?}: row 0 of a {MAX_ROWS}-row call did not change when its input did"
        );
    }
}

fn load(file: &str, options: &LoadOptions) -> Arc<Weights> {
    let path = models_dir().join(file);
    Weights::load_with(&path, options).unwrap_or_else(|e| {
        panic!(
            "cannot load {}: {e}\nfetch it with `examples/fetch-models.sh` (or point \
             SPECDEC_MODELS at the directory that holds {file})",
            path.display()
        )
    })
}

/// The two ways of running split-invariant matmuls over the same file: all rows per call where
/// the format allows (default) and one row per call (`row_by_row_matmuls`).
fn pair(file: &str, requantize_to_q8_0: bool) -> (Arc<Weights>, Arc<Weights>) {
    let batched = LoadOptions {
        requantize_to_q8_0,
        kernel: MatmulKernel::Candle,
        ..LoadOptions::default()
    };
    let row_by_row = LoadOptions {
        row_by_row_matmuls: true,
        ..batched.clone()
    };
    (load(file, &batched), load(file, &row_by_row))
}

/// A cached prefix, so the timed and compared calls are verifier calls mid-sequence.
const PREFIX: [u32; 12] = [1, 504, 3458, 282, 253, 1345, 28, 378, 8434, 30, 2114, 314];
const DRAFTS: [u32; MAX_ROWS] = [260, 1095, 282, 3458, 28, 30, 504, 314, 1345];

fn after_prefix(w: &Arc<Weights>) -> Model {
    let mut m = Model::new(w.clone());
    m.forward_last(&PREFIX, 1).unwrap();
    m
}

/// Batched and row-by-row matmuls give the same logits to the bit, and so does the whole
/// `rows`-row call against feeding its tokens one at a time.
fn assert_batched_equals_row_by_row(file: &str, q8: bool) {
    let (batched, row_by_row) = pair(file, q8);
    let (base_b, base_r) = (after_prefix(&batched), after_prefix(&row_by_row));
    let vocab = batched.config().vocab_size;
    for rows in [1, 2, 5, MAX_ROWS] {
        let a = base_b.clone().forward(&DRAFTS[..rows]).unwrap();
        let b = base_r.clone().forward(&DRAFTS[..rows]).unwrap();
        if let Some((i, x, y)) = first_difference(&a, &b) {
            panic!(
                "{file} (Q8_0: {q8}), {rows} rows: logit {i} is {x:e} batched, {y:e} row by row"
            );
        }
        let mut step = base_b.clone();
        for (r, &t) in DRAFTS[..rows].iter().enumerate() {
            let one = step.forward(&[t]).unwrap();
            if let Some((i, x, y)) = first_difference(&a[r * vocab..(r + 1) * vocab], &one) {
                panic!(
                    "{file} (Q8_0: {q8}): row {r} of a {rows}-row call differs from its 1-token \
                     call at logit {i}: {x:e} vs {y:e}"
                );
            }
        }
    }
}

#[test]
fn smollm2_batched_matmuls_give_the_row_by_row_logits() {
    assert_batched_equals_row_by_row(SMOLLM2_FILE, false);
    assert_batched_equals_row_by_row(SMOLLM2_FILE, true);
}

/// Qwen 0.5B covers the formats of a Q4_K_M file (Q4_K, Q6_K, Q5_0, Q8_0 as stored).
#[test]
#[ignore = "needs examples/fetch-models.sh qwen"]
fn qwen_0_5b_batched_matmuls_give_the_row_by_row_logits() {
    assert_batched_equals_row_by_row(QWEN_0_5B_FILE, false);
    assert_batched_equals_row_by_row(QWEN_0_5B_FILE, true);
}

/// Seconds of one `rows`-row forward after the prefix.
fn time_call(base: &Model, rows: usize) -> f64 {
    let mut m = base.clone();
    let started = Instant::now();
    m.forward(&DRAFTS[..rows]).unwrap();
    started.elapsed().as_secs_f64()
}

/// Prints the median of 5 interleaved calls per row count: split-invariant with one row per
/// matmul call, split-invariant batched, and `split_invariant` off (everything batched, the
/// floor).
fn print_call_cost_by_rows(file: &str, q8: bool) {
    let (batched, row_by_row) = pair(file, q8);
    let free = load(
        file,
        &LoadOptions {
            requantize_to_q8_0: q8,
            split_invariant: false,
            kernel: MatmulKernel::Candle,
            ..LoadOptions::default()
        },
    );
    let bases = [&row_by_row, &batched, &free].map(after_prefix);
    let format = if q8 {
        "re-quantized to Q8_0"
    } else {
        "as stored"
    };
    println!("{file} {format}: ms per call (÷ its 1-row call), median of 5 interleaved calls");
    println!("rows  invariant, row by row  invariant, batched  split_invariant off");
    let mut one = [0.0; 3];
    for rows in [1, 2, 3, 5, MAX_ROWS] {
        let mut t: [Vec<f64>; 3] = Default::default();
        // Alternate the three so a change in machine load hits all alike.
        for _ in 0..5 {
            for (times, base) in t.iter_mut().zip(&bases) {
                times.push(time_call(base, rows));
            }
        }
        let mut line = format!("{rows:>4}");
        for (w, times) in t.iter_mut().enumerate() {
            times.sort_by(f64::total_cmp);
            if rows == 1 {
                one[w] = times[2];
            }
            line += &format!("  {:>9.1} ({:>5.2}×)", times[2] * 1e3, times[2] / one[w]);
        }
        println!("{line}");
    }
}

#[test]
#[ignore = "timing; run with --ignored --nocapture"]
fn smollm2_target_call_cost_by_rows() {
    print_call_cost_by_rows(SMOLLM2_FILE, false);
    print_call_cost_by_rows(SMOLLM2_FILE, true);
}

#[test]
#[ignore = "timing; needs examples/fetch-models.sh qwen; run with --ignored --nocapture"]
fn qwen_0_5b_target_call_cost_by_rows() {
    print_call_cost_by_rows(QWEN_0_5B_FILE, false);
    print_call_cost_by_rows(QWEN_0_5B_FILE, true);
}

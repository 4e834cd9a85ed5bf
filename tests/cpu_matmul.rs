//! The CPU Q8_0 matmul behind the models' default kernel (`specdec::models::CpuQ8Matrix`): every
//! row of a multi-row call is the same bits as its 1-row call (rows 1 to 17, odd shapes, widths
//! that are not whole blocks), whatever the kernel (AVX-512 VNNI or portable) and the thread
//! count; results lie within the bound that the activations' 8-bit rounding allows of the f64
//! product with the dequantized weights (and a wrong weight block does not); repacking a Q8_0
//! matrix is lossless. In SmolLM2 (needs `examples/fetch-models.sh smollm2`): whole-prompt rows
//! equal 1-token rows to the bit, and the logits stay near candle's kernel on the stored weights.

mod common;

use common::{first_difference, outlier_values};
use specdec::models::{CpuKernel, CpuQ8Matrix, Q8Matrix, ROW_TILE, TILE_LANES};

/// `(out_features, in_features)`: a single weight, partial tiles (17, 33), partial blocks (31,
/// 33, 300) and whole ones.
const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (17, 33),
    (33, 96),
    (48, 300),
    (5, 31),
    (130, 64),
    (16, 512),
];

#[test]
fn every_row_is_the_same_bits_alone_or_with_others_on_every_kernel() {
    println!(
        "AVX-512 VNNI path on this CPU: {}",
        CpuKernel::simd_available()
    );
    let most = 2 * ROW_TILE + 1;
    for (s, &(n, k)) in SHAPES.iter().enumerate() {
        let m = CpuQ8Matrix::quantize(&outlier_values(n * k, 1 + s as u64), n, k);
        let x = outlier_values(most * k, 100 + s as u64);
        let singles: Vec<Vec<f32>> = (0..most)
            .map(|r| m.matmul_with(&x[r * k..(r + 1) * k], 1, CpuKernel::Portable))
            .collect();
        for rows in 1..=most {
            for kernel in [CpuKernel::Auto, CpuKernel::Portable] {
                let out = m.matmul_with(&x[..rows * k], rows, kernel);
                assert_eq!(out.len(), rows * n);
                for (r, single) in singles.iter().enumerate().take(rows) {
                    if let Some((c, a, b)) = first_difference(&out[r * n..(r + 1) * n], single) {
                        panic!(
                            "{n}×{k}, {kernel:?}: row {r} of a {rows}-row call differs from the \
                             portable 1-row call at column {c}: {a:e} vs {b:e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Enough work that calls go to the pool (over 16 k tile-blocks × rows: 65 × 64 × 5 here) in
    // several tasks, and a last partial tile.
    let (n, k, rows) = (64 * TILE_LANES + 3, 2048, 5);
    let m = CpuQ8Matrix::quantize(&outlier_values(n * k, 7), n, k);
    let x = outlier_values(rows * k, 8);
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| m.matmul(&x, rows))
    };
    let one = on(1);
    for threads in [2, 3] {
        assert_eq!(
            first_difference(&one, &on(threads)),
            None,
            "{threads} threads"
        );
    }
}

/// The most `|y − Σ w·x|` can be when the only rounding is the activations' (each value off by at
/// most half its block's step, `max|x| / 254`), plus f32 summation slack.
fn bound(m: &CpuQ8Matrix, x: &[f32], r: usize) -> f64 {
    let k = m.in_features();
    let (mut b, mut mag) = (0f64, 0f64);
    for (blk, xs) in x.chunks(32).enumerate() {
        let half_step = xs.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 254.0;
        for (j, &xv) in xs.iter().enumerate() {
            let w = m.get(r, blk * 32 + j).abs() as f64;
            b += w * half_step;
            mag += w * (xv.abs() as f64);
        }
    }
    assert!(k > 0);
    b * 1.0001 + mag * 1e-5
}

fn reference(m: &CpuQ8Matrix, x: &[f32], r: usize) -> f64 {
    x.iter()
        .enumerate()
        .map(|(c, &xv)| m.get(r, c) as f64 * xv as f64)
        .sum()
}

#[test]
fn results_lie_within_the_activation_rounding_bound_and_a_wrong_block_does_not() {
    let (mut checked, mut caught, mut controls) = (0, 0, 0);
    for (s, &(n, k)) in SHAPES.iter().enumerate() {
        let rows = 3;
        let m = CpuQ8Matrix::quantize(&outlier_values(n * k, 20 + s as u64), n, k);
        let x = outlier_values(rows * k, 40 + s as u64);
        let y = m.matmul(&x, rows);
        for row in 0..rows {
            let xr = &x[row * k..(row + 1) * k];
            for r in 0..n {
                let (got, want, tol) = (
                    y[row * n + r] as f64,
                    reference(&m, xr, r),
                    bound(&m, xr, r),
                );
                assert!(
                    (got - want).abs() <= tol,
                    "{n}×{k}, row {row}, feature {r}: {got} vs {want} (bound {tol:e})"
                );
                checked += 1;
                // Negative control: the first block's products counted with the wrong sign.
                let first: f64 = xr
                    .iter()
                    .take(32)
                    .enumerate()
                    .map(|(c, &xv)| m.get(r, c) as f64 * xv as f64)
                    .sum();
                if first.abs() > 0.0 {
                    controls += 1;
                    if (got - (want - 2.0 * first)).abs() > tol {
                        caught += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 500, "{checked} values checked");
    // Deterministic inputs: 654 of 750 are caught; the rest are blocks whose products nearly
    // cancel, where a sign error is within rounding.
    assert!(
        caught * 100 >= controls * 85,
        "the bound let {} of {controls} wrong-block values through",
        controls - caught
    );
}

#[test]
fn repacking_q8_0_is_lossless_and_widths_are_zero_padded() {
    let (n, k) = (37, 96);
    let q8 = Q8Matrix::quantize(&outlier_values(n * k, 3), n, k);
    let m = CpuQ8Matrix::from_q8(&q8);
    assert_eq!((m.out_features(), m.in_features()), (n, k));
    for r in 0..n {
        for c in 0..k {
            assert_eq!(m.get(r, c).to_bits(), q8.get(r, c).to_bits(), "({r}, {c})");
        }
    }
    // A width of 70 is stored as 96 with zeros: the same values as quantizing the padded rows.
    let (n, k) = (5, 70);
    let values = outlier_values(n * k, 4);
    let mut padded = vec![0f32; n * 96];
    for r in 0..n {
        padded[r * 96..r * 96 + k].copy_from_slice(&values[r * k..(r + 1) * k]);
    }
    let m = CpuQ8Matrix::quantize(&values, n, k);
    let q8 = Q8Matrix::quantize(&padded, n, 96);
    for r in 0..n {
        for c in 0..k {
            assert_eq!(m.get(r, c).to_bits(), q8.get(r, c).to_bits(), "({r}, {c})");
        }
    }
    let x = outlier_values(k, 5);
    let mut xp = vec![0f32; 96];
    xp[..k].copy_from_slice(&x);
    let wide = CpuQ8Matrix::from_q8(&q8);
    assert_eq!(
        first_difference(&m.matmul(&x, 1), &wide.matmul(&xp, 1)),
        None
    );
    // 16 rows per tile and 1.125 bytes per stored weight.
    assert_eq!(wide.bytes(), TILE_LANES * 96 * 9 / 8);
}

#[test]
#[should_panic(expected = "2 rows of 96 inputs")]
fn a_short_input_is_refused() {
    let m = CpuQ8Matrix::quantize(&outlier_values(96, 1), 1, 96);
    m.matmul(&outlier_values(100, 2), 2);
}

mod smollm2 {
    //! The kernel inside a real model (SmolLM2-135M, needs `examples/fetch-models.sh smollm2`;
    //! a missing file fails the test): `MatmulKernel::Q8Rows` named explicitly, so that these run
    //! on the portable path on a CPU without AVX-512 VNNI, where `Auto` picks candle.

    use std::sync::Arc;

    use specdec::models::{models_dir, LoadOptions, MatmulKernel, Model, Weights, SMOLLM2_FILE};

    fn load(kernel: MatmulKernel) -> Arc<Weights> {
        let path = models_dir().join(SMOLLM2_FILE);
        let options = LoadOptions {
            kernel,
            ..LoadOptions::default()
        };
        Weights::load_with(&path, &options).unwrap_or_else(|e| {
            panic!(
                "cannot load SmolLM2 from {}: {e}\nfetch it with `examples/fetch-models.sh \
                 smollm2`",
                path.display()
            )
        })
    }

    #[test]
    fn q8rows_logits_are_the_same_bits_however_rows_are_fed_and_near_candles() {
        let w = load(MatmulKernel::Q8Rows);
        let vocab = w.config().vocab_size;
        let prompt = w
            .tokenizer()
            .encode("def add(a, b):\n    return a + b\n\nprint(add(");
        assert!(prompt.len() >= 14, "{} tokens", prompt.len());
        let all = Model::new(w.clone()).forward(&prompt).unwrap();
        let mut step = Model::new(w.clone());
        for (i, &t) in prompt.iter().enumerate() {
            let row = step.forward(&[t]).unwrap();
            let want = &all[i * vocab..(i + 1) * vocab];
            let same = row
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "position {i}: the 1-token row differs from the whole-prompt row"
            );
        }
        // Near candle's kernel on the stored Q4_1 weights: both quantize activations to 8 bits;
        // Q8Rows also rounds the weights to Q8_0 (measured rms of the difference: 0.42 against a
        // logit spread of 6.3; each against the f32 product: Q8Rows 0.37, candle 0.23).
        let candle = Model::new(load(MatmulKernel::Candle))
            .forward(&prompt)
            .unwrap();
        let rms = |a: &[f32], b: &[f32]| {
            let s: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            (s / a.len() as f64).sqrt()
        };
        let mean = candle.iter().map(|&x| x as f64).sum::<f64>() / candle.len() as f64;
        let spread = (candle
            .iter()
            .map(|&x| (x as f64 - mean).powi(2))
            .sum::<f64>()
            / candle.len() as f64)
            .sqrt();
        let whole = rms(&all, &candle);
        println!("Q8Rows vs candle: rms {whole:.3} against a logit spread of {spread:.2}");
        assert!(whole <= 0.1 * spread, "rms {whole} vs spread {spread}");
        let (n, t) = (vocab, prompt.len());
        for i in 0..t {
            let row = rms(&all[i * n..(i + 1) * n], &candle[i * n..(i + 1) * n]);
            assert!(row <= 0.25 * spread, "position {i}: rms {row}");
            // Negative control: the next position's candle row is far outside the bound.
            if i + 1 < t {
                let other = rms(&all[i * n..(i + 1) * n], &candle[(i + 1) * n..(i + 2) * n]);
                assert!(
                    other > 0.25 * spread,
                    "position {i}: shifted rows within the bound"
                );
            }
        }
    }
}

//! The WGSL Philox, uniforms and Exp(1) noise equal the Rust twin (src/rng.rs). Philox words and
//! uniforms are integer / exactly-rounded work: they must match bit for bit. Exp(1) uses `ln`
//! above 2^-6, where devices may differ by an ulp or two; the largest difference is printed.

mod common;
use common::*;
use specdec::rng::{exp1_from_bits, random_words, uniform_open};

#[test]
fn gpu_rng_matches_rust_bit_for_bit() {
    let Some(v) = gpu() else { return };
    check_rng(v);
    // The portable variant (16-bit halves instead of 64-bit multiplies) gives the same bits.
    let portable = specdec::Verifier::new(specdec::VerifierOptions {
        shader_int64: false,
        ..specdec::VerifierOptions::default()
    })
    .unwrap();
    println!(
        "default: {}; portable: {}",
        v.describe(),
        portable.describe()
    );
    check_rng(&portable);
}

fn check_rng(v: &specdec::Verifier) {
    let mut g = Gen::new(77);
    let mut counters: Vec<[u32; 4]> = vec![[0; 4], [u32::MAX; 4], [1, 2, 3, 4]];
    for _ in 0..20_000 {
        let w = g.u64();
        counters.push([
            w as u32,
            (w >> 32) as u32,
            g.below(3) as u32,
            g.u64() as u32 & 0xff,
        ]);
    }
    for seed in [0u64, 42, u64::MAX, 0x243f_6a88_85a3_08d3] {
        let out = v.rng_check(seed, &counters).expect("rng_check");
        let mut max_ulps = 0i64;
        let mut series_exact = 0usize;
        for (i, c) in counters.iter().enumerate() {
            let o = &out[i * 12..(i + 1) * 12];
            let words = random_words(seed, [c[1], c[3]], c[2], c[0]);
            assert_eq!(
                &o[..4],
                &words,
                "Philox words for counter {c:?}, seed {seed:#x}"
            );
            assert_eq!(o[4], uniform_open(words[0]).to_bits(), "uniform for {c:?}");
            for j in 0..4 {
                let cpu = exp1_from_bits(words[j]);
                let gpu = f32::from_bits(o[5 + j]);
                let ulps = (cpu.to_bits() as i64 - gpu.to_bits() as i64).abs();
                max_ulps = max_ulps.max(ulps);
                if cpu < 0.015625 && ulps == 0 {
                    series_exact += 1;
                }
            }
        }
        println!("seed {seed:#x}: Exp(1) noise max difference {max_ulps} ulp; {series_exact} small-w values exact");
        assert!(max_ulps <= 4, "Exp(1) noise differs by {max_ulps} ulp");
    }
}

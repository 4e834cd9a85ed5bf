//! The counter-based random numbers of SPEC §5, the Rust twin of `shaders/common.wgsl`.
//!
//! Philox4x32-10 keyed by the request's seed, with the counter
//! `(vocab index / 4, row position low, stream, row position high)`. Word `vocab index % 4` of
//! the output belongs to that vocabulary entry. Everything here is 32-bit integer work or an f32
//! rounding that WGSL performs the same way, so the GPU and the CPU draw identical bits; only
//! `ln` may differ by an ulp between devices (SPEC §5).

/// Stream of the accept uniforms `u_i` (one per draft row, word 0 of quad 0).
pub const STREAM_ACCEPT: u32 = 0;
/// Stream of the exponential noise of a recovered (residual) token.
pub const STREAM_RESIDUAL: u32 = 1;
/// Stream of the exponential noise of a bonus token.
pub const STREAM_BONUS: u32 = 2;

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

#[inline]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let product = u64::from(a) * u64::from(b);
    ((product >> 32) as u32, product as u32)
}

/// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
/// SC'11). Returns the four output words for `counter` under `key`.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let (hi0, lo0) = mulhilo(PHILOX_M0, c[0]);
        let (hi1, lo1) = mulhilo(PHILOX_M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The absolute position of row `local_row` of a request whose first draft sits at `position`,
/// as the (low, high) counter words; wraps like the WGSL twin's 32-bit add with carry.
#[inline]
pub fn row_position(position: u64, local_row: u32) -> [u32; 2] {
    let p = position.wrapping_add(u64::from(local_row));
    [p as u32, (p >> 32) as u32]
}

/// The four random words of `quad` (vocabulary entries `4·quad .. 4·quad+3`) in `stream` at row
/// position `pos` for `seed`.
#[inline]
pub fn random_words(seed: u64, pos: [u32; 2], stream: u32, quad: u32) -> [u32; 4] {
    philox4x32_10(
        [quad, pos[0], stream, pos[1]],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// Uniform in the open interval (0, 1) from the top 23 bits: `(m + 0.5) / 2^23`, exact in f32,
/// never 0 and never 1.
#[inline]
pub fn uniform_open(bits: u32) -> f32 {
    ((bits >> 9) as f32 + 0.5) * (1.0 / 8_388_608.0)
}

/// An Exp(1) variate `e = -ln(1 - w)`, with `w = bits / 2^32` truncated to 24 significant bits.
///
/// The winners of the exponential race have small `e`, i.e. small `w`, so `w` keeps its full
/// relative precision near 0 (leading zeros are shifted out before the 24 bits are taken) and
/// `-ln(1 - w)` is its Taylor series `w + w²/2 + w³/3 + w⁴/4 + w⁵/5` below `2^-6` (relative
/// error under `w⁵/6 < 2^-32`), the series of `2·atanh(w / (2 − w))` below 0.5, and `ln` only
/// above. Same operations, same order as the WGSL twin.
#[inline]
pub fn exp1_from_bits(bits: u32) -> f32 {
    exp1_from_w(w_from_bits(bits))
}

/// `w = bits / 2^32` truncated to 24 significant bits: exact in f32, in (0, 1). Since
/// `-ln(1 − w) ≥ w`, the exponential race can skip a token whose `r / w` cannot beat the best key
/// without evaluating the log.
#[inline]
pub fn w_from_bits(bits: u32) -> f32 {
    if bits == 0 {
        return 1.164_153_2e-10; // 2^-33
    }
    // w = m · 2^(-24 - z), m in [2^23, 2^24): exponent 126 − z, mantissa m − 2^23 (exact).
    let z = bits.leading_zeros();
    let m = (bits << z) >> 8;
    f32::from_bits(((126 - z) << 23) | (m & 0x7f_ffff))
}

/// The race key of a token when nothing is subtracted from p (one-hot residuals, bonus rows,
/// tree slots without q): `z − ln e` with `z = l / T` and `e` from `w` ([`exp1_from_w`]), the
/// log of `p(y) / e_y` up to the row's log-normaliser (SPEC §3, Gumbel form). The twin of
/// `log_race_key` in `shaders/common.wgsl`; the GPU's `log` may differ by a few ulp.
#[inline]
pub fn log_race_key(z: f32, w: f32) -> f32 {
    z - exp1_from_w(w).ln()
}

/// Whether an entry with `z = l / T` and noise `w` can beat the key `bound`: `e ≥ w` bounds its
/// key by `z − ln w`, so it can win only if `w < exp(z − bound)` (`log_race_may` in the kernel),
/// padded by 1.001 against the rounding of `exp` and of the key's `ln`, so that no entry whose
/// computed key ties or beats `bound` is skipped: the race is then the argmax of the computed
/// keys whatever order the bound rose in (on the GPU, other lanes' keys as they publish them).
#[inline]
pub fn log_race_may(z: f32, w: f32, bound: f32) -> bool {
    w < (z - bound).exp() * 1.001
}

/// `-ln(1 − w)` for a `w` from [`w_from_bits`] (see [`exp1_from_bits`]).
#[inline]
pub fn exp1_from_w(w: f32) -> f32 {
    if w < 0.015_625 {
        w * (1.0 + w * (0.5 + w * (0.333_333_34 + w * (0.25 + w * 0.2))))
    } else if w < 0.5 {
        // -ln(1 - w) = 2·atanh(z), z = w / (2 - w) ≤ 1/3: odd series to z^15 (4e-9 relative).
        // GPU `log` is accurate only to an absolute 2^-21 near 1, so neither side uses it here.
        let z = w / (2.0 - w);
        let z2 = z * z;
        2.0 * z
            * (1.0
                + z2 * (0.333_333_34
                    + z2 * (0.2
                        + z2 * (0.142_857_15
                            + z2 * (0.111_111_11
                                + z2 * (0.090_909_09 + z2 * (0.076_923_08 + z2 * 0.066_666_67)))))))
    } else {
        // 1 - w is exact (w ≥ 0.5 has 24 significant bits); ln is a few ulp away from 1.
        -(1.0 - w).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry whose computed key equals the bound (a tie, which the lower index wins) passes
    /// `log_race_may`, for noise words across the whole range and logits from −20 to 20; the
    /// test without its padding (a negative control) skips some of them: where `e` is within
    /// rounding of `w`, `exp(z − key)` rounds to `w` or below.
    #[test]
    fn the_log_race_test_passes_every_entry_that_ties_its_bound() {
        let unpadded = |z: f32, w: f32, bound: f32| w < (z - bound).exp();
        let (mut checked, mut unpadded_skips) = (0, 0);
        for i in 0..4000u32 {
            let bits = i.wrapping_mul(2_654_435_761) >> (i % 32);
            let w = w_from_bits(bits);
            for j in 0..40 {
                let z = -20.0 + j as f32 + (i % 97) as f32 / 97.0;
                let key = log_race_key(z, w);
                assert!(log_race_may(z, w, key), "w {w:e}, z {z}: a tie skipped");
                checked += 1;
                unpadded_skips += usize::from(!unpadded(z, w, key));
            }
        }
        println!("{unpadded_skips} of {checked} ties skipped without the padding");
        assert!(unpadded_skips > 0, "the negative control skipped no tie");
    }

    /// Known-answer vectors published with Random123 (kat_vectors, philox4x32_10).
    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn uniform_is_open_interval() {
        assert!(uniform_open(0) > 0.0);
        assert!(uniform_open(u32::MAX) < 1.0);
        assert_eq!(uniform_open(0), 0.5 / 8_388_608.0);
    }

    #[test]
    fn exp1_is_positive_finite_and_monotone() {
        let mut prev = 0.0f32;
        for bits in [
            0u32,
            1,
            2,
            255,
            256,
            1 << 20,
            1 << 25,
            1 << 26,
            1 << 31,
            u32::MAX - 1,
            u32::MAX,
        ] {
            let e = exp1_from_bits(bits);
            assert!(e.is_finite() && e > 0.0, "bits {bits:#x} gave {e}");
            assert!(e >= prev, "not monotone at {bits:#x}: {e} < {prev}");
            prev = e;
        }
        // Small w: e ≈ w to full precision.
        let w = 1.0f64 / 4_294_967_296.0;
        assert!(((exp1_from_bits(1) as f64) - w).abs() / w < 1e-6);
        // Continuity across the series / log switch at w = 2^-6 (bits = 2^26).
        let below = exp1_from_bits((1 << 26) - 1) as f64;
        let above = exp1_from_bits(1 << 26) as f64;
        assert!((above - below).abs() < 1e-6, "{below} vs {above}");
        // ... and across the atanh series / ln switch at w = 0.5 (bits = 2^31), against f64.
        for bits in [(1u32 << 31) - 512, 1 << 31, 0x2000_0000, 0x0500_0000] {
            let w = ((bits >> 8) as f64) / 16_777_216.0;
            let exact = -(1.0 - w).ln();
            let got = exp1_from_bits(bits) as f64;
            assert!(
                (got - exact).abs() / exact < 4e-7,
                "bits {bits:#x}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn exp1_mean_is_one() {
        // E[e] = 1 for Exp(1); 200k draws give a standard error of 0.0022.
        let n = 200_000u32;
        let mut sum = 0.0f64;
        for i in 0..n {
            sum += exp1_from_bits(random_words(7, [i, 0], STREAM_BONUS, 0)[0]) as f64;
        }
        let mean = sum / n as f64;
        assert!(
            (mean - 1.0).abs() < 6.0 * (1.0 / n as f64).sqrt(),
            "mean {mean}"
        );
    }
}

//! CPU twin of `shaders/cutoff.wgsl`: the logit cut-off of a row under top-k / top-p / min-p,
//! by radix select over order-preserving keys with the kernel's integer sums, so it gives the
//! GPU's cut-off (the masses differ only where the two `exp`s differ by an ulp). For top-k and
//! top-p the kernel first narrows the search to one bin of values (or, for top-p after top-k, to
//! top-k's gathered entries) and selects within it; the key it finds is by definition the one
//! found here (the largest whose upper set weighs the target), so the twin keeps the plain four
//! rounds over the row. Min-p's bound is the kernel's bisection over the keys.

use crate::layout::ReqInfo;

/// Smallest key of a finite value; −inf maps just below it.
const KEY_MIN_FINITE: u32 = 0x0080_0000;
/// Key of +inf.
const KEY_POS_INF: u32 = 0xff80_0000;
/// exp((l − max) / T) in 2^-31 fixed point: the max entry weighs 2^31.
const MASS_SCALE: f32 = 2_147_483_648.0;

/// Order-preserving key of a non-NaN float (−0 maps to +0's key).
pub fn key_of(x: f32) -> u32 {
    let mut b = x.to_bits();
    if b == 0x8000_0000 {
        b = 0;
    }
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The float of a key.
pub fn value_of(k: u32) -> f32 {
    if k & 0x8000_0000 != 0 {
        f32::from_bits(k & 0x7fff_ffff)
    } else {
        f32::from_bits(!k)
    }
}

/// Fixed-point mass of one entry.
#[inline]
fn mass(x: f32, m: f32, inv_t: f32) -> u64 {
    // `as u32` truncates toward zero like WGSL's u32(); the value is in [0, 2^31].
    u64::from((((x - m) * inv_t).exp() * MASS_SCALE) as u32)
}

/// The radix select of the kernel: the largest key `K ≥ kbase` whose upper set weighs at least
/// the target; `kbase` when count mode needs no cut.
fn radix_select(
    row: &[f32],
    kbase: u32,
    top_k: Option<u32>,
    top_p: f32,
    m: f32,
    inv_t: f32,
) -> u32 {
    let mass_mode = top_k.is_none();
    let mut prefix = 0u32;
    let mut need = 0u64;
    for round in 0..4u32 {
        let mut hist = [0u64; 256];
        let shift = 24 - 8 * round;
        for &x in row {
            if x.is_nan() {
                continue;
            }
            let kx = key_of(x);
            if kx < kbase || (round > 0 && kx >> (32 - 8 * round) != prefix) {
                continue;
            }
            let digit = ((kx >> shift) & 255) as usize;
            hist[digit] += if mass_mode { mass(x, m, inv_t) } else { 1 };
        }
        if round == 0 {
            let total: u64 = hist.iter().sum();
            if let Some(k) = top_k {
                if total <= u64::from(k) {
                    return kbase;
                }
                need = u64::from(k);
            } else {
                // The kernel forms the target in f32 from the 64-bit total as hi·2^32 + lo.
                let total_f =
                    ((total >> 32) as u32) as f32 * 4_294_967_296.0 + (total as u32) as f32;
                need = ((top_p * total_f).ceil() as u64).min(total);
            }
        }
        let mut acc = 0u64;
        let mut digit = 0u32;
        for b in (0..256u32).rev() {
            digit = b;
            if acc + hist[b as usize] >= need {
                break;
            }
            acc += hist[b as usize];
        }
        need -= acc;
        prefix = (prefix << 8) | digit;
    }
    prefix
}

/// Min-p's bound for a row of finite max key `max_key`: the least finite key whose value `v`
/// passes `(v − m) / T ≥ ln(min_p)`, by the kernel's bisection over the keys. The test is
/// monotone in `v`, so the entries at or above the bound are exactly those that pass; the row
/// is not read.
fn min_p_bound(max_key: u32, inv_t: f32, log_min_p: f32) -> u32 {
    let m = value_of(max_key);
    let (mut lo, mut hi) = (KEY_MIN_FINITE, max_key);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if (value_of(mid) - m) * inv_t >= log_min_p {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// The cut-off of `row` for request `info` (−inf: nothing cut). Entries `< cut` are masked.
pub fn row_cutoff(row: &[f32], info: &ReqInfo) -> f32 {
    let inv_t = info.inv_temperature;
    let max_key = row
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| key_of(x))
        .max()
        .unwrap_or(0);
    if !(KEY_MIN_FINITE..KEY_POS_INF).contains(&max_key) {
        return f32::NEG_INFINITY;
    }
    let m = value_of(max_key);
    let mut kbase = KEY_MIN_FINITE;
    if info.log_min_p != f32::NEG_INFINITY {
        kbase = min_p_bound(max_key, inv_t, info.log_min_p);
    }
    if info.top_k != 0 {
        kbase = radix_select(row, kbase, Some(info.top_k), 1.0, m, inv_t);
    }
    if info.top_p < 1.0 {
        kbase = radix_select(row, kbase, None, info.top_p, m, inv_t);
    }
    if kbase == KEY_MIN_FINITE {
        f32::NEG_INFINITY
    } else {
        value_of(kbase)
    }
}

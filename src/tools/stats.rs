//! Exact statistical goodness-of-fit tools for testing the sampler.
//!
//! The tests of a speculative-decoding sampler are statistical: we draw many
//! tokens and check that their empirical distribution matches the target
//! distribution. Such a test is only as good as its acceptance threshold, and
//! the usual shortcuts for the χ² threshold are wrong in both directions:
//!
//! * Rules of thumb such as `df + 10·sqrt(2·df)` are **flaky at small df**:
//!   the χ² distribution is strongly right-skewed there, so for `df = 1` that
//!   rule gives 15.1, which a correct sampler exceeds with probability about
//!   1e-4 — a test suite with many such checks will fail spuriously.
//! * The same rule is **toothless at large df**: for `df = 100_000` it accepts
//!   statistics up to 104 472, while the exact 1e-12 upper quantile is
//!   103 178, so it lets through biases that an exact test at a far stricter
//!   false-alarm rate would catch.
//!
//! This module therefore computes the *exact* quantile of the χ² distribution
//! (to ~1e-12 relative) from an accurate regularized incomplete gamma
//! function, and the tests choose a false-alarm rate `alpha` explicitly.
//!
//! Every statistical test built on these tools must carry a **negative
//! control**: a deliberately wrong sampler or distribution, run through the
//! same check with the same sample size, that the check must reject. A test
//! that cannot fail proves nothing; the negative control demonstrates that the
//! chosen sample size and threshold actually have power against the kind of
//! bug the test is meant to catch.
//!
//! Everything here is written from the underlying mathematics using `std`
//! only. The numerics are explained next to each function.

use std::fmt;

/// `ln(sqrt(2π))`.
const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// Arguments at or above this value use the Stirling series directly; smaller
/// arguments are shifted up to it with the recurrence `Γ(a+1) = a·Γ(a)`.
const STIRLING_MIN: f64 = 10.0;

/// Remainder of Stirling's series:
/// `ln Γ(a) - [(a - 1/2)·ln a - a + ln sqrt(2π)]`, for `a >= STIRLING_MIN`.
///
/// The coefficients are `B_{2k} / (2k (2k-1))` with Bernoulli numbers
/// `B_{2k}`. With eight terms the first omitted term at `a = 10` is about
/// `3e-17`, i.e. below the rounding error of the result.
fn stirling_correction(a: f64) -> f64 {
    const COEFFS: [f64; 8] = [
        1.0 / 12.0,
        -1.0 / 360.0,
        1.0 / 1260.0,
        -1.0 / 1680.0,
        1.0 / 1188.0,
        -691.0 / 360_360.0,
        1.0 / 156.0,
        -3617.0 / 122_400.0,
    ];
    let inv = 1.0 / a;
    let inv2 = inv * inv;
    // Horner evaluation in 1/a² of sum_k COEFFS[k] / a^(2k+1).
    let mut acc = 0.0;
    for &c in COEFFS.iter().rev() {
        acc = acc * inv2 + c;
    }
    acc * inv
}

/// Natural logarithm of the gamma function, `ln Γ(a)`, for `a > 0`.
///
/// Uses Stirling's asymptotic series with eight correction terms for
/// `a >= 10` and the recurrence `ln Γ(a) = ln Γ(a + n) - ln(a (a+1) ⋯ (a+n-1))`
/// below that. The absolute error is a few units of `1e-15` times
/// `max(1, |ln Γ(a)|)` (the shift costs about `|ln Γ(a + n)|·eps`, i.e. up to
/// ~3e-15 for small `a`); absolute (not relative) error is what matters when
/// the result is exponentiated, as it is everywhere in this module.
///
/// # Panics
/// If `a` is not a finite positive number.
pub fn ln_gamma(a: f64) -> f64 {
    assert!(
        a.is_finite() && a > 0.0,
        "ln_gamma: argument must be finite and > 0, got {a}"
    );
    if a >= STIRLING_MIN {
        return (a - 0.5) * a.ln() - a + LN_SQRT_2PI + stirling_correction(a);
    }
    // Shift up: at most 10 factors, each below 20, so the product cannot
    // overflow, and one logarithm of the product costs a single rounding.
    let mut shifted = a;
    let mut product = 1.0;
    while shifted < STIRLING_MIN {
        product *= shifted;
        shifted += 1.0;
    }
    ln_gamma(shifted) - product.ln()
}

/// `ln(1 + t) - t`, accurate to a few ulps also when `|t|` is small (where the
/// naive formula cancels catastrophically).
///
/// For `t` in `[-0.5, 1]` we use `ln(1 + t) = 2·atanh(y)` with
/// `y = t / (2 + t)`, `|y| <= 1/3`:
/// `ln(1 + t) - t = -t²/(2 + t) + 2·(y³/3 + y⁵/5 + …)`, where both parts are
/// computed without cancellation and the series converges like `9^-k`.
/// Outside that interval the direct formula loses at most a couple of bits.
fn ln_1p_minus_x(t: f64) -> f64 {
    if !(-0.5..=1.0).contains(&t) {
        return t.ln_1p() - t;
    }
    let y = t / (2.0 + t);
    let y2 = y * y;
    let mut power = y * y2; // y^(2k+1), starting at k = 1
    let mut series = 0.0;
    let mut k = 1.0_f64;
    loop {
        let term = power / (2.0 * k + 1.0);
        series += term;
        if term.abs() <= series.abs() * 1e-17 {
            break;
        }
        power *= y2;
        k += 1.0;
    }
    -t * t / (2.0 + t) + 2.0 * series
}

/// `ln(x^a · e^-x / Γ(a))` for `a > 0`, `x > 0`: the common prefactor of both
/// the series and the continued fraction for the incomplete gamma function.
///
/// For large `a` the three terms `a·ln x`, `x` and `ln Γ(a)` are each of order
/// `a·ln a` (about 1e6 for `a = 1e5`) and nearly cancel, so evaluating them
/// separately would leave an absolute error of ~1e-10 in the exponent, i.e. a
/// 1e-10 relative error in the result. Instead we insert Stirling's formula
/// analytically:
/// `a·ln x - x - ln Γ(a) = a·(ln(x/a) - (x/a - 1)) + ln(a)/2 - ln sqrt(2π) - corr(a)`
/// and evaluate `ln(1+t) - t` with `t = (x - a)/a` by [`ln_1p_minus_x`].
/// Every remaining term is then of the size of the result itself.
fn ln_gamma_prefactor(a: f64, x: f64) -> f64 {
    if a < STIRLING_MIN {
        // All terms are moderate here (a < 10), so the direct formula is fine:
        // the absolute error is ~eps·max(x, 1), and once x exceeds ~750 the
        // result underflows anyway.
        return a * x.ln() - x - ln_gamma(a);
    }
    let r = x / a;
    let core = if (0.5..=2.0).contains(&r) {
        // x - a is exact here (Sterbenz), so t carries a single rounding.
        a * ln_1p_minus_x((x - a) / a)
    } else {
        a * r.ln() - (x - a)
    };
    core + 0.5 * a.ln() - LN_SQRT_2PI - stirling_correction(a)
}

/// Maximum number of series terms or continued-fraction steps. Both need
/// `O(sqrt(a))` steps in the worst case (x close to a), i.e. a few thousand at
/// `a = 1e5`; this cap is only a guard against an infinite loop.
const MAX_ITERATIONS: usize = 1_000_000;

/// Lower regularized gamma by its power series, valid for all x but used for
/// `x < a + 1`, where the terms decrease from the start:
/// `P(a, x) = x^a e^-x / Γ(a) · Σ_{n>=0} x^n / (a (a+1) ⋯ (a+n))`.
/// All terms are positive, so the sum has no cancellation.
fn gamma_p_series(a: f64, x: f64) -> f64 {
    let mut term = 1.0 / a;
    let mut sum = term;
    let mut denom = a;
    for _ in 0..MAX_ITERATIONS {
        denom += 1.0;
        term *= x / denom;
        sum += term;
        if term <= sum * f64::EPSILON * 0.25 {
            return sum * ln_gamma_prefactor(a, x).exp();
        }
    }
    panic!("regularized gamma series did not converge for a = {a}, x = {x}");
}

/// Upper regularized gamma by its continued fraction, used for `x >= a + 1`:
///
/// `Q(a, x) = x^a e^-x / Γ(a) · 1/(x+1-a - 1·(1-a)/(x+3-a - 2·(2-a)/(x+5-a - …)))`
///
/// (the even contraction of Legendre's fraction). For `x >= a + 1` it
/// converges quickly, while the series would need many terms and, for `P`
/// close to 1, `Q = 1 - P` would lose all relative accuracy in the tail that
/// the χ² quantiles live in. It is evaluated forwards with the modified Lentz
/// algorithm, which tracks the ratios `C_n = A_n/A_{n-1}` and
/// `D_n = B_{n-1}/B_n` of successive numerators and denominators instead of the
/// (overflowing) convergents themselves, replacing an exact zero by a tiny
/// number so that no division by zero can occur.
fn gamma_q_continued_fraction(a: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / TINY;
    let mut d = 1.0 / b;
    let mut h = d;
    for n in 1..MAX_ITERATIONS {
        let n = n as f64;
        let an = -n * (n - a);
        b += 2.0;
        d = an * d + b;
        if d.abs() < TINY {
            d = TINY;
        }
        c = b + an / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let delta = d * c;
        h *= delta;
        if (delta - 1.0).abs() <= f64::EPSILON {
            return h * ln_gamma_prefactor(a, x).exp();
        }
    }
    panic!("regularized gamma continued fraction did not converge for a = {a}, x = {x}");
}

fn check_gamma_args(name: &str, a: f64, x: f64) {
    assert!(
        a.is_finite() && a > 0.0,
        "{name}: shape a must be finite and > 0, got {a}"
    );
    assert!(
        !x.is_nan() && x >= 0.0,
        "{name}: x must be >= 0 (and not NaN), got {x}"
    );
}

/// Lower regularized incomplete gamma function
/// `P(a, x) = γ(a, x) / Γ(a) = 1/Γ(a) ∫_0^x t^(a-1) e^-t dt`.
///
/// Accurate to about 1e-13 relative for `a` in `[0.5, 1e5]`, `x` in `[0, 1e6]`.
/// For `x < a + 1` the power series is summed (all terms positive, so `P` —
/// the smaller of the two tails there — is obtained to full relative
/// accuracy); otherwise `P = 1 - Q` with `Q` from the continued fraction, and
/// since then `P` is not small this subtraction is harmless.
///
/// # Panics
/// If `a` is not finite and positive, or `x` is negative or NaN.
pub fn regularized_gamma_p(a: f64, x: f64) -> f64 {
    check_gamma_args("regularized_gamma_p", a, x);
    if x == 0.0 {
        0.0
    } else if x == f64::INFINITY {
        1.0
    } else if x < a + 1.0 {
        gamma_p_series(a, x)
    } else {
        1.0 - gamma_q_continued_fraction(a, x)
    }
}

/// Upper regularized incomplete gamma function `Q(a, x) = 1 - P(a, x)
/// = Γ(a, x) / Γ(a)`.
///
/// Accurate to about 1e-13 relative for `a` in `[0.5, 1e5]`, `x` in `[0, 1e6]`,
/// including deep in the upper tail (down to the underflow threshold), because
/// for `x >= a + 1` it is computed directly by a continued fraction rather than
/// as `1 - P`. For `x < a + 1`, `Q` is not small and `1 - P` is accurate.
///
/// # Panics
/// If `a` is not finite and positive, or `x` is negative or NaN.
pub fn regularized_gamma_q(a: f64, x: f64) -> f64 {
    check_gamma_args("regularized_gamma_q", a, x);
    if x == 0.0 {
        1.0
    } else if x == f64::INFINITY {
        0.0
    } else if x < a + 1.0 {
        1.0 - gamma_p_series(a, x)
    } else {
        gamma_q_continued_fraction(a, x)
    }
}

/// Complementary error function `erfc(x) = 2/sqrt(π) ∫_x^∞ e^(-t²) dt`.
///
/// Computed through the identity `erfc(x) = Q(1/2, x²)` for `x >= 0` (and
/// `erfc(x) = 1 + P(1/2, x²)` for `x < 0`), so it inherits the accuracy of
/// [`regularized_gamma_q`]: full relative accuracy in the upper tail apart
/// from the rounding of `x²`, which contributes a relative error of about
/// `x²·1.1e-16` (1.5e-13 at `x = 26`, where `erfc` is 6e-296).
///
/// # Panics
/// If `x` is NaN.
pub fn erfc(x: f64) -> f64 {
    assert!(!x.is_nan(), "erfc: argument is NaN");
    if x >= 0.0 {
        regularized_gamma_q(0.5, x * x)
    } else {
        1.0 + regularized_gamma_p(0.5, x * x)
    }
}

/// Quantile (inverse CDF) of the standard normal distribution: the `z` with
/// `Φ(z) = p`.
///
/// Starts from P. J. Acklam's rational approximation (relative error below
/// 1.2e-9) and applies one Halley step using the accurate [`erfc`]; Halley's
/// method triples the number of correct digits, so the result is as accurate
/// as `Φ` itself: about 5e-15 relative (checked against 40-digit references
/// for `p` from 1e-298 to 0.5). For `p > 0.5` the symmetry
/// `z(p) = -z(1 - p)` is used; `1 - p` is exact for `p >= 0.5`.
///
/// Typical use: `normal_quantile(1.0 - alpha / 2.0)` gives the two-sided
/// critical value, and `normal_quantile(1e-9) ≈ -6.0` shows that a
/// "6 standard errors" check has a two-sided false-alarm rate of ~2e-9.
///
/// Returns `-∞` for `p == 0` and `+∞` for `p == 1`.
///
/// # Panics
/// If `p` is NaN or outside `[0, 1]`.
pub fn normal_quantile(p: f64) -> f64 {
    assert!(
        (0.0..=1.0).contains(&p),
        "normal_quantile: p must be in [0, 1], got {p}"
    );
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    if p > 0.5 {
        return -normal_quantile(1.0 - p);
    }
    if p == 0.5 {
        return 0.0;
    }
    // From here on 0 < p < 0.5 and the result is negative.
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const P_LOW: f64 = 0.02425;

    let z0 = if p < P_LOW {
        // Tail region: rational function of sqrt(-2 ln p).
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else {
        // Central region: rational function of (p - 1/2).
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    };

    // One Halley step on f(z) = Φ(z) - p. With e = Φ(z0) - p and
    // u = e / φ(z0) = e·sqrt(2π)·exp(z0²/2), the step is z0 - u / (1 + z0·u/2).
    // For z0 <= 0, Φ(z0) = erfc(-z0/√2)/2 = Q(1/2, z0²/2)/2; using the gamma
    // form directly avoids the rounding of the division by √2.
    let cdf = 0.5 * regularized_gamma_q(0.5, 0.5 * z0 * z0);
    let e = cdf - p;
    if e == 0.0 {
        return z0;
    }
    // Assemble u in log space so that exp(z0²/2) cannot overflow for
    // subnormal p (z0 ≈ -38.5).
    let u = e.signum() * (e.abs().ln() + LN_SQRT_2PI + 0.5 * z0 * z0).exp();
    let z = z0 - u / (1.0 + 0.5 * z0 * u);
    if z.is_finite() {
        z
    } else {
        z0
    }
}

fn check_df(name: &str, df: f64) {
    assert!(
        df.is_finite() && df > 0.0,
        "{name}: degrees of freedom must be finite and > 0, got {df}"
    );
}

/// Survival function (upper tail) of the χ² distribution with `df` degrees of
/// freedom: `P[X > x] = Q(df/2, x/2)`. Accurate to ~1e-13 relative, also deep
/// in the tail. Returns 1 for `x <= 0`.
///
/// # Panics
/// If `df` is not finite and positive, or `x` is NaN.
pub fn chi_square_sf(x: f64, df: f64) -> f64 {
    check_df("chi_square_sf", df);
    assert!(!x.is_nan(), "chi_square_sf: x is NaN");
    if x <= 0.0 {
        return 1.0;
    }
    regularized_gamma_q(0.5 * df, 0.5 * x)
}

/// Cumulative distribution function of the χ² distribution:
/// `P[X <= x] = P(df/2, x/2)`. Returns 0 for `x <= 0`.
///
/// # Panics
/// If `df` is not finite and positive, or `x` is NaN.
pub fn chi_square_cdf(x: f64, df: f64) -> f64 {
    check_df("chi_square_cdf", df);
    assert!(!x.is_nan(), "chi_square_cdf: x is NaN");
    if x <= 0.0 {
        return 0.0;
    }
    regularized_gamma_p(0.5 * df, 0.5 * x)
}

/// The **exact** upper-tail quantile of the χ² distribution: the `x` with
/// `chi_square_sf(x, df) == upper_tail_alpha`, to a relative accuracy of
/// about 1e-12 (limited only by the accuracy of the incomplete gamma
/// function).
///
/// This is *not* the `df + 10·sqrt(2·df)` rule of thumb, nor the
/// Wilson–Hilferty approximation (which is only used as the starting point);
/// see the module documentation for why approximate thresholds make tests
/// flaky at small `df` and toothless at large `df`. Works for `alpha` down to
/// 1e-12 and below, and `df` from 1 to 1e5 and beyond.
///
/// Method: the equation is solved in log space, `ln Q(df/2, x/2) = ln alpha`
/// (or `ln P(df/2, x/2) = ln(1 - alpha)` for `alpha > 1/2`, so that the tail
/// being matched is always the small one). In log space the upper tail is
/// nearly linear in `x`, so Newton's method converges in a handful of steps
/// even for `alpha = 1e-12`. The root is first bracketed by expanding from the
/// Wilson–Hilferty guess, and every Newton step that would leave the bracket
/// is replaced by bisection, so convergence is guaranteed.
///
/// Returns `+∞` for `alpha == 0` and `0` for `alpha == 1`.
///
/// # Panics
/// If `upper_tail_alpha` is outside `[0, 1]` or NaN, or `df` is not finite and
/// positive.
pub fn chi_square_quantile(upper_tail_alpha: f64, df: f64) -> f64 {
    let alpha = upper_tail_alpha;
    assert!(
        (0.0..=1.0).contains(&alpha),
        "chi_square_quantile: alpha must be in [0, 1], got {alpha}"
    );
    check_df("chi_square_quantile", df);
    if alpha == 0.0 {
        return f64::INFINITY;
    }
    if alpha == 1.0 {
        return 0.0;
    }
    let a = 0.5 * df;
    let upper = alpha <= 0.5;
    // ln of the tail probability we must match; 1 - alpha is exact for
    // alpha >= 1/2.
    let ln_target = if upper {
        alpha.ln()
    } else {
        (1.0 - alpha).ln()
    };

    // g(x) = ln target - ln tail(x) for the lower tail, ln tail(x) - ln target
    // for the upper tail: in both cases strictly decreasing in x, +∞ at 0.
    // Also returns g'(x), using d/dx tail = ∓ pdf(x) with
    // pdf(x) = exp(ln_gamma_prefactor(df/2, x/2)) / x, assembled in log space.
    let eval = |x: f64| -> (f64, f64) {
        let h = 0.5 * x;
        if upper {
            let ln_q = regularized_gamma_q(a, h).ln();
            let slope = -(ln_gamma_prefactor(a, h) - ln_q).exp() / x;
            (ln_q - ln_target, slope)
        } else {
            let ln_p = regularized_gamma_p(a, h).ln();
            let slope = -(ln_gamma_prefactor(a, h) - ln_p).exp() / x;
            (ln_target - ln_p, slope)
        }
    };

    // Wilson–Hilferty starting point: (X/df)^(1/3) is close to normal with
    // mean 1 - 2/(9 df) and variance 2/(9 df).
    let z = -normal_quantile(alpha);
    let v = 2.0 / (9.0 * df);
    let wh = df * (1.0 - v + z * v.sqrt()).powi(3);
    let x = if wh.is_finite() && wh > 0.0 {
        wh
    } else {
        df.max(1.0)
    };

    let (lo, hi, x, g, slope) = bracket_root(&eval, x, alpha, df);
    safeguarded_newton(&eval, lo, hi, x, g, slope)
}

/// Brackets the root of the decreasing `eval` (value and slope of g, see
/// [`chi_square_quantile`]) from the starting point `x`: returns `(lo, hi, x, g(x), g'(x))` with
/// g(lo) > 0 ≥ g(hi) and `x` the end Newton's method continues from.
fn bracket_root(
    eval: &impl Fn(f64) -> (f64, f64),
    x: f64,
    alpha: f64,
    df: f64,
) -> (f64, f64, f64, f64, f64) {
    // Bracket the root: lo has g > 0, hi has g < 0 (lo = 0 is a valid lower
    // end since g(0+) = +∞).
    let mut x = x;
    let mut lo = 0.0_f64;
    let hi: f64;
    let (mut g, mut slope) = eval(x);
    if g > 0.0 {
        lo = x;
        let mut probe = x;
        loop {
            probe *= 2.0;
            let (gp, sp) = eval(probe);
            if gp <= 0.0 {
                hi = probe;
                if gp.is_finite() {
                    // Continue Newton from the closer end.
                    x = probe;
                    g = gp;
                    slope = sp;
                }
                break;
            }
            lo = probe;
            x = probe;
            g = gp;
            slope = sp;
            assert!(
                probe < 1e300,
                "chi_square_quantile: failed to bracket the root (alpha = {alpha}, df = {df})"
            );
        }
    } else {
        hi = x;
    }

    (lo, hi, x, g, slope)
}

/// Newton's method on the decreasing `eval` from `x` (where g = `g`, g' = `slope`) inside the
/// bracket `[lo, hi]`, every step that would leave the bracket replaced by bisection.
fn safeguarded_newton(
    eval: &impl Fn(f64) -> (f64, f64),
    mut lo: f64,
    mut hi: f64,
    mut x: f64,
    mut g: f64,
    mut slope: f64,
) -> f64 {
    // Safeguarded Newton iteration. Near the root the Newton step is
    // quadratically convergent, so once a step is below 1e-13 relative a
    // single further step reaches the rounding noise of g; we then stop,
    // rather than chase that noise.
    let mut polishing = false;
    for _ in 0..500 {
        if g == 0.0 {
            return x;
        }
        if g > 0.0 {
            lo = lo.max(x);
        } else {
            hi = hi.min(x);
        }
        let newton = x - g / slope;
        if g.is_finite() && slope.is_finite() && newton == x {
            // The correction is below half an ulp of x: converged.
            return x;
        }
        let next = if g.is_finite() && slope.is_finite() && newton > lo && newton < hi {
            newton
        } else if lo > 0.0 {
            0.5 * (lo + hi)
        } else {
            // No finite lower end found yet: approach 0 geometrically.
            0.5 * hi
        };
        let step = (next - x).abs();
        x = next;
        if step <= 4.0 * f64::EPSILON * x || (hi - lo) <= 4.0 * f64::EPSILON * x {
            return x;
        }
        if step <= 1e-13 * x {
            if polishing {
                return x;
            }
            polishing = true;
        }
        (g, slope) = eval(x);
    }
    x
}

/// Result of a Pearson χ² goodness-of-fit test ([`chi_square_gof`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GofOutcome {
    /// Pearson's statistic `Σ (observed - expected)² / expected` over the
    /// cells after pooling (0 when `df == 0`).
    pub statistic: f64,
    /// Degrees of freedom: number of cells after pooling minus one.
    pub df: usize,
    /// Exact critical value `chi_square_quantile(alpha, df)` (0 when
    /// `df == 0`).
    pub threshold: f64,
    /// Upper-tail p-value of the statistic, `chi_square_sf(statistic, df)`
    /// (1 when `df == 0`).
    pub p_value: f64,
    /// Number of observations that fell in cells of probability exactly zero.
    /// Any such observation is a hard failure regardless of the statistic.
    pub impossible: u64,
    /// Number of original cells (expected count below 5) that were merged into
    /// pooled cells.
    pub pooled_cells: usize,
}

impl GofOutcome {
    /// `true` when the statistic does not exceed the threshold and no
    /// observation landed in an impossible (zero-probability) cell.
    pub fn passed(&self) -> bool {
        self.statistic <= self.threshold && self.impossible == 0
    }
}

impl fmt::Display for GofOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "chi-square GOF {}: statistic {:.4} vs threshold {:.4} (df {}, p-value {:.3e}), \
             {} impossible observation(s), {} cell(s) pooled",
            if self.passed() { "PASS" } else { "FAIL" },
            self.statistic,
            self.threshold,
            self.df,
            self.p_value,
            self.impossible,
            self.pooled_cells,
        )
    }
}

/// Minimum expected count per cell for the χ² approximation of Pearson's
/// statistic to be trustworthy (the classical rule).
const MIN_EXPECTED: f64 = 5.0;

/// Pearson χ² goodness-of-fit test of `observed` counts against
/// `expected_probs`, at false-alarm rate `alpha` (e.g. 1e-6 in a test suite).
///
/// * `expected_probs` are normalised by their sum, so unnormalised weights are
///   fine.
/// * Cells with probability exactly 0 are excluded from the statistic; every
///   observation in such a cell is counted in [`GofOutcome::impossible`] and
///   makes the test fail. Expected counts of the remaining cells are computed
///   from the number of observations that fell in them, so the statistic
///   judges the shape of the distribution over the possible cells, and the
///   impossible observations are judged separately.
/// * Cells whose expected count is below 5 are pooled: they are sorted by
///   expected count (ascending) and merged greedily, a pooled cell being
///   closed as soon as its expected count reaches 5 and a new one started.
///   If the last pool is still below 5 it is merged into the smallest cell
///   formed so far (a regular cell or a closed pool). `pooled_cells` reports
///   how many original cells were pooled.
/// * `df` is the number of cells after pooling minus one, and the threshold
///   is the exact quantile `chi_square_quantile(alpha, df)`.
/// * If only one cell remains (`df == 0`, e.g. a single possible outcome, or
///   too few observations to form two cells of expected count 5) there is
///   nothing to test: the statistic and threshold are 0, the p-value is 1,
///   and the test passes trivially (unless there are impossible
///   observations). Callers that need power must use enough samples.
///
/// # Panics
/// If the lengths differ, any probability is negative, NaN or infinite, the
/// probabilities sum to zero, the total count is zero, or `alpha` is not in
/// `(0, 1)`.
pub fn chi_square_gof(observed: &[u64], expected_probs: &[f64], alpha: f64) -> GofOutcome {
    assert_eq!(
        observed.len(),
        expected_probs.len(),
        "chi_square_gof: {} observed counts but {} probabilities",
        observed.len(),
        expected_probs.len()
    );
    for (i, &p) in expected_probs.iter().enumerate() {
        assert!(
            p.is_finite() && p >= 0.0,
            "chi_square_gof: probability {i} is {p}; probabilities must be finite and >= 0"
        );
    }
    assert!(
        alpha > 0.0 && alpha < 1.0,
        "chi_square_gof: alpha must be in (0, 1), got {alpha}"
    );
    let prob_sum: f64 = expected_probs.iter().sum();
    assert!(prob_sum > 0.0, "chi_square_gof: probabilities sum to zero");
    let total: u64 = observed.iter().sum();
    assert!(total > 0, "chi_square_gof: total observed count is zero");

    let impossible: u64 = observed
        .iter()
        .zip(expected_probs)
        .filter(|&(_, &p)| p == 0.0)
        .map(|(&o, _)| o)
        .sum();
    let n = (total - impossible) as f64;

    // (expected, observed) for every cell of positive probability.
    let mut regular: Vec<(f64, f64)> = Vec::new();
    let mut small: Vec<(f64, f64)> = Vec::new();
    for (&o, &p) in observed.iter().zip(expected_probs) {
        if p == 0.0 {
            continue;
        }
        let e = n * (p / prob_sum);
        if e >= MIN_EXPECTED {
            regular.push((e, o as f64));
        } else {
            small.push((e, o as f64));
        }
    }
    let pooled_cells = small.len();

    // Greedy pooling of the small cells in ascending order of expectation.
    small.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut cells = regular;
    let mut pool = (0.0, 0.0);
    for (e, o) in small {
        pool.0 += e;
        pool.1 += o;
        if pool.0 >= MIN_EXPECTED {
            cells.push(pool);
            pool = (0.0, 0.0);
        }
    }
    if pooled_cells > 0 && pool != (0.0, 0.0) {
        // A leftover pool below 5: fold it into the smallest cell, or keep it
        // as the only cell if there is none.
        let smallest = cells
            .iter()
            .enumerate()
            .min_by(|x, y| x.1 .0.total_cmp(&y.1 .0))
            .map(|(i, _)| i);
        match smallest {
            Some(i) => {
                cells[i].0 += pool.0;
                cells[i].1 += pool.1;
            }
            None => cells.push(pool),
        }
    }

    let df = cells.len().saturating_sub(1);
    if df == 0 || n == 0.0 {
        return GofOutcome {
            statistic: 0.0,
            df: 0,
            threshold: 0.0,
            p_value: 1.0,
            impossible,
            pooled_cells,
        };
    }
    let statistic: f64 = cells
        .iter()
        .map(|&(e, o)| {
            let d = o - e;
            d * d / e
        })
        .sum();
    let dff = df as f64;
    GofOutcome {
        statistic,
        df,
        threshold: chi_square_quantile(alpha, dff),
        p_value: chi_square_sf(statistic, dff),
        impossible,
        pooled_cells,
    }
}

/// z-score of `successes` out of `trials` Bernoulli(`p`) draws:
/// `z = (k - n·p) / sqrt(n·p·(1 - p))`.
///
/// For the degenerate `p == 0` or `p == 1` (and for `trials == 0`) the
/// variance is zero: the z-score is 0 if `successes` equals the only possible
/// value `n·p`, and `±∞` otherwise.
///
/// # Panics
/// If `p` is not in `[0, 1]` or `successes > trials`.
pub fn binomial_z(successes: u64, trials: u64, p: f64) -> f64 {
    assert!(
        (0.0..=1.0).contains(&p),
        "binomial_z: p must be in [0, 1], got {p}"
    );
    assert!(
        successes <= trials,
        "binomial_z: successes ({successes}) exceed trials ({trials})"
    );
    let k = successes as f64;
    let n = trials as f64;
    if trials == 0 || p == 0.0 || p == 1.0 {
        let only = if p == 1.0 { trials } else { 0 };
        return match successes.cmp(&only) {
            std::cmp::Ordering::Equal => 0.0,
            std::cmp::Ordering::Greater => f64::INFINITY,
            std::cmp::Ordering::Less => f64::NEG_INFINITY,
        };
    }
    (k - n * p) / (n * p * (1.0 - p)).sqrt()
}

/// `true` if `successes` out of `trials` is within `sigmas` standard errors of
/// the mean `trials·p`, i.e. `|binomial_z(successes, trials, p)| <= sigmas`.
///
/// The normal approximation behind "within k sigmas" is only good when
/// `n·p·(1-p)` is reasonably large; pick `sigmas` with [`normal_quantile`]
/// (e.g. `-normal_quantile(alpha / 2.0)`) and a sample size large enough that
/// the negative control fails.
///
/// # Panics
/// As [`binomial_z`], or if `sigmas` is NaN or negative.
pub fn binomial_within(successes: u64, trials: u64, p: f64, sigmas: f64) -> bool {
    assert!(
        sigmas >= 0.0,
        "binomial_within: sigmas must be >= 0, got {sigmas}"
    );
    binomial_z(successes, trials, p).abs() <= sigmas
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_rel(actual: f64, expected: f64, tol: f64, what: &str) {
        let err = if expected == 0.0 {
            actual.abs()
        } else {
            ((actual - expected) / expected).abs()
        };
        assert!(
            err <= tol,
            "{what}: got {actual:e}, expected {expected:e}, rel err {err:e} > {tol:e}"
        );
    }

    #[test]
    fn ln_gamma_reference_values() {
        // (a, ln Γ(a)) from mpmath at 40 digits; absolute tolerance.
        let cases: [(f64, f64); 10] = [
            (0.5, 0.572_364_942_924_700_1),
            (1.0, 0.0),
            (1.5, -0.120_782_237_635_245_22),
            (2.0, 0.0),
            (3.0, std::f64::consts::LN_2),
            (3.3, 0.987_098_577_894_734_4),
            (10.0, 12.801_827_480_081_469),
            (100.0, 359.134_205_369_575_4),
            (1e5, 1_051_287.708_973_656_9),
            (1e-5, 11.512_919_692_895_826),
        ];
        for (a, want) in cases {
            let got = ln_gamma(a);
            let tol = 4e-15 * want.abs().max(1.0);
            assert!(
                (got - want).abs() <= tol,
                "ln_gamma({a}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn ln_1p_minus_x_matches_series_and_direct() {
        // Tiny t: ln(1+t) - t ≈ -t²/2 + t³/3.
        let t = 1e-9;
        assert_rel(
            ln_1p_minus_x(t),
            -t * t / 2.0 + t * t * t / 3.0,
            1e-15,
            "tiny",
        );
        for &t in &[-0.49, -0.2, 0.3, 0.99] {
            assert_rel(ln_1p_minus_x(t), (1.0_f64 + t).ln() - t, 1e-13, "moderate");
        }
    }

    #[test]
    fn regularized_gamma_reference_values() {
        // (a, x, P, Q) from mpmath at 40 digits.
        let cases: [(f64, f64, f64, f64); 21] = [
            (0.5, 0.1, 0.345_279_153_981_423, 0.654_720_846_018_577),
            (0.5, 2.0, 0.954_499_736_103_641_6, 0.045_500_263_896_358_42),
            (1.0, 1.0, 0.632_120_558_828_557_7, 0.367_879_441_171_442_33),
            (3.0, 2.5, 0.456_186_884_116_670_47, 0.543_813_115_883_329_5),
            (
                10.0,
                30.0,
                0.999_992_878_249_137_2,
                7.121_750_862_815_577e-6,
            ),
            (
                100.0,
                90.0,
                0.158_220_989_186_430_16,
                0.841_779_010_813_569_9,
            ),
            (
                100.0,
                120.0,
                0.972_136_260_109_479_3,
                0.027_863_739_890_520_663,
            ),
            (1e5, 1e5, 0.500_420_522_110_365_1, 0.499_579_477_889_634_8),
            (
                1e5,
                1.01e5,
                0.999_191_578_487_074_4,
                8.084_215_129_255_907e-4,
            ),
            (
                1e5,
                0.99e5,
                7.574_199_211_747_679e-4,
                0.999_242_580_078_825_3,
            ),
            (
                1e5,
                100_001.0,
                0.501_682_078_909_707_3,
                0.498_317_921_090_292_77,
            ),
            (
                1e5,
                99_700.0,
                0.171_417_314_514_502_93,
                0.828_582_685_485_497_1,
            ),
            (1e5, 105_000.0, 1.0, 7.204_959_694_834_921e-55),
            (
                5e4,
                50_700.0,
                0.999_088_019_629_334_8,
                9.119_803_706_652_216e-4,
            ),
            (0.5, 1e-10, 1.128_379_167_057_9e-5, 0.999_988_716_208_329_4),
            (7.5, 7.0, 0.474_470_870_237_091_1, 0.525_529_129_762_908_9),
            (
                1000.0,
                1100.0,
                0.998_940_676_746_07,
                1.059_323_253_929_977_3e-3,
            ),
            (0.5, 600.0, 1.0, 6.099_568_814_808_433_4e-263),
            (
                20.0,
                21.0,
                0.615_737_227_735_657_9,
                0.384_262_772_264_342_13,
            ),
            (
                20.0,
                22.0,
                0.693_972_979_437_825_3,
                0.306_027_020_562_174_73,
            ),
            (50.0, 1e6, 1.0, 0.0),
        ];
        for (a, x, p, q) in cases {
            assert_rel(regularized_gamma_p(a, x), p, 1e-13, &format!("P({a}, {x})"));
            assert_rel(regularized_gamma_q(a, x), q, 1e-13, &format!("Q({a}, {x})"));
        }
        // Q(2.5, 1000) = 1.209e-430 underflows to zero.
        assert_eq!(regularized_gamma_q(2.5, 1000.0), 0.0);
        assert_eq!(regularized_gamma_p(3.0, 0.0), 0.0);
        assert_eq!(regularized_gamma_q(3.0, 0.0), 1.0);
    }

    #[test]
    fn regularized_gamma_complementary() {
        for &a in &[0.5, 1.0, 2.5, 17.0, 333.3, 5e4, 1e5] {
            for &f in &[0.01, 0.5, 0.9, 1.0, 1.1, 2.0, 5.0] {
                let x = a * f;
                let s = regularized_gamma_p(a, x) + regularized_gamma_q(a, x);
                assert!((s - 1.0).abs() < 1e-14, "P+Q = {s} at a = {a}, x = {x}");
            }
        }
    }

    #[test]
    fn erfc_reference_values() {
        let cases = [
            (0.0, 1.0),
            (1.0, 0.157_299_207_050_285_13),
            (-1.0, 1.842_700_792_949_714_8),
            (0.3, 0.671_373_240_540_872_6),
            (2.0, 4.677_734_981_047_266e-3),
            (5.0, 1.537_459_794_428_035e-12),
            (10.0, 2.088_487_583_762_545e-45),
            (26.0, 5.663_192_408_856_143e-296),
            (-3.0, 1.999_977_909_503_001_5),
        ];
        for (x, want) in cases {
            let tol = 1e-14 + 2e-16 * x * x;
            assert_rel(erfc(x), want, tol, &format!("erfc({x})"));
        }
    }

    #[test]
    fn normal_quantile_reference_values() {
        // From scipy.stats.norm.ppf.
        let cases = [
            (0.975, 1.959_963_984_540_054),
            (1e-9, -5.997_807_015_007_686_5),
            (0.5, 0.0),
            (0.02425, -1.972_961_051_311_885),
            (0.9, 1.281_551_565_544_600_4),
            (1.0 - 1e-12, 7.034_486_910_047_835_6),
            (1e-15, -7.941_345_326_170_998),
            (1e-300, -37.047_096_299_361_2),
        ];
        for (p, want) in cases {
            assert_rel(
                normal_quantile(p),
                want,
                1e-14,
                &format!("normal_quantile({p})"),
            );
        }
        assert_eq!(normal_quantile(0.0), f64::NEG_INFINITY);
        assert_eq!(normal_quantile(1.0), f64::INFINITY);
        assert!(normal_quantile(5e-324).is_finite());
    }

    #[test]
    fn normal_quantile_round_trip_and_symmetry() {
        for &p in &[
            1e-200, 1e-50, 1e-12, 1e-6, 0.001, 0.01, 0.1, 0.3, 0.49, 0.499_999,
        ] {
            let z = normal_quantile(p);
            let cdf = 0.5 * erfc(-z / std::f64::consts::SQRT_2);
            assert_rel(cdf, p, 1e-13 + 2e-16 * z * z, &format!("Φ(Φ⁻¹({p}))"));
        }
        // 1 - p is exact for these, so the symmetry must hold to rounding.
        for &p in &[0.5 - 2f64.powi(-20), 0.25, 0.1, 1e-3, 2f64.powi(-40)] {
            assert_rel(
                normal_quantile(1.0 - p),
                -normal_quantile(p),
                1e-15,
                "symmetry",
            );
        }
    }

    #[test]
    fn chi_square_quantile_reference_values() {
        // (alpha, df, x) with chi2.isf(alpha, df) from scipy 1.17.
        let cases = [
            (0.05, 1.0, 3.841_458_820_694_124),
            (0.05, 10.0, 18.307_038_053_275_146),
            (0.001, 10.0, 29.588_298_445_074_42),
            (0.01, 100.0, 135.806_723_171_026_76),
            (1e-7, 1.0, 28.373_987_361_779_154),
            (1e-10, 1.0, 41.821_456_364_761_29),
            (1e-12, 1.0, 50.844_127_911_818_155),
            (1e-12, 2.0, 55.262_042_231_857_095),
            (1e-12, 37.0, 132.830_745_847_091_15),
            (1e-7, 1000.0, 1_250.124_269_010_138_3),
            (1e-10, 1000.0, 1_311.303_008_280_607),
            (1e-7, 10_000.0, 10_752.733_456_602_984),
            (1e-10, 10_000.0, 10_926.105_292_661_154),
            (1e-12, 100_000.0, 103_178.313_318_385_89),
            (0.05, 100_000.0, 100_736.736_177_319),
            (0.5, 2.0, 1.386_294_361_119_891),
            (0.999, 5.0, 0.210_212_602_629_219_3),
        ];
        for (alpha, df, want) in cases {
            assert_rel(
                chi_square_quantile(alpha, df),
                want,
                1e-12,
                &format!("chi_square_quantile({alpha}, {df})"),
            );
        }
        assert_eq!(chi_square_quantile(0.0, 3.0), f64::INFINITY);
        assert_eq!(chi_square_quantile(1.0, 3.0), 0.0);
    }

    #[test]
    fn chi_square_sf_quantile_round_trip() {
        let dfs = [1.0, 2.0, 3.0, 4.5, 7.0, 10.0, 30.0, 100.0, 999.0, 1e4, 1e5];
        let alphas = [0.999, 0.9, 0.5, 0.05, 1e-3, 1e-7, 1e-10, 1e-12, 1e-20];
        for &df in &dfs {
            for &alpha in &alphas {
                let x = chi_square_quantile(alpha, df);
                assert!(x.is_finite() && x > 0.0, "quantile({alpha}, {df}) = {x}");
                assert_rel(
                    chi_square_sf(x, df),
                    alpha,
                    1e-11,
                    &format!("sf(quantile({alpha}, {df}))"),
                );
                // The quantile is pinned to ~1e-12 relative: nudging x by 1e-10
                // relative must move the tail probability in the right direction.
                assert!(chi_square_sf(x * (1.0 + 1e-10), df) < alpha);
                assert!(chi_square_sf(x * (1.0 - 1e-10), df) > alpha);
            }
        }
        assert_eq!(chi_square_sf(0.0, 5.0), 1.0);
        assert_eq!(chi_square_sf(-1.0, 5.0), 1.0);
        assert_rel(
            chi_square_cdf(3.841_458_820_694_124, 1.0),
            0.95,
            1e-14,
            "cdf",
        );
    }

    #[test]
    fn exact_quantile_differs_from_rule_of_thumb() {
        // Why the module exists: df + 10·sqrt(2 df) is far too low at df = 1
        // (exceeded with probability ~1e-4) and far too high at df = 1e5.
        let rule = |df: f64| df + 10.0 * (2.0 * df).sqrt();
        assert!(chi_square_sf(rule(1.0), 1.0) > 5e-5);
        assert!(chi_square_quantile(1e-12, 1.0) > 3.0 * rule(1.0));
        assert!(chi_square_quantile(1e-12, 1e5) < rule(1e5) - 1000.0);
    }

    #[test]
    fn gof_exactly_proportional_counts_pass() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let observed = [1000, 2000, 3000, 4000];
        let out = chi_square_gof(&observed, &probs, 1e-6);
        assert!(out.passed(), "{out}");
        assert!(out.statistic.abs() < 1e-9);
        assert_eq!(out.df, 3);
        assert_eq!(out.impossible, 0);
        assert_eq!(out.pooled_cells, 0);
        assert_rel(
            out.threshold,
            chi_square_quantile(1e-6, 3.0),
            1e-15,
            "threshold",
        );
        assert_rel(out.p_value, 1.0, 1e-12, "p-value");
        // Unnormalised weights give the same result.
        let out2 = chi_square_gof(&observed, &[1.0, 2.0, 3.0, 4.0], 1e-6);
        assert!(out2.passed());
        assert!(out2.statistic.abs() < 1e-9);
    }

    #[test]
    fn gof_grossly_wrong_distribution_fails() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let observed = [2500, 2500, 2500, 2500];
        let out = chi_square_gof(&observed, &probs, 1e-6);
        assert!(!out.passed(), "{out}");
        assert!(out.statistic > out.threshold);
        assert!(out.p_value < 1e-6);
        assert!(out.to_string().contains("FAIL"));
    }

    #[test]
    fn gof_impossible_observation_fails() {
        let probs = [0.5, 0.0, 0.5];
        let observed = [5000, 1, 5000];
        let out = chi_square_gof(&observed, &probs, 1e-6);
        assert_eq!(out.impossible, 1);
        assert_eq!(out.df, 1);
        assert!(out.statistic <= out.threshold);
        assert!(!out.passed(), "{out}");
        // Zero-probability cells with zero observations are simply ignored.
        let ok = chi_square_gof(&[5000, 0, 5000], &probs, 1e-6);
        assert!(ok.passed(), "{ok}");
        assert_eq!(ok.df, 1);
    }

    #[test]
    fn gof_pooling() {
        // n = 1000: expected 500, 300, 180, then ten cells of expected 2 each.
        let mut probs = vec![0.5, 0.3, 0.18];
        probs.extend([0.002; 10]);
        let mut observed = vec![500, 300, 180];
        observed.extend([2; 10]);
        let out = chi_square_gof(&observed, &probs, 1e-6);
        // Three pools of three small cells (expected 6 each); the leftover
        // cell (expected 2) is folded into the smallest cell, one of the pools.
        assert_eq!(out.pooled_cells, 10);
        assert_eq!(out.df, 5);
        assert!(out.statistic.abs() < 1e-9, "{out}");
        assert!(out.passed());

        // Nine small cells: exactly three pools, nothing left over.
        let mut probs = vec![0.5, 0.3, 0.182];
        probs.extend([0.002; 9]);
        let mut observed = vec![500, 300, 182];
        observed.extend([2; 9]);
        let out = chi_square_gof(&observed, &probs, 1e-6);
        assert_eq!(out.pooled_cells, 9);
        assert_eq!(out.df, 5);
        assert!(out.statistic.abs() < 1e-9, "{out}");

        // All tail mass observed in one small cell: the pool containing it
        // sees 20 observations against 6 expected, the others 0 against 6.
        let mut probs = vec![0.5, 0.3, 0.18];
        probs.extend([0.002; 10]);
        let mut observed = vec![500, 300, 180, 20];
        observed.extend([0; 9]);
        let out = chi_square_gof(&observed, &probs, 1e-3);
        assert_eq!(out.pooled_cells, 10);
        // The leftover cell (2 expected, 0 observed) joins the first pool, the
        // one holding all 20 observations: (20-8)²/8 + 6 + 6 = 30.
        assert!((out.statistic - 30.0).abs() < 1e-9, "{out}");
        assert!(!out.passed(), "{out}");

        // Too few observations for two cells: df = 0 passes trivially.
        let out = chi_square_gof(&[1, 2], &[0.5, 0.5], 1e-6);
        assert_eq!(out.df, 0);
        assert_eq!(out.statistic, 0.0);
        assert_eq!(out.p_value, 1.0);
        assert!(out.passed());
        assert_eq!(out.pooled_cells, 2);
        // ... unless an impossible cell was hit.
        let out = chi_square_gof(&[1, 2, 1], &[0.5, 0.5, 0.0], 1e-6);
        assert_eq!(out.df, 0);
        assert!(!out.passed());
    }

    /// SplitMix64, only to draw reproducible samples in the tests below.
    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn sample_counts(probs: &[f64], n: usize, seed: u64) -> Vec<u64> {
        let total: f64 = probs.iter().sum();
        let mut state = seed;
        let mut counts = vec![0u64; probs.len()];
        for _ in 0..n {
            let u = (splitmix(&mut state) >> 11) as f64 / (1u64 << 53) as f64 * total;
            let mut acc = 0.0;
            let mut idx = probs.len() - 1;
            for (i, &p) in probs.iter().enumerate() {
                acc += p;
                if u < acc {
                    idx = i;
                    break;
                }
            }
            counts[idx] += 1;
        }
        counts
    }

    #[test]
    fn gof_sampled_with_negative_control() {
        // Zipf-like target over 200 tokens, some with tiny probability.
        let target: Vec<f64> = (1..=200).map(|k| 1.0 / (k as f64).powf(1.3)).collect();
        let n = 200_000;
        let good = chi_square_gof(&sample_counts(&target, n, 42), &target, 1e-6);
        assert!(good.passed(), "correct sampler rejected: {good}");
        // Negative control: a 10% relative bias on the most likely token
        // (the remainder renormalised) must be detected at the same n.
        let mut biased = target.clone();
        biased[0] *= 1.10;
        let bad = chi_square_gof(&sample_counts(&biased, n, 42), &target, 1e-6);
        assert!(!bad.passed(), "biased sampler accepted: {bad}");
    }

    #[test]
    fn binomial_z_and_within() {
        assert_eq!(binomial_z(500, 1000, 0.5), 0.0);
        assert_rel(
            binomial_z(550, 1000, 0.5),
            50.0 / 250.0_f64.sqrt(),
            1e-15,
            "z",
        );
        assert!(binomial_within(550, 1000, 0.5, 4.0));
        assert!(!binomial_within(550, 1000, 0.5, 3.0));
        // Degenerate probabilities.
        assert_eq!(binomial_z(0, 10, 0.0), 0.0);
        assert_eq!(binomial_z(1, 10, 0.0), f64::INFINITY);
        assert_eq!(binomial_z(10, 10, 1.0), 0.0);
        assert_eq!(binomial_z(9, 10, 1.0), f64::NEG_INFINITY);
        assert!(!binomial_within(1, 10, 0.0, 1e9));
        assert_eq!(binomial_z(0, 0, 0.3), 0.0);
        // Six sigmas corresponds to a two-sided rate of about 2e-9.
        let six = -normal_quantile(1e-9);
        assert!((six - 5.9978).abs() < 1e-4);
    }

    #[test]
    fn display_is_one_line() {
        let out = chi_square_gof(&[10, 20, 30], &[1.0, 2.0, 3.0], 0.01);
        let s = out.to_string();
        assert!(!s.contains('\n'));
        assert!(s.contains("PASS") && s.contains("df 2"), "{s}");
    }

    #[test]
    #[should_panic(expected = "observed counts but")]
    fn gof_panics_on_length_mismatch() {
        chi_square_gof(&[1, 2, 3], &[0.5, 0.5], 0.01);
    }

    #[test]
    #[should_panic(expected = "probabilities must be finite and >= 0")]
    fn gof_panics_on_negative_probability() {
        chi_square_gof(&[1, 2], &[0.5, -0.5], 0.01);
    }

    #[test]
    #[should_panic(expected = "probabilities must be finite and >= 0")]
    fn gof_panics_on_nan_probability() {
        chi_square_gof(&[1, 2], &[0.5, f64::NAN], 0.01);
    }

    #[test]
    #[should_panic(expected = "total observed count is zero")]
    fn gof_panics_on_zero_total() {
        chi_square_gof(&[0, 0], &[0.5, 0.5], 0.01);
    }
}

//! Synthetic acceptance schedules (SPEC §3 rule 4, vLLM's "synthetic" mode), for benchmarks that
//! must predict a real run's speed at a chosen acceptance. [`crate::VerifyBatch::synthetic_rates`]
//! takes *conditional* rates `c_i = P(accept draft i | drafts 0..i accepted)`; the functions here build
//! them from the other two usual descriptions.

use crate::Error;

/// Conditional rates from unconditional ones: `a_i = P(at least i + 1 drafts accepted)` must be
/// non-increasing in [0, 1]; then `c_0 = a_0`, `c_i = a_i / a_{i−1}` (0 once `a_{i−1}` is 0).
pub fn conditional_from_unconditional(a: &[f32]) -> Result<Vec<f32>, Error> {
    let bad = |i: usize, why: &str| Error::SyntheticRates {
        reason: format!("unconditional rate a[{i}] = {} {why}", a[i]),
    };
    let mut c = Vec::with_capacity(a.len());
    for i in 0..a.len() {
        if !(0.0..=1.0).contains(&a[i]) {
            return Err(bad(i, "is not a probability in [0, 1]"));
        }
        if i > 0 && a[i] > a[i - 1] {
            return Err(bad(i, "exceeds a[i-1]: P(A > i) cannot grow with i"));
        }
        c.push(match i {
            0 => a[0],
            _ if a[i - 1] == 0.0 => 0.0,
            _ => (a[i] / a[i - 1]).min(1.0),
        });
    }
    Ok(c)
}

/// The minimum-variance schedule with a mean acceptance length `mean` (tokens emitted per step,
/// 1 + accepted drafts, in [1, k + 1]) for `k` drafts: every step accepts either ⌊mean⌋ − 1 or
/// ⌈mean⌉ − 1 drafts, so the conditional rates are 1, …, 1, frac(mean − 1), 0, …, 0.
pub fn conditional_for_mean_length(k: usize, mean: f64) -> Result<Vec<f32>, Error> {
    if !mean.is_finite() || mean < 1.0 || mean > k as f64 + 1.0 {
        return Err(Error::SyntheticRates {
            reason: format!(
                "mean acceptance length {mean} is outside [1, k + 1 = {}]",
                k + 1
            ),
        });
    }
    let m = mean - 1.0;
    let whole = m.floor() as usize;
    Ok((0..k)
        .map(|i| match i.cmp(&whole) {
            std::cmp::Ordering::Less => 1.0,
            std::cmp::Ordering::Equal => (m - whole as f64) as f32,
            std::cmp::Ordering::Greater => 0.0,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unconditional_to_conditional() {
        let c = conditional_from_unconditional(&[0.8, 0.4, 0.1, 0.0, 0.0]).unwrap();
        assert_eq!(c, vec![0.8, 0.5, 0.25, 0.0, 0.0]);
        assert!(
            conditional_from_unconditional(&[0.5, 0.6]).is_err(),
            "a must not grow"
        );
        assert!(conditional_from_unconditional(&[1.5]).is_err());
        assert!(conditional_from_unconditional(&[f32::NAN]).is_err());
    }

    #[test]
    fn mean_length_schedule() {
        assert_eq!(
            conditional_for_mean_length(4, 3.25).unwrap(),
            vec![1.0, 1.0, 0.25, 0.0]
        );
        assert_eq!(conditional_for_mean_length(4, 1.0).unwrap(), vec![0.0; 4]);
        assert_eq!(conditional_for_mean_length(4, 5.0).unwrap(), vec![1.0; 4]);
        assert!(conditional_for_mean_length(4, 5.5).is_err());
        assert!(conditional_for_mean_length(4, 0.5).is_err());
        // The mean it produces: 1 + Σ_i Π_{j≤i} c_j.
        let c = conditional_for_mean_length(7, 4.6).unwrap();
        let (mut p, mut mean) = (1.0f64, 1.0f64);
        for x in c {
            p *= x as f64;
            mean += p;
        }
        assert!((mean - 4.6).abs() < 1e-6, "{mean}");
    }
}

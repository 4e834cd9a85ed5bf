//! The host checks of a batch, the first step of every verification (CPU or GPU): vocabulary
//! sizes, per-request parameters, draft ids, synthetic rates, the batch size, and the element
//! counts of host slices. Reads the caller's batch; writes nothing. Each check returns the
//! [`Error`] that names what was wrong; the GPU's own checks (buffers, limits) live in
//! `gpu::checks`.

use super::{Request, Rule, Shape, MAX_DRAFTS_PER_REQUEST};
use crate::error::Error;

/// Checks the vocabulary sizes; returns (target vocabulary, draft vocabulary), the draft's
/// defaulting to the target's.
pub(super) fn check_vocabs(shape: &Shape<'_>) -> Result<(u32, u32), Error> {
    let vocab = shape.vocab;
    if vocab == 0 || vocab > i32::MAX as u32 {
        return Err(Error::InvalidVocab {
            vocab_size: u64::from(vocab),
        });
    }
    let draft_vocab = shape.draft_vocab.unwrap_or(vocab);
    if draft_vocab == 0 || draft_vocab > vocab {
        return Err(Error::InvalidDraftVocab { draft_vocab, vocab });
    }
    Ok((vocab, draft_vocab))
}

/// What the checked requests add up to.
pub(super) struct Counts {
    /// Drafts of all requests.
    pub total_drafts: usize,
    /// The most drafts of one request.
    pub k_max: u32,
    /// Some request uses [`Rule::Synthetic`].
    pub any_synthetic: bool,
}

/// Checks every request in order (draft count, temperature, sampling parameters).
pub(super) fn check_requests(requests: &[Request]) -> Result<Counts, Error> {
    let mut counts = Counts {
        total_drafts: 0,
        k_max: 0,
        any_synthetic: false,
    };
    for (r, req) in requests.iter().enumerate() {
        if req.num_drafts > MAX_DRAFTS_PER_REQUEST {
            return Err(Error::TooManyDrafts {
                request: r,
                num_drafts: req.num_drafts,
            });
        }
        let t = req.params.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(Error::InvalidTemperature {
                request: r,
                temperature: t,
            });
        }
        req.params.check(r)?;
        counts.any_synthetic |= req.params.rule == Rule::Synthetic;
        counts.total_drafts += req.num_drafts as usize;
        counts.k_max = counts.k_max.max(req.num_drafts);
    }
    Ok(counts)
}

/// Checks that there is one draft id per draft and that each is -1 (no draft) or a token of
/// the vocabulary.
pub(super) fn check_draft_ids(shape: &Shape<'_>, total_drafts: usize) -> Result<(), Error> {
    if shape.draft_ids.len() != total_drafts {
        return Err(Error::DraftIdCount {
            expected: total_drafts,
            got: shape.draft_ids.len(),
        });
    }
    if let Some((index, &token)) = shape
        .draft_ids
        .iter()
        .enumerate()
        .find(|(_, &t)| t < -1 || t >= shape.vocab as i32)
    {
        return Err(Error::TokenOutOfRange {
            index,
            token,
            vocab_size: shape.vocab,
        });
    }
    Ok(())
}

/// Checks the synthetic rates (one probability per draft, needed only when some request uses
/// [`Rule::Synthetic`]); returns the rates the plan keeps (none without synthetic requests).
pub(super) fn check_rates(
    any_synthetic: bool,
    rates: Option<&[f32]>,
    total_drafts: usize,
) -> Result<Vec<f32>, Error> {
    match (any_synthetic, rates) {
        (false, _) => Ok(Vec::new()),
        (true, None) => Err(Error::SyntheticRates {
            reason: "a request uses Rule::Synthetic but synthetic_rates is None; give one \
                     conditional rate per draft"
                .into(),
        }),
        (true, Some(rates)) => {
            if rates.len() != total_drafts {
                return Err(Error::SyntheticRates {
                    reason: format!(
                        "{} rates given, the requests have {total_drafts} drafts (one rate each)",
                        rates.len()
                    ),
                });
            }
            if let Some((i, v)) = rates
                .iter()
                .enumerate()
                .find(|(_, v)| !(0.0..=1.0).contains(*v))
            {
                return Err(Error::SyntheticRates {
                    reason: format!("rate[{i}] = {v} is not a probability in [0, 1]"),
                });
            }
            Ok(rates.to_vec())
        }
    }
}

/// Checks that every row index fits the kernels' 32-bit row indices.
pub(super) fn check_total_rows(total_rows: usize, vocab: u32) -> Result<(), Error> {
    if total_rows > (i32::MAX as usize)
        || total_rows.saturating_mul(vocab as usize) > u64::MAX as usize
    {
        return Err(Error::BatchTooLarge {
            reason: format!("{total_rows} rows exceed 32-bit row indices"),
        });
    }
    Ok(())
}

/// Checks a host slice's element count against the rows the plan needs.
pub(crate) fn check_rows(got: usize, rows: usize, vocab: u32, draft: bool) -> Result<(), Error> {
    if got == rows * vocab as usize {
        return Ok(());
    }
    Err(if draft {
        Error::DraftRowCount {
            expected_rows: rows,
            got_elements: got,
            vocab_size: vocab,
        }
    } else {
        Error::TargetRowCount {
            expected_rows: rows,
            got_elements: got,
            vocab_size: vocab,
        }
    })
}

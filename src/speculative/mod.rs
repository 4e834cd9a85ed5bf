//! The speculative-decoding system around the [`crate::Verifier`] (SPEC §6): proposers (n-gram
//! prompt lookup, a draft model the app implements), the scorer (multi-query layout and batch
//! expansion, with the GPU gather kernel that contracts expanded rows), and the decode loop
//! [`SpecDecoder`] with its [`Metrics`].
//!
//! One decode step of [`SpecDecoder`], for the live requests of a batch:
//!
//! ```text
//! propose (Proposer)  →  score (TargetModel: k_r + 1 rows per request)  →  verify (Verifier)
//!        →  append the emitted tokens, stop on EOS / max length, roll the KV caches back
//! ```
//!
//! ```no_run
//! use specdec::speculative::{DecoderConfig, GenRequest, NgramProposer, SpecDecoder, TargetModel};
//! use specdec::{SamplingParams, Verifier, VerifierOptions};
//! # fn demo(target: &mut impl TargetModel) -> Result<(), specdec::speculative::SpecError> {
//! let verifier = Verifier::auto(VerifierOptions::default())?;
//! let mut decoder = SpecDecoder::new(&verifier, DecoderConfig { num_drafts: 4, eos: vec![2], ..Default::default() });
//! let mut proposer = NgramProposer::new(1, 3)?;
//! let requests = [GenRequest::new(vec![5, 6, 7, 5, 6], SamplingParams::greedy(), 32)];
//! let out = decoder.generate(target, &mut proposer, &requests)?;
//! println!("{:?}\n{}", out[0].tokens, decoder.metrics());
//! # Ok(()) }
//! ```

mod decoder;
mod draft;
mod gather_rows;
mod metrics;
mod ngram;
mod scorer;

#[doc(hidden)]
pub use decoder::DecodeFault;
#[cfg(feature = "candle")]
pub(crate) use decoder::{adapts, Pace};
pub use decoder::{DecoderConfig, GenRequest, Generation, SpecDecoder, Speculation, StopReason};
pub use draft::{DraftModel, DraftModelProposer};
pub use gather_rows::{gather_rows_cpu, GatherRows};
pub use metrics::Metrics;
pub use ngram::{NgramProposer, NgramTreeProposer};
pub use scorer::{
    BatchExpansion, ExpansionLayout, Query, ScoreInput, SequenceModel, Sequences, SingleQueryModel,
    TargetModel,
};

use crate::{Draft, Request, VerifyBatch, VerifyOutput};
use std::fmt;

/// The error a model (target or draft) reports; anything that is an error converts into it with
/// `?` (a candle error, an I/O error, a string).
pub type ModelError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What can go wrong in the decode loop and its parts.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpecError {
    /// The verifier refused the batch or failed (GPU error, timeout, device loss).
    Verify(crate::Error),
    /// The target or draft model failed.
    Model(ModelError),
    /// A proposer, draft model or target model broke its contract (wrong number of proposals,
    /// rows of the wrong length, a token outside the vocabulary). The message says which.
    Contract(String),
    /// Bad input or configuration (empty prompt, prompt not shorter than its max length, n-gram
    /// sizes out of order, a row larger than a storage binding). The message says what to change.
    Invalid(String),
    /// A GPU call of the gather kernel failed (caught in an error scope).
    Gpu(String),
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::Verify(e) => write!(f, "verification failed: {e}"),
            SpecError::Model(e) => write!(f, "model failed: {e}"),
            SpecError::Contract(m) => write!(f, "contract broken: {m}"),
            SpecError::Invalid(m) => write!(f, "invalid input: {m}"),
            SpecError::Gpu(m) => write!(f, "gather_rows GPU error: {m}"),
        }
    }
}

impl std::error::Error for SpecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpecError::Verify(e) => Some(e),
            SpecError::Model(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<crate::Error> for SpecError {
    fn from(e: crate::Error) -> Self {
        SpecError::Verify(e)
    }
}

/// One live sequence as the proposers see it.
#[derive(Clone, Copy, Debug)]
pub struct SeqView<'a> {
    /// Index of the request in the batch given to [`SpecDecoder::generate`] (stable for the
    /// whole generation; finished requests leave the step's slice, this index does not change).
    pub request: usize,
    /// The whole sequence so far: prompt, then the generated tokens.
    pub tokens: &'a [u32],
    /// Most tokens the sequence may hold (prompt included); see [`proposal_cap`].
    pub max_len: usize,
    /// The request's sampling parameters (a sampling drafter may take its seed from here).
    pub params: crate::SamplingParams,
}

/// How many drafts a sequence of `len` tokens may propose in a step with `k` drafts, under a
/// length cap of `max_len` tokens: `min(k, max_len − len − 1)`, and 0 when `len + 1 ≥ max_len`.
///
/// Why: a step emits `accepted + 1 ≤ drafts + 1` tokens, so with at most `max_len − len − 1`
/// drafts the sequence can never pass `max_len`, and a sequence one token short of its cap takes
/// a plain decode step. Proposals are cut to this length, not dropped, so the drafts that fit
/// are still verified.
pub fn proposal_cap(len: usize, max_len: usize, k: usize) -> usize {
    k.min(max_len.saturating_sub(len + 1))
}

/// The kind of draft rows a proposal carries (SPEC §2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowKind {
    /// No rows: `q` is one-hot at the drafted token (n-gram, greedy drafters).
    #[default]
    OneHot,
    /// Probabilities `q` (the distribution the drafter sampled from).
    Probs,
    /// Draft logits, turned into `q` with each request's temperature by the verifier.
    Logits,
}

/// The proposals of one step, batched: per request a proposal length, the drafted tokens of all
/// requests back to back, and optionally one draft row per token. Kept and reused by the decoder
/// from step to step, so that proposing allocates nothing once the buffers have grown.
#[derive(Clone, Debug, Default)]
pub struct Proposals {
    /// Per request: the number of drafts `k_r`.
    pub lens: Vec<u32>,
    /// Σ k_r drafted tokens, request after request.
    pub tokens: Vec<u32>,
    /// Σ k_r rows × `row_len` values (empty for [`RowKind::OneHot`]).
    pub rows: Vec<f32>,
    /// What `rows` hold.
    pub kind: RowKind,
    /// Length of a draft row: the draft model's vocabulary (≤ the target's).
    pub row_len: usize,
}

impl Proposals {
    /// Empties the buffers (keeping their capacity) for a step with rows of `kind`, `row_len`
    /// long.
    pub fn begin(&mut self, kind: RowKind, row_len: usize) {
        self.lens.clear();
        self.tokens.clear();
        self.rows.clear();
        self.kind = kind;
        self.row_len = row_len;
    }
    /// Appends the next request's proposal: `tokens` and, unless the kind is one-hot,
    /// `tokens.len()` rows.
    pub fn push(&mut self, tokens: &[u32], rows: &[f32]) -> Result<(), SpecError> {
        let want = if self.kind == RowKind::OneHot {
            0
        } else {
            tokens.len() * self.row_len
        };
        if rows.len() != want {
            return Err(SpecError::Contract(format!(
                "request {}: {} draft tokens with {} row values; {:?} rows need {want} \
                 ({} per token)",
                self.lens.len(),
                tokens.len(),
                rows.len(),
                self.kind,
                self.row_len
            )));
        }
        self.lens.push(tokens.len() as u32);
        self.tokens.extend_from_slice(tokens);
        self.rows.extend_from_slice(rows);
        Ok(())
    }
    /// Number of requests proposed for.
    pub fn len(&self) -> usize {
        self.lens.len()
    }
    /// True when no request was proposed for.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
    /// Offsets of each request's first draft (prefix sums of `lens`), written into `out`.
    pub fn offsets_into(&self, out: &mut Vec<usize>) {
        out.clear();
        let mut acc = 0;
        for &l in &self.lens {
            out.push(acc);
            acc += l as usize;
        }
    }
}

/// A proposer: guesses up to `k` next tokens for each live sequence of a step.
pub trait Proposer {
    /// Fills `out` (after [`Proposals::begin`]) with exactly one proposal per entry of `seqs`, in
    /// order, each at most [`proposal_cap`]`(len, max_len, k)` tokens long.
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        k: usize,
        out: &mut Proposals,
    ) -> Result<(), SpecError>;

    /// Whether proposing again after steps that did not call this proposer costs more than a
    /// usual proposal: a draft model's cache must first take in every token it missed. With
    /// [`Speculation::WhilePaying`], once plain steps have measured faster, such a proposer is
    /// not tried again in that `generate` call (each try would cost a catch-up as long as the
    /// plain run before it); a proposer that returns `false` (a lookup such as
    /// [`NgramProposer`]) is tried again for about 1/32 of the time. The default, `true`, is the
    /// safe answer for a proposer that keeps state.
    fn catches_up(&self) -> bool {
        true
    }
}

/// The proposer of plain decoding: proposes nothing, so every step is a `k = 0` step.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProposer;

impl Proposer for NoProposer {
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        _k: usize,
        out: &mut Proposals,
    ) -> Result<(), SpecError> {
        out.begin(RowKind::OneHot, 0);
        for _ in seqs {
            out.push(&[], &[])?;
        }
        Ok(())
    }

    fn catches_up(&self) -> bool {
        false
    }
}

/// The one place in `spec` where a [`VerifyBatch`] is built (its fields are changing upstream;
/// keeping one constructor keeps that change a one-line fix here).
pub(crate) fn verify_host(
    verifier: &crate::Verifier,
    vocab: u32,
    requests: &[Request],
    draft_ids: &[i32],
    target_logits: &[f32],
    draft: Draft<&[f32]>,
    draft_vocab: Option<u32>,
) -> Result<VerifyOutput, SpecError> {
    Ok(verifier.verify_blocking(&VerifyBatch {
        vocab_size: vocab,
        requests,
        draft_token_ids: draft_ids,
        target_logits: crate::Logits::F32(target_logits),
        draft: match draft {
            Draft::OneHot => Draft::OneHot,
            Draft::Probs(d) => Draft::Probs(crate::Logits::F32(d)),
            Draft::Logits(d) => Draft::Logits(crate::Logits::F32(d)),
        },
        draft_vocab_size: draft_vocab,
        synthetic_rates: None,
    })?)
}

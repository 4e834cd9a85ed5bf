//! Draft-model proposer: the app's small model behind the [`DraftModel`] trait, with top-1
//! proposer semantics (one proposal per request, per-request lengths, 0 past the max length).

use super::{proposal_cap, ModelError, Proposals, Proposer, RowKind, SeqView, SpecError};

/// A draft model the app implements. It sees every live sequence of a step with a cap on its
/// proposal, and writes one proposal per sequence (tokens and, for [`RowKind::Probs`] /
/// [`RowKind::Logits`], one row of `vocab_size()` values per token).
///
/// Contract of [`DraftModel::propose`]: `out` has been [`Proposals::begin`]-ed with
/// `row_kind()` and `vocab_size()`; push exactly `seqs.len()` proposals with
/// [`Proposals::push`], in order; the proposal for `seqs[i]` should hold at most `caps[i]`
/// tokens (`caps[i] == 0`: push an empty one — the sequence is at its length cap). Longer
/// proposals are cut to `caps[i]` by [`DraftModelProposer`]. For rejection sampling to be exact,
/// a drafter that returns rows must have *sampled* each token from its row (probabilities, or
/// the softmax of the logits at the request's temperature); a drafter without rows must be
/// deterministic given the sequence (e.g. greedy). The draft model keeps any state of its own
/// (e.g. a KV cache, per [`SeqView::request`]): between two calls a sequence grows by the tokens
/// the target emitted (accepted drafts and one more), so a cached drafter keeps the common
/// prefix of its cache and `seqs[i].tokens` and feeds the rest.
pub trait DraftModel {
    /// What the rows hold; [`RowKind::OneHot`] when the model returns no rows.
    fn row_kind(&self) -> RowKind;
    /// Length of a draft row: the draft vocabulary, at most the target's (smaller = padded
    /// target vocabulary; tokens past it have `q = 0`).
    fn vocab_size(&self) -> usize;
    /// Proposes up to `caps[i]` tokens after `seqs[i].tokens`, for every `i` (see the trait's
    /// contract).
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        caps: &[usize],
        out: &mut Proposals,
    ) -> Result<(), ModelError>;
}

/// Turns a [`DraftModel`] into a [`Proposer`]: computes each sequence's cap
/// ([`proposal_cap`]), calls the model once for the whole batch, checks what it returned and cuts
/// over-long proposals. Buffers are kept between steps (no allocation once grown).
#[derive(Debug)]
pub struct DraftModelProposer<M> {
    model: M,
    caps: Vec<usize>,
    raw: Proposals,
}

impl<M: DraftModel> DraftModelProposer<M> {
    /// Wraps `model`.
    pub fn new(model: M) -> Self {
        DraftModelProposer {
            model,
            caps: Vec::new(),
            raw: Proposals::default(),
        }
    }
    /// The wrapped model.
    pub fn model(&self) -> &M {
        &self.model
    }
    /// The wrapped model, mutably.
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }
    /// Unwraps the model.
    pub fn into_inner(self) -> M {
        self.model
    }
}

impl<M: DraftModel> Proposer for DraftModelProposer<M> {
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        k: usize,
        out: &mut Proposals,
    ) -> Result<(), SpecError> {
        let kind = self.model.row_kind();
        let row_len = self.model.vocab_size();
        if kind != RowKind::OneHot && row_len == 0 {
            return Err(SpecError::Contract(
                "the draft model returns rows but its vocab_size() is 0".into(),
            ));
        }
        self.caps.clear();
        self.caps.extend(
            seqs.iter()
                .map(|s| proposal_cap(s.tokens.len(), s.max_len, k)),
        );
        self.raw.begin(kind, row_len);
        self.model
            .propose(seqs, &self.caps, &mut self.raw)
            .map_err(SpecError::Model)?;
        if self.raw.len() != seqs.len() {
            return Err(SpecError::Contract(format!(
                "the draft model returned {} proposals for {} sequences (one each, empty ones \
                 included)",
                self.raw.len(),
                seqs.len()
            )));
        }
        let row = if kind == RowKind::OneHot { 0 } else { row_len };
        out.begin(kind, row_len);
        let mut at = 0usize;
        for (&len, &cap) in self.raw.lens.iter().zip(&self.caps) {
            let len = len as usize;
            let keep = len.min(cap);
            out.push(
                &self.raw.tokens[at..at + keep],
                &self.raw.rows[at * row..(at + keep) * row],
            )?;
            at += len;
        }
        Ok(())
    }
}

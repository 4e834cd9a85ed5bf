//! The scorer: how the target model's logits reach the verifier's row layout (SPEC §2: request
//! `r` owns `k_r + 1` consecutive rows; row `i < k_r` scores draft `d_i`, row `k_r` is the bonus
//! row).
//!
//! - **Multi-query** ([`TargetModel`]): the model scores all `k_r + 1` positions of a request in
//!   one sequence (feed the not-yet-cached tokens plus the drafts, keep the last `k_r + 1` rows).
//!   [`Sequences`] makes one from per-sequence KV-cached models ([`SequenceModel`]).
//! - **Batch expansion** ([`BatchExpansion`], vLLM's top-1 scorer) for a target that scores only
//!   the next position of each context ([`SingleQueryModel`]): a request with `k` drafts becomes
//!   `k + 1` single-query contexts (prefixes `[]`, `[d_0]`, …, `[d_0..d_{k−1}]`), and the scores
//!   are contracted back with [`gather_rows_cpu`] (on the GPU: [`super::GatherRows`]) by the index
//!   list of [`ExpansionLayout`].

use super::{gather_rows_cpu, ModelError};

/// One request of a scoring call.
#[derive(Clone, Copy, Debug)]
pub struct ScoreInput<'a> {
    /// The request's sequence slot in the model (its index in the batch given to
    /// [`super::SpecDecoder::generate`]).
    pub seq: usize,
    /// The whole sequence so far (prompt and generated tokens), never empty.
    pub tokens: &'a [u32],
    /// The drafts to score after it (`k_r` tokens, possibly none).
    pub drafts: &'a [u32],
}

impl ScoreInput<'_> {
    /// Rows this input owns in the output: `k_r + 1`.
    pub fn rows(&self) -> usize {
        self.drafts.len() + 1
    }
}

/// A target model that scores every position of a request at once (multi-query).
///
/// **Contract.** [`TargetModel::forward`] writes, for each input in order, `k_r + 1` rows of
/// `vocab_size()` logits into `out` (which has exactly `Σ (k_r + 1) × V` elements): row `i` is the
/// target's logits for the token that follows `tokens ++ drafts[..i]`; so row `i < k_r` scores
/// `drafts[i]` and row `k_r` is the bonus row. A KV-cached model feeds only what it has not cached
/// (`tokens[cached..] ++ drafts`); after the call its cache for `seq` may hold all of
/// `tokens ++ drafts`. The **decoder truncates**: after verification it calls
/// [`TargetModel::truncate`]`(seq, tokens.len() + accepted)`, dropping the rejected drafts (the
/// emitted token that follows the accepted drafts is not in the cache; it is fed at the next
/// step). The decoder never calls `forward` for a sequence whose cache holds more than
/// `tokens.len()` tokens; when a cache already holds all of `tokens`, the model must re-feed the
/// last token to produce row 0 (the [`Sequences`] adapter does that). Sequences that finished
/// are simply not scored again; their caches are the app's to free. At the start of
/// [`super::SpecDecoder::generate`] each slot's cache must be empty or hold a prefix of that
/// request's prompt (a shared system prompt, say): the decoder does not clear caches, so a slot
/// reused for a new prompt must be truncated by the app first.
pub trait TargetModel {
    /// Vocabulary size `V` (length of a logits row).
    fn vocab_size(&self) -> usize;
    /// Scores a batch (see the trait's contract).
    fn forward(&mut self, inputs: &[ScoreInput<'_>], out: &mut [f32]) -> Result<(), ModelError>;
    /// Rolls sequence `seq`'s KV cache back to its first `len` tokens (a no-op for a model
    /// without a cache).
    fn truncate(&mut self, seq: usize, len: usize) -> Result<(), ModelError>;
}

/// A per-sequence model with a KV cache: the usual shape of a local LLM (one object per
/// sequence). Wrap a `Vec` of them in [`Sequences`] to get a [`TargetModel`].
pub trait SequenceModel {
    /// Vocabulary size `V`.
    fn vocab_size(&self) -> usize;
    /// Tokens currently in the cache.
    fn len(&self) -> usize;
    /// True when the cache is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Appends `tokens` to the cache and returns the logits of every appended position,
    /// row-major `[tokens.len() × V]`.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError>;
    /// Like [`SequenceModel::forward`] but only the last `rows` positions' logits are needed
    /// (`1 ≤ rows ≤ tokens.len()`): override it to skip the LM head of a long prefill. The
    /// default calls `forward` and drops the leading rows.
    fn forward_last(&mut self, tokens: &[u32], rows: usize) -> Result<Vec<f32>, ModelError> {
        let mut all = self.forward(tokens)?;
        let v = self.vocab_size();
        if all.len() != tokens.len() * v {
            return Err(format!(
                "SequenceModel::forward returned {} values for {} tokens × vocab {v}",
                all.len(),
                tokens.len()
            )
            .into());
        }
        all.drain(..(tokens.len() - rows) * v);
        Ok(all)
    }
    /// Rolls the cache back to its first `len` tokens.
    fn truncate(&mut self, len: usize) -> Result<(), ModelError>;
}

/// One [`SequenceModel`] per request slot, as a batched [`TargetModel`]: input `seq` goes to
/// `models[seq]`, which is fed `tokens[cached..] ++ drafts` in one call and keeps the last
/// `k + 1` rows (the multi-query layout).
#[derive(Debug, Default)]
pub struct Sequences<M> {
    /// The per-sequence models; slot `i` serves request `i` of a generation.
    pub models: Vec<M>,
    feed: Vec<u32>,
}

impl<M> Sequences<M> {
    /// Wraps one model per request slot.
    pub fn new(models: Vec<M>) -> Self {
        Sequences {
            models,
            feed: Vec::new(),
        }
    }
}

impl<M: SequenceModel> TargetModel for Sequences<M> {
    fn vocab_size(&self) -> usize {
        self.models.first().map_or(0, |m| m.vocab_size())
    }

    fn forward(&mut self, inputs: &[ScoreInput<'_>], out: &mut [f32]) -> Result<(), ModelError> {
        let v = self.vocab_size();
        let mut at = 0usize;
        for input in inputs {
            let slots = self.models.len();
            let m = self
                .models
                .get_mut(input.seq)
                .ok_or_else(|| format!("sequence slot {} but only {slots} models", input.seq))?;
            let len = input.tokens.len();
            if m.len() > len {
                return Err(format!(
                    "sequence {}: the cache holds {} tokens, the sequence {len}; truncate it first",
                    input.seq,
                    m.len()
                )
                .into());
            }
            // Row 0 is the logits after the last token, so that token must be fed again when the
            // whole sequence is already cached.
            if m.len() == len {
                m.truncate(len - 1)?;
            }
            self.feed.clear();
            self.feed.extend_from_slice(&input.tokens[m.len()..]);
            self.feed.extend_from_slice(input.drafts);
            let rows = input.rows();
            let logits = m.forward_last(&self.feed, rows)?;
            if logits.len() != rows * v {
                return Err(format!(
                    "sequence {}: forward_last returned {} values, expected {rows} rows × {v}",
                    input.seq,
                    logits.len()
                )
                .into());
            }
            out[at..at + rows * v].copy_from_slice(&logits);
            at += rows * v;
        }
        Ok(())
    }

    fn truncate(&mut self, seq: usize, len: usize) -> Result<(), ModelError> {
        let slots = self.models.len();
        self.models
            .get_mut(seq)
            .ok_or_else(|| format!("sequence slot {seq} but only {slots} models"))?
            .truncate(len)
    }
}

/// One single-query context of batch expansion: `tokens ++ drafts`.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    /// The request's sequence slot.
    pub seq: usize,
    /// The sequence so far.
    pub tokens: &'a [u32],
    /// A prefix of the request's drafts (possibly empty) appended to `tokens`.
    pub drafts: &'a [u32],
}

/// A target that returns only the next position's logits for each context (no multi-query
/// kernel). Used through [`BatchExpansion`]. Suited to stateless scorers or ones that can fork
/// caches; a per-sequence KV-cached model is better served by [`Sequences`].
pub trait SingleQueryModel {
    /// Vocabulary size `V`.
    fn vocab_size(&self) -> usize;
    /// Writes into `out` (`queries.len() × V`) the logits of the token after each query's
    /// context `tokens ++ drafts`, row `i` for `queries[i]`.
    fn next_logits(&mut self, queries: &[Query<'_>], out: &mut [f32]) -> Result<(), ModelError>;
}

/// The index maths of batch expansion for per-request draft counts `k_r`.
///
/// Expanded order (what the single-query model sees), vLLM's: first every request with `k_r > 0`,
/// in request order, each as `k_r + 1` queries with prefixes of length `0..=k_r`; then the `k_r = 0`
/// requests, passed through, one query each, in request order:
///
/// ```text
/// k = [2, 0, 1]   verifier rows:  r0:[] r0:[d0] r0:[d0 d1] | r1:[] | r2:[] r2:[d0]
///                 expanded rows:  r0:[] r0:[d0] r0:[d0 d1] | r2:[] r2:[d0] | r1:[]
///                 contraction  = [0, 1, 2, 5, 3, 4]   (verifier row g ← expanded row)
///                 expansion    = [0, 1, 2, 4, 5, 3]   (expanded row e ← verifier row)
/// ```
///
/// Both index lists are permutations and inverse to each other, so contracting an expansion is
/// the identity. Buffers are reused by [`ExpansionLayout::build`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpansionLayout {
    /// Per expanded row: `(request, prefix length)`.
    pub queries: Vec<(u32, u32)>,
    /// Per verifier row: the expanded row holding its scores (the gather index list).
    pub contraction: Vec<u32>,
    /// Per expanded row: the verifier row it is contracted to.
    pub expansion: Vec<u32>,
    row_offsets: Vec<u32>,
}

impl ExpansionLayout {
    /// The layout for draft counts `lens` (one per request).
    pub fn new(lens: &[u32]) -> Self {
        let mut l = ExpansionLayout::default();
        l.build(lens);
        l
    }

    /// Recomputes the layout in place for draft counts `lens`, reusing the buffers.
    pub fn build(&mut self, lens: &[u32]) {
        self.queries.clear();
        self.row_offsets.clear();
        let mut rows = 0u32;
        for &k in lens {
            self.row_offsets.push(rows);
            rows += k + 1;
        }
        let total = rows as usize;
        self.contraction.clear();
        self.contraction.resize(total, 0);
        self.expansion.clear();
        self.expansion.resize(total, 0);
        let spec = lens.iter().enumerate().filter(|(_, &k)| k > 0);
        let plain = lens.iter().enumerate().filter(|(_, &k)| k == 0);
        for (r, &k) in spec.chain(plain) {
            for j in 0..=k {
                let e = self.queries.len() as u32;
                let g = self.row_offsets[r] + j;
                self.queries.push((r as u32, j));
                self.contraction[g as usize] = e;
                self.expansion[e as usize] = g;
            }
        }
    }

    /// Total rows (`Σ (k_r + 1)`), the same in both layouts.
    pub fn rows(&self) -> usize {
        self.queries.len()
    }

    /// Verifier-layout rows → expanded rows (`row_len` values per row): `expanded[e] =
    /// rows[expansion[e]]`.
    pub fn expand(&self, rows: &[f32], expanded: &mut [f32], row_len: usize) {
        gather_rows_cpu(rows, expanded, &self.expansion, row_len);
    }

    /// Expanded rows → verifier layout: `rows[g] = expanded[contraction[g]]` (on the GPU:
    /// [`super::GatherRows::record`] with `contraction`).
    pub fn contract(&self, expanded: &[f32], rows: &mut [f32], row_len: usize) {
        gather_rows_cpu(expanded, rows, &self.contraction, row_len);
    }
}

/// Batch expansion over a [`SingleQueryModel`], as a [`TargetModel`]: expands each request into
/// `k_r + 1` single-query contexts, scores them in one call, and contracts the rows back into the
/// verifier's layout (original order, `k = 0` requests passed through). The expanded logits
/// buffer and the layout are reused between calls; the small per-call query list is allocated.
/// `truncate` is a no-op: a single-query model keeps no per-sequence state here.
#[derive(Debug, Default)]
pub struct BatchExpansion<M> {
    /// The wrapped model.
    pub model: M,
    layout: ExpansionLayout,
    expanded: Vec<f32>,
    lens: Vec<u32>,
}

impl<M> BatchExpansion<M> {
    /// Wraps `model`.
    pub fn new(model: M) -> Self {
        BatchExpansion {
            model,
            layout: ExpansionLayout::default(),
            expanded: Vec::new(),
            lens: Vec::new(),
        }
    }
    /// The layout of the last call.
    pub fn layout(&self) -> &ExpansionLayout {
        &self.layout
    }
}

impl<M: SingleQueryModel> TargetModel for BatchExpansion<M> {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn forward(&mut self, inputs: &[ScoreInput<'_>], out: &mut [f32]) -> Result<(), ModelError> {
        let v = self.model.vocab_size();
        self.lens.clear();
        self.lens
            .extend(inputs.iter().map(|i| i.drafts.len() as u32));
        self.layout.build(&self.lens);
        let queries: Vec<Query<'_>> = self
            .layout
            .queries
            .iter()
            .map(|&(r, j)| {
                let input = &inputs[r as usize];
                Query {
                    seq: input.seq,
                    tokens: input.tokens,
                    drafts: &input.drafts[..j as usize],
                }
            })
            .collect();
        self.expanded.clear();
        self.expanded.resize(queries.len() * v, 0.0);
        self.model.next_logits(&queries, &mut self.expanded)?;
        self.layout.contract(&self.expanded, out, v);
        Ok(())
    }

    fn truncate(&mut self, _seq: usize, _len: usize) -> Result<(), ModelError> {
        Ok(())
    }
}

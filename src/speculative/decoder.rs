//! The decode loop: propose → score → verify → append, per live request, until every request
//! stops.

use super::{
    proposal_cap, verify_host, Metrics, Proposals, Proposer, RowKind, ScoreInput, SeqView,
    SpecError, TargetModel,
};
use crate::{Draft, Request, SamplingParams, Verifier, VerifyOutput};
use std::time::Instant;

/// Every request's tokens so far (prompt included) and why it stopped, if it has.
struct Progress {
    seqs: Vec<Vec<u32>>,
    stops: Vec<Option<StopReason>>,
}

/// Refuses what no step could handle: a vocabulary the verifier cannot index, an empty prompt.
fn check_requests(vocab: usize, requests: &[GenRequest]) -> Result<(), SpecError> {
    if vocab == 0 || vocab > i32::MAX as usize {
        return Err(SpecError::Invalid(format!(
            "the target's vocab_size() is {vocab}"
        )));
    }
    if let Some(i) = requests.iter().position(|r| r.prompt.is_empty()) {
        return Err(SpecError::Invalid(format!(
            "request {i} has an empty prompt; give at least one token (e.g. BOS)"
        )));
    }
    Ok(())
}

/// Debug-only faults of the decode loop, for the negative controls of the distribution tests:
/// deliberately wrong decoders that the tests must reject. Never use them for real work.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeFault {
    /// The correct loop.
    #[default]
    None,
    /// At a rejection, emit the rejected draft instead of the verifier's recovered token (the
    /// output then follows the draft distribution).
    EmitDraftOnReject,
    /// At a rejection, sample the token from the target's `p` at that row instead of the residual
    /// `max(p − q, 0)` (the accepted mass `min(p, q)` is then counted twice).
    ResampleFromTarget,
}

/// A sample from `softmax(row / t)` (argmax at `t = 0`) with its own random stream, for
/// [`DecodeFault::ResampleFromTarget`] only.
fn sample_faulty(row: &[f32], t: f32, seed: u64, position: usize) -> u32 {
    let bits = crate::rng::random_words(seed, crate::rng::row_position(position as u64, 0), 7, 0);
    let u = (f64::from(bits[0]) + 0.5) / 4_294_967_296.0;
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if t == 0.0 {
        return row.iter().position(|&x| x == m).unwrap_or(0) as u32;
    }
    let w: Vec<f64> = row
        .iter()
        .map(|&x| (f64::from(x - m) / f64::from(t)).exp())
        .collect();
    let mut left = u * w.iter().sum::<f64>();
    for (y, &x) in w.iter().enumerate() {
        if left < x {
            return y as u32;
        }
        left -= x;
    }
    (row.len() - 1) as u32
}

/// Settings of a [`SpecDecoder`].
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// `k`: drafts proposed per request and step (default 4); 0 is plain decoding.
    pub num_drafts: usize,
    /// End-of-sequence ids: a request stops after emitting one (it is kept in the output).
    pub eos: Vec<u32>,
    #[doc(hidden)]
    /// Deliberately wrong loop, only for negative controls.
    pub fault: DecodeFault,
}

impl Default for DecoderConfig {
    fn default() -> Self {
        DecoderConfig {
            num_drafts: 4,
            eos: Vec::new(),
            fault: DecodeFault::None,
        }
    }
}

/// One request of a generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    /// The prompt (at least one token).
    pub prompt: Vec<u32>,
    /// Sampling parameters given to the verifier (temperature 0 = greedy; a fixed seed makes the
    /// generation reproducible).
    pub params: SamplingParams,
    /// Most tokens the sequence may hold, prompt included.
    pub max_len: usize,
}

impl GenRequest {
    /// A request that may generate up to `max_new_tokens` tokens after `prompt`.
    pub fn new(prompt: Vec<u32>, params: SamplingParams, max_new_tokens: usize) -> Self {
        let max_len = prompt.len() + max_new_tokens;
        GenRequest {
            prompt,
            params,
            max_len,
        }
    }
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// It emitted an end-of-sequence id.
    Eos,
    /// It reached its `max_len`.
    MaxLen,
}

/// The outcome of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The generated tokens (after the prompt), the end-of-sequence id included when there was
    /// one.
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
}

/// The speculative decode loop over a [`TargetModel`], a [`Proposer`] and a [`Verifier`].
///
/// Each step, for the requests still running (in request order): the proposer drafts up to
/// [`proposal_cap`]`(len, max_len, k)` tokens per request; the target scores `k_r + 1` rows per
/// request in one [`TargetModel::forward`] call; the verifier (one call for the whole batch, at
/// `position = len`, the absolute index of the first draft) keeps `accepted` drafts and samples
/// one more token; the decoder then calls [`TargetModel::truncate`]`(seq, len + accepted)` to
/// drop the rejected drafts from the KV cache, and appends the emitted tokens one by one,
/// stopping a request at its first end-of-sequence id (kept) or at `max_len` (tokens past the
/// stop are discarded). With `num_drafts = 0`, or [`super::NoProposer`], this is plain decoding
/// through the same machinery (one token per request-step). The host-slice verifier API is used:
/// logits are uploaded once per step on a GPU verifier.
pub struct SpecDecoder<'v> {
    verifier: &'v Verifier,
    config: DecoderConfig,
    metrics: Metrics,
    proposals: Proposals,
    logits: Vec<f32>,
    requests: Vec<Request>,
    draft_ids: Vec<i32>,
    offsets: Vec<usize>,
    step_tokens: Vec<u32>,
}

impl<'v> SpecDecoder<'v> {
    /// A decoder verifying on `verifier`.
    pub fn new(verifier: &'v Verifier, config: DecoderConfig) -> Self {
        SpecDecoder {
            verifier,
            config,
            metrics: Metrics::default(),
            proposals: Proposals::default(),
            logits: Vec::new(),
            requests: Vec::new(),
            draft_ids: Vec::new(),
            offsets: Vec::new(),
            step_tokens: Vec::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The counters accumulated so far.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Zeroes the counters.
    pub fn reset_metrics(&mut self) {
        self.metrics = Metrics::default();
    }

    /// Generates for every request until it stops; request `i` uses sequence slot `i` of
    /// `target` (see [`TargetModel`] for what is cached and who truncates; a slot's cache must be
    /// empty or hold a prefix of its prompt when this is called). A prompt already at
    /// its `max_len` generates nothing (`StopReason::MaxLen`).
    pub fn generate<T, P>(
        &mut self,
        target: &mut T,
        proposer: &mut P,
        requests: &[GenRequest],
    ) -> Result<Vec<Generation>, SpecError>
    where
        T: TargetModel + ?Sized,
        P: Proposer + ?Sized,
    {
        let start = Instant::now();
        let vocab = target.vocab_size();
        check_requests(vocab, requests)?;
        let mut progress = Progress {
            seqs: requests.iter().map(|r| r.prompt.clone()).collect(),
            stops: requests
                .iter()
                .map(|r| (r.prompt.len() >= r.max_len).then_some(StopReason::MaxLen))
                .collect(),
        };
        let mut live: Vec<usize> = (0..requests.len())
            .filter(|&i| progress.stops[i].is_none())
            .collect();
        let k = self.config.num_drafts;
        while !live.is_empty() {
            // Propose.
            let t0 = Instant::now();
            let views: Vec<SeqView<'_>> = live
                .iter()
                .map(|&r| SeqView {
                    request: r,
                    tokens: &progress.seqs[r],
                    max_len: requests[r].max_len,
                    params: requests[r].params,
                })
                .collect();
            proposer.propose(&views, k, &mut self.proposals)?;
            self.check_proposals(&views, k, vocab)?;
            self.proposals.offsets_into(&mut self.offsets);
            let t1 = Instant::now();
            self.score(target, &views, vocab)?;
            let t2 = Instant::now();
            let out = self.verify(&views, vocab)?;
            drop(views);
            let t3 = Instant::now();
            self.append(target, requests, &live, &out, &mut progress, vocab)?;
            live.retain(|&r| progress.stops[r].is_none());
            self.metrics.propose_time += t1 - t0;
            self.metrics.score_time += t2 - t1;
            self.metrics.verify_time += t3 - t2;
        }
        self.metrics.elapsed += start.elapsed();
        Ok(progress
            .seqs
            .into_iter()
            .zip(requests)
            .zip(progress.stops)
            .map(|((s, req), stop)| Generation {
                tokens: s[req.prompt.len()..].to_vec(),
                stop: stop.unwrap_or(StopReason::MaxLen),
            })
            .collect())
    }

    /// The score step: the target's logits for every live sequence's drafts (plus one row) into
    /// `self.logits`.
    fn score<T: TargetModel + ?Sized>(
        &mut self,
        target: &mut T,
        views: &[SeqView<'_>],
        vocab: usize,
    ) -> Result<(), SpecError> {
        let inputs: Vec<ScoreInput<'_>> = views
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let at = self.offsets[i];
                ScoreInput {
                    seq: v.request,
                    tokens: v.tokens,
                    drafts: &self.proposals.tokens[at..at + self.proposals.lens[i] as usize],
                }
            })
            .collect();
        let rows: usize = inputs.iter().map(|i| i.rows()).sum();
        self.logits.clear();
        self.logits.resize(rows * vocab, 0.0);
        target
            .forward(&inputs, &mut self.logits)
            .map_err(SpecError::Model)?;
        self.metrics.target_calls += 1;
        Ok(())
    }

    /// The verify step: one verifier call over every live sequence's proposal and logits.
    fn verify(&mut self, views: &[SeqView<'_>], vocab: usize) -> Result<VerifyOutput, SpecError> {
        self.requests.clear();
        self.draft_ids.clear();
        for (i, v) in views.iter().enumerate() {
            self.requests.push(Request {
                num_drafts: self.proposals.lens[i],
                params: v.params,
                position: v.tokens.len() as u64,
            });
        }
        self.draft_ids
            .extend(self.proposals.tokens.iter().map(|&t| t as i32));
        let p = &self.proposals;
        let draft = match p.kind {
            RowKind::OneHot => Draft::OneHot,
            RowKind::Probs => Draft::Probs(&p.rows[..]),
            RowKind::Logits => Draft::Logits(&p.rows[..]),
        };
        let draft_vocab =
            (p.kind != RowKind::OneHot && p.row_len < vocab).then_some(p.row_len as u32);
        let out = verify_host(
            self.verifier,
            vocab as u32,
            &self.requests,
            &self.draft_ids,
            &self.logits,
            draft,
            draft_vocab,
        )?;
        self.metrics.verify_calls += 1;
        Ok(out)
    }

    /// The append step: per live sequence, roll the target's cache back to the accepted drafts,
    /// append the emitted tokens and stop at an end-of-sequence id or `max_len`.
    fn append<T: TargetModel + ?Sized>(
        &mut self,
        target: &mut T,
        requests: &[GenRequest],
        live: &[usize],
        out: &VerifyOutput,
        progress: &mut Progress,
        vocab: usize,
    ) -> Result<(), SpecError> {
        let mut row_at = 0usize;
        for (i, &r) in live.iter().enumerate() {
            let kr = self.proposals.lens[i] as usize;
            let accepted = out.accepted(i);
            self.metrics.record_step(kr, accepted);
            let len = progress.seqs[r].len();
            target
                .truncate(r, len + accepted)
                .map_err(SpecError::Model)?;
            self.step_tokens.clear();
            self.step_tokens
                .extend(out.emitted(i).iter().map(|&t| t as u32));
            if accepted < kr && self.config.fault != DecodeFault::None {
                let wrong = match self.config.fault {
                    DecodeFault::EmitDraftOnReject => {
                        self.proposals.tokens[self.offsets[i] + accepted]
                    }
                    _ => {
                        let row = &self.logits[(row_at + accepted) * vocab..][..vocab];
                        let at = len + accepted;
                        sample_faulty(row, requests[r].params.temperature, out.seeds[i], at)
                    }
                };
                *self.step_tokens.last_mut().expect("one token at least") = wrong;
            }
            row_at += kr + 1;
            for &t in &self.step_tokens {
                progress.seqs[r].push(t);
                self.metrics.appended += 1;
                if self.config.eos.contains(&t) {
                    progress.stops[r] = Some(StopReason::Eos);
                    break;
                }
                if progress.seqs[r].len() >= requests[r].max_len {
                    progress.stops[r] = Some(StopReason::MaxLen);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Checks the proposer's output against the step: one proposal per live sequence, each
    /// within its cap, rows consistent with the kind, draft rows no longer than the target's.
    fn check_proposals(
        &self,
        views: &[SeqView<'_>],
        k: usize,
        vocab: usize,
    ) -> Result<(), SpecError> {
        let p = &self.proposals;
        if p.lens.len() != views.len() {
            return Err(SpecError::Contract(format!(
                "the proposer returned {} proposals for {} live sequences",
                p.lens.len(),
                views.len()
            )));
        }
        for (i, (v, &l)) in views.iter().zip(&p.lens).enumerate() {
            let cap = proposal_cap(v.tokens.len(), v.max_len, k);
            if l as usize > cap {
                return Err(SpecError::Contract(format!(
                    "proposal {i} (request {}) has {l} drafts, more than its cap {cap} \
                     (k = {k}, length {} of {})",
                    v.request,
                    v.tokens.len(),
                    v.max_len
                )));
            }
        }
        let total: usize = p.lens.iter().map(|&l| l as usize).sum();
        let row = if p.kind == RowKind::OneHot {
            0
        } else {
            p.row_len
        };
        if p.tokens.len() != total || p.rows.len() != total * row {
            return Err(SpecError::Contract(format!(
                "the proposals hold {} tokens and {} row values for {total} drafts",
                p.tokens.len(),
                p.rows.len()
            )));
        }
        if p.kind != RowKind::OneHot && (p.row_len == 0 || p.row_len > vocab) {
            return Err(SpecError::Contract(format!(
                "draft rows are {} long; they must be 1..={vocab} (the target's vocabulary)",
                p.row_len
            )));
        }
        Ok(())
    }
}

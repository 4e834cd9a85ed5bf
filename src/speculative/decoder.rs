//! The decode loop: propose → score → verify → append, per live request, until every request
//! stops.

use super::{
    proposal_cap, verify_host, Metrics, Proposals, Proposer, RowKind, ScoreInput, SeqView,
    SpecError, TargetModel,
};
use crate::{Draft, Request, Rule, SamplingParams, Verifier, VerifyOutput};
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

/// When a [`SpecDecoder`] asks its proposer for drafts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculation {
    /// Every step asks for up to `num_drafts` drafts per request.
    Always,
    /// Speculate only while it pays (the default). A step whose live requests are all greedy
    /// (temperature 0 with [`Rule::Exact`] or [`Rule::Block`], whose output is the target's
    /// greedy output however many drafts are proposed; or with [`Rule::Synthetic`] at any
    /// temperature, the benchmarks' stand-in for them) runs with drafts or without them (plain
    /// decoding, one row per request), whichever has appended more tokens per second of wall
    /// time in the recent steps of this `generate` call; the slower way is tried again for
    /// about 1/32 of the time, so a change of pace (a copied passage starting or ending) is
    /// noticed, except a proposer that must catch up on the steps it missed
    /// ([`super::Proposer::catches_up`], a draft model), which plain steps that have measured
    /// faster replace for the rest of the call. Where speculation loses (drafts mostly
    /// rejected, or extra rows that cost nearly a whole call each) the decoder so falls back to
    /// plain decoding instead of running slower than it. A step with a sampled request always speculates: the way a step is taken would
    /// depend on timing, and a seeded sampled run's tokens (though distributed the same either
    /// way) would then differ from run to run.
    #[default]
    WhilePaying,
}

/// The recent wall time and appended tokens of steps without drafts (`[0]`) and with drafts
/// (`[1]`), each weighed down by [`Pace::DECAY`] per step, which [`Speculation::WhilePaying`]
/// compares; and when each way last ran.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pace {
    secs: [f64; 2],
    tokens: [f64; 2],
    steps: [u32; 2],
    /// How long each way's latest step took.
    last: [f64; 2],
    /// Wall time of the other way's steps since each way's latest step.
    since: [f64; 2],
}

impl Pace {
    /// A step's weight one step later: a memory of about ten steps, so that the choice follows
    /// the text (a copied passage starting or ending) within about twenty steps.
    const DECAY: f64 = 0.9;
    /// The slower way runs one step again once the faster one has run this many times as long
    /// as that step took the last time: about 1/33 of the time goes to trying it where its pace
    /// is unchanged.
    const PROBE_AFTER: f64 = 32.0;
    /// Steps of each way (without drafts, with drafts) before they are compared: two with
    /// drafts, so that one unlucky step (a first proposal rejected) does not keep the decoder on
    /// plain steps; one without, whose pace does not vary (a token a forward), and which is
    /// what trying costs where drafts win.
    const FIRST_STEPS: [u32; 2] = [1, 2];

    /// Whether the next step should propose drafts; a proposer that `catches_up`
    /// ([`Proposer::catches_up`]) is not tried again once plain steps are the faster way.
    pub(crate) fn speculate(&self, catches_up: bool) -> bool {
        if !self.compared() {
            // Drafts first, then the ways in turn.
            return self.steps[1] <= self.steps[0];
        }
        let faster = usize::from(self.drafts_faster());
        let slower = 1 - faster;
        if catches_up && faster == 0 {
            return false;
        }
        let due = self.since[slower] >= Self::PROBE_AFTER * self.last[slower];
        (if due { slower } else { faster }) == 1
    }

    /// Whether steps with drafts have appended more tokens per second than steps without.
    pub(crate) fn drafts_faster(&self) -> bool {
        let rate = |m: usize| self.tokens[m] / self.secs[m].max(f64::MIN_POSITIVE);
        rate(1) >= rate(0)
    }

    /// Whether both ways have been measured enough to be compared.
    pub(crate) fn compared(&self) -> bool {
        self.steps[0] >= Self::FIRST_STEPS[0] && self.steps[1] >= Self::FIRST_STEPS[1]
    }

    /// Counts one step that took `secs` and appended `tokens`, with drafts or without (a step
    /// whose proposer drafted nothing is a step without: it measured plain decoding's pace).
    pub(crate) fn record(&mut self, drafted: bool, secs: f64, tokens: u64) {
        for m in 0..2 {
            self.secs[m] *= Self::DECAY;
            self.tokens[m] *= Self::DECAY;
        }
        let m = usize::from(drafted);
        self.secs[m] += secs;
        self.tokens[m] += tokens as f64;
        self.steps[m] = self.steps[m].saturating_add(1);
        self.last[m] = secs;
        self.since[m] = 0.0;
        self.since[1 - m] += secs;
    }
}

/// Whether [`Speculation::WhilePaying`] may choose the way a step of this request is taken:
/// greedy requests whose output is the target's greedy output whatever is proposed, and
/// [`Rule::Synthetic`] ones, the benchmarks' stand-in for such requests (their tokens are
/// meaningless either way).
pub(crate) fn adapts(params: &SamplingParams) -> bool {
    params.rule == Rule::Synthetic
        || (params.temperature == 0.0 && matches!(params.rule, Rule::Exact | Rule::Block))
}

/// Settings of a [`SpecDecoder`].
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// `k`: drafts proposed per request and step (default 4); 0 is plain decoding.
    pub num_drafts: usize,
    /// End-of-sequence ids: a request stops after emitting one (it is kept in the output).
    pub eos: Vec<u32>,
    /// When to propose (default [`Speculation::WhilePaying`]).
    pub speculation: Speculation,
    #[doc(hidden)]
    /// Deliberately wrong loop, only for negative controls.
    pub fault: DecodeFault,
}

impl Default for DecoderConfig {
    fn default() -> Self {
        DecoderConfig {
            num_drafts: 4,
            eos: Vec::new(),
            speculation: Speculation::default(),
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
/// through the same machinery (one token per request-step). With [`Speculation::WhilePaying`]
/// (the default) a step of greedy requests may skip the proposer and score one row per request,
/// where that has been the faster way in this `generate` call ([`Metrics::plain_steps`] counts
/// those steps). The host-slice verifier API is used: logits are uploaded once per step on a GPU
/// verifier.
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
        // Learned anew by every call; its first step (a draft model's prefill of the prompt, cold
        // caches) is not counted.
        let mut pace = Pace::default();
        let mut first = true;
        while !live.is_empty() {
            // Propose.
            let t0 = Instant::now();
            let adaptive = self.config.speculation == Speculation::WhilePaying
                && k > 0
                && live.iter().all(|&r| adapts(&requests[r].params));
            let speculate = !adaptive || first || pace.speculate(proposer.catches_up());
            let step_k = if speculate { k } else { 0 };
            let views: Vec<SeqView<'_>> = live
                .iter()
                .map(|&r| SeqView {
                    request: r,
                    tokens: &progress.seqs[r],
                    max_len: requests[r].max_len,
                    params: requests[r].params,
                })
                .collect();
            if speculate {
                proposer.propose(&views, k, &mut self.proposals)?;
            } else {
                super::NoProposer.propose(&views, 0, &mut self.proposals)?;
            }
            self.check_proposals(&views, step_k, vocab)?;
            self.proposals.offsets_into(&mut self.offsets);
            let t1 = Instant::now();
            self.score(target, &views, vocab)?;
            let t2 = Instant::now();
            let out = self.verify(&views, vocab)?;
            drop(views);
            let t3 = Instant::now();
            let appended = self.metrics.appended;
            self.append(target, requests, &live, &out, &mut progress, vocab)?;
            if adaptive && !first {
                let secs = t0.elapsed().as_secs_f64();
                let drafted = !self.proposals.tokens.is_empty();
                pace.record(drafted, secs, self.metrics.appended - appended);
            }
            if !speculate {
                self.metrics.plain_steps += 1;
            }
            first = false;
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

#[cfg(test)]
mod tests {
    use super::Pace;

    /// Runs `steps` decisions on a machine where a step with drafts takes `spec.0` seconds for
    /// `spec.1` tokens and a step without `plain.0` for `plain.1` (as functions of the step's
    /// index); returns the decisions.
    fn simulate(
        pace: &mut Pace,
        steps: usize,
        catches_up: bool,
        spec: impl Fn(usize) -> (f64, u64),
        plain: impl Fn(usize) -> (f64, u64),
    ) -> Vec<bool> {
        (0..steps)
            .map(|i| {
                let drafts = pace.speculate(catches_up);
                let (secs, tokens) = if drafts { spec(i) } else { plain(i) };
                pace.record(drafts, secs, tokens);
                drafts
            })
            .collect()
    }

    fn count(ways: &[bool], drafts: bool) -> usize {
        ways.iter().filter(|&&w| w == drafts).count()
    }

    #[test]
    fn ways_take_turns_until_both_are_measured() {
        let mut pace = Pace::default();
        let ways = simulate(&mut pace, 3, false, |_| (1.0, 5), |_| (1.0, 1));
        assert_eq!(ways, [true, false, true]);
        assert!(pace.compared() && pace.drafts_faster());
    }

    #[test]
    fn the_faster_way_runs_and_the_slower_one_about_a_32nd_of_the_time() {
        // Drafts 5x faster per second: plain steps are probes only.
        let mut pace = Pace::default();
        let ways = simulate(&mut pace, 400, false, |_| (1.0, 5), |_| (1.0, 1));
        let plain = count(&ways[3..], false);
        assert!((4..=24).contains(&plain), "{plain} plain steps of 397");
        // Plain 5x faster (drafts' steps five times as long): drafts are probes only, and a
        // proposer that must catch up is never tried again.
        for (catches_up, lo, hi) in [(false, 2, 12), (true, 0, 0)] {
            let mut pace = Pace::default();
            let ways = simulate(&mut pace, 400, catches_up, |_| (5.0, 1), |_| (1.0, 1));
            let drafted = count(&ways[3..], true);
            assert!(
                (lo..=hi).contains(&drafted),
                "catches_up {catches_up}: {drafted} steps with drafts of 397"
            );
        }
    }

    #[test]
    fn a_change_of_pace_is_followed() {
        // Drafts win for 100 steps, then every draft is rejected (a copied passage ends): the
        // decoder is on plain steps within about twenty steps, and tries drafts only as probes
        // (one every 48 steps: 32 times a 1.5 s step) after that.
        let mut pace = Pace::default();
        let spec = |i: usize| if i < 100 { (1.0, 5) } else { (1.5, 1) };
        let ways = simulate(&mut pace, 200, false, spec, |_| (1.0, 1));
        let late = count(&ways[125..], true);
        assert!(
            late <= 2,
            "{late} steps with drafts from 25 steps after the change"
        );
        // Plain wins for 100 steps, then drafts start to be accepted: noticed at the next probe.
        let mut pace = Pace::default();
        let spec = |i: usize| if i < 100 { (1.5, 1) } else { (1.5, 6) };
        let ways = simulate(&mut pace, 250, false, spec, |_| (1.0, 1));
        let late = count(&ways[200..], true);
        assert!(
            late >= 45,
            "{late} of 50 steps with drafts long after the change"
        );
    }
}

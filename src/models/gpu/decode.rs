//! The decode loop on the GPU: the target (and the draft model, when there is one) forward on
//! the GPU through [`GpuSequence`], and the verifier reads the target's logits in place, in the
//! same command encoder. Per decode step one readback crosses to the host: the verifier's
//! emitted tokens. Logits never leave the GPU, and neither do a draft model's drafts.
//!
//! One step, with `L` tokens committed and the last of them (`pending`) not yet in the caches:
//!
//! ```text
//! propose  : draft model: k × (draft forward of one token, fed the previous draft from the GPU
//!            → verifier samples / takes the argmax of its row → token copied into the ids
//!            buffer; the row is copied into the q buffer when drafts are sampled), each
//!            submitted as soon as it is recorded
//!            n-gram: a lookup in the committed tokens, nothing on the GPU
//! score    : target forward of [pending, d_1 .. d_k] → k + 1 logits rows on the GPU
//! verify   : Verifier::record over those rows (same encoder; draft-model ids read from the
//!            ids buffer), one small readback
//! commit   : append the emitted tokens, truncate both KV caches to what was kept
//! ```
//!
//! Plain decoding ([`GpuProposer::None`]) runs the same kernels without drafts and without
//! waiting for each token: the forward of token `t + 1` reads token `t` from the verifier's
//! output on the GPU, so the host records windows of [`PLAIN_WINDOW`] tokens ahead and reads a
//! window back while the next one runs (a token per step still costs a forward and a verifier
//! call; only the host's wait between them is gone). Because each position's logits are the same
//! bits however many rows a call scores, greedy speculative output equals greedy plain output
//! exactly, and a seeded sampled run gives the same tokens either way (its draws are keyed by
//! position).

use super::sequence::{finish_read, start_read, PendingRead};
use super::{GpuModelError, GpuSequence};
use crate::speculative::{
    Metrics, NgramProposer, NgramTreeProposer, Pace, Speculation, StopReason,
};
use crate::tree::{TreeNode, TreeRequest};
use crate::{Draft, GpuDraft, GpuRows, GpuTreeBatch, GpuVerifyBatch, Request, SamplingParams};
use crate::{PendingTree, Verifier};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Tokens plain decoding records before it reads them back; two windows are in flight, so the
/// GPU runs one while the host reads the other. Up to `2 · PLAIN_WINDOW − 1` tokens past an
/// end-of-sequence token are computed and dropped.
pub const PLAIN_WINDOW: usize = 8;

/// Tokens of a plain run that [`Speculation::WhilePaying`] tries instead of a step with a draft
/// model: two windows, so that the GPU runs one while the host reads the other, as in plain
/// decoding.
pub const PLAIN_RUN: usize = 2 * PLAIN_WINDOW;

/// Where a step's drafts come from.
#[derive(Debug)]
pub enum GpuProposer {
    /// No drafts: plain decoding.
    None,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's
    /// last n-gram (no model, no GPU work).
    Ngram(NgramProposer),
    /// Prompt lookup as a tree: the continuations of several earlier occurrences merged into a
    /// trie, scored in one target call with tree attention ([`GpuSequence::record_tree`]) and
    /// verified as a tree ([`Verifier::record_tree`]); `num_drafts` is the tree's depth.
    NgramTree(NgramTreeProposer),
    /// A draft model on the same device (a smaller model, or a layer-skip copy of the target),
    /// greedy at temperature 0, else sampled from its processed distribution at the request's
    /// temperature and controls, its rows kept on the GPU as the verifier's `q`.
    Model(Box<GpuSequence>),
}

/// Settings of [`GpuDecoder`].
#[derive(Clone, Debug)]
pub struct GpuDecodeConfig {
    /// Drafts per step (`k`), at most [`super::MAX_ROWS`] − 1.
    pub num_drafts: usize,
    /// End-of-sequence ids: generation stops after emitting one (it is kept).
    pub eos: Vec<u32>,
    /// Conditional acceptance rates per draft position for [`crate::Rule::Synthetic`] requests
    /// (benchmarks with random weights); ignored by the other rules.
    pub synthetic_rates: Option<Vec<f32>>,
    /// When to propose. With a draft model ([`GpuProposer::Model`]), the default
    /// [`Speculation::WhilePaying`] makes greedy generations try plain runs of [`PLAIN_RUN`]
    /// tokens, recorded ahead as plain decoding does, and once those have appended more tokens
    /// per second the draft model is not tried again in that `generate` call, which then
    /// decodes plainly to its end. N-gram drafts always speculate (a step without a match is
    /// already a plain burst; plain runs measured slower for them on the H200).
    pub speculation: Speculation,
}

impl Default for GpuDecodeConfig {
    fn default() -> Self {
        GpuDecodeConfig {
            num_drafts: 4,
            eos: Vec::new(),
            synthetic_rates: None,
            speculation: Speculation::default(),
        }
    }
}

/// The outcome of [`GpuDecoder::generate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuGeneration {
    /// The generated tokens (prompt excluded).
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
}

/// Speculative decoding of one sequence with the target model on the GPU (see the module
/// documentation for one step). The verifier must run on the models' device
/// ([`Verifier::with_device`] with [`super::GpuModel::device`] / `queue`).
pub struct GpuDecoder<'v> {
    verifier: &'v Verifier,
    target: GpuSequence,
    proposer: GpuProposer,
    config: GpuDecodeConfig,
    /// Draft logits rows (`k × V` f32) when drafts are sampled: the verifier's `q`.
    q_rows: Option<wgpu::Buffer>,
    /// The draft model's drafted ids of a step (`MAX_ROWS` u32), written on the GPU.
    draft_ids: Option<wgpu::Buffer>,
    /// The two input ids of a first draft after a step that accepted every draft (its last
    /// draft and the bonus token), gathered on the GPU.
    pair_ids: Option<wgpu::Buffer>,
    /// The next step's first draft, already submitted: its verifier call (the drafted token)
    /// and the committed length it drafts after.
    ahead: Option<(crate::PendingVerify, usize)>,
    /// Steps with a draft model by drafts accepted: the order in which the next first draft is
    /// recorded ahead for each outcome.
    outcomes: [u64; super::MAX_ROWS],
    /// With n-gram drafts: the current step's drafts and verification, submitted during the
    /// previous step on a guess its readback confirmed.
    guessed: Option<(Vec<u32>, crate::PendingVerify)>,
    /// With n-gram trees: the current step's tree and verification (and the target's length
    /// before its forward), submitted during the previous step on a guess its readback
    /// confirmed.
    guessed_tree: Option<(Vec<TreeNode>, PendingTree, usize)>,
    guessed_steps: u64,
    metrics: Metrics,
}

/// The seed of draft sampling, kept apart from the verifier's stream for the same request so
/// that the draft's choices and the acceptance tests are independent (SPEC §5 keys every draw
/// by seed and position).
fn draft_seed(seed: u64) -> u64 {
    seed ^ 0xd1b5_4a32_d192_ed03
}

impl<'v> GpuDecoder<'v> {
    /// A decoder over `target` (an empty sequence) with `proposer`; the verifier must share the
    /// target's device.
    pub fn new(
        verifier: &'v Verifier,
        target: GpuSequence,
        proposer: GpuProposer,
        config: GpuDecodeConfig,
    ) -> Result<GpuDecoder<'v>, GpuModelError> {
        let Some((device, _)) = verifier.device() else {
            return Err(GpuModelError::Invalid(
                "the GPU decoder needs a GPU verifier on the model's device \
                 (Verifier::with_device(model.device().clone(), model.queue().clone(), ..))"
                    .into(),
            ));
        };
        if device != target.model().device() {
            return Err(GpuModelError::Invalid(
                "the verifier runs on another device than the target model: build it with \
                 Verifier::with_device on the model's device and queue"
                    .into(),
            ));
        }
        if config.num_drafts + 1 > super::MAX_ROWS {
            return Err(GpuModelError::Invalid(format!(
                "num_drafts {} is more than the forward scores at once ({} rows = k + 1)",
                config.num_drafts,
                super::MAX_ROWS
            )));
        }
        if let GpuProposer::Model(draft) = &proposer {
            let (d, t) = (draft.model().config(), target.model().config());
            if d.vocab_size != t.vocab_size {
                return Err(GpuModelError::Invalid(format!(
                    "the draft's vocabulary ({}) differs from the target's ({})",
                    d.vocab_size, t.vocab_size
                )));
            }
            if draft.model().device() != target.model().device() {
                return Err(GpuModelError::Invalid(
                    "the draft model lives on another device than the target".into(),
                ));
            }
        }
        if !target.is_empty() {
            return Err(GpuModelError::Invalid(
                "the target sequence must be empty: the decoder owns its cache".into(),
            ));
        }
        Ok(GpuDecoder {
            verifier,
            target,
            proposer,
            config,
            q_rows: None,
            draft_ids: None,
            pair_ids: None,
            ahead: None,
            outcomes: [0; super::MAX_ROWS],
            guessed: None,
            guessed_tree: None,
            guessed_steps: 0,
            metrics: Metrics::default(),
        })
    }

    /// What was counted since the decoder was made or [`GpuDecoder::reset_metrics`].
    /// `score_time` includes the verification, which is recorded into the target forward's
    /// submission (so `verify_time` stays zero); with a draft model, `propose_time` is the
    /// host's recording of the drafts and their GPU time falls in `score_time` (the step waits
    /// once, at its end); `elapsed` also includes the prompt's prefill.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Steps with n-gram drafts that were recorded during the previous step on a guess of its
    /// outcome and submitted as soon as its readback confirmed the guess.
    pub fn guessed_steps(&self) -> u64 {
        self.guessed_steps
    }

    /// Clears the counters.
    pub fn reset_metrics(&mut self) {
        self.metrics = Metrics::default();
    }

    /// Generates up to `max_new_tokens` after `prompt` (caches are reset first).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: SamplingParams,
        max_new_tokens: usize,
    ) -> Result<GpuGeneration, GpuModelError> {
        if prompt.is_empty() {
            return Err(GpuModelError::Invalid("the prompt is empty".into()));
        }
        let start = Instant::now();
        // One seed for the whole generation (positions tell its draws apart), so a sampled run
        // is one stream of SPEC §5 randomness; drawn from the clock when the caller gave none.
        let mut params = params;
        if params.seed.is_none() {
            params.seed = Some(clock_seed());
        }
        let mut seq = Committed::new(prompt);
        self.prefill(prompt)?;
        if matches!(self.proposer, GpuProposer::None) {
            let (tokens, stop) = self.plain(&mut seq, &params, max_new_tokens)?;
            self.metrics.elapsed += start.elapsed();
            return Ok(GpuGeneration { tokens, stop });
        }
        let mut out = Vec::new();
        // Only a draft model chooses. N-gram drafts keep speculating: where they find no match
        // a step is already a plain burst, and on the H200 plain runs cost them more than they
        // saved (code-editing prompt 2.47x plain against 3.12x, Python prompt 0.88x against
        // 0.87x; docs/gpu-decoding.md). So no step guessed ahead (n-gram only) is ever in
        // flight when a plain run starts.
        let adaptive = self.config.speculation == Speculation::WhilePaying
            && self.config.num_drafts > 0
            && matches!(self.proposer, GpuProposer::Model(_))
            && crate::speculative::adapts(&params);
        // As `SpecDecoder` does: learned anew by every call, its first step (the draft model's
        // prefill of the prompt) not counted.
        let mut pace = Pace::default();
        let mut first = true;
        let stop = loop {
            if out.len() >= max_new_tokens {
                break StopReason::MaxLen;
            }
            let t0 = Instant::now();
            // A draft model catches up on the tokens it missed (`catches_up`).
            if adaptive && !first && !pace.speculate(true) {
                // A draft model that plain runs have beaten is not tried again: the rest of
                // the call is one plain run.
                let n = if pace.compared() && !pace.drafts_faster() {
                    max_new_tokens - out.len()
                } else {
                    PLAIN_RUN.min(max_new_tokens - out.len())
                };
                let (tokens, stop) = self.plain_run(&mut seq, &params, n)?;
                pace.record(false, t0.elapsed().as_secs_f64(), tokens.len() as u64);
                out.extend_from_slice(&tokens);
                if stop == StopReason::Eos {
                    break StopReason::Eos;
                }
                continue;
            }
            let cap = (max_new_tokens - out.len())
                .saturating_sub(1)
                .min(self.config.num_drafts);
            let proposed = self.metrics.proposed;
            let emitted = self.step(&mut seq, &params, cap, max_new_tokens - out.len())?;
            let drafted = self.metrics.proposed > proposed;
            if adaptive && !first {
                let secs = t0.elapsed().as_secs_f64();
                pace.record(drafted, secs, emitted.len() as u64);
            }
            first = false;
            let mut stop = None;
            for &t in &emitted {
                if out.len() >= max_new_tokens {
                    stop = Some(StopReason::MaxLen);
                    break;
                }
                out.push(t);
                self.metrics.appended += 1;
                if self.config.eos.contains(&t) {
                    stop = Some(StopReason::Eos);
                    break;
                }
            }
            if let Some(s) = stop {
                break s;
            }
        };
        self.metrics.elapsed += start.elapsed();
        Ok(GpuGeneration { tokens: out, stop })
    }

    /// Feeds all prompt tokens but the last to the target (and the draft model); the last one is
    /// scored in the first step.
    fn prefill(&mut self, prompt: &[u32]) -> Result<(), GpuModelError> {
        if let Some((p, _)) = self.ahead.take() {
            self.verifier.release(p);
        }
        if let Some((_, p, _)) = self.guessed_tree.take() {
            self.verifier.release_tree(p);
        }
        if let Some((_, p)) = self.guessed.take() {
            self.verifier.release(p);
        }
        self.target.truncate(0)?;
        if let GpuProposer::Model(d) = &mut self.proposer {
            d.truncate(0)?;
        }
        let head = &prompt[..prompt.len() - 1];
        for chunk in head.chunks(super::MAX_ROWS) {
            self.forward_only(chunk)?;
        }
        // Wait for the prompt here, so that the first step's time is the step's alone.
        let device = self.target.model().device();
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuModelError::Invalid(format!("waiting for the prompt: {e}")))?;
        Ok(())
    }
}

/// The committed tokens of the sequence being decoded, and how far each cache has consumed them.
struct Committed {
    tokens: Vec<u32>,
}

impl Committed {
    fn new(prompt: &[u32]) -> Self {
        Committed {
            tokens: prompt.to_vec(),
        }
    }
}

impl<'v> GpuDecoder<'v> {
    fn queue(&self) -> &wgpu::Queue {
        self.target.model().queue()
    }

    fn encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.target
            .model()
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    /// Appends `tokens` to the target and the draft model without reading anything back.
    fn forward_only(&mut self, tokens: &[u32]) -> Result<(), GpuModelError> {
        let mut enc = self.encoder("specdec.decode prefill");
        self.target.record(&mut enc, tokens, 1)?;
        if let GpuProposer::Model(d) = &mut self.proposer {
            d.record(&mut enc, tokens, 1)?;
        }
        self.queue().submit([enc.finish()]);
        Ok(())
    }

    /// One decode step (module documentation): returns the emitted tokens, already appended to
    /// `seq`, with both caches truncated to what was kept.
    fn step(
        &mut self,
        seq: &mut Committed,
        params: &SamplingParams,
        cap: usize,
        remaining: usize,
    ) -> Result<Vec<u32>, GpuModelError> {
        if matches!(self.proposer, GpuProposer::Model(_)) {
            // Another step surely follows (barring an end-of-sequence token) when even a step
            // that accepts every draft leaves tokens to generate.
            return self.step_device_drafts(seq, params, cap, remaining >= cap + 2);
        }
        if matches!(self.proposer, GpuProposer::NgramTree(_)) {
            return self.step_tree(seq, params, cap, remaining);
        }
        let t0 = Instant::now();
        let len = seq.tokens.len();
        // A step submitted during the last one, whose guess the readback confirmed.
        let (drafts, verify) = match self.guessed.take() {
            Some(step) => step,
            None => {
                let drafts = self.propose(seq, cap);
                if drafts.is_empty() && cap > 0 {
                    // No draft (no n-gram match): `cap + 1` plain tokens recorded ahead, as
                    // plain decoding does, rather than one token with the host waiting for it.
                    return self.plain_burst(seq, params, cap + 1);
                }
                let (commands, verify) =
                    self.record_host_step(seq.tokens[len - 1], len, &drafts, params)?;
                self.queue().submit([commands]);
                (drafts, verify)
            }
        };
        let t1 = Instant::now();
        let guess = self.guess_next(seq, &drafts, params, remaining)?;
        let out = self.verifier.read_blocking(verify)?;
        let (accepted, emitted) = (out.accepted(0), out.emitted(0));
        let mut target_len = None;
        if let Some(g) = guess {
            if accepted == drafts.len() && emitted.last() == Some(&(g.bonus as i32)) {
                self.queue().submit([g.commands]);
                self.guessed = Some((g.drafts, g.verify));
                self.guessed_steps += 1;
                target_len = Some(g.target_len);
            } else {
                drop(g.commands);
                self.verifier.release(g.verify);
            }
        }
        let t2 = Instant::now();
        self.metrics.propose_time += t1 - t0;
        self.metrics.score_time += t2 - t1;
        let emitted = self.commit(seq, drafts.len(), accepted, emitted)?;
        if let Some(l) = target_len {
            // The guessed step's forward, submitted above, appends after what was kept.
            self.target.set_len(l);
        }
        Ok(emitted)
    }

    /// One step with an n-gram tree of depth at most `cap`: the target scores `[pending, tree]`
    /// with tree attention, the verifier walks the tree in the same submission, and after the
    /// readback the accepted path's cache entries move into place. While it runs, the next step
    /// is recorded on the guess that this one accepts the tree's first-child path (the chain
    /// drafter's proposal, already in place in the cache) and emits the n-gram's next token, and
    /// submitted when the readback confirms that, as chain steps do ([`GpuDecoder::step`]).
    /// Returns the emitted tokens, appended to `seq`.
    fn step_tree(
        &mut self,
        seq: &mut Committed,
        params: &SamplingParams,
        cap: usize,
        remaining: usize,
    ) -> Result<Vec<u32>, GpuModelError> {
        let GpuProposer::NgramTree(proposer) = &self.proposer else {
            unreachable!("step_tree runs for tree proposers only");
        };
        let t0 = Instant::now();
        let len = seq.tokens.len();
        let (nodes, pending, base) = match self.guessed_tree.take() {
            Some(step) => step,
            None => {
                let mut nodes: Vec<TreeNode> = Vec::new();
                proposer.propose_into(&seq.tokens, cap, &mut nodes);
                if nodes.is_empty() && cap > 0 {
                    return self.plain_burst(seq, params, cap + 1);
                }
                let base = self.target.len();
                let (commands, pending) =
                    self.record_tree_step(seq.tokens[len - 1], len, &nodes, params)?;
                self.queue().submit([commands]);
                (nodes, pending, base)
            }
        };
        let t1 = Instant::now();
        let guess = self.guess_next_tree(seq, &nodes, base, params, remaining)?;
        let verdict = self
            .verifier
            .read_tree_blocking(pending)?
            .requests
            .swap_remove(0);
        let mut target_len = None;
        if let Some(g) = guess {
            let bonus = verdict.tokens.last() == Some(&(g.bonus as i32));
            if verdict.accepted_nodes == g.path && bonus {
                self.queue().submit([g.commands]);
                self.guessed_tree = Some((g.nodes, g.verify, g.base));
                self.guessed_steps += 1;
                target_len = Some(g.target_len);
            } else {
                drop(g.commands);
                self.verifier.release_tree(g.verify);
            }
        }
        let path: Vec<usize> = std::iter::once(0)
            .chain(verdict.accepted_nodes.iter().map(|&v| v as usize + 1))
            .collect();
        let mut enc = self.encoder("specdec.decode keep path");
        if self.target.keep_path(&mut enc, base, &path)? {
            self.queue().submit([enc.finish()]);
        }
        self.metrics.propose_time += t1 - t0;
        self.metrics.score_time += t1.elapsed();
        // Per depth: a tree proposes a token at depth d when it reaches d.
        let depth = tree_depth(&nodes);
        let emitted = self.commit(seq, depth, verdict.accepted_nodes.len(), &verdict.tokens)?;
        if let Some(l) = target_len {
            // The guessed step's forward, submitted above, appends after what was kept.
            self.target.set_len(l);
        }
        Ok(emitted)
    }

    /// Records (without submitting) the target's tree forward of `[pending, nodes]` after the
    /// `len` committed tokens and the tree verification of its rows.
    fn record_tree_step(
        &mut self,
        pending: u32,
        len: usize,
        nodes: &[TreeNode],
        params: &SamplingParams,
    ) -> Result<(wgpu::CommandBuffer, PendingTree), GpuModelError> {
        let mut tokens = vec![pending];
        tokens.extend(nodes.iter().map(|n| n.token as u32));
        let mut parents = vec![-1];
        parents.extend(nodes.iter().map(|n| n.parent + 1));
        let vocab = self.target.model().config().vocab_size;
        let request = [TreeRequest {
            nodes,
            params: *params,
            position: len as u64,
        }];
        let mut enc = self.encoder("specdec.decode tree step");
        let logits = self.target.record_tree(&mut enc, &tokens, &parents)?;
        let pending = self.verifier.record_tree(
            &mut enc,
            &GpuTreeBatch {
                vocab_size: vocab as u32,
                requests: &request,
                target_logits: logits.gpu_rows(),
                draft: GpuDraft::OneHot,
                draft_vocab_size: None,
            },
        )?;
        Ok((enc.finish(), pending))
    }

    /// While a tree step over `nodes` (forwarded from target length `base`) runs: the next
    /// step recorded on the guess that it accepts the first-child path and emits the token the
    /// n-gram predicts after it. `None` where nothing can be guessed or fewer than 2 tokens
    /// would remain after the step.
    fn guess_next_tree(
        &mut self,
        seq: &Committed,
        nodes: &[TreeNode],
        base: usize,
        params: &SamplingParams,
        remaining: usize,
    ) -> Result<Option<TreeGuess>, GpuModelError> {
        let GpuProposer::NgramTree(proposer) = &self.proposer else {
            return Ok(None);
        };
        // The first-child path is nodes 0..c: node i's parent is i − 1 for as long as that
        // lasts, and a node's first child is the lowest-numbered one.
        let c = (0..nodes.len())
            .take_while(|&i| nodes[i].parent == i as i32 - 1)
            .count();
        let emitted = c + 1;
        if c == 0 || remaining < emitted + 2 {
            return Ok(None);
        }
        let cap = (remaining - emitted - 1).min(self.config.num_drafts);
        let mut text = seq.tokens.clone();
        text.extend(nodes[..c].iter().map(|n| n.token as u32));
        let Some(&bonus) = proposer.chain().lookup(&text, 1).first() else {
            return Ok(None);
        };
        text.push(bonus);
        let mut next = Vec::new();
        proposer.propose_into(&text, cap, &mut next);
        if next.is_empty() {
            return Ok(None);
        }
        // The KV cache may not be replaced while an alternative is recorded.
        self.target.reserve(next.len() + 1)?;
        let now = self.target.len();
        let guessed_base = base + emitted;
        self.target.set_len(guessed_base);
        let recorded = self.record_tree_step(bonus, seq.tokens.len() + emitted, &next, params);
        let target_len = self.target.len();
        self.target.set_len(now);
        let (commands, verify) = recorded?;
        Ok(Some(TreeGuess {
            bonus,
            path: (0..c as u32).collect(),
            nodes: next,
            commands,
            verify,
            base: guessed_base,
            target_len,
        }))
    }

    /// Records (without submitting) the target forward of `[pending, drafts]` at positions
    /// `len − 1..` and the verification of its rows.
    fn record_host_step(
        &mut self,
        pending: u32,
        len: usize,
        drafts: &[u32],
        params: &SamplingParams,
    ) -> Result<(wgpu::CommandBuffer, crate::PendingVerify), GpuModelError> {
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.push(pending);
        input.extend_from_slice(drafts);
        let draft_ids: Vec<i32> = drafts.iter().map(|&d| d as i32).collect();
        let vocab = self.target.model().config().vocab_size;
        let request = target_request(params, len, drafts.len());
        let rates = step_rates(&self.config, drafts.len());
        let mut enc = self.encoder("specdec.decode step");
        let logits = self.target.record(&mut enc, &input, input.len())?;
        let verify = self.verifier.record(
            &mut enc,
            &GpuVerifyBatch {
                vocab_size: vocab as u32,
                requests: &[request],
                draft_token_ids: &draft_ids,
                target_logits: logits.gpu_rows(),
                draft: Draft::OneHot,
                draft_vocab_size: None,
                synthetic_rates: rates,
            },
        )?;
        Ok((enc.finish(), verify))
    }

    /// With n-gram drafts, while a step of `drafts` runs: the next step recorded on the guess
    /// that this one accepts every draft and emits, as its bonus token, the token the n-gram
    /// predicts after them (on copied text both usually hold). `None` where no guess can be
    /// made or fewer than 2 tokens would remain after the step.
    fn guess_next(
        &mut self,
        seq: &Committed,
        drafts: &[u32],
        params: &SamplingParams,
        remaining: usize,
    ) -> Result<Option<Guess>, GpuModelError> {
        let GpuProposer::Ngram(n) = &self.proposer else {
            return Ok(None);
        };
        let emitted = drafts.len() + 1;
        if drafts.is_empty() || remaining < emitted + 2 {
            return Ok(None);
        }
        let cap = (remaining - emitted - 1).min(self.config.num_drafts);
        let mut text = seq.tokens.clone();
        text.extend_from_slice(drafts);
        let look = n.lookup(&text, cap + 1).to_vec();
        let [bonus, next @ ..] = &look[..] else {
            return Ok(None);
        };
        if next.is_empty() {
            return Ok(None);
        }
        // The KV cache may not be replaced while an alternative is recorded.
        self.target.reserve(next.len() + 1)?;
        let len = seq.tokens.len() + emitted;
        let (commands, verify) = self.record_host_step(*bonus, len, next, params)?;
        Ok(Some(Guess {
            bonus: *bonus,
            drafts: next.to_vec(),
            commands,
            verify,
            target_len: self.target.len(),
        }))
    }

    /// Counts a verified step of `drafts` drafts, appends its emitted tokens to `seq` and keeps
    /// in both caches everything committed but the new pending token.
    fn commit(
        &mut self,
        seq: &mut Committed,
        drafts: usize,
        accepted: usize,
        emitted: &[i32],
    ) -> Result<Vec<u32>, GpuModelError> {
        let emitted: Vec<u32> = emitted.iter().map(|&t| t as u32).collect();
        self.metrics.target_calls += 1;
        self.metrics.verify_calls += 1;
        self.metrics.record_step(drafts, accepted);
        seq.tokens.extend_from_slice(&emitted);
        let keep = seq.tokens.len() - 1;
        self.target.truncate(keep)?;
        // A first draft submitted ahead has consumed the new pending token too.
        let draft_keep = match &self.ahead {
            Some((_, at)) if *at == seq.tokens.len() => *at,
            _ => keep,
        };
        if let GpuProposer::Model(d) = &mut self.proposer {
            let l = d.len().min(draft_keep);
            d.truncate(l)?;
        }
        Ok(emitted)
    }
}

impl<'v> GpuDecoder<'v> {
    /// Up to `cap` drafts for the next positions of `seq` from the host-side proposers (none,
    /// n-gram); a draft model's drafts stay on the GPU ([`GpuDecoder::step_device_drafts`]).
    fn propose(&mut self, seq: &Committed, cap: usize) -> Vec<u32> {
        match &mut self.proposer {
            GpuProposer::Ngram(n) => n.lookup(&seq.tokens, cap).to_vec(),
            GpuProposer::None | GpuProposer::Model(_) | GpuProposer::NgramTree(_) => Vec::new(),
        }
    }

    /// The buffers a draft-model step writes on the GPU: the drafted ids (`MAX_ROWS` u32) and,
    /// when drafts are sampled, their logits rows (the verifier's `q`).
    fn draft_buffers(
        &mut self,
        sampled: bool,
    ) -> Result<(wgpu::Buffer, Option<wgpu::Buffer>), GpuModelError> {
        let device = self.target.model().device().clone();
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let make = |label: &str, size: u64, usage| {
            crate::gpu::scoped(&device, || {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage,
                    mapped_at_creation: false,
                })
            })
        };
        if self.draft_ids.is_none() {
            let ids_usage = usage | wgpu::BufferUsages::COPY_SRC;
            let ids = make(
                "specdec.decode draft ids",
                4 * super::MAX_ROWS as u64,
                ids_usage,
            )?;
            self.draft_ids = Some(ids);
        }
        if sampled && self.q_rows.is_none() {
            let row_bytes = (self.target.model().config().vocab_size * 4) as u64;
            let k = self.config.num_drafts.max(1) as u64;
            self.q_rows = Some(make("specdec.decode q rows", row_bytes * k, usage)?);
        }
        let ids = self.draft_ids.clone().expect("made above");
        Ok((ids, if sampled { self.q_rows.clone() } else { None }))
    }

    /// One step with a draft model, every draft on the GPU: draft `i` is one draft forward (fed
    /// draft `i − 1` straight from the previous verifier call's output buffer) and a 0-draft
    /// verifier request over its row (the argmax at temperature 0, else a sample of the
    /// processed distribution under the draft's own seed), whose token is copied into the ids
    /// buffer; sampled drafts also copy the row into the q buffer. Each draft is submitted as it
    /// is recorded, so the GPU runs while the host records the next; the target scores
    /// `[pending, d_1 .. d_k]` and verifies them against those ids in the last submission, and
    /// its emitted tokens are the step's one readback.
    ///
    /// While the GPU runs that, the host records the next step's first draft once per possible
    /// outcome (`a` = 0..=k drafts accepted: the draft model appends the emitted token `a`, or
    /// its last draft and the bonus token when all were accepted, read from the verifier's
    /// output on the GPU) and submits the one the readback names at once, so the GPU does not
    /// wait for the host between steps. `more`: another step follows.
    fn step_device_drafts(
        &mut self,
        seq: &mut Committed,
        params: &SamplingParams,
        cap: usize,
        more: bool,
    ) -> Result<Vec<u32>, GpuModelError> {
        let t0 = Instant::now();
        let sampled = params.temperature > 0.0;
        let (ids, q_rows) = self.draft_buffers(sampled)?;
        let verifier = self.verifier;
        let vocab = self.target.model().config().vocab_size;
        let row_bytes = (vocab * 4) as u64;
        let draft_params = draft_params(params);
        let len = seq.tokens.len();
        let device = self.target.model().device().clone();
        let queue = self.target.model().queue().clone();
        let new_encoder = |label| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
        };
        let mut drafted: Vec<crate::PendingVerify> = Vec::with_capacity(cap);
        match self.ahead.take() {
            Some((p, at)) if at == len && cap > 0 => drafted.push(p),
            Some((p, _)) => verifier.release(p),
            None => {}
        }
        for i in drafted.len()..cap {
            let GpuProposer::Model(d) = &mut self.proposer else {
                unreachable!("step_device_drafts is called for a draft model");
            };
            let mut enc = new_encoder("specdec.decode draft");
            let logits = match drafted.last() {
                None => {
                    let (head, last) = split_last_chunk(&seq.tokens[d.len()..]);
                    for chunk in head.chunks(super::MAX_ROWS) {
                        d.record(&mut enc, chunk, 1)?;
                    }
                    d.record(&mut enc, last, 1)?
                }
                Some(prev) => {
                    let from = crate::DeviceIds {
                        buffer: prev.output_buffer(),
                        offset: 0,
                    };
                    d.record_device_tokens(&mut enc, &[], from, 1, 1)?
                }
            };
            let request = draft_request(&draft_params, len + i);
            let pending = verifier.record(
                &mut enc,
                &one_row_batch(vocab, &request, logits.gpu_rows(), None),
            )?;
            // Request 0's first emitted token is word 0 of the output.
            enc.copy_buffer_to_buffer(pending.output_buffer(), 0, &ids, 4 * i as u64, 4);
            if let Some(q) = &q_rows {
                enc.copy_buffer_to_buffer(logits.buffer, 0, q, i as u64 * row_bytes, row_bytes);
            }
            queue.submit([enc.finish()]);
            drafted.push(pending);
        }
        let t1 = Instant::now();
        let pending = seq.tokens[len - 1];
        let request = target_request(params, len, cap);
        let rates = step_rates(&self.config, cap);
        let mut enc = new_encoder("specdec.decode step");
        let from = crate::DeviceIds {
            buffer: &ids,
            offset: 0,
        };
        let logits = self
            .target
            .record_device_tokens(&mut enc, &[pending], from, cap, cap + 1)?;
        let q = match (&q_rows, cap > 0) {
            (Some(q), true) => Draft::Logits(GpuRows::f32(q, 0)),
            _ => Draft::OneHot,
        };
        // Placeholders: the verifier reads the ids from `ids` on the GPU.
        let placeholders = vec![0i32; cap];
        let batch = GpuVerifyBatch {
            vocab_size: vocab as u32,
            requests: &[request],
            draft_token_ids: &placeholders,
            target_logits: logits.gpu_rows(),
            draft: q,
            draft_vocab_size: None,
            synthetic_rates: rates,
        };
        let verify = verifier.record_device_drafts(&mut enc, &batch, from)?;
        queue.submit([enc.finish()]);
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        queue.on_submitted_work_done(move || flag.store(true, Ordering::Release));
        let t2 = Instant::now();
        let ahead = if more && cap > 0 {
            let (out, q) = (verify.output_buffer(), q_rows.as_ref());
            self.record_first_drafts(len, cap, out, &ids, q, &draft_params, &done)?
        } else {
            Vec::new()
        };
        let t3 = Instant::now();
        let out = verifier.read_blocking(verify);
        for p in drafted {
            verifier.release(p);
        }
        let out = out?;
        let accepted = out.accepted(0);
        self.outcomes[accepted] += 1;
        self.submit_ahead(ahead, accepted, len);
        let t4 = Instant::now();
        self.metrics.propose_time += (t1 - t0) + (t3 - t2);
        self.metrics.score_time += (t2 - t1) + (t4 - t3);
        self.commit(seq, cap, accepted, out.emitted(0))
    }

    /// Submits the first draft recorded ahead for the outcome `accepted` of the step after `len`
    /// committed tokens, if there is one, and frees the others.
    fn submit_ahead(
        &mut self,
        ahead: Vec<(usize, wgpu::CommandBuffer, crate::PendingVerify, usize)>,
        accepted: usize,
        len: usize,
    ) {
        for (a, commands, pending, after) in ahead {
            if a == accepted {
                self.queue().submit([commands]);
                if let GpuProposer::Model(d) = &mut self.proposer {
                    d.set_len(after);
                }
                self.ahead = Some((pending, len + a + 1));
            } else {
                drop(commands);
                self.verifier.release(pending);
            }
        }
    }

    /// The next step's first draft for the outcomes `a` = 0..=`cap` of the step in flight (`len`
    /// tokens committed before it, its verifier output in `out`, its drafts in `ids`), the most
    /// frequent outcomes first, until the GPU has finished the step (`done`): recording one
    /// costs the host about what the draft forward costs the GPU, so recording all of them
    /// would make the host the bottleneck. Returns each outcome, its command buffer (not
    /// submitted), its verifier call and the draft model's length after it; the draft model's
    /// length is left as it was.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn record_first_drafts(
        &mut self,
        len: usize,
        cap: usize,
        out: &wgpu::Buffer,
        ids: &wgpu::Buffer,
        q_rows: Option<&wgpu::Buffer>,
        draft_params: &SamplingParams,
        done: &AtomicBool,
    ) -> Result<Vec<(usize, wgpu::CommandBuffer, crate::PendingVerify, usize)>, GpuModelError> {
        let device = self.target.model().device().clone();
        let vocab = self.target.model().config().vocab_size;
        if self.pair_ids.is_none() {
            let pair = crate::gpu::scoped(&device, || {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("specdec.decode first draft ids"),
                    size: 16,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })?;
            self.pair_ids = Some(pair);
        }
        let pair = self.pair_ids.clone().expect("made above");
        let verifier = self.verifier;
        let GpuProposer::Model(d) = &mut self.proposer else {
            unreachable!("record_first_drafts is called for a draft model");
        };
        // The draft model holds the committed tokens and drafts 1..cap−1.
        let drafted_len = d.len();
        debug_assert_eq!(drafted_len, len + cap - 1);
        // The KV cache may not be replaced while alternatives are recorded.
        d.reserve(2)?;
        let mut order: Vec<usize> = (0..=cap).collect();
        order.sort_by_key(|&a| std::cmp::Reverse((self.outcomes[a], a)));
        let mut out_ahead = Vec::with_capacity(cap + 1);
        for a in order {
            let _ = device.poll(wgpu::PollType::Poll);
            if done.load(Ordering::Acquire) {
                break;
            }
            let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("specdec.decode first draft ahead"),
            });
            let logits = if a < cap {
                // Drafts a+1.. were rejected: forget them, append the emitted token a.
                d.set_len(len + a);
                let from = crate::DeviceIds {
                    buffer: out,
                    offset: 4 * a as u64,
                };
                d.record_device_tokens(&mut enc, &[], from, 1, 1)?
            } else {
                // Every draft accepted: append the last draft and the bonus token.
                d.set_len(drafted_len);
                enc.copy_buffer_to_buffer(ids, 4 * (cap as u64 - 1), &pair, 0, 4);
                enc.copy_buffer_to_buffer(out, 4 * cap as u64, &pair, 4, 4);
                let from = crate::DeviceIds {
                    buffer: &pair,
                    offset: 0,
                };
                d.record_device_tokens(&mut enc, &[], from, 2, 1)?
            };
            // The committed length after outcome a, which the draft model now holds.
            let after = len + a + 1;
            let request = draft_request(draft_params, after);
            let pending = verifier.record(
                &mut enc,
                &one_row_batch(vocab, &request, logits.gpu_rows(), None),
            )?;
            enc.copy_buffer_to_buffer(pending.output_buffer(), 0, ids, 0, 4);
            if let Some(q) = q_rows {
                let row_bytes = (vocab * 4) as u64;
                enc.copy_buffer_to_buffer(logits.buffer, 0, q, 0, row_bytes);
            }
            out_ahead.push((a, enc.finish(), pending, after));
        }
        d.set_len(drafted_len);
        Ok(out_ahead)
    }
}

/// The parameters a draft model samples its drafts with: the request's, under a seed of its
/// own; a synthetic target rule has no meaning there.
fn draft_params(params: &SamplingParams) -> SamplingParams {
    let mut p = *params;
    p.seed = params.seed.map(draft_seed);
    if p.rule == crate::Rule::Synthetic {
        p.rule = crate::Rule::Exact;
    }
    p
}

/// The 0-draft verifier request that draws a draft model's token for `position`.
fn draft_request(params: &SamplingParams, position: usize) -> [Request; 1] {
    [Request {
        num_drafts: 0,
        params: *params,
        position: position as u64,
    }]
}

/// A 0-draft verifier call over one logits row: a draft model's token, or one plain decoding
/// step (`rates` for its synthetic rule).
fn one_row_batch<'a>(
    vocab: usize,
    request: &'a [Request],
    logits: GpuRows<'a>,
    rates: Option<&'a [f32]>,
) -> GpuVerifyBatch<'a> {
    GpuVerifyBatch {
        vocab_size: vocab as u32,
        requests: request,
        draft_token_ids: &[],
        target_logits: logits,
        draft: Draft::OneHot,
        draft_vocab_size: None,
        synthetic_rates: rates,
    }
}

/// A step recorded while the previous one ran (`GpuDecoder::guess_next`), submitted only if the
/// previous step's outcome matches the guess.
struct Guess {
    /// The bonus token the previous step is guessed to emit (this step's pending token).
    bonus: u32,
    drafts: Vec<u32>,
    commands: wgpu::CommandBuffer,
    verify: crate::PendingVerify,
    /// The target's length once this step's forward is in.
    target_len: usize,
}

/// A tree step recorded ahead on a guess ([`GpuDecoder::guess_next_tree`]).
struct TreeGuess {
    /// The bonus token the previous step is guessed to emit (this step's pending token).
    bonus: u32,
    /// The nodes the previous step is guessed to accept: its first-child path.
    path: Vec<u32>,
    nodes: Vec<TreeNode>,
    commands: wgpu::CommandBuffer,
    verify: PendingTree,
    /// The target's length before this step's forward, and after it.
    base: usize,
    target_len: usize,
}

/// Little-endian u32 words of a readback (its bytes need not be 4-aligned in memory).
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// A window of plain decoding in flight: its tokens' ids on the GPU and their readback.
struct Window {
    /// The emitted ids, one u32 per token, in order.
    ids: wgpu::Buffer,
    count: usize,
    pendings: Vec<crate::PendingVerify>,
    read: PendingRead,
}

impl<'v> GpuDecoder<'v> {
    /// Plain decoding of up to `max_new` tokens after `seq`, windows recorded ahead of the
    /// readback (module documentation). Leaves the target's cache holding everything committed
    /// but the last token, as a step does.
    fn plain(
        &mut self,
        seq: &mut Committed,
        params: &SamplingParams,
        max_new: usize,
    ) -> Result<(Vec<u32>, StopReason), GpuModelError> {
        let t0 = Instant::now();
        let base = seq.tokens.len();
        let mut out = Vec::new();
        let mut inflight: VecDeque<Window> = VecDeque::new();
        let mut recorded = 0;
        let stop = loop {
            while inflight.len() < 2 && recorded < max_new {
                let n = PLAIN_WINDOW.min(max_new - recorded);
                let prev = inflight.back().map(|w| (&w.ids, w.count));
                let w =
                    self.record_window(seq.tokens[base - 1], prev, base + recorded, n, params)?;
                recorded += n;
                inflight.push_back(w);
            }
            let Some(w) = inflight.pop_front() else {
                break StopReason::MaxLen;
            };
            let tokens = self.read_window(w)?;
            let mut stop = None;
            for &t in &tokens {
                out.push(t);
                seq.tokens.push(t);
                self.metrics.appended += 1;
                self.metrics.target_calls += 1;
                self.metrics.verify_calls += 1;
                self.metrics.record_step(0, 0);
                if self.config.eos.contains(&t) {
                    stop = Some(StopReason::Eos);
                    break;
                }
            }
            if let Some(s) = stop {
                break s;
            }
        };
        // Windows recorded past the end run on the GPU and are dropped; the cache forgets them.
        self.target.truncate(seq.tokens.len() - 1)?;
        self.metrics.score_time += t0.elapsed();
        Ok((out, stop))
    }

    /// A plain run of up to `n` tokens in place of speculative steps
    /// ([`Speculation::WhilePaying`]): no step is in flight, and a first draft recorded ahead
    /// for the next step is dropped (the draft model catches up when it drafts again).
    fn plain_run(
        &mut self,
        seq: &mut Committed,
        params: &SamplingParams,
        n: usize,
    ) -> Result<(Vec<u32>, StopReason), GpuModelError> {
        if let Some((p, _)) = self.ahead.take() {
            self.verifier.release(p);
        }
        self.metrics.plain_steps += 1;
        self.plain(seq, params, n)
    }

    /// `n` plain tokens after `seq` in one window (one readback), appended to `seq`; the target
    /// keeps everything committed but the last token, as after a step.
    fn plain_burst(
        &mut self,
        seq: &mut Committed,
        params: &SamplingParams,
        n: usize,
    ) -> Result<Vec<u32>, GpuModelError> {
        let t0 = Instant::now();
        let len = seq.tokens.len();
        let w = self.record_window(seq.tokens[len - 1], None, len, n, params)?;
        let tokens = self.read_window(w)?;
        for _ in 0..n {
            self.metrics.target_calls += 1;
            self.metrics.verify_calls += 1;
            self.metrics.record_step(0, 0);
        }
        self.metrics.score_time += t0.elapsed();
        seq.tokens.extend_from_slice(&tokens);
        Ok(tokens)
    }

    /// Waits for window `w` and returns its tokens, its verifier calls ended.
    fn read_window(&self, w: Window) -> Result<Vec<u32>, GpuModelError> {
        let bytes = finish_read(self.target.model().device(), w.read)?;
        for p in w.pendings {
            self.verifier.release(p);
        }
        let mut tokens = words(&bytes);
        tokens.truncate(w.count);
        Ok(tokens)
    }

    /// Records and submits `n` plain steps for positions `position..position + n`: the first
    /// forwards `host` (the committed last token) or, after another window, that window's last
    /// id on the GPU; each later one forwards the previous step's token from the GPU.
    fn record_window(
        &mut self,
        host: u32,
        prev: Option<(&wgpu::Buffer, usize)>,
        position: usize,
        n: usize,
        params: &SamplingParams,
    ) -> Result<Window, GpuModelError> {
        let model = self.target.model().clone();
        let device = model.device();
        let ids = crate::gpu::scoped(device, || {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("specdec.decode plain ids"),
                size: (4 * n as u64).next_multiple_of(16),
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let verifier = self.verifier;
        let vocab = model.config().vocab_size;
        let mut pendings = Vec::with_capacity(n);
        for i in 0..n {
            let mut enc = self.encoder("specdec.decode plain");
            let from = match (i, prev) {
                (0, None) => None,
                (0, Some((buffer, count))) => Some((buffer, count - 1)),
                (_, _) => Some((&ids, i - 1)),
            };
            let logits = match from {
                None => self.target.record(&mut enc, &[host], 1)?,
                Some((buffer, at)) => {
                    let ids = crate::DeviceIds {
                        buffer,
                        offset: 4 * at as u64,
                    };
                    self.target.record_device_tokens(&mut enc, &[], ids, 1, 1)?
                }
            };
            let request = [target_request(params, position + i, 0)];
            let rates = step_rates(&self.config, 0);
            let batch = one_row_batch(vocab, &request, logits.gpu_rows(), rates);
            let pending = verifier.record(&mut enc, &batch)?;
            // Request 0's first emitted token is word 0 of the output.
            enc.copy_buffer_to_buffer(pending.output_buffer(), 0, &ids, 4 * i as u64, 4);
            self.queue().submit([enc.finish()]);
            pendings.push(pending);
        }
        let read = start_read(model.device(), model.queue(), &ids, 4 * n as u64)?;
        Ok(Window {
            ids,
            count: n,
            pendings,
            read,
        })
    }
}

/// The target's verification request of a step: `drafts` drafts after the `len` committed
/// tokens.
fn target_request(params: &SamplingParams, len: usize, drafts: usize) -> Request {
    Request {
        num_drafts: drafts as u32,
        params: *params,
        position: len as u64,
    }
}

/// The depth of a tree's deepest node (0 for no nodes; a child of the root has depth 1).
fn tree_depth(nodes: &[TreeNode]) -> usize {
    let mut depth = vec![0usize; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        depth[i] = if n.parent < 0 {
            1
        } else {
            depth[n.parent as usize] + 1
        };
    }
    depth.into_iter().max().unwrap_or(0)
}

/// The synthetic rule's rates for a step of `drafts` drafts (benchmarks).
fn step_rates(config: &GpuDecodeConfig, drafts: usize) -> Option<&[f32]> {
    let r = config.synthetic_rates.as_deref()?;
    Some(&r[..drafts.min(r.len())])
}

/// `feed` as the tokens before its last `MAX_ROWS`-sized chunk and that chunk (never empty when
/// `feed` is not), so the last forward call of a feed is the one whose row is read.
fn split_last_chunk(feed: &[u32]) -> (&[u32], &[u32]) {
    let n = feed.len();
    let tail = match n % super::MAX_ROWS {
        0 => super::MAX_ROWS.min(n),
        r => r,
    };
    feed.split_at(n - tail)
}

/// A seed for a generation whose parameters name none.
fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // splitmix64's finaliser, so nearby clock readings give unrelated seeds.
    let mut z = nanos.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

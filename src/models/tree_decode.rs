//! Speculative decoding of one sequence with tree drafts on the CPU: an n-gram tree proposer
//! ([`NgramTreeProposer`]), one target forward per step over the whole tree
//! ([`Model::forward_tree`]), tree verification ([`crate::tree::verify_on_cpu`]), and the KV
//! cache cut back to the accepted path ([`Model::keep_path`]). With `max_matches = 1` the
//! proposer drafts a chain and with no proposer every step is a plain decode step, through the
//! same code: the three differ only in what they draft. [`generate_tree_with`] drafts with a
//! draft model instead ([`DraftTreeProposer`]: top-k trees).

use std::time::Instant;

use super::draft_tree::DraftTreeProposer;
use super::model::Model;
use crate::speculative::{NgramTreeProposer, SpecError};
use crate::tree::{verify_on_cpu, TreeBatch, TreeNode, TreeRequest};
use crate::{Draft, SamplingParams};

/// What [`generate_tree`] does.
#[derive(Clone, Copy, Debug)]
pub struct TreeGenOptions {
    /// Tokens to generate after the prompt.
    pub max_new_tokens: usize,
    /// Sampling of the target (the seed makes a run reproducible).
    pub params: SamplingParams,
    /// The drafter; `None` decodes plainly (one token per target call).
    pub proposer: Option<NgramTreeProposer>,
    /// Deepest draft path (the chain length `k` of a chain drafter).
    pub depth: usize,
    /// Threads of the CPU verifier.
    pub verify_threads: usize,
}

/// The result of [`generate_tree`].
#[derive(Clone, Debug, PartialEq)]
pub struct TreeGeneration {
    /// The generated tokens (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Target forwards after the prefill: one per step.
    pub target_calls: usize,
    /// Draft nodes scored over all steps.
    pub nodes_scored: usize,
    /// Wall time of the steps (the prefill excluded), seconds.
    pub decode_seconds: f64,
}

impl TreeGeneration {
    /// Generated tokens per target call.
    pub fn tokens_per_call(&self) -> f64 {
        self.tokens.len() as f64 / self.target_calls.max(1) as f64
    }
    /// Generated tokens per second of decode time.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens.len() as f64 / self.decode_seconds.max(f64::MIN_POSITIVE)
    }
}

/// Generates `max_new_tokens` after `prompt` (at least one token) with a fresh `model`
/// sequence. Emitted tokens are distributed exactly as the target's own sampling (greedy:
/// exactly its argmax text), whatever the drafter.
pub fn generate_tree(
    model: &mut Model,
    prompt: &[u32],
    opts: &TreeGenOptions,
) -> Result<TreeGeneration, SpecError> {
    let ngram = opts.proposer;
    run(model, prompt, opts, &mut |seq, depth, nodes| {
        match &ngram {
            Some(p) => p.propose_into(seq, depth, nodes),
            None => nodes.clear(),
        }
        Ok(())
    })
}

/// [`generate_tree`] with trees drafted by a draft model (`opts.proposer` is not used); the
/// draft's time counts in the decode time.
pub fn generate_tree_with(
    model: &mut Model,
    prompt: &[u32],
    opts: &TreeGenOptions,
    draft: &mut DraftTreeProposer,
) -> Result<TreeGeneration, SpecError> {
    run(model, prompt, opts, &mut |seq, depth, nodes| {
        draft
            .propose_into(seq, depth, nodes)
            .map_err(|e| SpecError::Model(e.into()))
    })
}

/// A drafter of [`run`]: writes the tree for a sequence, at most the given depth.
type Propose<'a> = dyn FnMut(&[u32], usize, &mut Vec<TreeNode>) -> Result<(), SpecError> + 'a;

/// The decode loop of [`generate_tree`] over any drafter.
fn run(
    model: &mut Model,
    prompt: &[u32],
    opts: &TreeGenOptions,
    propose: &mut Propose<'_>,
) -> Result<TreeGeneration, SpecError> {
    let Some((&root, head)) = prompt.split_last() else {
        return Err(SpecError::Invalid("the prompt is empty".into()));
    };
    model.reset();
    if !head.is_empty() {
        model
            .forward_last(head, 1)
            .map_err(|e| SpecError::Model(e.into()))?;
    }
    let mut seq = prompt.to_vec();
    let mut root = root;
    let mut out = TreeGeneration {
        tokens: Vec::new(),
        target_calls: 0,
        nodes_scored: 0,
        decode_seconds: 0.0,
    };
    let (mut nodes, mut tokens, mut parents) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    while out.tokens.len() < opts.max_new_tokens {
        let left = opts.max_new_tokens - out.tokens.len();
        // Deeper than what is left would score rows no one keeps.
        propose(&seq, opts.depth.min(left - 1), &mut nodes)?;
        tokens.clear();
        tokens.push(root);
        tokens.extend(nodes.iter().map(|n: &TreeNode| n.token as u32));
        parents.clear();
        parents.push(-1);
        parents.extend(nodes.iter().map(|n| n.parent + 1));
        let base = model.len();
        let logits = model
            .forward_tree(&tokens, &parents)
            .map_err(|e| SpecError::Model(e.into()))?;
        let request = [TreeRequest {
            nodes: &nodes,
            params: opts.params,
            position: seq.len() as u64,
        }];
        let verdict = verify_on_cpu(
            &TreeBatch {
                vocab_size: model.vocab_size() as u32,
                requests: &request,
                target_logits: (&logits).into(),
                draft: Draft::OneHot,
                draft_vocab_size: None,
            },
            opts.verify_threads,
        )?
        .requests
        .swap_remove(0);
        let path: Vec<usize> = std::iter::once(0)
            .chain(verdict.accepted_nodes.iter().map(|&v| v as usize + 1))
            .collect();
        model
            .keep_path(base, &path)
            .map_err(|e| SpecError::Model(e.into()))?;
        out.target_calls += 1;
        out.nodes_scored += nodes.len();
        for &t in verdict.tokens.iter().take(left) {
            out.tokens.push(t as u32);
            seq.push(t as u32);
        }
        root = *seq.last().expect("the sequence is never empty");
    }
    out.decode_seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

//! Tree verification: many candidate continuations per request, verified losslessly in one pass.
//!
//! [`crate::Verifier::verify_tree_blocking`] verifies a [`TreeBatch`] held in host memory on the
//! GPU (or the CPU backend); [`crate::Verifier::record_tree`] records a
//! [`crate::GpuTreeBatch`] whose rows live in the caller's GPU buffers into the caller's encoder,
//! and [`crate::Verifier::read_tree_blocking`] reads the verdicts. [`verify_on_cpu`] runs the CPU
//! twin alone.
//!
//! A tree drafter (EAGLE-2/3, Medusa, an n-gram lookup with several earlier matches) proposes
//! several tokens per position. One target call scores every node, and the verifier keeps the
//! longest path the target's own sampling would have produced, so the emitted text is
//! distributed exactly as if the target had sampled it token by token (greedy requests: the
//! target's argmax path).
//!
//! # Layout
//!
//! A [`TreeRequest`] holds `n` nodes in topological order: node `v` has a token and a parent
//! index, `-1` for a child of the root (the root is the last committed token). Its target rows
//! are `n + 1` rows of `vocab_size` logits: row 0 scores the root's children, row `v + 1` scores
//! node `v`'s children and is the bonus row when `v` ends the accepted path. A chain of `k`
//! drafts is the tree whose node `i` has parent `i − 1`; it verifies exactly as the chain
//! verifier does (same tokens for the same seed and position), so chain and tree requests mix
//! freely in one [`TreeBatch`].
//!
//! With a draft distribution ([`Draft::Probs`] / [`Draft::Logits`]) there is one row per
//! *expanding* node, in order: the root's first, then every node that has children, by index.
//! Row `s` is `q` at that node's position, the distribution its children were drawn from.
//!
//! # Rules
//!
//! - **Greedy** (`temperature == 0`): from the root, follow the child whose token is the row's
//!   argmax (ties: lowest id); where no child matches, emit the argmax.
//! - **Children without a distribution** ([`Draft::OneHot`]: top-k trees, n-gram candidates;
//!   sibling tokens must be distinct): at node `v` the children are tried in index order; child
//!   `c` is accepted with probability `p(c)` under the current residual, else `c` is removed from
//!   the residual and it is renormalised; if none is accepted the token comes from the final
//!   residual. This is sampling `y ~ p_v` and following the child equal to `y`.
//! - **Children drawn i.i.d. from `q_v`** (SpecInfer's multi-step speculative sampling, Miao et
//!   al., ASPLOS 2024): child `c_i` is accepted with probability `min(1, p(c_i) / q(c_i))` under
//!   the current residual `p`, else `p ← norm(max(p − q, 0))`; if none is accepted the token
//!   comes from the final residual. Sibling tokens may repeat.
//!
//! Temperature, top-k, top-p and min-p process `p` (and draft logits) exactly as for chains
//! ([`SamplingParams`]); [`crate::Rule::Exact`] is the only rule trees take.
//!
//! # Randomness
//!
//! A node at depth `d` (children of the root have depth 1) is scored by the row at counter
//! position `position + d`, so a chain node `i` sits where the chain verifier puts draft `i`.
//! The `j`-th child tried at a node draws its accept uniform from word `j` of the accept
//! stream there (the chain's draft uses word 0), and the final token races over the noise of the
//! residual or bonus stream at the final node's position: one walk visits one node per depth,
//! so no two decisions share a counter, and a request's tokens do not depend on its batch.

use crate::batch::{Draft, Logits, SamplingParams, Status};

/// Most levels a tree may have below its root.
pub const MAX_TREE_DEPTH: u32 = 64;

/// Most nodes one tree may hold (the chain limit, [`crate::MAX_DRAFTS_PER_REQUEST`]).
pub const MAX_TREE_NODES: u32 = crate::MAX_DRAFTS_PER_REQUEST;

/// One drafted token of a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeNode {
    /// The drafted token, in `[0, vocab_size)`.
    pub token: i32,
    /// Index of the parent node, smaller than this node's own index; −1 for a child of the root.
    pub parent: i32,
}

/// One request of a [`TreeBatch`].
#[derive(Clone, Copy, Debug)]
pub struct TreeRequest<'a> {
    /// The nodes, in topological order (every parent before its children). May be empty: a plain
    /// decode step with one target row.
    pub nodes: &'a [TreeNode],
    /// Sampling parameters; `rule` must be [`crate::Rule::Exact`].
    pub params: SamplingParams,
    /// Absolute position of the tokens that the root's children would take: the counter of row 0
    /// (see the module's *Randomness*).
    pub position: u64,
}

/// A batch of trees to verify, in host memory.
#[derive(Clone, Copy, Debug)]
pub struct TreeBatch<'a> {
    /// Target vocabulary size.
    pub vocab_size: u32,
    /// The requests.
    pub requests: &'a [TreeRequest<'a>],
    /// Σ (n_r + 1) rows of `vocab_size` target logits, request by request (row 0 the root's).
    pub target_logits: Logits<'a>,
    /// How the children were drafted: [`Draft::OneHot`] for children given without a
    /// distribution, else one `q` row per expanding node (see the module's *Layout*).
    pub draft: Draft<Logits<'a>>,
    /// Draft vocabulary size when smaller than the target's; `None` = `vocab_size`.
    pub draft_vocab_size: Option<u32>,
}

/// What was wrong with a tree ([`crate::Error::InvalidTree`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TreeDefect {
    /// More than [`MAX_TREE_NODES`] nodes.
    TooManyNodes {
        /// The node count given.
        nodes: usize,
    },
    /// A node's parent is not an earlier node (nor −1): the order is not topological, or the
    /// parents form a cycle.
    ParentNotBefore {
        /// The node.
        node: usize,
        /// Its parent index.
        parent: i32,
    },
    /// A node lies deeper than [`MAX_TREE_DEPTH`].
    TooDeep {
        /// The node.
        node: usize,
        /// Its depth (children of the root: 1).
        depth: u32,
    },
    /// A node's token is outside `[0, vocab_size)`.
    TokenOutOfRange {
        /// The node.
        node: usize,
        /// Its token.
        token: i32,
    },
    /// Two children of one node carry the same token, which children given without a draft
    /// distribution must not (each stands for one token of the target's sample).
    DuplicateSibling {
        /// The later of the two nodes.
        node: usize,
        /// Their token.
        token: i32,
    },
    /// The request's rule is not [`crate::Rule::Exact`]: block, typical and synthetic
    /// verification are defined for chains only.
    UnsupportedRule,
}

impl std::fmt::Display for TreeDefect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TreeDefect::TooManyNodes { nodes } => {
                write!(f, "{nodes} nodes; a tree holds at most {MAX_TREE_NODES}")
            }
            TreeDefect::ParentNotBefore { node, parent } => write!(
                f,
                "node {node} has parent {parent}; a parent must be −1 (the root) or an earlier \
                 node (topological order, no cycles)"
            ),
            TreeDefect::TooDeep { node, depth } => write!(
                f,
                "node {node} is at depth {depth}; trees are at most {MAX_TREE_DEPTH} deep"
            ),
            TreeDefect::TokenOutOfRange { node, token } => {
                write!(f, "node {node} has token {token}, outside the vocabulary")
            }
            TreeDefect::DuplicateSibling { node, token } => write!(
                f,
                "node {node} repeats its sibling's token {token}; children drafted without a \
                 distribution must be distinct (merge them, or pass the q they were drawn from)"
            ),
            TreeDefect::UnsupportedRule => write!(
                f,
                "trees are verified by Rule::Exact only (block, typical and synthetic rules \
                 are defined for chains)"
            ),
        }
    }
}

/// The outcome of one tree request. Equality compares the logprobs bit for bit (so NaN slots
/// compare equal), as for [`crate::VerifyOutput`].
#[derive(Clone, Debug)]
pub struct TreeVerdict {
    /// The accepted nodes, root's child first: the path whose KV-cache entries to keep.
    pub accepted_nodes: Vec<u32>,
    /// The emitted tokens: the accepted nodes' tokens, then one sampled token.
    pub tokens: Vec<i32>,
    /// Outcome flags of the row where the walk stopped, as for chains.
    pub status: Status,
    /// The seed the request used (a drawn one included), for replay.
    pub seed: u64,
    /// Per emitted token, its log-probability under the processed distribution, when the
    /// request set [`SamplingParams::logprobs`] (NaN at non-finite or all-masked rows).
    pub logprobs: Option<Vec<f32>>,
    /// The same under the raw logits, when it set [`SamplingParams::raw_logprobs`].
    pub raw_logprobs: Option<Vec<f32>>,
}

impl PartialEq for TreeVerdict {
    fn eq(&self, o: &Self) -> bool {
        let bits = |v: &Option<Vec<f32>>| {
            v.as_ref()
                .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>())
        };
        self.accepted_nodes == o.accepted_nodes
            && self.tokens == o.tokens
            && self.status == o.status
            && self.seed == o.seed
            && bits(&self.logprobs) == bits(&o.logprobs)
            && bits(&self.raw_logprobs) == bits(&o.raw_logprobs)
    }
}

impl TreeVerdict {
    /// Number of emitted tokens (accepted nodes + 1).
    pub fn num_emitted(&self) -> usize {
        self.tokens.len()
    }
}

/// The result of a tree verification: one verdict per request, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeOutput {
    /// Per request.
    pub requests: Vec<TreeVerdict>,
}

/// Debug-only faults for the negative controls of the statistical tests: deliberately wrong
/// tree samplers the tests must reject. Never use them for real work.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TreeFault {
    /// Correct sampler.
    #[default]
    None,
    /// Children without a distribution: accept each sibling with its unrenormalised `p(c)`.
    NoSiblingRenormalisation,
    /// Children drawn from `q`: test every sibling against the unchanged `p`, never the residual.
    UnrenormalisedAccept,
}

/// Verifies a batch of trees on the CPU with `threads` worker threads (the result does not
/// depend on the count), without a [`crate::Verifier`]: the CPU twin of the GPU's tree passes,
/// which [`crate::Verifier::verify_tree_blocking`] runs on either backend. Requests with
/// `seed: None` draw a seed from the clock, reported in the verdict.
pub fn verify_on_cpu(batch: &TreeBatch<'_>, threads: usize) -> Result<TreeOutput, crate::Error> {
    verify_on_cpu_with_fault(batch, threads, TreeFault::None)
}

/// [`verify_on_cpu`] with a deliberately wrong sampler, for negative controls.
#[doc(hidden)]
pub fn verify_on_cpu_with_fault(
    batch: &TreeBatch<'_>,
    threads: usize,
    fault: TreeFault,
) -> Result<TreeOutput, crate::Error> {
    use rand_pcg::rand_core::{Rng, SeedableRng};
    // Seeds for `seed: None` come from the clock, as the chain verifier's do by default: calls
    // with `None` seeds differ run to run, and the verdict reports the seed for replay.
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut seeds = rand_pcg::Pcg64::seed_from_u64(clock ^ u64::from(std::process::id()));
    let plan = crate::batch::TreePlan::for_host(batch, fault, || seeds.next_u64())?;
    let target = batch.target_logits.to_f32();
    let (_, draft) = batch.draft.split();
    let draft = draft.map(|d| d.to_f32());
    Ok(crate::cpu::tree::run(
        &plan,
        &target,
        draft.as_deref(),
        threads,
    ))
}

//! The plan of a checked tree batch: the chain plan of its rows (so the statistics, cut-off and
//! race code serve trees unchanged) plus each tree's shape (tokens, depths, children, `q` rows).
//! Every defect of a tree is found here, on the host, before any work.

use super::checks::{check_requests, check_rows, check_total_rows, check_vocabs};
use super::plan::{req_info, Plan, Shape};
use super::{Request, Rule};
use crate::error::Error;
use crate::layout::*;
use crate::tree::{TreeBatch, TreeDefect, TreeFault, TreeRequest, MAX_TREE_DEPTH, MAX_TREE_NODES};

/// The shape of one checked tree. Slot `s` is the root for `s = 0` and node `s − 1` otherwise,
/// so slot `s` is also the request's local target row `s`.
#[derive(Debug, Clone)]
pub(crate) struct TreeShape {
    /// Token of each node.
    pub tokens: Vec<i32>,
    /// Depth of each slot (the root: 0).
    pub depth: Vec<u32>,
    /// Children of slot `s`: `children[child_start[s] .. child_start[s + 1]]`, in index order.
    pub child_start: Vec<u32>,
    /// Node indices, grouped by parent slot.
    pub children: Vec<u32>,
}

impl TreeShape {
    /// The children (node indices) of slot `s`.
    pub fn children_of(&self, s: usize) -> &[u32] {
        &self.children[self.child_start[s] as usize..self.child_start[s + 1] as usize]
    }
}

/// A checked tree batch.
#[derive(Debug, Clone)]
pub(crate) struct TreePlan {
    /// The rows as a chain plan: `reqs[r].num_drafts` is the node count, `row_info[g]` is
    /// `(request, slot, no drafted token, q row or NO_INDEX)`, `total_drafts` the q rows.
    pub plan: Plan,
    /// Per request.
    pub trees: Vec<TreeShape>,
    /// The negative control to run (tests only).
    pub fault: TreeFault,
}

/// The shape of request `r`'s tree, or its defect.
fn tree_shape(
    r: usize,
    req: &TreeRequest<'_>,
    vocab: u32,
    distinct: bool,
) -> Result<TreeShape, Error> {
    let bad = |defect| Err(Error::InvalidTree { request: r, defect });
    let n = req.nodes.len();
    if n > MAX_TREE_NODES as usize {
        return bad(TreeDefect::TooManyNodes { nodes: n });
    }
    if req.params.rule != Rule::Exact {
        return bad(TreeDefect::UnsupportedRule);
    }
    let mut depth = vec![0u32; n + 1];
    let mut count = vec![0u32; n + 2];
    for (v, node) in req.nodes.iter().enumerate() {
        if node.parent < -1 || node.parent >= v as i32 {
            return bad(TreeDefect::ParentNotBefore {
                node: v,
                parent: node.parent,
            });
        }
        if node.token < 0 || node.token as u32 >= vocab {
            return bad(TreeDefect::TokenOutOfRange {
                node: v,
                token: node.token,
            });
        }
        let slot = (node.parent + 1) as usize;
        depth[v + 1] = depth[slot] + 1;
        if depth[v + 1] > MAX_TREE_DEPTH {
            return bad(TreeDefect::TooDeep {
                node: v,
                depth: depth[v + 1],
            });
        }
        count[slot + 1] += 1;
    }
    // Counting sort by parent slot keeps each slot's children in index order.
    let mut child_start = count;
    for s in 1..child_start.len() {
        child_start[s] += child_start[s - 1];
    }
    let mut fill = child_start.clone();
    let mut children = vec![0u32; n];
    for (v, node) in req.nodes.iter().enumerate() {
        let slot = (node.parent + 1) as usize;
        children[fill[slot] as usize] = v as u32;
        fill[slot] += 1;
    }
    let shape = TreeShape {
        tokens: req.nodes.iter().map(|n| n.token).collect(),
        depth,
        child_start,
        children,
    };
    if distinct {
        for s in 0..=n {
            let kids = shape.children_of(s);
            for (i, &c) in kids.iter().enumerate() {
                let token = shape.tokens[c as usize];
                if kids[..i].iter().any(|&o| shape.tokens[o as usize] == token) {
                    return bad(TreeDefect::DuplicateSibling {
                        node: c as usize,
                        token,
                    });
                }
            }
        }
    }
    Ok(shape)
}

/// The shape of a tree batch, independent of where its rows live.
pub(crate) struct TreeShapeIn<'a> {
    pub vocab: u32,
    pub requests: &'a [TreeRequest<'a>],
    pub draft_kind: u32,
    pub draft_vocab: Option<u32>,
}

impl<'a> TreeShapeIn<'a> {
    /// The shape of a host batch.
    pub fn host(batch: &TreeBatch<'a>) -> Self {
        TreeShapeIn {
            vocab: batch.vocab_size,
            requests: batch.requests,
            draft_kind: batch.draft.split().0,
            draft_vocab: batch.draft_vocab_size,
        }
    }
}

impl TreePlan {
    /// Checks a host batch (its shape and its slices' lengths) and builds its plan.
    pub fn for_host(
        batch: &TreeBatch<'_>,
        fault: TreeFault,
        draw_seed: impl FnMut() -> u64,
    ) -> Result<TreePlan, Error> {
        let tp = TreePlan::new(&TreeShapeIn::host(batch), fault, draw_seed)?;
        let plan = &tp.plan;
        check_rows(
            batch.target_logits.len(),
            plan.total_rows,
            plan.vocab,
            false,
        )?;
        if let (_, Some(d)) = batch.draft.split() {
            check_rows(d.len(), plan.total_drafts, plan.draft_vocab, true)?;
        }
        Ok(tp)
    }

    /// Checks the batch and builds its plan. `draw_seed` supplies seeds for `seed: None`.
    pub fn new(
        batch: &TreeShapeIn<'_>,
        fault: TreeFault,
        mut draw_seed: impl FnMut() -> u64,
    ) -> Result<TreePlan, Error> {
        let draft_kind = batch.draft_kind;
        let chain_requests: Vec<Request> = batch
            .requests
            .iter()
            .map(|t| Request {
                num_drafts: t.nodes.len().min(u32::MAX as usize) as u32,
                params: t.params,
                position: t.position,
            })
            .collect();
        let (vocab, draft_vocab) = check_vocabs(&Shape {
            vocab: batch.vocab,
            requests: &chain_requests,
            draft_ids: &[],
            draft_kind,
            draft_vocab: batch.draft_vocab,
            rates: None,
        })?;
        let mut trees = Vec::with_capacity(batch.requests.len());
        for (r, req) in batch.requests.iter().enumerate() {
            let distinct = draft_kind == DRAFT_NONE && req.params.temperature != 0.0;
            trees.push(tree_shape(r, req, vocab, distinct)?);
        }
        let counts = check_requests(&chain_requests)?;
        let total_rows = counts.total_drafts + batch.requests.len();
        check_total_rows(total_rows, vocab)?;
        let mut reqs = Vec::with_capacity(trees.len());
        let mut row_info = Vec::with_capacity(total_rows);
        let mut seeds = Vec::with_capacity(trees.len());
        let (mut row, mut q_row) = (0u32, 0u32);
        for (r, (req, tree)) in chain_requests.iter().zip(&trees).enumerate() {
            let seed = req.params.seed.unwrap_or_else(&mut draw_seed);
            seeds.push(seed);
            let mut info = req_info(req, 0, seed);
            info.row_offset = row;
            info.draft_offset = q_row;
            info.out_offset = (r * (counts.k_max as usize + 1)) as u32;
            reqs.push(info);
            for s in 0..=req.num_drafts as usize {
                let expands = !tree.children_of(s).is_empty();
                let d_row = if expands && draft_kind != DRAFT_NONE {
                    q_row += 1;
                    q_row - 1
                } else {
                    NO_INDEX
                };
                row_info.push([r as u32, s as u32, u32::MAX, d_row]);
            }
            row += req.num_drafts + 1;
        }
        let plan = Plan {
            vocab,
            draft_vocab,
            draft_kind,
            reqs,
            row_info,
            draft_ids: Vec::new(),
            rates: Vec::new(),
            total_rows,
            total_drafts: q_row as usize,
            out_stride: counts.k_max as usize + 1,
            seeds,
        };
        Ok(TreePlan { plan, trees, fault })
    }
}

//! A tree drafted by a draft model ([`DraftTreeProposer`]): at each depth the draft scores the
//! level just added in one call ([`Model::extend_tree`], the tree above it already in its
//! cache), and the most likely
//! continuations of the deepest nodes become the next level, top-k per node, ranked across the
//! level by the draft's log-probability of the whole path (as EAGLE-2 ranks its candidates).
//! The draft's greedy chain is always kept as the first-child path, so the tree contains what a
//! chain drafter of the same depth proposes and, with greedy targets, accepts at least as much.

use super::model::Model;
use super::ModelError;
use crate::tree::TreeNode;

/// A draft model proposing top-k trees for [`super::generate_tree_with`]. Children are distinct
/// tokens chosen deterministically from the draft's rows (no distribution is sent), so trees
/// verify under the rule for children given without `q`, which keeps the target's law whatever
/// the draft chose.
#[derive(Debug)]
pub struct DraftTreeProposer {
    draft: Model,
    /// The tokens in the draft's cache (a prefix of the sequence, when synced).
    cached: Vec<u32>,
    /// Children tried per expanded node (top-k of its row).
    branching: usize,
    /// Nodes added per level (the best-ranked of all candidates of the level).
    width: usize,
}

impl DraftTreeProposer {
    /// A proposer over `draft` (a fresh or reset model; the proposer owns its cache) adding at
    /// most `width` nodes per level, at most `branching` below any one node (both ≥ 1; width 1
    /// is the draft's greedy chain).
    pub fn new(draft: Model, branching: usize, width: usize) -> Result<Self, ModelError> {
        if branching == 0 || width == 0 {
            return Err(ModelError::BadTree {
                message: format!(
                    "a draft tree needs branching ≥ 1 and width ≥ 1 (got {branching}, {width})"
                ),
            });
        }
        let mut draft = draft;
        draft.reset();
        Ok(DraftTreeProposer {
            draft,
            cached: Vec::new(),
            branching,
            width,
        })
    }

    /// Writes into `out` (cleared first) a tree of depth at most `depth` after `seq` (its last
    /// token is the root, not yet in any cache), in topological order. The draft's cache is
    /// brought to `seq` minus its last token first, re-forwarding what differs from what it
    /// held.
    pub fn propose_into(
        &mut self,
        seq: &[u32],
        depth: usize,
        out: &mut Vec<TreeNode>,
    ) -> Result<(), ModelError> {
        out.clear();
        let Some((&root, head)) = seq.split_last() else {
            return Ok(());
        };
        self.sync(head)?;
        if depth == 0 {
            return Ok(());
        }
        let base = head.len();
        let vocab = self.draft.vocab_size();
        // Tree rows: the root, then the nodes (row i + 1 is node i); their parents and path
        // log-probabilities.
        let mut parents = vec![-1i32];
        let mut score = vec![0f64];
        // The deepest level's rows (the draft's greedy chain first) and their logits.
        let mut frontier = vec![0usize];
        let mut rows = self.draft.forward_tree(&[root], &[-1])?;
        for level in 0..depth {
            // (path log-probability, parent row, token), the frontier's children.
            let mut candidates: Vec<(f64, usize, u32)> = Vec::new();
            for (j, &f) in frontier.iter().enumerate() {
                let row = &rows[j * vocab..(j + 1) * vocab];
                for (t, lp) in top_k_log_probs(row, self.branching) {
                    candidates.push((score[f] + lp, f, t));
                }
            }
            // The greedy chain's child (the first candidate, the argmax below the chain's
            // node) leads; the rest by path probability, ties by order.
            let lead = candidates.first().copied();
            let mut rest: Vec<(f64, usize, u32)> = candidates.into_iter().skip(1).collect();
            rest.sort_by(|a, b| b.0.total_cmp(&a.0));
            let (mut new_tokens, mut new_parents) = (Vec::new(), Vec::new());
            frontier.clear();
            for (s, parent, token) in lead.into_iter().chain(rest).take(self.width) {
                out.push(TreeNode {
                    token: token as i32,
                    parent: parent as i32 - 1,
                });
                new_tokens.push(token);
                new_parents.push(parent as i32);
                score.push(s);
                frontier.push(parents.len() + new_parents.len() - 1);
            }
            // Top-k of one row are distinct tokens, so siblings are.
            if new_tokens.is_empty() || level + 1 == depth {
                break;
            }
            // Only the new level is forwarded: the tree above it is in the draft's cache.
            rows = self
                .draft
                .extend_tree(base, &parents, &new_tokens, &new_parents)?;
            parents.extend_from_slice(&new_parents);
        }
        self.draft.truncate(base)?;
        Ok(())
    }

    /// Brings the draft's cache to `head`: keeps the common prefix, forwards the rest.
    fn sync(&mut self, head: &[u32]) -> Result<(), ModelError> {
        let same = self
            .cached
            .iter()
            .zip(head)
            .take_while(|(a, b)| a == b)
            .count()
            .min(self.draft.len());
        self.draft.truncate(same)?;
        self.cached.truncate(same);
        if same < head.len() {
            self.draft.forward_last(&head[same..], 1)?;
            self.cached.extend_from_slice(&head[same..]);
        }
        Ok(())
    }
}

/// The `k` largest entries of a row as (token, log-probability under the row's softmax), the
/// largest first, ties by the lower token (as the verifier's argmax breaks them).
fn top_k_log_probs(row: &[f32], k: usize) -> Vec<(u32, f64)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return Vec::new();
    }
    let sum: f64 = row
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| f64::from(x - max).exp())
        .sum();
    let log_z = f64::from(max) + sum.ln();
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (t, &x) in row.iter().enumerate() {
        // NaN never enters: comparisons with it are false.
        if best.len() < k || x > best[best.len() - 1].1 {
            let at = best.partition_point(|&(_, y)| y >= x);
            best.insert(at, (t as u32, x));
            best.truncate(k);
        }
    }
    best.into_iter()
        .map(|(t, x)| (t, f64::from(x) - log_z))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::top_k_log_probs;

    #[test]
    fn top_k_is_ordered_with_ties_to_the_lower_token() {
        let row = [0.5f32, 2.0, 2.0, f32::NAN, -1.0, 3.0];
        let top: Vec<u32> = top_k_log_probs(&row, 3).iter().map(|p| p.0).collect();
        assert_eq!(top, [5, 1, 2]);
        let lp = top_k_log_probs(&[0.0, 0.0], 2);
        assert!((lp[0].1 - 0.5f64.ln()).abs() < 1e-12, "{lp:?}");
    }
}

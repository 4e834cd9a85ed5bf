//! N-gram proposer (prompt lookup decoding): drafts the tokens that followed the most recent
//! earlier occurrence of the sequence's last `n` tokens.

use super::{proposal_cap, Proposals, Proposer, RowKind, SeqView, SpecError};

/// Prompt-lookup proposer.
///
/// **Match rule.** For a sequence `t[0..L)`, for `n` from `n_max` down to `n_min` (only
/// `n ≤ L − 1`): the suffix is `t[L−n..L)`; an *occurrence* is a start `s < L − n` with
/// `t[s..s+n) == t[L−n..L)` — any earlier start, so an occurrence may overlap the suffix
/// (`a b a b a` matches `a b a` at `s = 0`). The **most recent** occurrence (largest `s`) of
/// the **longest** matching `n` wins; the proposal is the tokens that followed it,
/// `t[s+n .. min(s+n+cap, L))`, which is never empty because `s + n < L`. It is cut at the end of
/// the sequence (no extrapolation) and at `cap = `[`proposal_cap`]`(L, max_len, k)`. No match, or
/// `cap = 0`, proposes 0 tokens (a plain decode step).
///
/// Drafts are one-hot (no rows). The search is `O(L · n)` per `n` and allocates nothing: the
/// proposer has no buffers and writes into the caller's reused [`Proposals`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramProposer {
    n_min: usize,
    n_max: usize,
}

impl NgramProposer {
    /// A proposer trying n-gram sizes `n_max` down to `n_min` (`1 ≤ n_min ≤ n_max`).
    pub fn new(n_min: usize, n_max: usize) -> Result<Self, SpecError> {
        if n_min == 0 || n_min > n_max {
            return Err(SpecError::Invalid(format!(
                "n-gram sizes n_min = {n_min}, n_max = {n_max}: need 1 ≤ n_min ≤ n_max"
            )));
        }
        Ok(NgramProposer { n_min, n_max })
    }

    /// The smallest n-gram size tried.
    pub fn n_min(&self) -> usize {
        self.n_min
    }

    /// The largest n-gram size tried.
    pub fn n_max(&self) -> usize {
        self.n_max
    }

    /// The match for `tokens` under the rule above, as `(n, s)`: the n-gram size that matched and
    /// the start of its most recent earlier occurrence. `None` when nothing matches.
    pub fn find(&self, tokens: &[u32]) -> Option<(usize, usize)> {
        let len = tokens.len();
        let top = self.n_max.min(len.saturating_sub(1));
        for n in (self.n_min..=top).rev() {
            let suffix = &tokens[len - n..];
            // Most recent first: scan the starts from right to left.
            if let Some(s) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix) {
                return Some((n, s));
            }
        }
        None
    }

    /// The proposal for `tokens` with at most `cap` tokens (a sub-slice of `tokens`).
    pub fn lookup<'t>(&self, tokens: &'t [u32], cap: usize) -> &'t [u32] {
        if cap == 0 {
            return &[];
        }
        match self.find(tokens) {
            Some((n, s)) => {
                let start = s + n;
                &tokens[start..(start + cap).min(tokens.len())]
            }
            None => &[],
        }
    }
}

impl Proposer for NgramProposer {
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        k: usize,
        out: &mut Proposals,
    ) -> Result<(), SpecError> {
        out.begin(RowKind::OneHot, 0);
        for seq in seqs {
            let cap = proposal_cap(seq.tokens.len(), seq.max_len, k);
            out.push(self.lookup(seq.tokens, cap), &[])?;
        }
        Ok(())
    }

    /// A lookup in the sequence itself: nothing to catch up on.
    fn catches_up(&self) -> bool {
        false
    }
}

/// Prompt-lookup proposer that drafts a **tree**: the continuations of several earlier
/// occurrences of the suffix, merged into a trie, so one target call can keep whichever of them
/// the target agrees with (verified by [`crate::tree`] with children given without a
/// distribution: siblings are distinct by construction).
///
/// **Match rule.** Occurrences are taken for the n-gram sizes from [`NgramProposer`]'s (the
/// longest `n` from `n_max` down to `n_min` with an earlier occurrence) down to `n_min`, for each
/// size most recent first, skipping a continuation already taken, at most `max_matches` in all;
/// each contributes the up to `depth` tokens that followed it (cut at the end of the sequence),
/// inserted into the trie below the root (the last token). A node's children are in
/// first-insertion order, so the first occurrence's continuation is the first-child path: the
/// tree contains [`NgramProposer`]'s chain and can only accept more. The trie stops growing at
/// `max_nodes` nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramTreeProposer {
    chain: NgramProposer,
    max_matches: usize,
    max_nodes: usize,
}

impl NgramTreeProposer {
    /// A tree proposer over n-gram sizes `n_max` down to `n_min`, merging at most `max_matches`
    /// occurrences into at most `max_nodes` nodes (both ≥ 1; `max_nodes` ≤
    /// [`crate::tree::MAX_TREE_NODES`]).
    pub fn new(
        n_min: usize,
        n_max: usize,
        max_matches: usize,
        max_nodes: usize,
    ) -> Result<Self, SpecError> {
        let chain = NgramProposer::new(n_min, n_max)?;
        if max_matches == 0 || max_nodes == 0 || max_nodes > crate::tree::MAX_TREE_NODES as usize {
            return Err(SpecError::Invalid(format!(
                "n-gram tree with max_matches = {max_matches}, max_nodes = {max_nodes}: need \
                 max_matches ≥ 1 and 1 ≤ max_nodes ≤ {}",
                crate::tree::MAX_TREE_NODES
            )));
        }
        Ok(NgramTreeProposer {
            chain,
            max_matches,
            max_nodes,
        })
    }

    /// The chain proposer whose n-gram sizes the tree's matches use.
    pub fn chain(&self) -> &NgramProposer {
        &self.chain
    }

    /// Writes the tree for `tokens` (continuations at most `depth` long) into `out`, cleared
    /// first; empty when nothing matches or `depth` is 0. Nodes are in topological order.
    pub fn propose_into(&self, tokens: &[u32], depth: usize, out: &mut Vec<crate::tree::TreeNode>) {
        out.clear();
        let Some((n, _)) = self.chain.find(tokens) else {
            return;
        };
        if depth == 0 {
            return;
        }
        let len = tokens.len();
        // Continuations by where they start: the longest n-gram's occurrences first, most
        // recent first, then shorter n-grams' (their matches are weaker but differ more).
        let mut starts: Vec<usize> = Vec::with_capacity(self.max_matches);
        for m in (self.chain.n_min..=n).rev() {
            let suffix = &tokens[len - m..];
            for s in (0..len - m).rev() {
                if starts.len() == self.max_matches {
                    break;
                }
                if &tokens[s..s + m] == suffix && !starts.contains(&(s + m)) {
                    starts.push(s + m);
                }
            }
        }
        for start in starts {
            let mut parent = -1i32;
            for &t in &tokens[start..(start + depth).min(len)] {
                let token = t as i32;
                match out
                    .iter()
                    .position(|v| v.parent == parent && v.token == token)
                {
                    Some(v) => parent = v as i32,
                    None if out.len() < self.max_nodes => {
                        out.push(crate::tree::TreeNode { token, parent });
                        parent = out.len() as i32 - 1;
                    }
                    None => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::TreeNode;

    fn tree(p: &NgramTreeProposer, tokens: &[u32], depth: usize) -> Vec<(i32, i32)> {
        let mut out = Vec::new();
        p.propose_into(tokens, depth, &mut out);
        out.iter().map(|n: &TreeNode| (n.token, n.parent)).collect()
    }

    #[test]
    fn occurrences_merge_into_a_trie_most_recent_first() {
        let p = NgramTreeProposer::new(1, 2, 8, 64).unwrap();
        // Suffix "1 2" occurs at 0 (then 3 4), at 4 (then 3 5) and at 8 (then 7): most recent
        // first, 7 is the first child; 3 4 and 3 5 share their 3.
        let t = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 7, 1, 2];
        assert_eq!(
            tree(&p, &t, 2),
            vec![(7, -1), (1, 0), (3, -1), (5, 2), (4, 2)]
        );
        // The first-child path is the chain proposer's proposal.
        assert_eq!(p.chain.lookup(&t, 2), &[7, 1]);
        // max_matches = 1: the chain alone; max_nodes caps the trie.
        let one = NgramTreeProposer::new(1, 2, 1, 64).unwrap();
        assert_eq!(tree(&one, &t, 3), vec![(7, -1), (1, 0), (2, 1)]);
        let small = NgramTreeProposer::new(1, 2, 8, 3).unwrap();
        assert_eq!(tree(&small, &t, 2), vec![(7, -1), (1, 0), (3, -1)]);
        // Shorter n-grams add branches after the longest one's: "1 2" occurs once (then 3 1),
        // "2" also at 1 (then 9 1).
        let t = [5, 2, 9, 1, 2, 3, 1, 2];
        assert_eq!(tree(&p, &t, 2), vec![(3, -1), (1, 0), (9, -1), (1, 2)]);
        assert_eq!(tree(&one, &t, 2), vec![(3, -1), (1, 0)]);
        // No match, or depth 0: empty.
        assert!(tree(&p, &[1, 2, 3], 4).is_empty());
        assert!(tree(&p, &t, 0).is_empty());
        assert!(NgramTreeProposer::new(1, 2, 0, 4).is_err());
        assert!(NgramTreeProposer::new(1, 2, 4, 2000).is_err());
    }
}

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
}

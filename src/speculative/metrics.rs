//! Counters of the decode loop and the rates derived from them.

use std::fmt;
use std::time::Duration;

/// What [`super::SpecDecoder`] counted, accumulated over its `generate` calls until
/// [`super::SpecDecoder::reset_metrics`]. A *request-step* is one request in one decode step
/// (one verification of `k_r` drafts).
///
/// Definitions (the methods compute them; each is `None` / 0 when its denominator is 0):
/// - per-position acceptance rate `i`: `accepted_at[i] / proposed_at[i]`, the fraction of
///   request-steps proposing more than `i` drafts that accepted more than `i` (draft `i` and all
///   before it);
/// - mean acceptance length: `emitted / request_steps`, tokens a request gets per target call
///   (accepted drafts + the one sampled token; 1 for plain decoding);
/// - draft efficiency: `accepted / proposed`;
/// - system efficiency: `emitted / Σ (k_r + 1)` = `emitted / (proposed + request_steps)`, the
///   share of scored positions that became tokens;
/// - tokens per second: `appended / elapsed`, tokens added to the sequences (after EOS / length
///   cuts) per second of wall time inside `generate`.
///
/// `accepted` and `emitted` count what the verifier returned, before the stop conditions cut a
/// step's tokens; `appended` counts what was kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Calls of [`super::TargetModel::forward`] (one per decode step).
    pub target_calls: u64,
    /// Verifier calls (one per decode step).
    pub verify_calls: u64,
    /// Request-steps.
    pub request_steps: u64,
    /// Drafts proposed, Σ k_r.
    pub proposed: u64,
    /// Drafts accepted.
    pub accepted: u64,
    /// Tokens the verifier emitted (accepted + 1 per request-step).
    pub emitted: u64,
    /// Tokens appended to the sequences.
    pub appended: u64,
    /// Decode steps run without asking the proposer, because plain decoding had been the faster
    /// way ([`super::Speculation::WhilePaying`]); their request-steps count as `k = 0` steps.
    pub plain_steps: u64,
    /// `[i]`: request-steps that proposed more than `i` drafts.
    pub proposed_at: Vec<u64>,
    /// `[i]`: request-steps that accepted more than `i` drafts.
    pub accepted_at: Vec<u64>,
    /// Wall time inside `generate`.
    pub elapsed: Duration,
    /// Of which proposing.
    pub propose_time: Duration,
    /// Of which scoring (the target model).
    pub score_time: Duration,
    /// Of which verifying.
    pub verify_time: Duration,
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

impl Metrics {
    /// Records one request-step that proposed `k` drafts and accepted `accepted` of them.
    pub fn record_step(&mut self, k: usize, accepted: usize) {
        self.request_steps += 1;
        self.proposed += k as u64;
        self.accepted += accepted as u64;
        self.emitted += accepted as u64 + 1;
        if self.proposed_at.len() < k {
            self.proposed_at.resize(k, 0);
            self.accepted_at.resize(k, 0);
        }
        for i in 0..k {
            self.proposed_at[i] += 1;
            if i < accepted {
                self.accepted_at[i] += 1;
            }
        }
    }

    /// Acceptance rate of draft position `i` (see the type's definitions).
    pub fn acceptance_rate(&self, i: usize) -> Option<f64> {
        ratio(*self.accepted_at.get(i)?, *self.proposed_at.get(i)?)
    }

    /// Mean tokens per request-step (accepted + 1).
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        ratio(self.emitted, self.request_steps)
    }

    /// Accepted / proposed.
    pub fn draft_efficiency(&self) -> Option<f64> {
        ratio(self.accepted, self.proposed)
    }

    /// Emitted / Σ (k_r + 1).
    pub fn system_efficiency(&self) -> Option<f64> {
        ratio(self.emitted, self.proposed + self.request_steps)
    }

    /// Appended tokens per second of `generate` wall time.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let s = self.elapsed.as_secs_f64();
        (s > 0.0).then(|| self.appended as f64 / s)
    }
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| metric | value |")?;
        writeln!(f, "|---|---|")?;
        writeln!(f, "| target calls | {} |", self.target_calls)?;
        writeln!(f, "| request-steps | {} |", self.request_steps)?;
        if self.plain_steps > 0 {
            writeln!(
                f,
                "| steps without drafts (plain was faster) | {} |",
                self.plain_steps
            )?;
        }
        writeln!(
            f,
            "| drafts proposed / accepted | {} / {} |",
            self.proposed, self.accepted
        )?;
        writeln!(
            f,
            "| mean acceptance length (tokens per request-step) | {} |",
            opt(self.mean_acceptance_length(), 3)
        )?;
        writeln!(
            f,
            "| draft efficiency (accepted / proposed) | {} |",
            opt(self.draft_efficiency(), 3)
        )?;
        writeln!(
            f,
            "| system efficiency (emitted / Σ(k+1)) | {} |",
            opt(self.system_efficiency(), 3)
        )?;
        writeln!(
            f,
            "| tokens / s | {} ({} tokens in {:.3} s: propose {:.3}, score {:.3}, verify {:.3}) |",
            opt(self.tokens_per_second(), 1),
            self.appended,
            self.elapsed.as_secs_f64(),
            self.propose_time.as_secs_f64(),
            self.score_time.as_secs_f64(),
            self.verify_time.as_secs_f64()
        )?;
        if !self.proposed_at.is_empty() {
            writeln!(f)?;
            writeln!(
                f,
                "| draft position | proposed | accepted | acceptance rate |"
            )?;
            writeln!(f, "|---|---|---|---|")?;
            for i in 0..self.proposed_at.len() {
                writeln!(
                    f,
                    "| {i} | {} | {} | {} |",
                    self.proposed_at[i],
                    self.accepted_at[i],
                    opt(self.acceptance_rate(i), 3)
                )?;
            }
        }
        Ok(())
    }
}

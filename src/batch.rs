//! The public description of a verification batch and of its result (SPEC §2). The host-side
//! checks of a batch ([`checks`]) and the metadata built from it ([`plan`]), shared by the CPU and
//! GPU backends, live beside it.

mod checks;
mod plan;
mod tree_plan;

pub(crate) use checks::check_rows;
pub(crate) use plan::{Plan, Shape};
pub(crate) use tree_plan::{TreePlan, TreeShape, TreeShapeIn};

use crate::error::Error;
use crate::layout::*;
use std::fmt;

/// Most drafts one request may carry. The kernels have no fixed-size arrays; the bound keeps the
/// output stride and the per-request loop of the verify kernel reasonable.
pub const MAX_DRAFTS_PER_REQUEST: u32 = 1024;

/// How a request decides acceptance (SPEC §3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rule {
    /// Greedy when `temperature == 0`, otherwise standard rejection sampling against the batch's
    /// draft distribution (one-hot when the batch has none).
    #[default]
    Exact,
    /// Benchmark mode: accept draft `i` iff `u_i < rate_i` with the conditional rates given in
    /// [`VerifyBatch::synthetic_rates`]; everything else (reads, statistics, resampling) costs what
    /// [`Rule::Exact`] costs.
    Synthetic,
    /// Block verification (Sun et al. 2024, SPEC §3 rule 5): the drafts are accepted or
    /// rejected jointly, so a later draft can rescue an earlier unlikely one. Keeps the target
    /// distribution exactly and never accepts fewer drafts in expectation than [`Rule::Exact`].
    /// Greedy requests (temperature 0) ignore it. With one-hot drafts (no draft distribution)
    /// `R_j = ρ_j (1 − p_{j+1}(d_{j+1}))` in closed form and the cost is [`Rule::Exact`]'s; with
    /// draft probabilities or logits, `R_j = Σ_y max(ρ_j p_{j+1}(y) − q_{j+1}(y), 0)` takes one
    /// more pass over rows 2 .. k of the target and the draft (only for batches that hold such
    /// requests, and only for rows with ρ_j > 0). A request with a non-finite target row (or
    /// non-finite draft logits) is verified by the standard rule instead, with its status.
    Block,
    /// Typical acceptance (Medusa, Cai et al. 2024), **lossy and opt-in: it does not preserve
    /// the target distribution**. Accept draft `d` iff
    /// `p(d) > min(typical_epsilon, typical_delta · exp(−H(p)))`, `H` the entropy of the processed
    /// `p`; at the first rejection emit the argmax of `p`; all accepted: the bonus is sampled from
    /// `p`. The draft distribution, if given, is not used.
    Typical,
}

/// Sampling parameters of one request.
///
/// The target distribution at a row is `p = softmax(l / T)` restricted by the controls below,
/// renormalised; draft logits get the same processing with the same parameters (draft
/// probabilities are taken as given: they are what the drafter sampled from). The controls keep
/// an upper set of the row's values, applied in this order:
///
/// 1. `min_p`: keep tokens with `p(y) ≥ min_p · max p`, i.e. `(l − max l) / T ≥ ln(min_p)`;
/// 2. `top_k`: of those, keep the tokens whose logit is ≥ the `top_k`-th largest logit (counted
///    with multiplicity);
/// 3. `top_p`: of those, with the mass renormalised, keep the tokens whose logit is ≥ the largest
///    value `v` such that the tokens with logit ≥ `v` hold at least `top_p` of the mass.
///
/// **Ties at a cut-off are all kept**: the kept set is defined by logit values, never by index,
/// so `top_k` keeps more than `k` tokens when the `k`-th largest value repeats (as vLLM's top-k
/// does), and `top_p` keeps a whole group of equal logits or none of it. The most likely token is
/// always kept, so the controls never empty a finite row. Masses for `top_p` are summed in
/// 2^-31 fixed point relative to the most likely token (exact integer sums, independent of the
/// batch and the device); tokens below 2^-31 of the max weigh 0 there. Greedy requests
/// (`temperature == 0`) ignore the controls: they never change the argmax.
///
/// vLLM rejects min-p with speculative decoding; it is exact here, like the other controls,
/// because the verifier only needs the processed `p` and `q`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy. Must be finite and ≥ 0.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (ties at the cut-off kept); 0 = off (the default).
    pub top_k: u32,
    /// Nucleus sampling: keep the smallest top set holding `top_p` of the mass; in (0, 1],
    /// 1 = off (the default).
    pub top_p: f32,
    /// Keep tokens at least `min_p` times as likely as the most likely one; in [0, 1],
    /// 0 = off (the default).
    pub min_p: f32,
    /// Seed of the request's random stream; `None` draws one (reported in
    /// [`VerifyOutput::seeds`] so that the call can be replayed).
    pub seed: Option<u64>,
    /// Acceptance rule.
    pub rule: Rule,
    /// Return the log-probability of every emitted token under the processed distribution
    /// (temperature and controls; 0 for greedy requests, whose distribution is a point mass) in
    /// [`VerifyOutput::logprobs`]. Default false.
    pub logprobs: bool,
    /// Also return it under the raw logits (`log_softmax(l)`, T = 1, no controls) in
    /// [`VerifyOutput::raw_logprobs`]. Costs one more `exp` per entry in the statistics pass.
    /// Default false.
    pub raw_logprobs: bool,
    /// [`Rule::Typical`]'s ε (Medusa's posterior threshold), in [0, 1]. Default 0.09. The
    /// threshold is `min(ε, δ·exp(−H))`, so ε = 0 makes it 0: every draft with `p(d) > 0` is
    /// accepted, and only drafts the controls mask out (p = 0) or −1 drafts are rejected.
    pub typical_epsilon: f32,
    /// [`Rule::Typical`]'s δ (Medusa's posterior alpha), ≥ 0. Default 0.3.
    pub typical_delta: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            rule: Rule::Exact,
            logprobs: false,
            raw_logprobs: false,
            typical_epsilon: 0.09,
            typical_delta: 0.3,
        }
    }
}

impl SamplingParams {
    /// Greedy verification (temperature 0).
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }
    /// Random verification at `temperature` with a fixed `seed`, no other control.
    pub fn seeded(temperature: f32, seed: u64) -> Self {
        SamplingParams {
            temperature,
            seed: Some(seed),
            ..Self::default()
        }
    }
    /// The same parameters with `top_k`.
    pub fn with_top_k(self, top_k: u32) -> Self {
        SamplingParams { top_k, ..self }
    }
    /// The same parameters with `top_p`.
    pub fn with_top_p(self, top_p: f32) -> Self {
        SamplingParams { top_p, ..self }
    }
    /// The same parameters with `min_p`.
    pub fn with_min_p(self, min_p: f32) -> Self {
        SamplingParams { min_p, ..self }
    }
    /// The same parameters returning processed (and, with `raw`, raw) logprobs.
    pub fn with_logprobs(self, raw: bool) -> Self {
        SamplingParams {
            logprobs: true,
            raw_logprobs: raw,
            ..self
        }
    }
    /// True when a control restricts the distribution (and the request is not greedy).
    pub fn filters(&self) -> bool {
        self.temperature != 0.0 && (self.top_k != 0 || self.top_p < 1.0 || self.min_p > 0.0)
    }
    /// Checks the controls' ranges.
    fn check(&self, request: usize) -> Result<(), Error> {
        let bad = |reason: String| Err(Error::InvalidSampling { request, reason });
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!(
                "top_p = {} must be in (0, 1]; 1 turns it off",
                self.top_p
            ));
        }
        if self.rule == Rule::Typical
            && !((0.0..=1.0).contains(&self.typical_epsilon)
                && self.typical_delta >= 0.0
                && self.typical_delta.is_finite())
        {
            return bad(format!(
                "typical acceptance needs typical_epsilon in [0, 1] and a finite typical_delta \
                 >= 0 (got {} and {})",
                self.typical_epsilon, self.typical_delta
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!(
                "min_p = {} must be in [0, 1]; 0 turns it off",
                self.min_p
            ));
        }
        Ok(())
    }
}

/// One request of a batch: `num_drafts` drafts scored by `num_drafts + 1` target rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    /// `k_r`, may be 0 (a plain decode step in the same batch).
    pub num_drafts: u32,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Absolute position of the first draft token in its sequence: the RNG counter (SPEC §5), so
    /// the same request at the same position draws the same numbers in any batch.
    pub position: u64,
}

/// The draft distribution of a batch; `T` is where its rows live: `&[f32]` for host slices
/// ([`VerifyBatch`]), [`crate::GpuRows`] for GPU buffers ([`crate::GpuVerifyBatch`]).
#[derive(Clone, Copy, Debug)]
pub enum Draft<T> {
    /// No distribution: `q` is one-hot at the drafted token (n-gram or greedy drafters).
    OneHot,
    /// Probabilities `q`, Σ num_drafts rows × vocab_size.
    Probs(T),
    /// Draft logits, Σ num_drafts rows × vocab_size, turned into `q` with each request's
    /// temperature.
    Logits(T),
}

impl<T> Draft<T> {
    /// The kernels' `DRAFT_*` code and the rows, if any.
    pub(crate) fn split(self) -> (u32, Option<T>) {
        match self {
            Draft::OneHot => (DRAFT_NONE, None),
            Draft::Probs(d) => (DRAFT_PROBS, Some(d)),
            Draft::Logits(d) => (DRAFT_LOGITS, Some(d)),
        }
    }
}

/// The element type of a logits (or draft) buffer. Half-precision rows are read directly, two
/// per 32-bit word, and widened exactly to f32 with integer operations (no `SHADER_F16` needed),
/// so every adapter reads them and the result equals that of the f32 copy of the same values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary32.
    #[default]
    F32,
    /// IEEE binary16 (`half::f16` bits).
    F16,
    /// bfloat16: the top 16 bits of an f32.
    Bf16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }
}

/// Exact widening of an IEEE binary16 value (bits) to f32, the twin of `f16_to_f32` in the
/// WGSL: normals and subnormals exactly, ±inf, NaN kept NaN.
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let e = (h >> 10) & 0x1f;
    let m = h & 0x3ff;
    if e == 0 {
        // Subnormal or zero: m · 2^-24, exact in f32.
        let v = m as f32 * 5.960_464_5e-8;
        return if sign != 0 { -v } else { v };
    }
    if e == 31 {
        return f32::from_bits(sign | 0x7f80_0000 | (m << 13));
    }
    f32::from_bits(sign | ((e + 112) << 23) | (m << 13))
}

/// Widening of a bfloat16 value (bits) to f32: exact by construction.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Host rows of logits or probabilities in one of the supported element types.
#[derive(Clone, Copy, Debug)]
pub enum Logits<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// IEEE binary16 values, as raw bits.
    F16(&'a [u16]),
    /// bfloat16 values, as raw bits.
    Bf16(&'a [u16]),
}

impl<'a, T: AsRef<[f32]> + ?Sized> From<&'a T> for Logits<'a> {
    fn from(v: &'a T) -> Self {
        Logits::F32(v.as_ref())
    }
}

impl<'a> Logits<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Logits::F32(v) => v.len(),
            Logits::F16(v) | Logits::Bf16(v) => v.len(),
        }
    }
    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The element type.
    pub fn dtype(&self) -> Dtype {
        match self {
            Logits::F32(_) => Dtype::F32,
            Logits::F16(_) => Dtype::F16,
            Logits::Bf16(_) => Dtype::Bf16,
        }
    }
    /// The values as f32: borrowed for f32, widened (exactly) otherwise.
    pub fn to_f32(&self) -> std::borrow::Cow<'a, [f32]> {
        match *self {
            Logits::F32(v) => std::borrow::Cow::Borrowed(v),
            Logits::F16(v) => v.iter().map(|&h| f16_to_f32(h)).collect(),
            Logits::Bf16(v) => v.iter().map(|&h| bf16_to_f32(h)).collect(),
        }
    }
    /// The raw bytes, as they are uploaded.
    pub(crate) fn bytes(&self) -> &'a [u8] {
        match *self {
            Logits::F32(v) => bytemuck::cast_slice(v),
            Logits::F16(v) | Logits::Bf16(v) => bytemuck::cast_slice(v),
        }
    }
}

/// A batch to verify, in host memory (SPEC §2 layout).
#[derive(Clone, Copy, Debug)]
pub struct VerifyBatch<'a> {
    /// Vocabulary size `V` (row length).
    pub vocab_size: u32,
    /// The requests, in output order.
    pub requests: &'a [Request],
    /// Σ num_drafts ids, request after request; −1 marks an invalid draft (always rejected).
    pub draft_token_ids: &'a [i32],
    /// Σ (num_drafts + 1) rows × V target logits; request r owns num_drafts + 1 consecutive rows,
    /// the last one being its bonus row. f32, f16 or bf16 (`(&vec).into()` for f32).
    pub target_logits: Logits<'a>,
    /// The draft distribution (rows in any [`Dtype`], independently of the target's).
    pub draft: Draft<Logits<'a>>,
    /// Columns of a draft row when the draft model's vocabulary is smaller than the target's
    /// (padded vocabularies, e.g. 151,936 vs 152,064): draft rows are this long and tokens at or
    /// past it have q = 0. `None`: the target's `vocab_size`.
    pub draft_vocab_size: Option<u32>,
    /// Conditional acceptance rates, one per draft (Σ num_drafts values in [0, 1]); needed when a
    /// request uses [`Rule::Synthetic`], ignored otherwise.
    pub synthetic_rates: Option<&'a [f32]>,
}

/// Per-request outcome flags. `Status::OK` (no bit set) is the normal case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

impl Status {
    /// Nothing unusual.
    pub const OK: Status = Status(0);
    /// A target row had NaN or +inf: the request stopped at that row and emitted its argmax (NaN
    /// counted as −inf, lowest index on ties, 0 if the row has no finite value).
    pub const TARGET_NONFINITE: Status = Status(1);
    /// A draft-logit row had NaN or +inf, or was all −inf: its draft was rejected and the token
    /// resampled from p.
    pub const DRAFT_NONFINITE: Status = Status(2);
    /// The residual max(p − q, 0) had no mass: the token was sampled from p instead.
    pub const EMPTY_RESIDUAL: Status = Status(4);
    /// Every token of a target row was masked (the row is all −inf, e.g. a grammar mask with no
    /// way out): the request stopped there and emitted token 0, which the caller should discard.
    /// top-k / top-p / min-p never cause it: they always keep the most likely token.
    pub const ALL_MASKED: Status = Status(8);

    /// True when no flag is set.
    pub fn is_ok(self) -> bool {
        self.0 == 0
    }
    /// True when every flag of `other` is set.
    pub fn contains(self, other: Status) -> bool {
        self.0 & other.0 == other.0
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ok() {
            return write!(f, "ok");
        }
        let mut parts = Vec::new();
        if self.contains(Status::TARGET_NONFINITE) {
            parts.push("target-nonfinite");
        }
        if self.contains(Status::DRAFT_NONFINITE) {
            parts.push("draft-nonfinite");
        }
        if self.contains(Status::EMPTY_RESIDUAL) {
            parts.push("empty-residual");
        }
        if self.contains(Status::ALL_MASKED) {
            parts.push("all-masked");
        }
        write!(f, "{}", parts.join("+"))
    }
}

/// The result of a verify call. Equality compares the logprobs bit for bit (so NaN slots
/// compare equal).
#[derive(Clone, Debug)]
pub struct VerifyOutput {
    /// R × `stride` token ids: the accepted drafts, then the emitted (recovered or bonus) token,
    /// then −1 up to the end of the row. Every slot is written.
    pub tokens: Vec<i32>,
    /// Per request: accepted drafts + 1.
    pub num_emitted: Vec<u32>,
    /// Per request outcome flags.
    pub status: Vec<Status>,
    /// Row stride of `tokens`: K_max + 1.
    pub stride: usize,
    /// The seed each request used (drawn ones included), for replay.
    pub seeds: Vec<u64>,
    /// Laid out like `tokens` when some request set [`SamplingParams::logprobs`]: the
    /// log-probability of each emitted token under the processed distribution; NaN after the
    /// emitted ones, for requests that did not ask, and at non-finite or all-masked rows.
    pub logprobs: Option<Vec<f32>>,
    /// The same under the raw logits (log_softmax at T = 1, no controls), for requests that set
    /// [`SamplingParams::raw_logprobs`].
    pub raw_logprobs: Option<Vec<f32>>,
}

impl PartialEq for VerifyOutput {
    fn eq(&self, o: &Self) -> bool {
        let bits = |v: &Option<Vec<f32>>| {
            v.as_ref()
                .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>())
        };
        self.tokens == o.tokens
            && self.num_emitted == o.num_emitted
            && self.status == o.status
            && self.stride == o.stride
            && self.seeds == o.seeds
            && bits(&self.logprobs) == bits(&o.logprobs)
            && bits(&self.raw_logprobs) == bits(&o.raw_logprobs)
    }
}

impl VerifyOutput {
    /// Number of requests.
    pub fn len(&self) -> usize {
        self.num_emitted.len()
    }
    /// True for an empty batch.
    pub fn is_empty(&self) -> bool {
        self.num_emitted.is_empty()
    }
    /// The tokens request `r` emits: its accepted drafts followed by one sampled token.
    pub fn emitted(&self, r: usize) -> &[i32] {
        let start = r * self.stride;
        &self.tokens[start..start + self.num_emitted[r] as usize]
    }
    /// The processed logprobs of the tokens request `r` emits, if logprobs were asked for.
    pub fn emitted_logprobs(&self, r: usize) -> Option<&[f32]> {
        let start = r * self.stride;
        let n = self.num_emitted[r] as usize;
        self.logprobs.as_ref().map(|l| &l[start..start + n])
    }
    /// The raw logprobs of the tokens request `r` emits, if logprobs were asked for.
    pub fn emitted_raw_logprobs(&self, r: usize) -> Option<&[f32]> {
        let start = r * self.stride;
        let n = self.num_emitted[r] as usize;
        self.raw_logprobs.as_ref().map(|l| &l[start..start + n])
    }
    /// Number of drafts request `r` accepted.
    pub fn accepted(&self, r: usize) -> usize {
        self.num_emitted[r] as usize - 1
    }
}

/// Debug-only faults for the negative controls of statistical tests: a deliberately wrong sampler
/// that the tests must reject. Never use them for real work.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Correct sampler.
    #[default]
    None,
    /// Reject every draft and sample from p: the right marginal, the wrong halves. Under
    /// [`Rule::Block`] the joint decision is kept and the token after it is drawn from p instead
    /// of the residual: the wrong marginal.
    RejectAllFromTarget,
    /// Draw the residual noise from the accept stream (noise shared between the accept test and
    /// the resample).
    SharedNoise,
}

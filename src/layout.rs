//! Byte layouts shared with the shaders (`shaders/common.wgsl`). Every struct is `#[repr(C)]`,
//! made of 4-byte scalars and a multiple of 16 bytes, so WGSL adds no hidden padding; the test
//! `tests/shaders.rs` checks each size and field offset against what naga reports.

use bytemuck::{Pod, Zeroable};

/// How the draft distribution is given (`Params::draft_kind`).
pub const DRAFT_NONE: u32 = 0;
/// Draft probabilities `q`, one row per draft.
pub const DRAFT_PROBS: u32 = 1;
/// Draft logits, turned into `q` with the request's temperature.
pub const DRAFT_LOGITS: u32 = 2;

/// `ReqInfo::flags`: temperature 0, argmax verification.
pub const REQ_GREEDY: u32 = 1;
/// `ReqInfo::flags`: synthetic acceptance with per-position rates.
pub const REQ_SYNTHETIC: u32 = 2;
/// `ReqInfo::flags`: the request sets top-k, top-p or min-p: its rows (and draft-logit rows) get a
/// cut-off from the cutoff pass.
pub const REQ_FILTER: u32 = 4;
/// `ReqInfo::flags`: write the log-probability of every emitted token under the processed p.
pub const REQ_LOGPROBS: u32 = 8;
/// `ReqInfo::flags`: write it under the raw logits too (softmax at T = 1, no controls).
pub const REQ_RAW_LOGPROBS: u32 = 16;
/// `ReqInfo::flags`: block verification (SPEC §3 rule 5).
pub const REQ_BLOCK: u32 = 32;
/// `ReqInfo::flags`: typical acceptance (lossy; Medusa).
pub const REQ_TYPICAL: u32 = 64;
/// `ReqInfo::flags`: deliberate fault for negative controls: reject every draft, sample from p.
pub const REQ_FAULT_REJECT_ALL: u32 = 256;
/// `ReqInfo::flags`: deliberate fault for negative controls: residual noise from the accept stream.
pub const REQ_FAULT_SHARED_NOISE: u32 = 512;

/// `RowStats::flags`: a NaN target logit.
pub const ROW_T_NAN: u32 = 1;
/// `RowStats::flags`: a +inf target logit.
pub const ROW_T_POSINF: u32 = 2;
/// `RowStats::flags`: a NaN draft logit.
pub const ROW_Q_NAN: u32 = 4;
/// `RowStats::flags`: a +inf draft logit.
pub const ROW_Q_POSINF: u32 = 8;
/// `RowStats::flags`: block rule with a draft distribution, the row's mass `R_j` can change
/// τ, so block_mass sums it (set by verify, `mark_due_masses`).
pub const ROW_MASS_DUE: u32 = 16;
/// A float `R_j` never exceeds `ρ_j` by this factor: a draft whose accept uniform is above
/// `ρ_j · MASS_BOUND` is rejected whatever `R_j` is (`mark_due_masses`).
pub const MASS_BOUND: f32 = 1.125;

/// `Task::kind`: nothing left to sample.
pub const TASK_NONE: u32 = 0;
/// `Task::kind`: sample from p (bonus row, or a rejected row with no usable q).
pub const TASK_FROM_TARGET: u32 = 1;
/// `Task::kind`: sample from p without the drafted token (one-hot drafts).
pub const TASK_ONE_HOT_RESIDUAL: u32 = 2;
/// `Task::kind`: sample from max(p − q, 0).
pub const TASK_DRAFT_RESIDUAL: u32 = 3;
/// `Task::kind`: sample from max(ρ p − q, 0), ρ the row's `RowStats::rho` (block verification).
pub const TASK_BLOCK_RESIDUAL: u32 = 4;
/// `Task::kind`: a block request with a draft distribution still waiting for its masses
/// (between verify's `main` and `block_settle` entries; never seen by the residual pass).
pub const TASK_PENDING_BLOCK: u32 = 5;

/// Marks "no index" in argmax state.
pub const NO_INDEX: u32 = u32::MAX;

/// Per-dispatch parameters (`struct Params`, 96 bytes), one 256-byte uniform slot per window.
///
/// ```text
///  0 vocab        4 draft_vocab   8 block_len     12 num_blocks
/// 16 row_begin   20 row_count    24 t_elem_base   28 d_row_begin
/// 32 d_elem_base 36 draft_kind   40 req_begin     44 req_count
/// 48 num_requests 52 out_stride  56 total_rows    60 num_chunks
/// 64 block_chunks 68 stats_blocks 72 flags        76 cut_slice
/// 80 cut_list    84 settle_base 88 padding
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Params {
    /// V: columns of a target row.
    pub vocab: u32,
    /// Columns of a draft row.
    pub draft_vocab: u32,
    /// Vocabulary entries per residual_argmax workgroup (a multiple of 4).
    pub block_len: u32,
    /// ceil(V / block_len): residual_argmax workgroups per request.
    pub num_blocks: u32,
    /// First global target row of the window.
    pub row_begin: u32,
    /// Target rows in the window.
    pub row_count: u32,
    /// Element index, inside the target binding, of row_begin's first logit.
    pub t_elem_base: u32,
    /// First global draft row of the window.
    pub d_row_begin: u32,
    /// Element index, inside the draft binding, of d_row_begin's first value.
    pub d_elem_base: u32,
    /// `DRAFT_*`.
    pub draft_kind: u32,
    /// First request overlapping the window.
    pub req_begin: u32,
    /// Requests overlapping the window.
    pub req_count: u32,
    /// R, the whole batch.
    pub num_requests: u32,
    /// K_max + 1.
    pub out_stride: u32,
    /// Σ (k_r + 1).
    pub total_rows: u32,
    /// ceil(V / CHUNK): statistics partials per row.
    pub num_chunks: u32,
    /// Chunks each row_stats workgroup reduces (tuning only: never changes results).
    pub block_chunks: u32,
    /// row_stats workgroups per row.
    pub stats_blocks: u32,
    /// `PARAM_*` bits of this window.
    pub flags: u32,
    /// Row entries per cutoff `scan` workgroup, a multiple of its workgroup size (tuning only:
    /// the cut-offs never depend on it).
    pub cut_slice: u32,
    /// Words of a cutoff scratch slot's list of top-p candidates (tuning only: the cut-offs
    /// never depend on it).
    pub cut_list: u32,
    /// The word of the output buffer where row_stats' `block_wide_settle(_blocks)` keeps its
    /// block partials (after the output words), followed by one completion count per request; 0 in
    /// the other passes.
    pub settle_base: u32,
    /// Pads the struct to a multiple of 16 bytes.
    pub _pad: [u32; 2],
}

/// `Params::flags`: the window's rows start on 16-byte boundaries (for their element types);
/// 16-byte loads are allowed.
pub const PARAM_VEC4: u32 = 1;
/// `Params::flags`: some request filters its rows: the cut-offs buffer is valid and applied.
pub const PARAM_CUTOFF: u32 = 2;
/// `Params::flags`: the target rows are IEEE binary16 (two per 32-bit word).
pub const PARAM_T_F16: u32 = 4;
/// `Params::flags`: the target rows are bfloat16 (two per 32-bit word).
pub const PARAM_T_BF16: u32 = 8;
/// `Params::flags`: the draft rows are IEEE binary16.
pub const PARAM_D_F16: u32 = 16;
/// `Params::flags`: the draft rows are bfloat16.
pub const PARAM_D_BF16: u32 = 32;
/// `Params::flags`: the output holds the two logprob regions (some request asks for logprobs).
pub const PARAM_LOGPROBS: u32 = 64;
/// `Params::flags`: row_stats also sums exp(l − max) of the raw row (raw logprobs).
pub const PARAM_RAW: u32 = 128;
/// `Params::flags`: a tree batch (`crate::tree`): the residual pass takes each request's row
/// position, noise stream, draft row and excluded tokens from the output's tree scratch.
pub const PARAM_TREE: u32 = 256;

/// Entries per statistics chunk. With [`CHUNK_LANES`] this fixes the order of every float
/// operation of the statistics (see `shaders/common.wgsl`), independently of the batch.
pub const CHUNK: usize = 4096;
/// Lanes that reduce one chunk; lane `l` takes entries `4(l + 64 i) + c`.
pub const CHUNK_LANES: usize = 64;

/// Per-request metadata (`struct ReqInfo`, 64 bytes).
///
/// ```text
///  0 row_offset   4 draft_offset   8 num_drafts  12 flags
/// 16 inv_temperature 20 seed_lo   24 seed_hi     28 pos_lo
/// 32 pos_hi      36 out_offset    40 top_k       44 top_p
/// 48 log_min_p   52 typical_epsilon 56 typical_delta 60 padding
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct ReqInfo {
    /// First global target row.
    pub row_offset: u32,
    /// First global draft row (= index of its first draft id and rate).
    pub draft_offset: u32,
    /// k_r.
    pub num_drafts: u32,
    /// `REQ_*` bits.
    pub flags: u32,
    /// 1 / T (0 for greedy).
    pub inv_temperature: f32,
    /// Seed, low word.
    pub seed_lo: u32,
    /// Seed, high word.
    pub seed_hi: u32,
    /// Position of the first draft, low word.
    pub pos_lo: u32,
    /// Position of the first draft, high word.
    pub pos_hi: u32,
    /// r × out_stride.
    pub out_offset: u32,
    /// Keep the `top_k` largest logits (ties at the cut-off kept); 0 = off.
    pub top_k: u32,
    /// Keep the smallest top set of mass ≥ `top_p`; 1 = off.
    pub top_p: f32,
    /// ln(min_p): keep tokens with (l − max) / T ≥ this; −inf = off.
    pub log_min_p: f32,
    /// Typical acceptance ε (posterior threshold).
    pub typical_epsilon: f32,
    /// Typical acceptance δ (posterior alpha).
    pub typical_delta: f32,
    /// Padding to 64 bytes.
    pub _pad: [u32; 1],
}

impl ReqInfo {
    /// The 64-bit seed.
    pub fn seed(&self) -> u64 {
        u64::from(self.seed_lo) | (u64::from(self.seed_hi) << 32)
    }
    /// The 64-bit position of the first draft.
    pub fn position(&self) -> u64 {
        u64::from(self.pos_lo) | (u64::from(self.pos_hi) << 32)
    }
}

/// Statistics of one row or one (row, vocab block) (`struct RowStats`, 48 bytes).
///
/// ```text
///  0 t_max  4 t_sum  8 t_arg  12 flags  16 t_at_d  20 q_max  24 q_sum  28 q_at_d
/// 32 raw_max 36 raw_sum 40 t_ent 44 rho
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct RowStats {
    /// Max target logit (NaN counts as −inf).
    pub t_max: f32,
    /// Σ exp((l − t_max) / T) (unused for greedy rows).
    pub t_sum: f32,
    /// Lowest index of the max.
    pub t_arg: u32,
    /// `ROW_*` bits.
    pub flags: u32,
    /// Target logit at the drafted token (0 outside its block).
    pub t_at_d: f32,
    /// Max draft logit.
    pub q_max: f32,
    /// Σ exp((q − q_max) / T).
    pub q_sum: f32,
    /// Draft value (probability or logit) at the drafted token.
    pub q_at_d: f32,
    /// Max of the raw row (no cut-off; only with `PARAM_RAW`).
    pub raw_max: f32,
    /// Σ exp(l − raw_max) over the raw row at T = 1 (only with `PARAM_RAW`).
    pub raw_sum: f32,
    /// Σ exp(z) z with z = (l − t_max) / T (typical acceptance rows only): the entropy is
    /// `ln t_sum − t_ent / t_sum`.
    pub t_ent: f32,
    /// Block requests (merged rows only): ρ entering this row, `min(1, ρ_{j−1} p(d)/q(d))`,
    /// written by the verify pass for the joint decision and the block residual.
    pub rho: f32,
}

/// What the residual pass samples for one request (`struct Task`, 16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Task {
    /// `TASK_*`.
    pub kind: u32,
    /// Row within the request (0..=k).
    pub local_row: u32,
    /// Drafted token at that row, −1 for the bonus row or an invalid draft.
    pub draft_token: i32,
    /// Index in the token output of the slot to fill.
    pub slot: u32,
}

/// Best residual candidate of one (request, vocab block) (`struct Candidate`, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct Candidate {
    /// Best key of the residual r: r(y)/e(y) when q is subtracted, else the log-domain key
    /// (`rng::log_race_key`); −∞ when the residual has no mass in the block.
    pub r_key: f32,
    /// Its index, `NO_INDEX` if none.
    pub r_idx: u32,
    /// Best key of p, the fallback for an empty residual (−∞ if none).
    pub p_key: f32,
    /// Its index, `NO_INDEX` if none.
    pub p_idx: u32,
    /// Logit of the `r_idx` token (for its logprob).
    pub r_logit: f32,
    /// Logit of the `p_idx` token.
    pub p_logit: f32,
    /// Padding to 32 bytes.
    pub _pad: [u32; 2],
}

impl Default for Candidate {
    fn default() -> Self {
        Candidate {
            r_key: f32::NEG_INFINITY,
            r_idx: NO_INDEX,
            p_key: f32::NEG_INFINITY,
            p_idx: NO_INDEX,
            r_logit: 0.0,
            p_logit: 0.0,
            _pad: [0; 2],
        }
    }
}

//! The plan of a checked batch, the step after the host checks: the per-request table
//! (`ReqInfo`: flags, temperature, seed, position, filters, output offset), the per-row table
//! (`row_info`: request, local row, drafted token, draft row) and the sizes every backend
//! needs. Reads the caller's batch; the CPU twin uses the plan as is, the GPU uploads it.

use super::checks::{check_draft_ids, check_rates, check_requests, check_total_rows, check_vocabs};
use super::{Fault, Request, Rule, Status, VerifyOutput};
use crate::error::Error;
use crate::layout::*;

/// The shape of a batch, independent of where its logits live.
pub(crate) struct Shape<'a> {
    pub vocab: u32,
    pub requests: &'a [Request],
    pub draft_ids: &'a [i32],
    pub draft_kind: u32,
    pub draft_vocab: Option<u32>,
    pub rates: Option<&'a [f32]>,
}

/// Host-side metadata of a checked batch, uploaded as is to the GPU or used by the CPU twin.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub vocab: u32,
    pub draft_vocab: u32,
    pub draft_kind: u32,
    pub reqs: Vec<ReqInfo>,
    /// Per target row: (request, local row, drafted token as u32, global draft row or NO_INDEX).
    pub row_info: Vec<[u32; 4]>,
    pub draft_ids: Vec<i32>,
    pub rates: Vec<f32>,
    pub total_rows: usize,
    pub total_drafts: usize,
    pub out_stride: usize,
    pub seeds: Vec<u64>,
}

impl Plan {
    /// Checks the batch and builds its metadata. `draw_seed` supplies seeds for `seed: None`.
    pub fn new(
        shape: &Shape<'_>,
        fault: Fault,
        mut draw_seed: impl FnMut() -> u64,
    ) -> Result<Plan, Error> {
        let (vocab, draft_vocab) = check_vocabs(shape)?;
        let counts = check_requests(shape.requests)?;
        let total_drafts = counts.total_drafts;
        let total_rows = total_drafts + shape.requests.len();
        check_draft_ids(shape, total_drafts)?;
        let rates = check_rates(counts.any_synthetic, shape.rates, total_drafts)?;
        check_total_rows(total_rows, vocab)?;
        let out_stride = counts.k_max as usize + 1;
        let fault_bits = match fault {
            Fault::None => 0,
            Fault::RejectAllFromTarget => REQ_FAULT_REJECT_ALL,
            Fault::SharedNoise => REQ_FAULT_SHARED_NOISE,
        };
        let mut reqs = Vec::with_capacity(shape.requests.len());
        let mut row_info = Vec::with_capacity(total_rows);
        let mut seeds = Vec::with_capacity(shape.requests.len());
        let (mut row, mut drow) = (0u32, 0u32);
        for (r, req) in shape.requests.iter().enumerate() {
            let seed = req.params.seed.unwrap_or_else(&mut draw_seed);
            seeds.push(seed);
            let mut info = req_info(req, fault_bits, seed);
            info.row_offset = row;
            info.draft_offset = drow;
            info.out_offset = (r * out_stride) as u32;
            reqs.push(info);
            for i in 0..=req.num_drafts {
                if i < req.num_drafts {
                    let d = shape.draft_ids[(drow + i) as usize];
                    row_info.push([r as u32, i, d as u32, drow + i]);
                } else {
                    row_info.push([r as u32, i, u32::MAX, NO_INDEX]);
                }
            }
            row += req.num_drafts + 1;
            drow += req.num_drafts;
        }
        Ok(Plan {
            vocab,
            draft_vocab,
            draft_kind: shape.draft_kind,
            reqs,
            row_info,
            draft_ids: shape.draft_ids.to_vec(),
            rates,
            total_rows,
            total_drafts,
            out_stride,
            seeds,
        })
    }

    /// Number of requests.
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    /// True when some request asks for logprobs: the output then holds two more regions.
    pub fn has_logprobs(&self) -> bool {
        self.reqs
            .iter()
            .any(|r| r.flags & (REQ_LOGPROBS | REQ_RAW_LOGPROBS) != 0)
    }

    /// The `PARAM_LOGPROBS` / `PARAM_RAW` bits of the batch.
    pub fn logprob_flags(&self) -> u32 {
        let raw = self.reqs.iter().any(|r| r.flags & REQ_RAW_LOGPROBS != 0);
        (if self.has_logprobs() {
            PARAM_LOGPROBS
        } else {
            0
        }) | if raw { PARAM_RAW } else { 0 }
    }

    /// Words of the packed output: `[tokens R×S | num_emitted R | status R]`, then, when some
    /// request asks for logprobs, `[logprobs R×S | raw logprobs R×S]` (f32 bits, NaN where not
    /// emitted or not asked for). One buffer, one readback.
    pub fn out_words(&self) -> usize {
        let n = self.num_requests();
        let lp = if self.has_logprobs() {
            2 * n * self.out_stride
        } else {
            0
        };
        n * self.out_stride + 2 * n + lp
    }

    /// True when some request uses block verification with a draft distribution (the
    /// block_mass pass and verify's block_settle entry run).
    pub fn block_masses(&self) -> bool {
        self.draft_kind != DRAFT_NONE && self.reqs.iter().any(|r| r.flags & REQ_BLOCK != 0)
    }

    /// True when some request sets top-k / top-p / min-p (the cutoff pass runs).
    pub fn filters(&self) -> bool {
        self.reqs.iter().any(|r| r.flags & REQ_FILTER != 0)
    }

    /// Decodes the packed output words (`[tokens | num_emitted | status]`) into a VerifyOutput.
    pub fn decode_output(&self, words: &[u32]) -> VerifyOutput {
        let r = self.num_requests();
        let n_tok = r * self.out_stride;
        VerifyOutput {
            tokens: words[..n_tok].iter().map(|&w| w as i32).collect(),
            num_emitted: words[n_tok..n_tok + r].to_vec(),
            status: words[n_tok + r..n_tok + 2 * r]
                .iter()
                .map(|&w| Status(w))
                .collect(),
            stride: self.out_stride,
            seeds: self.seeds.clone(),
            logprobs: self
                .has_logprobs()
                .then(|| floats(&words[n_tok + 2 * r..2 * n_tok + 2 * r])),
            raw_logprobs: self
                .has_logprobs()
                .then(|| floats(&words[2 * n_tok + 2 * r..3 * n_tok + 2 * r])),
        }
    }
}

/// The `ReqInfo::flags` of a request: its rule (block and typical only when not greedy), its
/// filters and logprobs, and the fault bits of the negative controls.
fn request_flags(req: &Request, fault_bits: u32) -> u32 {
    let greedy = req.params.temperature == 0.0;
    let mut flags = fault_bits;
    if greedy {
        flags |= REQ_GREEDY;
    }
    if req.params.rule == Rule::Synthetic {
        flags |= REQ_SYNTHETIC;
    }
    if req.params.rule == Rule::Block && !greedy {
        flags |= REQ_BLOCK;
    }
    if req.params.rule == Rule::Typical && !greedy {
        flags |= REQ_TYPICAL;
    }
    if req.params.filters() {
        flags |= REQ_FILTER;
    }
    if req.params.logprobs {
        flags |= REQ_LOGPROBS;
    }
    if req.params.raw_logprobs {
        flags |= REQ_RAW_LOGPROBS;
    }
    flags
}

/// The `ReqInfo` of a checked request under `seed`; its row, draft and output offsets are left
/// 0 for the caller, which knows where the request sits in the batch.
pub(super) fn req_info(req: &Request, fault_bits: u32, seed: u64) -> ReqInfo {
    let greedy = req.params.temperature == 0.0;
    let filters = req.params.filters();
    let inv_temperature = if greedy {
        0.0
    } else {
        1.0 / req.params.temperature
    };
    ReqInfo {
        row_offset: 0,
        draft_offset: 0,
        num_drafts: req.num_drafts,
        flags: request_flags(req, fault_bits),
        inv_temperature,
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        pos_lo: req.position as u32,
        pos_hi: (req.position >> 32) as u32,
        out_offset: 0,
        top_k: if filters { req.params.top_k } else { 0 },
        top_p: if filters { req.params.top_p } else { 1.0 },
        log_min_p: if filters && req.params.min_p > 0.0 {
            (f64::from(req.params.min_p)).ln() as f32
        } else {
            f32::NEG_INFINITY
        },
        typical_epsilon: req.params.typical_epsilon,
        typical_delta: req.params.typical_delta,
        _pad: [0; 1],
    }
}

fn floats(words: &[u32]) -> Vec<f32> {
    words.iter().map(|&w| f32::from_bits(w)).collect()
}

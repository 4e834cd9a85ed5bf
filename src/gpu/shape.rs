//! The shape of one recorded verification: its row windows and every pass's grid (residual
//! blocks, row_stats chunks, cutoff slices and groups), its specialisation and which optional
//! passes run. Derived on the host from the plan, the caller's element types and the device;
//! the workspace is sized from it and every `record_*` dispatches by it.

use super::cutoff::CutShape;
use super::pipelines::{
    SPECIAL_ENTROPY, SPECIAL_HALF_WORDS, SPECIAL_MAX_ONLY, SPECIAL_PLAIN_BF16, SPECIAL_PLAIN_F16,
    SPECIAL_PLAIN_F32, SPECIAL_RAW, SPECIAL_WIDE,
};
use super::windows::{plan_windows, Window};
use super::{row_stats, GpuBackend, GpuRows};
use crate::batch::Plan;
use crate::layout::*;

/// Chunk partials per request above which an all-greedy batch's verify takes the device's
/// workgroup size instead of 64 lanes (`Shape::verify_wide`). On an H200 the wider merge took
/// verify to 0.80-0.97x from 190 partials a request (k + 1 rows of 38 chunks at V = 151,936)
/// and greedy GPU time to 1.01-1.05x at 16-76, where one or two rounds of 64 lanes already
/// cover them (`docs/performance.md`).
const WIDE_VERIFY_PARTIALS: u64 = 128;

/// Chunk partials of a batch verified in row_stats (`Shape::verify_in_stats`) above which
/// verify's row-run folds go to row_stats' lane arrays (`Shape::shared_runs`). On an H200, with
/// the folds there, batches of 1,280-1,520 chunks took 0.93-1.00x of verify's own dispatch
/// (1.07-1.17x with the array of their own declared), while up to 1,024 chunks the array of
/// their own is 1.01x faster (`docs/performance.md`).
const SHARED_RUNS_FROM_CHUNKS: u64 = 1024;

/// Chunks of a batch on the wide greedy reduction (`SPECIAL_WIDE`) from which each row_stats
/// workgroup takes at least `WIDE_MIN_BLOCK_CHUNKS` chunks, and its workgroups aim for half
/// of `target_workgroups`. On an H200, fewer, longer workgroups than `target_workgroups` gives
/// took greedy GPU time to 0.92-0.96x at 5,120-10,944 chunks with three chunks each (one or
/// two by default), and at 2,736 chunks or fewer two chunks gained nothing. Once a block's
/// chunks were folded once (`block_wide_settle_blocks`), six chunks instead of three took
/// 24,320 chunks (R = 128, k = 4, V = 151,936) to 0.95x and eleven instead of six 43,776 to
/// 0.995x (`docs/performance.md`).
const WIDE_LONG_BLOCKS_FROM_CHUNKS: u64 = 4096;

/// The fewest chunks per workgroup of the wide greedy reduction from
/// `WIDE_LONG_BLOCKS_FROM_CHUNKS` chunks.
const WIDE_MIN_BLOCK_CHUNKS: u32 = 3;

/// What the passes of one verification dispatch.
pub(super) struct Shape {
    /// Requests.
    pub n: usize,
    /// The row windows, each bound and dispatched on its own.
    pub windows: Vec<Window>,
    /// The Params slots (the windows' slots, then the cutoff groups'): their size, and (for
    /// immediate data) their values once `write_metadata` has written them.
    pub slots: super::bindings::ParamSlots,
    /// Storage offset alignment of the device.
    pub align: u64,
    /// Vocabulary entries per residual_argmax block.
    pub block_len: u32,
    /// residual_argmax blocks per request.
    pub num_blocks: u32,
    /// Chunks per row (the statistics' unit).
    pub num_chunks: u32,
    /// Chunks per row_stats workgroup.
    pub block_chunks: u32,
    /// row_stats workgroups per row.
    pub stats_blocks: u32,
    /// The row_stats specialisation (`SPECIAL_*` bits; verify takes its optional sums).
    pub special: u32,
    /// Some request sets top-k / top-p / min-p: the cutoff pass runs.
    pub filters: bool,
    /// Every row the kernels load is f32 (target rows, and draft rows when given): cutoff,
    /// residual_argmax and block_mass take their `PLAIN_F32` pipelines (plain loads, no dtype
    /// dispatch), filters or not. row_stats' `PLAIN_F32` also needs no filters (`special`).
    pub f32_rows: bool,
    /// `SPECIAL_PLAIN_F16` / `SPECIAL_PLAIN_BF16` where the target rows are half and the draft
    /// rows f32 or absent: residual_argmax's race reads both without the dtype dispatch (0
    /// otherwise).
    pub half_race: u32,
    /// No draft values (one-hot drafts): no residual subtracts q.
    pub no_q: bool,
    /// Block requests with a draft distribution: block_mass and `block_settle` run.
    pub block_masses: bool,
    /// Some request is not greedy: residual_argmax runs.
    pub needs_residual: bool,
    /// The cutoff pass.
    pub cut: CutShape,
    /// Words of the packed output (read back).
    pub out_words: usize,
    /// verify's `WIDE` pipeline: an all-greedy batch on an adapter that takes the wide
    /// reductions, whose requests may have more than `WIDE_VERIFY_PARTIALS` chunk partials.
    pub verify_wide: bool,
    /// A tree batch (`PARAM_TREE`): the residual pass reads the walk's race headers.
    pub tree: bool,
    /// row_stats' `block_wide_settle` decides the batch (`VerifierOptions::fused_greedy`): an
    /// all-greedy chain batch on the wide reduction, at most 64 rows a request, none of them
    /// synthetic or deliberately faulty. No verify dispatch; the output buffer holds the chunk
    /// results from word `out_words` and a count per request after them.
    pub settle_in_stats: bool,
    /// row_stats_verify's `block_verify` verifies the batch
    /// (`VerifierOptions::fused_verify_chunks`): a chain batch of at most that many chunk
    /// partials on row_stats' `block` without the optional sums (raw logprobs, typical
    /// acceptance). No verify dispatch; the block statistics hold the partials as words and a
    /// count per request after them, from word `Shape::partial_words`.
    pub verify_in_stats: bool,
    /// An all-greedy batch settled in row_stats on one-chunk workgroups (`block_wide_settle`)
    /// of f32 rows with at least `VerifierOptions::narrow_greedy_chunks` chunks: the
    /// `SPECIAL_NARROW` pipeline, half the device's workgroup size a chunk.
    pub narrow_settle: bool,
    /// With `verify_in_stats`, a batch of more than `SHARED_RUNS_FROM_CHUNKS` chunk partials:
    /// row_stats_verify's `SPECIAL_SHARED_RUNS` pipeline keeps verify's row-run folds in
    /// row_stats' lane arrays.
    pub shared_runs: bool,
    /// The early race (`SPECIAL_EARLY`): residual_argmax's `block` races every row of every
    /// sampled request beside row_stats, one candidate row per (request, local row).
    pub early: bool,
    /// Candidate rows the residual pass writes per request: one, or with the early race one per
    /// output slot (k_max + 1, its dispatch's z).
    pub candidate_rows: u32,
}

impl Shape {
    /// The shape of `plan` over the caller's rows, in windows of at most `max_rows` rows; `tree`
    /// for a tree batch (`PARAM_TREE`).
    pub fn new(
        g: &GpuBackend,
        plan: &Plan,
        (target, draft): (GpuRows<'_>, Option<GpuRows<'_>>),
        max_rows: usize,
        tree: bool,
    ) -> Shape {
        let limits = g.kernels.device.limits();
        let n = plan.num_requests();
        let windows = plan_windows(plan, max_rows);
        let needs_residual = plan.reqs.iter().any(|r| r.flags & REQ_GREEDY == 0);
        // The early race runs one race per sampled row, the other modes one per request.
        let early_races = if tree { None } else { g.early_races(plan) };
        let early = early_races.is_some();
        let races = early_races.unwrap_or(n);
        let block_len = g.residual_block_len(plan.vocab, races);
        let num_chunks = plan.vocab.div_ceil(CHUNK as u32);
        let filters = plan.filters();
        // A batch that can settle in row_stats (`fused_greedy`: greedy chain requests of at
        // most 64 rows, none synthetic or deliberately faulty) takes the wide reduction at any
        // size while `wide_greedy_chunks` is not 0: without verify's dispatch it paid at every
        // size an H200 measured but one (greedy GPU time 0.92-0.99x from 1,280 to 43,776
        // chunks, 1.07-1.09x at 2,736; `docs/performance.md`), where the wide reduction alone
        // is 1.00-1.25x slower past 1,024 chunks.
        let settles = g.fused_greedy
            && !tree
            && n > 0
            && plan.reqs.iter().all(|r| {
                r.flags & REQ_GREEDY != 0
                    && r.num_drafts < 64
                    && r.flags & (REQ_SYNTHETIC | REQ_FAULT_REJECT_ALL) == 0
            });
        let wide_max = match g.wide_max_chunks() {
            0 => 0,
            _ if settles => usize::MAX,
            w => w,
        };
        let special = row_stats::special(
            plan,
            filters,
            (target, draft),
            g.half_min_chunks(),
            wide_max,
        );
        let mut block_chunks = g.block_chunks(plan.vocab, plan.total_rows);
        // The plain half paths reduce chunks in pairs (row_stats.wgsl, half_chunks): an even
        // count per workgroup keeps both halves of the workgroup busy on every pair.
        if special & (SPECIAL_PLAIN_F16 | SPECIAL_PLAIN_BF16) != 0
            && special & SPECIAL_HALF_WORDS == 0
        {
            block_chunks = block_chunks.next_multiple_of(2).min(num_chunks);
        }
        let total_chunks = plan.total_rows as u64 * u64::from(num_chunks);
        if special & SPECIAL_WIDE != 0 && total_chunks >= WIDE_LONG_BLOCKS_FROM_CHUNKS {
            // Half as many workgroups as `target_workgroups` aims for, and at least
            // WIDE_MIN_BLOCK_CHUNKS chunks each.
            let half_target = u64::from(g.target_workgroups / 2).max(1);
            let long = total_chunks
                .div_ceil(half_target)
                .min(u64::from(num_chunks)) as u32;
            block_chunks = block_chunks
                .max(WIDE_MIN_BLOCK_CHUNKS)
                .max(long)
                .min(num_chunks);
        }
        let cut = CutShape::new(g, plan, &windows, filters);
        let settle_in_stats = settles && special & SPECIAL_WIDE != 0;
        // row_stats_verify is built for the load paths alone (no raw or entropy sums, not the
        // all-greedy pipelines, which settle in row_stats or merge over wide workgroups: a batch
        // that settles there is WIDE, so it never takes this path).
        let verify_in_stats = total_chunks <= u64::from(g.fused_verify_chunks)
            && !tree
            && n > 0
            && special & (SPECIAL_RAW | SPECIAL_ENTROPY | SPECIAL_MAX_ONLY | SPECIAL_WIDE) == 0;
        Shape {
            n,
            slots: super::bindings::ParamSlots {
                params: Vec::new(),
                slot_size: super::bindings::PARAM_SLOT
                    .max(u64::from(limits.min_uniform_buffer_offset_alignment)),
                immediates: g.kernels.variant.immediates,
            },
            align: u64::from(limits.min_storage_buffer_offset_alignment),
            block_len,
            num_blocks: plan.vocab.div_ceil(block_len),
            num_chunks,
            block_chunks,
            stats_blocks: num_chunks.div_ceil(block_chunks),
            special,
            filters,
            f32_rows: target.dtype == crate::Dtype::F32
                && draft.is_none_or(|d| d.dtype == crate::Dtype::F32),
            half_race: match target.dtype {
                _ if draft.is_some_and(|d| d.dtype != crate::Dtype::F32) => 0,
                crate::Dtype::F16 => SPECIAL_PLAIN_F16,
                crate::Dtype::Bf16 => SPECIAL_PLAIN_BF16,
                crate::Dtype::F32 => 0,
            },
            no_q: plan.draft_kind == DRAFT_NONE,
            block_masses: plan.block_masses(),
            needs_residual,
            cut,
            out_words: plan.out_words(),
            verify_wide: g.wide_max_chunks() > 0
                && special & SPECIAL_MAX_ONLY != 0
                && plan.out_stride as u64 * u64::from(num_chunks) > WIDE_VERIFY_PARTIALS,
            windows,
            tree,
            settle_in_stats,
            verify_in_stats,
            narrow_settle: settle_in_stats
                && block_chunks == 1
                && special & SPECIAL_PLAIN_F32 != 0
                && g.narrow_min_chunks() > 0
                && total_chunks >= g.narrow_min_chunks(),
            shared_runs: verify_in_stats && total_chunks > SHARED_RUNS_FROM_CHUNKS,
            early,
            candidate_rows: if early { plan.out_stride as u32 } else { 1 },
        }
    }

    /// The specialisation of the kernels whose only `PLAIN_F32` use is their loads (cutoff's scan,
    /// residual_argmax, block_mass): `SPECIAL_PLAIN_F32` for f32 rows, else 0.
    pub fn plain_loads(&self) -> u32 {
        if self.f32_rows {
            super::pipelines::SPECIAL_PLAIN_F32
        } else {
            0
        }
    }

    /// residual_argmax's specialisation: plain f32 loads for f32 rows, plain half loads for half
    /// target rows with f32 or no draft rows (`half_race`); without q (and outside
    /// trees, whose walk sets the tasks) every race keyed in the log domain, the pipeline
    /// without the linear keys' code (the residual pass 0.92x on an H200,
    /// `docs/performance.md`); and the early race.
    pub fn residual_special(&self) -> u32 {
        use super::pipelines::{SPECIAL_EARLY, SPECIAL_LOG_KEYS};
        let log_keys = if self.no_q && !self.tree {
            SPECIAL_LOG_KEYS
        } else {
            0
        };
        let early = if self.early { SPECIAL_EARLY } else { 0 };
        self.plain_loads() | self.half_race | log_keys | early
    }

    /// Words of the output buffer past the output that `block_wide_settle(_blocks)` uses: three
    /// per row_stats block (`stats_blocks` a row) of every row, then a count per request (0 when
    /// the batch does not settle there).
    pub fn settle_words(&self, plan: &Plan) -> usize {
        if self.settle_in_stats {
            3 * plan.total_rows * self.stats_blocks as usize + self.n
        } else {
            0
        }
    }

    /// Words of the chunk partials when row_stats_verify writes them (twelve a partial): its
    /// counts start there.
    pub fn partial_words(&self, plan: &Plan) -> usize {
        12 * plan.total_rows * self.num_chunks as usize
    }

    /// The Params every window's slot starts from (and the only slot of an empty batch).
    pub fn base_params(&self, plan: &Plan) -> Params {
        Params {
            vocab: plan.vocab,
            draft_vocab: plan.draft_vocab,
            block_len: self.block_len,
            num_blocks: self.num_blocks,
            draft_kind: plan.draft_kind,
            num_requests: self.n as u32,
            out_stride: plan.out_stride as u32,
            total_rows: plan.total_rows as u32,
            num_chunks: self.num_chunks,
            block_chunks: self.block_chunks,
            stats_blocks: self.stats_blocks,
            cut_slice: self.cut.slice,
            cut_list: self.cut.list,
            flags: if self.tree { PARAM_TREE } else { 0 },
            settle_base: if self.settle_in_stats {
                self.out_words as u32
            } else if self.verify_in_stats {
                self.partial_words(plan) as u32
            } else {
                0
            },
            ..Params::default()
        }
    }
}

impl GpuBackend {
    /// Whether a chain batch of `plan` (trees race the slots their walk chooses) takes the
    /// early race (`Shape::early`): one-hot drafts (no q, so every race is keyed in the log
    /// domain and needs no row statistics), some drafts (binding 2 holds their ids), some
    /// request that samples, and at most `early_race_entries` vocabulary entries in the rows
    /// the race adds (the sampled requests' draft rows). Racing k + 1 rows per request instead
    /// of one pays only while the GPU has room beside row_stats (`docs/performance.md`).
    pub(crate) fn takes_early_race(&self, plan: &Plan) -> bool {
        self.early_races(plan).is_some()
    }

    /// The races of the early race when a chain batch takes it (`takes_early_race`): every
    /// sampled request's draft rows and its bonus row.
    fn early_races(&self, plan: &Plan) -> Option<usize> {
        let (sampled, added) = sampled_requests_and_draft_rows(plan);
        let takes = plan.draft_kind == DRAFT_NONE
            && plan.total_drafts > 0
            && sampled > 0
            && added as u64 * u64::from(plan.vocab) <= self.early_race_entries;
        takes.then_some(sampled + added)
    }
}

/// The requests that sample (not greedy) and their draft rows: an early race races both the
/// draft rows and one bonus row per such request.
fn sampled_requests_and_draft_rows(plan: &Plan) -> (usize, usize) {
    plan.reqs
        .iter()
        .filter(|r| r.flags & REQ_GREEDY == 0)
        .fold((0, 0), |(n, rows), r| (n + 1, rows + r.num_drafts as usize))
}

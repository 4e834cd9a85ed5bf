//! Pass 1: cutoff (`shaders/cutoff.wgsl`). For batches where some request sets top-k / top-p /
//! min-p, finds every filtered row's cut-off by a select over value bins: reads the caller's
//! target (and draft-logit) rows and the request table, writes `cutoffs` (one f32 per row)
//! through the `cut_state` scratch. Row_stats, block_mass and residual_argmax then mask below
//! the cut-off.

use super::bindings::{entry, params_entry, with_params};
use super::shape::Shape;
use super::windows::{Window, WindowRows};
use super::workspace::Workspace;
use super::GpuBackend;
use crate::batch::Plan;
use crate::layout::*;
use crate::shaders::Kernel;

/// Head words of one row's slot in the cutoff kernel's scratch (S_LIST in cutoff.wgsl): its
/// stage and select state and a 256-bin histogram of 64-bit (hi, lo) sums. The list of the
/// top-k or top-p value bin that holds the cut-off follows (`CutShape::list` words).
const CUT_HEAD_WORDS: u64 = 528;
/// Fewest entries of a slot's list: at the top-p cut-off of N(0, 2) logits over 151,936
/// entries at T = 1 the chosen bin holds about 2,000; a fuller bin is selected from the row
/// itself, by one workgroup (slower, same cut-off).
const CUT_MIN_LIST: u64 = 4096;
/// Bytes the scratch may take: one group's slots. Within it, small batches get lists as long
/// as their rows (no bin is ever too full), large ones at least `CUT_MIN_LIST` entries.
const CUT_SCRATCH_BYTES: u64 = 64 << 20;
/// Most target rows per cutoff dispatch group; larger windows are cut in groups run one after
/// another. Fewer where the slots with the shortest lists would not fit the scratch.
const CUT_GROUP_ROWS: usize = 2048;
/// Fewest row entries per cutoff `scan` workgroup, per lane: below this the workgroup's
/// histogram clear and flush cost more than its share of the row.
const CUT_MIN_PER_LANE: u32 = 8;
/// Most slices per row for top-k's candidates (CAND_MAX_SLICES in cutoff.wgsl, which decides
/// per row; the host only decides whether the first round runs the entry points that carry
/// their code).
const CAND_MAX_SLICES: u32 = 64;
/// Most (k + 1) × slice entries for top-k's candidates: LOCAL_CAP × CAND_SUB / 2 in cutoff.wgsl
/// (a slice's candidates, about (k + 1) / 4,096 of its entries, within half of what a workgroup
/// holds).
const CAND_MAX_SPREAD: u32 = 1024 * 4096 / 2;

/// Entries per scan workgroup that `candidate_slice` raises small batches' slices to, where every
/// filtered request's top-k takes candidates: fewer, longer slices give `pick_top_k` a shorter
/// list (each slice adds at least k + 1 candidates), and rows that had too many slices for
/// candidates (R = 8 at V = 151,936: 75 of 2,048) take them instead of the value bins' two more
/// reads. Measured on an NVIDIA H200 (`docs/performance.md`, optimisation log).
const CAND_SLICE: u32 = 16384;
/// Fewest scan workgroups `candidate_slice` leaves a call: with 10 to 80 (batches of 5 to 40
/// rows) the longer slices measured 1.04–1.11× slower, and with a floor of 128 one request at
/// V = 151,936 still 1.03–1.04×.
const CAND_MIN_WORKGROUPS: u64 = 256;
/// Most slices per row after `candidate_slice` raises the slice: rows of 30 to 60 slices took
/// candidates 1.01–1.14× slower than the value bins (batches of one request, V = 151,936).
const CAND_RAISED_SLICES: u32 = 16;

/// Whether request `r` sets a top-k small enough for candidates: below the workgroup size (the
/// (k + 1)-th largest of a slice's lane maxima bounds its candidates; cutoff.wgsl
/// `takes_candidates`).
fn small_top_k(r: &ReqInfo, wg: u32) -> bool {
    r.top_k != 0 && r.top_k < wg
}

/// The longest slice whose candidates fit for request `r`'s top-k (`CAND_MAX_SPREAD`).
fn candidate_spread(r: &ReqInfo) -> u32 {
    CAND_MAX_SPREAD / (r.top_k + 1)
}

/// `slice` for the `entries` of a call's cut rows (`len` per row), raised towards `CAND_SLICE`
/// where every filtered request of `reqs` sets a top-k that can take candidates (below the
/// workgroup size, within `CAND_MAX_SPREAD` at that slice), as long as the scans keep
/// `CAND_MIN_WORKGROUPS` workgroups and a row at most `CAND_RAISED_SLICES` slices. Tuning only,
/// like `cut_slice`.
fn candidate_slice(wg: u32, reqs: &[ReqInfo], slice: u32, len: u32, entries: u64) -> u32 {
    let mut filtered = reqs.iter().filter(|r| r.flags & REQ_FILTER != 0).peekable();
    if slice >= CAND_SLICE || wg != 256 || filtered.peek().is_none() {
        return slice;
    }
    let mut most = CAND_SLICE;
    for r in filtered {
        if !small_top_k(r, wg) {
            return slice;
        }
        most = most.min(candidate_spread(r));
    }
    let raised = (entries / CAND_MIN_WORKGROUPS).min(u64::from(most)) as u32 / wg * wg;
    if raised > slice && len.div_ceil(raised) <= CAND_RAISED_SLICES {
        raised
    } else {
        slice
    }
}

/// The cutoff kernel's bindings: Params, target and draft rows, requests, row_info, then the
/// cut-offs and the scratch it writes.
pub(super) fn layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    with_params(6, &[5, 6])
}

/// The cutoff pass's grid: its scratch slots (target rows, then draft rows), the entries per scan
/// workgroup, the scan workgroups per row, the sides (draft-logit rows are cut too) and the
/// (scan, pick) rounds: max (and min-p's bound), then two top-k and two top-p rounds when some
/// request of the batch asks for them (rows that need fewer wait at DONE, for free).
pub(super) struct CutShape {
    /// Entries per scan workgroup (also in every Params: the kernels read it).
    pub slice: u32,
    /// Scan workgroups per row.
    pub slices: u32,
    /// 2 when draft-logit rows are cut too, else 1.
    pub sides: u32,
    /// (scan, pick) rounds after the first init.
    pub steps: u32,
    /// The row groups: (window, first row, end row), each with its own Params slot after the
    /// windows' slots. Empty when no request filters.
    pub groups: Vec<(usize, usize, usize)>,
    /// Target rows per group (`CUT_GROUP_ROWS`, or fewer where the scratch would not fit).
    pub group_rows: usize,
    /// Words of each slot's list of the chosen bin's candidates (also in every Params: the
    /// kernels read it).
    pub list: u32,
    /// Params slots to reserve for the groups: a bound on `groups.len()` (0 when no request
    /// filters).
    pub group_slots: usize,
    /// Some request's top-k may take candidates: the first round runs `scan_top_k` and
    /// `pick_top_k` instead of `scan_max` and `pick_max`.
    pub candidates: bool,
    /// Words of the cut-offs buffer (0 when no request filters).
    pub words: usize,
}

impl CutShape {
    /// The cutoff pass of `plan` over `windows` (`filters`: some request sets a filter).
    pub fn new(g: &GpuBackend, plan: &Plan, windows: &[Window], filters: bool) -> CutShape {
        let cut_logits = plan.draft_kind == DRAFT_LOGITS;
        let cut_rows = plan.total_rows + if cut_logits { plan.total_drafts } else { 0 };
        let cut_len = plan
            .vocab
            .max(if cut_logits { plan.draft_vocab } else { 0 });
        let slice = candidate_slice(
            g.kernels.wg,
            &plan.reqs,
            g.cut_slice(cut_len, cut_rows),
            cut_len,
            u64::from(cut_len) * cut_rows as u64,
        );
        let steps = {
            let filtered = || plan.reqs.iter().filter(|r| r.flags & REQ_FILTER != 0);
            // Min-p's bound comes from the max alone (the pick after the max scan).
            1 + 2 * u32::from(filtered().any(|r| r.top_k != 0))
                + 2 * u32::from(filtered().any(|r| r.top_p < 1.0))
        };
        let sides: u32 = if cut_logits { 2 } else { 1 };
        let group_rows = group_rows(g, sides);
        let list = list_words(g, plan.total_rows.min(group_rows), sides, cut_len);
        // The kernel's test (takes_candidates) with the target rows' slices. The kernel tests
        // every row (draft-logit rows with their own length): this only picks the first
        // round's entry points.
        let target_slices = plan.vocab.div_ceil(slice);
        let candidates = g.kernels.wg == 256
            && target_slices <= CAND_MAX_SLICES
            && plan.reqs.iter().any(|r| {
                r.flags & REQ_FILTER != 0
                    && small_top_k(r, g.kernels.wg)
                    && slice <= candidate_spread(r)
                    && r.top_k * target_slices <= list / 2
            });
        let groups = if filters {
            windows
                .iter()
                .enumerate()
                .flat_map(|(i, w)| {
                    (w.row_begin..w.row_end)
                        .step_by(group_rows)
                        .map(move |a| (i, a, (a + group_rows).min(w.row_end)))
                })
                .collect()
        } else {
            Vec::new()
        };
        CutShape {
            slice,
            slices: cut_len.div_ceil(slice),
            sides,
            steps,
            groups,
            group_rows,
            list,
            candidates,
            group_slots: if filters {
                plan.total_rows.div_ceil(group_rows) + windows.len()
            } else {
                0
            },
            // Cut-offs only exist when some request filters; otherwise the buffer is bound
            // unread (row_stats and the residual pass check PARAM_CUTOFF) and its minimum size
            // will do.
            words: if filters {
                plan.total_rows + plan.total_drafts
            } else {
                0
            },
        }
    }

    /// Bytes of the scratch: one group's slots on every side.
    pub fn state_bytes(&self, total_rows: usize) -> u64 {
        total_rows.min(self.group_rows) as u64
            * u64::from(self.sides)
            * (CUT_HEAD_WORDS + u64::from(self.list))
            * 4
    }

    /// The Params of every row group. A cutoff group reads its window's bindings from its own
    /// first row on; its draft rows are still addressed from the window's first draft row.
    pub fn group_params(
        &self,
        windows: &[Window],
        window_params: &[Params],
        vocab: u32,
    ) -> Vec<Params> {
        self.groups
            .iter()
            .map(|&(i, a, b)| {
                let w = &windows[i];
                Params {
                    row_begin: a as u32,
                    row_count: (b - a) as u32,
                    t_elem_base: window_params[i].t_elem_base + ((a - w.row_begin) as u32) * vocab,
                    ..window_params[i]
                }
            })
            .collect()
    }
}

/// The scratch's byte budget on `g`: `CUT_SCRATCH_BYTES`, or less where the largest binding is
/// smaller (`VerifierOptions::max_binding_bytes` caps it too).
fn scratch_budget(g: &GpuBackend) -> u64 {
    g.max_binding.min(CUT_SCRATCH_BYTES)
}

/// Target rows per cutoff group on `g`: `CUT_GROUP_ROWS`, or as many as the budget holds with
/// the shortest lists (`sides` slots per row), at least one.
fn group_rows(g: &GpuBackend, sides: u32) -> usize {
    let per_row = u64::from(sides) * (CUT_HEAD_WORDS + CUT_MIN_LIST) * 4;
    (scratch_budget(g) / per_row).clamp(1, CUT_GROUP_ROWS as u64) as usize
}

/// Words of each slot's list of the chosen bin's keys for groups of `rows` target rows: what the
/// budget leaves per slot, but no more than a row's `len` entries (and at least 4).
fn list_words(g: &GpuBackend, rows: usize, sides: u32, len: u32) -> u32 {
    let slots = (rows.max(1) as u64) * u64::from(sides);
    let per_slot = scratch_budget(g) / 4 / slots;
    per_slot
        .saturating_sub(CUT_HEAD_WORDS)
        .clamp(4, u64::from(len).max(4)) as u32
}

impl GpuBackend {
    /// Row entries per cutoff `scan` workgroup for `rows` filtered rows of `vocab`: about
    /// `target_workgroups` workgroups in all, at least `CUT_MIN_PER_LANE` entries per lane, a
    /// multiple of the workgroup size, and few enough slices per row for one dispatch
    /// dimension. Tuning only: the cut-offs never depend on it (integer histograms).
    pub fn cut_slice(&self, vocab: u32, rows: usize) -> u32 {
        let max_slices = u64::from(
            self.kernels
                .device
                .limits()
                .max_compute_workgroups_per_dimension
                .max(1),
        );
        let want = (u64::from(vocab) * rows as u64).div_ceil(u64::from(self.target_workgroups));
        let least = u64::from(vocab).div_ceil(max_slices);
        let slice = want
            .min(u64::from(vocab))
            .max(least)
            .max(u64::from(self.kernels.wg * CUT_MIN_PER_LANE));
        (slice.next_multiple_of(u64::from(self.kernels.wg))).min(u64::from(u32::MAX / 2)) as u32
    }

    /// One cutoff bind group per window (none when no request filters).
    pub(super) fn cutoff_groups(
        &self,
        ws: &Workspace,
        shape: &Shape,
        rows: &[WindowRows<'_>],
    ) -> Vec<wgpu::BindGroup> {
        if !shape.filters {
            return Vec::new();
        }
        rows.iter()
            .map(|r| {
                self.bind_group(
                    ws,
                    Kernel::Cutoff,
                    "specdec.cutoff",
                    &[
                        params_entry(ws),
                        r.target(),
                        r.draft(&self.kernels.dummy),
                        ws.meta_entry(3, ws.meta_at.requests),
                        ws.meta_entry(4, ws.meta_at.row_info),
                        entry(5, ws.cutoffs.get()),
                        entry(6, ws.cut_state.get()),
                    ],
                )
            })
            .collect()
    }

    /// Requests with top-k / top-p / min-p first get their rows' cut-offs. Per row group: init,
    /// then (scan, pick) per stage. The groups reuse the scratch one after another (wgpu orders
    /// dispatches sharing a buffer).
    pub(super) fn record_cutoff(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        groups: &[wgpu::BindGroup],
    ) {
        if !shape.filters {
            return;
        }
        let cut = &shape.cut;
        for (g, &(i, a, b)) in cut.groups.iter().enumerate() {
            let rows = (b - a) as u32;
            // Every pipeline of the group gets the group's slot again (`ParamSlots::bind`).
            let mut run = |pipeline: &wgpu::ComputePipeline, x: u32| {
                pass.set_pipeline(pipeline);
                shape.slots.bind(pass, &groups[i], shape.windows.len() + g);
                pass.dispatch_workgroups(x, rows, cut.sides);
            };
            run(self.pipeline(Kernel::Cutoff, "init"), 1);
            // The first round is every row's max (scan_max, pick_max), the others the value
            // bins' stages.
            for step in 0..cut.steps {
                let (scan, pick) = match (step, cut.candidates) {
                    (0, true) => ("scan_top_k", "pick_top_k"),
                    (0, false) => ("scan_max", "pick_max"),
                    _ => ("scan", "pick"),
                };
                run(
                    self.special_pipeline(Kernel::Cutoff, scan, shape.plain_loads()),
                    cut.slices,
                );
                run(self.pipeline(Kernel::Cutoff, pick), 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(top_k: u32, top_p: f32) -> ReqInfo {
        ReqInfo {
            flags: REQ_FILTER,
            top_k,
            top_p,
            ..Default::default()
        }
    }

    /// The slice for `rows` rows of `len` with `cut_slice`'s 2,048 (its floor at 256 lanes).
    fn slice_for(reqs: &[ReqInfo], rows: u64, len: u32) -> u32 {
        candidate_slice(256, reqs, 2048, len, rows * u64::from(len))
    }

    #[test]
    fn small_top_k_batches_get_longer_slices_within_the_limits() {
        let k40 = [req(40, 1.0); 8];
        // R = 8, k = 4 (40 rows): CAND_SLICE, 10 slices of V = 151,936, 400 workgroups.
        assert_eq!(slice_for(&k40, 40, 151_936), CAND_SLICE);
        // V = 32,000: 40 rows keep 256 workgroups (32,000 · 40 / 256 = 5,000, down to 4,864).
        assert_eq!(slice_for(&k40, 40, 32_000), 4864);
        // k = 200 bounds the slice by the candidates' spread: 2,097,152 / 201 = 10,433.
        assert_eq!(slice_for(&[req(200, 1.0)], 40, 151_936), 10240);
        // Top-p after top-k takes candidates too; requests without filters do not count.
        let mut mixed = vec![req(40, 0.95)];
        mixed.push(ReqInfo::default());
        assert_eq!(slice_for(&mixed, 40, 151_936), CAND_SLICE);
    }

    #[test]
    fn other_batches_keep_their_slices() {
        // One request at V = 151,936: 256 workgroups would leave rows of 54 slices.
        assert_eq!(slice_for(&[req(40, 1.0)], 5, 151_936), 2048);
        // 5 rows of V = 32,000: fewer than 256 workgroups of 2,048 already.
        assert_eq!(slice_for(&[req(40, 1.0)], 5, 32_000), 2048);
        // A request without top-k, or with one too large for candidates.
        assert_eq!(slice_for(&[req(40, 1.0), req(0, 0.9)], 40, 151_936), 2048);
        assert_eq!(slice_for(&[req(300, 1.0)], 40, 151_936), 2048);
        // No filtered request, a workgroup size other than 256, a slice already long enough.
        assert_eq!(slice_for(&[], 40, 151_936), 2048);
        assert_eq!(
            candidate_slice(128, &[req(40, 1.0)], 2048, 151_936, 40 * 151_936),
            2048
        );
        assert_eq!(
            candidate_slice(256, &[req(40, 1.0)], 21504, 151_936, 1152 * 151_936),
            21504
        );
    }
}

//! Tree batches on the GPU (`crate::tree`; CPU: `cpu::tree`). The chain's passes with a walk in
//! place of the per-row decision: cutoff and row_stats over every row (unchanged), verify's
//! `tree_merge` (each row's chunks into row_stats), block_mass's `tree` (each slot's children's
//! values at its row, and the residual masses children drawn from q need), verify's `tree_walk`
//! (one walk per request), then residual_argmax over the row where each walk stopped.
//!
//! No kernel gets a new binding (the WebGPU default allows 8 storage buffers per stage, and the
//! chain kernels use them all): the tree table rides in the draft-id buffer (`row_info` of
//! block_mass, `draft_ids` of verify), the children's values and masses in the block-mass buffer
//! (`masses` of block_mass, `rates` of verify), and the walk's results for the residual pass in
//! scratch words after the packed output, which only the accepted nodes of are read back.

use super::bindings::scoped;
use super::pipelines::{SPECIAL_ENTROPY, SPECIAL_RAW};
use super::shape::Shape;
use super::workspace::Workspace;
use super::{checks, GpuBackend, Sources, Timestamps};
use crate::batch::{Status, TreePlan};
use crate::error::Error;
use crate::layout::*;
use crate::shaders::Kernel;
use crate::tree::{TreeOutput, TreeVerdict};

/// Words of the tree table: per global slot (= target row) `g`, words `8g .. 8g + 7` are
/// (request, depth, first child, child count, token or −1, draft row or `NO_INDEX`, 0, 0); the
/// children's slots follow at word `8 · total_rows`, grouped by parent slot in index order.
/// Also returns the children's tokens in the same order (the residual pass's exclusions).
fn tree_table(tp: &TreePlan) -> (Vec<u32>, Vec<u32>) {
    let plan = &tp.plan;
    let mut table = vec![0u32; 8 * plan.total_rows];
    let (mut children, mut tokens) = (Vec::new(), Vec::new());
    for (r, tree) in tp.trees.iter().enumerate() {
        let base = plan.reqs[r].row_offset as usize;
        for s in 0..tree.depth.len() {
            let g = base + s;
            let kids = tree.children_of(s);
            let token = if s == 0 { -1 } else { tree.tokens[s - 1] };
            table[8 * g..8 * g + 6].copy_from_slice(&[
                r as u32,
                tree.depth[s],
                children.len() as u32,
                kids.len() as u32,
                token as u32,
                plan.row_info[g][3],
            ]);
            for &c in kids {
                children.push((base + 1 + c as usize) as u32);
                tokens.push(tree.tokens[c as usize] as u32);
            }
        }
    }
    table.extend(children);
    (table, tokens)
}

/// Word offsets in the output buffer: the accepted nodes, the race headers, the children's
/// tokens (the layout `tree_scratch` / `tree_headers` compute in WGSL), and the total.
struct Scratch {
    nodes: usize,
    headers: usize,
    tokens: usize,
    total: usize,
}

fn scratch(tp: &TreePlan, children: usize) -> Scratch {
    let plan = &tp.plan;
    let n = plan.num_requests();
    let nodes = plan.out_words();
    let headers = nodes + n * plan.out_stride;
    let tokens = headers + 8 * n;
    Scratch {
        nodes,
        headers,
        tokens,
        total: tokens + children,
    }
}

impl GpuBackend {
    /// Records the verification of a checked tree batch over the caller's rows, in the chain's
    /// four timed phases (cutoff + row_stats; tree_merge + tree values + tree_walk; the race's
    /// blocks; its merge). The readback then holds `tree_readback_words(tp)` words, decoded by
    /// [`decode_tree`].
    pub(crate) fn record_tree(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        ws: &mut Workspace,
        tp: &TreePlan,
        src: Sources<'_>,
        timestamps: Timestamps<'_>,
    ) -> Result<(), Error> {
        let plan = &tp.plan;
        self.check_alive()?;
        checks::check_buffers(plan, src.target, src.draft)?;
        let max_rows = self.check_fit(plan, src.target, src.draft)?;
        let mut shape = Shape::new(self, plan, (src.target, src.draft), max_rows, true);
        let (table, tokens) = tree_table(tp);
        let at = scratch(tp, tokens.len());
        shape.out_words = at.headers;
        self.ensure_workspace(ws, plan, &shape);
        let dev = &self.kernels.device;
        ws.tree_table.ensure(dev, table.len() as u64 * 4);
        // Tree values: 3 per slot, the recursion state 2 per slot, a partial per slot and chunk.
        let values = plan.total_rows as u64 * (5 + u64::from(shape.num_chunks));
        ws.masses.ensure(dev, values * 4);
        ws.out.ensure(dev, at.total as u64 * 4);
        let rows = self.write_metadata(ws, plan, &mut shape, src.target, src.draft);
        self.kernels
            .queue
            .write_buffer(ws.tree_table.get(), 0, bytemuck::cast_slice(&table));
        if !tokens.is_empty() {
            let offset = at.tokens as u64 * 4;
            self.kernels
                .queue
                .write_buffer(ws.out.get(), offset, bytemuck::cast_slice(&tokens));
        }
        // Sibling levels whose masses the walk may need: children drawn from q, up to the
        // largest child count of a non-greedy request.
        let levels = if plan.draft_kind == DRAFT_NONE {
            0
        } else {
            tp.trees
                .iter()
                .zip(&plan.reqs)
                .filter(|(_, info)| info.flags & REQ_GREEDY == 0)
                .flat_map(|(t, _)| t.child_start.windows(2).map(|w| w[1] - w[0]))
                .max()
                .unwrap_or(0)
        };
        let ws = &*ws;
        self.bind_callers(ws, &super::callers(src.target, src.draft));
        scoped(&self.kernels.device, || {
            let cutoff = self.cutoff_groups(ws, &shape, &rows);
            let stats = self.row_stats_groups(ws, &shape, &rows);
            let table = ws.tree_table.get().as_entire_buffer_binding();
            let values = self.mass_groups_over(ws, &rows, table.clone());
            let tables = [
                table,
                ws.masses.get().as_entire_buffer_binding(),
                self.kernels.dummy.as_entire_buffer_binding(),
            ];
            let walk = self.verify_group_over(ws, tables);
            let residual = self.residual_groups(ws, &shape, &rows);
            let special = shape.special & (SPECIAL_RAW | SPECIAL_ENTROPY);
            let phases: [&dyn Fn(&mut wgpu::ComputePass<'_>); 4] = [
                &|pass| {
                    self.record_cutoff(pass, &shape, &cutoff);
                    self.record_row_stats(pass, &shape, &stats);
                },
                &|pass| {
                    // The masses need the merged rows before the walk; without masses the walk
                    // merges its request's rows itself, one dispatch fewer.
                    let walk_entry = if levels > 1 {
                        pass.set_pipeline(self.special_pipeline(
                            Kernel::Verify,
                            "tree_merge",
                            special,
                        ));
                        shape.slots.bind(pass, &walk, 0);
                        pass.dispatch_workgroups(shape.n as u32, 1, 1);
                        "tree_walk"
                    } else {
                        "tree_merge_walk"
                    };
                    self.record_tree_values(pass, &shape, &values, levels);
                    pass.set_pipeline(self.special_pipeline(Kernel::Verify, walk_entry, special));
                    shape.slots.bind(pass, &walk, 0);
                    pass.dispatch_workgroups(shape.n as u32, 1, 1);
                },
                &|pass| self.record_residual_blocks(pass, &shape, &residual, false),
                &|pass| self.record_residual_merge(pass, &shape, &residual),
            ];
            if !shape.windows.is_empty() {
                super::record_phases(encoder, &phases, timestamps);
            }
            Self::record_readback_copy(encoder, ws, shape.out_words);
        })
        .map_err(|e| self.lift(e))
    }
}

impl GpuBackend {
    /// Uploads a host tree batch and records it into a fresh encoder; returns the submission.
    pub(crate) fn submit_host_tree(
        &self,
        ws: &mut Workspace,
        tp: &TreePlan,
        target: crate::Logits<'_>,
        draft: Option<crate::Logits<'_>>,
    ) -> Result<wgpu::SubmissionIndex, Error> {
        self.submit_uploaded(ws, target, draft, |g, encoder, ws, src| {
            g.record_tree(encoder, ws, tp, src, Timestamps::None)
        })
    }
}

impl GpuBackend {
    /// Dispatches block_mass's tree entries over every window: the children's values, then per
    /// sibling level 1 .. `levels − 1` the masses' partials and their fold.
    fn record_tree_values(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &Shape,
        groups: &[wgpu::BindGroup],
        levels: u32,
    ) {
        let windows = || shape.windows.iter().enumerate();
        pass.set_pipeline(self.pipeline(Kernel::BlockMass, "tree"));
        for (i, w) in windows() {
            shape.slots.bind(pass, &groups[i], i);
            pass.dispatch_workgroups((w.row_end - w.row_begin) as u32, 1, 1);
        }
        for _ in 1..levels {
            pass.set_pipeline(self.pipeline(Kernel::BlockMass, "tree_mass"));
            for (i, w) in windows() {
                shape.slots.bind(pass, &groups[i], i);
                pass.dispatch_workgroups(shape.num_chunks, (w.row_end - w.row_begin) as u32, 1);
            }
            pass.set_pipeline(self.pipeline(Kernel::BlockMass, "tree_fold"));
            for (i, w) in windows() {
                shape.slots.bind(pass, &groups[i], i);
                pass.dispatch_workgroups((w.row_end - w.row_begin).div_ceil(64) as u32, 1, 1);
            }
        }
    }
}

/// Words of a tree batch's readback: the packed output and the accepted nodes.
pub(crate) fn tree_readback_words(tp: &TreePlan) -> usize {
    let plan = &tp.plan;
    plan.out_words() + plan.num_requests() * plan.out_stride
}

/// The verdicts from the readback words of [`GpuBackend::record_tree`].
pub(crate) fn decode_tree(tp: &TreePlan, words: &[u32]) -> TreeOutput {
    let plan = &tp.plan;
    let (n, s) = (plan.num_requests(), plan.out_stride);
    let floats = |at: usize, len: usize| -> Vec<f32> {
        words[at..at + len]
            .iter()
            .map(|&w| f32::from_bits(w))
            .collect()
    };
    let at = scratch(tp, 0);
    let lp_base = n * s + 2 * n;
    let requests = (0..n)
        .map(|r| {
            let info = &plan.reqs[r];
            let emitted = words[n * s + r] as usize;
            let tok = r * s;
            TreeVerdict {
                accepted_nodes: words[at.nodes + tok..at.nodes + tok + emitted - 1].to_vec(),
                tokens: words[tok..tok + emitted]
                    .iter()
                    .map(|&w| w as i32)
                    .collect(),
                status: Status(words[n * s + n + r]),
                seed: plan.seeds[r],
                logprobs: (info.flags & REQ_LOGPROBS != 0).then(|| floats(lp_base + tok, emitted)),
                raw_logprobs: (info.flags & REQ_RAW_LOGPROBS != 0)
                    .then(|| floats(lp_base + n * s + tok, emitted)),
            }
        })
        .collect();
    TreeOutput { requests }
}

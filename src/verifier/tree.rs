//! [`Verifier`]'s tree calls (`crate::tree`): the host path and the GPU-resident path, the same
//! shape as the chain calls beside them.

use super::{Backend, Verifier};
use crate::batch::{TreePlan, TreeShapeIn};
use crate::error::Error;
use crate::gpu::{self, GpuDraft, GpuRows, Timestamps, Workspace};
use crate::tree::{TreeBatch, TreeFault, TreeOutput, TreeRequest};
use rand_pcg::rand_core::Rng;

/// A batch of trees whose rows live in GPU buffers ([`Verifier::record_tree`]); the layout is
/// [`TreeBatch`]'s.
#[derive(Clone, Copy, Debug)]
pub struct GpuTreeBatch<'a> {
    /// Target vocabulary size.
    pub vocab_size: u32,
    /// The requests.
    pub requests: &'a [TreeRequest<'a>],
    /// Σ (n_r + 1) rows × V target logits (f32, f16 or bf16), from the given byte offset.
    pub target_logits: GpuRows<'a>,
    /// How the children were drafted: [`GpuDraft::OneHot`], or one `q` row per expanding node.
    pub draft: GpuDraft<'a>,
    /// Draft vocabulary size when smaller than the target's; `None` = `vocab_size`.
    pub draft_vocab_size: Option<u32>,
}

/// A tree verification recorded into a command encoder: submit the encoder, then pass this to
/// [`Verifier::read_tree_blocking`].
pub struct PendingTree {
    ws: Workspace,
    plan: TreePlan,
}

impl Verifier {
    fn tree_plan(&self, shape: &TreeShapeIn<'_>) -> Result<TreePlan, Error> {
        let mut rng = self.seeds.lock().unwrap_or_else(|p| p.into_inner());
        TreePlan::new(shape, TreeFault::None, || rng.next_u64())
    }

    /// Verifies a batch of draft **trees** held in host memory ([`crate::tree`]: layout, rules,
    /// randomness); blocks until the result is back. On a GPU: one upload, one submission, one
    /// readback, like [`Verifier::verify_blocking`]; on the CPU backend the same walk on the
    /// host. Requests with `seed: None` draw their seed from this verifier's generator.
    pub fn verify_tree_blocking(&self, batch: &TreeBatch<'_>) -> Result<TreeOutput, Error> {
        let plan = {
            let mut rng = self.seeds.lock().unwrap_or_else(|p| p.into_inner());
            TreePlan::for_host(batch, TreeFault::None, || rng.next_u64())?
        };
        let (_, draft) = batch.draft.split();
        match &self.backend {
            Backend::Cpu(shape) => {
                let (t, d) = (batch.target_logits.to_f32(), draft.map(|d| d.to_f32()));
                Ok(crate::cpu::tree::run(
                    &plan,
                    &t,
                    d.as_deref(),
                    shape.threads,
                ))
            }
            Backend::Gpu(g) => {
                if plan.plan.num_requests() == 0 {
                    return Ok(TreeOutput {
                        requests: Vec::new(),
                    });
                }
                let _serial = self.serialize();
                let mut ws = g.take_workspace();
                let result = (|| {
                    let index = g.submit_host_tree(&mut ws, &plan, batch.target_logits, draft)?;
                    let words = gpu::tree_readback_words(&plan);
                    let flag = g.start_map(&ws, words);
                    let w = g.wait_for_map(Some(index), &ws, words, &flag)?;
                    Ok(gpu::decode_tree(&plan, &w))
                })();
                g.give_back_if_ok(ws, &result);
                result
            }
        }
    }

    /// Test hook: the residual mass each child's test uses, per target row of the batch (the
    /// row of the child's node; NaN, or on the GPU whatever the buffer held, where no test uses
    /// one), as this backend computes it during a verification of `batch`.
    #[doc(hidden)]
    pub fn tree_masses_blocking(&self, batch: &TreeBatch<'_>) -> Result<Vec<f32>, Error> {
        let plan = {
            let mut rng = self.seeds.lock().unwrap_or_else(|p| p.into_inner());
            TreePlan::for_host(batch, TreeFault::None, || rng.next_u64())?
        };
        let (_, draft) = batch.draft.split();
        let (t, d) = (batch.target_logits.to_f32(), draft.map(|d| d.to_f32()));
        match &self.backend {
            Backend::Cpu(_) => Ok(crate::cpu::tree::sibling_masses(&plan, &t, d.as_deref())),
            Backend::Gpu(g) => {
                let rows = plan.plan.total_rows;
                if rows == 0 {
                    return Ok(Vec::new());
                }
                let _serial = self.serialize();
                let mut ws = g.take_workspace();
                let result = (|| {
                    let index = g.submit_host_tree(&mut ws, &plan, batch.target_logits, draft)?;
                    g.wait(Some(index))?;
                    let values = g.read_tree_values(&ws, 3 * rows)?;
                    Ok(values.chunks(3).map(|v| v[2]).collect())
                })();
                g.give_back_if_ok(ws, &result);
                result
            }
        }
    }

    /// Records the verification of trees whose rows live in GPU buffers into the caller's
    /// encoder (the GPU-resident path, as [`Verifier::record`] for chains). Submit the encoder,
    /// then read the verdicts with [`Verifier::read_tree_blocking`].
    pub fn record_tree(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        batch: &GpuTreeBatch<'_>,
    ) -> Result<PendingTree, Error> {
        self.record_tree_timed(encoder, batch, Timestamps::None)
    }

    /// [`Verifier::record_tree`] with GPU timestamps, as [`Verifier::record_timed`] takes them
    /// (per kernel: the phases cutoff + row_stats, the tree walk with its merge and values, the
    /// race's blocks, its merge).
    pub fn record_tree_timed(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        batch: &GpuTreeBatch<'_>,
        timestamps: Timestamps<'_>,
    ) -> Result<PendingTree, Error> {
        let Backend::Gpu(g) = &self.backend else {
            return Err(Error::NotGpu);
        };
        let (draft_kind, draft) = batch.draft.split();
        let plan = self.tree_plan(&TreeShapeIn {
            vocab: batch.vocab_size,
            requests: batch.requests,
            draft_kind,
            draft_vocab: batch.draft_vocab_size,
        })?;
        let mut ws = g.take_workspace();
        if plan.plan.num_requests() > 0 {
            let src = gpu::Sources {
                target: batch.target_logits,
                draft,
                ids: None,
            };
            if let Err(e) = g.record_tree(encoder, &mut ws, &plan, src, timestamps) {
                g.give_back(ws);
                return Err(e);
            }
        }
        Ok(PendingTree { ws, plan })
    }

    /// Ends a recorded tree verification whose verdicts are not needed (a step recorded ahead
    /// and dropped), returning its buffers to the pool, as [`Verifier::release`] does for chains.
    pub fn release_tree(&self, pending: PendingTree) {
        if let Backend::Gpu(g) = &self.backend {
            g.give_back(pending.ws);
        }
    }

    /// Waits for a recorded tree verification (after the caller submitted its encoder) and
    /// reads the verdicts back.
    pub fn read_tree_blocking(&self, pending: PendingTree) -> Result<TreeOutput, Error> {
        let Backend::Gpu(g) = &self.backend else {
            return Err(Error::NotGpu);
        };
        let PendingTree { ws, plan } = pending;
        if plan.plan.num_requests() == 0 {
            g.give_back(ws);
            return Ok(TreeOutput {
                requests: Vec::new(),
            });
        }
        let words = gpu::tree_readback_words(&plan);
        let result = (|| {
            let flag = g.start_map(&ws, words);
            let w = g.wait_for_map(None, &ws, words, &flag)?;
            Ok(gpu::decode_tree(&plan, &w))
        })();
        g.give_back_if_ok(ws, &result);
        result
    }
}

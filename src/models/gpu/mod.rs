//! The forward pass of [`crate::models`]' llama and qwen2 models on the GPU through wgpu, so
//! the target's logits never leave the GPU on their way to the verifier.
//!
//! - [`GpuModel`]: the weights, re-quantized to Q8_0 and uploaded once to the caller's device,
//!   and the kernels' pipelines; shared by `Arc`.
//! - [`HostModel`]: the same weights on the host, and an f64 reference forward over them that
//!   the kernels are tested against.
//! - [`GpuSequence`]: one sequence's KV cache and activations. [`GpuSequence::record`] appends
//!   tokens in the caller's command encoder and leaves the logits of every appended position in
//!   a GPU buffer ([`GpuLogits`], readable by the verifier as [`crate::GpuRows`]);
//!   [`GpuSequence::truncate`] rolls back after a rejection. [`GpuSequence::record_tree`]
//!   scores a tree of tokens (tree attention) and [`GpuSequence::keep_path`] keeps one path.
//!
//! Kernels (`shaders/model_<kernel>.wgsl`, labels `specdec.model_<kernel>`): embed, rmsnorm,
//! matmul_q8 (8-bit weights × 8-bit activations, weight-stationary for up to [`MAX_ROWS`] rows,
//! optional fused bias or residual add; q/k/v as one), rope (which also writes keys and values
//! into the cache), attention, swiglu, kv_keep (moves a kept tree path's cache entries); rope
//! and attention also run over a tree; rmsnorm, attention and swiglu write their output as the
//! 8-bit blocks the matmul reads. Every reduction has an order fixed by the model's shapes and
//! the position alone, so a position's logits are the same bits whether it is scored alone or
//! with up to 15 others, and speculative greedy decoding equals plain greedy decoding bit for
//! bit. The mirror of the CPU forward (`crate::models::Model`) is close, not exact: both round
//! matmul inputs to 8 bits (the CPU with f16 block scales, the GPU with f32 ones), and the CPU
//! keeps the file's own weight formats where the GPU re-quantizes them to Q8_0.
//!
//! Costs (measured by tests/gpu_forward.rs on SmolLM2-135M Q4_1, lavapipe):
//! - Memory: 1.125 bytes per weight (int8 values, one f32 scale per 32), against 0.625 for the
//!   file's Q4_1 and about 0.6 for Qwen's Q4_K_M: SmolLM2's matrices take 151 MB on the device.
//!   The KV cache is f32, `2 · layers · kv_heads · head_dim · 4` bytes per position (SmolLM2:
//!   46 KB; Qwen2.5 1.5B: 57 KB), grown by doubling.
//! - Accuracy: 2.4e-7 from the same forward in f64 over the same weights and 8-bit activation
//!   rounding ([`HostModel::reference_forward`]) where every activation rounds alike; an
//!   activation within f32 rounding of a step's midpoint can round the other way on one side
//!   (2.1 % of the largest logit over 8 SmolLM2 positions). 1.67 at most from candle's logits
//!   (which reach 41.8) over a 16-token prompt, every argmax equal. For scale, candle's own Q8_0
//!   re-quantization of the file moves candle's logits by 2.87.

mod decode;
mod form_check;
mod kernels;
mod reference;
mod sequence;
mod weights;

pub use decode::{GpuDecodeConfig, GpuDecoder, GpuGeneration, GpuProposer, PLAIN_WINDOW};
pub use form_check::{matmul_forms_agree, MatmulFormCheck};
pub use kernels::{MatmulForm, ModelKernel, MODEL_COMMON};
pub use sequence::{ForwardProfile, GpuLogits, GpuSequence, MAX_ROWS, MAX_TREE_DEPTH};
pub use weights::{GpuModel, GpuModelOptions, HostModel, Q8Matrix, Q8_BLOCK};

pub(crate) use kernels::Pipelines;

use super::ModelError;

/// What can go wrong on the GPU forward path.
#[derive(Debug)]
#[non_exhaustive]
pub enum GpuModelError {
    /// Reading the model or a bad input (the same checks as the CPU forward).
    Model(ModelError),
    /// A wgpu object creation, recording or readback failed (validation, out of memory).
    Gpu(crate::Error),
    /// The model or the request does not fit what the kernels or the device support; the
    /// message says what to change.
    Invalid(String),
}

impl std::fmt::Display for GpuModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuModelError::Model(e) => write!(f, "{e}"),
            GpuModelError::Gpu(e) => write!(f, "GPU forward: {e}"),
            GpuModelError::Invalid(m) => write!(f, "GPU forward: {m}"),
        }
    }
}

impl std::error::Error for GpuModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GpuModelError::Model(e) => Some(e),
            GpuModelError::Gpu(e) => Some(e),
            GpuModelError::Invalid(_) => None,
        }
    }
}

impl From<ModelError> for GpuModelError {
    fn from(e: ModelError) -> Self {
        GpuModelError::Model(e)
    }
}

impl From<crate::Error> for GpuModelError {
    fn from(e: crate::Error) -> Self {
        GpuModelError::Gpu(e)
    }
}

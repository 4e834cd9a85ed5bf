//! Real models for the target and draft side of speculative decoding (feature `candle`).
//!
//! A small llama-family forward pass over GGUF weights, on the CPU through candle-core's
//! quantized matmul. It exists because a verifier needs what ready-made inference modules do not
//! give: the logits of **every** appended position (the `k` drafts and the bonus row in one call)
//! and a KV cache that can be **truncated** after a rejection.
//!
//! - [`Weights`]: one GGUF file (llama: SmolLM2; qwen2: Qwen2.5-Coder), shared by `Arc`.
//! - [`Model`]: one sequence over shared weights: `forward`, `truncate`, `len`, `vocab_size`;
//!   [`Model::layer_skip`] makes a self-speculation draft from the first layers.
//! - [`Tokenizer`]: byte-level BPE from the GGUF metadata.
//! - [`generate`]: plain greedy or sampled decoding, the baseline.
//! - [`GreedyDraft`] and `impl SequenceModel for Model`: the glue to [`crate::speculative`]'s
//!   `SpecDecoder` (target: `Sequences<Model>`, draft: `DraftModelProposer<GreedyDraft>`).
//!
//! ```no_run
//! use specdec::models::{Model, Weights};
//! let weights = Weights::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let mut target = Model::new(weights.clone());
//! let mut draft = Model::layer_skip(weights.clone(), 10)?;
//! let prompt = weights.tokenizer().encode("def fib(n):");
//! let logits = target.forward(&prompt)?; // prompt.len() rows of vocab_size() logits
//! assert_eq!(logits.len(), prompt.len() * target.vocab_size());
//! target.truncate(prompt.len() - 1)?; // roll the last position back
//! # let _ = draft.forward(&prompt)?;
//! # Ok::<(), specdec::models::ModelError>(())
//! ```
//!
//! Weights are fetched by `examples/fetch-models.sh` into
//! `${SPECDEC_MODELS:-$HOME/.cache/specdec/models}`; [`models_dir`] and [`SMOLLM2_FILE`] etc.
//! name them.

mod cpu_matmul;
mod draft_tree;
mod error;
mod generate;
mod gpu;
mod model;
mod speculative;
mod tokenizer;
mod tree_decode;
mod weights;

use std::path::PathBuf;

pub use cpu_matmul::{CpuKernel, CpuQ8Matrix, ROW_TILE, TILE_LANES};
pub use draft_tree::DraftTreeProposer;
pub use error::ModelError;
pub use generate::{argmax, generate, sample, GenerateOptions, Generation};
pub use gpu::{
    matmul_forms_agree, ForwardProfile, GpuDecodeConfig, GpuDecoder, GpuGeneration, GpuLogits,
    GpuModel, GpuModelError, GpuModelOptions, GpuProposer, GpuSequence, HostModel, MatmulForm,
    MatmulFormCheck, ModelKernel, Q8Matrix, MAX_ROWS, MAX_TREE_DEPTH, MODEL_COMMON, PLAIN_WINDOW,
    Q8_BLOCK,
};
pub use model::Model;
pub use speculative::GreedyDraft;
pub use tokenizer::{PreTokenizer, Tokenizer};
pub use tree_decode::{generate_tree, generate_tree_with, TreeGenOptions, TreeGeneration};
pub use weights::{Architecture, Config, LoadOptions, MatmulKernel, RopeStyle, Weights};

/// File name of SmolLM2-135M-Instruct (Q4_1) in the models directory.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), the draft of the 1.5B.
pub const QWEN_0_5B_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// File name of Qwen2.5-Coder-1.5B-Instruct (Q4_K_M).
pub const QWEN_1_5B_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// The file of a model named as the examples and benches name it: `smollm2`, `qwen-0.5b` or
/// `qwen-1.5b` in [`models_dir`]; any other name is taken as a path.
pub fn model_file(name: &str) -> PathBuf {
    match name {
        "smollm2" => models_dir().join(SMOLLM2_FILE),
        "qwen-0.5b" => models_dir().join(QWEN_0_5B_FILE),
        "qwen-1.5b" => models_dir().join(QWEN_1_5B_FILE),
        other => PathBuf::from(other),
    }
}

/// The directory `examples/fetch-models.sh` fills: `$SPECDEC_MODELS`, else
/// `$HOME/.cache/specdec/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPECDEC_MODELS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/specdec/models")
}

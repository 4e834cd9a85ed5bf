//! # specdec
//!
//! The verification step of speculative decoding on any GPU through wgpu (Vulkan, Metal, DX12,
//! OpenGL), with WGSL compute kernels and a CPU twin of every kernel.
//!
//! A [`Verifier`] takes a batch of requests, each with `k` draft tokens and the `k + 1` rows of
//! target logits that scored them, and decides per request how many drafts to keep and which
//! token to emit next, so that the emitted text is distributed exactly as if the target had
//! sampled it token by token (greedy, rejection sampling with draft probabilities, draft logits or
//! one-hot drafts, synthetic rates). See `SPEC.md` of the project for the formulas and README.md
//! for the API tour. [`speculative`] builds the rest of a speculative decoder around the verifier:
//! n-gram and draft-model proposers, the scorer, and the decode loop with its metrics.
//!
//! ```no_run
//! use specdec::{Draft, Request, SamplingParams, Verifier, VerifierOptions, VerifyBatch};
//! // A real GPU if there is one, else the CPU backend (see `device` for the policy).
//! let verifier = Verifier::auto(VerifierOptions::default()).unwrap();
//! let vocab = 8;
//! let requests = [Request { num_drafts: 2, params: SamplingParams::seeded(1.0, 42), position: 17 }];
//! let logits = vec![0.0f32; 3 * vocab];
//! let out = verifier
//!     .verify_blocking(&VerifyBatch {
//!         vocab_size: vocab as u32,
//!         requests: &requests,
//!         draft_token_ids: &[3, 5],
//!         target_logits: (&logits).into(),
//!         draft: Draft::OneHot,
//!         draft_vocab_size: None,
//!         synthetic_rates: None,
//!     })
//!     .unwrap();
//! println!("emitted {:?}", out.emitted(0));
//! ```

#![warn(missing_docs)]

mod batch;
mod cpu;
pub mod device;
mod error;
mod gpu;
#[cfg(feature = "candle")]
pub mod models;
pub mod rng;
pub mod speculative;
pub mod synthetic;
pub mod tree;
mod verifier;

// Public for the shader tests (WGSL struct layouts against the `#[repr(C)]` mirrors, naga
// translation to every backend), not an API: hidden so that the documentation a user reads shows
// only the library. They sit at the top level because the GPU pipeline (`gpu`) is built on them.
#[doc(hidden)]
pub mod layout;
#[doc(hidden)]
pub mod shaders;
// The `specdec` command's tools (benchmark, self-test, statistics), shared with the test suite.
// A folder and a hidden module rather than a cargo feature: the CLI binary and the tests need them
// in every build, and a feature would make `cargo test` depend on a flag.
#[doc(hidden)]
pub mod tools;

pub use batch::{
    bf16_to_f32, f16_to_f32, Draft, Dtype, Fault, Logits, Request, Rule, SamplingParams, Status,
    VerifyBatch, VerifyOutput, MAX_DRAFTS_PER_REQUEST,
};
pub use device::DeviceChoice;
pub use error::Error;
pub use gpu::{required_limits, select_adapter, DeviceIds, GpuDraft, GpuRows, Timestamps};
pub use verifier::{
    GpuTreeBatch, GpuVerifyBatch, PendingTree, PendingVerify, PipelineBuild, Verifier,
    VerifierOptions,
};

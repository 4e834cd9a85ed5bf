//! The one error type of the crate. Every message says what was wrong and what to do about it.

use std::fmt;

/// Everything that can go wrong in `specdec`. Input errors are found on the host before any GPU
/// work is recorded; GPU errors are caught in error scopes and never panic the host app.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// `vocab_size` is 0 or too large for 32-bit token ids.
    InvalidVocab {
        /// The vocabulary size given.
        vocab_size: u64,
    },
    /// `draft_vocab_size` is 0 or larger than `vocab_size`.
    InvalidDraftVocab {
        /// The draft vocabulary size given.
        draft_vocab: u32,
        /// The target vocabulary size.
        vocab: u32,
    },
    /// A request has more drafts than [`crate::MAX_DRAFTS_PER_REQUEST`].
    TooManyDrafts {
        /// Index of the request.
        request: usize,
        /// Its `num_drafts`.
        num_drafts: u32,
    },
    /// A temperature is NaN, infinite or negative.
    InvalidTemperature {
        /// Index of the request.
        request: usize,
        /// The temperature given.
        temperature: f32,
    },
    /// `top_k`, `top_p` or `min_p` of a request is out of range.
    InvalidSampling {
        /// Index of the request.
        request: usize,
        /// Which control and why.
        reason: String,
    },
    /// `draft_token_ids` does not hold Σ num_drafts ids.
    DraftIdCount {
        /// Σ num_drafts over the requests.
        expected: usize,
        /// Length of `draft_token_ids`.
        got: usize,
    },
    /// A tree request is malformed (see [`crate::tree::TreeDefect`]); found on the host before
    /// any work.
    InvalidTree {
        /// Index of the request.
        request: usize,
        /// What is wrong with it.
        defect: crate::tree::TreeDefect,
    },
    /// A draft id is ≥ vocab_size or < −1.
    TokenOutOfRange {
        /// Index into `draft_token_ids`.
        index: usize,
        /// The id.
        token: i32,
        /// The vocabulary size.
        vocab_size: u32,
    },
    /// The target logits do not hold Σ (num_drafts + 1) rows of `vocab_size`.
    TargetRowCount {
        /// Rows the requests need.
        expected_rows: usize,
        /// Elements (floats) given.
        got_elements: usize,
        /// The vocabulary size.
        vocab_size: u32,
    },
    /// The draft distribution does not hold Σ num_drafts rows of `vocab_size`.
    DraftRowCount {
        /// Rows the requests need.
        expected_rows: usize,
        /// Elements given.
        got_elements: usize,
        /// The vocabulary size.
        vocab_size: u32,
    },
    /// A synthetic request needs `synthetic_rates` (Σ num_drafts values in [0, 1]).
    SyntheticRates {
        /// What is wrong with them.
        reason: String,
    },
    /// A GPU buffer is too small for the rows it should hold.
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Bytes needed from offset 0.
        needed: u64,
        /// The buffer's size.
        size: u64,
    },
    /// A byte offset is not a multiple of 4.
    MisalignedOffset {
        /// Which buffer.
        what: &'static str,
        /// The offset given.
        offset: u64,
    },
    /// A GPU buffer lacks `BufferUsages::STORAGE`.
    BufferUsage {
        /// Which buffer.
        what: &'static str,
    },
    /// One row of logits is larger than the device's largest storage binding.
    RowTooLarge {
        /// Bytes of one row.
        row_bytes: u64,
        /// The device's `max_storage_buffer_binding_size`.
        max_binding: u64,
    },
    /// The batch is larger than 32-bit indices or the device's largest buffer allow.
    BatchTooLarge {
        /// What overflowed.
        reason: String,
    },
    /// The GPU buffer of draft ids given to [`crate::Verifier::record_device_drafts`] cannot
    /// serve the batch.
    DraftIdBuffer {
        /// What is wrong with it.
        detail: String,
    },
    /// The operation needs a GPU verifier (e.g. recording into a command encoder).
    NotGpu,
    /// `VerifierOptions` that cannot apply where they were given (e.g. other kernels asked of
    /// [`crate::Verifier::with_tuning`]).
    InvalidOptions {
        /// Which option, and what to do instead.
        detail: String,
    },
    /// No GPU adapter was found (or none matched `WGPU_ADAPTER_NAME` / `WGPU_BACKEND`).
    NoAdapter {
        /// What was looked for and what was seen.
        detail: String,
    },
    /// The adapter refused the device request (a limit or feature we need is missing).
    RequestDevice {
        /// wgpu's message.
        detail: String,
    },
    /// A wgpu validation or out-of-memory error caught in an error scope.
    Gpu {
        /// wgpu's message.
        detail: String,
    },
    /// The device was lost (driver reset, `destroy`); build a new `Verifier`.
    DeviceLost {
        /// wgpu's reason.
        detail: String,
    },
    /// The GPU did not finish within `VerifierOptions::timeout`.
    Timeout {
        /// The time waited.
        waited: std::time::Duration,
    },
}

/// [`Error::NotGpu`]'s message.
const NOT_GPU: &str = "this verifier runs on the CPU backend; recording into a command encoder \
                       needs Verifier::new or Verifier::with_device";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidVocab { vocab_size } => write!(
                f,
                "vocab_size {vocab_size} is not usable: it must be between 1 and {}",
                i32::MAX
            ),
            Error::TooManyDrafts {
                request,
                num_drafts,
            } => write!(
                f,
                "request {request} has {num_drafts} drafts; at most {} per request are supported \
                 (split the proposal)",
                crate::MAX_DRAFTS_PER_REQUEST
            ),
            Error::InvalidTemperature {
                request,
                temperature,
            } => write!(
                f,
                "request {request} has temperature {temperature}; it must be finite and >= 0 \
                 (0 means greedy)"
            ),
            Error::InvalidSampling { request, reason } => {
                write!(f, "request {request}: {reason}")
            }
            Error::InvalidTree { request, defect } => {
                write!(f, "tree request {request}: {defect}")
            }
            Error::DraftIdCount { expected, got } => write!(
                f,
                "draft_token_ids has {got} ids but the requests' num_drafts add up to {expected}"
            ),
            Error::TokenOutOfRange {
                index,
                token,
                vocab_size,
            } => write!(
                f,
                "draft_token_ids[{index}] = {token} is outside [-1, {vocab_size}): ids must be \
                 token ids of the vocabulary, or -1 for an invalid draft"
            ),
            Error::TargetRowCount {
                expected_rows,
                got_elements,
                vocab_size,
            } => write!(
                f,
                "target logits hold {got_elements} values = {} rows of {vocab_size} (+{} extra), \
                 but the requests need Σ(num_drafts + 1) = {expected_rows} rows",
                got_elements / (*vocab_size).max(1) as usize,
                got_elements % (*vocab_size).max(1) as usize
            ),
            Error::DraftRowCount {
                expected_rows,
                got_elements,
                vocab_size,
            } => write!(
                f,
                "draft distribution holds {got_elements} values = {} rows of {vocab_size} (+{} \
                 extra), but the requests need Σ num_drafts = {expected_rows} rows (one per draft)",
                got_elements / (*vocab_size).max(1) as usize,
                got_elements % (*vocab_size).max(1) as usize
            ),
            Error::SyntheticRates { reason } => write!(f, "synthetic rates: {reason}"),
            Error::InvalidDraftVocab { draft_vocab, vocab } => write!(
                f,
                "draft_vocab_size {draft_vocab} must be between 1 and the target's vocab_size \
                 {vocab} (a draft model may have a smaller, padded vocabulary, not a larger one)"
            ),
            Error::BufferUsage { what } => write!(
                f,
                "the {what} buffer was created without BufferUsages::STORAGE; add it so the \
                 kernels can read the buffer in place"
            ),
            Error::BufferTooSmall { what, needed, size } => write!(
                f,
                "the {what} buffer has {size} bytes but offset + rows × vocab × 4 needs {needed}"
            ),
            Error::MisalignedOffset { what, offset } => write!(
                f,
                "the {what} byte offset {offset} is not a multiple of 4 (f32 logits)"
            ),
            Error::RowTooLarge {
                row_bytes,
                max_binding,
            } => write!(
                f,
                "one row is {row_bytes} bytes but this device binds at most {max_binding} bytes \
                 at once; use a device with a larger max_storage_buffer_binding_size"
            ),
            Error::BatchTooLarge { reason } => write!(f, "batch too large: {reason}"),
            Error::DraftIdBuffer { detail } => write!(f, "draft ids on the GPU: {detail}"),
            Error::InvalidOptions { detail } => write!(f, "invalid options: {detail}"),
            Error::NotGpu => f.write_str(NOT_GPU),
            Error::NoAdapter { detail } => write!(
                f,
                "no GPU adapter: {detail}. Install a Vulkan/Metal/DX12 driver (on Linux without a \
                 GPU: apt-get install mesa-vulkan-drivers), check WGPU_BACKEND / \
                 WGPU_ADAPTER_NAME, or use Verifier::cpu"
            ),
            Error::RequestDevice { detail } => {
                write!(f, "the adapter refused the device we need: {detail}")
            }
            Error::Gpu { detail } => write!(f, "GPU error: {detail}"),
            Error::DeviceLost { detail } => write!(
                f,
                "the GPU device was lost ({detail}); create a new Verifier"
            ),
            Error::Timeout { waited } => write!(
                f,
                "the GPU did not finish within {waited:?}; raise VerifierOptions::timeout if the \
                 batch is very large or the adapter is a software one"
            ),
        }
    }
}

impl std::error::Error for Error {}

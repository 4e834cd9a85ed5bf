//! The one error type of `specdec::models`.

use std::fmt;
use std::path::PathBuf;

/// What went wrong loading or running a model; every message says what to change.
///
/// Kept apart from [`crate::Error`] so the verifier's error enum does not grow variants that only
/// exist with the `candle` feature.
#[derive(Debug)]
#[non_exhaustive]
pub enum ModelError {
    /// The weights file could not be opened or read.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not a GGUF file candle can parse.
    Gguf {
        /// The file.
        path: PathBuf,
        /// candle's message.
        message: String,
    },
    /// A metadata key is missing or has the wrong type.
    Metadata {
        /// The GGUF key, e.g. `llama.block_count`.
        key: String,
        /// What was wrong with it.
        message: String,
    },
    /// A tensor the architecture needs is not in the file.
    MissingTensor {
        /// The GGUF tensor name, e.g. `blk.0.attn_q.weight`.
        name: String,
    },
    /// The file describes a model this forward pass does not implement.
    Unsupported {
        /// What is unsupported and what is.
        message: String,
    },
    /// A candle tensor operation failed (a shape bug here, or out of memory).
    Candle {
        /// What was being done.
        context: &'static str,
        /// candle's error.
        source: candle_core::Error,
    },
    /// A token id is not in the model's vocabulary.
    TokenOutOfRange {
        /// The token.
        token: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// Appending the tokens would run past the model's context length.
    ContextFull {
        /// Tokens already in the cache.
        len: usize,
        /// Tokens asked to append.
        appended: usize,
        /// The context length from the GGUF metadata.
        max: usize,
    },
    /// `truncate` was asked to grow the sequence.
    TruncateBeyondLength {
        /// The requested length.
        requested: usize,
        /// The current length.
        len: usize,
    },
    /// `forward` was called with no tokens.
    EmptyInput,
    /// `forward_last` was asked for no rows or more rows than tokens.
    BadRowCount {
        /// Rows asked for.
        rows: usize,
        /// Tokens appended.
        tokens: usize,
    },
    /// `forward_tree` got a parent that is not an earlier new token (nor −1), or a parent list
    /// whose length differs from the tokens'; `keep_path` got slots not on one path.
    BadTree {
        /// What was wrong.
        message: String,
    },
    /// A layer-skip draft asked for no layers or more layers than the model has.
    BadLayerCount {
        /// Asked for.
        requested: usize,
        /// The model's layers.
        available: usize,
    },
    /// The tokenizer metadata is inconsistent (e.g. a merge whose parts are not tokens).
    Tokenizer {
        /// What was wrong.
        message: String,
    },
}

/// Checks the parents of a tree of `tokens` new tokens (CPU and GPU models alike): one per
/// token, each −1 (below the cache) or an earlier token's index.
pub(crate) fn check_tree_parents(tokens: usize, parents: &[i32]) -> Result<(), ModelError> {
    if parents.len() != tokens {
        return Err(ModelError::BadTree {
            message: format!("{} parents for {tokens} tokens", parents.len()),
        });
    }
    if let Some(i) = (0..parents.len()).find(|&i| parents[i] < -1 || parents[i] >= i as i32) {
        return Err(ModelError::BadTree {
            message: format!(
                "token {i} has parent {}; a parent is −1 or an earlier token",
                parents[i]
            ),
        });
    }
    Ok(())
}

/// Checks a `keep_path(base, path)` of a sequence of length `len` (CPU and GPU models alike):
/// `base ≤ len`, and `path` increasing within the `len − base` tokens appended since `base`.
pub(crate) fn check_kept_path(len: usize, base: usize, path: &[usize]) -> Result<(), ModelError> {
    let appended = len
        .checked_sub(base)
        .ok_or(ModelError::TruncateBeyondLength {
            requested: base,
            len,
        })?;
    if path.windows(2).any(|w| w[0] >= w[1]) || path.last().is_some_and(|&l| l >= appended) {
        return Err(ModelError::BadTree {
            message: format!("keep_path {path:?} is not increasing within {appended} tokens"),
        });
    }
    Ok(())
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, source } => write!(
                f,
                "cannot read {}: {source} (fetch the weights with examples/fetch-models.sh, \
                 or set SPECDEC_MODELS to the directory that holds them)",
                path.display()
            ),
            Self::Gguf { path, message } => write!(
                f,
                "{} is not a readable GGUF file: {message} (re-run examples/fetch-models.sh, \
                 which verifies the sha256)",
                path.display()
            ),
            Self::Metadata { key, message } => write!(f, "GGUF metadata `{key}`: {message}"),
            Self::MissingTensor { name } => write!(
                f,
                "GGUF tensor `{name}` is missing: the file is not a complete llama/qwen2 model"
            ),
            Self::Unsupported { message } => write!(f, "unsupported model: {message}"),
            Self::Candle { context, source } => {
                write!(f, "candle failed while {context}: {source}")
            }
            Self::TokenOutOfRange { token, vocab_size } => write!(
                f,
                "token {token} is outside the vocabulary (size {vocab_size}); tokens must come \
                 from this model's tokenizer"
            ),
            Self::ContextFull { len, appended, max } => write!(
                f,
                "appending {appended} tokens to {len} would exceed the context length {max}; \
                 truncate the sequence first"
            ),
            Self::TruncateBeyondLength { requested, len } => write!(
                f,
                "cannot truncate to {requested} tokens: the sequence holds only {len}"
            ),
            Self::EmptyInput => write!(f, "forward needs at least one token"),
            Self::BadRowCount { rows, tokens } => write!(
                f,
                "forward_last: asked for {rows} rows of {tokens} tokens; ask for 1..={tokens}"
            ),
            Self::BadTree { message } => write!(f, "tree forward: {message}"),
            Self::BadLayerCount {
                requested,
                available,
            } => write!(
                f,
                "a layer-skip draft needs between 1 and {available} layers, got {requested}"
            ),
            Self::Tokenizer { message } => write!(f, "tokenizer metadata: {message}"),
        }
    }
}

impl std::error::Error for ModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Candle { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Attaches a context to candle's errors: `.ctx("running attention")?`.
pub(crate) trait CandleContext<T> {
    fn ctx(self, context: &'static str) -> Result<T, ModelError>;
}

impl<T> CandleContext<T> for candle_core::Result<T> {
    fn ctx(self, context: &'static str) -> Result<T, ModelError> {
        self.map_err(|source| ModelError::Candle { context, source })
    }
}

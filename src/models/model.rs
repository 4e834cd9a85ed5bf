//! One sequence's forward pass: logits for every appended position, a KV cache that can be
//! truncated after a rejection.

use std::sync::Arc;

use candle_core::{DType, Tensor, D};

use super::error::{CandleContext, ModelError};
use super::weights::{Linear, Matrix, RopeStyle, Weights};

/// One layer's cached keys and values, `[kv_heads, len, head_dim]` each.
#[derive(Clone, Debug)]
struct LayerCache {
    k: Tensor,
    v: Tensor,
}

/// A sequence being decoded: shared [`Weights`], a layer count, and its own KV cache.
///
/// `forward` appends tokens and returns their logits; `truncate` drops the tail of the cache, so a
/// verifier can score `k` drafts plus a bonus position in one call and roll back the rejected
/// ones. Cloning is cheap (tensors are reference counted) and forks the sequence: the clone
/// shares the cached prefix and diverges on its next `forward`.
#[derive(Clone, Debug)]
pub struct Model {
    weights: Arc<Weights>,
    layers: usize,
    cache: Vec<LayerCache>,
    len: usize,
}

impl Model {
    /// A fresh, empty sequence using every layer.
    pub fn new(weights: Arc<Weights>) -> Model {
        let layers = weights.config.layers;
        Model {
            weights,
            layers,
            cache: Vec::new(),
            len: 0,
        }
    }

    /// A layer-skip self-speculation draft: the first `layers` blocks of the same weights, then
    /// the final norm and the output head. It shares the weights (no copy) and keeps its own
    /// cache, so it drafts while the full model verifies.
    pub fn layer_skip(weights: Arc<Weights>, layers: usize) -> Result<Model, ModelError> {
        let available = weights.config.layers;
        if layers == 0 || layers > available {
            return Err(ModelError::BadLayerCount {
                requested: layers,
                available,
            });
        }
        Ok(Model {
            weights,
            layers,
            cache: Vec::new(),
            len: 0,
        })
    }

    /// Tokens in the cache (the position the next appended token takes).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been appended yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Width of one logits row.
    pub fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }

    /// Blocks this sequence runs (all of them, or the draft's prefix).
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// The shared weights (for the tokenizer and config, or to start another sequence).
    pub fn weights(&self) -> &Arc<Weights> {
        &self.weights
    }

    /// Empties the cache.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.len = 0;
    }

    /// Keeps the first `len` positions of the cache and forgets the rest, e.g. the rejected
    /// drafts after verification. Growing is an error.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        if len > self.len {
            return Err(ModelError::TruncateBeyondLength {
                requested: len,
                len: self.len,
            });
        }
        if len == 0 {
            self.reset();
            return Ok(());
        }
        for c in &mut self.cache {
            // A view; the next forward's concatenation copies it into fresh storage.
            c.k = c.k.narrow(1, 0, len).ctx("truncating the key cache")?;
            c.v = c.v.narrow(1, 0, len).ctx("truncating the value cache")?;
        }
        self.len = len;
        Ok(())
    }

    /// Appends `tokens` at positions `len()..len() + tokens.len()` and returns their logits,
    /// row-major `[tokens.len() × vocab_size()]` f32: row `i` is the next-token distribution
    /// after `tokens[i]`. All rows are returned because a verifier scores `k` drafts and the
    /// bonus position in one call.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.forward_last(tokens, tokens.len())
    }

    /// Like [`Model::forward`] but returns only the last `rows` rows (`1 ≤ rows ≤
    /// tokens.len()`), `[rows × vocab_size()]`: the output head, the largest matrix of a small
    /// model, runs on those rows only, which makes a long prefill much cheaper.
    pub fn forward_last(&mut self, tokens: &[u32], rows: usize) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if rows == 0 || rows > tokens.len() {
            return Err(ModelError::BadRowCount {
                rows,
                tokens: tokens.len(),
            });
        }
        let chain: Vec<i32> = (-1..tokens.len() as i32 - 1).collect();
        let logits = self.forward_tensor(tokens, rows, self.len, &chain)?;
        logits
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .ctx("reading the logits back")
    }

    /// Appends a **tree** of tokens and returns the logits of every one, `[tokens.len() ×
    /// vocab_size()]`, for tree verification ([`crate::tree`]): new token `i` hangs below new
    /// token `parents[i]` (an earlier one), or below the cached sequence for −1. Token `i` sits at
    /// position `len() + depth(i)` (the −1 tokens at `len()`) and attends to the cache and to its
    /// own ancestors only, so row `i` is the next-token distribution after the path to `i`:
    /// the same values a chain forward of that path gives (bit for bit where the forward is
    /// split-invariant, see `LoadOptions::split_invariant`). The cache then holds every new
    /// token; [`Model::keep_path`] keeps the accepted path's.
    pub fn forward_tree(
        &mut self,
        tokens: &[u32],
        parents: &[i32],
    ) -> Result<Vec<f32>, ModelError> {
        let len = self.len;
        self.extend_tree(len, &[], tokens, parents)
    }

    /// Extends the tree appended since `base` (by [`Model::forward_tree`] and earlier calls of
    /// this) with `tokens`, returning their logits: `prior` are the parents the cached tree
    /// tokens were given (`len() − base` of them) and `parents[i]` indexes all tree tokens, the
    /// cached ones first (−1: below `base`). Rows are the values `forward_tree` of the whole tree
    /// gives them, so a drafter can grow a tree level by level without re-forwarding it.
    pub fn extend_tree(
        &mut self,
        base: usize,
        prior: &[i32],
        tokens: &[u32],
        parents: &[i32],
    ) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if base + prior.len() != self.len {
            return Err(ModelError::BadTree {
                message: format!(
                    "extend_tree: {} cached tree tokens after base {base}, but the length is {}",
                    prior.len(),
                    self.len
                ),
            });
        }
        // Parents index every tree token, the cached ones first.
        let all: Vec<i32> = prior.iter().chain(parents).copied().collect();
        super::error::check_tree_parents(prior.len() + tokens.len(), &all)?;
        let logits = self.forward_tensor(tokens, tokens.len(), base, &all)?;
        logits
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .ctx("reading the logits back")
    }

    /// After [`Model::forward_tree`] appended `len() − base` tokens at `base..`, keeps the cache
    /// up to `base` and the new tokens `path` (indices into that call's tokens, a root-to-node
    /// path in increasing order), which then sit at `base..base + path.len()`.
    pub fn keep_path(&mut self, base: usize, path: &[usize]) -> Result<(), ModelError> {
        super::error::check_kept_path(self.len, base, path)?;
        if path.iter().enumerate().all(|(i, &s)| i == s) {
            return self.truncate(base + path.len());
        }
        let keep: Vec<u32> = (0..base as u32)
            .chain(path.iter().map(|&s| (base + s) as u32))
            .collect();
        let device = &self.weights.device;
        let keep = Tensor::from_vec(keep, path.len() + base, device).ctx("building the path")?;
        for c in &mut self.cache {
            c.k = c.k.index_select(&keep, 1).ctx("keeping the path's keys")?;
            c.v =
                c.v.index_select(&keep, 1)
                    .ctx("keeping the path's values")?;
        }
        self.len = base + path.len();
        Ok(())
    }

    /// The forward of new tokens hanging below each other as `parents` says (−1: below the
    /// cache up to `tree_start`; a chain is `[−1, 0, 1, …]`), returning the last `rows` rows'
    /// logits. `parents` covers every token since `tree_start`: those already cached (a tree
    /// extended by [`Model::extend_tree`]), then the new `tokens`.
    fn forward_tensor(
        &mut self,
        tokens: &[u32],
        rows: usize,
        tree_start: usize,
        parents: &[i32],
    ) -> Result<Tensor, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        let w = &*self.weights;
        let cfg = &w.config;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                token,
                vocab_size: cfg.vocab_size,
            });
        }
        if self.len + tokens.len() > cfg.context_length {
            return Err(ModelError::ContextFull {
                len: self.len,
                appended: tokens.len(),
                max: cfg.context_length,
            });
        }
        let t = tokens.len();
        let start = tree_start;
        // Tree rows before this call's (already in the cache at start + row).
        let first = self.len - tree_start;
        debug_assert_eq!(first + t, parents.len());
        let total = self.len + t;
        let (hd, heads, kv_heads) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
        let group = heads / kv_heads;

        let ids = Tensor::from_slice(tokens, t, &w.device).ctx("uploading token ids")?;
        let mut x = w.embedding.embedding(&ids).ctx("looking up embeddings")?;
        let ancestors = Ancestors::new(parents);
        let positions: Vec<usize> = ancestors.depth[first..]
            .iter()
            .map(|&d| start + d)
            .collect();
        let (cos, sin) = rope_tables(&positions, hd, cfg.rope_theta, &w.device)?;
        let mask = ancestor_mask(start, first, &ancestors, group, &w.device)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let rows_mode = if !w.split_invariant {
            MatmulRows::Batched
        } else if w.row_by_row_matmuls {
            MatmulRows::OneByOne
        } else {
            MatmulRows::Invariant
        };

        let mut new_cache = Vec::with_capacity(self.layers);
        for (i, b) in w.blocks[..self.layers].iter().enumerate() {
            let h = rms_norm(&x, &b.attn_norm, cfg.rms_eps)?;
            let q = linear(&b.q, &h, rows_mode)?;
            let k = linear(&b.k, &h, rows_mode)?;
            let v = linear(&b.v, &h, rows_mode)?;
            // [t, heads·hd] → [heads, t, hd]
            let split = |x: Tensor, n: usize| -> candle_core::Result<Tensor> {
                x.reshape((t, n, hd))?.transpose(0, 1)?.contiguous()
            };
            let q = split(q, heads).ctx("splitting query heads")?;
            let k = split(k, kv_heads).ctx("splitting key heads")?;
            let v = split(v, kv_heads).ctx("splitting value heads")?;
            let q = rope(&q, &cos, &sin, cfg.rope_style)?;
            let k = rope(&k, &cos, &sin, cfg.rope_style)?;
            let (k, v) = match self.cache.get(i) {
                Some(c) => (
                    Tensor::cat(&[&c.k, &k], 1).ctx("appending to the key cache")?,
                    Tensor::cat(&[&c.v, &v], 1).ctx("appending to the value cache")?,
                ),
                None => (k, v),
            };
            // Grouped-query attention without copying K/V per query head: query head
            // `kv·group + g` reads kv head `kv`, so the `group` query heads of one kv head are
            // stacked as rows against that head's keys.
            let attn = if w.split_invariant && t > 1 {
                let kv = KeysOf {
                    start,
                    first,
                    ancestors: &ancestors,
                };
                attention_per_position(&q, &k, &v, &kv, kv_heads, group, scale)
            } else {
                (|| {
                    let q = q.reshape((kv_heads, group * t, hd))?;
                    let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&mask)?;
                    let probs = softmax_last(&scores)?;
                    let o = probs.matmul(&v)?; // [kv, group·t, hd]
                    o.reshape((heads, t, hd))?
                        .transpose(0, 1)?
                        .reshape((t, heads * hd))
                })()
            }
            .ctx("running attention")?;
            let attn = linear(&b.o, &attn, rows_mode)?;
            x = (x + attn).ctx("adding the attention residual")?;
            let h = rms_norm(&x, &b.ffn_norm, cfg.rms_eps)?;
            let gate = linear(&b.gate, &h, rows_mode)?;
            let up = linear(&b.up, &h, rows_mode)?;
            let act = (gate.silu().ctx("SwiGLU activation")? * up).ctx("SwiGLU product")?;
            let down = linear(&b.down, &act, rows_mode)?;
            x = (x + down).ctx("adding the MLP residual")?;
            new_cache.push(LayerCache { k, v });
        }
        let x = x
            .narrow(0, t - rows, rows)
            .ctx("selecting the rows to score")?;
        let x = rms_norm(&x, &w.output_norm, cfg.rms_eps)?;
        let logits = qmatmul(&w.output, &x, rows_mode)?;
        // Commit the cache only after every step succeeded, so an error leaves the sequence as
        // it was.
        self.cache = new_cache;
        self.len = total;
        Ok(logits)
    }
}

/// `QMatMul::forward` through candle's `Module` trait, under our error type.
trait ForwardQ {
    fn forward_q(&self, x: &Tensor) -> Result<Tensor, ModelError>;
}

impl ForwardQ for candle_core::quantized::QMatMul {
    fn forward_q(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        candle_core::Module::forward(self, x).ctx("quantized matmul")
    }
}

/// Who new token `i` attends to: the `start` cached positions and its ancestors among the new
/// tokens (itself included), in position order.
struct Ancestors {
    /// Parent of each new token (−1: the cache).
    parents: Vec<i32>,
    /// Depth of each new token below the cache (a chain: 0, 1, 2, …).
    depth: Vec<usize>,
}

impl Ancestors {
    /// From checked parents (each −1 or an earlier index).
    fn new(parents: &[i32]) -> Ancestors {
        let mut depth: Vec<usize> = Vec::with_capacity(parents.len());
        for &p in parents {
            depth.push(if p < 0 { 0 } else { depth[p as usize] + 1 });
        }
        Ancestors {
            parents: parents.to_vec(),
            depth,
        }
    }

    fn len(&self) -> usize {
        self.parents.len()
    }

    /// Token `i`'s path is `0..=i` (always so in a chain): its `depth(i)` strict ancestors all
    /// have smaller indices, so depth `i` leaves no room for others.
    fn is_prefix(&self, i: usize) -> bool {
        self.depth[i] == i
    }

    /// Token `i`'s ancestors, root first, itself last.
    fn path(&self, i: usize) -> Vec<usize> {
        let mut path = vec![0; self.depth[i] + 1];
        let mut a = i as i32;
        for slot in path.iter_mut().rev() {
            *slot = a as usize;
            a = self.parents[a as usize];
        }
        path
    }
}

/// The keys new token `i` reads in [`attention_per_position`].
struct KeysOf<'a> {
    start: usize,
    /// The tree row of the call's first token.
    first: usize,
    ancestors: &'a Ancestors,
}

/// Attention for each new position on its own, with exactly the shapes of a one-token forward at
/// that position (`group` query rows against its `position + 1` keys, copied contiguous), so the
/// float summation order, and hence every bit of the result, does not depend on how many
/// tokens were fed together, nor on whether they came as a chain or as one path of a tree. Why
/// it matters: quantized matmuls round their input to 8 bits, so a last-bit difference here can
/// flip a rounding and grow through the layers (measured on Qwen 0.5B: logits 0.3–0.6 apart
/// without this).
fn attention_per_position(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    keys: &KeysOf<'_>,
    kv_heads: usize,
    group: usize,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (heads, t, hd) = q.dims3()?;
    let start = keys.start;
    let mut rows = Vec::with_capacity(t);
    for i in 0..t {
        let anc = keys.ancestors;
        let r = keys.first + i;
        let len = start + anc.depth[r] + 1;
        let qi = q
            .narrow(1, i, 1)?
            .contiguous()?
            .reshape((kv_heads, group, hd))?;
        // A path of consecutive new tokens from the first (every chain) is a prefix view;
        // otherwise the path's keys are gathered, in the same order.
        let (ki, vi) = if anc.is_prefix(r) {
            (
                k.narrow(1, 0, len)?.contiguous()?,
                v.narrow(1, 0, len)?.contiguous()?,
            )
        } else {
            let idx: Vec<u32> = (0..start as u32)
                .chain(anc.path(r).iter().map(|&a| (start + a) as u32))
                .collect();
            let idx = Tensor::from_vec(idx, len, k.device())?;
            (k.index_select(&idx, 1)?, v.index_select(&idx, 1)?)
        };
        let probs = softmax_last(&(qi.matmul(&ki.t()?)? * scale)?)?;
        rows.push(probs.matmul(&vi)?.reshape((1, heads * hd))?);
    }
    Tensor::cat(&rows, 0)
}

/// How a forward's matmuls group their rows (see `LoadOptions::split_invariant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MatmulRows {
    /// All rows in one call: fastest, a row may depend on the others' count.
    Batched,
    /// As many rows per call as keep every row bit-identical to a 1-row call
    /// ([`invariant_rows`]).
    Invariant,
    /// One row per call whatever the format (`LoadOptions::row_by_row_matmuls`).
    OneByOne,
}

/// `x · wᵀ`, its rows grouped into calls as `mode` says where the kernel depends on it.
fn qmatmul(w: &Matrix, x: &Tensor, mode: MatmulRows) -> Result<Tensor, ModelError> {
    let rows = x.dim(0).ctx("reading the row count")?;
    let w = match w {
        Matrix::Candle(w) => w,
        // Row-independent by construction: one call for all rows.
        Matrix::Q8(m) => {
            let xs = x
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .ctx("reading matmul inputs")?;
            let y = m.matmul(&xs, rows);
            return Tensor::from_vec(y, (rows, m.out_features()), x.device())
                .ctx("wrapping matmul outputs");
        }
    };
    let per_call = match mode {
        MatmulRows::Batched => rows,
        MatmulRows::Invariant => invariant_rows(w),
        MatmulRows::OneByOne => 1,
    };
    if rows <= per_call {
        return w.forward_q(x);
    }
    let parts = (0..rows)
        .step_by(per_call)
        .map(|s| {
            let x = x.narrow(0, s, per_call.min(rows - s));
            w.forward_q(&x.ctx("selecting rows")?)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Tensor::cat(&parts, 0).ctx("joining matmul rows")
}

/// The most rows one call of `w` may take such that each output row is bit-identical to the
/// 1-row call of its input row, from candle-core 0.11.1's CPU kernels (`tests/cpu_rows.rs`
/// checks every format listed here; `docs/models.md` cites the code):
/// - `k_quants::matmul` quantizes the activations row by row and computes each (row, column)
///   with the same `vec_dot` call whatever the row count; Q4_1, Q5_0, Q5_1, Q2_K, Q3_K always
///   take it, and on x86-64 so do Q4_0 and Q5_K.
/// - x86-64 repacks Q4_K and Q8_0 into 16-column tiles for every row count; each row has its
///   own accumulators there, so rows stay independent, except that Q4_K switches to AMX tiles
///   from 32 rows on (hence 31).
/// - Q6_K is repacked on x86-64 only for more than one row, a different summation than its
///   1-row kernel. On aarch64 Q4_0, Q4_K, Q5_K, Q6_K and Q8_0 take kernels picked by the row
///   count (1 row, multiples of 4, the rest), not checked here; f32 / f16 weights go through a
///   gemm whose blocking depends on the row count. All of those run one row per call.
fn invariant_rows(w: &candle_core::quantized::QMatMul) -> usize {
    use candle_core::quantized::{GgmlDType as G, QMatMul};
    let QMatMul::QTensor(t) = w else {
        return 1;
    };
    let x86 = cfg!(target_arch = "x86_64");
    match t.dtype() {
        G::Q4_1 | G::Q5_0 | G::Q5_1 | G::Q2K | G::Q3K => usize::MAX,
        G::Q4_0 | G::Q5K | G::Q8_0 if x86 => usize::MAX,
        G::Q4K if x86 => 31,
        _ => 1,
    }
}

fn linear(l: &Linear, x: &Tensor, mode: MatmulRows) -> Result<Tensor, ModelError> {
    let y = qmatmul(&l.weight, x, mode)?;
    match &l.bias {
        Some(b) => y.broadcast_add(b).ctx("adding a bias"),
        None => Ok(y),
    }
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · w`.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor, ModelError> {
    (|| {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(weight)
    })()
    .ctx("RMSNorm")
}

/// Softmax over the last dimension, shifted by the row maximum so `exp` cannot overflow (a
/// masked `-inf` becomes 0).
fn softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}

/// `cos` and `sin` of `position · θ^(−2i/d)` for each of `positions`, `[t, d/2]`.
/// Computed in f64 and rounded once, so a position's angle does not depend on how the sequence
/// was split into forward calls.
fn rope_tables(
    positions: &[usize],
    hd: usize,
    theta: f64,
    device: &candle_core::Device,
) -> Result<(Tensor, Tensor), ModelError> {
    let half = hd / 2;
    let t = positions.len();
    let mut cos = Vec::with_capacity(t * half);
    let mut sin = Vec::with_capacity(t * half);
    for &p in positions {
        for i in 0..half {
            let angle = p as f64 * theta.powf(-2.0 * i as f64 / hd as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let cos = Tensor::from_vec(cos, (t, half), device).ctx("building rope tables")?;
    let sin = Tensor::from_vec(sin, (t, half), device).ctx("building rope tables")?;
    Ok((cos, sin))
}

/// Rotates `x` `[heads, t, d]` by the position angles: each pair `(a, b)` becomes
/// `(a·cos − b·sin, a·sin + b·cos)`; which components pair up is the [`RopeStyle`].
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle) -> Result<Tensor, ModelError> {
    (|| {
        let (heads, t, hd) = x.dims3()?;
        let half = hd / 2;
        match style {
            RopeStyle::RotateHalves => {
                let a = x.narrow(2, 0, half)?;
                let b = x.narrow(2, half, half)?;
                let ra = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
                let rb = (a.broadcast_mul(sin)? + b.broadcast_mul(cos)?)?;
                Tensor::cat(&[&ra, &rb], 2)
            }
            RopeStyle::AdjacentPairs => {
                let pairs = x.reshape((heads, t, half, 2))?;
                let a = pairs.narrow(3, 0, 1)?;
                let b = pairs.narrow(3, 1, 1)?;
                let cos = cos.unsqueeze(2)?;
                let sin = sin.unsqueeze(2)?;
                let ra = (a.broadcast_mul(&cos)? - b.broadcast_mul(&sin)?)?;
                let rb = (a.broadcast_mul(&sin)? + b.broadcast_mul(&cos)?)?;
                Tensor::cat(&[&ra, &rb], 3)?.reshape((heads, t, hd))
            }
        }
    })()
    .ctx("applying rope")
}

/// Additive mask `[group·t, start + t]`: row `g·t + i` (new token `i`) sees the `start` cached
/// keys and its ancestors' (itself included); for a chain that is keys `0..=start + i`.
fn ancestor_mask(
    start: usize,
    first: usize,
    ancestors: &Ancestors,
    group: usize,
    device: &candle_core::Device,
) -> Result<Tensor, ModelError> {
    let t = ancestors.len() - first;
    let total = start + ancestors.len();
    let mut m = vec![0f32; group * t * total];
    for g in 0..group {
        for i in 0..t {
            let r = first + i;
            let row = &mut m[(g * t + i) * total..(g * t + i + 1) * total];
            if ancestors.is_prefix(r) {
                row[start + r + 1..].fill(f32::NEG_INFINITY);
            } else {
                row[start..].fill(f32::NEG_INFINITY);
                for a in ancestors.path(r) {
                    row[start + a] = 0.0;
                }
            }
        }
    }
    Tensor::from_vec(m, (group * t, total), device)
        .and_then(|m| m.to_dtype(DType::F32))
        .ctx("building the causal mask")
}

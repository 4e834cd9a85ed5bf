//! One sequence on the GPU: activations, a truncatable KV cache and the logits rows, recorded
//! into the caller's command encoder.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use super::kernels::{params_entry, MatmulForm, ModelKernel, ModelParams, Pipe};
use super::weights::{GpuBlock, GpuMatrix, GpuModel};
use super::GpuModelError;
use crate::models::{ModelError, RopeStyle};
use crate::GpuRows;

/// Positions one chunk of a forward call processes at once: the weight-stationary matmul keeps
/// this many accumulators per lane. Longer calls run in chunks of this many rows, with the same
/// bits per row (every kernel's reduction order is independent of the row count).
pub const MAX_ROWS: usize = 16;

/// Deepest token of a [`GpuSequence::record_tree`] call (a token below the cache has depth 0):
/// the attention kernel keeps a row's ancestors in workgroup memory.
pub const MAX_TREE_DEPTH: usize = 64;

/// The tree table of a call (`shaders/model_attention.wgsl`): per token its depth and its
/// parent's index (`u32::MAX` below the cache), checked as [`crate::models::Model`]'s
/// `forward_tree` checks its parents, and the depth bounded by [`MAX_TREE_DEPTH`].
fn tree_table(tokens: usize, parents: &[i32]) -> Result<Vec<u32>, GpuModelError> {
    crate::models::error::check_tree_parents(tokens, parents)?;
    let mut table: Vec<u32> = Vec::with_capacity(2 * tokens);
    for (i, &parent) in parents.iter().enumerate() {
        let depth = if parent < 0 {
            0
        } else {
            table[2 * parent as usize] + 1
        };
        if depth as usize > MAX_TREE_DEPTH {
            return Err(ModelError::BadTree {
                message: format!("token {i} is at depth {depth}, deeper than {MAX_TREE_DEPTH}"),
            }
            .into());
        }
        table.extend([depth, if parent < 0 { u32::MAX } else { parent as u32 }]);
    }
    Ok(table)
}

/// Invocations of the elementwise kernels' workgroups.
const WG: usize = 64;
/// First KV capacity (positions); it doubles as needed up to the context length.
const FIRST_CAPACITY: usize = 64;

/// A matrix of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mat {
    /// q, k and v stacked.
    Qkv,
    O,
    /// Gate and up stacked.
    GateUp,
    Down,
}

/// A bind group of a sequence: which kernel over which buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Group {
    /// Embedding part.
    Embed(usize),
    AttnNorm(usize),
    FfnNorm(usize),
    FinalNorm,
    /// (layer, matrix, part).
    Mat(usize, Mat, usize),
    /// Output head part.
    Head(usize),
    Rope(usize),
    Attention(usize),
    Swiglu,
    /// A layer's kv_keep.
    Keep(usize),
}

/// The tokens of one call: ids from the host, then ids already in a GPU buffer; for a tree
/// call, the tree table uploaded after them (per token its depth and parent row, see
/// `shaders/model_attention.wgsl`).
#[derive(Clone, Copy)]
struct Tokens<'a> {
    host: &'a [u32],
    device: Option<(crate::DeviceIds<'a>, usize)>,
    tree: Option<&'a [u32]>,
}

impl Tokens<'_> {
    fn len(&self) -> usize {
        self.host.len() + self.device.map_or(0, |d| d.1)
    }
}

impl Dispatch {
    /// The pipe's name, with the matmul form (`Matmul/16r`: 16 lanes, rows one at a time; `u`:
    /// named per-row sums).
    fn label(&self) -> String {
        match self.form {
            Some(f) => format!(
                "{:?}/{}{}",
                self.pipe,
                f.lanes,
                if f.unrolled { 'u' } else { 'r' }
            ),
            None => format!("{:?}", self.pipe),
        }
    }
}

/// How a call's dispatches are timed on the GPU (profiling only).
#[derive(Clone, Copy)]
enum Timing<'a> {
    None,
    /// One pass, its two ends written to queries 0 and 1.
    Whole(&'a wgpu::QuerySet),
    /// One pass per dispatch, dispatch `i` timed by queries `2i` and `2i + 1`.
    PerDispatch(&'a wgpu::QuerySet),
}

/// One recorded dispatch: its pipeline, bind group, params slot and grid.
struct Dispatch {
    pipe: Pipe,
    /// The matmul form, for the matmul pipes.
    form: Option<MatmulForm>,
    group: Group,
    slot: u32,
    grid: (u32, u32),
}

/// An activation in the 8-bit block form the matmul reads (`shaders/model_common.wgsl`): 4
/// int8 per word and one f32 scale per 32 values.
#[derive(Debug)]
struct Q8Act {
    q: wgpu::Buffer,
    d: wgpu::Buffer,
}

/// The activation buffers, `MAX_ROWS` rows each.
#[derive(Debug)]
struct Activations {
    /// Residual stream `[rows, hidden]`.
    x: wgpu::Buffer,
    /// Normed stream `[rows, hidden]`, 8-bit.
    h: Q8Act,
    /// The stacked q/k/v matmul output `[rows, (heads + 2·kv_heads) · head_dim]`.
    qkv: wgpu::Buffer,
    /// Roped queries `[rows, heads · head_dim]`.
    q: wgpu::Buffer,
    /// Attention output `[rows, heads · head_dim]`, 8-bit.
    att: Q8Act,
    /// Gate and up side by side `[rows, 2·ffn]`.
    gu: wgpu::Buffer,
    /// Their SwiGLU product `[rows, ffn]`, 8-bit.
    a: Q8Act,
}

/// The logits of the last forward call on the GPU: `rows × vocab` f32, row-major, from byte 0
/// of `buffer` (valid until the sequence's next forward).
#[derive(Clone, Copy, Debug)]
pub struct GpuLogits<'a> {
    /// The sequence's logits buffer (`STORAGE | COPY_SRC`).
    pub buffer: &'a wgpu::Buffer,
    /// Rows written: one per scored position.
    pub rows: usize,
    /// Columns of a row.
    pub vocab: usize,
}

impl<'a> GpuLogits<'a> {
    /// The rows as the verifier takes them ([`crate::GpuVerifyBatch::target_logits`]).
    pub fn gpu_rows(&self) -> GpuRows<'a> {
        GpuRows::f32(self.buffer, 0)
    }
}

/// A sequence being decoded on the GPU over a shared [`GpuModel`]: its own KV cache, activation
/// buffers and logits rows. `record` appends tokens and writes the logits of every appended
/// position into a GPU buffer, recorded into the caller's command encoder (so a verifier can read
/// them in the same submission); `truncate` rolls the cache back by length.
#[derive(Debug)]
pub struct GpuSequence {
    model: Arc<GpuModel>,
    layers: usize,
    len: usize,
    capacity: usize,
    act: Activations,
    k_cache: Vec<wgpu::Buffer>,
    v_cache: Vec<wgpu::Buffer>,
    scratch: wgpu::Buffer,
    logits: wgpu::Buffer,
    logits_rows: usize,
    params: wgpu::Buffer,
    tokens: wgpu::Buffer,
    slot_bytes: u64,
    groups: HashMap<Group, wgpu::BindGroup>,
}

fn buffer(
    device: &wgpu::Device,
    label: &str,
    bytes: usize,
    usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: (bytes as u64).max(16).next_multiple_of(16),
        usage,
        mapped_at_creation: false,
    })
}

const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE;

fn grid_2d(groups: usize, max_dim: u32) -> (u32, u32) {
    let groups = groups.max(1) as u32;
    let x = groups.min(max_dim);
    (x, groups.div_ceil(x))
}

impl GpuSequence {
    /// A fresh, empty sequence over every layer of `model`.
    pub fn new(model: Arc<GpuModel>) -> Result<GpuSequence, GpuModelError> {
        let layers = model.config.layers;
        Self::with_layers(model, layers)
    }

    /// A layer-skip draft: the first `layers` blocks, then the final norm and the head.
    pub fn with_layers(model: Arc<GpuModel>, layers: usize) -> Result<GpuSequence, GpuModelError> {
        let c = model.config.clone();
        if layers == 0 || layers > c.layers {
            return Err(ModelError::BadLayerCount {
                requested: layers,
                available: c.layers,
            }
            .into());
        }
        let device = model.device.clone();
        let limits = device.limits();
        let slot_bytes = u64::from(limits.min_uniform_buffer_offset_alignment)
            .max(std::mem::size_of::<ModelParams>() as u64);
        let qd = c.heads * c.head_dim;
        let seq = crate::gpu::scoped(&device, || {
            let f =
                |label: &str, width: usize| buffer(&device, label, MAX_ROWS * width * 4, STORAGE);
            let q8 = |label: &str, width: usize| Q8Act {
                q: buffer(&device, label, MAX_ROWS * width, STORAGE),
                d: buffer(&device, label, MAX_ROWS * width / 32 * 4, STORAGE),
            };
            let act = Activations {
                x: f("specdec.model x", c.hidden),
                h: q8("specdec.model h", c.hidden),
                qkv: f("specdec.model qkv", qd + 2 * c.kv_heads * c.head_dim),
                q: f("specdec.model q", qd),
                att: q8("specdec.model att", qd),
                gu: f("specdec.model gate+up", 2 * c.ffn),
                a: q8("specdec.model act", c.ffn),
            };
            let placeholder = |label| buffer(&device, label, 16, STORAGE);
            GpuSequence {
                layers,
                len: 0,
                capacity: 0,
                act,
                k_cache: Vec::new(),
                v_cache: Vec::new(),
                scratch: placeholder("specdec.model scratch"),
                logits: placeholder("specdec.model logits"),
                logits_rows: 0,
                params: buffer(
                    &device,
                    "specdec.model params",
                    16,
                    wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                ),
                tokens: buffer(
                    &device,
                    "specdec.model tokens",
                    16,
                    STORAGE | wgpu::BufferUsages::COPY_DST,
                ),
                slot_bytes,
                groups: HashMap::new(),
                model: model.clone(),
            }
        })?;
        Ok(seq)
    }

    /// Tokens in the cache (the position the next appended token takes).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been appended yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks this sequence runs.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// The shared model.
    pub fn model(&self) -> &Arc<GpuModel> {
        &self.model
    }

    /// Keeps the first `len` positions and forgets the rest (their cache entries are overwritten
    /// by the next forward). Growing is an error.
    pub fn truncate(&mut self, len: usize) -> Result<(), GpuModelError> {
        if len > self.len {
            return Err(ModelError::TruncateBeyondLength {
                requested: len,
                len: self.len,
            }
            .into());
        }
        self.len = len;
        Ok(())
    }

    /// The logits of the last forward call (0 rows before the first).
    pub fn logits(&self) -> GpuLogits<'_> {
        GpuLogits {
            buffer: &self.logits,
            rows: self.logits_rows,
            vocab: self.model.config.vocab_size,
        }
    }

    /// Records into `encoder` the forward pass of `tokens` at positions `len()..len() +
    /// tokens.len()` and returns where the logits of the last `rows` positions will be (`1 ≤
    /// rows ≤ tokens.len()`; `rows = tokens.len()` scores every appended position, as a verifier
    /// needs). The sequence counts the tokens as appended at once: submit the encoder before
    /// reading the logits, and do not drop it unsubmitted (truncate back if you do).
    /// Everything is checked on the host before anything is recorded.
    pub fn record(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        tokens: &[u32],
        rows: usize,
    ) -> Result<GpuLogits<'_>, GpuModelError> {
        self.record_tokens(
            encoder,
            Tokens {
                host: tokens,
                device: None,
                tree: None,
            },
            rows,
        )
    }

    /// [`GpuSequence::record`] of `host` followed by `count` tokens that live in a GPU buffer
    /// (u32 ids from byte `device.offset`, e.g. a verifier's output, copied in the encoder before
    /// the forward, so they may be written earlier in the same encoder): a draft model feeding
    /// its own samples back without a trip to the host. The device ids are not checked on the
    /// host; an id outside the vocabulary leaves that position's embedding row unwritten.
    pub fn record_device_tokens(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        host: &[u32],
        device: crate::DeviceIds<'_>,
        count: usize,
        rows: usize,
    ) -> Result<GpuLogits<'_>, GpuModelError> {
        let b = device.buffer;
        if !b.usage().contains(wgpu::BufferUsages::COPY_SRC)
            || !device.offset.is_multiple_of(4)
            || device.offset + count as u64 * 4 > b.size()
        {
            return Err(GpuModelError::Invalid(format!(
                "device tokens: {count} ids from byte {} need a COPY_SRC buffer of at least {}                  bytes and a 4-byte aligned offset (the buffer has {} bytes)",
                device.offset,
                device.offset + count as u64 * 4,
                b.size()
            )));
        }
        let tokens = Tokens {
            host,
            device: (count > 0).then_some((device, count)),
            tree: None,
        };
        self.record_tokens(encoder, tokens, rows)
    }

    /// Records the forward of a **tree** of tokens and returns where the logits of every one
    /// will be (`tokens.len()` rows), for tree verification ([`crate::Verifier::record_tree`]):
    /// new token `i` hangs below new token `parents[i]` (an earlier one), or below the cached
    /// sequence for −1. Token `i` sits at position `len() + depth(i)` (the −1 tokens at `len()`),
    /// is cached at slot `len() + i`, and attends to the cache and its own ancestors only, so
    /// its row is the same bits as a chain call over the path to it gives. The sequence then
    /// counts every new token; [`GpuSequence::keep_path`] keeps the accepted path's. Depth is at
    /// most [`MAX_TREE_DEPTH`]. Checked on the host before anything is recorded.
    pub fn record_tree(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        tokens: &[u32],
        parents: &[i32],
    ) -> Result<GpuLogits<'_>, GpuModelError> {
        let table = tree_table(tokens.len(), parents)?;
        let tokens = Tokens {
            host: tokens,
            device: None,
            tree: Some(&table),
        };
        self.record_tokens(encoder, tokens, tokens.len())
    }

    /// After [`GpuSequence::record_tree`] appended `len() − base` tokens at `base..`, records
    /// into `encoder` the moves that keep the cache up to `base` and the new tokens `path`
    /// (indices into that call's tokens, a root-to-node path in increasing order), which then
    /// sit at `base..base + path.len()`; `len()` becomes `base + path.len()` at once. Returns
    /// whether anything was recorded: a path already in place (`path[d] == d`) records nothing,
    /// and its encoder need not be submitted.
    pub fn keep_path(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        base: usize,
        path: &[usize],
    ) -> Result<bool, GpuModelError> {
        crate::models::error::check_kept_path(self.len, base, path)?;
        let moves = path.iter().enumerate().any(|(d, &s)| d != s);
        if moves {
            let device = self.model.device.clone();
            crate::gpu::scoped(&device, || self.record_keep(encoder, base, path))?;
        }
        self.len = base + path.len();
        Ok(moves)
    }

    /// Copies, in `encoder`'s order, the parameter blocks `params` into slots `0..` of the params
    /// buffer and the concatenated `words` into the token buffer from word 0. The upload is a
    /// buffer of this call: several recordings may share one submission without one's
    /// parameters overwriting another's (`queue.write_buffer` would land before all of them).
    fn stage(&self, encoder: &mut wgpu::CommandEncoder, params: &[ModelParams], words: &[&[u32]]) {
        let mut bytes = vec![0u8; params.len() * self.slot_bytes as usize];
        for (i, p) in params.iter().enumerate() {
            let at = i * self.slot_bytes as usize;
            bytes[at..at + std::mem::size_of::<ModelParams>()]
                .copy_from_slice(bytemuck::bytes_of(p));
        }
        let params_len = bytes.len() as u64;
        for w in words {
            bytes.extend_from_slice(bytemuck::cast_slice(w));
        }
        let staging = self
            .model
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("specdec.model params upload"),
                contents: &bytes,
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        encoder.copy_buffer_to_buffer(&staging, 0, &self.params, 0, params_len);
        let upload = bytes.len() as u64 - params_len;
        if upload > 0 {
            encoder.copy_buffer_to_buffer(&staging, params_len, &self.tokens, 0, upload);
        }
    }

    /// The kv_keep dispatches of [`GpuSequence::keep_path`], one per layer.
    fn record_keep(&mut self, encoder: &mut wgpu::CommandEncoder, base: usize, path: &[usize]) {
        let c = &self.model.config;
        let kvd = c.kv_heads * c.head_dim;
        let p = ModelParams {
            rows: path.len() as u32,
            pos: base as u32,
            width: kvd as u32,
            ..ModelParams::default()
        };
        if self.ensure_uploads(1, path.len()) || self.groups.is_empty() {
            self.groups = self.build_groups();
        }
        let words: Vec<u32> = path.iter().map(|&s| s as u32).collect();
        self.stage(encoder, &[p], &[&words]);
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("specdec.model keep_path"),
            timestamp_writes: None,
        });
        pass.set_pipeline(self.model.pipelines.pipeline(Pipe::KvKeep, None));
        for l in 0..self.layers {
            pass.set_bind_group(0, &self.groups[&Group::Keep(l)], &[0]);
            pass.dispatch_workgroups(kvd.div_ceil(WG) as u32, 1, 1);
        }
    }

    fn record_tokens(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        tokens: Tokens<'_>,
        rows: usize,
    ) -> Result<GpuLogits<'_>, GpuModelError> {
        let c = &self.model.config;
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput.into());
        }
        if rows == 0 || rows > n {
            return Err(ModelError::BadRowCount { rows, tokens: n }.into());
        }
        if let Some(&token) = tokens.host.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                token,
                vocab_size: c.vocab_size,
            }
            .into());
        }
        if self.len + n > c.context_length {
            return Err(ModelError::ContextFull {
                len: self.len,
                appended: n,
                max: c.context_length,
            }
            .into());
        }
        let limits = self.model.device.limits();
        let logit_bytes = (rows * c.vocab_size * 4) as u64;
        if logit_bytes > limits.max_storage_buffer_binding_size {
            return Err(GpuModelError::Invalid(format!(
                "{rows} logits rows of {} need {logit_bytes} bytes, more than one storage binding \
                 of this device ({}); score fewer rows per call",
                c.vocab_size, limits.max_storage_buffer_binding_size
            )));
        }
        let device = self.model.device.clone();
        crate::gpu::scoped(&device, || {
            self.record_checked(encoder, tokens, rows, Timing::None)
        })??;
        self.len += n;
        self.logits_rows = rows;
        Ok(self.logits())
    }

    fn record_checked(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        tokens: Tokens<'_>,
        rows: usize,
        timing: Timing<'_>,
    ) -> Result<Vec<String>, GpuModelError> {
        let n = tokens.len();
        let mut dirty = self.ensure_cache(encoder, self.len + n);
        dirty |= self.ensure_logits(rows);
        let tree = tokens.tree.unwrap_or(&[]);
        let (dispatches, params) = self.plan(n, rows, !tree.is_empty());
        dirty |= self.ensure_uploads(params.len(), n + tree.len());
        if dirty || self.groups.is_empty() {
            self.groups = self.build_groups();
        }
        // A tree call's tokens are all from the host; its table follows them.
        self.stage(encoder, &params, &[tokens.host, tree]);
        let host_bytes = (tokens.host.len() * 4) as u64;
        if let Some((ids, count)) = tokens.device {
            let bytes = count as u64 * 4;
            encoder.copy_buffer_to_buffer(ids.buffer, ids.offset, &self.tokens, host_bytes, bytes);
        }
        // Profiling puts each dispatch in a pass of its own, timed at its ends; otherwise one
        // pass holds them all (wgpu orders the dependent dispatches inside it).
        let passes: Vec<&[Dispatch]> = match timing {
            Timing::PerDispatch(_) => dispatches.chunks(1).collect(),
            _ => vec![&dispatches[..]],
        };
        for (i, part) in passes.iter().enumerate() {
            let timestamp_writes = match timing {
                Timing::None => None,
                Timing::Whole(set) | Timing::PerDispatch(set) => {
                    Some(wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(2 * i as u32),
                        end_of_pass_write_index: Some(2 * i as u32 + 1),
                    })
                }
            };
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("specdec.model forward"),
                timestamp_writes,
            });
            for d in part.iter() {
                pass.set_pipeline(self.model.pipelines.pipeline(d.pipe, d.form));
                let offset = (u64::from(d.slot) * self.slot_bytes) as u32;
                pass.set_bind_group(0, &self.groups[&d.group], &[offset]);
                pass.dispatch_workgroups(d.grid.0, d.grid.1, 1);
            }
        }
        Ok(dispatches.iter().map(|d| d.label()).collect())
    }

    /// Grows the KV cache for up to `tokens` more positions now, in a submission of its own. For
    /// calls recorded ahead as alternatives ([`super::GpuDecoder`]), of which at most one is
    /// submitted: all of them must write the cache the next calls read, and a growth recorded
    /// inside one would copy the prefix only if that one ran. Other buffers a recording
    /// replaces (parameters, tokens, logits) need no reserving: the commands that bind an old
    /// one keep it alive and read and write it consistently.
    pub(super) fn reserve(&mut self, tokens: usize) -> Result<(), GpuModelError> {
        let device = self.model.device.clone();
        crate::gpu::scoped(&device, || {
            let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("specdec.model reserve"),
            });
            if self.ensure_cache(&mut encoder, self.len + tokens) {
                self.groups = self.build_groups();
            }
            self.model.queue.submit([encoder.finish()]);
        })?;
        Ok(())
    }

    /// Sets the length to `len` without recording anything: after recording alternatives
    /// ahead, back to where they started, or forward to what the submitted one appended.
    pub(super) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }

    /// Grows the KV cache (and the attention scratch) to hold `needed` positions, copying the
    /// cached prefix in `encoder`. True when buffers changed.
    fn ensure_cache(&mut self, encoder: &mut wgpu::CommandEncoder, needed: usize) -> bool {
        if needed <= self.capacity {
            return false;
        }
        let c = &self.model.config;
        let cap = needed
            .next_power_of_two()
            .max(FIRST_CAPACITY)
            .min(c.context_length);
        let kvd = c.kv_heads * c.head_dim;
        let device = &self.model.device;
        let usage = STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let keep = (self.len * kvd * 4) as u64;
        for (caches, what) in [(&mut self.k_cache, "k"), (&mut self.v_cache, "v")] {
            let fresh: Vec<wgpu::Buffer> = (0..self.layers)
                .map(|l| {
                    buffer(
                        device,
                        &format!("specdec.model {what} cache {l}"),
                        cap * kvd * 4,
                        usage,
                    )
                })
                .collect();
            if keep > 0 {
                for (old, new) in caches.iter().zip(&fresh) {
                    encoder.copy_buffer_to_buffer(old, 0, new, 0, keep);
                }
            }
            *caches = fresh;
        }
        self.scratch = buffer(
            device,
            "specdec.model attention scratch",
            MAX_ROWS * c.heads * cap * 4,
            STORAGE,
        );
        self.capacity = cap;
        true
    }

    fn ensure_logits(&mut self, rows: usize) -> bool {
        let vocab = self.model.config.vocab_size;
        if (rows * vocab * 4) as u64 <= self.logits.size() {
            return false;
        }
        self.logits = buffer(
            &self.model.device,
            "specdec.model logits",
            rows.max(MAX_ROWS) * vocab * 4,
            STORAGE | wgpu::BufferUsages::COPY_SRC,
        );
        true
    }

    fn ensure_uploads(&mut self, slots: usize, tokens: usize) -> bool {
        let device = &self.model.device;
        let mut dirty = false;
        let slot_need = slots as u64 * self.slot_bytes;
        if slot_need > self.params.size() {
            self.params = buffer(
                device,
                "specdec.model params",
                slot_need.next_power_of_two() as usize,
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            );
            dirty = true;
        }
        if (tokens * 4) as u64 > self.tokens.size() {
            self.tokens = buffer(
                device,
                "specdec.model tokens",
                (tokens * 4).next_power_of_two(),
                STORAGE | wgpu::BufferUsages::COPY_DST,
            );
            dirty = true;
        }
        dirty
    }
}

/// Collects the parameter blocks of a call, one slot per distinct block (a chunk's blocks are the
/// same for every layer, so a call needs ~16 slots per chunk, not one per dispatch).
#[derive(Default)]
struct Slots(Vec<ModelParams>);

impl Slots {
    fn slot(&mut self, p: ModelParams) -> u32 {
        let i = match self.0.iter().position(|q| *q == p) {
            Some(i) => i,
            None => {
                self.0.push(p);
                self.0.len() - 1
            }
        };
        i as u32
    }
}

/// Builds the dispatch list of one call, chunk by chunk.
struct Planner<'a> {
    model: &'a GpuModel,
    max_dim: u32,
    out: Vec<Dispatch>,
    slots: Slots,
    /// The current chunk's shared parameters (rows, position, head shape, epsilon).
    base: ModelParams,
}

impl Planner<'_> {
    fn push(&mut self, pipe: Pipe, group: Group, p: ModelParams, grid: (u32, u32)) {
        self.push_form(pipe, None, group, p, grid);
    }

    fn push_form(
        &mut self,
        pipe: Pipe,
        form: Option<MatmulForm>,
        group: Group,
        p: ModelParams,
        grid: (u32, u32),
    ) {
        let slot = self.slots.slot(p);
        self.out.push(Dispatch {
            pipe,
            form,
            group,
            slot,
            grid,
        });
    }

    /// `w` over the chunk's rows, one dispatch per part; `p` holds the input and output
    /// placement.
    fn matmul(
        &mut self,
        pipe: Pipe,
        group: impl Fn(usize) -> Group,
        w: &GpuMatrix,
        p: ModelParams,
    ) {
        let form = self.model.pipelines.policy.form(w.cols, p.rows as usize);
        let per_wg = (super::kernels::MATMUL_WG / form.lanes) as usize;
        for (i, part) in w.parts.iter().enumerate() {
            let p = ModelParams {
                width: w.cols as u32,
                out_rows: part.rows as u32,
                row_base: part.row_base as u32,
                ..p
            };
            let grid = grid_2d(part.rows.div_ceil(per_wg), self.max_dim);
            self.push_form(pipe, Some(form), group(i), p, grid);
        }
    }

    /// Block `l` over the chunk's rows (first position `base.pos`); the attention scratch
    /// holds `capacity` scores per row.
    fn layer(&mut self, l: usize, b: &GpuBlock, capacity: usize) {
        let c = &self.model.config;
        let base = self.base;
        let n = base.rows as usize;
        let (qd, kvd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let norm = ModelParams {
            width: c.hidden as u32,
            out_stride: c.hidden as u32,
            ..base
        };
        let into = |offset: usize, stride: usize| ModelParams {
            out_offset: offset as u32,
            out_stride: stride as u32,
            ..base
        };
        let qkv = if b.bias.is_some() {
            Pipe::MatmulBias
        } else {
            Pipe::Matmul
        };
        self.push(Pipe::RmsNorm, Group::AttnNorm(l), norm, (n as u32, 1));
        let qkv_width = qd + 2 * kvd;
        let mat = |i| Group::Mat(l, Mat::Qkv, i);
        self.matmul(qkv, mat, &b.qkv, into(0, qkv_width));
        let rope = ModelParams {
            style: match c.rope_style {
                RopeStyle::AdjacentPairs => 0,
                RopeStyle::RotateHalves => 1,
            },
            ..base
        };
        let pairs = n * (qd + 2 * kvd) / 2;
        let gr = grid_2d(pairs.div_ceil(WG), self.max_dim);
        self.push(Pipe::Rope, Group::Rope(l), rope, gr);
        let attention = ModelParams {
            scratch_stride: capacity as u32,
            scale: (1.0 / (c.head_dim as f64).sqrt()) as f32,
            ..base
        };
        let ga = (c.heads as u32, n as u32);
        self.push(Pipe::Attention, Group::Attention(l), attention, ga);
        let residual = Pipe::MatmulResidual;
        self.matmul(
            residual,
            |i| Group::Mat(l, Mat::O, i),
            &b.o,
            into(0, c.hidden),
        );
        self.push(Pipe::RmsNorm, Group::FfnNorm(l), norm, (n as u32, 1));
        let gate_up = |i| Group::Mat(l, Mat::GateUp, i);
        self.matmul(Pipe::Matmul, gate_up, &b.gate_up, into(0, 2 * c.ffn));
        let swiglu = ModelParams {
            width: c.ffn as u32,
            ..base
        };
        let gs = grid_2d((n * c.ffn / 4).div_ceil(WG), self.max_dim);
        self.push(Pipe::Swiglu, Group::Swiglu, swiglu, gs);
        self.matmul(
            residual,
            |i| Group::Mat(l, Mat::Down, i),
            &b.down,
            into(0, c.hidden),
        );
    }
}

impl GpuSequence {
    /// The dispatches of a call appending `t` tokens and scoring its last `rows`, and their
    /// parameter blocks; `tree`: the call's tree table follows its `t` tokens.
    fn plan(&self, t: usize, rows: usize, tree: bool) -> (Vec<Dispatch>, Vec<ModelParams>) {
        let m = &*self.model;
        let c = &m.config;
        let mut planner = Planner {
            model: m,
            max_dim: m.device.limits().max_compute_workgroups_per_dimension,
            out: Vec::new(),
            slots: Slots::default(),
            base: ModelParams::default(),
        };
        let first_scored = t - rows;
        for c0 in (0..t).step_by(MAX_ROWS) {
            let n = MAX_ROWS.min(t - c0);
            // A tree call's rows find their positions in the table, from the cached length.
            let (pos, token_base) = if tree {
                (self.len, c0)
            } else {
                (self.len + c0, 0)
            };
            let base = ModelParams {
                rows: n as u32,
                pos: pos as u32,
                token_base: token_base as u32,
                tree: if tree { t as u32 } else { 0 },
                heads: c.heads as u32,
                kv_heads: c.kv_heads as u32,
                head_dim: c.head_dim as u32,
                eps: c.rms_eps as f32,
                ..ModelParams::default()
            };
            planner.base = base;
            for (i, part) in m.embedding.parts.iter().enumerate() {
                let p = ModelParams {
                    width: c.hidden as u32,
                    out_rows: part.rows as u32,
                    row_base: part.row_base as u32,
                    out_stride: c.hidden as u32,
                    token_base: c0 as u32,
                    ..base
                };
                let grid = (c.hidden.div_ceil(WG) as u32, n as u32);
                planner.push(Pipe::Embed, Group::Embed(i), p, grid);
            }
            for (l, b) in m.blocks[..self.layers].iter().enumerate() {
                planner.layer(l, b, self.capacity);
            }
            // The head runs on the scored rows of this chunk only.
            let (lo, hi) = (first_scored.max(c0), c0 + n);
            if lo < hi {
                let norm = ModelParams {
                    width: c.hidden as u32,
                    out_stride: c.hidden as u32,
                    ..base
                };
                planner.push(Pipe::RmsNorm, Group::FinalNorm, norm, (n as u32, 1));
                let p = ModelParams {
                    rows: (hi - lo) as u32,
                    in_offset: ((lo - c0) * c.hidden) as u32,
                    out_offset: ((lo - first_scored) * c.vocab_size) as u32,
                    out_stride: c.vocab_size as u32,
                    ..base
                };
                planner.matmul(Pipe::Matmul, Group::Head, m.head(), p);
            }
        }
        (planner.out, planner.slots.0)
    }

    /// Every bind group of the sequence (rebuilt when a buffer it binds was replaced).
    fn build_groups(&self) -> HashMap<Group, wgpu::BindGroup> {
        let m = &*self.model;
        let a = &self.act;
        let mut groups = HashMap::new();
        let mut add = |group: Group, kernel: ModelKernel, buffers: &[&wgpu::Buffer]| {
            let mut entries = vec![params_entry(&self.params)];
            for (i, b) in buffers.iter().enumerate() {
                entries.push(crate::gpu::entry(i as u32 + 1, b));
            }
            let label = format!("specdec.{} {group:?}", kernel.name());
            let bg = m.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&label),
                layout: m.pipelines.layout(kernel),
                entries: &entries,
            });
            groups.insert(group, bg);
        };
        for (i, p) in m.embedding.parts.iter().enumerate() {
            add(
                Group::Embed(i),
                ModelKernel::Embed,
                &[&self.tokens, &p.qs, &p.scales, &a.x],
            );
        }
        for (i, p) in m.head().parts.iter().enumerate() {
            let g = Group::Head(i);
            let bufs = [&a.h.q, &p.qs, &p.scales, &m.dummy, &self.logits, &a.h.d];
            add(g, ModelKernel::MatmulQ8, &bufs);
        }
        let final_norm = [&a.x, &m.output_norm, &a.h.q, &a.h.d];
        add(Group::FinalNorm, ModelKernel::RmsNorm, &final_norm);
        add(Group::Swiglu, ModelKernel::Swiglu, &[&a.gu, &a.a.q, &a.a.d]);
        for (l, b) in m.blocks[..self.layers].iter().enumerate() {
            let (kc, vc) = (&self.k_cache[l], &self.v_cache[l]);
            let attn_norm = [&a.x, &b.attn_norm, &a.h.q, &a.h.d];
            add(Group::AttnNorm(l), ModelKernel::RmsNorm, &attn_norm);
            let ffn_norm = [&a.x, &b.ffn_norm, &a.h.q, &a.h.d];
            add(Group::FfnNorm(l), ModelKernel::RmsNorm, &ffn_norm);
            let rope = [&m.rope_table, &a.qkv, &a.q, kc, vc, &self.tokens];
            add(Group::Rope(l), ModelKernel::Rope, &rope);
            let att = [
                &a.q,
                kc,
                vc,
                &self.scratch,
                &a.att.q,
                &a.att.d,
                &self.tokens,
            ];
            add(Group::Attention(l), ModelKernel::Attention, &att);
            add(Group::Keep(l), ModelKernel::KvKeep, &[&self.tokens, kc, vc]);
            let bias = b.bias.as_ref().unwrap_or(&m.dummy);
            let mats: [(Mat, &GpuMatrix, &Q8Act, &wgpu::Buffer, &wgpu::Buffer); 4] = [
                (Mat::Qkv, &b.qkv, &a.h, bias, &a.qkv),
                (Mat::O, &b.o, &a.att, &m.dummy, &a.x),
                (Mat::GateUp, &b.gate_up, &a.h, &m.dummy, &a.gu),
                (Mat::Down, &b.down, &a.a, &m.dummy, &a.x),
            ];
            for (which, w, input, bias, output) in mats {
                for (i, p) in w.parts.iter().enumerate() {
                    let bufs = [&input.q, &p.qs, &p.scales, bias, output, &input.d];
                    add(Group::Mat(l, which, i), ModelKernel::MatmulQ8, &bufs);
                }
            }
        }
        groups
    }

    /// Appends `tokens`, scores every appended position, submits on the model's queue and reads
    /// the logits back: `tokens.len() × vocab` f32, row-major (tests and simple callers).
    pub fn forward_blocking(&mut self, tokens: &[u32]) -> Result<Vec<f32>, GpuModelError> {
        let device = self.model.device.clone();
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("specdec.model forward"),
        });
        self.record(&mut encoder, tokens, tokens.len())?;
        // Recording errors surface when the encoder is finished.
        crate::gpu::scoped(&device, || self.model.queue.submit([encoder.finish()]))?;
        self.read_logits_blocking()
    }

    /// Copies the last call's logits to the host (blocking): `rows × vocab` f32.
    pub fn read_logits_blocking(&self) -> Result<Vec<f32>, GpuModelError> {
        let l = self.logits();
        let bytes = (l.rows * l.vocab * 4) as u64;
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let raw = read_back(&self.model.device, &self.model.queue, l.buffer, bytes)?;
        Ok(bytemuck::cast_slice::<u8, f32>(&raw).to_vec())
    }

    /// Appends `tokens`, scores the last `rows`, and returns the GPU time of the call by kernel
    /// (each dispatch in a compute pass of its own, timed at its ends) and of the whole call in
    /// one pass, recorded again after truncating back. Needs a device with
    /// `Features::TIMESTAMP_QUERY`; for benchmarks (the per-dispatch passes add their own gaps,
    /// so the sum of the kernels is above the whole call's time).
    #[doc(hidden)]
    pub fn profile_blocking(
        &mut self,
        tokens: &[u32],
        rows: usize,
    ) -> Result<ForwardProfile, GpuModelError> {
        let m = self.model.clone();
        if !m
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Err(GpuModelError::Invalid(
                "profiling needs a device created with Features::TIMESTAMP_QUERY".into(),
            ));
        }
        let start = self.len;
        // Once through the checked path: it validates, and grows the cache (submitted, since a
        // grown cache's copy of the prefix is in that encoder).
        let mut first = m.device.create_command_encoder(&Default::default());
        self.record(&mut first, tokens, rows)?;
        m.queue.submit([first.finish()]);
        self.truncate(start)?;
        let count = self.plan(tokens.len(), rows, false).0.len();
        let period = f64::from(m.queue.get_timestamp_period());
        let mut run = |per_dispatch: bool| -> Result<(Vec<String>, Vec<u64>), GpuModelError> {
            let queries = if per_dispatch { 2 * count } else { 2 } as u32;
            let set = m.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("specdec.model profile"),
                ty: wgpu::QueryType::Timestamp,
                count: queries,
            });
            let resolved = buffer(
                &m.device,
                "specdec.model profile resolve",
                queries as usize * 8,
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            );
            let mut enc = m.device.create_command_encoder(&Default::default());
            let timing = if per_dispatch {
                Timing::PerDispatch(&set)
            } else {
                Timing::Whole(&set)
            };
            let pipes = crate::gpu::scoped(&m.device, || {
                let host = Tokens {
                    host: tokens,
                    device: None,
                    tree: None,
                };
                self.record_checked(&mut enc, host, rows, timing)
            })??;
            enc.resolve_query_set(&set, 0..queries, &resolved, 0);
            m.queue.submit([enc.finish()]);
            let raw = read_back(&m.device, &m.queue, &resolved, u64::from(queries) * 8)?;
            Ok((pipes, bytemuck::cast_slice::<u8, u64>(&raw).to_vec()))
        };
        let (pipes, ticks) = run(true)?;
        let mut kernels: Vec<(String, f64, usize)> = Vec::new();
        for (i, pipe) in pipes.iter().enumerate() {
            let ns = ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period;
            let name = pipe.clone();
            match kernels.iter_mut().find(|k| k.0 == name) {
                Some(k) => {
                    k.1 += ns;
                    k.2 += 1;
                }
                None => kernels.push((name, ns, 1)),
            }
        }
        let (_, whole) = run(false)?;
        let total_ns = whole[1].saturating_sub(whole[0]) as f64 * period;
        Ok(ForwardProfile { total_ns, kernels })
    }
}

/// GPU time of one forward call ([`GpuSequence::profile_blocking`]).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct ForwardProfile {
    /// The whole call in one compute pass, in nanoseconds.
    pub total_ns: f64,
    /// Per pipeline: its name, summed nanoseconds over its dispatches, and the dispatch count.
    pub kernels: Vec<(String, f64, usize)>,
}

/// Copies `bytes` of `src` (a `COPY_SRC` buffer) to the host, blocking until the copy is done.
/// Copies `bytes` of `src` (a `COPY_SRC` buffer) to the host, after everything submitted before.
pub(super) fn read_back(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    src: &wgpu::Buffer,
    bytes: u64,
) -> Result<Vec<u8>, GpuModelError> {
    let pending = start_read(device, queue, src, bytes)?;
    finish_read(device, pending)
}

/// A copy to a mappable buffer, submitted after everything submitted before it.
pub(super) struct PendingRead {
    staging: wgpu::Buffer,
    submission: wgpu::SubmissionIndex,
}

/// Submits a copy of `bytes` of `src` (a `COPY_SRC` buffer) into a mappable buffer; later
/// submissions may run while [`finish_read`] waits for this one alone.
pub(super) fn start_read(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    src: &wgpu::Buffer,
    bytes: u64,
) -> Result<PendingRead, GpuModelError> {
    let (staging, submission) = crate::gpu::scoped(device, || {
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specdec.model readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("specdec.model readback"),
        });
        encoder.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
        let submission = queue.submit([encoder.finish()]);
        (staging, submission)
    })?;
    Ok(PendingRead {
        staging,
        submission,
    })
}

/// Waits for the copy of `pending` (not for what was submitted after it) and returns its bytes.
pub(super) fn finish_read(
    device: &wgpu::Device,
    pending: PendingRead,
) -> Result<Vec<u8>, GpuModelError> {
    let gpu_err = |detail: String| GpuModelError::Gpu(crate::Error::Gpu { detail });
    let PendingRead {
        staging,
        submission,
    } = pending;
    let flag = Arc::new(Mutex::new(None));
    let flag_c = flag.clone();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        *flag_c.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    });
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: None,
        })
        .map_err(|e| gpu_err(e.to_string()))?;
    loop {
        if let Some(r) = flag.lock().unwrap_or_else(|p| p.into_inner()).take() {
            r.map_err(|e| gpu_err(e.to_string()))?;
            break;
        }
        let _ = device.poll(wgpu::PollType::Poll);
        std::thread::yield_now();
    }
    let view = staging
        .slice(..)
        .get_mapped_range()
        .map_err(|e| gpu_err(e.to_string()))?;
    let out = view.to_vec();
    drop(view);
    staging.unmap();
    Ok(out)
}

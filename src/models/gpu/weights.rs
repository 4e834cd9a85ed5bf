//! Weights on the GPU: every matrix re-quantized to Q8_0 blocks in 4-byte-aligned arrays, split
//! by output rows so that each buffer fits one storage binding.
//!
//! ```text
//! one part of a [rows × K] matrix (K a multiple of 32), element e = r·K + c:
//!   qs:     u32[rows·K/4]    word e/4 holds int8 element e in byte e%4 (little end first)
//!   scales: f32[rows·K/32]   scale of block e/32
//!   value(r, c) = f32(int8) · scale
//! ```
//!
//! 1.125 bytes per weight (ggml's Q8_0 keeps an f16 scale inline, 1.0625; the f32 scale in its
//! own array keeps every load 4-byte aligned, which WGSL needs).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::Device;
use wgpu::util::DeviceExt;

use super::{GpuModelError, Pipelines};
use crate::models::{Architecture, Config, ModelError};

/// Elements per Q8_0 block.
pub const Q8_BLOCK: usize = 32;

/// A host-side Q8_0 matrix: `rows × cols` int8 (packed 4 per word) and one f32 scale per block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Q8Matrix {
    /// Output rows.
    pub rows: usize,
    /// Input columns (a multiple of 32).
    pub cols: usize,
    /// `rows · cols / 4` words, see the module docs.
    pub qs: Vec<u32>,
    /// `rows · cols / 32` block scales.
    pub scales: Vec<f32>,
}

impl Q8Matrix {
    /// Quantizes row-major f32 values block by block as ggml's `quantize_row_q8_0` does:
    /// `d = max|x| / 127`, `q = round(x / d)` (halves away from zero), except that `d` stays f32.
    ///
    /// # Panics
    /// If `values.len() != rows · cols` or `cols` is not a multiple of 32.
    pub fn quantize(values: &[f32], rows: usize, cols: usize) -> Q8Matrix {
        assert_eq!(
            values.len(),
            rows * cols,
            "values of a {rows}×{cols} matrix"
        );
        assert!(
            cols.is_multiple_of(Q8_BLOCK),
            "{cols} columns: not whole Q8_0 blocks"
        );
        let mut qs = Vec::with_capacity(values.len() / 4);
        let mut scales = Vec::with_capacity(values.len() / Q8_BLOCK);
        for block in values.chunks_exact(Q8_BLOCK) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            scales.push(d);
            for four in block.chunks_exact(4) {
                let mut word = 0u32;
                for (j, v) in four.iter().enumerate() {
                    let q = (v * id).round() as i8;
                    word |= u32::from(q as u8) << (8 * j);
                }
                qs.push(word);
            }
        }
        Q8Matrix {
            rows,
            cols,
            qs,
            scales,
        }
    }

    /// The rows of `self`, then those of `below` (same width).
    ///
    /// # Panics
    /// If the widths differ.
    pub fn stack(&self, below: &Q8Matrix) -> Q8Matrix {
        assert_eq!(
            self.cols, below.cols,
            "stacking matrices of different widths"
        );
        Q8Matrix {
            rows: self.rows + below.rows,
            cols: self.cols,
            qs: [&self.qs[..], &below.qs[..]].concat(),
            scales: [&self.scales[..], &below.scales[..]].concat(),
        }
    }

    /// Value `(r, c)` as the kernels see it.
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let e = r * self.cols + c;
        let q = (self.qs[e / 4] >> (8 * (e % 4))) as u8 as i8;
        f32::from(q) * self.scales[e / Q8_BLOCK]
    }
}

/// One part of a matrix on the GPU: output rows `row_base .. row_base + rows`.
#[derive(Debug)]
pub(crate) struct Q8Part {
    pub qs: wgpu::Buffer,
    pub scales: wgpu::Buffer,
    pub row_base: usize,
    pub rows: usize,
}

/// A Q8_0 matrix on the GPU, in parts of whole rows.
#[derive(Debug)]
pub(crate) struct GpuMatrix {
    pub parts: Vec<Q8Part>,
    pub cols: usize,
}

impl GpuMatrix {
    /// Uploads `m`, `max_binding` bytes of int8 at most per part.
    fn upload(device: &wgpu::Device, label: &str, m: &Q8Matrix, max_binding: u64) -> GpuMatrix {
        let per_part = ((max_binding / m.cols as u64) as usize).clamp(1, m.rows);
        let mut parts = Vec::new();
        let mut row_base = 0;
        while row_base < m.rows {
            let rows = per_part.min(m.rows - row_base);
            let (w0, w1) = (row_base * m.cols / 4, (row_base + rows) * m.cols / 4);
            let (s0, s1) = (
                row_base * m.cols / Q8_BLOCK,
                (row_base + rows) * m.cols / Q8_BLOCK,
            );
            let init = |what: &str, contents: &[u8]| {
                device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(&format!("specdec.model_weights {label} {what}")),
                    contents,
                    usage: wgpu::BufferUsages::STORAGE,
                })
            };
            parts.push(Q8Part {
                qs: init("qs", bytemuck::cast_slice(&m.qs[w0..w1])),
                scales: init("scales", bytemuck::cast_slice(&m.scales[s0..s1])),
                row_base,
                rows,
            });
            row_base += rows;
        }
        GpuMatrix {
            parts,
            cols: m.cols,
        }
    }
}

/// One transformer block on the GPU.
#[derive(Debug)]
pub(crate) struct GpuBlock {
    pub attn_norm: wgpu::Buffer,
    /// The q rows, then the k rows, then the v rows: one matmul computes all three
    /// (`[(heads + 2·kv_heads)·head_dim, hidden]`).
    pub qkv: GpuMatrix,
    /// Qwen2's q, k, v biases, stacked the same way.
    pub bias: Option<wgpu::Buffer>,
    pub o: GpuMatrix,
    pub ffn_norm: wgpu::Buffer,
    /// The gate rows, then the up rows: one matmul computes both (`[2·ffn, hidden]`).
    pub gate_up: GpuMatrix,
    pub down: GpuMatrix,
}

/// Options of [`GpuModel`] loading.
#[derive(Clone, Debug, Default)]
pub struct GpuModelOptions {
    /// Cap on the bytes of one weight buffer, below the device's
    /// `max_storage_buffer_binding_size` (None = the device's). Smaller caps split matrices into
    /// more parts; the logits do not change. For tests of the splitting.
    pub max_binding_bytes: Option<u64>,
    /// Lanes that share one output row of the matmul (a power of two, 1 to 32; None: by the
    /// matrix width on a GPU, 16 up to 64 blocks per row and 32 above; 4 on a CPU adapter).
    /// Tuning only, but it sets the summation order, so logits move in their last bits when it
    /// changes; rows scored together still equal rows scored alone.
    pub matmul_lanes: Option<u32>,
    /// How the matmul keeps its per-row sums (the WGSL `UNROLLED` override of
    /// `shaders/model_matmul_q8.wgsl`): `Some(true)`, in 16 named variables inside the block
    /// loop, each weight block read once for all rows; `Some(false)`, one row at a time, the
    /// block read again per row from cache. None: on GPUs one at a time for a single row (fewer
    /// registers) and named for several; one at a time on CPU adapters (lavapipe runs every
    /// guarded sum of the named form: 4.6× slower at one row). The summation order is the same
    /// either way.
    pub matmul_unrolled: Option<bool>,
}

/// One transformer block's tensors on the host.
#[derive(Clone, Debug)]
pub(crate) struct HostBlock {
    pub attn_norm: Vec<f32>,
    pub q: Q8Matrix,
    pub k: Q8Matrix,
    pub v: Q8Matrix,
    pub bias: Option<[Vec<f32>; 3]>,
    pub o: Q8Matrix,
    pub ffn_norm: Vec<f32>,
    pub gate: Q8Matrix,
    pub up: Q8Matrix,
    pub down: Q8Matrix,
}

/// A model's weights on the host in the GPU's form (Q8_0 matrices, f32 norms and biases):
/// what [`GpuModel::upload`] copies to a device, and the input of the f64 reference forward
/// ([`HostModel::reference_forward`]) that the GPU kernels are tested against.
#[derive(Clone, Debug)]
pub struct HostModel {
    pub(crate) config: Config,
    pub(crate) embedding: Q8Matrix,
    /// `None`: tied to the embedding.
    pub(crate) head: Option<Q8Matrix>,
    pub(crate) output_norm: Vec<f32>,
    pub(crate) blocks: Vec<HostBlock>,
}

/// A model's weights uploaded once to a caller's device, with the kernels' pipelines: shared (by
/// `Arc`) by every [`super::GpuSequence`] over it.
#[derive(Debug)]
pub struct GpuModel {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) config: Config,
    pub(crate) pipelines: Pipelines,
    pub(crate) embedding: GpuMatrix,
    /// `None`: tied to the embedding.
    pub(crate) head: Option<GpuMatrix>,
    pub(crate) output_norm: wgpu::Buffer,
    pub(crate) blocks: Vec<GpuBlock>,
    /// `(cos, sin)` of every position and pair, `[context_length, head_dim / 2]`.
    pub(crate) rope_table: wgpu::Buffer,
    /// Bound where a kernel's optional input is absent (a matmul without bias).
    pub(crate) dummy: wgpu::Buffer,
    weight_bytes: u64,
    /// What the upload found about the matmul's two accumulator forms.
    matmul_forms: super::MatmulFormCheck,
}

impl HostModel {
    /// Reads the GGUF file `path` (llama or qwen2, the tensor names of
    /// [`crate::models::Weights`]), whose hyper-parameters are `config` (take them from
    /// [`crate::models::Weights::config`]), and re-quantizes every matrix to Q8_0 from candle's
    /// dequantized f32.
    pub fn load(path: impl AsRef<Path>, config: &Config) -> Result<HostModel, GpuModelError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| gguf_error(path, e))?;
        let mut file = GgufFile {
            path,
            content,
            reader,
        };
        let c = config;
        let (qd, kvd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let embedding = file.matrix("token_embd.weight", c.vocab_size, c.hidden)?;
        let head = if c.tied_embeddings {
            None
        } else {
            Some(file.matrix("output.weight", c.vocab_size, c.hidden)?)
        };
        let mut blocks = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let name = |s: &str| format!("blk.{i}.{s}");
            let q = file.matrix(&name("attn_q.weight"), qd, c.hidden)?;
            let k = file.matrix(&name("attn_k.weight"), kvd, c.hidden)?;
            let v = file.matrix(&name("attn_v.weight"), kvd, c.hidden)?;
            let o = file.matrix(&name("attn_output.weight"), c.hidden, qd)?;
            let gate = file.matrix(&name("ffn_gate.weight"), c.ffn, c.hidden)?;
            let up = file.matrix(&name("ffn_up.weight"), c.ffn, c.hidden)?;
            let down = file.matrix(&name("ffn_down.weight"), c.hidden, c.ffn)?;
            let bias = if c.architecture == Architecture::Qwen2 {
                Some([
                    file.read(&name("attn_q.bias"))?.0,
                    file.read(&name("attn_k.bias"))?.0,
                    file.read(&name("attn_v.bias"))?.0,
                ])
            } else {
                None
            };
            blocks.push(HostBlock {
                attn_norm: file.read(&name("attn_norm.weight"))?.0,
                q,
                k,
                v,
                bias,
                o,
                ffn_norm: file.read(&name("ffn_norm.weight"))?.0,
                gate,
                up,
                down,
            });
        }
        let output_norm = file.read("output_norm.weight")?.0;
        Ok(HostModel {
            config: config.clone(),
            embedding,
            head,
            output_norm,
            blocks,
        })
    }

    /// A model of `config`'s shape with pseudo-random Q8_0 weights (seeded; norms 1, biases
    /// uniform in [−0.5, 0.5)), for timing a real architecture without its file. The logits mean nothing.
    pub fn random(config: &Config, seed: u64) -> HostModel {
        let mut rng = SplitMix(seed);
        let matrix = |rng: &mut SplitMix, rows: usize, cols: usize| {
            let qs = (0..rows * cols / 4).map(|_| rng.next() as u32).collect();
            // Scales so that a row's dot product with unit-RMS input stays O(1).
            let s = 1.0 / (127.0 * (cols as f32).sqrt());
            Q8Matrix {
                rows,
                cols,
                qs,
                scales: vec![s; rows * cols / Q8_BLOCK],
            }
        };
        // Biases in [−0.5, 0.5): large enough that a kernel dropping one is seen.
        let bias = |rng: &mut SplitMix, n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                .collect()
        };
        let c = config;
        let (qd, kvd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let embedding = matrix(&mut rng, c.vocab_size, c.hidden);
        let head = (!c.tied_embeddings).then(|| matrix(&mut rng, c.vocab_size, c.hidden));
        let mut blocks = Vec::with_capacity(c.layers);
        for _ in 0..c.layers {
            // Drawn for every architecture, so that two configs differing in the architecture
            // alone get the same matrices (the tests' controls rely on it).
            let biases = [bias(&mut rng, qd), bias(&mut rng, kvd), bias(&mut rng, kvd)];
            blocks.push(HostBlock {
                attn_norm: vec![1.0; c.hidden],
                q: matrix(&mut rng, qd, c.hidden),
                k: matrix(&mut rng, kvd, c.hidden),
                v: matrix(&mut rng, kvd, c.hidden),
                bias: (c.architecture == Architecture::Qwen2).then_some(biases),
                o: matrix(&mut rng, c.hidden, qd),
                ffn_norm: vec![1.0; c.hidden],
                gate: matrix(&mut rng, c.ffn, c.hidden),
                up: matrix(&mut rng, c.ffn, c.hidden),
                down: matrix(&mut rng, c.hidden, c.ffn),
            });
        }
        let output_norm = vec![1.0; c.hidden];
        HostModel {
            config: config.clone(),
            embedding,
            head,
            output_norm,
            blocks,
        }
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

impl GpuModel {
    /// [`HostModel::load`], then [`GpuModel::upload`].
    pub fn load(
        path: impl AsRef<Path>,
        config: &Config,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        options: &GpuModelOptions,
    ) -> Result<GpuModel, GpuModelError> {
        Self::upload(&HostModel::load(path, config)?, device, queue, options)
    }

    /// [`HostModel::random`], then [`GpuModel::upload`].
    pub fn random(
        config: &Config,
        seed: u64,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        options: &GpuModelOptions,
    ) -> Result<GpuModel, GpuModelError> {
        Self::upload(&HostModel::random(config, seed), device, queue, options)
    }

    /// Uploads `host` to `device` and builds the kernels' pipelines there (every object created
    /// inside an error scope).
    pub fn upload(
        host: &HostModel,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        options: &GpuModelOptions,
    ) -> Result<GpuModel, GpuModelError> {
        let HostModel {
            config,
            embedding,
            head,
            output_norm,
            blocks,
        } = host;
        let head = head.as_ref();
        check_config(config)?;
        if let Some(lanes) = options.matmul_lanes {
            if !lanes.is_power_of_two() || lanes > 32 {
                return Err(GpuModelError::Invalid(format!(
                    "matmul_lanes {lanes}: use a power of two from 1 to 32"
                )));
            }
        }
        let policy = super::kernels::MatmulPolicy::new(
            device,
            options.matmul_lanes,
            options.matmul_unrolled,
        );
        let limits = device.limits();
        let max_binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            .min(options.max_binding_bytes.unwrap_or(u64::MAX));
        let mut weight_bytes = 0u64;
        let mut count = |m: &Q8Matrix| {
            weight_bytes += (m.qs.len() * 4 + m.scales.len() * 4) as u64;
        };
        count(embedding);
        head.into_iter().for_each(&mut count);
        for b in blocks {
            for m in [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down] {
                count(m);
            }
        }
        let floats = |label: &str, v: &[f32]| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&format!("specdec.model_weights {label}")),
                contents: bytemuck::cast_slice(v),
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        let rope = rope_table(config);
        let built = crate::gpu::scoped(device, || {
            let up = |label: &str, m: &Q8Matrix| GpuMatrix::upload(device, label, m, max_binding);
            let gpu_blocks = blocks
                .iter()
                .enumerate()
                .map(|(i, b)| GpuBlock {
                    attn_norm: floats(&format!("blk.{i}.attn_norm"), &b.attn_norm),
                    qkv: up(&format!("blk.{i}.attn_qkv"), &b.q.stack(&b.k).stack(&b.v)),
                    bias: b.bias.as_ref().map(|[q, k, v]| {
                        floats(&format!("blk.{i}.attn_qkv.bias"), &[&q[..], k, v].concat())
                    }),
                    o: up(&format!("blk.{i}.attn_output"), &b.o),
                    ffn_norm: floats(&format!("blk.{i}.ffn_norm"), &b.ffn_norm),
                    gate_up: up(&format!("blk.{i}.ffn_gate+up"), &b.gate.stack(&b.up)),
                    down: up(&format!("blk.{i}.ffn_down"), &b.down),
                })
                .collect();
            GpuModel {
                device: device.clone(),
                queue: queue.clone(),
                config: config.clone(),
                pipelines: Pipelines::new(device, policy, config.head_dim),
                embedding: up("token_embd", embedding),
                head: head.map(|h| up("output", h)),
                output_norm: floats("output_norm", output_norm),
                blocks: gpu_blocks,
                rope_table: floats("rope table", &rope),
                dummy: floats("dummy", &[0.0; 4]),
                weight_bytes,
                matmul_forms: super::MatmulFormCheck::OneForm,
            }
        })?;
        let mut built = built;
        built.matmul_forms = super::form_check::settle_forms(device, queue, &mut built.pipelines)?;
        Ok(built)
    }

    /// Whether the device compiled the matmul's two accumulator forms alike (checked at upload;
    /// see [`super::MatmulFormCheck`]): where they differ, every call takes the one-at-a-time
    /// form, so a row's logits never depend on how many rows share its call.
    pub fn matmul_forms(&self) -> super::MatmulFormCheck {
        self.matmul_forms
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bytes of the Q8_0 matrices on the device (int8 values and f32 scales; norms, biases and
    /// the rope table, all small, not counted).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Weight buffers the output head was split into (1 unless it exceeds one binding).
    pub fn head_parts(&self) -> usize {
        self.head.as_ref().unwrap_or(&self.embedding).parts.len()
    }

    /// The device the weights live on.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue the model submits on in its `_blocking` functions.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    pub(crate) fn head(&self) -> &GpuMatrix {
        self.head.as_ref().unwrap_or(&self.embedding)
    }
}

/// splitmix64, the seeded stream of [`HostModel::random`].
pub(super) struct SplitMix(pub(super) u64);

impl SplitMix {
    /// The next word of the stream.
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn gguf_error(path: &Path, e: candle_core::Error) -> ModelError {
    ModelError::Gguf {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// An open GGUF file whose tensors are read one at a time as f32.
struct GgufFile<'a> {
    path: &'a Path,
    content: Content,
    reader: BufReader<File>,
}

impl GgufFile<'_> {
    /// Tensor `name`, dequantized by candle, and its shape.
    fn read(&mut self, name: &str) -> Result<(Vec<f32>, Vec<usize>), GpuModelError> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(ModelError::MissingTensor {
                name: name.to_string(),
            }
            .into());
        }
        let t = self
            .content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .map_err(|e| gguf_error(self.path, e))?;
        let dims = t.dims().to_vec();
        let v = t
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| gguf_error(self.path, e))?;
        Ok((v, dims))
    }

    /// Matrix `name` of shape `[rows, cols]`, re-quantized to Q8_0.
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Q8Matrix, GpuModelError> {
        let (v, dims) = self.read(name)?;
        if dims != [rows, cols] {
            return Err(GpuModelError::Invalid(format!(
                "tensor `{name}` has shape {dims:?}, the config implies [{rows}, {cols}]"
            )));
        }
        Ok(Q8Matrix::quantize(&v, rows, cols))
    }
}

/// What the kernels assume of a configuration.
fn check_config(c: &Config) -> Result<(), GpuModelError> {
    let bad = |what: String| Err(GpuModelError::Invalid(what));
    if !c.hidden.is_multiple_of(Q8_BLOCK) || !c.ffn.is_multiple_of(Q8_BLOCK) {
        return bad(format!(
            "hidden {} and ffn {} must be multiples of 32 (Q8_0 blocks)",
            c.hidden, c.ffn
        ));
    }
    // The attention kernel writes each head's output as whole 8-bit blocks and keeps a head's
    // query (up to 128 words of 4) in workgroup memory.
    if !c.head_dim.is_multiple_of(Q8_BLOCK) || c.head_dim > 512 {
        return bad(format!(
            "heads of {}: the head width must be a multiple of 32, at most 512",
            c.head_dim
        ));
    }
    if c.kv_heads == 0 || !c.heads.is_multiple_of(c.kv_heads) {
        return bad(format!("{} heads over {} kv heads", c.heads, c.kv_heads));
    }
    Ok(())
}

/// `(cos, sin)` of `p · θ^(−2i/d)` for every position `p < context_length` and pair `i < d/2`,
/// computed in f64 and rounded once, exactly as the CPU forward's rope tables.
fn rope_table(c: &Config) -> Vec<f32> {
    let (hd, half) = (c.head_dim, c.head_dim / 2);
    let mut t = Vec::with_capacity(c.context_length * half * 2);
    for p in 0..c.context_length {
        for i in 0..half {
            let angle = p as f64 * c.rope_theta.powf(-2.0 * i as f64 / hd as f64);
            t.push(angle.cos() as f32);
            t.push(angle.sin() as f32);
        }
    }
    t
}

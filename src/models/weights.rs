//! Reading a llama-family GGUF file: the hyper-parameters, the quantized tensors, the tokenizer.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};

use super::cpu_matmul::{CpuKernel, CpuQ8Matrix};
use super::error::{CandleContext, ModelError};
use super::gpu::Q8_BLOCK;
use super::tokenizer::Tokenizer;

/// The model families this forward pass implements (GGUF `general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Architecture {
    /// `llama`: SmolLM2 and the Llama family; no attention biases.
    Llama,
    /// `qwen2`: Qwen2 / Qwen2.5(-Coder); biases on the q, k and v projections.
    Qwen2,
}

/// How rotary position embedding pairs up the `head_dim` components of a query or key.
///
/// The GGUF converter of llama.cpp permutes the q/k rows of `llama` checkpoints so that the
/// rotated pairs are adjacent, and leaves `qwen2` checkpoints in Hugging Face order, where the
/// pairs are the two halves. Using the wrong one does not fail, it only degrades the text, so
/// the default comes from the architecture and [`LoadOptions::rope_style`] can override it for
/// experiments (see the README for the check made on SmolLM2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i+1])` (llama.cpp's "normal" rope; GGUF `llama`).
    AdjacentPairs,
    /// Pairs `(x[i], x[i + d/2])` (llama.cpp's "neox" rope; Hugging Face order; GGUF `qwen2`).
    RotateHalves,
}

/// The hyper-parameters read from the GGUF metadata.
#[derive(Clone, Debug)]
pub struct Config {
    /// The family.
    pub architecture: Architecture,
    /// Transformer blocks.
    pub layers: usize,
    /// Residual stream width.
    pub hidden: usize,
    /// SwiGLU inner width.
    pub ffn: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Width of one head (`hidden / heads`).
    pub head_dim: usize,
    /// Rows of the output head (logits per position).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Rope base frequency.
    pub rope_theta: f64,
    /// Rope pairing in this file.
    pub rope_style: RopeStyle,
    /// The longest sequence the model was trained for; `forward` refuses to go past it.
    pub context_length: usize,
    /// Whether the output head reuses the token embedding (no `output.weight` in the file).
    pub tied_embeddings: bool,
}

impl Config {
    /// The shape of a model this crate knows by name (`"smollm2"`, `"qwen-0.5b"`,
    /// `"qwen-1.5b"`): the hyper-parameters its GGUF file holds, for building pseudo-random
    /// weights of the real shape ([`crate::models::GpuModel::random`]) where the file is absent.
    pub fn known_shape(name: &str) -> Option<Config> {
        let qwen = |layers, hidden, ffn, heads| Config {
            architecture: Architecture::Qwen2,
            layers,
            hidden,
            ffn,
            heads,
            kv_heads: 2,
            head_dim: hidden / heads,
            vocab_size: 151_936,
            rms_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_style: RopeStyle::RotateHalves,
            context_length: 32_768,
            tied_embeddings: true,
        };
        match name {
            "qwen-0.5b" => Some(qwen(24, 896, 4864, 14)),
            "qwen-1.5b" => Some(qwen(28, 1536, 8960, 12)),
            "smollm2" => Some(Config {
                architecture: Architecture::Llama,
                layers: 30,
                hidden: 576,
                ffn: 1536,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                vocab_size: 49_152,
                rms_eps: 1e-5,
                rope_theta: 100_000.0,
                rope_style: RopeStyle::AdjacentPairs,
                context_length: 8192,
                tied_embeddings: true,
            }),
            _ => None,
        }
    }
}

/// Options for [`Weights::load_with`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Override the rope pairing the architecture implies (for experiments only).
    pub rope_style: Option<RopeStyle>,
    /// Re-quantize the matrices stored in formats for which candle 0.11 has only a scalar dot
    /// product (Q4_1, Q5_0, Q5_1) to Q8_0, which has an AVX2/NEON one, at load time. SmolLM2 (a
    /// Q4_1 file) and Qwen2.5-Coder-0.5B (mostly Q5_0) decode several times faster for about 1.6×
    /// the weight memory. The Q8_0 rounding of the stored values changes the logits slightly
    /// (the README gives the measured effect), so it is off by default.
    pub requantize_to_q8_0: bool,
    /// Make a position's logits independent of how many tokens were fed with it (default: on):
    /// attention runs position by position, and every matmul whose candle kernel could compute a
    /// row differently in a multi-row call runs one row at a time. candle 0.11 picks a different
    /// x86 kernel for Q6_K when a call has more than one row (repacked tiles), which moves Qwen
    /// 0.5B's logits by up to ~0.4 between a whole-prompt forward and token-by-token decoding
    /// (measured; with all weights dequantized to f32 the two agree to 2e-5); the formats whose
    /// kernels compute every row alike (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, …, checked by
    /// `tests/cpu_rows.rs`) run all rows in one call. A verifier scores `k + 1` rows at once, so
    /// without this its target would differ slightly from the same model decoding alone. Off:
    /// faster prefill.
    pub split_invariant: bool,
    /// With `split_invariant`, run every quantized matmul one row at a time, also in the formats
    /// whose kernels are row-independent (default: off). The rows are the same bits either way;
    /// this is the slower reference that `docs/models.md` measures the batched calls against,
    /// and a way out on a CPU where a kernel turns out to depend on the row count.
    pub row_by_row_matmuls: bool,
    /// Which CPU kernel runs the matrix products (default [`MatmulKernel::Auto`]).
    pub kernel: MatmulKernel,
}

/// The CPU kernel behind a model's matrix products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulKernel {
    /// [`MatmulKernel::Q8Rows`] where its SIMD path runs ([`CpuKernel::simd_available`]: x86-64
    /// with AVX-512 VNNI), else [`MatmulKernel::Candle`]: the portable path of `Q8Rows` gives the
    /// same bits but is several times slower than candle's SIMD kernels (docs/models.md).
    #[default]
    Auto,
    /// Every matrix as Q8_0 in a [`CpuQ8Matrix`]: Q8_0 matrices are repacked as
    /// stored, other formats dequantized and re-quantized to Q8_0 at load (1.125 bytes per
    /// weight: about twice a Q4_K file's size in memory). A `k + 1`-row call costs little more
    /// than a 1-row call, and each row is the same bits however many are scored together, so
    /// `split_invariant`, `row_by_row_matmuls` and `requantize_to_q8_0` do not apply to its
    /// matmuls (`split_invariant` still sets how attention runs).
    Q8Rows,
    /// candle-core's quantized matmul on the stored formats: less memory for 4- and 5-bit
    /// files, each extra row costs about as much as the first (docs/models.md).
    Candle,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            rope_style: None,
            requantize_to_q8_0: false,
            split_invariant: true,
            row_by_row_matmuls: false,
            kernel: MatmulKernel::Auto,
        }
    }
}

impl MatmulKernel {
    /// [`MatmulKernel::Auto`] resolved for this CPU; the others as they are.
    pub fn resolve(self) -> MatmulKernel {
        match self {
            MatmulKernel::Auto if CpuKernel::simd_available() => MatmulKernel::Q8Rows,
            MatmulKernel::Auto => MatmulKernel::Candle,
            other => other,
        }
    }
}

/// A weight matrix in the form its kernel reads.
#[derive(Clone, Debug)]
pub(crate) enum Matrix {
    /// [`MatmulKernel::Candle`].
    Candle(QMatMul),
    /// [`MatmulKernel::Q8Rows`].
    Q8(CpuQ8Matrix),
}

/// A linear layer: a quantized weight and, for Qwen2's q/k/v, an f32 bias.
#[derive(Clone, Debug)]
pub(crate) struct Linear {
    pub weight: Matrix,
    pub bias: Option<Tensor>,
}

/// One transformer block's tensors.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub attn_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub ffn_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// The immutable part of a model: configuration, tensors and tokenizer, read once and shared
/// through an [`Arc`] by every [`super::Model`] (the sequences of a batch, a layer-skip draft and
/// its target) so none of them duplicates the weights.
#[derive(Debug)]
pub struct Weights {
    pub(crate) config: Config,
    /// Quantized embedding table; rows are dequantized per token (a full f32 copy of Qwen 1.5B's
    /// table would be 0.9 GB).
    pub(crate) embedding: Arc<QTensor>,
    pub(crate) blocks: Vec<Block>,
    pub(crate) output_norm: Tensor,
    pub(crate) output: Matrix,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) device: Device,
    /// [`LoadOptions::split_invariant`].
    pub(crate) split_invariant: bool,
    /// [`LoadOptions::row_by_row_matmuls`].
    pub(crate) row_by_row_matmuls: bool,
    path: PathBuf,
}

impl Weights {
    /// Loads a llama or qwen2 GGUF file onto the CPU with default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Weights>, ModelError> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// Loads a llama or qwen2 GGUF file onto the CPU.
    pub fn load_with(
        path: impl AsRef<Path>,
        options: &LoadOptions,
    ) -> Result<Arc<Weights>, ModelError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| ModelError::Gguf {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let mut config = read_config(&Metadata(&content.metadata), options)?;
        let tokenizer = Tokenizer::from_gguf(&content.metadata)?;
        let mut tensors = TensorReader {
            content: &content,
            reader,
            path: &path,
            requantize_to_q8_0: options.requantize_to_q8_0,
            kernel: options.kernel.resolve(),
        };

        let embedding = Arc::new(tensors.matrix("token_embd.weight")?);
        let (vocab_size, embd_width) = embedding
            .shape()
            .dims2()
            .ctx("reading the embedding shape")?;
        if embd_width != config.hidden {
            return Err(ModelError::Unsupported {
                message: format!(
                    "embedding width {embd_width} differs from {}",
                    config.hidden
                ),
            });
        }
        let has_bias = config.architecture == Architecture::Qwen2;
        let blocks = (0..config.layers)
            .map(|i| tensors.block(i, has_bias))
            .collect::<Result<Vec<Block>, ModelError>>()?;
        let output_norm = dequantize(tensors.read("output_norm.weight")?)?;
        let tied_embeddings = !content.tensor_infos.contains_key("output.weight");
        let output = match (tied_embeddings, tensors.kernel) {
            // Same Arc: the head costs no memory beyond the embedding.
            (true, MatmulKernel::Candle) => Matrix::Candle(
                QMatMul::from_arc(embedding.clone()).ctx("wrapping the tied output head")?,
            ),
            // A repacked copy: the lookups keep reading the stored table.
            (true, MatmulKernel::Q8Rows | MatmulKernel::Auto) => Matrix::Q8(cpu_q8(&embedding)?),
            (false, _) => {
                let head = tensors.matrix("output.weight")?;
                tensors.wrap(head)?
            }
        };
        if tokenizer.vocab_size() > vocab_size {
            return Err(ModelError::Tokenizer {
                message: format!(
                    "{} tokens but only {vocab_size} embedding rows",
                    tokenizer.vocab_size()
                ),
            });
        }
        config.vocab_size = vocab_size;
        config.tied_embeddings = tied_embeddings;
        Ok(Arc::new(Weights {
            config,
            embedding,
            blocks,
            output_norm,
            output,
            tokenizer,
            device: Device::Cpu,
            split_invariant: options.split_invariant,
            row_by_row_matmuls: options.row_by_row_matmuls,
            path,
        }))
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The tokenizer built from the file's metadata.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The file the weights came from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The hyper-parameters from the metadata, checked against what the forward pass implements.
/// `vocab_size` and `tied_embeddings` come from the tensors: 0 and false here, set by
/// [`Weights::load_with`] once the embedding and the head are read.
fn read_config(meta: &Metadata, options: &LoadOptions) -> Result<Config, ModelError> {
    let arch_name = meta.string("general.architecture")?;
    let architecture = match arch_name {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        other => {
            return Err(ModelError::Unsupported {
                message: format!(
                    "architecture `{other}`; this forward pass implements `llama` and `qwen2`"
                ),
            })
        }
    };
    let a = arch_name;
    let layers = meta.usize(&format!("{a}.block_count"))?;
    let hidden = meta.usize(&format!("{a}.embedding_length"))?;
    let ffn = meta.usize(&format!("{a}.feed_forward_length"))?;
    let heads = meta.usize(&format!("{a}.attention.head_count"))?;
    let kv_heads = meta
        .opt_usize(&format!("{a}.attention.head_count_kv"))?
        .unwrap_or(heads);
    let rms_eps = meta.f64(&format!("{a}.attention.layer_norm_rms_epsilon"))?;
    let rope_theta = meta
        .opt_f64(&format!("{a}.rope.freq_base"))?
        .unwrap_or(10_000.0);
    let context_length = meta.usize(&format!("{a}.context_length"))?;
    if heads == 0 || kv_heads == 0 || hidden % heads != 0 || heads % kv_heads != 0 {
        return Err(ModelError::Unsupported {
            message: format!(
                "{heads} heads, {kv_heads} kv heads, width {hidden}: heads must divide the \
                 width and kv heads must divide heads"
            ),
        });
    }
    let head_dim = hidden / heads;
    check_rope(meta, a, head_dim)?;
    let rope_style = options.rope_style.unwrap_or(match architecture {
        Architecture::Llama => RopeStyle::AdjacentPairs,
        Architecture::Qwen2 => RopeStyle::RotateHalves,
    });
    Ok(Config {
        architecture,
        layers,
        hidden,
        ffn,
        heads,
        kv_heads,
        head_dim,
        vocab_size: 0,
        rms_eps,
        rope_theta,
        rope_style,
        context_length,
        tied_embeddings: false,
    })
}

/// Refuses the rope variants the forward pass does not implement: partial rotation and scaling.
fn check_rope(meta: &Metadata, a: &str, head_dim: usize) -> Result<(), ModelError> {
    if let Some(rope_dims) = meta.opt_usize(&format!("{a}.rope.dimension_count"))? {
        if rope_dims != head_dim {
            return Err(ModelError::Unsupported {
                message: format!(
                    "partial rope ({rope_dims} of {head_dim} head dimensions rotated)"
                ),
            });
        }
    }
    if meta.0.contains_key(&format!("{a}.rope.scaling.type")) {
        let kind = meta.string(&format!("{a}.rope.scaling.type"))?;
        if kind != "none" {
            return Err(ModelError::Unsupported {
                message: format!("rope scaling `{kind}`"),
            });
        }
    }
    Ok(())
}

/// Reads named tensors from an open GGUF file.
struct TensorReader<'a> {
    content: &'a Content,
    reader: BufReader<File>,
    path: &'a Path,
    /// [`LoadOptions::requantize_to_q8_0`].
    requantize_to_q8_0: bool,
    /// [`LoadOptions::kernel`].
    kernel: MatmulKernel,
}

impl TensorReader<'_> {
    /// The tensor `name` as stored.
    fn read(&mut self, name: &str) -> Result<QTensor, ModelError> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(ModelError::MissingTensor {
                name: name.to_string(),
            });
        }
        self.content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| ModelError::Gguf {
                path: self.path.to_path_buf(),
                message: format!("tensor `{name}`: {e}"),
            })
    }

    /// A weight matrix, re-quantized to Q8_0 when the options ask for it and its format has
    /// only a scalar dot product in candle.
    fn matrix(&mut self, name: &str) -> Result<QTensor, ModelError> {
        let t = self.read(name)?;
        let scalar_only = matches!(
            t.dtype(),
            GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
        );
        // Q8Rows re-quantizes from the stored values itself: no Q8_0 round trip first.
        if !self.requantize_to_q8_0 || !scalar_only || self.kernel == MatmulKernel::Q8Rows {
            return Ok(t);
        }
        let dense = t.dequantize(&Device::Cpu).ctx("dequantizing for Q8_0")?;
        QTensor::quantize(&dense, GgmlDType::Q8_0).ctx("re-quantizing to Q8_0")
    }

    /// `t` in the form the kernel reads.
    fn wrap(&self, t: QTensor) -> Result<Matrix, ModelError> {
        match self.kernel {
            MatmulKernel::Candle => Ok(Matrix::Candle(
                QMatMul::from_qtensor(t).ctx("wrapping a quantized weight")?,
            )),
            MatmulKernel::Q8Rows | MatmulKernel::Auto => Ok(Matrix::Q8(cpu_q8(&t)?)),
        }
    }

    /// Block `i`'s linear layer `name`, with its bias when `bias`.
    fn linear(&mut self, i: usize, name: &str, bias: bool) -> Result<Linear, ModelError> {
        let weight = self.matrix(&format!("blk.{i}.{name}.weight"))?;
        let weight = self.wrap(weight)?;
        let bias = if bias {
            Some(dequantize(self.read(&format!("blk.{i}.{name}.bias"))?)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// Transformer block `i` (q/k/v biases when `has_bias`).
    fn block(&mut self, i: usize, has_bias: bool) -> Result<Block, ModelError> {
        let q = self.linear(i, "attn_q", has_bias)?;
        let k = self.linear(i, "attn_k", has_bias)?;
        let v = self.linear(i, "attn_v", has_bias)?;
        let o = self.linear(i, "attn_output", false)?;
        let gate = self.linear(i, "ffn_gate", false)?;
        let up = self.linear(i, "ffn_up", false)?;
        let down = self.linear(i, "ffn_down", false)?;
        let attn_norm = dequantize(self.read(&format!("blk.{i}.attn_norm.weight"))?)?;
        let ffn_norm = dequantize(self.read(&format!("blk.{i}.ffn_norm.weight"))?)?;
        Ok(Block {
            attn_norm,
            q,
            k,
            v,
            o,
            ffn_norm,
            gate,
            up,
            down,
        })
    }
}

/// `t` (`[out_features, in_features]`) as a [`CpuQ8Matrix`]: Q8_0 blocks are repacked as stored
/// (the f16 scale widened to f32, lossless), other formats dequantized and re-quantized.
fn cpu_q8(t: &QTensor) -> Result<CpuQ8Matrix, ModelError> {
    let (n, k) = t.shape().dims2().ctx("reading a matrix shape")?;
    if t.dtype() != GgmlDType::Q8_0 {
        let dense = t.dequantize(&Device::Cpu).ctx("dequantizing for Q8_0")?;
        // Read the values in place: a copy of Qwen 1.5B's matrices is 6 GB of fresh pages.
        let (storage, layout) = dense.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            let values = cpu.as_slice::<f32>().ctx("reading dequantized values")?;
            return Ok(CpuQ8Matrix::quantize(&values[start..end], n, k));
        }
        drop(storage);
        let values = dense
            .flatten_all()
            .and_then(|d| d.to_vec1::<f32>())
            .ctx("reading dequantized values")?;
        return Ok(CpuQ8Matrix::quantize(&values, n, k));
    }
    // ggml's block_q8_0: an f16 scale, then 32 int8 values.
    const BLOCK_BYTES: usize = 2 + Q8_BLOCK;
    let data = t.data().ctx("reading Q8_0 blocks")?;
    let blocks = k / Q8_BLOCK;
    if data.len() != n * blocks * BLOCK_BYTES {
        return Err(ModelError::Unsupported {
            message: format!("a {n}×{k} Q8_0 matrix of {} bytes", data.len()),
        });
    }
    // Straight into the kernel's layout, in parallel: no intermediate copy of the matrix.
    let data: &[u8] = &data;
    Ok(CpuQ8Matrix::pack(n, k, |r, b| {
        let block = &data[(r * blocks + b) * BLOCK_BYTES..][..BLOCK_BYTES];
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        (d, std::array::from_fn(|c| block[2 + c] as i8))
    }))
}

fn dequantize(t: QTensor) -> Result<Tensor, ModelError> {
    t.dequantize(&Device::Cpu)
        .ctx("dequantizing a norm weight or bias")
}

/// Typed access to the metadata map with errors that name the key.
struct Metadata<'a>(&'a HashMap<String, Value>);

impl<'a> Metadata<'a> {
    fn get(&self, key: &str) -> Result<&'a Value, ModelError> {
        self.0.get(key).ok_or_else(|| ModelError::Metadata {
            key: key.to_string(),
            message: "missing".to_string(),
        })
    }

    fn string(&self, key: &str) -> Result<&'a str, ModelError> {
        self.get(key)?
            .to_string()
            .map(|s| s.as_str())
            .map_err(|e| wrong_type(key, e))
    }

    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        as_usize(key, self.get(key)?)
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        self.0.get(key).map(|v| as_usize(key, v)).transpose()
    }

    fn f64(&self, key: &str) -> Result<f64, ModelError> {
        as_f64(key, self.get(key)?)
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.0.get(key).map(|v| as_f64(key, v)).transpose()
    }
}

fn wrong_type(key: &str, e: candle_core::Error) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        message: e.to_string(),
    }
}

/// GGUF writers disagree on integer widths (u32 here, u64 there), so accept any integer.
pub(crate) fn as_usize(key: &str, v: &Value) -> Result<usize, ModelError> {
    let n: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        other => {
            return Err(ModelError::Metadata {
                key: key.to_string(),
                message: format!("expected an integer, found {:?}", other.value_type()),
            })
        }
    };
    usize::try_from(n).map_err(|_| ModelError::Metadata {
        key: key.to_string(),
        message: format!("{n} is not a valid size"),
    })
}

fn as_f64(key: &str, v: &Value) -> Result<f64, ModelError> {
    match v {
        Value::F32(x) => Ok((*x).into()),
        Value::F64(x) => Ok(*x),
        other => as_usize(key, other).map(|n| n as f64),
    }
}

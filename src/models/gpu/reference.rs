//! The GPU forward pass computed on the host in f64 over the same Q8_0 weights: the reference
//! the kernels are tested against. It shares the kernels' inputs exactly (weights, rope angles,
//! epsilon) and their one deliberate rounding, the 8-bit blocks every matmul input is quantized
//! to (`shaders/model_common.wgsl`), and none of their f32 arithmetic, so the gap to the GPU
//! measures that arithmetic alone. (A value lying within f32 rounding of a quantization step's
//! midpoint can round to the neighbouring step on one side and not the other; the tests'
//! tolerance covers those rare flips.)

use super::weights::{HostModel, Q8Matrix};
use crate::models::RopeStyle;

/// `y[n] = Σ_k W[n, k] · x[k]` in f64.
fn matvec(w: &Q8Matrix, x: &[f64]) -> Vec<f64> {
    (0..w.rows)
        .map(|n| (0..w.cols).map(|k| f64::from(w.get(n, k)) * x[k]).sum())
        .collect()
}

/// `x` through the 8-bit activation blocks the matmul reads: per 32 values, `d = max|v| / 127`
/// and `q = round(v / d)` (ties to even), all in f32 as on the GPU; returns `q · d`.
fn q8_round(x: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for block in x.chunks(32) {
        let v: Vec<f32> = block.iter().map(|&v| v as f32).collect();
        let amax = v.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(
            v.iter()
                .map(|v| f64::from((v * id).round_ties_even().clamp(-127.0, 127.0)) * f64::from(d)),
        );
    }
    out
}

fn rms_norm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = (ms + eps).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, w)| v / r * f64::from(*w))
        .collect()
}

/// Rotates every head of `x` in place for position `pos`.
fn rope(x: &mut [f64], head_dim: usize, pos: usize, theta: f64, style: RopeStyle) {
    let half = head_dim / 2;
    for head in x.chunks_mut(head_dim) {
        for i in 0..half {
            let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
            let (ia, ib) = match style {
                RopeStyle::AdjacentPairs => (2 * i, 2 * i + 1),
                RopeStyle::RotateHalves => (i, i + half),
            };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * angle.cos() - b * angle.sin();
            head[ib] = a * angle.sin() + b * angle.cos();
        }
    }
}

impl HostModel {
    /// Logits of every position of `tokens` (from an empty cache) through the first `layers`
    /// blocks, `[tokens.len() × vocab]`, computed in f64 and rounded to f32 at the end. Slow
    /// (scalar, every weight dequantized on the fly): for tests over a few positions.
    ///
    /// # Panics
    /// If `layers` exceeds the model's or a token is past the vocabulary.
    pub fn reference_forward(&self, tokens: &[u32], layers: usize) -> Vec<f32> {
        let c = &self.config;
        let hd = c.head_dim;
        let group = c.heads / c.kv_heads;
        let mut keys: Vec<Vec<Vec<f64>>> = vec![Vec::new(); layers];
        let mut values: Vec<Vec<Vec<f64>>> = vec![Vec::new(); layers];
        let mut out = Vec::with_capacity(tokens.len() * c.vocab_size);
        for (pos, &t) in tokens.iter().enumerate() {
            let mut x: Vec<f64> = (0..c.hidden)
                .map(|i| f64::from(self.embedding.get(t as usize, i)))
                .collect();
            for (l, b) in self.blocks[..layers].iter().enumerate() {
                let h = q8_round(&rms_norm(&x, &b.attn_norm, c.rms_eps));
                let mut q = matvec(&b.q, &h);
                let mut k = matvec(&b.k, &h);
                let mut v = matvec(&b.v, &h);
                if let Some([bq, bk, bv]) = &b.bias {
                    for (y, bias) in [(&mut q, bq), (&mut k, bk), (&mut v, bv)] {
                        y.iter_mut()
                            .zip(bias)
                            .for_each(|(y, b)| *y += f64::from(*b));
                    }
                }
                rope(&mut q, hd, pos, c.rope_theta, c.rope_style);
                rope(&mut k, hd, pos, c.rope_theta, c.rope_style);
                keys[l].push(k);
                values[l].push(v);
                let mut att = vec![0f64; c.heads * hd];
                for head in 0..c.heads {
                    let kvh = head / group;
                    let qh = &q[head * hd..(head + 1) * hd];
                    let scores: Vec<f64> = keys[l]
                        .iter()
                        .map(|k| {
                            let kh = &k[kvh * hd..(kvh + 1) * hd];
                            qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for (j, v) in values[l].iter().enumerate() {
                        for d in 0..hd {
                            att[head * hd + d] += e[j] / total * v[kvh * hd + d];
                        }
                    }
                }
                let o = matvec(&b.o, &q8_round(&att));
                x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
                let h = q8_round(&rms_norm(&x, &b.ffn_norm, c.rms_eps));
                let gate = matvec(&b.gate, &h);
                let up = matvec(&b.up, &h);
                let act: Vec<f64> = gate
                    .iter()
                    .zip(&up)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let down = matvec(&b.down, &q8_round(&act));
                x.iter_mut().zip(&down).for_each(|(x, d)| *x += d);
            }
            let h = q8_round(&rms_norm(&x, &self.output_norm, c.rms_eps));
            let head = self.head.as_ref().unwrap_or(&self.embedding);
            out.extend(matvec(head, &h).into_iter().map(|v| v as f32));
        }
        out
    }
}

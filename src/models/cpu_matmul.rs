//! A CPU matmul over Q8_0 weights whose cost grows little with the number of rows, so that a
//! verifier's `k + 1` rows cost little more than one.
//!
//! Decoding one token streams every weight once and does 1 multiply-add per weight: on a CPU
//! core reading ~25 GB/s that is memory-bound, *if* the dot products keep up. Scoring `k + 1`
//! rows reads the same weights, so it should cost about the same; what grows is arithmetic. The
//! kernel here makes that arithmetic cheap enough to hide behind the weight stream:
//!
//! - **Weight-stationary tiles.** Output features are taken 16 at a time (one 512-bit vector of
//!   lanes); for each 32-weight block the tile's 16 × 32 weight bytes are loaded once into
//!   registers and used by every row of the call (up to [`ROW_TILE`] rows at a time).
//! - **Integer dot products, one float step per block.** Activations are quantized per row to
//!   8 bits with one scale per 32 values, as the weights are. A block's 32 products are summed
//!   exactly in i32 (AVX-512 VNNI: four products per lane per instruction), then added to the
//!   f32 accumulator once: `acc = fma(f32(isum), w_scale · a_scale, acc)`.
//! - **Offset-binary weights.** `vpdpbusd` multiplies unsigned by signed bytes, so weights are
//!   stored as `w + 128` and each row's block sum is corrected by `−128 · Σa` (exact in i32).
//!
//! Every output value is computed by that one sequence of operations, block after block, whatever
//! the row count, the row's place in the call, the thread count or the instruction set: the
//! portable path does the same integer sum and the same fused multiply-add per block, so a row's
//! result is the same bits alone, with others, with or without AVX-512 (tests/cpu_matmul.rs).
//! That is what lets speculative greedy decoding equal plain greedy decoding on the CPU.
//!
//! Why not candle-core's quantized matmul (0.11.1), which the models used before: on the
//! project's AVX-512 CPU its Q8_0 kernel costs ~4.4× a 1-row call for 5 rows (docs/models.md),
//! because it runs each (row, column) dot product on its own, and its 1-row call reads the
//! weights at about a quarter of the core's bandwidth. The measured comparison is in
//! `docs/models.md`.
//!
//! The SIMD path needs x86-64 with AVX-512F and AVX-512 VNNI (AMD Zen 4 and later, Intel server
//! parts since Ice Lake); elsewhere the portable path runs, same bits, slower.

use rayon::prelude::*;

use super::gpu::{Q8Matrix, Q8_BLOCK};

/// Output features per tile: one 512-bit vector of i32 or f32 lanes.
pub const TILE_LANES: usize = 16;
/// Rows whose accumulators a tile keeps in registers at once; more rows run in further passes
/// over the tile's weights (from cache).
pub const ROW_TILE: usize = 8;
/// 4-byte groups per block: one `vpdpbusd` step each.
const STEPS: usize = Q8_BLOCK / 4;
/// Weight bytes of one tile's block.
const TILE_BLOCK_BYTES: usize = TILE_LANES * Q8_BLOCK;
/// Tiles per parallel task: enough work to amortise a task, few enough to balance two threads.
const TILES_PER_TASK: usize = 4;
/// Tile-blocks × rows below which a call runs on the calling thread: ~16 k of them take ~80 µs
/// on one core, well above the cost of handing work to the pool and waiting for it.
const PARALLEL_WORK: usize = 16_384;

/// Which instructions [`CpuQ8Matrix::matmul_with`] uses. Both give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuKernel {
    /// AVX-512 VNNI where the CPU has it, else [`CpuKernel::Portable`].
    Auto,
    /// Plain Rust: the same integer sums and fused multiply-adds, one lane at a time.
    Portable,
}

impl CpuKernel {
    /// Whether [`CpuKernel::Auto`] runs the AVX-512 VNNI path on this CPU.
    pub fn simd_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

/// A `[out_features × in_features]` matrix in Q8_0 blocks, repacked for [`CpuQ8Matrix::matmul`]:
/// 1.125 bytes per weight (an int8 per weight, an f32 scale per 32), as on the GPU.
///
/// ```text
/// tile t = output features 16t .. 16t + 15 (zero-padded past out_features),
/// block b = input features 32b .. 32b + 31 (zero-padded past in_features):
///   quants[((t·blocks + b)·8 + s)·64 + lane·4 + j] = w[16t + lane][32b + 4s + j] + 128  (u8)
///   scales[(t·blocks + b)·16 + lane]               = scale of that block of that feature
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CpuQ8Matrix {
    out_features: usize,
    in_features: usize,
    blocks: usize,
    tiles: usize,
    quants: Vec<u8>,
    scales: Vec<f32>,
}

impl CpuQ8Matrix {
    /// Repacks a Q8_0 matrix (`rows` output features of `cols` inputs). Lossless.
    pub fn from_q8(m: &Q8Matrix) -> CpuQ8Matrix {
        let blocks = m.cols / Q8_BLOCK;
        Self::pack(m.rows, m.cols, |r, b| {
            let e0 = r * m.cols + b * Q8_BLOCK;
            let q =
                std::array::from_fn(|c| (m.qs[(e0 + c) / 4] >> (8 * ((e0 + c) % 4))) as u8 as i8);
            (m.scales[r * blocks + b], q)
        })
    }

    /// Quantizes row-major f32 values (`out_features` rows of `in_features`) block by block as
    /// [`Q8Matrix::quantize`] does; a last partial block is zero-padded, so any width works.
    ///
    /// # Panics
    /// If `values.len() != out_features · in_features`.
    pub fn quantize(values: &[f32], out_features: usize, in_features: usize) -> CpuQ8Matrix {
        assert_eq!(
            values.len(),
            out_features * in_features,
            "values of a {out_features}×{in_features} matrix"
        );
        Self::pack(out_features, in_features, |r, b| {
            let row = &values[r * in_features..(r + 1) * in_features];
            let src = &row[b * Q8_BLOCK..in_features.min((b + 1) * Q8_BLOCK)];
            let mut block = [0f32; Q8_BLOCK];
            block[..src.len()].copy_from_slice(src);
            quantize_block(&block)
        })
    }

    /// Lays weights out as the type's docs say, tiles in parallel; `block(r, b)` is the scale
    /// and the 32 int8 values of feature `r`'s block `b` (the loader reads GGUF's Q8_0 blocks
    /// through this).
    pub(crate) fn pack(
        out_features: usize,
        in_features: usize,
        block: impl Fn(usize, usize) -> (f32, [i8; Q8_BLOCK]) + Sync,
    ) -> CpuQ8Matrix {
        let blocks = in_features.div_ceil(Q8_BLOCK);
        let tiles = out_features.div_ceil(TILE_LANES);
        let mut quants = vec![128u8; tiles * blocks * TILE_BLOCK_BYTES];
        let mut scales = vec![0f32; tiles * blocks * TILE_LANES];
        quants
            .par_chunks_mut((blocks * TILE_BLOCK_BYTES).max(1))
            .zip(scales.par_chunks_mut((blocks * TILE_LANES).max(1)))
            .enumerate()
            .for_each(|(t, (quants, scales))| {
                let features = t * TILE_LANES..out_features.min((t + 1) * TILE_LANES);
                for (lane, r) in features.enumerate() {
                    for b in 0..blocks {
                        let (d, q) = block(r, b);
                        scales[b * TILE_LANES + lane] = d;
                        for (c, &v) in q.iter().enumerate() {
                            let at = b * TILE_BLOCK_BYTES + (c / 4) * 4 * TILE_LANES + lane * 4;
                            quants[at + c % 4] = (v as u8) ^ 0x80;
                        }
                    }
                }
            });
        CpuQ8Matrix {
            out_features,
            in_features,
            blocks,
            tiles,
            quants,
            scales,
        }
    }

    /// Output features (rows of the weight, columns of the result).
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Input features (the width of each input row).
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Bytes held (quants and scales).
    pub fn bytes(&self) -> usize {
        self.quants.len() + 4 * self.scales.len()
    }

    /// Weight `(r, c)` as the kernel sees it: its int8 times its block's scale.
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let (t, lane, b, k) = (r / TILE_LANES, r % TILE_LANES, c / Q8_BLOCK, c % Q8_BLOCK);
        let tb = t * self.blocks + b;
        let at = tb * TILE_BLOCK_BYTES + (k / 4) * 4 * TILE_LANES + lane * 4 + k % 4;
        f32::from((self.quants[at] ^ 0x80) as i8) * self.scales[tb * TILE_LANES + lane]
    }

    /// `x · wᵀ` for `rows` input rows, row-major `[rows × in_features]` in,
    /// `[rows × out_features]` out, with the fastest kernel this CPU has.
    ///
    /// # Panics
    /// If `x.len() != rows · in_features`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(x, rows, CpuKernel::Auto)
    }

    /// [`CpuQ8Matrix::matmul`] with a chosen kernel (for tests and measurements: the result is
    /// the same bits either way).
    ///
    /// # Panics
    /// If `x.len() != rows · in_features`.
    pub fn matmul_with(&self, x: &[f32], rows: usize, kernel: CpuKernel) -> Vec<f32> {
        assert_eq!(
            x.len(),
            rows * self.in_features,
            "{rows} rows of {} inputs",
            self.in_features
        );
        if rows == 0 {
            return Vec::new();
        }
        let a = QuantRows::new(x, rows, self.in_features, self.blocks);
        let simd = kernel == CpuKernel::Auto && CpuKernel::simd_available();
        // Tile-major scratch so that parallel tasks own disjoint slices; transposed below.
        let per_tile = rows * TILE_LANES;
        let mut scratch = vec![0f32; self.tiles * per_tile];
        let task = |(task, out): (usize, &mut [f32])| {
            for (i, tile_out) in out.chunks_exact_mut(per_tile).enumerate() {
                self.tile(task * TILES_PER_TASK + i, &a, tile_out, simd);
            }
        };
        // Handing a call to rayon's pool costs the caller a sleep and a wake-up (~10 µs, measured
        // as 15 % of a 1-thread SmolLM2 forward): small calls and 1-thread pools run here.
        let work = self.tiles * self.blocks * rows;
        if rayon::current_num_threads() > 1 && work >= PARALLEL_WORK {
            scratch
                .par_chunks_mut(per_tile * TILES_PER_TASK)
                .enumerate()
                .for_each(task);
        } else {
            scratch
                .chunks_mut(per_tile * TILES_PER_TASK)
                .enumerate()
                .for_each(task);
        }
        let n = self.out_features;
        let mut y = vec![0f32; rows * n];
        for t in 0..self.tiles {
            let lanes = TILE_LANES.min(n - t * TILE_LANES);
            for r in 0..rows {
                let src = &scratch[t * per_tile + r * TILE_LANES..][..lanes];
                y[r * n + t * TILE_LANES..][..lanes].copy_from_slice(src);
            }
        }
        y
    }

    /// Tile `t` for every row: `out[r·16 + lane]`.
    fn tile(&self, t: usize, a: &QuantRows, out: &mut [f32], simd: bool) {
        let w =
            &self.quants[t * self.blocks * TILE_BLOCK_BYTES..][..self.blocks * TILE_BLOCK_BYTES];
        let s = &self.scales[t * self.blocks * TILE_LANES..][..self.blocks * TILE_LANES];
        let mut r0 = 0;
        while r0 < a.rows {
            let n = (a.rows - r0).min(ROW_TILE);
            let out = &mut out[r0 * TILE_LANES..][..n * TILE_LANES];
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: `simd` is true only when `simd_available()` saw AVX-512F and VNNI.
                unsafe { avx512::tile(w, s, a, r0, n, out) };
                r0 += n;
                continue;
            }
            let _ = simd;
            portable_tile(w, s, a, r0, n, out);
            r0 += n;
        }
    }
}

/// Input rows quantized to 8 bits per value and one f32 scale per 32 (zero-padded to whole
/// blocks), the way [`Q8Matrix::quantize`] quantizes weights.
struct QuantRows {
    rows: usize,
    blocks: usize,
    /// `[rows][blocks·8]`: four int8 values per i32, little end first.
    q: Vec<i32>,
    /// `[rows][blocks]` scales.
    d: Vec<f32>,
    /// `[rows][blocks]`: `−128 · Σ q` over the block, the offset-binary correction.
    corr: Vec<i32>,
}

impl QuantRows {
    fn new(x: &[f32], rows: usize, width: usize, blocks: usize) -> QuantRows {
        let mut q = Vec::with_capacity(rows * blocks * STEPS);
        let mut d = Vec::with_capacity(rows * blocks);
        let mut corr = Vec::with_capacity(rows * blocks);
        let mut block = [0f32; Q8_BLOCK];
        for row in x.chunks_exact(width.max(1)).take(rows) {
            for b in 0..blocks {
                let src = &row[b * Q8_BLOCK..row.len().min((b + 1) * Q8_BLOCK)];
                block.fill(0.0);
                block[..src.len()].copy_from_slice(src);
                let (scale, qs) = quantize_block(&block);
                let mut sum = 0i32;
                for four in qs.chunks_exact(4) {
                    let mut word = 0u32;
                    for (j, &qv) in four.iter().enumerate() {
                        sum += i32::from(qv);
                        word |= u32::from(qv as u8) << (8 * j);
                    }
                    q.push(word as i32);
                }
                d.push(scale);
                corr.push(-128 * sum);
            }
        }
        QuantRows {
            rows,
            blocks,
            q,
            d,
            corr,
        }
    }
}

/// ggml's `quantize_row_q8_0` rule for one block, with the scale kept f32: `d = max|x| / 127`,
/// `q = round(x / d)` (halves away from zero), as [`Q8Matrix::quantize`] does.
fn quantize_block(block: &[f32; Q8_BLOCK]) -> (f32, [i8; Q8_BLOCK]) {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; Q8_BLOCK];
    for (q, &v) in q.iter_mut().zip(block) {
        *q = round_half_away(v * inv) as i8;
    }
    (d, q)
}

/// `x.round()` for `|x| < 2³¹` (NaN gives 0, as `NaN.round() as i8` does), without the libm call
/// that `f32::round` compiles to on baseline x86-64 (it made loading Qwen 1.5B take ~17 s).
/// Exact: the truncation is exact below 2³¹ and `x − trunc(x)` is exact in f32.
fn round_half_away(x: f32) -> i32 {
    let t = x as i32;
    let frac = x - t as f32;
    // Without branches: the fractions of weights are random, so a branch mispredicts often.
    t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

#[cfg(test)]
mod tests {
    use super::round_half_away;

    #[test]
    fn rounding_equals_f32_round_at_and_around_every_half() {
        for k in -600..=600 {
            let half = k as f32 / 2.0;
            for x in [
                half,
                half.next_up(),
                half.next_down(),
                half + 0.25,
                half - 0.25,
            ] {
                assert_eq!(round_half_away(x), x.round() as i32, "{x:e}");
            }
        }
        assert_eq!(round_half_away(f32::NAN) as i8, f32::NAN.round() as i8);
    }
}

/// One tile for rows `r0 .. r0 + n`, one lane at a time: the reference the SIMD path equals.
fn portable_tile(w: &[u8], s: &[f32], a: &QuantRows, r0: usize, n: usize, out: &mut [f32]) {
    for (i, out) in out.chunks_exact_mut(TILE_LANES).take(n).enumerate() {
        let r = r0 + i;
        let mut acc = [0f32; TILE_LANES];
        for b in 0..a.blocks {
            let qa = &a.q[(r * a.blocks + b) * STEPS..][..STEPS];
            let (da, corr) = (a.d[r * a.blocks + b], a.corr[r * a.blocks + b]);
            let wb = &w[b * TILE_BLOCK_BYTES..][..TILE_BLOCK_BYTES];
            for (lane, acc) in acc.iter_mut().enumerate() {
                let mut isum = corr;
                for (step, word) in qa.iter().enumerate() {
                    let av = word.to_le_bytes();
                    let wv = &wb[step * 4 * TILE_LANES + lane * 4..][..4];
                    for j in 0..4 {
                        isum += i32::from(wv[j]) * i32::from(av[j] as i8);
                    }
                }
                let scale = s[b * TILE_LANES + lane] * da;
                *acc = (isum as f32).mul_add(scale, *acc);
            }
        }
        out.copy_from_slice(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{QuantRows, ROW_TILE, STEPS, TILE_BLOCK_BYTES, TILE_LANES};

    /// One tile for rows `r0 .. r0 + n` (`1 ≤ n ≤ ROW_TILE`), the row count a compile-time
    /// constant so that the accumulators stay in registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn tile(
        w: &[u8],
        s: &[f32],
        a: &QuantRows,
        r0: usize,
        n: usize,
        out: &mut [f32],
    ) {
        match n {
            1 => rows::<1>(w, s, a, r0, out),
            2 => rows::<2>(w, s, a, r0, out),
            3 => rows::<3>(w, s, a, r0, out),
            4 => rows::<4>(w, s, a, r0, out),
            5 => rows::<5>(w, s, a, r0, out),
            6 => rows::<6>(w, s, a, r0, out),
            7 => rows::<7>(w, s, a, r0, out),
            _ => rows::<ROW_TILE>(w, s, a, r0, out),
        }
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    #[inline]
    unsafe fn rows<const R: usize>(w: &[u8], s: &[f32], a: &QuantRows, r0: usize, out: &mut [f32]) {
        let blocks = a.blocks;
        assert!(w.len() >= blocks * TILE_BLOCK_BYTES && s.len() >= blocks * TILE_LANES);
        assert!(a.q.len() >= (r0 + R) * blocks * STEPS && out.len() >= R * TILE_LANES);
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            // SAFETY (all loads): the asserts above bound every offset below.
            let wp = w.as_ptr().add(b * TILE_BLOCK_BYTES);
            let wv: [__m512i; STEPS] =
                std::array::from_fn(|step| _mm512_loadu_si512(wp.add(step * 64).cast()));
            let sw = _mm512_loadu_ps(s.as_ptr().add(b * TILE_LANES));
            for (i, acc) in acc.iter_mut().enumerate() {
                let rb = (r0 + i) * blocks + b;
                let qa = a.q.as_ptr().add(rb * STEPS);
                // Independent chains where rows are few: a `vpdpbusd` waits ~4 cycles for its
                // accumulator, which bounded a 1-row call; with 4 or more rows the rows overlap
                // and extra chains only add instructions. Integer sums: the order is free.
                let chains = if R >= 4 {
                    1
                } else if R >= 2 {
                    2
                } else {
                    4
                };
                let mut part = [_mm512_setzero_si512(); 4];
                part[0] = _mm512_set1_epi32(*a.corr.get_unchecked(rb));
                for (step, wv) in wv.iter().enumerate() {
                    let av = _mm512_set1_epi32(*qa.add(step));
                    let c = step % chains;
                    part[c] = _mm512_dpbusd_epi32(part[c], *wv, av);
                }
                let mut isum = part[0];
                for p in &part[1..chains] {
                    isum = _mm512_add_epi32(isum, *p);
                }
                let scale = _mm512_mul_ps(sw, _mm512_set1_ps(*a.d.get_unchecked(rb)));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, *acc);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(i * TILE_LANES), *acc);
        }
    }
}

// matmul_q8: Y[m, n] (+)= Σ_k X[m, k] · W[n, k] (+ bias[n]) for the rows m < rows of a chunk and
// the output rows n of one Q8_0 weight part, weight-stationary: each workgroup reads ROWS_PER_WG
// weight rows once and applies every block it reads to all M ≤ 16 input rows.
//
// Both operands are 8-bit: the weights in Q8_0 blocks, the input rows quantized by the kernel
// that wrote them (rmsnorm, attention, swiglu) to the same form, 32 int8 and one f32 scale per
// block. A block's dot product is then 8 packed 4×8-bit integer dot products (exact, so their
// order does not matter), scaled once: f32(Σ q_w · q_x) · d_w · d_x. This is the arithmetic
// of llama.cpp's GPU backends and of candle's CPU Q8_0 kernels; per weight it costs a quarter of
// an instruction for any number of input rows, where f32 inputs cost an unpack and a multiply
// per row, and an 8-bit row is a quarter of the bytes to read per block.
//
// Layouts (see src/models/gpu/weights.rs and sequence.rs):
//   qs, scales:  weights, u32[rows · K / 4] (4 int8 per word, little end first) and
//                f32[rows · K / 32]
//   xq, xd:      input rows the same way, row m's element e at word (in_offset + m · K + e) / 4
//
// Workgroup: ROWS_PER_WG output rows × LANES lanes (override constants, set per device). Lane l
// of row n handles the blocks b ≡ l mod LANES in increasing b and adds each block's value to its
// accumulator; after one barrier, one lane per input row adds the LANES partial sums in lane
// order. The order depends on K and LANES alone, never on M or on the part, so a row's output
// is the same bits whether it is computed alone or with 15 others (speculative greedy == plain
// greedy).
//
// Specialisations (override constants, one pipeline each): HAS_BIAS adds bias[row_base + n]
// after the sum (Qwen2's q/k/v); RESIDUAL adds the sum to what Y holds (the residual stream).
// Output element (m, n): out_offset + m · out_stride + row_base + n.

override HAS_BIAS: bool = false;
// The input rows inside the block loop, each with an accumulator in a named register (true: a
// weight block is read once for all rows), or the block loop inside a loop over the rows with
// one accumulator (false: the block is read again per row, from cache; lavapipe runs all 16
// guarded sums of the named form, so CPU adapters use this). Both add the same terms in the same
// order with one program for every row count, so rows scored together equal rows scored alone.
override UNROLLED: bool = false;
override RESIDUAL: bool = false;

// Lanes per output row and output rows per workgroup; LANES · ROWS_PER_WG = WG ≤ 256.
override LANES: u32 = 32u;
override ROWS_PER_WG: u32 = 8u;
override WG: u32 = 256u;
const MAX_M: u32 = 16u;

@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> xd: array<f32>;

var<workgroup> partial: array<f32, 4096>; // WG · MAX_M

// One block: its 32 int8 as two vec4<u32>, and its scale.
struct Block {
    lo: vec4<u32>,
    hi: vec4<u32>,
    d: f32,
}

fn weight_block(n: u32, blocks: u32, b: u32) -> Block {
    let at = n * blocks + b;
    return Block(qs[2u * at], qs[2u * at + 1u], scales[at]);
}

// Block xb of the input (a block index counted from word 0 of xq).
fn input_block(xb: u32) -> Block {
    return Block(xq[2u * xb], xq[2u * xb + 1u], xd[xb]);
}

// The value of one block pair: the exact integer dot product, scaled.
fn block_dot(w: Block, x: Block) -> f32 {
    let s = dot4I8Packed(w.lo.x, x.lo.x) + dot4I8Packed(w.lo.y, x.lo.y)
        + dot4I8Packed(w.lo.z, x.lo.z) + dot4I8Packed(w.lo.w, x.lo.w)
        + dot4I8Packed(w.hi.x, x.hi.x) + dot4I8Packed(w.hi.y, x.hi.y)
        + dot4I8Packed(w.hi.z, x.hi.z) + dot4I8Packed(w.hi.w, x.hi.w);
    return f32(s) * w.d * x.d;
}

// Row m's block b, m counted within the chunk: its block index in xq.
fn xblock(m: u32, blocks: u32, b: u32) -> u32 {
    return P.in_offset / 32u + m * blocks + b;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let lane = li % LANES;
    let r = li / LANES;
    let n = group_index(wid, nwg) * ROWS_PER_WG + r;
    let blocks = P.width / 32u;
    let rows = min(P.rows, MAX_M);
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    var a4 = 0.0;
    var a5 = 0.0;
    var a6 = 0.0;
    var a7 = 0.0;
    var a8 = 0.0;
    var a9 = 0.0;
    var a10 = 0.0;
    var a11 = 0.0;
    var a12 = 0.0;
    var a13 = 0.0;
    var a14 = 0.0;
    var a15 = 0.0;
    if (UNROLLED && n < P.out_rows) {
        for (var b = lane; b < blocks; b += LANES) {
            let w = weight_block(n, blocks, b);
            let x0 = xblock(0u, blocks, b);
            if (rows > 0u) { a0 = a0 + block_dot(w, input_block(x0)); }
            if (rows > 1u) { a1 = a1 + block_dot(w, input_block(x0 + 1u * blocks)); }
            if (rows > 2u) { a2 = a2 + block_dot(w, input_block(x0 + 2u * blocks)); }
            if (rows > 3u) { a3 = a3 + block_dot(w, input_block(x0 + 3u * blocks)); }
            if (rows > 4u) { a4 = a4 + block_dot(w, input_block(x0 + 4u * blocks)); }
            if (rows > 5u) { a5 = a5 + block_dot(w, input_block(x0 + 5u * blocks)); }
            if (rows > 6u) { a6 = a6 + block_dot(w, input_block(x0 + 6u * blocks)); }
            if (rows > 7u) { a7 = a7 + block_dot(w, input_block(x0 + 7u * blocks)); }
            if (rows > 8u) { a8 = a8 + block_dot(w, input_block(x0 + 8u * blocks)); }
            if (rows > 9u) { a9 = a9 + block_dot(w, input_block(x0 + 9u * blocks)); }
            if (rows > 10u) { a10 = a10 + block_dot(w, input_block(x0 + 10u * blocks)); }
            if (rows > 11u) { a11 = a11 + block_dot(w, input_block(x0 + 11u * blocks)); }
            if (rows > 12u) { a12 = a12 + block_dot(w, input_block(x0 + 12u * blocks)); }
            if (rows > 13u) { a13 = a13 + block_dot(w, input_block(x0 + 13u * blocks)); }
            if (rows > 14u) { a14 = a14 + block_dot(w, input_block(x0 + 14u * blocks)); }
            if (rows > 15u) { a15 = a15 + block_dot(w, input_block(x0 + 15u * blocks)); }
        }
    }
    let mine = (r * LANES + lane) * MAX_M;
    if (UNROLLED) {
        if (rows > 0u) { partial[mine + 0u] = a0; }
        if (rows > 1u) { partial[mine + 1u] = a1; }
        if (rows > 2u) { partial[mine + 2u] = a2; }
        if (rows > 3u) { partial[mine + 3u] = a3; }
        if (rows > 4u) { partial[mine + 4u] = a4; }
        if (rows > 5u) { partial[mine + 5u] = a5; }
        if (rows > 6u) { partial[mine + 6u] = a6; }
        if (rows > 7u) { partial[mine + 7u] = a7; }
        if (rows > 8u) { partial[mine + 8u] = a8; }
        if (rows > 9u) { partial[mine + 9u] = a9; }
        if (rows > 10u) { partial[mine + 10u] = a10; }
        if (rows > 11u) { partial[mine + 11u] = a11; }
        if (rows > 12u) { partial[mine + 12u] = a12; }
        if (rows > 13u) { partial[mine + 13u] = a13; }
        if (rows > 14u) { partial[mine + 14u] = a14; }
        if (rows > 15u) { partial[mine + 15u] = a15; }
    } else if (n < P.out_rows) {
        // One input row at a time with one accumulator in a register: an array indexed by the
        // row lives in local memory on GPUs.
        for (var m = 0u; m < rows; m++) {
            var a = 0.0;
            for (var b = lane; b < blocks; b += LANES) {
                a = a + block_dot(weight_block(n, blocks, b), input_block(xblock(m, blocks, b)));
            }
            partial[mine + m] = a;
        }
    }
    workgroupBarrier();
    // Lane j sums the LANES partials of input rows j, j + LANES, … in lane order: the same
    // serial order as one lane summing them all, with the rows' sums running side by side.
    let base = r * LANES * MAX_M;
    if (n < P.out_rows) {
        for (var m = lane; m < rows; m += LANES) {
            var v = partial[base + m];
            for (var l = 1u; l < LANES; l++) {
                v = v + partial[base + l * MAX_M + m];
            }
            if (HAS_BIAS) {
                v = v + bias[P.row_base + n];
            }
            let at = P.out_offset + m * P.out_stride + P.row_base + n;
            if (RESIDUAL) {
                y[at] = y[at] + v;
            } else {
                y[at] = v;
            }
        }
    }
}

// matmul_q8: Y[m, n] (+)= Σ_k X[m, k] · W[n, k] (+ bias[n]) for the rows m < rows of a chunk and
// the output rows n of one Q8_0 weight part, weight-stationary: each workgroup reads ROWS_PER_WG
// weight rows once and applies every block it reads to all M ≤ 16 input rows.
//
// Q8_0 part layout (see src/models/gpu/weights.rs):
//   qs:     u32[rows · K / 4]   4 int8 per word, little end first
//   scales: f32[rows · K / 32]  one per block of 32 consecutive elements of a row
//
// Workgroup: ROWS_PER_WG output rows × LANES lanes (override constants, set per device). Lane l
// of row n handles the blocks b ≡ l mod LANES in increasing b: a block's sum is
// Σ_{j<8} dot(q_j, x_j) in increasing j, times the block's scale, added to the lane's
// accumulator; after one barrier, one lane per input row adds the LANES partial sums in lane
// order. The order depends on K and LANES alone, never on M or on the part, so a row's output
// is the same bits whether it is computed alone or with 15 others (speculative greedy == plain
// greedy).
//
// Specialisations (override constants, one pipeline each): HAS_BIAS adds bias[row_base + n]
// after the sum (Qwen2's q/k/v); RESIDUAL adds the sum to what Y holds (the residual stream).
// Output element (m, n): out_offset + m · out_stride + row_base + n.

override HAS_BIAS: bool = false;
// Accumulators in 16 named variables (true) or one register per input row, the rows one after
// another (false, default; lavapipe runs all 16 guarded sums of the named form: 4.6× slower at
// one row). Both add the same terms in the same order, and either is one program for every row
// count, so rows scored together equal rows scored alone in both.
override UNROLLED: bool = false;
override RESIDUAL: bool = false;

// Lanes per output row and output rows per workgroup; LANES · ROWS_PER_WG = WG ≤ 256.
override LANES: u32 = 32u;
override ROWS_PER_WG: u32 = 8u;
override WG: u32 = 256u;
const MAX_M: u32 = 16u;

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

var<workgroup> partial: array<f32, 4096>; // WG · MAX_M

// The 4 int8 of a word, little end first, as f32.
fn unpack(w: u32) -> vec4<f32> {
    return vec4<f32>(
        f32(bitcast<i32>(w << 24u) >> 24u),
        f32(bitcast<i32>(w << 16u) >> 24u),
        f32(bitcast<i32>(w << 8u) >> 24u),
        f32(bitcast<i32>(w) >> 24u),
    );
}

// One block of 32 weights, unpacked.
struct Block {
    q0: vec4<f32>,
    q1: vec4<f32>,
    q2: vec4<f32>,
    q3: vec4<f32>,
    q4: vec4<f32>,
    q5: vec4<f32>,
    q6: vec4<f32>,
    q7: vec4<f32>,
}

// Σ_{j<8} dot(q_j, x[xb + j]) in increasing j.
fn block_sum(w: Block, xb: u32) -> f32 {
    var s = dot(w.q0, x[xb]);
    s = s + dot(w.q1, x[xb + 1u]);
    s = s + dot(w.q2, x[xb + 2u]);
    s = s + dot(w.q3, x[xb + 3u]);
    s = s + dot(w.q4, x[xb + 4u]);
    s = s + dot(w.q5, x[xb + 5u]);
    s = s + dot(w.q6, x[xb + 6u]);
    s = s + dot(w.q7, x[xb + 7u]);
    return s;
}

// Block b of weight row n (K = k, blocks per row = blocks) applied to the x words from xb on,
// times the block's scale: the same terms, in the same order, as the named-accumulator path.
fn block_row(n: u32, k: u32, blocks: u32, b: u32, xb: u32) -> f32 {
    let at = (n * k + b * 32u) / 16u;
    let lo = qs[at];
    let hi = qs[at + 1u];
    let w = Block(
        unpack(lo.x), unpack(lo.y), unpack(lo.z), unpack(lo.w),
        unpack(hi.x), unpack(hi.y), unpack(hi.z), unpack(hi.w),
    );
    return block_sum(w, xb) * scales[n * blocks + b];
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
    let k = P.width;
    let k4 = k / 4u;
    let blocks = k / 32u;
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
            // A block is 32 bytes, two aligned vec4<u32>.
            let at = (n * k + b * 32u) / 16u;
            let lo = qs[at];
            let hi = qs[at + 1u];
            let w = Block(
                unpack(lo.x), unpack(lo.y), unpack(lo.z), unpack(lo.w),
                unpack(hi.x), unpack(hi.y), unpack(hi.z), unpack(hi.w),
            );
            let d = scales[n * blocks + b];
            let xb = (P.in_offset + b * 32u) / 4u;
            if (rows > 0u) { a0 = a0 + block_sum(w, xb + 0u * k4) * d; }
            if (rows > 1u) { a1 = a1 + block_sum(w, xb + 1u * k4) * d; }
            if (rows > 2u) { a2 = a2 + block_sum(w, xb + 2u * k4) * d; }
            if (rows > 3u) { a3 = a3 + block_sum(w, xb + 3u * k4) * d; }
            if (rows > 4u) { a4 = a4 + block_sum(w, xb + 4u * k4) * d; }
            if (rows > 5u) { a5 = a5 + block_sum(w, xb + 5u * k4) * d; }
            if (rows > 6u) { a6 = a6 + block_sum(w, xb + 6u * k4) * d; }
            if (rows > 7u) { a7 = a7 + block_sum(w, xb + 7u * k4) * d; }
            if (rows > 8u) { a8 = a8 + block_sum(w, xb + 8u * k4) * d; }
            if (rows > 9u) { a9 = a9 + block_sum(w, xb + 9u * k4) * d; }
            if (rows > 10u) { a10 = a10 + block_sum(w, xb + 10u * k4) * d; }
            if (rows > 11u) { a11 = a11 + block_sum(w, xb + 11u * k4) * d; }
            if (rows > 12u) { a12 = a12 + block_sum(w, xb + 12u * k4) * d; }
            if (rows > 13u) { a13 = a13 + block_sum(w, xb + 13u * k4) * d; }
            if (rows > 14u) { a14 = a14 + block_sum(w, xb + 14u * k4) * d; }
            if (rows > 15u) { a15 = a15 + block_sum(w, xb + 15u * k4) * d; }
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
        // row lives in local memory on GPUs. The weight block is read again for each row, from
        // cache: the workgroup's ROWS_PER_WG weight rows are at most a few tens of KB.
        for (var m = 0u; m < rows; m++) {
            var a = 0.0;
            for (var b = lane; b < blocks; b += LANES) {
                a = a + block_row(n, k, blocks, b, (P.in_offset + b * 32u) / 4u + m * k4);
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

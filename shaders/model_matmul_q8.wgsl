// matmul_q8: Y[m, n] (+)= Σ_k X[m, k] · W[n, k] (+ bias[n]) for the rows m < rows of a chunk and
// the output rows n of one Q8_0 weight part, weight-stationary: each workgroup reads 4 weight
// rows once and applies every block it reads to all M ≤ 16 input rows.
//
// Q8_0 part layout (see src/models/gpu/weights.rs):
//   qs:     u32[rows · K / 4]   4 int8 per word, little end first
//   scales: f32[rows · K / 32]  one per block of 32 consecutive elements of a row
//
// Workgroup: ROWS_PER_WG output rows × LANES lanes (override constants, set per device). Lane l
// of row n handles the blocks b ≡ l mod LANES in increasing b: a block's sum is
// Σ_{j<8} dot(q_j, x_j) in increasing j, times the block's scale, added to the lane's
// accumulator; after one barrier, lane 0 adds the LANES partial sums in lane order. The order
// depends on K and LANES alone, never on M or on the part, so a row's output is the same bits
// whether it is computed alone or with 15 others (speculative greedy == plain greedy).
//
// Specialisations (override constants, one pipeline each): HAS_BIAS adds bias[row_base + n]
// after the sum (Qwen2's q/k/v); RESIDUAL adds the sum to what Y holds (the residual stream).
// Output element (m, n): out_offset + m · out_stride + row_base + n.

override HAS_BIAS: bool = false;
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
    let blocks = k / 32u;
    let rows = min(P.rows, MAX_M);
    var acc: array<f32, MAX_M>;
    if (n < P.out_rows) {
        for (var b = lane; b < blocks; b += LANES) {
            // A block is 32 bytes, two aligned vec4<u32>.
            let w = (n * k + b * 32u) / 16u;
            let lo = qs[w];
            let hi = qs[w + 1u];
            let q0 = unpack(lo.x);
            let q1 = unpack(lo.y);
            let q2 = unpack(lo.z);
            let q3 = unpack(lo.w);
            let q4 = unpack(hi.x);
            let q5 = unpack(hi.y);
            let q6 = unpack(hi.z);
            let q7 = unpack(hi.w);
            let d = scales[n * blocks + b];
            for (var m = 0u; m < rows; m++) {
                let xb = (P.in_offset + m * k + b * 32u) / 4u;
                var s = dot(q0, x[xb]);
                s = s + dot(q1, x[xb + 1u]);
                s = s + dot(q2, x[xb + 2u]);
                s = s + dot(q3, x[xb + 3u]);
                s = s + dot(q4, x[xb + 4u]);
                s = s + dot(q5, x[xb + 5u]);
                s = s + dot(q6, x[xb + 6u]);
                s = s + dot(q7, x[xb + 7u]);
                acc[m] = acc[m] + s * d;
            }
        }
    }
    let mine = (r * LANES + lane) * MAX_M;
    for (var m = 0u; m < rows; m++) {
        partial[mine + m] = acc[m];
    }
    workgroupBarrier();
    if (lane == 0u && n < P.out_rows) {
        for (var m = 0u; m < rows; m++) {
            var v = partial[mine + m];
            for (var l = 1u; l < LANES; l++) {
                v = v + partial[mine + l * MAX_M + m];
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

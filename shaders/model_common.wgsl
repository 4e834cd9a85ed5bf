// Declarations shared by the model kernels (model_*.wgsl); prefixed to each of them, since WGSL
// has no includes.
//
// `Params` mirrors `ModelParams` in src/models/gpu/kernels.rs field for field (20 words, 80
// bytes). One struct serves every model kernel; each reads the fields it needs, the rest are 0.
// Offsets and strides count f32 elements, not bytes.
struct Params {
    // Activation rows (positions) of this chunk: M ≤ 16.
    rows: u32,
    // Input width: K of a matmul, the hidden width of embed / rmsnorm, the element count of swiglu.
    width: u32,
    // Output rows of this weight part (matmul, embed).
    out_rows: u32,
    // First weight row of this part in the whole matrix.
    row_base: u32,
    // Element offset of input row 0 (matmul: a multiple of 4).
    in_offset: u32,
    // Element offset of output row 0.
    out_offset: u32,
    // Elements between consecutive output rows.
    out_stride: u32,
    // Sequence position of row 0.
    pos: u32,
    // Query heads (rope: the heads of the rotated buffer).
    heads: u32,
    // Key/value heads.
    kv_heads: u32,
    // Width of one head.
    head_dim: u32,
    // Elements between the score rows of the attention scratch.
    scratch_stride: u32,
    // Index of this chunk's first token in the token buffer.
    token_base: u32,
    // Rope pairing: 0 adjacent pairs (x[2i], x[2i+1]), 1 rotate halves (x[i], x[i + d/2]).
    style: u32,
    // RMSNorm epsilon.
    eps: f32,
    // Attention score scale 1/sqrt(head_dim).
    scale: f32,
    // Tree calls (rope, attention): the word offset in the token buffer of the call's tree table
    // (per call row r: its depth at 2r, its parent row at 2r + 1, 0xffffffff below the cache);
    // 0 for a chain call. kv_keep: the path's word offset.
    tree: u32,
    // Unused; the block is a multiple of 16 bytes.
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

// The linear index of this workgroup in a 2-D grid (dispatches wider than
// max_compute_workgroups_per_dimension spill into y).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// 8-bit activation blocks, the input form of matmul_q8: 32 consecutive values of a row as int8
// q = round(v / d) (ties to even), packed 4 to a word, little end first, and one f32 scale
// d = max |v| / 127 per block (0 for an all-zero block). The host reference
// (src/models/gpu/reference.rs) rounds the same way.

// (d, 1/d) of a block whose largest magnitude is `amax`.
fn q8_scale(amax: f32) -> vec2<f32> {
    let d = amax / 127.0;
    return vec2<f32>(d, select(0.0, 1.0 / d, d > 0.0));
}

// Four values as one word of int8, little end first.
fn q8_word(v: vec4<f32>, id: f32) -> u32 {
    let q = vec4<i32>(clamp(round(v * id), vec4<f32>(-127.0), vec4<f32>(127.0)));
    return (u32(q.x) & 0xffu) | ((u32(q.y) & 0xffu) << 8u) | ((u32(q.z) & 0xffu) << 16u)
        | ((u32(q.w) & 0xffu) << 24u);
}

fn max4(v: vec4<f32>) -> f32 {
    let a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}

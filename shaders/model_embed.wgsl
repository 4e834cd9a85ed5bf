// embed: X[m, i] = dequantized row tokens[token_base + m] of the Q8_0 embedding table, for the
// tokens whose row lies in this part (rows row_base .. row_base + out_rows); a table split into
// several buffers is one dispatch per part.
//
// Q8_0 part layout (see src/models/gpu/weights.rs):
//   qs:     u32[rows · width / 4]   4 int8 per word, little end first: element e of row r is byte
//                                   e % 4 of word (r · width + e) / 4
//   scales: f32[rows · width / 32]  one per block of 32 consecutive elements of a row
// value = f32(int8) · scale.

@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> qs: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let m = gid.y;
    if (i >= P.width || m >= P.rows) {
        return;
    }
    let token = tokens[P.token_base + m];
    if (token < P.row_base || token >= P.row_base + P.out_rows) {
        return;
    }
    let e = (token - P.row_base) * P.width + i;
    let word = qs[e / 4u];
    let shift = (e % 4u) * 8u;
    let q = bitcast<i32>(word << (24u - shift)) >> 24u;
    x[P.out_offset + m * P.out_stride + i] = f32(q) * scales[e / 32u];
}

// rope: rotates each pair (a, b) of every head of rows 0..rows of a buffer in place:
// (a, b) ← (a·cos − b·sin, a·sin + b·cos) with (cos, sin) of angle (pos + m) · θ^(−2i/d),
// precomputed on the host in f64 and rounded once (table[p · d/2 + i] = (cos, sin)), as the CPU
// forward does. style 0 pairs (x[2i], x[2i+1]), style 1 pairs (x[i], x[i + d/2]).
// Row m's head h starts at out_offset + m · out_stride + h · head_dim.

@group(0) @binding(1) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = P.head_dim / 2u;
    let idx = gid.x;
    if (idx >= P.rows * P.heads * half) {
        return;
    }
    let i = idx % half;
    let h = (idx / half) % P.heads;
    let m = idx / (half * P.heads);
    let cs = table[(P.pos + m) * half + i];
    let base = P.out_offset + m * P.out_stride + h * P.head_dim;
    var ia = base + i;
    var ib = base + i + half;
    if (P.style == 0u) {
        ia = base + 2u * i;
        ib = ia + 1u;
    }
    let a = x[ia];
    let b = x[ib];
    x[ia] = a * cs.x - b * cs.y;
    x[ib] = a * cs.y + b * cs.x;
}

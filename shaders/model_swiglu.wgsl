// swiglu: A[m, i] = silu(G[m, i]) · U[m, i], silu(g) = g / (1 + exp(−g)), for the rows · width
// elements of a chunk (width = ffn). Gate and up come from one matmul over the stacked matrix:
//   GU: f32[rows, 2 · width]   row m = G[m, 0..width] then U[m, 0..width]

@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.y * nwg.x * 64u + gid.x;
    if (e >= P.rows * P.width) {
        return;
    }
    let m = e / P.width;
    let i = e % P.width;
    let v = gu[m * 2u * P.width + i];
    a[e] = v / (1.0 + exp(-v)) * gu[m * 2u * P.width + P.width + i];
}

// swiglu: A[m, i] = silu(G[m, i]) · U[m, i], silu(g) = g / (1 + exp(−g)), for the rows · width
// elements of a chunk (width = ffn, a multiple of 32), written as 8-bit blocks
// (model_common.wgsl), the input form of matmul_q8. One invocation per word of 4 elements; the 8
// invocations of a block share its largest magnitude through workgroup memory. Gate and up come
// from one matmul over the stacked matrix:
//   GU: f32[rows, 2 · width]   row m = G[m, 0..width] then U[m, 0..width]

@group(0) @binding(1) var<storage, read> gu: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> aq: array<u32>;
@group(0) @binding(3) var<storage, read_write> ad: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let e = group_index(wid, nwg) * 64u + li;
    let words = P.width / 4u;
    let live = e < P.rows * words;
    var v = vec4<f32>(0.0);
    if (live) {
        let m = e / words;
        let i = e % words;
        let g = gu[m * 2u * words + i];
        v = g / (1.0 + exp(-g)) * gu[m * 2u * words + words + i];
    }
    red[li] = max4(v);
    workgroupBarrier();
    let gb = li & ~7u;
    var amax = red[gb];
    for (var j = 1u; j < 8u; j++) {
        amax = max(amax, red[gb + j]);
    }
    let sc = q8_scale(amax);
    if (live) {
        aq[e] = q8_word(v, sc.y);
        if ((e & 7u) == 0u) {
            ad[e / 8u] = sc.x;
        }
    }
}

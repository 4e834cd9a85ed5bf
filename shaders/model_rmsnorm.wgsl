// rmsnorm: Y[m, i] = X[m, i] / sqrt(mean_i(X[m, i]²) + eps) · w[i], one workgroup per row, the
// result written as 8-bit blocks (model_common.wgsl), the input form of matmul_q8. The sum of
// squares has a fixed order (thread t sums the words i ≡ t mod 256 in increasing i, then a fixed
// tree over the 256 threads), so a row's result does not depend on the other rows of the call.
// Needs width % 32 == 0 (whole blocks) and in_offset % 4 == 0.

const WG: u32 = 256u;

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> yq: array<u32>;
@group(0) @binding(4) var<storage, read_write> yd: array<f32>;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let m = wid.x;
    let words = P.width / 4u;
    let base = P.in_offset / 4u + m * words;
    var s = 0.0;
    for (var i = li; i < words; i += WG) {
        let v = x[base + i];
        s += dot(v, v);
    }
    red[li] = s;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        if (li < half) {
            red[li] += red[li + half];
        }
        workgroupBarrier();
    }
    let r = sqrt(red[0] / f32(P.width) + P.eps);
    workgroupBarrier();
    let out = (P.out_offset + m * P.out_stride) / 4u;
    // Words in steps of the workgroup (a multiple of 8, so a block's 8 words share a step).
    for (var at = 0u; at < words; at += WG) {
        let i = at + li;
        var v = vec4<f32>(0.0);
        if (i < words) {
            v = x[base + i] / r * w[i];
        }
        red[li] = max4(v);
        workgroupBarrier();
        let g = li & ~7u;
        var amax = red[g];
        for (var j = 1u; j < 8u; j++) {
            amax = max(amax, red[g + j]);
        }
        let sc = q8_scale(amax);
        if (i < words) {
            yq[out + i] = q8_word(v, sc.y);
            if ((i & 7u) == 0u) {
                yd[(out + i) / 8u] = sc.x;
            }
        }
        workgroupBarrier();
    }
}

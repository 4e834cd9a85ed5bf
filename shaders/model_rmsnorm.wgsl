// rmsnorm: Y[m, i] = X[m, i] / sqrt(mean_i(X[m, i]²) + eps) · w[i], one workgroup per row.
// The sum of squares has a fixed order (thread t sums i ≡ t mod 64 in increasing i, then a fixed
// tree over the 64 threads), so a row's result does not depend on the other rows of the call.

const WG: u32 = 64u;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let m = wid.x;
    let base = P.in_offset + m * P.width;
    var s = 0.0;
    for (var i = li; i < P.width; i += WG) {
        let v = x[base + i];
        s += v * v;
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
    let out = P.out_offset + m * P.out_stride;
    for (var i = li; i < P.width; i += WG) {
        y[out + i] = x[base + i] / r * w[i];
    }
}

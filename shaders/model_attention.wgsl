// attention: causal grouped-query attention of query rows 0..rows (positions pos + m) against
// the key/value cache, one workgroup per (head, row); the output written as 8-bit blocks
// (model_common.wgsl), the input form of matmul_q8.
//
//   Q:       f32[rows, heads · head_dim]          (roped)
//   K, V:    f32[capacity, kv_heads · head_dim]   position-major cache of one layer (K roped)
//   scratch: f32[rows · heads, scratch_stride]    the scores, then their exponentials
//   O:       8-bit blocks of [rows, heads · head_dim]
//
// Query head h reads kv head h / (heads / kv_heads). For position p = pos + m:
//   s_j = (q · k_j) · scale, j = 0..=p;  e_j = exp(s_j − max s);  o = (Σ_j e_j · v_j) / Σ e.
// Every sum has a fixed order that depends on p and the head shape alone, so a row's output is
// the same bits whatever other rows share the call: q · k_j over the head's words in increasing
// order; Σ e over j ≡ t mod 256 per thread t, then a fixed tree; o per column word c over the
// j ≡ s mod S of each of the S = 256 / (head_dim / 4) slices, then the slices in order.
// Needs head_dim % 32 == 0 and head_dim ≤ 512.
//
// Decoding scores a few rows against a short cache, so a workgroup's time is the latency of its
// dependent loads, not bandwidth: the loops load four terms ahead and add them in order (the
// same order as one at a time), and 256 threads cover 256 positions, or 8 slices of positions
// for a head of 128, at once.

const WG: u32 = 256u;

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(5) var<storage, read_write> oq: array<u32>;
@group(0) @binding(6) var<storage, read_write> od: array<f32>;

var<workgroup> red: array<f32, WG>;
var<workgroup> qh: array<vec4<f32>, 128>;
var<workgroup> acc: array<vec4<f32>, WG>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let m = wid.y;
    let hw = P.head_dim / 4u;
    let p = P.pos + m;
    let kvh = h / (P.heads / P.kv_heads);
    let kvw = P.kv_heads * hw;
    let qb = (m * P.heads + h) * hw;
    let sb = (m * P.heads + h) * P.scratch_stride;
    if (li < hw) {
        qh[li] = q[qb + li];
    }
    workgroupBarrier();

    var mx = bitcast<f32>(0xff800000u);
    for (var j = li; j <= p; j += WG) {
        let kb = j * kvw + kvh * hw;
        var s = 0.0;
        // hw is a multiple of 8.
        for (var d = 0u; d < hw; d += 4u) {
            let k0 = kc[kb + d];
            let k1 = kc[kb + d + 1u];
            let k2 = kc[kb + d + 2u];
            let k3 = kc[kb + d + 3u];
            s += dot(qh[d], k0);
            s += dot(qh[d + 1u], k1);
            s += dot(qh[d + 2u], k2);
            s += dot(qh[d + 3u], k3);
        }
        s = s * P.scale;
        scratch[sb + j] = s;
        mx = max(mx, s);
    }
    red[li] = mx;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        if (li < half) {
            red[li] = max(red[li], red[li + half]);
        }
        workgroupBarrier();
    }
    let top = red[0];
    workgroupBarrier();

    var sum = 0.0;
    for (var j = li; j <= p; j += WG) {
        let e = exp(scratch[sb + j] - top);
        scratch[sb + j] = e;
        sum += e;
    }
    red[li] = sum;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        if (li < half) {
            red[li] += red[li + half];
        }
        workgroupBarrier();
    }
    let total = red[0];
    // The exponentials were written by other threads of this workgroup.
    storageBarrier();

    let slices = WG / hw;
    let c = li % hw;
    let slice = li / hw;
    var a = vec4<f32>(0.0);
    if (slice < slices) {
        let vb = kvh * hw + c;
        var j = slice;
        for (; j + 3u * slices <= p; j += 4u * slices) {
            let e0 = scratch[sb + j];
            let e1 = scratch[sb + j + slices];
            let e2 = scratch[sb + j + 2u * slices];
            let e3 = scratch[sb + j + 3u * slices];
            let v0 = vc[j * kvw + vb];
            let v1 = vc[(j + slices) * kvw + vb];
            let v2 = vc[(j + 2u * slices) * kvw + vb];
            let v3 = vc[(j + 3u * slices) * kvw + vb];
            a += e0 * v0;
            a += e1 * v1;
            a += e2 * v2;
            a += e3 * v3;
        }
        for (; j <= p; j += slices) {
            a += scratch[sb + j] * vc[j * kvw + vb];
        }
    }
    acc[li] = a;
    workgroupBarrier();
    var o = vec4<f32>(0.0);
    if (li < hw) {
        o = acc[li];
        for (var s = 1u; s < slices; s++) {
            o += acc[s * hw + li];
        }
        o = o / total;
        red[li] = max4(o);
    }
    workgroupBarrier();
    if (li < hw) {
        let g = li & ~7u;
        var amax = red[g];
        for (var j = 1u; j < 8u; j++) {
            amax = max(amax, red[g + j]);
        }
        let sc = q8_scale(amax);
        let word = qb + li;
        oq[word] = q8_word(o, sc.y);
        if ((li & 7u) == 0u) {
            od[word / 8u] = sc.x;
        }
    }
}

// attention: causal grouped-query attention of query rows 0..rows (positions pos + m) against
// the key/value cache, one workgroup per (head, row).
//
//   Q:       f32[rows, heads · head_dim]          (roped)
//   K, V:    f32[capacity, kv_heads · head_dim]   position-major cache of one layer (K roped)
//   scratch: f32[rows · heads, scratch_stride]    the scores, then their exponentials
//   O:       f32[rows, heads · head_dim]
//
// Query head h reads kv head h / (heads / kv_heads). For position p = pos + m:
//   s_j = (q · k_j) · scale, j = 0..=p;  e_j = exp(s_j − max s);  o = Σ_j (e_j / Σ e) · v_j.
// Every sum has a fixed order that depends on p alone (dot products in increasing d; partial
// sums of thread t over j ≡ t mod 64, then a fixed tree; o in increasing j), so a row's output is
// the same bits whatever other rows share the call.

const WG: u32 = 64u;

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<f32>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let m = wid.y;
    let hd = P.head_dim;
    let p = P.pos + m;
    let kvh = h / (P.heads / P.kv_heads);
    let kvdim = P.kv_heads * hd;
    let qb = m * P.heads * hd + h * hd;
    let sb = (m * P.heads + h) * P.scratch_stride;

    var mx = bitcast<f32>(0xff800000u);
    for (var j = li; j <= p; j += WG) {
        let kb = j * kvdim + kvh * hd;
        var s = 0.0;
        for (var d = 0u; d < hd; d++) {
            s += q[qb + d] * kc[kb + d];
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

    for (var d = li; d < hd; d += WG) {
        var acc = 0.0;
        for (var j = 0u; j <= p; j++) {
            acc += (scratch[sb + j] / total) * vc[j * kvdim + kvh * hd + d];
        }
        o[qb + d] = acc;
    }
}

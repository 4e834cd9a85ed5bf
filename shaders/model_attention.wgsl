// attention: causal grouped-query attention of query rows 0..rows (positions pos + m) against
// the key/value cache, one workgroup per (head, row); the output written as 8-bit blocks
// (model_common.wgsl), the input form of matmul_q8.
//
//   Q:       f32[rows, heads · head_dim]          (roped)
//   K, V:    f32[capacity, kv_heads · head_dim]   position-major cache of one layer (K roped)
//   scratch: f32[rows · heads, scratch_stride]    scores of positions ≥ SC_CAP
//   O:       8-bit blocks of [rows, heads · head_dim]
//
// Query head h reads kv head h / (heads / kv_heads). For position p = pos + m:
//   s_j = (q · k_j) · scale, j = 0..=p;  e_j = exp(s_j − max s);  o = (Σ_j e_j · v_j) / Σ e.
// Every sum has a fixed order that depends on p and the head shape alone, so a row's output is
// the same bits whatever other rows share the call: q · k_j over the head's words in increasing
// order; Σ e and the output column words over the j ≡ s mod S of each of the S = 256 / HW
// slices in increasing j, then the slices in order.
// Needs head_dim % 32 == 0 and head_dim ≤ 512.
//
// Tree calls (P.tree ≠ 0, `tab` the call's tree table, P.pos the cached length, P.token_base the
// chunk's first call row): row m is call row r = token_base + m at depth d, position p = pos + d,
// and its key j is cache slot j below pos, else the slot pos + a_(j − pos) of its ancestor at
// depth j − pos (a_d = r). Keys and values are then the same bits, at the same j, as a chain
// call over the path to r has, so the row is the same bits as that chain's.
//
// Decoding scores a few rows against a short cache, so a workgroup's time is the latency of its
// dependent loads and barriers, not bandwidth. The head width is a pipeline constant (HW), so
// the score loop over a head's words is unrolled and its loads issued together; the scores stay
// in workgroup memory (up to SC_CAP positions); the exponentials are taken in the value pass,
// which also sums them, so one reduction tree (the maximum) is left.

const WG: u32 = 256u;
// Words of 4 values in a head: head_dim / 4, set per model (src/models/gpu/kernels.rs).
override HW: u32 = 16u;
// Positions whose scores stay in workgroup memory; later ones go through `scratch`.
const SC_CAP: u32 = 2048u;

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(5) var<storage, read_write> oq: array<u32>;
@group(0) @binding(6) var<storage, read_write> od: array<f32>;
@group(0) @binding(7) var<storage, read> tab: array<u32>;

var<workgroup> red: array<f32, WG>;
var<workgroup> qh: array<vec4<f32>, 128>;
var<workgroup> acc: array<vec4<f32>, WG>;
var<workgroup> sc: array<f32, SC_CAP>;
var<workgroup> amax4: array<f32, 128>;
// A tree row's ancestors by depth (call rows), itself last: depth ≤ MAX_TREE_DEPTH (64) of
// src/models/gpu/sequence.rs. 16 KiB of workgroup memory is the WebGPU floor; this is within it.
var<workgroup> anc: array<u32, 65>;

// The cache slot of key j.
fn slot(j: u32) -> u32 {
    if (P.tree == 0u || j < P.pos) {
        return j;
    }
    return P.pos + anc[j - P.pos];
}

fn score(sb: u32, j: u32) -> f32 {
    if (j < SC_CAP) {
        return sc[j];
    }
    return scratch[sb + j];
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let m = wid.y;
    var p = P.pos + m;
    if (P.tree != 0u) {
        let r = P.token_base + m;
        let depth = tab[P.tree + 2u * r];
        p = P.pos + depth;
        if (li == 0u) {
            var a = r;
            for (var d = depth; d > 0u; d--) {
                anc[d] = a;
                a = tab[P.tree + 2u * a + 1u];
            }
            anc[0] = a;
        }
    }
    let kvh = h / (P.heads / P.kv_heads);
    let kvw = P.kv_heads * HW;
    let qb = (m * P.heads + h) * HW;
    let sb = (m * P.heads + h) * P.scratch_stride;
    if (li < HW) {
        qh[li] = q[qb + li];
    }
    workgroupBarrier();

    var mx = bitcast<f32>(0xff800000u);
    for (var j = li; j <= p; j += WG) {
        let kb = slot(j) * kvw + kvh * HW;
        var s = 0.0;
        // HW is a multiple of 8 and a constant: the loop unrolls.
        for (var d = 0u; d < HW; d += 4u) {
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
        if (j < SC_CAP) {
            sc[j] = s;
        } else {
            scratch[sb + j] = s;
        }
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
    // Everyone has read the maximum before `red` takes the slices' sums; the scores written by
    // other threads (workgroup memory and scratch) are visible after this.
    workgroupBarrier();
    storageBarrier();

    let slices = WG / HW;
    let c = li % HW;
    let slice = li / HW;
    var a = vec4<f32>(0.0);
    var es = 0.0;
    if (slice < slices) {
        let vb = kvh * HW + c;
        var j = slice;
        for (; j + 3u * slices <= p; j += 4u * slices) {
            let v0 = vc[slot(j) * kvw + vb];
            let v1 = vc[slot(j + slices) * kvw + vb];
            let v2 = vc[slot(j + 2u * slices) * kvw + vb];
            let v3 = vc[slot(j + 3u * slices) * kvw + vb];
            let e0 = exp(score(sb, j) - top);
            let e1 = exp(score(sb, j + slices) - top);
            let e2 = exp(score(sb, j + 2u * slices) - top);
            let e3 = exp(score(sb, j + 3u * slices) - top);
            a += e0 * v0;
            a += e1 * v1;
            a += e2 * v2;
            a += e3 * v3;
            es += e0;
            es += e1;
            es += e2;
            es += e3;
        }
        for (; j <= p; j += slices) {
            let e = exp(score(sb, j) - top);
            a += e * vc[slot(j) * kvw + vb];
            es += e;
        }
    }
    acc[li] = a;
    if (c == 0u && slice < slices) {
        red[slice] = es;
    }
    workgroupBarrier();
    var o = vec4<f32>(0.0);
    if (li < HW) {
        o = acc[li];
        var total = red[0];
        for (var s = 1u; s < slices; s++) {
            o += acc[s * HW + li];
            total += red[s];
        }
        o = o / total;
        amax4[li] = max4(o);
    }
    workgroupBarrier();
    if (li < HW) {
        let g = li & ~7u;
        var amax = amax4[g];
        for (var j = 1u; j < 8u; j++) {
            amax = max(amax, amax4[g + j]);
        }
        let sc8 = q8_scale(amax);
        let word = qb + li;
        oq[word] = q8_word(o, sc8.y);
        if ((li & 7u) == 0u) {
            od[word / 8u] = sc8.x;
        }
    }
}

// rope: splits the stacked q/k/v matmul output of rows 0..rows (positions pos + m) and rotates
// each pair (a, b) of every query and key head: (a, b) ← (a·cos − b·sin, a·sin + b·cos) with
// (cos, sin) of angle (pos + m) · θ^(−2i/d), precomputed on the host in f64 and rounded once
// (table[p · d/2 + i] = (cos, sin)), as the CPU forward does. style 0 pairs (x[2i], x[2i+1]),
// style 1 pairs (x[i], x[i + d/2]). The rotated queries go to Q, the rotated keys and the values
// to the layer's caches at their positions: one dispatch where a separate q, k and v matmul and
// two rope passes took five.
//
//   QKV:   f32[rows, (heads + 2 · kv_heads) · head_dim]   row m = q, then k, then v
//   Q:     f32[rows, heads · head_dim]
//   K, V:  f32[capacity, kv_heads · head_dim]             position-major
//
// One invocation per query pair, key pair, or pair of value elements.
//
// Tree calls (P.tree ≠ 0, see model_attention.wgsl): row m is call row r = token_base + m; it
// is rotated by the angle of position pos + depth(r) and cached at slot pos + r.

@group(0) @binding(1) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<f32>;
@group(0) @binding(5) var<storage, read_write> vc: array<f32>;
@group(0) @binding(6) var<storage, read> tab: array<u32>;

// Element offsets (a, b) of pair i of the head starting at `base`.
fn pair(base: u32, i: u32, half: u32) -> vec2<u32> {
    if (P.style == 0u) {
        return vec2<u32>(base + 2u * i, base + 2u * i + 1u);
    }
    return vec2<u32>(base + i, base + i + half);
}

fn rotate(ab: vec2<f32>, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(ab.x * cs.x - ab.y * cs.y, ab.x * cs.y + ab.y * cs.x);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let hd = P.head_dim;
    let half = hd / 2u;
    let qd = P.heads * hd;
    let kvd = P.kv_heads * hd;
    let q_pairs = P.heads * half;
    let kv_pairs = P.kv_heads * half;
    let per_row = q_pairs + 2u * kv_pairs;
    let idx = gid.y * nwg.x * 64u + gid.x;
    if (idx >= P.rows * per_row) {
        return;
    }
    let m = idx / per_row;
    let r = idx % per_row;
    let src = m * (qd + 2u * kvd);
    // The position (angle) and the cache slot of row m.
    var position = P.pos + m;
    var at = (P.pos + m) * kvd;
    if (P.tree != 0u) {
        let r = P.token_base + m;
        position = P.pos + tab[P.tree + 2u * r];
        at = (P.pos + r) * kvd;
    }
    if (r < q_pairs + kv_pairs) {
        let is_q = r < q_pairs;
        let r2 = select(r - q_pairs, r, is_q);
        let h = r2 / half;
        let i = r2 % half;
        let cs = table[position * half + i];
        let s = pair(select(src + qd, src, is_q) + h * hd, i, half);
        let o = rotate(vec2<f32>(qkv[s.x], qkv[s.y]), cs);
        if (is_q) {
            let d = pair(m * qd + h * hd, i, half);
            q[d.x] = o.x;
            q[d.y] = o.y;
        } else {
            let d = pair(at + h * hd, i, half);
            kc[d.x] = o.x;
            kc[d.y] = o.y;
        }
    } else {
        let e = 2u * (r - q_pairs - kv_pairs);
        vc[at + e] = qkv[src + qd + kvd + e];
        vc[at + e + 1u] = qkv[src + qd + kvd + e + 1u];
    }
}

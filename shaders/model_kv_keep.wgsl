// kv_keep: after a tree call, moves the cache entries of the accepted path down to consecutive
// slots: entry pos + path[d] → pos + d for d = 0..rows, in increasing d, of one layer's key and
// value caches (`path` from word P.tree of the token buffer).
//
//   K, V: f32[capacity, width]   position-major cache of one layer
//
// One invocation per element of a cache row; each moves its element of every path entry in
// order. A path is increasing with path[d] ≥ d, so a move's destination is never a later
// move's source, and one invocation's reads and writes of an element are ordered.

@group(0) @binding(1) var<storage, read> path: array<u32>;
@group(0) @binding(2) var<storage, read_write> kc: array<f32>;
@group(0) @binding(3) var<storage, read_write> vc: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= P.width) {
        return;
    }
    for (var d = 0u; d < P.rows; d++) {
        let src = P.pos + path[P.tree + d];
        let dst = P.pos + d;
        if (src != dst) {
            kc[dst * P.width + e] = kc[src * P.width + e];
            vc[dst * P.width + e] = vc[src * P.width + e];
        }
    }
}

// swiglu: A = silu(G) · U elementwise, silu(g) = g / (1 + exp(−g)), over rows · width elements.

@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> u: array<f32>;
@group(0) @binding(3) var<storage, read_write> a: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.y * nwg.x * 64u + gid.x;
    if (e >= P.rows * P.width) {
        return;
    }
    let v = g[e];
    a[e] = v / (1.0 + exp(-v)) * u[e];
}

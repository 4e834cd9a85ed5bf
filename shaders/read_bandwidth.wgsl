// read_bandwidth — the bandwidth ceiling the benchmark compares against: a read-only reduction
// with 16-byte loads and a grid-stride loop, nothing else. Pipeline label:
// specdec.read_bandwidth.main. Not used by verification.

@group(0) @binding(0) var<storage, read> data: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = arrayLength(&data);
    let stride = nwg.x * WG;
    var acc = vec4<f32>(0.0);
    for (var i = gid.x; i < n; i += stride) {
        acc += data[i];
    }
    let s = acc.x + acc.y + acc.z + acc.w;
    // A store the compiler cannot prove dead keeps every load alive; it (almost) never happens.
    if (s == 1234.5678) {
        sink[0] = s;
    }
}

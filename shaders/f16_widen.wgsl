// f16_widen — the host's check, once per device, that unpack2x16float widens binary16 exactly
// (src/gpu/probes.rs): invocation i unpacks the word holding halves 2i (low 16 bits) and 2i + 1
// (high) and writes the two f32 results' bits at 2i and 2i + 1, so the output holds the device's
// widening of all 65,536 binary16 values in bit order. The word is built at run time, as the
// kernels' words are loaded, so no compiler can fold the conversion.
@group(0) @binding(0) var<storage, read_write> widened: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let p = unpack2x16float(((2u * i + 1u) << 16u) | (2u * i));
    widened[2u * i] = bitcast<u32>(p.x);
    widened[2u * i + 1u] = bitcast<u32>(p.y);
}

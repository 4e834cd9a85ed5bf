// f16 widening of the variant `Variant::f16_unpack`: the device's conversion, found exact for all
// 65,536 binary16 values by the check run when the verifier was made (src/gpu/probes.rs). Needs
// wgpu's SHADER_F16_IN_F32 (naga's SHADER_FLOAT16_IN_FLOAT32), hence a text of its own: a module
// holding the call is refused where the device lacks it, even if the call is never taken.
const F16_UNPACK: bool = true;

// The two binary16 values of `word` (low 16 bits first) as f32.
fn unpack_f16x2(word: u32) -> vec2<f32> {
    return unpack2x16float(word);
}

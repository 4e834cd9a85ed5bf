// f16 widening of the portable variant: integer operations (common.wgsl f16_to_f32), exact on
// every device.
const F16_UNPACK: bool = false;

// The two binary16 values of `word` (low 16 bits first) as f32.
fn unpack_f16x2(word: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(word & 0xffffu), f16_to_f32(word >> 16u));
}

// mul_wide with 64-bit integers (devices with SHADER_INT64): both halves of the 32x32->64
// product from one wide multiply, e.g. a single IMAD.WIDE on NVIDIA, instead of four 16-bit
// products for the high half and a second multiply for the low half. Exact, so it gives the same
// words as mul_wide_u32.wgsl.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let p = u64(a) * u64(b);
    return vec2<u32>(u32(p), u32(p >> 32u));
}

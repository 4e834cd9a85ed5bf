// mulhi32 with 64-bit integers (devices with SHADER_INT64): one wide multiply, e.g. a single
// IMAD.WIDE on NVIDIA, instead of four 16-bit products. Exact, so it gives the same words as
// mulhi_u32.wgsl.
fn mulhi32(a: u32, b: u32) -> u32 {
    return u32((u64(a) * u64(b)) >> 32u);
}

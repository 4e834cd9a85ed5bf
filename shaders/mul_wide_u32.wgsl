// mul_wide without 64-bit integers (portable WGSL): the 32x32->64 product as (low, high) words,
// the high word assembled from 16-bit halves. Exact; used when the device lacks SHADER_INT64.
// Alternative: mul_wide_int64.wgsl.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a_lo = a & 0xffffu;
    let a_hi = a >> 16u;
    let b_lo = b & 0xffffu;
    let b_hi = b >> 16u;
    let ll = a_lo * b_lo;
    let lh = a_lo * b_hi;
    let hl = a_hi * b_lo;
    let hh = a_hi * b_hi;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return vec2<u32>(a * b, hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u));
}

//! CPU twin of `shaders/gather_rows.wgsl`: destination row `i` ← source row `indices[i]`, each
//! `row_len` values, copied bit for bit (as the kernel copies u32 words).

/// Copies `dst[i·row_len ..][..row_len] = src[indices[i]·row_len ..][..row_len]` for every `i`.
///
/// # Panics
/// If `dst` is not `indices.len() × row_len` long or an index points past the end of `src`
/// (the GPU entry point checks the same on the host and returns an error instead).
pub fn gather_rows(src: &[f32], dst: &mut [f32], indices: &[u32], row_len: usize) {
    assert_eq!(
        dst.len(),
        indices.len() * row_len,
        "gather_rows: dst must hold indices.len() × row_len values"
    );
    if row_len == 0 {
        return;
    }
    for (out, &i) in dst.chunks_exact_mut(row_len).zip(indices) {
        let from = i as usize * row_len;
        out.copy_from_slice(&src[from..from + row_len]);
    }
}

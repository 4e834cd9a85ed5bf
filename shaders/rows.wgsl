// rows — the bindings and loaders of the logit rows, shared by every kernel that reads them
// (cutoff, row_stats, block_mass, residual_argmax). `Kernel::source` prepends this file after
// common.wgsl; each kernel declares its other bindings (3 and up) itself. WGSL cannot pass a
// storage array to a function, so loaders need their bindings declared at module scope: declared
// once here, the four kernels read the rows exactly alike. `params` (binding 0, or immediate
// data) comes before this file: params_uniform.wgsl / params_immediate.wgsl.

// The window's target rows and draft rows (probabilities or logits), as 32-bit words: f32 values,
// or two f16 / bf16 values per word (see `widen`).
@group(0) @binding(1) var<storage, read> target_logits: array<u32>;
@group(0) @binding(2) var<storage, read> draft_values: array<u32>;

// PLAIN_F32: every row is f32, so loads are plain f32. Set in the cutoff, block_mass and
// residual_argmax pipelines of f32 batches, and in row_stats' when no request filters either
// (row_stats then skips the cut-off mask too). The dtype-dispatching loads cost row_stats 12-45 %,
// residual_argmax 4 % and top-p calls 5 % on an H200 even when unused (measured with `bench`),
// hence a specialisation.
override PLAIN_F32: bool = false;
// PLAIN_F16 / PLAIN_BF16 (row_stats only, at most one set): the target rows are f16 / bf16 and no
// request filters; the draft rows may be of any type (they keep the dtype-dispatching loads).
override PLAIN_F16: bool = false;
override PLAIN_BF16: bool = false;
// DRAFT_F32 (residual_argmax with PLAIN_F16 / PLAIN_BF16): the draft rows are f32 or absent, so
// their loads are plain too.
override DRAFT_F32: bool = false;

// Half value `i` (0 or 1: low or high 16 bits) of a word of target rows in the PLAIN_F16 /
// PLAIN_BF16 type, widened exactly: bf16 is the high half of an f32; binary16 goes through
// f16_of_word (the device's conversion where it is exact, else f16_to_f32).
fn plain_half(word: u32, i: u32) -> f32 {
    if (PLAIN_BF16) {
        return bitcast<f32>(select(word << 16u, word & 0xffff0000u, i != 0u));
    }
    return f16_of_word(word, i);
}

// Element i of the target / draft binding, whatever its element type.
fn t_elem(i: u32) -> f32 {
    if (PLAIN_F32) {
        return bitcast<f32>(target_logits[i]);
    }
    if (PLAIN_F16 || PLAIN_BF16) {
        return plain_half(target_logits[i >> 1u], i & 1u);
    }
    let half = params.flags & (PARAM_T_F16 | PARAM_T_BF16);
    return widen(target_logits[select(i, i >> 1u, half != 0u)], i, half);
}
fn d_elem(i: u32) -> f32 {
    if (PLAIN_F32 || DRAFT_F32) {
        return bitcast<f32>(draft_values[i]);
    }
    let half = (params.flags >> 2u) & (PARAM_T_F16 | PARAM_T_BF16);
    return widen(draft_values[select(i, i >> 1u, half != 0u)], i, half);
}

// Entries i .. i+3 of the target / draft binding, whatever their element type. Half rows at an
// even i take two 32-bit loads (two entries each) instead of four, with the type tested once:
// the small batches that read half rows this way are bound by their loads' latency.
fn t_elem4(i: u32) -> vec4<f32> {
    if (PLAIN_F16 || PLAIN_BF16) {
        if ((i & 1u) == 0u) {
            let w0 = target_logits[i >> 1u];
            let w1 = target_logits[(i >> 1u) + 1u];
            return vec4<f32>(plain_half(w0, 0u), plain_half(w0, 1u), plain_half(w1, 0u), plain_half(w1, 1u));
        }
    } else if (!PLAIN_F32) {
        let half = params.flags & (PARAM_T_F16 | PARAM_T_BF16);
        if (half != 0u && (i & 1u) == 0u) {
            let w0 = target_logits[i >> 1u];
            let w1 = target_logits[(i >> 1u) + 1u];
            return vec4<f32>(widen(w0, 0u, half), widen(w0, 1u, half), widen(w1, 0u, half), widen(w1, 1u, half));
        }
    }
    return vec4<f32>(t_elem(i), t_elem(i + 1u), t_elem(i + 2u), t_elem(i + 3u));
}
fn d_elem4(i: u32) -> vec4<f32> {
    if (!PLAIN_F32 && !DRAFT_F32) {
        let half = (params.flags >> 2u) & (PARAM_T_F16 | PARAM_T_BF16);
        if (half != 0u && (i & 1u) == 0u) {
            let w0 = draft_values[i >> 1u];
            let w1 = draft_values[(i >> 1u) + 1u];
            return vec4<f32>(widen(w0, 0u, half), widen(w0, 1u, half), widen(w1, 0u, half), widen(w1, 1u, half));
        }
    }
    return vec4<f32>(d_elem(i), d_elem(i + 1u), d_elem(i + 2u), d_elem(i + 3u));
}

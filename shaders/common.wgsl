// specdec — declarations shared by every kernel. This file is prepended to each kernel's source
// (WGSL has no includes); it declares no bindings, so every kernel still owns its own layout.
//
// Everything here has a Rust twin: `src/rng.rs` (Philox, uniforms, Exp(1) noise) and
// `src/layout.rs` (the structs, byte for byte). Change both together.

// ---------------------------------------------------------------------------------------------
// Packed layouts. Each struct is 16-byte aligned and made of 4-byte scalars so that the WGSL and
// the #[repr(C)] Rust layouts agree without hidden padding (a test checks this with naga).
// ---------------------------------------------------------------------------------------------

// Per-dispatch parameters, one 256-byte slot per dispatch (bound with a dynamic offset).
// A "window" is a range of target rows whose logits fit one storage binding.
struct Params {
    vocab: u32,          // V: columns of a target row
    draft_vocab: u32,    // columns of a draft row (== V for now)
    block_len: u32,      // vocabulary entries per residual_argmax workgroup (multiple of 4)
    num_blocks: u32,     // ceil(V / block_len): residual_argmax workgroups per request
    row_begin: u32,      // first global target row of this window
    row_count: u32,      // target rows in this window
    t_elem_base: u32,    // element index, in the target binding, of row_begin's first logit
    d_row_begin: u32,    // first global draft row of this window
    d_elem_base: u32,    // element index, in the draft binding, of d_row_begin's first value
    draft_kind: u32,     // DRAFT_NONE / DRAFT_PROBS / DRAFT_LOGITS
    req_begin: u32,      // first request overlapping this window
    req_count: u32,      // requests overlapping this window
    num_requests: u32,   // R, whole batch
    out_stride: u32,     // K_max + 1
    total_rows: u32,     // Σ (k_r + 1)
    num_chunks: u32,     // ceil(V / CHUNK): statistics partials per row
    block_chunks: u32,   // chunks each row_stats workgroup reduces (tuning only, never changes results)
    stats_blocks: u32,   // row_stats workgroups per row = ceil(num_chunks / block_chunks)
    flags: u32,          // PARAM_* bits of this window
    cut_slice: u32,      // row entries per cutoff scan workgroup (tuning only, never changes results)
    cut_list: u32,       // words of a cutoff slot's list of top-p candidates (tuning only)
    settle_base: u32,    // block_wide_settle: the word of the output buffer where its partials start
    _pad1: u32,
    _pad2: u32,
}

// Params::flags: rows of this window start on 16-byte boundaries (V a multiple of a vec4's
// elements, 4 f32 or 8 halves, and aligned bases), so the statistics pass may use the vec4 views
// of the logits.
const PARAM_VEC4: u32 = 1u;
// Params::flags: some request sets top-k / top-p / min-p; `cutoffs` holds a logit cut-off per
// target row (then per draft row, after total_rows) and entries below it count as -inf.
const PARAM_CUTOFF: u32 = 2u;
// Params::flags: element types. The logits bindings are arrays of 32-bit words; f32 rows are
// bitcast, f16 / bf16 rows hold two values per word (low half first) and are widened exactly
// with integer operations (no SHADER_F16 needed). The twin is src/batch.rs f16_to_f32.
const PARAM_T_F16: u32 = 4u;
const PARAM_T_BF16: u32 = 8u;
const PARAM_D_F16: u32 = 16u;
const PARAM_D_BF16: u32 = 32u;
// Params::flags: the output has the logprob regions / row_stats sums the raw rows too.
const PARAM_LOGPROBS: u32 = 64u;
const PARAM_RAW: u32 = 128u;
// Params::flags: a tree batch (verify.wgsl tree_walk): the output words hold, after the packed
// output, the accepted nodes (R × out_stride), one 8-word race header per request (depth of the
// final slot, noise stream, its draft row, first and count of its excluded tokens) and the
// children's tokens grouped by parent slot. See tree_scratch below.
const PARAM_TREE: u32 = 256u;

// The statistics contract: each row is cut into CHUNK-entry chunks; inside a chunk lane l of
// CHUNK_LANES reduces the groups of entries 4(l + CHUNK_LANES·i) + (0..3), i = 0..15 in that
// order (row_stats.wgsl push4 says how a group is added), the lanes fold as a tree, and the chunk
// partials of a row fold in runs of max(8, ceil(chunks / 8)) consecutive chunks, each run in chunk
// order, then the runs in run order (verify.wgsl run_len). The order of every float operation is
// fixed by these constants and the vocabulary alone, never by the batch or the workgroup count,
// so sums (hence p(d)) do not depend on the batch, and the CPU twin reproduces them.
const CHUNK: u32 = 4096u;
const CHUNK_LANES: u32 = 64u;
const CHUNK_STEPS: u32 = 16u; // CHUNK / 4 / CHUNK_LANES

// Per-request metadata (64 bytes).
struct ReqInfo {
    row_offset: u32,       // first global target row
    draft_offset: u32,     // first global draft row == index of its first draft id / rate
    num_drafts: u32,       // k_r
    flags: u32,            // REQ_* bits
    inv_temperature: f32,  // 1 / T (0 for greedy)
    seed_lo: u32,
    seed_hi: u32,
    pos_lo: u32,           // absolute position of the first draft token (RNG counter)
    pos_hi: u32,
    out_offset: u32,       // r * out_stride
    top_k: u32,            // keep the top_k largest logits, ties at the cut-off kept (0 = off)
    top_p: f32,            // then the smallest top set holding top_p of the mass (1 = off)
    log_min_p: f32,        // and tokens with (l - max) / T >= ln(min_p) (-inf = off)
    typical_epsilon: f32,  // typical acceptance: accept iff p(d) > min(epsilon, delta exp(-H))
    typical_delta: f32,
    _pad0: u32,
}

// Row statistics, per (row, chunk) and, after the merge, per row (48 bytes).
//   t_max   max target logit (NaN treated as -inf)      t_sum  Σ exp((l - t_max) / T)
//   t_arg   lowest index of t_max                       flags  ROW_* bits
//   t_at_d  target logit at the drafted token (0 when the token is not in this chunk / no draft)
//   q_max, q_sum, q_at_d: the same for the draft row (draft logits), q_at_d also for probabilities
struct RowStats {
    t_max: f32,
    t_sum: f32,
    t_arg: u32,
    flags: u32,
    t_at_d: f32,
    q_max: f32,
    q_sum: f32,
    q_at_d: f32,
    raw_max: f32,   // max / Σexp(l - max) of the raw row at T = 1, no cut-off (PARAM_RAW only):
    raw_sum: f32,   // the denominators of raw logprobs
    t_ent: f32,     // Σ exp(z) z, z = (l - t_max) / T (typical acceptance): H = ln t_sum - t_ent / t_sum
    rho: f32,       // block requests, merged rows only: ρ entering this row (verify writes it)
}

// What the residual pass must sample for a request (16 bytes).
struct Task {
    kind: u32,         // TASK_*
    local_row: u32,    // row within the request (0..=k): the rejected row or the bonus row
    draft_token: i32,  // drafted token at that row (-1 for the bonus row or an invalid draft)
    slot: u32,         // index in the token output where the sampled token goes
}

// Per-(request, block) candidate of the residual argmax (32 bytes).
struct Candidate {
    r_key: f32,   // best key of r in the block (-inf when the residual is empty there)
    r_idx: u32,
    p_key: f32,   // best key of p: the fallback when the whole residual is empty
    p_idx: u32,
    r_logit: f32, // the logits of the two winners, for their logprobs
    p_logit: f32,
    _pad0: u32,
    _pad1: u32,
}

const DRAFT_NONE: u32 = 0u;
const DRAFT_PROBS: u32 = 1u;
const DRAFT_LOGITS: u32 = 2u;

const REQ_GREEDY: u32 = 1u;
const REQ_SYNTHETIC: u32 = 2u;
const REQ_FILTER: u32 = 4u;
const REQ_LOGPROBS: u32 = 8u;
const REQ_RAW_LOGPROBS: u32 = 16u;
const REQ_BLOCK: u32 = 32u;
const REQ_TYPICAL: u32 = 64u;
// Deliberate faults, only for negative controls of the statistical tests (never set by users).
const REQ_FAULT_REJECT_ALL: u32 = 256u;
const REQ_FAULT_SHARED_NOISE: u32 = 512u;

const ROW_T_NAN: u32 = 1u;
const ROW_T_POSINF: u32 = 2u;
const ROW_Q_NAN: u32 = 4u;
const ROW_Q_POSINF: u32 = 8u;
// Block rule with a draft distribution: the row's mass R_j can change τ (verify marks it).
const ROW_MASS_DUE: u32 = 16u;
// A float R_j never exceeds ρ_j by this factor (verify.wgsl, mark_due_masses).
const MASS_BOUND: f32 = 1.125;

const TASK_NONE: u32 = 0u;
const TASK_FROM_TARGET: u32 = 1u;     // sample from p (bonus row, or a residual with no usable q)
const TASK_ONE_HOT_RESIDUAL: u32 = 2u; // p with the drafted token removed
const TASK_DRAFT_RESIDUAL: u32 = 3u;   // max(p - q, 0)
const TASK_BLOCK_RESIDUAL: u32 = 4u;   // max(ρ p - q, 0), ρ = row_stats[row].rho (block rule)
const TASK_PENDING_BLOCK: u32 = 5u;    // block request with a draft distribution: verify's
                                       // block_settle decides it after block_mass

const STATUS_TARGET_NONFINITE: u32 = 1u;
const STATUS_DRAFT_NONFINITE: u32 = 2u;
const STATUS_EMPTY_RESIDUAL: u32 = 4u;
const STATUS_ALL_MASKED: u32 = 8u;

const STREAM_ACCEPT: u32 = 0u;
const STREAM_RESIDUAL: u32 = 1u;
const STREAM_BONUS: u32 = 2u;

const NO_INDEX: u32 = 0xffffffffu;
const NEG_INF_BITS: u32 = 0xff800000u;
const POS_INF_BITS: u32 = 0x7f800000u;

// Workgroup size; the tree reductions below assume a power of two no larger than MAX_WG.
override WG: u32 = 256u;
const MAX_WG: u32 = 256u;

// NaN and infinity tests on the bit pattern: compilers allowed to assume finite floats may fold
// `x != x` away, but they cannot fold integer compares.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > POS_INF_BITS;
}
fn is_pos_inf(x: f32) -> bool {
    return bitcast<u32>(x) == POS_INF_BITS;
}
fn is_neg_inf(x: f32) -> bool {
    return bitcast<u32>(x) == NEG_INF_BITS;
}

// Exact widening of IEEE binary16 bits (low 16 bits of h) to f32: normals by re-biasing the
// exponent, subnormals as m · 2^-24 (exact), inf and NaN kept.
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        let v = f32(m) * 5.9604645e-8;
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// Element `i` of a row buffer of 32-bit words holding f32 (half_bits 0), f16 (PARAM_T_F16) or
// bf16 (PARAM_T_BF16) values; `word` is the word holding it (word i for f32, i / 2 otherwise).
fn widen(word: u32, i: u32, half_bits: u32) -> f32 {
    if (half_bits == 0u) {
        return bitcast<f32>(word);
    }
    let h = select(word & 0xffffu, word >> 16u, (i & 1u) != 0u);
    if (half_bits == PARAM_T_BF16) {
        return bitcast<f32>(h << 16u);
    }
    return f16_of_word(word, i & 1u);
}

// Half `i` (0: low 16 bits, 1: high) of a word of binary16 values, widened exactly. F16_UNPACK
// and unpack_f16x2 come from the variant's text (f16_unpack_device.wgsl, where the device's
// unpack2x16float widens every binary16 value as f16_to_f32 does, NaN to some NaN; else
// f16_unpack_integer.wgsl): the device's one conversion instead of f16_to_f32's integer
// operations and branches. Every kernel tests NaN by its bits (is_nan) before using a value, so
// a NaN's payload never reaches a result.
fn f16_of_word(word: u32, i: u32) -> f32 {
    if (F16_UNPACK) {
        let p = unpack_f16x2(word);
        return select(p.x, p.y, i != 0u);
    }
    return f16_to_f32(select(word & 0xffffu, word >> 16u, i != 0u));
}

// The logprob pair of a slot that holds no token (and of a stop the residual pass settles).
fn nan_pair() -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(0x7fc00000u));
}

// Whether a merged target row stops its request: NaN or +inf in the row, or no finite entry at
// all (verify's and row_stats' settle alike).
fn row_nonfinite(st: RowStats) -> bool {
    return (st.flags & (ROW_T_NAN | ROW_T_POSINF)) != 0u || is_neg_inf(st.t_max);
}

// The output words of output slot `slot`'s two logprobs, for an output of `requests` requests of
// `stride` slots: after the tokens (requests x stride), the counts and the statuses (requests
// each), the processed then the raw logprob region (requests x stride each).
fn logprob_words(requests: u32, stride: u32, slot: u32) -> vec2<u32> {
    let base = requests * stride + 2u * requests + slot;
    return vec2<u32>(base, base + requests * stride);
}

// The (processed, raw) logprobs of a token with logit `l` at a row with statistics `st`, NaN
// where the request did not ask (twin: logprobs_of in src/cpu/verify.rs).
fn logprobs_of(info: ReqInfo, st: RowStats, l: f32) -> vec2<f32> {
    var lp = nan_pair();
    if ((info.flags & REQ_LOGPROBS) != 0u) {
        if ((info.flags & REQ_GREEDY) != 0u) {
            lp.x = 0.0; // a point mass at the argmax
        } else {
            lp.x = (l - st.t_max) * info.inv_temperature - log(st.t_sum);
        }
    }
    if ((info.flags & REQ_RAW_LOGPROBS) != 0u) {
        lp.y = (l - st.raw_max) - log(st.raw_sum);
    }
    return lp;
}

// The argmax rule of every merge of maxima (row_stats' lane trees; verify_request's `fold` and
// `arg_step` write it out): the larger maximum wins, equal maxima go to the lower index, so a
// row's argmax does not depend on the order of its folds.
fn takes_other(m_self: f32, a_self: u32, m_other: f32, a_other: u32) -> bool {
    return m_other > m_self || (m_other == m_self && a_other < a_self);
}

// Rescaled sum of one side of a merge; a -inf side contributes nothing (avoids -inf - -inf).
// Used by row_stats' chunk folds and by the chunk merge in verify.
fn rescale(m: f32, s: f32, m_new: f32, inv_t: f32) -> f32 {
    if (is_neg_inf(m)) {
        return 0.0;
    }
    return s * exp((m - m_new) * inv_t);
}

// The entropy numerator of one side of a merge, moved to max m_new: with d = (m - m_new) / T,
// Σ exp(z + d)(z + d) = exp(d) (e + d s). A -inf side contributes nothing (used by row_stats
// and by the chunk merge in verify).
fn rescale_ent(m: f32, s: f32, e: f32, m_new: f32, inv_t: f32) -> f32 {
    if (is_neg_inf(m)) {
        return 0.0;
    }
    let d = (m - m_new) * inv_t;
    return exp(d) * (e + d * s);
}

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., SC'11), counter-based: the same (key, counter) gives the same four
// words on every device. The Rust twin uses u64; a test checks both against the published
// vectors.
// ---------------------------------------------------------------------------------------------

// mul_wide(a, b), the 64-bit product as (low, high) words, comes from one of two small files
// prepended after this one: shaders/mul_wide_u32.wgsl (portable) or shaders/mul_wide_int64.wgsl (on
// devices with SHADER_INT64). Both are exact, so the random words are the same either way.

fn philox4x32_10(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var round = 0u; round < 10u; round += 1u) {
        if (round > 0u) {
            k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
        }
        // (low, high) words of each product: one wide multiply each with SHADER_INT64 (the
        // residual pass 0.98x on an H200 against a separate low multiply).
        let p0 = mul_wide(0xD2511F53u, c.x);
        let p1 = mul_wide(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.y ^ c.y ^ k.x, p1.x, p0.y ^ c.w ^ k.y, p0.x);
    }
    return c;
}

// Counter layout (SPEC §5): (vocab index / 4, row position low, stream, row position high),
// key = seed. Word `vocab index % 4` of the output belongs to that vocabulary entry, so one Philox
// call feeds four consecutive entries. The row position is the request's position + local row.
fn row_position(info: ReqInfo, local_row: u32) -> vec2<u32> {
    let lo = info.pos_lo + local_row;
    let carry = select(0u, 1u, lo < info.pos_lo);
    return vec2<u32>(lo, info.pos_hi + carry);
}

fn random_words(info: ReqInfo, pos: vec2<u32>, stream: u32, quad: u32) -> vec4<u32> {
    return philox4x32_10(vec4<u32>(quad, pos.x, stream, pos.y), vec2<u32>(info.seed_lo, info.seed_hi));
}

// Uniform in the open interval (0, 1) from the top 23 bits: (m + 0.5) / 2^23 is exact in f32,
// never 0 and never 1.
fn uniform_open(bits: u32) -> f32 {
    return (f32(bits >> 9u) + 0.5) * (1.0 / 8388608.0);
}

// Exp(1) variate e = -ln(1 - w), w = bits / 2^32 truncated to 24 significant bits (exact in f32,
// never 0, never 1). The winners of an exponential race have small e, i.e. small w, so w keeps
// full relative precision near 0 (leading zeros are shifted out) and -ln(1 - w) uses series
// there; every step is exact integer work or a rounding the Rust twin reproduces (up to the
// few-ulp freedom WGSL gives division and log).
fn exp1_from_bits(bits: u32) -> f32 {
    return exp1_from_w(w_from_bits(bits));
}

// w = bits / 2^32 truncated to 24 significant bits, exact in f32, in (0, 1). Note -ln(1 - w) >= w,
// which lets the exponential race skip tokens that cannot win without evaluating the log.
fn w_from_bits(bits: u32) -> f32 {
    if (bits == 0u) {
        return 1.16415322e-10; // 2^-33: below every other value, still > 0
    }
    // w = m · 2^(-24 - z) with m = the top 24 bits after the leading zeros, m in [2^23, 2^24):
    // built directly as exponent 126 - z and mantissa m - 2^23 (integer work only, exact).
    let z = countLeadingZeros(bits);
    let m = (bits << z) >> 8u;
    return bitcast<f32>(((126u - z) << 23u) | (m & 0x7fffffu));
}

// The race key of a token when nothing is subtracted from p (one-hot residuals, bonus rows, tree
// slots without q): ln p(y) − ln e_y up to the row's log-normaliser, z − ln e with z = l / T
// (SPEC §3: the Gumbel form of the race). It needs neither the row's maximum nor its sum.
// (The twin: rng::log_race_key.)
fn log_race_key(z: f32, w: f32) -> f32 {
    return z - log(exp1_from_w(w));
}

// Whether an entry with z = l / T and noise w can beat the key `bound`: e >= w, so its key is at
// most z − ln w, and it can win only if w < exp(z − bound). Settles most entries without the
// log, as the linear race's r > B·w does. Padded by 1.001 against the ulps of exp here and of
// log in the key: where e is within rounding of w (small w), an entry whose computed key ties
// the bound or beats it by an ulp must not be skipped, since the residual race's bound holds
// other lanes' keys as they publish them, and a skip would then depend on their timing. The
// twin (src/rng.rs) pads alike.
fn log_race_may(z: f32, w: f32, bound: f32) -> bool {
    return w < exp(z - bound) * 1.001;
}

// An order-preserving u32 key of a non-NaN f32 (-inf lowest), and back: workgroup atomics take
// the largest of f32 values of either sign through it. -0.0 takes +0.0's key: the two are equal
// as f32 values, so a maximum held by both goes to the lowest index holding either, as the
// twin's f32 comparisons decide (an integer test: no float rule can fold it away).
fn order_key(x: f32) -> u32 {
    let b = select(bitcast<u32>(x), 0u, bitcast<u32>(x) == 0x80000000u);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}
fn from_order_key(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// -ln(1 - w) for w from w_from_bits.
fn exp1_from_w(w: f32) -> f32 {
    if (w < 0.015625) {
        // w + w^2/2 + w^3/3 + w^4/4 + w^5/5, relative error below w^5/6 < 2^-32
        return w * (1.0 + w * (0.5 + w * (0.33333334 + w * (0.25 + w * 0.2))));
    }
    if (w < 0.5) {
        // -ln(1 - w) = 2 atanh(z), z = w / (2 - w) <= 1/3: the odd series to z^15 is accurate
        // to 4e-9 relative. GPU `log` is only accurate to an absolute 2^-21 near 1, i.e. many
        // ulps of a small result, so it is not used here.
        let z = w / (2.0 - w);
        let z2 = z * z;
        return 2.0 * z * (1.0 + z2 * (0.33333334 + z2 * (0.2 + z2 * (0.14285715 + z2 * (0.11111111
            + z2 * (0.09090909 + z2 * (0.07692308 + z2 * 0.06666667)))))));
    }
    // 1 - w is exact here (w >= 0.5 has 24 significant bits) and log is accurate to a few ulp
    // away from 1.
    return -log(1.0 - w);
}

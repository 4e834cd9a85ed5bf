// cutoff — the logit cut-off of every row of the requests that set top-k, top-p or min-p.
// CPU twin: src/cpu/cutoff.rs. Pipeline label: specdec.cutoff.main.
//
// Every control keeps an upper set of the row's values, so together they are one threshold c:
// the processed distribution is softmax(l / T) over the entries with l >= c (the others count as
// -inf in row_stats and residual_argmax). Order (documented in batch.rs):
//   min-p   keep (l - max) / T >= ln(min_p)                  (relative to the most likely token)
//   top-k   keep l >= the k-th largest value (with multiplicity) of what min-p kept
//   top-p   of what is left, keep l >= the largest value v whose upper set {l >= v} holds at
//           least top_p of the (renormalised) mass
// Ties at a cut-off are all kept (the set is defined by values, never by index), so top-k can keep
// more than k entries when the k-th value repeats. NaN entries are skipped (row_stats flags the
// row non-finite); a row whose max is -inf or +inf gets no cut-off.
//
// No sort: values map to order-preserving u32 keys and each cut-off is a radix select, 8 bits per
// round over four rounds, each round one pass over the row building a 256-bin histogram in
// workgroup memory (counts for top-k; for top-p the masses exp((l - max) / T) in 2^-31 fixed
// point, summed with 64-bit integer atomics). Integer sums do not depend on the order of the
// additions, so the cut-off does not depend on the batch, the workgroup size or the device
// (beyond the few-ulp freedom of exp), and the twin reproduces it.
//
// Dispatch: x = 1, y = target row within the window; one workgroup of CUTOFF_LANES lanes per
// row (64: the passes are short and barrier-bound, wider groups only add idle lanes). The same
// workgroup then does the row's draft row when the draft is given as logits.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> target_logits: array<u32>;
@group(0) @binding(2) var<storage, read> draft_values: array<u32>;
@group(0) @binding(3) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(4) var<storage, read> row_info: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cutoffs: array<f32>;

// Element i of the target / draft binding, whatever its element type (see `widen`).
fn t_elem(i: u32) -> f32 {
    let half = params.flags & (PARAM_T_F16 | PARAM_T_BF16);
    return widen(target_logits[select(i, i >> 1u, half != 0u)], i, half);
}
fn d_elem(i: u32) -> f32 {
    let half = (params.flags >> 2u) & (PARAM_T_F16 | PARAM_T_BF16);
    return widen(draft_values[select(i, i >> 1u, half != 0u)], i, half);
}

const BINS: u32 = 256u;
const CUTOFF_LANES: u32 = 64u;
// Smallest key of a finite value (-f32::MAX); -inf maps just below it.
const KEY_MIN_FINITE: u32 = 0x00800000u;
// Key of +inf.
const KEY_POS_INF: u32 = 0xff800000u;
// Mass of one entry in fixed point: exp((l - max) / T) · 2^31, so the max entry weighs 2^31.
const MASS_SCALE: f32 = 2147483648.0;

var<workgroup> h_count: array<atomic<u32>, BINS>;
var<workgroup> h_lo: array<atomic<u32>, BINS>;
var<workgroup> h_hi: array<atomic<u32>, BINS>;
var<workgroup> red_key: atomic<u32>;
// Broadcasts from lane 0, read back with workgroupUniformLoad.
var<workgroup> bc_key: u32;
var<workgroup> bc_stop: u32;
// Lane 0's running target of the radix walk (64 bits as hi, lo).
var<workgroup> need_hi: u32;
var<workgroup> need_lo: u32;

// Order-preserving key: a < b as floats (no NaN) iff key(a) < key(b); -0 maps to +0's key so
// that the key order and the float comparison `l >= cut` agree everywhere.
fn key_of(x: f32) -> u32 {
    var b = bitcast<u32>(x);
    if (b == 0x80000000u) {
        b = 0u;
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

fn value_of(k: u32) -> f32 {
    if ((k & 0x80000000u) != 0u) {
        return bitcast<f32>(k & 0x7fffffffu);
    }
    return bitcast<f32>(~k);
}

// Entry y of the row at element `base` of the target (which == 0) or draft binding. Storage
// arrays cannot be passed to functions in core WGSL, hence the branch.
fn load(which: u32, base: u32, y: u32) -> f32 {
    if (which == 0u) {
        return t_elem(base + y);
    }
    return d_elem(base + y);
}

// Unsigned 64-bit a >= b on (hi, lo) pairs.
fn ge64(a_hi: u32, a_lo: u32, b_hi: u32, b_lo: u32) -> bool {
    return a_hi > b_hi || (a_hi == b_hi && a_lo >= b_lo);
}

// The radix select: the largest key K >= kbase such that the entries with key >= K weigh at
// least the target (count mode: target = need_in entries; mass mode: target =
// ceil(top_p · total mass of the entries >= kbase)). Returns kbase when nothing needs cutting
// (count mode with no more than need_in entries). Keys below kbase never take part.
fn radix_select(which: u32, base: u32, len: u32, lane: u32, kbase: u32, mass_mode: bool,
                need_in: u32, top_p: f32, m: f32, inv_t: f32) -> u32 {
    var prefix = 0u;
    for (var round = 0u; round < 4u; round += 1u) {
        for (var b = lane; b < BINS; b += CUTOFF_LANES) {
            atomicStore(&h_count[b], 0u);
            atomicStore(&h_lo[b], 0u);
            atomicStore(&h_hi[b], 0u);
        }
        workgroupBarrier();
        let shift = 24u - 8u * round;
        for (var y = lane; y < len; y += CUTOFF_LANES) {
            let x = load(which, base, y);
            if (is_nan(x)) {
                continue;
            }
            let kx = key_of(x);
            if (kx < kbase) {
                continue;
            }
            if (round > 0u) {
                if ((kx >> (32u - 8u * round)) != prefix) {
                    continue;
                }
            }
            let digit = (kx >> shift) & 255u;
            if (mass_mode) {
                let fx = u32(exp((x - m) * inv_t) * MASS_SCALE);
                let old = atomicAdd(&h_lo[digit], fx);
                if (old + fx < old) {
                    atomicAdd(&h_hi[digit], 1u);
                }
            } else {
                atomicAdd(&h_count[digit], 1u);
            }
        }
        workgroupBarrier();
        if (lane == 0u) {
            var stop = 0u;
            if (round == 0u) {
                // The target, from the totals of the first round.
                var t_hi = 0u;
                var t_lo = 0u;
                for (var b = 0u; b < BINS; b += 1u) {
                    var h_l = atomicLoad(&h_count[b]);
                    var h_h = 0u;
                    if (mass_mode) {
                        h_l = atomicLoad(&h_lo[b]);
                        h_h = atomicLoad(&h_hi[b]);
                    }
                    let lo = t_lo + h_l;
                    t_hi = t_hi + h_h + select(0u, 1u, lo < t_lo);
                    t_lo = lo;
                }
                if (mass_mode) {
                    let total = f32(t_hi) * 4294967296.0 + f32(t_lo);
                    let nf = ceil(top_p * total);
                    let hi = floor(nf * (1.0 / 4294967296.0));
                    need_hi = u32(hi);
                    need_lo = u32(nf - hi * 4294967296.0);
                    // Rounding of the f32 total must not ask for more than there is.
                    if (ge64(need_hi, need_lo, t_hi, t_lo)) {
                        need_hi = t_hi;
                        need_lo = t_lo;
                    }
                } else {
                    need_hi = 0u;
                    need_lo = need_in;
                    if (t_hi == 0u && t_lo <= need_in) {
                        stop = 1u;
                    }
                }
            }
            if (stop == 0u) {
                // Walk the bins from the top until the running weight reaches the target.
                var acc_hi = 0u;
                var acc_lo = 0u;
                var digit = 0u;
                for (var bi = 0i; bi < i32(BINS); bi += 1i) {
                    let b = BINS - 1u - u32(bi);
                    var h_l = atomicLoad(&h_count[b]);
                    var h_h = 0u;
                    if (mass_mode) {
                        h_l = atomicLoad(&h_lo[b]);
                        h_h = atomicLoad(&h_hi[b]);
                    }
                    let lo = acc_lo + h_l;
                    let hi = acc_hi + h_h + select(0u, 1u, lo < acc_lo);
                    digit = b;
                    if (ge64(hi, lo, need_hi, need_lo)) {
                        break;
                    }
                    acc_hi = hi;
                    acc_lo = lo;
                }
                // What is still needed inside the chosen bin.
                let n_lo = need_lo - acc_lo;
                need_hi = need_hi - acc_hi - select(0u, 1u, need_lo < acc_lo);
                need_lo = n_lo;
                bc_key = (prefix << 8u) | digit;
            }
            bc_stop = stop;
        }
        if (workgroupUniformLoad(&bc_stop) != 0u) {
            return kbase;
        }
        prefix = workgroupUniformLoad(&bc_key);
    }
    return prefix;
}

// The cut-off of one row (the same value on every lane), -inf when nothing is cut.
fn row_cutoff(which: u32, base: u32, len: u32, lane: u32, info: ReqInfo) -> f32 {
    let ninf = bitcast<f32>(NEG_INF_BITS);
    let inv_t = info.inv_temperature;
    // The row max (NaN skipped).
    if (lane == 0u) {
        atomicStore(&red_key, 0u);
    }
    workgroupBarrier();
    var local_max = 0u;
    for (var y = lane; y < len; y += CUTOFF_LANES) {
        let x = load(which, base, y);
        if (!is_nan(x)) {
            local_max = max(local_max, key_of(x));
        }
    }
    atomicMax(&red_key, local_max);
    workgroupBarrier();
    if (lane == 0u) {
        bc_key = atomicLoad(&red_key);
    }
    let max_key = workgroupUniformLoad(&bc_key);
    if (max_key < KEY_MIN_FINITE || max_key >= KEY_POS_INF) {
        return ninf;
    }
    let m = value_of(max_key);
    // min-p: the smallest key passing (l - m) / T >= ln(min_p) (an upper set: the test is
    // monotone in l).
    var kbase = KEY_MIN_FINITE;
    if (!is_neg_inf(info.log_min_p)) {
        if (lane == 0u) {
            atomicStore(&red_key, 0xffffffffu);
        }
        workgroupBarrier();
        var local_min = 0xffffffffu;
        for (var y = lane; y < len; y += CUTOFF_LANES) {
            let x = load(which, base, y);
            if (!is_nan(x) && !is_neg_inf(x) && (x - m) * inv_t >= info.log_min_p) {
                local_min = min(local_min, key_of(x));
            }
        }
        atomicMin(&red_key, local_min);
        workgroupBarrier();
        if (lane == 0u) {
            bc_key = atomicLoad(&red_key);
        }
        kbase = workgroupUniformLoad(&bc_key);
    }
    if (info.top_k != 0u) {
        kbase = radix_select(which, base, len, lane, kbase, false, info.top_k, 1.0, m, inv_t);
    }
    if (info.top_p < 1.0) {
        kbase = radix_select(which, base, len, lane, kbase, true, 0u, info.top_p, m, inv_t);
    }
    if (kbase == KEY_MIN_FINITE) {
        return ninf;
    }
    return value_of(kbase);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let local_row = wid.y;
    let row = params.row_begin + local_row;
    let info4 = row_info[row];
    let info = requests[info4.x];
    let filtered = (info.flags & REQ_FILTER) != 0u && (info.flags & REQ_GREEDY) == 0u;
    var cut = bitcast<f32>(NEG_INF_BITS);
    if (filtered) {
        cut = row_cutoff(0u, params.t_elem_base + local_row * params.vocab, params.vocab, lane, info);
    }
    if (lane == 0u) {
        cutoffs[row] = cut;
    }
    // The draft row scored at this target row, when q comes from draft logits.
    let d_row = info4.w;
    if (params.draft_kind == DRAFT_LOGITS && d_row != NO_INDEX) {
        var d_cut = bitcast<f32>(NEG_INF_BITS);
        if (filtered) {
            let d_base = params.d_elem_base + (d_row - params.d_row_begin) * params.draft_vocab;
            d_cut = row_cutoff(1u, d_base, params.draft_vocab, lane, info);
        }
        if (lane == 0u) {
            cutoffs[params.total_rows + d_row] = d_cut;
        }
    }
}

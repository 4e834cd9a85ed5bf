// cutoff — the logit cut-off of every row of the requests that set top-k, top-p or min-p.
// CPU twin: src/cpu/cutoff.rs. Pipeline labels:
// specdec.cutoff.{init,scan_max,pick_max,scan_top_k,pick_top_k,scan,pick}.
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
// No sort: values map to order-preserving u32 keys and each cut-off is a select over 256-bin
// histograms (counts for top-k; for top-p the masses exp((l - max) / T) in 2^-31 fixed point,
// summed as 64-bit integers emulated with u32 pairs). Integer sums do not depend on the order of
// the additions, so the cut-off does not depend on the batch, on how a row is split between
// workgroups or on the device (beyond the few-ulp freedom of exp), and the twin reproduces it.
// Top-k and top-p each read the row twice after its max, through 256 value bins below the max
// (bins are intervals of values, the top bin holds the max):
//   1. a histogram of the bins (counts for top-k, masses for top-p) picks the bin holding the
//      cut-off;
//   2. a second scan gathers that bin's entries (tens to a few thousand on real rows) into the
//      row's slot, and `pick` runs 8-bit radix rounds over them alone, from the first key byte
//      they do not all share (none when they are all equal).
// The key found is the largest whose upper set weighs the target, exactly as four radix rounds
// over the whole row find it (the twin's way): every entry of a higher bin has a larger value.
// Top-k with k below the lane count skips both scans where a row has at most CAND_MAX_SLICES
// slices: the scan of its max also gathers its candidates, each slice's entries at or above a
// bound that its (k+1)-th largest lane max sets, and `pick` selects top-k's cut-off (and
// top-p's after it) from them alone (scan_candidates, pick_candidates).
// A bin too full for the slot's list (params.cut_list: the whole row at small batches, at least
// 4,096 entries) is selected by `pick`'s workgroup reading the row itself, restricted to the
// bin: slower, same cut-off.
//   top-k  bins of d = max - l on a log scale, 8 per octave from 2^-16 to 2^15.75 (the top bin
//          d < 2^-16, the lowest everything past the range): the k-th largest value of a row can
//          lie anywhere below its max and rows can hold far outliers (masks of -1e9 or -f32::MAX),
//          so the bins are fixed in d, neither in the row's span nor in T. At the top-40
//          cut-off of N(0, 2) logits over 151,936 entries a bin holds about 15.
//   top-p  256 equal bins of z = (max - l) / T over the candidates' span, at most 22 deep
//          (past 21.49 every fixed-point mass is 0).
//
// A row is split over many workgroups: one workgroup per row made every pass a long serial
// loop (milliseconds on a big GPU while the rest of the verification takes tens of µs). Each
// row (target row, or draft row when the draft is given as logits) has a slot of `state`: the
// stage it is at, its radix-select progress and a global 256-bin histogram. The host records
//   init                    (1, rows, sides): resets the slots (unfiltered rows: cut-off -inf)
//   N x (scan, pick)        the first (scan_max, pick_max), or (scan_top_k, pick_top_k) where
//                           some request's top-k may take candidates
//     scan   (slices, rows, sides): each workgroup reduces `cut_slice` entries of the row for the
//            row's current stage (max, a histogram of value bins, or the gathering
//            of the chosen bin) into workgroup memory, then adds its partial into the slot with
//            integer atomics
//     pick   (1, rows, sides): reads the totals, picks the bound / bin (after the max: min-p's
//            bound, by bisection over the keys; after a gathering: the radix rounds over the
//            list), clears the histogram and moves the row to its next stage; a row reaching
//            DONE writes its cut-off
// with N = 1 + 2 [any top-k] + 2 [any top-p] over the batch. Rows needing fewer
// stages sit at DONE and their workgroups return at once: rows whose top-k took candidates
// (unless a slice had too many, ties or equal finite masks: those go on through the value
// bins), top-k with at most k candidates, and
// top-k followed by top-p where every entry from top-k's chosen bin up fits the list (top-k's
// gathering then takes them all, and `pick` selects top-p's cut-off from that list right after
// top-k's, without reading the row again). Side (z) 0 is the target row, side 1 the draft row
// scored at it (draft logits only; otherwise z has one value).

// Bindings 0-2 (params, target_logits, draft_values) and t_elem / d_elem: shaders/rows.wgsl.
@group(0) @binding(3) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(4) var<storage, read> row_info: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cutoffs: array<f32>;
// Slots of STATE_WORDS words (layout: S_* below), scratch between the dispatches: target rows
// of the dispatch first, then their draft rows (see state_at). The host dispatches the rows in
// groups small enough for this buffer and reuses it group after group.
@group(0) @binding(6) var<storage, read_write> state: array<atomic<u32>>;

const BINS: u32 = 256u;
// Smallest key of a finite value (-f32::MAX); -inf maps just below it.
const KEY_MIN_FINITE: u32 = 0x00800000u;
// Key of +inf.
const KEY_POS_INF: u32 = 0xff800000u;
// Mass of one entry in fixed point: exp((l - max) / T) · 2^31, so the max entry weighs 2^31.
const MASS_SCALE: f32 = 2147483648.0;

// Entries of the chosen bin one scan workgroup collects before adding them to the slot's list
// with one global atomic; past it, each entry takes a global atomic of its own.
const LOCAL_CAP: u32 = 1024u;
// Top-p bins span z = (max - l) / T in [0, 22] at most: beyond 21.49, exp(-z) 2^31 truncates to a
// mass of 0, so the bins past it weigh nothing and never hold a cut-off.
const BIN_RANGE: f32 = 22.0;
// Top-k bins: the f32 bits of d = max - l from those of 2^-16, 2^20 apart (8 bins per octave).
const KBIN_LO_BITS: u32 = 0x37800000u;
const KBIN_SHIFT: u32 = 20u;
// Entries of a slice whose lanes' maxima set top-k's candidate bound (16 per lane): the scan
// then reads them a second time, from the cache.
const CAND_SUB: u32 = 4096u;
// Most slices per row for top-k's candidates: each slice adds about k + 1 of them (per CAND_SUB
// entries), from a bound that only its own entries set, so many small slices (small batches)
// make a long list.
const CAND_MAX_SLICES: u32 = 64u;
// Keys `pick` keeps in workgroup memory for its selects (p_keys; 8 KiB).
const P_CAP: u32 = 2048u;

// Slot layout (words): S_LIST head words (keep equal to CUT_HEAD_WORDS in cutoff.rs), then the
// list of the chosen bin's keys, params.cut_list words: the host sizes it from the batch (the
// whole row for small batches, at least 4,096 entries; at the top-p cut-off of N(0, 2) logits
// over 151,936 entries at T = 1 a bin holds about 2,000). A bin with more entries than the list
// holds is selected from the row itself. The histogram's 64-bit bins are (hi, lo)
// pairs; a count fits lo alone.
const S_MAX: u32 = 0u;     // max key of the row (atomicMax over the scans)
const S_OVER: u32 = 1u;    // top-k's candidates: 1 when a workgroup had too many for LOCAL_CAP
const S_STAGE: u32 = 2u;   // ST_*
const S_KBASE: u32 = 3u;   // lower key bound of what the earlier controls kept
const S_PREFIX: u32 = 4u;  // digits chosen so far in the current radix select
const S_NEED_HI: u32 = 5u; // weight still needed inside the chosen prefix
const S_NEED_LO: u32 = 6u;
const S_LCOUNT: u32 = 7u;  // entries gathered into the list (past params.cut_list: too full)
const S_RMIN: u32 = 8u;    // min key of the row's finite values (atomicMin over the max scans)
const S_SCALE: u32 = 9u;   // f32 bits: top-p bins per unit of z
const S_CMIN: u32 = 10u;   // least and greatest key of the chosen bin's entries
const S_CMAX: u32 = 11u;
const S_KALL: u32 = 12u;   // 1: top-k's gathering takes every entry from the chosen bin up
const S_LOWER: u32 = 13u;  // top-k's candidates: a lower bound of the row's (k+1)-th largest key
const S_HIST_LO: u32 = 16u;
const S_HIST_HI: u32 = 272u; // S_HIST_LO + BINS
const S_LIST: u32 = 528u;  // the chosen bin's keys (params.cut_list words)

// Stages, in order; a row skips those its request does not ask for.
const ST_MAX: u32 = 0u;
const ST_KB: u32 = 1u; // top-k: the count histogram of its value bins
const ST_KC: u32 = 2u; // top-k: the chosen bin's entries gathered, then selected by `pick`
const ST_PB: u32 = 3u; // top-p: the mass histogram of its value bins
const ST_PC: u32 = 4u; // top-p: the chosen bin's entries gathered, then selected by `pick`
const ST_DONE: u32 = 5u;

var<workgroup> h_lo: array<atomic<u32>, BINS>;
var<workgroup> h_hi: array<atomic<u32>, BINS>;
var<workgroup> red_key: atomic<u32>;
var<workgroup> red_min: atomic<u32>;
// The chosen bin's entries found by a scan workgroup (LOCAL_CAP kept), and where they go.
var<workgroup> l_cnt: atomic<u32>;
var<workgroup> l_kmin: atomic<u32>;
var<workgroup> l_kmax: atomic<u32>;
var<workgroup> l_list: array<u32, LOCAL_CAP>;
var<workgroup> w_off: u32;
var<workgroup> w_scale: f32;
// Lane 0's view of the slot, broadcast (the stage through workgroupUniformLoad).
var<workgroup> w_stage: u32;
var<workgroup> w_slot: u32;
var<workgroup> w_kbase: u32;
var<workgroup> w_prefix: u32;
var<workgroup> w_max: u32;
var<workgroup> w_all: u32;
// select: suffix sums of the histogram (64-bit as hi, lo), the target, the chosen bin.
var<workgroup> suf_lo: array<u32, BINS>;
var<workgroup> suf_hi: array<u32, BINS>;
var<workgroup> w_need_hi: u32;
var<workgroup> w_need_lo: u32;
var<workgroup> w_stop: u32;
var<workgroup> w_digit: u32;
var<workgroup> w_acc_hi: u32;
var<workgroup> w_acc_lo: u32;
// Top-k's candidates: whether the row takes them (scan, pick), and pick's view of the list.
var<workgroup> w_cand: u32;
var<workgroup> w_count: u32;
var<workgroup> w_floor: u32;
var<workgroup> w_top_p: u32;
var<workgroup> w_in_keys: u32; // pick_candidates: 1 when the kept keys fit p_keys
var<workgroup> red_sub: atomic<u32>;
var<workgroup> p_cnt: atomic<u32>;
var<workgroup> p_keys: array<u32, P_CAP>;

// Order-preserving key: a < b as floats (no NaN) iff key(a) < key(b); -0 maps to +0's key so
// that the key order and the float comparison `l >= cut` agree everywhere.
fn key_of(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let k = b ^ (bitcast<u32>(bitcast<i32>(b) >> 31u) | 0x80000000u);
    return select(k, 0x80000000u, b == 0x80000000u);
}

fn value_of(k: u32) -> f32 {
    if ((k & 0x80000000u) != 0u) {
        return bitcast<f32>(k & 0x7fffffffu);
    }
    return bitcast<f32>(~k);
}

// Unsigned 64-bit a >= b on (hi, lo) pairs.
fn ge64(a_hi: u32, a_lo: u32, b_hi: u32, b_lo: u32) -> bool {
    return a_hi > b_hi || (a_hi == b_hi && a_lo >= b_lo);
}

// The first word of the scratch slot of (local target row, side).
fn state_at(local_row: u32, side: u32) -> u32 {
    return (side * params.row_count + local_row) * (S_LIST + params.cut_list);
}

// The index in `cutoffs` of (local target row, side), or NO_INDEX when that side has no row to
// cut (side 1 without draft logits, or a target row with no draft row).
fn slot_of(local_row: u32, side: u32) -> u32 {
    let row = params.row_begin + local_row;
    if (side == 0u) {
        return row;
    }
    let d_row = row_info[row].w;
    if (params.draft_kind != DRAFT_LOGITS || d_row == NO_INDEX) {
        return NO_INDEX;
    }
    return params.total_rows + d_row;
}

fn row_req(local_row: u32) -> ReqInfo {
    return requests[row_info[params.row_begin + local_row].x];
}

// The element index of entry 0 of the row of (local row, side): in the target binding for side
// 0, the draft binding for side 1.
fn row_base(local_row: u32, side: u32) -> u32 {
    if (side == 0u) {
        return params.t_elem_base + local_row * params.vocab;
    }
    let d_row = row_info[params.row_begin + local_row].w;
    return params.d_elem_base + (d_row - params.d_row_begin) * params.draft_vocab;
}

// Element i of the side's binding. Storage arrays cannot be passed to functions in core WGSL,
// hence the branch (uniform: one side per workgroup).
fn ld(side: u32, i: u32) -> f32 {
    if (side == 0u) {
        return t_elem(i);
    }
    return d_elem(i);
}

// Entries y .. y+3 of the row starting at `base`; entries at or past `end` read as NaN, which
// every stage skips. The four loads go out together: with one load per lane in flight the scans
// read at about 1.6 TB/s on an H200 (latency-bound), well under the read ceiling.
fn load4(side: u32, base: u32, y: u32, end: u32) -> vec4<f32> {
    if (y + 3u < end) {
        if (side == 0u) {
            return t_elem4(base + y);
        }
        return d_elem4(base + y);
    }
    var v = vec4<f32>(bitcast<f32>(0x7fc00000u));
    if (y < end) {
        v.x = ld(side, base + y);
    }
    if (y + 1u < end) {
        v.y = ld(side, base + y + 1u);
    }
    if (y + 2u < end) {
        v.z = ld(side, base + y + 2u);
    }
    return v;
}

// `acc` raised to the key of x unless x is NaN. (The callers spell out the four entries of a
// group: a vec4 indexed in a loop can end up in local memory.)
fn max_key(acc: u32, x: f32) -> u32 {
    return select(max(acc, key_of(x)), acc, is_nan(x));
}

// Min-p's bound for a row of max key `max_key` (finite): the least finite key whose value v
// passes (v - m) / T >= ln(min_p). The test is monotone in v, so the entries at or above that
// value are exactly those that pass: a bisection over the keys finds the bound without reading
// the row. The twin bisects the same way (src/cpu/cutoff.rs), so the bound is the same bits.
fn min_p_bound(max_key: u32, inv_t: f32, log_min_p: f32) -> u32 {
    let m = value_of(max_key);
    var lo = KEY_MIN_FINITE;
    var hi = max_key;
    while (lo < hi) {
        let mid = lo + (hi - lo) / 2u;
        if ((value_of(mid) - m) * inv_t >= log_min_p) {
            hi = mid;
        } else {
            lo = mid + 1u;
        }
    }
    return lo;
}

// `acc` lowered to the key of x unless x is NaN or -inf (never a candidate: a row masked with
// -inf keeps its top-p bins as narrow as its finite values allow).
fn min_key(acc: u32, x: f32) -> u32 {
    if (is_nan(x) || is_neg_inf(x)) {
        return acc;
    }
    return min(acc, key_of(x));
}

// The top-p bin of x (not NaN, x <= m) as a digit, 255 for the bin of the max: z = (m - x) / T
// in steps of 1 / scale, capped. Each operation is monotone in x, so a bin is an interval of
// values and a higher digit holds larger values (what the radix select's walk from the top
// needs). The cap keeps the product finite whatever the scale.
fn bin_digit(x: f32, m: f32, inv_t: f32, scale: f32) -> u32 {
    return 255u - u32(min(min((m - x) * inv_t, BIN_RANGE) * scale, 255.0));
}

// The top-k bin of x (not NaN, x <= m) as a digit, 255 for the top bin: the f32 bits of the
// distance d = m - x (d >= 0; the sign bit cleared for m = -0, x = +0), 2^KBIN_SHIFT apart from
// those of 2^-16, capped. Monotone in x like bin_digit.
fn log_bin(x: f32, m: f32) -> u32 {
    let u = bitcast<u32>(m - x) & 0x7fffffffu;
    if (u < KBIN_LO_BITS) {
        return 255u;
    }
    return 254u - min((u - KBIN_LO_BITS) >> KBIN_SHIFT, 254u);
}

// Top-p bins per unit of z for a row of max m whose candidates are at least `lower`: 256 bins
// over z in [0, min(22, (m - lower) / T)], so the bins are as narrow as the candidates allow.
fn bin_scale(m: f32, lower: f32, inv_t: f32) -> f32 {
    var range = BIN_RANGE;
    let z = (m - lower) * inv_t;
    if (z < BIN_RANGE) {
        range = z;
    }
    // Every candidate equal to m (range 0): any scale puts them all in the top bin.
    return 256.0 / max(range, 1e-30);
}

// What a histogram round needs to know about the row (uniform over the workgroup).
struct Round {
    kbase: u32,
    prefix: u32,
    round: u32,
    shift: u32,
    mass_mode: bool,
    m: f32,
    inv_t: f32,
    // The bins are top-k's (log_bin) instead of top-p's (bin_digit).
    log_bins: bool,
    // The gathering takes the bins from the chosen one (prefix) up to this one: the chosen bin
    // alone, or every bin up to 255 (top-k before top-p, S_KALL).
    top_bin: u32,
    scale: f32,
    // Only entries of this value bin are candidates (NO_INDEX: any).
    only_bin: u32,
}

// The value bin of x (not NaN, x <= m) for the round's control.
fn value_bin(r: Round, x: f32) -> u32 {
    if (r.log_bins) {
        return log_bin(x, r.m);
    }
    return bin_digit(x, r.m, r.inv_t, r.scale);
}

// Adds entry x's weight into bin `bin` of the workgroup histogram: 1, or its mass in 2^-31 fixed
// point (a wrap of the low word carries into the high one).
fn add_to_bin(bin: u32, x: f32, mass_mode: bool, m: f32, inv_t: f32) {
    if (mass_mode) {
        let fx = u32(exp((x - m) * inv_t) * MASS_SCALE);
        let old = atomicAdd(&h_lo[bin], fx);
        if (old + fx < old) {
            atomicAdd(&h_hi[bin], 1u);
        }
    } else {
        atomicAdd(&h_lo[bin], 1u);
    }
}

// The histogram scans, one function per control so that the loop over the row tests no control
// per entry (the scans are bound by their per-entry work, not by bytes: a uniform test of the
// control per entry measured 1-2 % of a top-k or top-p call). Each adds entry x when it is a
// candidate (not NaN, at or above kbase): top-k counts it in its log bin, top-p adds its mass to
// its bin.
fn count_log_bin(kbase: u32, m: f32, x: f32) {
    if (is_nan(x) || key_of(x) < kbase) {
        return;
    }
    atomicAdd(&h_lo[log_bin(x, m)], 1u);
}

fn add_mass_bin(kbase: u32, m: f32, inv_t: f32, scale: f32, x: f32) {
    if (is_nan(x) || key_of(x) < kbase) {
        return;
    }
    add_to_bin(bin_digit(x, m, inv_t, scale), x, true, m, inv_t);
}

// Adds entry x into the workgroup histogram of a radix round when it is a candidate: not NaN, at
// or above kbase, in `only_bin` if set, carrying the prefix of the digits chosen so far.
fn radix_add(r: Round, x: f32) {
    if (is_nan(x)) {
        return;
    }
    let kx = key_of(x);
    if (kx < r.kbase) {
        return;
    }
    if (r.only_bin != NO_INDEX && value_bin(r, x) != r.only_bin) {
        return;
    }
    if (r.round > 0u && (kx >> (32u - 8u * r.round)) != r.prefix) {
        return;
    }
    add_to_bin((kx >> r.shift) & 255u, x, r.mass_mode, r.m, r.inv_t);
}

// Counts key kx into the workgroup's list and its key range; false where the list (LOCAL_CAP)
// was already full, so that kx is not in it.
fn add_local(kx: u32) -> bool {
    atomicMin(&l_kmin, kx);
    atomicMax(&l_kmax, kx);
    let i = atomicAdd(&l_cnt, 1u);
    if (i < LOCAL_CAP) {
        l_list[i] = kx;
        return true;
    }
    return false;
}

// Collects entry x into the workgroup's list when it is a candidate in the chosen value bin
// (r.prefix; or above it, up to r.top_bin; past LOCAL_CAP straight into the list of the slot at
// `at`), and widens the list's key range. `b` is x's value bin (computed by the caller's loop, one
// per control).
fn gather(r: Round, at: u32, x: f32, b: u32) {
    if (is_nan(x)) {
        return;
    }
    let kx = key_of(x);
    if (kx < r.kbase || b < r.prefix || b > r.top_bin) {
        return;
    }
    if (add_local(kx)) {
        return;
    }
    let j = atomicAdd(&state[at + S_LCOUNT], 1u);
    if (j < params.cut_list) {
        atomicStore(&state[at + S_LIST + j], kx);
    }
}

// This lane's max key over its entries of [begin, end) (NaN skipped) and, with `want_min`, its
// least finite key (the span of top-p's bins); one loop each, so that top-k and min-p do not pay
// for the minimum.
fn lane_extremes(lane: u32, side: u32, base: u32, begin: u32, end: u32,
                 want_min: bool) -> vec2<u32> {
    var local_max = 0u;
    var local_min = 0xffffffffu;
    if (want_min) {
        for (var y = begin + 4u * lane; y < end; y += 4u * WG) {
            let v = load4(side, base, y, end);
            local_max = max_key(max_key(max_key(max_key(local_max, v.x), v.y), v.z), v.w);
            local_min = min_key(min_key(min_key(min_key(local_min, v.x), v.y), v.z), v.w);
        }
    } else {
        for (var y = begin + 4u * lane; y < end; y += 4u * WG) {
            let v = load4(side, base, y, end);
            local_max = max_key(max_key(max_key(max_key(local_max, v.x), v.y), v.z), v.w);
        }
    }
    return vec2<u32>(local_max, local_min);
}

// Whether top-k's cut-off of the row comes from its candidates, gathered in the scan of its max
// (see scan_candidates): top-k is set and below the lane count (k + 1 lanes' maxima bound the
// candidates), the scan has one lane per histogram bin, the row has at most CAND_MAX_SLICES
// slices, and their candidates fit: a slice gives about (k + 1) / 4,096 of its entries on real
// rows (its bound is about the (k+1)-th largest of 4,096 entries), which must stay within half
// of LOCAL_CAP, and the slices' together within half of the list.
fn takes_candidates(info: ReqInfo, side: u32) -> bool {
    let slices = (row_len(side) + params.cut_slice - 1u) / params.cut_slice;
    return WG == BINS && info.top_k != 0u && info.top_k < WG && slices <= CAND_MAX_SLICES
        && params.cut_slice <= LOCAL_CAP * CAND_SUB / 2u / (info.top_k + 1u)
        && info.top_k * slices <= params.cut_list / 2u;
}

// Collects entry x into the workgroup's list when its key is at least t. Keys above +inf's are
// NaN's (t is finite, so negative NaNs' keys fall below it).
fn candidate(t: u32, x: f32) {
    let kx = key_of(x);
    if (kx < t || kx > KEY_POS_INF) {
        return;
    }
    add_local(kx);
}

// Adds the workgroup's list (the first LOCAL_CAP of its l_cnt entries) to the slot's at `at`
// with one global atomic, and widens the slot's key range. With `whole`, a workgroup that found
// more than LOCAL_CAP adds nothing and marks the slot (S_OVER) instead: top-k's candidates are
// of use only all together. Uniform control flow (barriers).
fn flush_list(lane: u32, at: u32, whole: bool) {
    workgroupBarrier();
    if (lane == 0u) {
        let found = atomicLoad(&l_cnt);
        var off = params.cut_list;
        if (whole && found > LOCAL_CAP) {
            atomicStore(&state[at + S_OVER], 1u);
        } else if (found != 0u) {
            off = atomicAdd(&state[at + S_LCOUNT], min(found, LOCAL_CAP));
            atomicMin(&state[at + S_CMIN], atomicLoad(&l_kmin));
            atomicMax(&state[at + S_CMAX], atomicLoad(&l_kmax));
        }
        w_off = off;
    }
    let off = workgroupUniformLoad(&w_off);
    let n = min(atomicLoad(&l_cnt), LOCAL_CAP);
    for (var i = lane; i < n && off + i < params.cut_list; i += WG) {
        atomicStore(&state[at + S_LIST + off + i], l_list[i]);
    }
}

// The scan of the row's max for a row whose top-k takes candidates (uniform control flow): the
// max (and, for top-p, the least finite value) of this workgroup's slice, and its candidates,
// every entry whose key is at least a bound t, added to the slot's list.
//   t: the lanes' maxima over the slice's first CAND_SUB entries go into the log bins below
//      their own max; the bin holding the (k+1)-th largest of them, and the least lane max in it
//      or above, give t. At least k + 1 of those maxima, distinct entries, are at or above t, so
//      t is at most the slice's (k+1)-th largest key, hence at most the row's: the row's k + 1
//      largest entries, and every entry equal to them, are candidates of their slices.
//   S_LOWER, the largest t of the row's workgroups so far, is such a bound too: each workgroup
//      raises it and gathers from the larger of the two.
// The slice is then read once for its max and its candidates (the first CAND_SUB entries a
// second time, from the cache). On real rows a slice gives about k + 1 candidates per CAND_SUB
// entries; `pick` selects from the list alone (pick_candidates).
fn scan_candidates(lane: u32, at: u32, side: u32, base: u32, begin: u32, end: u32, k: u32,
                   want_min: bool) {
    let sub_end = min(end, begin + CAND_SUB);
    let mine = lane_extremes(lane, side, base, begin, sub_end, false).x;
    atomicMax(&red_sub, mine);
    workgroupBarrier();
    let m1 = atomicLoad(&red_sub);
    let finite = mine >= KEY_MIN_FINITE && mine < KEY_POS_INF;
    if (finite) {
        atomicAdd(&h_lo[log_bin(value_of(mine), value_of(m1))], 1u);
    }
    workgroupBarrier();
    suf_lo[lane] = atomicLoad(&h_lo[lane]);
    suf_hi[lane] = 0u;
    atomicStore(&h_lo[lane], 0u);
    workgroupBarrier();
    suffix_sums(lane);
    choose(lane, 0u, k + 1u);
    // The least lane max in the chosen bin or above (fewer than k + 1 finite maxima: every
    // finite entry is a candidate, t = KEY_MIN_FINITE).
    if (finite && suf_lo[0] > k && log_bin(value_of(mine), value_of(m1)) >= w_digit) {
        atomicMin(&red_min, mine);
    }
    workgroupBarrier();
    if (lane == 0u) {
        var t = KEY_MIN_FINITE;
        if (suf_lo[0] > k) {
            t = max(atomicLoad(&red_min), KEY_MIN_FINITE);
        }
        w_prefix = max(t, atomicMax(&state[at + S_LOWER], t));
        atomicStore(&red_min, 0xffffffffu);
    }
    let t = workgroupUniformLoad(&w_prefix);
    var local_max = 0u;
    var local_min = 0xffffffffu;
    for (var y = begin + 4u * lane; y < end; y += 4u * WG) {
        let v = load4(side, base, y, end);
        local_max = max_key(max_key(max_key(max_key(local_max, v.x), v.y), v.z), v.w);
        if (want_min) {
            local_min = min_key(min_key(min_key(min_key(local_min, v.x), v.y), v.z), v.w);
        }
        candidate(t, v.x);
        candidate(t, v.y);
        candidate(t, v.z);
        candidate(t, v.w);
    }
    atomicMax(&red_key, local_max);
    atomicMin(&red_min, local_min);
    flush_list(lane, at, true);
    if (lane == 0u) {
        atomicMax(&state[at + S_MAX], atomicLoad(&red_key));
        atomicMin(&state[at + S_RMIN], atomicLoad(&red_min));
    }
}

fn row_len(side: u32) -> u32 {
    return select(params.vocab, params.draft_vocab, side != 0u);
}

// The stage after `s` for a request: the next control it sets, DONE when none.
fn next_stage(s: u32, info: ReqInfo) -> u32 {
    var t = s + 1u;
    if (t == ST_KB && info.top_k == 0u) {
        t = ST_PB;
    }
    if (t == ST_PB && !(info.top_p < 1.0)) {
        t = ST_DONE;
    }
    return t;
}

// Moves the slot at `at` to stage `next`; entering top-p, also sets its bin scale from the row's
// max and the lowest candidate (the row's min, or kbase where earlier controls cut higher).
fn set_stage(at: u32, next: u32, kbase: u32, inv_t: f32) {
    if (next == ST_PB) {
        let m = value_of(atomicLoad(&state[at + S_MAX]));
        let lower = value_of(max(kbase, atomicLoad(&state[at + S_RMIN])));
        atomicStore(&state[at + S_SCALE], bitcast<u32>(bin_scale(m, lower, inv_t)));
    }
    atomicStore(&state[at + S_STAGE], next);
}

// The cut-off of a row whose selects are over: -inf when nothing is cut.
fn cut_of(kbase: u32) -> f32 {
    if (kbase == KEY_MIN_FINITE) {
        return bitcast<f32>(NEG_INF_BITS);
    }
    return value_of(kbase);
}

// The scan of ST_KC / ST_PC: the entries of the chosen bin (the slot's prefix after ST_KB /
// ST_PB; with r.top_bin, the bins above it too) in this workgroup's slice, added to the slot's
// list with one global atomic for the workgroup's first LOCAL_CAP (the slot's count may pass
// params.cut_list: `pick` then reads the row), and the list's key range. Called in uniform
// control flow (barriers).
fn gather_bin(r: Round, lane: u32, at: u32, side: u32, base: u32, begin: u32, end: u32) {
    if (r.log_bins) {
        for (var y = begin + 4u * lane; y < end; y += 4u * WG) {
            let v = load4(side, base, y, end);
            gather(r, at, v.x, log_bin(v.x, r.m));
            gather(r, at, v.y, log_bin(v.y, r.m));
            gather(r, at, v.z, log_bin(v.z, r.m));
            gather(r, at, v.w, log_bin(v.w, r.m));
        }
    } else {
        for (var y = begin + 4u * lane; y < end; y += 4u * WG) {
            let v = load4(side, base, y, end);
            gather(r, at, v.x, bin_digit(v.x, r.m, r.inv_t, r.scale));
            gather(r, at, v.y, bin_digit(v.y, r.m, r.inv_t, r.scale));
            gather(r, at, v.z, bin_digit(v.z, r.m, r.inv_t, r.scale));
            gather(r, at, v.w, bin_digit(v.w, r.m, r.inv_t, r.scale));
        }
    }
    flush_list(lane, at, false);
}

@compute @workgroup_size(256)
fn init(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let slot = slot_of(wid.y, wid.z);
    if (slot == NO_INDEX) {
        return;
    }
    let info = row_req(wid.y);
    let filtered = (info.flags & REQ_FILTER) != 0u && (info.flags & REQ_GREEDY) == 0u;
    let at = state_at(wid.y, wid.z);
    if (!filtered) {
        if (lane == 0u) {
            atomicStore(&state[at + S_STAGE], ST_DONE);
            cutoffs[slot] = bitcast<f32>(NEG_INF_BITS);
        }
        return;
    }
    // 256 lanes: one bin each.
    atomicStore(&state[at + S_HIST_LO + lane], 0u);
    atomicStore(&state[at + S_HIST_HI + lane], 0u);
    if (lane == 0u) {
        atomicStore(&state[at + S_MAX], 0u);
        atomicStore(&state[at + S_RMIN], 0xffffffffu);
        atomicStore(&state[at + S_STAGE], ST_MAX);
        atomicStore(&state[at + S_KBASE], KEY_MIN_FINITE);
        atomicStore(&state[at + S_PREFIX], 0u);
        atomicStore(&state[at + S_OVER], 0u);
        atomicStore(&state[at + S_LOWER], 0u);
        atomicStore(&state[at + S_LCOUNT], 0u);
        atomicStore(&state[at + S_CMIN], 0xffffffffu);
        atomicStore(&state[at + S_CMAX], 0u);
    }
}

// What every scan workgroup starts with: its histogram and accumulators cleared, and lane 0's
// view of the slot (for the local row `row` of `side`) in workgroup memory, with `cand` whether
// the row takes top-k's candidates (w_cand). Returns the slot's stage (ST_DONE for a side with no
// row). Uniform control flow (a barrier).
fn scan_prologue(row: u32, side: u32, lane: u32, cand: bool) -> u32 {
    for (var b = lane; b < BINS; b += WG) {
        atomicStore(&h_lo[b], 0u);
        atomicStore(&h_hi[b], 0u);
    }
    if (lane == 0u) {
        let slot = slot_of(row, side);
        var stage = ST_DONE;
        if (slot != NO_INDEX) {
            let at = state_at(row, side);
            stage = atomicLoad(&state[at + S_STAGE]);
            w_kbase = atomicLoad(&state[at + S_KBASE]);
            w_prefix = atomicLoad(&state[at + S_PREFIX]);
            w_max = atomicLoad(&state[at + S_MAX]);
            w_scale = bitcast<f32>(atomicLoad(&state[at + S_SCALE]));
            w_all = atomicLoad(&state[at + S_KALL]);
        }
        w_stage = stage;
        w_cand = select(0u, 1u, cand && stage == ST_MAX && takes_candidates(row_req(row), side));
        atomicStore(&red_key, 0u);
        atomicStore(&red_min, 0xffffffffu);
        atomicStore(&red_sub, 0u);
        atomicStore(&l_cnt, 0u);
        atomicStore(&l_kmin, 0xffffffffu);
        atomicStore(&l_kmax, 0u);
    }
    // Also the barrier after the clears above.
    return workgroupUniformLoad(&w_stage);
}

// The max (NaN skipped) of this workgroup's slice of the row and, with `want_min`, its least
// finite value (the span of top-p's bins), into the slot. Uniform control flow (a barrier).
fn slice_max(lane: u32, at: u32, side: u32, base: u32, begin: u32, end: u32, want_min: bool) {
    let e = lane_extremes(lane, side, base, begin, end, want_min);
    atomicMax(&red_key, e.x);
    atomicMin(&red_min, e.y);
    workgroupBarrier();
    if (lane == 0u) {
        atomicMax(&state[at + S_MAX], atomicLoad(&red_key));
        atomicMin(&state[at + S_RMIN], atomicLoad(&red_min));
    }
}

// The first scan (every filtered row is at ST_MAX after init): the rows' max. A batch where
// some request's top-k may take candidates runs scan_top_k instead; each is an entry point of
// its own, so that this one does not carry the candidates' code and workgroup memory (with
// them, the max scan of top-p alone measured up to 1.05x slower on an H100).
@compute @workgroup_size(WG)
fn scan_max(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let side = wid.z;
    let stage = scan_prologue(wid.y, side, lane, false);
    let len = row_len(side);
    let begin = wid.x * params.cut_slice;
    if (stage != ST_MAX || begin >= len) {
        return;
    }
    let info = row_req(wid.y);
    let end = min(begin + params.cut_slice, len);
    slice_max(lane, state_at(wid.y, side), side, row_base(wid.y, side), begin, end,
              info.top_p < 1.0);
}

// scan_max with top-k's candidates for the rows that take them (scan_candidates). Its preamble
// repeats scan_max's rather than sharing a function with a `cand` flag: workgroup memory is
// reserved by static use, so a shared function would put the candidates' arrays back into
// scan_max.
@compute @workgroup_size(WG)
fn scan_top_k(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(local_invocation_index) lane: u32) {
    let side = wid.z;
    let stage = scan_prologue(wid.y, side, lane, true);
    let len = row_len(side);
    let begin = wid.x * params.cut_slice;
    if (stage != ST_MAX || begin >= len) {
        return;
    }
    let end = min(begin + params.cut_slice, len);
    let at = state_at(wid.y, side);
    let info = row_req(wid.y);
    let base = row_base(wid.y, side);
    if (workgroupUniformLoad(&w_cand) != 0u) {
        scan_candidates(lane, at, side, base, begin, end, info.top_k, info.top_p < 1.0);
    } else {
        slice_max(lane, at, side, base, begin, end, info.top_p < 1.0);
    }
}

// The later scans: the value bins' histograms and gatherings (ST_KB .. ST_PC).
@compute @workgroup_size(WG)
fn scan(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let side = wid.z;
    let stage = scan_prologue(wid.y, side, lane, false);
    let len = row_len(side);
    let begin = wid.x * params.cut_slice;
    if (stage == ST_DONE || stage == ST_MAX || begin >= len) {
        return;
    }
    let end = min(begin + params.cut_slice, len);
    let at = state_at(wid.y, side);
    let info = row_req(wid.y);
    let inv_t = info.inv_temperature;
    let base = row_base(wid.y, side);
    let m = value_of(w_max);
    // The gathering of the chosen bin (ST_KC, ST_PC), or the histogram of the value bins of the
    // keys >= kbase (ST_KB, ST_PB).
    let kbase = w_kbase;
    if (stage == ST_KC || stage == ST_PC) {
        let top_bin = select(w_prefix, 255u, stage == ST_KC && w_all != 0u);
        let r = Round(kbase, w_prefix, 0u, 24u, stage == ST_PC, m, inv_t, stage == ST_KC,
                      top_bin, w_scale, NO_INDEX);
        gather_bin(r, lane, at, side, base, begin, end);
        return;
    }
    if (stage == ST_KB) {
        for (var y = begin + 4u * lane; y < end; y += 4u * WG) {
            let v = load4(side, base, y, end);
            count_log_bin(kbase, m, v.x);
            count_log_bin(kbase, m, v.y);
            count_log_bin(kbase, m, v.z);
            count_log_bin(kbase, m, v.w);
        }
    } else {
        let scale = w_scale;
        for (var y = begin + 4u * lane; y < end; y += 4u * WG) {
            let v = load4(side, base, y, end);
            add_mass_bin(kbase, m, inv_t, scale, v.x);
            add_mass_bin(kbase, m, inv_t, scale, v.y);
            add_mass_bin(kbase, m, inv_t, scale, v.z);
            add_mass_bin(kbase, m, inv_t, scale, v.w);
        }
    }
    workgroupBarrier();
    // Add the workgroup's bins into the row's: a wrap of lo carries one into hi, so the pair
    // is the exact 64-bit sum whatever the order of the workgroups.
    for (var b = lane; b < BINS; b += WG) {
        let lo = atomicLoad(&h_lo[b]);
        let hi = atomicLoad(&h_hi[b]);
        if (lo != 0u) {
            let old = atomicAdd(&state[at + S_HIST_LO + b], lo);
            let carry = select(0u, 1u, old + lo < old);
            if (hi + carry != 0u) {
                atomicAdd(&state[at + S_HIST_HI + b], hi + carry);
            }
        } else if (hi != 0u) {
            atomicAdd(&state[at + S_HIST_HI + b], hi);
        }
    }
}

// Suffix sums of the histogram in suf_lo / suf_hi: suf[b] = weight of the bins >= b (8
// doubling steps). 256 lanes, one bin each; uniform control flow (barriers).
fn suffix_sums(lane: u32) {
    for (var off = 1u; off < BINS; off <<= 1u) {
        var lo = suf_lo[lane];
        var hi = suf_hi[lane];
        if (lane + off < BINS) {
            let o_lo = suf_lo[lane + off];
            let n_lo = lo + o_lo;
            hi = hi + suf_hi[lane + off] + select(0u, 1u, n_lo < lo);
            lo = n_lo;
        }
        workgroupBarrier();
        suf_lo[lane] = lo;
        suf_hi[lane] = hi;
        workgroupBarrier();
    }
}

// The chosen bin after suffix_sums, into w_digit: the highest b whose suffix reaches the need
// (the walk from the top stops there), with the weight above it in w_acc. The walk would stop at
// no bin only if the need exceeded the total (it cannot); it would then end on bin 0 having
// added every bin. Uniform control flow (barriers).
fn choose(lane: u32, n_hi: u32, n_lo: u32) {
    if (lane == 0u) {
        w_digit = 0u;
        w_acc_hi = suf_hi[0];
        w_acc_lo = suf_lo[0];
    }
    workgroupBarrier();
    var above_lo = 0u;
    var above_hi = 0u;
    if (lane + 1u < BINS) {
        above_lo = suf_lo[lane + 1u];
        above_hi = suf_hi[lane + 1u];
    }
    if (ge64(suf_hi[lane], suf_lo[lane], n_hi, n_lo) && !ge64(above_hi, above_lo, n_hi, n_lo)) {
        w_digit = lane;
        w_acc_hi = above_hi;
        w_acc_lo = above_lo;
    }
    workgroupBarrier();
}

// Lane 0: what is still needed inside the chosen bin (need - weight above it).
fn take_need_above() {
    let acc_lo = w_acc_lo;
    let n_lo = w_need_lo;
    w_need_hi = w_need_hi - w_acc_hi - select(0u, 1u, n_lo < acc_lo);
    w_need_lo = n_lo - acc_lo;
}

// The shared leading bytes of the keys in [lo, hi] as a prefix, into w_prefix, and how many
// there are (the first radix round to run) into w_stop. Lane 0.
fn shared_bytes(lo: u32, hi: u32) {
    let first = countLeadingZeros(lo ^ hi) / 8u;
    var prefix = 0u;
    if (first == 4u) {
        prefix = lo;
    } else if (first > 0u) {
        prefix = lo >> (32u - 8u * first);
    }
    w_prefix = prefix;
    w_stop = first;
}

// Lane 0, after suffix_sums of a mass histogram of every candidate: top-p's need, the mass its
// upper set must reach, from the total.
fn set_top_p_need(top_p: f32) {
    let t_hi = suf_hi[0];
    let t_lo = suf_lo[0];
    let total = f32(t_hi) * 4294967296.0 + f32(t_lo);
    let nf = ceil(top_p * total);
    let hi = floor(nf * (1.0 / 4294967296.0));
    w_need_hi = u32(hi);
    w_need_lo = u32(nf - hi * 4294967296.0);
    // Rounding of the f32 total must not ask for more than there is.
    if (ge64(w_need_hi, w_need_lo, t_hi, t_lo)) {
        w_need_hi = t_hi;
        w_need_lo = t_lo;
    }
}

// The start of radix round `round`: the workgroup histogram cleared, and t carrying the round,
// its shift and the digits chosen so far (w_prefix). 256 lanes. Uniform control flow.
fn round_start(lane: u32, t: Round, round: u32) -> Round {
    atomicStore(&h_lo[lane], 0u);
    atomicStore(&h_hi[lane], 0u);
    workgroupBarrier();
    var r = t;
    r.prefix = w_prefix;
    r.round = round;
    r.shift = 24u - 8u * round;
    return r;
}

// The end of a radix round whose histogram is filled: its digit chosen (the first round with
// `top_p` below 1 sets the need from its total: every candidate carries the shared prefix, so
// that total is the mass of them all) and appended to w_prefix. Uniform control flow.
fn round_end(lane: u32, first_round: bool, top_p: f32) {
    workgroupBarrier();
    suf_lo[lane] = atomicLoad(&h_lo[lane]);
    suf_hi[lane] = atomicLoad(&h_hi[lane]);
    workgroupBarrier();
    suffix_sums(lane);
    if (first_round && top_p < 1.0) {
        if (lane == 0u) {
            set_top_p_need(top_p);
        }
        workgroupBarrier();
    }
    choose(lane, w_need_hi, w_need_lo);
    if (lane == 0u) {
        take_need_above();
        w_prefix = (w_prefix << 8u) | w_digit;
    }
    workgroupBarrier();
}

// Radix rounds `first` .. 3 over the slot's list of `count` keys, or over the row (restricted
// to t.only_bin) when `from_list` is false: the largest key whose upper set weighs w_need (with
// `top_p` below 1, top_p of the first round's total). Leaves the key in w_prefix. Uniform
// control flow (barriers).
fn radix_rounds(lane: u32, at: u32, t: Round, first: u32, from_list: bool, count: u32,
                top_p: f32, side: u32, base: u32, len: u32) {
    for (var round = first; round < 4u; round++) {
        let r = round_start(lane, t, round);
        if (from_list) {
            for (var i = lane; i < count; i += BINS) {
                radix_add(r, value_of(atomicLoad(&state[at + S_LIST + i])));
            }
        } else {
            // One workgroup reads the whole row: eight loads per lane in flight.
            for (var y = 8u * lane; y < len; y += 8u * BINS) {
                let v = load4(side, base, y, len);
                let w = load4(side, base, y + 4u, len);
                radix_add(r, v.x);
                radix_add(r, v.y);
                radix_add(r, v.z);
                radix_add(r, v.w);
                radix_add(r, w.x);
                radix_add(r, w.y);
                radix_add(r, w.z);
                radix_add(r, w.w);
            }
        }
        round_end(lane, round == first, top_p);
    }
}

// radix_rounds over the first `count` keys of p_keys (pick_top_k's). A function of its own so
// that `pick`, which never reads p_keys, does not reserve its 8 KiB: with them it measured up
// to 1.05x slower (top-p alone, an H100).
fn radix_rounds_kept(lane: u32, t: Round, first: u32, count: u32, top_p: f32) {
    for (var round = first; round < 4u; round++) {
        let r = round_start(lane, t, round);
        for (var i = lane; i < count; i += BINS) {
            radix_add(r, value_of(p_keys[i]));
        }
        round_end(lane, round == first, top_p);
    }
}

// Lane 0, top-p after top-k's cut-off (w_prefix) over a list of keys in [S_CMIN, S_CMAX] that
// holds every key at or above that cut-off: the cut-off becomes top-p's lower key bound
// (w_kbase), and the leading bytes of the keys at or above it are skipped (shared_bytes; a
// cut-off below S_CMIN, where top-k cut nothing, shares them from S_CMIN).
fn top_p_after_top_k(at: u32) {
    w_kbase = w_prefix;
    shared_bytes(max(w_prefix, atomicLoad(&state[at + S_CMIN])), atomicLoad(&state[at + S_CMAX]));
}

// The last step of top-k (ST_KC) and top-p (ST_PC): radix rounds over the chosen bin's entries,
// from the slot's list, or from the row (restricted to the bin) when the bin was too full for
// the list. The largest key whose upper set within the bin weighs (counts or masses) what is
// still needed is the cut-off. The rounds of the leading bytes all the bin's keys share are
// skipped: they would choose those bytes, since the chosen bin weighs at least what is still
// needed (at least 1). A bin whose entries are all equal (ties, coarse number formats) needs no
// round at all.
// Top-k followed by top-p, with every entry from the chosen bin up in the list (S_KALL; the
// need then still the whole k): the list holds every candidate of top-p too, so top-p's
// cut-off is selected from it right after top-k's, by mass rounds over its keys at or above
// top-k's cut-off, and the row is never read for top-p.
// Uniform control flow (barriers).
fn finish_bin(lane: u32, at: u32, local_row: u32, side: u32, info: ReqInfo, stage: u32) {
    if (lane == 0u) {
        w_stage = atomicLoad(&state[at + S_LCOUNT]);
        w_need_hi = atomicLoad(&state[at + S_NEED_HI]);
        w_need_lo = atomicLoad(&state[at + S_NEED_LO]);
        w_kbase = atomicLoad(&state[at + S_KBASE]);
        w_digit = atomicLoad(&state[at + S_PREFIX]);
        w_max = atomicLoad(&state[at + S_MAX]);
        w_scale = bitcast<f32>(atomicLoad(&state[at + S_SCALE]));
        w_all = select(0u, atomicLoad(&state[at + S_KALL]), stage == ST_KC);
        // The bytes every entry of the bin shares (those of its least and greatest keys) are
        // the digits their rounds would choose: start after them.
        shared_bytes(atomicLoad(&state[at + S_CMIN]), atomicLoad(&state[at + S_CMAX]));
    }
    let first_round = workgroupUniformLoad(&w_stop);
    let count = workgroupUniformLoad(&w_stage);
    let all = workgroupUniformLoad(&w_all) != 0u;
    let from_list = count <= params.cut_list;
    // Every entry of the list is in the bin (or above it, with S_KALL): only the row needs the
    // bin test.
    let only_bin = select(w_digit, NO_INDEX, from_list);
    let t = Round(w_kbase, 0u, 0u, 24u, stage == ST_PC, value_of(w_max), info.inv_temperature,
                  stage == ST_KC, 0u, w_scale, only_bin);
    let base = row_base(local_row, side);
    let len = row_len(side);
    radix_rounds(lane, at, t, first_round, from_list, count, 1.0, side, base, len);
    if (all) {
        // Top-p over the list's keys at or above top-k's cut-off: they share the leading bytes
        // of that key and the list's greatest. The barrier first: radix_rounds may have run no
        // round (and reached no barrier), and other lanes may still be reading w_kbase for `t`
        // when lane 0 rewrites it (`all` is uniform, so every lane reaches the barrier).
        workgroupBarrier();
        if (lane == 0u) {
            top_p_after_top_k(at);
        }
        let first_p = workgroupUniformLoad(&w_stop);
        var tp = t;
        tp.kbase = w_kbase;
        tp.mass_mode = true;
        radix_rounds(lane, at, tp, first_p, true, count, info.top_p, side, base, len);
    }
    if (lane == 0u) {
        let key = w_prefix;
        atomicStore(&state[at + S_KBASE], key);
        var next = next_stage(stage, info);
        if (all) {
            next = next_stage(ST_PC, info);
        }
        set_stage(at, next, key, info.inv_temperature);
        if (next == ST_DONE) {
            cutoffs[w_slot] = cut_of(key);
        }
    }
}

// Lane 0 of `pick` after the max scan: the row's next stage (returned), and min-p's bound as the
// new kbase (also in w_kbase; a non-finite max cuts nothing: kbase is still KEY_MIN_FINITE then).
fn pick_bound(at: u32, info: ReqInfo) -> u32 {
    var next = next_stage(ST_MAX, info);
    var kbase = atomicLoad(&state[at + S_KBASE]);
    let max_key = atomicLoad(&state[at + S_MAX]);
    if (max_key < KEY_MIN_FINITE || max_key >= KEY_POS_INF) {
        next = ST_DONE;
    } else if (!is_neg_inf(info.log_min_p)) {
        kbase = min_p_bound(max_key, info.inv_temperature, info.log_min_p);
        atomicStore(&state[at + S_KBASE], kbase);
    }
    set_stage(at, next, kbase, info.inv_temperature);
    if (next == ST_DONE) {
        cutoffs[w_slot] = cut_of(kbase);
    }
    w_kbase = kbase;
    w_max = max_key;
    return next;
}

// Keeps key `kx` of the list in p_keys when it is at least floor (the zero keys past the list's
// end never are: floor is finite); counts it also past P_CAP.
fn keep(kx: u32, floor: u32) {
    if (kx >= floor) {
        let i = atomicAdd(&p_cnt, 1u);
        if (i < P_CAP) {
            p_keys[i] = kx;
        }
    }
}

// The slot's list of `count` keys through keep (four loads in flight per lane).
fn keep_list(lane: u32, at: u32, count: u32, floor: u32) {
    for (var i = 4u * lane; i < count; i += 4u * BINS) {
        let a = atomicLoad(&state[at + S_LIST + i]);
        var b = 0u;
        var c = 0u;
        var d = 0u;
        if (i + 1u < count) {
            b = atomicLoad(&state[at + S_LIST + i + 1u]);
        }
        if (i + 2u < count) {
            c = atomicLoad(&state[at + S_LIST + i + 2u]);
        }
        if (i + 3u < count) {
            d = atomicLoad(&state[at + S_LIST + i + 3u]);
        }
        keep(a, floor);
        keep(b, floor);
        keep(c, floor);
        keep(d, floor);
    }
}

// `pick` after the scan of a row whose top-k takes candidates (uniform control flow). With a
// finite max and every candidate in the list: min-p's bound (kbase) from the max, then the list's
// count at or above floor = max(kbase, S_LOWER). S_LOWER is at most the row's (k+1)-th largest
// key, so a count of at most k means the row holds at most k entries at or above kbase (top-k
// cuts nothing, as the histogram's total tells in the value bins' stages); otherwise the radix
// rounds over the list select the k-th largest key, which is the row's: the list holds the
// row's k + 1 largest entries. Top-p then selects from the list's keys at or above top-k's
// cut-off, every one of which the list holds. A workgroup with too many candidates (ties, or a
// slice of equal finite masks) leaves the row to the value bins' stages, which follow.
fn pick_candidates(lane: u32, at: u32, local_row: u32, side: u32, info: ReqInfo) {
    if (lane == 0u) {
        // The value bins' next stage and min-p's bound, as for a row without candidates; the
        // list's selection below moves the row on to DONE. A non-finite max (the only way next
        // is DONE here: the request sets top-k) or an incomplete list leaves the row where
        // pick_bound put it.
        let next = pick_bound(at, info);
        let count = atomicLoad(&state[at + S_LCOUNT]);
        let listed = atomicLoad(&state[at + S_OVER]) == 0u && count <= params.cut_list;
        w_stop = select(1u, 0u, next != ST_DONE && listed);
        w_count = count;
        w_floor = max(w_kbase, atomicLoad(&state[at + S_LOWER]));
        w_top_p = select(0u, 1u, info.top_p < 1.0);
        atomicStore(&p_cnt, 0u);
    }
    if (workgroupUniformLoad(&w_stop) != 0u) {
        return;
    }
    let count = workgroupUniformLoad(&w_count);
    let floor = w_floor;
    keep_list(lane, at, count, floor);
    workgroupBarrier();
    if (lane == 0u) {
        let kept = atomicLoad(&p_cnt);
        // More than p_keys holds: the selects read the slot's list, from floor up.
        w_count = select(count, kept, kept <= P_CAP);
        w_in_keys = select(0u, 1u, kept <= P_CAP);
        let cuts = kept > info.top_k;
        w_all = select(0u, 1u, cuts);
        if (cuts) {
            w_need_hi = 0u;
            w_need_lo = info.top_k;
            shared_bytes(max(floor, atomicLoad(&state[at + S_CMIN])),
                         atomicLoad(&state[at + S_CMAX]));
        } else {
            w_prefix = w_kbase;
        }
    }
    let cuts = workgroupUniformLoad(&w_all) != 0u;
    let first = workgroupUniformLoad(&w_stop);
    let in_keys = workgroupUniformLoad(&w_in_keys) != 0u;
    let n = workgroupUniformLoad(&w_count);
    let base = row_base(local_row, side);
    let len = row_len(side);
    let t = Round(floor, 0u, 0u, 24u, false, value_of(w_max), info.inv_temperature, true, 0u,
                  0.0, NO_INDEX);
    if (cuts) {
        if (in_keys) {
            radix_rounds_kept(lane, t, first, n, 1.0);
        } else {
            radix_rounds(lane, at, t, first, true, n, 1.0, side, base, len);
        }
    }
    if (lane == 0u) {
        if (info.top_p < 1.0) {
            top_p_after_top_k(at);
        } else {
            w_kbase = w_prefix;
        }
    }
    if (workgroupUniformLoad(&w_top_p) != 0u) {
        let first_p = workgroupUniformLoad(&w_stop);
        var tp = t;
        tp.kbase = w_kbase;
        tp.mass_mode = true;
        if (in_keys) {
            radix_rounds_kept(lane, tp, first_p, n, info.top_p);
        } else {
            radix_rounds(lane, at, tp, first_p, true, n, info.top_p, side, base, len);
        }
    }
    if (lane == 0u) {
        let key = select(w_kbase, w_prefix, info.top_p < 1.0);
        atomicStore(&state[at + S_KBASE], key);
        set_stage(at, ST_DONE, key, info.inv_temperature);
        cutoffs[w_slot] = cut_of(key);
    }
}

// Lane 0's view of the slot's stage and cut-off index, in workgroup memory, with `cand` whether
// the row takes top-k's candidates (w_cand); returns the stage (ST_DONE for a side with no row).
// Uniform control flow (a barrier).
fn pick_prologue(row: u32, side: u32, lane: u32, cand: bool) -> u32 {
    if (lane == 0u) {
        let slot = slot_of(row, side);
        var stage = ST_DONE;
        if (slot != NO_INDEX) {
            stage = atomicLoad(&state[state_at(row, side) + S_STAGE]);
        }
        w_slot = slot;
        w_stage = stage;
        w_cand = select(0u, 1u, cand && stage == ST_MAX && takes_candidates(row_req(row), side));
    }
    return workgroupUniformLoad(&w_stage);
}

// The picks: one workgroup per slot; 256 lanes, one histogram bin each (within WebGPU's default
// limit).
// The pick after scan_max: min-p's bound and the row's next stage (lane 0).
@compute @workgroup_size(256)
fn pick_max(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let side = wid.z;
    if (pick_prologue(wid.y, side, lane, false) == ST_MAX && lane == 0u) {
        _ = pick_bound(state_at(wid.y, side), row_req(wid.y));
    }
}

// The pick after scan_top_k: pick_max's, or for a row whose top-k takes candidates its cut-off
// from them (pick_candidates).
@compute @workgroup_size(256)
fn pick_top_k(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(local_invocation_index) lane: u32) {
    let side = wid.z;
    if (pick_prologue(wid.y, side, lane, true) != ST_MAX) {
        return;
    }
    let at = state_at(wid.y, side);
    let info = row_req(wid.y);
    if (workgroupUniformLoad(&w_cand) != 0u) {
        pick_candidates(lane, at, wid.y, side, info);
    } else if (lane == 0u) {
        _ = pick_bound(at, info);
    }
}

// The picks after the later scans (ST_KB .. ST_PC).
@compute @workgroup_size(256)
fn pick(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let side = wid.z;
    let stage = pick_prologue(wid.y, side, lane, false);
    if (stage == ST_DONE || stage == ST_MAX) {
        return;
    }
    let at = state_at(wid.y, side);
    let info = row_req(wid.y);
    let inv_t = info.inv_temperature;
    if (stage == ST_KC || stage == ST_PC) {
        finish_bin(lane, at, wid.y, side, info, stage);
        return;
    }
    // The histogram of top-k's (ST_KB) or top-p's (ST_PB) value bins.
    let mass_mode = stage == ST_PB;
    // Take the row's histogram and clear it for the next use.
    suf_lo[lane] = atomicLoad(&state[at + S_HIST_LO + lane]);
    suf_hi[lane] = atomicLoad(&state[at + S_HIST_HI + lane]);
    atomicStore(&state[at + S_HIST_LO + lane], 0u);
    atomicStore(&state[at + S_HIST_HI + lane], 0u);
    if (lane == 0u) {
        w_need_hi = atomicLoad(&state[at + S_NEED_HI]);
        w_need_lo = atomicLoad(&state[at + S_NEED_LO]);
        w_kbase = atomicLoad(&state[at + S_KBASE]);
    }
    workgroupBarrier();
    suffix_sums(lane);
    if (lane == 0u) {
        // The target, from the histogram's total.
        var stop = 0u;
        if (mass_mode) {
            set_top_p_need(info.top_p);
        } else {
            w_need_hi = 0u;
            w_need_lo = info.top_k;
            if (suf_hi[0] == 0u && suf_lo[0] <= info.top_k) {
                stop = 1u;
            }
        }
        w_stop = stop;
    }
    if (workgroupUniformLoad(&w_stop) != 0u) {
        // Top-k with no more than k candidates: nothing to cut, kbase stays.
        if (lane == 0u) {
            let next = next_stage(ST_KC, info);
            set_stage(at, next, w_kbase, inv_t);
            if (next == ST_DONE) {
                cutoffs[w_slot] = cut_of(w_kbase);
            }
        }
        return;
    }
    choose(lane, w_need_hi, w_need_lo);
    if (lane == 0u) {
        // Top-k before top-p gathers every entry from the chosen bin up when they fit the list
        // (the need stays k): top-p is then selected from that list (finish_bin). A count
        // histogram's sums fit their low words.
        let all = stage == ST_KB && info.top_p < 1.0 && suf_lo[w_digit] <= params.cut_list;
        if (!all) {
            take_need_above();
        }
        atomicStore(&state[at + S_KALL], select(0u, 1u, all));
        // The prefix is the chosen value bin, which ST_KC / ST_PC gathers.
        atomicStore(&state[at + S_NEED_HI], w_need_hi);
        atomicStore(&state[at + S_NEED_LO], w_need_lo);
        atomicStore(&state[at + S_PREFIX], w_digit);
        atomicStore(&state[at + S_LCOUNT], 0u);
        atomicStore(&state[at + S_CMIN], 0xffffffffu);
        atomicStore(&state[at + S_CMAX], 0u);
        set_stage(at, stage + 1u, w_kbase, inv_t);
    }
}

// row_stats — one pass over every target row (and draft-logit row) of a window.
// CPU twin: src/cpu/row_stats.rs. Pipeline label: specdec.row_stats.block.
//
// Dispatch `block`: x = block of `block_chunks` chunks of a row, y = row within the window; one
// workgroup of CHUNK_LANES (64) invocations. For each chunk of its block the workgroup computes
// the chunk's statistics in the fixed order of the statistics contract (common.wgsl): each lane
// keeps an online (max, Σexp, argmax) over its 64 entries, four at a time (push4), the lanes
// fold as a tree (lane i takes
// lane i+s for s = 32 .. 1), and lane 0 writes the chunk's RowStats. The merge of the chunks of a
// row (in runs of chunks, common.wgsl) happens in the verify kernel. Rows whose logits start on 16-byte
// boundaries are read with 16-byte loads (PARAM_VEC4); the order of operations is the same.
// Dispatch `block_wide`: the same grid for small all-greedy batches (MAX_ONLY, the host's WIDE
// specialisation), each chunk over the device's workgroup size (max_chunks).
// Half-precision target rows with no filters (PLAIN_F16 / PLAIN_BF16) take half_chunks: one
// 16-byte load is 8 entries, two lanes' groups, and each invocation plays those two lanes (the
// contract's order again, so the same bits as f32 rows holding the widened values).
//
// NaN rules (the same in the twin): a NaN logit counts as -inf for max / argmax / Σexp and sets
// ROW_T_NAN; +inf sets ROW_T_POSINF. A row with either flag, or whose max is -inf (all -inf),
// is non-finite: the verify pass stops the request there and emits the row's argmax.
// Argmax ties go to the lowest index; an all -inf / NaN row reports index 0.

// Bindings 0-2 (params, target_logits, draft_values) and t_elem / d_elem: shaders/rows.wgsl.
@group(0) @binding(3) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(4) var<storage, read> row_info: array<vec4<u32>>;
// Binding 5, the chunk partials, and `store_partial`: partials_plain.wgsl (partials_atomic.wgsl in
// row_stats_verify).
// The same ranges as bindings 1 and 2, seen as vec4 (used only when PARAM_VEC4 is set).
@group(0) @binding(6) var<storage, read> target_vec4: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> draft_vec4: array<vec4<u32>>;
// Per-row logit cut-offs from the cutoff pass (read only when PARAM_CUTOFF is set): target rows,
// then draft rows after total_rows. Entries below a row's cut-off count as -inf.
@group(0) @binding(8) var<storage, read> cutoffs: array<f32>;

// Pipeline specialisations (override constants, so a pipeline without them carries none of
// their code or registers): RAW_SUMS also reduces the raw rows (raw logprobs; the batch sets
// PARAM_RAW), ENTROPY keeps Σ exp(z) z for typical-acceptance rows.
override RAW_SUMS: bool = false;
override ENTROPY: bool = false;
// MAX_ONLY: every request of the batch is greedy and none asks for raw sums, so no row keeps a
// sum and no draft row is read. The rows' runtime test gives the same values; the constant
// takes the sums' code and registers out of the pipeline (greedy GPU time 0.93x on an H200).
override MAX_ONLY: bool = false;
// PLAIN_F32 (declared in rows.wgsl): f32 rows and no cut-off; skips the mask too.
// PLAIN_F16 / PLAIN_BF16 (rows.wgsl): half target rows and no cut-off; half_chunks, or with
// HALF_WORDS the f32 paths' lanes (word_chunks, max_chunks), each group of four entries from two
// words (rows.wgsl's t_elem4). The host sets HALF_WORDS for small batches, which are bound by
// latency: half_chunks gives them half the invocations, the dtype dispatch costs them its tests.
override HALF_WORDS: bool = false;

// Online softmax state of one lane: max m, s = Σ exp((x - m) * inv_t), argmax a, flags.
struct Acc {
    m: f32,
    s: f32,
    a: u32,
    flags: u32,
    e: f32, // Σ exp(z) z, z = (x - m) / T: the entropy numerator (typical acceptance only)
}

var<workgroup> sh_m: array<f32, CHUNK_LANES>;
var<workgroup> sh_s: array<f32, CHUNK_LANES>;
var<workgroup> sh_a: array<u32, CHUNK_LANES>;
var<workgroup> sh_f: array<u32, CHUNK_LANES>;
var<workgroup> sh_qm: array<f32, CHUNK_LANES>;
var<workgroup> sh_qs: array<f32, CHUNK_LANES>;
var<workgroup> sh_wm: array<f32, CHUNK_LANES>;
var<workgroup> sh_ws: array<f32, CHUNK_LANES>;
var<workgroup> sh_e: array<f32, CHUNK_LANES>;

fn acc_new() -> Acc {
    return Acc(bitcast<f32>(NEG_INF_BITS), 0.0, NO_INDEX, 0u, 0.0);
}

// exp(z) z for z = (x - m) / T, 0 for x = -inf.
fn ent_term(x: f32, m: f32, inv_t: f32) -> f32 {
    if (is_neg_inf(x)) {
        return 0.0;
    }
    let z = (x - m) * inv_t;
    return exp(z) * z;
}

// load_target and load_draft (and residual_argmax's loaders) differ only in the binding they
// read: core WGSL cannot pass a storage array to a function (that needs the
// unrestricted_pointer_parameters extension, not available everywhere), so each binding gets its
// own loader.
// Entries y .. y+3 of the target row starting at element `base` of the binding; entries at or
// past V read as -inf. With PARAM_VEC4 (V % 4 == 0, aligned rows) one 16-byte load.
fn load_target(base: u32, y: u32, vec4_path: bool) -> vec4<f32> {
    let v = params.vocab;
    let ninf = bitcast<f32>(NEG_INF_BITS);
    if (y + 3u < v) {
        if (vec4_path) {
            return bitcast<vec4<f32>>(target_vec4[(base + y) / 4u]);
        }
        return t_elem4(base + y);
    }
    var r = vec4<f32>(ninf);
    if (y < v) {
        r.x = t_elem(base + y);
    }
    if (y + 1u < v) {
        r.y = t_elem(base + y + 1u);
    }
    if (y + 2u < v) {
        r.z = t_elem(base + y + 2u);
    }
    return r;
}

// The same for the draft row (length draft_vocab).
fn load_draft(base: u32, y: u32, vec4_path: bool) -> vec4<f32> {
    let v = params.draft_vocab;
    let ninf = bitcast<f32>(NEG_INF_BITS);
    if (y + 3u < v) {
        if (vec4_path) {
            return bitcast<vec4<f32>>(draft_vec4[(base + y) / 4u]);
        }
        return d_elem4(base + y);
    }
    var r = vec4<f32>(ninf);
    if (y < v) {
        r.x = d_elem(base + y);
    }
    if (y + 1u < v) {
        r.y = d_elem(base + y + 1u);
    }
    if (y + 2u < v) {
        r.z = d_elem(base + y + 2u);
    }
    return r;
}

// Entries below the cut-off read as -inf (NaN stays NaN, `NaN < c` being false, so it is still
// flagged); with no cut-off (c = -inf) nothing changes.
fn mask4(v: vec4<f32>, c: f32) -> vec4<f32> {
    if (PLAIN_F32 || PLAIN_F16 || PLAIN_BF16) {
        return v;
    }
    return select(v, vec4<f32>(bitcast<f32>(NEG_INF_BITS)), v < vec4<f32>(c));
}

// exp((x - m) / T), 0 for x = -inf.
fn term(x: f32, m: f32, inv_t: f32) -> f32 {
    if (is_neg_inf(x)) {
        return 0.0;
    }
    return exp((x - m) * inv_t);
}

// Adds entries y .. y+3 (a lane visits its groups in increasing y) to the lane's state: NaN
// counts as -inf and sets `nan_flag`, +inf sets `inf_flag`; a new maximum m4 > m takes the
// lowest index holding it and rescales the sum once; then the four terms exp((x - m) / T) are
// added as (t0 + t1) + (t2 + t3). `with_sum` is false for greedy rows (max / argmax only).
// One branch per group instead of one per entry keeps a warp's lanes together.
// With `with_ent` (typical acceptance) the lane also keeps e = Σ exp(z) z, rescaled with the sum.
fn push4(acc: Acc, v_in: vec4<f32>, y: u32, inv_t: f32, with_sum: bool, nan_flag: u32, inf_flag: u32, with_ent: bool) -> Acc {
    var r = acc;
    var v = v_in;
    let ninf = bitcast<f32>(NEG_INF_BITS);
    if (is_nan(v.x)) {
        r.flags |= nan_flag;
        v.x = ninf;
    }
    if (is_nan(v.y)) {
        r.flags |= nan_flag;
        v.y = ninf;
    }
    if (is_nan(v.z)) {
        r.flags |= nan_flag;
        v.z = ninf;
    }
    if (is_nan(v.w)) {
        r.flags |= nan_flag;
        v.w = ninf;
    }
    if (is_pos_inf(v.x) || is_pos_inf(v.y) || is_pos_inf(v.z) || is_pos_inf(v.w)) {
        r.flags |= inf_flag;
    }
    r = take_max4(r, v, y, inv_t, with_sum, with_ent);
    if (with_sum && !is_neg_inf(r.m)) {
        r.s = r.s + ((term(v.x, r.m, inv_t) + term(v.y, r.m, inv_t)) + (term(v.z, r.m, inv_t) + term(v.w, r.m, inv_t)));
    }
    if (with_ent && !is_neg_inf(r.m)) {
        r.e = r.e + ((ent_term(v.x, r.m, inv_t) + ent_term(v.y, r.m, inv_t)) + (ent_term(v.z, r.m, inv_t) + ent_term(v.w, r.m, inv_t)));
    }
    return r;
}

// What every chunk of a row_stats workgroup shares: its row, where the rows start, the
// request's temperature and which sums it keeps, the cut-offs and the block's chunks.
struct RowJob {
    row: u32,
    t_base: u32,
    d_base: u32,
    drafted: i32,
    inv_t: f32,
    with_sum: bool,
    has_q_row: bool,
    raw: bool,
    ent: bool,
    vec4_path: bool,
    cut: f32,
    dcut: f32,
    first_chunk: u32,
    last_chunk: u32,
}

// The job of workgroup (block `bx`, window row `local_row`).
fn row_job(bx: u32, local_row: u32) -> RowJob {
    let row = params.row_begin + local_row;
    let info4 = row_info[row];
    let req = requests[info4.x];
    let k_row = info4.y;
    let greedy = (req.flags & REQ_GREEDY) != 0u;
    var job: RowJob;
    job.row = row;
    job.drafted = bitcast<i32>(info4.z);
    job.inv_t = req.inv_temperature;
    job.with_sum = !MAX_ONLY && !greedy;
    // Draft logits are reduced alongside the target row when the row scores a draft.
    job.has_q_row = !MAX_ONLY && params.draft_kind == DRAFT_LOGITS && k_row < req.num_drafts && !greedy;
    job.raw = RAW_SUMS;
    // The entropy numerator, only for rows of typical-acceptance requests.
    job.ent = ENTROPY && (req.flags & REQ_TYPICAL) != 0u && job.with_sum;
    job.vec4_path = (params.flags & PARAM_VEC4) != 0u;
    job.t_base = params.t_elem_base + local_row * params.vocab;
    let d_row = info4.w;
    job.d_base = params.d_elem_base + (d_row - params.d_row_begin) * params.draft_vocab;
    job.cut = bitcast<f32>(NEG_INF_BITS);
    job.dcut = job.cut;
    if ((params.flags & PARAM_CUTOFF) != 0u) {
        job.cut = cutoffs[row];
        if (d_row != NO_INDEX) {
            job.dcut = cutoffs[params.total_rows + d_row];
        }
    }
    job.first_chunk = bx * params.block_chunks;
    job.last_chunk = min(job.first_chunk + params.block_chunks, params.num_chunks);
    return job;
}

// Lane `i`'s state in the workgroup arrays, for the fold.
fn store_lane(i: u32, t: Acc, q: Acc, w: Acc) {
    sh_m[i] = t.m;
    sh_s[i] = t.s;
    sh_a[i] = t.a;
    sh_f[i] = t.flags | q.flags;
    sh_qm[i] = q.m;
    sh_qs[i] = q.s;
    sh_wm[i] = w.m;
    sh_ws[i] = w.s;
    sh_e[i] = t.e;
}

// Folds the CHUNK_LANES lane states stored for chunk `chunk` as a tree (lane i takes lane i+s
// for s = 32 .. 1) and writes the chunk's RowStats. Every invocation calls it (it holds the
// barriers); it returns when the workgroup arrays are free again. Levels with s >= SG_LANES go
// through the workgroup arrays, the rest through subgroup shuffles (fold_chunk_in_subgroup).
fn finish_chunk(job: RowJob, lane: u32, chunk: u32) {
    let inv_t = job.inv_t;
    let sg = min(SG_LANES, CHUNK_LANES);
    workgroupBarrier();
    for (var stride = CHUNK_LANES / 2u; stride >= sg && stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            let o = lane + stride;
            let m_new = max(sh_m[lane], sh_m[o]);
            if (job.ent) {
                sh_e[lane] = rescale_ent(sh_m[lane], sh_s[lane], sh_e[lane], m_new, inv_t) + rescale_ent(sh_m[o], sh_s[o], sh_e[o], m_new, inv_t);
            }
            if (job.with_sum) {
                sh_s[lane] = rescale(sh_m[lane], sh_s[lane], m_new, inv_t) + rescale(sh_m[o], sh_s[o], m_new, inv_t);
            }
            if (takes_other(sh_m[lane], sh_a[lane], sh_m[o], sh_a[o])) {
                sh_a[lane] = sh_a[o];
            }
            sh_m[lane] = m_new;
            sh_f[lane] = sh_f[lane] | sh_f[o];
            if (job.raw) {
                let wm_new = max(sh_wm[lane], sh_wm[o]);
                sh_ws[lane] = rescale(sh_wm[lane], sh_ws[lane], wm_new, 1.0) + rescale(sh_wm[o], sh_ws[o], wm_new, 1.0);
                sh_wm[lane] = wm_new;
            }
            if (job.has_q_row) {
                let qm_new = max(sh_qm[lane], sh_qm[o]);
                sh_qs[lane] = rescale(sh_qm[lane], sh_qs[lane], qm_new, inv_t) + rescale(sh_qm[o], sh_qs[o], qm_new, inv_t);
                sh_qm[lane] = qm_new;
            }
        }
        workgroupBarrier();
    }
    if (sg > 1u) {
        fold_chunk_in_subgroup(job, lane, sg);
    }
    if (lane == 0u) {
        write_chunk(job, chunk);
    }
    // The next chunk reuses the workgroup arrays.
    workgroupBarrier();
}

// finish_chunk's levels s = sg/2 .. 1 in registers: lanes 0 .. sg-1 are one subgroup
// (lanes_subgroup.wgsl), and lane i takes lane i+s's state through a shuffle, with the same
// operations in the same order as the workgroup-array levels. Every lane runs it (the shuffles
// stay in uniform control flow); only lanes below s compute states that are read again, and lane
// 0 leaves the chunk's state in the arrays' slot 0 for write_chunk.
fn fold_chunk_in_subgroup(job: RowJob, lane: u32, sg: u32) {
    let inv_t = job.inv_t;
    var m = sh_m[lane];
    var s = sh_s[lane];
    var a = sh_a[lane];
    var f = sh_f[lane];
    var qm = sh_qm[lane];
    var qs = sh_qs[lane];
    var wm = sh_wm[lane];
    var ws = sh_ws[lane];
    var e = sh_e[lane];
    for (var stride = sg / 2u; stride > 0u; stride = stride / 2u) {
        let om = lanes_down_f32(m, stride);
        let oa = lanes_down_u32(a, stride);
        let o_f = lanes_down_u32(f, stride);
        let m_new = max(m, om);
        if (job.with_sum || job.ent) {
            let os = lanes_down_f32(s, stride);
            if (job.ent) {
                let oe = lanes_down_f32(e, stride);
                e = rescale_ent(m, s, e, m_new, inv_t) + rescale_ent(om, os, oe, m_new, inv_t);
            }
            if (job.with_sum) {
                s = rescale(m, s, m_new, inv_t) + rescale(om, os, m_new, inv_t);
            }
        }
        if (takes_other(m, a, om, oa)) {
            a = oa;
        }
        m = m_new;
        f = f | o_f;
        if (job.raw) {
            let owm = lanes_down_f32(wm, stride);
            let ows = lanes_down_f32(ws, stride);
            let wm_new = max(wm, owm);
            ws = rescale(wm, ws, wm_new, 1.0) + rescale(owm, ows, wm_new, 1.0);
            wm = wm_new;
        }
        if (job.has_q_row) {
            let oqm = lanes_down_f32(qm, stride);
            let oqs = lanes_down_f32(qs, stride);
            let qm_new = max(qm, oqm);
            qs = rescale(qm, qs, qm_new, inv_t) + rescale(oqm, oqs, qm_new, inv_t);
            qm = qm_new;
        }
    }
    if (lane == 0u) {
        sh_m[0] = m;
        sh_s[0] = s;
        sh_a[0] = a;
        sh_f[0] = f;
        sh_qm[0] = qm;
        sh_qs[0] = qs;
        sh_wm[0] = wm;
        sh_ws[0] = ws;
        sh_e[0] = e;
    }
}

// Lane 0's part of finish_chunk: the folded state and the values at the drafted token.
fn write_chunk(job: RowJob, chunk: u32) {
    let begin = chunk * CHUNK;
    var out: RowStats;
    out.t_max = sh_m[0];
    out.t_sum = sh_s[0];
    out.t_arg = sh_a[0];
    out.flags = sh_f[0];
    out.q_max = sh_qm[0];
    out.q_sum = sh_qs[0];
    out.t_at_d = 0.0;
    out.q_at_d = 0.0;
    out.raw_max = sh_wm[0];
    out.raw_sum = sh_ws[0];
    out.t_ent = sh_e[0];
    // The values at the drafted token come from the one chunk that holds it.
    if (job.drafted >= 0 && u32(job.drafted) >= begin && u32(job.drafted) < begin + CHUNK) {
        let dt = u32(job.drafted);
        out.t_at_d = t_elem(job.t_base + dt);
        if (out.t_at_d < job.cut) {
            out.t_at_d = bitcast<f32>(NEG_INF_BITS); // cut off: p(d) = 0
        }
        if (params.draft_kind != DRAFT_NONE && dt < params.draft_vocab) {
            out.q_at_d = d_elem(job.d_base + dt);
            if (params.draft_kind == DRAFT_LOGITS && out.q_at_d < job.dcut) {
                out.q_at_d = bitcast<f32>(NEG_INF_BITS);
            }
        }
    }
    store_partial(job.row * params.num_chunks + chunk, out);
}

@compute @workgroup_size(64)
fn block(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    stats_chunks(row_job(wid.x, wid.y), lane);
}

// A job's chunk partials through the plain half path of two lanes an invocation, or the word
// loads (block, and row_stats_verify's block_verify).
fn stats_chunks(job: RowJob, lane: u32) {
    if ((PLAIN_F16 || PLAIN_BF16) && !HALF_WORDS) {
        half_chunks(job, lane);
    } else {
        word_chunks(job, lane);
    }
}

// `block` for small MAX_ONLY batches of f32 or dtype-dispatched rows (the host's WIDE
// specialisation): the device's workgroup size instead of the contract's CHUNK_LANES. A row's
// max and the lowest index holding it do not depend on the order of the fold, so each lane may
// read fewer entries, and a small batch waits out fewer rounds of loads. An entry of its own,
// not a branch of `block`: the branch's workgroup arrays, allocated even where it never ran,
// made `block` 1.2x slower at large batches (H200).
@compute @workgroup_size(WG)
fn block_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    max_chunks(row_job(wid.x, wid.y), lane);
}

// ---- block_wide_settle: all-greedy batches decided without verify -------------------------
//
// `block_wide` for batches the host lets settle here (all-greedy, at most 64 rows a request,
// not a tree, any size; `Shape::settle_in_stats`). The chunk results go to the output buffer,
// bound at 5 in place of the chunk partials, from word `params.settle_base` (three words a
// workgroup's block of chunks, stats_blocks a row: the maximum, its lowest index, the flags).
// The last workgroup of each request to
// finish (a count per request after the partials, which the host zeroes before the pass)
// merges the request's rows and settles it as verify's greedy path does (`merge_greedy_rows`,
// then `settle_from_registers` and `settle_stop` for a greedy request): the same tokens,
// counts, statuses and logprobs. The pass then needs no verify dispatch: one dispatch boundary
// and verify's own chain of loads fewer (H200: greedy GPU time 0.76-0.83x up to 1,024 chunks,
// 0.92-0.99x above but at one point, docs/performance.md). The partials and counts go through
// atomics so that the last workgroup reads what the others wrote, after the device-scope
// barriers around its count.
@group(0) @binding(5) var<storage, read_write> settle_words: array<atomic<u32>>;

var<workgroup> st_key: array<atomic<u32>, 64>;
var<workgroup> st_arg: array<atomic<u32>, 64>;
var<workgroup> st_flags: array<atomic<u32>, 64>;
var<workgroup> st_stop: atomic<u32>;
var<workgroup> st_last: u32;

@compute @workgroup_size(WG)
fn block_wide_settle(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    var job = row_job(wid.x, wid.y);
    job.vec4_path = f32_vec4_path(job);
    settle_block(job, wid.x, lane, max_chunk(job, job.first_chunk, lane));
}

// block_wide_settle for blocks of several chunks (`Shape::block_chunks` > 1, from 4,096 chunks):
// the block's chunks pushed onto one state per lane and folded once. A maximum and the lowest
// index holding it do not depend on how the entries were grouped, so the block's result is its
// chunks' merged, and the workgroup's loads meet one tree instead of one a chunk (H200: greedy
// GPU time 0.95-0.97x at R = 128, docs/performance.md). An entry of its own: in
// block_wide_settle, as its only form or behind a branch, the loop made calls of one-chunk
// blocks (whose first pushes start from constants in max_chunk) up to 8 % slower (2,048-2,736
// chunks) and 4 % (R = 1).
@compute @workgroup_size(WG)
fn block_wide_settle_blocks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    var job = row_job(wid.x, wid.y);
    job.vec4_path = f32_vec4_path(job);
    var lane_t = acc_new();
    for (var chunk = job.first_chunk; chunk < job.last_chunk; chunk += 1u) {
        lane_t = max_lane(job, chunk, lane, lane_t);
    }
    settle_block(job, wid.x, lane, max_fold(lane_t, lane));
}

// A block's result `t` (valid in lane 0) written to its slot (a row's stats_blocks slots, in
// block order), the workgroup counted, and the request settled by its last workgroup. Every
// invocation calls it.
fn settle_block(job: RowJob, block: u32, lane: u32, t: Acc) {
    if (lane == 0u) {
        let w = params.settle_base + 3u * (job.row * params.stats_blocks + block);
        atomicStore(&settle_words[w], bitcast<u32>(t.m));
        atomicStore(&settle_words[w + 1u], t.a);
        atomicStore(&settle_words[w + 2u], t.flags);
    }
    let r = row_info[job.row].x;
    let info = requests[r];
    let rows = info.num_drafts + 1u;
    // Publish this workgroup's partials, then count it; the last of the request's
    // stats_blocks x rows workgroups goes on.
    storageBarrier();
    if (lane == 0u) {
        let counts = params.settle_base + 3u * params.total_rows * params.stats_blocks;
        let done = atomicAdd(&settle_words[counts + r], 1u) + 1u;
        st_last = select(0u, 1u, done == params.stats_blocks * rows);
    }
    if (workgroupUniformLoad(&st_last) == 0u) {
        return;
    }
    storageBarrier();
    settle_request(r, info, lane);
}

// The request's rows merged (a row's maximum by an atomic max over order keys, its index by an
// atomic min over the partials holding it, as merge_greedy_rows) and the request settled: lane
// i holds row i (rows <= 64).
fn settle_request(r: u32, info: ReqInfo, lane: u32) {
    let k = info.num_drafts;
    let rows = k + 1u;
    var drafted = -1;
    if (lane < rows) {
        drafted = bitcast<i32>(row_info[info.row_offset + lane].z);
        atomicStore(&st_key[lane], 0u);
        atomicStore(&st_arg[lane], NO_INDEX);
        atomicStore(&st_flags[lane], 0u);
    }
    if (lane == 0u) {
        atomicStore(&st_stop, k);
    }
    workgroupBarrier();
    // One slot per block of chunks, nb a row (block_wide_settle).
    let nb = params.stats_blocks;
    let first = params.settle_base + 3u * info.row_offset * nb;
    for (var p = lane; p < rows * nb; p += WG) {
        let w = first + 3u * p;
        atomicMax(&st_key[p / nb], order_key(bitcast<f32>(atomicLoad(&settle_words[w]))));
        atomicOr(&st_flags[p / nb], atomicLoad(&settle_words[w + 2u]));
    }
    workgroupBarrier();
    for (var p = lane; p < rows * nb; p += WG) {
        let w = first + 3u * p;
        if (order_key(bitcast<f32>(atomicLoad(&settle_words[w]))) == atomicLoad(&st_key[p / nb])) {
            atomicMin(&st_arg[p / nb], atomicLoad(&settle_words[w + 1u]));
        }
    }
    workgroupBarrier();
    var st: RowStats;
    if (lane < rows) {
        st.t_max = from_order_key(atomicLoad(&st_key[lane]));
        st.t_arg = atomicLoad(&st_arg[lane]);
        st.flags = atomicLoad(&st_flags[lane]);
        if (st.t_arg == NO_INDEX) {
            st.t_arg = 0u;
        }
        // A draft row stops the request where it is non-finite or its draft is not the argmax.
        if (lane < k && (row_nonfinite(st) || drafted < 0 || u32(drafted) != st.t_arg)) {
            atomicMin(&st_stop, lane);
        }
    }
    workgroupBarrier();
    let stop = atomicLoad(&st_stop);
    let nan2 = nan_pair();
    for (var j = lane; j < params.out_stride; j += WG) {
        if (j != stop) {
            // Accepted drafts (lane j holds row j), then -1 padding with NaN logprobs.
            let token = select(-1, drafted, j < stop);
            settled_put(info.out_offset + j, token, select(nan2, logprobs_of(info, st, st.t_at_d), j < stop));
        }
    }
    if (lane == stop) {
        // The stop row: its argmax; a non-finite row gives its status and NaN logprobs.
        var status = 0u;
        var lp = logprobs_of(info, st, st.t_max);
        if (row_nonfinite(st)) {
            status = select(STATUS_ALL_MASKED, STATUS_TARGET_NONFINITE, (st.flags & (ROW_T_NAN | ROW_T_POSINF)) != 0u);
            lp = nan2;
        }
        settled_put(info.out_offset + stop, i32(st.t_arg), lp);
        let base = params.num_requests * params.out_stride;
        atomicStore(&settle_words[base + r], stop + 1u);
        atomicStore(&settle_words[base + params.num_requests + r], status);
    }
}

// Output slot `slot`: its token and, where the output has them, its logprobs (put_logprobs'
// layout, through atomic words).
fn settled_put(slot: u32, token: i32, lp: vec2<f32>) {
    atomicStore(&settle_words[slot], bitcast<u32>(token));
    if ((params.flags & PARAM_LOGPROBS) != 0u) {
        let w = logprob_words(params.num_requests, params.out_stride, slot);
        atomicStore(&settle_words[w.x], bitcast<u32>(lp.x));
        atomicStore(&settle_words[w.y], bitcast<u32>(lp.y));
    }
}

// Whether a job of word_chunks or max_chunks reads its target rows with the 16-byte loads:
// PARAM_VEC4 and f32 target rows (half rows are read through the plain half path, as half
// words, or one element at a time). Each side on its own: PARAM_VEC4 means both sides' rows
// are aligned for their own element type, so an f32 side takes the 16-byte loads beside a half
// one (f32 draft logits beside half target rows as half words: GPU time 0.92-1.00x on an H200,
// docs/performance.md).
fn f32_vec4_path(job: RowJob) -> bool {
    return job.vec4_path && (params.flags & (PARAM_T_F16 | PARAM_T_BF16)) == 0u;
}

// The same for the draft rows that word_chunks reduces (draft logits).
fn f32_draft_vec4_path(job: RowJob) -> bool {
    return job.vec4_path && (params.flags & (PARAM_D_F16 | PARAM_D_BF16)) == 0u;
}

// max_chunks' lane states, WG of them.
var<workgroup> mx_m: array<f32, MAX_WG>;
var<workgroup> mx_a: array<u32, MAX_WG>;
var<workgroup> mx_f: array<u32, MAX_WG>;

// One chunk of a MAX_ONLY row over WG lanes: lane l reads the groups 4(l + WG·i) of the chunk,
// in rounds of four loads, then the lanes fold as a tree. The result, valid in lane 0 (max,
// lowest index holding it, flags), is the chunk's whatever the order, so it equals
// word_chunks' to the bit. Ends with a barrier: the next chunk reuses the workgroup arrays.
fn max_chunk(job: RowJob, chunk: u32, lane: u32) -> Acc {
    return max_fold(max_lane(job, chunk, lane, acc_new()), lane);
}

// max_chunk's loads and pushes: lane l's groups 4(l + WG·i) of `chunk` pushed onto its state `t`
// (in increasing index order, also over consecutive chunks).
fn max_lane(job: RowJob, chunk: u32, lane: u32, t_in: Acc) -> Acc {
    let steps = CHUNK / 4u / WG;
    let gap = 4u * WG;
    let begin = chunk * CHUNK;
    var t = t_in;
    for (var h = 0u; h < steps; h += 4u) {
        let y0 = begin + 4u * (lane + WG * h);
        let a0 = load_target(job.t_base, y0, job.vec4_path);
        let a1 = load_target(job.t_base, y0 + gap, job.vec4_path);
        let a2 = load_target(job.t_base, y0 + 2u * gap, job.vec4_path);
        let a3 = load_target(job.t_base, y0 + 3u * gap, job.vec4_path);
        t = push4_any(t, mask4(a0, job.cut), y0, 1.0, false, ROW_T_NAN, ROW_T_POSINF, false);
        t = push4_any(t, mask4(a1, job.cut), y0 + gap, 1.0, false, ROW_T_NAN, ROW_T_POSINF, false);
        t = push4_any(t, mask4(a2, job.cut), y0 + 2u * gap, 1.0, false, ROW_T_NAN, ROW_T_POSINF, false);
        t = push4_any(t, mask4(a3, job.cut), y0 + 3u * gap, 1.0, false, ROW_T_NAN, ROW_T_POSINF, false);
    }
    return t;
}

// The WG lane states folded as a tree: the maximum, the lowest index holding it and the flags,
// valid in lane 0. Every invocation calls it (it holds the barriers); it ends with a barrier, as
// the next chunk reuses the workgroup arrays.
fn max_fold(t: Acc, lane: u32) -> Acc {
    mx_m[lane] = t.m;
    mx_a[lane] = t.a;
    mx_f[lane] = t.flags;
    workgroupBarrier();
    // Levels wider than a subgroup through the workgroup arrays, the rest in registers.
    let sg = min(SG_LANES, WG);
    for (var stride = WG / 2u; stride >= sg && stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            let o = lane + stride;
            if (takes_other(mx_m[lane], mx_a[lane], mx_m[o], mx_a[o])) {
                mx_a[lane] = mx_a[o];
            }
            mx_m[lane] = max(mx_m[lane], mx_m[o]);
            mx_f[lane] = mx_f[lane] | mx_f[o];
        }
        workgroupBarrier();
    }
    var m = mx_m[lane];
    var a = mx_a[lane];
    var f = mx_f[lane];
    for (var stride = sg / 2u; stride > 0u; stride = stride / 2u) {
        let om = lanes_down_f32(m, stride);
        let oa = lanes_down_u32(a, stride);
        f = f | lanes_down_u32(f, stride);
        if (takes_other(m, a, om, oa)) {
            a = oa;
        }
        m = max(m, om);
    }
    // The next chunk reuses the workgroup arrays.
    workgroupBarrier();
    return Acc(m, 0.0, a, f, 0.0);
}

// The chunks of a `block_wide` workgroup, each written from lane 0 as word_chunks writes a
// MAX_ONLY row's chunk (lane 0 alone uses the shared state it stores).
fn max_chunks(job_in: RowJob, lane: u32) {
    var job = job_in;
    job.vec4_path = f32_vec4_path(job);
    for (var chunk = job.first_chunk; chunk < job.last_chunk; chunk += 1u) {
        let t = max_chunk(job, chunk, lane);
        if (lane == 0u) {
            store_lane(0u, t, acc_new(), acc_new());
            write_chunk(job, chunk);
        }
    }
}

// Rows of f32 (or of mixed / filtered types, through the dtype-dispatching loads): each
// invocation is one lane of the contract. The vec4 loads read f32 only.
fn word_chunks(job_in: RowJob, lane: u32) {
    var job = job_in;
    job.vec4_path = f32_vec4_path(job);
    let d_vec4 = f32_draft_vec4_path(job_in);
    let inv_t = job.inv_t;
    let with_sum = job.with_sum;
    let ent = job.ent;
    let cut = job.cut;
    let dcut = job.dcut;
    let t_base = job.t_base;
    let d_base = job.d_base;
    let vec4_path = job.vec4_path;
    for (var chunk = job.first_chunk; chunk < job.last_chunk; chunk += 1u) {
        let begin = chunk * CHUNK;
        // Loads go out 4 at a time before any is used (named values, not an array: an array
        // indexed in a loop may live in slow local memory), so each lane keeps 64 bytes in
        // flight instead of waiting out one memory latency per step. 8 at a time held more
        // registers and was 5 % slower (row_stats on an H200, median over 36 points; 14 % at
        // R = 8, k = 8). Entries past the row's end read as -inf, and pushing -inf changes
        // nothing: it is the same as skipping them.
        var t = acc_new();
        var q = acc_new();
        // The raw row (no cut-off, T = 1) for raw logprobs, in the same order.
        var w = acc_new();
        for (var h = 0u; h < CHUNK_STEPS; h += 4u) {
            let y0 = begin + 4u * (lane + CHUNK_LANES * h);
            let a0 = load_target(t_base, y0, vec4_path);
            let a1 = load_target(t_base, y0 + 256u, vec4_path);
            let a2 = load_target(t_base, y0 + 512u, vec4_path);
            let a3 = load_target(t_base, y0 + 768u, vec4_path);
            t = push4_any(t, mask4(a0, cut), y0, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            t = push4_any(t, mask4(a1, cut), y0 + 256u, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            t = push4_any(t, mask4(a2, cut), y0 + 512u, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            t = push4_any(t, mask4(a3, cut), y0 + 768u, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            if (job.raw) {
                w = push4_any(w, a0, y0, 1.0, true, 0u, 0u, false);
                w = push4_any(w, a1, y0 + 256u, 1.0, true, 0u, 0u, false);
                w = push4_any(w, a2, y0 + 512u, 1.0, true, 0u, 0u, false);
                w = push4_any(w, a3, y0 + 768u, 1.0, true, 0u, 0u, false);
            }
            if (job.has_q_row) {
                let b0 = load_draft(d_base, y0, d_vec4);
                let b1 = load_draft(d_base, y0 + 256u, d_vec4);
                let b2 = load_draft(d_base, y0 + 512u, d_vec4);
                let b3 = load_draft(d_base, y0 + 768u, d_vec4);
                q = push4_any(q, mask4(b0, dcut), y0, inv_t, true, ROW_Q_NAN, ROW_Q_POSINF, false);
                q = push4_any(q, mask4(b1, dcut), y0 + 256u, inv_t, true, ROW_Q_NAN, ROW_Q_POSINF, false);
                q = push4_any(q, mask4(b2, dcut), y0 + 512u, inv_t, true, ROW_Q_NAN, ROW_Q_POSINF, false);
                q = push4_any(q, mask4(b3, dcut), y0 + 768u, inv_t, true, ROW_Q_NAN, ROW_Q_POSINF, false);
            }
        }
        store_lane(lane, t, q, w);
        finish_chunk(job, lane, chunk);
    }
}

// Entries y .. y+3 (lo) and y+4 .. y+7 (hi) of a row: the groups of two neighbouring lanes.
struct Eight {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Two lanes' states (lanes 2j and 2j+1 of the contract).
struct Acc2 {
    a: Acc,
    b: Acc,
}

// The 8 half values of one 16-byte word group in the PLAIN_F16 / PLAIN_BF16 type, in order: the
// low half of each word comes first (little-endian rows).
fn widen8(w: vec4<u32>) -> Eight {
    if (PLAIN_F16 && F16_UNPACK) {
        return Eight(
            vec4<f32>(unpack_f16x2(w.x), unpack_f16x2(w.y)),
            vec4<f32>(unpack_f16x2(w.z), unpack_f16x2(w.w)),
        );
    }
    return Eight(
        vec4<f32>(plain_half(w.x, 0u), plain_half(w.x, 1u), plain_half(w.y, 0u), plain_half(w.y, 1u)),
        vec4<f32>(plain_half(w.z, 0u), plain_half(w.z, 1u), plain_half(w.w, 0u), plain_half(w.w, 1u)),
    );
}

// Entries y .. y+7 of the half target row at element `base` (y a multiple of 8) as raw halves,
// two per word, the lower entry in the low bits; -inf past V. With PARAM_VEC4 (V % 8 == 0, rows
// on 16-byte boundaries) one 16-byte load.
fn load8_target(base: u32, y: u32, vec4_path: bool) -> vec4<u32> {
    if (vec4_path && y + 7u < params.vocab) {
        return target_vec4[(base + y) / 8u];
    }
    var w = vec4<u32>(0u);
    for (var i = 0u; i < 8u; i += 1u) {
        var h = select(0xfc00u, 0xff80u, PLAIN_BF16); // -inf
        let e = base + y + i;
        if (y + i < params.vocab) {
            h = (target_logits[e >> 1u] >> (16u * (e & 1u))) & 0xffffu;
        }
        w[i / 2u] |= h << (16u * (i & 1u));
    }
    return w;
}

// True when the 8 halves of `w` widen without special cases and push4's NaN / +inf tests would
// find nothing: no exponent field all ones (±inf, NaN) and, for f16 widened by integer
// operations, none all zeros (±0, subnormals; the device's conversion, F16_UNPACK, widens those
// as any value). Two halves per word at once: adding one unit of the exponent's lowest bit to the
// masked exponent carries into the sign bit's place exactly when the exponent is all ones
// (bf16: (e << 7) + 0x80; f16: (e << 10) + 0x400), and adding 31 units to an f16 exponent reaches
// it exactly when the exponent is not 0. One test of the raw words for 8 entries: cheaper than
// push4_any's test of each four widened values.
fn ordinary8(w: vec4<u32>) -> bool {
    let sign_bits = vec4<u32>(0x80008000u);
    if (PLAIN_BF16) {
        let top = ((w & vec4<u32>(0x7f807f80u)) + vec4<u32>(0x00800080u)) & sign_bits;
        return ((top.x | top.y) | (top.z | top.w)) == 0u;
    }
    let e = w & vec4<u32>(0x7c007c00u);
    let top = (e + vec4<u32>(0x04000400u)) & sign_bits;
    if (F16_UNPACK) {
        return ((top.x | top.y) | (top.z | top.w)) == 0u;
    }
    let zero = ((e + vec4<u32>(0x7c007c00u)) & sign_bits) ^ sign_bits;
    let bad = top | zero;
    return ((bad.x | bad.y) | (bad.z | bad.w)) == 0u;
}

// widen8 for halves that pass ordinary8: bf16 and the device's f16 conversion as always; else
// f16 normals by re-biasing the exponent (the exact rule of f16_to_f32 for 1 <= e <= 30), both
// halves of each word in a few integer ops.
fn widen8_ordinary(w: vec4<u32>) -> Eight {
    if (PLAIN_BF16 || F16_UNPACK) {
        return widen8(w);
    }
    let lo = bitcast<vec4<f32>>((((w & vec4<u32>(0x7fffu)) << vec4<u32>(13u)) + vec4<u32>(0x38000000u)) | ((w & vec4<u32>(0x8000u)) << vec4<u32>(16u)));
    let hi = bitcast<vec4<f32>>((((w >> vec4<u32>(3u)) & vec4<u32>(0x0fffe000u)) + vec4<u32>(0x38000000u)) | (w & vec4<u32>(0x80000000u)));
    return Eight(vec4<f32>(lo.x, hi.x, lo.y, hi.y), vec4<f32>(lo.z, hi.z, lo.w, hi.w));
}

// A new maximum among entries y .. y+3 (values `v`): it takes the lowest index holding it and
// rescales the sums once (shared by push4 and push4_finite).
fn take_max4(acc: Acc, v: vec4<f32>, y: u32, inv_t: f32, with_sum: bool, with_ent: bool) -> Acc {
    var r = acc;
    let m4 = max(max(v.x, v.y), max(v.z, v.w));
    if (m4 > r.m) {
        var a = y + 3u;
        if (v.z == m4) {
            a = y + 2u;
        }
        if (v.y == m4) {
            a = y + 1u;
        }
        if (v.x == m4) {
            a = y;
        }
        if (with_ent) {
            r.e = rescale_ent(r.m, r.s, r.e, m4, inv_t);
        }
        if (with_sum) {
            r.s = rescale(r.m, r.s, m4, inv_t);
        }
        r.m = m4;
        r.a = a;
    }
    return r;
}

// push4 for entries that are all finite (no NaN, no ±inf): the same operations in the same order
// minus the tests that could not fire (NaN, +inf, -inf terms, a -inf maximum after the push), so
// the same bits.
fn push4_finite(acc: Acc, v: vec4<f32>, y: u32, inv_t: f32, with_sum: bool, with_ent: bool) -> Acc {
    var r = acc;
    r = take_max4(r, v, y, inv_t, with_sum, with_ent);
    if (with_sum) {
        let z = (v - vec4<f32>(r.m)) * inv_t;
        r.s = r.s + ((exp(z.x) + exp(z.y)) + (exp(z.z) + exp(z.w)));
    }
    if (with_ent) {
        let z = (v - vec4<f32>(r.m)) * inv_t;
        r.e = r.e + ((exp(z.x) * z.x + exp(z.y) * z.y) + (exp(z.z) * z.z + exp(z.w) * z.w));
    }
    return r;
}

// push4 for f32 entries of any value: a group with no NaN and no ±inf (nearly all) takes
// push4_finite, whose operations are push4's minus the tests that cannot fire, so the bits are
// the same either way; one vector test per group replaces four NaN tests, four +inf tests and
// the -inf test of every term.
fn push4_any(acc: Acc, v: vec4<f32>, y: u32, inv_t: f32, with_sum: bool, nan_flag: u32, inf_flag: u32, with_ent: bool) -> Acc {
    let e = bitcast<vec4<u32>>(v) & vec4<u32>(0x7f800000u);
    if (all(e != vec4<u32>(0x7f800000u))) {
        return push4_finite(acc, v, y, inv_t, with_sum, with_ent);
    }
    return push4(acc, v, y, inv_t, with_sum, nan_flag, inf_flag, with_ent);
}

// Entries y .. y+7 (raw halves `w`) pushed to the two lanes' states: ordinary groups (nearly all)
// skip the special-value handling, the others take widen8 and push4.
fn push8_halves(acc: Acc2, w: vec4<u32>, y: u32, inv_t: f32, with_sum: bool, nan_flag: u32, inf_flag: u32, with_ent: bool) -> Acc2 {
    if (ordinary8(w)) {
        let v = widen8_ordinary(w);
        return Acc2(push4_finite(acc.a, v.lo, y, inv_t, with_sum, with_ent), push4_finite(acc.b, v.hi, y + 4u, inv_t, with_sum, with_ent));
    }
    return push8(acc, widen8(w), y, inv_t, with_sum, nan_flag, inf_flag, with_ent);
}

// The same for the draft-logit row, whose type may differ from the target's: f32 rows take two
// 16-byte loads, rows of the target's half type one, others the dtype-dispatching loads.
fn load8_draft(base: u32, y: u32, vec4_path: bool) -> Eight {
    if (vec4_path && y + 7u < params.draft_vocab) {
        let d_half = (params.flags >> 2u) & (PARAM_T_F16 | PARAM_T_BF16);
        if (d_half == 0u) {
            let i = (base + y) / 4u;
            return Eight(bitcast<vec4<f32>>(draft_vec4[i]), bitcast<vec4<f32>>(draft_vec4[i + 1u]));
        }
        if (d_half == (params.flags & (PARAM_T_F16 | PARAM_T_BF16))) {
            return widen8(draft_vec4[(base + y) / 8u]);
        }
    }
    return Eight(load_draft(base, y, false), load_draft(base, y + 4u, false));
}

// push4 for two neighbouring lanes' groups at y and y+4.
fn push8(acc: Acc2, v: Eight, y: u32, inv_t: f32, with_sum: bool, nan_flag: u32, inf_flag: u32, with_ent: bool) -> Acc2 {
    return Acc2(
        push4(acc.a, v.lo, y, inv_t, with_sum, nan_flag, inf_flag, with_ent),
        push4(acc.b, v.hi, y + 4u, inv_t, with_sum, nan_flag, inf_flag, with_ent),
    );
}

// Half-precision target rows and no filters (PLAIN_F16 / PLAIN_BF16). One 16-byte load holds 8
// entries: the groups of lanes 2j and 2j+1 of the contract at the same step. So invocation j
// plays both lanes through all their steps, in the contract's order (the sums are bit for bit
// those of word_chunks and of the twin), and the 64 invocations reduce two chunks at once:
// invocations 0-31 the first of a pair, 32-63 the second. The two chunks then fold one after
// the other through finish_chunk. No cut-offs here, so no mask.
fn half_chunks(job: RowJob, lane: u32) {
    let side = lane / 32u;
    let j = lane % 32u;
    let inv_t = job.inv_t;
    let with_sum = job.with_sum;
    let ent = job.ent;
    let t_base = job.t_base;
    let d_base = job.d_base;
    let vec4_path = job.vec4_path;
    for (var pair = job.first_chunk; pair < job.last_chunk; pair += 2u) {
        let chunk = pair + side;
        var t = Acc2(acc_new(), acc_new());
        var q = t;
        var w = t;
        // 4 loads (64 bytes, 32 entries) in flight per invocation: 8 held more registers and were
        // 5 % slower at the median, up to 18 % at R = 128 (H200, bf16 rows).
        for (var h = 0u; h < CHUNK_STEPS && chunk < job.last_chunk; h += 4u) {
            let y0 = chunk * CHUNK + 8u * j + 4u * CHUNK_LANES * h;
            let a0 = load8_target(t_base, y0, vec4_path);
            let a1 = load8_target(t_base, y0 + 256u, vec4_path);
            let a2 = load8_target(t_base, y0 + 512u, vec4_path);
            let a3 = load8_target(t_base, y0 + 768u, vec4_path);
            t = push8_halves(t, a0, y0, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            t = push8_halves(t, a1, y0 + 256u, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            t = push8_halves(t, a2, y0 + 512u, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            t = push8_halves(t, a3, y0 + 768u, inv_t, with_sum, ROW_T_NAN, ROW_T_POSINF, ent);
            if (job.raw) {
                w = push8_halves(w, a0, y0, 1.0, true, 0u, 0u, false);
                w = push8_halves(w, a1, y0 + 256u, 1.0, true, 0u, 0u, false);
                w = push8_halves(w, a2, y0 + 512u, 1.0, true, 0u, 0u, false);
                w = push8_halves(w, a3, y0 + 768u, 1.0, true, 0u, 0u, false);
            }
            if (job.has_q_row) {
                for (var e = 0u; e < 4u; e += 1u) {
                    let y = y0 + 256u * e;
                    q = push8(q, load8_draft(d_base, y, vec4_path), y, inv_t, true, ROW_Q_NAN, ROW_Q_POSINF, false);
                }
            }
        }
        for (var s = 0u; s < 2u; s += 1u) {
            if (pair + s < job.last_chunk) {
                if (side == s) {
                    store_lane(2u * j, t.a, q.a, w.a);
                    store_lane(2u * j + 1u, t.b, q.b, w.b);
                }
                finish_chunk(job, lane, pair + s);
            }
        }
    }
}

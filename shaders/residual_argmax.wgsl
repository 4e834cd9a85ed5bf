// residual_argmax — samples the one token each non-greedy request still needs: the recovered
// token from the rejected row's residual, or the bonus token from the bonus row.
// CPU twin: src/cpu/residual_argmax.rs. Labels: specdec.residual_argmax.block / .merge.
//
// Exponential race (equivalent to Gumbel-max): y* = argmax_y r(y) / e_y with e_y ~ Exp(1)
// independent, which picks y with probability r(y) / Σ r — no sort, no normalisation of r, one
// pass. r is max(p - q, 0) (TASK_DRAFT_RESIDUAL) or max(ρ p - q, 0) with the row's stored ρ
// (TASK_BLOCK_RESIDUAL, block verification), keyed r(y) / e_y; or, with nothing subtracted, p
// without the drafted token (TASK_ONE_HOT_RESIDUAL) or p (TASK_FROM_TARGET), keyed in the log
// domain, l / T − ln e_y (common.wgsl log_race_key: the same argmax, without the row's
// normaliser). Alongside, each block also keeps the best p-key: if the residual has no mass
// anywhere (p == q) the merge falls back to it and sets STATUS_EMPTY_RESIDUAL. Ties go to the
// lowest index, so the result does not depend on the reduction order and the twin needs no lane
// emulation.
//
// Dispatch `block`: x = vocab block, y = request within the window (requests whose task row lies
// in another window skip), z = local row with EARLY (else 1). Each lane handles groups of 4
// consecutive entries (one Philox call).
// Dispatch `merge`: one workgroup per request folds its blocks and writes the token.

// Bindings 0-2 (params, target_logits, draft_values) and t_elem / d_elem: shaders/rows.wgsl.
@group(0) @binding(3) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(4) var<storage, read> row_stats: array<RowStats>;
@group(0) @binding(5) var<storage, read> tasks: array<Task>;
@group(0) @binding(6) var<storage, read_write> candidates: array<Candidate>;
@group(0) @binding(7) var<storage, read_write> out_words: array<u32>;
// Per-row logit cut-offs (PARAM_CUTOFF): entries below them have p = 0 (q = 0 for draft logits).
@group(0) @binding(8) var<storage, read> cutoffs: array<f32>;

// The largest r and p keys any lane of the workgroup holds so far, as order keys (common.wgsl:
// log-domain keys are negative as often as not). Each lane filters its entries against them: with a lane's
// own best alone, each lane's first few dozen entries nearly always set a new best, and a warp
// pays the log and divisions whenever one of its lanes does. Read without a barrier: any value
// read is a key some entry reached, so a stale one only filters less.
var<workgroup> bound_r: atomic<u32>;
var<workgroup> bound_p: atomic<u32>;
// The lowest entry index holding each bound at the end, and its logit.
var<workgroup> win_r: atomic<u32>;
var<workgroup> win_p: atomic<u32>;
var<workgroup> win_rl: f32;
var<workgroup> win_pl: f32;

// The race's order: a larger key wins, equal keys go to the lower index (so a race's winner does
// not depend on how it was split).
fn better(key: f32, idx: u32, best_key: f32, best_idx: u32) -> bool {
    return key > best_key || (key == best_key && idx < best_idx);
}

// LOG_KEYS: the batch has no draft values (one-hot drafts) and is not a tree, so no task
// subtracts q, every race is keyed in the log domain and no token is excluded. The tasks say so
// already; the constant takes the linear keys' and the exclusions' code out of the pipeline
// (residual pass 0.92x on an H200, measured as a shader variant with the same two constants).
override LOG_KEYS: bool = false;
// EARLY (with LOG_KEYS, small one-hot batches): `block` runs beside row_stats, before verify has
// chosen any row, and races every row of every sampled request (dispatch z = the local row):
// each rejected-draft row without its drafted token (the r race) and with it (the p race), and
// the bonus row. Log-domain keys need no row statistics, and the pass writes only `candidates`,
// so wgpu puts no barrier between it and row_stats and the two overlap (one-hot R = 1 calls
// 0.83-0.86x on an H200 with the race moved there, `docs/performance.md`). `merge` then reads
// the candidates of the row verify stopped at. Binding 2 holds the draft ids in this mode (one-hot
// batches have no draft values).
override EARLY: bool = false;

// What the race needs to know about the row being resampled.
struct RaceCtx {
    st: RowStats,
    inv_sum: f32,   // 1 / Σ exp((l - max) / T): one division per row, not per token
    inv_qsum: f32,  // the same for the draft logits
    inv_t: f32,
    use_q: bool,    // subtract q (TASK_DRAFT_RESIDUAL, TASK_BLOCK_RESIDUAL)
    rho: f32,       // scales p before q is subtracted: ρ for TASK_BLOCK_RESIDUAL, else 1 (exact)
    q_logits: bool, // q given as logits (else probabilities)
    kind: u32,
    draft_token: i32,
    cut: f32,       // target entries below it have p = 0
    dcut: f32,      // draft-logit entries below it have q = 0
    excl_at: u32,   // tree batches: the excluded tokens are out_words[excl_at ..][.. excl_count]
    excl_count: u32,
}

// Tree batches: the output words after the packed output hold the accepted nodes (R ×
// out_stride), then one 8-word race header per request, then the children's tokens (see
// verify.wgsl tree_walk and PARAM_TREE).
fn tree_headers() -> u32 {
    var base = params.num_requests * params.out_stride + 2u * params.num_requests;
    if ((params.flags & PARAM_LOGPROBS) != 0u) {
        base += 2u * params.num_requests * params.out_stride;
    }
    return base + params.num_requests * params.out_stride;
}

// True when `y` is one of the excluded tokens (the rejected children of a tree slot drafted
// without q). Checked only for an entry that could win the race, so its cost is a few entries
// per block, whatever the count.
fn excluded(c: RaceCtx, y: u32) -> bool {
    for (var j = 0u; j < c.excl_count; j += 1u) {
        if (out_words[c.excl_at + j] == y) {
            return true;
        }
    }
    return false;
}

// Entries y .. y+3 of the row (element `base` of the binding); entries at or past `end` read as
// -inf, so their p is 0 and they never win.
fn load_logits4(base: u32, y: u32, end: u32) -> vec4<f32> {
    let ninf = bitcast<f32>(NEG_INF_BITS);
    if (y + 3u < end) {
        return t_elem4(base + y);
    }
    var r = vec4<f32>(ninf);
    if (y < end) {
        r.x = t_elem(base + y);
    }
    if (y + 1u < end) {
        r.y = t_elem(base + y + 1u);
    }
    if (y + 2u < end) {
        r.z = t_elem(base + y + 2u);
    }
    return r;
}

// Draft values y .. y+3; entries past the draft vocabulary read as 0 (and race_step ignores
// them).
fn load_draft4(base: u32, y: u32) -> vec4<f32> {
    let v = params.draft_vocab;
    if (y + 3u < v) {
        return d_elem4(base + y);
    }
    var r = vec4<f32>(0.0);
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

// One entry of the exponential race: keys r(y)/e_y and p(y)/e_y against the best so far.
// `floor_r` / `floor_p` are keys another lane of the workgroup has already reached: an entry
// that cannot beat them cannot win the block either, so it is settled without the log.
fn race_step(best_in: Candidate, c: RaceCtx, y: u32, l: f32, dv: f32, bits: u32, floor_r: f32, floor_p: f32) -> Candidate {
    var best = best_in;
    let ninf = bitcast<f32>(NEG_INF_BITS);
    let lc = select(l, ninf, l < c.cut);
    let w = w_from_bits(bits);
    if (!c.use_q) {
        // Log-domain keys. p's candidates are r's plus the excluded tokens, so one test against
        // r's bound (the lower one) settles both races.
        if (is_neg_inf(lc) || is_nan(lc)) {
            return best; // p = 0
        }
        let z = lc * c.inv_t;
        if (log_race_may(z, w, max(best.r_key, floor_r))) {
            let key = log_race_key(z, w);
            let excl = (c.kind == TASK_ONE_HOT_RESIDUAL && i32(y) == c.draft_token)
                || (c.excl_count > 0u && excluded(c, y));
            if (!excl && better(key, y, best.r_key, best.r_idx)) {
                best.r_key = key;
                best.r_idx = y;
                best.r_logit = l;
            }
            if (better(key, y, best.p_key, best.p_idx)) {
                best.p_key = key;
                best.p_idx = y;
                best.p_logit = l;
            }
        }
        return best;
    }
    let p = exp((lc - c.st.t_max) * c.inv_t) * c.inv_sum;
    var res = p;
    if (c.use_q) {
        var q = 0.0;
        if (y < params.draft_vocab) {
            if (c.q_logits) {
                q = exp((select(dv, ninf, dv < c.dcut) - c.st.q_max) * c.inv_t) * c.inv_qsum;
            } else if (!(is_nan(dv) || is_pos_inf(dv) || dv < 0.0)) {
                q = dv;
            }
        }
        res = max(c.rho * p - q, 0.0);
    }
    // e = -ln(1 - w) >= w, so a key r/e can only beat the best B if r > B·w: most tokens are
    // settled with one multiply and never evaluate the log (the twin applies the same rule).
    // Padded by 1.001, as log_race_may, so that no key within rounding of B is skipped: B holds
    // other lanes' keys as they publish them. (An excluded tree token has residual 0: the twin
    // zeroes it before this test.)
    let r_may = res > 0.0 && res * 1.001 > max(best.r_key, floor_r) * w && !(c.excl_count > 0u && excluded(c, y));
    let p_may = p > 0.0 && p * 1.001 > max(best.p_key, floor_p) * w;
    if (r_may || p_may) {
        let e = exp1_from_w(w);
        let rk = res / e;
        let pk = p / e;
        if (r_may && better(rk, y, best.r_key, best.r_idx)) {
            best.r_key = rk;
            best.r_idx = y;
            best.r_logit = l;
        }
        if (p_may && better(pk, y, best.p_key, best.p_idx)) {
            best.p_key = pk;
            best.p_idx = y;
            best.p_logit = l;
        }
    }
    return best;
}

// Whether any entry of a quad of log-domain keys (logits `l`, noise words `words`) may pass
// race_step's own test against `bound` (log_race_may: w < exp(z − bound)): one `exp` for the
// quad's largest z and an integer test per entry, where race_step spends a float w and an
// `exp` on every entry. It passes every entry race_step's test would pass, so skipping the
// quads it rejects changes no token (and the twin, which tests each entry, needs no change):
// the quad's z and bound bound each entry's from above and below (the bound only rises along
// the quad), and bits >= tb implies w >= t (w is bits truncated to 24 significant bits, over
// 2^32, and T = t·2^32 lies on that grid or below 2^24), with t padded against exp's ulps.
fn log_quad_may(l: vec4<f32>, words: vec4<u32>, c: RaceCtx, bound: f32) -> bool {
    let zmax = quad_max_logit(l, c.cut) * c.inv_t;
    if (is_neg_inf(zmax)) {
        return false;
    }
    return words_below(words, exp(zmax - bound)); // a -inf bound gives t = +inf: true
}

// The same for the linear keys r / e and p / e (race_step: r > B_r·w or p > B_p·w): every
// entry's p is at most the quad's largest, and r = max(ρ p − q, 0) at most ρ p.
fn linear_quad_may(l: vec4<f32>, words: vec4<u32>, c: RaceCtx, bound_r: f32, bound_p: f32) -> bool {
    let lmax = quad_max_logit(l, c.cut);
    if (is_neg_inf(lmax)) {
        return false;
    }
    if (!(bound_r > 0.0) || !(bound_p > 0.0)) {
        return true; // no bound yet on one side (keys start at -inf): nothing to test against
    }
    let pmax = exp((lmax - c.st.t_max) * c.inv_t) * c.inv_sum;
    return words_below(words, pmax * max(max(c.rho, 1.0) / bound_r, 1.0 / bound_p));
}

// The largest logit of a quad that race_step could take: cut-off and NaN entries have p = 0
// (race_step skips them), NaN kept out of max by bit tests (as is_nan: a float test may be
// folded away). -inf when there is none.
fn quad_max_logit(l: vec4<f32>, cut: f32) -> f32 {
    let nan = (bitcast<vec4<u32>>(l) & vec4<u32>(0x7fffffffu)) > vec4<u32>(POS_INF_BITS);
    let lc = select(l, vec4<f32>(bitcast<f32>(NEG_INF_BITS)), (l < vec4<f32>(cut)) | nan);
    return max(max(lc.x, lc.y), max(lc.z, lc.w));
}

// Whether some noise word of a quad may lie below the threshold t: bits < T + 2 with
// T = t·2^32·1.002 (race_step's padding of 1.001 times one against exp's ulps here); any T at or
// past 4e9 (or NaN, +inf) passes the quad.
fn words_below(words: vec4<u32>, t: f32) -> bool {
    let big_t = t * (4294967296.0 * 1.002);
    if (!(big_t < 4.0e9)) {
        return true;
    }
    let tb = u32(big_t) + 2u;
    return any(words < vec4<u32>(tb));
}

// The quad test of the block's race (log_quad_may or linear_quad_may, by its keys) against the
// lane's best and the workgroup's bounds.
fn quad_may(c: RaceCtx, l: vec4<f32>, words: vec4<u32>, best: Candidate, floor_r: f32, floor_p: f32) -> bool {
    if (c.use_q) {
        return linear_quad_may(l, words, c, max(best.r_key, floor_r), max(best.p_key, floor_p));
    }
    return log_quad_may(l, words, c, max(best.r_key, floor_r));
}

// EARLY: the task of local row `lr` as verify would set it were the request to stop there:
// a rejected one-hot draft (its drafted token excluded from the r race) or the bonus row; none
// for greedy requests and rows past the request's own.
fn early_task(info: ReqInfo, lr: u32) -> Task {
    var t = Task(TASK_NONE, lr, -1, 0u);
    if ((info.flags & REQ_GREEDY) != 0u || lr > info.num_drafts) {
        return t;
    }
    if (lr < info.num_drafts) {
        t.kind = TASK_ONE_HOT_RESIDUAL;
        t.draft_token = bitcast<i32>(draft_values[info.draft_offset + lr]);
    } else {
        t.kind = TASK_FROM_TARGET;
    }
    return t;
}

// The candidates' row of request r: one per request, or with EARLY one per (request, local row).
fn candidate_row(r: u32, local_row: u32) -> u32 {
    if (EARLY) {
        return r * params.out_stride + local_row;
    }
    return r;
}

@compute @workgroup_size(WG)
fn block(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let block_id = wid.x;
    let r = params.req_begin + wid.y;
    let info = requests[r];
    var task: Task;
    if (EARLY) {
        task = early_task(info, wid.z);
    } else {
        task = tasks[r];
    }
    let row = info.row_offset + task.local_row;
    let in_window = task.kind != TASK_NONE && row >= params.row_begin
        && row < params.row_begin + params.row_count;

    // The early race reads no row statistics (log-domain keys: `c.st` only enters the linear
    // keys), and where row_stats_verify runs beside it its bind group holds a dummy of one
    // element at binding 4 (residual.rs, `early_race_groups`): no load there.
    var st: RowStats;
    if (!EARLY) {
        st = row_stats[row];
    }
    let inv_t = info.inv_temperature;
    let begin = block_id * params.block_len;
    var end = min(begin + params.block_len, params.vocab);
    if (!in_window) {
        end = begin; // no work, but every lane still reaches the barriers below
    }
    let t_base = params.t_elem_base + (row - params.row_begin) * params.vocab;
    var d_row = info.draft_offset + task.local_row;
    var has_d = task.local_row < info.num_drafts;
    var stream = STREAM_RESIDUAL;
    if (task.local_row == info.num_drafts) {
        stream = STREAM_BONUS;
    }
    if ((info.flags & REQ_FAULT_SHARED_NOISE) != 0u) {
        stream = STREAM_ACCEPT; // negative control: noise correlated with the accept draw
    }
    var pos = row_position(info, task.local_row);
    var excl_at = 0u;
    var excl_count = 0u;
    if ((params.flags & PARAM_TREE) != 0u) {
        // A tree slot sits at its depth, draws bonus noise only at a leaf, has its own draft
        // row, and may exclude several rejected children.
        let h = tree_headers() + 8u * r;
        pos = row_position(info, out_words[h]);
        stream = out_words[h + 1u];
        d_row = out_words[h + 2u];
        has_d = d_row != NO_INDEX;
        excl_at = tree_headers() + 8u * params.num_requests + out_words[h + 3u];
        excl_count = out_words[h + 4u];
    }
    let d_base = params.d_elem_base + (d_row - params.d_row_begin) * params.draft_vocab;
    let use_q = !LOG_KEYS && (task.kind == TASK_DRAFT_RESIDUAL || task.kind == TASK_BLOCK_RESIDUAL);
    let rho = select(1.0, st.rho, task.kind == TASK_BLOCK_RESIDUAL);
    let q_logits = params.draft_kind == DRAFT_LOGITS;

    let ninf = bitcast<f32>(NEG_INF_BITS);
    var best = Candidate(ninf, NO_INDEX, ninf, NO_INDEX, 0.0, 0.0, 0u, 0u);
    var cut = ninf;
    var dcut = cut;
    if ((params.flags & PARAM_CUTOFF) != 0u && in_window) {
        cut = cutoffs[row];
        if (has_d) {
            dcut = cutoffs[params.total_rows + d_row];
        }
    }
    // LOG_KEYS batches are not trees: no excluded tokens (and the constant drops their code).
    let excl_n = select(excl_count, 0u, LOG_KEYS);
    let ctx = RaceCtx(st, 1.0 / st.t_sum, 1.0 / st.q_sum, inv_t, use_q, rho, q_logits, task.kind, task.draft_token, cut, dcut, excl_at, excl_n);
    if (lane == 0u) {
        atomicStore(&bound_r, order_key(ninf));
        atomicStore(&bound_p, order_key(ninf));
        atomicStore(&win_r, NO_INDEX);
        atomicStore(&win_p, NO_INDEX);
        win_rl = 0.0;
        win_pl = 0.0;
    }
    workgroupBarrier();
    // block_len is a multiple of 4, so each group of 4 starts on a Philox quad boundary. The
    // loads go out first; the Philox rounds then overlap their latency.
    let quad_tests = params.block_len >= 16u * WG;
    for (var g = begin + 4u * lane; g < end; g += 4u * WG) {
        let l = load_logits4(t_base, g, end);
        var dv = vec4<f32>(0.0);
        if (use_q) {
            dv = load_draft4(d_base, g);
        }
        let words = random_words(info, pos, stream, g / 4u);
        let floor_r = from_order_key(atomicLoad(&bound_r));
        // Log-domain keys test p against r's bound (race_step): p's bound is needed only by
        // publish_winner, so those races publish it once, after the loop.
        var floor_p = floor_r;
        if (!LOG_KEYS) {
            floor_p = from_order_key(atomicLoad(&bound_p));
        }
        // Quads that cannot pass race_step's test are skipped whole (log_quad_may): where a
        // lane has a few quads, its first ones meet a low bound and pass anyway, so the test
        // runs from 4 quads per lane (residual pass 0.83x at R = 128 on an H200, 1.02-1.03x
        // at R <= 8 without the threshold).
        if (quad_tests && !quad_may(ctx, l, words, best, floor_r, floor_p)) {
            continue;
        }
        best = race_step(best, ctx, g, l.x, dv.x, words.x, floor_r, floor_p);
        best = race_step(best, ctx, g + 1u, l.y, dv.y, words.y, floor_r, floor_p);
        best = race_step(best, ctx, g + 2u, l.z, dv.z, words.z, floor_r, floor_p);
        best = race_step(best, ctx, g + 3u, l.w, dv.w, words.w, floor_r, floor_p);
        if (best.r_key > floor_r) {
            atomicMax(&bound_r, order_key(best.r_key));
        }
        if (!LOG_KEYS && best.p_key > floor_p) {
            atomicMax(&bound_p, order_key(best.p_key));
        }
    }
    if (LOG_KEYS) {
        atomicMax(&bound_p, order_key(best.p_key));
    }
    let slot = candidate_row(r, task.local_row) * params.num_blocks + block_id;
    publish_winner(best, lane, select(NO_INDEX, slot, in_window));
}

// The block's winner, written to candidates[slot] by lane 0 (NO_INDEX: nothing written, for a
// workgroup outside the window, which still reaches the barriers). The largest key is already in
// the bounds (every lane published its best), so only the lowest index holding it is left to
// find, then its logit. Every lane calls it.
fn publish_winner(best: Candidate, lane: u32, slot: u32) {
    workgroupBarrier();
    let top_r = atomicLoad(&bound_r);
    let top_p = atomicLoad(&bound_p);
    let holds_r = order_key(best.r_key) == top_r;
    let holds_p = order_key(best.p_key) == top_p;
    if (holds_r) {
        atomicMin(&win_r, best.r_idx);
    }
    if (holds_p) {
        atomicMin(&win_p, best.p_idx);
    }
    workgroupBarrier();
    let idx_r = atomicLoad(&win_r);
    let idx_p = atomicLoad(&win_p);
    if (holds_r && best.r_idx == idx_r && idx_r != NO_INDEX) {
        win_rl = best.r_logit;
    }
    if (holds_p && best.p_idx == idx_p && idx_p != NO_INDEX) {
        win_pl = best.p_logit;
    }
    workgroupBarrier();
    if (lane == 0u && slot != NO_INDEX) {
        candidates[slot] = Candidate(from_order_key(top_r), idx_r, from_order_key(top_p), idx_p, win_rl, win_pl, 0u, 0u);
    }
}

var<workgroup> m_key_r: atomic<u32>;
var<workgroup> m_key_p: atomic<u32>;
var<workgroup> m_idx_r: atomic<u32>;
var<workgroup> m_idx_p: atomic<u32>;
var<workgroup> m_logit_r: f32;
var<workgroup> m_logit_p: f32;

// One workgroup of 64 per request: the lanes load the block candidates in parallel, each keeps
// the best of its share, and the workgroup takes the largest key and then the lowest index
// holding it through atomics (the argmax with lowest-index ties does not depend on the order).
// Every load goes out before anything waits on another: the candidates do not wait for the task,
// and lane 0 fetches the request and its row statistics while the others fold.
@compute @workgroup_size(64)
fn merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let r = wid.x;
    let ninf = bitcast<f32>(NEG_INF_BITS);
    if (lane == 0u) {
        atomicStore(&m_key_r, order_key(ninf));
        atomicStore(&m_key_p, order_key(ninf));
        atomicStore(&m_idx_r, NO_INDEX);
        atomicStore(&m_idx_p, NO_INDEX);
        m_logit_r = 0.0;
        m_logit_p = 0.0;
    }
    let task = tasks[r];
    let info = requests[r];
    let st = row_stats[select(0u, info.row_offset + task.local_row, task.kind != TASK_NONE)];
    var best = Candidate(ninf, NO_INDEX, ninf, NO_INDEX, 0.0, 0.0, 0u, 0u);
    let cand_base = candidate_row(r, task.local_row) * params.num_blocks;
    for (var b = lane; b < params.num_blocks; b += 64u) {
        let c = candidates[cand_base + b];
        if (better(c.r_key, c.r_idx, best.r_key, best.r_idx)) {
            best.r_key = c.r_key;
            best.r_idx = c.r_idx;
            best.r_logit = c.r_logit;
        }
        if (better(c.p_key, c.p_idx, best.p_key, best.p_idx)) {
            best.p_key = c.p_key;
            best.p_idx = c.p_idx;
            best.p_logit = c.p_logit;
        }
    }
    workgroupBarrier();
    atomicMax(&m_key_r, order_key(best.r_key));
    atomicMax(&m_key_p, order_key(best.p_key));
    workgroupBarrier();
    let holds_r = order_key(best.r_key) == atomicLoad(&m_key_r);
    let holds_p = order_key(best.p_key) == atomicLoad(&m_key_p);
    if (holds_r) {
        atomicMin(&m_idx_r, best.r_idx);
    }
    if (holds_p) {
        atomicMin(&m_idx_p, best.p_idx);
    }
    workgroupBarrier();
    let idx_r = atomicLoad(&m_idx_r);
    let idx_p = atomicLoad(&m_idx_p);
    if (holds_r && best.r_idx == idx_r && idx_r != NO_INDEX) {
        m_logit_r = best.r_logit;
    }
    if (holds_p && best.p_idx == idx_p && idx_p != NO_INDEX) {
        m_logit_p = best.p_logit;
    }
    workgroupBarrier();
    if (lane != 0u || task.kind == TASK_NONE) {
        return;
    }
    // An early race excluded the drafted token from every draft row's r race; a task taking
    // the target's own sample wants the p race (in the other modes r equals p for it).
    let use_p = EARLY && task.kind == TASK_FROM_TARGET;
    var token = select(idx_r, idx_p, use_p);
    var logit = select(m_logit_r, m_logit_p, use_p);
    if (token == NO_INDEX) {
        // Empty residual (p == q, or p concentrated on the rejected draft): fall back to p.
        token = idx_p;
        logit = m_logit_p;
        let status_idx = params.num_requests * params.out_stride + params.num_requests + r;
        out_words[status_idx] = out_words[status_idx] | STATUS_EMPTY_RESIDUAL;
    }
    if (token == NO_INDEX) {
        token = st.t_arg;
        logit = st.t_max;
    }
    out_words[task.slot] = token;
    put_logprobs(task.slot, logprobs_of(info, st, logit));
}

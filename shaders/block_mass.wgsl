// block_mass — the residual masses of block verification with a draft distribution (SPEC §3
// rule 5): R_j = Σ_y max(ρ_j p_j(y) - q_j(y), 0) at draft rows j = 1 .. k-1 of each block
// request. CPU twin: src/cpu/block_mass.rs. Pipeline label: specdec.block_mass.main.
//
// Why a pass of its own: ρ_j = min(1, ρ_{j-1} p_{j-1}(d) / q_{j-1}(d)) needs the softmax sums
// of the earlier rows, so R_j cannot be summed in the same pass as the statistics. The verify
// kernel's `main` entry stores ρ_j in row_stats[row].rho and leaves the request pending; this
// pass sums the masses; verify's `block_settle` entry decides. Only batches with such requests
// run it, and only the rows whose mass can change the decision (ROW_MASS_DUE, verify's
// mark_due_masses) are read: the others skip the read.
//
// Dispatch `main`: x = chunk of the row (CHUNK entries), y = target row within the window; one
// workgroup of CHUNK_LANES (64). Lane l sums the groups of entries 4(l + 64 i) + (0..3),
// i = 0..15 in that order, each group as (t0 + t1) + (t2 + t3); the lanes fold as a tree (lane i
// takes lane i + s for s = 32 .. 1) and lane 0 writes the chunk's partial. verify folds the
// partials of a row in chunk order. The order of every float operation is fixed by CHUNK alone,
// so R_j does not depend on the batch and the twin reproduces it.
//
// p and q are computed as the residual pass computes them (one division per row, the same
// cut-offs), so the mass is the mass of the residual that pass samples from.

// Bindings 0-2 (params, target_logits, draft_values) and t_elem / d_elem: shaders/rows.wgsl.
@group(0) @binding(3) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(4) var<storage, read> row_info: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> row_stats: array<RowStats>;
@group(0) @binding(6) var<storage, read> cutoffs: array<f32>;
// Chunk partials of R: total_rows × num_chunks (only rows that need one are written).
@group(0) @binding(7) var<storage, read_write> masses: array<f32>;

var<workgroup> sh_sum: array<f32, CHUNK_LANES>;
// `main`: whether the workgroup's row is due (ROW_MASS_DUE), as a workgroup-uniform value.
var<workgroup> wg_needed: u32;

// What one term of the sum needs to know about the row.
struct MassCtx {
    t_base: u32,
    d_base: u32,
    t_max: f32,
    inv_sum: f32,
    q_max: f32,
    inv_qsum: f32,
    inv_t: f32,
    rho: f32,
    cut: f32,
    dcut: f32,
}

// max(ρ p(y) - q(y), 0) for entry y of target value l and draft value dv; 0 past the vocabulary.
// q is 0 past the draft vocabulary, and a draft probability that is NaN, +inf or negative
// counts as 0 (as in the residual pass).
fn term(c: MassCtx, y: u32, l: f32, dv: f32) -> f32 {
    if (y >= params.vocab) {
        return 0.0;
    }
    var p = 0.0;
    if (!(l < c.cut) && !is_neg_inf(l) && !is_nan(l)) {
        p = exp((l - c.t_max) * c.inv_t) * c.inv_sum;
    }
    var q = 0.0;
    if (y < params.draft_vocab) {
        if (params.draft_kind == DRAFT_LOGITS) {
            if (!(dv < c.dcut) && !is_neg_inf(dv) && !is_nan(dv)) {
                q = exp((dv - c.q_max) * c.inv_t) * c.inv_qsum;
            }
        } else if (!(is_nan(dv) || is_pos_inf(dv) || dv < 0.0)) {
            q = dv;
        }
    }
    return max(c.rho * p - q, 0.0);
}

// Entries y .. y+3 of the target row (t) and of the draft row (d). Past a row's end the index
// is clamped to its last entry: the same addresses as reading entry by entry, and `term` gives
// those entries 0 whatever their values.
struct Group {
    t: vec4<f32>,
    d: vec4<f32>,
}

fn load_group(c: MassCtx, y: u32) -> Group {
    var g: Group;
    let v = params.vocab;
    if (y + 3u < v) {
        g.t = t_elem4(c.t_base + y);
    } else {
        g.t = vec4<f32>(t_elem(c.t_base + min(y, v - 1u)), t_elem(c.t_base + min(y + 1u, v - 1u)),
                        t_elem(c.t_base + min(y + 2u, v - 1u)), t_elem(c.t_base + min(y + 3u, v - 1u)));
    }
    let dvs = params.draft_vocab;
    if (y + 3u < dvs) {
        g.d = d_elem4(c.d_base + y);
    } else {
        g.d = vec4<f32>(d_elem(c.d_base + min(y, dvs - 1u)), d_elem(c.d_base + min(y + 1u, dvs - 1u)),
                        d_elem(c.d_base + min(y + 2u, dvs - 1u)), d_elem(c.d_base + min(y + 3u, dvs - 1u)));
    }
    return g;
}

// The group at y, each pair summed first: (t0 + t1) + (t2 + t3).
fn group_mass(c: MassCtx, y: u32, g: Group) -> f32 {
    return (term(c, y, g.t.x, g.d.x) + term(c, y + 1u, g.t.y, g.d.y))
        + (term(c, y + 2u, g.t.z, g.d.z) + term(c, y + 3u, g.t.w, g.d.w));
}

// The partial of Σ max(ρ p − q, 0) over chunk `chunk` of the row `ctx` describes, in the order
// above (0 where `due` is false). Every lane of the workgroup calls it: it holds the barriers.
// Four groups' loads go out before any is summed, so a lane waits out one memory latency per
// four groups instead of one per group; the sum's order is unchanged (a group past the row's
// end adds +0, the same as stopping).
fn chunk_mass(ctx: MassCtx, chunk: u32, lane: u32, due: bool) -> f32 {
    var s = 0.0;
    if (due) {
        let first = chunk * CHUNK;
        for (var i = 0u; i < CHUNK_STEPS; i += 4u) {
            let y0 = first + 4u * (lane + CHUNK_LANES * i);
            if (y0 >= params.vocab) {
                break;
            }
            let y1 = y0 + 4u * CHUNK_LANES;
            let y2 = y1 + 4u * CHUNK_LANES;
            let y3 = y2 + 4u * CHUNK_LANES;
            let g0 = load_group(ctx, y0);
            let g1 = load_group(ctx, y1);
            let g2 = load_group(ctx, y2);
            let g3 = load_group(ctx, y3);
            s = s + group_mass(ctx, y0, g0);
            s = s + group_mass(ctx, y1, g1);
            s = s + group_mass(ctx, y2, g2);
            s = s + group_mass(ctx, y3, g3);
        }
    }
    sh_sum[lane] = s;
    workgroupBarrier();
    // Levels wider than a subgroup through workgroup memory, the rest in registers
    // (lanes_subgroup.wgsl): the same sums in the same order.
    let sg = min(SG_LANES, CHUNK_LANES);
    for (var stride = CHUNK_LANES / 2u; stride >= sg && stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            sh_sum[lane] = sh_sum[lane] + sh_sum[lane + stride];
        }
        workgroupBarrier();
    }
    if (sg > 1u) {
        var t = sh_sum[lane];
        for (var stride = sg / 2u; stride > 0u; stride = stride / 2u) {
            t = t + lanes_down_f32(t, stride);
        }
        if (lane == 0u) {
            sh_sum[0] = t;
        }
        workgroupBarrier();
    }
    return sh_sum[0];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let chunk = wid.x;
    let row = params.row_begin + wid.y;
    let ri = row_info[row]; // (request, row within the request, drafted token, draft row)
    let info = requests[ri.x];
    let st = row_stats[row];
    // Rows 1 .. k-1 of block requests (row 0 needs no mass: τ = 0 is the fallback), and only
    // those verify marked due (the others' R cannot change τ, and verify does not read it).
    // The same in every lane; made uniform through one barrier, so that a workgroup with nothing
    // to sum (most of them) returns before chunk_mass' six.
    let needed = (info.flags & REQ_BLOCK) != 0u && ri.y >= 1u && ri.y < info.num_drafts
        && (st.flags & ROW_MASS_DUE) != 0u;
    if (lane == 0u) {
        wg_needed = select(0u, 1u, needed);
    }
    if (workgroupUniformLoad(&wg_needed) == 0u) {
        return;
    }
    var ctx = MassCtx(
        params.t_elem_base + (row - params.row_begin) * params.vocab,
        params.d_elem_base + (ri.w - params.d_row_begin) * params.draft_vocab,
        st.t_max, 1.0 / st.t_sum, st.q_max, 1.0 / st.q_sum, info.inv_temperature, st.rho,
        bitcast<f32>(NEG_INF_BITS), bitcast<f32>(NEG_INF_BITS));
    if ((params.flags & PARAM_CUTOFF) != 0u) {
        ctx.cut = cutoffs[row];
        ctx.dcut = cutoffs[params.total_rows + ri.w];
    }
    let partial = chunk_mass(ctx, chunk, lane, true);
    if (lane == 0u) {
        masses[row * params.num_chunks + chunk] = partial;
    }
}

// ---- Tree batches (crate::tree; CPU: src/cpu/tree.rs) ----------------------------------------
//
// For a tree batch `row_info` is bound to the tree table and `masses` to the tree values (layouts
// in src/gpu/tree.rs). Table: per slot g (= target row), words 8g .. 8g+7 are (request, depth,
// first child, child count, token, draft row, 0, 0); the children (their slots, grouped by
// parent) follow at word 8·total_rows. Values, R = total_rows, C = num_chunks:
//   [0, 3R)        per slot: its token's logit at its parent's row (under the cut-off), its
//                  draft value there (raw probability, or logit under the draft cut-off), and the
//                  residual mass its test needs when it is the j-th child (j ≥ 1) of a node whose
//                  children were drawn from q;
//   [3R, 5R)       per slot: ρ and the next sibling level j (as f32) of its mass recursion;
//   [5R, 5R + RC)  per slot and chunk: the partial of the mass being summed.
// The masses follow SpecInfer's residual recursion in the form max(ρ_j p − q, 0): ρ_1 = 1,
// M_j = Σ max(ρ_j p − q, 0), ρ_{j+1} = ρ_j / (1 + M_j). They depend on the row alone, not on the
// draws, so they are summed for every child the walk might test, level by level: `tree_mass`
// (one workgroup per chunk and row, the block-mass order above) then `tree_fold` (chunk order),
// once per level up to the batch's largest child count.

// Entry `tree`: one workgroup per slot of the window: the children's values at this row, and
// the slot's recursion state (ρ = 1, level 1).
@compute @workgroup_size(64)
fn tree(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = params.row_begin + wid.x;
    let ctx = tree_ctx(row);
    let child_begin = tree_word(8u * row + 2u);
    let child_count = tree_word(8u * row + 3u);
    let children = 8u * params.total_rows;
    for (var i = lane; i < child_count; i += CHUNK_LANES) {
        let c = tree_word(children + child_begin + i);
        let token = tree_word(8u * c + 4u);
        var l = t_elem(ctx.t_base + token);
        if (l < ctx.cut) {
            l = bitcast<f32>(NEG_INF_BITS);
        }
        var qv = 0.0;
        if (tree_word(8u * row + 5u) != NO_INDEX && params.draft_kind != DRAFT_NONE
            && token < params.draft_vocab) {
            qv = d_elem(ctx.d_base + token);
            if (params.draft_kind == DRAFT_LOGITS && qv < ctx.dcut) {
                qv = bitcast<f32>(NEG_INF_BITS);
            }
        }
        masses[3u * c] = l;
        masses[3u * c + 1u] = qv;
    }
    if (lane == 0u) {
        masses[3u * params.total_rows + 2u * row] = 1.0;
        masses[3u * params.total_rows + 2u * row + 1u] = 1.0;
    }
}

fn tree_word(i: u32) -> u32 {
    return row_info[i / 4u][i % 4u];
}

// The term context of slot row `row` (ρ from the recursion state).
fn tree_ctx(row: u32) -> MassCtx {
    let info = requests[tree_word(8u * row)];
    let q_row = tree_word(8u * row + 5u);
    let st = row_stats[row];
    let ninf = bitcast<f32>(NEG_INF_BITS);
    var ctx = MassCtx(
        params.t_elem_base + (row - params.row_begin) * params.vocab, 0u,
        st.t_max, 1.0 / st.t_sum, st.q_max, 1.0 / st.q_sum, info.inv_temperature,
        masses[3u * params.total_rows + 2u * row], ninf, ninf);
    let has_q = q_row != NO_INDEX && params.draft_kind != DRAFT_NONE;
    if (has_q) {
        ctx.d_base = params.d_elem_base + (q_row - params.d_row_begin) * params.draft_vocab;
    }
    if ((params.flags & PARAM_CUTOFF) != 0u) {
        ctx.cut = cutoffs[row];
        if (has_q) {
            ctx.dcut = cutoffs[params.total_rows + q_row];
        }
    }
    return ctx;
}

// True while slot row `row` still has a mass to sum: its children were drawn from q (not
// greedy, finite row, usable q) and the level has not reached its child count.
fn tree_mass_due(row: u32) -> bool {
    let info = requests[tree_word(8u * row)];
    let st = row_stats[row];
    let has_q = tree_word(8u * row + 5u) != NO_INDEX && params.draft_kind != DRAFT_NONE;
    let greedy = (info.flags & REQ_GREEDY) != 0u;
    let finite = (st.flags & (ROW_T_NAN | ROW_T_POSINF)) == 0u && !is_neg_inf(st.t_max);
    let q_ok = params.draft_kind != DRAFT_LOGITS
        || ((st.flags & (ROW_Q_NAN | ROW_Q_POSINF)) == 0u && !is_neg_inf(st.q_max));
    let level = u32(masses[3u * params.total_rows + 2u * row + 1u]);
    return has_q && !greedy && finite && q_ok && level < tree_word(8u * row + 3u);
}

// Entry `tree_mass`: x = chunk, y = row within the window; the chunk's partial of the mass at
// the row's current level, exactly as `main` sums a block-mass partial.
@compute @workgroup_size(64)
fn tree_mass(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let chunk = wid.x;
    let row = params.row_begin + wid.y;
    let due = tree_mass_due(row);
    let partial = chunk_mass(tree_ctx(row), chunk, lane, due);
    if (lane == 0u && due) {
        masses[5u * params.total_rows + row * params.num_chunks + chunk] = partial;
    }
}

// Entry `tree_fold`: one invocation per row of the window (64 per workgroup): the mass at the
// current level folded in chunk order, stored for the child it tests, then ρ and the level move on.
@compute @workgroup_size(64)
fn tree_fold(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = wid.x * 64u + lane;
    if (i >= params.row_count) {
        return;
    }
    let row = params.row_begin + i;
    if (!tree_mass_due(row)) {
        return;
    }
    let base = 5u * params.total_rows + row * params.num_chunks;
    var total = masses[base];
    for (var c = 1u; c < params.num_chunks; c += 1u) {
        total = total + masses[base + c];
    }
    let state = 3u * params.total_rows + 2u * row;
    let level = u32(masses[state + 1u]);
    let child = tree_word(8u * params.total_rows + tree_word(8u * row + 2u) + level);
    masses[3u * child + 2u] = total;
    masses[state] = masses[state] / (1.0 + total);
    masses[state + 1u] = f32(level + 1u);
}

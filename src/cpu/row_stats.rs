//! CPU twin of `shaders/row_stats.wgsl` (and of the row merge in `shaders/verify.wgsl`): the
//! same chunks, lanes, tree and NaN rules, so the sums agree with the GPU's up to the last bits of
//! `exp`, whatever the batch.

use crate::layout::*;

/// Online softmax state of one emulated lane.
#[derive(Clone, Copy)]
struct Acc {
    m: f32,
    s: f32,
    a: u32,
    flags: u32,
    /// Σ exp(z) z, z = (x − m) / T (typical acceptance rows only).
    e: f32,
}

const ACC_NEW: Acc = Acc {
    m: f32::NEG_INFINITY,
    s: 0.0,
    a: NO_INDEX,
    flags: 0,
    e: 0.0,
};

/// `exp((x − m) / T)`, 0 for x = −inf.
#[inline]
fn term(x: f32, m: f32, inv_t: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        0.0
    } else {
        ((x - m) * inv_t).exp()
    }
}

/// The entropy numerator of one side of a merge moved to max `m_new` (`rescale_ent` in the
/// WGSL): with d = (m − m_new) / T, exp(d) (e + d s); a −inf side contributes nothing.
#[inline]
pub(crate) fn rescale_ent(m: f32, s: f32, e: f32, m_new: f32, inv_t: f32) -> f32 {
    if m == f32::NEG_INFINITY {
        0.0
    } else {
        let d = (m - m_new) * inv_t;
        d.exp() * (e + d * s)
    }
}

/// exp(z) z for z = (x − m) / T, 0 for x = −inf.
#[inline]
fn ent_term(x: f32, m: f32, inv_t: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        0.0
    } else {
        let z = (x - m) * inv_t;
        z.exp() * z
    }
}

/// Adds entries `y .. y+3` to a lane's state, exactly as `push4` in `shaders/row_stats.wgsl`:
/// NaN counts as −inf (flagged), +inf is flagged, a new maximum takes the lowest index holding it
/// and rescales the sum once, then the terms are added as `(t0 + t1) + (t2 + t3)`.
// Eight arguments mirror the WGSL's push4 one for one (the twin reads like the kernel).
#[allow(clippy::too_many_arguments)]
#[inline]
fn push4(
    acc: &mut Acc,
    v_in: [f32; 4],
    y: u32,
    inv_t: f32,
    with_sum: bool,
    nan_flag: u32,
    inf_flag: u32,
    with_ent: bool,
) {
    let mut v = v_in;
    for x in &mut v {
        if x.is_nan() {
            acc.flags |= nan_flag;
            *x = f32::NEG_INFINITY;
        }
    }
    if v.contains(&f32::INFINITY) {
        acc.flags |= inf_flag;
    }
    let m4 = v[0].max(v[1]).max(v[2].max(v[3]));
    if m4 > acc.m {
        let a = v.iter().position(|&x| x == m4).unwrap_or(3) as u32;
        if with_ent {
            acc.e = rescale_ent(acc.m, acc.s, acc.e, m4, inv_t);
        }
        if with_sum {
            acc.s = rescale(acc.m, acc.s, m4, inv_t);
        }
        acc.m = m4;
        acc.a = y + a;
    }
    if with_sum && acc.m != f32::NEG_INFINITY {
        let m = acc.m;
        acc.s += (term(v[0], m, inv_t) + term(v[1], m, inv_t))
            + (term(v[2], m, inv_t) + term(v[3], m, inv_t));
    }
    if with_ent && acc.m != f32::NEG_INFINITY {
        let m = acc.m;
        acc.e += (ent_term(v[0], m, inv_t) + ent_term(v[1], m, inv_t))
            + (ent_term(v[2], m, inv_t) + ent_term(v[3], m, inv_t));
    }
}

/// Entries `y .. y+3` of `row`, −inf past its end (pushing −inf changes nothing) and below
/// the cut-off `cut` (NaN stays NaN: `NaN < cut` is false, so it is still flagged).
#[inline]
fn group(row: &[f32], y: usize, cut: f32) -> [f32; 4] {
    let mut g = [f32::NEG_INFINITY; 4];
    for (c, x) in g.iter_mut().enumerate() {
        if let Some(&v) = row.get(y + c) {
            *x = if v < cut { f32::NEG_INFINITY } else { v };
        }
    }
    g
}

/// A value at the drafted token, −inf when the cut-off removed it (so its probability is 0).
#[inline]
pub(crate) fn masked(x: f32, cut: f32) -> f32 {
    if x < cut {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// One side of a merge rescaled to `m_new`; a −inf side contributes nothing.
#[inline]
pub(crate) fn rescale(m: f32, s: f32, m_new: f32, inv_t: f32) -> f32 {
    if m == f32::NEG_INFINITY {
        0.0
    } else {
        s * ((m - m_new) * inv_t).exp()
    }
}

/// Argmax merge: larger value wins, equal values go to the lower index.
#[inline]
fn takes_other(m_self: f32, a_self: u32, m_other: f32, a_other: u32) -> bool {
    m_other > m_self || (m_other == m_self && a_other < a_self)
}

/// One row's inputs to the statistics pass.
pub struct RowInput<'a> {
    /// The target row (V values).
    pub target: &'a [f32],
    /// The draft-logit row to reduce alongside (draft logits mode, non-greedy draft rows only).
    pub draft_logits: Option<&'a [f32]>,
    /// The draft row to read `q_at_d` from (probabilities or logits), if the batch has one.
    pub draft_values: Option<&'a [f32]>,
    /// Drafted token of this row, −1 for none.
    pub drafted: i32,
    /// Greedy rows skip the sums.
    pub greedy: bool,
    /// 1 / T.
    pub inv_t: f32,
    /// Target entries below this logit count as −inf (top-k / top-p / min-p); −inf = none.
    pub cut: f32,
    /// The same for the draft-logit row.
    pub dcut: f32,
    /// The draft row holds logits (so `dcut` applies to `q_at_d`).
    pub draft_is_logits: bool,
    /// Also reduce the raw row (no cut-off, T = 1) for raw logprobs.
    pub raw: bool,
    /// Keep the entropy numerator (typical acceptance rows).
    pub ent: bool,
}

/// Statistics of chunk `chunk` of one row, in the order of the statistics contract: lane `l`
/// of [`CHUNK_LANES`] visits entries `4(l + 64 i) + c` (i = 0..15, c = 0..3), then the lanes fold
/// as a tree (lane i takes lane i + s for s = 32 .. 1).
pub fn chunk(input: &RowInput<'_>, chunk: usize) -> RowStats {
    let with_sum = !input.greedy;
    let inv_t = input.inv_t;
    let begin = chunk * CHUNK;
    let vocab = input.target.len();
    let mut t = [ACC_NEW; CHUNK_LANES];
    let mut q = [ACC_NEW; CHUNK_LANES];
    let mut w = [ACC_NEW; CHUNK_LANES];
    for (lane, ((tl, ql), wl)) in t.iter_mut().zip(q.iter_mut()).zip(w.iter_mut()).enumerate() {
        for i in 0..CHUNK / 4 / CHUNK_LANES {
            let y0 = begin + 4 * (lane + CHUNK_LANES * i);
            if input.raw && y0 < vocab {
                push4(
                    wl,
                    group(input.target, y0, f32::NEG_INFINITY),
                    y0 as u32,
                    1.0,
                    true,
                    0,
                    0,
                    false,
                );
            }
            if y0 < vocab {
                push4(
                    tl,
                    group(input.target, y0, input.cut),
                    y0 as u32,
                    inv_t,
                    with_sum,
                    ROW_T_NAN,
                    ROW_T_POSINF,
                    input.ent && with_sum,
                );
            }
            if let Some(draft) = input.draft_logits {
                if y0 < draft.len() {
                    push4(
                        ql,
                        group(draft, y0, input.dcut),
                        y0 as u32,
                        inv_t,
                        true,
                        ROW_Q_NAN,
                        ROW_Q_POSINF,
                        false,
                    );
                }
            }
        }
        tl.flags |= ql.flags;
    }
    let mut stride = CHUNK_LANES / 2;
    while stride > 0 {
        for lane in 0..stride {
            let o = lane + stride;
            let (a, b) = (t[lane], t[o]);
            let m_new = a.m.max(b.m);
            if input.ent && with_sum {
                t[lane].e = rescale_ent(a.m, a.s, a.e, m_new, inv_t)
                    + rescale_ent(b.m, b.s, b.e, m_new, inv_t);
            }
            if with_sum {
                t[lane].s = rescale(a.m, a.s, m_new, inv_t) + rescale(b.m, b.s, m_new, inv_t);
            }
            if takes_other(a.m, a.a, b.m, b.a) {
                t[lane].a = b.a;
            }
            t[lane].m = m_new;
            t[lane].flags = a.flags | b.flags;
            if input.raw {
                let (wa, wb) = (w[lane], w[o]);
                let wm_new = wa.m.max(wb.m);
                w[lane].s = rescale(wa.m, wa.s, wm_new, 1.0) + rescale(wb.m, wb.s, wm_new, 1.0);
                w[lane].m = wm_new;
            }
            if input.draft_logits.is_some() {
                let (qa, qb) = (q[lane], q[o]);
                let qm_new = qa.m.max(qb.m);
                q[lane].s = rescale(qa.m, qa.s, qm_new, inv_t) + rescale(qb.m, qb.s, qm_new, inv_t);
                q[lane].m = qm_new;
            }
        }
        stride /= 2;
    }
    let mut out = RowStats {
        t_max: t[0].m,
        t_sum: t[0].s,
        t_arg: t[0].a,
        flags: t[0].flags,
        t_at_d: 0.0,
        q_max: q[0].m,
        q_sum: q[0].s,
        q_at_d: 0.0,
        raw_max: w[0].m,
        raw_sum: w[0].s,
        t_ent: t[0].e,
        rho: 0.0,
    };
    if input.drafted >= 0 {
        let d = input.drafted as usize;
        if d >= begin && d < begin + CHUNK {
            out.t_at_d = masked(input.target[d], input.cut);
            if let Some(values) = input.draft_values {
                if d < values.len() {
                    out.q_at_d = if input.draft_is_logits {
                        masked(values[d], input.dcut)
                    } else {
                        values[d]
                    };
                }
            }
        }
    }
    out
}

/// Chunks per run of a row's fold for a row of `chunks` chunks: at least 8, and at most 8 runs
/// (the statistics contract; `run_len` in verify.wgsl).
fn run_len(chunks: usize) -> usize {
    8.max(chunks.div_ceil(8))
}

/// Folds `o` into `acc`, `acc` holding the chunks before `o` (verify.wgsl `fold`).
fn fold(acc: &mut RowStats, o: &RowStats, with_sum: bool, inv_t: f32) {
    let m_new = acc.t_max.max(o.t_max);
    if with_sum {
        acc.t_ent = rescale_ent(acc.t_max, acc.t_sum, acc.t_ent, m_new, inv_t)
            + rescale_ent(o.t_max, o.t_sum, o.t_ent, m_new, inv_t);
        acc.t_sum =
            rescale(acc.t_max, acc.t_sum, m_new, inv_t) + rescale(o.t_max, o.t_sum, m_new, inv_t);
    }
    if takes_other(acc.t_max, acc.t_arg, o.t_max, o.t_arg) {
        acc.t_arg = o.t_arg;
    }
    acc.t_max = m_new;
    let qm_new = acc.q_max.max(o.q_max);
    acc.q_sum =
        rescale(acc.q_max, acc.q_sum, qm_new, inv_t) + rescale(o.q_max, o.q_sum, qm_new, inv_t);
    acc.q_max = qm_new;
    let wm_new = acc.raw_max.max(o.raw_max);
    acc.raw_sum =
        rescale(acc.raw_max, acc.raw_sum, wm_new, 1.0) + rescale(o.raw_max, o.raw_sum, wm_new, 1.0);
    acc.raw_max = wm_new;
    acc.flags |= o.flags;
}

/// Folds a row's chunk statistics as the verify kernel does: runs of `run_len` consecutive
/// chunks, each folded in chunk order, then the runs' results in run order. (The two levels let
/// the GPU fold the runs on parallel lanes: a chain of at most run_len + 7 dependent folds
/// instead of one per chunk.)
pub fn merge(chunks: &[RowStats], input: &RowInput<'_>) -> RowStats {
    let with_sum = !input.greedy;
    let inv_t = input.inv_t;
    let run_of = |run: &[RowStats]| {
        let mut acc = run[0];
        for o in &run[1..] {
            fold(&mut acc, o, with_sum, inv_t);
        }
        acc
    };
    let mut runs = chunks.chunks(run_len(chunks.len())).map(run_of);
    let mut acc = runs.next().expect("a row has at least one chunk");
    for o in runs {
        fold(&mut acc, &o, with_sum, inv_t);
    }
    if acc.t_arg == NO_INDEX {
        acc.t_arg = 0;
    }
    if input.drafted >= 0 {
        let holder = chunks[input.drafted as usize / CHUNK];
        acc.t_at_d = holder.t_at_d;
        acc.q_at_d = holder.q_at_d;
    }
    acc
}

/// Statistics of a whole row: every chunk, then the merge.
pub fn row(input: &RowInput<'_>) -> RowStats {
    let chunks: Vec<RowStats> = (0..input.target.len().div_ceil(CHUNK))
        .map(|c| chunk(input, c))
        .collect();
    merge(&chunks, input)
}

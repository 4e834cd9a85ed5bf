//! CPU twin of `shaders/block_mass.wgsl`: the block rule's residual mass
//! `R = Σ_y max(ρ p(y) − q(y), 0)` of one row, summed in the kernel's order (per chunk: lane
//! `l` takes the groups `4(l + 64 i) + (0..3)`, each group as `(t0 + t1) + (t2 + t3)`, the lanes
//! fold as a tree; the chunks fold in chunk order, as verify's `block_settle` folds them).

use crate::batch::Plan;
use crate::cpu::verify::sanitize_prob;
use crate::layout::*;

/// `R` of target row `target` (statistics `st`, with `st.rho` already stored) against its
/// draft row `draft` (probabilities or logits per `plan.draft_kind`), under the row's cut-offs.
pub(crate) fn row_mass(
    plan: &Plan,
    info: &ReqInfo,
    st: &RowStats,
    target: &[f32],
    draft: &[f32],
    (cut, dcut): (f32, f32),
) -> f32 {
    let v = plan.vocab as usize;
    let dv = plan.draft_vocab as usize;
    let inv_t = info.inv_temperature;
    // One division per row, as the kernel (and the residual pass) does.
    let (inv_sum, inv_qsum) = (1.0 / st.t_sum, 1.0 / st.q_sum);
    // (NaN never counts; with x not NaN, `x >= c` is "not below the cut-off".)
    let usable = |x: f32, c: f32| !x.is_nan() && x >= c && x != f32::NEG_INFINITY;
    let term = |y: usize| -> f32 {
        if y >= v {
            return 0.0;
        }
        let l = target[y];
        let p = if usable(l, cut) {
            ((l - st.t_max) * inv_t).exp() * inv_sum
        } else {
            0.0
        };
        let q = if y >= dv {
            0.0
        } else if plan.draft_kind == DRAFT_LOGITS {
            let x = draft[y];
            if usable(x, dcut) {
                ((x - st.q_max) * inv_t).exp() * inv_qsum
            } else {
                0.0
            }
        } else {
            sanitize_prob(draft[y])
        };
        (st.rho * p - q).max(0.0)
    };
    let mut total = 0.0f32;
    for c in 0..v.div_ceil(CHUNK) {
        let mut lanes = [0.0f32; CHUNK_LANES];
        for (l, s) in lanes.iter_mut().enumerate() {
            for i in 0..CHUNK / 4 / CHUNK_LANES {
                let y = c * CHUNK + 4 * (l + CHUNK_LANES * i);
                if y >= v {
                    break;
                }
                *s += (term(y) + term(y + 1)) + (term(y + 2) + term(y + 3));
            }
        }
        let mut stride = CHUNK_LANES / 2;
        while stride > 0 {
            for l in 0..stride {
                lanes[l] += lanes[l + stride];
            }
            stride /= 2;
        }
        total = if c == 0 { lanes[0] } else { total + lanes[0] };
    }
    total
}

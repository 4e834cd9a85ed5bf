//! Step 5: row windows. Splits a batch's rows into windows whose logits fit one storage binding
//! (`max_storage_buffer_binding_size`) and one dispatch dimension, and computes each window's
//! aligned binding range. Reads the plan's row table; writes nothing.

use super::GpuRows;
use crate::batch::Plan;
use crate::layout::*;

/// `Params::flags` bits of a target (shift 0) or draft (shift 2) element type.
pub(super) fn dtype_bits(dtype: crate::Dtype, shift: u32) -> u32 {
    match dtype {
        crate::Dtype::F32 => 0,
        crate::Dtype::F16 => PARAM_T_F16 << shift,
        crate::Dtype::Bf16 => PARAM_T_BF16 << shift,
    }
}

/// A range of target rows whose logits fit one storage binding, with the draft rows and the
/// requests that go with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub row_begin: usize,
    pub row_end: usize,
    pub d_row_begin: usize,
    pub d_row_end: usize,
    pub req_begin: usize,
    pub req_end: usize,
}

/// Splits the rows into windows of at most `max_rows` rows.
pub(crate) fn plan_windows(plan: &Plan, max_rows: usize) -> Vec<Window> {
    let mut windows = Vec::new();
    let mut begin = 0;
    while begin < plan.total_rows {
        let end = (begin + max_rows).min(plan.total_rows);
        let (mut d_begin, mut d_end) = (usize::MAX, 0);
        for info in &plan.row_info[begin..end] {
            if info[3] != NO_INDEX {
                d_begin = d_begin.min(info[3] as usize);
                d_end = d_end.max(info[3] as usize + 1);
            }
        }
        if d_end == 0 {
            d_begin = 0;
        }
        windows.push(Window {
            row_begin: begin,
            row_end: end,
            d_row_begin: d_begin,
            d_row_end: d_end,
            req_begin: plan.row_info[begin][0] as usize,
            req_end: plan.row_info[end - 1][0] as usize + 1,
        });
        begin = end;
    }
    windows
}

/// The binding range (offset, size) of rows `[begin, end)` of `rows` and the element index of
/// row `begin` inside it: the offset is rounded down to the storage offset alignment.
pub(super) fn window_range(
    rows: GpuRows<'_>,
    begin: usize,
    end: usize,
    row_bytes: u64,
    align: u64,
) -> ((u64, u64), u32) {
    let start = rows.offset + begin as u64 * row_bytes;
    let stop = rows.offset + end as u64 * row_bytes;
    let aligned = start - start % align;
    // Bindings cover whole 4-byte words (an odd count of half values ends mid-word).
    let size = (stop - aligned)
        .next_multiple_of(4)
        .min(rows.buffer.size() - aligned);
    (
        (aligned, size),
        ((start - aligned) / rows.dtype.size()) as u32,
    )
}

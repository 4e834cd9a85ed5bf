//! Step 5: row windows. Splits a batch's rows into windows whose logits fit one storage binding
//! (`max_storage_buffer_binding_size`) and one dispatch dimension, and computes each window's
//! aligned binding ranges over the caller's rows and its Params. Reads the plan's row table;
//! writes nothing (upload writes the Params, the passes bind the ranges).

use super::bindings::{entry, ranged};
use super::GpuRows;
use crate::batch::Plan;
use crate::layout::*;

/// `Params::flags` bits of a target (shift 0) or draft (shift 2) element type.
fn dtype_bits(dtype: crate::Dtype, shift: u32) -> u32 {
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
fn window_range(
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

/// The caller's rows one window binds: its target range and, when the window has draft rows,
/// its draft range, each as (buffer, (byte offset, byte size)).
pub(super) struct WindowRows<'a> {
    target: (&'a wgpu::Buffer, (u64, u64)),
    draft: Option<(&'a wgpu::Buffer, (u64, u64))>,
}

impl<'a> WindowRows<'a> {
    /// The target rows at binding 1.
    pub fn target(&self) -> wgpu::BindGroupEntry<'a> {
        let (buf, (off, size)) = self.target;
        ranged(1, buf, off, size)
    }

    /// The draft rows at binding 2 (`dummy` when the window has none).
    pub fn draft<'b>(&self, dummy: &'b wgpu::Buffer) -> wgpu::BindGroupEntry<'b>
    where
        'a: 'b,
    {
        match self.draft {
            Some((buf, (off, size))) => ranged(2, buf, off, size),
            None => entry(2, dummy),
        }
    }

    /// The vec4 view of the target rows at binding 6. The vec4 views need at least one whole
    /// vec4; smaller windows never take the vec4 path (PARAM_VEC4 is off for them) and bind the
    /// dummy instead.
    pub fn target_vec4<'b>(&self, dummy: &'b wgpu::Buffer) -> wgpu::BindGroupEntry<'b>
    where
        'a: 'b,
    {
        let (buf, (off, size)) = self.target;
        if size >= 16 {
            ranged(6, buf, off, size)
        } else {
            entry(6, dummy)
        }
    }

    /// The vec4 view of the draft rows at binding 7 (`dummy` when none or under one vec4).
    pub fn draft_vec4<'b>(&self, dummy: &'b wgpu::Buffer) -> wgpu::BindGroupEntry<'b>
    where
        'a: 'b,
    {
        match self.draft {
            Some((buf, (off, size))) if size >= 16 => ranged(7, buf, off, size),
            _ => entry(7, dummy),
        }
    }
}

/// The rows window `w` binds and its Params (`base` with the window's rows, element bases and
/// flags). `align` is the storage offset alignment; `filters`: some request sets a filter.
pub(super) fn bind_window<'a>(
    w: &Window,
    plan: &Plan,
    target: GpuRows<'a>,
    draft: Option<GpuRows<'a>>,
    align: u64,
    filters: bool,
    base: &Params,
) -> (WindowRows<'a>, Params) {
    let t_size = target.dtype.size();
    let d_size = draft.map_or(4, |d| d.dtype.size());
    let row_bytes = u64::from(plan.vocab) * t_size;
    let dv = u64::from(plan.draft_vocab);
    let (t_range, t_base) = window_range(target, w.row_begin, w.row_end, row_bytes, align);
    let (d_range, d_base) = match draft {
        Some(d) if w.d_row_end > w.d_row_begin => {
            let (r, b) = window_range(d, w.d_row_begin, w.d_row_end, dv * d_size, align);
            (Some((d.buffer, r)), b)
        }
        _ => (None, 0),
    };
    // 16-byte loads when every row of the window starts on a 16-byte boundary: the row length
    // and the first row's element are multiples of a vec4's elements (4 f32 or 8 halves). Which
    // kernels use them for which types: row_stats.wgsl.
    let per_vec4 = |size: u64| (16 / size) as u32;
    let vec4 = plan.vocab.is_multiple_of(per_vec4(t_size))
        && t_range.1 >= 16
        && t_base.is_multiple_of(per_vec4(t_size))
        && d_range.is_none_or(|(_, (_, size))| {
            plan.draft_vocab.is_multiple_of(per_vec4(d_size))
                && d_base.is_multiple_of(per_vec4(d_size))
                && size >= 16
        });
    let p = Params {
        flags: if vec4 { PARAM_VEC4 } else { 0 }
            | base.flags & PARAM_TREE
            | if filters { PARAM_CUTOFF } else { 0 }
            | dtype_bits(target.dtype, 0)
            | plan.logprob_flags()
            | draft.map_or(0, |d| dtype_bits(d.dtype, 2)),
        row_begin: w.row_begin as u32,
        row_count: (w.row_end - w.row_begin) as u32,
        t_elem_base: t_base,
        d_row_begin: w.d_row_begin as u32,
        d_elem_base: d_base,
        req_begin: w.req_begin as u32,
        req_count: (w.req_end - w.req_begin) as u32,
        ..*base
    };
    let rows = WindowRows {
        target: (target.buffer, t_range),
        draft: d_range,
    };
    (rows, p)
}

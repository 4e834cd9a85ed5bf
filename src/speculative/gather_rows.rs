//! `gather_rows` on the GPU: records into the caller's command encoder a copy of rows by an
//! index list, over the caller's buffers. Kernel: `shaders/gather_rows.wgsl`; CPU twin:
//! `src/cpu/gather_rows.rs` ([`gather_rows_cpu`]); every wgpu object is labelled
//! `specdec.gather_rows`.

use super::SpecError;
use crate::gpu::{self, layout_entry, ranged, storage};
use crate::GpuRows;
use wgpu::util::DeviceExt;

const LABEL: &str = "specdec.gather_rows";
/// Column blocks per destination row: enough workgroups to stream a 150k-entry row, few enough
/// that small rows do not dispatch idle ones (the loop inside is grid-stride).
const MAX_COLUMN_BLOCKS: u32 = 64;

/// Host twin of the kernel (`src/cpu/gather_rows.rs`): `dst` row `i` ← `src` row `indices[i]`,
/// `row_len` values each, bit for bit.
///
/// # Panics
/// If `dst.len() != indices.len() × row_len` or an index points past the end of `src`.
pub fn gather_rows_cpu(src: &[f32], dst: &mut [f32], indices: &[u32], row_len: usize) {
    crate::cpu::gather_rows::gather_rows(src, dst, indices, row_len);
}

/// The uniform block of one chunk (the WGSL `GatherParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct GatherParams {
    row_len: u32,
    num_rows: u32,
    src_base: u32,
    dst_base: u32,
    src_row_begin: u32,
    index_base: u32,
    _pad: [u32; 2],
}

/// A chunk of destination rows whose source and destination ranges each fit one binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    dst_begin: usize,
    dst_end: usize,
    src_min: usize,
    src_max: usize,
}

/// Splits the destination rows into chunks of consecutive rows whose destination range and
/// source span (`max − min + 1` rows) each hold at most `max_rows` rows.
fn chunks(indices: &[u32], max_rows: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut begin = 0;
    while begin < indices.len() {
        let (mut lo, mut hi) = (indices[begin] as usize, indices[begin] as usize);
        let mut end = begin + 1;
        while end < indices.len() && end - begin < max_rows {
            let s = indices[end] as usize;
            let (nlo, nhi) = (lo.min(s), hi.max(s));
            if nhi - nlo + 1 > max_rows {
                break;
            }
            (lo, hi) = (nlo, nhi);
            end += 1;
        }
        out.push(Chunk {
            dst_begin: begin,
            dst_end: end,
            src_min: lo,
            src_max: hi,
        });
        begin = end;
    }
    out
}

/// The `gather_rows` pipeline of one device. Build it once ([`GatherRows::new`]) and record as
/// often as needed.
#[derive(Debug)]
pub struct GatherRows {
    device: wgpu::Device,
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    wg: u32,
    max_binding: u64,
}

/// `crate::gpu::scoped`, with its `Error::Gpu` reported as [`SpecError::Gpu`] (the `From`
/// conversion would make it [`SpecError::Verify`], which is for the verifier's own failures).
fn scoped<T>(device: &wgpu::Device, f: impl FnOnce() -> T) -> Result<T, SpecError> {
    gpu::scoped(device, f).map_err(|e| match e {
        crate::Error::Gpu { detail } => SpecError::Gpu(detail),
        other => SpecError::Verify(other),
    })
}

impl GatherRows {
    /// Builds the pipeline on `device` (for instance [`crate::Verifier::device`]'s), with a
    /// workgroup size of 256 lowered to the device's limits.
    pub fn new(device: &wgpu::Device) -> Result<GatherRows, SpecError> {
        let limits = device.limits();
        // The verifier's choice for its default of 256. `.max(1)` keeps what gather_rows chose
        // before the clamp was shared on a device whose limits allow no compute (1, not 0).
        let wg = gpu::workgroup_size(&limits, 256).max(1);
        let (pipeline, layout) = scoped(device, || {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(LABEL),
                source: wgpu::ShaderSource::Wgsl(crate::shaders::gather_rows_source().into()),
            });
            // One params slot per chunk, bound at its own offset (no dynamic offset).
            let uniform = wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            };
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(LABEL),
                entries: &[
                    layout_entry(0, uniform),
                    layout_entry(1, storage(true)),
                    layout_entry(2, storage(false)),
                    layout_entry(3, storage(true)),
                ],
            });
            let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(LABEL),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let constants = [("WG", f64::from(wg))];
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(LABEL),
                layout: Some(&pl),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
            (pipeline, layout)
        })?;
        Ok(GatherRows {
            device: device.clone(),
            pipeline,
            layout,
            wg,
            max_binding: limits.max_storage_buffer_binding_size,
        })
    }

    /// Caps the bytes one binding may cover below the device's
    /// `max_storage_buffer_binding_size` (more, smaller chunks; same result). For tests of the
    /// chunking.
    pub fn with_max_binding_bytes(mut self, bytes: u64) -> Self {
        self.max_binding = bytes.min(self.device.limits().max_storage_buffer_binding_size);
        self
    }

    /// The workgroup size the pipeline was built with.
    pub fn workgroup_size(&self) -> u32 {
        self.wg
    }

    /// Records into `encoder`: destination row `i` (at `dst`) ← source row `indices[i]` (of the
    /// `src_rows` rows at `src`), `row_len` f32 each. Offsets are byte offsets, multiples of 4;
    /// both buffers need `STORAGE` usage and must be different buffers. Everything is checked on
    /// the host before anything is recorded. Rows are split into chunks so that every binding
    /// fits the device's largest storage binding; the index list and the per-chunk parameters
    /// are uploaded in small buffers created for this call (kept alive by the encoder), so
    /// several recordings may share one submission.
    pub fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: GpuRows<'_>,
        src_rows: usize,
        dst: GpuRows<'_>,
        indices: &[u32],
        row_len: usize,
    ) -> Result<(), SpecError> {
        if indices.is_empty() || row_len == 0 {
            return Ok(());
        }
        check_gather(src, src_rows, dst, indices, row_len)?;
        let row_bytes = row_len as u64 * 4;
        let limits = self.device.limits();
        let align = u64::from(limits.min_storage_buffer_offset_alignment);
        if row_bytes + align > self.max_binding {
            return Err(SpecError::Invalid(format!(
                "a row of {row_bytes} bytes does not fit one storage binding of this device \
                 ({} bytes)",
                self.max_binding
            )));
        }
        let max_dim = limits.max_compute_workgroups_per_dimension as usize;
        let max_rows = (((self.max_binding - align) / row_bytes) as usize).min(max_dim);
        let plan = chunks(indices, max_rows);
        let slot = u64::from(limits.min_uniform_buffer_offset_alignment)
            .max(std::mem::size_of::<GatherParams>() as u64);
        let mut params = vec![0u8; slot as usize * plan.len()];
        let mut ranges = Vec::with_capacity(plan.len());
        for (c, ch) in plan.iter().enumerate() {
            let (s_off, s_size, s_base) = window(src, ch.src_min, ch.src_max + 1, row_bytes, align);
            let (d_off, d_size, d_base) = window(dst, ch.dst_begin, ch.dst_end, row_bytes, align);
            let p = GatherParams {
                row_len: row_len as u32,
                num_rows: (ch.dst_end - ch.dst_begin) as u32,
                src_base: s_base,
                dst_base: d_base,
                src_row_begin: ch.src_min as u32,
                index_base: ch.dst_begin as u32,
                _pad: [0; 2],
            };
            let at = c * slot as usize;
            params[at..at + std::mem::size_of::<GatherParams>()]
                .copy_from_slice(bytemuck::bytes_of(&p));
            ranges.push(((s_off, s_size), (d_off, d_size)));
        }
        let blocks = (row_len as u32).div_ceil(self.wg).clamp(
            1,
            MAX_COLUMN_BLOCKS.min(limits.max_compute_workgroups_per_dimension),
        );
        let dev = &self.device;
        scoped(dev, || {
            let params_buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(LABEL),
                contents: &params,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let index_buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(LABEL),
                contents: bytemuck::cast_slice(indices),
                usage: wgpu::BufferUsages::STORAGE,
            });
            let groups: Vec<wgpu::BindGroup> = ranges
                .iter()
                .enumerate()
                .map(|(c, &((s_off, s_size), (d_off, d_size)))| {
                    dev.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(LABEL),
                        layout: &self.layout,
                        entries: &[
                            ranged(
                                0,
                                &params_buf,
                                c as u64 * slot,
                                std::mem::size_of::<GatherParams>() as u64,
                            ),
                            ranged(1, src.buffer, s_off, s_size),
                            ranged(2, dst.buffer, d_off, d_size),
                            gpu::entry(3, &index_buf),
                        ],
                    })
                })
                .collect();
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(LABEL),
                timestamp_writes: None,
            });
            pass.set_pipeline(&self.pipeline);
            for (group, ch) in groups.iter().zip(&plan) {
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(blocks, (ch.dst_end - ch.dst_begin) as u32, 1);
            }
        })
    }
}

/// The host-side checks of [`GatherRows::record`]: both buffers usable as storage, 4-byte
/// offsets, large enough for their rows, distinct, and every index within the source rows.
fn check_gather(
    src: GpuRows<'_>,
    src_rows: usize,
    dst: GpuRows<'_>,
    indices: &[u32],
    row_len: usize,
) -> Result<(), SpecError> {
    let row_bytes = row_len as u64 * 4;
    for (what, rows, b) in [("src", src_rows, src), ("dst", indices.len(), dst)] {
        if !b.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(SpecError::Invalid(format!(
                "gather_rows {what} buffer lacks BufferUsages::STORAGE; create it with that usage"
            )));
        }
        if !b.offset.is_multiple_of(4) {
            return Err(SpecError::Invalid(format!(
                "gather_rows {what} offset {} is not a multiple of 4 bytes",
                b.offset
            )));
        }
        let needed = b.offset + rows as u64 * row_bytes;
        if needed > b.buffer.size() {
            return Err(SpecError::Invalid(format!(
                "gather_rows {what}: {rows} rows of {row_len} f32 at offset {} need {needed} \
                     bytes, the buffer has {}",
                b.offset,
                b.buffer.size()
            )));
        }
    }
    if src.buffer == dst.buffer {
        return Err(SpecError::Invalid(
            "gather_rows reads src and writes dst in one dispatch: they must be different \
                 buffers"
                .into(),
        ));
    }
    if let Some((i, &s)) = indices
        .iter()
        .enumerate()
        .find(|(_, &s)| s as usize >= src_rows)
    {
        return Err(SpecError::Invalid(format!(
            "gather_rows index {i} is {s}, past the {src_rows} source rows"
        )));
    }
    Ok(())
}

/// The binding `(offset, size)` of rows `[begin, end)` of `rows` and the word index of row
/// `begin` inside it: the offset is rounded down to the storage offset alignment.
fn window(
    rows: GpuRows<'_>,
    begin: usize,
    end: usize,
    row_bytes: u64,
    align: u64,
) -> (u64, u64, u32) {
    let start = rows.offset + begin as u64 * row_bytes;
    let stop = rows.offset + end as u64 * row_bytes;
    let aligned = start - start % align;
    (aligned, stop - aligned, ((start - aligned) / 4) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_within_limits() {
        let idx = [5u32, 0, 9, 1, 2, 3, 8, 8, 7];
        for max_rows in 1..=10 {
            let plan = chunks(&idx, max_rows);
            let mut next = 0;
            for ch in &plan {
                assert_eq!(ch.dst_begin, next);
                assert!(ch.dst_end - ch.dst_begin <= max_rows);
                assert!(ch.src_max - ch.src_min < max_rows);
                for &s in &idx[ch.dst_begin..ch.dst_end] {
                    assert!((ch.src_min..=ch.src_max).contains(&(s as usize)));
                }
                next = ch.dst_end;
            }
            assert_eq!(next, idx.len());
        }
        assert_eq!(chunks(&idx, 10).len(), 1);
    }
}

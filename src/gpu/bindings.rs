//! Small binding functions shared by every pass (and by `speculative::gather_rows`): layout
//! entries, bind group entries over whole or ranged buffers, the Params slot, and the error scope
//! every GPU call runs in.

use super::workspace::Workspace;
use crate::error::Error;
use crate::layout::Params;

/// Bytes of one Params slot; a multiple of every adapter's uniform offset alignment (≤ 256).
pub(super) const PARAM_SLOT: u64 = 256;
/// Bytes of `Params`.
pub(super) const PARAMS_BYTES: usize = std::mem::size_of::<Params>();

/// A compute-stage bind group layout entry of `ty` at `binding`.
///
/// `pub(crate)` so that `speculative::gather_rows`, which builds its own pipeline outside
/// [`GpuBackend`], lays out its bindings with the same functions instead of a copy.
pub(crate) fn layout_entry(binding: u32, ty: wgpu::BindingType) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty,
        count: None,
    }
}

/// A storage buffer binding type (no dynamic offset, no minimum size).
///
/// `pub(crate)` for `speculative::gather_rows` (see [`layout_entry`]).
pub(crate) fn storage(read_only: bool) -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Storage { read_only },
        has_dynamic_offset: false,
        min_binding_size: None,
    }
}

pub(super) fn params_uniform() -> wgpu::BindingType {
    wgpu::BindingType::Buffer {
        ty: wgpu::BufferBindingType::Uniform,
        has_dynamic_offset: true,
        min_binding_size: std::num::NonZeroU64::new(std::mem::size_of::<Params>() as u64),
    }
}

/// A bind group entry over the whole of `buffer`.
///
/// `pub(crate)` for `speculative::gather_rows` (see [`layout_entry`]).
pub(crate) fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

/// A bind group entry over `size` bytes of `buffer` from byte `offset`.
///
/// `pub(crate)` for `speculative::gather_rows`, which binds chunks of the caller's buffers the same way
/// (see [`layout_entry`]).
pub(crate) fn ranged(
    binding: u32,
    buffer: &wgpu::Buffer,
    offset: u64,
    size: u64,
) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset,
            size: std::num::NonZeroU64::new(size),
        }),
    }
}

/// A bind group entry over the range `b` describes.
pub(super) fn bound(binding: u32, b: wgpu::BufferBinding<'_>) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(b),
    }
}

/// Runs `f` inside validation and out-of-memory error scopes and turns a captured error into
/// `Error::Gpu` (wgpu's default handler would panic the host app).
///
/// `pub(crate)` so that `speculative::gather_rows` wraps its object creation and recording in the same
/// scopes instead of a copy; it maps the `Error::Gpu` it gets to its own `SpecError::Gpu`.
pub(crate) fn scoped<T>(device: &wgpu::Device, f: impl FnOnce() -> T) -> Result<T, Error> {
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    let v = pollster::block_on(validation.pop());
    let o = pollster::block_on(oom.pop());
    match v.or(o) {
        Some(e) => Err(Error::Gpu {
            detail: e.to_string(),
        }),
        None => Ok(value),
    }
}

/// The binding of the Params slot in every verification kernel's layout (absent where the
/// variant takes the Params as immediate data).
pub(super) const PARAMS_BINDING: u32 = 0;

/// The layout of a verification kernel: the Params slot (dynamic offset) at 0 and storage
/// buffers at 1..=`last`; `writable` lists the read-write ones. `build_pipelines` drops the
/// slot where the variant takes the Params as immediate data.
pub(super) fn with_params(last: u32, writable: &[u32]) -> Vec<wgpu::BindGroupLayoutEntry> {
    let mut v = vec![layout_entry(PARAMS_BINDING, params_uniform())];
    v.extend((1..=last).map(|b| layout_entry(b, storage(!writable.contains(&b)))));
    v
}

/// The Params binding of every verification bind group: one slot of the workspace's Params
/// slots, chosen per dispatch by its dynamic offset (`GpuBackend::bind_group` leaves it out
/// where the variant takes the Params as immediate data).
pub(super) fn params_entry(ws: &Workspace) -> wgpu::BindGroupEntry<'_> {
    ws.meta_entry(PARAMS_BINDING, (ws.meta_at.params.0, PARAMS_BYTES as u64))
}

/// The Params of a call's slots (one per window, then one per cutoff group), as
/// `GpuBackend::write_metadata` wrote them, and how a dispatch gets its slot.
pub(super) struct ParamSlots {
    /// Each slot's Params where `immediates` (empty otherwise: the dispatches bind the slots
    /// by offset).
    pub params: Vec<Params>,
    /// Bytes between two slots of the uniform buffer.
    pub slot_size: u64,
    /// The variant takes the Params as immediate data, not through binding 0.
    pub immediates: bool,
}

impl ParamSlots {
    /// Binds `group` and slot `slot`'s Params for the next dispatch: as immediate data, or as
    /// the dynamic offset of binding 0. Call it after every `set_pipeline`: wgpu clears the
    /// immediate data whenever the pipeline layout changes (another kernel's pipeline), and its
    /// OpenGL backend, which emulates immediate data with each program's uniforms, loses them
    /// at any pipeline change (a cutoff group's scans read zeroed Params there when bound once
    /// for the group).
    pub fn bind(&self, pass: &mut wgpu::ComputePass<'_>, group: &wgpu::BindGroup, slot: usize) {
        if self.immediates {
            pass.set_bind_group(0, group, &[]);
            pass.set_immediates(0, bytemuck::bytes_of(&self.params[slot]));
        } else {
            pass.set_bind_group(0, group, &[(slot as u64 * self.slot_size) as u32]);
        }
    }
}

//! Step 1 of the GPU pipeline: find an adapter, rank it, and negotiate the limits the kernels
//! need (storage buffers per stage, binding and dispatch sizes, the workgroup size). Reads the
//! `WGPU_BACKEND` / `WGPU_ADAPTER_NAME` environment; writes nothing.

use crate::error::Error;

/// Storage buffers every kernel but row_stats_verify fits in one stage (row_stats and
/// residual_argmax bind 8).
pub(super) const STORAGE_BUFFERS_NEEDED: u32 = 8;
/// Storage buffers row_stats_verify binds (row_stats' eight and verify's six besides the
/// requests); devices with fewer take verify's own dispatch.
pub(super) const STORAGE_BUFFERS_FUSED: u32 = 14;

/// Every adapter of the backends `WGPU_BACKEND` allows (all by default), filtered by
/// `WGPU_ADAPTER_NAME` (case-insensitive substring) when it is set.
pub(crate) fn enumerate() -> Vec<wgpu::Adapter> {
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    let wanted = std::env::var("WGPU_ADAPTER_NAME")
        .ok()
        .map(|s| s.to_lowercase());
    pollster::block_on(instance.enumerate_adapters(backends))
        .into_iter()
        .filter(|a| match &wanted {
            Some(w) => a.get_info().name.to_lowercase().contains(w.as_str()),
            None => true,
        })
        .collect()
}

/// Indices of `adapters`, best first: discrete, integrated, virtual, other, CPU (software); native
/// APIs before OpenGL.
pub(crate) fn rank_adapters(adapters: &[wgpu::Adapter]) -> Vec<usize> {
    let rank = |a: &wgpu::Adapter| {
        let i = a.get_info();
        let ty = match i.device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        };
        (ty, u8::from(i.backend == wgpu::Backend::Gl))
    };
    let mut idx: Vec<usize> = (0..adapters.len()).collect();
    idx.sort_by_key(|&i| rank(&adapters[i]));
    idx
}

/// Finds the adapter `Verifier::new` uses: `WGPU_BACKEND` limits the backends,
/// `WGPU_ADAPTER_NAME` (case-insensitive substring) picks one by name; otherwise the best by type
/// (discrete, integrated, virtual, other, CPU/software), native APIs before OpenGL.
pub fn select_adapter() -> Result<wgpu::Adapter, Error> {
    let mut adapters = enumerate();
    match rank_adapters(&adapters).first() {
        Some(&i) => Ok(adapters.swap_remove(i)),
        None => Err(Error::NoAdapter {
            detail: format!(
                "backends {:?}{}: none found",
                wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all()),
                std::env::var("WGPU_ADAPTER_NAME")
                    .map(|w| format!(", WGPU_ADAPTER_NAME={w:?}"))
                    .unwrap_or_default()
            ),
        }),
    }
}

/// The limits we ask of an adapter: WebGPU's downlevel defaults, raised to what the adapter
/// offers for the sizes that decide how much one binding / dispatch can hold.
pub fn required_limits(adapter: &wgpu::Limits) -> Result<wgpu::Limits, Error> {
    if adapter.max_storage_buffers_per_shader_stage < STORAGE_BUFFERS_NEEDED {
        return Err(Error::RequestDevice {
            detail: format!(
                "the kernels bind {STORAGE_BUFFERS_NEEDED} storage buffers per stage, the adapter \
                 allows {}",
                adapter.max_storage_buffers_per_shader_stage
            ),
        });
    }
    let mut l = wgpu::Limits::downlevel_defaults();
    // As many as row_stats_verify binds where the adapter has them.
    l.max_storage_buffers_per_shader_stage = adapter
        .max_storage_buffers_per_shader_stage
        .min(STORAGE_BUFFERS_FUSED);
    l.max_storage_buffer_binding_size = adapter.max_storage_buffer_binding_size;
    l.max_buffer_size = adapter.max_buffer_size;
    l.max_compute_workgroups_per_dimension = adapter.max_compute_workgroups_per_dimension;
    l.max_compute_invocations_per_workgroup = adapter.max_compute_invocations_per_workgroup;
    l.max_compute_workgroup_size_x = adapter.max_compute_workgroup_size_x;
    // Room for the Params as immediate data (`Variant::immediates`) where the adapter has any;
    // 256 bytes is more than the Params take and within what every backend offers.
    l.max_immediate_size = adapter.max_immediate_size.min(256);
    Ok(l)
}

/// The optional features a verifier's device is asked for: `SHADER_INT64`, `SUBGROUP` and
/// `IMMEDIATES` where the options want them (`VerifierOptions::shader_int64` / `subgroups` /
/// `immediates`) and the adapter has them. Shared by `Verifier::new` and the benchmark's device,
/// so both run the same variant.
pub(crate) fn optional_features(
    adapter: &wgpu::Adapter,
    opts: &crate::VerifierOptions,
) -> wgpu::Features {
    let mut wanted = wgpu::Features::empty();
    if opts.shader_int64 {
        wanted |= wgpu::Features::SHADER_INT64;
    }
    if opts.subgroups {
        wanted |= wgpu::Features::SUBGROUP;
    }
    if opts.immediates {
        wanted |= wgpu::Features::IMMEDIATES;
    }
    adapter.features() & wanted
}

/// The `WG` override to build with: `requested`, at most 256 and the device's workgroup limits
/// (`max_compute_invocations_per_workgroup`, `max_compute_workgroup_size_x`), rounded to a power
/// of two (up, then halved if that passes the limit). 0 only on a device whose limits allow no
/// compute at all.
///
/// `pub(crate)` so that `speculative::gather_rows` picks its workgroup size the same way as the
/// verifier's kernels instead of a copy of this clamp.
pub(crate) fn workgroup_size(limits: &wgpu::Limits, requested: u32) -> u32 {
    let max_wg = limits
        .max_compute_invocations_per_workgroup
        .min(limits.max_compute_workgroup_size_x)
        .min(256);
    let wg = requested.min(max_wg).max(1).next_power_of_two();
    if wg > max_wg {
        wg / 2
    } else {
        wg
    }
}

#[cfg(test)]
mod tests {
    use super::workgroup_size;

    /// The shared clamp gives what `speculative::gather_rows` computed on its own before it used it (the
    /// largest power of two within `min(limits, 256)`, at least 1 there), and never passes the
    /// limits for any request.
    #[test]
    fn workgroup_size_is_a_power_of_two_within_the_limits() {
        for limit in 0..=1100u32 {
            for (inv, x) in [(limit, 1024), (1024, limit), (limit, limit)] {
                let limits = wgpu::Limits {
                    max_compute_invocations_per_workgroup: inv,
                    max_compute_workgroup_size_x: x,
                    ..wgpu::Limits::default()
                };
                let max_wg = limit.clamp(1, 256);
                let gather_before = 1u32 << (31 - max_wg.leading_zeros());
                assert_eq!(
                    workgroup_size(&limits, 256).max(1),
                    gather_before,
                    "{limit}"
                );
                for requested in [0, 1, 3, 32, 48, 64, 100, 256, 300, 1024] {
                    let wg = workgroup_size(&limits, requested);
                    if limit == 0 {
                        assert_eq!(wg, 0);
                        continue;
                    }
                    assert!(
                        wg.is_power_of_two() && wg <= limit.min(256),
                        "{limit} {requested}"
                    );
                }
            }
        }
    }
}

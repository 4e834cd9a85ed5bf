//! Checks run once per device, when its kernels are built, whose answers choose a shader
//! variant: each is a tiny compute kernel whose output the host compares with what the variant
//! needs. [`run`] dispatches one and reads its words; a probe that fails to run counts as "no",
//! and the caller keeps the portable code (the same results).
//!
//! - [`super::subgroups`]: whether subgroups follow the local index (the subgroup folds).
//! - [`f16_unpack_is_exact`]: whether `unpack2x16float` widens every binary16 value as the
//!   kernels' integer widening does (`F16_UNPACK`).

use super::readback::read_words;
use super::scoped;

/// Runs the compute shader `source` (entry `main`, one read-write storage buffer at binding 0
/// of `words` 32-bit words) over `workgroups` workgroups and returns the buffer's words, or
/// `None` if anything failed.
pub(super) fn run(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    label: &str,
    source: &str,
    workgroups: u32,
    words: usize,
) -> Option<Vec<u32>> {
    let bytes = (words * 4) as u64;
    let built = scoped(device, || {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let out = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: out.as_entire_binding(),
            }],
        });
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
        enc.copy_buffer_to_buffer(&out, 0, &staging, 0, bytes);
        (queue.submit([enc.finish()]), staging)
    });
    let (submission, staging) = built.ok()?;
    read_words(
        device,
        &staging,
        submission,
        std::time::Duration::from_secs(10),
    )
    .ok()
}

/// The f16 probe's shader source.
const F16_WIDEN: &str = include_str!("../../shaders/f16_widen.wgsl");
/// binary16 values: all of them.
const HALVES: usize = 1 << 16;

/// Whether the device's widening of every binary16 value (`seen[h]`, the f32 bits of `h`) is
/// the kernels' integer widening, [`crate::batch::f16_to_f32`]: the same bits, except that a
/// NaN may come back as any NaN (the kernels test NaN by its bits before using a value, so its
/// payload never reaches a result). A device that flushes subnormals, or returns a wrong value
/// anywhere, fails.
pub(crate) fn widening_is_exact(seen: &[u32]) -> bool {
    seen.len() == HALVES
        && seen.iter().enumerate().all(|(h, &bits)| {
            let want = crate::batch::f16_to_f32(h as u16);
            let got = f32::from_bits(bits);
            bits == want.to_bits() || (want.is_nan() && got.is_nan())
        })
}

/// Runs the f16 probe (`shaders/f16_widen.wgsl`, two values per invocation) on `device` and
/// checks its answer with [`widening_is_exact`].
pub(super) fn f16_unpack_is_exact(device: &wgpu::Device, queue: &wgpu::Queue) -> bool {
    let workgroups = (HALVES / 2 / 64) as u32;
    run(
        device,
        queue,
        "specdec.f16_widen",
        F16_WIDEN,
        workgroups,
        HALVES,
    )
    .is_some_and(|seen| widening_is_exact(&seen))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn exact() -> Vec<u32> {
        (0..HALVES)
            .map(|h| crate::batch::f16_to_f32(h as u16).to_bits())
            .collect()
    }

    #[test]
    fn the_integer_widening_passes() {
        assert!(widening_is_exact(&exact()));
    }

    #[test]
    fn another_nan_passes_and_anything_else_wrong_fails() {
        let one_ulp_up = exact()[0x3555] + 1;
        // (binary16 value, the device's answer for it, whether the check passes)
        let cases = [
            (0x7c01, 0x7fc0_0000, true),  // a signalling NaN returned quieted
            (0x0001, 0, false),           // a flushed subnormal (0x0001 is 2^-24)
            (0x8000, 0, false),           // -0 widened to +0
            (0xfe00, 0xff80_0000, false), // a NaN widened to a number
            (0x3c00, 0x7fc0_0000, false), // a number widened to a NaN
            (0x3555, one_ulp_up, false),  // one ulp off
        ];
        for (h, bits, passes) in cases {
            let mut seen = exact();
            seen[h] = bits;
            assert_eq!(widening_is_exact(&seen), passes, "{h:#06x} -> {bits:#010x}");
        }
        // A short answer.
        assert!(!widening_is_exact(&exact()[1..]));
    }

    /// A probe's source parses and validates with naga and `caps` (the probes' tests).
    pub(in crate::gpu) fn assert_validates(source: &str, caps: naga::valid::Capabilities) {
        let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{e}"));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn the_probe_validates() {
        assert_validates(
            F16_WIDEN,
            naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32,
        );
    }
}

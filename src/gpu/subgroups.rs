//! Whether the kernels may fold lane states through subgroup shuffles on a device.
//!
//! The folds of `shaders/lanes_subgroup.wgsl` exchange the states of lanes 0 .. SG-1 (SG the
//! adapter's smallest subgroup size) in registers, which is only the statistics contract's tree
//! if those lanes form one subgroup in local-index order. Every driver we know forms compute
//! subgroups from consecutive local indices, but neither Vulkan nor WebGPU promises it, so the
//! device shows it once, with `shaders/subgroup_layout.wgsl`, before the variant is chosen; a
//! device that does not keeps the portable folds (same results, every level through
//! workgroup memory).

/// The probe's shader source.
const PROBE: &str = include_str!("../../shaders/subgroup_layout.wgsl");
/// Levels of the probe (d = 1, 2, .., 32) and lanes per level.
const LEVELS: usize = 6;
const LANES: usize = 64;

/// Whether the probe's shuffles, as the device returned them, are the local-index layout the
/// folds need over the first `lanes` lanes: lane i receives lane i + d wherever i + d < lanes.
pub(crate) fn layout_is_ordered(seen: &[u32], lanes: u32) -> bool {
    let lanes = (lanes as usize).min(LANES);
    seen.len() == LEVELS * LANES
        && (0..LEVELS).all(|level| {
            let d = 1usize << level;
            (0..lanes.saturating_sub(d)).all(|i| seen[level * LANES + i] as usize == i + d)
        })
}

/// Runs the probe on `device` (which must have `SUBGROUP`) and checks its answer for `lanes`.
/// Any failure to run it counts as "no": the caller then keeps the portable folds.
pub(super) fn device_layout_is_ordered(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    lanes: u32,
) -> bool {
    super::probes::run(
        device,
        queue,
        "specdec.subgroup_layout",
        PROBE,
        1,
        LEVELS * LANES,
    )
    .is_some_and(|seen| layout_is_ordered(&seen, lanes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered() -> Vec<u32> {
        (0..LEVELS)
            .flat_map(|level| (0..LANES).map(move |i| (i + (1 << level)) as u32))
            .collect()
    }

    #[test]
    fn the_local_index_layout_passes() {
        assert!(layout_is_ordered(&ordered(), 32));
        assert!(layout_is_ordered(&ordered(), 8));
        assert!(layout_is_ordered(&ordered(), 128));
    }

    #[test]
    fn a_permuted_subgroup_fails() {
        // Lane 0 receives lane 3 at d = 1 (a subgroup not in local-index order).
        let mut seen = ordered();
        seen[0] = 3;
        assert!(!layout_is_ordered(&seen, 32));
        // Beyond the first `lanes` lanes nothing is required.
        let mut seen = ordered();
        seen[3 * LANES + 10] = 0; // d = 8, lane 10: 18 >= 16
        assert!(layout_is_ordered(&seen, 16));
        assert!(!layout_is_ordered(&seen, 32));
        assert!(!layout_is_ordered(&seen[1..], 32));
    }

    #[test]
    fn the_probe_validates() {
        crate::gpu::probes::tests::assert_validates(PROBE, naga::valid::Capabilities::SUBGROUP);
    }
}

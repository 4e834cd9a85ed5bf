// Lane exchange through subgroup operations, for devices with wgpu's SUBGROUP feature (naga
// offers the builtins to such devices without an `enable` directive). Alternative:
// lanes_portable.wgsl.
//
// SG_LANES is the adapter's smallest subgroup size (the host's `subgroup_min_size`, at most
// 128): lanes 0 .. SG_LANES-1 of a workgroup are then one subgroup, with subgroup invocation id
// = local invocation index (the host checks this layout once per device before it picks this
// variant). A fold of lane states whose levels take lane i + s for s < SG_LANES can exchange
// those states in registers instead of through workgroup memory and a barrier per level; the
// levels keep their order and operands, so the results are the same bits.
override SG_LANES: u32 = 1u;

// Lane (own lane + d)'s x; only read by lanes whose lane + d is in their subgroup.
fn lanes_down_f32(x: f32, d: u32) -> f32 {
    return subgroupShuffleDown(x, d);
}

fn lanes_down_u32(x: u32, d: u32) -> u32 {
    return subgroupShuffleDown(x, d);
}

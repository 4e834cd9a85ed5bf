// Lane exchange without subgroup operations (portable WGSL). SG_LANES stays 1, so no fold level
// exchanges lanes in registers and these are never called; every level goes through workgroup
// memory. Alternative: lanes_subgroup.wgsl.
override SG_LANES: u32 = 1u;

fn lanes_down_f32(x: f32, d: u32) -> f32 {
    return x;
}

fn lanes_down_u32(x: u32, d: u32) -> u32 {
    return x;
}

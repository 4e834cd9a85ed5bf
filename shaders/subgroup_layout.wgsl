// subgroup_layout — the host's check, once per device, that the folds of lanes_subgroup.wgsl
// may shuffle: for each power of two d < 64, lane i of a 64-lane workgroup writes the local index
// that subgroupShuffleDown(·, d) brings it. The host (src/gpu/subgroups.rs) requires i + d
// wherever i + d is below the adapter's smallest subgroup size, i.e. that lanes 0 .. SG-1 are
// one subgroup in local-index order. Validated with naga's SUBGROUP capability only.
@group(0) @binding(0) var<storage, read_write> seen: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lane: u32) {
    var level = 0u;
    for (var d = 1u; d < 64u; d = d * 2u) {
        seen[level * 64u + lane] = subgroupShuffleDown(lane, d);
        level += 1u;
    }
}

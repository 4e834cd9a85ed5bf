// The window's Params as a uniform slot at binding 0, chosen per dispatch by a dynamic offset
// (every device). Alternative: params_immediate.wgsl.
@group(0) @binding(0) var<uniform> params: Params;

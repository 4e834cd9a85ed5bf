// The window's Params as immediate data (push constants), set with each dispatch on devices
// with wgpu's IMMEDIATES feature: the values travel with the dispatch, so a kernel does not
// start with a load of its Params from memory. Binding 0 is then unused. Alternative:
// params_uniform.wgsl.
var<immediate> params: Params;

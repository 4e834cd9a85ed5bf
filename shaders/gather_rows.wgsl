// gather_rows — copies rows by an index list: destination row i ← source row indices[i]. The
// scorer uses it to contract batch-expanded target logits into the verifier's row layout
// (src/speculative/scorer.rs, ExpansionLayout::contraction). CPU twin: src/cpu/gather_rows.rs. Rust entry
// point: src/speculative/gather_rows.rs. Every wgpu object (module, layouts, pipeline, buffers, bind
// groups, pass) is labelled specdec.gather_rows.
//
// Written to follow shaders/common.wgsl (it uses the WG override declared there).
//
// One dispatch per chunk of destination rows (chunks keep every binding within
// max_storage_buffer_binding_size): workgroup y = destination row of the chunk, x = a block of
// columns, grid-stride over the row. Rows are copied as u32 words, so every bit pattern (NaN
// payloads, denormals) arrives unchanged, exactly like the twin's copy.
//
//   src binding (offset rounded down to the storage alignment):
//     [ slack: src_base words | row src_row_begin | row src_row_begin + 1 | ... ]
//   dst binding:
//     [ slack: dst_base words | chunk row 0 | chunk row 1 | ... | chunk row num_rows-1 ]

struct GatherParams {
    row_len: u32,       // words per row
    num_rows: u32,      // destination rows in this chunk
    src_base: u32,      // word of source row src_row_begin inside the src binding
    dst_base: u32,      // word of the chunk's first destination row inside the dst binding
    src_row_begin: u32, // first source row the src binding covers
    index_base: u32,    // index (into `gather_indices`) of the chunk's first destination row
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> gather: GatherParams;
@group(0) @binding(1) var<storage, read> gather_src: array<u32>;
@group(0) @binding(2) var<storage, read_write> gather_dst: array<u32>;
@group(0) @binding(3) var<storage, read> gather_indices: array<u32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row = wid.y;
    if (row >= gather.num_rows) {
        return;
    }
    let s = gather_indices[gather.index_base + row] - gather.src_row_begin;
    let src_at = gather.src_base + s * gather.row_len;
    let dst_at = gather.dst_base + row * gather.row_len;
    for (var c = wid.x * WG + lid.x; c < gather.row_len; c += nwg.x * WG) {
        gather_dst[dst_at + c] = gather_src[src_at + c];
    }
}

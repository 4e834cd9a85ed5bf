// row_stats' chunk partials as verify reads them (binding 5): one RowStats per (row, chunk).
@group(0) @binding(5) var<storage, read_write> chunk_stats: array<RowStats>;

// Stores chunk partial i (row-major, num_chunks per row).
fn store_partial(i: u32, st: RowStats) {
    chunk_stats[i] = st;
}

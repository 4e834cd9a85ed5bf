// rng_check — evaluates the shared random-number functions for given counters so the tests can
// compare them bit for bit with the Rust twin (src/rng.rs). Pipeline label: specdec.rng_check.main.
// Not used by verification itself.
//
// Input i: vec4(quad, row position low, stream, row position high) with the key in
// requests[0]. Output i: the four Philox words, uniform_open(word 0) and exp1_from_bits of each
// word, as f32 bit patterns (9 words, padded to 12).

@group(0) @binding(0) var<storage, read> counters: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> requests: array<ReqInfo>;
@group(0) @binding(2) var<storage, read_write> results: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&counters)) {
        return;
    }
    let c = counters[i];
    let words = random_words(requests[0], vec2<u32>(c.y, c.w), c.z, c.x);
    let o = i * 12u;
    for (var j = 0u; j < 4u; j += 1u) {
        results[o + j] = words[j];
        results[o + 5u + j] = bitcast<u32>(exp1_from_bits(words[j]));
    }
    results[o + 4u] = bitcast<u32>(uniform_open(words.x));
    results[o + 9u] = 0u;
    results[o + 10u] = 0u;
    results[o + 11u] = 0u;
}

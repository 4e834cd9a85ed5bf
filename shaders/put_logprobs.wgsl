// put_logprobs — the logprob writer of the kernels that write the output words (verify,
// row_stats_verify, residual_argmax), appended after each. The including module declares
// `params` and `out_words`.

// Writes the logprobs of output slot `slot` when the output has the logprob regions.
fn put_logprobs(slot: u32, lp: vec2<f32>) {
    if ((params.flags & PARAM_LOGPROBS) == 0u) {
        return;
    }
    let w = logprob_words(params.num_requests, params.out_stride, slot);
    out_words[w.x] = bitcast<u32>(lp.x);
    out_words[w.y] = bitcast<u32>(lp.y);
}

//! SmolLM2-135M through `specdec::models` (feature `candle`): tokenizer, all-position logits,
//! cache truncation, deterministic greedy decoding. CI-sized: one 98 MB model, short prompts.
//!
//! Needs the weights: `examples/fetch-models.sh smollm2` (into `$SPECDEC_MODELS`, default
//! `~/.cache/specdec/models`). A missing file fails the test; it is never skipped.

use std::sync::{Arc, OnceLock};

use specdec::models::{
    generate, models_dir, GenerateOptions, LoadOptions, Model, ModelError, PreTokenizer, Weights,
    SMOLLM2_FILE,
};

/// Largest |difference| allowed between a logit computed with the whole prompt in one forward
/// and the same logit computed token by token through the cache (or after a truncation). With
/// `LoadOptions::split_invariant` (the default) every position is computed with the shapes of a
/// one-token step, and the rows measured bit-identical on a 2-core AMD EPYC (AVX2). The bound
/// leaves room for a CPU whose kernels are not deterministic per shape.
const SPLIT_TOLERANCE: f32 = 1e-3;

/// The weights with Q4_1 re-quantized to Q8_0 (`LoadOptions::requantize_to_q8_0`): candle's Q8_0
/// kernel is SIMD and its Q4_1 one scalar, so the CI run is ~3.5× faster. The properties tested
/// (consistency of rows across splits, truncation, determinism) do not depend on the format;
/// [`exact_weights`] covers the file as stored.
fn weights() -> Arc<Weights> {
    static WEIGHTS: OnceLock<Arc<Weights>> = OnceLock::new();
    WEIGHTS
        .get_or_init(|| {
            load(&LoadOptions {
                requantize_to_q8_0: true,
                ..LoadOptions::default()
            })
        })
        .clone()
}

/// The weights exactly as stored in the file.
fn exact_weights() -> Arc<Weights> {
    static WEIGHTS: OnceLock<Arc<Weights>> = OnceLock::new();
    WEIGHTS
        .get_or_init(|| load(&LoadOptions::default()))
        .clone()
}

fn load(options: &LoadOptions) -> Arc<Weights> {
    let path = models_dir().join(SMOLLM2_FILE);
    Weights::load_with(&path, options).unwrap_or_else(|e| {
        panic!(
            "cannot load SmolLM2 from {}: {e}\nfetch it with `examples/fetch-models.sh smollm2` \
             (or point SPECDEC_MODELS at the directory that holds {SMOLLM2_FILE})",
            path.display()
        )
    })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Inputs and ids from Hugging Face `tokenizers` 0.23.3, configured as SmolLM2's tokenizer.json
/// (digits split individually, then GPT-2's byte-level regex) over the vocabulary and merges of
/// this GGUF file.
const REFERENCE: &[(&str, &[u32])] = &[
    ("Hello, world!", &[19556, 28, 905, 17]),
    (
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n",
        &[
            1604, 3987, 24, 94, 727, 472, 585, 304, 2067, 216, 34, 42, 448, 1003, 304, 472, 1003,
            3987, 24, 94, 29, 33, 25, 1232, 3987, 24, 94, 29, 34, 25, 198,
        ],
    ),
    (
        "  leading spaces and trailing   ",
        &[216, 2899, 5600, 284, 35079, 333],
    ),
    (
        "tabs\tand\n\nnewlines\r\n\r\nend",
        &[100, 7366, 197, 397, 198, 198, 2241, 5110, 7209, 198, 486],
    ),
    (
        "I'm you're we've they'll she'd IT'S 'sound",
        &[
            57, 5248, 346, 2316, 392, 3543, 502, 3060, 1041, 6737, 9627, 23, 67, 637, 30451,
        ],
    ),
    (
        "numbers 1234567 3.14159 1e-10 x2",
        &[
            28707, 216, 33, 34, 35, 36, 37, 38, 39, 216, 35, 30, 33, 36, 33, 37, 41, 216, 33, 85,
            29, 33, 32, 1792, 34,
        ],
    ),
    (
        "café naïve résumé Ünïcödé",
        &[
            83, 1939, 2756, 15486, 46494, 412, 2756, 5422, 2756, 5549, 246, 94, 25972, 83, 7466,
            84, 2756,
        ],
    ),
    (
        "日本語のテキスト、中文文本。",
        &[
            23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100,
            226, 29917, 28589, 29184, 29184, 40993, 19076,
        ],
    ),
    (
        "emoji 😀🎉👍🏽 mixed",
        &[
            391, 33777, 40303, 218, 10813, 232, 227, 10813, 235, 231, 10813, 233, 138, 6468,
        ],
    ),
    (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        &[1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198],
    ),
    (
        "fn main() { println!(\"{}\", x[0]); }",
        &[
            7853, 1085, 1000, 1662, 1628, 34115, 17, 43331, 1002, 1792, 75, 32, 2255, 43, 4029,
        ],
    ),
    ("    \n\t  \n", &[289, 3354, 32057]),
    ("a  b   c    d", &[81, 216, 278, 256, 265, 333, 287]),
    (
        "(foo) [bar] {baz} <qux>",
        &[
            24, 15236, 25, 933, 6299, 77, 1662, 45511, 109, 2067, 385, 104, 46,
        ],
    ),
    (
        "\u{a0}nbsp\u{2003}emspace",
        &[15442, 94, 32093, 321, 221, 1687, 6525],
    ),
    (
        "Ⅻ ½ ² ٣ १२३",
        &[
            173, 223, 121, 216, 16738, 216, 19133, 216, 164, 113, 216, 9310, 117, 9310, 118, 9310,
            119,
        ],
    ),
    (
        "हिन्दी भाषा",
        &[
            4300, 134, 27011, 30658, 16525, 44757, 37189, 12335, 251, 18075, 4300, 132, 18075,
        ],
    ),
    ("!!!???...,,,", &[29646, 16693, 47, 27040, 12002]),
    ("\n", &[198]),
    (" ", &[216]),
    ("x", &[104]),
    ("a\r\nb\rc\n", &[81, 201, 198, 82, 201, 83, 198]),
    (
        "#include <stdio.h>\nint main(void){return 0;}\n",
        &[
            19, 21745, 2067, 10491, 1119, 30, 88, 46, 198, 591, 1085, 24, 32439, 25, 107, 5406,
            216, 32, 43, 109, 198,
        ],
    ),
    (
        "    // comment with 'quotes' and \"double\"\n",
        &[
            333, 13241, 5189, 351, 637, 385, 2346, 23, 284, 476, 21414, 18, 198,
        ],
    ),
    (
        "SELECT * FROM t WHERE a='b';",
        &[23428, 1672, 18451, 252, 28531, 253, 2069, 82, 36651],
    ),
    (
        "🦀🦀🦀 rust",
        &[10813, 116, 218, 10813, 116, 218, 10813, 116, 218, 15744],
    ),
    (
        "Ελληνικά κείμενο",
        &[
            153, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 31953, 14240, 22442, 16674,
            14240, 11517, 10589,
        ],
    ),
    (
        "Привет, мир!",
        &[155, 249, 46879, 16464, 32547, 28, 41337, 7872, 9175, 17],
    ),
];

#[test]
fn tokenizer_matches_reference_ids_and_round_trips() {
    let w = weights();
    let tok = w.tokenizer();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Gpt2SingleDigits);
    assert_eq!(tok.vocab_size(), 49_152);
    for (text, ids) in REFERENCE {
        assert_eq!(tok.encode(text), *ids, "encoding {text:?}");
        assert_eq!(tok.decode(ids), *text, "decoding {text:?}");
    }
    // A special token in the text is one id; decoding gives its text back.
    let im_start = tok
        .token_id("<|im_start|>")
        .expect("SmolLM2 has <|im_start|>");
    let ids = tok.encode("<|im_start|>user");
    assert_eq!(ids[0], im_start);
    assert_eq!(tok.decode(&ids), "<|im_start|>user");
}

#[test]
fn whole_prompt_equals_token_by_token() {
    let w = weights();
    let vocab = w.config().vocab_size;
    let prompt = w.tokenizer().encode("def add(a, b):\n    return");
    let mut whole = Model::new(w.clone());
    let all = whole.forward(&prompt).unwrap();
    assert_eq!(all.len(), prompt.len() * vocab);
    assert_eq!(whole.len(), prompt.len());

    let mut stepwise = Model::new(w.clone());
    let mut worst = 0.0f32;
    for (i, &t) in prompt.iter().enumerate() {
        let row = stepwise.forward(&[t]).unwrap();
        assert_eq!(row.len(), vocab);
        worst = worst.max(max_abs_diff(&row, &all[i * vocab..(i + 1) * vocab]));
    }
    println!("whole prompt vs token by token: max |Δlogit| = {worst:e}");
    assert!(
        worst <= SPLIT_TOLERANCE,
        "rows differ by {worst} > {SPLIT_TOLERANCE}"
    );
    // Splitting in uneven chunks agrees too (the verifier appends k + 1 rows at a time).
    let mut chunked = Model::new(w.clone());
    let mut rows = chunked.forward(&prompt[..3]).unwrap();
    rows.extend(chunked.forward(&prompt[3..]).unwrap());
    let d = max_abs_diff(&rows, &all);
    assert!(d <= SPLIT_TOLERANCE, "chunked rows differ by {d}");
}

#[test]
fn truncate_then_reforward_reproduces_rows() {
    let w = weights();
    let tok = w.tokenizer();
    let prompt = tok.encode("fn main() {");
    let drafts = tok.encode(" println!(\"hi\");");
    let other = tok.encode(" let x = 1;");
    let mut m = Model::new(w.clone());
    m.forward(&prompt).unwrap();
    let first = m.forward(&drafts).unwrap();
    assert_eq!(m.len(), prompt.len() + drafts.len());

    // Reject everything, score a different continuation, roll back again, re-score the first.
    m.truncate(prompt.len()).unwrap();
    assert_eq!(m.len(), prompt.len());
    m.forward(&other).unwrap();
    m.truncate(prompt.len()).unwrap();
    let again = m.forward(&drafts).unwrap();
    let d = max_abs_diff(&first, &again);
    println!("re-forward after truncate: max |Δlogit| = {d:e}");
    assert!(d <= SPLIT_TOLERANCE, "rows after truncate differ by {d}");

    // Partial acceptance: keep two drafts, the rows after them match a fresh sequence's.
    m.truncate(prompt.len() + 2).unwrap();
    let tail = m.forward(&drafts[2..]).unwrap();
    let vocab = m.vocab_size();
    let d = max_abs_diff(&tail, &first[2 * vocab..]);
    assert!(
        d <= SPLIT_TOLERANCE,
        "rows after partial truncate differ by {d}"
    );

    assert!(matches!(
        m.truncate(m.len() + 1),
        Err(ModelError::TruncateBeyondLength { .. })
    ));
    assert!(matches!(m.forward(&[]), Err(ModelError::EmptyInput)));
    assert!(matches!(
        m.forward(&[vocab as u32]),
        Err(ModelError::TokenOutOfRange { .. })
    ));
    // A failed forward leaves the sequence as it was.
    assert_eq!(m.len(), prompt.len() + drafts.len());
}

#[test]
fn greedy_continuation_is_deterministic_and_sensible() {
    let w = exact_weights();
    let tok = w.tokenizer();
    let prompt = tok.encode("The capital of France is");
    let options = GenerateOptions {
        max_new_tokens: 8,
        ..GenerateOptions::default()
    };
    let a = generate(&mut Model::new(w.clone()), &prompt, &options).unwrap();
    let b = generate(&mut Model::new(w.clone()), &prompt, &options).unwrap();
    assert_eq!(a.tokens, b.tokens);
    let text = tok.decode(&a.tokens);
    println!("greedy: {text:?}");
    assert!(
        text.contains("Paris"),
        "greedy continuation {text:?} lacks Paris"
    );

    // Sampling with a seed is reproducible too.
    let sampled = GenerateOptions {
        temperature: 0.8,
        seed: 7,
        max_new_tokens: 4,
        ..options.clone()
    };
    let c = generate(&mut Model::new(w.clone()), &prompt, &sampled).unwrap();
    let d = generate(&mut Model::new(w.clone()), &prompt, &sampled).unwrap();
    assert_eq!(c.tokens, d.tokens);
}

#[test]
fn layer_skip_draft_shares_weights_and_has_its_own_cache() {
    let w = weights();
    let prompt = w.tokenizer().encode("for i in range(");
    let mut target = Model::new(w.clone());
    let mut draft = Model::layer_skip(w.clone(), 8).unwrap();
    assert_eq!(draft.layers(), 8);
    assert_eq!(target.layers(), w.config().layers);
    let t = target.forward(&prompt).unwrap();
    let d = draft.forward(&prompt[..2]).unwrap();
    assert_eq!(draft.len(), 2);
    assert_eq!(target.len(), prompt.len());
    assert_eq!(d.len(), 2 * draft.vocab_size());
    // A different depth gives different logits for the same position.
    let vocab = target.vocab_size();
    assert!(max_abs_diff(&t[vocab..2 * vocab], &d[vocab..]) > 0.1);
    assert!(matches!(
        Model::layer_skip(w.clone(), 0),
        Err(ModelError::BadLayerCount { .. })
    ));
    assert!(Model::layer_skip(w.clone(), w.config().layers + 1).is_err());
}

#[test]
fn forward_last_returns_the_tail_rows() {
    let w = weights();
    let prompt = w.tokenizer().encode("let v = vec![1, 2, 3];");
    let vocab = w.config().vocab_size;
    let all = Model::new(w.clone()).forward(&prompt).unwrap();
    let mut m = Model::new(w.clone());
    let last2 = m.forward_last(&prompt, 2).unwrap();
    assert_eq!(m.len(), prompt.len());
    let d = max_abs_diff(&last2, &all[(prompt.len() - 2) * vocab..]);
    assert!(d <= SPLIT_TOLERANCE, "forward_last rows differ by {d}");
    assert!(matches!(
        m.forward_last(&prompt, 0),
        Err(ModelError::BadRowCount { .. })
    ));
}

/// The glue to `specdec::speculative`: SmolLM2 verifying its own first 20 layers through `SpecDecoder`
/// on the CPU verifier emits exactly the plain greedy continuation.
#[test]
fn speculative_greedy_with_layer_skip_draft_equals_plain_greedy() {
    use specdec::models::GreedyDraft;
    use specdec::speculative::{
        DecoderConfig, DraftModelProposer, GenRequest, Sequences, SpecDecoder,
    };
    use specdec::{SamplingParams, Verifier, VerifierOptions};

    let w = weights();
    let prompt = w.tokenizer().encode("def square(x):\n    return");
    let new_tokens = 10;
    let plain = generate(
        &mut Model::new(w.clone()),
        &prompt,
        &GenerateOptions {
            max_new_tokens: new_tokens,
            ..GenerateOptions::default()
        },
    )
    .unwrap();

    let verifier = Verifier::cpu(VerifierOptions::default());
    let mut decoder = SpecDecoder::new(
        &verifier,
        DecoderConfig {
            num_drafts: 3,
            ..DecoderConfig::default()
        },
    );
    let mut target = Sequences::new(vec![Model::new(w.clone())]);
    let draft = GreedyDraft::new(Model::layer_skip(w.clone(), 20).unwrap());
    let mut proposer = DraftModelProposer::new(draft);
    let request = GenRequest::new(prompt.clone(), SamplingParams::greedy(), new_tokens);
    let out = decoder
        .generate(&mut target, &mut proposer, &[request])
        .unwrap();
    println!("{}", decoder.metrics());
    assert_eq!(out[0].tokens, plain.tokens);
    // The target's cache holds the sequence minus the last emitted token (fed next step).
    assert!(target.models[0].len() < prompt.len() + new_tokens);
}

/// A prompt and a two-branch tree below its last token, as (prompt, tree tokens, parents):
///
/// ```text
/// root (the last prompt token) ─┬─ a0 ─ a1 ─ a2      a = " let x = 1;"
///                               └─ b0 ─ b1           b = " println!"
/// ```
fn small_tree(w: &Weights) -> (Vec<u32>, [u32; 6], [i32; 6]) {
    let tok = w.tokenizer();
    let prompt = tok.encode("fn main() {");
    let a = tok.encode(" let x = 1;");
    let b = tok.encode(" println!");
    let root = *prompt.last().unwrap();
    let tokens = [root, a[0], b[0], a[1], b[1], a[2]];
    (prompt, tokens, [-1, 0, 0, 1, 2, 3])
}

/// A tree forward scores each node as a chain forward of its path would (bit for bit: every
/// position runs with a one-token step's shapes), and `keep_path` leaves the cache a chain
/// forward of the accepted path would leave.
#[test]
fn tree_forward_rows_equal_their_paths_chain_rows() {
    let w = weights();
    let tok = w.tokenizer();
    let (prompt, tokens, parents) = small_tree(&w);
    let a = tok.encode(" let x = 1;");
    let b = tok.encode(" println!");
    let root = tokens[0];
    let mut m = Model::new(w.clone());
    m.forward(&prompt[..prompt.len() - 1]).unwrap();
    let base = m.len();
    let tree = m.forward_tree(&tokens, &parents).unwrap();
    assert_eq!(m.len(), base + tokens.len());
    let vocab = m.vocab_size();
    let row = |i: usize| &tree[i * vocab..(i + 1) * vocab];
    let mut chain = Model::new(w.clone());
    chain.forward(&prompt[..prompt.len() - 1]).unwrap();
    let path_a = chain.forward(&[root, a[0], a[1], a[2]]).unwrap();
    chain.truncate(base).unwrap();
    let path_b = chain.forward(&[root, b[0], b[1]]).unwrap();
    for (tree_row, chain_row) in [(0, 0), (1, 1), (3, 2), (5, 3)] {
        let d = max_abs_diff(
            row(tree_row),
            &path_a[chain_row * vocab..(chain_row + 1) * vocab],
        );
        assert!(d <= SPLIT_TOLERANCE, "path a, tree row {tree_row}: {d}");
    }
    for (tree_row, chain_row) in [(2, 1), (4, 2)] {
        let d = max_abs_diff(
            row(tree_row),
            &path_b[chain_row * vocab..(chain_row + 1) * vocab],
        );
        assert!(d <= SPLIT_TOLERANCE, "path b, tree row {tree_row}: {d}");
    }
    // Negative control: rows of different paths differ (the comparison can fail).
    assert!(max_abs_diff(row(3), &path_b[2 * vocab..3 * vocab]) > 1.0);

    // Keep root → b0 → b1; the next token's row equals the chain's after the same path.
    m.keep_path(base, &[0, 2, 4]).unwrap();
    assert_eq!(m.len(), base + 3);
    let next = m.forward(&[a[0]]).unwrap();
    let want = chain.forward(&[a[0]]).unwrap();
    let d = max_abs_diff(&next, &want);
    assert!(d <= SPLIT_TOLERANCE, "after keep_path: {d}");
    // Bad trees and paths are typed errors, and leave the sequence as it was.
    let len = m.len();
    assert!(matches!(
        m.forward_tree(&[1, 2], &[-1, 1]),
        Err(ModelError::BadTree { .. })
    ));
    assert!(matches!(
        m.forward_tree(&[1, 2], &[-1]),
        Err(ModelError::BadTree { .. })
    ));
    assert!(matches!(
        m.keep_path(len - 2, &[1, 0]),
        Err(ModelError::BadTree { .. })
    ));
    assert_eq!(m.len(), len);
}

/// Tree speculation with n-gram trees emits exactly the plain greedy text (greedy is the
/// exactness oracle end to end), and on a prompt that repeats itself a tree yields at least as
/// many tokens per target call as its first-child chain.
#[test]
fn greedy_tree_decoding_equals_plain_decoding() {
    use specdec::models::{generate_tree, TreeGenOptions};
    use specdec::speculative::NgramTreeProposer;
    let w = weights();
    let tok = w.tokenizer();
    let prompt = tok.encode(
        "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    \
         return total / len(values)\n\n# The same, with `total` renamed to `acc`:\n\
         def mean(values):\n    acc = 0\n",
    );
    let mut m = Model::new(w.clone());
    let opts = |proposer| TreeGenOptions {
        max_new_tokens: 24,
        params: specdec::SamplingParams::greedy(),
        proposer,
        depth: 6,
        verify_threads: 1,
    };
    let plain = generate_tree(&mut m, &prompt, &opts(None)).unwrap();
    let chain = NgramTreeProposer::new(1, 3, 1, 64).unwrap();
    let tree = NgramTreeProposer::new(1, 3, 8, 64).unwrap();
    let by_chain = generate_tree(&mut m, &prompt, &opts(Some(chain))).unwrap();
    let by_tree = generate_tree(&mut m, &prompt, &opts(Some(tree))).unwrap();
    assert_eq!(plain.target_calls, 24);
    assert_eq!(
        by_chain.tokens,
        plain.tokens,
        "{}",
        tok.decode(&by_chain.tokens)
    );
    assert_eq!(
        by_tree.tokens,
        plain.tokens,
        "{}",
        tok.decode(&by_tree.tokens)
    );
    println!(
        "tokens per call: chain {:.2}, tree {:.2} ({} nodes scored)",
        by_chain.tokens_per_call(),
        by_tree.tokens_per_call(),
        by_tree.nodes_scored
    );
    assert!(by_chain.target_calls < plain.target_calls);
    assert!(by_tree.target_calls <= by_chain.target_calls);
}

/// Trees drafted by a draft model (`DraftTreeProposer`, top-k per node, the draft's greedy chain
/// as the first-child path): greedy tree decoding emits exactly the plain greedy text with a
/// layer-skip draft, and the whole model as its own draft has every step accept the full depth
/// (its greedy chain is the target's), which a tree without that chain would miss.
#[test]
fn greedy_draft_model_trees_equal_plain_decoding() {
    use specdec::models::{generate_tree, generate_tree_with, DraftTreeProposer, TreeGenOptions};
    let w = weights();
    let tok = w.tokenizer();
    let prompt =
        tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n");
    let mut m = Model::new(w.clone());
    let opts = TreeGenOptions {
        max_new_tokens: 16,
        params: specdec::SamplingParams::greedy(),
        proposer: None,
        depth: 4,
        verify_threads: 1,
    };
    let plain = generate_tree(&mut m, &prompt, &opts).unwrap();
    let layers = m.layers();
    let skip = Model::layer_skip(w.clone(), layers / 3).unwrap();
    let mut draft = DraftTreeProposer::new(skip, 2, 3).unwrap();
    let by_skip = generate_tree_with(&mut m, &prompt, &opts, &mut draft).unwrap();
    assert_eq!(
        by_skip.tokens,
        plain.tokens,
        "{}",
        tok.decode(&by_skip.tokens)
    );
    let mut own = DraftTreeProposer::new(Model::new(w.clone()), 2, 3).unwrap();
    let by_own = generate_tree_with(&mut m, &prompt, &opts, &mut own).unwrap();
    assert_eq!(by_own.tokens, plain.tokens);
    println!(
        "tokens per call: layer-skip draft {:.2} ({} nodes), own draft {:.2}",
        by_skip.tokens_per_call(),
        by_skip.nodes_scored,
        by_own.tokens_per_call()
    );
    // 16 tokens at up to 5 per call (4 drafts and the bonus): 4 calls when every draft passes.
    assert_eq!(
        by_own.target_calls, 4,
        "the draft's own greedy chain was rejected"
    );
    assert!(
        by_skip.nodes_scored > by_skip.target_calls * 4,
        "no branching"
    );
    assert!(DraftTreeProposer::new(Model::new(w), 0, 3).is_err());
}

/// `extend_tree` grows a tree level by level with the rows a forward of the whole tree gives
/// (within the split tolerance), and refuses a wrong base or a parent that is not earlier.
#[test]
fn extending_a_tree_level_by_level_equals_forwarding_it_whole() {
    let w = weights();
    let (prompt, tokens, parents) = small_tree(&w);
    let mut whole = Model::new(w.clone());
    whole.forward(&prompt[..prompt.len() - 1]).unwrap();
    let base = whole.len();
    let all = whole.forward_tree(&tokens, &parents).unwrap();
    let mut m = Model::new(w.clone());
    m.forward(&prompt[..prompt.len() - 1]).unwrap();
    let mut rows = m.forward_tree(&tokens[..1], &parents[..1]).unwrap();
    for level in [1..3, 3..5, 5..6] {
        let more = m
            .extend_tree(
                base,
                &parents[..level.start],
                &tokens[level.clone()],
                &parents[level.clone()],
            )
            .unwrap();
        rows.extend(more);
    }
    assert_eq!(m.len(), base + tokens.len());
    let d = max_abs_diff(&rows, &all);
    assert!(d <= SPLIT_TOLERANCE, "level by level vs whole: {d}");
    assert!(
        m.extend_tree(base + 1, &parents, &[5], &[0]).is_err(),
        "wrong base"
    );
    assert!(
        m.extend_tree(base, &parents, &[5], &[6]).is_err(),
        "parent not earlier"
    );
    assert_eq!(m.len(), base + tokens.len());
}

//! Qwen2.5-Coder 0.5B and 1.5B through `specdec::models` (feature `candle`): the Qwen2
//! tokenizer against reference ids, all-position logits, and the two files' shared vocabulary.
//!
//! Ignored by default (1.6 GB of weights, not fetched in CI). Run explicitly:
//! `examples/fetch-models.sh qwen && cargo test --release --features candle --test qwen -- --ignored`.

use std::sync::Arc;

use specdec::models::{
    models_dir, Architecture, LoadOptions, Model, PreTokenizer, Weights, QWEN_0_5B_FILE,
    QWEN_1_5B_FILE,
};

fn load(file: &str) -> Arc<Weights> {
    let path = models_dir().join(file);
    let options = LoadOptions {
        requantize_to_q8_0: true,
        ..LoadOptions::default()
    };
    Weights::load_with(&path, &options).unwrap_or_else(|e| {
        panic!(
            "cannot load {}: {e}\nfetch it with `examples/fetch-models.sh qwen` (or point \
             SPECDEC_MODELS at the directory that holds {file})",
            path.display()
        )
    })
}

/// Inputs and ids from Hugging Face `tokenizers` 0.23.3 with Qwen2's pre-tokenizer regex over
/// the vocabulary and merges of these GGUF files.
const REFERENCE: &[(&str, &[u32])] = &[
    ("Hello, world!", &[9707, 11, 1879, 0]),
    (
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n",
        &[
            750, 15801, 1445, 982, 262, 421, 308, 366, 220, 17, 510, 286, 470, 308, 198, 262, 470,
            15801, 1445, 12, 16, 8, 488, 15801, 1445, 12, 17, 340,
        ],
    ),
    (
        "  leading spaces and trailing   ",
        &[220, 6388, 12621, 323, 27748, 262],
    ),
    (
        "tabs\tand\n\nnewlines\r\n\r\nend",
        &[30993, 52477, 271, 931, 7969, 871, 408],
    ),
    (
        "I'm you're we've they'll she'd IT'S 'sound",
        &[
            40, 2776, 498, 2299, 582, 3003, 807, 3278, 1340, 4172, 8700, 13272, 364, 27532,
        ],
    ),
    (
        "numbers 1234567 3.14159 1e-10 x2",
        &[
            37378, 220, 16, 17, 18, 19, 20, 21, 22, 220, 18, 13, 16, 19, 16, 20, 24, 220, 16, 68,
            12, 16, 15, 856, 17,
        ],
    ),
    (
        "café naïve résumé Ünïcödé",
        &[
            924, 58858, 94880, 586, 9333, 1242, 963, 30512, 77, 37572, 66, 2956, 128505,
        ],
    ),
    (
        "日本語のテキスト、中文文本。",
        &[
            101059, 102819, 15767, 56833, 61803, 70534, 5373, 104811, 108704, 1773,
        ],
    ),
    (
        "emoji 😀🎉👍🏽 mixed",
        &[37523, 90316, 144841, 144349, 145375, 9519],
    ),
    (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        &[151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
    ),
    (
        "fn main() { println!(\"{}\", x[0]); }",
        &[8822, 1887, 368, 314, 13751, 79878, 856, 58, 15, 14979, 335],
    ),
    ("    \n\t  \n", &[1066, 38320]),
    ("a  b   c    d", &[64, 220, 293, 256, 272, 262, 294]),
    (
        "(foo) [bar] {baz} <qux>",
        &[71880, 8, 508, 2257, 60, 314, 42573, 92, 366, 446, 87, 29],
    ),
    (
        "\u{a0}nbsp\u{2003}emspace",
        &[4102, 5674, 378, 225, 336, 8746],
    ),
    (
        "Ⅻ ½ ² ٣ १२३",
        &[
            70467, 104, 220, 26062, 220, 29456, 220, 149, 96, 220, 12619, 100, 12619, 101, 12619,
            102,
        ],
    ),
    (
        "हिन्दी भाषा",
        &[
            93948, 42311, 101, 30484, 99, 43647, 14925, 255, 31411, 115, 23868,
        ],
    ),
    ("!!!???...,,,", &[12069, 33015, 1112, 60723]),
    ("\n", &[198]),
    (" ", &[220]),
    ("x", &[87]),
    ("a\r\nb\rc\n", &[64, 319, 65, 201, 66, 198]),
    (
        "#include <stdio.h>\nint main(void){return 0;}\n",
        &[
            1067, 366, 10345, 860, 397, 396, 1887, 4333, 6098, 689, 220, 15, 12084,
        ],
    ),
    (
        "    // comment with 'quotes' and \"double\"\n",
        &[262, 442, 3980, 448, 364, 53282, 6, 323, 330, 4331, 698],
    ),
    (
        "SELECT * FROM t WHERE a='b';",
        &[4858, 353, 4295, 259, 5288, 264, 1131, 65, 6967],
    ),
    ("🦀🦀🦀 rust", &[147579, 147579, 147579, 23071]),
    (
        "Ελληνικά κείμενο",
        &[
            144674, 33486, 33486, 41424, 33269, 29762, 67337, 74134, 71638, 30143, 54141, 43123,
            30143, 33269, 27554,
        ],
    ),
    ("Привет, мир!", &[53645, 26991, 8178, 11, 137144, 0]),
];

#[test]
#[ignore = "needs examples/fetch-models.sh qwen (1.6 GB)"]
fn qwen_tokenizer_matches_reference_ids() {
    let w = load(QWEN_0_5B_FILE);
    let tok = w.tokenizer();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Qwen2);
    assert_eq!(tok.encode("Hello, world!"), [9707, 11, 1879, 0]);
    for (text, ids) in REFERENCE {
        assert_eq!(tok.encode(text), *ids, "encoding {text:?}");
        assert_eq!(tok.decode(ids), *text, "decoding {text:?}");
    }
}

#[test]
#[ignore = "needs examples/fetch-models.sh qwen (1.6 GB)"]
fn qwen_pair_shares_vocabulary_and_scores_every_position() {
    let draft = load(QWEN_0_5B_FILE);
    let target = load(QWEN_1_5B_FILE);
    assert_eq!(draft.config().architecture, Architecture::Qwen2);
    assert_eq!(draft.config().vocab_size, target.config().vocab_size);
    let prompt = draft
        .tokenizer()
        .encode("def add(a, b):\n    return a + b\n");
    assert_eq!(
        prompt,
        target
            .tokenizer()
            .encode("def add(a, b):\n    return a + b\n")
    );

    let vocab = draft.config().vocab_size;
    let all = Model::new(draft.clone()).forward(&prompt).unwrap();
    let mut step = Model::new(draft.clone());
    let mut worst = 0.0f32;
    for (i, &t) in prompt.iter().enumerate() {
        let row = step.forward(&[t]).unwrap();
        let reference = &all[i * vocab..(i + 1) * vocab];
        let d = row
            .iter()
            .zip(reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        worst = worst.max(d);
    }
    println!("Qwen 0.5B whole prompt vs token by token: max |Δlogit| = {worst:e}");
    assert!(worst <= 1e-3, "rows differ by {worst}");

    // The target agrees with the draft on the easy next token after "return a +": " b".
    let mut t = Model::new(target.clone());
    let p = target.tokenizer().encode("def add(a, b):\n    return a +");
    let row = t.forward_last(&p, 1).unwrap();
    let best = specdec::models::argmax(&row);
    assert_eq!(target.tokenizer().decode(&[best]), " b");
}

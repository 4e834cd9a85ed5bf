//! Byte-level BPE (GPT-2 / Qwen2 style) built from the GGUF metadata: vocabulary, merges, token
//! types, and the pre-tokenizer name.
//!
//! Encoding is: split out special tokens (GGUF token types *control* and *user-defined*, e.g.
//! `<|im_start|>`) by longest literal match; split the rest into pre-tokens with the model's
//! pre-tokenizer; map each pre-token's UTF-8 bytes to GPT-2's printable byte alphabet; apply the
//! merges lowest rank first. Decoding maps the alphabet back to bytes.
//!
//! The pre-tokenizers are the published regular expressions written out as hand scanners, so no
//! regex engine is needed (the Qwen2 one has a look-ahead that the `regex` crate lacks). One
//! approximation: the regexes' `\p{L}` and `\p{N}` are read as Rust's `char::is_alphabetic` and
//! `char::is_numeric`. `is_numeric` is exactly `\p{N}`; `is_alphabetic` is `\p{Alphabetic}`,
//! which adds letter numbers (Nl, also numeric) and combining vowel signs (Mn/Mc with
//! Other_Alphabetic, e.g. in Devanagari) to `\p{L}`. Text in those scripts can split
//! differently from the reference tokenizer; ASCII, Latin, CJK and code are unaffected.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::error::ModelError;
use super::weights::as_usize;

/// Which published pre-tokenizer regex the model was trained with (GGUF `tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// GPT-2's: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// GPT-2's after splitting every digit into its own piece (`smollm`, also StarCoder).
    Gpt2SingleDigits,
    /// Qwen2's: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Qwen2,
}

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: u32 = 3;
const TOKEN_TYPE_USER_DEFINED: u32 = 4;

/// A byte-level BPE tokenizer.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    /// Token id → its string in the byte alphabet (special tokens: their literal text).
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// `(left, right)` → `(rank, merged id)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Special tokens, longest first, matched literally in the input.
    special: Vec<(String, u32)>,
    is_special: Vec<bool>,
    pre: PreTokenizer,
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
    bos: Option<u32>,
    eos: Option<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF metadata map.
    pub fn from_gguf(meta: &HashMap<String, Value>) -> Result<Tokenizer, ModelError> {
        let get = |key: &str| {
            meta.get(key).ok_or_else(|| ModelError::Metadata {
                key: key.to_string(),
                message: "missing".to_string(),
            })
        };
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            let bad = |m: String| ModelError::Metadata {
                key: key.to_string(),
                message: m,
            };
            get(key)?
                .to_vec()
                .map_err(|e| bad(e.to_string()))?
                .iter()
                .map(|v| v.to_string().cloned().map_err(|e| bad(e.to_string())))
                .collect()
        };
        let pre = pre_tokenizer_of(meta)?;
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types: Vec<u32> = match meta.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| ModelError::Metadata {
                    key: "tokenizer.ggml.token_type".into(),
                    message: e.to_string(),
                })?
                .iter()
                .map(|v| as_usize("tokenizer.ggml.token_type", v).map(|n| n as u32))
                .collect::<Result<_, _>>()?,
            None => vec![1; tokens.len()],
        };
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), i as u32))
            .collect();
        let merges = read_merges(&strings("tokenizer.ggml.merges")?, &ids)?;
        let mut is_special = vec![false; tokens.len()];
        let mut special = Vec::new();
        for (i, (s, &ty)) in tokens.iter().zip(&types).enumerate() {
            if (ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED) && !s.is_empty() {
                is_special[i] = true;
                special.push((s.clone(), i as u32));
            }
        }
        special.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let byte_char = byte_alphabet();
        let char_byte = byte_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            meta.get(key)
                .map(|v| as_usize(key, v).map(|n| n as u32))
                .transpose()
        };
        Ok(Tokenizer {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            tokens,
            ids,
            merges,
            special,
            is_special,
            pre,
            byte_char,
            char_byte,
        })
    }

    /// Number of token strings (may be smaller than the model's logits width: Qwen2.5 pads its
    /// output head to 151,936 rows for 151,665 tokens).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// Beginning-of-sequence token, if the file names one. `encode` never adds it.
    pub fn bos_token(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token, if the file names one.
    pub fn eos_token(&self) -> Option<u32> {
        self.eos
    }

    /// The id of a token string exactly as stored (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// The stored string of a token (byte-alphabet form for ordinary tokens).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|s| s.as_str())
    }

    /// Encodes `text`. Special-token strings in it (e.g. `<|im_start|>`) become their single
    /// ids, as in Hugging Face tokenizers' default; no BOS is added.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // The earliest special token, longest at that position.
            let found = self
                .special
                .iter()
                .filter_map(|(s, id)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
                .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let (plain, next) = match found {
                Some((at, len, id)) => (&rest[..at], Some((id, &rest[at + len..]))),
                None => (rest, None),
            };
            for piece in self.pre_tokenize(plain) {
                self.bpe(piece, &mut out);
            }
            match next {
                Some((id, tail)) => {
                    out.push(id);
                    rest = tail;
                }
                None => break,
            }
        }
        out
    }

    /// The bytes the tokens stand for (special tokens as their literal text); ids outside the
    /// vocabulary are skipped.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            let Some(s) = self.tokens.get(id as usize) else {
                continue;
            };
            if self.is_special[id as usize] {
                out.extend_from_slice(s.as_bytes());
                continue;
            }
            for c in s.chars() {
                match self.char_byte.get(&c) {
                    Some(&b) => out.push(b),
                    None => {
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
        out
    }

    /// Decodes to text; byte sequences that are not valid UTF-8 (a token boundary inside a
    /// character) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// Applies the merges to one pre-token, lowest rank first (leftmost among equal ranks).
    fn bpe(&self, piece: &str, out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        let mut mapped = String::with_capacity(piece.len() * 2);
        for &b in piece.as_bytes() {
            mapped.push(self.byte_char[b as usize]);
        }
        if let Some(&id) = self.ids.get(&mapped) {
            out.push(id);
            return;
        }
        // Every byte-alphabet character is a token in a byte-level vocabulary; one that is not
        // (a broken file) is dropped rather than panicking.
        let mut parts: Vec<u32> = mapped
            .chars()
            .filter_map(|c| self.ids.get(c.encode_utf8(&mut [0u8; 4]) as &str).copied())
            .collect();
        loop {
            let best = parts
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| self.merges.get(&(w[0], w[1])).map(|&(r, m)| (r, i, m)))
                .min();
            let Some((_, i, merged)) = best else { break };
            parts[i] = merged;
            parts.remove(i + 1);
        }
        out.extend_from_slice(&parts);
    }

    /// Splits text (free of special tokens) into pre-tokens.
    fn pre_tokenize<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut out = Vec::new();
        match self.pre {
            PreTokenizer::Qwen2 => scan(text, &mut out, qwen2_match),
            PreTokenizer::Gpt2 => scan(text, &mut out, gpt2_match),
            PreTokenizer::Gpt2SingleDigits => {
                // First every digit alone, then GPT-2's regex on the text between digits.
                let mut from = 0;
                for (at, c) in text.char_indices() {
                    if c.is_numeric() {
                        scan(&text[from..at], &mut out, gpt2_match);
                        out.push(&text[at..at + c.len_utf8()]);
                        from = at + c.len_utf8();
                    }
                }
                scan(&text[from..], &mut out, gpt2_match);
            }
        }
        out
    }
}

/// The pre-tokenizer the file names (`tokenizer.ggml.pre`), after checking that the model is
/// byte-level BPE (`tokenizer.ggml.model = gpt2`), the only one implemented.
fn pre_tokenizer_of(meta: &HashMap<String, Value>) -> Result<PreTokenizer, ModelError> {
    let model = meta
        .get("tokenizer.ggml.model")
        .ok_or_else(|| ModelError::Metadata {
            key: "tokenizer.ggml.model".into(),
            message: "missing".to_string(),
        })?
        .to_string()
        .map_err(|e| ModelError::Metadata {
            key: "tokenizer.ggml.model".into(),
            message: e.to_string(),
        })?;
    if model != "gpt2" {
        return Err(ModelError::Unsupported {
            message: format!(
                "tokenizer model `{model}`; only byte-level BPE (`gpt2`) is implemented"
            ),
        });
    }
    let pre_name = meta
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.to_string().ok())
        .map(|s| s.as_str())
        .unwrap_or("default");
    Ok(match pre_name {
        "qwen2" => PreTokenizer::Qwen2,
        "smollm" | "starcoder" => PreTokenizer::Gpt2SingleDigits,
        "gpt2" | "default" => PreTokenizer::Gpt2,
        other => {
            return Err(ModelError::Unsupported {
                message: format!(
                    "pre-tokenizer `{other}`; implemented: qwen2, smollm, starcoder, gpt2"
                ),
            })
        }
    })
}

/// The merge table: `(left id, right id)` → `(rank, merged id)`.
type Merges = HashMap<(u32, u32), (u32, u32)>;

/// The merge table from the `"left right"` lines; the first occurrence of a pair keeps its rank.
fn read_merges(lines: &[String], ids: &HashMap<String, u32>) -> Result<Merges, ModelError> {
    let mut merges = HashMap::new();
    for (rank, line) in lines.iter().enumerate() {
        let (a, b) = line.split_once(' ').ok_or_else(|| ModelError::Tokenizer {
            message: format!("merge {rank} `{line}` has no space"),
        })?;
        let lookup = |s: &str| {
            ids.get(s).copied().ok_or_else(|| ModelError::Tokenizer {
                message: format!("merge {rank} `{line}`: `{s}` is not a token"),
            })
        };
        let merged = lookup(&format!("{a}{b}"))?;
        merges
            .entry((lookup(a)?, lookup(b)?))
            .or_insert((rank as u32, merged));
    }
    Ok(merges)
}

/// GPT-2's byte → printable character table: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes take the code points from U+0100 on, in byte order.
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        *slot = if printable {
            char::from(b as u8)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    table
}

/// Runs a matcher over `text`: at each position the matcher returns the length in chars of the
/// pre-token that starts there (at least 1).
fn scan<'a>(text: &'a str, out: &mut Vec<&'a str>, matcher: fn(&[char], usize) -> usize) {
    if text.is_empty() {
        return;
    }
    let chars: Vec<char> = text.chars().collect();
    let mut offsets: Vec<usize> = text.char_indices().map(|(o, _)| o).collect();
    offsets.push(text.len());
    let mut i = 0;
    while i < chars.len() {
        let n = matcher(&chars, i).max(1);
        out.push(&text[offsets[i]..offsets[i + n]]);
        i += n;
    }
}

fn is_letter(c: char) -> bool {
    c.is_alphabetic()
}

fn is_number(c: char) -> bool {
    c.is_numeric()
}

/// `[^\s\p{L}\p{N}]`
fn is_other(c: char) -> bool {
    !c.is_whitespace() && !is_letter(c) && !is_number(c)
}

fn run(chars: &[char], from: usize, pred: fn(char) -> bool) -> usize {
    chars[from..].iter().take_while(|&&c| pred(c)).count()
}

/// `'s|'t|'re|'ve|'m|'ll|'d`, optionally case-insensitive; length in chars or 0.
fn contraction(chars: &[char], i: usize, ignore_case: bool) -> usize {
    if chars[i] != '\'' {
        return 0;
    }
    let lower = |k: usize| {
        chars.get(i + k).map(|&c| {
            if ignore_case {
                c.to_ascii_lowercase()
            } else {
                c
            }
        })
    };
    match (lower(1), lower(2)) {
        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 3,
        (Some('s' | 't' | 'm' | 'd'), _) => 2,
        _ => 0,
    }
}

/// `\s+(?!\S)|\s+` at a whitespace char: the run, less its last char when a non-space follows
/// and the run is longer than one.
fn whitespace(chars: &[char], i: usize) -> usize {
    let n = run(chars, i, char::is_whitespace);
    if i + n < chars.len() && n > 1 {
        n - 1
    } else {
        n
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2_match(chars: &[char], i: usize) -> usize {
    let n = contraction(chars, i, false);
    if n > 0 {
        return n;
    }
    let space = usize::from(chars[i] == ' ' && i + 1 < chars.len());
    let c = chars[i + space];
    for pred in [is_letter as fn(char) -> bool, is_number, is_other] {
        if pred(c) {
            return space + run(chars, i + space, pred);
        }
    }
    whitespace(chars, i)
}

/// Qwen2: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn qwen2_match(chars: &[char], i: usize) -> usize {
    let n = contraction(chars, i, true);
    if n > 0 {
        return n;
    }
    let c = chars[i];
    if is_letter(c) {
        return run(chars, i, is_letter);
    }
    let next = chars.get(i + 1).copied();
    if c != '\r' && c != '\n' && !is_number(c) && next.is_some_and(is_letter) {
        return 1 + run(chars, i + 1, is_letter);
    }
    if is_number(c) {
        return 1;
    }
    let space = usize::from(c == ' ' && next.is_some_and(is_other));
    if is_other(chars[i + space]) {
        let n = space + run(chars, i + space, is_other);
        return n + run(chars, i + n, |c| c == '\r' || c == '\n');
    }
    // Whitespace from here on.
    let ws = run(chars, i, char::is_whitespace);
    if let Some(last_newline) = chars[i..i + ws]
        .iter()
        .rposition(|&c| c == '\r' || c == '\n')
    {
        return last_newline + 1;
    }
    whitespace(chars, i)
}

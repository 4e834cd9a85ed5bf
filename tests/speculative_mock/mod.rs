//! A deterministic mock language model for the `spec` tests: logits are a hash of the last few
//! tokens of the context, with a strong "successor" token in most contexts so that generated text
//! repeats (n-gram friendly) and drafts are often, but not always, accepted. Plus a mock draft
//! model that agrees with it most of the time, and reference decoders computed directly from it.
#![allow(dead_code)]

use specdec::speculative::{
    DraftModel, ModelError, Proposals, Query, RowKind, SeqView, SequenceModel, SingleQueryModel,
};

/// SplitMix64's finaliser: a good 64-bit mix.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Uniform in [0, 1) from a hash.
pub fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The mock target.
#[derive(Clone, Copy, Debug)]
pub struct MockLm {
    pub vocab: usize,
    pub salt: u64,
    /// Logit bonus of the successor token in "strong" contexts.
    pub peak: f32,
    /// Scale of the hash noise on every logit.
    pub noise: f32,
    /// Tokens of context the logits depend on (besides the successor, which depends on the last).
    pub order: usize,
    /// One context in `weak_every` has no successor bonus.
    pub weak_every: u64,
}

impl MockLm {
    /// A peaked, repetitive model for the greedy tests.
    pub fn peaked(vocab: usize) -> Self {
        MockLm {
            vocab,
            salt: 0x5eed,
            peak: 4.0,
            noise: 3.0,
            order: 3,
            weak_every: 4,
        }
    }

    /// Hash of the last `order` tokens of `a ++ b`.
    fn context_hash(&self, a: &[u32], b: &[u32]) -> u64 {
        let mut h = self.salt;
        let n = a.len() + b.len();
        for i in n.saturating_sub(self.order)..n {
            let t = if i < a.len() { a[i] } else { b[i - a.len()] };
            h = mix(h ^ u64::from(t).wrapping_add(0x100));
        }
        h
    }

    fn last(a: &[u32], b: &[u32]) -> u32 {
        *b.last().or(a.last()).expect("non-empty context")
    }

    /// Logits of the token after `a ++ b`.
    pub fn logits(&self, a: &[u32], b: &[u32], out: &mut [f32]) {
        let h = self.context_hash(a, b);
        let last = Self::last(a, b);
        let succ = (mix(u64::from(last) ^ self.salt.rotate_left(17)) % self.vocab as u64) as usize;
        let strong = !mix(h ^ 0xabcd).is_multiple_of(self.weak_every);
        for (y, o) in out.iter_mut().enumerate() {
            let n = unit(mix(h ^ (y as u64).wrapping_mul(0x9e37_79b9))) as f32;
            *o = self.noise * n + if strong && y == succ { self.peak } else { 0.0 };
        }
    }

    /// Argmax (lowest index on ties) of the logits after `ctx`.
    pub fn greedy_next(&self, ctx: &[u32]) -> u32 {
        let mut l = vec![0f32; self.vocab];
        self.logits(ctx, &[], &mut l);
        argmax(&l) as u32
    }

    /// Softmax of the logits after `ctx` at temperature `t`, in f64.
    pub fn probs(&self, ctx: &[u32], t: f64) -> Vec<f64> {
        let mut l = vec![0f32; self.vocab];
        self.logits(ctx, &[], &mut l);
        softmax64(&l, t)
    }
}

pub fn argmax(l: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best
}

pub fn softmax64(l: &[f32], t: f64) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = l.iter().map(|&x| ((x as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// The reference: greedy decoding straight from the mock, with the decoder's stop rules.
pub fn reference_greedy(lm: &MockLm, prompt: &[u32], max_len: usize, eos: &[u32]) -> Vec<u32> {
    let mut s = prompt.to_vec();
    while s.len() < max_len {
        let t = lm.greedy_next(&s);
        s.push(t);
        if eos.contains(&t) {
            break;
        }
    }
    s[prompt.len()..].to_vec()
}

impl SingleQueryModel for MockLm {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn next_logits(&mut self, queries: &[Query<'_>], out: &mut [f32]) -> Result<(), ModelError> {
        for (q, row) in queries.iter().zip(out.chunks_exact_mut(self.vocab)) {
            self.logits(q.tokens, q.drafts, row);
        }
        Ok(())
    }
}

/// One sequence of the mock with a "KV cache": the tokens it was fed. Its logits come from the
/// cache, not from what the decoder believes, so a missed rollback changes the output.
#[derive(Clone, Debug)]
pub struct MockSeq {
    pub lm: MockLm,
    pub cache: Vec<u32>,
    pub forward_calls: usize,
}

impl MockSeq {
    pub fn new(lm: MockLm) -> Self {
        MockSeq {
            lm,
            cache: Vec::new(),
            forward_calls: 0,
        }
    }
}

impl SequenceModel for MockSeq {
    fn vocab_size(&self) -> usize {
        self.lm.vocab
    }
    fn len(&self) -> usize {
        self.cache.len()
    }
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.forward_calls += 1;
        let v = self.lm.vocab;
        let mut out = vec![0f32; tokens.len() * v];
        for (j, &t) in tokens.iter().enumerate() {
            self.cache.push(t);
            self.lm
                .logits(&self.cache, &[], &mut out[j * v..(j + 1) * v]);
        }
        Ok(out)
    }
    fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        if len > self.cache.len() {
            return Err(
                format!("truncate to {len} but the cache holds {}", self.cache.len()).into(),
            );
        }
        self.cache.truncate(len);
        Ok(())
    }
}

/// A draft model: the target's logits plus its own hash noise. Greedy (`OneHot`) or sampling
/// from its distribution (`Probs`, `Logits`) with a hash keyed by (request seed, position).
#[derive(Clone, Debug)]
pub struct MockDraft {
    pub target: MockLm,
    pub noise: f32,
    pub kind: RowKind,
    pub salt: u64,
    pub calls: usize,
    logits: Vec<f32>,
    ext: Vec<u32>,
    toks: Vec<u32>,
    rows: Vec<f32>,
}

impl MockDraft {
    pub fn new(target: MockLm, noise: f32, kind: RowKind) -> Self {
        MockDraft {
            target,
            noise,
            kind,
            salt: 0xd4af7,
            calls: 0,
            logits: vec![0.0; target.vocab],
            ext: Vec::new(),
            toks: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// The draft's logits after `ctx`.
    pub fn draft_logits(&self, ctx: &[u32], out: &mut [f32]) {
        self.target.logits(ctx, &[], out);
        let h = self.target.context_hash(ctx, &[]) ^ self.salt;
        for (y, o) in out.iter_mut().enumerate() {
            *o += self.noise * (unit(mix(h ^ (y as u64 + 7).wrapping_mul(0x51_7cc1))) as f32 - 0.5);
        }
    }
}

impl DraftModel for MockDraft {
    fn row_kind(&self) -> RowKind {
        self.kind
    }
    fn vocab_size(&self) -> usize {
        self.target.vocab
    }
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        caps: &[usize],
        out: &mut Proposals,
    ) -> Result<(), ModelError> {
        self.calls += 1;
        let v = self.target.vocab;
        let mut logits = std::mem::take(&mut self.logits);
        for (s, &cap) in seqs.iter().zip(caps) {
            self.ext.clear();
            self.ext.extend_from_slice(s.tokens);
            self.toks.clear();
            self.rows.clear();
            let t = f64::from(s.params.temperature);
            for _ in 0..cap {
                self.draft_logits(&self.ext, &mut logits);
                let tok = if self.kind == RowKind::OneHot || t == 0.0 {
                    argmax(&logits)
                } else {
                    let q = softmax64(&logits, t);
                    let pos = self.ext.len() as u64;
                    let seed = s.params.seed.unwrap_or(0);
                    let u = unit(mix(mix(seed ^ self.salt) ^ pos));
                    let mut acc = 0.0;
                    let mut pick = v - 1;
                    for (y, &p) in q.iter().enumerate() {
                        acc += p;
                        if u < acc {
                            pick = y;
                            break;
                        }
                    }
                    pick
                };
                match self.kind {
                    RowKind::OneHot => {}
                    RowKind::Probs => {
                        let q = softmax64(&logits, if t == 0.0 { 1.0 } else { t });
                        self.rows.extend(q.iter().map(|&x| x as f32));
                    }
                    RowKind::Logits => self.rows.extend_from_slice(&logits),
                }
                self.toks.push(tok as u32);
                self.ext.push(tok as u32);
            }
            out.push(&self.toks, &self.rows)?;
        }
        self.logits = logits;
        Ok(())
    }
}

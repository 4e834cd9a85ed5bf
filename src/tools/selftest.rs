//! The statistical self-test behind `specdec selftest`: exact cases, distribution checks for each
//! rule (both halves of SPEC §4 by χ² at an exact quantile, and the acceptance rate), seeded
//! replay, batch invariance, and GPU-vs-CPU-twin agreement, on the verifier under test.

use crate::tools::stats::{binomial_z, chi_square_gof};
use crate::{
    Draft, Logits, Request, Rule, SamplingParams, Status, Verifier, VerifierOptions, VerifyBatch,
    VerifyOutput,
};
use rand_pcg::rand_core::{Rng, SeedableRng};
use std::time::Instant;

/// How much work each distribution check does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// ~20k trials per distribution check (seconds on a laptop GPU).
    Quick,
    /// ~100k trials (about a minute on a laptop GPU).
    Normal,
    /// ~500k trials.
    Thorough,
}

impl Size {
    fn trials(self) -> usize {
        match self {
            Size::Quick => 20_000,
            Size::Normal => 100_000,
            Size::Thorough => 500_000,
        }
    }
}

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct CheckResult {
    /// Check name, e.g. `dist.draft_probs`.
    pub name: &'static str,
    /// Whether it passed.
    pub passed: bool,
    /// What was measured.
    pub detail: String,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Significance of each χ² test of the self-test.
pub const ALPHA: f64 = 1e-6;

/// The names of the checks, in the order they run.
pub const CHECKS: [&str; 11] = [
    "exact.greedy_paths",
    "exact.forced_outcomes",
    "exact.minus_one_drafts",
    "exact.zero_draft_neighbours",
    "exact.non_finite_rows",
    "dist.one_hot",
    "dist.draft_probs",
    "dist.draft_logits",
    "replay.seeded",
    "invariance.batch",
    "twin.gpu_vs_cpu",
];

/// Runs every check on `v`, calling `progress(index, name)` before each.
pub fn run(v: &Verifier, size: Size, mut progress: impl FnMut(usize, &str)) -> Vec<CheckResult> {
    CHECKS
        .iter()
        .enumerate()
        .map(|(i, &name)| {
            progress(i, name);
            let t0 = Instant::now();
            let (passed, detail) = match run_one(v, name, size) {
                Ok(d) => (true, d),
                Err(d) => (false, d),
            };
            CheckResult {
                name,
                passed,
                detail,
                seconds: t0.elapsed().as_secs_f64(),
            }
        })
        .collect()
}

type Check = Result<String, String>;

fn run_one(v: &Verifier, name: &str, size: Size) -> Check {
    match name {
        "exact.greedy_paths" => greedy_paths(v),
        "exact.forced_outcomes" => forced_outcomes(v),
        "exact.minus_one_drafts" => minus_one(v),
        "exact.zero_draft_neighbours" => zero_draft_neighbours(v),
        "exact.non_finite_rows" => non_finite(v),
        "dist.one_hot" => distribution(v, 0, size),
        "dist.draft_probs" => distribution(v, 1, size),
        "dist.draft_logits" => distribution(v, 2, size),
        "replay.seeded" => replay(v),
        "invariance.batch" => invariance(v),
        "twin.gpu_vs_cpu" => twin(v),
        other => Err(format!("unknown check {other}")),
    }
}

/// An owned batch.
struct Owned {
    vocab: u32,
    requests: Vec<Request>,
    drafts: Vec<i32>,
    target: Vec<f32>,
    kind: u8,
    draft: Vec<f32>,
    rates: Option<Vec<f32>>,
}

impl Owned {
    fn new(vocab: u32) -> Owned {
        Owned {
            vocab,
            requests: Vec::new(),
            drafts: Vec::new(),
            target: Vec::new(),
            kind: 0,
            draft: Vec::new(),
            rates: None,
        }
    }
    fn push(&mut self, params: SamplingParams, position: u64, drafts: &[i32], rows: &[Vec<f32>]) {
        self.requests.push(Request {
            num_drafts: drafts.len() as u32,
            params,
            position,
        });
        self.drafts.extend_from_slice(drafts);
        for r in rows {
            self.target.extend_from_slice(r);
        }
    }
    fn batch(&self) -> VerifyBatch<'_> {
        VerifyBatch {
            vocab_size: self.vocab,
            requests: &self.requests,
            draft_token_ids: &self.drafts,
            target_logits: Logits::F32(&self.target),
            draft: match self.kind {
                0 => Draft::OneHot,
                1 => Draft::Probs(Logits::F32(&self.draft)),
                _ => Draft::Logits(Logits::F32(&self.draft)),
            },
            draft_vocab_size: None,
            synthetic_rates: self.rates.as_deref(),
        }
    }
    fn verify(&self, v: &Verifier) -> Result<VerifyOutput, String> {
        v.verify_blocking(&self.batch()).map_err(|e| e.to_string())
    }
}

fn row(vocab: usize, rest: f32, set: &[(usize, f32)]) -> Vec<f32> {
    let mut r = vec![rest; vocab];
    for &(i, x) in set {
        r[i] = x;
    }
    r
}

fn expect(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

fn greedy_paths(v: &Verifier) -> Check {
    let rows = [
        row(10, 0.0, &[(3, 5.0)]),
        row(10, 0.0, &[(7, 5.0)]),
        row(10, 0.0, &[(1, 5.0)]),
        row(10, 0.0, &[(9, 5.0)]),
    ];
    let mut b = Owned::new(10);
    for (i, d) in [[3, 7, 1], [3, 7, 2], [4, 7, 1], [3, 0, 1]]
        .iter()
        .enumerate()
    {
        b.push(SamplingParams::greedy(), i as u64, d, &rows);
    }
    let out = b.verify(v)?;
    let want: [&[i32]; 4] = [&[3, 7, 1, 9], &[3, 7, 1], &[3], &[3, 7]];
    for (r, w) in want.iter().enumerate() {
        expect(out.emitted(r) == *w, || {
            format!("request {r}: emitted {:?}, expected {w:?}", out.emitted(r))
        })?;
    }
    Ok("all-accepted+bonus, last/first/middle rejected: exact".into())
}

fn forced_outcomes(v: &Verifier) -> Check {
    // Certain targets (p = 1 on one token): a draft of it is accepted, any other is rejected
    // and resampled to it. Synthetic rates 1 and 0 force accept and reject.
    let certain = |t: usize| row(8, f32::NEG_INFINITY, &[(t, 1.5)]);
    let mut b = Owned::new(8);
    for s in 0..32 {
        b.push(
            SamplingParams::seeded(1.0, s),
            s,
            &[4, 6],
            &[certain(4), certain(1), certain(7)],
        );
    }
    let out = b.verify(v)?;
    for r in 0..32 {
        expect(out.emitted(r) == [4, 1], || {
            format!("certain targets: request {r} emitted {:?}", out.emitted(r))
        })?;
    }
    let mut s = Owned::new(8);
    let free = row(8, 0.0, &[]);
    for i in 0..4u64 {
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(i),
            rule: Rule::Synthetic,
            ..SamplingParams::default()
        };
        s.push(
            params,
            i,
            &[1, 2, 3],
            &[free.clone(), free.clone(), free.clone(), free.clone()],
        );
    }
    s.rates = Some(vec![
        1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0,
    ]);
    let out = s.verify(v)?;
    expect(out.num_emitted == [4, 1, 2, 3], || {
        format!("synthetic rates 1/0: emitted counts {:?}", out.num_emitted)
    })?;
    Ok("certain targets and synthetic rates 0/1: exact".into())
}

fn minus_one(v: &Verifier) -> Check {
    let rows = [
        row(6, f32::NEG_INFINITY, &[(2, 0.0)]),
        row(6, f32::NEG_INFINITY, &[(2, 0.0)]),
    ];
    let mut b = Owned::new(6);
    b.push(SamplingParams::greedy(), 0, &[-1], &rows);
    b.push(SamplingParams::seeded(1.0, 5), 1, &[-1], &rows);
    let out = b.verify(v)?;
    expect(out.emitted(0) == [2] && out.emitted(1) == [2], || {
        format!(
            "-1 drafts: emitted {:?} / {:?}",
            out.emitted(0),
            out.emitted(1)
        )
    })?;
    Ok("-1 drafts rejected, token resampled from p".into())
}

fn zero_draft_neighbours(v: &Verifier) -> Check {
    let mut g = rand_pcg::Pcg64::seed_from_u64(3);
    let mut b = Owned::new(40);
    for &k in &[0usize, 64, 0, 5] {
        let rows: Vec<Vec<f32>> = (0..=k).map(|_| normals(&mut g, 40, 2.0)).collect();
        let drafts: Vec<i32> = rows[..k].iter().map(|r| argmax(r) as i32).collect();
        b.push(SamplingParams::greedy(), k as u64, &drafts, &rows);
    }
    let out = b.verify(v)?;
    expect(out.num_emitted == [1, 65, 1, 6], || {
        format!(
            "emitted counts {:?}, expected [1, 65, 1, 6]",
            out.num_emitted
        )
    })?;
    expect(out.tokens[1..65].iter().all(|&t| t == -1), || {
        "padding of a 0-draft request is not -1".into()
    })?;
    Ok("0-draft requests beside a 64-draft one: exact".into())
}

fn non_finite(v: &Verifier) -> Check {
    let nan = row(7, 0.0, &[(1, f32::NAN), (5, 1.0)]);
    let mut b = Owned::new(7);
    b.push(
        SamplingParams::seeded(1.0, 1),
        0,
        &[2],
        &[row(7, f32::NEG_INFINITY, &[(2, 3.0)]), nan],
    );
    b.push(
        SamplingParams::seeded(1.0, 2),
        1,
        &[],
        &[row(7, 0.0, &[(6, f32::INFINITY)])],
    );
    b.push(
        SamplingParams::greedy(),
        2,
        &[],
        &[row(7, f32::NEG_INFINITY, &[])],
    );
    let out = b.verify(v)?;
    expect(
        out.emitted(0) == [2, 5] && out.status[0].contains(Status::TARGET_NONFINITE),
        || format!("NaN row: {:?} {}", out.emitted(0), out.status[0]),
    )?;
    expect(out.emitted(1) == [6], || {
        format!("+inf row: {:?}", out.emitted(1))
    })?;
    expect(
        out.emitted(2) == [0] && out.status[2] == Status::ALL_MASKED,
        || format!("all -inf row: {:?}", out.emitted(2)),
    )?;
    Ok("NaN / +inf / all -inf rows: status set, tokens in range".into())
}

fn normals(g: &mut rand_pcg::Pcg64, n: usize, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1 = ((g.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let u2 = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            (scale * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

fn argmax(r: &[f32]) -> usize {
    (0..r.len()).fold(0, |b, j| if r[j] > r[b] { j } else { b })
}

fn softmax(l: &[f32], t: f64) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = l.iter().map(|&x| ((x as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

fn sample(g: &mut rand_pcg::Pcg64, w: &[f64]) -> usize {
    let mut u = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    for (i, &x) in w.iter().enumerate() {
        if u < x {
            return i;
        }
        u -= x;
    }
    w.iter().rposition(|&x| x > 0.0).unwrap_or(0)
}

/// Both halves of SPEC §4 at draft position 0 (k = 1, V = 6, T = 0.8), χ² at [`ALPHA`], and the
/// acceptance rate within 6 standard errors of Σ min(p, q). `kind`: 0 one-hot, 1 probs, 2 logits.
pub fn distribution(v: &Verifier, kind: u8, size: Size) -> Check {
    let n = size.trials();
    let mut g = rand_pcg::Pcg64::seed_from_u64(40 + u64::from(kind));
    let vocab = 6usize;
    let t = 0.8f64;
    let target = normals(&mut g, vocab, 1.2);
    let bonus = normals(&mut g, vocab, 1.2);
    let dl = normals(&mut g, vocab, 1.2);
    let p = softmax(&target, t);
    let (q, draft_row): (Vec<f64>, Vec<f32>) = match kind {
        0 => {
            // One-hot at the second most likely token, so rejections are common.
            let mut idx: Vec<usize> = (0..vocab).collect();
            idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            (
                (0..vocab).map(|y| f64::from(y == idx[1])).collect(),
                Vec::new(),
            )
        }
        1 => {
            let q = softmax(&dl, 1.0);
            (q.clone(), q.iter().map(|&x| x as f32).collect())
        }
        _ => (softmax(&dl, t), dl.clone()),
    };
    let mut cells = vec![0u64; 2 * vocab];
    let mut accepted = 0u64;
    let mut done = 0usize;
    while done < n {
        let r = 8192.min(n - done);
        let mut b = Owned::new(vocab as u32);
        b.kind = kind;
        for _ in 0..r {
            let d = sample(&mut g, &q) as i32;
            b.push(
                SamplingParams::seeded(t as f32, g.next_u64()),
                g.next_u64() % 1_000_000,
                &[d],
                &[target.clone(), bonus.clone()],
            );
            b.draft.extend_from_slice(&draft_row);
        }
        let out = b.verify(v)?;
        for i in 0..r {
            let e = out.emitted(i);
            let y = e[0] as usize;
            if y >= vocab {
                return Err(format!("token {y} outside the vocabulary"));
            }
            if e.len() == 2 {
                accepted += 1;
                cells[y] += 1;
            } else {
                cells[vocab + y] += 1;
            }
        }
        done += r;
    }
    let mut expected: Vec<f64> = (0..vocab).map(|y| p[y].min(q[y])).collect();
    expected.extend((0..vocab).map(|y| (p[y] - q[y]).max(0.0)));
    let halves = chi_square_gof(&cells, &expected, ALPHA);
    let beta: f64 = (0..vocab).map(|y| p[y].min(q[y])).sum();
    let z = binomial_z(accepted, n as u64, beta);
    let detail = format!(
        "{n} trials: halves χ² {:.1} ≤ {:.1} (df {}), acceptance {:.4} vs {:.4} (z {:.2})",
        halves.statistic,
        halves.threshold,
        halves.df,
        accepted as f64 / n as f64,
        beta,
        z
    );
    if halves.passed() && z.abs() <= 6.0 {
        Ok(detail)
    } else {
        Err(detail)
    }
}

fn random_batch(seed: u64, vocab: usize, ks: &[u32], kind: u8) -> Owned {
    let mut g = rand_pcg::Pcg64::seed_from_u64(seed);
    let mut b = Owned::new(vocab as u32);
    b.kind = kind;
    for (r, &k) in ks.iter().enumerate() {
        let rows: Vec<Vec<f32>> = (0..=k).map(|_| normals(&mut g, vocab, 2.0)).collect();
        let drafts: Vec<i32> = rows[..k as usize]
            .iter()
            .map(|row| {
                if g.next_u64() % 10 < 7 {
                    argmax(row) as i32
                } else {
                    (g.next_u64() % vocab as u64) as i32
                }
            })
            .collect();
        let t = [0.0, 1.0, 0.7, 1.3][r % 4];
        b.push(
            SamplingParams::seeded(t, g.next_u64()),
            g.next_u64() % 100_000,
            &drafts,
            &rows,
        );
        for _ in 0..k {
            let l = normals(&mut g, vocab, 2.0);
            match kind {
                1 => b.draft.extend(softmax(&l, 1.0).iter().map(|&x| x as f32)),
                2 => b.draft.extend(l),
                _ => {}
            }
        }
    }
    b
}

fn replay(v: &Verifier) -> Check {
    for kind in 0..3 {
        let b = random_batch(7 + u64::from(kind), 3000, &[3, 0, 5, 2, 4, 1], kind);
        let (a, c) = (b.verify(v)?, b.verify(v)?);
        expect(a == c, || {
            format!("draft kind {kind}: two runs with the same seeds differ")
        })?;
    }
    Ok("same seeds, same tokens (3 draft kinds)".into())
}

fn invariance(v: &Verifier) -> Check {
    let b = random_batch(11, 2000, &[3, 0, 5, 2, 4, 1], 2);
    let full = b.verify(v)?;
    // Each request alone, and the batch reversed.
    let v_ = b.vocab as usize;
    let (mut row0, mut d0) = (0usize, 0usize);
    let mut rev = Owned::new(b.vocab);
    rev.kind = b.kind;
    let mut parts = Vec::new();
    for req in &b.requests {
        let k = req.num_drafts as usize;
        let mut one = Owned::new(b.vocab);
        one.kind = b.kind;
        one.requests.push(*req);
        one.drafts.extend_from_slice(&b.drafts[d0..d0 + k]);
        one.target
            .extend_from_slice(&b.target[row0 * v_..(row0 + k + 1) * v_]);
        one.draft
            .extend_from_slice(&b.draft[d0 * v_..(d0 + k) * v_]);
        parts.push(one);
        row0 += k + 1;
        d0 += k;
    }
    for (r, one) in parts.iter().enumerate() {
        let alone = one.verify(v)?;
        expect(alone.emitted(0) == full.emitted(r), || {
            format!("request {r} alone differs from the batch")
        })?;
    }
    for one in parts.iter().rev() {
        rev.requests.extend(&one.requests);
        rev.drafts.extend(&one.drafts);
        rev.target.extend(&one.target);
        rev.draft.extend(&one.draft);
    }
    let out = rev.verify(v)?;
    let n = parts.len();
    for r in 0..n {
        expect(out.emitted(n - 1 - r) == full.emitted(r), || {
            format!("request {r} differs when the batch is reversed")
        })?;
    }
    Ok(format!("{n} requests alone and reversed: identical tokens"))
}

fn twin(v: &Verifier) -> Check {
    if !v.is_gpu() {
        return Ok("skipped: the verifier under test is the CPU twin itself".into());
    }
    let cpu = Verifier::cpu(VerifierOptions::default());
    let (mut total, mut differ) = (0usize, 0usize);
    for round in 0..6u64 {
        let kind = (round % 3) as u8;
        let b = random_batch(
            100 + round,
            [1000, 32000, 5003][round as usize % 3],
            &[0, 1, 2, 3, 4, 5, 6, 7],
            kind,
        );
        let (a, c) = (b.verify(v)?, b.verify(&cpu)?);
        for r in 0..b.requests.len() {
            total += 1;
            if a.emitted(r) != c.emitted(r) {
                if b.requests[r].params.temperature == 0.0 {
                    return Err(format!(
                        "greedy request {r} of round {round} differs from the CPU twin"
                    ));
                }
                differ += 1;
            }
        }
    }
    let detail = format!("{differ} of {total} requests differ (greedy: all identical)");
    if differ * 100 <= total {
        Ok(detail)
    } else {
        Err(detail)
    }
}

/// The results as JSON (no dependency: a handful of fields, strings escaped by hand).
pub fn to_json(adapter: &str, results: &[CheckResult]) -> String {
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let checks: Vec<String> = results
        .iter()
        .map(|r| {
            format!(
                "{{\"name\":\"{}\",\"passed\":{},\"seconds\":{:.3},\"detail\":\"{}\"}}",
                r.name,
                r.passed,
                r.seconds,
                esc(&r.detail)
            )
        })
        .collect();
    format!(
        "{{\"adapter\":\"{}\",\"passed\":{},\"checks\":[{}]}}",
        esc(adapter),
        results.iter().all(|r| r.passed),
        checks.join(",")
    )
}

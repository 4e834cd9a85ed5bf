//! Tree verification (`specdec::tree`): the bad-input catalogue, greedy oracles, equality with
//! the chain verifier on trees that are chains, and exactness by χ² on the first two emitted
//! tokens jointly, against target sampling, for random trees with and without a draft
//! distribution, each beside a negative control (a deliberately wrong sampler) the same test
//! rejects.

mod common;
use common::*;
use specdec::tools::stats::chi_square_gof;
use specdec::tree::{
    verify_on_cpu, verify_on_cpu_with_fault, TreeBatch, TreeDefect, TreeFault, TreeNode,
    TreeOutput, TreeRequest,
};
use specdec::{Draft, Dtype, Error, GpuDraft, GpuRows, GpuTreeBatch, Logits, Request, Rule};
use specdec::{SamplingParams, Status, VerifyBatch};

/// Significance of every χ² test: a correct sampler fails one with probability 1e-6.
const ALPHA: f64 = 1e-6;

fn node(token: i32, parent: i32) -> TreeNode {
    TreeNode { token, parent }
}

/// A one-request batch over `logits` (rows of `vocab`) with children given without q.
fn one(vocab: u32, nodes: &[TreeNode], params: SamplingParams, logits: &[f32]) -> TreeOutput {
    let req = [TreeRequest {
        nodes,
        params,
        position: 5,
    }];
    verify_on_cpu(
        &TreeBatch {
            vocab_size: vocab,
            requests: &req,
            target_logits: logits.into(),
            draft: Draft::OneHot,
            draft_vocab_size: None,
        },
        1,
    )
    .unwrap()
}

fn defect_of(vocab: u32, nodes: &[TreeNode], params: SamplingParams) -> Error {
    let req = [TreeRequest {
        nodes,
        params,
        position: 0,
    }];
    let logits = vec![0.0f32; (nodes.len() + 1) * vocab as usize];
    verify_on_cpu(
        &TreeBatch {
            vocab_size: vocab,
            requests: &req,
            target_logits: (&logits).into(),
            draft: Draft::OneHot,
            draft_vocab_size: None,
        },
        1,
    )
    .unwrap_err()
}

#[test]
fn malformed_trees_are_typed_errors() {
    let t1 = SamplingParams::seeded(1.0, 1);
    let tree = |defect| Error::InvalidTree { request: 0, defect };
    let cases: Vec<(Vec<TreeNode>, SamplingParams, Error)> = vec![
        (
            vec![node(1, -1), node(2, 1)],
            t1,
            tree(TreeDefect::ParentNotBefore { node: 1, parent: 1 }),
        ),
        (
            vec![node(1, 1), node(2, 0)],
            t1,
            tree(TreeDefect::ParentNotBefore { node: 0, parent: 1 }),
        ),
        (
            vec![node(1, -2)],
            t1,
            tree(TreeDefect::ParentNotBefore {
                node: 0,
                parent: -2,
            }),
        ),
        (
            vec![node(1, -1), node(9, 0)],
            t1,
            tree(TreeDefect::TokenOutOfRange { node: 1, token: 9 }),
        ),
        (
            vec![node(-1, -1)],
            t1,
            tree(TreeDefect::TokenOutOfRange { node: 0, token: -1 }),
        ),
        (
            vec![node(1, -1), node(2, 0), node(1, -1)],
            t1,
            tree(TreeDefect::DuplicateSibling { node: 2, token: 1 }),
        ),
        (
            vec![node(1, -1)],
            SamplingParams {
                rule: Rule::Block,
                ..t1
            },
            tree(TreeDefect::UnsupportedRule),
        ),
        (
            (0..65).map(|i| node(1, i - 1)).collect(),
            t1,
            tree(TreeDefect::TooDeep {
                node: 64,
                depth: 65,
            }),
        ),
        (
            (0..1025).map(|_| node(1, -1)).collect(),
            SamplingParams::greedy(),
            tree(TreeDefect::TooManyNodes { nodes: 1025 }),
        ),
        (
            vec![node(1, -1)],
            SamplingParams::seeded(-1.0, 1),
            Error::InvalidTemperature {
                request: 0,
                temperature: -1.0,
            },
        ),
    ];
    for (nodes, params, want) in cases {
        let got = defect_of(8, &nodes, params);
        assert_eq!(got, want, "{} nodes", nodes.len());
        assert!(!got.to_string().is_empty());
    }
    // A depth of exactly 64 and 1024 nodes are fine; duplicate siblings are fine for greedy
    // requests (the first match is followed).
    let ok = |nodes: &[TreeNode], params| {
        let logits = vec![0.0f32; (nodes.len() + 1) * 8];
        one(8, nodes, params, &logits)
    };
    ok(&(0..64).map(|i| node(1, i - 1)).collect::<Vec<_>>(), t1);
    ok(
        &(0..1024)
            .map(|i| node(i % 8, i / 8 - 1))
            .collect::<Vec<_>>(),
        SamplingParams::greedy(),
    );
    ok(&[node(1, -1), node(1, -1)], SamplingParams::greedy());
}

#[test]
fn row_counts_are_checked() {
    let nodes = [node(1, -1), node(2, -1), node(3, 0)];
    let req = [TreeRequest {
        nodes: &nodes,
        params: SamplingParams::seeded(1.0, 3),
        position: 0,
    }];
    let target = vec![0.0f32; 4 * 8];
    let batch = |target: &[f32], q: &[f32]| {
        verify_on_cpu(
            &TreeBatch {
                vocab_size: 8,
                requests: &req,
                target_logits: target.into(),
                draft: Draft::Probs(q.into()),
                draft_vocab_size: None,
            },
            1,
        )
    };
    // Two expanding slots (the root and node 0): two q rows.
    assert!(batch(&target, &[0.125f32; 16]).is_ok());
    assert!(matches!(
        batch(&target, &[0.125f32; 24]),
        Err(Error::DraftRowCount {
            expected_rows: 2,
            got_elements: 24,
            ..
        })
    ));
    assert!(matches!(
        batch(&target[..24], &[0.125f32; 16]),
        Err(Error::TargetRowCount {
            expected_rows: 4,
            ..
        })
    ));
}

/// Rows of `vocab` logits, each with one `high` entry (the argmax) and `low` elsewhere.
fn peaked(vocab: usize, argmaxes: &[usize]) -> Vec<f32> {
    argmaxes
        .iter()
        .flat_map(|&a| (0..vocab).map(move |y| if y == a { 3.0 } else { 0.0 }))
        .collect()
}

#[test]
fn greedy_follows_the_argmax_path() {
    // root ─┬─ n0 (tok 2) ─┬─ n2 (tok 5) ── n4 (tok 1)
    //       │              └─ n3 (tok 4)
    //       └─ n1 (tok 3) ── n5 (tok 6)
    let nodes = [
        node(2, -1),
        node(3, -1),
        node(5, 0),
        node(4, 0),
        node(1, 2),
        node(6, 1),
    ];
    let g = SamplingParams::greedy();
    // Argmaxes: root → 3 (n1), n1 → 6 (n5), n5 → 7 (leaf: bonus).
    let out = one(8, &nodes, g, &peaked(8, &[3, 0, 6, 0, 0, 0, 7]));
    assert_eq!(out.requests[0].accepted_nodes, vec![1, 5]);
    assert_eq!(out.requests[0].tokens, vec![3, 6, 7]);
    assert_eq!(out.requests[0].status, Status::OK);
    // Argmaxes: root → 2 (n0), n0 → 4 (n3), n3 → 0 (leaf).
    let out = one(8, &nodes, g, &peaked(8, &[2, 4, 0, 0, 0, 0, 0]));
    assert_eq!(out.requests[0].accepted_nodes, vec![0, 3]);
    assert_eq!(out.requests[0].tokens, vec![2, 4, 0]);
    // No child matches at n0 (argmax 7): emit it there.
    let out = one(8, &nodes, g, &peaked(8, &[2, 7, 0, 0, 0, 0, 0]));
    assert_eq!(out.requests[0].accepted_nodes, vec![0]);
    assert_eq!(out.requests[0].tokens, vec![2, 7]);
    // Ties go to the lowest id: root row all equal → argmax 0, no child 0: emit 0.
    let out = one(8, &nodes, g, &[0.0f32; 7 * 8]);
    assert_eq!(out.requests[0].tokens, vec![0]);
    assert!(out.requests[0].accepted_nodes.is_empty());
    // A NaN on the path stops there with its status.
    let mut rows = peaked(8, &[3, 0, 6, 0, 0, 0, 7]);
    rows[2 * 8 + 1] = f32::NAN;
    let out = one(8, &nodes, g, &rows);
    assert_eq!(out.requests[0].accepted_nodes, vec![1]);
    assert!(out.requests[0].status.contains(Status::TARGET_NONFINITE));
}

/// A chain request and the same drafts as a tree: tokens, counts, statuses and logprobs must
/// be the chain verifier's, bit for bit.
#[test]
fn a_chain_tree_verifies_as_the_chain_verifier() {
    let chain = cpu();
    let vocab = 40usize;
    let mut g = Gen::new(17);
    let mut compared = 0;
    for case in 0..240 {
        let mode = case % 3;
        let k = g.below(6);
        let temperature = [0.0f32, 1.0, 0.7][(case / 3) % 3];
        let controls = [
            Controls::OFF,
            Controls {
                top_k: 5,
                top_p: 0.9,
                min_p: 0.0,
            },
            Controls {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.05,
            },
        ][(case / 9) % 3];
        let params = controls
            .apply(SamplingParams::seeded(temperature, g.u64()))
            .with_logprobs(case % 2 == 0);
        let mut target = g.logits((k + 1) * vocab, 2.0);
        if case % 37 == 5 {
            target[vocab * g.below(k + 1) + 3] = f32::NAN;
        }
        // Drafts mostly the row's argmax, so long acceptances happen too.
        let drafts: Vec<i32> = (0..k)
            .map(|i| {
                let row = &target[i * vocab..(i + 1) * vocab];
                if g.unit() < 0.6 {
                    (0..vocab)
                        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                        .unwrap() as i32
                } else {
                    g.below(vocab) as i32
                }
            })
            .collect();
        let q: Vec<f32> = match mode {
            1 => (0..k)
                .flat_map(|_| {
                    let w: Vec<f64> = (0..vocab).map(|_| g.unit() + 0.01).collect();
                    let s: f64 = w.iter().sum();
                    w.into_iter().map(move |x| (x / s) as f32)
                })
                .collect(),
            2 => g.logits(k * vocab, 2.0),
            _ => Vec::new(),
        };
        let draft = match mode {
            1 => Draft::Probs(Logits::from(&q)),
            2 => Draft::Logits(Logits::from(&q)),
            _ => Draft::OneHot,
        };
        let position = g.u64() >> 20;
        let want = chain
            .verify_blocking(&VerifyBatch {
                vocab_size: vocab as u32,
                requests: &[Request {
                    num_drafts: k as u32,
                    params,
                    position,
                }],
                draft_token_ids: &drafts,
                target_logits: (&target).into(),
                draft,
                draft_vocab_size: None,
                synthetic_rates: None,
            })
            .unwrap();
        let nodes: Vec<TreeNode> = drafts
            .iter()
            .enumerate()
            .map(|(i, &t)| node(t, i as i32 - 1))
            .collect();
        let got = verify_on_cpu(
            &TreeBatch {
                vocab_size: vocab as u32,
                requests: &[TreeRequest {
                    nodes: &nodes,
                    params,
                    position,
                }],
                target_logits: (&target).into(),
                draft,
                draft_vocab_size: None,
            },
            1,
        )
        .unwrap();
        let v = &got.requests[0];
        let tag = format!("case {case} mode {mode} k {k} T {temperature} {controls:?}");
        assert_eq!(v.tokens, want.emitted(0), "{tag}");
        assert_eq!(v.status, want.status[0], "{tag}");
        assert_eq!(v.seed, want.seeds[0], "{tag}");
        let n = v.tokens.len();
        assert_eq!(
            v.accepted_nodes,
            (0..n as u32 - 1).collect::<Vec<_>>(),
            "{tag}"
        );
        if params.logprobs {
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(v.logprobs.as_ref().unwrap()),
                bits(want.emitted_logprobs(0).unwrap()),
                "{tag}"
            );
        } else {
            assert!(v.logprobs.is_none());
        }
        compared += 1;
    }
    assert_eq!(compared, 240);
}

/// Vocabulary of the χ² problems: 25 joint cells for the first two tokens.
const V: usize = 5;

/// A deterministic "model": the logits after `prefix`, from a hash of it (`salt` picks the
/// model), so every node of every tree sees the target's own conditional distribution.
fn model_logits(prefix: &[i32], salt: u64, scale: f64) -> Vec<f32> {
    let seed = prefix
        .iter()
        .fold(salt.wrapping_mul(0x9E37_79B9_7F4A_7C15), |h, &t| {
            (h ^ (t as u64 + 1))
                .wrapping_mul(0xBF58_476D_1CE4_E5B9)
                .rotate_left(29)
        });
    Gen::new(seed).logits(V, scale)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum QMode {
    /// Children given without a distribution (distinct tokens).
    None,
    /// Children drawn i.i.d. from draft probabilities.
    Probs,
    /// Children drawn i.i.d. from the processed draft logits.
    Logits,
}

/// One χ² problem: how trees are drafted and how the target samples.
#[derive(Clone, Copy, Debug)]
struct Problem {
    mode: QMode,
    temperature: f32,
    controls: Controls,
}

impl Problem {
    fn params(&self, seed: u64) -> SamplingParams {
        self.controls
            .apply(SamplingParams::seeded(self.temperature, seed))
    }
    fn target(&self, prefix: &[i32]) -> Vec<f32> {
        model_logits(prefix, 1, 1.2)
    }
    /// The draft logits: the target's plus noise, so drafts are often but not always right.
    fn draft_logits(&self, prefix: &[i32]) -> Vec<f32> {
        let noise = model_logits(prefix, 2, 1.0);
        self.target(prefix)
            .iter()
            .zip(noise)
            .map(|(t, n)| t + n)
            .collect()
    }
    /// The target's processed distribution after `prefix`.
    fn p(&self, prefix: &[i32]) -> Vec<f64> {
        processed(
            &self.target(prefix),
            f64::from(self.temperature),
            self.controls,
        )
    }
    /// The q row given to the verifier after `prefix`, and the distribution children are
    /// drawn from.
    fn q(&self, prefix: &[i32]) -> (Vec<f32>, Vec<f64>) {
        let l = self.draft_logits(prefix);
        match self.mode {
            QMode::Logits => {
                let dist = processed(&l, f64::from(self.temperature), self.controls);
                (l, dist)
            }
            _ => {
                let dist = softmax(&l, 1.0);
                (dist.iter().map(|&x| x as f32).collect(), dist)
            }
        }
    }
}

/// One drafted tree: its nodes, target rows and q rows, in the batch layout.
struct Drafted {
    nodes: Vec<TreeNode>,
    target: Vec<f32>,
    q: Vec<f32>,
}

/// Drafts a random tree (depth 1–4, branching 1–4 per node, at most 24 nodes): children are
/// the draft's top tokens without q, else drawn i.i.d. from q at their parent.
fn draft_tree(pb: &Problem, g: &mut Gen) -> Drafted {
    let depth = 1 + g.below(4);
    let mut nodes: Vec<TreeNode> = Vec::new();
    let mut prefixes: Vec<Vec<i32>> = vec![Vec::new()]; // per slot
    let mut d = Drafted {
        nodes: Vec::new(),
        target: pb.target(&[]),
        q: Vec::new(),
    };
    // Breadth first: slot s's children are drafted when s is reached, so parents precede.
    let mut s = 0;
    while s < prefixes.len() {
        let prefix = prefixes[s].clone();
        if prefix.len() < depth && nodes.len() < 24 {
            let b = (1 + g.below(4)).min(24 - nodes.len());
            let (q_row, q_dist) = pb.q(&prefix);
            // Without q, a top-b tree: the draft's b most likely tokens, most likely first.
            let mut order: Vec<i32> = (0..V as i32).collect();
            order.sort_by(|&a, &c| q_dist[c as usize].total_cmp(&q_dist[a as usize]));
            for &top in &order[..b] {
                let token = match pb.mode {
                    QMode::None => top,
                    _ => g.sample(&q_dist) as i32,
                };
                nodes.push(node(token, s as i32 - 1));
                let mut p = prefix.clone();
                p.push(token);
                prefixes.push(p);
            }
            if pb.mode != QMode::None {
                d.q.extend(q_row);
            }
        }
        s += 1;
    }
    // Target rows in slot order (slot v + 1 is node v, and breadth-first order is node order).
    for p in &prefixes[1..] {
        d.target.extend(pb.target(p));
    }
    d.nodes = nodes;
    d
}

/// Joint counts of the first two emitted tokens over `trials` drafted trees, the second drawn
/// from the target when the verifier emitted one token only.
fn joint_counts(pb: &Problem, trials: usize, fault: TreeFault, seed: u64) -> Vec<u64> {
    let mut g = Gen::new(seed);
    let trees: Vec<Drafted> = (0..trials).map(|_| draft_tree(pb, &mut g)).collect();
    let requests: Vec<TreeRequest> = trees
        .iter()
        .enumerate()
        .map(|(i, t)| TreeRequest {
            nodes: &t.nodes,
            params: pb.params(seed ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D)),
            position: 1000 + i as u64 % 7,
        })
        .collect();
    let target: Vec<f32> = trees
        .iter()
        .flat_map(|t| t.target.iter().copied())
        .collect();
    let q: Vec<f32> = trees.iter().flat_map(|t| t.q.iter().copied()).collect();
    let draft = match pb.mode {
        QMode::None => Draft::OneHot,
        QMode::Probs => Draft::Probs(Logits::from(&q)),
        QMode::Logits => Draft::Logits(Logits::from(&q)),
    };
    let out = verify_on_cpu_with_fault(
        &TreeBatch {
            vocab_size: V as u32,
            requests: &requests,
            target_logits: (&target).into(),
            draft,
            draft_vocab_size: None,
        },
        2,
        fault,
    )
    .unwrap();
    let mut cells = vec![0u64; V * V];
    for (t, v) in trees.iter().zip(&out.requests) {
        assert!(v.status.is_ok(), "{:?}", v.status);
        // The accepted path is a path of the tree, and the emitted tokens are its tokens.
        let mut parent = -1;
        for (&a, &tok) in v.accepted_nodes.iter().zip(&v.tokens) {
            assert_eq!(t.nodes[a as usize].parent, parent);
            assert_eq!(t.nodes[a as usize].token, tok);
            parent = a as i32;
        }
        let first = v.tokens[0] as usize;
        let second = match v.tokens.get(1) {
            Some(&y) => y as usize,
            None => g.sample(&pb.p(&[first as i32])),
        };
        cells[first * V + second] += 1;
    }
    cells
}

/// The target's joint law of the first two tokens.
fn joint_expected(pb: &Problem) -> Vec<f64> {
    let p1 = pb.p(&[]);
    let mut e = vec![0.0; V * V];
    for y1 in 0..V {
        let p2 = pb.p(&[y1 as i32]);
        for y2 in 0..V {
            e[y1 * V + y2] = p1[y1] * p2[y2];
        }
    }
    e
}

fn chi_square(pb: &Problem, fault: TreeFault, seed: u64) -> specdec::tools::stats::GofOutcome {
    let cells = joint_counts(pb, 40_000, fault, seed);
    let gof = chi_square_gof(&cells, &joint_expected(pb), ALPHA);
    eprintln!(
        "{:?} T {} {:?}, fault {fault:?}: {gof}",
        pb.mode, pb.temperature, pb.controls
    );
    gof
}

const PLAIN: Problem = Problem {
    mode: QMode::None,
    temperature: 1.0,
    controls: Controls::OFF,
};
const DRAWN: Problem = Problem {
    mode: QMode::Probs,
    temperature: 1.0,
    controls: Controls::OFF,
};

#[test]
fn trees_without_q_emit_the_target_law() {
    let filtered = Problem {
        temperature: 0.8,
        controls: Controls {
            top_k: 4,
            top_p: 1.0,
            min_p: 0.0,
        },
        ..PLAIN
    };
    for (i, pb) in [PLAIN, filtered].iter().enumerate() {
        let gof = chi_square(pb, TreeFault::None, 11 + i as u64);
        assert!(gof.passed(), "{pb:?}: {gof}");
    }
    // Negative control: every sibling accepted with its unrenormalised p(c).
    let gof = chi_square(&PLAIN, TreeFault::NoSiblingRenormalisation, 11);
    assert!(!gof.passed(), "the control passed: {gof}");
}

#[test]
fn trees_drawn_from_q_emit_the_target_law() {
    let logits = Problem {
        mode: QMode::Logits,
        temperature: 0.7,
        controls: Controls {
            top_k: 0,
            top_p: 0.95,
            min_p: 0.05,
        },
    };
    for (i, pb) in [DRAWN, logits].iter().enumerate() {
        let gof = chi_square(pb, TreeFault::None, 21 + i as u64);
        assert!(gof.passed(), "{pb:?}: {gof}");
    }
    // Negative control: siblings tested against p instead of the residual.
    let gof = chi_square(&DRAWN, TreeFault::UnrenormalisedAccept, 21);
    assert!(!gof.passed(), "the control passed: {gof}");
}

/// Trees beat chains on what a target call yields: with the same drafter, a branching tree
/// accepts more tokens per call than its first-child chain (the tree contains that chain).
#[test]
fn trees_accept_more_than_their_first_chain() {
    let mut g = Gen::new(5);
    let trials = 4000;
    let trees: Vec<Drafted> = (0..trials).map(|_| draft_tree(&PLAIN, &mut g)).collect();
    let mean_emitted = |first_child_only: bool| {
        let mut total = 0usize;
        for (i, t) in trees.iter().enumerate() {
            // The first-child chain: node 0, its first child, and so on.
            let mut nodes = t.nodes.clone();
            let mut target = t.target.clone();
            if first_child_only {
                let mut keep = Vec::new();
                let mut parent = -1;
                while let Some(c) = t.nodes.iter().position(|n| n.parent == parent) {
                    keep.push(c);
                    parent = c as i32;
                }
                nodes = keep
                    .iter()
                    .enumerate()
                    .map(|(j, &c)| node(t.nodes[c].token, j as i32 - 1))
                    .collect();
                target = t.target[..V].to_vec();
                for &c in &keep {
                    target.extend_from_slice(&t.target[(c + 1) * V..(c + 2) * V]);
                }
            }
            let out = one(V as u32, &nodes, PLAIN.params(i as u64), &target);
            total += out.requests[0].num_emitted();
        }
        total as f64 / trials as f64
    };
    let (tree, chain) = (mean_emitted(false), mean_emitted(true));
    assert!(
        tree > chain + 0.1,
        "tree {tree:.3} vs chain {chain:.3} tokens per call"
    );
}

/// A random batch of trees (chains among them) with every draft kind's rows, for the GPU ==
/// CPU comparison: owned, so that one description serves both backends.
struct OwnedTrees {
    vocab: usize,
    nodes: Vec<Vec<TreeNode>>,
    params: Vec<SamplingParams>,
    target: Vec<f32>,
    q: Vec<f32>,
}

fn random_trees(g: &mut Gen, vocab: usize, mode: QMode, requests: usize) -> OwnedTrees {
    let mut t = OwnedTrees {
        vocab,
        nodes: Vec::new(),
        params: Vec::new(),
        target: Vec::new(),
        q: Vec::new(),
    };
    for r in 0..requests {
        let n = g.below(12);
        let mut nodes: Vec<TreeNode> = Vec::new();
        for v in 0..n {
            let parent = if r % 4 == 0 {
                v as i32 - 1
            } else {
                g.below(v + 1) as i32 - 1
            };
            // Distinct siblings for children without q: the next unused token among a few
            // likely ones (the rows make tokens 0..4 likely, so siblings hold most of the mass
            // and the later siblings' tests matter).
            let mut token = g.below(4) as i32;
            while mode == QMode::None
                && nodes.iter().any(|o| o.parent == parent && o.token == token)
            {
                token = (token + 1) % vocab as i32;
            }
            nodes.push(node(token, parent));
        }
        let temperature = [0.0f32, 1.0, 0.7, 1.3][r % 4];
        let controls = [
            Controls::OFF,
            Controls {
                top_k: 6,
                top_p: 0.9,
                min_p: 0.0,
            },
            Controls {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.02,
            },
        ][(r / 4) % 3];
        t.params.push(
            controls
                .apply(SamplingParams::seeded(temperature, g.u64()))
                .with_logprobs(r % 3 == 0),
        );
        for s in 0..=n {
            let mut row = g.logits(vocab, 1.0);
            for x in row.iter_mut().take(4) {
                *x += 4.0 + 0.5 * (vocab as f32).ln(); // tokens 0..4 likely at every vocabulary
            }
            if r % 23 == 7 && s == n / 2 {
                row[vocab / 3] = f32::NAN;
            }
            t.target.extend(row);
            let expands = nodes.iter().any(|o| o.parent == s as i32 - 1);
            if expands && mode != QMode::None {
                let mut ql = g.logits(vocab, 1.0);
                for x in ql.iter_mut().take(4) {
                    *x += 4.0 + 0.5 * (vocab as f32).ln();
                }
                if mode == QMode::Probs {
                    let p = softmax(&ql, 1.0);
                    t.q.extend(p.iter().map(|&x| x as f32));
                } else {
                    t.q.extend(ql);
                }
            }
        }
        t.nodes.push(nodes);
    }
    t
}

impl OwnedTrees {
    fn verify_with(&self, mode: QMode, f: impl Fn(&TreeBatch) -> TreeOutput) -> TreeOutput {
        self.with_batch(mode, f)
    }

    fn with_batch<T>(&self, mode: QMode, f: impl Fn(&TreeBatch) -> T) -> T {
        let requests: Vec<TreeRequest> = self
            .nodes
            .iter()
            .zip(&self.params)
            .enumerate()
            .map(|(i, (nodes, &params))| TreeRequest {
                nodes,
                params,
                position: 40 + i as u64,
            })
            .collect();
        let draft = match mode {
            QMode::None => Draft::OneHot,
            QMode::Probs => Draft::Probs(Logits::from(&self.q)),
            QMode::Logits => Draft::Logits(Logits::from(&self.q)),
        };
        f(&TreeBatch {
            vocab_size: self.vocab as u32,
            requests: &requests,
            target_logits: (&self.target).into(),
            draft,
            draft_vocab_size: None,
        })
    }
}

/// The GPU's tree verification equals the CPU's, bit for bit: tokens, accepted nodes, statuses,
/// seeds and logprobs, for every draft kind, temperatures 0 / 0.7 / 1 / 1.3, top-k with top-p,
/// min-p, NaN rows, chains among the trees, at a vocabulary of one chunk and of several (the
/// residual masses are summed chunk by chunk) and one not a multiple of 4.
#[test]
fn gpu_tree_verification_equals_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = Gen::new(99);
    let mut checked = 0;
    // Logprobs to f32 rounding of exp / log (as for chains); the rest exactly, except that on
    // a GPU whose exp / log differ from the CPU's by an ulp a decision within rounding of its
    // threshold may go the other way (common::twin_slack; none on llvmpipe).
    let close =
        |a: &Option<Vec<f32>>, b: &Option<Vec<f32>>| logprobs_close(a.as_deref(), b.as_deref());
    let (slack, _) = twin_slack(gpu);
    let mut differing = Vec::new();
    for &vocab in &[64usize, 5003, 9000] {
        for mode in [QMode::None, QMode::Probs, QMode::Logits] {
            let trees = random_trees(&mut g, vocab, mode, 48);
            let want = trees.verify_with(mode, |b| verify_on_cpu(b, 2).unwrap());
            let got = trees.verify_with(mode, |b| gpu.verify_tree_blocking(b).unwrap());
            for (r, (w, o)) in want.requests.iter().zip(&got.requests).enumerate() {
                let same = (&w.tokens, &w.accepted_nodes, w.status, w.seed)
                    == (&o.tokens, &o.accepted_nodes, o.status, o.seed)
                    && close(&w.logprobs, &o.logprobs)
                    && close(&w.raw_logprobs, &o.raw_logprobs);
                if !same {
                    differing.push(format!(
                        "vocab {vocab} {mode:?} request {r} {:?}: cpu {w:?}, gpu {o:?}",
                        trees.nodes[r]
                    ));
                }
                checked += 1;
            }
        }
    }
    assert!(
        differing.len() <= slack,
        "{} of {checked} requests differ (allowed {slack}):\n{}",
        differing.len(),
        differing.join("\n")
    );
    assert_eq!(checked, 3 * 3 * 48);
    // The CPU backend of a Verifier is the same walk.
    let trees = random_trees(&mut g, 64, QMode::Probs, 16);
    let cpu_backend = cpu();
    let a = trees.verify_with(QMode::Probs, |b| {
        cpu_backend.verify_tree_blocking(b).unwrap()
    });
    let b = trees.verify_with(QMode::Probs, |b| verify_on_cpu(b, 1).unwrap());
    assert_eq!(a, b);
}

/// The GPU-resident path: rows in the caller's buffers at byte offsets, bf16 target rows, the
/// verification recorded into the caller's encoder. Its verdicts equal the host path's on the
/// same values; a CPU verifier refuses to record.
#[test]
fn gpu_resident_trees_equal_the_host_path() {
    let Some(gpu) = gpu() else { return };
    let (device, queue) = gpu.device().expect("a GPU verifier");
    let mut g = Gen::new(7);
    let trees = random_trees(&mut g, 300, QMode::Logits, 24);
    // bf16 target rows (their f32 copy is what the host path gets), f32 draft logits.
    let bf16: Vec<u16> = trees
        .target
        .iter()
        .map(|&x| (x.to_bits() >> 16) as u16)
        .collect();
    let widened: Vec<f32> = bf16.iter().map(|&h| specdec::bf16_to_f32(h)).collect();
    let host = OwnedTrees {
        target: widened,
        ..OwnedTrees {
            vocab: trees.vocab,
            nodes: trees.nodes.clone(),
            params: trees.params.clone(),
            target: Vec::new(),
            q: trees.q.clone(),
        }
    };
    let want = host.verify_with(QMode::Logits, |b| gpu.verify_tree_blocking(b).unwrap());
    let buffer = |bytes: &[u8], offset: usize| {
        let mut padded = vec![0u8; offset];
        padded.extend_from_slice(bytes);
        padded.resize(padded.len().next_multiple_of(4) + 4, 0);
        let buf = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("test.tree_rows"),
            size: padded.len() as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&buf, 0, &padded);
        buf
    };
    let t_buf = buffer(bytemuck::cast_slice(&bf16), 258);
    let q_buf = buffer(bytemuck::cast_slice(&trees.q), 16);
    let requests: Vec<TreeRequest> = trees
        .nodes
        .iter()
        .zip(&trees.params)
        .enumerate()
        .map(|(i, (nodes, &params))| TreeRequest {
            nodes,
            params,
            position: 40 + i as u64,
        })
        .collect();
    let batch = GpuTreeBatch {
        vocab_size: trees.vocab as u32,
        requests: &requests,
        target_logits: GpuRows::f32(&t_buf, 258).with_dtype(Dtype::Bf16),
        draft: GpuDraft::Logits(GpuRows::f32(&q_buf, 16)),
        draft_vocab_size: None,
    };
    let mut encoder = device.create_command_encoder(&Default::default());
    let pending = gpu.record_tree(&mut encoder, &batch).unwrap();
    queue.submit([encoder.finish()]);
    let got = gpu.read_tree_blocking(pending).unwrap();
    assert_eq!(got, want);
    assert!(got.requests.iter().any(|v| v.accepted_nodes.len() >= 2));
    let mut encoder = device.create_command_encoder(&Default::default());
    assert!(matches!(
        cpu().record_tree(&mut encoder, &batch),
        Err(Error::NotGpu)
    ));
}

/// Trees whose rows need several storage-binding windows (WebGPU's default 128 MiB bindings;
/// V = 262,144 f32 rows are 1 MiB each, and over 128 rows are drafted) verify as on the CPU.
#[test]
fn trees_across_binding_windows_equal_the_cpu() {
    if gpu().is_none() {
        return;
    }
    let v = with_limits(wgpu::Limits::default()).expect("a device with WebGPU's default limits");
    let mut g = Gen::new(31);
    for mode in [QMode::None, QMode::Probs] {
        let trees = random_trees(&mut g, 262_144, mode, 24);
        let rows = trees.target.len() / trees.vocab;
        assert!(rows > 128, "{rows} rows fit one window");
        let want = trees.verify_with(mode, |b| verify_on_cpu(b, 2).unwrap());
        let got = trees.verify_with(mode, |b| v.verify_tree_blocking(b).unwrap());
        let strip = |o: &TreeOutput| {
            o.requests
                .iter()
                .map(|r| (r.tokens.clone(), r.accepted_nodes.clone(), r.status))
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&got), strip(&want), "{mode:?}");
    }
}

/// Wide trees drawn from a q unlike p (every slot 6 or 3 children): the walk tests later
/// siblings against the residual masses often, so an error in a mass or in ρ's recursion changes
/// decisions; GPU == CPU there too.
#[test]
fn gpu_sibling_masses_equal_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut g = Gen::new(41);
    let vocab = 5003;
    for mode in [QMode::Probs, QMode::Logits] {
        let mut t = OwnedTrees {
            vocab,
            nodes: Vec::new(),
            params: Vec::new(),
            target: Vec::new(),
            q: Vec::new(),
        };
        for r in 0..96 {
            // Root: 6 children; each of them: 3 children.
            let mut nodes: Vec<TreeNode> = (0..6).map(|_| node(g.below(6) as i32, -1)).collect();
            for c in 0..6 {
                nodes.extend((0..3).map(|_| node(g.below(6) as i32, c)));
            }
            t.params.push(SamplingParams::seeded(1.0, 1000 + r));
            for s in 0..=nodes.len() {
                let mut row = g.logits(vocab, 1.0);
                let mut ql = g.logits(vocab, 1.0);
                for y in 0..6 {
                    row[y] += 7.0 + 2.0 * g.normal() as f32;
                    ql[y] += 7.0 + 2.0 * g.normal() as f32;
                }
                t.target.extend(row);
                if s <= 6 {
                    match mode {
                        QMode::Probs => t.q.extend(softmax(&ql, 1.0).iter().map(|&x| x as f32)),
                        _ => t.q.extend(ql),
                    }
                }
            }
            t.nodes.push(nodes);
        }
        let want = t.verify_with(mode, |b| verify_on_cpu(b, 2).unwrap());
        let got = t.verify_with(mode, |b| gpu.verify_tree_blocking(b).unwrap());
        let strip = |o: &TreeOutput| {
            o.requests
                .iter()
                .map(|r| (r.tokens.clone(), r.accepted_nodes.clone(), r.status))
                .collect::<Vec<_>>()
        };
        let differ = strip(&want)
            .iter()
            .zip(strip(&got))
            .filter(|(a, b)| *a != b)
            .count();
        assert!(
            differ <= twin_slack(gpu).0,
            "{mode:?}: {differ} of 96 requests differ"
        );
        // The masses themselves, child by child: the GPU's against the CPU's (f32 rounding of
        // exp apart). A decision flips only when a draw lands near its threshold; a mass off by
        // any fraction shows here.
        let cpu_masses = t.with_batch(mode, |b| cpu().tree_masses_blocking(b).unwrap());
        let gpu_masses = t.with_batch(mode, |b| gpu.tree_masses_blocking(b).unwrap());
        let mut compared = 0;
        for (g, (&w, &o)) in cpu_masses.iter().zip(&gpu_masses).enumerate() {
            if w.is_nan() {
                continue;
            }
            assert!(
                (w - o).abs() <= 1e-5 * (1.0 + w.abs()),
                "{mode:?} row {g}: {o} vs {w}"
            );
            compared += 1;
        }
        // 96 roots with 5 later children each, and 6 × 96 nodes with 2 each.
        assert_eq!(compared, 96 * (5 + 6 * 2), "{mode:?}");
        // The batch does reach later siblings: some request accepts a third child or later.
        assert!(want
            .requests
            .iter()
            .any(|v| v.accepted_nodes.first().is_some_and(|&a| a >= 2)));
    }
}

/// A request's verdict does not depend on its batch: each request of a mixed batch verified
/// alone (at its own position and seed) gives the verdict it got in the batch, on the CPU and on
/// the GPU.
#[test]
fn a_requests_verdict_does_not_depend_on_its_batch() {
    let mut g = Gen::new(77);
    let trees = random_trees(&mut g, 300, QMode::Logits, 12);
    let whole = trees.verify_with(QMode::Logits, |b| verify_on_cpu(b, 1).unwrap());
    let gpu_whole =
        gpu().map(|v| trees.verify_with(QMode::Logits, |b| v.verify_tree_blocking(b).unwrap()));
    let (mut row, mut q_row) = (0usize, 0usize);
    for r in 0..trees.nodes.len() {
        let nodes = &trees.nodes[r];
        let rows = nodes.len() + 1;
        let q_rows = (0..rows)
            .filter(|&s| nodes.iter().any(|n| n.parent == s as i32 - 1))
            .count();
        let alone = OwnedTrees {
            vocab: trees.vocab,
            nodes: vec![nodes.clone()],
            params: vec![trees.params[r]],
            target: trees.target[row * 300..(row + rows) * 300].to_vec(),
            q: trees.q[q_row * 300..(q_row + q_rows) * 300].to_vec(),
        };
        let position = 40 + r as u64;
        let requests = [TreeRequest {
            nodes,
            params: trees.params[r],
            position,
        }];
        let batch = TreeBatch {
            vocab_size: 300,
            requests: &requests,
            target_logits: (&alone.target).into(),
            draft: Draft::Logits(Logits::from(&alone.q)),
            draft_vocab_size: None,
        };
        assert_eq!(
            verify_on_cpu(&batch, 1).unwrap().requests[0],
            whole.requests[r],
            "request {r}"
        );
        if let (Some(v), Some(gw)) = (gpu(), &gpu_whole) {
            let got = v
                .verify_tree_blocking(&batch)
                .unwrap()
                .requests
                .swap_remove(0);
            assert_eq!(
                (&got.tokens, &got.accepted_nodes, got.status),
                (
                    &gw.requests[r].tokens,
                    &gw.requests[r].accepted_nodes,
                    gw.requests[r].status
                ),
                "GPU request {r}"
            );
        }
        row += rows;
        q_row += q_rows;
    }
    assert_eq!(row * 300, trees.target.len());
}

/// An empty batch verifies to no verdicts on every path (host, GPU-resident, CPU twin).
#[test]
fn empty_tree_batches_give_no_verdicts() {
    let batch = TreeBatch {
        vocab_size: 16,
        requests: &[],
        target_logits: (&[] as &[f32]).into(),
        draft: Draft::OneHot,
        draft_vocab_size: None,
    };
    assert!(verify_on_cpu(&batch, 1).unwrap().requests.is_empty());
    assert!(cpu()
        .verify_tree_blocking(&batch)
        .unwrap()
        .requests
        .is_empty());
    let Some(gpu) = gpu() else { return };
    assert!(gpu
        .verify_tree_blocking(&batch)
        .unwrap()
        .requests
        .is_empty());
    let (device, queue) = gpu.device().unwrap();
    let buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test.empty"),
        size: 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    let pending = gpu
        .record_tree(
            &mut encoder,
            &GpuTreeBatch {
                vocab_size: 16,
                requests: &[],
                target_logits: GpuRows::f32(&buf, 0),
                draft: GpuDraft::OneHot,
                draft_vocab_size: None,
            },
        )
        .unwrap();
    queue.submit([encoder.finish()]);
    assert!(gpu.read_tree_blocking(pending).unwrap().requests.is_empty());
}

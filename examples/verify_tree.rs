//! Tree verification in one call: three requests, each drafting a small tree (a top-2 tree, an
//! n-gram trie, a chain), verified against a 32,000-token vocabulary where the backend policy
//! puts it (`Verifier::auto`: a real GPU if there is one, else the CPU backend), then checked
//! against the CPU twin. Prints each request's accepted nodes (the KV-cache entries to keep) and
//! emitted tokens.
//!
//! ```text
//! cargo run --release --example verify_tree
//! ```

use specdec::tree::{verify_on_cpu, TreeBatch, TreeNode, TreeRequest};
use specdec::{Draft, SamplingParams, Verifier, VerifierOptions};

/// SplitMix64: a tiny deterministic generator for the example's logits.
struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Roughly 2·N(0, 1): the sum of four uniforms, rescaled.
    fn logit(&mut self) -> f32 {
        let x = self.next();
        let s: u32 = (0..4).map(|i| ((x >> (16 * i)) & 0xffff) as u32).sum();
        (s as f32 / 65536.0 - 2.0) * 3.46
    }
}

fn node(token: i32, parent: i32) -> TreeNode {
    TreeNode { token, parent }
}

fn main() {
    specdec::device::quiet_vulkan_device_select();
    let vocab = 32_000usize;
    // Node v's parent is an earlier node, or −1 for a child of the root (the last committed
    // token). Siblings drafted without a distribution carry distinct tokens.
    let trees: [Vec<TreeNode>; 3] = [
        // A top-2 tree two levels deep: 2 children of the root, 2 under each.
        vec![
            node(11, -1),
            node(12, -1),
            node(21, 0),
            node(22, 0),
            node(23, 1),
            node(24, 1),
        ],
        // An n-gram trie: two earlier continuations sharing their first token.
        vec![
            node(31, -1),
            node(32, 0),
            node(33, 1),
            node(34, 0),
            node(35, 3),
        ],
        // A chain: the tree whose node i hangs below node i − 1.
        vec![node(41, -1), node(42, 0), node(43, 1)],
    ];
    // Target rows: one for the root and one per node. Make the drafted tokens likely, so that
    // paths get accepted: row s favours the first child of slot s.
    let mut rng = Mix(2026);
    let mut target = Vec::new();
    for nodes in &trees {
        for s in 0..=nodes.len() {
            let mut row: Vec<f32> = (0..vocab).map(|_| rng.logit()).collect();
            if let Some(c) = nodes.iter().find(|n| n.parent == s as i32 - 1) {
                row[c.token as usize] += 9.0;
            }
            target.extend(row);
        }
    }
    let params = [
        SamplingParams::seeded(1.0, 7),
        SamplingParams::seeded(0.8, 8).with_top_p(0.95),
        // Greedy requests need no seed, but one is set so that the verdicts (which report the
        // seed used) compare equal across the two runs below.
        SamplingParams {
            seed: Some(9),
            ..SamplingParams::greedy()
        },
    ];
    let requests: Vec<TreeRequest> = trees
        .iter()
        .zip(params)
        .map(|(nodes, params)| TreeRequest {
            nodes,
            params,
            position: 120,
        })
        .collect();
    let batch = TreeBatch {
        vocab_size: vocab as u32,
        requests: &requests,
        target_logits: (&target).into(),
        draft: Draft::OneHot,
        draft_vocab_size: None,
    };
    let verifier = Verifier::auto(VerifierOptions::default()).expect("a verifier");
    println!("verifier: {}", verifier.describe());
    let out = verifier
        .verify_tree_blocking(&batch)
        .expect("a valid batch");
    println!("\n req  nodes  accepted nodes  emitted tokens        status");
    for (r, v) in out.requests.iter().enumerate() {
        println!(
            "{r:>4}  {:>5}  {:<14}  {:<20}  {:?}",
            trees[r].len(),
            format!("{:?}", v.accepted_nodes),
            format!("{:?}", v.tokens),
            v.status
        );
    }
    let twin = verify_on_cpu(&batch, 1).expect("a valid batch");
    if twin == out {
        println!("\nCPU twin: identical verdicts");
    } else {
        println!("\nCPU twin: verdicts differ (a draw within rounding of its threshold?)");
        std::process::exit(1);
    }
}

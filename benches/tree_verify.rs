//! Tree against chain verification cost on a GPU: the same number of target rows per request
//! verified as trees (`Verifier::record_tree`) and as chains (`Verifier::record`), both
//! GPU-resident, GPU time by timestamps around the one pass, alternated call by call after a
//! warm-up.
//!
//! ```text
//! cargo bench --bench tree_verify -- [--vocab 151936] [--batch 1,8,32] [--nodes 8,32,64]
//!     [--reps 30] [--warm-s 10] [--csv PATH]
//! ```
//!
//! Trees: `nodes` nodes per request, each node's parent the previous node with probability ½,
//! else a random earlier node (so trees are a few levels deep and branch), tokens distinct
//! among siblings. Chains: `nodes` drafts. Modes: children without q (one-hot chains) and with
//! draft probabilities (one q row per expanding node; a chain has one per draft). Temperature 1.
//! Logits are 2·N(0, 1); what is measured is cost, not acceptance.

use std::process::ExitCode;

use rand_pcg::rand_core::{Rng, SeedableRng};
use specdec::tree::{TreeNode, TreeRequest};
use specdec::{GpuDraft, GpuRows, GpuTreeBatch, GpuVerifyBatch, Request, SamplingParams};
use specdec::{Timestamps, Verifier, VerifierOptions};

struct Args {
    vocab: u32,
    batches: Vec<usize>,
    nodes: Vec<usize>,
    reps: usize,
    warm_s: f64,
    csv: Option<String>,
}

fn list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|x| x.parse().map_err(|_| format!("not a number: {x:?}")))
        .collect()
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        vocab: 151_936,
        batches: vec![1, 8, 32],
        nodes: vec![8, 32, 64],
        reps: 30,
        warm_s: 10.0,
        csv: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let v = it.next().ok_or(format!("{arg} needs a value"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|_| format!("{arg}: not a number"));
        match arg.as_str() {
            "--vocab" => a.vocab = num(v)? as u32,
            "--batch" => a.batches = list(v)?,
            "--nodes" => a.nodes = list(v)?,
            "--reps" => a.reps = num(v)? as usize,
            "--warm-s" => a.warm_s = num(v)?,
            "--csv" => a.csv = Some(v.clone()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match parse(&args).and_then(|a| run(&a).map_err(|e| e.to_string())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tree_verify bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// Reproducible shapes and values.
struct Mix(rand_pcg::Pcg64);

impl Mix {
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
    /// Approximately 2·N(0, 1) (sum of four uniforms, rescaled): cheap for a gigabyte.
    fn logit(&mut self) -> f32 {
        let x = self.0.next_u64();
        let s: u32 = (0..4).map(|i| ((x >> (16 * i)) & 0xffff) as u32).sum();
        (s as f32 / 65536.0 - 2.0) * 2.0 * 1.732
    }
}

/// A random tree of `n` nodes over `vocab` (see the module comment).
fn tree(m: &mut Mix, n: usize, vocab: u32) -> Vec<TreeNode> {
    let mut nodes: Vec<TreeNode> = Vec::with_capacity(n);
    for v in 0..n {
        let parent = if v == 0 {
            -1
        } else if m.below(2) == 0 {
            v as i32 - 1
        } else {
            m.below(v + 1) as i32 - 1
        };
        let mut token = m.below(vocab as usize) as i32;
        while nodes.iter().any(|o| o.parent == parent && o.token == token) {
            token = m.below(vocab as usize) as i32;
        }
        nodes.push(TreeNode { token, parent });
    }
    nodes
}

/// GPU time of one recorded call per rep (µs, median), tree and chain calls alternated.
struct Timer<'a> {
    v: &'a Verifier,
    device: &'a wgpu::Device,
    queue: &'a wgpu::Queue,
    qs: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    period_ns: f64,
}

impl Timer<'_> {
    fn stamp(&self, i: u32) -> Timestamps<'_> {
        Timestamps::Pass(wgpu::ComputePassTimestampWrites {
            query_set: &self.qs,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    fn time(
        &self,
        tree: &GpuTreeBatch<'_>,
        chain: &GpuVerifyBatch<'_>,
        reps: usize,
    ) -> Result<(f64, f64), specdec::Error> {
        for i in 0..reps as u32 {
            let mut enc = self.device.create_command_encoder(&Default::default());
            let p = self
                .v
                .record_tree_timed(&mut enc, tree, self.stamp(2 * i))?;
            self.queue.submit([enc.finish()]);
            self.v.read_tree_blocking(p)?;
            let mut enc = self.device.create_command_encoder(&Default::default());
            let p = self
                .v
                .record_timed(&mut enc, chain, self.stamp(2 * i + 1))?;
            self.queue.submit([enc.finish()]);
            self.v.read_blocking(p)?;
        }
        let n = 4 * reps as u32;
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.resolve_query_set(&self.qs, 0..n, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, 8 * u64::from(n));
        let idx = self.queue.submit([enc.finish()]);
        let slice = self.read.slice(..8 * u64::from(n));
        slice.map_async(wgpu::MapMode::Read, |_| {});
        let _ = self.device.poll(wgpu::PollType::Wait {
            submission_index: Some(idx),
            timeout: Some(std::time::Duration::from_secs(60)),
        });
        let ticks: Vec<u64> = {
            let view = slice.get_mapped_range().expect("mapped");
            bytemuck::cast_slice::<u8, u64>(&view).to_vec()
        };
        self.read.unmap();
        let us = |pair: &[u64]| pair[1].wrapping_sub(pair[0]) as f64 * self.period_ns / 1e3;
        let mut t: Vec<f64> = ticks.chunks(4).map(|c| us(&c[0..2])).collect();
        let mut c: Vec<f64> = ticks.chunks(4).map(|c| us(&c[2..4])).collect();
        t.sort_by(f64::total_cmp);
        c.sort_by(f64::total_cmp);
        Ok((t[t.len() / 2], c[c.len() / 2]))
    }
}

fn device() -> Result<(wgpu::Device, wgpu::Queue, String), Box<dyn std::error::Error>> {
    let adapter = specdec::select_adapter()?;
    if !adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
        return Err("the adapter has no timestamp queries".into());
    }
    let limits = specdec::required_limits(&adapter.limits())?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("tree_verify bench"),
        required_features: wgpu::Features::TIMESTAMP_QUERY
            | (adapter.features() & wgpu::Features::SHADER_INT64),
        required_limits: limits,
        ..Default::default()
    }))?;
    Ok((device, queue, adapter.get_info().name))
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (device, queue, adapter) = device()?;
    let v = Verifier::with_device(device.clone(), queue.clone(), VerifierOptions::default())?;
    let max_rows = a.batches.iter().max().unwrap_or(&1) * (a.nodes.iter().max().unwrap_or(&1) + 1);
    let len = max_rows * a.vocab as usize;
    eprintln!(
        "{adapter}: {:.2} GB of logits and draft probabilities",
        8.0 * len as f64 / 1e9
    );
    let mut m = Mix(rand_pcg::Pcg64::seed_from_u64(1));
    let logits: Vec<f32> = (0..len).map(|_| m.logit()).collect();
    let q = vec![1.0 / a.vocab as f32; len];
    let buffer = |data: &[f32]| {
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench.rows"),
            size: 4 * data.len() as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&b, 0, bytemuck::cast_slice(data));
        b
    };
    let (t_buf, q_buf) = (buffer(&logits), buffer(&q));
    let count = 4 * a.reps.max(1) as u32;
    let timer = Timer {
        v: &v,
        device: &device,
        queue: &queue,
        qs: device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("bench.timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count,
        }),
        resolve: device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench.resolve"),
            size: 8 * u64::from(count),
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        }),
        read: device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench.read"),
            size: 8 * u64::from(count),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }),
        period_ns: f64::from(queue.get_timestamp_period()),
    };
    let mut lines =
        vec!["adapter,mode,vocab,batch,nodes,tree_gpu_us,chain_gpu_us,ratio".to_string()];
    let warm_until = std::time::Instant::now() + std::time::Duration::from_secs_f64(a.warm_s);
    let mut warmed = false;
    for &r in &a.batches {
        for &n in &a.nodes {
            let trees: Vec<Vec<TreeNode>> = (0..r).map(|_| tree(&mut m, n, a.vocab)).collect();
            let params = SamplingParams::seeded(1.0, 7);
            let tree_reqs: Vec<TreeRequest> = trees
                .iter()
                .enumerate()
                .map(|(i, nodes)| TreeRequest {
                    nodes,
                    params,
                    position: 100 + i as u64,
                })
                .collect();
            let chain_reqs: Vec<Request> = (0..r)
                .map(|i| Request {
                    num_drafts: n as u32,
                    params,
                    position: 100 + i as u64,
                })
                .collect();
            let ids: Vec<i32> = trees
                .iter()
                .flat_map(|t| t.iter().map(|n| n.token))
                .collect();
            for (mode, with_q) in [("one_hot", false), ("draft_probs", true)] {
                let tree_batch = GpuTreeBatch {
                    vocab_size: a.vocab,
                    requests: &tree_reqs,
                    target_logits: GpuRows::f32(&t_buf, 0),
                    draft: if with_q {
                        GpuDraft::Probs(GpuRows::f32(&q_buf, 0))
                    } else {
                        GpuDraft::OneHot
                    },
                    draft_vocab_size: None,
                };
                let chain_batch = GpuVerifyBatch {
                    vocab_size: a.vocab,
                    requests: &chain_reqs,
                    draft_token_ids: &ids,
                    target_logits: GpuRows::f32(&t_buf, 0),
                    draft: tree_batch.draft,
                    draft_vocab_size: None,
                    synthetic_rates: None,
                };
                while !warmed {
                    timer.time(&tree_batch, &chain_batch, 2)?;
                    warmed = std::time::Instant::now() > warm_until;
                }
                let (t_us, c_us) = timer.time(&tree_batch, &chain_batch, a.reps)?;
                let line = format!(
                    "{adapter},{mode},{},{r},{n},{t_us:.1},{c_us:.1},{:.3}",
                    a.vocab,
                    t_us / c_us
                );
                eprintln!("{line}");
                lines.push(line);
            }
        }
    }
    let text = lines.join("\n") + "\n";
    print!("{text}");
    if let Some(path) = &a.csv {
        std::fs::write(path, text)?;
    }
    Ok(())
}

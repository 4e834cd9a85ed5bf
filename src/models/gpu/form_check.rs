//! Whether two compiled forms of the matmul kernel give the same bits on this device.
//!
//! A row's logits must be the same bits whether a call scores it alone (plain decoding: one
//! row, the one-at-a-time sums) or with others (speculation: several rows, the named-register
//! sums), or speculative greedy output would drift from plain greedy output. Both forms add the
//! same terms in the same order, but WGSL leaves a driver free to fuse a product into the add
//! that follows it (an FMA), and nothing makes it do so alike in two pipelines. So when a model
//! is uploaded with both forms, one call of each over the same 16 input rows is compared bit
//! for bit, and a device that differs gets the one-at-a-time form for every row count
//! (`GpuModel::matmul_forms`): exact, and slower at several rows, where the named registers read
//! each weight block once (they won at five rows on an H200, `docs/gpu-decoding.md`).

use wgpu::util::DeviceExt;

use super::kernels::{
    params_entry, MatmulForm, MatmulPolicy, ModelKernel, ModelParams, Pipe, Pipelines,
};
use super::sequence::read_back;
use super::GpuModelError;

/// Input width of the check: 70 blocks, so that every lane count from 1 to 32 gives its lanes
/// several blocks and an uneven last round.
const CHECK_COLS: u32 = 32 * 70;

/// Output rows of the check: several workgroups for every lane count.
const CHECK_OUT_ROWS: u32 = 64;

/// Input rows of the check: every named register of the unrolled form.
const CHECK_ROWS: u32 = super::sequence::MAX_ROWS as u32;

/// What the upload of a [`super::GpuModel`] found about its matmul forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulFormCheck {
    /// One summation form serves every row count (CPU adapters, or
    /// [`super::GpuModelOptions::matmul_unrolled`] set): nothing to compare.
    OneForm,
    /// Both forms were compiled and gave the same bits: one row takes the one-at-a-time sums,
    /// several rows the named registers.
    Agree,
    /// The device compiled the two forms differently; every row count takes the one-at-a-time
    /// sums, so rows scored together still equal rows scored alone.
    Differ,
}

/// Whether matmul forms `a` and `b` give the same bits on `device` for the same inputs (16
/// input rows, every specialisation: plain, with a bias, adding into the residual stream).
/// Forms of different lane counts sum in different orders and are expected to differ; the
/// accumulator forms of one lane count are expected to agree. A diagnostic for a device the
/// project has not run on; [`super::GpuModel::upload`] makes this check itself.
pub fn matmul_forms_agree(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    a: MatmulForm,
    b: MatmulForm,
) -> Result<bool, GpuModelError> {
    for form in [a, b] {
        if !form.lanes.is_power_of_two() || form.lanes > 32 {
            return Err(GpuModelError::Invalid(format!(
                "matmul lanes {}: use a power of two from 1 to 32",
                form.lanes
            )));
        }
    }
    let policy = MatmulPolicy {
        lanes: Some(a.lanes),
        unrolled: Some(a.unrolled),
        cpu: false,
    };
    let pipelines = crate::gpu::scoped(device, || {
        Pipelines::with_forms(device, policy, 64, &[a, b])
    })?;
    forms_agree(device, queue, &pipelines, a, b)
}

/// [`matmul_forms_agree`] over pipelines already built in both forms.
pub(crate) fn forms_agree(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    pipelines: &Pipelines,
    a: MatmulForm,
    b: MatmulForm,
) -> Result<bool, GpuModelError> {
    let inputs = Inputs::new(device);
    for pipe in [Pipe::Matmul, Pipe::MatmulBias, Pipe::MatmulResidual] {
        let ya = inputs.run(device, queue, pipelines, pipe, a)?;
        let yb = inputs.run(device, queue, pipelines, pipe, b)?;
        if ya != yb {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The check's operands on the device: pseudo-random 8-bit blocks and scales, a bias, and a
/// residual stream to add into.
struct Inputs {
    params: wgpu::Buffer,
    xq: wgpu::Buffer,
    xd: wgpu::Buffer,
    qs: wgpu::Buffer,
    scales: wgpu::Buffer,
    bias: wgpu::Buffer,
    y0: Vec<f32>,
}

impl Inputs {
    fn new(device: &wgpu::Device) -> Inputs {
        // Any fixed stream of varied words serves: the weights' own splitmix64.
        let mut rng = super::weights::SplitMix(0x5eed_f0e5);
        let mut next = move || rng.next();
        let blocks = CHECK_COLS / 32;
        let mut words = |n: u32| (0..n).map(|_| next() as u32).collect::<Vec<u32>>();
        let xq = words(CHECK_ROWS * CHECK_COLS / 4);
        let qs = words(CHECK_OUT_ROWS * CHECK_COLS / 4);
        // Scales and values of a few binary orders of magnitude, so that the products round.
        let mut floats = |n: u32, lo: f32| {
            (0..n)
                .map(|_| lo * (1.0 + (next() >> 40) as f32 / (1u64 << 24) as f32 * 7.0))
                .collect::<Vec<f32>>()
        };
        let xd = floats(CHECK_ROWS * blocks, 1e-3);
        let scales = floats(CHECK_OUT_ROWS * blocks, 1e-3);
        let bias = floats(CHECK_OUT_ROWS, 0.1);
        let y0 = floats(CHECK_ROWS * CHECK_OUT_ROWS, 0.5);
        let params = ModelParams {
            rows: CHECK_ROWS,
            width: CHECK_COLS,
            out_rows: CHECK_OUT_ROWS,
            out_stride: CHECK_OUT_ROWS,
            ..ModelParams::default()
        };
        let init = |label: &str, contents: &[u8], usage: wgpu::BufferUsages| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&format!("specdec.matmul form check {label}")),
                contents,
                usage,
            })
        };
        let storage = wgpu::BufferUsages::STORAGE;
        Inputs {
            params: init(
                "params",
                bytemuck::bytes_of(&params),
                wgpu::BufferUsages::UNIFORM,
            ),
            xq: init("xq", bytemuck::cast_slice(&xq), storage),
            xd: init("xd", bytemuck::cast_slice(&xd), storage),
            qs: init("qs", bytemuck::cast_slice(&qs), storage),
            scales: init("scales", bytemuck::cast_slice(&scales), storage),
            bias: init("bias", bytemuck::cast_slice(&bias), storage),
            y0,
        }
    }

    /// One call of `pipe` in `form`; the output's bits.
    fn run(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        pipelines: &Pipelines,
        pipe: Pipe,
        form: MatmulForm,
    ) -> Result<Vec<u8>, GpuModelError> {
        let bytes = (self.y0.len() * 4) as u64;
        let y = crate::gpu::scoped(device, || {
            let y = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("specdec.matmul form check y"),
                contents: bytemuck::cast_slice(&self.y0),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            });
            let mut entries = vec![params_entry(&self.params)];
            let buffers = [&self.xq, &self.qs, &self.scales, &self.bias, &y, &self.xd];
            for (i, b) in buffers.iter().enumerate() {
                entries.push(crate::gpu::entry(i as u32 + 1, b));
            }
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("specdec.matmul form check"),
                layout: pipelines.layout(ModelKernel::MatmulQ8),
                entries: &entries,
            });
            let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("specdec.matmul form check"),
            });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("specdec.matmul form check"),
                    timestamp_writes: None,
                });
                pass.set_pipeline(pipelines.pipeline(pipe, Some(form)));
                pass.set_bind_group(0, &group, &[0]);
                let rows_per_wg = super::kernels::MATMUL_WG / form.lanes;
                pass.dispatch_workgroups(CHECK_OUT_ROWS.div_ceil(rows_per_wg), 1, 1);
            }
            queue.submit([encoder.finish()]);
            y
        })?;
        read_back(device, queue, &y, bytes)
    }
}

/// The upload's check: for each lane count compiled in both accumulator forms, whether the two
/// agree; where any pair differs, `pipelines` is switched to the one-at-a-time form for every
/// row count.
pub(crate) fn settle_forms(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    pipelines: &mut Pipelines,
) -> Result<MatmulFormCheck, GpuModelError> {
    let forms = pipelines.policy.forms();
    let mut pairs = forms
        .iter()
        .filter(|f| {
            !f.unrolled
                && forms.contains(&MatmulForm {
                    unrolled: true,
                    ..**f
                })
        })
        .peekable();
    if pairs.peek().is_none() {
        return Ok(MatmulFormCheck::OneForm);
    }
    for &rolled in pairs {
        let named = MatmulForm {
            unrolled: true,
            ..rolled
        };
        if !forms_agree(device, queue, pipelines, rolled, named)? {
            pipelines.policy.unrolled = Some(false);
            return Ok(MatmulFormCheck::Differ);
        }
    }
    Ok(MatmulFormCheck::Agree)
}

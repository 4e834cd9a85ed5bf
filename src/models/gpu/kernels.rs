//! The model kernels: one WGSL file per kernel (`shaders/model_<kernel>.wgsl`, each prefixed with
//! `shaders/model_common.wgsl`), one pipeline label `specdec.model_<kernel>`, explicit bind group
//! layouts, and the parameter block they share.

use crate::gpu::{layout_entry, storage};

/// Declarations shared by the model kernels (the `Params` block, the 2-D grid index).
pub const MODEL_COMMON: &str = include_str!("../../../shaders/model_common.wgsl");

/// The parameter block of one dispatch (the WGSL `Params` of `shaders/model_common.wgsl`, field
/// for field). Offsets and strides count f32 elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ModelParams {
    pub rows: u32,
    pub width: u32,
    pub out_rows: u32,
    pub row_base: u32,
    pub in_offset: u32,
    pub out_offset: u32,
    pub out_stride: u32,
    pub pos: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub scratch_stride: u32,
    pub token_base: u32,
    pub style: u32,
    pub eps: f32,
    pub scale: f32,
    /// Tree calls: the word offset of the tree table in the token buffer (0: a chain call).
    pub tree: u32,
    pub pad: [u32; 3],
}

/// A model kernel: one WGSL file, one pipeline label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelKernel {
    /// Token ids → rows of the Q8_0 embedding table (`shaders/model_embed.wgsl`).
    Embed,
    /// RMSNorm of each row (`shaders/model_rmsnorm.wgsl`).
    RmsNorm,
    /// Weight-stationary Q8_0 matmul with optional bias and residual
    /// (`shaders/model_matmul_q8.wgsl`).
    MatmulQ8,
    /// Rotary position embedding of the stacked q/k/v output, keys and values into the cache
    /// (`shaders/model_rope.wgsl`).
    Rope,
    /// Causal grouped-query attention over the cache (`shaders/model_attention.wgsl`).
    Attention,
    /// `silu(gate) · up` over the stacked gate/up output (`shaders/model_swiglu.wgsl`).
    Swiglu,
    /// After a tree call, the accepted path's cache entries moved to consecutive slots
    /// (`shaders/model_kv_keep.wgsl`).
    KvKeep,
}

impl ModelKernel {
    /// Every model kernel.
    pub const ALL: [ModelKernel; 7] = [
        ModelKernel::Embed,
        ModelKernel::RmsNorm,
        ModelKernel::MatmulQ8,
        ModelKernel::Rope,
        ModelKernel::Attention,
        ModelKernel::Swiglu,
        ModelKernel::KvKeep,
    ];

    /// The file stem: `model_<kernel>`, also the pipeline label after `specdec.`.
    pub fn name(self) -> &'static str {
        match self {
            ModelKernel::Embed => "model_embed",
            ModelKernel::RmsNorm => "model_rmsnorm",
            ModelKernel::MatmulQ8 => "model_matmul_q8",
            ModelKernel::Rope => "model_rope",
            ModelKernel::Attention => "model_attention",
            ModelKernel::Swiglu => "model_swiglu",
            ModelKernel::KvKeep => "model_kv_keep",
        }
    }

    /// The kernel's own source (without [`MODEL_COMMON`]).
    pub fn body(self) -> &'static str {
        match self {
            ModelKernel::Embed => include_str!("../../../shaders/model_embed.wgsl"),
            ModelKernel::RmsNorm => include_str!("../../../shaders/model_rmsnorm.wgsl"),
            ModelKernel::MatmulQ8 => include_str!("../../../shaders/model_matmul_q8.wgsl"),
            ModelKernel::Rope => include_str!("../../../shaders/model_rope.wgsl"),
            ModelKernel::Attention => include_str!("../../../shaders/model_attention.wgsl"),
            ModelKernel::Swiglu => include_str!("../../../shaders/model_swiglu.wgsl"),
            ModelKernel::KvKeep => include_str!("../../../shaders/model_kv_keep.wgsl"),
        }
    }

    /// The full WGSL source: [`MODEL_COMMON`] then [`ModelKernel::body`].
    pub fn source(self) -> String {
        format!("{MODEL_COMMON}\n{}", self.body())
    }

    /// The storage bindings after the params slot (binding 0), in order: `true` = read-only.
    fn storage_bindings(self) -> &'static [bool] {
        match self {
            ModelKernel::Embed => &[true, true, true, false],
            ModelKernel::RmsNorm => &[true, true, false, false],
            ModelKernel::MatmulQ8 => &[true, true, true, true, false, true],
            ModelKernel::Rope => &[true, true, false, false, false, true],
            ModelKernel::Attention => &[true, true, true, false, false, false, true],
            ModelKernel::Swiglu => &[true, false, false],
            ModelKernel::KvKeep => &[true, false, false],
        }
    }
}

/// A pipeline: a kernel and its specialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pipe {
    Embed,
    RmsNorm,
    /// `Y = X·Wᵀ`.
    Matmul,
    /// `Y = X·Wᵀ + bias`.
    MatmulBias,
    /// `Y += X·Wᵀ`.
    MatmulResidual,
    Rope,
    Attention,
    Swiglu,
    KvKeep,
}

impl Pipe {
    const ALL: [Pipe; 9] = [
        Pipe::Embed,
        Pipe::RmsNorm,
        Pipe::Matmul,
        Pipe::MatmulBias,
        Pipe::MatmulResidual,
        Pipe::Rope,
        Pipe::Attention,
        Pipe::Swiglu,
        Pipe::KvKeep,
    ];

    pub(crate) fn kernel(self) -> ModelKernel {
        match self {
            Pipe::Embed => ModelKernel::Embed,
            Pipe::RmsNorm => ModelKernel::RmsNorm,
            Pipe::Matmul | Pipe::MatmulBias | Pipe::MatmulResidual => ModelKernel::MatmulQ8,
            Pipe::Rope => ModelKernel::Rope,
            Pipe::Attention => ModelKernel::Attention,
            Pipe::Swiglu => ModelKernel::Swiglu,
            Pipe::KvKeep => ModelKernel::KvKeep,
        }
    }

    fn constants(self, form: MatmulForm) -> Vec<(&'static str, f64)> {
        let shape = [
            ("LANES", f64::from(form.lanes)),
            ("ROWS_PER_WG", f64::from(MATMUL_WG / form.lanes)),
            ("WG", f64::from(MATMUL_WG)),
            ("UNROLLED", f64::from(u8::from(form.unrolled))),
        ];
        match self {
            Pipe::Matmul => shape.to_vec(),
            Pipe::MatmulBias => [&shape[..], &[("HAS_BIAS", 1.0)]].concat(),
            Pipe::MatmulResidual => [&shape[..], &[("RESIDUAL", 1.0)]].concat(),
            _ => Vec::new(),
        }
    }
}

/// Binding 0 of every model kernel's group: one `ModelParams` of `buffer`, at the dynamic
/// offset the dispatch gives.
pub(crate) fn params_entry(buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset: 0,
            size: std::num::NonZeroU64::new(std::mem::size_of::<ModelParams>() as u64),
        }),
    }
}

/// Invocations of a matmul workgroup: `LANES` lanes × `256 / LANES` output rows.
pub(crate) const MATMUL_WG: u32 = 256;

/// A compiled form of the matmul kernel: lanes per output row and how the per-row sums are
/// kept (see [`super::GpuModelOptions::matmul_lanes`] and
/// [`super::GpuModelOptions::matmul_unrolled`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulForm {
    /// Lanes that share one output row: a power of two from 1 to 32. It sets the summation
    /// order, so two lane counts give different bits.
    pub lanes: u32,
    /// Sums in 16 named registers inside the block loop (each weight block read once for all
    /// rows), or one input row at a time. The two add the same terms in the same order.
    pub unrolled: bool,
}

/// Which matmul form each call uses: fixed by the options, else chosen by the device, the
/// matrix width and the row count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatmulPolicy {
    /// `GpuModelOptions::matmul_lanes`.
    pub lanes: Option<u32>,
    /// `GpuModelOptions::matmul_unrolled`.
    pub unrolled: Option<bool>,
    /// A CPU adapter (lavapipe).
    pub cpu: bool,
}

impl MatmulPolicy {
    /// The policy for `device` under the options' overrides.
    pub(crate) fn new(device: &wgpu::Device, lanes: Option<u32>, unrolled: Option<bool>) -> Self {
        MatmulPolicy {
            lanes,
            unrolled,
            cpu: device.adapter_info().device_type == wgpu::DeviceType::Cpu,
        }
    }

    /// The form of a matmul over `cols` input columns for `rows` input rows. Lanes: 4 on CPU
    /// adapters, where every idle lane and every extra workgroup costs; on GPUs 16 for rows of at
    /// most 64 blocks, 32 for longer ones (measured on an H200 through Vulkan, Qwen2.5 1.5B
    /// shapes: K = 1536 matrices ran 1.2–1.9× faster with 16 lanes than 32, K = 8960 1.4×
    /// slower). Sums: one row at a time for a single row (fewer registers, more workgroups in
    /// flight: 10 % faster at one row on the H200), in named registers for several (each weight
    /// block read once). The two forms add the same terms in the same order, and the choice
    /// between them depends on the row count alone, so a row's bits do not depend on the others
    /// while the driver compiles both alike, which every upload checks (`form_check.rs`; also
    /// `examples/gpu_forward_bench` before it times, and tests/gpu_forward.rs).
    /// The lane count sets the summation order, so it depends on the width alone.
    pub(crate) fn form(&self, cols: usize, rows: usize) -> MatmulForm {
        let lanes = self.lanes.unwrap_or(match (self.cpu, cols / 32 <= 64) {
            (true, _) => 4,
            (false, true) => 16,
            (false, false) => 32,
        });
        let unrolled = self.unrolled.unwrap_or(!self.cpu && rows > 1);
        MatmulForm { lanes, unrolled }
    }

    /// Every form [`MatmulPolicy::form`] can return.
    pub(crate) fn forms(&self) -> Vec<MatmulForm> {
        let lanes: Vec<u32> = match (self.lanes, self.cpu) {
            (Some(l), _) => vec![l],
            (None, true) => vec![4],
            (None, false) => vec![16, 32],
        };
        let unrolled: Vec<bool> = match (self.unrolled, self.cpu) {
            (Some(u), _) => vec![u],
            (None, true) => vec![false],
            (None, false) => vec![false, true],
        };
        lanes
            .iter()
            .flat_map(|&lanes| {
                unrolled
                    .iter()
                    .map(move |&unrolled| MatmulForm { lanes, unrolled })
            })
            .collect()
    }
}

/// The pipelines and bind group layouts of the model kernels on one device, built once per
/// [`super::GpuModel`] and shared by all its sequences.
#[derive(Debug)]
pub(crate) struct Pipelines {
    layouts: Vec<(ModelKernel, wgpu::BindGroupLayout)>,
    /// Each pipe, with the matmul form for the matmul pipes.
    pipelines: Vec<((Pipe, Option<MatmulForm>), wgpu::ComputePipeline)>,
    /// Which matmul form a call uses.
    pub policy: MatmulPolicy,
}

impl Pipelines {
    /// Compiles every kernel, the matmul in every form `policy` can choose, attention for heads
    /// of `head_dim`; call inside an error scope.
    pub(crate) fn new(device: &wgpu::Device, policy: MatmulPolicy, head_dim: usize) -> Pipelines {
        Self::with_forms(device, policy, head_dim, &policy.forms())
    }

    /// As [`Pipelines::new`], with the matmul in `forms` only (`policy` is kept for the calls'
    /// choice and must choose among them).
    pub(crate) fn with_forms(
        device: &wgpu::Device,
        policy: MatmulPolicy,
        head_dim: usize,
        forms: &[MatmulForm],
    ) -> Pipelines {
        let mut layouts = Vec::new();
        let mut modules = Vec::new();
        for kernel in ModelKernel::ALL {
            let label = format!("specdec.{}", kernel.name());
            let uniform = wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: std::num::NonZeroU64::new(
                    std::mem::size_of::<ModelParams>() as u64
                ),
            };
            let mut entries = vec![layout_entry(0, uniform)];
            for (i, &ro) in kernel.storage_bindings().iter().enumerate() {
                entries.push(layout_entry(i as u32 + 1, storage(ro)));
            }
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(&label),
                entries: &entries,
            });
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
            });
            layouts.push((kernel, layout));
            modules.push((kernel, module));
        }
        let mut pipelines = Vec::new();
        let mut keys: Vec<(Pipe, Option<MatmulForm>)> = Vec::new();
        for pipe in Pipe::ALL {
            if pipe.kernel() == ModelKernel::MatmulQ8 {
                keys.extend(forms.iter().map(|&f| (pipe, Some(f))));
            } else {
                keys.push((pipe, None));
            }
        }
        for (pipe, form) in keys {
            let kernel = pipe.kernel();
            let label = format!("specdec.{}", kernel.name());
            let layout = &layouts.iter().find(|(k, _)| *k == kernel).expect("built").1;
            let module = &modules.iter().find(|(k, _)| *k == kernel).expect("built").1;
            let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&label),
                bind_group_layouts: &[Some(layout)],
                immediate_size: 0,
            });
            let constants = match (pipe, form) {
                (_, Some(f)) => pipe.constants(f),
                (Pipe::Attention, None) => vec![("HW", (head_dim / 4) as f64)],
                _ => Vec::new(),
            };
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: Some(&pl),
                module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
            pipelines.push(((pipe, form), pipeline));
        }
        Pipelines {
            layouts,
            pipelines,
            policy,
        }
    }

    pub(crate) fn layout(&self, kernel: ModelKernel) -> &wgpu::BindGroupLayout {
        &self
            .layouts
            .iter()
            .find(|(k, _)| *k == kernel)
            .expect("every kernel has a layout")
            .1
    }

    /// The pipeline of `pipe` (in `form` for the matmul pipes).
    pub(crate) fn pipeline(&self, pipe: Pipe, form: Option<MatmulForm>) -> &wgpu::ComputePipeline {
        &self
            .pipelines
            .iter()
            .find(|(k, _)| *k == (pipe, form))
            .expect("every pipe is built in every form the policy chooses")
            .1
    }
}

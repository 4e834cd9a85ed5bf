//! Registers per invocation, shared memory and code size of the verification kernels, as a
//! Vulkan driver compiles them: the driver statistics of `VK_KHR_pipeline_executable_properties`
//! (NVIDIA reports "Register Count", "Shared Memory Size", "Binary Size"). wgpu cannot ask a
//! driver for them, so this builds each kernel's SPIR-V with naga the way wgpu's Vulkan backend
//! does (the same source, `override` constants, bounds-check policies and loop bounding) and
//! creates the pipelines with plain Vulkan (`ash`).
//!
//! ```text
//! cargo run --release --example pipeline_registers            # every probe below
//! SPECDEC_SHADER_DIR=variant/ cargo run --release --example pipeline_registers
//! ```
//!
//! Registers bound how many workgroups a multiprocessor holds at once, which is what a pass of
//! thousands of workgroups runs at: on an H200 (65,536 registers a multiprocessor) a 64-lane
//! workgroup of 95 registers fits 10 times, one of 36 registers 28 times. On a device without
//! the extension (lavapipe) the pipelines are still built, which checks the SPIR-V, and the
//! statistics are reported missing.

use ash::vk;
use specdec::shaders::{Kernel, Variant};
use std::ffi::{CStr, CString};

/// One pipeline to build: a kernel's entry point with the `override` constants the verifier
/// gives it on a discrete GPU for f32 rows (`WG` 256, 32-lane subgroups).
struct Probe {
    label: &'static str,
    kernel: Kernel,
    entry: &'static str,
    constants: &'static [(&'static str, f64)],
    /// row_stats_verify's text for its pipelines past 1,024 chunks (verify's row-run folds in
    /// row_stats' lane arrays).
    lane_runs: bool,
}

const fn probe(
    label: &'static str,
    kernel: Kernel,
    entry: &'static str,
    constants: &'static [(&'static str, f64)],
) -> Probe {
    Probe {
        label,
        kernel,
        entry,
        constants,
        lane_runs: false,
    }
}

/// The pipelines of the benchmark's f32 batches, by pass.
const PROBES: &[Probe] = &[
    probe(
        "row_stats block (softmax sums)",
        Kernel::RowStats,
        "block",
        &[("PLAIN_F32", 1.0)],
    ),
    probe(
        "row_stats block (max only)",
        Kernel::RowStats,
        "block",
        &[("PLAIN_F32", 1.0), ("MAX_ONLY", 1.0)],
    ),
    probe(
        "row_stats block_wide_settle",
        Kernel::RowStats,
        "block_wide_settle",
        &[("PLAIN_F32", 1.0), ("MAX_ONLY", 1.0)],
    ),
    probe(
        "row_stats block_wide_settle_blocks",
        Kernel::RowStats,
        "block_wide_settle_blocks",
        &[("PLAIN_F32", 1.0), ("MAX_ONLY", 1.0)],
    ),
    probe(
        "row_stats_verify (up to 1,024 chunks)",
        Kernel::RowStatsVerify,
        "block_verify",
        &[("PLAIN_F32", 1.0)],
    ),
    Probe {
        label: "row_stats_verify (lane runs, past 1,024)",
        kernel: Kernel::RowStatsVerify,
        entry: "block_verify",
        constants: &[("PLAIN_F32", 1.0)],
        lane_runs: true,
    },
    probe("verify main", Kernel::Verify, "main", &[]),
    probe(
        "residual block (one-hot)",
        Kernel::ResidualArgmax,
        "block",
        &[("PLAIN_F32", 1.0), ("LOG_KEYS", 1.0)],
    ),
    probe(
        "residual block (early race)",
        Kernel::ResidualArgmax,
        "block",
        &[("PLAIN_F32", 1.0), ("LOG_KEYS", 1.0), ("EARLY", 1.0)],
    ),
    probe(
        "residual block (draft values)",
        Kernel::ResidualArgmax,
        "block",
        &[("PLAIN_F32", 1.0)],
    ),
    probe("residual merge", Kernel::ResidualArgmax, "merge", &[]),
    probe(
        "cutoff scan_max",
        Kernel::Cutoff,
        "scan_max",
        &[("PLAIN_F32", 1.0)],
    ),
    probe("cutoff scan", Kernel::Cutoff, "scan", &[("PLAIN_F32", 1.0)]),
    probe(
        "block_mass main",
        Kernel::BlockMass,
        "main",
        &[("PLAIN_F32", 1.0)],
    ),
    probe("read_bandwidth", Kernel::ReadBandwidth, "main", &[]),
];

/// A buffer binding of a kernel: (group, binding, uniform rather than storage).
type Binding = (u32, u32, bool);

/// The SPIR-V of one probe and its buffer bindings (group, binding, uniform?). The options are
/// wgpu-hal's for a Vulkan 1.3 device with robust buffer access: index clamps, no buffer
/// checks, no workgroup zeroing (the verifier's pipelines ask for none), loop bounding where
/// [`Kernel::loop_bounding_by_default`] keeps it, as the verifier's default checks do.
fn spirv(p: &Probe, variant: Variant) -> Result<(Vec<u32>, Vec<Binding>), String> {
    let src = p.kernel.source_with(variant, p.lane_runs);
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    let mut constants = naga::back::PipelineConstants::default();
    for &(name, value) in [("WG", 256.0), ("SG_LANES", 32.0)]
        .iter()
        .chain(p.constants)
    {
        // A constant the module does not declare would be ignored silently: refuse it, so that
        // a renamed override cannot leave a probe on its default.
        if !module
            .overrides
            .iter()
            .any(|(_, o)| o.name.as_deref() == Some(name))
        {
            return Err(format!("no override named {name}"));
        }
        constants.insert(name.to_string(), value);
    }
    let stage = naga::ShaderStage::Compute;
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((stage, p.entry)),
        &constants,
    )
    .map_err(|e| format!("{e:?}"))?;
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        capabilities: None,
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: p.kernel.loop_bounding_by_default(),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: stage,
        entry_point: p.entry.to_string(),
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| format!("{e:?}"))?;
    let bindings = module
        .global_variables
        .iter()
        .filter_map(|(_, g)| {
            let b = g.binding.as_ref()?;
            match g.space {
                naga::AddressSpace::Uniform => Some((b.group, b.binding, true)),
                naga::AddressSpace::Storage { .. } => Some((b.group, b.binding, false)),
                _ => None,
            }
        })
        .collect();
    Ok((words, bindings))
}

/// A Vulkan device on the first discrete GPU (else the first device), with the extension where
/// the device has it, and 64-bit integers (the Philox variant the verifier takes there).
struct Gpu {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    stats: Option<ash::khr::pipeline_executable_properties::Device>,
    name: String,
}

impl Gpu {
    fn new() -> Result<Gpu, String> {
        // SAFETY: every call below follows the Vulkan specification's valid usage: the create
        // infos outlive the calls, the physical device comes from this instance, and the
        // feature chain holds structures of distinct types.
        unsafe {
            let entry = ash::Entry::load().map_err(|e| format!("Vulkan loader: {e}"))?;
            let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
            let instance = entry
                .create_instance(
                    &vk::InstanceCreateInfo::default().application_info(&app),
                    None,
                )
                .map_err(|e| format!("instance: {e}"))?;
            let all = instance
                .enumerate_physical_devices()
                .map_err(|e| e.to_string())?;
            let discrete = all.iter().copied().find(|&pd| {
                instance.get_physical_device_properties(pd).device_type
                    == vk::PhysicalDeviceType::DISCRETE_GPU
            });
            let pd = discrete
                .or(all.first().copied())
                .ok_or("no Vulkan device")?;
            let props = instance.get_physical_device_properties(pd);
            let name = CStr::from_ptr(props.device_name.as_ptr())
                .to_string_lossy()
                .into_owned();
            let ext = ash::khr::pipeline_executable_properties::NAME;
            let has_ext = instance
                .enumerate_device_extension_properties(pd)
                .map_err(|e| e.to_string())?
                .iter()
                .any(|e| CStr::from_ptr(e.extension_name.as_ptr()) == ext);
            let family = instance
                .get_physical_device_queue_family_properties(pd)
                .iter()
                .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
                .ok_or("no compute queue")? as u32;
            let priority = [1.0f32];
            let queues = [vk::DeviceQueueCreateInfo::default()
                .queue_family_index(family)
                .queue_priorities(&priority)];
            let ext_names = [ext.as_ptr()];
            let mut exec_info =
                vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
                    .pipeline_executable_info(true);
            let mut features = vk::PhysicalDeviceFeatures2::default()
                .features(vk::PhysicalDeviceFeatures::default().shader_int64(true));
            if has_ext {
                features = features.push_next(&mut exec_info);
            }
            let create = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_extension_names(if has_ext { &ext_names } else { &[] })
                .push_next(&mut features);
            let device = instance
                .create_device(pd, &create, None)
                .map_err(|e| format!("device: {e}"))?;
            let stats = has_ext
                .then(|| ash::khr::pipeline_executable_properties::Device::new(&instance, &device));
            Ok(Gpu {
                _entry: entry,
                instance,
                device,
                stats,
                name,
            })
        }
    }

    /// Builds one probe's pipeline and returns its executables' statistics as "name: value"
    /// (empty without the extension).
    fn statistics(
        &self,
        words: &[u32],
        bindings: &[Binding],
        entry: &str,
    ) -> Result<Vec<String>, String> {
        // SAFETY: as in `new`; the objects made here are destroyed before returning, and the
        // statistics are read from a pipeline created with CAPTURE_STATISTICS.
        unsafe {
            let d = &self.device;
            let module = d
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)
                .map_err(|e| e.to_string())?;
            let groups = bindings.iter().map(|b| b.0 + 1).max().unwrap_or(0);
            let mut set_layouts = Vec::new();
            for g in 0..groups {
                let b: Vec<_> = bindings
                    .iter()
                    .filter(|b| b.0 == g)
                    .map(|&(_, binding, uniform)| {
                        vk::DescriptorSetLayoutBinding::default()
                            .binding(binding)
                            .descriptor_type(if uniform {
                                vk::DescriptorType::UNIFORM_BUFFER
                            } else {
                                vk::DescriptorType::STORAGE_BUFFER
                            })
                            .descriptor_count(1)
                            .stage_flags(vk::ShaderStageFlags::COMPUTE)
                    })
                    .collect();
                let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&b);
                set_layouts.push(
                    d.create_descriptor_set_layout(&info, None)
                        .map_err(|e| e.to_string())?,
                );
            }
            let layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts),
                    None,
                )
                .map_err(|e| e.to_string())?;
            let name = CString::new(entry).map_err(|e| e.to_string())?;
            let flags = if self.stats.is_some() {
                vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
            } else {
                vk::PipelineCreateFlags::empty()
            };
            let create = vk::ComputePipelineCreateInfo::default()
                .flags(flags)
                .layout(layout)
                .stage(
                    vk::PipelineShaderStageCreateInfo::default()
                        .stage(vk::ShaderStageFlags::COMPUTE)
                        .module(module)
                        .name(&name),
                );
            let made = d.create_compute_pipelines(vk::PipelineCache::null(), &[create], None);
            let result = match (made, &self.stats) {
                (Err((_, e)), _) => Err(format!("pipeline: {e}")),
                (Ok(p), None) => {
                    d.destroy_pipeline(p[0], None);
                    Ok(Vec::new())
                }
                (Ok(p), Some(ext)) => {
                    let read = executable_statistics(ext, p[0]);
                    d.destroy_pipeline(p[0], None);
                    read
                }
            };
            d.destroy_pipeline_layout(layout, None);
            for s in set_layouts {
                d.destroy_descriptor_set_layout(s, None);
            }
            d.destroy_shader_module(module, None);
            result
        }
    }
}

/// Every executable's statistics of `pipeline`, formatted.
///
/// # Safety
/// `pipeline` was created on `ext`'s device with `CAPTURE_STATISTICS_KHR`.
unsafe fn executable_statistics(
    ext: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let executables = ext
        .get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))
        .map_err(|e| e.to_string())?;
    for i in 0..executables.len() as u32 {
        let info = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(i);
        for s in ext
            .get_pipeline_executable_statistics(&info)
            .map_err(|e| e.to_string())?
        {
            let name = CStr::from_ptr(s.name.as_ptr()).to_string_lossy();
            let value = match s.format {
                vk::PipelineExecutableStatisticFormatKHR::BOOL32 => s.value.b32.to_string(),
                vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                _ => format!("{:.3}", s.value.f64),
            };
            out.push(format!("{name}: {value}"));
        }
    }
    Ok(out)
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: nothing made on the device is alive any more (`statistics` destroys its own).
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Gpu::new()?;
    let variant = Variant {
        int64: true,
        subgroup_lanes: 32,
        immediates: false,
        f16_unpack: true,
    };
    println!("device: {}", gpu.name);
    if gpu.stats.is_none() {
        println!("no VK_KHR_pipeline_executable_properties: pipelines built, no statistics");
    }
    let mut failed = 0;
    for p in PROBES {
        let report = spirv(p, variant)
            .and_then(|(words, bindings)| gpu.statistics(&words, &bindings, p.entry));
        match report {
            Ok(stats) if stats.is_empty() => println!("{:<42} built", p.label),
            Ok(stats) => println!("{:<42} {}", p.label, stats.join(" | ")),
            Err(e) => {
                failed += 1;
                println!("{:<42} FAILED: {e}", p.label);
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} of {} pipelines failed", PROBES.len()).into());
    }
    Ok(())
}

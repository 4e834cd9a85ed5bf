//! Which backend to use: the policy behind [`crate::Verifier::auto`] and `specdec info`.
//!
//! A real GPU (discrete, integrated or virtual) is preferred. A software adapter (llvmpipe /
//! lavapipe, WARP, SwiftShader) is *not* preferred over the native CPU backend, which is much
//! faster than an emulated GPU (measured here on 2 cores: the CPU backend verifies ~10× faster
//! than lavapipe, `benches/results/`). Overrides, strongest first: `SPECDEC_DEVICE=cpu|gpu|auto`,
//! then [`VerifierOptions::device`](crate::VerifierOptions::device); `WGPU_BACKEND` limits the
//! backends looked at and `WGPU_ADAPTER_NAME` picks an adapter by name (naming a software adapter
//! explicitly selects it, which is how the tests pin lavapipe).
//!
//! Surveying adapters creates a Vulkan instance, and Mesa's implicit Vulkan layer
//! `VK_LAYER_MESA_device_select` then asks libwayland for a display to find the default GPU;
//! where no desktop login set `XDG_RUNTIME_DIR` (servers, containers, CI) libwayland prints
//! `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` to stderr, once per
//! adapter survey. [`quiet_vulkan_device_select`] switches that layer off in exactly that case.

use std::fmt;

/// Where verification runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// A real GPU if there is one, else the CPU backend.
    #[default]
    Auto,
    /// A GPU adapter, software ones included; an error if there is none.
    Gpu,
    /// The CPU backend.
    Cpu,
}

impl DeviceChoice {
    /// `SPECDEC_DEVICE` (`cpu`, `gpu` or `auto`, any case), if set.
    pub fn from_env() -> Option<Result<DeviceChoice, String>> {
        let v = std::env::var("SPECDEC_DEVICE").ok()?;
        Some(match v.to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(DeviceChoice::Auto),
            "gpu" => Ok(DeviceChoice::Gpu),
            "cpu" => Ok(DeviceChoice::Cpu),
            other => Err(format!(
                "SPECDEC_DEVICE={other:?} is not one of cpu, gpu, auto"
            )),
        })
    }
}

/// One adapter as `specdec info` shows it.
#[derive(Clone, Debug)]
pub struct AdapterReport {
    /// Adapter name.
    pub name: String,
    /// Backend (Vulkan, Metal, Dx12, Gl).
    pub backend: String,
    /// Discrete / integrated / virtual / CPU (software) / other.
    pub device_type: String,
    /// Driver name and version string.
    pub driver: String,
    /// A software rasteriser (llvmpipe, WARP, SwiftShader): not preferred over the CPU backend.
    pub software: bool,
    /// `max_storage_buffer_binding_size`, bytes.
    pub max_storage_binding: u64,
    /// `max_buffer_size`, bytes.
    pub max_buffer: u64,
    /// `max_storage_buffers_per_shader_stage` (the kernels need 7).
    pub storage_buffers_per_stage: u32,
    /// `max_compute_invocations_per_workgroup`.
    pub max_invocations: u32,
    /// `SHADER_INT64` (faster Philox).
    pub int64: bool,
    /// `TIMESTAMP_QUERY` (GPU timings in the benchmark).
    pub timestamps: bool,
    /// `SUBGROUP` (lane folds through subgroup shuffles).
    pub subgroups: bool,
    /// Whether the kernels can run here (enough storage buffers per stage).
    pub usable: bool,
}

/// What the policy decided, and why.
#[derive(Clone, Debug)]
pub struct Decision {
    /// Every adapter wgpu reports for the allowed backends.
    pub adapters: Vec<AdapterReport>,
    /// The adapter a GPU verifier uses (index into `adapters`), if any.
    pub gpu: Option<usize>,
    /// True when verification runs on the CPU backend.
    pub use_cpu: bool,
    /// The reason, one sentence.
    pub reason: String,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.use_cpu, self.gpu) {
            (true, _) => write!(f, "CPU backend: {}", self.reason),
            (false, Some(i)) => write!(
                f,
                "GPU {} ({}): {}",
                self.adapters[i].name, self.adapters[i].backend, self.reason
            ),
            (false, None) => write!(f, "no backend: {}", self.reason),
        }
    }
}

/// Turns Mesa's `VK_LAYER_MESA_device_select` Vulkan layer off (`NODEVICE_SELECT=1`, the
/// switch its manifest names) when it could only print an error: no Wayland display is reachable
/// (`XDG_RUNTIME_DIR` unset or not an absolute path, `WAYLAND_DISPLAY` not an absolute path,
/// no `WAYLAND_SOCKET`) and nothing asks the layer for a choice (`MESA_VK_DEVICE_SELECT`,
/// `DRI_PRIME` and `NODEVICE_SELECT` unset). The layer only reorders the GPUs it reports, which
/// the policy does itself, by type (see [`decide`]). Returns whether it set the variable.
///
/// It sets an environment variable, so call it at the start of `main`, before any thread that
/// may read the environment is started (the `specdec` command and the examples do).
pub fn quiet_vulkan_device_select() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let absolute =
        |k: &str| std::env::var_os(k).is_some_and(|v| v.to_string_lossy().starts_with('/'));
    let wayland_reachable =
        absolute("XDG_RUNTIME_DIR") || absolute("WAYLAND_DISPLAY") || set("WAYLAND_SOCKET");
    let layer_asked = set("MESA_VK_DEVICE_SELECT") || set("DRI_PRIME") || set("NODEVICE_SELECT");
    if wayland_reachable || layer_asked {
        return false;
    }
    std::env::set_var("NODEVICE_SELECT", "1");
    true
}

fn report(a: &wgpu::Adapter) -> AdapterReport {
    let i = a.get_info();
    let l = a.limits();
    let f = a.features();
    AdapterReport {
        name: i.name.clone(),
        backend: format!("{:?}", i.backend),
        device_type: format!("{:?}", i.device_type),
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
        software: i.device_type == wgpu::DeviceType::Cpu,
        max_storage_binding: l.max_storage_buffer_binding_size,
        max_buffer: l.max_buffer_size,
        storage_buffers_per_stage: l.max_storage_buffers_per_shader_stage,
        max_invocations: l.max_compute_invocations_per_workgroup,
        int64: f.contains(wgpu::Features::SHADER_INT64),
        timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
        subgroups: f.contains(wgpu::Features::SUBGROUP),
        usable: l.max_storage_buffers_per_shader_stage >= 7,
    }
}

/// Surveys the adapters and applies the policy for `requested` (overridden by `SPECDEC_DEVICE`).
pub fn decide(requested: DeviceChoice) -> Result<Decision, crate::Error> {
    let choice = match DeviceChoice::from_env() {
        Some(Ok(c)) => c,
        Some(Err(msg)) => return Err(crate::Error::NoAdapter { detail: msg }),
        None => requested,
    };
    let all = crate::gpu::enumerate();
    let adapters: Vec<AdapterReport> = all.iter().map(report).collect();
    if choice == DeviceChoice::Cpu {
        return Ok(Decision {
            adapters,
            gpu: None,
            use_cpu: true,
            reason: "requested (SPECDEC_DEVICE=cpu or VerifierOptions::device)".into(),
        });
    }
    let named = std::env::var("WGPU_ADAPTER_NAME").ok();
    let best = crate::gpu::rank_adapters(&all)
        .into_iter()
        .find(|&i| adapters[i].usable);
    let decision = match best {
        None if choice == DeviceChoice::Gpu => {
            return Err(crate::Error::NoAdapter {
                detail: format!(
                    "SPECDEC_DEVICE / VerifierOptions::device asks for a GPU; adapters seen: {}",
                    names(&adapters)
                ),
            })
        }
        None => Decision {
            reason: format!("no usable GPU adapter (seen: {})", names(&adapters)),
            adapters,
            gpu: None,
            use_cpu: true,
        },
        Some(i) if adapters[i].software && choice == DeviceChoice::Auto && named.is_none() => {
            Decision {
                reason: format!(
                "the only adapter is software ({}); the CPU backend is faster than an emulated GPU \
                 (set SPECDEC_DEVICE=gpu or WGPU_ADAPTER_NAME to use it anyway)",
                adapters[i].name
            ),
                adapters,
                gpu: Some(i),
                use_cpu: true,
            }
        }
        Some(i) => Decision {
            reason: match (&named, adapters[i].software) {
                (Some(n), _) => format!("WGPU_ADAPTER_NAME={n:?} selects it"),
                (None, true) => {
                    "SPECDEC_DEVICE=gpu asks for a GPU; this software adapter is the only one"
                        .into()
                }
                (None, false) => format!(
                    "the best {} adapter found",
                    adapters[i].device_type.to_lowercase()
                ),
            },
            adapters,
            gpu: Some(i),
            use_cpu: false,
        },
    };
    Ok(decision)
}

fn names(a: &[AdapterReport]) -> String {
    if a.is_empty() {
        return "none".into();
    }
    a.iter()
        .map(|r| format!("{} ({}, {})", r.name, r.backend, r.device_type))
        .collect::<Vec<_>>()
        .join(", ")
}

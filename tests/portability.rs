//! Every kernel, `gather_rows` (the `speculative` module's kernel) included, translates, with naga's
//! own backends, to every shading language wgpu may hand it to: SPIR-V (Vulkan), MSL (Metal),
//! HLSL shader model 6.0 (DX12), GLSL ES 3.10 and GLSL 430 (GL / GLES). Each entry point is
//! translated for each workgroup size the library can build (the `WG` override), after the
//! overrides are resolved the way wgpu resolves them
//! (`naga::back::pipeline_constants::process_overrides`). No GPU is needed.
//!
//! Where the external validators are installed, the outputs are also checked by them:
//! `spirv-val --target-env vulkan1.1` (Debian `spirv-tools`) and `glslangValidator`
//! (Debian `glslang-tools`). Without them the validation is skipped with a message, unless
//! `CI=true`, where a missing validator fails the test. The translations are written to
//! `$CARGO_TARGET_TMPDIR/portability/` for inspection.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use naga::back::{glsl, hlsl, msl, pipeline_constants, spv, PipelineConstants};
use naga::valid::ModuleInfo;
use naga::{Module, ShaderStage};
use specdec::shaders::{validate_all, validate_gather_rows, validate_variant, Kernel, Variant};

/// `WG` override values the library builds (256 normally, less on devices with lower limits).
const WORKGROUP_SIZES: [u32; 3] = [32, 64, 256];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Spirv,
    Msl,
    Hlsl,
    GlslEs310,
    Glsl430,
}

impl Backend {
    const ALL: [Backend; 5] = [
        Backend::Spirv,
        Backend::Msl,
        Backend::Hlsl,
        Backend::GlslEs310,
        Backend::Glsl430,
    ];

    fn name(self) -> &'static str {
        match self {
            Backend::Spirv => "SPIR-V 1.3",
            Backend::Msl => "MSL 2.0",
            Backend::Hlsl => "HLSL sm6.0",
            Backend::GlslEs310 => "GLSL ES 310",
            Backend::Glsl430 => "GLSL 430",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Backend::Spirv => "spv",
            Backend::Msl => "metal",
            Backend::Hlsl => "hlsl",
            Backend::GlslEs310 => "es310.comp",
            Backend::Glsl430 => "gl430.comp",
        }
    }
}

/// A translated shader.
enum Output {
    Words(Vec<u32>),
    Text(String),
}

/// An external validator, if it runs here.
struct Validator {
    program: &'static str,
    package: &'static str,
    found: bool,
}

impl Validator {
    fn probe(program: &'static str, package: &'static str) -> Self {
        let found = Command::new(program).arg("--version").output().is_ok();
        Validator {
            program,
            package,
            found,
        }
    }

    /// Runs the validator with `args`; `Err` carries its output when it rejects the file.
    fn run(&self, args: &[&str], file: &Path) -> Result<(), String> {
        let out = Command::new(self.program)
            .args(args)
            .arg(file)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.program))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} {} {}: {}\n{}{}",
                self.program,
                args.join(" "),
                file.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

/// Entry points whose workgroup size is fixed at 64, not `WG`.
const FIXED_64: [&str; 13] = [
    "row_stats.block",
    "row_stats_verify.block_verify",
    "row_stats_verify_lanes.block_verify",
    "verify.main",
    "verify.block_settle",
    "verify.tree_merge",
    "verify.tree_walk",
    "verify.tree_merge_walk",
    "block_mass.main",
    "block_mass.tree",
    "block_mass.tree_mass",
    "block_mass.tree_fold",
    "residual_argmax.merge",
];

/// Entry points whose workgroup size is fixed at 256 (one lane per histogram bin), not `WG`.
const FIXED_256: [&str; 4] = [
    "cutoff.init",
    "cutoff.pick_max",
    "cutoff.pick_top_k",
    "cutoff.pick",
];

/// Resolves the overrides for one entry point and workgroup size, as wgpu does before a backend.
fn resolve<'a>(
    module: &'a Module,
    info: &'a ModuleInfo,
    entry: &str,
    qualified: &str,
    wg: u32,
    sg_lanes: u32,
) -> Result<(Module, ModuleInfo), String> {
    let mut constants = PipelineConstants::default();
    constants.insert("WG".to_string(), f64::from(wg));
    // The kernels declare SG_LANES with the portable default 1; gather_rows does not declare it.
    if sg_lanes > 1 {
        constants.insert("SG_LANES".to_string(), f64::from(sg_lanes));
    }
    let (module, info) = pipeline_constants::process_overrides(
        module,
        info,
        Some((ShaderStage::Compute, entry)),
        &constants,
    )
    .map_err(|e| format!("process_overrides: {e}"))?;
    let (module, info) = (module.into_owned(), info.into_owned());
    // naga 30 keeps the `overrides` arena (its doc says otherwise); what matters to the backends
    // is that no expression still refers to one.
    if module
        .global_expressions
        .iter()
        .any(|(_, e)| matches!(e, naga::Expression::Override(_)))
    {
        return Err("override expressions left after process_overrides".to_string());
    }
    let ep = module
        .entry_points
        .iter()
        .find(|ep| ep.name == entry)
        .ok_or_else(|| format!("entry point {entry} lost by process_overrides"))?;
    // Entry points sized by `WG` must take the override; the others (64 or 256 lanes by design) keep
    // their literal size.
    let expected = if FIXED_64.contains(&qualified) {
        [64, 1, 1]
    } else if FIXED_256.contains(&qualified) {
        [256, 1, 1]
    } else {
        [wg, 1, 1]
    };
    if ep.workgroup_size_overrides.is_some() || ep.workgroup_size != expected {
        return Err(format!(
            "workgroup size {:?} after overriding WG = {wg}",
            ep.workgroup_size
        ));
    }
    Ok((module, info))
}

/// The bounds-check policies wgpu uses on devices without robust buffer access (the strictest).
fn restrict_all() -> naga::proc::BoundsCheckPolicies {
    let restrict = naga::proc::BoundsCheckPolicy::Restrict;
    naga::proc::BoundsCheckPolicies {
        index: restrict,
        buffer: restrict,
        image_load: restrict,
        binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
    }
}

fn translate(
    backend: Backend,
    module: &Module,
    info: &ModuleInfo,
    entry: &str,
) -> Result<Output, String> {
    let stage = ShaderStage::Compute;
    match backend {
        Backend::Spirv => {
            let options = spv::Options {
                lang_version: (1, 3),
                bounds_check_policies: restrict_all(),
                ..spv::Options::default()
            };
            let pipeline = spv::PipelineOptions {
                shader_stage: stage,
                entry_point: entry.to_string(),
            };
            spv::write_vec(module, info, &options, Some(&pipeline))
                .map(Output::Words)
                .map_err(|e| e.to_string())
        }
        Backend::Msl => {
            let options = msl::Options {
                lang_version: (2, 0),
                bounds_check_policies: restrict_all(),
                ..msl::Options::default()
            };
            let pipeline = msl::PipelineOptions {
                entry_point: Some((stage, entry.to_string())),
                ..msl::PipelineOptions::default()
            };
            msl::write_string(module, info, &options, &pipeline)
                .map(|(text, _)| Output::Text(text))
                .map_err(|e| e.to_string())
        }
        Backend::Hlsl => {
            let options = hlsl::Options {
                shader_model: hlsl::ShaderModel::V6_0,
                ..hlsl::Options::default()
            };
            let pipeline = hlsl::PipelineOptions {
                entry_point: Some((stage, entry.to_string())),
            };
            let mut text = String::new();
            hlsl::Writer::new(&mut text, &options, &pipeline)
                .write(module, info, None)
                .map_err(|e| e.to_string())?;
            Ok(Output::Text(text))
        }
        Backend::GlslEs310 | Backend::Glsl430 => {
            let version = if backend == Backend::GlslEs310 {
                glsl::Version::new_gles(310)
            } else {
                glsl::Version::Desktop(430)
            };
            // One GL binding slot per WGSL binding (every kernel uses group 0 only).
            let binding_map = module
                .global_variables
                .iter()
                .filter_map(|(_, g)| g.binding)
                .map(|b| {
                    assert_eq!(b.group, 0, "GLSL binding map assumes one bind group");
                    (b, u8::try_from(b.binding).expect("binding index fits u8"))
                })
                .collect();
            let options = glsl::Options {
                version,
                binding_map,
                ..glsl::Options::default()
            };
            let pipeline = glsl::PipelineOptions {
                shader_stage: stage,
                entry_point: entry.to_string(),
                multiview: None,
            };
            let mut text = String::new();
            glsl::Writer::new(&mut text, module, info, &options, &pipeline, restrict_all())
                .and_then(|mut w| w.write())
                .map_err(|e| e.to_string())?;
            Ok(Output::Text(text))
        }
    }
}

fn write_output(path: &Path, output: &Output) {
    let bytes: Vec<u8> = match output {
        Output::Words(words) => words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        Output::Text(text) => text.clone().into_bytes(),
    };
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Per (kernel, backend): variants translated, variants validated, variants attempted.
#[derive(Clone, Copy, Default)]
struct Cell {
    translated: usize,
    validated: usize,
    total: usize,
}

#[test]
fn every_kernel_translates_to_every_backend() {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let spirv_val = Validator::probe("spirv-val", "spirv-tools");
    let glslang = Validator::probe("glslangValidator", "glslang-tools");
    let mut failures: Vec<String> = Vec::new();
    for v in [&spirv_val, &glslang] {
        if !v.found {
            println!(
                "{}: validator not found, skipped validation (apt-get install {})",
                v.program, v.package
            );
            if ci {
                failures.push(format!(
                    "{} not found but CI=true (install the {} package)",
                    v.program, v.package
                ));
            }
        }
    }

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("portability");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));

    // (name, entry points, module): every `Kernel`, then `gather_rows`. gather_rows is not a
    // `Kernel` variant and is added here rather than to the enum: the verifier's backend builds a
    // pipeline and a bind group layout for every `Kernel` on every device, so adding it there
    // would change what `Verifier::new` builds (and `Kernel::ALL`'s users) for the sake of a
    // test; this only changes the test. Its source comes from `validate_gather_rows`, the same
    // parse and validation the device's source gets.
    // validate_all's last module is row_stats_verify's second text (its lane-array folds),
    // named apart here so that its rows and files do not take the first text's.
    let mut modules: Vec<(&'static str, &[&str], Module, ModuleInfo)> = validate_all()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .enumerate()
        .map(|(i, (kernel, module, info))| {
            let name = if i < Kernel::ALL.len() {
                kernel.name()
            } else {
                "row_stats_verify_lanes"
            };
            (name, kernel.entry_points(), module, info)
        })
        .collect();
    let (module, info) = validate_gather_rows().unwrap_or_else(|e| panic!("{e}"));
    modules.push(("gather_rows", &["main"], module, info));
    let mut table: Vec<(&str, [Cell; 5])> = Vec::new();
    for &(name, entry_points, ref module, ref info) in &modules {
        let mut cells = [Cell::default(); 5];
        for &entry in entry_points {
            for wg in WORKGROUP_SIZES {
                let variant = format!("{name}.{entry} WG={wg}");
                let qualified = format!("{name}.{entry}");
                let resolved = resolve(module, info, entry, &qualified, wg, 1);
                for (b, backend) in Backend::ALL.into_iter().enumerate() {
                    let cell = &mut cells[b];
                    cell.total += 1;
                    let (module, info) = match &resolved {
                        Ok(r) => r,
                        Err(e) => {
                            failures.push(format!("{variant} {}: {e}", backend.name()));
                            continue;
                        }
                    };
                    let output = match translate(backend, module, info, entry) {
                        Ok(o) => o,
                        Err(e) => {
                            failures.push(format!(
                                "{variant} {}: translation failed: {e}",
                                backend.name()
                            ));
                            continue;
                        }
                    };
                    cell.translated += 1;
                    let path = dir.join(format!("{name}.{entry}.wg{wg}.{}", backend.extension()));
                    write_output(&path, &output);
                    let checked = match backend {
                        Backend::Spirv if spirv_val.found => {
                            Some(spirv_val.run(&["--target-env", "vulkan1.1"], &path))
                        }
                        Backend::GlslEs310 | Backend::Glsl430 if glslang.found => {
                            Some(glslang.run(&["-S", "comp"], &path))
                        }
                        _ => None,
                    };
                    match checked {
                        Some(Ok(())) => cell.validated += 1,
                        Some(Err(e)) => failures.push(format!(
                            "{variant} {}: validation failed: {e}",
                            backend.name()
                        )),
                        None => {}
                    }
                }
            }
        }
        table.push((name, cells));
    }

    // Summary: per kernel and backend, "translated/total" then "validated/total" ("-": no
    // validator for that language here).
    let validates = |b: Backend| match b {
        Backend::Spirv => spirv_val.found,
        Backend::GlslEs310 | Backend::Glsl430 => glslang.found,
        Backend::Msl | Backend::Hlsl => false,
    };
    let mut summary = String::new();
    let _ = write!(summary, "{:<16}", "kernel");
    for backend in Backend::ALL {
        let _ = write!(summary, " | {:<13}", backend.name());
    }
    summary.push('\n');
    for (name, cells) in &table {
        let _ = write!(summary, "{name:<16}");
        for (b, cell) in cells.iter().enumerate() {
            let validated = if validates(Backend::ALL[b]) {
                format!("{}/{}", cell.validated, cell.total)
            } else {
                "-".to_string()
            };
            let text = format!("{}/{} val {validated}", cell.translated, cell.total);
            let _ = write!(summary, " | {text:<13}");
        }
        summary.push('\n');
    }
    println!(
        "translated / validated per kernel x backend (entry points x WG {WORKGROUP_SIZES:?}); \
         outputs in {}\n{summary}",
        dir.display()
    );

    assert!(
        failures.is_empty(),
        "{} portability failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The subgroup variant (`Variant::subgroup_lanes`; row_stats, row_stats_verify and block_mass fold the lanes
/// below `SG_LANES` through shuffles) translates to the languages of the backends that offer
/// wgpu's `SUBGROUP` (SPIR-V, MSL, HLSL shader model 6.0), for subgroups of 8, 32 and 64 lanes,
/// and its SPIR-V passes spirv-val where it is installed (required with `CI=true`). The f16
/// rows' device conversion (`Variant::f16_unpack`) is in this variant too, as on a device that
/// passed its check.
#[test]
fn subgroup_folds_translate_to_the_subgroup_backends() {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let spirv_val = Validator::probe("spirv-val", "spirv-tools");
    assert!(spirv_val.found || !ci, "spirv-val not found but CI=true");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("portability-subgroups");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let modules = validate_variant(Variant {
        int64: false,
        subgroup_lanes: 32,
        immediates: false,
        f16_unpack: true,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let mut failures = Vec::new();
    let mut translated = 0;
    for (i, (kernel, module, info)) in modules.iter().enumerate() {
        if !matches!(
            kernel,
            Kernel::RowStats | Kernel::RowStatsVerify | Kernel::BlockMass
        ) {
            continue;
        }
        // The last module is row_stats_verify's second text, as in the table above.
        let name = if i < Kernel::ALL.len() {
            kernel.name()
        } else {
            "row_stats_verify_lanes"
        };
        for &entry in kernel.entry_points() {
            for (wg, sg) in [(64, 8), (256, 32), (256, 64)] {
                let qualified = format!("{name}.{entry}");
                let (module, info) = match resolve(module, info, entry, &qualified, wg, sg) {
                    Ok(r) => r,
                    Err(e) => {
                        failures.push(format!("{qualified} WG={wg} SG={sg}: {e}"));
                        continue;
                    }
                };
                for backend in [Backend::Spirv, Backend::Msl, Backend::Hlsl] {
                    let output = match translate(backend, &module, &info, entry) {
                        Ok(o) => o,
                        Err(e) => {
                            failures.push(format!("{qualified} SG={sg} {}: {e}", backend.name()));
                            continue;
                        }
                    };
                    translated += 1;
                    let path =
                        dir.join(format!("{qualified}.wg{wg}.sg{sg}.{}", backend.extension()));
                    write_output(&path, &output);
                    if backend == Backend::Spirv && spirv_val.found {
                        if let Err(e) = spirv_val.run(&["--target-env", "vulkan1.1"], &path) {
                            failures.push(format!("{qualified} SG={sg} spirv-val: {e}"));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // row_stats' four entry points, row_stats_verify's one in each of its two texts and
    // block_mass' four, three sizes, three languages.
    assert_eq!(translated, 10 * 3 * 3);
}

//! The WGSL sources, one file per kernel, each prefixed with `shaders/common.wgsl` (WGSL has no
//! includes). The sources are compiled into the crate so a binary needs no shader files at run
//! time; `validate_all` runs naga's parser and validator on each, with no GPU.

/// Declarations shared by every kernel (layouts, Philox, noise).
pub const COMMON: &str = include_str!("../shaders/common.wgsl");
/// The row bindings (0–2) and their loaders `t_elem` / `d_elem`, shared by the kernels that
/// read logit rows ([`Kernel::reads_rows`]).
pub const ROWS: &str = include_str!("../shaders/rows.wgsl");
/// `mul_wide` for any device (the high word from 16-bit halves).
pub const MUL_WIDE_U32: &str = include_str!("../shaders/mul_wide_u32.wgsl");
/// `mul_wide` for devices with `SHADER_INT64` (one wide multiply).
pub const MUL_WIDE_INT64: &str = include_str!("../shaders/mul_wide_int64.wgsl");

/// Lane exchange through subgroup shuffles.
pub const LANES_SUBGROUP: &str = include_str!("../shaders/lanes_subgroup.wgsl");
/// Lane exchange for any device: every fold level through workgroup memory.
pub const LANES_PORTABLE: &str = include_str!("../shaders/lanes_portable.wgsl");

/// f16 widening by the device's `unpack2x16float` (`Variant::f16_unpack`; needs wgpu's
/// `DownlevelFlags::SHADER_F16_IN_F32`).
pub const F16_UNPACK_DEVICE: &str = include_str!("../shaders/f16_unpack_device.wgsl");
/// f16 widening by integer operations, for any device.
pub const F16_UNPACK_INTEGER: &str = include_str!("../shaders/f16_unpack_integer.wgsl");

/// The Params of the verification kernels as a uniform slot at binding 0 (every device).
pub const PARAMS_UNIFORM: &str = include_str!("../shaders/params_uniform.wgsl");
/// The Params of the verification kernels as immediate data (needs `wgpu::Features::IMMEDIATES`).
pub const PARAMS_IMMEDIATE: &str = include_str!("../shaders/params_immediate.wgsl");

/// row_stats' statistics pass (`shaders/row_stats.wgsl`): [`Kernel::RowStats`]' body and a
/// companion of [`Kernel::RowStatsVerify`].
const ROW_STATS: &str = include_str!("../shaders/row_stats.wgsl");
/// The merge, decisions and settling of one request, shared by [`Kernel::Verify`] and
/// [`Kernel::RowStatsVerify`] (`shaders/verify_request.wgsl`).
pub const VERIFY_REQUEST: &str = include_str!("../shaders/verify_request.wgsl");
/// The logprob writer `put_logprobs`, shared by the kernels that write the output words
/// ([`Kernel::Verify`], [`Kernel::RowStatsVerify`], [`Kernel::ResidualArgmax`];
/// `shaders/put_logprobs.wgsl`).
pub const PUT_LOGPROBS: &str = include_str!("../shaders/put_logprobs.wgsl");
/// verify_request's row-run folds in a workgroup array of their own ([`Kernel::Verify`], and
/// [`Kernel::RowStatsVerify`] up to its `SPECIAL_SHARED_RUNS` pipelines;
/// `shaders/verify_runs_own.wgsl`).
pub const VERIFY_RUNS_OWN: &str = include_str!("../shaders/verify_runs_own.wgsl");
/// verify_request's row-run folds in row_stats' lane arrays ([`Kernel::RowStatsVerify`]'s
/// text for its `SPECIAL_SHARED_RUNS` pipelines, [`Kernel::source_with`];
/// `shaders/verify_runs_lanes.wgsl`).
pub const VERIFY_RUNS_LANES: &str = include_str!("../shaders/verify_runs_lanes.wgsl");
/// row_stats' chunk partials as plain structs ([`Kernel::RowStats`]).
pub const PARTIALS_PLAIN: &str = include_str!("../shaders/partials_plain.wgsl");
/// row_stats' chunk partials as atomic words ([`Kernel::RowStatsVerify`]).
pub const PARTIALS_ATOMIC: &str = include_str!("../shaders/partials_atomic.wgsl");

/// A pipeline variant: which optional device features the kernels use. Every variant computes
/// the same bits; the portable one (`Variant::default()`) runs everywhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Use 64-bit integer multiplies for Philox (needs `wgpu::Features::SHADER_INT64`).
    pub int64: bool,
    /// The subgroup width the folds may exchange lanes across in registers (the adapter's
    /// smallest subgroup size; needs `wgpu::Features::SUBGROUP`), or 0: every fold level through
    /// workgroup memory.
    pub subgroup_lanes: u32,
    /// The verification kernels take their Params as immediate data set with each dispatch
    /// instead of a uniform slot at binding 0 (needs `wgpu::Features::IMMEDIATES` and
    /// [`crate::layout::Params`]' size within the device's `max_immediate_size`).
    pub immediates: bool,
    /// The device's `unpack2x16float` widens binary16 rows ([`F16_UNPACK_DEVICE`] in place of
    /// [`F16_UNPACK_INTEGER`]), where a check when the verifier is made found it exact for all
    /// 65,536 values (needs `wgpu::DownlevelFlags::SHADER_F16_IN_F32`). The same bits either
    /// way.
    pub f16_unpack: bool,
}

impl Variant {
    /// The `SG_LANES` override constant of every kernel of this variant (1: no subgroups).
    pub fn sg_lanes(self) -> u32 {
        self.subgroup_lanes.max(1)
    }

    /// The optional features in use, as `describe()` and the benchmark's adapter line print
    /// them: any of `", int64 Philox"`, `", 32-lane subgroup folds"`,
    /// `", Params as immediates"` and `", f16 unpack"`, in that order, or nothing.
    pub fn describe(self) -> String {
        let mut s = String::new();
        if self.int64 {
            s.push_str(", int64 Philox");
        }
        if self.subgroup_lanes > 1 {
            s.push_str(&format!(", {}-lane subgroup folds", self.subgroup_lanes));
        }
        if self.immediates {
            s.push_str(", Params as immediates");
        }
        if self.f16_unpack {
            s.push_str(", f16 unpack");
        }
        s
    }
}

/// A kernel: one WGSL file, one Rust module, one CPU twin, one pipeline label prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Per-row logit cut-offs of top-k / top-p / min-p (`shaders/cutoff.wgsl`).
    Cutoff,
    /// Per-row statistics over vocab blocks (`shaders/row_stats.wgsl`).
    RowStats,
    /// row_stats whose last workgroup per request also verifies it, in place of verify's
    /// dispatch (`shaders/row_stats_verify.wgsl`, with row_stats' and verify's shared code).
    RowStatsVerify,
    /// The per-request verify loop (`shaders/verify.wgsl`).
    Verify,
    /// Block verification's residual masses with a draft distribution
    /// (`shaders/block_mass.wgsl`).
    BlockMass,
    /// The vocabulary-wide residual / bonus argmax (`shaders/residual_argmax.wgsl`).
    ResidualArgmax,
    /// Test kernel: Philox words and noise for given counters (`shaders/rng_check.wgsl`).
    RngCheck,
    /// Benchmark kernel: the read-bandwidth ceiling (`shaders/read_bandwidth.wgsl`).
    ReadBandwidth,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 8] = [
        Kernel::Cutoff,
        Kernel::RowStats,
        Kernel::RowStatsVerify,
        Kernel::Verify,
        Kernel::BlockMass,
        Kernel::ResidualArgmax,
        Kernel::RngCheck,
        Kernel::ReadBandwidth,
    ];

    /// The kernel's name: its file stem and the prefix of its pipeline labels.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Cutoff => "cutoff",
            Kernel::RowStats => "row_stats",
            Kernel::RowStatsVerify => "row_stats_verify",
            Kernel::Verify => "verify",
            Kernel::BlockMass => "block_mass",
            Kernel::ResidualArgmax => "residual_argmax",
            Kernel::RngCheck => "rng_check",
            Kernel::ReadBandwidth => "read_bandwidth",
        }
    }

    /// The kernel's own source (without the common prefix).
    pub fn body(self) -> &'static str {
        match self {
            Kernel::Cutoff => include_str!("../shaders/cutoff.wgsl"),
            Kernel::RowStats => ROW_STATS,
            Kernel::RowStatsVerify => include_str!("../shaders/row_stats_verify.wgsl"),
            Kernel::Verify => include_str!("../shaders/verify.wgsl"),
            Kernel::BlockMass => include_str!("../shaders/block_mass.wgsl"),
            Kernel::ResidualArgmax => include_str!("../shaders/residual_argmax.wgsl"),
            Kernel::RngCheck => include_str!("../shaders/rng_check.wgsl"),
            Kernel::ReadBandwidth => include_str!("../shaders/read_bandwidth.wgsl"),
        }
    }

    /// The files appended after the kernel's own body (its share of code that two kernels use),
    /// by file stem and source.
    pub fn companions(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kernel::RowStats => &[("partials_plain", PARTIALS_PLAIN)],
            Kernel::RowStatsVerify => &[
                ("row_stats", ROW_STATS),
                ("partials_atomic", PARTIALS_ATOMIC),
                ("verify_request", VERIFY_REQUEST),
                ("put_logprobs", PUT_LOGPROBS),
                ("verify_runs_own", VERIFY_RUNS_OWN),
            ],
            Kernel::Verify => &[
                ("verify_request", VERIFY_REQUEST),
                ("put_logprobs", PUT_LOGPROBS),
                ("verify_runs_own", VERIFY_RUNS_OWN),
            ],
            Kernel::ResidualArgmax => &[("put_logprobs", PUT_LOGPROBS)],
            _ => &[],
        }
    }

    /// The entry points the library dispatches.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Kernel::Cutoff => &[
                "init",
                "scan_max",
                "pick_max",
                "scan_top_k",
                "pick_top_k",
                "scan",
                "pick",
            ],
            Kernel::RowStats => &[
                "block",
                "block_wide",
                "block_wide_settle",
                "block_wide_settle_blocks",
            ],
            Kernel::RowStatsVerify => &["block_verify"],
            Kernel::Verify => &[
                "main",
                "block_settle",
                "tree_merge",
                "tree_walk",
                "tree_merge_walk",
            ],
            Kernel::BlockMass => &["main", "tree", "tree_mass", "tree_fold"],
            Kernel::ResidualArgmax => &["block", "merge"],
            Kernel::RngCheck => &["main"],
            Kernel::ReadBandwidth => &["main"],
        }
    }

    /// True for the kernels that read logit rows: they bind them through [`ROWS`].
    pub fn reads_rows(self) -> bool {
        matches!(
            self,
            Kernel::Cutoff
                | Kernel::RowStats
                | Kernel::RowStatsVerify
                | Kernel::BlockMass
                | Kernel::ResidualArgmax
        )
    }

    /// Whether the kernel keeps wgpu's loop-bounding counter when the options name no runtime
    /// checks. Every loop here runs to a bound the host validates, so the counter only costs
    /// time; it is dropped where an H200 measured that cost (residual_argmax 10-20 %, row_stats
    /// 1-3 %) and kept where dropping it made the kernel slower (verify: +2-6 µs, its merge
    /// loop compiled differently). Same-process A/B in `docs/performance.md`.
    pub fn loop_bounding_by_default(self) -> bool {
        !matches!(self, Kernel::RowStats | Kernel::ResidualArgmax)
    }

    /// True for the verification kernels: they read the window's `Params` (binding 0, or
    /// immediate data in a [`Variant`] with `immediates`).
    pub fn takes_params(self) -> bool {
        !matches!(self, Kernel::RngCheck | Kernel::ReadBandwidth)
    }

    /// The full source handed to the device for `variant`: common declarations, the f16
    /// widening, `mul_wide` and lane exchange of the variant, the Params declaration of the
    /// variant for the kernels that take them, [`ROWS`] for the kernels that read rows, then the
    /// kernel and its [`Kernel::companions`].
    ///
    /// Development hook: when `SPECDEC_SHADER_DIR` is set and holds `<kernel>.wgsl`, that file
    /// replaces the built-in kernel body, and `<kernel>.<stem>.wgsl` or `<stem>.wgsl` a companion
    /// (to time shader experiments on a device without rebuilding). Never set it in production.
    pub fn source(self, variant: Variant) -> String {
        self.source_with(variant, false)
    }

    /// [`Kernel::source`], and with `lane_runs` row_stats_verify's other text: verify's row-run
    /// folds in row_stats' lane arrays (`verify_runs_lanes` in place of `verify_runs_own`), the
    /// module of its `SPECIAL_SHARED_RUNS` pipelines. A module of its own, not an `override`
    /// branch: a pipeline allocates every workgroup array its module declares, also one its
    /// constants rule out (H200). Other kernels ignore `lane_runs`.
    pub fn source_with(self, variant: Variant, lane_runs: bool) -> String {
        let mul_wide = if variant.int64 {
            MUL_WIDE_INT64
        } else {
            MUL_WIDE_U32
        };
        let body = shader_dir_file(self.name()).unwrap_or_else(|| self.body().to_string());
        let rows = if self.reads_rows() { ROWS } else { "" };
        // No `enable subgroups;` directive: naga 30 rejects it as not yet implemented and
        // offers the subgroup builtins to modules validated with its SUBGROUP capability,
        // which wgpu grants on devices created with the feature.
        let lanes = if variant.subgroup_lanes > 1 {
            LANES_SUBGROUP
        } else {
            LANES_PORTABLE
        };
        let f16 = if variant.f16_unpack {
            F16_UNPACK_DEVICE
        } else {
            F16_UNPACK_INTEGER
        };
        let params = match (self.takes_params(), variant.immediates) {
            (false, _) => "",
            (true, false) => PARAMS_UNIFORM,
            (true, true) => PARAMS_IMMEDIATE,
        };
        let companions: Vec<String> = self
            .companions()
            .iter()
            .map(
                |&(stem, src)| match (stem, lane_runs && self == Kernel::RowStatsVerify) {
                    ("verify_runs_own", true) => ("verify_runs_lanes", VERIFY_RUNS_LANES),
                    _ => (stem, src),
                },
            )
            .map(|(stem, src)| {
                shader_dir_file(&format!("{}.{stem}", self.name()))
                    .or_else(|| shader_dir_file(stem))
                    .unwrap_or_else(|| src.to_string())
            })
            .collect();
        let companions = companions.join("\n");
        format!("{COMMON}\n{f16}\n{mul_wide}\n{lanes}\n{params}\n{rows}\n{body}\n{companions}")
    }
}

/// `<stem>.wgsl` from `SPECDEC_SHADER_DIR` when the variable is set and the file exists
/// ([`Kernel::source`]'s development hook).
fn shader_dir_file(stem: &str) -> Option<String> {
    let dir = std::env::var_os("SPECDEC_SHADER_DIR")?;
    std::fs::read_to_string(std::path::Path::new(&dir).join(format!("{stem}.wgsl"))).ok()
}

/// Parses and validates every kernel's portable variant with naga (no GPU needed). Returns the
/// validated modules: one per kernel in [`Kernel::ALL`]'s order, then row_stats_verify's second
/// text ([`Kernel::source_with`] with `lane_runs`).
pub fn validate_all() -> Result<Vec<(Kernel, naga::Module, naga::valid::ModuleInfo)>, String> {
    validate_variant(Variant::default())
}

/// Parses and validates every kernel of `variant`, with the naga capabilities it needs (the
/// modules of [`validate_all`]).
pub fn validate_variant(
    variant: Variant,
) -> Result<Vec<(Kernel, naga::Module, naga::valid::ModuleInfo)>, String> {
    let mut caps = naga::valid::Capabilities::empty();
    if variant.int64 {
        caps |= naga::valid::Capabilities::SHADER_INT64;
    }
    if variant.subgroup_lanes > 1 {
        caps |= naga::valid::Capabilities::SUBGROUP;
    }
    if variant.immediates {
        caps |= naga::valid::Capabilities::IMMEDIATES;
    }
    if variant.f16_unpack {
        caps |= naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    }
    // Every kernel's text, then row_stats_verify's other one (its lane_runs pipelines).
    let texts = Kernel::ALL.iter().map(|&k| (k, k.source(variant))).chain([(
        Kernel::RowStatsVerify,
        Kernel::RowStatsVerify.source_with(variant, true),
    )]);
    texts
        .map(|(k, src)| {
            let module = naga::front::wgsl::parse_str(&src)
                .map_err(|e| format!("{}.wgsl: {}", k.name(), e.emit_to_string(&src)))?;
            let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
                .subgroup_operations(naga::valid::SubgroupOperationSet::all())
                .validate(&module)
                .map_err(|e| {
                    format!(
                        "{}.wgsl ({variant:?}): {}",
                        k.name(),
                        e.emit_to_string(&src)
                    )
                })?;
            Ok((k, module, info))
        })
        .collect()
}

/// `shaders/gather_rows.wgsl`: copies rows by an index list (the scorer's contraction of
/// batch-expanded logits, [`crate::speculative::GatherRows`]). It follows [`COMMON`] like every kernel,
/// but it is not a [`Kernel`] variant: the verifier's backend builds a pipeline and matches a
/// bind group layout for every [`Kernel`], while this kernel belongs to `speculative`, which builds its
/// own pipeline. [`validate_gather_rows`] gives it the same naga check as [`validate_all`].
pub const GATHER_ROWS: &str = include_str!("../shaders/gather_rows.wgsl");

/// The full source of `gather_rows` handed to the device: common declarations, the portable
/// f16 widening and `mul_wide`, then the kernel (entry point `main`, workgroup size from the
/// `WG` override).
pub fn gather_rows_source() -> String {
    format!("{COMMON}\n{F16_UNPACK_INTEGER}\n{MUL_WIDE_U32}\n{GATHER_ROWS}")
}

/// Parses and validates `gather_rows` with naga (no GPU needed).
pub fn validate_gather_rows() -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let src = gather_rows_source();
    let module = naga::front::wgsl::parse_str(&src)
        .map_err(|e| format!("gather_rows.wgsl: {}", e.emit_to_string(&src)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .map_err(|e| format!("gather_rows.wgsl: {}", e.emit_to_string(&src)))?;
    Ok((module, info))
}

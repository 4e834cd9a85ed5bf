//! The WGSL sources, one file per kernel, each prefixed with `shaders/common.wgsl` (WGSL has no
//! includes). The sources are compiled into the crate so a binary needs no shader files at run
//! time; `validate_all` runs naga's parser and validator on each, with no GPU.

/// Declarations shared by every kernel (layouts, Philox, noise).
pub const COMMON: &str = include_str!("../shaders/common.wgsl");

/// A kernel: one WGSL file, one Rust module, one CPU twin, one pipeline label prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Per-row statistics over vocab blocks (`shaders/row_stats.wgsl`).
    RowStats,
    /// The per-request verify loop (`shaders/verify.wgsl`).
    Verify,
    /// The vocabulary-wide residual / bonus argmax (`shaders/residual_argmax.wgsl`).
    ResidualArgmax,
    /// Test kernel: Philox words and noise for given counters (`shaders/rng_check.wgsl`).
    RngCheck,
    /// Benchmark kernel: the read-bandwidth ceiling (`shaders/read_bandwidth.wgsl`).
    ReadBandwidth,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 5] = [
        Kernel::RowStats,
        Kernel::Verify,
        Kernel::ResidualArgmax,
        Kernel::RngCheck,
        Kernel::ReadBandwidth,
    ];

    /// The kernel's name: its file stem and the prefix of its pipeline labels.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::RowStats => "row_stats",
            Kernel::Verify => "verify",
            Kernel::ResidualArgmax => "residual_argmax",
            Kernel::RngCheck => "rng_check",
            Kernel::ReadBandwidth => "read_bandwidth",
        }
    }

    /// The kernel's own source (without the common prefix).
    pub fn body(self) -> &'static str {
        match self {
            Kernel::RowStats => include_str!("../shaders/row_stats.wgsl"),
            Kernel::Verify => include_str!("../shaders/verify.wgsl"),
            Kernel::ResidualArgmax => include_str!("../shaders/residual_argmax.wgsl"),
            Kernel::RngCheck => include_str!("../shaders/rng_check.wgsl"),
            Kernel::ReadBandwidth => include_str!("../shaders/read_bandwidth.wgsl"),
        }
    }

    /// The entry points the library dispatches.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Kernel::RowStats => &["block"],
            Kernel::Verify => &["main"],
            Kernel::ResidualArgmax => &["block", "merge"],
            Kernel::RngCheck => &["main"],
            Kernel::ReadBandwidth => &["main"],
        }
    }

    /// The full source handed to the device: common declarations, then the kernel.
    pub fn source(self) -> String {
        format!("{COMMON}\n{}", self.body())
    }
}

/// Parses and validates every kernel with naga (no GPU needed). Returns the validated modules.
pub fn validate_all() -> Result<Vec<(Kernel, naga::Module, naga::valid::ModuleInfo)>, String> {
    Kernel::ALL
        .iter()
        .map(|&k| {
            let module = naga::front::wgsl::parse_str(&k.source())
                .map_err(|e| format!("{}.wgsl: {}", k.name(), e.emit_to_string(&k.source())))?;
            let info = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::empty(),
            )
            .validate(&module)
            .map_err(|e| format!("{}.wgsl: {}", k.name(), e.emit_to_string(&k.source())))?;
            Ok((k, module, info))
        })
        .collect()
}

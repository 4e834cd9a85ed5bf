//! Every shader parses and validates with naga (no GPU), and the Rust layouts match the WGSL ones.

use specdec::layout::{Candidate, Params, ReqInfo, RowStats, Task};
use specdec::shaders::{validate_all, Kernel};

#[test]
fn every_shader_validates() {
    let modules = validate_all().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(modules.len(), Kernel::ALL.len() + 1);
    for (kernel, module, _) in &modules {
        for entry in kernel.entry_points() {
            assert!(
                module.entry_points.iter().any(|e| e.name == *entry),
                "{} has no entry point {entry}",
                kernel.name()
            );
        }
    }
}

#[test]
fn int64_variant_validates() {
    let modules = specdec::shaders::validate_variant(specdec::shaders::Variant {
        int64: true,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(modules.len(), Kernel::ALL.len() + 1);
}

/// The subgroup variant parses and validates (with naga's subgroup capability), and only it
/// calls subgroup operations: the portable modules carry none.
#[test]
fn subgroup_variant_validates() {
    use specdec::shaders::Variant;
    let modules = specdec::shaders::validate_variant(Variant {
        int64: true,
        subgroup_lanes: 32,
        immediates: false,
        f16_unpack: true,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(modules.len(), Kernel::ALL.len() + 1);
    let sub = Kernel::RowStats.source(Variant {
        subgroup_lanes: 32,
        ..Default::default()
    });
    assert!(sub.contains("subgroupShuffleDown"));
    // How describe() and the benchmark's adapter line name the variant.
    let both = Variant {
        int64: true,
        subgroup_lanes: 32,
        immediates: false,
        f16_unpack: false,
    };
    assert_eq!(both.describe(), ", int64 Philox, 32-lane subgroup folds");
    let all = Variant {
        immediates: true,
        ..both
    };
    assert_eq!(
        all.describe(),
        ", int64 Philox, 32-lane subgroup folds, Params as immediates"
    );
    let f16 = Variant {
        f16_unpack: true,
        ..all
    };
    assert_eq!(
        f16.describe(),
        ", int64 Philox, 32-lane subgroup folds, Params as immediates, f16 unpack"
    );
    assert_eq!(Variant::default().describe(), "");
    // The device's f16 conversion needs a capability not every device has (wgpu's
    // SHADER_F16_IN_F32): only its variant's text may call it.
    for k in Kernel::ALL {
        let portable = k.source(Variant::default());
        assert!(!portable.contains("subgroupShuffle"), "{}", k.name());
        assert!(!portable.contains("unpack2x16float("), "{}", k.name());
        assert!(k.source(f16).contains("unpack2x16float("), "{}", k.name());
    }
}

/// The immediates variant parses and validates (with naga's IMMEDIATES capability): every
/// verification kernel declares its Params as immediate data and binds nothing at 0, the
/// portable modules the uniform slot at 0, and the diagnostics kernels neither.
#[test]
fn immediates_variant_validates() {
    use specdec::shaders::Variant;
    let imm = Variant {
        immediates: true,
        ..Default::default()
    };
    let modules = specdec::shaders::validate_variant(imm).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(modules.len(), Kernel::ALL.len() + 1);
    for (kernel, module, _) in &modules {
        let immediate = module
            .global_variables
            .iter()
            .any(|(_, g)| g.space == naga::AddressSpace::Immediate);
        let at_zero = module
            .global_variables
            .iter()
            .any(|(_, g)| g.binding.as_ref().is_some_and(|b| b.binding == 0));
        assert_eq!(immediate, kernel.takes_params(), "{}", kernel.name());
        assert!(!(kernel.takes_params() && at_zero), "{}", kernel.name());
    }
    for (kernel, module, _) in validate_all().unwrap() {
        let uniform = module
            .global_variables
            .iter()
            .any(|(_, g)| g.space == naga::AddressSpace::Uniform);
        assert_eq!(uniform, kernel.takes_params(), "{}", kernel.name());
    }
}

/// Size and field offsets of a WGSL struct as naga lays it out.
fn wgsl_layout(name: &str) -> (u32, Vec<(String, u32)>) {
    let (_, module, _) = validate_all().unwrap().into_iter().next().unwrap();
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).unwrap();
    for (handle, ty) in module.types.iter() {
        if ty.name.as_deref() == Some(name) {
            if let naga::TypeInner::Struct { members, span } = &ty.inner {
                let fields = members
                    .iter()
                    .map(|m| (m.name.clone().unwrap(), m.offset))
                    .collect();
                assert_eq!(layouter[handle].size, *span);
                return (*span, fields);
            }
        }
    }
    panic!("struct {name} not found in the WGSL");
}

macro_rules! check_layout {
    ($ty:ty, $name:literal, [$($field:ident),*]) => {{
        let (size, fields) = wgsl_layout($name);
        assert_eq!(size as usize, std::mem::size_of::<$ty>(), "size of {}", $name);
        let rust: Vec<(&str, usize)> = vec![$((stringify!($field), std::mem::offset_of!($ty, $field))),*];
        for (wgsl_name, wgsl_off) in &fields {
            if wgsl_name.starts_with("_pad") {
                continue;
            }
            let (_, off) = rust
                .iter()
                .find(|(n, _)| n == wgsl_name)
                .unwrap_or_else(|| panic!("{}: field {wgsl_name} missing on the Rust side", $name));
            assert_eq!(*off, *wgsl_off as usize, "{}.{wgsl_name} offset", $name);
        }
        assert_eq!(rust.len(), fields.iter().filter(|(n, _)| !n.starts_with("_pad")).count(), "{} field count", $name);
    }};
}

#[test]
fn params_structs_match_wgsl_layout() {
    check_layout!(
        Params,
        "Params",
        [
            vocab,
            draft_vocab,
            block_len,
            num_blocks,
            row_begin,
            row_count,
            t_elem_base,
            d_row_begin,
            d_elem_base,
            draft_kind,
            req_begin,
            req_count,
            num_requests,
            out_stride,
            total_rows,
            num_chunks,
            block_chunks,
            stats_blocks,
            flags,
            cut_slice,
            cut_list,
            settle_base
        ]
    );
    check_layout!(
        ReqInfo,
        "ReqInfo",
        [
            row_offset,
            draft_offset,
            num_drafts,
            flags,
            inv_temperature,
            seed_lo,
            seed_hi,
            pos_lo,
            pos_hi,
            out_offset,
            top_k,
            top_p,
            log_min_p,
            typical_epsilon,
            typical_delta
        ]
    );
    check_layout!(
        RowStats,
        "RowStats",
        [t_max, t_sum, t_arg, flags, t_at_d, q_max, q_sum, q_at_d, raw_max, raw_sum, t_ent, rho]
    );
    check_layout!(Task, "Task", [kind, local_row, draft_token, slot]);
    check_layout!(
        Candidate,
        "Candidate",
        [r_key, r_idx, p_key, p_idx, r_logit, p_logit]
    );
}

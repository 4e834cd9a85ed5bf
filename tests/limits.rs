//! Device limits: the kernels run within WebGPU's default limits, and a device that cannot run
//! them (WebGPU's downlevel defaults allow 4 storage buffers per stage; the kernels bind 7) is
//! refused at `Verifier` creation with a typed error that says what is missing.

mod common;
use common::*;

#[test]
fn webgpu_default_limits_run_and_match_the_twin() {
    if gpu().is_none() {
        return;
    }
    // Every pipeline built with the verifier, so every one is validated under these limits.
    let v = with_limits_built(wgpu::Limits::default(), specdec::PipelineBuild::Eager)
        .expect("a device with WebGPU's default limits");
    let (built, total) = v.pipeline_counts();
    assert_eq!(built, total, "Eager builds every pipeline");
    let mut g = Gen::new(5);
    // 128 MiB bindings: V = 262,144 rows are 1 MiB each, so 200 rows need two windows; the odd
    // V = 262,145 also misaligns every row (scalar loads, unaligned window offsets).
    for (vocab, kind) in [
        (262_144, 0u8),
        (262_144, 1),
        (262_144, 2),
        (262_145, 0),
        (262_145, 2),
    ] {
        let b = Owned::random(&mut g, vocab, &[99, 0, 99], &[0.0, 1.0, 0.8], kind, 0.7);
        let want = cpu().verify_blocking(&b.batch()).unwrap();
        assert_eq!(
            v.verify_blocking(&b.batch()).unwrap(),
            want,
            "V={vocab} kind {kind}"
        );
    }
}

#[test]
fn downlevel_limits_are_refused_with_a_typed_error() {
    if gpu().is_none() {
        return;
    }
    match with_limits(wgpu::Limits::downlevel_defaults()) {
        Err(specdec::Error::RequestDevice { detail }) => {
            assert!(detail.contains("storage buffers per stage"), "{detail}");
            assert!(detail.contains('8'), "{detail}");
        }
        Err(other) => panic!("expected RequestDevice, got {other:?}"),
        Ok(_) => panic!("a 4-storage-buffer device cannot run the kernels; creation must fail"),
    }
}

#[test]
fn the_portable_path_matches_the_twin() {
    if gpu().is_none() {
        return;
    }
    // No SHADER_INT64 (16-bit-halves Philox); timestamps and subgroups are never required.
    let v = specdec::Verifier::new(specdec::VerifierOptions {
        shader_int64: false,
        ..Default::default()
    })
    .unwrap();
    let mut g = Gen::new(6);
    for kind in 0..3u8 {
        let b = Owned::random(&mut g, 5000, &[3, 1, 0, 4], &[1.0, 0.6, 0.0], kind, 0.7);
        assert_eq!(
            v.verify_blocking(&b.batch()).unwrap(),
            cpu().verify_blocking(&b.batch()).unwrap()
        );
    }
}

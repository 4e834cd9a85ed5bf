//! f16 and bf16 logits: the exact widening on the host, and the same tokens as the f32
//! copy of the same values on both backends — target and draft independently, host slices and
//! GPU buffers at odd element offsets, with and without top-k / top-p / min-p.

mod common;
use common::*;
use specdec::{
    bf16_to_f32, f16_to_f32, Draft, Dtype, GpuDraft, GpuRows, GpuVerifyBatch, Logits, Rule,
    VerifyBatch,
};

#[test]
fn f16_widening_is_exact() {
    let cases: [(u16, f32); 10] = [
        (0x0000, 0.0),
        (0x3c00, 1.0),
        (0xc000, -2.0),
        (0x7bff, 65504.0),
        (0x0001, 5.960_464_5e-8), // smallest subnormal, 2^-24
        (0x03ff, 6.097_555e-5),   // largest subnormal, 1023 · 2^-24
        (0x0400, 6.103_515_6e-5), // smallest normal, 2^-14
        (0x3555, 0.333_251_95),
        (0x7c00, f32::INFINITY),
        (0xfc00, f32::NEG_INFINITY),
    ];
    for (bits, want) in cases {
        assert_eq!(f16_to_f32(bits), want, "{bits:#06x}");
    }
    assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    assert!(f16_to_f32(0x7e00).is_nan() && f16_to_f32(0xfc01).is_nan());
    // Every finite f16 round-trips through f32 exactly (no two widen to the same f32).
    let mut seen = std::collections::HashSet::new();
    for bits in 0..=u16::MAX {
        let x = f16_to_f32(bits);
        if x.is_finite() && bits != 0x8000 {
            assert!(seen.insert(x.to_bits()), "{bits:#06x} collides");
        }
    }
    assert_eq!(bf16_to_f32(0x3f80), 1.0);
    assert_eq!(bf16_to_f32(0xc2f7), -123.5);
    assert_eq!(bf16_to_f32(0x7f80), f32::INFINITY);
}

/// Half-precision values of moderate size (exponents 2^-6 .. 2^3), as raw bits and widened.
fn halves(g: &mut Gen, n: usize, dtype: Dtype) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = (0..n)
        .map(|_| {
            let sign = (g.below(2) as u16) << 15;
            match dtype {
                Dtype::F16 => sign | ((9 + g.below(9) as u16) << 10) | g.below(1024) as u16,
                _ => sign | ((121 + g.below(9) as u16) << 7) | g.below(128) as u16,
            }
        })
        .collect();
    let wide = bits
        .iter()
        .map(|&h| match dtype {
            Dtype::F16 => f16_to_f32(h),
            _ => bf16_to_f32(h),
        })
        .collect();
    (bits, wide)
}

/// f16 bits of a value in [0, 65504], mantissa truncated (subnormals included).
fn f16_truncated(x: f32) -> u16 {
    let b = x.to_bits();
    let e = ((b >> 23) & 0xff) as i32 - 127;
    if e < -14 {
        (x * 16_777_216.0) as u16 // m · 2^-24
    } else {
        (((e + 15) as u16) << 10) | ((b >> 13) & 0x3ff) as u16
    }
}

fn logits(dtype: Dtype, bits: &[u16], wide: &[f32]) -> Logits<'static> {
    // The tests keep their vectors alive for the whole call; leaking them keeps this function small.
    match dtype {
        Dtype::F32 => Logits::F32(Box::leak(wide.to_vec().into_boxed_slice())),
        Dtype::F16 => Logits::F16(Box::leak(bits.to_vec().into_boxed_slice())),
        Dtype::Bf16 => Logits::Bf16(Box::leak(bits.to_vec().into_boxed_slice())),
    }
}

/// A mixed batch (greedy, plain and filtered requests) whose target and draft rows come in
/// `t_dtype` / `d_dtype`; returns it with the same batch in f32.
fn pair(
    seed: u64,
    t_dtype: Dtype,
    d_dtype: Dtype,
    kind: u8,
) -> (Owned, Logits<'static>, Logits<'static>) {
    let mut g = Gen::new(seed);
    let vocab = 37;
    let mut o = Owned::random(
        &mut g,
        vocab,
        &[3, 0, 2, 4, 1, 3],
        &[0.0, 1.0, 0.7, 2.0],
        kind,
        0.5,
    );
    for (i, r) in o.requests.iter_mut().enumerate() {
        if i % 3 == 2 {
            r.params = r.params.with_top_k(5).with_top_p(0.9).with_min_p(0.02);
        }
    }
    let (tb, tw) = halves(&mut g, o.target.len(), t_dtype);
    o.target = tw.clone();
    let t = logits(t_dtype, &tb, &tw);
    let d = if kind == 2 {
        let (db, dw) = halves(&mut g, o.draft.len(), d_dtype);
        o.draft = dw.clone();
        logits(d_dtype, &db, &dw)
    } else if kind == 1 {
        // Probabilities in half precision: truncate them, then use the widened values.
        let bits: Vec<u16> = o
            .draft
            .iter()
            .map(|&p| match d_dtype {
                Dtype::F16 => f16_truncated(p),
                _ => (p.to_bits() >> 16) as u16,
            })
            .collect();
        let wide: Vec<f32> = bits
            .iter()
            .map(|&h| {
                if d_dtype == Dtype::F16 {
                    f16_to_f32(h)
                } else {
                    bf16_to_f32(h)
                }
            })
            .collect();
        o.draft = wide.clone();
        logits(d_dtype, &bits, &wide)
    } else {
        Logits::F32(&[])
    };
    (o, t, d)
}

fn with_rows<'a>(o: &'a Owned, t: Logits<'a>, d: Logits<'a>) -> VerifyBatch<'a> {
    let mut b = o.batch();
    b.target_logits = t;
    b.draft = match o.draft_kind {
        0 => Draft::OneHot,
        1 => Draft::Probs(d),
        _ => Draft::Logits(d),
    };
    b
}

#[test]
fn half_rows_give_the_tokens_of_their_f32_copy() {
    let dtypes = [Dtype::F32, Dtype::F16, Dtype::Bf16];
    each_backend(|v| {
        let mut n = 0;
        for (i, &t_dtype) in dtypes.iter().enumerate() {
            for (j, &d_dtype) in dtypes.iter().enumerate() {
                for kind in 0..3u8 {
                    let (o, t, d) = pair(
                        10 * i as u64 + j as u64 + 100 * kind as u64,
                        t_dtype,
                        d_dtype,
                        kind,
                    );
                    let want = v.verify_blocking(&o.batch()).unwrap();
                    let got = v.verify_blocking(&with_rows(&o, t, d)).unwrap();
                    assert_eq!(
                        got,
                        want,
                        "{}: target {t_dtype:?}, draft {d_dtype:?}, kind {kind}",
                        v.describe()
                    );
                    n += 1;
                }
            }
        }
        println!(
            "{}: {n} dtype combinations match their f32 copies",
            v.describe()
        );
    });
}

/// `rows` in a new GPU buffer, `offset` bytes in (zeros before, padding after).
fn upload(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    rows: Logits<'_>,
    offset: u64,
) -> (wgpu::Buffer, Dtype) {
    let bytes: Vec<u8> = match rows {
        Logits::F32(x) => bytemuck::cast_slice(x).to_vec(),
        Logits::F16(x) | Logits::Bf16(x) => bytemuck::cast_slice(x).to_vec(),
    };
    let mut padded = vec![0u8; offset as usize];
    padded.extend(bytes);
    padded.resize(padded.len().next_multiple_of(4) + 4, 0);
    let buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test.half_rows"),
        size: padded.len() as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&buf, 0, &padded);
    (buf, rows.dtype())
}

/// Half rows read in place from GPU buffers, starting at odd element offsets (2 bytes past a
/// word boundary), give the tokens of the host f32 copy.
#[test]
fn half_rows_in_gpu_buffers_at_odd_offsets() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().unwrap();
    for (dtype, kind) in [(Dtype::F16, 2u8), (Dtype::Bf16, 0), (Dtype::F16, 1)] {
        let (o, t, d) = pair(77 + kind as u64, dtype, dtype, kind);
        let want = cpu().verify_blocking(&o.batch()).unwrap();
        let make = |rows, offset| upload(device, queue, rows, offset);
        let (tb, tt) = make(t, 258);
        let (db, dt) = make(if d.is_empty() { Logits::F32(&[0.0]) } else { d }, 6);
        let batch = GpuVerifyBatch {
            vocab_size: o.vocab,
            requests: &o.requests,
            draft_token_ids: &o.drafts,
            target_logits: GpuRows::f32(&tb, 258).with_dtype(tt),
            draft: match kind {
                0 => GpuDraft::OneHot,
                1 => GpuDraft::Probs(GpuRows::f32(&db, 6).with_dtype(dt)),
                _ => GpuDraft::Logits(GpuRows::f32(&db, 6).with_dtype(dt)),
            },
            draft_vocab_size: None,
            synthetic_rates: None,
        };
        let got = record_and_read(v, &batch);
        assert_eq!(got, want, "{dtype:?} kind {kind}");
    }
    // An f16 buffer offset that is not a multiple of 2 is refused before anything is recorded.
    let (o, t, _) = pair(5, Dtype::F16, Dtype::F16, 0);
    let Logits::F16(bits) = t else { unreachable!() };
    let buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test.misaligned"),
        size: (bits.len() * 2 + 8) as u64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let mut encoder =
        device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    let err = v
        .record(
            &mut encoder,
            &GpuVerifyBatch {
                vocab_size: o.vocab,
                requests: &o.requests,
                draft_token_ids: &o.drafts,
                target_logits: GpuRows::f32(&buf, 1).with_dtype(Dtype::F16),
                draft: GpuDraft::OneHot,
                draft_vocab_size: None,
                synthetic_rates: None,
            },
        )
        .err()
        .expect("odd byte offset refused");
    assert!(err.to_string().contains("offset"), "{err}");
}

/// Target rows for the plain half path: random half values (`halves`), each row's maximum
/// planted again beside it inside the same 16-byte load (entry i ^ 4: the other lane of the
/// pair one invocation plays), in the next chunk and at the last entry (argmax ties, lowest
/// index wins), a few −inf entries, and special rows, each the first row of a request (so it is
/// always read): row 4 with a +inf, row 6 with a NaN, row 10 (a greedy request's) all −inf but
/// f16 subnormals (their order decides the argmax) or tiny bf16 normals.
fn plain_rows(g: &mut Gen, dtype: Dtype, rows: usize, vocab: usize) -> (Vec<u16>, Vec<f32>) {
    let (mut bits, _) = halves(g, rows * vocab, dtype);
    let widen = |h: u16| match dtype {
        Dtype::F16 => f16_to_f32(h),
        _ => bf16_to_f32(h),
    };
    let (neg_inf, nan, pos_inf) = match dtype {
        Dtype::F16 => (0xfc00, 0x7e00, 0x7c00),
        _ => (0xff80, 0x7fc0, 0x7f80),
    };
    for (r, row) in bits.chunks_mut(vocab).enumerate() {
        if r == 10 {
            for h in row.iter_mut() {
                *h = match (g.below(3), dtype) {
                    (0, _) => neg_inf,
                    (_, Dtype::F16) => 1 + g.below(0x3ff) as u16,
                    _ => 0x0080 | g.below(0x7f) as u16,
                };
            }
        }
        for _ in 0..8 {
            row[g.below(vocab)] = neg_inf;
        }
        let best = (0..vocab).fold(0, |b, i| if widen(row[i]) > widen(row[b]) { i } else { b });
        for at in [best ^ 4, (best + 4096) % vocab, vocab - 1] {
            row[at.min(vocab - 1)] = row[best];
        }
        match r {
            4 => row[g.below(vocab)] = pos_inf,
            6 => row[g.below(vocab)] = nan,
            _ => {}
        }
    }
    let wide = bits.iter().map(|&h| widen(h)).collect();
    (bits, wide)
}

/// One case of the plain half path: target type, vocabulary, byte offset of the GPU rows, draft
/// kind (0 one-hot, 1 probabilities, 2 logits), draft type, and whether requests filter.
type PlainCase = (Dtype, u32, u64, u8, Dtype, bool);

/// A batch of `case`: greedy and sampled requests (some with processed and raw logprobs, one
/// typical), half target rows from `plain_rows`; returns it with its rows in `case`'s types.
fn plain_batch(seed: u64, case: PlainCase) -> (Owned, Logits<'static>, Logits<'static>) {
    let (dtype, vocab, _, kind, d_dtype, filters) = case;
    let mut g = Gen::new(seed);
    let ks = [3, 1, 2, 0, 4, 2];
    let mut o = Owned::random(&mut g, vocab, &ks, &[0.0, 1.0, 0.7, 1.3], kind, 0.5);
    for (i, r) in o.requests.iter_mut().enumerate() {
        r.params = match i % 3 {
            1 => r.params.with_logprobs(true),
            2 => r.params.with_logprobs(false),
            _ => r.params,
        };
        if i == 5 {
            r.params.rule = Rule::Typical;
        }
        if filters && i % 2 == 1 {
            r.params = r.params.with_top_k(50).with_top_p(0.9);
        }
    }
    let rows = o.target.len() / vocab as usize;
    let (tb, tw) = plain_rows(&mut g, dtype, rows, vocab as usize);
    o.target = tw.clone();
    let t = logits(dtype, &tb, &tw);
    let d = match kind {
        0 => Logits::F32(&[]),
        1 => logits(Dtype::F32, &[], &o.draft),
        _ => {
            let (db, dw) = halves(&mut g, o.draft.len(), d_dtype);
            o.draft = dw.clone();
            logits(d_dtype, &db, &dw)
        }
    };
    (o, t, d)
}

/// `batch` recorded into an encoder of `v`'s device, submitted, and read back.
fn record_and_read(v: &specdec::Verifier, batch: &GpuVerifyBatch<'_>) -> specdec::VerifyOutput {
    let (device, queue) = v.device().unwrap();
    let mut encoder =
        device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    let pending = v.record(&mut encoder, batch).unwrap();
    queue.submit([encoder.finish()]);
    v.read_blocking(pending).unwrap()
}

/// The target and draft rows of a `PlainCase` batch in GPU buffers of their own, the target
/// at the case's byte offset (a placeholder draft buffer for one-hot drafts).
fn upload_case(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    (t, d): (Logits<'_>, Logits<'_>),
    case: PlainCase,
) -> [(wgpu::Buffer, Dtype); 2] {
    let d = if d.is_empty() { Logits::F32(&[0.0]) } else { d };
    [
        upload(device, queue, t, case.2),
        upload(device, queue, d, 0),
    ]
}

/// `o` as a GPU call over `rows` (from `upload_case`), its draft rows of `case`'s kind.
fn gpu_batch<'a>(
    o: &'a Owned,
    [(tb, tt), (db, dt)]: &'a [(wgpu::Buffer, Dtype); 2],
    case: PlainCase,
) -> GpuVerifyBatch<'a> {
    GpuVerifyBatch {
        vocab_size: o.vocab,
        requests: &o.requests,
        draft_token_ids: &o.drafts,
        target_logits: GpuRows::f32(tb, case.2).with_dtype(*tt),
        draft: match case.3 {
            0 => GpuDraft::OneHot,
            1 => GpuDraft::Probs(GpuRows::f32(db, 0).with_dtype(*dt)),
            _ => GpuDraft::Logits(GpuRows::f32(db, 0).with_dtype(*dt)),
        },
        draft_vocab_size: None,
        synthetic_rates: None,
    }
}

/// Half target rows with no filters take row_stats' plain half path (8 entries per 16-byte
/// load, two contract lanes per invocation): its output is bit for bit that of the f32 copy of
/// the same values on the same GPU (logprobs included), and equal to the CPU twin's. Shapes:
/// vocabularies that are and are not multiples of 8, several chunks per workgroup (chunk pairs
/// and a lone last chunk), rows at byte offsets that start mid-vec4 or mid-word, several
/// windows, draft rows in f32, in the target's type and in the other half type; then a
/// filtered half batch and an f32 target with bf16 drafts on the general path.
#[test]
fn plain_half_rows_match_their_f32_copy_bit_for_bit() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().unwrap();
    // One workgroup per row (every chunk of a row in one block) and windows of a few rows.
    let packed = specdec::Verifier::with_device(
        device.clone(),
        queue.clone(),
        specdec::VerifierOptions {
            target_workgroups: 1,
            max_binding_bytes: Some(1 << 17),
            ..Default::default()
        },
    )
    .unwrap();
    let (f16, bf16, f32) = (Dtype::F16, Dtype::Bf16, Dtype::F32);
    let cases: [PlainCase; 11] = [
        (bf16, 12288, 0, 0, f32, false),
        (f16, 12288, 0, 2, f16, false),
        (bf16, 8200, 0, 2, f32, false),
        (f16, 20480, 0, 1, bf16, false),
        (bf16, 4100, 0, 2, bf16, false),
        (f16, 9999, 0, 2, f16, false),
        (bf16, 12288, 8, 2, bf16, false),
        (f16, 12288, 2, 0, f32, false),
        (bf16, 12288, 0, 2, f16, false),
        (bf16, 12288, 0, 2, bf16, true),
        (f32, 12288, 0, 2, bf16, false),
    ];
    for (n, case) in cases.into_iter().enumerate() {
        let (o, t, d) = plain_batch(500 + n as u64, case);
        let twin = cpu().verify_blocking(&with_rows(&o, t, d)).unwrap();
        let rows = upload_case(device, queue, (t, d), case);
        let batch = gpu_batch(&o, &rows, case);
        for verifier in [v, &packed] {
            let want = verifier.verify_blocking(&o.batch()).unwrap();
            let got = record_and_read(verifier, &batch);
            assert_eq!(got, want, "case {case:?}: half rows vs their f32 copy");
            assert_matches_twin(&got, &twin, format!("case {case:?}: GPU vs twin"));
        }
        let statuses: Vec<_> = twin.status.iter().map(|s| format!("{s:?}")).collect();
        println!("case {case:?}: statuses {statuses:?}");
    }
}

/// Small batches of half target rows with no filters, raw logprobs or typical acceptance read
/// their rows as half words (a lane of the statistics contract an invocation, four entries from
/// two words): their output is bit for bit that of the f32 copy on the same verifier and of the
/// plain half path of two lanes an invocation (one workgroup a row), and equals the CPU twin's.
/// On the default tuning (statistics, then verify's pass) and on discrete GPUs' (all-greedy
/// batches settled over wide workgroups, sampled batches verified in row_stats), greedy and
/// sampled batches, every draft kind (f32 draft logits read with 16-byte loads beside the half
/// words), vocabularies that are and are not multiples of 8, rows at odd element offsets. Each
/// call must have taken the half words.
#[test]
fn small_half_batches_read_half_words_and_match_their_f32_copy() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().unwrap();
    let plain = gpu_tuned(specdec::VerifierOptions::default());
    let tuned = gpu_tuned(specdec::VerifierOptions::default().with_discrete_tuning());
    let pairs = gpu_tuned(specdec::VerifierOptions {
        target_workgroups: 1,
        ..Default::default()
    });
    let (f16, bf16, f32) = (Dtype::F16, Dtype::Bf16, Dtype::F32);
    let cases: [PlainCase; 7] = [
        (bf16, 12288, 0, 0, f32, false),
        (bf16, 12288, 0, 2, f32, false),
        (f16, 12288, 0, 2, f16, false),
        (bf16, 9999, 2, 1, f32, false),
        (f16, 8200, 0, 2, bf16, false),
        (bf16, 12288, 2, 2, bf16, false),
        (f16, 9999, 0, 0, f32, false),
    ];
    for (n, case) in cases.into_iter().enumerate() {
        for greedy in [false, true] {
            let (mut o, t, d) = plain_batch(700 + n as u64, case);
            for r in o.requests.iter_mut() {
                r.params.raw_logprobs = false;
                r.params.rule = Rule::Exact;
                if greedy {
                    r.params.temperature = 0.0;
                }
            }
            let twin = cpu().verify_blocking(&with_rows(&o, t, d)).unwrap();
            let rows = upload_case(device, queue, (t, d), case);
            let batch = gpu_batch(&o, &rows, case);
            let what = format!("case {case:?}, greedy {greedy}");
            for verifier in [&plain, &tuned, &pairs] {
                let want = verifier.verify_blocking(&o.batch()).unwrap();
                let before = verifier.half_words_calls();
                let got = record_and_read(verifier, &batch);
                let took = verifier.half_words_calls() - before;
                let on_pairs = std::ptr::eq(verifier, &pairs);
                assert_eq!(
                    took,
                    u64::from(!on_pairs),
                    "{what}: half words taken {took} times"
                );
                assert_eq!(got, want, "{what}: half rows vs their f32 copy");
                assert_matches_twin(&got, &twin, format!("{what}: GPU vs twin"));
            }
        }
    }
    assert!(tuned.fused_greedy_calls() > 0 && tuned.fused_verify_calls() > 0);
}

#[test]
fn half_rows_through_the_early_race_give_the_tokens_of_the_late_one() {
    // The early one-hot race's pipeline without plain f32 loads (half target rows), against the
    // race after verify on the same rows and against the f32 copy.
    let Some(_) = gpu() else { return };
    let with = |entries| {
        gpu_tuned(specdec::VerifierOptions {
            early_race_entries: Some(entries),
            ..Default::default()
        })
    };
    let (early, late) = (with(u64::MAX), with(0));
    for (i, t_dtype) in [Dtype::F16, Dtype::Bf16].into_iter().enumerate() {
        let (o, t, d) = pair(900 + i as u64, t_dtype, Dtype::F32, 0);
        let batch = with_rows(&o, t, d);
        assert!(early.takes_early_race(&batch).unwrap(), "{t_dtype:?}");
        let want = late.verify_blocking(&batch).unwrap();
        assert_eq!(early.verify_blocking(&batch).unwrap(), want, "{t_dtype:?}");
        assert_eq!(
            early.verify_blocking(&o.batch()).unwrap(),
            want,
            "{t_dtype:?} vs f32"
        );
    }
}

/// f16 rows widened by the device's `unpack2x16float` (`VerifierOptions::f16_unpack`, taken
/// where the check at creation finds it exact) and by the kernels' integer operations give the
/// same outputs, equal to the CPU twin's: the plain half path (pairs and half words), the
/// dtype-dispatching loads of filtered rows and of f16 draft logits beside bf16 target rows,
/// with the subnormals, ±inf and NaN of `plain_rows`. The default verifier must have taken
/// the device's conversion, or every other f16 test here would exercise only one of the two
/// widenings: a device whose conversion fails the check is accepted only with
/// `SPECDEC_TEST_NO_F16_UNPACK=1`.
#[test]
fn f16_rows_widened_by_the_device_and_by_integer_operations_agree() {
    let Some(v) = gpu() else { return };
    let (device, queue) = v.device().unwrap();
    let unpacks = v.describe().contains("f16 unpack");
    if std::env::var("SPECDEC_TEST_NO_F16_UNPACK").as_deref() == Ok("1") {
        eprintln!("f16 unpack on this device: {unpacks} (SPECDEC_TEST_NO_F16_UNPACK=1)");
    } else {
        assert!(
            unpacks,
            "the device's f16 conversion failed its check: {} (set SPECDEC_TEST_NO_F16_UNPACK=1 \
             to accept that)",
            v.describe()
        );
    }
    let integer = specdec::Verifier::with_device(
        device.clone(),
        queue.clone(),
        specdec::VerifierOptions {
            f16_unpack: false,
            ..test_options()
        },
    )
    .unwrap();
    assert!(!integer.describe().contains("f16 unpack"));
    let (f16, bf16, f32) = (Dtype::F16, Dtype::Bf16, Dtype::F32);
    let cases: [PlainCase; 5] = [
        (f16, 12288, 0, 2, f16, false),
        (f16, 9999, 2, 1, f32, false),
        (f16, 12288, 0, 2, f16, true),
        (bf16, 12288, 0, 2, f16, false),
        (f16, 20480, 0, 0, f32, false),
    ];
    for (n, case) in cases.into_iter().enumerate() {
        let (o, t, d) = plain_batch(1100 + n as u64, case);
        let twin = cpu().verify_blocking(&with_rows(&o, t, d)).unwrap();
        let rows = upload_case(device, queue, (t, d), case);
        let batch = gpu_batch(&o, &rows, case);
        let got = record_and_read(v, &batch);
        assert_matches_twin(
            &got,
            &twin,
            format!("case {case:?}: default verifier vs twin"),
        );
        assert_eq!(
            record_and_read(&integer, &batch),
            got,
            "case {case:?}: integer widening vs the default verifier's"
        );
    }
}

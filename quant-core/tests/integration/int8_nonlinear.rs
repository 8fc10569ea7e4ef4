//! The integer softmax, GELU and layer normalisation of `quant_core::int8` against their exact
//! functions in `f64`, over their whole accepted input range, random scales and both
//! approximations: every output within the kernel's documented `max_error()`. Also: `isqrt`
//! against the standard library's, determinism (same input, same bits, on any thread), edge
//! cases (rows of one value, equal values, extreme codes, zero variance) and the typed errors
//! for what the kernels refuse.
//!
//! The constants the bounds are built from were measured by `quant-core/examples/nonlinear_error_bounds.rs`.

use proptest::prelude::*;
use quant_core::int8::nonlinear::{isqrt, Approximation, IntGelu, IntLayerNorm, IntSoftmax};
use quant_core::int8::nonlinear::{
    GELU_FIXED_POINT_MAX_ERROR, GELU_IBERT_MAX_ERROR, GELU_IBERT_MAX_INPUT_SCALE,
    GELU_IBERT_SCALE_ERROR, GELU_MAX_INPUT_SCALE, GELU_MIN_INPUT_SCALE, LAYER_NORM_MAX_ERROR,
    SOFTMAX_FIXED_POINT_MAX_ERROR, SOFTMAX_IBERT_MAX_ERROR, SOFTMAX_IBERT_MAX_INPUT_SCALE,
    SOFTMAX_IBERT_SCALE_ERROR, SOFTMAX_MAX_INPUT_SCALE, SOFTMAX_MAX_ROW_LEN, SOFTMAX_TABLE_MAX_LEN,
};
use quant_core::int8::Isa;
use quant_core::QuantError;

use crate::nonlinear_reference::{erfc, gelu, layer_norm, max_scale, softmax};

#[test]
#[allow(clippy::excessive_precision)] // mpmath's digits, as printed
fn reference_erfc_matches_mpmath() {
    // mpmath 1.3.0, 30 digits: (x, erf(x), erfc(x)).
    let table = [
        (0.001, 0.0011283787909692363799, 0.99887162120903076362),
        (0.1, 0.1124629160182848922, 0.8875370839817151078),
        (0.5, 0.52049987781304653768, 0.47950012218695346232),
        (1.0, 0.84270079294971486934, 0.15729920705028513066),
        (1.5, 0.96610514647531072707, 0.033894853524689272933),
        (2.0, 0.99532226501895273416, 0.0046777349810472658379),
        (2.5, 0.99959304798255504106, 0.00040695201744495893956),
        (3.0, 0.99997790950300141456, 0.000022090496998585441373),
        (3.5, 0.99999925690162765859, 7.4309837234141274552e-7),
        (4.0, 0.99999998458274209972, 1.5417257900280018852e-8),
        (4.5, 0.99999999980338395585, 1.9661604415428874763e-10),
        (5.0, 0.99999999999846254021, 1.5374597944280348502e-12),
        (6.0, 0.99999999999999997848, 2.1519736712498913117e-17),
    ];
    for (x, erf, complement) in table {
        assert!((1.0 - erfc(x) - erf).abs() < 1e-13, "erf({x})");
        // Absolute below 2 (the series), relative from 2 on (the continued fraction).
        let tolerance = if x < 2.0 { 1e-13 } else { 1e-13 * complement };
        assert!((erfc(x) - complement).abs() <= tolerance, "erfc({x})");
        assert!((erfc(-x) - (1.0 + erf)).abs() < 1e-13, "erfc(-{x})");
    }
}

// ---------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------

/// A scale `2^e`, `e` uniform in `[lo, hi]` (so every mantissa occurs), as f32.
fn scale_in(lo: f32, hi: f32) -> impl Strategy<Value = f32> {
    (lo.log2() as f64..=hi.log2() as f64).prop_map(move |e| (2f64.powf(e) as f32).clamp(lo, hi))
}

fn approximation() -> impl Strategy<Value = Approximation> {
    prop_oneof![Just(Approximation::IBert), Just(Approximation::FixedPoint)]
}

/// Codes of real values spread over `[-spread, 0]` (plus a centre anywhere in i32), or codes
/// anywhere in i32: `(scale, codes)` for a softmax row.
fn softmax_row(
    max_scale: f32,
    len: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = (f32, Vec<i32>)> {
    (
        scale_in(2f32.powi(-40), max_scale),
        len,
        any::<i32>(),
        0.0f64..50.0,
        any::<bool>(),
    )
        .prop_flat_map(|(scale, n, centre, spread, anywhere)| {
            let codes = if anywhere {
                proptest::collection::vec(any::<i32>(), n).boxed()
            } else {
                proptest::collection::vec(0.0f64..=1.0, n)
                    .prop_map(move |u| {
                        u.iter()
                            .map(|u| {
                                let code = centre as f64 - (u * spread / scale as f64).round();
                                code.clamp(i32::MIN as f64, i32::MAX as f64) as i32
                            })
                            .collect()
                    })
                    .boxed()
            };
            (Just(scale), codes)
        })
}

// ---------------------------------------------------------------------------------------
// isqrt
// ---------------------------------------------------------------------------------------

#[test]
fn isqrt_is_exact_on_every_small_value_and_around_every_square() {
    for n in 0..=1u64 << 20 {
        assert_eq!(isqrt(n), n.isqrt(), "isqrt({n})");
    }
    // k² - 1, k², k² + 1 for k spread over all of u32 (every 2^12-th k, and the top ones).
    let ks = (0..=u32::MAX as u64)
        .step_by(4093)
        .chain(u32::MAX as u64 - 4096..=u32::MAX as u64);
    for k in ks {
        let square = k * k;
        assert_eq!(isqrt(square), k, "isqrt({k}²)");
        if square > 0 {
            assert_eq!(isqrt(square - 1), k - 1, "isqrt({k}² - 1)");
        }
        assert_eq!(isqrt(square + 1), (square + 1).isqrt(), "isqrt({k}² + 1)");
    }
    assert_eq!(isqrt(u64::MAX), u32::MAX as u64);
    for shift in 0..64 {
        let p = 1u64 << shift;
        for n in [p - 1, p, p + 1, p | (p >> 1)] {
            assert_eq!(isqrt(n), n.isqrt(), "isqrt({n})");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn isqrt_is_the_floor_of_the_square_root(n in any::<u64>()) {
        let r = isqrt(n);
        prop_assert!(r * r <= n);
        prop_assert!((r + 1) as u128 * (r + 1) as u128 > n as u128);
    }
}

// ---------------------------------------------------------------------------------------
// Softmax
// ---------------------------------------------------------------------------------------

/// Every output of `codes` (whole rows) within `max_error()` of the exact softmax.
fn check_softmax(k: &IntSoftmax, codes: &[i32]) -> Result<(), TestCaseError> {
    let mut out = vec![0u16; codes.len()];
    k.run(codes, &mut out).unwrap();
    let (scale, bound) = (k.output_scale() as f64, k.max_error());
    for (row, got) in codes.chunks(k.row_len()).zip(out.chunks(k.row_len())) {
        for (i, (p, code)) in softmax(row, k.input_scale()).iter().zip(got).enumerate() {
            let err = (*code as f64 * scale - p).abs();
            prop_assert!(
                err <= bound,
                "{}: row {:?} at scale {:e}: value {} is {} (code {}), exact {}; error {:e} > bound {:e}",
                k.approximation(), row, k.input_scale(), i, *code as f64 * scale, code, p, err, bound
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn softmax_is_within_its_bound(
        (approximation, (scale, codes)) in approximation().prop_flat_map(|a| {
            (Just(a), softmax_row(max_scale(a, SOFTMAX_IBERT_MAX_INPUT_SCALE, SOFTMAX_MAX_INPUT_SCALE), 1..=80))
        }),
        bits in 2u32..=16,
    ) {
        let k = IntSoftmax::new(scale, codes.len(), bits, approximation).unwrap();
        check_softmax(&k, &codes)?;
    }

    #[test]
    fn softmax_of_several_rows_is_softmax_of_each(
        approximation in approximation(),
        (scale, codes) in softmax_row(SOFTMAX_IBERT_MAX_INPUT_SCALE, 12..=12),
    ) {
        // Three rows of four; each alone must give the same bits.
        let k = IntSoftmax::new(scale, 4, 8, approximation).unwrap();
        let mut all = [0u8; 12];
        k.run(&codes, &mut all).unwrap();
        for (row, got) in codes.chunks(4).zip(all.chunks(4)) {
            let mut one = [0u8; 4];
            k.run(row, &mut one).unwrap();
            prop_assert_eq!(&one[..], got);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Rows longer than the on-stack buffer (256) compute each `exp` twice.
    #[test]
    fn long_softmax_rows_are_within_the_bound(
        approximation in approximation(),
        (scale, codes) in softmax_row(SOFTMAX_IBERT_MAX_INPUT_SCALE, 250..=700),
    ) {
        let k = IntSoftmax::new(scale, codes.len(), 16, approximation).unwrap();
        check_softmax(&k, &codes)?;
    }
}

#[test]
fn softmax_edge_cases() {
    for approximation in Approximation::ALL {
        for bits in [2, 8, 16] {
            let max = (1u32 << bits) - 1;
            // A row of one value is certain, whatever the value.
            let k = IntSoftmax::new(0.01, 1, bits, approximation).unwrap();
            for q in [i32::MIN, -1, 0, 7, i32::MAX] {
                let mut out = [0i32];
                k.run(&[q], &mut out).unwrap();
                assert_eq!(out[0] as u32, max, "{approximation} {bits} bits: row [{q}]");
            }
            // Equal values share evenly: (2^b - 1) / n rounded (either way on an exact tie).
            for n in [2usize, 3, 16, 64, 300] {
                let k = IntSoftmax::new(0.01, n, bits, approximation).unwrap();
                for q in [i32::MIN, 0, i32::MAX] {
                    let mut out = vec![0i32; n];
                    k.run(&vec![q; n], &mut out).unwrap();
                    let even = max as f64 / n as f64;
                    assert!(
                        out.iter().all(|o| *o == out[0]),
                        "{approximation} {bits} bits: {n} x {q} -> {out:?}"
                    );
                    assert!(
                        (out[0] as f64 - even).abs() <= 0.5 + 1e-4,
                        "{approximation} {bits} bits: {n} x {q} -> {out:?}, expected {even}"
                    );
                }
            }
            // One value far above the others takes everything, at the extremes of i32.
            let k = IntSoftmax::new(0.01, 3, bits, approximation).unwrap();
            let mut out = [0i32; 3];
            k.run(&[i32::MIN, i32::MAX, i32::MIN], &mut out).unwrap();
            assert_eq!(out, [0, max as i32, 0], "{approximation} {bits} bits");
        }
    }
    // The smallest scale and the largest: all equal, then one step decides everything.
    for approximation in Approximation::ALL {
        let k = IntSoftmax::new(f32::MIN_POSITIVE, 3, 8, approximation).unwrap();
        let mut out = [0u8; 3];
        k.run(&[i32::MAX, i32::MIN, 0], &mut out).unwrap();
        assert_eq!(out, [85, 85, 85], "{approximation}");
    }
    let mut out = [0u8; 2];
    let k = IntSoftmax::new(SOFTMAX_MAX_INPUT_SCALE, 2, 8, Approximation::FixedPoint).unwrap();
    k.run(&[5i32, 4], &mut out).unwrap();
    assert_eq!(out, [255, 0]);
}

#[test]
fn softmax_reads_every_code_type_alike() {
    for approximation in Approximation::ALL {
        let k = IntSoftmax::new(0.05, 8, 8, approximation).unwrap();
        let codes: [u8; 8] = [0, 3, 17, 40, 41, 90, 200, 255];
        let (mut from_u8, mut from_i32, mut from_i16) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        k.run(&codes, &mut from_u8).unwrap();
        k.run(&codes.map(|c| c as i32 - 1000), &mut from_i32)
            .unwrap();
        k.run(&codes.map(|c| c as i16 - 128), &mut from_i16)
            .unwrap();
        assert_eq!(from_u8, from_i32);
        assert_eq!(from_u8, from_i16);
        let mut wide = [0u16; 8];
        k.run(&codes, &mut wide).unwrap();
        assert_eq!(wide.map(|c| c as u8), from_u8);
    }
}

// ---------------------------------------------------------------------------------------
// GELU
// ---------------------------------------------------------------------------------------

/// `(scale, zero point, code range, codes)`: 8-bit grids (every code), 16-bit grids and i32
/// accumulators (codes of real values in [-12, 12] and anywhere in the range, some outside it).
fn gelu_case(max_scale: f32) -> impl Strategy<Value = (f32, i32, (i32, i32), Vec<i32>)> {
    let grid = prop_oneof![
        (0i32..=255).prop_map(|z| (z, (0, 255))),
        (-128i32..=127).prop_map(|z| (z, (-128, 127))),
        (-1000i32..=1000).prop_map(|z| (z, (-32768, 32767))),
        Just((0, (i32::MIN, i32::MAX))),
        (any::<i32>(), any::<i32>(), any::<i32>()).prop_map(|(z, a, b)| (z, (a.min(b), a.max(b)))),
    ];
    (
        scale_in(GELU_MIN_INPUT_SCALE.max(2f32.powi(-40)), max_scale),
        grid,
    )
        .prop_flat_map(|(scale, (zero, (lo, hi)))| {
            let near = (-12.0f64..=12.0).prop_map(move |x| {
                (zero as f64 + (x / scale as f64).round()).clamp(i32::MIN as f64, i32::MAX as f64)
                    as i32
            });
            let codes = proptest::collection::vec(
                prop_oneof![3 => near, 1 => any::<i32>(), 1 => lo..=hi],
                1..64,
            );
            (Just(scale), Just(zero), Just((lo, hi)), codes)
        })
}

fn check_gelu(k: &IntGelu, codes: &[i32]) -> Result<(), TestCaseError> {
    let mut out = vec![0i32; codes.len()];
    k.run(codes, &mut out).unwrap();
    let range = k.input_codes();
    let (scale, bound) = (k.output_scale() as f64, k.max_error());
    for (q, code) in codes.iter().zip(&out) {
        let x = ((*q).clamp(*range.start(), *range.end()) as i64 - k.input_zero_point() as i64)
            as f64
            * k.input_scale() as f64;
        let (got, exact) = (*code as f64 * scale, gelu(x));
        // Codes of up to 33 bits times a 24-bit scale do not fit f64's 53 bits: the check's
        // own rounding (a few ulps of the value) comes on top of the kernel's bound.
        let bound = bound + 4.0 * f64::EPSILON * exact.abs();
        prop_assert!(
            (got - exact).abs() <= bound,
            "{}: code {} (x = {}) at scale {:e}, zero point {}: {} (code {}), exact {}; error {:e} > bound {:e}",
            k.approximation(), q, x, k.input_scale(), k.input_zero_point(), got, code, exact, (got - exact).abs(), bound
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn gelu_is_within_its_bound(
        (approximation, (scale, zero, (lo, hi), codes)) in approximation().prop_flat_map(|a| {
            (Just(a), gelu_case(max_scale(a, GELU_IBERT_MAX_INPUT_SCALE, GELU_MAX_INPUT_SCALE)))
        }),
    ) {
        let k = IntGelu::new(scale, zero, lo..=hi, approximation).unwrap();
        check_gelu(&k, &codes)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every code of an 8-bit grid.
    #[test]
    fn gelu_of_every_8_bit_code_is_within_its_bound(
        approximation in approximation(),
        signed in any::<bool>(),
        zero in 0i32..=255,
        scale in scale_in(1e-4, 0.5),
    ) {
        let scale = scale.min(max_scale(approximation, GELU_IBERT_MAX_INPUT_SCALE, f32::MAX));
        let (lo, hi, zero) = if signed { (-128, 127, zero - 128) } else { (0, 255, zero) };
        let k = IntGelu::new(scale, zero, lo..=hi, approximation).unwrap();
        check_gelu(&k, &(lo..=hi).collect::<Vec<_>>())?;
    }
}

#[test]
fn gelu_edge_cases() {
    for approximation in Approximation::ALL {
        // Zero in, zero out; far right is the identity, far left is 0, at the ends of i32.
        let k = IntGelu::new(1e-3, 0, i32::MIN..=i32::MAX, approximation).unwrap();
        let mut out = [7i32; 3];
        k.run(&[0, i32::MAX, i32::MIN], &mut out).unwrap();
        let s = k.output_scale() as f64;
        assert_eq!(out[0], 0);
        assert!(
            (out[1] as f64 * s - i32::MAX as f64 * 1e-3f32 as f64).abs() <= s,
            "{approximation}: {out:?}"
        );
        assert_eq!(out[2], 0, "{approximation}");
        // Codes outside the declared range are clamped into it.
        let k = IntGelu::new(0.05, 10, 0..=255, approximation).unwrap();
        let (mut inside, mut outside) = ([0i32; 2], [0i32; 2]);
        k.run(&[0i32, 255], &mut inside).unwrap();
        k.run(&[-5000i32, 90_000], &mut outside).unwrap();
        assert_eq!(inside, outside);
        // A range of one code.
        let k = IntGelu::new(0.05, 3, 3..=3, approximation).unwrap();
        let mut one = [1i32];
        k.run(&[100u8], &mut one).unwrap();
        assert_eq!(one, [0]);
        // u8 and i32 codes alike.
        let k = IntGelu::new(0.02, 128, 0..=255, approximation).unwrap();
        let codes: Vec<u8> = (0..=255).collect();
        let (mut a, mut b) = (vec![0i32; 256], vec![0i32; 256]);
        k.run(&codes, &mut a).unwrap();
        k.run(&codes.iter().map(|c| *c as i32).collect::<Vec<_>>(), &mut b)
            .unwrap();
        assert_eq!(a, b);
    }
    // The output scale: the input scale times 2^(bits of the widest |q - z|) / 2^30.
    let k = IntGelu::new(0.5, 128, 0..=255, Approximation::FixedPoint).unwrap();
    assert_eq!(k.output_scale(), 0.5 * 2f32.powi(8 - 30));
    let k = IntGelu::new(0.5, 0, i32::MIN..=i32::MAX, Approximation::FixedPoint).unwrap();
    assert_eq!(k.output_scale(), 0.5 * 2f32.powi(32 - 30));
}

// ---------------------------------------------------------------------------------------
// Layer normalisation
// ---------------------------------------------------------------------------------------

/// `(scale, code range, gamma, beta, eps, rows of codes)`.
#[allow(clippy::type_complexity)]
fn layer_norm_case() -> impl Strategy<Value = (f32, (i32, i32), Vec<f32>, Vec<f32>, f32, Vec<i32>)>
{
    (
        1usize..=80,
        scale_in(2f32.powi(-24), 2f32.powi(10)),
        any::<i32>(),
        0u32..=24,
        1usize..=3,
    )
        .prop_flat_map(|(n, scale, lo, span_bits, rows)| {
            let span = ((1u64 << span_bits) - 1).min((1u64 << 31) / n as u64 - 1) as i64;
            let lo = (lo as i64).min(i32::MAX as i64 - span) as i32;
            let hi = (lo as i64 + span) as i32;
            let affine = proptest::collection::vec(
                prop_oneof![3 => -4.0f32..4.0, 1 => Just(0.0f32), 1 => -1e-3f32..1e-3],
                n,
            );
            let eps = prop_oneof![Just(0.0f32), Just(1e-5f32), Just(1e-12f32), 0.0f32..1.0];
            let row = prop_oneof![
                // anywhere in the range
                proptest::collection::vec(lo..=hi, n),
                // nearly constant: a base and small steps
                (lo..=hi, proptest::collection::vec(0i32..=2, n)).prop_map(move |(b, d)| d
                    .iter()
                    .map(|d| b.saturating_add(*d).min(hi))
                    .collect()),
                // constant
                (lo..=hi).prop_map(move |b| vec![b; n]),
                // one outlier
                (lo..=hi, lo..=hi, 0..n).prop_map(move |(b, o, i)| {
                    let mut r = vec![b; n];
                    r[i] = o;
                    r
                }),
            ];
            let codes = proptest::collection::vec(row, rows).prop_map(|r| r.concat());
            (
                Just(scale),
                Just((lo, hi)),
                affine.clone(),
                affine,
                eps,
                codes,
            )
        })
}

fn check_layer_norm(
    k: &IntLayerNorm,
    codes: &[i32],
    gamma: &[f32],
    beta: &[f32],
) -> Result<(), TestCaseError> {
    let mut out = vec![0i32; codes.len()];
    k.run(codes, &mut out).unwrap();
    let (scale, bound) = (k.output_scale() as f64, k.max_error());
    for (row, got) in codes.chunks(k.row_len()).zip(out.chunks(k.row_len())) {
        let exact = layer_norm(row, k.input_scale(), gamma, beta, k.epsilon());
        for (i, (y, code)) in exact.iter().zip(got).enumerate() {
            let err = (*code as f64 * scale - y).abs();
            prop_assert!(
                err <= bound,
                "row {:?} at scale {:e}, eps {:e}: value {} is {} (code {}), exact {}; error {:e} = {} steps > bound {:e}",
                row, k.input_scale(), k.epsilon(), i, *code as f64 * scale, code, y, err, err / scale, bound
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn layer_norm_is_within_its_bound(
        (scale, (lo, hi), gamma, beta, eps, codes) in layer_norm_case(),
    ) {
        let k = match IntLayerNorm::new(scale, lo..=hi, &gamma, &beta, eps) {
            Ok(k) => k,
            // ε so large against the scale that it is refused: a typed error, checked below.
            Err(QuantError::InvalidValue { what, .. }) if what == "layer norm epsilon" => return Ok(()),
            Err(e) => panic!("{e}"),
        };
        check_layer_norm(&k, &codes, &gamma, &beta)?;
    }
}

#[test]
fn layer_norm_edge_cases() {
    let gamma = [1.5f32, -2.0, 0.25, 1.0];
    let beta = [0.5f32, 0.0, -1.0, 3.0];
    let k = IntLayerNorm::new(0.1, 0..=255, &gamma, &beta, 1e-5).unwrap();
    let s = k.output_scale() as f64;
    let mut out = [0i32; 4];
    // Zero variance gives β, exactly on the output grid.
    for q in [0u8, 77, 255] {
        k.run(&[q; 4], &mut out).unwrap();
        assert_eq!(
            out.map(|o| o as f64 * s),
            beta.map(|b| b as f64),
            "row of {q}"
        );
    }
    // The extremes of the range: ±1 (ε is negligible against a variance of 12.75²).
    k.run(&[0u8, 255, 0, 255], &mut out).unwrap();
    let expected = [-1.0, -2.0, -1.25, 4.0];
    for (o, e) in out.iter().zip(expected) {
        assert!((*o as f64 * s - e).abs() < 1e-6, "{out:?}");
    }
    // A row of one value is β.
    let k = IntLayerNorm::new(0.1, 0..=255, &[3.0], &[-0.75], 0.0).unwrap();
    let mut one = [0i32];
    k.run(&[200u8], &mut one).unwrap();
    assert_eq!(one[0] as f64 * k.output_scale() as f64, -0.75);
    // All of γ and β zero: every output is 0.
    let k = IntLayerNorm::new(0.1, 0..=255, &[0.0; 3], &[0.0; 3], 1e-5).unwrap();
    let mut three = [5i32; 3];
    k.run(&[1u8, 2, 200], &mut three).unwrap();
    assert_eq!(three, [0; 3]);
    // The widest range a row of 64 allows, at its ends, with ε = 0.
    let span = ((1i64 << 31) / 64 - 1) as i32;
    let k = IntLayerNorm::new(
        1e-3,
        -span / 2..=span - span / 2,
        &[1.0; 64],
        &[0.0; 64],
        0.0,
    )
    .unwrap();
    let mut codes = vec![-span / 2; 64];
    codes[0] = span - span / 2;
    let mut out = vec![0i32; 64];
    k.run(&codes, &mut out).unwrap();
    assert!((out[0] as f64 * k.output_scale() as f64 - 63f64.sqrt()).abs() < 1e-6);
    assert!((out[1] as f64 * k.output_scale() as f64 + 1.0 / 63f64.sqrt()).abs() < 1e-6);
    // Rows at the limit of the 32-bit sums of squares: 33 025 codes of 0..=255 (the most
    // they take) and 33 027 (every code at the top but one: 33 026 · 255² > 2^31), with
    // every code at the top but one, or half and half, on every path.
    for n in [33_025usize, 33_027] {
        let (gamma, beta) = (vec![1.0f32; n], vec![0.25f32; n]);
        let k = IntLayerNorm::new(0.5, 0..=255, &gamma, &beta, 1e-5).unwrap();
        let mut one_low = vec![255i32; n];
        one_low[n / 3] = 0;
        let halves: Vec<i32> = (0..n).map(|i| if i % 2 == 0 { 255 } else { 0 }).collect();
        for row in [one_low, halves] {
            for isa in Isa::available() {
                let k = k.clone().with_isa(isa).unwrap();
                check_layer_norm(&k, &row, &gamma, &beta).unwrap();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------------------

#[test]
fn every_kernel_gives_the_same_bits_on_every_thread_and_every_call() {
    use rayon::prelude::*;
    let rows = 512;
    let codes: Vec<i32> = (0..rows * 16)
        .map(|i| ((i as i64 * 2654435761) % 2001 - 1000) as i32)
        .collect();
    for approximation in Approximation::ALL {
        let softmax = IntSoftmax::new(0.01, 16, 8, approximation).unwrap();
        let gelu = IntGelu::new(0.01, 0, -1000..=1000, approximation).unwrap();
        let mut serial = vec![0u8; codes.len()];
        softmax.run(&codes, &mut serial).unwrap();
        let mut parallel = vec![0u8; codes.len()];
        parallel
            .par_chunks_mut(16)
            .zip(codes.par_chunks(16))
            .for_each(|(o, c)| softmax.run(c, o).unwrap());
        assert_eq!(serial, parallel, "{approximation} softmax");
        let mut again = vec![0u8; codes.len()];
        softmax.run(&codes, &mut again).unwrap();
        assert_eq!(serial, again);

        let mut serial = vec![0i32; codes.len()];
        gelu.run(&codes, &mut serial).unwrap();
        let mut parallel = vec![0i32; codes.len()];
        parallel
            .par_chunks_mut(7)
            .zip(codes.par_chunks(7))
            .for_each(|(o, c)| gelu.run(c, o).unwrap());
        assert_eq!(serial, parallel, "{approximation} gelu");
    }
    let gamma: Vec<f32> = (0..16).map(|i| 0.5 + i as f32 / 16.0).collect();
    let layer_norm = IntLayerNorm::new(0.01, -1000..=1000, &gamma, &gamma, 1e-5).unwrap();
    let mut serial = vec![0i32; codes.len()];
    layer_norm.run(&codes, &mut serial).unwrap();
    let mut parallel = vec![0i32; codes.len()];
    parallel
        .par_chunks_mut(16)
        .zip(codes.par_chunks(16))
        .for_each(|(o, c)| layer_norm.run(c, o).unwrap());
    assert_eq!(serial, parallel, "layer norm");
}

// ---------------------------------------------------------------------------------------
// Typed errors
// ---------------------------------------------------------------------------------------

#[test]
fn unsupported_scales_sizes_and_buffers_are_typed_errors() {
    use Approximation::*;
    let invalid_value = |r: Result<_, QuantError>, what: &str| match r {
        Err(QuantError::InvalidValue { what: w, .. }) => assert_eq!(w, what),
        other => panic!("expected InvalidValue for {what}, got {other:?}"),
    };
    for scale in [0.0f32, -1.0, f32::NAN, f32::INFINITY, 1e-45] {
        assert!(
            matches!(
                IntSoftmax::new(scale, 4, 8, FixedPoint),
                Err(QuantError::InvalidScale { .. })
            ),
            "{scale}"
        );
        assert!(
            matches!(
                IntGelu::new(scale, 0, 0..=255, IBert),
                Err(QuantError::InvalidScale { .. })
            ),
            "{scale}"
        );
        assert!(
            matches!(
                IntLayerNorm::new(scale, 0..=255, &[1.0], &[0.0], 0.0),
                Err(QuantError::InvalidScale { .. })
            ),
            "{scale}"
        );
    }
    invalid_value(
        IntSoftmax::new(SOFTMAX_IBERT_MAX_INPUT_SCALE * 1.01, 4, 8, IBert).map(|_| ()),
        "softmax input scale",
    );
    invalid_value(
        IntSoftmax::new(SOFTMAX_MAX_INPUT_SCALE * 2.0, 4, 8, FixedPoint).map(|_| ()),
        "softmax input scale",
    );
    assert!(IntSoftmax::new(SOFTMAX_IBERT_MAX_INPUT_SCALE, 4, 8, IBert).is_ok());
    invalid_value(
        IntSoftmax::new(0.1, 0, 8, FixedPoint).map(|_| ()),
        "softmax row length",
    );
    invalid_value(
        IntSoftmax::new(0.1, SOFTMAX_MAX_ROW_LEN + 1, 8, FixedPoint).map(|_| ()),
        "softmax row length",
    );
    assert!(IntSoftmax::new(0.1, SOFTMAX_MAX_ROW_LEN, 8, FixedPoint).is_ok());
    for bits in [0, 1, 17, 32] {
        assert!(
            matches!(IntSoftmax::new(0.1, 4, bits, FixedPoint), Err(QuantError::InvalidBits { bits: b }) if b == bits)
        );
    }
    let softmax = IntSoftmax::new(0.1, 4, 12, FixedPoint).unwrap();
    let mut narrow = [9u8; 4];
    invalid_value(
        softmax.run(&[1i32, 2, 3, 4], &mut narrow),
        "softmax output type",
    );
    assert_eq!(narrow, [9; 4], "nothing written");
    let mut short = [0u16; 3];
    assert!(matches!(
        softmax.run(&[1i32, 2, 3, 4], &mut short),
        Err(QuantError::LengthMismatch { .. })
    ));
    let mut out = [0u16; 5];
    assert!(matches!(
        softmax.run(&[1i32, 2, 3, 4, 5], &mut out),
        Err(QuantError::LengthMismatch { .. })
    ));

    invalid_value(
        IntGelu::new(GELU_IBERT_MAX_INPUT_SCALE * 1.01, 0, 0..=255, IBert).map(|_| ()),
        "gelu input scale",
    );
    invalid_value(
        IntGelu::new(GELU_MAX_INPUT_SCALE * 2.0, 0, 0..=255, FixedPoint).map(|_| ()),
        "gelu input scale",
    );
    invalid_value(
        IntGelu::new(GELU_MIN_INPUT_SCALE / 2.0, 0, 0..=255, FixedPoint).map(|_| ()),
        "gelu input scale",
    );
    #[allow(clippy::reversed_empty_ranges)]
    let empty = 5..=4;
    assert!(matches!(
        IntGelu::new(0.1, 0, empty.clone(), FixedPoint),
        Err(QuantError::InvalidRange { .. })
    ));
    let gelu = IntGelu::new(0.1, 0, 0..=255, FixedPoint).unwrap();
    assert!(matches!(
        gelu.run(&[1u8, 2], &mut [0i32; 1]),
        Err(QuantError::LengthMismatch { .. })
    ));

    assert!(matches!(
        IntLayerNorm::new(0.1, empty, &[1.0], &[0.0], 0.0),
        Err(QuantError::InvalidRange { .. })
    ));
    invalid_value(
        IntLayerNorm::new(0.1, 0..=255, &[], &[], 0.0).map(|_| ()),
        "layer norm gamma",
    );
    assert!(matches!(
        IntLayerNorm::new(0.1, 0..=255, &[1.0, 1.0], &[0.0], 0.0),
        Err(QuantError::LengthMismatch { .. })
    ));
    assert!(
        matches!(IntLayerNorm::new(0.1, 0..=255, &[1.0, f32::NAN], &[0.0, 0.0], 0.0), Err(QuantError::NonFinite { what, .. }) if what == "layer norm gamma[1]")
    );
    assert!(
        matches!(IntLayerNorm::new(0.1, 0..=255, &[1.0], &[f32::INFINITY], 0.0), Err(QuantError::NonFinite { what, .. }) if what == "layer norm beta[0]")
    );
    invalid_value(
        IntLayerNorm::new(0.1, 0..=255, &[1.0], &[0.0], -1e-5).map(|_| ()),
        "layer norm epsilon",
    );
    invalid_value(
        IntLayerNorm::new(0.1, 0..=255, &[1.0], &[0.0], f32::NAN).map(|_| ()),
        "layer norm epsilon",
    );
    invalid_value(
        IntLayerNorm::new(1e-30, 0..=255, &[1.0; 4], &[0.0; 4], 1e-5).map(|_| ()),
        "layer norm epsilon",
    );
    invalid_value(
        IntLayerNorm::new(0.1, i32::MIN..=i32::MAX, &[1.0; 4], &[0.0; 4], 0.0).map(|_| ()),
        "layer norm input codes",
    );
    let span = ((1i64 << 31) / 64) as i32;
    invalid_value(
        IntLayerNorm::new(0.1, 0..=span, &[1.0; 64], &[0.0; 64], 0.0).map(|_| ()),
        "layer norm input codes",
    );
    assert!(IntLayerNorm::new(0.1, 0..=span - 1, &[1.0; 64], &[0.0; 64], 0.0).is_ok());
    let layer_norm = IntLayerNorm::new(0.1, 0..=255, &[1.0; 4], &[0.0; 4], 0.0).unwrap();
    assert!(matches!(
        layer_norm.run(&[1u8, 2, 3], &mut [0i32; 3]),
        Err(QuantError::LengthMismatch { .. })
    ));
    // Messages say what was wrong and what is valid.
    let message = IntSoftmax::new(0.5, 4, 8, IBert).unwrap_err().to_string();
    assert!(
        message.contains("softmax input scale") && message.contains("fixed_point"),
        "{message}"
    );
}

#[test]
fn documented_bounds_are_what_max_error_reports() {
    let softmax = IntSoftmax::new(0.01, 4, 8, Approximation::IBert).unwrap();
    let step = 1.0 / 255.0;
    let expected =
        SOFTMAX_IBERT_MAX_ERROR + SOFTMAX_IBERT_SCALE_ERROR * 0.01f32 as f64 + step / 2.0;
    assert!((softmax.max_error() - expected).abs() < 1e-6);
    let softmax = IntSoftmax::new(0.01, 4, 8, Approximation::FixedPoint).unwrap();
    assert!((softmax.max_error() - SOFTMAX_FIXED_POINT_MAX_ERROR - step / 2.0).abs() < 1e-6);
    let gelu = IntGelu::new(0.01, 0, 0..=255, Approximation::IBert).unwrap();
    let expected = GELU_IBERT_MAX_ERROR + GELU_IBERT_SCALE_ERROR * 0.01f32 as f64;
    assert!((gelu.max_error() - expected).abs() < 1e-8);
    let gelu = IntGelu::new(0.01, 0, 0..=255, Approximation::FixedPoint).unwrap();
    assert!((gelu.max_error() - GELU_FIXED_POINT_MAX_ERROR).abs() < 1e-8);
    let layer_norm = IntLayerNorm::new(0.1, 0..=255, &[1.0; 4], &[0.0; 4], 0.0).unwrap();
    assert_eq!(
        layer_norm.max_error(),
        LAYER_NORM_MAX_ERROR * layer_norm.output_scale() as f64
    );
}

// ---------------------------------------------------------------------------------------
// Every instruction-set path gives the reference's codes
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Softmax and layer normalisation are compiled once per register width (the compiler
    /// vectorizes the same loops); every path this CPU runs must give the portable codes.
    #[test]
    fn softmax_gives_the_same_codes_on_every_path(
        approximation in approximation(),
        (scale, codes) in softmax_row(SOFTMAX_IBERT_MAX_INPUT_SCALE, 1..=40),
        rows in 1usize..=4,
        bits in 2u32..=16,
    ) {
        let codes = codes.repeat(rows).iter().enumerate()
            .map(|(i, c)| c.wrapping_add((i / rows) as i32 % 3))
            .collect::<Vec<_>>();
        let n = codes.len() / rows;
        // The reference evaluates `exp` for every value; the paths take it from the table
        // where the scale allows one, and evaluate it too.
        let kernel = IntSoftmax::new(scale, n, bits, approximation).unwrap();
        let reference = kernel.clone().with_isa(Isa::Portable).unwrap().with_exp_table(false);
        let mut expected = vec![0i32; codes.len()];
        reference.run(&codes, &mut expected).unwrap();
        for isa in Isa::available() {
            for table in [true, false] {
                let k = kernel.clone().with_isa(isa).unwrap().with_exp_table(table);
                let mut got = vec![0i32; codes.len()];
                k.run(&codes, &mut got).unwrap();
                prop_assert_eq!(&got, &expected, "path {} table {}", isa, k.uses_exp_table());
            }
        }
    }

    /// At coarse input scales softmax takes `exp` from a table of its own values: every
    /// difference from the row's maximum up to past the table's end, and extreme codes, give
    /// the evaluated codes on every path.
    #[test]
    fn softmax_table_gives_the_evaluated_codes(
        approximation in approximation(),
        scale in scale_in(0.012, SOFTMAX_IBERT_MAX_INPUT_SCALE),
        top in any::<i32>(),
        n in 2usize..=24,
        bits in 2u32..=16,
    ) {
        let kernel = IntSoftmax::new(scale, n, bits, approximation).unwrap();
        prop_assert!(kernel.uses_exp_table(), "scale {}", scale);
        let reference = kernel.clone().with_isa(Isa::Portable).unwrap().with_exp_table(false);
        // Rows of `n` codes: the maximum `top`, then differences counting up from 0 to past
        // the table's last entry, and the lowest code.
        let mut codes = Vec::new();
        for (i, difference) in (0..SOFTMAX_TABLE_MAX_LEN as i64 + 2 * n as i64).enumerate() {
            if i % n == 0 {
                codes.push(top);
                codes.push(i32::MIN);
            }
            codes.push((top as i64 - difference).max(i32::MIN as i64) as i32);
        }
        codes.truncate(codes.len() / n * n);
        let mut expected = vec![0i32; codes.len()];
        reference.run(&codes, &mut expected).unwrap();
        for isa in Isa::available() {
            let k = kernel.clone().with_isa(isa).unwrap();
            let mut got = vec![0i32; codes.len()];
            k.run(&codes, &mut got).unwrap();
            prop_assert_eq!(&got, &expected, "path {}", isa);
        }
    }

    #[test]
    fn layer_norm_gives_the_same_codes_on_every_path(
        (scale, (lo, hi), gamma, beta, eps, codes) in layer_norm_case(),
    ) {
        let Ok(reference) = IntLayerNorm::new(scale, lo..=hi, &gamma, &beta, eps) else {
            return Ok(());
        };
        let reference = reference.with_isa(Isa::Portable).unwrap();
        let mut expected = vec![0i32; codes.len()];
        reference.run(&codes, &mut expected).unwrap();
        for isa in Isa::available() {
            let k = reference.clone().with_isa(isa).unwrap();
            let mut got = vec![0i32; codes.len()];
            k.run(&codes, &mut got).unwrap();
            prop_assert_eq!(&got, &expected, "path {}", isa);
        }
    }

    /// GELU keeps the outputs of narrow code ranges in a table: a lookup, on every path, must
    /// give what the kernel computes for the code (clamped into the range), for codes inside and
    /// outside it.
    #[test]
    fn gelu_table_gives_the_computed_codes(
        approximation in approximation(),
        (lo, span) in (-40_000i32..=40_000, 0i32..=1100),
        zero in -300i32..=300,
        scale in scale_in(1e-4, 0.05),
        extra in proptest::collection::vec(any::<i32>(), 0..8),
    ) {
        let hi = lo + span;
        let k = IntGelu::new(scale, lo + zero, lo..=hi, approximation).unwrap();
        let codes: Vec<i32> = (lo - 3..=hi + 3).chain(extra).collect();
        for isa in Isa::available() {
            let k = k.clone().with_isa(isa).unwrap();
            let mut got = vec![0i32; codes.len()];
            k.run(&codes, &mut got).unwrap();
            for (q, out) in codes.iter().zip(&got) {
                prop_assert_eq!(*out, k.value(*q), "code {} of {}..={} on {}", q, lo, hi, isa);
            }
        }
    }
}

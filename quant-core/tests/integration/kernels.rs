//! Every kernel against a scalar reference, on every walk, every SIMD path and any number of
//! threads.

use quant_core::__internals::{limit_kernel_paths, VectorPath};
use quant_core::kernels::*;
use quant_core::{ChannelLayout, QuantError, RoundingPolicy};

use crate::threads::on_one_and_three_threads;

/// The scalar reference of the forward formula, with any rounding policy.
fn reference(x: f32, s: f32, z: i32, qmin: i32, qmax: i32, rounding: RoundingPolicy) -> f32 {
    let inv = 1.0 / s;
    let q = rounding.round(x * inv) as i64 + z as i64;
    ((q.clamp(qmin as i64, qmax as i64) - z as i64) as f32) * s
}

#[test]
fn ties_follow_every_rounding_policy() {
    // x * (1/s) lands exactly on k + 0.5 for s = 0.5 (inv = 2 exactly) and x = (k + 0.5) / 2.
    let xs: Vec<f32> = (-20..20).map(|k| (k as f32 + 0.5) * 0.5).collect();
    for policy in RoundingPolicy::ALL {
        let mut y = vec![0.0; xs.len()];
        fake_quantize_per_tensor_affine_into(&xs, &mut y, 0.5, 3, -8, 7, policy).unwrap();
        for (x, y) in xs.iter().zip(&y) {
            assert_eq!(*y, reference(*x, 0.5, 3, -8, 7, policy), "{policy:?} x={x}");
        }
    }
}

#[test]
fn far_out_of_range_and_non_finite() {
    let x = [1e30, -1e30, f32::INFINITY, f32::NEG_INFINITY, 1e6, -1e6];
    let y = fake_quantize_per_tensor_affine(&x, 0.1, 2, 0, 255).unwrap();
    let top = (255 - 2) as f32 * 0.1;
    let bottom = (0 - 2) as f32 * 0.1;
    assert_eq!(y, vec![top, bottom, top, bottom, top, bottom]);
    let y = fake_quantize_per_tensor_affine(&[f32::NAN, 1.0], 0.1, 0, -128, 127).unwrap();
    assert!(y[0].is_nan());
    assert_eq!(y[1], 1.0);
}

#[test]
fn bad_parameters_are_errors() {
    let x = [1.0];
    for s in [0.0, -1.0, f32::NAN, f32::INFINITY, 1e-40] {
        assert!(matches!(
            fake_quantize_per_tensor_affine(&x, s, 0, -128, 127),
            Err(QuantError::InvalidScale { .. })
        ));
    }
    assert!(matches!(
        fake_quantize_per_tensor_affine(&x, 1.0, 0, 5, 4),
        Err(QuantError::InvalidRange { .. })
    ));
    assert!(matches!(
        fake_quantize_per_tensor_affine(&x, 1.0, 300, 0, 255),
        Err(QuantError::InvalidZeroPoint { .. })
    ));
    assert!(matches!(
        fake_quantize_per_channel_affine(&[1.0; 6], &[2, 3], 1, &[1.0, 1.0], &[0, 0], -8, 7),
        Err(QuantError::LengthMismatch { .. })
    ));
    assert!(matches!(
        fake_quantize_per_channel_affine(&[1.0; 5], &[2, 3], 1, &[1.0; 3], &[0; 3], -8, 7),
        Err(QuantError::LengthMismatch { .. })
    ));
    assert!(matches!(
        fake_quantize_per_channel_affine(&[1.0; 6], &[2, 3], 2, &[1.0; 3], &[0; 3], -8, 7),
        Err(QuantError::InvalidAxis { .. })
    ));
    // LSQ: `dy` of another length, a NaN zero point, a NaN grad factor.
    let lsq_cases: [(&[f32], f32, f32); 3] = [
        (&[1.0, 2.0], 0.0, 1.0),
        (&[1.0], f32::NAN, 1.0),
        (&[1.0], 0.0, f32::NAN),
    ];
    for (dy, zero_point, grad_factor) in lsq_cases {
        assert!(
            fake_quantize_learnable_per_tensor_affine_backward(
                &x,
                dy,
                1.0,
                zero_point,
                -8,
                7,
                grad_factor
            )
            .is_err(),
            "dy {dy:?}, zero point {zero_point}, grad factor {grad_factor}"
        );
    }
}

#[test]
fn wide_ranges_take_the_exact_slow_path() {
    let x = [3.5e6f32, -7.25e6, 0.5, 1.5];
    let y = fake_quantize_per_tensor_affine(&x, 1.0, 0, i32::MIN, i32::MAX).unwrap();
    assert_eq!(
        y,
        vec![
            3.5e6f32.round_ties_even(),
            -7.25e6f32.round_ties_even(),
            0.0,
            2.0
        ]
    );
}

#[test]
fn per_channel_matches_per_tensor_channel_by_channel_on_every_axis() {
    let shape = [3usize, 4, 5];
    let x: Vec<f32> = (0..60)
        .map(|i| ((i * 37 % 61) as f32 - 30.0) * 0.173)
        .collect();
    for axis in 0..3 {
        let c = shape[axis];
        let scales: Vec<f32> = (0..c).map(|k| 0.1 + 0.07 * k as f32).collect();
        let zps: Vec<i32> = (0..c).map(|k| k as i32 - 1).collect();
        let y = fake_quantize_per_channel_affine(&x, &shape, axis, &scales, &zps, -8, 7).unwrap();
        let layout = ChannelLayout::new(&shape, Some(axis)).unwrap();
        for (i, (xi, yi)) in x.iter().zip(&y).enumerate() {
            let ch = layout.channel_of(i);
            let e = fake_quantize_per_tensor_affine(&[*xi], scales[ch], zps[ch], -8, 7).unwrap()[0];
            assert_eq!(*yi, e, "axis {axis} i {i}");
        }
    }
}

#[test]
fn large_tensors_split_across_threads_give_the_same_result() {
    let n = PARALLEL_THRESHOLD * 2 + 17;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 2001) as f32 * 0.01 - 10.0)
        .collect();
    let y = fake_quantize_per_tensor_affine(&x, 0.05, 3, -128, 127).unwrap();
    for (xi, yi) in x.iter().zip(&y).step_by(997) {
        assert_eq!(
            *yi,
            reference(*xi, 0.05, 3, -128, 127, RoundingPolicy::HalfEven)
        );
    }
    let dy = vec![1.0; n];
    let (dx, ds, _) =
        fake_quantize_learnable_per_tensor_affine_backward(&x, &dy, 0.05, 3.0, -128, 127, 1.0)
            .unwrap();
    let mut exact = 0f64;
    for (xi, gi) in x.iter().zip(&dx) {
        let q = (xi * 20.0f32).round_ties_even() + 3.0;
        let inside = (-128.0..=127.0).contains(&q);
        assert_eq!(*gi, if inside { 1.0 } else { 0.0 });
        exact += if inside {
            ((q - 3.0) * 0.05 - xi) as f64 * 20.0
        } else if q < -128.0 {
            -131.0
        } else {
            124.0
        };
    }
    assert!(
        ((ds as f64 - exact) / exact).abs() < 1e-6,
        "{ds} vs {exact}"
    );
}

#[test]
fn quantize_dequantize_equals_fake_quantize() {
    let x: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.031).collect();
    let layout = ChannelLayout::new(&[3, 100], Some(0)).unwrap();
    let (s, z) = ([0.02, 0.05, 0.1], [-3, 0, 5]);
    let quantize = |x: &[f32], q: &mut [i8], qmin, qmax| {
        quantize_into(x, q, layout, &s, &z, qmin, qmax, RoundingPolicy::HalfEven)
    };
    let mut q = vec![0i8; 300];
    quantize(&x, &mut q, -128, 127).unwrap();
    let mut y = vec![0.0; 300];
    dequantize_into(&q, &mut y, layout, &s, &z, -128, 127).unwrap();
    let f = fake_quantize_per_channel_affine(&x, &[3, 100], 0, &s, &z, -128, 127).unwrap();
    assert_eq!(y, f);
    assert!(quantize(&x, &mut vec![0i8; 300], 0, 255).is_err());
    let mut nan = x.clone();
    nan[7] = f32::NAN;
    let err = quantize(&nan, &mut q, -128, 127).unwrap_err();
    assert!(err.to_string().contains("x[7]"), "{err}");
}

// ----- every kernel against a scalar reference, on every walk and every SIMD path ------

/// Deterministic inputs with exact ties for `scale` (and plenty of out-of-range values).
fn inputs(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let k = ((s >> 40) % 400) as f32 - 200.0;
            match i % 4 {
                // Exact ties k + 1/2 (scale is a power of two in the tests that need it).
                0 => (k + 0.5) * scale,
                1 => k * scale,
                _ => ((s >> 20) as u32 as f32 / u32::MAX as f32 - 0.5) * 300.0 * scale,
            }
        })
        .collect()
}

/// The layouts the drivers treat differently: per tensor, long rows, short rows (periods),
/// short rows that do not repeat, each small and above the parallel threshold.
fn layouts() -> Vec<(Vec<usize>, Option<usize>)> {
    vec![
        (vec![1000], None),
        (vec![3, 5, 7], Some(0)),
        (vec![3, 5, 7], Some(1)),
        (vec![3, 5, 7], Some(2)),
        (vec![PARALLEL_THRESHOLD + 999], None),
        (vec![70, 31, 130], Some(1)),
        (vec![300, 17, 60], Some(1)),
        (vec![2, 150_001, 1], Some(1)),
    ]
}

fn params(channels: usize) -> (Vec<f32>, Vec<i32>) {
    let scales = (0..channels)
        .map(|c| [0.5, 0.25, 0.125, 0.0625][c % 4])
        .collect();
    let zps = (0..channels).map(|c| (c % 7) as i32 - 3).collect();
    (scales, zps)
}

/// Runs `f` on every layout of [`layouts`] with its [`params`]: `f(label, layout, scales,
/// zero_points)`.
fn each_layout(mut f: impl FnMut(&str, ChannelLayout, &[f32], &[i32])) {
    for (shape, axis) in layouts() {
        let layout = ChannelLayout::new(&shape, axis).unwrap();
        let (scales, zps) = params(layout.channels);
        f(&format!("{shape:?} {axis:?}"), layout, &scales, &zps);
    }
}

/// [`each_layout`] on every SIMD path ([`every_path`]), with labels naming the path and the walk.
fn each_level_and_layout(mut f: impl FnMut(&str, ChannelLayout, &[f32], &[i32])) {
    every_path(|level| {
        each_layout(|shape, layout, scales, zps| {
            f(&format!("{level} {shape}"), layout, scales, zps)
        })
    });
}

fn lsq_reference(
    x: f32,
    dy: f32,
    s: f32,
    z: i32,
    qmin: i32,
    qmax: i32,
    policy: RoundingPolicy,
) -> Option<(bool, f64, f64)> {
    let w = x * (1.0 / s) + z as f32;
    if w.is_nan() {
        return None;
    }
    let q = policy.round(w) as i64;
    let (lo, hi) = (qmin as i64, qmax as i64);
    Some(if q < lo || q > hi {
        let k = (q.clamp(lo, hi) - z as i64) as f32;
        (false, (dy * k) as f64, dy as f64)
    } else {
        let fq = (q - z as i64) as f32 * s;
        (true, (dy * ((fq - x) * (1.0 / s))) as f64, 0.0)
    })
}

/// LSQ's gradient on the signed 8-bit grid, rounding half to even, from zero: `(dx, dscales,
/// dzero_points)` (one scale and zero-point gradient per channel of `layout`).
fn lsq_int8(
    x: &[f32],
    dy: &[f32],
    layout: ChannelLayout,
    scales: &[f32],
    zero_points: &[f32],
    grad_factor: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dx = vec![0.0; x.len()];
    let (mut ds, mut dz) = (vec![0.0; layout.channels], vec![0.0; layout.channels]);
    fake_quantize_learnable_affine_backward_into(
        x,
        dy,
        &mut dx,
        layout,
        scales,
        zero_points,
        -128,
        127,
        grad_factor,
        RoundingPolicy::HalfEven,
        &mut ds,
        Some(&mut dz[..]),
    )
    .unwrap();
    (dx, ds, dz)
}

/// Runs `f` on the AVX-512 code, the AVX2 code (each where the CPU has it) and the baseline
/// code.
fn every_path(f: impl FnMut(&str)) {
    with_paths(
        &[
            (VectorPath::Avx512, "avx512"),
            (VectorPath::Avx2, "avx2"),
            (VectorPath::Baseline, "baseline"),
        ],
        f,
    )
}

/// Runs `f` under each limit of `paths` in turn ([`limit_kernel_paths`]), then lifts the
/// limit. One caller at a time: the limit is the process's, and another test's call could
/// move it half-way.
pub(crate) fn with_paths(paths: &[(VectorPath, &str)], mut f: impl FnMut(&str)) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for &(path, label) in paths {
        limit_kernel_paths(path);
        f(label);
    }
    limit_kernel_paths(VectorPath::Avx512);
}

#[test]
fn every_kernel_matches_the_scalar_reference_on_every_layout() {
    let (qmin, qmax) = (-128, 127);
    each_level_and_layout(|label, layout, scales, zps| {
        let n = layout.numel();
        let x = inputs(n, 0.5, 7);
        let dy = inputs(n, 0.01, 11);
        for policy in RoundingPolicy::ALL {
            let what = format!("{label} {policy:?}");
            let mut y = vec![0.0; n];
            fake_quantize_affine_into(&x, &mut y, layout, scales, zps, qmin, qmax, policy).unwrap();
            let mut dx = vec![0.0; n];
            fake_quantize_affine_backward_into(
                &x, &dy, &mut dx, layout, scales, zps, qmin, qmax, policy,
            )
            .unwrap();
            let mut q = vec![0i8; n];
            quantize_into(&x, &mut q, layout, scales, zps, qmin, qmax, policy).unwrap();
            let mut dq = vec![0.0; n];
            dequantize_into(&q, &mut dq, layout, scales, zps, qmin, qmax).unwrap();
            for i in (0..n).step_by(1 + n / 20_000) {
                let c = layout.channel_of(i);
                let e = reference(x[i], scales[c], zps[c], qmin, qmax, policy);
                assert_eq!(y[i].to_bits(), e.to_bits(), "{what}: y[{i}], x = {}", x[i]);
                assert_eq!(
                    dq[i].to_bits(),
                    e.to_bits(),
                    "{what}: dequantize(quantize)[{i}]"
                );
                let code = policy.round(x[i] * (1.0 / scales[c])) as i64 + zps[c] as i64;
                let inside = (qmin as i64..=qmax as i64).contains(&code);
                assert_eq!(dx[i], if inside { dy[i] } else { 0.0 }, "{what}: dx[{i}]");
            }
        }
    });
}

#[test]
fn lsq_matches_the_scalar_reference_on_every_layout() {
    let (qmin, qmax) = (-8, 7);
    each_level_and_layout(|label, layout, scales, zps| {
        let n = layout.numel();
        let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
        let x = inputs(n, 0.5, 3);
        let dy = inputs(n, 0.01, 5);
        for policy in [
            RoundingPolicy::HalfEven,
            RoundingPolicy::HalfUp,
            RoundingPolicy::Floor,
        ] {
            let what = format!("{label} {policy:?}");
            let channels = layout.channels;
            let mut dx = vec![0.0; n];
            let (mut ds, mut dz) = (vec![0.0; channels], vec![0.0; channels]);
            fake_quantize_learnable_affine_backward_into(
                &x,
                &dy,
                &mut dx,
                layout,
                scales,
                &zf,
                qmin,
                qmax,
                1.0,
                policy,
                &mut ds,
                Some(&mut dz[..]),
            )
            .unwrap();
            // (ds, dz, Σ|ds terms|, Σ|dz terms|)
            let mut exact = vec![(0f64, 0f64, 0f64, 0f64); channels];
            for i in 0..n {
                let c = layout.channel_of(i);
                let (inside, t, u) =
                    lsq_reference(x[i], dy[i], scales[c], zps[c], qmin, qmax, policy).unwrap();
                assert_eq!(dx[i], if inside { dy[i] } else { 0.0 }, "{what}: dx[{i}]");
                exact[c].0 += t;
                exact[c].1 += u;
                exact[c].2 += t.abs();
                exact[c].3 += u.abs();
            }
            // Within 1e-6 of the exact sum, relative to the sum or (when terms of both
            // signs cancel) to 1e-3 of the sum of their absolute values.
            let close =
                |got: f32, e: f64, l1: f64| (got as f64 - e).abs() <= 1e-6 * e.abs().max(l1 * 1e-3);
            for c in 0..channels {
                let (es, ez, l1s, l1z) = exact[c];
                let s = scales[c] as f64;
                assert!(close(ds[c], es, l1s), "{what}: ds[{c}] {} vs {es}", ds[c]);
                assert!(
                    close(dz[c], -ez * s, l1z * s),
                    "{what}: dz[{c}] {} vs {}",
                    dz[c],
                    -ez * s
                );
            }
        }
    });
}

#[test]
fn nan_inputs_add_nothing_to_lsq_sums_and_nan_gradients_propagate() {
    each_layout(|shape, layout, scales, zps| {
        let n = layout.numel();
        let channels = layout.channels;
        let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
        let x = inputs(n, 0.5, 9);
        let dy = inputs(n, 0.01, 13);
        let run = |x: &[f32], dy: &[f32]| lsq_int8(x, dy, layout, scales, &zf, 1.0);
        // Element 0 dropped from the sums: its terms are recomputed without it.
        let mut x_nan = x.clone();
        x_nan[0] = f32::NAN;
        let (dx_nan, ds_nan, dz_nan) = run(&x_nan, &dy);
        let mut dy_zero = dy.clone();
        dy_zero[0] = 0.0;
        let (_, ds_ref, dz_ref) = run(&x, &dy_zero);
        assert_eq!(dx_nan[0], 0.0, "{shape}");
        for c in 0..channels {
            assert!(
                ds_nan[c].is_finite() && dz_nan[c].is_finite(),
                "{shape} channel {c}"
            );
            assert!(
                (ds_nan[c] - ds_ref[c]).abs() <= 1e-5 * ds_ref[c].abs().max(1.0),
                "{shape} {c}"
            );
            assert!(
                (dz_nan[c] - dz_ref[c]).abs() <= 1e-5 * dz_ref[c].abs().max(1.0),
                "{shape} {c}"
            );
        }
        let mut dy_nan = dy.clone();
        dy_nan[0] = f32::NAN;
        let (_, ds, _) = run(&x, &dy_nan);
        assert!(ds[layout.channel_of(0)].is_nan(), "{shape}");
    });
}

#[test]
fn results_do_not_depend_on_the_number_of_threads() {
    let layout = ChannelLayout::new(&[300, 17, 60], Some(1)).unwrap();
    let n = layout.numel();
    let (scales, zps) = params(17);
    let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
    let (x, dy) = (inputs(n, 0.5, 21), inputs(n, 0.01, 23));
    let run = || {
        let per_channel = lsq_int8(&x, &dy, layout, &scales, &zf, 0.01);
        let t = ChannelLayout::per_tensor(n);
        let per_tensor = lsq_int8(&x, &dy, t, &[0.5], &[1.0], 0.01);
        let mut dx = vec![0.0; n];
        let grid = quant_core::IntegerGrid::new(8, false, false).unwrap();
        let da = pact_backward_into(&x, &dy, &mut dx, 20.0, grid);
        (per_channel, per_tensor, dx, da)
    };
    let [one, three] = on_one_and_three_threads(run);
    assert_eq!(format!("{one:?}"), format!("{three:?}"));
}

#[test]
fn pact_backward_matches_the_scalar_reference() {
    let grid = quant_core::IntegerGrid::new(8, false, false).unwrap();
    every_path(|level| {
        for n in [37, PARALLEL_THRESHOLD + 77] {
            let x = inputs(n, 0.05, 31);
            let dy = inputs(n, 0.01, 37);
            let mut dx = vec![0.5; n];
            let da = pact_backward_into(&x, &dy, &mut dx, 3.0, grid);
            let mut exact = 0f64;
            for i in 0..n {
                let inside = x[i] >= 0.0 && x[i] < 3.0;
                assert_eq!(
                    dx[i],
                    0.5 + if inside { dy[i] } else { 0.0 },
                    "{level} {n} dx[{i}]"
                );
                exact += if x[i] >= 3.0 { dy[i] as f64 } else { 0.0 };
            }
            assert!(
                (da as f64 - exact).abs() <= 1e-6 * exact.abs().max(1e-3),
                "{level} {n}: {da} vs {exact}"
            );
        }
    });
}

#[test]
fn wide_grids_keep_integer_codes_exact() {
    // Codes beyond 2^24 follow PyTorch's quantize_val: `int64(float(z) + round(x/s))`, the
    // addition in f32 (so 2^24 + 3 rounds to 2^24 + 4), then clamped to the range.
    let x = [16_777_217.0f32, -16_777_219.0, 1e12, -1e12, 0.5, 1.5];
    let layout = ChannelLayout::per_tensor(x.len());
    let mut q = [0i32; 6];
    quantize_into(
        &x,
        &mut q,
        layout,
        &[1.0],
        &[3],
        i32::MIN,
        i32::MAX,
        RoundingPolicy::HalfEven,
    )
    .unwrap();
    assert_eq!(q, [16_777_220, -16_777_216, i32::MAX, i32::MIN, 3, 5]);
    let mut y = [0.0; 6];
    dequantize_into(&q, &mut y, layout, &[1.0], &[3], i32::MIN, i32::MAX).unwrap();
    assert_eq!(y[0], 16_777_216.0); // (2^24 + 1) as f32
                                    // The straight-through mask of x = 2^31 on the widest grid.
    let mask_of_2_pow_31 = |layout| {
        let mut dx = [0.0; 1];
        fake_quantize_affine_backward_into(
            &[2_147_483_648.0f32],
            &[1.0],
            &mut dx,
            layout,
            &[1.0],
            &[0],
            i32::MIN,
            i32::MAX,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        dx
    };
    // PyTorch's per-tensor mask compares f32 codes with f32(quant_max): 2^31 is inside.
    assert_eq!(mask_of_2_pow_31(ChannelLayout::per_tensor(1)), [1.0]);
    // Per channel, the code is an int64: 2^31 is outside.
    let per_channel = ChannelLayout::new(&[1], Some(0)).unwrap();
    assert_eq!(mask_of_2_pow_31(per_channel), [0.0]);
}

#[test]
fn empty_tensors_are_fine() {
    let l = ChannelLayout::new(&[0, 4], Some(1)).unwrap();
    let (s, z) = params(4);
    fake_quantize_affine_into(&[], &mut [], l, &s, &z, -128, 127, RoundingPolicy::HalfEven)
        .unwrap();
    fake_quantize_affine_backward_into(
        &[],
        &[],
        &mut [],
        l,
        &s,
        &z,
        -128,
        127,
        RoundingPolicy::HalfEven,
    )
    .unwrap();
    let (_, ds, _) = lsq_int8(&[], &[], l, &s, &[0.0; 4], 1.0);
    assert_eq!(ds, vec![0.0; 4]);
    quantize_into::<i8>(&[], &mut [], l, &s, &z, -128, 127, RoundingPolicy::HalfEven).unwrap();
    dequantize_into::<i8>(&[], &mut [], l, &s, &z, -128, 127).unwrap();
}

#[test]
fn narrow_codes_dequantize_exactly_with_any_zero_point() {
    // A zero point near i32::MIN used to overflow the narrow i32 difference.
    for z in [
        i32::MIN,
        i32::MIN + 1,
        -65_537,
        -1,
        0,
        3,
        65_535,
        1 << 30,
        i32::MAX,
    ] {
        for q in [-128i8, -1, 0, 7, 127] {
            let exact = (q as i64 - z as i64) as f32;
            assert_eq!(q.minus_zero_point(z), exact, "{q} - {z}");
            assert_eq!(
                (q as u8).minus_zero_point(z),
                (q as u8 as i64 - z as i64) as f32
            );
            assert_eq!((q as i16).minus_zero_point(z), exact);
        }
    }
    let layout = ChannelLayout::per_tensor(2);
    let mut y = [0.0; 2];
    dequantize_into(
        &[7i8, -3],
        &mut y,
        layout,
        &[1.0],
        &[i32::MIN],
        i32::MIN,
        i32::MAX,
    )
    .unwrap();
    assert_eq!(y, [2_147_483_655.0f32, 2_147_483_645.0f32]);
}

#[test]
fn allocating_forms_equal_the_into_forms_bit_for_bit() {
    // Fresh storage is written, never zeroed first: the values must still be exactly what a
    // zeroed buffer plus the `_into` forms give, on the fast and the wide (slow) grids, with
    // NaN inputs and -0.0 gradients (which a zeroed buffer turns into +0.0).
    let mut x = inputs(PARALLEL_THRESHOLD + 333, 0.5, 41);
    x[5] = f32::NAN;
    x[6] = f32::INFINITY;
    let mut dy = inputs(x.len(), 0.01, 43);
    dy[7] = -0.0;
    dy[8] = -0.0;
    x[8] = 1e9; // outside the grid: its gradient is 0.0 + 0.0
    every_path(|level| {
        for (qmin, qmax, z) in [(-128, 127, 3), (i32::MIN, i32::MAX, 5)] {
            let y = fake_quantize_per_tensor_affine(&x, 0.5, z, qmin, qmax).unwrap();
            let mut y_into = vec![0.0; x.len()];
            fake_quantize_per_tensor_affine_into(
                &x,
                &mut y_into,
                0.5,
                z,
                qmin,
                qmax,
                RoundingPolicy::HalfEven,
            )
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&y_into), "{level} forward [{qmin}, {qmax}]");

            let (dx, ds, dz) = fake_quantize_learnable_per_tensor_affine_backward(
                &x, &dy, 0.5, z as f32, qmin, qmax, 0.01,
            )
            .unwrap();
            let mut dx_into = vec![0.0; x.len()];
            let (mut ds_into, mut dz_into) = ([0.0], [0.0]);
            fake_quantize_learnable_affine_backward_into(
                &x,
                &dy,
                &mut dx_into,
                ChannelLayout::per_tensor(x.len()),
                &[0.5],
                &[z as f32],
                qmin,
                qmax,
                0.01,
                RoundingPolicy::HalfEven,
                &mut ds_into,
                Some(&mut dz_into[..]),
            )
            .unwrap();
            assert_eq!(bits(&dx), bits(&dx_into), "{level} LSQ dx [{qmin}, {qmax}]");
            assert_eq!(dx[8].to_bits(), 0.0f32.to_bits());
            assert_eq!(
                (ds.to_bits(), dz.to_bits()),
                (ds_into[0].to_bits(), dz_into[0].to_bits())
            );
        }
        let shape = [3usize, 70, 5];
        let (scales, zps) = params(70);
        let x = inputs(3 * 70 * 5, 0.5, 47);
        let y = fake_quantize_per_channel_affine(&x, &shape, 1, &scales, &zps, -8, 7).unwrap();
        let mut y_into = vec![0.0; x.len()];
        let layout = ChannelLayout::new(&shape, Some(1)).unwrap();
        fake_quantize_affine_into(
            &x,
            &mut y_into,
            layout,
            &scales,
            &zps,
            -8,
            7,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        assert_eq!(y, y_into, "{level} per channel");
    });
}

#[test]
fn zero_points_round_half_to_even_at_every_magnitude() {
    let (qmin, qmax) = (i32::MIN, i32::MAX);
    let mut zs: Vec<f32> = vec![
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -2.5,
        0.49999997,
        -0.49999997,
    ];
    // Around the edge of the add-and-subtract rounding (2^22) and beyond, where floats are
    // halves and then integers.
    for e in 20..=31 {
        let p = (1u64 << e) as f32;
        for d in [-1.5f32, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5] {
            zs.extend([p + d, -(p + d)]);
        }
    }
    zs.extend((-400..400).map(|k| k as f32 * 0.25));
    // The per-channel form gives each value's result, on narrow grids (its vectorised loop)
    // and wide ones.
    for (lo, hi) in [
        (-8, 7),
        (0, 255),
        (-(1 << 22), 1 << 22),
        (-(1 << 23), 5),
        (qmin, qmax),
    ] {
        let one_by_one: Vec<i32> = zs
            .iter()
            .map(|z| round_zero_point(*z, lo, hi).unwrap())
            .collect();
        assert_eq!(
            round_zero_points(&zs, lo, hi).unwrap(),
            one_by_one,
            "[{lo}, {hi}]"
        );
    }
    for z in zs {
        let expected = z.clamp(qmin as f32, qmax as f32).round_ties_even() as i32;
        assert_eq!(
            round_zero_point(z, qmin, qmax).unwrap(),
            expected,
            "z = {z}"
        );
    }
    // Clamped first, then rounded.
    assert_eq!(round_zero_point(300.5, 0, 255).unwrap(), 255);
    assert_eq!(round_zero_point(-7.5, -8, 7).unwrap(), -8);
    assert_eq!(
        round_zero_points(&[0.5, 1.5, -2.5, 9.0], -8, 7).unwrap(),
        vec![0, 2, -2, 7]
    );
    assert!(round_zero_points(&[0.0, f32::NAN], -8, 7).is_err());
    assert!(round_zero_points(&[1.0], 7, -8).is_err());
}

/// Every path gives the baseline's bits, not only the reference's accuracy: the forward, and
/// LSQ's input gradient (added to one already there, and into fresh storage) and its scale and
/// zero-point sums, whose order of additions is part of the definition, on every layout,
/// with values far out of range, infinities and a NaN among them; asked without the zero
/// point's sums, the same input and scale gradients.
#[test]
fn every_path_gives_the_baselines_bits() {
    let (qmin, qmax) = (-8, 7);
    let mut runs: Vec<(String, String, Vec<u32>)> = Vec::new();
    each_level_and_layout(|label, layout, scales, zps| {
        let n = layout.numel();
        let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
        let mut x = inputs(n, 0.5, 41);
        for (i, v) in [(3, 1e30), (17, f32::INFINITY), (40, f32::NEG_INFINITY)] {
            if i < n {
                x[i] = v;
            }
        }
        let dy = inputs(n, 0.01, 43);
        let mut y = vec![0.0; n];
        fake_quantize_affine_into(
            &x,
            &mut y,
            layout,
            scales,
            zps,
            qmin,
            qmax,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        // LSQ's backward added to 0.25 everywhere: (dx, ds), and the zero point's sums where
        // asked for.
        let lsq = |dz: Option<&mut [f32]>| {
            let (mut dx, mut ds) = (vec![0.25; n], vec![0.0; layout.channels]);
            fake_quantize_learnable_affine_backward_into(
                &x,
                &dy,
                &mut dx,
                layout,
                scales,
                &zf,
                qmin,
                qmax,
                1.0,
                RoundingPolicy::HalfEven,
                &mut ds,
                dz,
            )
            .unwrap();
            (dx, ds)
        };
        let mut dz = vec![0.0; layout.channels];
        let (dx, ds) = lsq(Some(&mut dz));
        // Without the zero point's sums (a zero point that does not learn): the same input and
        // scale gradients, bit for bit, on this path.
        let (dx_alone, ds_alone) = lsq(None);
        let bits_of = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits_of(&dx_alone), bits_of(&dx), "{label}: dx without dz");
        assert_eq!(bits_of(&ds_alone), bits_of(&ds), "{label}: ds without dz");
        let mut bits: Vec<u32> = [&y, &dx, &ds, &dz]
            .iter()
            .flat_map(|v| v.iter().map(|v| v.to_bits()))
            .collect();
        if layout.channels == 1 {
            let mut with_nan = x.clone();
            with_nan[n / 2] = f32::NAN;
            for x in [&x, &with_nan] {
                let (dx, ds, dz) = fake_quantize_learnable_per_tensor_affine_backward(
                    x, &dy, scales[0], zf[0], qmin, qmax, 1.0,
                )
                .unwrap();
                bits.extend(dx.iter().map(|v| v.to_bits()));
                bits.extend([ds.to_bits(), dz.to_bits()]);
            }
        }
        let (path, walk) = label.split_once(' ').unwrap();
        runs.push((path.to_string(), walk.to_string(), bits));
    });
    let baseline: Vec<_> = runs.iter().filter(|r| r.0 == "baseline").collect();
    assert_eq!(baseline.len(), layouts().len());
    for (path, walk, bits) in &runs {
        let want = baseline.iter().find(|b| &b.1 == walk).unwrap();
        let first = bits.iter().zip(&want.2).position(|(a, b)| a != b);
        assert!(
            bits.len() == want.2.len() && first.is_none(),
            "{path} {walk}: first difference at {first:?}"
        );
    }
}

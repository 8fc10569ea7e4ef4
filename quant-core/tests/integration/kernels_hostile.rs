//! The kernels' public API on hostile arguments: layouts built by hand (their fields are
//! public) that disagree with the buffers or overflow, buffers of any length, NaN, infinite,
//! zero, negative and subnormal scales, zero points anywhere, inverted ranges, every rounding
//! policy. Functions that return `Result` must succeed exactly when their arguments are valid
//! (an oracle written here from the documented rules decides) and otherwise return an error
//! that leaves every output buffer as it was; the gradient functions that cannot fail must
//! leave mismatched buffers alone. None may panic.

use proptest::prelude::*;
use quant_core::kernels::*;
use quant_core::{ChannelLayout, IntegerGrid, RoundingPolicy};

const POLICIES: [RoundingPolicy; 7] = [
    RoundingPolicy::HalfEven,
    RoundingPolicy::HalfAwayFromZero,
    RoundingPolicy::HalfUp,
    RoundingPolicy::HalfDown,
    RoundingPolicy::HalfTowardZero,
    RoundingPolicy::Floor,
    RoundingPolicy::Ceil,
];

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0usize..5, 1 => Just(usize::MAX), 1 => Just(1 << 40)]
}

fn layout() -> impl Strategy<Value = ChannelLayout> {
    prop_oneof![
        (0usize..12).prop_map(ChannelLayout::per_tensor),
        (dim(), dim(), dim(), prop::option::of(0usize..4)).prop_map(
            |(outer, channels, inner, axis)| {
                ChannelLayout {
                    outer,
                    channels,
                    inner,
                    axis,
                }
            }
        ),
        (
            prop::collection::vec(1usize..4, 1..4),
            any::<prop::sample::Index>()
        )
            .prop_map(|(shape, a)| ChannelLayout::new(&shape, Some(a.index(shape.len()))).unwrap()),
    ]
}

fn float() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -3.0f32..3.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(0.0f32),
        1 => Just(-0.5f32),
        1 => Just(1e-40f32),
        1 => Just(f32::MAX),
        1 => Just(1e30f32),
    ]
}

fn floats(max: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(float(), 0..max)
}

fn int() -> impl Strategy<Value = i32> {
    prop_oneof![4 => -300i32..300, 1 => Just(i32::MIN), 1 => Just(i32::MAX)]
}

fn grid() -> impl Strategy<Value = IntegerGrid> {
    (2u32..=16, any::<bool>(), any::<bool>())
        .prop_map(|(b, s, n)| IntegerGrid::new(b, s, n).unwrap())
}

/// What the kernels accept as a scale: finite and normal.
fn valid_scale(s: f32) -> bool {
    s.is_finite() && s >= f32::MIN_POSITIVE
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

/// A straight-through gradient: each element of `dx` is what it was, or that plus `dy`.
fn passed_through_or_not(before: &[f32], dy: &[f32], dx: &[f32]) -> bool {
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    before.len() == dx.len()
        && before
            .iter()
            .zip(dy)
            .zip(dx)
            .all(|((b, d), x)| same(*x, *b) || same(*x, *b + *d))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn affine_kernels(
        layout in layout(),
        x in floats(14),
        dy in floats(14),
        y_len in 0usize..14,
        scales in floats(5),
        zps in prop::collection::vec(int(), 0..5),
        zpf in floats(5),
        qmin in int(),
        qmax in int(),
        g in float(),
        policy in 0usize..7,
        conform in any::<bool>(),
    ) {
        let rounding = POLICIES[policy];
        let channels = layout.channels;
        // Half the cases are made to agree with the layout (values stay hostile), so that
        // valid calls are common enough to check their results too.
        let (mut x, mut dy, mut y_len, mut scales, mut zps, mut zpf) = (x, dy, y_len, scales, zps, zpf);
        let (mut qmin, mut qmax, mut g) = (qmin, qmax, g);
        if conform && layout.numel() <= 64 && channels <= 64 {
            let n = layout.numel();
            x = (0..n).map(|i| x.get(i % x.len().max(1)).copied().unwrap_or(0.3)).collect();
            dy = (0..n).map(|i| dy.get(i % dy.len().max(1)).copied().unwrap_or(1.0)).collect();
            y_len = n;
            if qmin > qmax {
                std::mem::swap(&mut qmin, &mut qmax);
            }
            let scale = |i: usize| scales.get(i).copied().filter(|s| valid_scale(*s)).unwrap_or(0.25);
            scales = (0..channels).map(scale).collect();
            zps = (0..channels).map(|i| zps.get(i).copied().unwrap_or(0).clamp(qmin, qmax)).collect();
            zpf = (0..channels).map(|i| zpf.get(i).copied().filter(|z| !z.is_nan()).unwrap_or(0.0)).collect();
            if !g.is_finite() {
                g = 1.0;
            }
        }
        // What each function must accept: lengths that agree with the layout, a range, valid
        // scales and zero points inside the range. Everything else is an error that leaves
        // the output buffers as they were.
        let range = qmin <= qmax;
        let params = range
            && scales.len() == channels
            && zps.len() == channels
            && scales.iter().all(|s| valid_scale(*s))
            && zps.iter().all(|z| (qmin..=qmax).contains(z));
        let fits_x = layout.numel() == x.len();

        let mut y = vec![0.5; y_len];
        let r = fake_quantize_affine_into(&x, &mut y, layout, &scales, &zps, qmin, qmax, rounding);
        prop_assert_eq!(r.is_ok(), fits_x && y_len == x.len() && params, "forward: {:?}", r);
        if r.is_ok() {
            // NaN propagates; nothing else becomes NaN (±Inf saturates to the grid).
            prop_assert!(x.iter().zip(&y).all(|(x, y)| x.is_nan() == y.is_nan()), "{:?} -> {:?}", x, y);
        } else {
            prop_assert!(y.iter().all(|v| *v == 0.5), "an error wrote into y: {:?}", y);
        }

        let before = vec![0.25; y_len];
        let mut dx = before.clone();
        let r = fake_quantize_affine_backward_into(&x, &dy, &mut dx, layout, &scales, &zps, qmin, qmax, rounding);
        let grads_fit = fits_x && dy.len() == x.len() && y_len == x.len();
        prop_assert_eq!(r.is_ok(), grads_fit && params, "STE backward: {:?}", r);
        if r.is_ok() {
            prop_assert!(passed_through_or_not(&before, &dy, &dx), "STE: {:?} {:?} -> {:?}", dy, before, dx);
        } else {
            prop_assert_eq!(bits(&dx), bits(&before));
        }

        let mut dx = before.clone();
        let mut ds = vec![0.0; scales.len()];
        let mut dz = vec![0.0; zpf.len()];
        let r = fake_quantize_learnable_affine_backward_into(
            &x, &dy, &mut dx, layout, &scales, &zpf, qmin, qmax, g, rounding, &mut ds,
            Some(&mut dz[..]),
        );
        // Learnable zero points are rounded and clamped into the range: only NaN is rejected.
        let lsq_valid = grads_fit
            && range
            && scales.len() == channels
            && zpf.len() == channels
            && scales.iter().all(|s| valid_scale(*s))
            && zpf.iter().all(|z| !z.is_nan())
            && g.is_finite();
        prop_assert_eq!(r.is_ok(), lsq_valid, "LSQ backward: {:?}", r);
        if r.is_ok() {
            prop_assert!(passed_through_or_not(&before, &dy, &dx), "LSQ: {:?} {:?} -> {:?}", dy, before, dx);
        } else {
            prop_assert_eq!(bits(&dx), bits(&before));
            prop_assert!(ds.iter().chain(&dz).all(|v| *v == 0.0));
        }

        if let (Some(s), Some(z)) = (scales.first(), zpf.first()) {
            let r = fake_quantize_learnable_per_tensor_affine_backward(&x, &dy, *s, *z, qmin, qmax, g);
            let valid = dy.len() == x.len() && range && valid_scale(*s) && !z.is_nan() && g.is_finite();
            prop_assert_eq!(r.is_ok(), valid, "LSQ per tensor: {:?}", r);
            if let Ok((dx, _, _)) = r {
                prop_assert!(passed_through_or_not(&vec![0.0; x.len()], &dy, &dx));
            }
        }

        let codes_fit = fits_x && y_len == x.len() && params && !x.iter().any(|v| v.is_nan());
        let mut q8 = vec![7i8; y_len];
        let r = quantize_into(&x, &mut q8, layout, &scales, &zps, qmin, qmax, rounding);
        prop_assert_eq!(r.is_ok(), codes_fit && qmin >= -128 && qmax <= 127, "quantize i8: {:?}", r);
        if r.is_ok() {
            prop_assert!(q8.iter().all(|q| (qmin..=qmax).contains(&(*q as i32))), "{:?}", q8);
        } else {
            prop_assert!(q8.iter().all(|q| *q == 7));
        }
        let mut q32 = vec![7i32; y_len];
        let r = quantize_into(&x, &mut q32, layout, &scales, &zps, qmin, qmax, rounding);
        prop_assert_eq!(r.is_ok(), codes_fit, "quantize i32: {:?}", r);
        if r.is_ok() {
            prop_assert!(q32.iter().all(|q| (qmin..=qmax).contains(q)), "{:?}", q32);
        } else {
            prop_assert!(q32.iter().all(|q| *q == 7));
        }

        // Codes from anywhere (here 7 or a quantizer's output) dequantize by the formula.
        let dequantize_valid = layout.numel() == y_len && params;
        for r in [
            dequantize_into(&q32, &mut y, layout, &scales, &zps, qmin, qmax),
            dequantize_into(&q8, &mut y, layout, &scales, &zps, qmin, qmax),
        ] {
            prop_assert_eq!(r.is_ok(), dequantize_valid, "dequantize: {:?}", r);
            if r.is_ok() {
                prop_assert!(y.iter().all(|v| !v.is_nan()), "{:?}", y);
            }
        }

        for z in &zpf {
            let r = round_zero_point(*z, qmin, qmax);
            prop_assert_eq!(r.is_ok(), range && !z.is_nan(), "round_zero_point({}): {:?}", z, r);
            if let Ok(z) = r {
                prop_assert!((qmin..=qmax).contains(&z));
            }
        }

        if let Some(s) = scales.first() {
            let z = zps.first().copied().unwrap_or(0);
            let r = fake_quantize_per_tensor_affine(&x, *s, z, qmin, qmax);
            prop_assert_eq!(r.is_ok(), range && valid_scale(*s) && (qmin..=qmax).contains(&z), "{:?}", r);
            if let Ok(y) = r {
                prop_assert_eq!(y.len(), x.len());
                prop_assert!(x.iter().zip(&y).all(|(x, y)| x.is_nan() == y.is_nan()));
            }
        }
    }

    #[test]
    fn pact_and_dsq_kernels(
        layout in layout(),
        x in floats(14),
        dy in floats(14),
        dx_len in 0usize..14,
        alpha in float(),
        alphas in floats(5),
        lower in floats(5),
        upper in floats(5),
        grads in (0usize..6, 0usize..6, 0usize..6),
        grid in grid(),
        policy in 0usize..7,
    ) {
        let rounding = POLICIES[policy];
        let mut y = vec![0.0; dx_len];
        let r = pact_forward_into(&x, &mut y, layout, alpha, grid, rounding);
        let pact_valid = alpha.is_finite() && !grid.signed() && layout.numel() == x.len() && dx_len == x.len();
        prop_assert_eq!(r.is_ok(), pact_valid, "PACT forward: {:?}", r);
        let _ = pact_alpha(alpha, grid);
        let mut dx = vec![0.0; dx_len];
        let _ = pact_backward_into(&x, &dy, &mut dx, alpha, grid);
        let _ = dsq_forward_into(&x, &mut y, layout, &lower, &upper, grid, rounding);
        if let (Some(l), Some(u)) = (lower.first(), upper.first()) {
            let _ = dsq_qparams(*l, *u, grid);
        }
        let (mut da, mut dl, mut du) = (vec![0.0; grads.0], vec![0.0; grads.1], vec![0.0; grads.2]);
        let before = dx.clone();
        dsq_backward_into(&x, &dy, &mut dx, layout, &alphas, &lower, &upper, grid, &mut da, &mut dl, &mut du);
        let consistent = layout.numel() == x.len() && dy.len() == x.len() && dx.len() == x.len()
            && [alphas.len(), lower.len(), upper.len(), grads.0, grads.1, grads.2].iter().all(|n| *n >= layout.channels);
        if !consistent {
            // Mismatched buffers are left alone: the forward pass, which checks them, failed.
            prop_assert_eq!(format!("{dx:?}"), format!("{before:?}"));
            prop_assert!(da.iter().chain(&dl).chain(&du).all(|v| *v == 0.0));
        }
    }
}

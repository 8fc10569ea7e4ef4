//! The kernels' public API on hostile arguments: layouts built by hand (their fields are
//! public) that disagree with the buffers or overflow, buffers of any length, NaN, infinite,
//! zero, negative and subnormal scales, zero points anywhere, inverted ranges, every rounding
//! policy. Functions that return `Result` must return an error or succeed; the gradient
//! functions that cannot fail must leave mismatched buffers alone. None may panic.

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
    ) {
        let rounding = POLICIES[policy];
        let mut y = vec![0.0; y_len];
        let _ = fake_quantize_affine_into(&x, &mut y, layout, &scales, &zps, qmin, qmax, rounding);
        let _ = fake_quantize_affine_backward_into(&x, &dy, &mut y, layout, &scales, &zps, qmin, qmax, rounding);
        let mut ds = vec![0.0; scales.len()];
        let mut dz = vec![0.0; zpf.len()];
        let _ = fake_quantize_learnable_affine_backward_into(
            &x, &dy, &mut y, layout, &scales, &zpf, qmin, qmax, g, rounding, &mut ds, &mut dz,
        );
        if let (Some(s), Some(z)) = (scales.first(), zpf.first()) {
            let _ = fake_quantize_learnable_per_tensor_affine_backward(&x, &dy, *s, *z, qmin, qmax, g);
        }
        let mut q8 = vec![0i8; y_len];
        let _ = quantize_into(&x, &mut q8, layout, &scales, &zps, qmin, qmax, rounding);
        let mut q32 = vec![0i32; y_len];
        let _ = quantize_into(&x, &mut q32, layout, &scales, &zps, qmin, qmax, rounding);
        let _ = dequantize_into(&q32, &mut y, layout, &scales, &zps, qmin, qmax);
        let _ = dequantize_into(&q8, &mut y, layout, &scales, &zps, qmin, qmax);
        for z in &zpf {
            let _ = round_zero_point(*z, qmin, qmax);
        }
        if let Some(s) = scales.first() {
            let _ = fake_quantize_per_tensor_affine(&x, *s, zps.first().copied().unwrap_or(0), qmin, qmax);
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
        let _ = pact_forward_into(&x, &mut y, layout, alpha, grid, rounding);
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

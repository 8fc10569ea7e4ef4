//! Our kernels against real PyTorch (`tools/gen_pytorch_fixtures.py` wrote the vectors in
//! `fixtures/pytorch_fake_quant.json` with `torch.fake_quantize_per_tensor_affine`,
//! `torch.fake_quantize_per_channel_affine`, `torch._fake_quantize_learnable_per_tensor_affine`
//! and `torch._fake_quantize_learnable_per_channel_affine` and their autograd backward), run
//! with `ATEN_CPU_CAPABILITY=default` (the script says why: PyTorch's AVX2/AVX512 builds fuse
//! the LSQ backward's `z + x * (1/s)` into an FMA, which moves a few near-tie codes).
//!
//! Forward values must be bit-identical. Straight-through and LSQ input gradients must be
//! equal (as numbers: PyTorch's `dy * 0` keeps the sign of `dy`, our `0` does not). LSQ's
//! scale and zero-point gradients are sums over the tensor, accumulated in a different order
//! than PyTorch's: they must agree to 1e-5 relative, measured against the larger of the
//! expected value and 1e-3 of the sum of the absolute values of the terms, which bounds the
//! rounding error of any summation order (a sum of terms of both signs can cancel to almost
//! nothing).
//!
//! Each case also runs tiled to more than `PARALLEL_THRESHOLD` elements, so the parallel and
//! vectorised main loops see the same inputs as the scalar remainders.

use quant_core::kernels::{
    dequantize_into, fake_quantize_affine_backward_into, fake_quantize_affine_into,
    fake_quantize_learnable_affine_backward_into,
    fake_quantize_learnable_per_tensor_affine_backward, fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine, quantize_into, round_zero_point, QuantInt, PARALLEL_THRESHOLD,
};
use quant_core::{ChannelLayout, RoundingPolicy};
use serde::Deserialize;

const FIXTURES: &str = include_str!("fixtures/pytorch_fake_quant.json");

#[derive(Deserialize)]
struct Fixtures {
    torch_version: String,
    per_tensor: Vec<PerTensor>,
    per_channel: Vec<PerChannel>,
    learnable_per_tensor: Vec<LearnablePerTensor>,
    learnable_per_channel: Vec<LearnablePerChannel>,
}

#[derive(Deserialize)]
struct PerTensor {
    name: String,
    scale: u32,
    zero_point: i32,
    quant_min: i32,
    quant_max: i32,
    x: Vec<u32>,
    y: Vec<u32>,
    dy: Vec<u32>,
    dx: Vec<u32>,
}

#[derive(Deserialize)]
struct PerChannel {
    name: String,
    shape: Vec<usize>,
    axis: usize,
    scales: Vec<u32>,
    zero_points: Vec<i32>,
    quant_min: i32,
    quant_max: i32,
    x: Vec<u32>,
    y: Vec<u32>,
    dy: Vec<u32>,
    dx: Vec<u32>,
}

#[derive(Deserialize)]
struct LearnablePerTensor {
    name: String,
    scale: u32,
    zero_point: u32,
    /// The zero point PyTorch's per-tensor backward really uses: `trunc(clamp(z + 0.5))`.
    zero_point_backward: u32,
    quant_min: i32,
    quant_max: i32,
    grad_factor: u32,
    x: Vec<u32>,
    y: Vec<u32>,
    dy: Vec<u32>,
    dx: Vec<u32>,
    dscale: Vec<u32>,
    dzero_point: Vec<u32>,
    l1_dscale: Vec<f64>,
    l1_dzero_point: Vec<f64>,
}

#[derive(Deserialize)]
struct LearnablePerChannel {
    name: String,
    shape: Vec<usize>,
    axis: usize,
    scales: Vec<u32>,
    zero_points: Vec<u32>,
    quant_min: i32,
    quant_max: i32,
    grad_factor: u32,
    x: Vec<u32>,
    y: Vec<u32>,
    dy: Vec<u32>,
    dx: Vec<u32>,
    dscale: Vec<u32>,
    dzero_point: Vec<u32>,
    l1_dscale: Vec<f64>,
    l1_dzero_point: Vec<f64>,
}

fn fixtures() -> Fixtures {
    serde_json::from_str(FIXTURES).expect("fixtures/pytorch_fake_quant.json parses")
}

fn f32s(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|b| f32::from_bits(*b)).collect()
}

/// Asserts bit-identical values, naming the first difference.
fn assert_bits(case: &str, what: &str, x: &[f32], got: &[f32], expected: &[u32]) {
    assert_eq!(got.len(), expected.len(), "{case}: {what} length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            g.to_bits() == *e,
            "{case}: {what}[{i}] = {g:e} ({:#010x}), PyTorch {:e} ({e:#010x}), x = {:e} ({:#010x})",
            g.to_bits(),
            f32::from_bits(*e),
            x[i % x.len()],
            x[i % x.len()].to_bits()
        );
    }
}

/// Asserts equal values (`-0 == +0`), naming the first difference.
fn assert_values(case: &str, what: &str, x: &[f32], got: &[f32], expected: &[u32]) {
    assert_eq!(got.len(), expected.len(), "{case}: {what} length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let e = f32::from_bits(*e);
        assert!(
            *g == e,
            "{case}: {what}[{i}] = {g:e}, PyTorch {e:e}, x = {:e}",
            x[i % x.len()]
        );
    }
}

/// Asserts a gradient sum within 1e-5 of PyTorch's, relative to `max(|expected|, l1 / 1000)`.
fn assert_sum(case: &str, what: &str, got: f32, expected: u32, l1: f64) {
    let e = f32::from_bits(expected) as f64;
    let err = (got as f64 - e).abs();
    let reference = e.abs().max(l1 * 1e-3);
    assert!(
        err <= 1e-5 * reference || err == 0.0,
        "{case}: {what} = {got:e}, PyTorch {e:e}, error {:.2e} relative to {reference:e} (l1 {l1:e})",
        err / reference
    );
}

/// `x` repeated until it is longer than the parallel threshold, and the repeat count.
fn tiled(x: &[f32]) -> (Vec<f32>, usize) {
    let times = PARALLEL_THRESHOLD / x.len() + 2;
    (
        x.iter().copied().cycle().take(x.len() * times).collect(),
        times,
    )
}

fn repeat_bits(bits: &[u32], times: usize) -> Vec<u32> {
    bits.iter()
        .copied()
        .cycle()
        .take(bits.len() * times)
        .collect()
}

/// Quantizes to the narrowest storage that holds the range, dequantizes, and returns the result.
fn round_trip(
    x: &[f32],
    layout: ChannelLayout,
    scales: &[f32],
    zps: &[i32],
    qmin: i32,
    qmax: i32,
) -> Vec<f32> {
    fn with<T: QuantInt>(
        x: &[f32],
        l: ChannelLayout,
        s: &[f32],
        z: &[i32],
        qmin: i32,
        qmax: i32,
    ) -> Vec<f32> {
        let mut q = vec![T::default(); x.len()];
        quantize_into(x, &mut q, l, s, z, qmin, qmax, RoundingPolicy::HalfEven).expect("quantize");
        let mut y = vec![0.0; x.len()];
        dequantize_into(&q, &mut y, l, s, z, qmin, qmax).expect("dequantize");
        y
    }
    match (qmin, qmax) {
        (-128..=127, -128..=127) => with::<i8>(x, layout, scales, zps, qmin, qmax),
        (0..=255, 0..=255) => with::<u8>(x, layout, scales, zps, qmin, qmax),
        (-32768..=32767, -32768..=32767) => with::<i16>(x, layout, scales, zps, qmin, qmax),
        (0..=65535, 0..=65535) => with::<u16>(x, layout, scales, zps, qmin, qmax),
        _ => with::<i32>(x, layout, scales, zps, qmin, qmax),
    }
}

#[test]
fn fixtures_come_from_pytorch() {
    let f = fixtures();
    assert!(!f.torch_version.is_empty());
    assert!(f.per_tensor.len() >= 10 && f.per_channel.len() >= 5);
    assert!(f.learnable_per_tensor.len() >= 5 && f.learnable_per_channel.len() >= 3);
}

#[test]
fn per_tensor_forward_and_straight_through_gradient_match_pytorch() {
    for c in fixtures().per_tensor {
        let (x, dy, s) = (f32s(&c.x), f32s(&c.dy), f32::from_bits(c.scale));
        let (z, qmin, qmax) = (c.zero_point, c.quant_min, c.quant_max);
        let y = fake_quantize_per_tensor_affine(&x, s, z, qmin, qmax).expect("valid case");
        assert_bits(&c.name, "y", &x, &y, &c.y);

        let layout = ChannelLayout::per_tensor(x.len());
        let mut dx = vec![0.0; x.len()];
        fake_quantize_affine_backward_into(
            &x,
            &dy,
            &mut dx,
            layout,
            &[s],
            &[z],
            qmin,
            qmax,
            RoundingPolicy::HalfEven,
        )
        .expect("valid case");
        assert_values(&c.name, "dx", &x, &dx, &c.dx);

        let q = round_trip(&x, layout, &[s], &[z], qmin, qmax);
        assert_bits(&c.name, "dequantize(quantize(x))", &x, &q, &c.y);

        let (xt, times) = tiled(&x);
        let (dyt, _) = tiled(&dy);
        let lt = ChannelLayout::per_tensor(xt.len());
        let mut yt = vec![0.0; xt.len()];
        fake_quantize_affine_into(
            &xt,
            &mut yt,
            lt,
            &[s],
            &[z],
            qmin,
            qmax,
            RoundingPolicy::HalfEven,
        )
        .expect("valid");
        assert_bits(&c.name, "tiled y", &x, &yt, &repeat_bits(&c.y, times));
        let mut dxt = vec![0.0; xt.len()];
        fake_quantize_affine_backward_into(
            &xt,
            &dyt,
            &mut dxt,
            lt,
            &[s],
            &[z],
            qmin,
            qmax,
            RoundingPolicy::HalfEven,
        )
        .expect("valid");
        assert_values(&c.name, "tiled dx", &x, &dxt, &repeat_bits(&c.dx, times));
        let qt = round_trip(&xt, lt, &[s], &[z], qmin, qmax);
        assert_bits(
            &c.name,
            "tiled dequantize(quantize(x))",
            &x,
            &qt,
            &repeat_bits(&c.y, times),
        );
    }
}

#[test]
fn per_channel_forward_and_straight_through_gradient_match_pytorch() {
    for c in fixtures().per_channel {
        let (x, dy, s) = (f32s(&c.x), f32s(&c.dy), f32s(&c.scales));
        let (z, qmin, qmax) = (&c.zero_points, c.quant_min, c.quant_max);
        let y = fake_quantize_per_channel_affine(&x, &c.shape, c.axis, &s, z, qmin, qmax)
            .expect("valid case");
        assert_bits(&c.name, "y", &x, &y, &c.y);

        let layout = ChannelLayout::new(&c.shape, Some(c.axis)).expect("valid shape");
        let mut dx = vec![0.0; x.len()];
        fake_quantize_affine_backward_into(
            &x,
            &dy,
            &mut dx,
            layout,
            &s,
            z,
            qmin,
            qmax,
            RoundingPolicy::HalfEven,
        )
        .expect("valid case");
        assert_values(&c.name, "dx", &x, &dx, &c.dx);
        let q = round_trip(&x, layout, &s, z, qmin, qmax);
        assert_bits(&c.name, "dequantize(quantize(x))", &x, &q, &c.y);

        // A new leading dimension repeats the tensor without moving any element's channel.
        let (xt, times) = tiled(&x);
        let (dyt, _) = tiled(&dy);
        let shape: Vec<usize> = std::iter::once(times)
            .chain(c.shape.iter().copied())
            .collect();
        let lt = ChannelLayout::new(&shape, Some(c.axis + 1)).expect("valid shape");
        let mut yt = vec![0.0; xt.len()];
        fake_quantize_affine_into(
            &xt,
            &mut yt,
            lt,
            &s,
            z,
            qmin,
            qmax,
            RoundingPolicy::HalfEven,
        )
        .expect("valid");
        assert_bits(&c.name, "tiled y", &x, &yt, &repeat_bits(&c.y, times));
        let mut dxt = vec![0.0; xt.len()];
        fake_quantize_affine_backward_into(
            &xt,
            &dyt,
            &mut dxt,
            lt,
            &s,
            z,
            qmin,
            qmax,
            RoundingPolicy::HalfEven,
        )
        .expect("valid");
        assert_values(&c.name, "tiled dx", &x, &dxt, &repeat_bits(&c.dx, times));
        let qt = round_trip(&xt, lt, &s, z, qmin, qmax);
        assert_bits(
            &c.name,
            "tiled dequantize(quantize(x))",
            &x,
            &qt,
            &repeat_bits(&c.y, times),
        );
    }
}

#[test]
fn lsq_per_tensor_matches_pytorch() {
    for c in fixtures().learnable_per_tensor {
        let (x, dy) = (f32s(&c.x), f32s(&c.dy));
        let (s, zf, g) = (
            f32::from_bits(c.scale),
            f32::from_bits(c.zero_point),
            f32::from_bits(c.grad_factor),
        );
        let (qmin, qmax) = (c.quant_min, c.quant_max);
        let z = round_zero_point(zf, qmin, qmax).expect("finite zero point");
        let y = fake_quantize_per_tensor_affine(&x, s, z, qmin, qmax).expect("valid case");
        assert_bits(&c.name, "y", &x, &y, &c.y);
        // PyTorch's per-tensor backward rounds the zero point its own way (see the kernels'
        // module docs); give ours the value it used, to compare the gradient formulas.
        let zb = f32::from_bits(c.zero_point_backward);
        let (dx, ds, dz) =
            fake_quantize_learnable_per_tensor_affine_backward(&x, &dy, s, zb, qmin, qmax, g)
                .expect("valid case");
        assert_values(&c.name, "dx", &x, &dx, &c.dx);
        assert_sum(&c.name, "dscale", ds, c.dscale[0], c.l1_dscale[0]);
        assert_sum(
            &c.name,
            "dzero_point",
            dz,
            c.dzero_point[0],
            c.l1_dzero_point[0],
        );

        // Tiled: every gradient sum is `times` the original (the grad factor is kept).
        let (xt, times) = tiled(&x);
        let (dyt, _) = tiled(&dy);
        let (dxt, dst, dzt) =
            fake_quantize_learnable_per_tensor_affine_backward(&xt, &dyt, s, zb, qmin, qmax, g)
                .expect("valid");
        assert_values(&c.name, "tiled dx", &x, &dxt, &repeat_bits(&c.dx, times));
        let scaled = |bits: u32| (f32::from_bits(bits) * times as f32).to_bits();
        let t = times as f64;
        assert_sum(
            &c.name,
            "tiled dscale",
            dst,
            scaled(c.dscale[0]),
            c.l1_dscale[0] * t,
        );
        assert_sum(
            &c.name,
            "tiled dzero_point",
            dzt,
            scaled(c.dzero_point[0]),
            c.l1_dzero_point[0] * t,
        );
    }
}

#[test]
fn lsq_per_channel_matches_pytorch() {
    for c in fixtures().learnable_per_channel {
        let (x, dy, s, zf) = (
            f32s(&c.x),
            f32s(&c.dy),
            f32s(&c.scales),
            f32s(&c.zero_points),
        );
        let (qmin, qmax, g) = (c.quant_min, c.quant_max, f32::from_bits(c.grad_factor));
        let z: Vec<i32> = zf
            .iter()
            .map(|z| round_zero_point(*z, qmin, qmax).expect("finite"))
            .collect();
        let y = fake_quantize_per_channel_affine(&x, &c.shape, c.axis, &s, &z, qmin, qmax)
            .expect("valid case");
        assert_bits(&c.name, "y", &x, &y, &c.y);

        let layout = ChannelLayout::new(&c.shape, Some(c.axis)).expect("valid shape");
        let channels = layout.channels;
        let mut dx = vec![0.0; x.len()];
        let (mut ds, mut dz) = (vec![0.0; channels], vec![0.0; channels]);
        fake_quantize_learnable_affine_backward_into(
            &x,
            &dy,
            &mut dx,
            layout,
            &s,
            &zf,
            qmin,
            qmax,
            g,
            RoundingPolicy::HalfEven,
            &mut ds,
            Some(&mut dz[..]),
        )
        .expect("valid case");
        assert_values(&c.name, "dx", &x, &dx, &c.dx);
        for ch in 0..channels {
            assert_sum(
                &c.name,
                &format!("dscale[{ch}]"),
                ds[ch],
                c.dscale[ch],
                c.l1_dscale[ch],
            );
            assert_sum(
                &c.name,
                &format!("dzero_point[{ch}]"),
                dz[ch],
                c.dzero_point[ch],
                c.l1_dzero_point[ch],
            );
        }

        let (xt, times) = tiled(&x);
        let (dyt, _) = tiled(&dy);
        let shape: Vec<usize> = std::iter::once(times)
            .chain(c.shape.iter().copied())
            .collect();
        let lt = ChannelLayout::new(&shape, Some(c.axis + 1)).expect("valid shape");
        let mut dxt = vec![0.0; xt.len()];
        let (mut dst, mut dzt) = (vec![0.0; channels], vec![0.0; channels]);
        fake_quantize_learnable_affine_backward_into(
            &xt,
            &dyt,
            &mut dxt,
            lt,
            &s,
            &zf,
            qmin,
            qmax,
            g,
            RoundingPolicy::HalfEven,
            &mut dst,
            Some(&mut dzt[..]),
        )
        .expect("valid");
        assert_values(&c.name, "tiled dx", &x, &dxt, &repeat_bits(&c.dx, times));
        let t = times as f64;
        for ch in 0..channels {
            let scaled = |bits: u32| (f32::from_bits(bits) * times as f32).to_bits();
            assert_sum(
                &c.name,
                &format!("tiled dscale[{ch}]"),
                dst[ch],
                scaled(c.dscale[ch]),
                c.l1_dscale[ch] * t,
            );
            let name = format!("tiled dzero_point[{ch}]");
            assert_sum(
                &c.name,
                &name,
                dzt[ch],
                scaled(c.dzero_point[ch]),
                c.l1_dzero_point[ch] * t,
            );
        }
    }
}

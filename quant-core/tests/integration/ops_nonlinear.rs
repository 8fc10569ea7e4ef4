//! The integer GELU as a dfdx op: its input gradient is its definition's (the exact GELU's
//! slope where the input's code lies inside the kernel's range, 0 beyond) bit for bit, on every
//! instruction set and range width.

use dfdx::prelude::*;
use quant_core::dfdx_ops::int_gelu;
use quant_core::int8::nonlinear::{normal_cdf, Approximation, IntGelu};
use quant_core::int8::Isa;

/// `Φ(x) + x · φ(x)`: the slope of the exact GELU.
fn gelu_slope(x: f64) -> f64 {
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    normal_cdf(x) + x * pdf
}

/// `int_gelu`'s input gradient by its definition, one value at a time: the exact code
/// decides whether the value is inside the kernel's range, the slope is computed for each.
fn gelu_gradient_reference(kernel: &IntGelu, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    let (scale, zero) = (
        kernel.input_scale() as f64,
        kernel.input_zero_point() as f64,
    );
    let (lo, hi) = (
        *kernel.input_codes().start() as f64,
        *kernel.input_codes().end() as f64,
    );
    for ((x, dy), dx) in x.iter().zip(dy).zip(dx) {
        let code = (*x as f64 / scale).round_ties_even() + zero;
        if (lo..=hi).contains(&code) {
            *dx += (*dy as f64 * gelu_slope(*x as f64)) as f32;
        }
    }
}

#[test]
fn int_gelu_input_gradient_is_the_reference_bit_for_bit_on_every_width() {
    let dev = Cpu::default();
    // (scale, zero point, codes): a memo-sized range, one too wide for the memo, ranges
    // ending at the i32 bounds (where the vectorised codes saturate).
    let cases = [
        (1.0f32 / 16.0, 128, 0..=255),
        (0.01, 0, -100_000..=100_000),
        (2.0f32.powi(-20), 0, i32::MAX - 300..=i32::MAX),
        (2.0f32.powi(-20), 0, i32::MIN..=i32::MIN + 300),
    ];
    for (scale, zero_point, codes) in cases {
        let (lo, hi) = (*codes.start() as i64, *codes.end() as i64);
        // On-grid values across and beyond the range, repeated (the memo's hits), their
        // neighbours one ulp away (same code, other bits), and values far beyond i32 codes.
        let mut x = Vec::new();
        for k in 0..600i64 {
            let code = lo - 20 + (k * 7919) % (hi - lo + 41).min(2000);
            let v = ((code - zero_point as i64) as f64 * scale as f64) as f32;
            x.extend([v, v, v.next_up(), v.next_down(), v]);
        }
        x.extend([1e30, -1e30, 3.0e9 * scale, -3.0e9 * scale]);
        // Then on-grid values only, across and beyond the range: whole groups of values
        // whose slopes the memo already holds (the vectorised paths' gathers).
        for k in 0..4000i64 {
            let code = lo - 20 + (k * 31) % (hi - lo + 41).min(2000);
            x.push(((code - zero_point as i64) as f64 * scale as f64) as f32);
        }
        let dy: Vec<f32> = (0..x.len())
            .map(|i| 0.25 + (i % 13) as f32 * 0.37)
            .collect();
        let base: Vec<f32> = (0..x.len()).map(|i| (i % 5) as f32 * 0.1).collect();
        for isa in Isa::available() {
            let kernel = IntGelu::new(scale, zero_point, codes.clone(), Approximation::FixedPoint)
                .unwrap()
                .with_isa(isa)
                .unwrap();
            let mut want = base.clone();
            gelu_gradient_reference(&kernel, &x, &dy, &mut want);
            let input: Tensor<(usize,), f32, Cpu> = dev.tensor((x.clone(), (x.len(),)));
            let y = int_gelu(input.leaky_trace(), &kernel).unwrap();
            let w: Tensor<(usize,), f32, Cpu> = dev.tensor((dy.clone(), (x.len(),)));
            // The input also feeds a second term, whose gradient (`base`) is already there.
            let b: Tensor<(usize,), f32, Cpu> = dev.tensor((base.clone(), (x.len(),)));
            let loss = (y * w).sum() + (input.leaky_trace() * b).sum();
            let got = loss.backward().get(&input).as_vec();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{isa:?}, codes {codes:?}: x[{i}] = {:e}: {g:e} against {w:e}",
                    x[i]
                );
            }
        }
    }
}

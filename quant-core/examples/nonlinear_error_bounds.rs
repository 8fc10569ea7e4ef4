//! Measures the worst errors of the integer softmax, GELU and layer normalisation, which the
//! constants in `quant_core::int8::nonlinear` were set from (a measurement, not a check: it
//! prints figures and takes minutes):
//!
//! ```text
//! cargo run -p quant-core --release --example nonlinear_error_bounds
//! ```

#[path = "../tests/integration/nonlinear_reference.rs"]
mod nonlinear_reference;

use nonlinear_reference::{gelu, layer_norm, max_scale, next, softmax};
use quant_core::int8::nonlinear::{Approximation, IntGelu, IntLayerNorm, IntSoftmax};
use quant_core::int8::nonlinear::{
    GELU_IBERT_MAX_INPUT_SCALE, GELU_MAX_INPUT_SCALE, SOFTMAX_IBERT_MAX_INPUT_SCALE,
    SOFTMAX_MAX_INPUT_SCALE,
};

/// The worst error of softmax at `scale` beyond the rounding of its output (16-bit codes, half
/// a step taken out): two-value rows `[0, -x]` over `x ∈ [0, 40]` in `steps` (the worst shape
/// for a spread of relative errors), and `rows` random rows of 3, 8, 16 and 64 values spread
/// over `[-12, 0]`.
fn softmax_worst(approximation: Approximation, scale: f32, steps: u64, rows: usize) -> f64 {
    let half = 0.5 / 65535.0;
    let mut worst = 0f64;
    let mut check = |k: &IntSoftmax, row: &[i32]| {
        let mut out = vec![0u16; row.len()];
        k.run(row, &mut out).unwrap();
        for (p, c) in softmax(row, scale).iter().zip(out) {
            worst = worst.max((c as f64 / 65535.0 - p).abs() - half);
        }
    };
    let k = IntSoftmax::new(scale, 2, 16, approximation).unwrap();
    let top = (40.0 / scale as f64).min(u32::MAX as f64);
    for i in 0..=steps {
        let kq = ((top * i as f64 / steps as f64).round() as i64).min(u32::MAX as i64);
        check(&k, &[i32::MAX, (i32::MAX as i64 - kq) as i32]);
    }
    let mut state = 12345u64;
    for n in [3usize, 8, 16, 64] {
        let k = IntSoftmax::new(scale, n, 16, approximation).unwrap();
        for _ in 0..rows {
            let spread = 12.0 * next(&mut state);
            let row: Vec<i32> = (0..n)
                .map(|_| {
                    (-(spread * next(&mut state)) / scale as f64)
                        .round()
                        .max(i32::MIN as f64) as i32
                })
                .collect();
            check(&k, &row);
        }
    }
    worst
}

/// The worst error of GELU at `scale` beyond the rounding of its output, and where: every code
/// of `x ∈ [-12, 12]` (at most `max_codes`, evenly spaced beyond), on a range of exactly those
/// codes (so the output grid is as fine as that range allows).
fn gelu_worst(approximation: Approximation, scale: f32, max_codes: i64) -> (f64, f64) {
    let reach = (12.0 / scale as f64).ceil().min(i32::MAX as f64) as i64;
    let k = IntGelu::new(scale, 0, -reach as i32..=reach as i32, approximation).unwrap();
    let stride = (2 * reach / max_codes).max(1);
    let codes: Vec<i32> = (-reach..=reach)
        .step_by(stride as usize)
        .map(|q| q as i32)
        .collect();
    let mut out = vec![0i32; codes.len()];
    k.run(&codes, &mut out).unwrap();
    let step = k.output_scale() as f64;
    let (mut worst, mut at) = (0f64, 0f64);
    for (q, o) in codes.iter().zip(&out) {
        let x = *q as f64 * scale as f64;
        let e = (*o as f64 * step - gelu(x)).abs() - 0.5 * step;
        if e > worst {
            (worst, at) = (e, x);
        }
    }
    (worst, at)
}

/// Dense sweeps of each kernel; prints the worst error of each approximation beyond the
/// rounding of its output, which the constants in `quant_core::int8::nonlinear` were set from:
/// for I-BERT's, the error at fine scales (`A`) and the largest `(error - A) / scale` over a
/// dense sweep of coarse scales (`B`), since its constants are whole input codes.
fn main() {
    let log_uniform = |lo: f64, hi: f64, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| 2f64.powf(lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32)
            .collect()
    };
    for approximation in Approximation::ALL {
        let max = max_scale(
            approximation,
            SOFTMAX_IBERT_MAX_INPUT_SCALE,
            SOFTMAX_MAX_INPUT_SCALE,
        );
        println!("softmax {approximation}: worst error (16-bit output, half a step taken out):");
        let mut fine = 0f64;
        for scale in log_uniform(
            -40.0,
            (max as f64).log2(),
            2 * (40 + (max as f64).log2() as usize) + 1,
        ) {
            let w = softmax_worst(approximation, scale, 200_000, 20_000);
            if scale <= 2f32.powi(-12) {
                fine = fine.max(w);
            }
            println!("  scale {scale:.3e}: {w:.3e}");
        }
        let (mut slope, mut at) = (0f64, 0f32);
        let dense = log_uniform(-12.0, (max as f64).log2().min(4.0), 1500)
            .into_iter()
            .map(|s| (s, 20_000, 500));
        // Scales just below ln 2 / k, where I-BERT's ⌈ln 2 / s⌉ · s overshoots ln 2 by almost s.
        let aligned = (12..=64u32)
            .chain((7..=12).map(|e| 1 << e))
            .map(|k| {
                (
                    (std::f64::consts::LN_2 / (k as f64 + 1e-3)) as f32,
                    200_000,
                    5_000,
                )
            })
            .filter(|(s, _, _)| *s <= max);
        for (scale, steps, rows) in dense.chain(aligned) {
            let w = softmax_worst(approximation, scale, steps, rows);
            if (w - fine) / scale as f64 > slope {
                (slope, at) = ((w - fine) / scale as f64, scale);
            }
        }
        println!("softmax {approximation}: A = {fine:.3e} (scales up to 2^-12), B = {slope:.3} (at scale {at:.4e})");
    }
    for approximation in Approximation::ALL {
        let max = max_scale(
            approximation,
            GELU_IBERT_MAX_INPUT_SCALE,
            GELU_MAX_INPUT_SCALE,
        );
        println!(
            "gelu {approximation}: worst error (half an output step taken out), x in [-12, 12]:"
        );
        let mut fine = 0f64;
        for scale in log_uniform(
            -40.0,
            (max as f64).log2(),
            2 * (40 + (max as f64).log2() as usize) + 1,
        ) {
            let (w, x) = gelu_worst(approximation, scale, 4_000_000);
            if scale <= 2f32.powi(-12) {
                fine = fine.max(w);
            }
            println!("  scale {scale:.3e}: {w:.3e} at x = {x:.4}");
        }
        let (mut slope, mut at) = (0f64, 0f32);
        for scale in log_uniform(-12.0, (max as f64).log2().min(4.0), 1500) {
            let (w, _) = gelu_worst(approximation, scale, 200_000);
            if (w - fine) / scale as f64 > slope {
                (slope, at) = ((w - fine) / scale as f64, scale);
            }
        }
        println!("gelu {approximation}: A = {fine:.3e} (scales up to 2^-12), B = {slope:.4} (at scale {at:.4e})");
    }
    // Layer norm: random rows, worst error in output steps.
    let mut state = 99u64;
    let mut worst = 0f64;
    for trial in 0..200_000 {
        let n = 1 + (next(&mut state) * 96.0) as usize;
        let span = ((1u64 << (1 + (next(&mut state) * 24.0) as u32)) - 1)
            .min((1u64 << 31) / n as u64 - 1) as i32;
        let scale = 2f32.powf(-20.0 + 30.0 * next(&mut state) as f32);
        let gamma: Vec<f32> = (0..n)
            .map(|_| (8.0 * next(&mut state) - 4.0) as f32)
            .collect();
        let beta: Vec<f32> = (0..n)
            .map(|_| (8.0 * next(&mut state) - 4.0) as f32)
            .collect();
        let eps = [0.0, 1e-5, 1e-12][trial % 3];
        let Ok(k) = IntLayerNorm::new(scale, 0..=span, &gamma, &beta, eps) else {
            continue;
        };
        let width = if trial % 2 == 0 { span as f64 } else { 3.0 };
        let base = (next(&mut state) * (span as f64 - width).max(0.0)) as i32;
        let row: Vec<i32> = (0..n)
            .map(|_| (base + (next(&mut state) * width) as i32).min(span))
            .collect();
        let mut out = vec![0i32; n];
        k.run(&row, &mut out).unwrap();
        for (y, o) in layer_norm(&row, scale, &gamma, &beta, eps).iter().zip(&out) {
            worst = worst
                .max((*o as f64 * k.output_scale() as f64 - y).abs() / k.output_scale() as f64);
        }
    }
    println!("layer norm: worst error {worst:.3} output steps");
}

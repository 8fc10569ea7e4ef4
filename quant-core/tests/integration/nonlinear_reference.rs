//! Exact references in `f64` for the integer softmax, GELU and layer normalisation, shared
//! by `int8_nonlinear.rs` (the bounds checked) and `examples/nonlinear_error_bounds.rs` (the
//! bounds measured).
#![allow(dead_code)] // the tests and the example each use part of it

use quant_core::int8::nonlinear::Approximation;

/// `erfc(y)`: the Maclaurin series of `erf` below 2 (alternating; cancellation leaves about
/// 1e-15 absolute), Laplace's continued fraction from 2 on (60 levels, evaluated from the tail;
/// about 1e-15 relative). A different algorithm from the kernel's table builder.
pub fn erfc(y: f64) -> f64 {
    if y < 0.0 {
        return 2.0 - erfc(-y);
    }
    if y < 2.0 {
        let (mut term, mut sum, mut n) = (y, y, 0.0f64);
        loop {
            n += 1.0;
            term *= -y * y / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-18 {
                break;
            }
        }
        return 1.0 - 2.0 / std::f64::consts::PI.sqrt() * sum;
    }
    // erfc(y) = e^{-y²}/√π · 1/(y + (1/2)/(y + 1/(y + (3/2)/(y + 2/(y + ...)))))
    let mut fraction = y;
    for k in (1..=60).rev() {
        fraction = y + (k as f64 / 2.0) / fraction;
    }
    (-y * y).exp() / std::f64::consts::PI.sqrt() / fraction
}

/// `x · Φ(x)`, `Φ(x) = erfc(-x / √2) / 2`.
pub fn gelu(x: f64) -> f64 {
    x * 0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// Softmax of `(q - max q) · scale` in f64.
pub fn softmax(codes: &[i32], scale: f32) -> Vec<f64> {
    let max = *codes.iter().max().unwrap();
    let e: Vec<f64> = codes
        .iter()
        .map(|q| ((*q as i64 - max as i64) as f64 * scale as f64).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

/// `γ · (x - mean) / √(var + ε) + β` of `x = q · scale` (population variance), in f64. The
/// codes are taken relative to the first one (exact in `i64`), so that rows of large, nearly
/// equal codes do not lose their differences to f64 rounding (the result does not depend on a
/// shift of every value).
pub fn layer_norm(codes: &[i32], scale: f32, gamma: &[f32], beta: &[f32], eps: f32) -> Vec<f64> {
    let n = codes.len() as f64;
    let x: Vec<f64> = codes
        .iter()
        .map(|q| (*q as i64 - codes[0] as i64) as f64 * scale as f64)
        .collect();
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps as f64).sqrt();
    x.iter()
        .zip(gamma.iter().zip(beta))
        .map(|(v, (g, b))| {
            if var + eps as f64 == 0.0 {
                *b as f64
            } else {
                *g as f64 * (v - mean) * inv + *b as f64
            }
        })
        .collect()
}

/// The largest input scale of `approximation`: `ibert` or `fixed`.
pub fn max_scale(approximation: Approximation, ibert: f32, fixed: f32) -> f32 {
    match approximation {
        Approximation::IBert => ibert,
        Approximation::FixedPoint => fixed,
    }
}

/// A uniform number in [0, 1) (splitmix64).
pub fn next(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E3779B97F4A7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

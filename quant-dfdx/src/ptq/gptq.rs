//! GPTQ on one group of a layer's weights, in Gram form.
//!
//! GPTQ (Frantar et al., 2022) rounds the weights one input column at a time, and after each
//! column moves the not-yet-rounded columns of the same rows to absorb its rounding error, as
//! far as the inputs' correlations allow: the optimal update of Optimal Brain Surgeon for the
//! quadratic loss `(w̃ − w*)ᵀ H (w̃ − w*)` of each output row, through the upper Cholesky factor
//! of `H⁻¹`. One pass, no iterations: a layer takes the time of a `K × K` inverse and an
//! `O × K × K` update.
//!
//! The loss here is the same reconstruction loss AdaRound minimises,
//! `E‖W x − W̃ x̃‖²` with float inputs `x` and inputs `x̃` from the already-quantized earlier
//! layers. With `H = E[x̃ x̃ᵀ]` and `C = E[x̃ xᵀ]`, each row's loss is
//! `w̃ᵀ H w̃ − 2 w̃ᵀ C w + const`, which is `(w̃ − w*)ᵀ H (w̃ − w*) + const` around its float
//! optimum `w* = H⁻¹ C w`. Dampening adds `λ·I` to `H` (`λ` a share of its mean diagonal, so
//! that inputs which never vary do not make it singular) and the matching pull `λ·w` toward the
//! float weights: `w* = (H + λI)⁻¹ (C w + λ w)`. When the inputs are the float ones (`x̃ = x`,
//! `C = H`) that is `w` itself, the original GPTQ.

use super::adaround::{Moments, RowGrid};
use super::GptqSettings;

/// The codes GPTQ gives weights `w` (`o × k`, row-major) on `grid`, or `None` when `H` is not
/// positive definite even after dampening (inputs that are all zero): the caller keeps
/// nearest rounding then.
pub(crate) fn gptq(
    moments: &Moments,
    w: &[f32],
    grid: RowGrid<'_>,
    options: &GptqSettings,
) -> Option<Vec<i32>> {
    let k = moments.k;
    let o = w.len() / k.max(1);
    let n = moments.rows.max(1) as f64;
    let h: Vec<f64> = moments.quantized.iter().map(|v| *v as f64 / n).collect();
    let c: Vec<f64> = moments.cross.iter().map(|v| *v as f64 / n).collect();
    let mean_diagonal = (0..k).map(|j| h[j * k + j]).sum::<f64>() / k.max(1) as f64;
    let lambda = options.damping * mean_diagonal;
    if !(lambda > 0.0 && lambda.is_finite()) {
        return None;
    }
    // The columns in the order they are rounded: with `act_order`, the inputs of most energy
    // first, whose errors the rest can still absorb.
    let mut order: Vec<usize> = (0..k).collect();
    if options.act_order {
        order.sort_by(|a, b| h[b * k + b].total_cmp(&h[a * k + a]));
    }
    // H + λI in that order.
    let mut damped = vec![0f64; k * k];
    for (i, &oi) in order.iter().enumerate() {
        for (j, &oj) in order.iter().enumerate() {
            damped[i * k + j] = h[oi * k + oj] + if i == j { lambda } else { 0.0 };
        }
    }
    let lower = cholesky(&damped, k)?;
    let inverse = inverse_from_cholesky(&lower, k);
    // The update reads the upper Cholesky factor of the inverse (Hd⁻¹ = Uᵀ U): row `i` of `U`
    // spreads column `i`'s error over the later columns, `U_ii` scales it.
    let upper = upper_cholesky(&inverse, k)?;

    let mut codes = vec![0i32; o * k];
    let mut row = vec![0f64; k];
    let mut pull = vec![0f64; k];
    for r in 0..o {
        let wr = &w[r * k..(r + 1) * k];
        // C w + λ w, in the rounding order.
        for (i, &oi) in order.iter().enumerate() {
            pull[i] =
                (0..k).map(|j| c[oi * k + j] * wr[j] as f64).sum::<f64>() + lambda * wr[oi] as f64;
        }
        // w* = Hd⁻¹ (C w + λ w).
        for i in 0..k {
            row[i] = (0..k).map(|j| inverse[i * k + j] * pull[j]).sum();
        }
        let (scale, zero) = (grid.scales[r] as f64, grid.zero_points[r] as f64);
        for i in 0..k {
            let code =
                ((row[i] / scale).round_ties_even() + zero).clamp(grid.min as f64, grid.max as f64);
            let error = (row[i] - (code - zero) * scale) / upper[i * k + i];
            for j in i + 1..k {
                row[j] -= error * upper[i * k + j];
            }
            codes[r * k + order[i]] = code as i32;
        }
    }
    Some(codes)
}

/// The lower Cholesky factor `L` of a symmetric `k × k` matrix (`L Lᵀ = a`), or `None` when
/// `a` is not positive definite.
fn cholesky(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            let s = a[i * k + j] - (0..j).map(|p| l[i * k + p] * l[j * k + p]).sum::<f64>();
            if i == j {
                if !(s > 0.0 && s.is_finite()) {
                    return None;
                }
                l[i * k + i] = s.sqrt();
            } else {
                l[i * k + j] = s / l[j * k + j];
            }
        }
    }
    Some(l)
}

/// `a⁻¹` from the lower Cholesky factor of `a`: `(L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹`.
fn inverse_from_cholesky(l: &[f64], k: usize) -> Vec<f64> {
    // M = L⁻¹, lower triangular, by forward substitution column by column.
    let mut m = vec![0f64; k * k];
    for col in 0..k {
        for i in col..k {
            let identity = if i == col { 1.0 } else { 0.0 };
            let s = identity - (col..i).map(|p| l[i * k + p] * m[p * k + col]).sum::<f64>();
            m[i * k + col] = s / l[i * k + i];
        }
    }
    // a⁻¹ = Mᵀ M.
    let mut inverse = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            let v: f64 = (i..k).map(|p| m[p * k + i] * m[p * k + j]).sum();
            inverse[i * k + j] = v;
            inverse[j * k + i] = v;
        }
    }
    inverse
}

/// The upper Cholesky factor `U` of a symmetric `k × k` matrix (`Uᵀ U = a`), or `None` when
/// `a` is not positive definite.
fn upper_cholesky(a: &[f64], k: usize) -> Option<Vec<f64>> {
    // Uᵀ U = a is L Lᵀ = a with L = Uᵀ.
    let l = cholesky(a, k)?;
    let mut u = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            u[j * k + i] = l[i * k + j];
        }
    }
    Some(u)
}

#[cfg(test)]
mod tests {
    use super::super::adaround::{correlated_layer, dequantize, nearest_codes};
    use super::*;
    use dfdx::prelude::*;

    const OPTIONS: GptqSettings = GptqSettings {
        damping: 0.01,
        act_order: true,
    };

    #[test]
    fn correlated_inputs_absorb_the_rounding_errors() {
        for seed in 0..3 {
            let (m, w, scales) = correlated_layer(seed, 24, 4);
            let zero_points = vec![0; scales.len()];
            let grid = RowGrid {
                scales: &scales,
                zero_points: &zero_points,
                min: -4,
                max: 3,
            };
            let e_nearest =
                m.output_error(&w, &dequantize(&nearest_codes(&w, m.k, grid), m.k, grid));
            for act_order in [false, true] {
                let options = GptqSettings {
                    act_order,
                    ..OPTIONS
                };
                let codes = gptq(&m, &w, grid, &options).expect("positive definite");
                assert!(codes.iter().all(|c| (-4..=3).contains(c)), "{codes:?}");
                let e = m.output_error(&w, &dequantize(&codes, m.k, grid));
                assert!(
                    e < 0.4 * e_nearest,
                    "seed {seed}, act order {act_order}: GPTQ {e} vs nearest {e_nearest}"
                );
            }
        }
    }

    /// Inputs that do not correlate leave nothing to absorb an error: with `x̃ = x` and a
    /// diagonal `H`, GPTQ is nearest rounding, in either order.
    #[test]
    fn uncorrelated_float_inputs_give_nearest_rounding() {
        let k = 5;
        let mut m = Moments::new(k);
        // Each row excites one input: `H` is diagonal with distinct entries.
        let mut x = Vec::new();
        for r in 0..40 {
            let mut row = vec![0f32; k];
            row[r % k] = 1.0 + (r % k) as f32;
            x.extend(row);
        }
        m.add(&Cpu::default(), &x, &x);
        let w = [0.3f32, -0.7, 0.55, 0.1, -0.95, 0.8, 0.44, -0.2, -0.6, 0.05];
        let scales = [0.25f32, 0.3];
        let zero_points = [1, -1];
        let grid = RowGrid {
            scales: &scales,
            zero_points: &zero_points,
            min: -4,
            max: 3,
        };
        let expected = nearest_codes(&w, k, grid);
        for act_order in [false, true] {
            let options = GptqSettings {
                act_order,
                ..OPTIONS
            };
            assert_eq!(gptq(&m, &w, grid, &options), Some(expected.clone()));
        }
    }

    #[test]
    fn inputs_that_are_all_zero_leave_the_rounding_to_the_caller() {
        let k = 3;
        let mut m = Moments::new(k);
        m.add(&Cpu::default(), &[0.0; 6], &[0.0; 6]);
        let scales = [0.5f32];
        let grid = RowGrid {
            scales: &scales,
            zero_points: &[0],
            min: -4,
            max: 3,
        };
        assert_eq!(gptq(&m, &[0.2, 0.4, -0.3], grid, &OPTIONS), None);
    }

    #[test]
    fn the_cholesky_inverse_inverts() {
        let k = 4;
        let a = [
            4.0, 1.0, 0.5, 0.2, 1.0, 3.0, 0.3, 0.1, 0.5, 0.3, 2.0, 0.4, 0.2, 0.1, 0.4, 1.5,
        ];
        let l = cholesky(&a, k).expect("positive definite");
        let inverse = inverse_from_cholesky(&l, k);
        for i in 0..k {
            for j in 0..k {
                let v: f64 = (0..k).map(|p| a[i * k + p] * inverse[p * k + j]).sum();
                let identity = if i == j { 1.0 } else { 0.0 };
                assert!((v - identity).abs() < 1e-12, "({i}, {j}): {v}");
            }
        }
        let u = upper_cholesky(&inverse, k).expect("positive definite");
        for i in 0..k {
            for j in 0..k {
                let v: f64 = (0..k).map(|p| u[p * k + i] * u[p * k + j]).sum();
                assert!((v - inverse[i * k + j]).abs() < 1e-12);
                if j < i {
                    assert_eq!(u[i * k + j], 0.0);
                }
            }
        }
        assert!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
    }
}

//! The integer softmax, GELU and layer normalisation of [`crate::int8::nonlinear`] as
//! differentiable dfdx ops, for quantization-aware training that agrees with the integer
//! runtime.
//!
//! The forward pass *is* the integer kernel: the input values (fake-quantized, so on the
//! kernel's input grid) are taken back to their codes, the kernel runs, and the output is
//! `code · output_scale` ([`IntSoftmax::simulate`] and the others). The backward pass is the
//! gradient of the exact float function at the input (softmax, `x · Φ(x)`, layer
//! normalisation): the kernels approximate those functions to far below an output step, so
//! their gradients stand in for the piecewise-constant kernels' (the straight-through
//! estimator's reasoning, applied to the approximation).
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_core::int8::nonlinear::{Approximation, IntSoftmax};
//! use quant_core::dfdx_ops::int_softmax;
//!
//! let dev = Cpu::default();
//! // Scores on a grid of 1/16 (as fake-quantized Q·Kᵀ would give), rows of 4, 8-bit probabilities.
//! let kernel = IntSoftmax::new(0.0625, 4, 8, Approximation::FixedPoint)?;
//! let scores = dev.tensor([[1.0f32, 0.0, 0.0, -0.5], [0.25, 0.25, 0.25, 0.25]]);
//! let probs = int_softmax(scores.leaky_trace(), &kernel)?;
//! assert_eq!(probs.array()[1], [64.0 * kernel.output_scale(); 4]); // 255 / 4 = 63.75 → 64
//! let grads = probs.exp().sum().backward();
//! assert!(grads.get(&scores).array()[0][0] != 0.0);
//! # Ok::<(), quant_core::QuantError>(())
//! ```

use std::ops::RangeInclusive;

use dfdx::prelude::*;

use super::{custom_op, custom_op_quantized, DynQuantization, ParamInput};
use crate::error::{QuantError, Result};
use crate::int8::nonlinear::{codes_into, normal_cdf};
use crate::int8::nonlinear::{IntGelu, IntLayerNorm, IntSoftmax};
#[cfg(target_arch = "x86_64")]
use crate::int8::widths::Width;
use crate::int8::Isa;
use crate::kernels::{exp_nonpositive_in_place, round_ties_even_f64, rows_per_job, VectorPath};
use crate::scratch::Scratch;
use rayon::prelude::*;

/// An error unless the last axis of `shape` is `row_len` long.
fn check_last_axis<S: Shape>(what: &str, shape: &S, row_len: usize) -> Result<()> {
    let dims = shape.concrete();
    let last = dims.as_ref().last().copied().unwrap_or(1);
    if last != row_len {
        return Err(QuantError::LengthMismatch {
            what: format!(
                "{what}: the last axis of the input (the rows the kernel was prepared for)"
            ),
            expected: row_len,
            actual: last,
        });
    }
    Ok(())
}

/// Softmax over the last axis through `kernel` (prepared for rows of that length at the scale
/// of `x`'s grid); gradient of the exact softmax.
///
/// # Errors
/// The last axis is not [`IntSoftmax::row_len`] long; a value of `x` is not finite.
pub fn int_softmax<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    kernel: &IntSoftmax,
) -> Result<Tensor<S, f32, Cpu, T>> {
    check_last_axis("int_softmax", x.shape(), kernel.row_len())?;
    let n = kernel.row_len();
    custom_op(
        x,
        Vec::new(),
        Box::new(|x, _, y| kernel.simulate(x, y)),
        Box::new(move |x, _, dy, dx, _| softmax_backward(n, x, dy, dx)),
    )
}

/// The gradient of the exact softmax over rows of `n` (in `f64`) for `dy`, added to `dx`:
/// `p · (dy - Σ p · dy)` with `p = exp(x - max) / Σ exp(x - max)`. Each row's maximum and
/// sums are chains of dependent operations in the row's order; `ROWS_SIDE_BY_SIDE` rows'
/// chains run side by side, which gives the same bits as one row at a time.
///
/// Jobs of whole rows run in parallel (rows are independent: the same bits whatever the split).
pub fn softmax_backward(n: usize, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    const R: usize = ROWS_SIDE_BY_SIDE;
    let n = n.max(1);
    let job = rows_per_job(x.len(), n, R) * n;
    let path = VectorPath::widest();
    let jobs = x.par_chunks(job).zip(dy.par_chunks(job));
    jobs.zip(dx.par_chunks_mut(job))
        .for_each(|((x, dy), dx)| softmax_job(n, x, dy, dx, path));
}

/// One parallel job of [`softmax_backward`]. (Compiled for the baseline: at AVX-512's width
/// it took as long, its time being the rows' chains of dependent steps.)
fn softmax_job(n: usize, x: &[f32], dy: &[f32], dx: &mut [f32], path: VectorPath) {
    let mut job = SoftmaxRows {
        n,
        probs: vec![0.0f64; ROWS_SIDE_BY_SIDE * n],
        path,
    };
    by_row_groups(n, x, dy, dx, &mut job);
}

/// [`softmax_backward`]'s rows of one job.
struct SoftmaxRows {
    n: usize,
    probs: Vec<f64>,
    path: VectorPath,
}

impl RowGroups for SoftmaxRows {
    #[inline(always)]
    fn rows<const R: usize>(&mut self, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        softmax_rows_backward::<R>(self.n, x, dy, dx, &mut self.probs, self.path);
    }
}

/// `R` consecutive rows of [`softmax_backward`] (`x`, `dy`, `dx` hold exactly `R` rows).
#[inline(always)]
fn softmax_rows_backward<const R: usize>(
    n: usize,
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    probs: &mut [f64],
    path: VectorPath,
) {
    let probs = &mut probs[..R * n];
    let mut max = [f64::NEG_INFINITY; R];
    for i in 0..n {
        for (r, m) in max.iter_mut().enumerate() {
            *m = m.max(x[r * n + i] as f64);
        }
    }
    for (r, (p, x)) in probs.chunks_exact_mut(n).zip(x.chunks_exact(n)).enumerate() {
        for (p, x) in p.iter_mut().zip(x) {
            *p = *x as f64 - max[r];
        }
    }
    exp_nonpositive_in_place(path, probs);
    // Sums start at -0.0, as `Iterator::sum` does.
    let mut sum = [-0.0f64; R];
    for i in 0..n {
        for (r, s) in sum.iter_mut().enumerate() {
            *s += probs[r * n + i];
        }
    }
    for (r, p) in probs.chunks_exact_mut(n).enumerate() {
        for p in p {
            *p /= sum[r];
        }
    }
    let mut dot = [-0.0f64; R];
    for i in 0..n {
        for (r, s) in dot.iter_mut().enumerate() {
            *s += probs[r * n + i] * dy[r * n + i] as f64;
        }
    }
    for (r, ((g, p), d)) in dx
        .chunks_exact_mut(n)
        .zip(probs.chunks_exact(n))
        .zip(dy.chunks_exact(n))
        .enumerate()
    {
        for ((g, p), d) in g.iter_mut().zip(p).zip(d) {
            *g += (p * (*d as f64 - dot[r])) as f32;
        }
    }
}

/// GELU (`x · Φ(x)`) through `kernel`, elementwise; gradient `Φ(x) + x · φ(x)` of the exact
/// GELU where the input's code lies in the kernel's input range, 0 where the kernel clamps it.
///
/// # Errors
/// A value of `x` is not finite.
pub fn int_gelu<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    kernel: &IntGelu,
) -> Result<Tensor<S, f32, Cpu, T>> {
    gelu_op(x, None, kernel)
}

/// [`int_gelu`] of `x` as `quantization` quantizes it (onto the kernel's input grid), the
/// quantizer run inside the op: the same bits as [`crate::dfdx_ops::fake_quantize_dyn`] and then
/// [`int_gelu`], without a dfdx tensor and gradient for the quantized values
/// ([`crate::dfdx_ops::elementwise_op_quantized`]).
///
/// # Errors
/// The quantizer's forward pass; a quantized value that is not finite.
pub fn int_gelu_quantized<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    quantization: DynQuantization,
    kernel: &IntGelu,
) -> Result<Tensor<S, f32, Cpu, T>> {
    gelu_op(x, Some(quantization), kernel)
}

/// [`int_gelu`], its input quantized inside the op when `quantization` is given.
fn gelu_op<S: Shape, T: Tape<f32, Cpu>>(
    x: Tensor<S, f32, Cpu, T>,
    quantization: Option<DynQuantization>,
    kernel: &IntGelu,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let (scale, zero_point, isa) = (
        kernel.input_scale(),
        kernel.input_zero_point(),
        kernel.isa(),
    );
    let (lo, hi) = (*kernel.input_codes().start(), *kernel.input_codes().end());
    custom_op_quantized(
        x,
        quantization,
        Vec::new(),
        Box::new(|x, _, y| kernel.simulate(x, y)),
        Box::new(move |x, _, dy, dx, _| {
            // Jobs of values in parallel, each with its own memo: the same slopes.
            let job = rows_per_job(x.len(), 1, 1);
            let jobs = x.par_chunks(job).zip(dy.par_chunks(job));
            jobs.zip(dx.par_chunks_mut(job)).for_each(|((x, dy), dx)| {
                gelu_backward_job(isa, (scale, zero_point), lo..=hi, x, dy, dx)
            });
        }),
    )
}

/// [`int_gelu`]'s backward pass over some values: `dx += dy · slope` where the input's code
/// (on the grid of `scale` and `zero_point`) lies in `input_codes`, the kernel's input range.
fn gelu_backward_job(
    isa: Isa,
    grid: (f32, i32),
    input_codes: RangeInclusive<i32>,
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    // Each value's code, as the forward pass found it (which also checked that every value is
    // finite), a vectorised pass at the kernel's width; pooled, as it is written whole.
    let mut codes = Scratch::with_len(n);
    let codes = codes.as_i32_mut();
    codes_into(isa, x, grid.0, grid.1, codes);
    let mut memo = SlopeMemo::new(input_codes);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if !memo.slopes.is_empty() && isa.width() != Width::Portable {
        // SAFETY: `Isa::width` is `Avx2` or `Avx512` only where the CPU runs AVX2; the four
        // slices are `n` long (cut above).
        done = unsafe { gelu_backward_avx2(x, codes, dy, dx, &mut memo, grid) };
    }
    for i in done..n {
        gelu_backward_one(x[i], codes[i], dy[i], &mut dx[i], &mut memo, grid);
    }
}

/// The slopes of [`gelu_backward_job`] by code, each from the first value with that code and
/// reused for the values with the same bits (any other value gets its own): the inputs are a
/// quantizer's outputs, a few hundred distinct values, each the same `f32` wherever it occurs;
/// the same slopes as computing each, a fraction of the `erf` series.
struct SlopeMemo {
    /// The kernel's input range.
    codes: RangeInclusive<i32>,
    /// By code from the range's start: the bits of the value whose slope is kept (`u32::MAX`,
    /// the bits of no finite value, where none is yet). Empty for a range wider than
    /// [`MEMO_CODES`].
    bits: Vec<u32>,
    /// By code from the range's start: the slope of the value `bits` holds.
    slopes: Vec<f64>,
}

impl SlopeMemo {
    fn new(codes: RangeInclusive<i32>) -> Self {
        let span = *codes.end() as i64 - *codes.start() as i64 + 1;
        let len = if span <= MEMO_CODES { span as usize } else { 0 };
        SlopeMemo {
            codes,
            bits: vec![u32::MAX; len],
            slopes: vec![0.0; len],
        }
    }
}

/// One value of [`gelu_backward_job`], `code` its code as `codes_into` gives it.
#[inline(always)]
fn gelu_backward_one(
    x: f32,
    code: i32,
    dy: f32,
    dx: &mut f32,
    memo: &mut SlopeMemo,
    (scale, zero_point): (f32, i32),
) {
    let (lo, hi) = (*memo.codes.start(), *memo.codes.end());
    let in_range = if code == i32::MIN || code == i32::MAX {
        // Saturated: the exact code decides (a range may end at an i32 bound).
        let exact = round_ties_even_f64(x as f64 / scale as f64) + zero_point as f64;
        (lo as f64..=hi as f64).contains(&exact)
    } else {
        (lo..=hi).contains(&code)
    };
    if !in_range {
        return;
    }
    let slot = (code as i64 - lo as i64) as usize;
    let slope = if slot < memo.slopes.len() {
        if memo.bits[slot] != x.to_bits() {
            memo.bits[slot] = x.to_bits();
            memo.slopes[slot] = gelu_slope(x as f64);
        }
        memo.slopes[slot]
    } else {
        gelu_slope(x as f64)
    };
    *dx += (dy as f64 * slope) as f32;
}

/// [`gelu_backward_job`] eight values at a time while the memo holds every in-range value's
/// slope (gathered by code, checked by bits); a group with a value it lacks, or with a
/// saturated code, goes through [`gelu_backward_one`], which fills the memo. The same
/// operations on each value as that function (an exact `f32` → `f64` widening, one `f64`
/// product, one rounding to `f32`, one `f32` sum; out-of-range values left as they are, not
/// added zero, which would turn `-0.0` into `+0.0`), so the same bits. Returns how many values
/// from the start it did (whole groups of eight).
///
/// # Safety
/// The CPU runs AVX2; `x`, `codes`, `dy` and `dx` are equally long; `memo` covers its range
/// (not empty).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gelu_backward_avx2(
    x: &[f32],
    codes: &[i32],
    dy: &[f32],
    dx: &mut [f32],
    memo: &mut SlopeMemo,
    grid: (f32, i32),
) -> usize {
    use std::arch::x86_64::*;
    let n = x.len();
    let (lo, hi) = (*memo.codes.start(), *memo.codes.end());
    let (lo_v, hi_v) = (_mm256_set1_epi32(lo), _mm256_set1_epi32(hi));
    let (int_min, int_max) = (_mm256_set1_epi32(i32::MIN), _mm256_set1_epi32(i32::MAX));
    let mut i = 0;
    while i + 8 <= n {
        // Every access below reads or writes the eight values from `i`, and `i + 8 <= n`,
        // the slices' common length; the gathers read only the lanes of `inside`, whose codes
        // lie in `lo..=hi`, so `code - lo` is below the memo's length (the range's width).
        // SAFETY: as just said.
        let (c, inside, ready) = unsafe {
            let c = _mm256_loadu_si256(codes.as_ptr().add(i).cast());
            let bits = _mm256_loadu_si256(x.as_ptr().add(i).cast());
            let saturated = _mm256_or_si256(
                _mm256_cmpeq_epi32(c, int_min),
                _mm256_cmpeq_epi32(c, int_max),
            );
            let outside = _mm256_or_si256(_mm256_cmpgt_epi32(lo_v, c), _mm256_cmpgt_epi32(c, hi_v));
            let inside = _mm256_andnot_si256(outside, _mm256_set1_epi32(-1));
            let kept = _mm256_mask_i32gather_epi32::<4>(
                _mm256_set1_epi32(-1),
                memo.bits.as_ptr().cast(),
                _mm256_sub_epi32(c, lo_v),
                inside,
            );
            let missing = _mm256_andnot_si256(_mm256_cmpeq_epi32(kept, bits), inside);
            let ready =
                _mm256_testz_si256(_mm256_or_si256(saturated, missing), _mm256_set1_epi32(-1)) == 1;
            (c, inside, ready)
        };
        if !ready {
            for j in i..i + 8 {
                gelu_backward_one(x[j], codes[j], dy[j], &mut dx[j], memo, grid);
            }
            i += 8;
            continue;
        }
        // SAFETY: as above.
        unsafe {
            let slot = _mm256_sub_epi32(c, lo_v);
            let halves = [
                _mm256_castsi256_si128(slot),
                _mm256_extracti128_si256::<1>(slot),
            ];
            let masks = [
                _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(inside))),
                _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(inside))),
            ];
            let g = _mm256_loadu_ps(dy.as_ptr().add(i));
            let g = [_mm256_castps256_ps128(g), _mm256_extractf128_ps::<1>(g)];
            let added: [__m128; 2] = std::array::from_fn(|h| {
                let slope = _mm256_mask_i32gather_pd::<8>(
                    _mm256_setzero_pd(),
                    memo.slopes.as_ptr(),
                    halves[h],
                    masks[h],
                );
                _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(g[h]), slope))
            });
            let before = _mm256_loadu_ps(dx.as_ptr().add(i));
            let sum = _mm256_add_ps(before, _mm256_set_m128(added[1], added[0]));
            let after = _mm256_blendv_ps(before, sum, _mm256_castsi256_ps(inside));
            _mm256_storeu_ps(dx.as_mut_ptr().add(i), after);
        }
        i += 8;
    }
    i
}

/// Code ranges up to this wide get [`int_gelu`]'s backward memo of slopes.
const MEMO_CODES: i64 = 4096;

/// `Φ(x) + x · φ(x)`: the slope of the exact GELU.
fn gelu_slope(x: f64) -> f64 {
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    normal_cdf(x) + x * pdf
}

/// The grid a kernel's input values lie on (a per-tensor quantizer's): the scale and zero
/// point of the codes, and the range they lie in ([`int_layer_norm`], and what a layer needs to
/// prepare an [`IntGelu`] or [`IntSoftmax`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CodeGrid {
    /// The scale of the input codes.
    pub scale: f32,
    /// Their zero point.
    pub zero_point: i32,
    /// The codes the kernel accepts (others are clamped), zero point included.
    pub codes: RangeInclusive<i32>,
}

/// Layer normalisation over the last axis with the affine `gamma`, `beta` (one value per
/// feature) through an [`IntLayerNorm`] prepared from their current values (so they can train);
/// gradients of the exact layer normalisation for `x`, and for `gamma`, `beta` when
/// `train_affine`.
///
/// # Errors
/// `gamma`, `beta` or the grid rejected by [`IntLayerNorm::new`] (the error names which); the
/// last axis not as long as `gamma`; a value of `x` that is not finite.
pub fn int_layer_norm<S: Shape, T: Tape<f32, Cpu>, P: Shape>(
    x: Tensor<S, f32, Cpu, T>,
    gamma: &Tensor<P, f32, Cpu>,
    beta: &Tensor<P, f32, Cpu>,
    epsilon: f32,
    input: &CodeGrid,
    train_affine: bool,
) -> Result<Tensor<S, f32, Cpu, T>> {
    layer_norm_op(x, None, gamma, beta, epsilon, input, train_affine)
}

/// [`int_layer_norm`] of `x` as `quantization` quantizes it (onto `input`), the quantizer run
/// inside the op: the same bits as [`crate::dfdx_ops::fake_quantize_dyn`] and then
/// [`int_layer_norm`], without a dfdx tensor and gradient for the quantized values
/// ([`crate::dfdx_ops::elementwise_op_quantized`]).
///
/// # Errors
/// As [`int_layer_norm`]; the quantizer's forward pass.
pub fn int_layer_norm_quantized<S: Shape, T: Tape<f32, Cpu>, P: Shape>(
    x: Tensor<S, f32, Cpu, T>,
    quantization: DynQuantization,
    gamma: &Tensor<P, f32, Cpu>,
    beta: &Tensor<P, f32, Cpu>,
    epsilon: f32,
    input: &CodeGrid,
    train_affine: bool,
) -> Result<Tensor<S, f32, Cpu, T>> {
    layer_norm_op(
        x,
        Some(quantization),
        gamma,
        beta,
        epsilon,
        input,
        train_affine,
    )
}

/// [`int_layer_norm`], its input quantized inside the op when `quantization` is given.
fn layer_norm_op<S: Shape, T: Tape<f32, Cpu>, P: Shape>(
    x: Tensor<S, f32, Cpu, T>,
    quantization: Option<DynQuantization>,
    gamma: &Tensor<P, f32, Cpu>,
    beta: &Tensor<P, f32, Cpu>,
    epsilon: f32,
    input: &CodeGrid,
    train_affine: bool,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let params = vec![
        ParamInput::new(gamma, train_affine),
        ParamInput::new(beta, train_affine),
    ];
    let kernel = IntLayerNorm::new(
        input.scale,
        input.codes.clone(),
        params[0].data(),
        params[1].data(),
        epsilon,
    )?;
    let n = kernel.row_len();
    check_last_axis("int_layer_norm", x.shape(), n)?;
    let zero_point = input.zero_point;
    custom_op_quantized(
        x,
        quantization,
        params,
        Box::new(move |x, _, y| kernel.simulate(zero_point, x, y)),
        Box::new(move |x, params, dy, dx, dparams| {
            if let [dgamma, dbeta] = dparams {
                layer_norm_backward(n, epsilon, x, params[0], dy, dx, dgamma, dbeta);
            }
        }),
    )
}

/// Rows whose chains [`layer_norm_backward`] and [`softmax_backward`] take side by side.
const ROWS_SIDE_BY_SIDE: usize = 4;

/// The gradients of the exact layer normalisation (rows of `n`, `ε`, affine `gamma`) for
/// `dy`, added to `dx`, `dgamma` and `dbeta`. Each row's four sums (mean, variance, `mean(g)`,
/// `mean(g · x̂)`) are chains of dependent `f64` additions, in the row's order; four rows'
/// chains run side by side (a third of the QAT ViT step's excess over the float step was
/// their latency), and the rows' contributions to `dgamma` and `dbeta` are added in row order,
/// so the results are those of one row at a time, bit for bit.
///
/// Jobs of whole rows run in parallel. Each writes its rows' `dx` and their terms of `dgamma`
/// (one per value); the terms are then added one row after another, so the split changes no
/// bits.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward(
    n: usize,
    epsilon: f32,
    x: &[f32],
    gamma: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    const R: usize = ROWS_SIDE_BY_SIDE;
    let n = n.max(1);
    let rows = x.len() / n;
    let job_rows = rows_per_job(x.len(), n, R);
    let job = job_rows * n;
    // What each row adds to `dgamma`, kept until the rows are added in order: each value's
    // term, and whether the row is constant without ε (it adds none).
    let (mut dgamma_terms, mut constant) = (vec![0.0f32; rows * n], vec![false; rows]);
    let jobs = x.par_chunks(job).zip(dy.par_chunks(job));
    let jobs = jobs.zip(dx.par_chunks_mut(job));
    let term_jobs = dgamma_terms.par_chunks_mut(job);
    let term_jobs = term_jobs.zip(constant.par_chunks_mut(job_rows));
    let isa = Isa::detected();
    jobs.zip(term_jobs)
        .for_each(|(((x, dy), dx), (dgamma_terms, constant))| {
            let terms = RowTermsMut {
                dgamma: dgamma_terms,
                constant,
            };
            rows_job_by_width(isa, n, epsilon, x, gamma, dy, dx, terms);
        });
    // The rows' gradients of β and terms of γ's, one row after another.
    let rows = dy.chunks_exact(n).zip(dgamma_terms.chunks_exact(n));
    for ((dy, row_terms), constant) in rows.zip(&constant) {
        for (db, d) in dbeta.iter_mut().zip(dy) {
            *db += *d;
        }
        if !constant {
            for (dg, t) in dgamma.iter_mut().zip(row_terms) {
                *dg += *t;
            }
        }
    }
}

crate::int8::widths::compiled_for_each_width! {
    /// [`rows_job`] at `isa`'s width: a closure of rayon's is compiled for the baseline's two
    /// `f64` lanes (0.85x the time at AVX-512's on the digits ViT's LayerNorms). The same
    /// operations in the same order in every width (the compiler neither reorders nor fuses
    /// floating-point operations), so the same bits.
    #[allow(clippy::too_many_arguments)]
    fn rows_job_by_width<>(
        n: usize,
        epsilon: f32,
        x: &[f32],
        gamma: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        terms: RowTermsMut<'_>,
    ) => rows_job;
}

/// One parallel job of [`layer_norm_backward`]: its whole rows, [`ROWS_SIDE_BY_SIDE`] at a
/// time, then one by one.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rows_job(
    n: usize,
    epsilon: f32,
    x: &[f32],
    gamma: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    terms: RowTermsMut<'_>,
) {
    let mut job = LayerNormRows {
        n,
        epsilon,
        gamma,
        terms,
        scratch: RowScratch::new(n),
        row: 0,
    };
    by_row_groups(n, x, dy, dx, &mut job);
}

/// [`layer_norm_backward`]'s rows of one job, and the row it has reached.
struct LayerNormRows<'a> {
    n: usize,
    epsilon: f32,
    gamma: &'a [f32],
    terms: RowTermsMut<'a>,
    scratch: RowScratch,
    row: usize,
}

impl RowGroups for LayerNormRows<'_> {
    #[inline(always)]
    fn rows<const R: usize>(&mut self, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (n, row) = (self.n, self.row);
        let mut terms = RowTermsMut {
            dgamma: &mut self.terms.dgamma[row * n..(row + R) * n],
            constant: &mut self.terms.constant[row..row + R],
        };
        let (epsilon, gamma) = (self.epsilon, self.gamma);
        rows_backward::<R>(n, epsilon, x, gamma, dy, dx, &mut terms, &mut self.scratch);
        self.row += R;
    }
}

/// What some consecutive rows of [`layer_norm_backward`] add to `dgamma`: each value's term,
/// and whether the row is constant without `ε` (it adds none).
struct RowTermsMut<'a> {
    dgamma: &'a mut [f32],
    constant: &'a mut [bool],
}

/// What [`by_row_groups`] runs on each run of rows: a method, not a closure, so that it is
/// compiled with the target features of the function it is inlined into (a closure is
/// compiled for the baseline).
trait RowGroups {
    /// `R` consecutive rows (`x`, `dy`, `dx` hold exactly `R` rows).
    fn rows<const R: usize>(&mut self, x: &[f32], dy: &[f32], dx: &mut [f32]);
}

/// Runs `f` on consecutive runs of whole rows of `n` values, in order: [`ROWS_SIDE_BY_SIDE`]
/// rows at a time, then the rows left over one by one.
#[inline(always)]
fn by_row_groups(n: usize, x: &[f32], dy: &[f32], dx: &mut [f32], f: &mut impl RowGroups) {
    const R: usize = ROWS_SIDE_BY_SIDE;
    let full = x.len() / n / R * R * n;
    let groups = x[..full]
        .chunks_exact(R * n)
        .zip(dy[..full].chunks_exact(R * n))
        .zip(dx[..full].chunks_exact_mut(R * n));
    for ((x, dy), dx) in groups {
        f.rows::<R>(x, dy, dx);
    }
    let rest = x[full..]
        .chunks_exact(n)
        .zip(dy[full..].chunks_exact(n))
        .zip(dx[full..].chunks_exact_mut(n));
    for ((x, dy), dx) in rest {
        f.rows::<1>(x, dy, dx);
    }
}

/// Per-value buffers of [`layer_norm_backward`], for [`ROWS_SIDE_BY_SIDE`] rows.
struct RowScratch {
    /// `x` relative to its row's first value.
    centred: Vec<f64>,
    /// `x̂`.
    norm: Vec<f64>,
    /// `dy · γ`.
    g: Vec<f64>,
}

impl RowScratch {
    fn new(n: usize) -> RowScratch {
        let len = ROWS_SIDE_BY_SIDE * n;
        RowScratch {
            centred: vec![0.0; len],
            norm: vec![0.0; len],
            g: vec![0.0; len],
        }
    }
}

/// `R` consecutive rows of [`layer_norm_backward`] (`x`, `dy`, `dx` hold exactly `R` rows).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rows_backward<const R: usize>(
    n: usize,
    epsilon: f32,
    x: &[f32],
    gamma: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    terms: &mut RowTermsMut<'_>,
    scratch: &mut RowScratch,
) {
    let len = R * n;
    let (centred, norm, g) = (
        &mut scratch.centred[..len],
        &mut scratch.norm[..len],
        &mut scratch.g[..len],
    );
    // Relative to the first value, so rows of large, nearly equal values keep their
    // differences.
    for (c, x) in centred.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
        for (c, v) in c.iter_mut().zip(x) {
            *c = *v as f64 - x[0] as f64;
        }
    }
    // Each sum starts at -0.0, as `Iterator::sum` does, and adds in the row's order.
    let mut mean = [-0.0f64; R];
    for i in 0..n {
        for (r, m) in mean.iter_mut().enumerate() {
            *m += centred[r * n + i];
        }
    }
    let mean = mean.map(|m| m / n as f64);
    let mut var = [-0.0f64; R];
    for i in 0..n {
        for (r, v) in var.iter_mut().enumerate() {
            let d = centred[r * n + i] - mean[r];
            *v += d * d;
        }
    }
    let denominator = var.map(|v| v / n as f64 + epsilon as f64);
    let inv = denominator.map(|d| 1.0 / d.sqrt());
    for (r, (h, c)) in norm
        .chunks_exact_mut(n)
        .zip(centred.chunks_exact(n))
        .enumerate()
    {
        for (h, c) in h.iter_mut().zip(c) {
            *h = (c - mean[r]) * inv[r];
        }
    }
    for (g, dy) in g.chunks_exact_mut(n).zip(dy.chunks_exact(n)) {
        for ((g, d), gamma) in g.iter_mut().zip(dy).zip(gamma) {
            *g = *d as f64 * *gamma as f64;
        }
    }
    // g = dy · γ; dx = (g - mean(g) - x̂ · mean(g · x̂)) / σ.
    let (mut mean_g, mut mean_gn) = ([-0.0f64; R], [-0.0f64; R]);
    for i in 0..n {
        for r in 0..R {
            mean_g[r] += g[r * n + i];
            mean_gn[r] += g[r * n + i] * norm[r * n + i];
        }
    }
    let (mean_g, mean_gn) = (mean_g.map(|s| s / n as f64), mean_gn.map(|s| s / n as f64));
    for r in 0..R {
        let row = r * n..(r + 1) * n;
        terms.constant[r] = denominator[r] <= 0.0;
        if terms.constant[r] {
            // A constant row without ε gives β whatever x and γ are.
            continue;
        }
        for (((o, g), h), (t, d)) in dx[row.clone()]
            .iter_mut()
            .zip(&g[row.clone()])
            .zip(&norm[row.clone()])
            .zip(terms.dgamma[row.clone()].iter_mut().zip(&dy[row]))
        {
            *o += ((g - mean_g[r] - h * mean_gn[r]) * inv[r]) as f32;
            *t = (*d as f64 * h) as f32;
        }
    }
}

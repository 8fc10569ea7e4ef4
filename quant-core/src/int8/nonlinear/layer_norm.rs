//! Integer layer normalisation over rows: exact integer mean and variance, the exact `⌊√·⌋` of
//! the variance scaled up to 62 bits first, a fixed-point reciprocal, and the
//! affine `γ`, `β` folded into integer multipliers and offsets.

use std::ops::RangeInclusive;

use super::InputCode;
use super::{check_code_range, check_rows, check_scale, isqrt, round_shift, simulate_rows};
use crate::error::{QuantError, Result};
use crate::int8::widths::{compiled_for_each_width, Width};
use crate::int8::Isa;

/// The error of [`IntLayerNorm`] in output steps ([`IntLayerNorm::output_scale`]), for every
/// accepted input: measured worst case `1.53` steps (200 000 random rows, scales `2^-20` to
/// `2^10`, `quant-core/examples/nonlinear_error_bounds.rs`); set with a margin.
/// An output step is at most `2 · (max|γ| · √(n - 1) + max|β|) / 2^30`, so in real units this is
/// about `10⁻⁸` of the output's range: the requantization that follows dominates.
pub const LAYER_NORM_MAX_ERROR: f64 = 3.0;

/// Layer normalisation of each row of `n` codes with an affine `γ`, `β` (length `n`), into
/// `i32` codes: `yᵢ = γᵢ · (xᵢ - mean) / √(var + ε) + βᵢ`, with the population variance (as
/// dfdx's `LayerNorm1D` and PyTorch).
///
/// Codes are clamped into the declared input range `[lo, hi]`; with `uᵢ = qᵢ - lo` (the zero
/// point cancels), everything up to the square root is exact:
///
/// 1. `S = Σ uᵢ`, `W = n · Σ uᵢ² - S² = n² · var` (in codes²), `cᵢ = n · uᵢ - S = n · (qᵢ - mean)`,
///    so `(xᵢ - mean) / √(var + ε) = cᵢ / √T` with `T = W + n² · ε / scale²`.
/// 2. `T` in fixed point (`2^32 · T`, `u128`), shifted by an even number of bits into
///    `[2^60, 2^62)`, so that [`isqrt`] gives `√T · 2^j` to 30 significant bits however small or
///    large the variance is (this is where I-BERT loses precision on rows of nearly equal
///    values); then the reciprocal `F = ⌊2^61 / ⌊√T · 2^j⌋⌋`.
/// 3. `normᵢ ≈ cᵢ · F / 2^(31 + b - j)` in steps of `2^(b - 30)`, `b = ⌈log2 √(n - 1)⌉`
///    (`|norm| ≤ √(n - 1)`, so it fits 30 bits), and `outᵢ = round(normᵢ · Gᵢ / 2^31) + Bᵢ`
///    with `Gᵢ = round(γᵢ / s_out · 2^(b + 1))`, `Bᵢ = round(βᵢ / s_out)`.
///
/// The output scale `s_out` is the power of two that puts `max|γ| · √(n - 1) + max|β|` (the
/// largest possible `|y|`) just below `2^30` codes, zero point 0. A row of equal values (zero
/// variance) gives `β`, as in floating point; a row of one value always does.
///
/// Accepted: `n · (hi - lo) < 2^31` (so every product above fits `i64`) and
/// `n² · ε / scale² < 2^62`. The bound on the error is [`IntLayerNorm::max_error`].
#[derive(Debug, Clone)]
pub struct IntLayerNorm {
    input_scale: f32,
    epsilon: f32,
    codes: RangeInclusive<i32>,
    /// `b = ⌈log2 √(n - 1)⌉`.
    norm_bits: u32,
    /// `round(n² · ε / scale² · 2^32)`.
    epsilon_fixed: u128,
    /// Whether a row's `Σu²` fits `i32` (`n · (hi - lo)² < 2^31`; 4- and 8-bit codes in rows
    /// of up to 33 025 values).
    narrow_squares: bool,
    gamma: Vec<i64>,
    beta: Vec<i64>,
    /// The AVX2 output loop's constants, per value: `G >> 16` and `G mod 2^16` (each fits
    /// `i32`, as `|G| < 2^32`), and `B` as `i32` plus `2^31` (see `x86::row_out`).
    gamma_high: Vec<i32>,
    gamma_low: Vec<i32>,
    beta_offset: Vec<i32>,
    output_scale: f32,
    isa: Isa,
}

impl IntLayerNorm {
    /// Prepares layer normalisation of rows of `gamma.len()` codes in `codes` (clamped into
    /// it) at `input_scale`, with the affine `gamma`, `beta` and `epsilon` of the float layer.
    ///
    /// # Errors
    /// `gamma` empty or not as long as `beta`; a `γ`, `β` or `ε` that is not finite (or a
    /// negative `ε`); a scale that is not finite and positive; an empty code range, or one
    /// too wide for the row (`n · (hi - lo) ≥ 2^31`); `n² · ε / scale² ≥ 2^62`.
    pub fn new(
        input_scale: f32,
        codes: RangeInclusive<i32>,
        gamma: &[f32],
        beta: &[f32],
        epsilon: f32,
    ) -> Result<IntLayerNorm> {
        let n = gamma.len();
        if n == 0 {
            return Err(QuantError::InvalidValue {
                what: "layer norm gamma".into(),
                value: "[]".into(),
                expected: "one value per feature of the row (at least one)".into(),
            });
        }
        super::super::check_len("layer norm beta", n, beta.len())?;
        for (what, values) in [("gamma", gamma), ("beta", beta)] {
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(QuantError::NonFinite {
                    what: format!("layer norm {what}[{i}]"),
                    value: values[i] as f64,
                });
            }
        }
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(QuantError::InvalidValue {
                what: "layer norm epsilon".into(),
                value: epsilon.to_string(),
                expected: "a finite value >= 0".into(),
            });
        }
        check_scale(
            "layer norm input scale",
            input_scale,
            f32::MIN_POSITIVE,
            f32::MAX,
            "",
        )?;
        check_code_range("layer norm", &codes)?;
        let span = (*codes.end() as i64 - *codes.start() as i64) as u64;
        if (n as u128) * (span.max(1) as u128) >= 1 << 31 {
            return Err(QuantError::InvalidValue {
                what: "layer norm input codes".into(),
                value: format!("{codes:?} for rows of {n}"),
                expected: format!(
                    "a range of fewer than 2^31 / {n} = {} codes",
                    (1u64 << 31) / n as u64
                ),
            });
        }
        let n2 = (n as f64) * (n as f64);
        let epsilon_codes = n2 * epsilon as f64 / (input_scale as f64 * input_scale as f64);
        if epsilon_codes >= 2f64.powi(62) {
            return Err(QuantError::InvalidValue {
                what: "layer norm epsilon".into(),
                value: format!("{epsilon} at input scale {input_scale} for rows of {n}"),
                expected: "n² · epsilon / scale² < 2^62 (a finer input scale makes epsilon \
                           outweigh every variance)"
                    .into(),
            });
        }
        let norm_bits = (0..).find(|b| 1u64 << (2 * b) >= n as u64 - 1).unwrap_or(0);
        let largest = |v: &[f32]| v.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
        let bound = largest(gamma) * ((n - 1) as f64).sqrt() + largest(beta);
        let output_scale = output_scale_for(bound);
        let s = output_scale as f64;
        // A row of one value normalises to 0 whatever γ is.
        let gain = if n > 1 {
            2f64.powi(norm_bits as i32 + 1)
        } else {
            0.0
        };
        let gamma: Vec<i64> = gamma
            .iter()
            .map(|g| (*g as f64 / s * gain).round() as i64)
            .collect();
        let beta: Vec<i64> = beta
            .iter()
            .map(|b| (*b as f64 / s).round() as i64)
            .collect();
        Ok(IntLayerNorm {
            input_scale,
            epsilon,
            codes,
            norm_bits,
            epsilon_fixed: (epsilon_codes * 2f64.powi(32)).round() as u128,
            narrow_squares: (n as u128) * (span as u128) * (span as u128) < 1 << 31,
            gamma_high: gamma.iter().map(|g| (g >> 16) as i32).collect(),
            gamma_low: gamma.iter().map(|g| (g & 0xffff) as i32).collect(),
            beta_offset: beta
                .iter()
                .map(|b| (*b as i32).wrapping_add(i32::MIN))
                .collect(),
            gamma,
            beta,
            output_scale,
            isa: Isa::detected(),
        })
    }

    /// The same kernel on the path `isa` (tests and benchmarks use it to force a path; every
    /// path gives the same codes).
    ///
    /// # Errors
    /// A path this CPU cannot run.
    pub fn with_isa(mut self, isa: Isa) -> Result<IntLayerNorm> {
        self.isa = isa.check_available()?;
        Ok(self)
    }

    /// The path it runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Values per row.
    pub fn row_len(&self) -> usize {
        self.gamma.len()
    }

    /// The scale of the input codes.
    pub fn input_scale(&self) -> f32 {
        self.input_scale
    }

    /// The input codes it accepts; others are clamped into this range.
    pub fn input_codes(&self) -> RangeInclusive<i32> {
        self.codes.clone()
    }

    /// `ε`, as given.
    pub fn epsilon(&self) -> f32 {
        self.epsilon
    }

    /// The scale of the output codes: a power of two.
    pub fn output_scale(&self) -> f32 {
        self.output_scale
    }

    /// Always 0.
    pub fn output_zero_point(&self) -> i32 {
        0
    }

    /// A bound on `|code · output_scale - y|` for every output, with `y` layer normalisation
    /// of the real inputs in exact arithmetic: [`LAYER_NORM_MAX_ERROR`] output steps.
    pub fn max_error(&self) -> f64 {
        LAYER_NORM_MAX_ERROR * self.output_scale as f64
    }

    /// Layer normalisation of every row of `input` (whole rows of [`IntLayerNorm::row_len`])
    /// into `out`.
    ///
    /// # Errors
    /// `input` not whole rows, or `out` not as long as `input`; nothing is written then.
    pub fn run<I: InputCode>(&self, input: &[I], out: &mut [i32]) -> Result<()> {
        check_rows("layer norm", self.row_len(), input.len(), out.len())?;
        // AVX2 has no 64-bit multiply: its code takes the products as 32x32→64-bit ones.
        // The portable code (SSE2 has no signed 32x32→64 multiply either) and AVX-512
        // (`vpmullq`) are faster with the 64-bit products; every form gives the same integers.
        if self.isa.width() == Width::Avx2 {
            norm_rows(self.isa, self, input, out, NarrowProducts);
        } else {
            norm_rows(self.isa, self, input, out, WideProducts);
        }
        Ok(())
    }

    /// What [`IntLayerNorm::run`] computes, on real values: the layer normalisation a
    /// fake-quantized model uses to agree with the integer runtime. `x` holds values on the
    /// input grid (`(code - zero_point) · input_scale`; the zero point places the codes in the
    /// declared range, and cancels otherwise), each taken back to its code, the kernel runs on
    /// the codes, and `out` gets `code · output_scale`.
    ///
    /// # Errors
    /// `x` not whole rows, `out` not as long, or a value that is not finite (the error names
    /// its index); nothing is written then.
    pub fn simulate(&self, zero_point: i32, x: &[f32], out: &mut [f32]) -> Result<()> {
        check_rows("layer norm", self.row_len(), x.len(), out.len())?;
        simulate_rows(
            "layer norm input",
            self.isa,
            (self.input_scale, zero_point),
            self.row_len(),
            x,
            self.output_scale,
            out,
            |codes, values| self.run(codes, values),
        )
    }

    /// `(x, shift)` for `W ≥ 1`: `x = 2^32 · T / 4^a` in `[2^60, 2^62)`, so that `⌊√x⌋` has 30
    /// significant bits however small or large `T = W + n² · ε / scale²` is, and the right
    /// shift that takes `c · ⌊2^61 / ⌊√x⌋⌋` to `c / √T · 2^(30 - b)`.
    #[inline(always)]
    fn scaled_square(&self, w: u64) -> (u64, u32) {
        let t = ((w as u128) << 32) + self.epsilon_fixed; // 2^32 · T < 2^95
        let bits = 128 - t.leading_zeros() as i32; // ≥ 33
                                                   // x = t / 4^a in [2^60, 2^62): √x = √T · 2^(16 - a), 30 significant bits.
        let a = (bits - 61).div_euclid(2); // -14 ..= 17
        let x = if a >= 0 { t >> (2 * a) } else { t << (-2 * a) } as u64;
        // c · F · 2^(j - 31 - b) with j = 16 - a: a right shift by 15 + b + a, in 1..=48.
        (x, (15 + self.norm_bits as i32 + a) as u32)
    }

    /// `(F, shift)` with `c · F / 2^shift ≈ c / √T · 2^(30 - b)`, for `W ≥ 1` (so `T ≥ 1`):
    /// `F = ⌊2^61 / ⌊√x⌋⌋ ∈ (2^30, 2^31]` with `x` and `shift` from `scaled_square`.
    fn reciprocal_sqrt(&self, w: u64) -> (i64, u32) {
        let (x, shift) = self.scaled_square(w);
        (((1u64 << 61) / isqrt(x)) as i64, shift)
    }

    /// [`Self::reciprocal_sqrt`] of the first `rows` of a block's `W`s (left as they are where
    /// `W` is 0), step by step across the rows: each row's root and division is a chain of
    /// dependent steps, and the rows' chains then overlap. `⌊√x⌋` from the `f64` root and
    /// `⌊2^61 / ⌊√x⌋⌋` from the `f64` quotient, each corrected to the exact integer (in `u64`:
    /// `x < 2^62`, so the root is below 2^31, the quotient at most 2^31; both estimates are
    /// within one of the answer, as `f64` carries 53 bits).
    #[inline(always)]
    fn reciprocal_sqrts(
        &self,
        ws: &[(i64, i64); BLOCK_ROWS],
        rows: usize,
        out: &mut [(i64, u32); BLOCK_ROWS],
    ) {
        let mut squares = [0u64; BLOCK_ROWS];
        for ((x, (_, w)), (_, shift)) in squares.iter_mut().zip(ws).zip(out.iter_mut()).take(rows) {
            if *w != 0 {
                (*x, *shift) = self.scaled_square(*w as u64);
            }
        }
        let mut roots = squares.map(|x| (x as f64).sqrt() as u64);
        for (r, x) in roots.iter_mut().zip(&squares) {
            while *r * *r > *x {
                *r -= 1;
            }
            while (*r + 1) * (*r + 1) <= *x {
                *r += 1;
            }
        }
        const NUMERATOR: u64 = 1 << 61;
        for ((reciprocal, _), r) in out.iter_mut().zip(&roots).take(rows) {
            if *r == 0 {
                continue; // W = 0: no root.
            }
            let mut q = (NUMERATOR as f64 / *r as f64) as u64;
            while q * *r > NUMERATOR {
                q -= 1;
            }
            while (q + 1) * *r <= NUMERATOR {
                q += 1;
            }
            *reciprocal = q as i64;
        }
        // The tests' builds check every row against the integer root and division.
        for ((_, w), root) in ws.iter().zip(out.iter()).take(rows) {
            if *w != 0 {
                debug_assert_eq!(*root, self.reciprocal_sqrt(*w as u64), "W = {w}");
            }
        }
    }
}

compiled_for_each_width! {
    /// Every row of `input` into `out`.
    fn norm_rows<I: InputCode, P: Products>(
        kernel: &IntLayerNorm,
        input: &[I],
        out: &mut [i32],
        products: P,
    ) => rows;
}

/// The products of a row's loops, in `i64`: of two factors that fit `i32` (`u²`, `n · u`),
/// and `c · r` (`|c| < 2^31`, `r ∈ (2^30, 2^31]`).
trait Products: Copy {
    /// Whether a row's outputs go through the written AVX2 loop (`x86::row_out`).
    const WRITTEN_AVX2: bool = false;
    fn small(a: i64, b: i64) -> i64;
    fn scale(c: i64, r: i64) -> i64;
}

/// 64-bit products.
#[derive(Clone, Copy)]
struct WideProducts;

impl Products for WideProducts {
    #[inline(always)]
    fn small(a: i64, b: i64) -> i64 {
        a * b
    }
    #[inline(always)]
    fn scale(c: i64, r: i64) -> i64 {
        c * r
    }
}

/// The same products from 32x32→64-bit ones (`vpmuldq`): `c · r = c · (r - 2^30) + c · 2^30`
/// with `r - 2^30` in `i32`.
#[derive(Clone, Copy)]
struct NarrowProducts;

impl Products for NarrowProducts {
    // `IntLayerNorm::run` takes these products only where `Isa::width` found AVX2.
    const WRITTEN_AVX2: bool = cfg!(target_arch = "x86_64");
    #[inline(always)]
    fn small(a: i64, b: i64) -> i64 {
        debug_assert!(a == a as i32 as i64 && b == b as i32 as i64);
        (a as i32 as i64) * (b as i32 as i64)
    }
    #[inline(always)]
    fn scale(c: i64, r: i64) -> i64 {
        debug_assert!(c == c as i32 as i64 && r > 1 << 30 && r <= 1 << 31);
        (c as i32 as i64) * ((r - (1 << 30)) as i32 as i64) + (c << 30)
    }
}

/// Rows normalised together: their sums, then their reciprocal square roots, then their
/// outputs, so that the square roots and divisions of different rows (a chain of dependent
/// steps within a row) overlap instead of running one row at a time.
const BLOCK_ROWS: usize = 8;

#[inline(always)]
fn rows<I: InputCode, P: Products>(kernel: &IntLayerNorm, input: &[I], out: &mut [i32], _: P) {
    let n = kernel.row_len();
    let (lo, hi) = (*kernel.codes.start(), *kernel.codes.end());
    let unit = |q: &I| q.code().clamp(lo, hi) as i64 - lo as i64;
    // A row's `c = n · u - S` as `i32` (both terms are below 2^31), for the AVX2 loop.
    let mut centred = if P::WRITTEN_AVX2 {
        vec![0i32; n]
    } else {
        Vec::new()
    };
    for (block, out) in input
        .chunks(BLOCK_ROWS * n)
        .zip(out.chunks_mut(BLOCK_ROWS * n))
    {
        // Per row: S, W, then (F, shift) (W = 0: a row of equal values, no root).
        let mut sums = [(0i64, 0i64); BLOCK_ROWS];
        for (row, (sum, w)) in block.chunks_exact(n).zip(&mut sums) {
            // n · (hi - lo) < 2^31: S < 2^31, n · Σu² < 2^62, |c| < 2^31.
            let (s, squares) = if kernel.narrow_squares {
                // Σu² < 2^31: twice the values to a vector register, and 32-bit products.
                let (s, q2) = row.iter().fold((0i32, 0i32), |(s, q2), q| {
                    let u = unit(q) as i32;
                    (s + u, q2 + u * u)
                });
                (s as i64, q2 as i64)
            } else {
                row.iter().fold((0i64, 0i64), |(s, q2), q| {
                    let u = unit(q);
                    (s + u, q2 + P::small(u, u))
                })
            };
            (*sum, *w) = (s, n as i64 * squares - s * s);
        }
        let rows = block.len() / n;
        let mut roots = [(0i64, 0u32); BLOCK_ROWS];
        kernel.reciprocal_sqrts(&sums, rows, &mut roots);
        for ((row, out), ((sum, w), (reciprocal, shift))) in block
            .chunks_exact(n)
            .zip(out.chunks_exact_mut(n))
            .zip(sums.iter().zip(&roots))
        {
            if *w == 0 {
                for (o, b) in out.iter_mut().zip(&kernel.beta) {
                    *o = *b as i32;
                }
                continue;
            }
            // The AVX2 loop's share of the row (whole groups of 8), the rest below.
            let done = if P::WRITTEN_AVX2 {
                for (c, q) in centred.iter_mut().zip(row) {
                    *c = n as i32 * unit(q) as i32 - *sum as i32;
                }
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `WRITTEN_AVX2` products run only where `Isa::width` found AVX2;
                // `centred`, `out` and the constants hold one row of `n` values.
                let done = unsafe { x86::row_out(kernel, &centred, (*reciprocal, *shift), out) };
                #[cfg(not(target_arch = "x86_64"))]
                let done = 0;
                done
            } else {
                0
            };
            for ((o, q), (g, b)) in out
                .iter_mut()
                .zip(row)
                .zip(kernel.gamma.iter().zip(&kernel.beta))
                .skip(done)
            {
                let c = P::small(n as i64, unit(q)) - sum;
                let norm = round_shift(P::scale(c, *reciprocal), *shift);
                *o = (round_shift(norm * g, 31) + b) as i32;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::IntLayerNorm;
    use crate::int8::widths::mul_epi32;
    use std::arch::x86_64::*;

    /// The outputs of one row, 8 values at a time, from `c = n · u - S` per value and the
    /// row's `(F, shift)`: what the portable loop computes, `round_shift(c · F, shift)` times
    /// `G`, `round_shift(·, 31) + B`, in 64-bit lanes without the 64-bit multiply and
    /// arithmetic shift AVX2 lacks. `c · F = c · (F - 2^30) + c · 2^30` (`F ∈ (2^30, 2^31]`);
    /// `|c · F| < 2^62`, so adding `2^62` makes it non-negative and a logical shift gives
    /// `norm + 2^(62 - shift)`; `|norm| < 2^31` (at most about `2^30`: `|c| / √T ≤ √(n - 1)`,
    /// `2^b ≥ √(n - 1)`), so `norm · G = (norm · (G >> 16)) · 2^16 + norm · (G mod 2^16)` from
    /// two 32x32→64-bit products, `|norm · G| < 2^62` (`|G| ≤ 2^(31 + b) / √(n - 1) < 2^32`), and
    /// the same bias gives `round_shift(norm · G, 31) + 2^31`, whose low 32 bits plus
    /// `B + 2^31` (`beta_offset`) are the output modulo 2^32, as the portable `as i32`.
    /// Returns how many values it did (a multiple of 8).
    ///
    /// # Safety
    /// The CPU runs AVX2; `centred` and `out` hold one row of `kernel`'s length.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_out(
        kernel: &IntLayerNorm,
        centred: &[i32],
        (reciprocal, shift): (i64, u32),
        out: &mut [i32],
    ) -> usize {
        let n = centred
            .len()
            .min(out.len())
            .min(kernel.gamma_high.len())
            .min(kernel.gamma_low.len())
            .min(kernel.beta_offset.len());
        let whole = n - n % 8;
        let factor = _mm256_set1_epi64x(reciprocal - (1 << 30));
        let norm_bias = _mm256_set1_epi64x((1i64 << 62) + ((1i64 << shift) >> 1));
        let norm_offset = _mm256_set1_epi64x(1i64 << (62 - shift));
        let count = _mm_cvtsi32_si128(shift as i32);
        let out_bias = _mm256_set1_epi64x((1i64 << 62) + (1 << 30));
        // The low 32 bits of the four 64-bit lanes, in order, in the low 128 bits.
        let low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        let four = |at: usize| {
            // SAFETY: the caller guarantees AVX2, and `at + 4 <= whole <= n`, within
            // `centred` and the constants.
            unsafe {
                let load = |v: &[i32]| {
                    _mm256_cvtepi32_epi64(_mm_loadu_si128(v.as_ptr().add(at) as *const __m128i))
                };
                let c = load(centred);
                let product = _mm256_add_epi64(mul_epi32(c, factor), _mm256_slli_epi64::<30>(c));
                let norm = _mm256_sub_epi64(
                    _mm256_srl_epi64(_mm256_add_epi64(product, norm_bias), count),
                    norm_offset,
                );
                let scaled = _mm256_add_epi64(
                    _mm256_slli_epi64::<16>(mul_epi32(norm, load(&kernel.gamma_high))),
                    mul_epi32(norm, load(&kernel.gamma_low)),
                );
                let biased = _mm256_srli_epi64::<31>(_mm256_add_epi64(scaled, out_bias));
                let codes = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(biased, low_halves));
                let offset = _mm_loadu_si128(kernel.beta_offset.as_ptr().add(at) as *const __m128i);
                _mm_add_epi32(codes, offset)
            }
        };
        let mut o = 0;
        while o < whole {
            let (first, second) = (four(o), four(o + 4));
            // SAFETY: `o + 8 <= whole <= out.len()`: the 8 `i32`s from `o` lie in `out`.
            unsafe {
                _mm256_storeu_si256(
                    out.as_mut_ptr().add(o) as *mut __m256i,
                    _mm256_set_m128i(second, first),
                )
            };
            o += 8;
        }
        whole
    }
}

/// The power of two `s` with `bound ≤ 2^30 · s` (the least such), within `f32`'s normal
/// range; 1 when `bound` is 0 (every output is then 0).
fn output_scale_for(bound: f64) -> f32 {
    if bound == 0.0 {
        return 1.0;
    }
    let mut exponent = (bound / 2f64.powi(30)).log2().ceil() as i32;
    if bound > 2f64.powi(30 + exponent) {
        exponent += 1;
    }
    2f64.powi(exponent.clamp(-126, 127)) as f32
}

//! Integer-only softmax, GELU and layer normalisation for transformer inference, after I-BERT
//! (Kim et al., *I-BERT: Integer-only BERT Quantization*, ICML 2021).
//!
//! Each kernel is prepared once per layer from the scale of its input codes (the real value of
//! a code `q` is `(q - zero_point) · scale`) and holds integer constants only: its `run` uses
//! `i64`/`u64` arithmetic (and `i128` products for one exact division per softmax row), no
//! allocation, and gives the same integers on every machine and thread. Floats appear only as
//! first guesses that integer steps then correct exactly (the square root of [`isqrt`], the
//! quotient of the softmax's division). `run` *is* the
//! definition: a fake-quantized training model that wants to agree with the integer runtime
//! recovers the codes of its fake-quantized values and calls the same kernel; the real value
//! of each output is `(code - output_zero_point) · output_scale`.
//!
//! | kernel | input | output |
//! |---|---|---|
//! | [`IntSoftmax`] | rows of codes of one scale (any `i32`) | unsigned codes on `[0, 1]`, scale `1 / (2^bits - 1)`, zero point 0 |
//! | [`IntGelu`] | codes in a declared range, any zero point | `i32` codes, zero point 0, scale `input_scale · 2^k` (reported) |
//! | [`IntLayerNorm`] | rows of codes in a declared range | `i32` codes, zero point 0, a power-of-two scale (reported) |
//!
//! # Approximations
//! Softmax and GELU come in two [`Approximation`]s:
//!
//! - [`Approximation::IBert`], the paper's: `exp(p) ≈ 0.3585 · (p + 1.353)² + 0.344` on
//!   `p ∈ (-ln 2, 0]` after `x = -ln2 · z + p`, and
//!   `erf(x) ≈ sgn(x) · [-0.2888 · (min(|x|, 1.769) - 1.769)² + 1]`, evaluated on the input
//!   codes themselves with constants `⌊c / scale⌋`, `⌊c / scale²⌋`. Its error is that of the
//!   polynomials (about 0.56 % relative spread for exp, 0.018 absolute for GELU) plus a part that
//!   grows with the input scale (`ln 2` and the constants are rounded to whole codes), so it is
//!   accepted only up to a maximum input scale. It is meant for what I-BERT feeds it: `i32`
//!   accumulators of a matrix product, whose scales are tiny.
//! - [`Approximation::FixedPoint`], ours: the input is first converted exactly (the `f32`
//!   scale's 24-bit mantissa times the code, one rounding) to a fixed grid of step `2^-30`, so
//!   every later constant is independent of the scale and rounded at `2^-30`; exp is a
//!   degree-6 polynomial (Taylor at the middle of `(-ln 2, 0]`, relative error below
//!   `3·10⁻⁷`) and the normal CDF of GELU a table of 96 cubic Hermite pieces on `[0, 6)` (error
//!   below `3·10⁻⁸`). It costs a few more multiplications per value and is accurate to far
//!   below an 8-bit (or 16-bit) output step at every scale; it is the better choice unless the
//!   model was trained against I-BERT's curves.
//!
//! Layer normalisation has one method ([`IntLayerNorm`]): it needs no approximation beyond
//! rounding (integer mean and variance, the exact `⌊√·⌋` ([`isqrt`]), fixed-point
//! reciprocal), so it is I-BERT's algorithm carried out with more precision.
//!
//! # Error bounds
//! Each kernel reports [`IntSoftmax::max_error`] (and the same for the others): a bound, in
//! real units, on `|value(output) - f(value(input))|` for every input the kernel accepts, where
//! `f` is the exact function (softmax, `x · Φ(x)` with the normal CDF `Φ`, layer
//! normalisation in `f64`). The bound is built from the constants in this module
//! ([`SOFTMAX_IBERT_MAX_ERROR`], ...), which were measured on dense sweeps (see each one) and
//! set with a margin, plus the rounding of the output to its grid (half an output step). The
//! property tests in `quant-core/tests/integration/int8_nonlinear.rs` check every bound on random inputs
//! and scales over the whole accepted range.
//!
//! | kernel | [`Approximation::IBert`] (input scale `s ≤ 2^-4`) | [`Approximation::FixedPoint`] |
//! |---|---|---|
//! | softmax (probability) | `10⁻³ + 1.0 · s` | `10⁻⁷` |
//! | GELU (real units) | `0.0185 + 0.15 · s` | `5·10⁻⁸` |
//! | layer normalisation | 3 output steps | (one method) |
//!
//! I-BERT's error grows with the input scale because its constants (`ln 2`, the polynomials'
//! offsets) are whole input codes: at `s = 2^-4` its softmax is off by up to `0.05`. It suits
//! the `i32` accumulators of a matrix product, whose scales are tiny; at coarser scales use
//! the fixed-point approximation.
//!
//! # Training that agrees with the integer runtime
//! `simulate` ([`IntSoftmax::simulate`], [`IntGelu::simulate`], [`IntLayerNorm::simulate`])
//! runs a kernel on real values that lie on its input grid (a fake-quantized model's values):
//! each value is taken back to its code, the kernel runs, and the output codes are turned back
//! into real values as the integer runtime dequantizes them. The dfdx ops
//! [`crate::dfdx_ops::int_softmax`], [`crate::dfdx_ops::int_gelu`] and [`crate::dfdx_ops::int_layer_norm`] use
//! it as their forward pass, with the exact functions' gradients.
//!
//! ```
//! use quant_core::int8::nonlinear::{Approximation, IntSoftmax};
//!
//! // Attention scores: i32 accumulators at scale 1e-4, rows of 4 tokens, 8-bit probabilities.
//! let softmax = IntSoftmax::new(1e-4, 4, 8, Approximation::FixedPoint)?;
//! let mut probs = [0u8; 4];
//! softmax.run(&[10_000i32, 0, 0, -5_000], &mut probs)?; // x = 1, 0, 0, -0.5
//! assert_eq!(softmax.output_scale(), 1.0 / 255.0);
//! assert_eq!(probs, [130, 48, 48, 29]); // 0.5105, 0.1878, 0.1878, 0.1139 (× 255, rounded)
//! # Ok::<(), quant_core::QuantError>(())
//! ```

mod gelu;
mod layer_norm;
pub(crate) mod softmax;

pub use gelu::normal_cdf;
pub use gelu::{
    IntGelu, GELU_FIXED_POINT_MAX_ERROR, GELU_IBERT_MAX_ERROR, GELU_IBERT_MAX_INPUT_SCALE,
    GELU_IBERT_SCALE_ERROR, GELU_MAX_INPUT_SCALE, GELU_MIN_INPUT_SCALE,
};
pub use layer_norm::{IntLayerNorm, LAYER_NORM_MAX_ERROR};
pub use softmax::{
    attention_scale, IntSoftmax, SOFTMAX_BITS, SOFTMAX_FIXED_POINT_MAX_ERROR,
    SOFTMAX_IBERT_MAX_ERROR, SOFTMAX_IBERT_MAX_INPUT_SCALE, SOFTMAX_IBERT_SCALE_ERROR,
    SOFTMAX_MAX_INPUT_SCALE, SOFTMAX_MAX_ROW_LEN, SOFTMAX_TABLE_MAX_LEN,
};

use crate::error::{QuantError, Result};
use crate::int8::widths::compiled_for_each_width;
use crate::int8::Isa;
use crate::kernels::{round_small_f64, small_int_f64};
use crate::scratch::Scratch;
use rayon::prelude::*;

/// Which integer approximation of `exp` (softmax) and `erf` (GELU) a kernel evaluates (see the
/// [module documentation](self)).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Approximation {
    /// I-BERT's second-order polynomials, evaluated on the input codes with constants rounded
    /// to the input scale (`"ibert"` in files).
    #[serde(rename = "ibert")]
    IBert,
    /// Input converted to a `2^-30` fixed-point grid first, then a degree-6 polynomial for
    /// `exp` and a cubic table for the normal CDF (`"fixed_point"` in files).
    #[serde(rename = "fixed_point")]
    FixedPoint,
}

impl Approximation {
    /// Both approximations.
    pub const ALL: [Approximation; 2] = [Approximation::IBert, Approximation::FixedPoint];

    /// The name used in files and messages (`ibert`, `fixed_point`).
    pub fn name(self) -> &'static str {
        match self {
            Approximation::IBert => "ibert",
            Approximation::FixedPoint => "fixed_point",
        }
    }

    /// `ibert` or `fixed_point`, whichever names this approximation: a kernel's constant (a
    /// largest scale, an error bound) for each.
    fn pick<T>(self, ibert: T, fixed_point: T) -> T {
        match self {
            Approximation::IBert => ibert,
            Approximation::FixedPoint => fixed_point,
        }
    }
}

impl std::fmt::Display for Approximation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `⌊√n⌋`, exactly: the `f64` square root (correctly rounded on every machine), then
/// corrected by whole steps until `r² ≤ n < (r + 1)²`. I-BERT iterates Newton's method on
/// integers instead, a `u64` division per step; the result is the same integer, found in a
/// fraction of the time (layer normalisation takes one root per row).
///
/// ```
/// use quant_core::int8::nonlinear::isqrt;
/// assert_eq!(isqrt(0), 0);
/// assert_eq!(isqrt(99), 9);
/// assert_eq!(isqrt(100), 10);
/// assert_eq!(isqrt(u64::MAX), u32::MAX as u64);
/// ```
#[inline]
pub fn isqrt(n: u64) -> u64 {
    // Rounding n to 53 bits and the root to an integer leaves the estimate within a step or two
    // of the answer; the loops fix it in `u128`, where `(r + 1)²` cannot overflow.
    let mut r = ((n as f64).sqrt() as u64).min(u32::MAX as u64);
    let n = n as u128;
    while (r as u128) * (r as u128) > n {
        r -= 1;
    }
    while ((r + 1) as u128) * ((r + 1) as u128) <= n {
        r += 1;
    }
    r
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for i8 {}
    impl Sealed for u16 {}
    impl Sealed for i16 {}
    impl Sealed for i32 {}
}

/// Integer codes a kernel reads: `u8`, `i8`, `u16`, `i16` and `i32` (every one fits `i32`).
pub trait InputCode: sealed::Sealed + Copy {
    /// The code as `i32`.
    fn code(self) -> i32;
}

macro_rules! input_code {
    ($($t:ty),*) => {$(
        impl InputCode for $t {
            #[inline(always)]
            fn code(self) -> i32 {
                self as i32
            }
        }
    )*};
}
input_code!(u8, i8, u16, i16, i32);

/// Unsigned codes [`IntSoftmax`] can write: `u8` (up to 8 bits), `u16` (up to 16) and `i32`.
pub trait OutputCode: sealed::Sealed + Copy {
    /// The largest code the type holds.
    const MAX: u64;
    /// `code`, which is at most [`OutputCode::MAX`].
    fn from_code(code: u64) -> Self;
}

macro_rules! output_code {
    ($($t:ty),*) => {$(
        impl OutputCode for $t {
            const MAX: u64 = <$t>::MAX as u64;
            #[inline(always)]
            fn from_code(code: u64) -> Self {
                code as $t
            }
        }
    )*};
}
output_code!(u8, u16, i32);

/// Fraction bits of the fixed-point grid of [`Approximation::FixedPoint`] (and of `Φ` in
/// [`IntGelu`]): values are integers times `2^-30`.
const FRACTION_BITS: u32 = 30;
const ONE: i64 = 1 << FRACTION_BITS;

/// `round(delta · scale · 2^30)` exactly (half up): `scale = mantissa · 2^exponent` is the `f32`
/// scale taken apart, so the product is exact and only the final shift rounds.
#[derive(Debug, Clone, Copy)]
struct FixedPointInput {
    mantissa: i64,
    left: u32,
    right: u32,
}

impl FixedPointInput {
    fn new(scale: f32) -> FixedPointInput {
        let bits = scale.to_bits();
        let (biased, fraction) = ((bits >> 23) & 0xff, (bits & 0x7f_ffff) as i64);
        // Normal: 1.fraction · 2^(biased - 127); subnormal: 0.fraction · 2^-126.
        let (mantissa, exponent) = if biased == 0 {
            (fraction, -149)
        } else {
            (fraction | 1 << 23, biased as i32 - 150)
        };
        let shift = exponent + FRACTION_BITS as i32;
        FixedPointInput {
            mantissa,
            left: shift.max(0) as u32,
            // Any |delta · mantissa| the callers allow is below 2^61: a shift of 62 gives 0.
            right: (-shift).clamp(0, 62) as u32,
        }
    }

    /// The caller keeps `|delta| < 2^34` and the result inside `i64` (both kernels clamp
    /// `delta` to where the function saturates first).
    #[inline(always)]
    fn apply(&self, delta: i64) -> i64 {
        round_shift(delta * self.mantissa, self.right) << self.left
    }
}

/// `⌊n / 2^shift + 1/2⌋` (half up; `shift` at most 62).
#[inline(always)]
fn round_shift(n: i64, shift: u32) -> i64 {
    (n + ((1i64 << shift) >> 1)) >> shift
}

/// An error unless `scale` is finite and within `[min, max]`.
fn check_scale(what: &str, scale: f32, min: f32, max: f32, why: &str) -> Result<()> {
    if !(scale.is_finite() && scale >= f32::MIN_POSITIVE) {
        return Err(QuantError::InvalidScale {
            what: what.into(),
            value: scale,
        });
    }
    if !(min..=max).contains(&scale) {
        return Err(QuantError::InvalidValue {
            what: what.into(),
            value: scale.to_string(),
            expected: format!("a scale in [{min:e}, {max:e}] {why}"),
        });
    }
    Ok(())
}

/// [`check_scale`] of the input scale of `kernel` (`"GELU"`, `"softmax"`), whose largest scale
/// depends on the approximation: `max` holds it for I-BERT and for fixed point.
fn check_input_scale(
    kernel: &str,
    scale: f32,
    min: f32,
    [ibert_max, fixed_point_max]: [f32; 2],
    approximation: Approximation,
) -> Result<()> {
    check_scale(
        &format!("{} input scale", kernel.to_lowercase()),
        scale,
        min,
        approximation.pick(ibert_max, fixed_point_max),
        &format!("for the {approximation} {kernel} (use fixed_point for coarser scales)"),
    )
}

/// An error unless `input` is whole rows of `row_len` and `out` is as long.
fn check_rows(what: &str, row_len: usize, input: usize, out: usize) -> Result<()> {
    if !input.is_multiple_of(row_len) {
        return Err(QuantError::LengthMismatch {
            what: format!("{what} input (whole rows of {row_len})"),
            expected: input.next_multiple_of(row_len),
            actual: input,
        });
    }
    super::check_len(&format!("{what} output"), input, out)
}

/// The codes of real values that lie on a grid of `scale` and `zero_point` (as a fake-quantized
/// model computes them, `(code - zero_point) · scale` in `f32`): `round(x / scale) +
/// zero_point`, in `f64`, saturated to `i32`. A value computed in `f32` from a code below
/// `2^23` in magnitude is within `2^-24` relative of it, so this gives the code back exactly.
/// The loop runs at `isa`'s width (a tenth of a quantized ViT's training step was this
/// conversion one value at a time); division and rounding are exact IEEE operations, so every
/// width gives the same codes. Not public API (quant-core's tests).
#[doc(hidden)]
pub fn codes_of(what: &str, x: &[f32], scale: f32, zero_point: i32, isa: Isa) -> Result<Vec<i32>> {
    let mut codes = vec![0i32; x.len()];
    if !codes_into(isa, x, scale, zero_point, &mut codes) {
        let i = x.iter().position(|v| !v.is_finite()).unwrap_or_default();
        return Err(QuantError::NonFinite {
            what: format!("{what}[{i}]"),
            value: x[i] as f64,
        });
    }
    Ok(codes)
}

/// [`codes_of`]'s loop: the codes of `x` into `out` (as long), and whether every value was
/// finite (`out` is meaningless where not). On AVX-512 without the division (see
/// `x86::codes_avx512`), elsewhere [`codes_into_body`] at `isa`'s width. Not public API
/// (quant-core's tests).
#[doc(hidden)]
pub fn codes_into(isa: Isa, x: &[f32], scale: f32, zero_point: i32, out: &mut [i32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa.width() == crate::int8::widths::Width::Avx512 {
        // SAFETY: `Isa::width` gives `Width::Avx512` only after checking that this CPU runs
        // AVX-512 F, BW, DQ, VL and AVX2.
        return unsafe { x86::codes_avx512(x, scale, zero_point, out) };
    }
    codes_by_width(isa, x, scale, zero_point, out)
}

compiled_for_each_width! {
    /// [`codes_into_body`] at `isa`'s width.
    fn codes_by_width<>(x: &[f32], scale: f32, zero_point: i32, out: &mut [i32]) -> bool
        => codes_into_body;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::codes_into_body;
    use std::arch::x86_64::*;

    /// [`codes_into_body`] without its `f64` division, whose throughput (one 8-lane quotient
    /// per 16 cycles on recent Intel cores) bounded the loop: `q = x · (1/scale)` rounded to
    /// `r`, then the exact remainder `d = x - r · scale` (one FMA: both terms are multiples of
    /// the smaller operand's unit in the last place and `|d|` is below `scale`, so `d` needs
    /// at most 27 bits). Where `|d| < scale / 2`, `r` is the exact quotient `e` rounded, and
    /// so the definition's code: below `2^28`, `f64`'s rounding of `e` cannot make a tie of
    /// it (a quotient of two `f32` values that is not a tie lies at least `2^-25` from one).
    /// Vectors with a lane where that is not shown (an exact tie, a quotient of `2^28` or
    /// more, a NaN or infinite one from a value that is not finite) go through
    /// [`codes_into_body`]: the same codes on every input. The tests' exact ties
    /// (`|d| = scale / 2`), values beyond `2^28` codes and infinities take that way.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F, BW, DQ, VL and AVX2.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2")]
    pub(super) unsafe fn codes_avx512(
        x: &[f32],
        scale: f32,
        zero_point: i32,
        out: &mut [i32],
    ) -> bool {
        let n = x.len().min(out.len());
        let whole = n - n % 8;
        let s = scale as f64;
        let (s_wide, inverse) = (_mm512_set1_pd(s), _mm512_set1_pd(1.0 / s));
        let half_scale = _mm512_set1_pd(s / 2.0);
        let near = _mm512_set1_pd((1u64 << 28) as f64);
        let zp = _mm512_set1_pd(zero_point as f64);
        let (lo, hi) = (
            _mm512_set1_pd(i32::MIN as f64),
            _mm512_set1_pd(i32::MAX as f64),
        );
        let magnitude = _mm512_castsi512_pd(_mm512_set1_epi64(i64::MAX));
        let mut finite = true;
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 8 <= whole <= x.len()`: the 8 `f32`s from `i` lie in `x`.
            let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
            let v = _mm512_cvtps_pd(v);
            let q = _mm512_mul_pd(v, inverse);
            let r = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(q);
            let d = _mm512_fnmadd_pd(r, s_wide, v);
            let unsure = _mm512_cmp_pd_mask::<_CMP_NLT_UQ>(_mm512_and_pd(d, magnitude), half_scale)
                | _mm512_cmp_pd_mask::<_CMP_NLT_UQ>(_mm512_and_pd(q, magnitude), near);
            if unsure == 0 {
                let code = _mm512_min_pd(_mm512_max_pd(_mm512_add_pd(r, zp), lo), hi);
                // SAFETY: `i + 8 <= whole <= out.len()`: the 8 `i32`s from `i` lie in `out`.
                unsafe {
                    _mm256_storeu_si256(
                        out.as_mut_ptr().add(i) as *mut __m256i,
                        _mm512_cvtpd_epi32(code),
                    )
                };
            } else {
                finite &= codes_into_body(&x[i..i + 8], scale, zero_point, &mut out[i..i + 8]);
            }
            i += 8;
        }
        finite & codes_into_body(&x[whole..n], scale, zero_point, &mut out[whole..n])
    }
}

#[inline(always)]
fn codes_into_body(x: &[f32], scale: f32, zero_point: i32, out: &mut [i32]) -> bool {
    // Quotients beyond 2^50 in magnitude saturate whatever the zero point (below 2^31), so
    // they are clamped there first: the rounding trick is exact below 2^51, and the loop has
    // no branch (a library call for large values) to keep it from vectorising.
    const LIMIT: f64 = (1u64 << 50) as f64;
    let (scale, zero_point) = (scale as f64, zero_point as f64);
    let mut non_finite = 0u32;
    for (o, v) in out.iter_mut().zip(x) {
        non_finite |= (v.to_bits() & 0x7f80_0000 == 0x7f80_0000) as u32;
        let quotient = (*v as f64 / scale).clamp(-LIMIT, LIMIT);
        let code = round_small_f64(quotient) + zero_point;
        *o = small_int_f64(code.clamp(i32::MIN as f64, i32::MAX as f64));
    }
    non_finite == 0
}

/// What a kernel's `simulate` computes: the codes of `x` (on the grid of `scale` and
/// `zero_point`, as [`codes_of`]), `run` on them, and `out` = the output codes times
/// `output_scale` ([`values_of`]). Jobs of whole rows of `row_len` run in parallel; the rows
/// being independent, the split changes no bits.
///
/// # Errors
/// A value of `x` that is not finite (named `what[index]`, the first such), or what `run`
/// returns; nothing is written to `out` then.
#[allow(clippy::too_many_arguments)]
fn simulate_rows(
    what: &str,
    isa: Isa,
    (scale, zero_point): (f32, i32),
    row_len: usize,
    x: &[f32],
    output_scale: f32,
    out: &mut [f32],
    run: impl Fn(&[i32], &mut [i32]) -> Result<()> + Sync,
) -> Result<()> {
    let job = crate::kernels::rows_per_job(x.len(), row_len, 1) * row_len.max(1);
    // Pooled: no zeroing before the jobs write them whole.
    let (mut codes, mut values) = (Scratch::with_len(x.len()), Scratch::with_len(x.len()));
    let (codes, values) = (codes.as_i32_mut(), values.as_i32_mut());
    // Per job: `Ok(false)` where a value is not finite (the job's kernel is not run then).
    let jobs: Vec<Result<bool>> = x
        .par_chunks(job)
        .zip(codes.par_chunks_mut(job))
        .zip(values.par_chunks_mut(job))
        .map(|((x, codes), values)| {
            if !codes_into(isa, x, scale, zero_point, codes) {
                return Ok(false);
            }
            run(codes, values).map(|()| true)
        })
        .collect();
    if jobs.iter().any(|job| matches!(job, Ok(false))) {
        let i = x.iter().position(|v| !v.is_finite()).unwrap_or_default();
        return Err(QuantError::NonFinite {
            what: format!("{what}[{i}]"),
            value: x[i] as f64,
        });
    }
    for job in jobs {
        job?;
    }
    values
        .par_chunks(job)
        .zip(out.par_chunks_mut(job))
        .for_each(|(codes, out)| values_by_width(isa, codes, output_scale, out));
    Ok(())
}

compiled_for_each_width! {
    /// [`values_of`] at `isa`'s width (a closure of rayon's is compiled for the baseline's
    /// four lanes; this pass was about 1.4% of the digits ViT's QAT step there). The same
    /// conversions and products in every width, so the same bits.
    fn values_by_width<>(codes: &[i32], scale: f32, out: &mut [f32]) => values_of;
}

/// `code · scale` in `f32` for each code: the real values of a kernel's output codes, as the
/// integer runtime dequantizes them.
#[inline(always)]
fn values_of(codes: &[i32], scale: f32, out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(codes) {
        *o = *c as f32 * scale;
    }
}

/// An error unless `lo <= hi`.
fn check_code_range(what: &str, codes: &std::ops::RangeInclusive<i32>) -> Result<()> {
    if codes.start() > codes.end() {
        return Err(QuantError::InvalidRange {
            quant_min: *codes.start(),
            quant_max: *codes.end(),
            reason: match what {
                "gelu" => "the input codes of GELU need min <= max",
                _ => "the input codes of layer normalisation need min <= max",
            },
        });
    }
    Ok(())
}

//! Integer GELU, `x · Φ(x)` with `Φ` the normal CDF: `Φ` in fixed point (`2^-30`) from the
//! input code, then one exact product with the centered code and a rounding shift.

use std::ops::RangeInclusive;
use std::sync::OnceLock;

use super::{check_code_range, check_input_scale, round_shift, simulate_rows};
use super::{Approximation, FixedPointInput};
use super::{InputCode, FRACTION_BITS, ONE};
use crate::error::Result;
use crate::int8::fixed_point_multiplier;
use crate::int8::widths::compiled_for_each_width;
use crate::int8::Isa;

/// The smallest input scale [`IntGelu`] accepts (`2^-96`): the output scale, at least
/// `scale · 2^-30`, stays a normal `f32`.
pub const GELU_MIN_INPUT_SCALE: f32 = f32::from_bits((127 - 96) << 23);

/// The largest input scale [`IntGelu`] accepts with [`Approximation::FixedPoint`] (`2^20`).
pub const GELU_MAX_INPUT_SCALE: f32 = (1 << 20) as f32;

/// The largest input scale [`IntGelu`] accepts with [`Approximation::IBert`] (`2^-4`): I-BERT
/// rounds its constants to whole codes of `scale / √2`, which adds to its error in proportion to
/// the scale ([`GELU_IBERT_SCALE_ERROR`]).
pub const GELU_IBERT_MAX_INPUT_SCALE: f32 = 0.0625;

/// The error of I-BERT's GELU at fine input scales, in the output's real units (the paper
/// reports 0.018 for its `erf` polynomial): measured worst case `1.815·10⁻²`, at `x ≈ ±2.35`
/// (scales up to `2^-12`, `quant-core/examples/nonlinear_error_bounds.rs`); set
/// with a margin.
pub const GELU_IBERT_MAX_ERROR: f64 = 0.0185;

/// The part of I-BERT's GELU error that grows with the input scale `s`, per unit of `s`
/// ([`IntGelu::max_error`] adds `GELU_IBERT_SCALE_ERROR · s`): measured worst
/// `(error - 1.815·10⁻²) / s` is `0.090` (at `s = 2^-4`, error `2.38·10⁻²`); set with a margin.
pub const GELU_IBERT_SCALE_ERROR: f64 = 0.15;

/// The error of the fixed-point GELU, in the output's real units, at every accepted scale:
/// measured worst case `2.12·10⁻⁸` (the cubic pieces of `Φ` near `x = ±1`); set with a margin.
pub const GELU_FIXED_POINT_MAX_ERROR: f64 = 5e-8;

/// GELU, `x · Φ(x)` (the exact, `erf`-based definition), of codes with a zero point, into
/// `i32` codes.
///
/// For a code `q` (clamped into the declared input range) and `d = q - zero_point`:
/// `Φ_q ≈ Φ(d · scale) · 2^30` by the [`Approximation`], then
/// `out = round(d · Φ_q / 2^k)` (half up), exact in `i64`. `k` is the bit length of the
/// largest `|d|` the range allows, so every output fits in 31 bits; the output scale is
/// `scale · 2^(k - 30)` (exact in `f32`), zero point 0. Requantize the output into the next
/// layer's grid with a fixed-point multiplier ([`Requantizer`](crate::int8::Requantizer)).
///
/// With [`Approximation::IBert`], `Φ = (1 + erf(x / √2)) / 2` with I-BERT's integer `erf`:
/// `sgn(d) · [(min(|d|, -b) + b)² + c]` at scale `-0.2888 · s'²` (`s' = scale / √2`,
/// `b = ⌊-1.769 / s'⌋`, `c = ⌊-1 / (0.2888 · s'²)⌋`), shifted right so that it fits 30 bits
/// (I-BERT shifts by a fixed 14), plus `⌊1 / erf scale⌋` for the `1 +`, then converted to
/// `2^-30` by a fixed-point multiplier. Where I-BERT's `erf` is clipped (`|x / √2| ≥ 1.769`),
/// its value is exactly `±1`, and so is ours.
///
/// The bound on the error of each output value is [`IntGelu::max_error`].
#[derive(Debug, Clone)]
pub struct IntGelu {
    approximation: Approximation,
    input_scale: f32,
    zero_point: i32,
    codes: RangeInclusive<i32>,
    out_shift: u32,
    phi: Phi,
    /// The output of every accepted code, `lo..=hi` (then repeated to the end), when there
    /// are at most [`TABLE_CODES`]: GELU of one code depends on nothing else, so a table of the
    /// kernel's own results is the kernel, at one load per value.
    table: Option<Box<[i32; TABLE_CODES]>>,
    isa: Isa,
}

/// The widest code range whose outputs [`IntGelu`] keeps in a table (10-bit codes and
/// narrower; 4 KiB). A power of two: a clamped index masked by `TABLE_CODES - 1` needs no
/// bounds check, so the lookups vectorize (gathers).
const TABLE_CODES: usize = 1 << 10;

#[derive(Debug, Clone)]
enum Phi {
    IBert(IBertPhi),
    FixedPoint(FixedPointPhi),
}

impl IntGelu {
    /// The GELU quant deploys: fixed point. The one constructor both the fake-quantized model
    /// (QAT) and the integer runtime call, so that they run the same kernel.
    ///
    /// # Errors
    /// As [`IntGelu::new`].
    pub fn deployed(
        input_scale: f32,
        zero_point: i32,
        codes: RangeInclusive<i32>,
    ) -> Result<IntGelu> {
        IntGelu::new(input_scale, zero_point, codes, Approximation::FixedPoint)
    }

    /// Prepares GELU of codes in `codes` (clamped into it) with `zero_point` at `input_scale`.
    ///
    /// # Errors
    /// A scale that is not finite, below [`GELU_MIN_INPUT_SCALE`] or above
    /// [`GELU_MAX_INPUT_SCALE`] ([`GELU_IBERT_MAX_INPUT_SCALE`] for I-BERT); an empty code
    /// range.
    pub fn new(
        input_scale: f32,
        zero_point: i32,
        codes: RangeInclusive<i32>,
        approximation: Approximation,
    ) -> Result<IntGelu> {
        check_input_scale(
            "GELU",
            input_scale,
            GELU_MIN_INPUT_SCALE,
            [GELU_IBERT_MAX_INPUT_SCALE, GELU_MAX_INPUT_SCALE],
            approximation,
        )?;
        check_code_range("gelu", &codes)?;
        let reach = |q: i32| (q as i64 - zero_point as i64).unsigned_abs();
        let largest = reach(*codes.start()).max(reach(*codes.end()));
        let phi = match approximation {
            Approximation::IBert => Phi::IBert(IBertPhi::new(input_scale)?),
            Approximation::FixedPoint => Phi::FixedPoint(FixedPointPhi::new(input_scale)),
        };
        let mut kernel = IntGelu {
            approximation,
            input_scale,
            zero_point,
            codes,
            // |d| < 2^k and Φ ≤ 2^30 (+ a little for I-BERT's floors): |out| < 2^30 + 1.
            out_shift: 64 - largest.leading_zeros(),
            phi,
            table: None,
            isa: Isa::detected(),
        };
        let (lo, hi) = (*kernel.codes.start(), *kernel.codes.end());
        if (hi as i64 - lo as i64) < TABLE_CODES as i64 {
            let span = (hi as i64 - lo as i64) as usize;
            let mut table = Box::new([0i32; TABLE_CODES]);
            for (i, out) in table[..=span].iter_mut().enumerate() {
                *out = kernel.value(lo + i as i32);
            }
            let last = table[span];
            table[span + 1..].fill(last);
            kernel.table = Some(table);
        }
        Ok(kernel)
    }

    /// The approximation of `Φ` it evaluates.
    pub fn approximation(&self) -> Approximation {
        self.approximation
    }

    /// The scale of the input codes.
    pub fn input_scale(&self) -> f32 {
        self.input_scale
    }

    /// The zero point of the input codes.
    pub fn input_zero_point(&self) -> i32 {
        self.zero_point
    }

    /// The input codes it accepts; others are clamped into this range.
    pub fn input_codes(&self) -> RangeInclusive<i32> {
        self.codes.clone()
    }

    /// `input_scale · 2^(k - 30)`, exact.
    pub fn output_scale(&self) -> f32 {
        (self.input_scale as f64 * 2f64.powi(self.out_shift as i32 - FRACTION_BITS as i32)) as f32
    }

    /// Always 0.
    pub fn output_zero_point(&self) -> i32 {
        0
    }

    /// A bound on `|code · output_scale - x · Φ(x)|` for every accepted input: the
    /// approximation's error ([`GELU_IBERT_MAX_ERROR`] `+` [`GELU_IBERT_SCALE_ERROR`]` · scale`,
    /// or [`GELU_FIXED_POINT_MAX_ERROR`]) and half an output step.
    pub fn max_error(&self) -> f64 {
        let approximation = self.approximation.pick(
            GELU_IBERT_MAX_ERROR + GELU_IBERT_SCALE_ERROR * self.input_scale as f64,
            GELU_FIXED_POINT_MAX_ERROR,
        );
        approximation + 0.5 * self.output_scale() as f64
    }

    /// GELU of every code of `input` into `out`.
    ///
    /// # Errors
    /// `out` not as long as `input`; nothing is written then.
    pub fn run<I: InputCode>(&self, input: &[I], out: &mut [i32]) -> Result<()> {
        super::super::check_len("gelu output", input.len(), out.len())?;
        if let Some(table) = &self.table {
            look_up(
                self.isa,
                table,
                *self.codes.start()..=*self.codes.end(),
                input,
                out,
            );
            return Ok(());
        }
        match &self.phi {
            Phi::IBert(phi) => self.values(input, out, |d| phi.phi(d)),
            Phi::FixedPoint(phi) => self.values(input, out, |d| phi.phi(d)),
        }
        Ok(())
    }

    /// The same kernel on the path `isa` (tests and benchmarks use it to force a path; every
    /// path gives the same codes).
    ///
    /// # Errors
    /// A path this CPU cannot run.
    pub fn with_isa(mut self, isa: Isa) -> Result<IntGelu> {
        self.isa = isa.check_available()?;
        Ok(self)
    }

    /// The path it runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The output code of one input code (clamped into [`IntGelu::input_codes`]), evaluated
    /// rather than looked up: what [`IntGelu::run`] gives for it, by definition.
    pub fn value(&self, code: i32) -> i32 {
        let mut out = [0];
        match &self.phi {
            Phi::IBert(phi) => self.values(&[code], &mut out, |d| phi.phi(d)),
            Phi::FixedPoint(phi) => self.values(&[code], &mut out, |d| phi.phi(d)),
        }
        out[0]
    }

    /// What [`IntGelu::run`] computes, on real values: the GELU a fake-quantized model uses to
    /// agree with the integer runtime. `x` holds values on the input grid (`(code -
    /// zero_point) · input_scale`), each taken back to its code, the kernel runs on the codes,
    /// and `out` gets `code · output_scale` (rounded to `f32`, as the integer runtime
    /// dequantizes it; the next quantizer requantizes it).
    ///
    /// # Errors
    /// `out` not as long as `x`, or a value that is not finite (the error names its index);
    /// nothing is written then.
    pub fn simulate(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        super::super::check_len("gelu output", x.len(), out.len())?;
        simulate_rows(
            "gelu input",
            self.isa,
            (self.input_scale, self.zero_point),
            1,
            x,
            self.output_scale(),
            out,
            |codes, values| self.run(codes, values),
        )
    }

    #[inline(always)]
    fn values<I: InputCode>(&self, input: &[I], out: &mut [i32], phi: impl Fn(i64) -> i64) {
        let (lo, hi, zero) = (
            *self.codes.start(),
            *self.codes.end(),
            self.zero_point as i64,
        );
        for (o, q) in out.iter_mut().zip(input) {
            let d = q.code().clamp(lo, hi) as i64 - zero;
            *o = round_shift(d * phi(d), self.out_shift) as i32;
        }
    }
}

compiled_for_each_width! {
    /// `out = table[clamp(q) - lo]` for every code.
    fn look_up<I: InputCode>(
        table: &[i32; TABLE_CODES],
        codes: RangeInclusive<i32>,
        input: &[I],
        out: &mut [i32],
    ) => table_rows;
}

#[inline(always)]
fn table_rows<I: InputCode>(
    table: &[i32; TABLE_CODES],
    codes: RangeInclusive<i32>,
    input: &[I],
    out: &mut [i32],
) {
    let (lo, hi) = (*codes.start(), *codes.end());
    for (o, q) in out.iter_mut().zip(input) {
        // Clamped, the index is below TABLE_CODES already; the mask says so to the compiler.
        let i = (q.code().clamp(lo, hi) as i64 - lo as i64) as usize;
        *o = table[i & (TABLE_CODES - 1)];
    }
}

/// I-BERT's `Φ = (1 + erf(x / √2)) / 2`, in `2^-30` (see [`IntGelu`]).
#[derive(Debug, Clone)]
struct IBertPhi {
    /// Right shift of `d` that brings the scale to at least `2^-29` (the squares stay in
    /// `i64`); 0 for every scale above that.
    pre_shift: u32,
    /// `-b = -⌊-1.769 / s'⌋`: where `erf` is clipped to `±1`.
    clip: i64,
    b: i64,
    c: i64,
    /// Right shift of the `erf` integer (I-BERT's fixed `2^14`, here the least that fits 30
    /// bits).
    erf_shift: u32,
    /// `⌊1 / erf scale⌋` (negative: the erf scale `-0.2888 · s'² · 2^erf_shift` is).
    one: i64,
    /// `-erf scale / 2 · 2^30 ≈ m · 2^-m_shift`.
    m: i64,
    m_shift: u32,
}

impl IBertPhi {
    const A: f64 = -0.2888;
    const B: f64 = -1.769;

    fn new(scale: f32) -> Result<IBertPhi> {
        let mut s = scale as f64;
        let mut pre_shift = 0;
        while s < 2f64.powi(-29) {
            s *= 2.0;
            pre_shift += 1;
        }
        let s = s / std::f64::consts::SQRT_2;
        let b = (Self::B / s).floor() as i64;
        let c = (1.0 / (Self::A * s * s)).floor() as i64;
        // |erf integer| ≤ |c|: keep 30 bits.
        let erf_shift = (64 - c.unsigned_abs().leading_zeros()).saturating_sub(30);
        let erf_scale = Self::A * s * s * 2f64.powi(erf_shift as i32);
        let (m, m_shift) = fixed_point_multiplier(-erf_scale / 2.0 * ONE as f64)
            .map_err(|e| e.at("gelu (ibert) erf scale"))?;
        Ok(IBertPhi {
            // |d| ≤ 2^32: a shift of 63 already gives ⌊d / 2^k⌋ ∈ {-1, 0} like any larger k.
            pre_shift: pre_shift.min(63),
            clip: -b,
            b,
            c,
            erf_shift,
            one: (1.0 / erf_scale).floor() as i64,
            m,
            m_shift,
        })
    }

    #[inline(always)]
    fn phi(&self, d: i64) -> i64 {
        let d = d >> self.pre_shift;
        let a = d.abs();
        if a >= self.clip {
            return if d > 0 { ONE } else { 0 };
        }
        let y = (a + self.b) * (a + self.b) + self.c;
        let erf = (d.signum() * y) >> self.erf_shift;
        round_shift(-(erf + self.one) * self.m, self.m_shift)
    }
}

/// Where the fixed-point `Φ` saturates: `Φ(6) = 1 - 9.9 · 10⁻¹⁰`, so `|x| · (1 - Φ(|x|))` is
/// below `6 · 10⁻⁹` beyond.
const SATURATION: i64 = 6 * ONE;
/// The table's pieces: `[0, 6)` in steps of `2^-4`.
const PIECE_BITS: u32 = 4;
const PIECES: usize = 6 << PIECE_BITS;

/// The fixed-point `Φ`: `d · s` to the `2^-30` grid, then a cubic Hermite piece (value and
/// slope of `Φ` at both ends, so the curve is continuous with a continuous slope).
#[derive(Debug, Clone)]
struct FixedPointPhi {
    input: FixedPointInput,
    /// `⌈6 / s⌉ + 1` codes: beyond, `Φ` is 0 or 1, and clamping here keeps `d · mantissa`
    /// small.
    reach: i64,
    table: &'static [[i64; 4]; PIECES],
}

impl FixedPointPhi {
    fn new(scale: f32) -> FixedPointPhi {
        let reach = (6.0 / scale as f64).ceil() + 1.0;
        FixedPointPhi {
            input: FixedPointInput::new(scale),
            reach: reach.min((1u64 << 33) as f64) as i64,
            table: phi_table(),
        }
    }

    #[inline(always)]
    fn phi(&self, d: i64) -> i64 {
        let t = self.input.apply(d.clamp(-self.reach, self.reach));
        let a = t.abs();
        let upper = if a >= SATURATION {
            ONE
        } else {
            let piece = FRACTION_BITS - PIECE_BITS;
            let [c0, c1, c2, c3] = self.table[(a >> piece) as usize];
            // v ∈ [0, 1) within the piece, in 2^-30.
            let v = (a & ((1 << piece) - 1)) << PIECE_BITS;
            c0 + ((v * (c1 + ((v * (c2 + ((v * c3) >> FRACTION_BITS))) >> FRACTION_BITS)))
                >> FRACTION_BITS)
        };
        if t >= 0 {
            upper
        } else {
            ONE - upper
        }
    }
}

/// The Hermite pieces of `Φ` on `[0, 6)`, in `2^-30`: piece `i` on `[x₀, x₀ + h]`,
/// `h = 2^-4`, is `c₀ + c₁v + c₂v² + c₃v³` in `v = (x - x₀) / h`.
fn phi_table() -> &'static [[i64; 4]; PIECES] {
    static TABLE: OnceLock<[[i64; 4]; PIECES]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let h = 1.0 / (1 << PIECE_BITS) as f64;
        let cdf = |x: f64| 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2));
        let pdf = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let fixed = |v: f64| (v * ONE as f64).round() as i64;
        std::array::from_fn(|i| {
            let (x0, x1) = (i as f64 * h, (i + 1) as f64 * h);
            let (f0, f1, d0, d1) = (cdf(x0), cdf(x1), h * pdf(x0), h * pdf(x1));
            [
                fixed(f0),
                fixed(d0),
                fixed(3.0 * (f1 - f0) - 2.0 * d0 - d1),
                fixed(2.0 * (f0 - f1) + d0 + d1),
            ]
        })
    })
}

/// `Φ(x) = (1 + erf(x / √2)) / 2` in `f64`, saturated to 0 and 1 beyond `|x| = 6`
/// (`1 - Φ(6) < 10⁻⁹`): the exact GELU of float references and of the simulated GELU's
/// gradients.
pub fn normal_cdf(x: f64) -> f64 {
    let upper = if x.abs() >= 6.0 {
        1.0
    } else {
        0.5 * (1.0 + erf(x.abs() / std::f64::consts::SQRT_2))
    };
    if x >= 0.0 {
        upper
    } else {
        1.0 - upper
    }
}

/// `erf(x)` for `0 ≤ x ≤ 4.3`, to about `10⁻¹⁵`, from the series of positive terms
/// `erf(x) = 2/√π · e^(-x²) · Σₙ 2ⁿ x^(2n+1) / (1 · 3 ⋯ (2n+1))` (no cancellation). Only the
/// table above uses it, once.
fn erf(x: f64) -> f64 {
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term > sum * 1e-17 {
        n += 1.0;
        term *= 2.0 * x * x / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp() * sum
}

//! Integer softmax over rows: `exp` of each code minus the row's largest, approximated in
//! integers, then one integer division per row for the normalisation.

use super::{check_input_scale, check_rows, simulate_rows};
use super::{Approximation, FixedPointInput, InputCode, OutputCode};
use super::{FRACTION_BITS, ONE};
use crate::error::{QuantError, Result};
use crate::int8::widths::compiled_for_each_width;
#[cfg(target_arch = "x86_64")]
use crate::int8::widths::Width;
use crate::int8::Isa;

/// The longest row [`IntSoftmax`] accepts. Every `exp` keeps `61 - ⌈log2 n⌉` fraction bits, so
/// that a row's sum fits 61 bits; up to this length that is at least 45 bits, and the floors of
/// the `exp` values move a probability by less than `2^-29` in all.
pub const SOFTMAX_MAX_ROW_LEN: usize = 1 << 16;

/// The largest input scale [`IntSoftmax`] accepts with [`Approximation::FixedPoint`]: one code
/// step of `2^20` already drives every probability but the largest to 0.
pub const SOFTMAX_MAX_INPUT_SCALE: f32 = 1048576.0;

/// The largest input scale [`IntSoftmax`] accepts with [`Approximation::IBert`] (`2^-4`):
/// I-BERT rounds `ln 2` (and its polynomial's constants) to whole codes, which stretches every
/// exponent by up to `scale / ln 2`; at this scale the error already reaches about `0.05`
/// (13 steps of an 8-bit output), see [`SOFTMAX_IBERT_SCALE_ERROR`].
pub const SOFTMAX_IBERT_MAX_INPUT_SCALE: f32 = 0.0625;

/// The error of I-BERT's softmax at fine input scales, in probability: its polynomial's
/// relative error on `exp` spans `[-0.31 %, +0.25 %]`. Measured worst case `8.43·10⁻⁴` (scales
/// up to `2^-12`, `quant-core/examples/nonlinear_error_bounds.rs`); set with a
/// margin.
pub const SOFTMAX_IBERT_MAX_ERROR: f64 = 1.0e-3;

/// The part of I-BERT's softmax error that grows with the input scale `s`, per unit of `s`
/// ([`IntSoftmax::max_error`] adds `SOFTMAX_IBERT_SCALE_ERROR · s`): measured worst
/// `(error - 8.43·10⁻⁴) / s` is `0.83`, at `s = 2^-4` and at `s` just below `ln 2 / 16` (where
/// `⌈ln 2 / s⌉ · s` overshoots `ln 2` by nearly `s`, the most it can); set with a margin.
pub const SOFTMAX_IBERT_SCALE_ERROR: f64 = 1.0;

/// The error of the fixed-point softmax, in probability, at every accepted scale and row
/// length: measured worst case `4.96·10⁻⁸`; set with a margin.
pub const SOFTMAX_FIXED_POINT_MAX_ERROR: f64 = 1.0e-7;

/// Rows up to this length keep their `exp` values on the stack between the sum and the
/// normalisation; longer rows compute them twice (same integers).
const STACK_ROW: usize = 256;

/// The most entries of the table of `exp` values [`IntSoftmax`] keeps (32 KiB of `u64`): at an
/// input scale above about `0.012` every difference from the row's maximum that does not
/// round `exp` to 0 has its own entry (a 4-bit attention's scores: scales near `0.04`).
pub const SOFTMAX_TABLE_MAX_LEN: usize = 4096;

/// Softmax over each row of `row_len` codes of one scale, into unsigned codes on `[0, 1]`.
///
/// For a row `q`, with `Δᵢ = qᵢ - max q ≤ 0` (so the zero point does not matter):
///
/// 1. `eᵢ ≈ exp(Δᵢ · scale) · 2^E`, `E = 61 - ⌈log2 row_len⌉`, by the [`Approximation`]:
///    `Δᵢ · scale = -z · ln 2 + p` with `p ∈ (-ln 2, 0]`, a polynomial in `p`, shifted right by
///    `z` (floor). The largest value of the row gets `exp(0)`, so every row's sum is at least
///    `2^(E-1)`; values more than `64 · ln 2` below the maximum contribute 0.
/// 2. `S = Σ eᵢ`, and `outᵢ = round(eᵢ · (2^bits - 1) / S)` (half up) through one exact
///    division of a `u128` numerator per row (see `floor_div`) and a `u64` multiply-shift per
///    value.
///
/// The output grid is `k / (2^bits - 1)`, `k = 0..=2^bits - 1`, zero point 0: both 0 and 1 are
/// on it, so a row dominated by one value gives exactly 1 (I-BERT uses `k / 2^bits`, where 1
/// is one code above an 8-bit range). The output values of a row need not sum to exactly 1.
///
/// The bound on the error of each output value is [`IntSoftmax::max_error`].
#[derive(Debug, Clone)]
pub struct IntSoftmax {
    approximation: Approximation,
    input_scale: f32,
    row_len: usize,
    output_bits: u32,
    /// `2^bits - 1`.
    max_code: u64,
    /// `E`: fraction bits of the `exp` values.
    exp_bits: u32,
    exp: Exp,
    /// `exp` of every difference `-x`, `x = 0..=N`, where `N` is the first from which every
    /// difference gives the same value (the approximation saturates), and that value repeated
    /// to [`SOFTMAX_TABLE_MAX_LEN`] entries; `None` when `N` is not below it. The kernel's own
    /// results, so a lookup gives the same bits.
    table: Option<Box<[u64; SOFTMAX_TABLE_MAX_LEN]>>,
    use_table: bool,
    /// The normalisation's numerator, `(2^bits - 1) · 2^(E - 30 + 62 - bits)`, and the same
    /// as `f64` (exact: a 16-bit integer times a power of two).
    numerator: u128,
    numerator_f64: f64,
    isa: Isa,
}

#[derive(Debug, Clone)]
enum Exp {
    IBert(IBertExp),
    FixedPoint(FixedPointExp),
}

/// Output bits of the deployed softmax ([`IntSoftmax::deployed`]): its `i32` output at scale
/// `1 / (2^16 - 1)` is requantized by the quantizer after it (attention's `probs`).
pub const SOFTMAX_BITS: u32 = 16;

/// The scale of attention scores of codes at `query` and `key` over `d` features per head,
/// `s_q · s_k / √d`: the input scale of attention's softmax, in QAT and in the integer runtime.
pub fn attention_scale(query: f64, key: f64, d: usize) -> f64 {
    query * key / (d as f64).sqrt()
}

impl IntSoftmax {
    /// The softmax quant deploys: fixed point, into [`SOFTMAX_BITS`]-bit codes. The one
    /// constructor both the fake-quantized model (QAT) and the integer runtime call, so that
    /// they run the same kernel.
    ///
    /// # Errors
    /// As [`IntSoftmax::new`].
    pub fn deployed(input_scale: f32, row_len: usize) -> Result<IntSoftmax> {
        IntSoftmax::new(
            input_scale,
            row_len,
            SOFTMAX_BITS,
            Approximation::FixedPoint,
        )
    }

    /// Prepares softmax over rows of `row_len` codes at `input_scale`, into codes of
    /// `output_bits` bits.
    ///
    /// # Errors
    /// A scale that is not finite and positive, or above [`SOFTMAX_MAX_INPUT_SCALE`]
    /// ([`SOFTMAX_IBERT_MAX_INPUT_SCALE`] for I-BERT); a row length of 0 or above
    /// [`SOFTMAX_MAX_ROW_LEN`]; output bits outside `2..=16`.
    pub fn new(
        input_scale: f32,
        row_len: usize,
        output_bits: u32,
        approximation: Approximation,
    ) -> Result<IntSoftmax> {
        check_input_scale(
            "softmax",
            input_scale,
            f32::MIN_POSITIVE,
            [SOFTMAX_IBERT_MAX_INPUT_SCALE, SOFTMAX_MAX_INPUT_SCALE],
            approximation,
        )?;
        if !(1..=SOFTMAX_MAX_ROW_LEN).contains(&row_len) {
            return Err(QuantError::InvalidValue {
                what: "softmax row length".into(),
                value: row_len.to_string(),
                expected: format!("1..={SOFTMAX_MAX_ROW_LEN} values per row"),
            });
        }
        if !(2..=16).contains(&output_bits) {
            return Err(QuantError::InvalidBits { bits: output_bits });
        }
        let exp_bits = 61 - (row_len as u64).next_power_of_two().trailing_zeros();
        let exp = match approximation {
            Approximation::IBert => Exp::IBert(IBertExp::new(input_scale, exp_bits)),
            Approximation::FixedPoint => Exp::FixedPoint(FixedPointExp::new(input_scale, exp_bits)),
        };
        let table = match &exp {
            Exp::IBert(e) => table_of(e, e.saturation()),
            Exp::FixedPoint(e) => table_of(e, e.saturation()),
        };
        let max_code = (1u64 << output_bits) - 1;
        let up = exp_bits - FRACTION_BITS + normaliser_shift(output_bits);
        Ok(IntSoftmax {
            approximation,
            input_scale,
            row_len,
            output_bits,
            max_code,
            exp_bits,
            exp,
            use_table: table.is_some(),
            table,
            numerator: (max_code as u128) << up,
            numerator_f64: max_code as f64 * 2f64.powi(up as i32),
            isa: Isa::detected(),
        })
    }

    /// The same kernel taking `exp` from its table (`true`, the default where the input scale
    /// allows a table of at most [`SOFTMAX_TABLE_MAX_LEN`] entries) or evaluating it for every
    /// value (`false`): the same codes either way (tests and benchmarks use it to compare).
    pub fn with_exp_table(mut self, on: bool) -> IntSoftmax {
        self.use_table = on && self.table.is_some();
        self
    }

    /// Whether `exp` comes from a table (see [`IntSoftmax::with_exp_table`]).
    pub fn uses_exp_table(&self) -> bool {
        self.use_table
    }

    /// The same kernel on the path `isa` (tests and benchmarks use it to force a path; every
    /// path gives the same codes).
    ///
    /// # Errors
    /// A path this CPU cannot run.
    pub fn with_isa(mut self, isa: Isa) -> Result<IntSoftmax> {
        self.isa = isa.check_available()?;
        Ok(self)
    }

    /// The path it runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The approximation of `exp` it evaluates.
    pub fn approximation(&self) -> Approximation {
        self.approximation
    }

    /// The scale of the input codes.
    pub fn input_scale(&self) -> f32 {
        self.input_scale
    }

    /// Values per row.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Bits of the output codes.
    pub fn output_bits(&self) -> u32 {
        self.output_bits
    }

    /// The largest output code, `2^bits - 1` (probability 1).
    pub fn max_code(&self) -> u32 {
        self.max_code as u32
    }

    /// `1 / (2^bits - 1)`, rounded to `f32` (code `k` stands for `k / (2^bits - 1)` exactly;
    /// `k · output_scale` is within `2^-24` relative of it).
    pub fn output_scale(&self) -> f32 {
        (1.0 / self.max_code as f64) as f32
    }

    /// Always 0.
    pub fn output_zero_point(&self) -> i32 {
        0
    }

    /// A bound on `|code · output_scale - softmax(x)|` for every output of every row, with
    /// `x` the real inputs: the approximation's error ([`SOFTMAX_IBERT_MAX_ERROR`] `+`
    /// [`SOFTMAX_IBERT_SCALE_ERROR`]` · scale`, or [`SOFTMAX_FIXED_POINT_MAX_ERROR`]), half an
    /// output step, and the `f32` rounding of [`IntSoftmax::output_scale`].
    pub fn max_error(&self) -> f64 {
        let approximation = self.approximation.pick(
            SOFTMAX_IBERT_MAX_ERROR + SOFTMAX_IBERT_SCALE_ERROR * self.input_scale as f64,
            SOFTMAX_FIXED_POINT_MAX_ERROR,
        );
        approximation + 0.5 / self.max_code as f64 + f32::EPSILON as f64
    }

    /// Softmax of every row of `input` (whole rows of [`IntSoftmax::row_len`]) into `out`.
    ///
    /// # Errors
    /// `input` not whole rows, `out` not as long as `input`, or an output type too narrow for
    /// [`IntSoftmax::output_bits`] (`u8` holds up to 8 bits); nothing is written then.
    pub fn run<I: InputCode, O: OutputCode>(&self, input: &[I], out: &mut [O]) -> Result<()> {
        check_rows("softmax", self.row_len, input.len(), out.len())?;
        if O::MAX < self.max_code {
            return Err(QuantError::InvalidValue {
                what: "softmax output type".into(),
                value: std::any::type_name::<O>().into(),
                expected: format!(
                    "a type that holds {}-bit codes (u8 up to 8 bits, u16 up to 16, i32)",
                    self.output_bits
                ),
            });
        }
        match (&self.table, &self.exp) {
            (Some(table), _) if self.use_table => {
                softmax_rows(self.isa, self, &TableExp(table), input, out)
            }
            (_, Exp::IBert(exp)) => softmax_rows(self.isa, self, exp, input, out),
            (_, Exp::FixedPoint(exp)) => match exp.in_32_bits() {
                #[cfg(target_arch = "x86_64")]
                Some(exp) if self.isa.width() == Width::Avx2 => {
                    // At AVX2 width the compiler turns the 32-bit form's 32x32-bit products
                    // into emulated 64-bit ones; the written kernel keeps them one instruction.
                    let exp = x86::FixedPointExpAvx2::new(exp);
                    softmax_rows(self.isa, self, &exp, input, out)
                }
                Some(exp) => softmax_rows(self.isa, self, &exp, input, out),
                None => softmax_rows(self.isa, self, exp, input, out),
            },
        }
        Ok(())
    }

    /// What [`IntSoftmax::run`] computes, on real values: the softmax a fake-quantized model
    /// uses to agree with the integer runtime. `x` holds values on the input grid (`code ·
    /// input_scale`, as the fake-quantized model computes them; softmax ignores a zero point),
    /// each taken back to its code (`round(x / input_scale)`), the kernel runs on the codes, and
    /// `out` gets `code · output_scale` for each output code (16 bits at most, held in `i32`).
    ///
    /// # Errors
    /// `x` not whole rows, `out` not as long, or a value that is not finite (the error names
    /// its index); nothing is written then.
    pub fn simulate(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        check_rows("softmax", self.row_len, x.len(), out.len())?;
        simulate_rows(
            "softmax input",
            self.isa,
            (self.input_scale, 0),
            self.row_len,
            x,
            self.output_scale(),
            out,
            |codes, probs| self.run(codes, probs),
        )
    }

    /// A row's factor `⌊(2^bits - 1) · 2^(E - 30 + K) / sum⌋` (`sum ≥ 2^(E-1)`), for
    /// [`IntSoftmax::normaliser`].
    #[inline(always)]
    fn factor(&self, sum: u64) -> u64 {
        floor_div(self.numerator, self.numerator_f64, sum)
    }

    /// The per-row constants of `round(e · (2^bits - 1) / sum)` from the row's
    /// [`IntSoftmax::factor`].
    #[inline(always)]
    fn normaliser(&self, factor: u64) -> Normaliser {
        // With e' = e >> (E - 30) ≤ 2^30 and factor = ⌊(2^bits - 1) · 2^(E - 30 + K) / sum⌋ ≤
        // (2^bits - 1) · 2^(K - 29), the product e' · factor stays below 2^(bits + K + 1) =
        // 2^63 for K = 62 - bits. Dropping e's low bits moves a code by at most 2^(bits - 29),
        // the floor of the factor by at most e' / 2^K ≤ 2^-16.
        Normaliser {
            drop: self.exp_bits - FRACTION_BITS,
            // factor ≤ 2^33: its low 32 bits and the rest, so that e' · factor is two
            // 32x32→64-bit products, which vector units have, rather than a 64-bit one.
            factor_low: factor & 0xffff_ffff,
            factor_high: factor >> 32,
            shift: normaliser_shift(self.output_bits),
            max_code: self.max_code,
        }
    }
}

/// `K = 62 - bits`, the normalisation's fraction bits (see `IntSoftmax::normaliser`).
fn normaliser_shift(output_bits: u32) -> u32 {
    62 - output_bits
}

/// The table of `exp`'s values on every difference before it saturates at `saturation` (`N`
/// such that `exp(-x) = exp(-N)` for every `x ≥ N`; `None` if that does not fit `u64`; see
/// `IntSoftmax::table`), or `None` if that takes more than [`SOFTMAX_TABLE_MAX_LEN`] entries.
fn table_of<E: Exponential>(
    exp: &E,
    saturation: Option<u64>,
) -> Option<Box<[u64; SOFTMAX_TABLE_MAX_LEN]>> {
    let saturation = saturation.filter(|n| *n < SOFTMAX_TABLE_MAX_LEN as u64)? as usize;
    let mut table = Box::new([0u64; SOFTMAX_TABLE_MAX_LEN]);
    let (evaluated, saturated) = table.split_at_mut(saturation + 1);
    for (x, e) in evaluated.iter_mut().enumerate() {
        *e = exp.exp(-(x as i64));
    }
    // Every difference past the saturation is evaluated as the saturation (QAT builds a table
    // on every call, its scales being trained, and most of the table lies there).
    saturated.fill(evaluated[saturation]);
    Some(table)
}

/// `exp` from a table of its values: `table[min(-Δ, SOFTMAX_TABLE_MAX_LEN - 1)]` (a fixed
/// length, so that the lookup needs no bounds check).
struct TableExp<'a>(&'a [u64; SOFTMAX_TABLE_MAX_LEN]);

impl Exponential for TableExp<'_> {
    #[inline(always)]
    fn exp(&self, delta: i64) -> u64 {
        self.0[(delta.unsigned_abs() as usize).min(SOFTMAX_TABLE_MAX_LEN - 1)]
    }
}

compiled_for_each_width! {
    /// Every row of `input` into `out`, with `exp(Δ) · 2^E` given by `exp`.
    fn softmax_rows<I: InputCode, O: OutputCode, E: Exponential>(
        kernel: &IntSoftmax,
        exp: &E,
        input: &[I],
        out: &mut [O],
    ) => rows;
}

#[inline(always)]
fn rows<I: InputCode, O: OutputCode, E: Exponential>(
    kernel: &IntSoftmax,
    exp: &E,
    input: &[I],
    out: &mut [O],
) {
    let n = kernel.row_len;
    if n > STACK_ROW {
        for (row, out) in input.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            let max = row_max(row);
            let delta = |q: &I| q.code() as i64 - max;
            let sum = row.iter().map(|q| exp.exp(delta(q))).sum();
            let normalise = kernel.normaliser(kernel.factor(sum));
            for (o, q) in out.iter_mut().zip(row) {
                *o = O::from_code(normalise.code(exp.exp(delta(q))));
            }
        }
        return;
    }
    // Short rows go in blocks of up to STACK_ROW values, each step for every row of the block
    // before the next step: the rows' maxima, sums and divisions are independent, and a
    // block hands the CPU several to overlap instead of one row's chain of them at a time.
    let per_block = STACK_ROW / n;
    let mut stack = [0u64; STACK_ROW];
    let mut sums = [0u64; STACK_ROW];
    for (block, out) in input
        .chunks(per_block * n)
        .zip(out.chunks_mut(per_block * n))
    {
        let rows = block.len() / n;
        exp.exp_rows(block, n, &mut stack[..block.len()]);
        for (e, sum) in stack.chunks_exact(n).zip(&mut sums) {
            *sum = e.iter().sum();
        }
        // The divisions, one per row, back to back (they pipeline), then the normalisation.
        for sum in &mut sums[..rows] {
            *sum = kernel.factor(*sum);
        }
        for ((out, e), factor) in out
            .chunks_exact_mut(n)
            .zip(stack.chunks_exact(n))
            .zip(&sums[..rows])
        {
            let normalise = kernel.normaliser(*factor);
            for (o, e) in out.iter_mut().zip(e) {
                *o = O::from_code(normalise.code(*e));
            }
        }
    }
}

/// The largest code of a row (not empty). A fold of `max` rather than `Iterator::max`
/// (which keeps the last of equal elements and stayed a scalar loop): the compiler vectorises
/// it.
#[inline(always)]
fn row_max<I: InputCode>(row: &[I]) -> i64 {
    row.iter().fold(i32::MIN, |m, q| m.max(q.code())) as i64
}

/// `exp(Δ · scale) · 2^E` of a difference `Δ ≤ 0` of input codes, by one [`Approximation`].
trait Exponential {
    fn exp(&self, delta: i64) -> u64;

    /// `exp` of each code of `block` (whole rows of `n`, at most [`STACK_ROW`] codes) minus
    /// its row's largest, into `out`.
    #[inline(always)]
    fn exp_rows<I: InputCode>(&self, block: &[I], n: usize, out: &mut [u64]) {
        for (row, out) in block.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            let max = row_max(row);
            for (e, q) in out.iter_mut().zip(row) {
                *e = self.exp(q.code() as i64 - max);
            }
        }
    }
}

/// `⌊n / d⌋` for `d ≥ 1` and a quotient below `2^52` (`n_f64` is `n` as `f64`, exactly),
/// without a `u128` division or conversion (library calls, once per row): the `f64` quotient
/// is within `2^-52` relative of the true one, so within one of its floor, and whole steps of
/// the exact remainder (in `i128`, products only) correct it.
#[inline(always)]
fn floor_div(n: u128, n_f64: f64, d: u64) -> u64 {
    let mut q = (n_f64 / d as f64) as u64;
    let mut r = n as i128 - q as i128 * d as i128;
    while r < 0 {
        q -= 1;
        r += d as i128;
    }
    while r >= d as i128 {
        q += 1;
        r -= d as i128;
    }
    q
}

/// `round(e · (2^bits - 1) / sum)` for one row.
struct Normaliser {
    drop: u32,
    factor_low: u64,
    factor_high: u64,
    shift: u32,
    max_code: u64,
}

impl Normaliser {
    #[inline(always)]
    fn code(&self, e: u64) -> u64 {
        // e' < 2^31 and factor_low < 2^32: (e' · factor) in two 32x32→64-bit products.
        let e = (e >> self.drop) as u32 as u64;
        let product = e * self.factor_low + ((e * self.factor_high) << 32);
        // At most max_code without a clamp: e' · 2^drop ≤ e ≤ sum, so e' · factor ≤
        // (2^bits - 1) · 2^K, and adding half of 2^K does not reach the next multiple.
        let rounded = (product + (1 << (self.shift - 1))) >> self.shift;
        debug_assert!(rounded <= self.max_code);
        rounded
    }
}

/// `⌊a / l⌋` and `a mod l` for `0 ≤ a ≤ 64 · l`, `l < 2^31`, through `recip = ⌊2^56 / l⌋`:
/// `a · recip < 2^62`, and the estimate is low by at most one.
#[inline(always)]
fn div_rem(a: u64, l: u64, recip: u64) -> (u64, u64) {
    let z = (a * recip) >> 56;
    let r = a - z * l;
    let carry = (r >= l) as u64;
    (z + carry, r - carry * l)
}

/// I-BERT's `exp`: constants at the input scale (after a right shift of the codes for scales
/// below `2^-30`, where the squares would leave `i64`).
#[derive(Debug, Clone)]
struct IBertExp {
    /// Right shift of `Δ` that brings the scale to at least `2^-30`.
    pre_shift: u32,
    /// `⌈ln 2 / s⌉`: I-BERT's `-⌊-ln 2 / s⌋`.
    ln2: u64,
    recip: u64,
    /// `⌊1.353 / s⌋` and `⌊0.344 / (0.3585 · s²)⌋`: `exp(p) ≈ 0.3585 · s² · ((p + b)² + c)`.
    b: i64,
    c: i64,
    /// Left or right shift that puts `exp(0)` in `(2^(E-1), 2^E]`.
    up: u32,
    down: u32,
}

impl IBertExp {
    fn new(scale: f32, exp_bits: u32) -> IBertExp {
        let mut s = scale as f64;
        let mut pre_shift = 0;
        while s < 2f64.powi(-30) {
            s *= 2.0;
            pre_shift += 1;
        }
        let ln2 = (std::f64::consts::LN_2 / s).ceil() as u64;
        let b = (1.353 / s).floor() as i64;
        let c = (0.344 / (0.3585 * s * s)).floor() as i64;
        // exp(0): the polynomial rises on (-ln 2, 0] (its vertex, -1.353, lies left of it).
        let top = (b * b + c) as u64;
        let bits = 64 - top.leading_zeros();
        IBertExp {
            // Δ ≥ -2^32: a shift of 63 already gives ⌊Δ / 2^k⌋ ∈ {-1, 0} like any larger k.
            pre_shift: pre_shift.min(63),
            ln2,
            recip: (1u64 << 56) / ln2,
            b,
            c,
            up: exp_bits.saturating_sub(bits),
            down: bits.saturating_sub(exp_bits),
        }
    }
}

impl Exponential for IBertExp {
    #[inline(always)]
    fn exp(&self, delta: i64) -> u64 {
        let t = delta >> self.pre_shift;
        // z ≥ 64 shifts everything out: clamp so the division stays small.
        let a = ((-t) as u64).min(64 * self.ln2);
        let (z, r) = div_rem(a, self.ln2, self.recip);
        let p = self.b - r as i64; // p + b with p = -r ∈ (-ln 2, 0]
        let poly = (p * p + self.c) as u64;
        (poly << self.up) >> (z as u32 + self.down).min(63)
    }
}

impl IBertExp {
    /// From `x = 64 · ln2 · 2^pre_shift` on, `-t = ⌈x / 2^pre_shift⌉ ≥ 64 · ln2`, where `a` is
    /// clamped: every larger difference gives the same `exp` (see `table_of`).
    fn saturation(&self) -> Option<u64> {
        (64 * self.ln2).checked_mul(1u64.checked_shl(self.pre_shift)?)
    }
}

/// `ln 2 · 2^30`, `ln 2 / 2 · 2^30` (the middle of `(-ln 2, 0]`), rounded.
const LN2_FIXED: i64 = (std::f64::consts::LN_2 * ONE as f64 + 0.5) as i64;
/// `⌊2^56 / LN2_FIXED⌋`, for [`div_rem`].
const LN2_RECIPROCAL: u64 = (1u64 << 56) / LN2_FIXED as u64;
const HALF_LN2_FIXED: i64 = (std::f64::consts::LN_2 * 0.5 * ONE as f64 + 0.5) as i64;

/// `exp(m + u) = e^m · Σ uᵏ / k!`, `m = -ln 2 / 2`, `e^m = 1 / √2`: the Taylor coefficients
/// `2^30 / (√2 · k!)`, `k = 0..=6`, rounded. On `|u| ≤ ln 2 / 2` the remainder is at most
/// `(ln 2 / 2)^7 / 7! · e^(ln 2 / 2) < 1.7 · 10⁻⁷`, relative `< 3.4 · 10⁻⁷`.
const EXP_TAYLOR: [i64; 7] = {
    let mut c = [0i64; 7];
    let mut factorial = 1.0;
    let mut k = 0;
    while k < 7 {
        if k > 0 {
            factorial *= k as f64;
        }
        c[k] = (ONE as f64 * std::f64::consts::FRAC_1_SQRT_2 / factorial + 0.5) as i64;
        k += 1;
    }
    c
};

/// The fixed-point `exp`: `Δ · s` to the `2^-30` grid, then the Taylor polynomial.
#[derive(Debug, Clone)]
struct FixedPointExp {
    input: FixedPointInput,
    /// `-⌈64 · ln 2 / s⌉ - 1` codes: below this every `exp` is 0 anyway, and clamping here keeps
    /// `Δ · mantissa` and the fixed-point value small.
    delta_floor: i64,
    /// `E - 30`: the polynomial gives 30 fraction bits.
    up: u32,
}

impl FixedPointExp {
    fn new(scale: f32, exp_bits: u32) -> FixedPointExp {
        let floor = (64.0 * std::f64::consts::LN_2 / scale as f64).ceil() + 1.0;
        FixedPointExp {
            input: FixedPointInput::new(scale),
            delta_floor: -(floor.min((1u64 << 33) as f64) as i64),
            up: exp_bits - FRACTION_BITS,
        }
    }
}

impl Exponential for FixedPointExp32<'_> {
    #[inline(always)]
    fn exp(&self, delta: i64) -> u64 {
        let e = self.exp;
        // Δ ∈ [delta_floor, 0] and mantissa < 2^24: |n| < 2^55, and n ≤ 0.
        let d = self.clamped(delta);
        // Both factors sign-extended from 32 bits: one `vpmuldq`.
        let n = d as i64 * self.mantissa as i32 as i64;
        // round_shift(n, right) = ⌊(n + half) / 2^right⌋, biased by 2^62 to a logical shift.
        let t = ((((n + self.biased_half) as u64) >> e.input.right) as i64 - self.bias_quotient)
            << e.input.left;
        let a = ((-t) as u64).min(64 * LN2_FIXED as u64);
        // ⌊a / ln2⌋ from a / 64 (< 2^30) times ⌊2^56 / ln2⌋ (< 2^27): never above the true
        // quotient, and below it by less than 2^-20 + 2^-23, so one step corrects it; z ≤ 64
        // and ln2 < 2^30 multiply in 32 bits too.
        let mut z = (((a >> 6) as u32 as u64) * LN2_RECIPROCAL) >> 50;
        let mut r = a - (z as u32 as u64) * (LN2_FIXED as u32 as u64);
        let carry = (r >= LN2_FIXED as u64) as u64;
        z += carry;
        r -= carry * LN2_FIXED as u64;
        let u = HALF_LN2_FIXED - r as i64;
        let mut poly = EXP_TAYLOR[6];
        for c in EXP_TAYLOR[..6].iter().rev() {
            // As in `FixedPointExp::exp`; |poly · u| < 2^60, so biased by 2^60 the product is
            // non-negative and its floor shift a logical one.
            let product = (poly as i32 as i64) * (u as i32 as i64);
            poly = c + ((((product + (1 << 60)) as u64) >> FRACTION_BITS) as i64 - (1 << 30));
        }
        ((poly as u64) << e.up) >> z.min(63)
    }
}

impl Exponential for FixedPointExp {
    #[inline(always)]
    fn exp(&self, delta: i64) -> u64 {
        let t = self.input.apply(delta.max(self.delta_floor));
        let a = ((-t) as u64).min(64 * LN2_FIXED as u64);
        // `/` and `%` by a constant compile to a 128-bit product, which no vector unit has;
        // `div_rem`'s 64-bit one gives the same quotient and remainder.
        let (z, r) = div_rem(a, LN2_FIXED as u64, LN2_RECIPROCAL);
        let r = r as i64;
        // p = -r ∈ (-ln 2, 0]; u = p - m = ln 2 / 2 - r.
        let u = HALF_LN2_FIXED - r;
        let mut poly = EXP_TAYLOR[6];
        for c in EXP_TAYLOR[..6].iter().rev() {
            // |u| < 2^29, and 0 < poly < 2^31 (each step is a tail of the Taylor sum of
            // e^(m + u) ≤ 1 in units of 2^-30, at most 2^30 plus the floors' drift): both fit
            // i32, so the product is the same as in i64, and written so, it is one 32x32→64
            // multiply (`vpmuldq`), which AVX2 has, instead of a 64-bit one, which it lacks.
            debug_assert!(poly == poly as i32 as i64 && u == u as i32 as i64);
            poly = c + (((poly as i32 as i64) * (u as i32 as i64)) >> FRACTION_BITS);
        }
        ((poly as u64) << self.up) >> z.min(63)
    }
}

/// [`FixedPointExp`] where every clamped `Δ` fits `i32` (input scales above about `2^-25`), in
/// the same integers, each product written as a 32x32→64-bit multiply and each shift of a
/// possibly negative value biased to a logical one: AVX2 has those in its vectors, not 64-bit
/// products or arithmetic shifts (which it emulates in several instructions each).
struct FixedPointExp32<'a> {
    exp: &'a FixedPointExp,
    /// `Δ` clamped at or above this fits `i32`.
    delta_floor: i32,
    /// Below 2^24.
    mantissa: u32,
    /// `2^(right - 1)` (0 for no shift) plus `2^62`, and `2^(62 - right)`.
    biased_half: i64,
    bias_quotient: i64,
}

impl FixedPointExp32<'_> {
    /// `Δ` raised to `delta_floor`, where it fits `i32`.
    #[inline(always)]
    fn clamped(&self, delta: i64) -> i32 {
        delta.max(self.delta_floor as i64) as i32
    }
}

/// Not public API (re-exported in `quant_core::__internals`): the softmax's fixed-point `exp`
/// at one input scale, in both of its forms, for quant-core's tests to compare them.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct FixedPointExpForms(FixedPointExp);

impl FixedPointExpForms {
    /// The `exp` of input codes at scale `scale`, with `exp_bits` fraction bits (30 to 62).
    pub fn new(scale: f32, exp_bits: u32) -> FixedPointExpForms {
        FixedPointExpForms(FixedPointExp::new(scale, exp_bits))
    }

    /// Differences below this are evaluated as this one.
    pub fn delta_floor(&self) -> i64 {
        self.0.delta_floor
    }

    /// The 64-bit form's `exp` of a difference `Δ ≤ 0`.
    pub fn exp(&self, delta: i64) -> u64 {
        self.0.exp(delta)
    }

    /// The 32-bit form's, or `None` where that form does not apply (input scales below about
    /// `2^-25`).
    pub fn exp_in_32_bits(&self, delta: i64) -> Option<u64> {
        Some(self.0.in_32_bits()?.exp(delta))
    }

    /// The 32-bit form's written AVX2 kernel on every difference of `deltas` (each `≤ 0`), or
    /// `None` where the 32-bit form does not apply or this CPU lacks AVX2.
    pub fn exp_in_32_bits_avx2(&self, deltas: &[i64]) -> Option<Vec<u64>> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let exp = self.0.in_32_bits()?;
            let deltas: Vec<i32> = deltas.iter().map(|d| exp.clamped(*d)).collect();
            let mut out = vec![0; deltas.len()];
            // SAFETY: this CPU runs AVX2 (checked above).
            unsafe { x86::exp_avx2(&exp, &deltas, &mut out) };
            return Some(out);
        }
        let _ = deltas;
        None
    }
}

impl FixedPointExp {
    /// The same `exp` in 32-bit products where `Δ` fits `i32`.
    fn in_32_bits(&self) -> Option<FixedPointExp32<'_>> {
        let delta_floor = i32::try_from(self.delta_floor).ok()?;
        let mantissa = u32::try_from(self.input.mantissa).ok()?;
        let right = self.input.right;
        Some(FixedPointExp32 {
            exp: self,
            delta_floor,
            mantissa,
            biased_half: ((1i64 << right) >> 1) + (1 << 62),
            bias_quotient: 1i64 << (62 - right),
        })
    }

    /// Every `Δ` below `delta_floor` is evaluated as `delta_floor` (see `table_of`).
    fn saturation(&self) -> Option<u64> {
        Some(self.delta_floor.unsigned_abs())
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Exponential, FixedPointExp32, InputCode, STACK_ROW};
    use super::{EXP_TAYLOR, FRACTION_BITS, HALF_LN2_FIXED, LN2_FIXED, LN2_RECIPROCAL};
    use crate::int8::widths::{mul_epi32, mul_epu32, Width};
    use std::arch::x86_64::*;

    /// [`FixedPointExp32`] with its rows evaluated by [`exp_avx2`]; made only where this CPU
    /// runs AVX2.
    pub(super) struct FixedPointExpAvx2<'a>(FixedPointExp32<'a>);

    impl<'a> FixedPointExpAvx2<'a> {
        /// # Panics
        /// Where this CPU lacks AVX2 (callers check `Isa::width` first).
        pub(super) fn new(exp: FixedPointExp32<'a>) -> FixedPointExpAvx2<'a> {
            assert!(crate::int8::Isa::Avx2.width() == Width::Avx2);
            FixedPointExpAvx2(exp)
        }
    }

    impl Exponential for FixedPointExpAvx2<'_> {
        #[inline(always)]
        fn exp(&self, delta: i64) -> u64 {
            self.0.exp(delta)
        }

        #[inline(always)]
        fn exp_rows<I: InputCode>(&self, block: &[I], n: usize, out: &mut [u64]) {
            let mut deltas = [0i32; STACK_ROW];
            for (row, deltas) in block.chunks_exact(n).zip(deltas.chunks_exact_mut(n)) {
                let max = super::row_max(row);
                for (d, q) in deltas.iter_mut().zip(row) {
                    *d = self.0.clamped(q.code() as i64 - max);
                }
            }
            // SAFETY: `new` checked that this CPU runs AVX2.
            unsafe { exp_avx2(&self.0, &deltas[..block.len()], out) }
        }
    }

    /// `FixedPointExp32::exp` of every difference (each already clamped to its `delta_floor`)
    /// into `out`, four at a time in 64-bit lanes: the same integers, each step one
    /// instruction (`vpmuldq` reads the low 32 bits of a lane as signed by itself).
    ///
    /// # Safety
    /// The CPU runs AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn exp_avx2(exp: &FixedPointExp32, deltas: &[i32], out: &mut [u64]) {
        assert_eq!(deltas.len(), out.len());
        let e = exp.exp;
        let mantissa = _mm256_set1_epi64x(exp.mantissa as i64);
        let biased_half = _mm256_set1_epi64x(exp.biased_half);
        let bias_quotient = _mm256_set1_epi64x(exp.bias_quotient);
        let right = _mm_set_epi64x(0, e.input.right as i64);
        let left = _mm_set_epi64x(0, e.input.left as i64);
        let up = _mm_set_epi64x(0, e.up as i64);
        let cap = _mm256_set1_epi64x(64 * LN2_FIXED);
        let reciprocal = _mm256_set1_epi64x(LN2_RECIPROCAL as i64);
        let ln2 = _mm256_set1_epi64x(LN2_FIXED);
        let below_ln2 = _mm256_set1_epi64x(LN2_FIXED - 1);
        let half_ln2 = _mm256_set1_epi64x(HALF_LN2_FIXED);
        let product_bias = _mm256_set1_epi64x(1 << 60);
        let coefficients = EXP_TAYLOR.map(|c| _mm256_set1_epi64x(c));
        // The last step's `c - 2^30`: the product's bias taken back with the coefficient.
        let last = _mm256_set1_epi64x(EXP_TAYLOR[0] - (1 << FRACTION_BITS));
        let (chunks, tail) = deltas.as_chunks::<4>();
        for (i, d) in chunks.iter().enumerate() {
            // SAFETY: 4 `i32`s are 16 readable bytes.
            let d = unsafe { _mm_loadu_si128(d.as_ptr() as *const __m128i) };
            let d = _mm256_cvtepi32_epi64(d);
            let n = mul_epi32(d, mantissa);
            let t = _mm256_srl_epi64(_mm256_add_epi64(n, biased_half), right);
            let t = _mm256_sll_epi64(_mm256_sub_epi64(t, bias_quotient), left);
            // -t ≥ 0 and the cap below 2^36: a signed comparison orders them.
            let a = _mm256_sub_epi64(_mm256_setzero_si256(), t);
            let a = _mm256_blendv_epi8(a, cap, _mm256_cmpgt_epi64(a, cap));
            let z = _mm256_srli_epi64(mul_epu32(_mm256_srli_epi64(a, 6), reciprocal), 50);
            let r = _mm256_sub_epi64(a, mul_epu32(z, ln2));
            // All ones where r ≥ ln 2: one more for the quotient, one ln 2 less for r.
            let carry = _mm256_cmpgt_epi64(r, below_ln2);
            let z = _mm256_sub_epi64(z, carry);
            let r = _mm256_sub_epi64(r, _mm256_and_si256(carry, ln2));
            let u = _mm256_sub_epi64(half_ln2, r);
            // Each step reads only the low 32 bits of the one before (as the scalar form's
            // `as i32` does), and those are the same whether the shift is arithmetic or
            // logical: the steps before the last drop the scalar form's bias of 2^60, the last
            // keeps it, so that all 64 bits of the result are the scalar form's.
            let mut poly = coefficients[6];
            for c in coefficients[1..6].iter().rev() {
                let product = mul_epi32(poly, u);
                poly = _mm256_add_epi64(_mm256_srli_epi64(product, FRACTION_BITS as i32), *c);
            }
            let product = _mm256_add_epi64(mul_epi32(poly, u), product_bias);
            poly = _mm256_add_epi64(_mm256_srli_epi64(product, FRACTION_BITS as i32), last);
            // `>> z.min(63)` without the minimum: z ≤ 64, and poly · 2^up < 2^62 (poly < 2^31,
            // up ≤ 31) gives 0 shifted by 63, as `vpsrlvq` gives for a count of 64.
            let exp = _mm256_srlv_epi64(_mm256_sll_epi64(poly, up), z);
            // SAFETY: 4 `u64`s from `4i` lie in `out` (as long as `deltas`).
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(4 * i) as *mut __m256i, exp) };
        }
        let done = 4 * chunks.len();
        for (o, d) in out[done..].iter_mut().zip(tail) {
            *o = exp.exp(*d as i64);
        }
    }
}

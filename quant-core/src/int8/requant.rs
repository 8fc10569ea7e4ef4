//! Requantization: `i32` accumulators into the next layer's `u8` codes with a fixed-point
//! multiplier per output channel, rounded once, exactly, with any [`RoundingPolicy`].

use super::{check_len, Isa};
use crate::error::{QuantError, Result};
use crate::vocab::RoundingPolicy;

/// Largest right shift of a fixed-point multiplier: `|acc · m| < 2^62` and the rounding
/// offset `2^(shift-1)` then stay inside `i64`.
pub const MAX_SHIFT: u32 = 62;

/// `m · 2^-shift ≈ multiplier`, with `m` in `[2^30, 2^31)` (smaller only when the shift would
/// exceed [`MAX_SHIFT`], for multipliers below about `2^-32`, which round every accumulator to
/// zero anyway).
///
/// # Errors
/// A multiplier that is not finite and positive, or `2^31` or more (scales of consecutive
/// layers this far apart cannot be requantized).
pub fn fixed_point_multiplier(multiplier: f64) -> Result<(i64, u32)> {
    if !(multiplier.is_finite() && multiplier > 0.0) {
        return Err(QuantError::NonFinite {
            what: "requantization multiplier".into(),
            value: multiplier,
        });
    }
    // multiplier = f · 2^e with f in [0.5, 1).
    let mut e = multiplier.log2().floor() as i32 + 1;
    let mut f = multiplier / 2f64.powi(e);
    if f >= 1.0 {
        f /= 2.0;
        e += 1;
    }
    if f < 0.5 {
        f *= 2.0;
        e -= 1;
    }
    let mut m = (f * 2f64.powi(31)).round() as i64;
    if m == 1 << 31 {
        m = 1 << 30;
        e += 1;
    }
    let shift = 31 - e;
    if shift < 0 {
        return Err(QuantError::InvalidValue {
            what: "requantization multiplier".into(),
            value: multiplier.to_string(),
            expected: "a value below 2^31 (scales of consecutive layers this far apart cannot be requantized)".into(),
        });
    }
    if shift > MAX_SHIFT as i32 {
        // So small that every product rounds to zero; keep the shift representable.
        return Ok((m >> (shift - MAX_SHIFT as i32).min(63), MAX_SHIFT));
    }
    Ok((m, shift as u32))
}

/// `round(n / 2^shift)` with `policy`, in exact integer arithmetic.
#[inline]
pub fn rounding_shift(n: i64, shift: u32, policy: RoundingPolicy) -> i64 {
    if shift == 0 {
        return n;
    }
    let q = n >> shift;
    let rem = n - (q << shift);
    let half = 1i64 << (shift - 1);
    let up = match policy {
        RoundingPolicy::HalfEven => rem > half || (rem == half && q & 1 == 1),
        RoundingPolicy::HalfUp => rem >= half,
        RoundingPolicy::HalfDown => rem > half,
        RoundingPolicy::HalfAwayFromZero => {
            if n >= 0 {
                rem >= half
            } else {
                rem > half
            }
        }
        RoundingPolicy::HalfTowardZero => {
            if n >= 0 {
                rem > half
            } else {
                rem >= half
            }
        }
        RoundingPolicy::Floor => false,
        RoundingPolicy::Ceil => rem > 0,
    };
    q + up as i64
}

/// Requantizes accumulators `[rows, n]` (channel = column) into `u8` codes:
/// `out = clamp(rounding_shift(acc · m[o], shift[o], rounding) + zero_point, lo, hi)`, all in
/// stored (`u8`) units: a signed grid is stored offset by 128, its zero point and bounds
/// alike; a fused ReLU raises `lo` to the zero point. Exact for every policy; a layer that
/// requantizes every batch should build a [`Requantizer`] once instead.
///
/// # Errors
/// `multipliers.len() != n`, `acc` not whole rows of `n`, `out` not as long as `acc`, a
/// multiplier outside `[0, 2^31)` or a shift above [`MAX_SHIFT`], or bounds outside
/// `0 <= lo <= hi <= 255`. Nothing is written then.
#[allow(clippy::too_many_arguments)]
pub fn requantize_u8(
    acc: &[i32],
    n: usize,
    multipliers: &[(i64, u32)],
    zero_point: i32,
    lo: i32,
    hi: i32,
    rounding: RoundingPolicy,
    out: &mut [u8],
) -> Result<()> {
    check_len("requantization multipliers", n, multipliers.len())?;
    Requantizer::new(multipliers, zero_point, lo, hi, rounding)?.run(acc, out)
}

/// Values a [`Requantizer`] runs as one row at least: whole rows of its channels, repeated.
const LONG_ROW: usize = 256;

/// [`requantize_u8`] prepared once for a layer: validated multipliers and the per-channel
/// constants of the branch-free and vectorised paths, on a chosen instruction set.
///
/// Every policy is one formula, `round(p / 2^s) = (p + base + adjust(p)) >> s` with an
/// arithmetic shift of the exact product `p = acc · m`: `base` is 0 (floor), `2^s - 1`
/// (ceiling), `2^(s-1)` (half up) or `2^(s-1) - 1` (the other halves), and `adjust` is, for
/// halves to even, the parity bit `(p >> s) & 1`; away from zero, 1 when `p >= 0`; toward
/// zero, 1 when `p < 0` (all 0 when `s = 0`).
#[derive(Debug, Clone)]
pub struct Requantizer {
    isa: Isa,
    multipliers: Vec<(i64, u32)>,
    rounding: RoundingPolicy,
    /// Per channel, as `i64` lanes: `m`, `s`, `base`, and 1 (0 when `s` is 0) for `adjust`
    /// (repeated, channel after channel, to fill a row of about [`LONG_ROW`] values).
    m: Vec<i64>,
    shift: Vec<i64>,
    base: Vec<i64>,
    unit: Vec<i64>,
    adjust: Adjust,
    /// The AVX2 path's constants when every shift is at least 31 (see [`Narrow`]).
    narrow: Option<Narrow>,
    /// The AVX2 and AVX-512 paths' constants when the product can be taken in `f64` (see
    /// [`Float`]); boxed, so that a requantizer stays small beside the values that hold one.
    float: Option<Box<Float>>,
    /// The AVX-512 path's thresholds for a per-tensor requantizer into at most 16 codes (see
    /// [`Levels`]); boxed, as `float`.
    levels: Option<Box<Levels>>,
    zero_point: i32,
    lo: i32,
    hi: i32,
    /// What [`Requantizer::with_accumulator_bound`] was given, if called.
    accumulator_bound: Option<u64>,
}

/// Constants of the AVX2 path for requantizers whose every shift is at least 31 (multipliers
/// below 1, as almost every layer has) and whose zero point lies within `±2^30` (the bounds less
/// the zero point then fit `i32`): the rounded quotient then fits `i32`, so only the product and
/// the shift need 64-bit lanes, and AVX2's missing arithmetic 64-bit shift is
/// avoided by biasing the product by `2^62` (non-negative, as `|acc · m| < 2^62`) and shifting
/// logically: `(p + 2^62 + base + adjust) >> s = r + 2^(62 - s)`, whose low 32 bits less those
/// of `2^(62 - s)` are `r` exactly. Per 8 channels the 64-bit constants are stored even
/// channels first, then odd ones, the order in which `vpmuldq` takes them.
#[derive(Debug, Clone)]
struct Narrow {
    /// `m` per channel, in channel order.
    m: Vec<i32>,
    /// `s` per channel, even-odd order per 8 channels.
    shift: Vec<i64>,
    /// `2^62 + base` per channel, even-odd order per 8 channels.
    base: Vec<i64>,
    /// The low 32 bits of `2^(62 - s)` per channel, in channel order.
    bias: Vec<i32>,
}

impl Narrow {
    /// The constants for `shift.len()` lanes (whole groups of 8), or `None` when a shift is
    /// below 31 or the zero point beyond `±2^30`.
    fn new(m: &[i64], shift: &[i64], base: &[i64], zero_point: i32) -> Option<Narrow> {
        if shift.iter().any(|s| *s < 31) || zero_point.unsigned_abs() >= 1 << 30 {
            return None;
        }
        let whole = shift.len() - shift.len() % 8;
        let even_odd = |v: &[i64]| -> Vec<i64> {
            v[..whole]
                .chunks(8)
                .flat_map(|g| [g[0], g[2], g[4], g[6], g[1], g[3], g[5], g[7]])
                .collect()
        };
        let biased: Vec<i64> = base.iter().map(|b| b + (1 << 62)).collect();
        Some(Narrow {
            m: m[..whole].iter().map(|m| *m as i32).collect(),
            shift: even_odd(shift),
            base: even_odd(&biased),
            bias: shift[..whole]
                .iter()
                .map(|s| (1i64 << (62 - s)) as i32)
                .collect(),
        })
    }
}

/// Constants of the AVX2 and AVX-512 paths that take the product in `f64`:
/// `x = acc · (m · 2^-s)`, clamped to `[lo - zero point, hi - zero point]`, then rounded by
/// the policy. It gives the exact result wherever the policy is half to even, floor or
/// ceiling and every shift is at most `53 - e`, where `2^e` bounds the clamped range widened
/// by one (`|lo - zp|`, `|hi - zp|` plus 1): `acc` and `m · 2^-s` are exact in `f64` and the
/// product is correctly rounded, so an exact result that is an integer or half-integer in
/// that range comes out exactly, and any other exact result lies at least `2^-s` from them,
/// more than the product's rounding error (at most `2^(e - 54)`) can cross. Beyond the range
/// the product stays beyond it (rounding is monotone) and clamps alike.
///
/// With larger shifts it is still exact for accumulators within a bound `B` with
/// `B · max m < 2^53` (see [`Requantizer::with_accumulator_bound`]): the product `acc · m`
/// then has at most 53 bits, so `x` is exact, and so is its rounding. The kernels check the
/// bound as they go; a row with an accumulator beyond it takes the integer path.
#[derive(Debug, Clone)]
struct Float {
    /// `m · 2^-s` per channel (repeated like the other constants).
    scale: Vec<f64>,
    /// `Some(B)`: exact only for rows whose accumulators all lie within `±B`.
    bound: Option<u32>,
    /// The clamping bounds less the zero point.
    lo: f64,
    hi: f64,
    rounding: FloatRounding,
}

/// The rounding of [`Float`]'s path, as a number for a const generic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FloatRounding {
    /// `vcvtpd2dq` in the default rounding mode: half to even.
    HalfEven = 0,
    Floor = 1,
    Ceil = 2,
}

impl Float {
    /// The constants, or `None` where the path is not exact (see [`Float`]), for accumulators
    /// within `±accumulator_bound` where one is given.
    fn new(
        m: &[i64],
        shift: &[i64],
        zero_point: i32,
        [lo, hi]: [i32; 2],
        rounding: RoundingPolicy,
        accumulator_bound: Option<u64>,
    ) -> Option<Float> {
        let rounding = match rounding {
            RoundingPolicy::HalfEven => FloatRounding::HalfEven,
            RoundingPolicy::Floor => FloatRounding::Floor,
            RoundingPolicy::Ceil => FloatRounding::Ceil,
            _ => return None,
        };
        // The kernel adds the zero point in `i16` lanes (the clamped codes then lie within
        // 2^15 of it).
        if zero_point.unsigned_abs() >= 1 << 14 {
            return None;
        }
        let (lo, hi) = (lo as i64 - zero_point as i64, hi as i64 - zero_point as i64);
        let reach = lo.unsigned_abs().max(hi.unsigned_abs()) + 1;
        let e = 64 - (reach - 1).leading_zeros() as i64; // 2^e >= reach
        let bound = if shift.iter().all(|s| *s <= 53 - e) {
            None
        } else {
            let largest_m = m.iter().copied().max().unwrap_or(0).max(0) as u128;
            match accumulator_bound {
                Some(b) if b as u128 * largest_m < 1 << 53 => Some(b.min(u32::MAX as u64) as u32),
                _ => return None,
            }
        };
        Some(Float {
            bound,
            scale: m
                .iter()
                .zip(shift)
                .map(|(m, s)| *m as f64 * 2f64.powi(-(*s as i32)))
                .collect(),
            lo: lo as f64,
            hi: hi as f64,
            rounding,
        })
    }
}

/// A per-tensor requantizer into at most 16 codes as thresholds: the code is a monotone
/// (non-decreasing) step function of the accumulator (`m ≥ 0`; every policy rounds
/// monotonically; clamping keeps it so), so with `c₀` the code of `i32::MIN` and `Tⱼ` the least
/// accumulator whose code is at least `c₀ + j` (found with the definition itself),
/// `code(a) = c₀ + #{j : Tⱼ ≤ a}`: exact for every policy, shift and zero point. The count is
/// a binary search of four steps over the thresholds held in one register (`vpermd`): fewer
/// operations than the 64-bit products (which LayerNorm's and GELU's outputs into 4-bit grids
/// need, their shifts being beyond the `f64` path's reach) and than the `f64` path's
/// conversions. On AVX2 the same search (over two registers' worth of thresholds) takes more
/// operations than the `f64` path, so it runs only where that path is not exact.
#[derive(Debug, Clone, Copy)]
struct Levels {
    /// `Tⱼ` at `j` for `j` in `1..=steps`, `i32::MAX` above (`[0]` is never read).
    thresholds: [i32; 16],
    /// `c₀`.
    lowest: i32,
    /// How many thresholds there are: the code of `i32::MAX` less `c₀`.
    steps: i32,
}

impl Levels {
    /// The thresholds of `code` (one channel's requantization), where its codes span at most
    /// 16 values.
    fn new(code: impl Fn(i32) -> i32) -> Option<Levels> {
        let (lowest, highest) = (code(i32::MIN), code(i32::MAX));
        let steps = highest - lowest;
        if !(0..16).contains(&steps) {
            return None;
        }
        let mut thresholds = [i32::MAX; 16];
        for (j, t) in thresholds
            .iter_mut()
            .enumerate()
            .take(steps as usize + 1)
            .skip(1)
        {
            // The least `a` in (i32::MIN, i32::MAX] with `code(a) >= lowest + j`.
            let (mut below, mut at) = (i32::MIN as i64, i32::MAX as i64);
            while at - below > 1 {
                let mid = below + (at - below) / 2;
                if code(mid as i32) >= lowest + j as i32 {
                    at = mid;
                } else {
                    below = mid;
                }
            }
            *t = at as i32;
        }
        Some(Levels {
            thresholds,
            lowest,
            steps,
        })
    }
}

/// The data-dependent part of a rounding policy (see [`Requantizer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adjust {
    None = 0,
    Parity = 1,
    NonNegative = 2,
    Negative = 3,
}

impl Requantizer {
    /// Validates and prepares the constants for the fastest path this CPU has.
    ///
    /// # Errors
    /// See [`requantize_u8`].
    pub fn new(
        multipliers: &[(i64, u32)],
        zero_point: i32,
        lo: i32,
        hi: i32,
        rounding: RoundingPolicy,
    ) -> Result<Requantizer> {
        for (o, (m, shift)) in multipliers.iter().enumerate() {
            if !(0..1i64 << 31).contains(m) || *shift > MAX_SHIFT {
                return Err(QuantError::InvalidValue {
                    what: format!("requantization multiplier of channel {o}"),
                    value: format!("({m}, {shift})"),
                    expected: format!(
                        "m in [0, 2^31) and a shift of at most {MAX_SHIFT} (see fixed_point_multiplier)"
                    ),
                });
            }
        }
        if !(0 <= lo && lo <= hi && hi <= 255) {
            return Err(QuantError::InvalidRange {
                quant_min: lo,
                quant_max: hi,
                reason:
                    "u8 codes need 0 <= lo <= hi <= 255 (signed grids are stored offset by 128)",
            });
        }
        let (adjust, base): (Adjust, fn(i64, i64) -> i64) = match rounding {
            // (half = 2^(s-1), unit = 1 or 0 when s = 0)
            RoundingPolicy::Floor => (Adjust::None, |_, _| 0),
            RoundingPolicy::Ceil => (Adjust::None, |half, _| 2 * half - (half > 0) as i64),
            RoundingPolicy::HalfUp => (Adjust::None, |half, _| half),
            RoundingPolicy::HalfDown => (Adjust::None, |half, unit| half - unit),
            RoundingPolicy::HalfEven => (Adjust::Parity, |half, unit| half - unit),
            RoundingPolicy::HalfAwayFromZero => (Adjust::NonNegative, |half, unit| half - unit),
            RoundingPolicy::HalfTowardZero => (Adjust::Negative, |half, unit| half - unit),
        };
        let half = |s: u32| if s == 0 { 0 } else { 1i64 << (s - 1) };
        // The constants repeat, channel after channel, across rows of about LONG_ROW values, so
        // the vector path runs many rows of a few channels (or one per-tensor channel) in whole
        // registers rather than a short row at a time.
        let channels = multipliers.len().max(1);
        let lanes = channels * (LONG_ROW / channels).max(1);
        let per = |f: &dyn Fn(i64, u32) -> i64| -> Vec<i64> {
            multipliers
                .iter()
                .cycle()
                .take(lanes)
                .map(|(m, s)| f(*m, *s))
                .collect()
        };
        let (m, shift) = (per(&|m, _| m), per(&|_, s| s as i64));
        let base = per(&|_, s| base(half(s), (s > 0) as i64));
        let float = Float::new(&m, &shift, zero_point, [lo, hi], rounding, None).map(Box::new);
        let levels = match multipliers {
            [(m, shift)] => Levels::new(|a| {
                let r = rounding_shift(a as i64 * m, *shift, rounding);
                r.saturating_add(zero_point as i64)
                    .clamp(lo as i64, hi as i64) as i32
            })
            .map(Box::new),
            _ => None,
        };
        Ok(Requantizer {
            isa: Isa::detected(),
            multipliers: multipliers.to_vec(),
            rounding,
            narrow: Narrow::new(&m, &shift, &base, zero_point),
            float,
            levels,
            m,
            shift,
            base,
            unit: per(&|_, s| (s > 0) as i64),
            adjust,
            zero_point,
            lo,
            hi,
            accumulator_bound: None,
        })
    }

    /// The same requantizer on the path `isa` (tests and benchmarks use it to force a path).
    ///
    /// # Errors
    /// A path this CPU cannot run.
    pub fn with_isa(mut self, isa: Isa) -> Result<Requantizer> {
        self.isa = isa.check_available()?;
        Ok(self)
    }

    /// The same requantizer for accumulators the caller expects within `±bound` (a layer's
    /// bound from its weights and input codes): requantizers whose shifts are too large for
    /// the `f64` paths in general (small multipliers into narrow grids) then take them where
    /// `bound · m < 2^53`, the product being exact. Never less exact: a row holding an
    /// accumulator beyond the bound takes the integer path.
    pub fn with_accumulator_bound(mut self, bound: u64) -> Requantizer {
        self.accumulator_bound = Some(bound);
        if self.float.as_ref().is_none_or(|f| f.bound.is_some()) {
            self.float = Float::new(
                &self.m,
                &self.shift,
                self.zero_point,
                [self.lo, self.hi],
                self.rounding,
                Some(bound),
            )
            .map(Box::new);
        }
        self
    }

    /// This requantization of accumulators that went through a ReLU first: it gives
    /// `requantize(max(acc, 0))` for every `acc`. That is `requantize(acc)` with its lowest
    /// code raised to what 0 gives, the zero point within `[lo, hi]`: every multiplier is
    /// non-negative and every rounding policy maps 0 to 0 and never decreases, so accumulators
    /// below 0 give at most that code and the others are unchanged. On the same path, with
    /// the same accumulator bound.
    ///
    /// # Errors
    /// None in practice (the constants are this requantizer's, already valid).
    pub fn after_relu(&self) -> Result<Requantizer> {
        let lo = self.zero_point.clamp(self.lo, self.hi);
        let raised = Requantizer::new(
            &self.multipliers,
            self.zero_point,
            lo,
            self.hi,
            self.rounding,
        )?
        .with_isa(self.isa)?;
        Ok(match self.accumulator_bound {
            Some(bound) => raised.with_accumulator_bound(bound),
            None => raised,
        })
    }

    /// The path it runs on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Output channels (columns of the accumulators).
    pub fn channels(&self) -> usize {
        self.multipliers.len()
    }

    /// Requantizes `acc` (whole rows of [`Requantizer::channels`]) into `out`.
    ///
    /// # Errors
    /// `acc` not whole rows, or `out` not as long as `acc`; nothing is written then.
    pub fn run(&self, acc: &[i32], out: &mut [u8]) -> Result<()> {
        let n = self.channels();
        if (n == 0 && !acc.is_empty()) || (n > 0 && !acc.len().is_multiple_of(n)) {
            return Err(QuantError::LengthMismatch {
                what: format!("accumulators (whole rows of {n} channels)"),
                expected: acc.len().next_multiple_of(n.max(1)),
                actual: acc.len(),
            });
        }
        check_len("requantized codes", acc.len(), out.len())?;
        if n == 0 {
            return Ok(());
        }
        match self.adjust {
            Adjust::None => self.rows::<0>(acc, out),
            Adjust::Parity => self.rows::<1>(acc, out),
            Adjust::NonNegative => self.rows::<2>(acc, out),
            Adjust::Negative => self.rows::<3>(acc, out),
        }
        Ok(())
    }

    /// Every row: whole vectors on the vector path, the rest with the same formula in scalar
    /// code. `ADJUST` is an [`Adjust`] as a number. A row is one run of the repeated channel
    /// constants (see [`LONG_ROW`]).
    fn rows<const ADJUST: u8>(&self, acc: &[i32], out: &mut [u8]) {
        let n = self.m.len();
        for (acc, out) in acc.chunks(n).zip(out.chunks_mut(n)) {
            // `$kernel::<rounding, bounded>` for `float`'s rounding, as a number, and whether it
            // has a bound to check; on a row beyond the bound, `$integer` instead.
            #[cfg(target_arch = "x86_64")]
            macro_rules! by_rounding {
                ($kernel:ident, $float:expr, $integer:expr) => {{
                    let done = match ($float.rounding, $float.bound.is_some()) {
                        (FloatRounding::HalfEven, false) => {
                            x86::$kernel::<0, false>(self, $float, acc, out)
                        }
                        (FloatRounding::Floor, false) => {
                            x86::$kernel::<1, false>(self, $float, acc, out)
                        }
                        (FloatRounding::Ceil, false) => {
                            x86::$kernel::<2, false>(self, $float, acc, out)
                        }
                        (FloatRounding::HalfEven, true) => {
                            x86::$kernel::<0, true>(self, $float, acc, out)
                        }
                        (FloatRounding::Floor, true) => {
                            x86::$kernel::<1, true>(self, $float, acc, out)
                        }
                        (FloatRounding::Ceil, true) => {
                            x86::$kernel::<2, true>(self, $float, acc, out)
                        }
                    };
                    match done {
                        Some(done) => done,
                        None => $integer,
                    }
                }};
            }
            let done = match (self.isa, &self.levels, &self.float) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `new`/`with_isa` checked that this CPU runs AVX-512 F + BW.
                (Isa::Avx512Bw | Isa::Avx512Vnni, Some(levels), _) => unsafe {
                    x86::row_avx512_levels(levels, acc, out)
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above; `float`'s scales are one per channel, as many as `acc` and
                // `out` hold.
                (Isa::Avx512Bw | Isa::Avx512Vnni, None, Some(float)) => unsafe {
                    by_rounding!(
                        row_avx512_float,
                        float,
                        x86::row_avx512::<ADJUST>(self, acc, out)
                    )
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above; the constants have one entry per channel.
                (Isa::Avx512Bw | Isa::Avx512Vnni, None, None) => unsafe {
                    x86::row_avx512::<ADJUST>(self, acc, out)
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above, for AVX2.
                (Isa::Avx2 | Isa::AvxVnni, _, Some(float)) => unsafe {
                    by_rounding!(
                        row_avx2_float,
                        float,
                        match &self.narrow {
                            Some(narrow) => x86::row_avx2_narrow::<ADJUST>(self, narrow, acc, out),
                            None => x86::row_avx2::<ADJUST>(self, acc, out),
                        }
                    )
                },
                // The `f64` path, where it is exact, takes fewer operations than the search.
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above, for AVX2.
                (Isa::Avx2 | Isa::AvxVnni, Some(levels), None) => unsafe {
                    x86::row_avx2_levels(levels, acc, out)
                },
                #[cfg(target_arch = "x86_64")]
                (Isa::Avx2 | Isa::AvxVnni, _, None) => match &self.narrow {
                    // SAFETY: as above, for AVX2; `narrow`'s constants cover the whole groups
                    // of 8 of the repeated channels.
                    Some(narrow) => unsafe {
                        x86::row_avx2_narrow::<ADJUST>(self, narrow, acc, out)
                    },
                    // SAFETY: as above, for AVX2.
                    None => unsafe { x86::row_avx2::<ADJUST>(self, acc, out) },
                },
                _ => 0,
            };
            self.scalar::<ADJUST>(&acc[done..], &mut out[done..], done);
        }
    }

    /// Channels `first..` of one row, branch-free.
    #[inline]
    fn scalar<const ADJUST: u8>(&self, acc: &[i32], out: &mut [u8], first: usize) {
        let (zp, lo, hi) = (self.zero_point as i64, self.lo as i64, self.hi as i64);
        let constants = self.m[first..]
            .iter()
            .zip(&self.shift[first..])
            .zip(self.base[first..].iter().zip(&self.unit[first..]));
        for ((code, a), ((m, s), (base, unit))) in out.iter_mut().zip(acc).zip(constants) {
            let p = *a as i64 * m;
            let sign = (p >> 63) & 1;
            let adjust = match ADJUST {
                1 => (p >> s) & unit,
                2 => unit & !sign,
                3 => unit & sign,
                _ => 0,
            };
            let r = (p + base + adjust) >> s;
            *code = (r + zp).clamp(lo, hi) as u8;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Float, Levels, Narrow, Requantizer};

    /// One row on AVX-512 by [`Levels`]' thresholds, 16 values at a time: four steps of a
    /// binary search, each a `vpermd` of the thresholds at the candidate count and a compare.
    /// Returns how many values it did.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn row_avx512_levels(levels: &Levels, acc: &[i32], out: &mut [u8]) -> usize {
        let n = acc.len().min(out.len());
        let whole = n - n % 16;
        // SAFETY: `thresholds` holds 16 `i32`s, one register.
        let table = unsafe { _mm512_loadu_si512(levels.thresholds.as_ptr() as *const __m512i) };
        let (lowest, steps) = (
            _mm512_set1_epi32(levels.lowest),
            _mm512_set1_epi32(levels.steps),
        );
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + 16 <= whole <= acc.len()`: the 16 `i32`s from `o` lie in `acc`.
            let a = unsafe { _mm512_loadu_si512(acc.as_ptr().add(o) as *const __m512i) };
            let mut count = _mm512_setzero_si512();
            for step in [8, 4, 2, 1] {
                // `count` is a multiple of `2 · step`: or-ing adds.
                let candidate = _mm512_or_si512(count, _mm512_set1_epi32(step));
                let reached =
                    _mm512_cmpge_epi32_mask(a, _mm512_permutexvar_epi32(candidate, table));
                count = _mm512_mask_mov_epi32(count, reached, candidate);
            }
            // The padding (`i32::MAX`) counts only for `a = i32::MAX`, whose count is `steps`.
            let codes = _mm512_add_epi32(_mm512_min_epi32(count, steps), lowest);
            // SAFETY: `o + 16 <= whole <= out.len()`: the 16 bytes from `o` lie in `out`.
            unsafe {
                _mm_storeu_si128(
                    out.as_mut_ptr().add(o) as *mut __m128i,
                    _mm512_cvtepi32_epi8(codes),
                )
            };
            o += 16;
        }
        whole
    }

    /// One row on AVX2 by [`Levels`]' thresholds, 16 values at a time as two registers of 8:
    /// the same four-step search as [`row_avx512_levels`], whose 16 thresholds do not fit one
    /// 256-bit register, over the thresholds each step can reach laid out by its candidate
    /// (the middle one, then 2, 4 and 8 by the count so far, `vpermd`). Returns how many
    /// values it did.
    ///
    /// # Safety
    /// The CPU runs AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_avx2_levels(levels: &Levels, acc: &[i32], out: &mut [u8]) -> usize {
        let n = acc.len().min(out.len());
        let whole = n - n % 16;
        // `a >= Tⱼ` as `a > Tⱼ - 1`: thresholds lie in (i32::MIN, i32::MAX], so no wrap.
        let below = |j: usize| levels.thresholds[j] - 1;
        let middle = _mm256_set1_epi32(below(8));
        let quarters = _mm256_setr_epi32(below(4), below(12), 0, 0, 0, 0, 0, 0);
        let eighths = _mm256_setr_epi32(below(2), below(6), below(10), below(14), 0, 0, 0, 0);
        let odd = _mm256_setr_epi32(
            below(1),
            below(3),
            below(5),
            below(7),
            below(9),
            below(11),
            below(13),
            below(15),
        );
        let (lowest, steps) = (
            _mm256_set1_epi32(levels.lowest),
            _mm256_set1_epi32(levels.steps),
        );
        let eight = |at: usize| {
            // SAFETY: `at + 8 <= whole <= acc.len()`: the 8 `i32`s from `at` lie in `acc`.
            let a = unsafe { _mm256_loadu_si256(acc.as_ptr().add(at) as *const __m256i) };
            let step = |count: __m256i, threshold: __m256i, bit: i32| {
                let reached = _mm256_cmpgt_epi32(a, threshold);
                _mm256_or_si256(count, _mm256_and_si256(reached, _mm256_set1_epi32(bit)))
            };
            let count = step(_mm256_setzero_si256(), middle, 8);
            // The count so far, shifted, indexes the thresholds of the next candidates.
            let count = step(
                count,
                _mm256_permutevar8x32_epi32(quarters, _mm256_srli_epi32::<3>(count)),
                4,
            );
            let count = step(
                count,
                _mm256_permutevar8x32_epi32(eighths, _mm256_srli_epi32::<2>(count)),
                2,
            );
            let count = step(
                count,
                _mm256_permutevar8x32_epi32(odd, _mm256_srli_epi32::<1>(count)),
                1,
            );
            // The padding (`i32::MAX`) counts only for `a = i32::MAX`, whose count is `steps`.
            _mm256_add_epi32(_mm256_min_epi32(count, steps), lowest)
        };
        let mut o = 0;
        while o < whole {
            // SAFETY: the caller guarantees AVX2; codes lie in [0, 255].
            let bytes = unsafe { sixteen_codes(eight(o), eight(o + 8)) };
            // SAFETY: `o + 16 <= whole <= out.len()`: the 16 bytes from `o` lie in `out`.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().add(o) as *mut __m128i, bytes) };
            o += 16;
        }
        whole
    }

    /// Two registers of 8 codes (`i32` within [0, 255]) as 16 bytes in order.
    ///
    /// # Safety
    /// The CPU runs AVX2 (checked with `is_x86_feature_detected!`).
    #[inline(always)]
    unsafe fn sixteen_codes(first: __m256i, second: __m256i) -> __m128i {
        // SAFETY: the caller guarantees AVX2, all that these register-only intrinsics require.
        unsafe {
            // The saturating packs only narrow. They work within 128-bit halves, so the dwords
            // come out interleaved; `order` takes dword i of each half back in order.
            let words = _mm256_packus_epi32(first, second);
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words, words), order);
            _mm256_castsi256_si128(bytes)
        }
    }

    /// One row on AVX-512, 16 channels at a time (`vpmuldq` for the exact 64-bit products,
    /// `vpsravq` for the shifts): returns how many channels it did.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F and BW; `acc` and `out` hold one row of `q.channels()` or fewer.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn row_avx512<const ADJUST: u8>(
        q: &Requantizer,
        acc: &[i32],
        out: &mut [u8],
    ) -> usize {
        let n = acc.len().min(out.len()).min(q.m.len());
        let whole = n - n % 16;
        let bounds = [
            _mm512_set1_epi64(q.zero_point as i64),
            _mm512_set1_epi64(q.lo as i64),
            _mm512_set1_epi64(q.hi as i64),
        ];
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + 16 <= whole <= acc.len()`: the 16 `i32`s from `o` lie in `acc`.
            let a = unsafe { _mm512_loadu_si512(acc.as_ptr().add(o) as *const __m512i) };
            // SAFETY: the caller guarantees AVX-512 F, and `o + 16 <= n <= q.m.len()`, the
            // length of every constant vector `eight` reads.
            let first = unsafe { eight::<ADJUST>(q, o, _mm512_castsi512_si256(a), bounds) };
            // SAFETY: as above, for channels `o + 8..o + 16`.
            let second =
                unsafe { eight::<ADJUST>(q, o + 8, _mm512_extracti64x4_epi64::<1>(a), bounds) };
            // SAFETY: `o + 16 <= whole <= out.len()`: the 16 bytes from `o` lie in `out`.
            unsafe {
                _mm_storeu_si128(
                    out.as_mut_ptr().add(o) as *mut __m128i,
                    _mm_unpacklo_epi64(first, second),
                )
            };
            o += 16;
        }
        whole
    }

    /// Channels `o..o + 8` of [`row_avx512`] (`bounds`: zero point, lo, hi): 8 codes in the
    /// low 64 bits.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F (checked with `is_x86_feature_detected!`), and
    /// `o + 8 <= q.m.len()` (the length of every constant vector of `q`).
    #[inline(always)]
    unsafe fn eight<const ADJUST: u8>(
        q: &Requantizer,
        o: usize,
        a: __m256i,
        [zp, lo, hi]: [__m512i; 3],
    ) -> __m128i {
        let load = |v: &[i64]| {
            // SAFETY: the caller guarantees AVX-512 F and `o + 8 <= q.m.len()`; `v` is one of
            // `q`'s constant vectors, all as long as `q.m`: the 8 `i64`s from `o` lie in `v`.
            unsafe { _mm512_loadu_si512(v.as_ptr().add(o) as *const __m512i) }
        };
        let (m, s, base, unit) = (load(&q.m), load(&q.shift), load(&q.base), load(&q.unit));
        // SAFETY: the caller guarantees AVX-512 F, all that these register-only intrinsics
        // require.
        unsafe {
            // m < 2^31 and a sign-extended i32: the low halves multiply exactly.
            let p = _mm512_mul_epi32(_mm512_cvtepi32_epi64(a), m);
            let sign = _mm512_srli_epi64::<63>(p);
            let adjust = match ADJUST {
                1 => _mm512_and_si512(_mm512_srav_epi64(p, s), unit),
                2 => _mm512_andnot_si512(sign, unit),
                3 => _mm512_and_si512(sign, unit),
                _ => _mm512_setzero_si512(),
            };
            let r = _mm512_srav_epi64(_mm512_add_epi64(_mm512_add_epi64(p, base), adjust), s);
            let c = _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(r, zp), lo), hi);
            _mm512_cvtepi64_epi8(c)
        }
    }

    /// One row on AVX-512 with [`Float`] constants, 16 channels at a time (two registers of 8
    /// `f64`, rounded by `vcvtpd2dq` with the rounding mode in the instruction): returns how
    /// many channels it did, or `None` where `BOUNDED` and an accumulator lies beyond
    /// `float`'s bound (the codes written are then to be replaced). `ROUNDING` is a
    /// [`super::FloatRounding`] as a number.
    ///
    /// # Safety
    /// The CPU runs AVX-512 F and BW; `acc` and `out` hold one row of `q.channels()` or fewer;
    /// `float` is `q`'s.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn row_avx512_float<const ROUNDING: u8, const BOUNDED: bool>(
        q: &Requantizer,
        float: &Float,
        acc: &[i32],
        out: &mut [u8],
    ) -> Option<usize> {
        let n = acc.len().min(out.len()).min(float.scale.len());
        let whole = n - n % 16;
        // The largest magnitude seen, unsigned (`|i32::MIN|` is 2^31).
        let mut largest = _mm512_setzero_si512();
        let (lo, hi) = (_mm512_set1_pd(float.lo), _mm512_set1_pd(float.hi));
        let zp = _mm512_set1_epi32(q.zero_point);
        let eight = |at: usize| {
            // SAFETY: the caller guarantees AVX-512 F, and `at + 8 <= whole <= n`, within
            // `acc` and `float.scale`.
            unsafe {
                let a = _mm256_loadu_si256(acc.as_ptr().add(at) as *const __m256i);
                let x = _mm512_mul_pd(
                    _mm512_cvtepi32_pd(a),
                    _mm512_loadu_pd(float.scale.as_ptr().add(at)),
                );
                let x = _mm512_min_pd(_mm512_max_pd(x, lo), hi);
                match ROUNDING {
                    1 => {
                        _mm512_cvt_roundpd_epi32::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x)
                    }
                    2 => {
                        _mm512_cvt_roundpd_epi32::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(x)
                    }
                    _ => _mm512_cvt_roundpd_epi32::<
                        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                    >(x),
                }
            }
        };
        let mut o = 0;
        while o < whole {
            if BOUNDED {
                // SAFETY: `o + 16 <= whole <= acc.len()`: the 16 `i32`s from `o` lie in `acc`.
                let a = unsafe { _mm512_loadu_si512(acc.as_ptr().add(o) as *const __m512i) };
                largest = _mm512_max_epu32(largest, _mm512_abs_epi32(a));
            }
            // The clamped codes plus the zero point lie in [lo, hi] within [0, 255]: the
            // truncating narrowing only drops zero bits.
            let codes = _mm512_add_epi32(
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(eight(o)), eight(o + 8)),
                zp,
            );
            // SAFETY: `o + 16 <= whole <= out.len()`: the 16 bytes from `o` lie in `out`.
            unsafe {
                _mm_storeu_si128(
                    out.as_mut_ptr().add(o) as *mut __m128i,
                    _mm512_cvtepi32_epi8(codes),
                )
            };
            o += 16;
        }
        let bound = float.bound.unwrap_or(u32::MAX);
        (!BOUNDED || _mm512_reduce_max_epu32(largest) <= bound).then_some(whole)
    }

    /// One row on AVX2 with [`Float`] constants, 16 channels at a time: returns how many
    /// channels it did, or `None` as [`row_avx512_float`]. `ROUNDING` is a
    /// [`super::FloatRounding`] as a number.
    ///
    /// # Safety
    /// The CPU runs AVX2; `acc` and `out` hold one row of `q.channels()` or fewer; `float` is
    /// `q`'s.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_avx2_float<const ROUNDING: u8, const BOUNDED: bool>(
        q: &Requantizer,
        float: &Float,
        acc: &[i32],
        out: &mut [u8],
    ) -> Option<usize> {
        let n = acc.len().min(out.len()).min(float.scale.len());
        let whole = n - n % 16;
        // The largest magnitude seen, unsigned (`|i32::MIN|` is 2^31).
        let mut largest = _mm256_setzero_si256();
        let (lo, hi) = (_mm256_set1_pd(float.lo), _mm256_set1_pd(float.hi));
        // |zero point| < 2^14 (`Float::new`), so it, the clamped codes (within 2^14 + 255 of
        // 0) and their sums fit `i16`.
        let zp = _mm_set1_epi16(q.zero_point as i16);
        let four = |at: usize| {
            // SAFETY: the caller guarantees AVX2, and `at + 4 <= whole <= n`, within `acc`
            // and `float.scale`.
            unsafe {
                let a = _mm_loadu_si128(acc.as_ptr().add(at) as *const __m128i);
                let x = _mm256_mul_pd(
                    _mm256_cvtepi32_pd(a),
                    _mm256_loadu_pd(float.scale.as_ptr().add(at)),
                );
                let x = _mm256_min_pd(_mm256_max_pd(x, lo), hi);
                let x = match ROUNDING {
                    1 => _mm256_floor_pd(x),
                    2 => _mm256_ceil_pd(x),
                    // `vcvtpd2dq` rounds half to even in the default rounding mode, the one
                    // Rust code runs in.
                    _ => x,
                };
                _mm256_cvtpd_epi32(x)
            }
        };
        let mut o = 0;
        while o < whole {
            if BOUNDED {
                for at in [o, o + 8] {
                    // SAFETY: `at + 8 <= whole <= acc.len()`: the 8 `i32`s from `at` lie in
                    // `acc`.
                    let a = unsafe { _mm256_loadu_si256(acc.as_ptr().add(at) as *const __m256i) };
                    largest = _mm256_max_epu32(largest, _mm256_abs_epi32(a));
                }
            }
            // The clamped codes fit `i16`: the signed pack only narrows; plus the zero point
            // they lie in [lo, hi] within [0, 255].
            let words = |at: usize| _mm_add_epi16(_mm_packs_epi32(four(at), four(at + 4)), zp);
            let bytes = _mm_packus_epi16(words(o), words(o + 8));
            // SAFETY: `o + 16 <= whole <= out.len()`: the 16 bytes from `o` lie in `out`.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().add(o) as *mut __m128i, bytes) };
            o += 16;
        }
        let mut lanes = [0u32; 8];
        // SAFETY: `lanes` holds 8 `u32`s, one register.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, largest) };
        let bound = float.bound.unwrap_or(u32::MAX);
        (!BOUNDED || lanes.iter().all(|l| *l <= bound)).then_some(whole)
    }

    /// `a >> s` per 64-bit lane, arithmetic (AVX2 has only the logical `vpsrlvq`).
    ///
    /// # Safety
    /// The CPU runs AVX2 (checked with `is_x86_feature_detected!`).
    #[inline(always)]
    unsafe fn sra64(a: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2, all that these register-only intrinsics require.
        unsafe {
            let sign = _mm256_cmpgt_epi64(_mm256_setzero_si256(), a);
            _mm256_xor_si256(_mm256_srlv_epi64(_mm256_xor_si256(a, sign), s), sign)
        }
    }

    /// One row on AVX2, 8 channels at a time: returns how many channels it did.
    ///
    /// # Safety
    /// The CPU runs AVX2; `acc` and `out` hold one row of `q.channels()` or fewer.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_avx2<const ADJUST: u8>(
        q: &Requantizer,
        acc: &[i32],
        out: &mut [u8],
    ) -> usize {
        let n = acc.len().min(out.len()).min(q.m.len());
        let whole = n - n % 8;
        let bounds = [
            _mm256_set1_epi64x(q.zero_point as i64),
            _mm256_set1_epi64x(q.lo as i64),
            _mm256_set1_epi64x(q.hi as i64),
        ];
        let mut o = 0;
        while o < whole {
            // SAFETY: `o + 8 <= whole <= acc.len()`: the 8 `i32`s from `o` lie in `acc`.
            let a = unsafe { _mm256_loadu_si256(acc.as_ptr().add(o) as *const __m256i) };
            // SAFETY: the caller guarantees AVX2, and `o + 8 <= n <= q.m.len()`, the length of
            // every constant vector `four` reads.
            let first = unsafe { four::<ADJUST>(q, o, _mm256_castsi256_si128(a), bounds) };
            // SAFETY: as above, for channels `o + 4..o + 8`.
            let second =
                unsafe { four::<ADJUST>(q, o + 4, _mm256_extracti128_si256::<1>(a), bounds) };
            // Every value is in [0, 255]: the saturating packs only narrow.
            let words = _mm_packus_epi32(first, second);
            let bytes = _mm_packus_epi16(words, words);
            // SAFETY: `o + 8 <= whole <= out.len()`: the 8 bytes from `o` lie in `out`.
            unsafe { _mm_storel_epi64(out.as_mut_ptr().add(o) as *mut __m128i, bytes) };
            o += 8;
        }
        whole
    }

    /// Channels `o..o + 4` of [`row_avx2`] (`bounds`: zero point, lo, hi): 4 codes as `i32`.
    ///
    /// # Safety
    /// The CPU runs AVX2 (checked with `is_x86_feature_detected!`), and `o + 4 <= q.m.len()`
    /// (the length of every constant vector of `q`).
    #[inline(always)]
    unsafe fn four<const ADJUST: u8>(
        q: &Requantizer,
        o: usize,
        a: __m128i,
        [zp, lo, hi]: [__m256i; 3],
    ) -> __m128i {
        let load = |v: &[i64]| {
            // SAFETY: the caller guarantees AVX2 and `o + 4 <= q.m.len()`; `v` is one of `q`'s
            // constant vectors, all as long as `q.m`: the 4 `i64`s from `o` lie in `v`.
            unsafe { _mm256_loadu_si256(v.as_ptr().add(o) as *const __m256i) }
        };
        let (m, s, base, unit) = (load(&q.m), load(&q.shift), load(&q.base), load(&q.unit));
        // SAFETY: the caller guarantees AVX2, all that these register-only intrinsics (and
        // `sra64`) require.
        unsafe {
            let p = _mm256_mul_epi32(_mm256_cvtepi32_epi64(a), m);
            let sign = _mm256_srli_epi64::<63>(p);
            let adjust = match ADJUST {
                1 => _mm256_and_si256(sra64(p, s), unit),
                2 => _mm256_andnot_si256(sign, unit),
                3 => _mm256_and_si256(sign, unit),
                _ => _mm256_setzero_si256(),
            };
            let r = sra64(_mm256_add_epi64(_mm256_add_epi64(p, base), adjust), s);
            let c = _mm256_add_epi64(r, zp);
            let c = _mm256_blendv_epi8(c, lo, _mm256_cmpgt_epi64(lo, c));
            let c = _mm256_blendv_epi8(c, hi, _mm256_cmpgt_epi64(c, hi));
            // The low halves of the four lanes, in order, in the low 128 bits.
            let evens = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
            _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(c, evens))
        }
    }

    /// One row on AVX2 with [`Narrow`] constants, 16 channels at a time: returns how many
    /// channels it did.
    ///
    /// # Safety
    /// The CPU runs AVX2; `acc` and `out` hold one row of `q.channels()` or fewer; `narrow` is
    /// `q`'s.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_avx2_narrow<const ADJUST: u8>(
        q: &Requantizer,
        narrow: &Narrow,
        acc: &[i32],
        out: &mut [u8],
    ) -> usize {
        let n = acc.len().min(out.len()).min(narrow.m.len());
        let whole = n - n % 16;
        // Clamping before adding the zero point keeps every step inside `i32`.
        let bounds = [
            _mm256_set1_epi32(q.lo - q.zero_point),
            _mm256_set1_epi32(q.hi - q.zero_point),
            _mm256_set1_epi32(q.zero_point),
        ];
        let mut o = 0;
        while o < whole {
            // SAFETY: the caller guarantees AVX2, and `o + 16 <= whole <= n`, within `acc`
            // and every constant vector of `narrow` (`eight_narrow` reads 8 lanes from `o`
            // and from `o + 8`); every code is in [0, 255].
            let bytes = unsafe {
                sixteen_codes(
                    eight_narrow::<ADJUST>(narrow, o, acc, bounds),
                    eight_narrow::<ADJUST>(narrow, o + 8, acc, bounds),
                )
            };
            // SAFETY: `o + 16 <= whole <= out.len()`: the 16 bytes from `o` lie in `out`.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().add(o) as *mut __m128i, bytes) };
            o += 16;
        }
        whole
    }

    /// Channels `o..o + 8` of [`row_avx2_narrow`] (`bounds`: lo and hi less the zero point,
    /// the zero point): 8 codes as `i32`, in channel order.
    ///
    /// # Safety
    /// The CPU runs AVX2 (checked with `is_x86_feature_detected!`), and `o + 8` is at most
    /// `acc.len()` and the length of `narrow`'s constant vectors.
    #[inline(always)]
    unsafe fn eight_narrow<const ADJUST: u8>(
        narrow: &Narrow,
        o: usize,
        acc: &[i32],
        [lo, hi, zp]: [__m256i; 3],
    ) -> __m256i {
        // SAFETY: the caller guarantees `o + 8 <= acc.len()` and `o + 8` within `narrow`'s
        // vectors, so each load reads 8 `i32`s or two runs of 4 `i64`s inside its slice; and
        // AVX2, all that the register-only intrinsics require.
        unsafe {
            let load = |p: *const i32| _mm256_loadu_si256(p as *const __m256i);
            let load64 =
                |v: &[i64], at: usize| _mm256_loadu_si256(v.as_ptr().add(at) as *const __m256i);
            let a = load(acc.as_ptr().add(o));
            let m = load(narrow.m.as_ptr().add(o));
            // `vpmuldq` multiplies the low `i32` of each 64-bit lane: the even channels, then
            // the odd ones moved down.
            let even = _mm256_mul_epi32(a, m);
            let odd = _mm256_mul_epi32(_mm256_srli_epi64::<32>(a), _mm256_srli_epi64::<32>(m));
            let quotient = |p: __m256i, at: usize| {
                // The shifts lie in 31..=62; masked to 0..=63 all the same, so that the
                // compiler knows them in range: it otherwise guards each `vpsrlvq` with a
                // compare and a mask (a shift past 63 gives 0), three more instructions.
                let s = _mm256_and_si256(load64(&narrow.shift, at), _mm256_set1_epi64x(63));
                let one = _mm256_set1_epi64x(1);
                // Bit s of p is the parity of floor(p / 2^s); bit 63 its sign.
                let adjust = match ADJUST {
                    1 => _mm256_and_si256(_mm256_srlv_epi64(p, s), one),
                    2 => _mm256_andnot_si256(_mm256_srli_epi64::<63>(p), one),
                    3 => _mm256_srli_epi64::<63>(p),
                    _ => _mm256_setzero_si256(),
                };
                let biased =
                    _mm256_add_epi64(_mm256_add_epi64(p, load64(&narrow.base, at)), adjust);
                _mm256_srlv_epi64(biased, s)
            };
            let (even, odd) = (quotient(even, o), quotient(odd, o + 4));
            // The low 32 bits of each quotient, back in channel order.
            let biased = _mm256_blend_epi32::<0b1010_1010>(even, _mm256_slli_epi64::<32>(odd));
            let r = _mm256_sub_epi32(biased, load(narrow.bias.as_ptr().add(o)));
            _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(r, lo), hi), zp)
        }
    }
}

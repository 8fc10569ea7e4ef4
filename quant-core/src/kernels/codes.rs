//! Integer codes: quantizing to integer storage types and dequantizing back, with the same
//! arithmetic as fake quantization (`dequantize(quantize(x))` equals it bit for bit).

use std::marker::PhantomData;

use super::driver::{drive, Unary, Walk};
use super::params::{affines, check_len, Affine, Grid, Path};
use super::round::{clamp, small_int, Round};
use crate::error::{QuantError, Result};
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// Integer types quantized values are stored in.
pub trait QuantInt: Copy + Default + Send + Sync + std::fmt::Debug + PartialEq + 'static {
    /// Smallest value.
    const MIN: i32;
    /// Largest value.
    const MAX: i32;
    /// Name for error messages.
    const NAME: &'static str;
    /// Converts an integer-valued float already inside `[MIN, MAX]`.
    fn from_f32(v: f32) -> Self;
    /// Widens to i32.
    fn to_i32(self) -> i32;
    /// Converts an integer already inside `[MIN, MAX]` (exact, unlike [`QuantInt::from_f32`]
    /// above `2^24`).
    fn from_i32(v: i32) -> Self {
        Self::from_f32(v as f32)
    }
    /// `(self - zero_point)` as `f32`: the exact integer difference, rounded once.
    fn minus_zero_point(self, zero_point: i32) -> f32 {
        (self.to_i32() as i64 - zero_point as i64) as f32
    }
}

macro_rules! quant_int {
    ($t:ty, $narrow:literal) => {
        impl QuantInt for $t {
            const MIN: i32 = <$t>::MIN as i32;
            const MAX: i32 = <$t>::MAX as i32;
            const NAME: &'static str = stringify!($t);
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i32(self) -> i32 {
                self as i32
            }
            #[inline(always)]
            fn from_i32(v: i32) -> Self {
                // In range by contract: the plain cast is exact (and vectorises as a pack).
                v as $t
            }
            #[inline(always)]
            fn minus_zero_point(self, zero_point: i32) -> f32 {
                if $narrow {
                    // Vectorises (cvtdq2ps), where an i64 difference does not: the zero point
                    // splits into its low 16 bits, whose difference with a narrow code has at
                    // most 18 bits, and the rest, a multiple of 2^16 with at most 16
                    // significant bits. Both are exact in f32, so their f32 difference is the
                    // exact difference rounded once, for any zero point (a plain i32
                    // difference overflows for zero points near i32::MIN).
                    let low = zero_point & 0xFFFF;
                    (self as i32 - low) as f32 - (zero_point - low) as f32
                } else {
                    (self as i64 - zero_point as i64) as f32
                }
            }
        }
    };
}
quant_int!(i8, true);
quant_int!(u8, true);
quant_int!(i16, true);
quant_int!(u16, true);
quant_int!(i32, false);

/// `q = R(clamp(x * (1/s), lo, hi)) + z`, stored as `T`.
struct Quantize<T, R>(PhantomData<(T, R)>);

impl<T: QuantInt, R: Round> Unary for Quantize<T, R> {
    type In = f32;
    type Out = T;
    #[inline(always)]
    fn apply(&self, x: f32, p: &Affine) -> T {
        T::from_i32(small_int(
            R::round(clamp(x * p.inv, p.lo, p.hi)) + p.zero_point,
        ))
    }
}

/// `y = (q - z) * s`.
struct Dequantize<T>(PhantomData<T>);

impl<T: QuantInt> Unary for Dequantize<T> {
    type In = T;
    type Out = f32;
    #[inline(always)]
    fn apply(&self, q: T, p: &Affine) -> f32 {
        q.minus_zero_point(p.zero_point_i) * p.scale
    }
}

/// Quantizes to integers: `q = clamp(round(x * (1/scale)) + zero_point, quant_min, quant_max)`
/// stored as `T`.
///
/// # Errors
/// See [`fake_quantize_affine_into`](super::fake_quantize_affine_into); also a grid that does
/// not fit `T`, or a NaN in `x` (the index of the first one is reported).
#[allow(clippy::too_many_arguments)]
pub fn quantize_into<T: QuantInt>(
    x: &[f32],
    q: &mut [T],
    layout: ChannelLayout,
    scales: &[f32],
    zero_points: &[i32],
    quant_min: i32,
    quant_max: i32,
    rounding: RoundingPolicy,
) -> Result<()> {
    check_len("x", layout.numel(), x.len())?;
    check_len("q", x.len(), q.len())?;
    if quant_min < T::MIN || quant_max > T::MAX {
        return Err(QuantError::InvalidRange {
            quant_min,
            quant_max,
            reason: match T::NAME {
                "i8" => "does not fit the i8 storage [-128, 127]",
                "u8" => "does not fit the u8 storage [0, 255]",
                "i16" => "does not fit the i16 storage [-32768, 32767]",
                "u16" => "does not fit the u16 storage [0, 65535]",
                _ => "does not fit the storage type",
            },
        });
    }
    // A branch-free scan first (vectorises; `position` alone does not), then the index.
    let any_nan = x
        .chunks(4096)
        .any(|c| c.iter().fold(false, |acc, v| acc | v.is_nan()));
    let first_nan = if any_nan {
        x.iter().position(|v| v.is_nan())
    } else {
        None
    };
    if let Some(i) = first_nan {
        return Err(QuantError::NonFinite {
            what: format!("x[{i}] (NaN cannot be quantized to an integer)"),
            value: f64::NAN,
        });
    }
    let grid = Grid::new(layout, scales, zero_points, quant_min, quant_max, rounding);
    grid.run(|path, params| match path {
        Path::Fast(walk) => with_rounding!(rounding, R => {
            drive(&Quantize::<T, R>(PhantomData), (x, q), &walk, layout.channels);
        }),
        Path::Exact => {
            for (i, (qi, xi)) in q.iter_mut().zip(x).enumerate() {
                let p = &params[layout.channel_of(i)];
                // PyTorch's quantize_val: `clamp(int64(z + round(x * (1/s))))`; NaN was rejected.
                let code = (p.zero_point + rounding.round(*xi * p.inv)) as i64;
                *qi = T::from_i32(code.clamp(quant_min as i64, quant_max as i64) as i32);
            }
        }
    })?;
    Ok(())
}

/// Dequantizes integers: `y = (q - zero_point) * scale`, computed as PyTorch does (the integer
/// difference, then one f32 multiplication), so `dequantize(quantize(x))` equals fake
/// quantization bit for bit.
///
/// # Errors
/// Lengths that do not match the layout, or invalid scales / zero points. Values of `q` outside
/// `[quant_min, quant_max]` are not an error: they dequantize by the same formula.
#[allow(clippy::too_many_arguments)]
pub fn dequantize_into<T: QuantInt>(
    q: &[T],
    y: &mut [f32],
    layout: ChannelLayout,
    scales: &[f32],
    zero_points: &[i32],
    quant_min: i32,
    quant_max: i32,
) -> Result<()> {
    check_len("q", layout.numel(), q.len())?;
    check_len("y", q.len(), y.len())?;
    let params = affines(scales, zero_points, quant_min, quant_max, layout.channels)?;
    if q.is_empty() {
        return Ok(());
    }
    let walk = Walk::new(layout, &params);
    drive(
        &Dequantize::<T>(PhantomData),
        (q, y),
        &walk,
        layout.channels,
    );
    Ok(())
}

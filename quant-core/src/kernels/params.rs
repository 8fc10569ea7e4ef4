//! Validated per-channel constants of an affine grid, and the argument checks every kernel
//! family shares.

use crate::error::{QuantError, Result};
use crate::grid::{check_scale, is_valid_scale};

/// Largest `|quant_min|`, `|quant_max|`, `|quant_min - zero_point|`, `|quant_max - zero_point|`
/// the fast path handles.
const FAST_LIMIT: i64 = 1 << 21;

/// The per-channel constants of an affine grid: `y = R(clamp(x * inv, lo, hi)) * scale`
/// where `lo = quant_min - zero_point`, `hi = quant_max - zero_point`. (`Default`, all zeros,
/// is for kernels that carry their own constants.)
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Affine {
    pub scale: f32,
    pub inv: f32,
    pub lo: f32,
    pub hi: f32,
    pub zero_point: f32,
    /// The zero point as given (PyTorch's `int64` arithmetic on the slow paths).
    pub zero_point_i: i32,
    /// The range as floats (the LSQ backward compares `round(x/s + z)` with them).
    pub quant_min: f32,
    pub quant_max: f32,
}

pub(super) fn check_range(quant_min: i32, quant_max: i32) -> Result<()> {
    if quant_min > quant_max {
        return Err(QuantError::InvalidRange {
            quant_min,
            quant_max,
            reason: "quant_min must not exceed quant_max",
        });
    }
    Ok(())
}

pub(super) fn check_len(what: &str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(QuantError::LengthMismatch {
            what: what.into(),
            expected,
            actual,
        });
    }
    Ok(())
}

/// One channel's constants, unchecked (see [`affines`]).
#[inline(always)]
fn affine(scale: f32, zero_point: i32, quant_min: i32, quant_max: i32) -> Affine {
    Affine {
        scale,
        // PyTorch: `float inv_scale = 1.0f / scale;` and a multiplication, never a division.
        inv: 1.0 / scale,
        lo: (quant_min as i64 - zero_point as i64) as f32,
        hi: (quant_max as i64 - zero_point as i64) as f32,
        zero_point: zero_point as f32,
        zero_point_i: zero_point,
        quant_min: quant_min as f32,
        quant_max: quant_max as f32,
    }
}

/// Why channel `channel` of `channels` has no valid constants.
#[cold]
fn affine_error(
    scale: f32,
    zero_point: i32,
    quant_min: i32,
    quant_max: i32,
    channel: usize,
    channels: usize,
) -> QuantError {
    let what = if channels == 1 {
        String::new()
    } else {
        format!("channel {channel}: ")
    };
    if let Err(e) = check_scale(scale, || format!("{what}scale")) {
        return e;
    }
    QuantError::InvalidZeroPoint {
        what: format!("{what}zero_point"),
        value: zero_point as f64,
        quant_min,
        quant_max,
    }
}

/// Every channel's constants, checked: one scale and one zero point per channel.
pub(super) fn affines(
    scales: &[f32],
    zero_points: &[i32],
    quant_min: i32,
    quant_max: i32,
    channels: usize,
) -> Result<Vec<Affine>> {
    check_range(quant_min, quant_max)?;
    for (what, len) in [("scales", scales.len()), ("zero_points", zero_points.len())] {
        check_len(what, channels, len)?;
    }
    // A plain loop: collecting per-channel `Result`s cost more than the kernel itself on
    // weight tensors of a few hundred channels, twice per training step.
    let mut params = Vec::with_capacity(scales.len());
    for (c, (s, z)) in scales.iter().zip(zero_points).enumerate() {
        if !(is_valid_scale(*s) && (quant_min..=quant_max).contains(z)) {
            return Err(affine_error(*s, *z, quant_min, quant_max, c, channels));
        }
        params.push(affine(*s, *z, quant_min, quant_max));
    }
    Ok(params)
}

/// Whether the range and every channel's bounds fit the exact fast rounding.
pub(super) fn fast_path(params: &[Affine], quant_min: i32, quant_max: i32) -> bool {
    let fits = |v: i64| v.abs() < FAST_LIMIT;
    fits(quant_min as i64)
        && fits(quant_max as i64)
        && params
            .iter()
            .all(|p| fits(p.lo as i64) && fits(p.hi as i64))
}

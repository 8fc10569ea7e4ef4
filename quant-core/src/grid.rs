//! The integer grid and quantization parameters, and the exact formulas that turn a threshold
//! or a range into a scale and zero point.

use serde::{Deserialize, Serialize};

use crate::error::{QuantError, Result};
use crate::vocab::QuantizationMethod;

/// The smallest scale any formula here produces: a constant or all-zero tensor still gets a
/// finite, positive scale.
pub const MIN_SCALE: f32 = f32::EPSILON;

/// An integer grid: bit width, signedness and narrow range. Always valid once constructed.
///
/// Signed: `[-2^(b-1), 2^(b-1)-1]`, or `[-2^(b-1)+1, 2^(b-1)-1]` with `narrow_range`.
/// Unsigned: `[0, 2^b-1]`, or `[0, 2^b-2]` with `narrow_range`.
///
/// ```
/// use quant_core::IntegerGrid;
/// let g = IntegerGrid::new(8, true, true).unwrap();
/// assert_eq!((g.quant_min(), g.quant_max()), (-127, 127));
/// assert!(IntegerGrid::new(17, true, false).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "GridRepr", into = "GridRepr")]
pub struct IntegerGrid {
    bits: u32,
    signed: bool,
    narrow_range: bool,
}

serde_via_new!(IntegerGrid as GridRepr {
    bits: u32,
    signed: bool,
    #[serde(default)]
    narrow_range: bool,
});

impl IntegerGrid {
    /// Smallest supported bit width.
    pub const MIN_BITS: u32 = 2;
    /// Largest supported bit width.
    pub const MAX_BITS: u32 = 16;

    /// Creates a grid.
    ///
    /// # Errors
    /// [`QuantError::InvalidBits`] unless `2 <= bits <= 16`.
    pub const fn new(bits: u32, signed: bool, narrow_range: bool) -> Result<IntegerGrid> {
        if bits < Self::MIN_BITS || bits > Self::MAX_BITS {
            return Err(QuantError::InvalidBits { bits });
        }
        Ok(IntegerGrid {
            bits,
            signed,
            narrow_range,
        })
    }

    /// Signed 8-bit, full range: `[-128, 127]`.
    pub const INT8: IntegerGrid = IntegerGrid {
        bits: 8,
        signed: true,
        narrow_range: false,
    };
    /// Unsigned 8-bit: `[0, 255]`.
    pub const UINT8: IntegerGrid = IntegerGrid {
        bits: 8,
        signed: false,
        narrow_range: false,
    };

    /// Bit width.
    pub const fn bits(self) -> u32 {
        self.bits
    }
    /// Whether the grid has negative values.
    pub const fn signed(self) -> bool {
        self.signed
    }
    /// Whether the most negative (signed) or largest (unsigned) value is dropped.
    pub const fn narrow_range(self) -> bool {
        self.narrow_range
    }

    /// Lowest integer on the grid.
    pub const fn quant_min(self) -> i32 {
        if self.signed {
            let m = -(1i32 << (self.bits - 1));
            if self.narrow_range {
                m + 1
            } else {
                m
            }
        } else {
            0
        }
    }

    /// Highest integer on the grid.
    pub const fn quant_max(self) -> i32 {
        if self.signed {
            (1i32 << (self.bits - 1)) - 1
        } else if self.narrow_range {
            (1i32 << self.bits) - 2
        } else {
            (1i32 << self.bits) - 1
        }
    }

    /// Number of levels, `quant_max - quant_min + 1`.
    pub const fn levels(self) -> u32 {
        (self.quant_max() - self.quant_min() + 1) as u32
    }

    /// The same grid with another signedness.
    pub const fn with_signed(self, signed: bool) -> IntegerGrid {
        IntegerGrid { signed, ..self }
    }

    /// The divisor that turns a power-of-two threshold into a power-of-two scale (see
    /// [`power_of_two_scale`]): `2^(b-1)` signed and `2^b` unsigned, whatever the narrow range
    /// (NVIDIA's `2^(b-1)-1` would make the scale `2^k / 127`, not a power of two).
    pub const fn power_of_two_divisor(self) -> f32 {
        if self.signed {
            (1u32 << (self.bits - 1)) as f32
        } else {
            (1u32 << self.bits) as f32
        }
    }

    /// The divisor that turns a symmetric threshold `T` into a scale (see [`symmetric_scale`]).
    pub const fn threshold_divisor(self) -> f32 {
        if self.signed {
            // |quant_min|: 2^(b-1) (MCT), or 2^(b-1)-1 with narrow range (NVIDIA's amax/127).
            (-self.quant_min()) as f32
        } else {
            // 2^b (MCT's unsigned convention); narrow range keeps the same threshold meaning.
            (1u32 << self.bits) as f32
        }
    }
}

/// Scales and zero points, per tensor (one each) or per channel.
///
/// Invariants (checked by [`QParams::new`] and on deserialisation): at least one scale; as
/// many zero points as scales; scales finite and `> 0`; a per-tensor `QParams` has no axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "QParamsRepr", into = "QParamsRepr")]
pub struct QParams {
    scales: Vec<f32>,
    zero_points: Vec<i32>,
    axis: Option<usize>,
}

serde_via_new!(QParams as QParamsRepr {
    scales: Vec<f32>,
    zero_points: Vec<i32>,
    #[serde(default)]
    axis: Option<usize>,
});

impl QParams {
    /// Creates per-tensor (`axis = None`, one scale) or per-channel parameters.
    ///
    /// # Errors
    /// Empty or mismatched lengths, several scales without an axis, or a scale that is not
    /// finite and positive.
    pub fn new(scales: Vec<f32>, zero_points: Vec<i32>, axis: Option<usize>) -> Result<QParams> {
        if scales.is_empty() {
            return Err(QuantError::LengthMismatch {
                what: "scales".into(),
                expected: 1,
                actual: 0,
            });
        }
        if zero_points.len() != scales.len() {
            return Err(QuantError::LengthMismatch {
                what: "zero_points".into(),
                expected: scales.len(),
                actual: zero_points.len(),
            });
        }
        if axis.is_none() && scales.len() != 1 {
            return Err(QuantError::LengthMismatch {
                what: "scales (per-tensor parameters have no axis)".into(),
                expected: 1,
                actual: scales.len(),
            });
        }
        for (i, s) in scales.iter().enumerate() {
            check_scale(*s, || format!("scales[{i}]"))?;
        }
        Ok(QParams {
            scales,
            zero_points,
            axis,
        })
    }

    /// One scale and zero point for the whole tensor.
    pub fn per_tensor(scale: f32, zero_point: i32) -> Result<QParams> {
        QParams::new(vec![scale], vec![zero_point], None)
    }

    /// One scale and zero point per channel along `axis`.
    pub fn per_channel(axis: usize, scales: Vec<f32>, zero_points: Vec<i32>) -> Result<QParams> {
        QParams::new(scales, zero_points, Some(axis))
    }

    /// The scales (one per channel, or one).
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// The zero points (one per channel, or one).
    pub fn zero_points(&self) -> &[i32] {
        &self.zero_points
    }
    /// The channel axis of per-channel parameters.
    pub fn axis(&self) -> Option<usize> {
        self.axis
    }
    /// Number of channels (1 per tensor).
    pub fn channels(&self) -> usize {
        self.scales.len()
    }
    /// Whether the parameters are per channel.
    pub fn is_per_channel(&self) -> bool {
        self.axis.is_some()
    }

    /// Checks that every zero point lies on `grid`.
    pub fn check_zero_points(&self, grid: IntegerGrid) -> Result<()> {
        for (i, z) in self.zero_points.iter().enumerate() {
            if *z < grid.quant_min() || *z > grid.quant_max() {
                return Err(QuantError::InvalidZeroPoint {
                    what: format!("zero_points[{i}]"),
                    value: *z as f64,
                    quant_min: grid.quant_min(),
                    quant_max: grid.quant_max(),
                });
            }
        }
        Ok(())
    }

    /// Parameters of `method` on `grid` for per-channel (or per-tensor, one entry) ranges
    /// `[mins[c], maxs[c]]`, following [`qparams_from_range`].
    pub fn from_ranges(
        method: QuantizationMethod,
        grid: IntegerGrid,
        mins: &[f32],
        maxs: &[f32],
        axis: Option<usize>,
    ) -> Result<QParams> {
        if mins.len() != maxs.len() {
            return Err(QuantError::LengthMismatch {
                what: "range maxima".into(),
                expected: mins.len(),
                actual: maxs.len(),
            });
        }
        let mut scales = Vec::with_capacity(mins.len());
        let mut zps = Vec::with_capacity(mins.len());
        for (lo, hi) in mins.iter().zip(maxs) {
            let (s, z) = qparams_from_range(method, grid, *lo, *hi)?;
            scales.push(s);
            zps.push(z);
        }
        QParams::new(scales, zps, axis)
    }
}

/// What [`check_scale`] accepts: finite and at least the smallest normal `f32`.
#[inline(always)]
pub(crate) fn is_valid_scale(s: f32) -> bool {
    s.is_finite() && s >= f32::MIN_POSITIVE
}

/// Checks that a scale is finite, positive and normal (so its reciprocal is finite too).
pub(crate) fn check_scale(s: f32, what: impl FnOnce() -> String) -> Result<()> {
    if is_valid_scale(s) {
        Ok(())
    } else {
        Err(QuantError::InvalidScale {
            what: what(),
            value: s,
        })
    }
}

fn check_finite(v: f32, what: &str) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(QuantError::NonFinite {
            what: what.to_string(),
            value: v as f64,
        })
    }
}

/// Symmetric scale from a threshold: `s = T / 2^(b-1)` on a signed grid (MCT), which with
/// `narrow_range` becomes `T / (2^(b-1)-1)` (NVIDIA's `amax / 127`); `s = T / 2^b` on an
/// unsigned grid (MCT). The threshold is floored so the scale is at least [`MIN_SCALE`].
///
/// # Errors
/// A threshold that is NaN or infinite.
pub fn symmetric_scale(threshold: f32, grid: IntegerGrid) -> Result<f32> {
    check_finite(threshold, "threshold")?;
    Ok((threshold.abs() / grid.threshold_divisor()).max(MIN_SCALE))
}

/// Rounds a threshold up to a power of two, `2^ceil(log2 T)` (thresholds below
/// `2^-126` become `2^-126`).
///
/// # Errors
/// A threshold that is NaN or infinite.
pub fn power_of_two_threshold(threshold: f32) -> Result<f32> {
    check_finite(threshold, "threshold")?;
    let t = threshold.abs().max(f32::MIN_POSITIVE);
    let mut p = 2f32.powi(t.log2().ceil() as i32);
    // log2 is not exact near powers of two: correct by one step either way.
    if p < t {
        p *= 2.0;
    }
    if p / 2.0 >= t {
        p /= 2.0;
    }
    Ok(p)
}

/// The PowerOfTwo scale for threshold `T`: `T` rounded up to a power of two
/// ([`power_of_two_threshold`]), divided by [`IntegerGrid::power_of_two_divisor`], so the scale
/// is a power of two on every grid, narrow range included (which then drops the code
/// `-2^(b-1)`: the largest magnitude is `(2^(b-1)-1)·s`). At least [`MIN_SCALE`].
///
/// # Errors
/// A threshold that is NaN or infinite, or whose power of two overflows `f32`.
pub fn power_of_two_scale(threshold: f32, grid: IntegerGrid) -> Result<f32> {
    check_finite(threshold, "threshold")?;
    let divisor = grid.power_of_two_divisor();
    let t = power_of_two_threshold(threshold.abs().max(MIN_SCALE * divisor))?;
    let s = t / divisor;
    if !s.is_finite() {
        return Err(QuantError::NonFinite {
            what: "power-of-two threshold".into(),
            value: f64::from(t),
        });
    }
    Ok(s)
}

/// MCT's uniform (asymmetric) parameters for the range `[min, max]` on `grid`: the range is
/// widened to contain 0, `s = (max - min) / (quant_max - quant_min)` (floored at
/// [`MIN_SCALE`]), and the zero point `z = round_half_even(quant_min - min / s)` clamped to the
/// grid, so 0 is exactly representable.
///
/// # Errors
/// A range end that is NaN or infinite.
pub fn uniform_qparams(min: f32, max: f32, grid: IntegerGrid) -> Result<(f32, i32)> {
    check_finite(min, "range min")?;
    check_finite(max, "range max")?;
    let lo = min.min(max).min(0.0);
    let hi = max.max(min).max(0.0);
    let span = (grid.quant_max() - grid.quant_min()) as f32;
    let s = ((hi - lo) / span).max(MIN_SCALE);
    let z = (grid.quant_min() as f32 - lo / s).round_ties_even();
    let z = z.clamp(grid.quant_min() as f32, grid.quant_max() as f32) as i32;
    Ok((s, z))
}

/// Scale and zero point of `method` on `grid` for values in `[min, max]`:
/// Symmetric uses the threshold `max(|min|, |max|)` ([`symmetric_scale`]); PowerOfTwo rounds
/// that threshold up to a power of two ([`power_of_two_scale`]); Uniform uses
/// [`uniform_qparams`].
pub fn qparams_from_range(
    method: QuantizationMethod,
    grid: IntegerGrid,
    min: f32,
    max: f32,
) -> Result<(f32, i32)> {
    check_finite(min, "range min")?;
    check_finite(max, "range max")?;
    let threshold = min.abs().max(max.abs());
    match method {
        QuantizationMethod::Symmetric => Ok((symmetric_scale(threshold, grid)?, 0)),
        QuantizationMethod::PowerOfTwo => Ok((power_of_two_scale(threshold, grid)?, 0)),
        QuantizationMethod::Uniform => uniform_qparams(min, max, grid),
    }
}

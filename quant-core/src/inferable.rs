//! Inferable quantizers: what a trained quantizer becomes for deployment. Plain serde data
//! (method, grid, rounding, scales and zero points) that quantizes to integers and
//! dequantizes without dfdx.

use serde::{Deserialize, Serialize};

use crate::error::{QuantError, Result};
use crate::grid::{IntegerGrid, QParams};
use crate::kernels::{self, QuantInt};
use crate::quantizer::ChannelLayout;
use crate::vocab::{QuantizationMethod, RoundingPolicy};

/// A deployable quantizer: symmetric, power-of-two or uniform, per tensor or per channel.
///
/// Invariants, checked by [`InferableQuantizer::new`] and on deserialisation: zero points lie on
/// the grid; Symmetric and PowerOfTwo have zero points 0 and a signed grid, or an unsigned grid
/// (for non-negative activations); PowerOfTwo scales are powers of two.
///
/// ```
/// use quant_core::{InferableQuantizer, IntegerGrid, QParams, QuantizationMethod, RoundingPolicy};
/// let q = InferableQuantizer::new(
///     QuantizationMethod::Symmetric,
///     IntegerGrid::INT8,
///     RoundingPolicy::HalfEven,
///     QParams::per_tensor(0.5, 0).unwrap(),
/// ).unwrap();
/// let ints: Vec<i8> = q.quantize(&[1.0, -0.74, 100.0], &[3]).unwrap();
/// assert_eq!(ints, vec![2, -1, 127]);
/// assert_eq!(q.dequantize(&ints, &[3]).unwrap(), vec![1.0, -0.5, 63.5]);
/// let json = serde_json::to_string(&q).unwrap();
/// assert_eq!(serde_json::from_str::<InferableQuantizer>(&json).unwrap(), q);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "InferableRepr", into = "InferableRepr")]
pub struct InferableQuantizer {
    method: QuantizationMethod,
    grid: IntegerGrid,
    rounding: RoundingPolicy,
    qparams: QParams,
}

serde_via_new!(InferableQuantizer as InferableRepr {
    method: QuantizationMethod,
    grid: IntegerGrid,
    #[serde(default)]
    rounding: RoundingPolicy,
    qparams: QParams,
});

/// The signature the kernels of an affine grid share: `(input, out, layout, scales,
/// zero_points, quant_min, quant_max, rounding)`.
type AffineKernel<I, O> =
    fn(&[I], &mut [O], ChannelLayout, &[f32], &[i32], i32, i32, RoundingPolicy) -> Result<()>;

impl InferableQuantizer {
    /// Creates an inferable quantizer, checking the invariants listed on the type.
    ///
    /// # Errors
    /// Zero points off the grid; a symmetric method with a non-zero zero point; a PowerOfTwo
    /// scale that is not a power of two.
    pub fn new(
        method: QuantizationMethod,
        grid: IntegerGrid,
        rounding: RoundingPolicy,
        qparams: QParams,
    ) -> Result<Self> {
        qparams.check_zero_points(grid)?;
        if method.is_symmetric() {
            if let Some(i) = qparams.zero_points().iter().position(|z| *z != 0) {
                return Err(QuantError::InvalidZeroPoint {
                    what: format!("zero_points[{i}] of a {method} quantizer (must be 0)"),
                    value: qparams.zero_points()[i] as f64,
                    quant_min: 0,
                    quant_max: 0,
                });
            }
        }
        if method == QuantizationMethod::PowerOfTwo {
            for (i, s) in qparams.scales().iter().enumerate() {
                if s.to_bits() & 0x007f_ffff != 0 {
                    return Err(QuantError::InvalidValue {
                        what: format!("scales[{i}] of a PowerOfTwo quantizer"),
                        value: s.to_string(),
                        expected: "a power of two (such as 0.25, 0.5, 1 or 2)".into(),
                    });
                }
            }
        }
        Ok(InferableQuantizer {
            method,
            grid,
            rounding,
            qparams,
        })
    }

    /// The grid layout.
    pub fn method(&self) -> QuantizationMethod {
        self.method
    }
    /// The integer grid.
    pub fn grid(&self) -> IntegerGrid {
        self.grid
    }
    /// The rounding policy.
    pub fn rounding(&self) -> RoundingPolicy {
        self.rounding
    }
    /// Scales and zero points.
    pub fn qparams(&self) -> &QParams {
        &self.qparams
    }

    /// The layout of a tensor of `shape` for these parameters.
    ///
    /// # Errors
    /// The channel axis is outside `shape` or its size differs from the number of channels.
    pub fn layout(&self, shape: &[usize]) -> Result<ChannelLayout> {
        let layout = ChannelLayout::new(shape, self.qparams.axis())?;
        if layout.channels != self.qparams.channels() {
            return Err(QuantError::LengthMismatch {
                what: format!(
                    "channels along axis {:?} of shape {shape:?}",
                    self.qparams.axis()
                ),
                expected: self.qparams.channels(),
                actual: layout.channels,
            });
        }
        Ok(layout)
    }

    /// Quantizes `x` (of `shape`) to integers stored as `T` (`i8`, `u8`, `i16`, `u16`, `i32`).
    ///
    /// # Errors
    /// A shape that does not match `x` or the parameters, a grid that does not fit `T`, or a
    /// NaN in `x`.
    pub fn quantize<T: QuantInt>(&self, x: &[f32], shape: &[usize]) -> Result<Vec<T>> {
        self.run(kernels::quantize_into::<T>, x, shape)
    }

    /// Dequantizes integers `q` (of `shape`): `(q - zero_point) * scale`.
    ///
    /// # Errors
    /// A shape that does not match `q` or the parameters.
    pub fn dequantize<T: QuantInt>(&self, q: &[T], shape: &[usize]) -> Result<Vec<f32>> {
        // Dequantizing rounds nothing.
        self.run(
            |q, y, layout, s, z, lo, hi, _| kernels::dequantize_into(q, y, layout, s, z, lo, hi),
            q,
            shape,
        )
    }

    /// Quantizes and dequantizes in one pass (equal to `dequantize(quantize(x))`, NaN aside,
    /// which propagates here).
    ///
    /// # Errors
    /// A shape that does not match `x` or the parameters.
    pub fn fake_quantize(&self, x: &[f32], shape: &[usize]) -> Result<Vec<f32>> {
        self.run(kernels::fake_quantize_affine_into, x, shape)
    }

    /// Runs `kernel` ([`kernels::quantize_into`], [`kernels::dequantize_into`] or
    /// [`kernels::fake_quantize_affine_into`]) with this quantizer's parameters on `input` (of
    /// `shape`), into a fresh buffer.
    fn run<I, O: Clone + Default>(
        &self,
        kernel: AffineKernel<I, O>,
        input: &[I],
        shape: &[usize],
    ) -> Result<Vec<O>> {
        let layout = self.layout(shape)?;
        let mut out = vec![O::default(); input.len()];
        kernel(
            input,
            &mut out,
            layout,
            self.qparams.scales(),
            self.qparams.zero_points(),
            self.grid.quant_min(),
            self.grid.quant_max(),
            self.rounding,
        )?;
        Ok(out)
    }
}

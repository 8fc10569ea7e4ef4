//! PyTorch's own arithmetic, element by element, for grids too wide for the fast paths.

use super::params::Affine;
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// PyTorch's arithmetic, element by element, for grids too wide for the fast path (more than
/// `2^21` levels on a side). Its per-tensor and per-channel CPU kernels differ there: per
/// tensor, the code `q = float(z) + round(x * (1/s))` stays an `f32`, the mask compares it with
/// `float(quant_min)`, `float(quant_max)` and the output is `f32(q' - z) * s`; per channel, `q`
/// is cast to `int64` first, the mask compares integers and the output is `(q' - z) * s` in
/// `double`, rounded to `f32` (`q'` is `q` clamped to the range). On grids of up to 2^24
/// levels the two agree, and agree with the fast path.
#[derive(Clone, Copy)]
pub(super) struct Torch {
    per_tensor: bool,
    quant_min: i32,
    quant_max: i32,
    rounding: RoundingPolicy,
}

impl Torch {
    pub(super) fn new(
        layout: ChannelLayout,
        quant_min: i32,
        quant_max: i32,
        rounding: RoundingPolicy,
    ) -> Torch {
        Torch {
            per_tensor: layout.axis.is_none(),
            quant_min,
            quant_max,
            rounding,
        }
    }

    /// The fake-quantized value and the straight-through mask (NaN: `(NaN, false)`).
    pub(super) fn forward(&self, x: f32, p: &Affine) -> (f32, bool) {
        let v = x * p.inv;
        if v.is_nan() {
            return (f32::NAN, false);
        }
        let q = p.zero_point + self.rounding.round(v);
        let (qmin, qmax, z) = (
            self.quant_min as i64,
            self.quant_max as i64,
            p.zero_point_i as i64,
        );
        if self.per_tensor {
            let clamped = (q as f64).clamp(qmin as f64, qmax as f64) as i64;
            let y = (clamped - z) as f32 * p.scale;
            (y, self.quant_min as f32 <= q && q <= self.quant_max as f32)
        } else {
            // Saturating where PyTorch's cast is undefined (beyond int64, or ±Inf).
            let q = q as i64;
            let y = ((q.clamp(qmin, qmax) - z) as f64 * p.scale as f64) as f32;
            (y, qmin <= q && q <= qmax)
        }
    }

    /// LSQ's backward for one element (PyTorch's `fake_quantize_learnable_*_grad_kernel_cpu`):
    /// `(inside, ds, dz)` with `ds`, `dz` to be multiplied by `dy`, or `None` for NaN.
    pub(super) fn lsq(&self, x: f32, p: &Affine) -> Option<(bool, f32, f32)> {
        let w = x * p.inv + p.zero_point;
        if w.is_nan() {
            return None;
        }
        let q = self.rounding.round(w) as i64;
        let (qmin, qmax, z) = (
            self.quant_min as i64,
            self.quant_max as i64,
            p.zero_point_i as i64,
        );
        // Per tensor the zero point is an int64, per channel a float.
        let minus_z = |v: i64| {
            if self.per_tensor {
                (v - z) as f32
            } else {
                v as f32 - p.zero_point
            }
        };
        Some(if q < qmin {
            (false, minus_z(qmin), 1.0)
        } else if q > qmax {
            (false, minus_z(qmax), 1.0)
        } else {
            (true, (minus_z(q) * p.scale - x) * p.inv, 0.0)
        })
    }
}

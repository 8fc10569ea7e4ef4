//! The runtime's integer kernels: `quant_core::int8` (matrix products, requantization,
//! im2col, depthwise convolution and max pooling on `u8` codes, with run-time instruction-set
//! dispatch), plus max
//! pooling of `i32` accumulators.

use crate::graph::taps;

pub use quant_core::int8::{
    fixed_point_multiplier, gemm_u8, im2col_u8, max_pool_u8, rounding_shift, DepthwiseFilter,
    PackedMatrix, Requantizer, Window,
};

/// Max pooling of one NHWC sample of accumulators; padding never wins (the `i32` counterpart
/// of [`max_pool_u8`]).
#[allow(clippy::too_many_arguments)]
pub fn max_pool_i32(
    x: &[i32],
    (h, w, c): (usize, usize, usize),
    k: usize,
    stride: usize,
    padding: usize,
    (oh, ow): (usize, usize),
    out: &mut [i32],
) {
    for oy in 0..oh {
        for ox in 0..ow {
            let dst = &mut out[(oy * ow + ox) * c..(oy * ow + ox + 1) * c];
            dst.fill(i32::MIN);
            for (_, iy) in taps(oy, k, stride, padding, h) {
                for (_, ix) in taps(ox, k, stride, padding, w) {
                    let src = &x[(iy * w + ix) * c..][..c];
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d = (*d).max(*s);
                    }
                }
            }
        }
    }
}

//! The straight-through backward of fake quantization (PyTorch's cachemask backward).

use std::marker::PhantomData;

use super::driver::{drive, Constants, Map};
use super::params::{check_len, Grid, Path};
use super::round::{clamp, Round};
use crate::error::Result;
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// `dx += dy * [lo <= R(x * (1/s)) <= hi]`.
struct Ste<R>(PhantomData<R>);

impl<R: Round> Map<(&[f32], &[f32], &mut [f32])> for Ste<R> {
    #[inline(always)]
    fn map<C: Constants>(&self, (x, dy, dx): (&[f32], &[f32], &mut [f32]), c: &C) {
        let n = x.len().min(dy.len()).min(dx.len());
        let (x, dy, dx, c) = (&x[..n], &dy[..n], &mut dx[..n], c.prefix(n));
        for i in 0..n {
            let p = c.at(i);
            // Read before the select: a read inside it became a masked load (vmaskmovps), which
            // made the whole loop several times slower on AMD.
            let d = dy[i];
            // Not clamped first: beyond 2^22 the fast rounding is off by a little, but such a
            // value stays far outside the grid (which is what the mask asks), and ±Inf stays
            // ±Inf.
            let r = R::round(x[i] * p.inv);
            // `r` is on the grid iff clamping it changes nothing (NaN compares unequal: mask 0).
            dx[i] += if r == clamp(r, p.lo, p.hi) { d } else { 0.0 };
        }
    }
}

/// Straight-through gradient of fake quantization: adds `dy` into `dx` where the rounded,
/// unclamped `q` lies in `[quant_min, quant_max]` (PyTorch's cachemask backward).
///
/// # Errors
/// See [`fake_quantize_affine_into`](super::fake_quantize_affine_into); also `dy` or `dx` not
/// as long as `x`.
#[allow(clippy::too_many_arguments)]
pub fn fake_quantize_affine_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    scales: &[f32],
    zero_points: &[i32],
    quant_min: i32,
    quant_max: i32,
    rounding: RoundingPolicy,
) -> Result<()> {
    check_len("x", layout.numel(), x.len())?;
    check_len("dy", x.len(), dy.len())?;
    check_len("dx", x.len(), dx.len())?;
    let grid = Grid::new(layout, scales, zero_points, quant_min, quant_max, rounding);
    grid.run(|path, params| match path {
        Path::Fast(walk) => with_rounding!(rounding, R => {
            drive(&Ste::<R>(PhantomData), (x, dy, dx), &walk, layout.channels);
        }),
        Path::Exact => {
            let torch = grid.torch();
            for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
                let (_, inside) = torch.forward(*xi, &params[layout.channel_of(i)]);
                *g += if inside { *dyi } else { 0.0 };
            }
        }
    })?;
    Ok(())
}

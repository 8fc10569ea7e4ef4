//! Forward fake quantization, per tensor and per channel (PyTorch's
//! `fake_quantize_per_tensor_affine` and `fake_quantize_per_channel_affine`).

use std::marker::PhantomData;

use super::driver::{drive, uninit_vec, Out, Unary};
use super::params::{check_len, Affine, Grid, Path};
use super::round::{clamp, Round};
use super::torch::Torch;
use crate::error::Result;
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy::{self, HalfEven};

/// `y = R(clamp(x * (1/s), lo, hi)) * s`.
struct FakeQuant<R>(PhantomData<R>);

impl<R: Round> Unary for FakeQuant<R> {
    type In = f32;
    type Out = f32;
    #[inline(always)]
    fn apply(&self, x: f32, p: &Affine) -> f32 {
        R::round(clamp(x * p.inv, p.lo, p.hi)) * p.scale
    }
}

/// The exact path for grids too wide for the fast rounding.
fn fq_slow<O: Out>(x: &[f32], y: &mut [O], layout: ChannelLayout, params: &[Affine], torch: Torch) {
    for (i, (yi, xi)) in y.iter_mut().zip(x).enumerate() {
        yi.set(torch.forward(*xi, &params[layout.channel_of(i)]).0);
    }
}

/// PyTorch's `torch.fake_quantize_per_tensor_affine`: round half to even of `x * (1/scale)`,
/// plus `zero_point`, clamped to `[quant_min, quant_max]`, minus `zero_point`, times `scale`.
///
/// ```
/// use quant_core::kernels::fake_quantize_per_tensor_affine;
/// let y = fake_quantize_per_tensor_affine(&[0.25, 0.75, 9.0, -9.0], 0.5, 0, -4, 3).unwrap();
/// assert_eq!(y, vec![0.0, 1.0, 1.5, -2.0]); // 0.5 → 0 and 1.5 → 2 are ties to even
/// ```
///
/// # Errors
/// A scale that is not finite and normal, `quant_min > quant_max`, or a zero point outside
/// `[quant_min, quant_max]`.
pub fn fake_quantize_per_tensor_affine(
    x: &[f32],
    scale: f32,
    zero_point: i32,
    quant_min: i32,
    quant_max: i32,
) -> Result<Vec<f32>> {
    let grid = Grid::torch_per_tensor(x.len(), &scale, &zero_point, quant_min, quant_max);
    uninit_vec(x.len(), |y| fake_quantize_to(x, y, grid))
}

/// [`fake_quantize_per_tensor_affine`] into `y`, with any rounding policy.
///
/// # Errors
/// See [`fake_quantize_per_tensor_affine`]; also `y` shorter or longer than `x`.
pub fn fake_quantize_per_tensor_affine_into(
    x: &[f32],
    y: &mut [f32],
    scale: f32,
    zero_point: i32,
    quant_min: i32,
    quant_max: i32,
    rounding: RoundingPolicy,
) -> Result<()> {
    fake_quantize_affine_into(
        x,
        y,
        ChannelLayout::per_tensor(x.len()),
        &[scale],
        &[zero_point],
        quant_min,
        quant_max,
        rounding,
    )
}

/// PyTorch's `torch.fake_quantize_per_channel_affine`: the per-tensor formula with channel
/// `c`'s scale and zero point for every element whose index along `axis` is `c`.
///
/// ```
/// use quant_core::kernels::fake_quantize_per_channel_affine;
/// let x = [0.3, 0.3, 0.3, 0.3];
/// let y = fake_quantize_per_channel_affine(&x, &[2, 2], 0, &[0.5, 0.25], &[0, 0], -8, 7).unwrap();
/// assert_eq!(y, vec![0.5, 0.5, 0.25, 0.25]);
/// ```
///
/// # Errors
/// Everything [`fake_quantize_per_tensor_affine`] rejects, for any channel; `axis` outside
/// `shape`; `x`, `scales` or `zero_points` whose length does not match `shape`.
#[allow(clippy::too_many_arguments)]
pub fn fake_quantize_per_channel_affine(
    x: &[f32],
    shape: &[usize],
    axis: usize,
    scales: &[f32],
    zero_points: &[i32],
    quant_min: i32,
    quant_max: i32,
) -> Result<Vec<f32>> {
    let layout = ChannelLayout::new(shape, Some(axis))?;
    let grid = Grid::new(layout, scales, zero_points, quant_min, quant_max, HalfEven);
    uninit_vec(x.len(), |y| fake_quantize_to(x, y, grid))
}

/// Fake quantization into `y` for any layout (one channel = per tensor) and rounding policy.
///
/// # Errors
/// See [`fake_quantize_per_channel_affine`]; also `y` shorter or longer than `x`.
#[allow(clippy::too_many_arguments)]
pub fn fake_quantize_affine_into(
    x: &[f32],
    y: &mut [f32],
    layout: ChannelLayout,
    scales: &[f32],
    zero_points: &[i32],
    quant_min: i32,
    quant_max: i32,
    rounding: RoundingPolicy,
) -> Result<()> {
    let grid = Grid::new(layout, scales, zero_points, quant_min, quant_max, rounding);
    fake_quantize_to(x, y, grid)
}

/// [`fake_quantize_affine_into`] into a caller's buffer or fresh storage: on `Ok`, every
/// element of `y` is written.
fn fake_quantize_to<O: Out>(x: &[f32], y: &mut [O], grid: Grid<'_>) -> Result<()> {
    check_len("x", grid.layout.numel(), x.len())?;
    check_len("y", x.len(), y.len())?;
    grid.run(|path, params| match path {
        Path::Fast(walk) => with_rounding!(grid.rounding, R => {
            drive(&FakeQuant::<R>(PhantomData), (x, y), &walk, grid.layout.channels);
        }),
        Path::Exact => fq_slow(x, y, grid.layout, params, grid.torch()),
    })?;
    Ok(())
}

//! Validated per-channel constants of an affine grid, and the argument checks every kernel
//! family shares.

use super::driver::Walk;
use super::torch::Torch;
use crate::error::{QuantError, Result};
use crate::grid::{check_scale, is_valid_scale};
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

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

pub(super) use crate::error::check_len;

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

/// Whether the range and every channel's bounds fit the exact fast rounding. `params` come
/// from [`affines`], which checked that every zero point lies in the range.
pub(super) fn fast_path(params: &[Affine], quant_min: i32, quant_max: i32) -> bool {
    let fits = |v: i64| v.abs() < FAST_LIMIT;
    if !(fits(quant_min as i64) && fits(quant_max as i64)) {
        return false;
    }
    let within = |p: &Affine| fits(p.lo as i64) && fits(p.hi as i64);
    // With the zero point in the range, `|lo|` and `|hi|` are at most the range's span: a
    // span that fits answers for every channel without a pass over them (a per-channel weight
    // has hundreds, and this runs several times per training step).
    if fits(quant_max as i64 - quant_min as i64) {
        debug_assert!(params.iter().all(within));
        return true;
    }
    params.iter().all(within)
}

/// The affine grid a public kernel is given, as one argument for the private code several
/// public kernels share: the tensor's channel layout, one scale and zero point per channel
/// (`Z`: `i32`, or `f32` for LSQ's learnable zero points), the range and the rounding.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grid<'a, Z = i32> {
    pub layout: ChannelLayout,
    pub scales: &'a [f32],
    pub zero_points: &'a [Z],
    pub quant_min: i32,
    pub quant_max: i32,
    pub rounding: RoundingPolicy,
}

/// How an element-wise kernel runs on a grid (see [`Grid::run`]).
pub(super) enum Path<'p> {
    /// Every bound fits the exact fast rounding: the vectorised driver, walking this.
    Fast(Walk<'p>),
    /// A grid too wide for the fast rounding: scalar code with PyTorch's own arithmetic.
    Exact,
}

impl<'a, Z> Grid<'a, Z> {
    pub fn new(
        layout: ChannelLayout,
        scales: &'a [f32],
        zero_points: &'a [Z],
        quant_min: i32,
        quant_max: i32,
        rounding: RoundingPolicy,
    ) -> Self {
        Grid {
            layout,
            scales,
            zero_points,
            quant_min,
            quant_max,
            rounding,
        }
    }

    /// PyTorch's per-tensor kernels' grid: one scale and zero point for all `len` elements,
    /// rounding half to even.
    pub fn torch_per_tensor(
        len: usize,
        scale: &'a f32,
        zero_point: &'a Z,
        quant_min: i32,
        quant_max: i32,
    ) -> Self {
        let (scales, zero_points) = (
            std::slice::from_ref(scale),
            std::slice::from_ref(zero_point),
        );
        let layout = ChannelLayout::per_tensor(len);
        Grid::new(
            layout,
            scales,
            zero_points,
            quant_min,
            quant_max,
            RoundingPolicy::HalfEven,
        )
    }

    /// PyTorch's arithmetic on this grid, for [`Path::Exact`].
    pub fn torch(&self) -> Torch {
        Torch::new(self.layout, self.quant_min, self.quant_max, self.rounding)
    }
}

impl Grid<'_, i32> {
    /// Every channel's constants, checked (see [`affines`]).
    pub fn affines(&self) -> Result<Vec<Affine>> {
        let (lo, hi) = (self.quant_min, self.quant_max);
        affines(self.scales, self.zero_points, lo, hi, self.layout.channels)
    }

    /// Checks the grid, then runs `kernel` with the path its constants fit and the constants;
    /// `None` (and no kernel) when the layout has no elements. Callers check their buffers
    /// against the layout first.
    pub fn run<T>(&self, kernel: impl FnOnce(Path<'_>, &[Affine]) -> T) -> Result<Option<T>> {
        let params = self.affines()?;
        if self.layout.numel() == 0 {
            return Ok(None);
        }
        let path = if fast_path(&params, self.quant_min, self.quant_max) {
            Path::Fast(Walk::new(self.layout, &params))
        } else {
            Path::Exact
        };
        Ok(Some(kernel(path, &params)))
    }
}

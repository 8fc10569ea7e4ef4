//! Fake-quantization kernels on slices, without dfdx.
//!
//! The functions named after PyTorch's (`fake_quantize_per_tensor_affine`,
//! `fake_quantize_per_channel_affine`, `fake_quantize_learnable_per_tensor_affine_backward`) take
//! the same arguments in the same order and agree with PyTorch's CPU kernels bit for bit in
//! the forward pass: `q = round_half_even(x * (1/scale)) + zero_point`,
//! `y = (clamp(q, quant_min, quant_max) - zero_point) * scale`, in `f32`.
//! The `_into` variants write into a caller's buffer, take a [`RoundingPolicy`] and a
//! [`ChannelLayout`], and are what the dfdx ops use.
//!
//! # Non-finite inputs
//! `±Inf` saturates to the nearest end of the grid. `NaN` propagates: the output is `NaN`,
//! its gradient mask is 0 and it adds nothing to scale or zero-point gradients. (PyTorch's
//! CPU kernel casts `NaN` to an integer, which is undefined behaviour in C++.) Quantizing to
//! integers ([`quantize_into`]) rejects `NaN` with an error. Parameters (scales, zero points,
//! ranges) are validated: they are never allowed to be `NaN`.
//!
//! # Speed
//! Rounding uses the `1.5 * 2^23` addition trick, exact round-half-even for `|v| <= 2^22`
//! (the input is clamped to the grid first, which commutes with rounding because the bounds
//! are integers), so every loop vectorises on baseline x86-64 (SSE2) without `roundps`.
//! Tensors of at least [`PARALLEL_THRESHOLD`] elements are split across rayon's threads.

use rayon::prelude::*;

use crate::error::{QuantError, Result};
use crate::grid::check_scale;
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// Element count from which kernels split work across rayon's thread pool.
pub const PARALLEL_THRESHOLD: usize = 1 << 18;
const PARALLEL_CHUNK: usize = 1 << 15;
/// Below this many elements per channel block, parameters are expanded per element so the
/// inner loop stays long enough to vectorise.
const SHORT_BLOCK: usize = 64;
/// `1.5 * 2^23`: adding and subtracting it rounds to the nearest integer, ties to even, for
/// any `|v| <= 2^22`.
const MAGIC: f32 = 12_582_912.0;
/// Largest `|quant_min - zero_point|`, `|quant_max - zero_point|` the fast path handles.
const FAST_LIMIT: i64 = 1 << 21;

#[inline(always)]
fn rne(v: f32) -> f32 {
    (v + MAGIC) - MAGIC
}

/// Rounding to an integer, valid for `|v| <= 2^22` (and NaN, which it propagates).
trait Round: Send + Sync {
    fn round(v: f32) -> f32;
}

macro_rules! rounding {
    ($name:ident, |$v:ident, $r:ident, $d:ident| $body:expr) => {
        struct $name;
        impl Round for $name {
            #[inline(always)]
            fn round($v: f32) -> f32 {
                let $r = rne($v);
                // Exact: |v - r| <= 0.5 and both are close (Sterbenz).
                let $d = $v - $r;
                $body
            }
        }
    };
}

rounding!(HalfEven, |v, r, d| {
    let _ = (v, d);
    r
});
rounding!(HalfAwayFromZero, |v, r, d| {
    r + if d == 0.5 && v > 0.0 { 1.0 } else { 0.0 } - if d == -0.5 && v < 0.0 { 1.0 } else { 0.0 }
});
rounding!(HalfUp, |v, r, d| {
    let _ = v;
    r + if d == 0.5 { 1.0 } else { 0.0 }
});
rounding!(HalfDown, |v, r, d| {
    let _ = v;
    r - if d == -0.5 { 1.0 } else { 0.0 }
});
rounding!(HalfTowardZero, |v, r, d| {
    r + if d == 0.5 && v < 0.0 { 1.0 } else { 0.0 } - if d == -0.5 && v > 0.0 { 1.0 } else { 0.0 }
});
rounding!(Floor, |v, r, d| {
    let _ = v;
    r - if d < 0.0 { 1.0 } else { 0.0 }
});
rounding!(Ceil, |v, r, d| {
    let _ = v;
    r + if d > 0.0 { 1.0 } else { 0.0 }
});

/// Calls `$f::<R>($args)` with `R` the zero-sized rounding type of `$policy`.
macro_rules! with_rounding {
    ($policy:expr, $f:ident ( $($args:expr),* $(,)? )) => {
        match $policy {
            RoundingPolicy::HalfEven => $f::<HalfEven>($($args),*),
            RoundingPolicy::HalfAwayFromZero => $f::<HalfAwayFromZero>($($args),*),
            RoundingPolicy::HalfUp => $f::<HalfUp>($($args),*),
            RoundingPolicy::HalfDown => $f::<HalfDown>($($args),*),
            RoundingPolicy::HalfTowardZero => $f::<HalfTowardZero>($($args),*),
            RoundingPolicy::Floor => $f::<Floor>($($args),*),
            RoundingPolicy::Ceil => $f::<Ceil>($($args),*),
        }
    };
}

/// The per-channel constants of an affine grid: `y = R(clamp(x * inv, lo, hi)) * scale`
/// where `lo = quant_min - zero_point`, `hi = quant_max - zero_point`.
#[derive(Debug, Clone, Copy)]
struct Affine {
    scale: f32,
    inv: f32,
    lo: f32,
    hi: f32,
    zero_point: f32,
}

fn check_range(quant_min: i32, quant_max: i32) -> Result<()> {
    if quant_min > quant_max {
        return Err(QuantError::InvalidRange {
            quant_min,
            quant_max,
            reason: "quant_min must not exceed quant_max",
        });
    }
    Ok(())
}

fn affine(
    scale: f32,
    zero_point: i32,
    quant_min: i32,
    quant_max: i32,
    what: impl Fn() -> String,
) -> Result<Affine> {
    check_scale(scale, || format!("{}scale", what()))?;
    if zero_point < quant_min || zero_point > quant_max {
        return Err(QuantError::InvalidZeroPoint {
            what: format!("{}zero_point", what()),
            value: zero_point as f64,
            quant_min,
            quant_max,
        });
    }
    Ok(Affine {
        scale,
        inv: 1.0 / scale,
        lo: (quant_min as i64 - zero_point as i64) as f32,
        hi: (quant_max as i64 - zero_point as i64) as f32,
        zero_point: zero_point as f32,
    })
}

fn affines(
    scales: &[f32],
    zero_points: &[i32],
    quant_min: i32,
    quant_max: i32,
    channels: usize,
) -> Result<Vec<Affine>> {
    check_range(quant_min, quant_max)?;
    for (what, len) in [("scales", scales.len()), ("zero_points", zero_points.len())] {
        if len != channels {
            return Err(QuantError::LengthMismatch {
                what: what.into(),
                expected: channels,
                actual: len,
            });
        }
    }
    scales
        .iter()
        .zip(zero_points)
        .enumerate()
        .map(|(c, (s, z))| {
            affine(*s, *z, quant_min, quant_max, || {
                if channels == 1 {
                    String::new()
                } else {
                    format!("channel {c}: ")
                }
            })
        })
        .collect()
}

/// Whether every channel's bounds fit the exact fast rounding.
fn fast_path(params: &[Affine]) -> bool {
    params
        .iter()
        .all(|p| (p.lo as i64).abs() < FAST_LIMIT && (p.hi as i64).abs() < FAST_LIMIT)
}

fn check_len(what: &str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(QuantError::LengthMismatch {
            what: what.into(),
            expected,
            actual,
        });
    }
    Ok(())
}

#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    // Comparisons, not f32::max/min: they vectorise to compare + select and let NaN through.
    let v = if v < lo { lo } else { v };
    if v > hi {
        hi
    } else {
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Layout driver: runs a per-element kernel over [outer, channels, inner] with per-channel
// constants, as long contiguous rows, in parallel for large tensors.
// ---------------------------------------------------------------------------------------------

/// Per-element constants for one period (`channels * inner` elements) when blocks are short.
struct Expanded {
    scale: Vec<f32>,
    inv: Vec<f32>,
    lo: Vec<f32>,
    hi: Vec<f32>,
}

impl Expanded {
    fn new(params: &[Affine], inner: usize) -> Expanded {
        let per = |f: fn(&Affine) -> f32| -> Vec<f32> {
            params
                .iter()
                .flat_map(|p| std::iter::repeat_n(f(p), inner))
                .collect()
        };
        Expanded {
            scale: per(|p| p.scale),
            inv: per(|p| p.inv),
            lo: per(|p| p.lo),
            hi: per(|p| p.hi),
        }
    }
}

/// Splits `n` elements into jobs of whole `unit`s, each at least `PARALLEL_CHUNK` long.
fn job_len(n: usize, unit: usize) -> usize {
    let units = PARALLEL_CHUNK.div_ceil(unit.max(1)).max(1);
    (units * unit.max(1)).min(n.max(1))
}

// ----- forward -------------------------------------------------------------------------------

#[inline(always)]
fn fq_row<R: Round>(x: &[f32], y: &mut [f32], p: Affine) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = R::round(clamp(*xi * p.inv, p.lo, p.hi)) * p.scale;
    }
}

#[inline(always)]
fn fq_row_expanded<R: Round>(x: &[f32], y: &mut [f32], e: &Expanded) {
    let n = x.len().min(y.len()).min(e.scale.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    let (s, inv, lo, hi) = (&e.scale[..n], &e.inv[..n], &e.lo[..n], &e.hi[..n]);
    for i in 0..n {
        y[i] = R::round(clamp(x[i] * inv[i], lo[i], hi[i])) * s[i];
    }
}

fn fq_slow(
    x: &[f32],
    y: &mut [f32],
    layout: ChannelLayout,
    params: &[Affine],
    rounding: RoundingPolicy,
) {
    for (i, (yi, xi)) in y.iter_mut().zip(x).enumerate() {
        let p = params[layout.channel_of(i)];
        let v = *xi * p.inv;
        *yi = if v.is_nan() {
            f32::NAN
        } else {
            rounding.round(clamp(v, p.lo, p.hi)) * p.scale
        };
    }
}

fn fq_driver<R: Round>(x: &[f32], y: &mut [f32], layout: ChannelLayout, params: &[Affine]) {
    let n = x.len();
    if layout.channels == 1 {
        let p = params[0];
        if n >= PARALLEL_THRESHOLD {
            y.par_chunks_mut(PARALLEL_CHUNK)
                .zip(x.par_chunks(PARALLEL_CHUNK))
                .for_each(|(y, x)| fq_row::<R>(x, y, p));
        } else {
            fq_row::<R>(x, y, p);
        }
    } else if layout.inner >= SHORT_BLOCK {
        let inner = layout.inner;
        let run = |(b, (y, x)): (usize, (&mut [f32], &[f32]))| {
            fq_row::<R>(x, y, params[b % layout.channels])
        };
        if n >= PARALLEL_THRESHOLD {
            y.par_chunks_mut(inner)
                .zip(x.par_chunks(inner))
                .enumerate()
                .for_each(run);
        } else {
            y.chunks_mut(inner)
                .zip(x.chunks(inner))
                .enumerate()
                .for_each(run);
        }
    } else {
        let period = layout.channels * layout.inner;
        let e = Expanded::new(params, layout.inner);
        if n >= PARALLEL_THRESHOLD {
            let job = job_len(n, period);
            y.par_chunks_mut(job)
                .zip(x.par_chunks(job))
                .for_each(|(y, x)| {
                    for (y, x) in y.chunks_mut(period).zip(x.chunks(period)) {
                        fq_row_expanded::<R>(x, y, &e);
                    }
                });
        } else {
            for (y, x) in y.chunks_mut(period).zip(x.chunks(period)) {
                fq_row_expanded::<R>(x, y, &e);
            }
        }
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
    let mut y = vec![0.0; x.len()];
    fake_quantize_per_tensor_affine_into(
        x,
        &mut y,
        scale,
        zero_point,
        quant_min,
        quant_max,
        RoundingPolicy::HalfEven,
    )?;
    Ok(y)
}

/// [`fake_quantize_per_tensor_affine`] into `y`, with any rounding policy.
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
    let mut y = vec![0.0; x.len()];
    fake_quantize_affine_into(
        x,
        &mut y,
        layout,
        scales,
        zero_points,
        quant_min,
        quant_max,
        RoundingPolicy::HalfEven,
    )?;
    Ok(y)
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
    check_len("x", layout.numel(), x.len())?;
    check_len("y", x.len(), y.len())?;
    let params = affines(scales, zero_points, quant_min, quant_max, layout.channels)?;
    if fast_path(&params) {
        with_rounding!(rounding, fq_driver(x, y, layout, &params));
    } else {
        fq_slow(x, y, layout, &params, rounding);
    }
    Ok(())
}

// ----- straight-through backward ------------------------------------------------------------

#[inline(always)]
fn ste_row<R: Round>(x: &[f32], dy: &[f32], dx: &mut [f32], p: Affine) {
    let (lo, hi) = (p.lo - 1.0, p.hi + 1.0);
    for ((g, xi), dyi) in dx.iter_mut().zip(x).zip(dy) {
        let r = R::round(clamp(*xi * p.inv, lo, hi));
        *g += if r >= p.lo && r <= p.hi { *dyi } else { 0.0 };
    }
}

fn ste_driver<R: Round>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    params: &[Affine],
) {
    let inner = if layout.channels == 1 {
        PARALLEL_CHUNK
    } else {
        layout.inner
    };
    if layout.channels == 1 || inner >= SHORT_BLOCK {
        let run = |(b, ((g, x), dy)): (usize, ((&mut [f32], &[f32]), &[f32]))| {
            ste_row::<R>(
                x,
                dy,
                g,
                params[if layout.channels == 1 {
                    0
                } else {
                    b % layout.channels
                }],
            )
        };
        if x.len() >= PARALLEL_THRESHOLD {
            dx.par_chunks_mut(inner)
                .zip(x.par_chunks(inner))
                .zip(dy.par_chunks(inner))
                .enumerate()
                .for_each(run);
        } else {
            dx.chunks_mut(inner)
                .zip(x.chunks(inner))
                .zip(dy.chunks(inner))
                .enumerate()
                .for_each(run);
        }
    } else {
        for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
            let p = params[layout.channel_of(i)];
            let r = R::round(clamp(*xi * p.inv, p.lo - 1.0, p.hi + 1.0));
            *g += if r >= p.lo && r <= p.hi { *dyi } else { 0.0 };
        }
    }
}

/// Straight-through gradient of fake quantization: adds `dy` into `dx` where the rounded,
/// unclamped `q` lies in `[quant_min, quant_max]` (PyTorch's cachemask backward).
///
/// # Errors
/// See [`fake_quantize_affine_into`]; also `dy` or `dx` not as long as `x`.
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
    let params = affines(scales, zero_points, quant_min, quant_max, layout.channels)?;
    if fast_path(&params) {
        with_rounding!(rounding, ste_driver(x, dy, dx, layout, &params));
    } else {
        for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
            let p = params[layout.channel_of(i)];
            let v = *xi * p.inv;
            let r = rounding.round(clamp(v, p.lo - 1.0, p.hi + 1.0));
            *g += if r >= p.lo && r <= p.hi { *dyi } else { 0.0 };
        }
    }
    Ok(())
}

// ----- LSQ backward --------------------------------------------------------------------------

/// Sums of one channel's scale and zero-point gradient terms, before the gradient factor.
#[derive(Debug, Clone, Copy, Default)]
struct LsqSums {
    dscale: f64,
    dzero: f64,
}

impl std::ops::Add for LsqSums {
    type Output = LsqSums;
    fn add(self, o: LsqSums) -> LsqSums {
        LsqSums {
            dscale: self.dscale + o.dscale,
            dzero: self.dzero + o.dzero,
        }
    }
}

/// One row of LSQ's backward: adds the input gradient into `dx` and returns the sums of
/// `dy * ∂y/∂s` (before `grad_factor`) and of `dy` over out-of-range elements.
#[inline(always)]
fn lsq_row<R: Round>(x: &[f32], dy: &[f32], dx: &mut [f32], p: Affine) -> LsqSums {
    const LANES: usize = 8;
    let (lo1, hi1) = (p.lo - 1.0, p.hi + 1.0);
    let mut sums = LsqSums::default();
    // Accumulate in f32 lanes over short blocks and in f64 across blocks: vectorises, and keeps
    // the sum well within 1e-6 relative of an exact one.
    for ((g, x), dy) in dx.chunks_mut(256).zip(x.chunks(256)).zip(dy.chunks(256)) {
        let mut ds = [0f32; LANES];
        let mut dz = [0f32; LANES];
        let mut i = 0;
        while i < x.len() {
            let end = (i + LANES).min(x.len());
            for l in 0..end - i {
                let xi = x[i + l];
                let dyi = dy[i + l];
                let v = xi * p.inv;
                let r = R::round(clamp(v, lo1, hi1));
                let below = r < p.lo;
                let above = r > p.hi;
                let inside = r >= p.lo && r <= p.hi;
                // Inside: (x_fq - x) / s with x_fq = r * s; outside: the end of the range.
                let term = if inside {
                    (r * p.scale - xi) * p.inv
                } else if below {
                    p.lo
                } else if above {
                    p.hi
                } else {
                    0.0
                };
                ds[l] += dyi * term;
                dz[l] += if below || above { dyi } else { 0.0 };
                g[i + l] += if inside { dyi } else { 0.0 };
            }
            i = end;
        }
        sums.dscale += ds.iter().map(|v| *v as f64).sum::<f64>();
        sums.dzero += dz.iter().map(|v| *v as f64).sum::<f64>();
    }
    sums
}

fn lsq_driver<R: Round>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    params: &[Affine],
) -> Vec<LsqSums> {
    let channels = layout.channels;
    let mut sums = vec![LsqSums::default(); channels];
    if channels == 1 || layout.inner >= SHORT_BLOCK {
        let inner = if channels == 1 {
            PARALLEL_CHUNK
        } else {
            layout.inner
        };
        let run = |(b, ((g, x), dy)): (usize, ((&mut [f32], &[f32]), &[f32]))| {
            let c = if channels == 1 { 0 } else { b % channels };
            (c, lsq_row::<R>(x, dy, g, params[c]))
        };
        let partial: Vec<(usize, LsqSums)> = if x.len() >= PARALLEL_THRESHOLD {
            dx.par_chunks_mut(inner)
                .zip(x.par_chunks(inner))
                .zip(dy.par_chunks(inner))
                .enumerate()
                .map(run)
                .collect()
        } else {
            dx.chunks_mut(inner)
                .zip(x.chunks(inner))
                .zip(dy.chunks(inner))
                .enumerate()
                .map(run)
                .collect()
        };
        for (c, s) in partial {
            sums[c] = sums[c] + s;
        }
    } else {
        for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
            let c = layout.channel_of(i);
            let s = lsq_row::<R>(
                std::slice::from_ref(xi),
                std::slice::from_ref(dyi),
                std::slice::from_mut(g),
                params[c],
            );
            sums[c] = sums[c] + s;
        }
    }
    sums
}

/// Rounds a learnable (floating) zero point the way PyTorch does before use:
/// `round_half_even(clamp(zero_point, quant_min, quant_max))`.
///
/// # Errors
/// A NaN zero point.
pub fn round_zero_point(zero_point: f32, quant_min: i32, quant_max: i32) -> Result<i32> {
    if zero_point.is_nan() {
        return Err(QuantError::NonFinite {
            what: "zero_point".into(),
            value: f64::NAN,
        });
    }
    Ok(zero_point
        .clamp(quant_min as f32, quant_max as f32)
        .round_ties_even() as i32)
}

/// PyTorch's `_fake_quantize_learnable_per_tensor_affine_backward`, the LSQ gradient: returns
/// `(dx, dscale, dzero_point)` for the forward `fake_quantize_per_tensor_affine(x, scale,
/// round(zero_point), ...)`, with `grad_factor` (LSQ's `g = 1/sqrt(numel * quant_max)`)
/// applied to the scale and zero-point gradients:
///
/// ```text
/// inside:     dx = dy,  dscale = dy * (x_fq - x) / scale * g,   dzero = 0
/// below/above: dx = 0,  dscale = dy * (quant_min|quant_max - z) * g,  dzero = -dy * scale * g
/// ```
///
/// ```
/// use quant_core::kernels::fake_quantize_learnable_per_tensor_affine_backward;
/// let (dx, ds, dz) =
///     fake_quantize_learnable_per_tensor_affine_backward(&[0.3, 5.0], &[1.0, 1.0], 0.5, 0.0, -4, 3, 1.0).unwrap();
/// assert_eq!(dx, vec![1.0, 0.0]);
/// assert!((ds - ((0.5 - 0.3) / 0.5 + 3.0)).abs() < 1e-6);
/// assert_eq!(dz, -0.5);
/// ```
///
/// # Errors
/// See [`fake_quantize_per_tensor_affine`]; also `dy` not as long as `x`, a NaN zero point, or
/// a grad factor that is not finite.
pub fn fake_quantize_learnable_per_tensor_affine_backward(
    x: &[f32],
    dy: &[f32],
    scale: f32,
    zero_point: f32,
    quant_min: i32,
    quant_max: i32,
    grad_factor: f32,
) -> Result<(Vec<f32>, f32, f32)> {
    let mut dx = vec![0.0; x.len()];
    let mut ds = [0.0];
    let mut dz = [0.0];
    fake_quantize_learnable_affine_backward_into(
        x,
        dy,
        &mut dx,
        ChannelLayout::per_tensor(x.len()),
        &[scale],
        &[zero_point],
        quant_min,
        quant_max,
        grad_factor,
        RoundingPolicy::HalfEven,
        &mut ds,
        &mut dz,
    )?;
    Ok((dx, ds[0], dz[0]))
}

/// The LSQ gradient for any layout: adds into `dx`, and into `dscales`/`dzero_points` (one per
/// channel). Zero points are learnable floats, rounded as [`round_zero_point`] says.
///
/// # Errors
/// See [`fake_quantize_learnable_per_tensor_affine_backward`]; also buffers whose lengths do
/// not match the layout.
#[allow(clippy::too_many_arguments)]
pub fn fake_quantize_learnable_affine_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    scales: &[f32],
    zero_points: &[f32],
    quant_min: i32,
    quant_max: i32,
    grad_factor: f32,
    rounding: RoundingPolicy,
    dscales: &mut [f32],
    dzero_points: &mut [f32],
) -> Result<()> {
    check_len("x", layout.numel(), x.len())?;
    check_len("dy", x.len(), dy.len())?;
    check_len("dx", x.len(), dx.len())?;
    check_len("dscales", layout.channels, dscales.len())?;
    check_len("dzero_points", layout.channels, dzero_points.len())?;
    check_len("zero_points", layout.channels, zero_points.len())?;
    check_range(quant_min, quant_max)?;
    if !grad_factor.is_finite() {
        return Err(QuantError::NonFinite {
            what: "grad_factor".into(),
            value: grad_factor as f64,
        });
    }
    let zps = zero_points
        .iter()
        .map(|z| round_zero_point(*z, quant_min, quant_max))
        .collect::<Result<Vec<i32>>>()?;
    let params = affines(scales, &zps, quant_min, quant_max, layout.channels)?;
    let sums = if fast_path(&params) {
        with_rounding!(rounding, lsq_driver(x, dy, dx, layout, &params))
    } else {
        let mut sums = vec![LsqSums::default(); layout.channels];
        for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
            let c = layout.channel_of(i);
            let p = params[c];
            let v = *xi * p.inv;
            let r = rounding.round(clamp(v, p.lo - 1.0, p.hi + 1.0));
            let (inside, below, above) = (r >= p.lo && r <= p.hi, r < p.lo, r > p.hi);
            let term = if inside {
                (r * p.scale - xi) * p.inv
            } else if below {
                p.lo
            } else if above {
                p.hi
            } else {
                0.0
            };
            sums[c].dscale += (dyi * term) as f64;
            sums[c].dzero += if below || above { *dyi as f64 } else { 0.0 };
            *g += if inside { *dyi } else { 0.0 };
        }
        sums
    };
    for (c, s) in sums.iter().enumerate() {
        dscales[c] += (s.dscale * grad_factor as f64) as f32;
        dzero_points[c] += (-s.dzero * params[c].scale as f64 * grad_factor as f64) as f32;
    }
    Ok(())
}

// ----- PACT ----------------------------------------------------------------------------------

/// PACT's effective clip value: `alpha`, floored so the scale `alpha / quant_max` stays at
/// least [`crate::grid::MIN_SCALE`].
pub fn pact_alpha(alpha: f32, grid: crate::grid::IntegerGrid) -> f32 {
    alpha.max(crate::grid::MIN_SCALE * grid.quant_max() as f32)
}

/// PACT forward: `fake_quant(clamp(x, 0, α))` with `scale = α / quant_max`, zero point 0, on an
/// unsigned grid. (Clamping `x * (1/scale)` to `[0, quant_max]` is the same clamp.)
///
/// # Errors
/// A NaN or infinite `alpha`, or a signed grid.
pub fn pact_forward_into(
    x: &[f32],
    y: &mut [f32],
    layout: ChannelLayout,
    alpha: f32,
    grid: crate::grid::IntegerGrid,
    rounding: RoundingPolicy,
) -> Result<()> {
    if !alpha.is_finite() {
        return Err(QuantError::NonFinite {
            what: "alpha".into(),
            value: alpha as f64,
        });
    }
    if grid.signed() {
        return Err(QuantError::InvalidValue {
            what: "grid.signed".into(),
            value: "true".into(),
            expected: "an unsigned grid: PACT clips activations to [0, alpha]".into(),
        });
    }
    let scale = pact_alpha(alpha, grid) / grid.quant_max() as f32;
    fake_quantize_affine_into(
        x,
        y,
        ChannelLayout::per_tensor(layout.numel()),
        &[scale],
        &[0],
        grid.quant_min(),
        grid.quant_max(),
        rounding,
    )
}

/// PACT backward: adds `dy·[0 ≤ x < α]` into `dx` and returns `dα = Σ dy·[x ≥ α]`.
pub fn pact_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    alpha: f32,
    grid: crate::grid::IntegerGrid,
) -> f32 {
    let a = pact_alpha(alpha, grid);
    let mut dalpha = 0f64;
    for ((g, xi), dyi) in dx.iter_mut().zip(x).zip(dy) {
        let inside = *xi >= 0.0 && *xi < a;
        *g += if inside { *dyi } else { 0.0 };
        dalpha += if *xi >= a { *dyi as f64 } else { 0.0 };
    }
    dalpha as f32
}

// ----- DSQ -----------------------------------------------------------------------------------

/// Bounds of DSQ's sharpness `α`: it is clamped into this range before use (where it is
/// clamped, its gradient is 0).
pub const DSQ_ALPHA_RANGE: (f32, f32) = (1e-3, 0.999);

/// DSQ's per-channel scale and zero point for the range `[lower, upper]`: the Uniform
/// parameters ([`crate::grid::uniform_qparams`]), so 0 is on the grid.
pub fn dsq_qparams(lower: f32, upper: f32, grid: crate::grid::IntegerGrid) -> Result<(f32, i32)> {
    crate::grid::uniform_qparams(lower, upper, grid)
}

/// DSQ forward: affine fake quantization with [`dsq_qparams`] per channel.
///
/// # Errors
/// Non-finite range ends, or lengths that do not match the layout.
#[allow(clippy::too_many_arguments)]
pub fn dsq_forward_into(
    x: &[f32],
    y: &mut [f32],
    layout: ChannelLayout,
    lower: &[f32],
    upper: &[f32],
    grid: crate::grid::IntegerGrid,
    rounding: RoundingPolicy,
) -> Result<()> {
    check_len("lower", layout.channels, lower.len())?;
    check_len("upper", layout.channels, upper.len())?;
    let mut scales = Vec::with_capacity(layout.channels);
    let mut zps = Vec::with_capacity(layout.channels);
    for (l, u) in lower.iter().zip(upper) {
        let (s, z) = dsq_qparams(*l, *u, grid)?;
        scales.push(s);
        zps.push(z);
    }
    fake_quantize_affine_into(
        x,
        y,
        layout,
        &scales,
        &zps,
        grid.quant_min(),
        grid.quant_max(),
        rounding,
    )
}

/// DSQ backward: the exact derivative of the soft surrogate, added into `dx`, `dalpha`,
/// `dlower`, `dupper` (one value per channel each).
///
/// With `(Δ, z)` from [`dsq_qparams`], `lo = quant_min - z`, `N = quant_max - quant_min` and
/// `p = x/Δ - lo` (the position on the grid), inside `0 ≤ p ≤ N`:
/// `i = min(floor(p), N-1)`, `r = p - i - 1/2`, `a = ln(2/α - 1)`,
/// `φ = tanh(a·r) / (1-α)`, and the surrogate is `Q = Δ·(lo + i + (φ+1)/2)`: the hard forward
/// value is its limit `sign(φ)`. Outside, `Q` is the nearest end, `Δ·lo` or `Δ·(lo + N)`.
/// `z` and `i` are held constant; `Δ = (max(u,0) - min(l,0)) / N` carries the gradients of
/// the range ends.
#[allow(clippy::too_many_arguments)]
pub fn dsq_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    alpha: &[f32],
    lower: &[f32],
    upper: &[f32],
    grid: crate::grid::IntegerGrid,
    dalpha: &mut [f32],
    dlower: &mut [f32],
    dupper: &mut [f32],
) {
    let channels = layout.channels;
    let n_levels = (grid.quant_max() - grid.quant_min()) as f32;
    let mut sums = vec![(0f64, 0f64); channels]; // (dΔ, dα) per channel
    let mut params = Vec::with_capacity(channels);
    for c in 0..channels {
        let (l, u) = (
            lower.get(c).copied().unwrap_or(0.0),
            upper.get(c).copied().unwrap_or(0.0),
        );
        let (delta, z) = dsq_qparams(l, u, grid).unwrap_or((crate::grid::MIN_SCALE, 0));
        let raw_alpha = alpha.get(c).copied().unwrap_or(0.2);
        let a_clamped = raw_alpha.clamp(DSQ_ALPHA_RANGE.0, DSQ_ALPHA_RANGE.1);
        params.push((
            delta,
            (grid.quant_min() - z) as f32,
            a_clamped,
            a_clamped == raw_alpha,
        ));
    }
    for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
        let c = layout.channel_of(i);
        let (delta, lo, al, _) = params[c];
        let p = *xi / delta - lo;
        if p.is_nan() {
            continue;
        }
        if p < 0.0 {
            sums[c].0 += (*dyi * lo) as f64;
            continue;
        }
        if p > n_levels {
            sums[c].0 += (*dyi * (lo + n_levels)) as f64;
            continue;
        }
        let idx = p.floor().min(n_levels - 1.0);
        let r = p - idx - 0.5;
        let a = (2.0 / al - 1.0).ln();
        let t = (a * r).tanh();
        let k = 1.0 / (1.0 - al);
        let phi = t * k;
        let dphi_dr = a * (1.0 - t * t) * k;
        *g += *dyi * 0.5 * dphi_dr;
        let dq_ddelta = lo + idx + 0.5 * (phi + 1.0) - 0.5 * dphi_dr * *xi / delta;
        sums[c].0 += (*dyi * dq_ddelta) as f64;
        let da_dalpha = -2.0 / (al * (2.0 - al));
        let dphi_dalpha = (1.0 - t * t) * r * da_dalpha * k + t * k * k;
        sums[c].1 += (*dyi * 0.5 * delta * dphi_dalpha) as f64;
    }
    for c in 0..channels {
        let (l, u) = (
            lower.get(c).copied().unwrap_or(0.0),
            upper.get(c).copied().unwrap_or(0.0),
        );
        let (lo_end, hi_end) = (l.min(u), u.max(l));
        let ddelta = sums[c].0 as f32;
        // Δ = (max(hi, 0) - min(lo, 0)) / N; the floor at MIN_SCALE stops the gradient.
        let live = ((hi_end.max(0.0) - lo_end.min(0.0)) / n_levels) > crate::grid::MIN_SCALE;
        if live {
            if u >= l {
                dupper[c] += if u > 0.0 { ddelta / n_levels } else { 0.0 };
                dlower[c] += if l < 0.0 { -ddelta / n_levels } else { 0.0 };
            } else {
                dlower[c] += if l > 0.0 { ddelta / n_levels } else { 0.0 };
                dupper[c] += if u < 0.0 { -ddelta / n_levels } else { 0.0 };
            }
        }
        if params[c].3 {
            dalpha[c] += sums[c].1 as f32;
        }
    }
}

// ----- integer quantize / dequantize --------------------------------------------------------

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
}

macro_rules! quant_int {
    ($t:ty) => {
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
        }
    };
}
quant_int!(i8);
quant_int!(u8);
quant_int!(i16);
quant_int!(u16);
quant_int!(i32);

#[inline(always)]
fn q_row<T: QuantInt, R: Round>(x: &[f32], q: &mut [T], p: Affine) {
    for (qi, xi) in q.iter_mut().zip(x) {
        *qi = T::from_f32(R::round(clamp(*xi * p.inv, p.lo, p.hi)) + p.zero_point);
    }
}

fn q_driver<R: Round>(
    x: &[f32],
    q: &mut [impl QuantInt],
    layout: ChannelLayout,
    params: &[Affine],
) {
    if layout.channels == 1 || layout.inner >= SHORT_BLOCK {
        let inner = if layout.channels == 1 {
            PARALLEL_CHUNK
        } else {
            layout.inner
        };
        let run = |(b, (q, x)): (usize, (&mut [_], &[f32]))| {
            q_row::<_, R>(
                x,
                q,
                params[if layout.channels == 1 {
                    0
                } else {
                    b % layout.channels
                }],
            )
        };
        if x.len() >= PARALLEL_THRESHOLD {
            q.par_chunks_mut(inner)
                .zip(x.par_chunks(inner))
                .enumerate()
                .for_each(run);
        } else {
            q.chunks_mut(inner)
                .zip(x.chunks(inner))
                .enumerate()
                .for_each(run);
        }
    } else {
        for (i, (qi, xi)) in q.iter_mut().zip(x).enumerate() {
            let p = params[layout.channel_of(i)];
            *qi = QuantInt::from_f32(R::round(clamp(*xi * p.inv, p.lo, p.hi)) + p.zero_point);
        }
    }
}

/// Quantizes to integers: `q = clamp(round(x * (1/scale)) + zero_point, quant_min, quant_max)`
/// stored as `T`.
///
/// # Errors
/// See [`fake_quantize_affine_into`]; also a grid that does not fit `T`, or a NaN in `x`
/// (the index of the first one is reported).
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
    if let Some(i) = x.iter().position(|v| v.is_nan()) {
        return Err(QuantError::NonFinite {
            what: format!("x[{i}] (NaN cannot be quantized to an integer)"),
            value: f64::NAN,
        });
    }
    let params = affines(scales, zero_points, quant_min, quant_max, layout.channels)?;
    if fast_path(&params) {
        with_rounding!(rounding, q_driver(x, q, layout, &params));
    } else {
        for (i, (qi, xi)) in q.iter_mut().zip(x).enumerate() {
            let p = params[layout.channel_of(i)];
            let r = rounding.round(clamp(*xi * p.inv, p.lo, p.hi));
            *qi = T::from_f32(((r as f64) + p.zero_point as f64) as f32);
        }
    }
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
    for (i, (yi, qi)) in y.iter_mut().zip(q).enumerate() {
        let p = params[if layout.channels == 1 {
            0
        } else {
            layout.channel_of(i)
        }];
        *yi = ((qi.to_i32() as i64 - p.zero_point as i64) as f32) * p.scale;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar reference of the forward formula, with any rounding policy.
    fn reference(x: f32, s: f32, z: i32, qmin: i32, qmax: i32, rounding: RoundingPolicy) -> f32 {
        let inv = 1.0 / s;
        let q = rounding.round(x * inv) as i64 + z as i64;
        ((q.clamp(qmin as i64, qmax as i64) - z as i64) as f32) * s
    }

    #[test]
    fn ties_follow_every_rounding_policy() {
        // x * (1/s) lands exactly on k + 0.5 for s = 0.5 (inv = 2 exactly) and x = (k + 0.5) / 2.
        let xs: Vec<f32> = (-20..20).map(|k| (k as f32 + 0.5) * 0.5).collect();
        for policy in RoundingPolicy::ALL {
            let mut y = vec![0.0; xs.len()];
            fake_quantize_per_tensor_affine_into(&xs, &mut y, 0.5, 3, -8, 7, policy).unwrap();
            for (x, y) in xs.iter().zip(&y) {
                assert_eq!(*y, reference(*x, 0.5, 3, -8, 7, policy), "{policy:?} x={x}");
            }
        }
    }

    #[test]
    fn far_out_of_range_and_non_finite() {
        let x = [1e30, -1e30, f32::INFINITY, f32::NEG_INFINITY, 1e6, -1e6];
        let y = fake_quantize_per_tensor_affine(&x, 0.1, 2, 0, 255).unwrap();
        let top = (255 - 2) as f32 * 0.1;
        let bottom = (0 - 2) as f32 * 0.1;
        assert_eq!(y, vec![top, bottom, top, bottom, top, bottom]);
        let y = fake_quantize_per_tensor_affine(&[f32::NAN, 1.0], 0.1, 0, -128, 127).unwrap();
        assert!(y[0].is_nan());
        assert_eq!(y[1], 1.0);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let x = [1.0];
        for s in [0.0, -1.0, f32::NAN, f32::INFINITY, 1e-40] {
            assert!(matches!(
                fake_quantize_per_tensor_affine(&x, s, 0, -128, 127),
                Err(QuantError::InvalidScale { .. })
            ));
        }
        assert!(matches!(
            fake_quantize_per_tensor_affine(&x, 1.0, 0, 5, 4),
            Err(QuantError::InvalidRange { .. })
        ));
        assert!(matches!(
            fake_quantize_per_tensor_affine(&x, 1.0, 300, 0, 255),
            Err(QuantError::InvalidZeroPoint { .. })
        ));
        assert!(matches!(
            fake_quantize_per_channel_affine(&[1.0; 6], &[2, 3], 1, &[1.0, 1.0], &[0, 0], -8, 7),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert!(matches!(
            fake_quantize_per_channel_affine(&[1.0; 5], &[2, 3], 1, &[1.0; 3], &[0; 3], -8, 7),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert!(matches!(
            fake_quantize_per_channel_affine(&[1.0; 6], &[2, 3], 2, &[1.0; 3], &[0; 3], -8, 7),
            Err(QuantError::InvalidAxis { .. })
        ));
        assert!(fake_quantize_learnable_per_tensor_affine_backward(
            &x,
            &[1.0, 2.0],
            1.0,
            0.0,
            -8,
            7,
            1.0
        )
        .is_err());
        assert!(fake_quantize_learnable_per_tensor_affine_backward(
            &x,
            &[1.0],
            1.0,
            f32::NAN,
            -8,
            7,
            1.0
        )
        .is_err());
        assert!(fake_quantize_learnable_per_tensor_affine_backward(
            &x,
            &[1.0],
            1.0,
            0.0,
            -8,
            7,
            f32::NAN
        )
        .is_err());
    }

    #[test]
    fn wide_ranges_take_the_exact_slow_path() {
        let x = [3.5e6f32, -7.25e6, 0.5, 1.5];
        let y = fake_quantize_per_tensor_affine(&x, 1.0, 0, i32::MIN, i32::MAX).unwrap();
        assert_eq!(
            y,
            vec![
                3.5e6f32.round_ties_even(),
                -7.25e6f32.round_ties_even(),
                0.0,
                2.0
            ]
        );
    }

    #[test]
    fn per_channel_matches_per_tensor_channel_by_channel_on_every_axis() {
        let shape = [3usize, 4, 5];
        let x: Vec<f32> = (0..60)
            .map(|i| ((i * 37 % 61) as f32 - 30.0) * 0.173)
            .collect();
        for axis in 0..3 {
            let c = shape[axis];
            let scales: Vec<f32> = (0..c).map(|k| 0.1 + 0.07 * k as f32).collect();
            let zps: Vec<i32> = (0..c).map(|k| k as i32 - 1).collect();
            let y =
                fake_quantize_per_channel_affine(&x, &shape, axis, &scales, &zps, -8, 7).unwrap();
            let layout = ChannelLayout::new(&shape, Some(axis)).unwrap();
            for (i, (xi, yi)) in x.iter().zip(&y).enumerate() {
                let ch = layout.channel_of(i);
                let e =
                    fake_quantize_per_tensor_affine(&[*xi], scales[ch], zps[ch], -8, 7).unwrap()[0];
                assert_eq!(*yi, e, "axis {axis} i {i}");
            }
        }
    }

    #[test]
    fn large_tensors_split_across_threads_give_the_same_result() {
        let n = PARALLEL_THRESHOLD * 2 + 17;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 2001) as f32 * 0.01 - 10.0)
            .collect();
        let y = fake_quantize_per_tensor_affine(&x, 0.05, 3, -128, 127).unwrap();
        for (xi, yi) in x.iter().zip(&y).step_by(997) {
            assert_eq!(
                *yi,
                reference(*xi, 0.05, 3, -128, 127, RoundingPolicy::HalfEven)
            );
        }
        let dy = vec![1.0; n];
        let (dx, ds, _) =
            fake_quantize_learnable_per_tensor_affine_backward(&x, &dy, 0.05, 3.0, -128, 127, 1.0)
                .unwrap();
        let mut exact = 0f64;
        for (xi, gi) in x.iter().zip(&dx) {
            let q = (xi * 20.0f32).round_ties_even() + 3.0;
            let inside = (-128.0..=127.0).contains(&q);
            assert_eq!(*gi, if inside { 1.0 } else { 0.0 });
            exact += if inside {
                ((q - 3.0) * 0.05 - xi) as f64 * 20.0
            } else if q < -128.0 {
                -131.0
            } else {
                124.0
            };
        }
        assert!(
            ((ds as f64 - exact) / exact).abs() < 1e-6,
            "{ds} vs {exact}"
        );
    }

    #[test]
    fn quantize_dequantize_equals_fake_quantize() {
        let x: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.031).collect();
        let layout = ChannelLayout::new(&[3, 100], Some(0)).unwrap();
        let (s, z) = ([0.02, 0.05, 0.1], [-3, 0, 5]);
        let mut q = vec![0i8; 300];
        quantize_into(
            &x,
            &mut q,
            layout,
            &s,
            &z,
            -128,
            127,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        let mut y = vec![0.0; 300];
        dequantize_into(&q, &mut y, layout, &s, &z, -128, 127).unwrap();
        let f = fake_quantize_per_channel_affine(&x, &[3, 100], 0, &s, &z, -128, 127).unwrap();
        assert_eq!(y, f);
        assert!(quantize_into(
            &x,
            &mut vec![0i8; 300],
            layout,
            &s,
            &z,
            0,
            255,
            RoundingPolicy::HalfEven
        )
        .is_err());
        let mut nan = x.clone();
        nan[7] = f32::NAN;
        let err = quantize_into(
            &nan,
            &mut q,
            layout,
            &s,
            &z,
            -128,
            127,
            RoundingPolicy::HalfEven,
        )
        .unwrap_err();
        assert!(err.to_string().contains("x[7]"), "{err}");
    }
}

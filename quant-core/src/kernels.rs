//! Fake-quantization kernels on slices, without dfdx.
//!
//! The functions named after PyTorch's (`fake_quantize_per_tensor_affine`,
//! `fake_quantize_per_channel_affine`, `fake_quantize_learnable_per_tensor_affine_backward`) take
//! the same arguments in the same order and agree with PyTorch's CPU kernels bit for bit in
//! the forward pass: `q = round_half_even(x * (1/scale)) + zero_point`,
//! `y = (clamp(q, quant_min, quant_max) - zero_point) * scale`, in `f32`.
//! The `_into` variants write into a caller's buffer, take a [`RoundingPolicy`] and a
//! [`ChannelLayout`], and are what the dfdx ops use. `quant-core/tests/pytorch_reference.rs`
//! checks all of this against vectors that real PyTorch produced
//! (`tools/gen_pytorch_fixtures.py`).
//!
//! # PyTorch's LSQ backward
//! PyTorch's learnable (LSQ) backward rounds `x * (1/scale) + zero_point`, where its forward
//! rounds `x * (1/scale)` and then adds `zero_point`. At an exact tie with an odd zero point the
//! two disagree (`x/s = 0.5, z = 1`: the forward gives `q = 1`, the backward `q = 2`). We follow
//! PyTorch in each, so [`fake_quantize_learnable_affine_backward_into`] matches its gradients
//! exactly. Two things we do not copy:
//! - PyTorch's *per-tensor* backward rounds a learnable zero point as `trunc(clamp(z + 0.5))`
//!   where its forward and its per-channel backward use `round_half_even(clamp(z))`; they
//!   differ for every negative zero point (`z = -5` becomes `-4` in the backward) and at
//!   halves. We use the forward's rounding everywhere ([`round_zero_point`]), so forward and
//!   backward see the same grid.
//! - PyTorch's AVX2/AVX512 builds of the LSQ backward contract `z + x * (1/s)` into one fused
//!   multiply-add, so one ulp from a tie their result depends on the CPU. We compute the
//!   product and the sum separately, as its portable (`DEFAULT`) build does, on every CPU.
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
//! are integers), so every loop vectorises on baseline x86-64 (SSE2) without `roundps`. On
//! x86-64 CPUs with AVX2 (detected at run time) the same loops run compiled for AVX2: twice
//! the lanes, same results bit for bit (no FMA contraction: Rust never fuses `a * b + c`).
//! The LSQ backward with round half to even, the training hot spot, has a hand-written AVX2
//! loop (LLVM would not keep the sums in registers), lane for lane the portable arithmetic.
//! Gradient sums accumulate in `f32` lanes over blocks of at most 4 terms per lane and in
//! `f64` across blocks, so they stay within about 1e-7 relative of an exact sum of the terms
//! (relative to the sum of their absolute values, when terms of both signs cancel).
//! Tensors of at least [`PARALLEL_THRESHOLD`] elements are split across rayon's threads into
//! jobs whose boundaries depend only on the tensor's size, so results do not depend on the
//! number of threads.
//!
//! Grids wider than `2^21` levels on either side of zero take exact scalar paths that follow
//! PyTorch's own arithmetic there, which differs between its per-tensor kernel (`f32` codes
//! and products) and its per-channel kernel (`int64` codes, a `double` product).

use rayon::prelude::*;

use crate::error::{QuantError, Result};
use crate::grid::check_scale;
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// Element count from which kernels split work across rayon's thread pool.
pub const PARALLEL_THRESHOLD: usize = 1 << 18;
/// Least number of elements in one parallel job (128 KiB of `f32` per stream).
const PARALLEL_CHUNK: usize = 1 << 15;
/// Below this many elements per channel block, parameters are expanded per element so the
/// inner loop stays long enough to vectorise.
const SHORT_BLOCK: usize = 64;
/// `1.5 * 2^23`: adding and subtracting it rounds to the nearest integer, ties to even, for
/// any `|v| <= 2^22`.
const MAGIC: f32 = 12_582_912.0;
/// The bit pattern of [`MAGIC`]: for an integer-valued `|v| < 2^22`, the bits of `v + MAGIC`
/// are `MAGIC_BITS + v`, an exact float-to-integer conversion that vectorises on SSE2.
const MAGIC_BITS: i32 = 0x4B40_0000;
/// Largest `|quant_min|`, `|quant_max|`, `|quant_min - zero_point|`, `|quant_max - zero_point|`
/// the fast path handles.
const FAST_LIMIT: i64 = 1 << 21;
/// `f32` accumulator lanes of the gradient sums: one AVX2 register, two SSE2. (More lanes
/// spill registers on AVX2.)
const LANES: usize = 8;
/// Elements per accumulation block: each `f32` lane sums 4 terms before it is added to an
/// `f64` accumulator, which bounds the rounding error of a block sum to a few ulps.
const BLOCK: usize = 4 * LANES;

#[inline(always)]
fn rne(v: f32) -> f32 {
    (v + MAGIC) - MAGIC
}

/// Defines `fn $name` that runs its body compiled for AVX2 when the CPU has it (checked at run
/// time, once per call), and compiled for the baseline target otherwise. Everything the body
/// calls must be `#[inline(always)]` (or generic and inlined) to benefit.
macro_rules! multiversion {
    (
        $(#[$meta:meta])*
        fn $name:ident<$($gen:ident: $bound:path),*>($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        fn $name<$($gen: $bound),*>($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp<$($gen: $bound),*>($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            {
                // `unsafe fn`: safe functions with target features need Rust 1.86.
                #[target_feature(enable = "avx2")]
                unsafe fn avx2<$($gen: $bound),*>($($arg: $ty),*) $(-> $ret)? {
                    imp::<$($gen),*>($($arg),*)
                }
                if !baseline_forced() && std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2, checked just above.
                    return unsafe { avx2::<$($gen),*>($($arg),*) };
                }
            }
            imp::<$($gen),*>($($arg),*)
        }
    };
}

/// Unit tests set this to run the baseline (SSE2) code on an AVX2 machine too.
#[cfg(test)]
static FORCE_BASELINE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn baseline_forced() -> bool {
    #[cfg(test)]
    {
        FORCE_BASELINE.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(test))]
    {
        false
    }
}

/// Rounding to an integer, valid for `|v| <= 2^22` (and NaN, which it propagates).
trait Round: Send + Sync {
    /// Round half to even (PyTorch's rounding), which has a hand-written AVX2 LSQ backward.
    const HALF_EVEN: bool = false;
    fn round(v: f32) -> f32;
}

macro_rules! rounding {
    ($name:ident, |$v:ident, $r:ident, $d:ident| $body:expr) => {
        rounding!($name, false, |$v, $r, $d| $body);
    };
    ($name:ident, $half_even:literal, |$v:ident, $r:ident, $d:ident| $body:expr) => {
        struct $name;
        impl Round for $name {
            const HALF_EVEN: bool = $half_even;
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

rounding!(HalfEven, true, |v, r, d| {
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
    /// The zero point as given (PyTorch's `int64` arithmetic on the slow paths).
    zero_point_i: i32,
    /// The range as floats (the LSQ backward compares `round(x/s + z)` with them).
    quant_min: f32,
    quant_max: f32,
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
        // PyTorch: `float inv_scale = 1.0f / scale;` and a multiplication, never a division.
        inv: 1.0 / scale,
        lo: (quant_min as i64 - zero_point as i64) as f32,
        hi: (quant_max as i64 - zero_point as i64) as f32,
        zero_point: zero_point as f32,
        zero_point_i: zero_point,
        quant_min: quant_min as f32,
        quant_max: quant_max as f32,
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

/// Whether the range and every channel's bounds fit the exact fast rounding.
fn fast_path(params: &[Affine], quant_min: i32, quant_max: i32) -> bool {
    let fits = |v: i64| v.abs() < FAST_LIMIT;
    fits(quant_min as i64)
        && fits(quant_max as i64)
        && params
            .iter()
            .all(|p| fits(p.lo as i64) && fits(p.hi as i64))
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
    // Comparisons, not f32::max/min: they vectorise to compare + select (maxps/minps) and let
    // NaN through.
    let v = if v < lo { lo } else { v };
    if v > hi {
        hi
    } else {
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Walks: how per-channel constants map onto a tensor laid out as [outer, channels, inner].
// ---------------------------------------------------------------------------------------------

/// Per-element constants for one period (`channels * inner` elements) when rows are short.
struct Expanded {
    inner: usize,
    scale: Vec<f32>,
    inv: Vec<f32>,
    lo: Vec<f32>,
    hi: Vec<f32>,
    zero_point: Vec<f32>,
    /// Global, the same for every channel.
    quant_min: f32,
    quant_max: f32,
    /// The constants per channel.
    params: Vec<Affine>,
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
            inner,
            scale: per(|p| p.scale),
            inv: per(|p| p.inv),
            lo: per(|p| p.lo),
            hi: per(|p| p.hi),
            zero_point: per(|p| p.zero_point),
            quant_min: params.first().map_or(0.0, |p| p.quant_min),
            quant_max: params.first().map_or(0.0, |p| p.quant_max),
            params: params.to_vec(),
        }
    }

    fn period(&self) -> usize {
        self.scale.len()
    }
}

/// The constants of consecutive rows from row `first` on: `params` over and over. (A `%` per
/// row costs as much as a row of 64 elements.)
#[inline(always)]
fn rows_params(params: &[Affine], first: usize) -> impl Iterator<Item = &Affine> {
    let skip = first % params.len().max(1);
    params[skip..].iter().chain(params.iter().cycle())
}

/// How a kernel walks a tensor.
enum Walk<'a> {
    /// One set of constants for every element.
    Tensor(Affine),
    /// Rows of `inner` elements; row `b` uses `params[b % params.len()]`.
    Rows { inner: usize, params: &'a [Affine] },
    /// Short rows: whole periods of `channels * inner` elements with expanded constants.
    Periods(Expanded),
}

impl<'a> Walk<'a> {
    fn new(layout: ChannelLayout, params: &'a [Affine]) -> Walk<'a> {
        match params {
            [p] => Walk::Tensor(*p),
            // Expanding costs a few floats per element of one period: worth it when periods
            // repeat.
            _ if layout.inner >= SHORT_BLOCK || layout.outer < 4 => Walk::Rows {
                inner: layout.inner,
                params,
            },
            _ => Walk::Periods(Expanded::new(params, layout.inner)),
        }
    }

    /// Jobs are made of whole units.
    fn unit(&self) -> usize {
        match self {
            Walk::Tensor(_) => 1,
            Walk::Rows { inner, .. } => *inner,
            Walk::Periods(e) => e.period(),
        }
        .max(1)
    }

    /// Length of one job: whole units, at least `PARALLEL_CHUNK` elements, all of `n` when `n`
    /// is below the parallel threshold. Depends only on `n` and the layout, so sums come out
    /// the same whatever the number of threads.
    fn job_len(&self, n: usize) -> usize {
        if n < PARALLEL_THRESHOLD {
            return n.max(1);
        }
        let unit = self.unit();
        // Periods: at least 16 per job, which bounds the per-channel partial sums LSQ keeps per
        // job to one per 16 elements.
        let least = if let Walk::Periods(_) = self { 16 } else { 1 };
        (PARALLEL_CHUNK.div_ceil(unit).max(least) * unit)
            .min(n)
            .max(1)
    }
}

// ----- forward -------------------------------------------------------------------------------

#[inline(always)]
fn fq_span<R: Round>(x: &[f32], y: &mut [f32], p: &Affine) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = R::round(clamp(*xi * p.inv, p.lo, p.hi)) * p.scale;
    }
}

#[inline(always)]
fn fq_period<R: Round>(x: &[f32], y: &mut [f32], e: &Expanded) {
    let n = x.len().min(y.len()).min(e.period());
    let (x, y) = (&x[..n], &mut y[..n]);
    let (s, inv, lo, hi) = (&e.scale[..n], &e.inv[..n], &e.lo[..n], &e.hi[..n]);
    for i in 0..n {
        y[i] = R::round(clamp(x[i] * inv[i], lo[i], hi[i])) * s[i];
    }
}

multiversion! {
    /// Fake quantization of one job (whole rows or periods) starting at element `start`.
    fn fq_job<R: Round>(start: usize, x: &[f32], y: &mut [f32], walk: &Walk<'_>) {
        match walk {
            Walk::Periods(e) => {
                for (y, x) in y.chunks_mut(e.period()).zip(x.chunks(e.period())) {
                    fq_period::<R>(x, y, e);
                }
            }
            Walk::Rows { inner, params } => {
                // Explicit loops, not closures: a closure would be compiled without AVX2.
                let rows = y.chunks_mut(*inner).zip(x.chunks(*inner));
                for (p, (y, x)) in rows_params(params, start / inner).zip(rows) {
                    fq_span::<R>(x, y, p);
                }
            }
            Walk::Tensor(p) => fq_span::<R>(x, y, p),
        }
    }
}

fn fq_driver<R: Round>(x: &[f32], y: &mut [f32], walk: &Walk<'_>) {
    let job = walk.job_len(x.len());
    if job >= x.len() {
        fq_job::<R>(0, x, y, walk);
    } else {
        y.par_chunks_mut(job)
            .zip(x.par_chunks(job))
            .enumerate()
            .for_each(|(j, (y, x))| fq_job::<R>(j * job, x, y, walk));
    }
}

/// PyTorch's arithmetic, element by element, for grids too wide for the fast path (more than
/// `2^21` levels on a side). Its per-tensor and per-channel CPU kernels differ there: per
/// tensor, the code `q = float(z) + round(x * (1/s))` stays an `f32`, the mask compares it with
/// `float(quant_min)`, `float(quant_max)` and the output is `f32(q' - z) * s`; per channel, `q`
/// is cast to `int64` first, the mask compares integers and the output is `(q' - z) * s` in
/// `double`, rounded to `f32` (`q'` is `q` clamped to the range). On grids of up to 2^24
/// levels the two agree, and agree with the fast path.
#[derive(Clone, Copy)]
struct Torch {
    per_tensor: bool,
    quant_min: i32,
    quant_max: i32,
    rounding: RoundingPolicy,
}

impl Torch {
    fn new(
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
    fn forward(&self, x: f32, p: &Affine) -> (f32, bool) {
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
    fn lsq(&self, x: f32, p: &Affine) -> Option<(bool, f32, f32)> {
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

/// The exact path for grids too wide for the fast rounding.
fn fq_slow(x: &[f32], y: &mut [f32], layout: ChannelLayout, params: &[Affine], torch: Torch) {
    for (i, (yi, xi)) in y.iter_mut().zip(x).enumerate() {
        *yi = torch.forward(*xi, &params[layout.channel_of(i)]).0;
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
    if x.is_empty() {
        return Ok(());
    }
    if fast_path(&params, quant_min, quant_max) {
        let walk = Walk::new(layout, &params);
        with_rounding!(rounding, fq_driver(x, y, &walk));
    } else {
        fq_slow(
            x,
            y,
            layout,
            &params,
            Torch::new(layout, quant_min, quant_max, rounding),
        );
    }
    Ok(())
}

// ----- straight-through backward ------------------------------------------------------------

#[inline(always)]
fn ste_span<R: Round>(x: &[f32], dy: &[f32], dx: &mut [f32], p: &Affine) {
    for ((g, xi), dyi) in dx.iter_mut().zip(x).zip(dy) {
        // Read before the select: a read inside it became a masked load (vmaskmovps), which
        // made the whole loop several times slower on AMD.
        let d = *dyi;
        // Not clamped first: beyond 2^22 the fast rounding is off by a little, but such a
        // value stays far outside the grid (which is what the mask asks), and ±Inf stays ±Inf.
        let r = R::round(*xi * p.inv);
        // `r` is on the grid iff clamping it changes nothing (NaN compares unequal: mask 0).
        *g += if r == clamp(r, p.lo, p.hi) { d } else { 0.0 };
    }
}

#[inline(always)]
fn ste_period<R: Round>(x: &[f32], dy: &[f32], dx: &mut [f32], e: &Expanded) {
    let n = x.len().min(dy.len()).min(dx.len()).min(e.period());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    let (inv, lo, hi) = (&e.inv[..n], &e.lo[..n], &e.hi[..n]);
    for i in 0..n {
        let d = dy[i];
        let r = R::round(x[i] * inv[i]); // See `ste_span` for why no clamp.
        dx[i] += if r == clamp(r, lo[i], hi[i]) { d } else { 0.0 };
    }
}

multiversion! {
    /// The straight-through gradient of one job starting at element `start`.
    fn ste_job<R: Round>(start: usize, x: &[f32], dy: &[f32], dx: &mut [f32], walk: &Walk<'_>) {
        match walk {
            Walk::Periods(e) => {
                let p = e.period();
                for ((g, x), dy) in dx.chunks_mut(p).zip(x.chunks(p)).zip(dy.chunks(p)) {
                    ste_period::<R>(x, dy, g, e);
                }
            }
            Walk::Rows { inner, params } => {
                let rows = dx.chunks_mut(*inner).zip(x.chunks(*inner)).zip(dy.chunks(*inner));
                for (p, ((g, x), dy)) in rows_params(params, start / inner).zip(rows) {
                    ste_span::<R>(x, dy, g, p);
                }
            }
            Walk::Tensor(p) => ste_span::<R>(x, dy, dx, p),
        }
    }
}

fn ste_driver<R: Round>(x: &[f32], dy: &[f32], dx: &mut [f32], walk: &Walk<'_>) {
    let job = walk.job_len(x.len());
    if job >= x.len() {
        ste_job::<R>(0, x, dy, dx, walk);
    } else {
        dx.par_chunks_mut(job)
            .zip(x.par_chunks(job))
            .zip(dy.par_chunks(job))
            .enumerate()
            .for_each(|(j, ((g, x), dy))| ste_job::<R>(j * job, x, dy, g, walk));
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
    if x.is_empty() {
        return Ok(());
    }
    if fast_path(&params, quant_min, quant_max) {
        let walk = Walk::new(layout, &params);
        with_rounding!(rounding, ste_driver(x, dy, dx, &walk));
    } else {
        let torch = Torch::new(layout, quant_min, quant_max, rounding);
        for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
            let (_, inside) = torch.forward(*xi, &params[layout.channel_of(i)]);
            *g += if inside { *dyi } else { 0.0 };
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

impl std::ops::AddAssign for LsqSums {
    fn add_assign(&mut self, o: LsqSums) {
        self.dscale += o.dscale;
        self.dzero += o.dzero;
    }
}

impl LsqSums {
    fn is_nan(&self) -> bool {
        self.dscale.is_nan() || self.dzero.is_nan()
    }
}

/// One element of LSQ's backward: what it adds to `dx`, to the scale sum and to the
/// zero-point sum (before `grad_factor`).
struct LsqTerms {
    dx: f32,
    ds: f32,
    dz: f32,
}

/// PyTorch's `fake_quantize_learnable_*_grad_kernel_cpu` for one element, with `R` rounding:
/// `q = R(x * (1/s) + z)`; inside the grid `dx = dy`, `ds = dy * ((q - z) * s - x) * (1/s)`;
/// outside `dx = 0`, `ds = dy * (clamp(q) - z)`, `dz = dy` (negated and scaled by the caller).
/// A NaN `x` makes `ds` NaN here: the callers recompute such sums with
/// [`lsq_sums_skipping_nan`], which leaves it out.
#[inline(always)]
fn lsq_terms<R: Round>(x: f32, dy: f32, p: &Affine) -> LsqTerms {
    // PyTorch's backward adds z before rounding (its forward adds it after).
    let w = x * p.inv + p.zero_point;
    // No clamp before rounding, as in `ste_span`: only `inside` and `rc` depend on `r`, and
    // both are exact wherever the fast rounding is not.
    let r = R::round(w);
    let rc = clamp(r, p.quant_min, p.quant_max);
    let inside = r == rc;
    let k = rc - p.zero_point;
    let term = if inside { (k * p.scale - x) * p.inv } else { k };
    LsqTerms {
        dx: if inside { dy } else { 0.0 },
        ds: dy * term,
        dz: if inside { 0.0 } else { dy },
    }
}

/// The gradient sums of a span, element by element in `f64`, leaving out NaN inputs.
fn lsq_sums_skipping_nan<R: Round>(x: &[f32], dy: &[f32], p: &Affine) -> LsqSums {
    let mut sums = LsqSums::default();
    for (xi, dyi) in x.iter().zip(dy).filter(|(xi, _)| !xi.is_nan()) {
        let t = lsq_terms::<R>(*xi, *dyi, p);
        sums.dscale += t.ds as f64;
        sums.dzero += t.dz as f64;
    }
    sums
}

/// Elements per chunk of the two-phase reductions: the per-element terms of one chunk live
/// in a stack buffer (2 KiB per sum, in L1).
const CHUNK: usize = 512;

/// Sums `terms` (whose length is a multiple of [`BLOCK`]) into `wide`: `f32` lanes over 4 terms
/// each, then `f64`. Kept apart from the element-wise loop that produced `terms`: both loops
/// then vectorise cleanly, where one fused loop left LLVM half scalar.
#[inline(always)]
fn reduce_blocks(terms: &[f32], wide: &mut [f64; LANES]) {
    for b in terms.chunks_exact(BLOCK) {
        let mut lanes = [0f32; LANES];
        for j in 0..BLOCK / LANES {
            for l in 0..LANES {
                lanes[l] += b[j * LANES + l];
            }
        }
        for l in 0..LANES {
            wide[l] += lanes[l] as f64;
        }
    }
}

/// LSQ's backward over a span with one set of constants: adds into `dx` and returns the sums.
#[inline(always)]
fn lsq_span<R: Round>(x: &[f32], dy: &[f32], dx: &mut [f32], p: &Affine) -> LsqSums {
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    let mut ds_wide = [0f64; LANES];
    let mut dz_wide = [0f64; LANES];
    let mut sums = LsqSums::default();
    #[cfg(target_arch = "x86_64")]
    if R::HALF_EVEN && !baseline_forced() && std::arch::is_x86_feature_detected!("avx2") {
        let whole = n - n % BLOCK;
        // SAFETY: the CPU supports AVX2, checked just above; the slices are `whole` long.
        unsafe {
            avx2::lsq_blocks_half_even(
                &x[..whole],
                &dy[..whole],
                &mut dx[..whole],
                p,
                &mut ds_wide,
                &mut dz_wide,
            );
        }
        // The tail, then the lanes, in the order the portable code below adds them: the two
        // paths give the same bits.
        for ((x, dy), g) in x[whole..].iter().zip(&dy[whole..]).zip(&mut dx[whole..]) {
            let t = lsq_terms::<R>(*x, *dy, p);
            *g += t.dx;
            sums.dscale += t.ds as f64;
            sums.dzero += t.dz as f64;
        }
        sums.dscale += ds_wide.iter().sum::<f64>();
        sums.dzero += dz_wide.iter().sum::<f64>();
        if sums.is_nan() {
            sums = lsq_sums_skipping_nan::<R>(x, dy, p);
        }
        return sums;
    }
    let mut ts = [0f32; CHUNK];
    let mut tz = [0f32; CHUNK];
    for ((x, dy), g) in x
        .chunks(CHUNK)
        .zip(dy.chunks(CHUNK))
        .zip(dx.chunks_mut(CHUNK))
    {
        let m = x.len().min(dy.len()).min(g.len()).min(CHUNK);
        let (x, dy, g, ts, tz) = (&x[..m], &dy[..m], &mut g[..m], &mut ts[..m], &mut tz[..m]);
        // Phase 1, element-wise: the input gradient, and each element's terms.
        for i in 0..m {
            let t = lsq_terms::<R>(x[i], dy[i], p);
            g[i] += t.dx;
            ts[i] = t.ds;
            tz[i] = t.dz;
        }
        // Phase 2: whole blocks in f32 lanes then f64; a short tail straight into f64.
        let whole = m - m % BLOCK;
        reduce_blocks(&ts[..whole], &mut ds_wide);
        reduce_blocks(&tz[..whole], &mut dz_wide);
        for (s, z) in ts[whole..].iter().zip(&tz[whole..]) {
            sums.dscale += *s as f64;
            sums.dzero += *z as f64;
        }
    }
    sums.dscale += ds_wide.iter().sum::<f64>();
    sums.dzero += dz_wide.iter().sum::<f64>();
    if sums.is_nan() {
        // Rare: a NaN input or gradient. Recompute the sums with NaN inputs left out.
        sums = lsq_sums_skipping_nan::<R>(x, dy, p);
    }
    sums
}

/// Hand-written AVX2 kernels, where LLVM's vectoriser needs help.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Affine, BLOCK, LANES, MAGIC};
    use std::arch::x86_64::*;

    /// [`super::lsq_terms`] with round half to even, over whole blocks of [`BLOCK`] elements,
    /// 8 lanes at a time, in one pass (the portable code needs two): adds into `dx`, and each
    /// block's sums, in `f32` lanes over its 4 vectors, into the `f64` lanes of `ds`, `dz`.
    /// Lane for lane the same operations, in the same order, as the portable code.
    ///
    /// # Safety
    /// The CPU must support AVX2. `x`, `dy` and `dx` must have the same length, a multiple of
    /// [`BLOCK`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lsq_blocks_half_even(
        x: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        p: &Affine,
        ds: &mut [f64; LANES],
        dz: &mut [f64; LANES],
    ) {
        let n = x.len().min(dy.len()).min(dx.len());
        let (xp, yp, gp) = (x.as_ptr(), dy.as_ptr(), dx.as_mut_ptr());
        let inv = _mm256_set1_ps(p.inv);
        let zp = _mm256_set1_ps(p.zero_point);
        let scale = _mm256_set1_ps(p.scale);
        let (qmin, qmax) = (_mm256_set1_ps(p.quant_min), _mm256_set1_ps(p.quant_max));
        let magic = _mm256_set1_ps(MAGIC);
        let (mut ds_lo, mut ds_hi) = (
            _mm256_loadu_pd(ds.as_ptr()),
            _mm256_loadu_pd(ds.as_ptr().add(4)),
        );
        let (mut dz_lo, mut dz_hi) = (
            _mm256_loadu_pd(dz.as_ptr()),
            _mm256_loadu_pd(dz.as_ptr().add(4)),
        );
        let mut i = 0;
        while i + BLOCK <= n {
            let mut s_acc = _mm256_setzero_ps();
            let mut z_acc = _mm256_setzero_ps();
            for _ in 0..BLOCK / 8 {
                // SAFETY (all pointer reads and writes): i + 8 <= n, the length of each slice.
                let xv = _mm256_loadu_ps(xp.add(i));
                let dyv = _mm256_loadu_ps(yp.add(i));
                // max(lo, v) / min(hi, v) return v when v is NaN, like `clamp`.
                let w = _mm256_add_ps(_mm256_mul_ps(xv, inv), zp);
                let r = _mm256_sub_ps(_mm256_add_ps(w, magic), magic);
                let rc = _mm256_min_ps(qmax, _mm256_max_ps(qmin, r));
                let inside = _mm256_cmp_ps::<_CMP_EQ_OQ>(r, rc);
                let k = _mm256_sub_ps(rc, zp);
                let t_in = _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(k, scale), xv), inv);
                let term = _mm256_blendv_ps(k, t_in, inside);
                s_acc = _mm256_add_ps(s_acc, _mm256_mul_ps(dyv, term));
                z_acc = _mm256_add_ps(z_acc, _mm256_andnot_ps(inside, dyv));
                let g = _mm256_add_ps(_mm256_loadu_ps(gp.add(i)), _mm256_and_ps(inside, dyv));
                _mm256_storeu_ps(gp.add(i), g);
                i += 8;
            }
            ds_lo = _mm256_add_pd(ds_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(s_acc)));
            ds_hi = _mm256_add_pd(ds_hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(s_acc)));
            dz_lo = _mm256_add_pd(dz_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(z_acc)));
            dz_hi = _mm256_add_pd(dz_hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(z_acc)));
        }
        _mm256_storeu_pd(ds.as_mut_ptr(), ds_lo);
        _mm256_storeu_pd(ds.as_mut_ptr().add(4), ds_hi);
        _mm256_storeu_pd(dz.as_mut_ptr(), dz_lo);
        _mm256_storeu_pd(dz.as_mut_ptr().add(4), dz_hi);
    }
}

multiversion! {
    /// LSQ's backward over one job starting at element `start`: adds into `dx` and returns the
    /// job's partial sums for [`fold_lsq`]: one for the tensor, one per row, or one per channel
    /// for periods. (Not one per channel for a job of rows: with many channels and many jobs,
    /// that much memory, allocated and page-faulted on every call, cost more than the kernel.)
    fn lsq_job<R: Round>(start: usize, x: &[f32], dy: &[f32], dx: &mut [f32], walk: &Walk<'_>) -> Vec<LsqSums> {
        match walk {
            Walk::Periods(e) => {
                let mut sums = vec![LsqSums::default(); e.params.len()];
                lsq_periods::<R>(x, dy, dx, e, &mut sums);
                sums
            }
            Walk::Rows { inner, params } => {
                let first = start / inner;
                let mut sums = Vec::with_capacity(x.len().div_ceil(*inner));
                let rows = dx.chunks_mut(*inner).zip(x.chunks(*inner)).zip(dy.chunks(*inner));
                // A loop, not a closure: a closure would be compiled without AVX2.
                for (p, ((g, x), dy)) in rows_params(params, first).zip(rows) {
                    sums.push(lsq_span::<R>(x, dy, g, p));
                }
                sums
            }
            Walk::Tensor(p) => vec![lsq_span::<R>(x, dy, dx, p)],
        }
    }
}

/// Adds the partial sums of the job starting at element `start` into per-channel `sums`.
fn fold_lsq(walk: &Walk<'_>, start: usize, part: &[LsqSums], sums: &mut [LsqSums]) {
    match walk {
        Walk::Rows { inner, .. } => {
            let first = start / inner;
            for (b, p) in part.iter().enumerate() {
                let c = (first + b) % sums.len().max(1);
                if let Some(s) = sums.get_mut(c) {
                    *s += *p;
                }
            }
        }
        _ => {
            for (s, p) in sums.iter_mut().zip(part) {
                *s += *p;
            }
        }
    }
}

/// LSQ's backward over whole periods of short rows: per-element `f32` accumulators over at
/// most 4 periods, added element-wise into per-element `f64` accumulators (vectorises, unlike
/// a sum per channel, whose dependency chain cost more than the kernel), which are summed per
/// channel once at the end. The same error bound as the lanes of [`lsq_span`].
#[inline(always)]
fn lsq_periods<R: Round>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    e: &Expanded,
    sums: &mut [LsqSums],
) {
    const FLUSH: usize = 4;
    let period = e.period();
    let inner = e.inner.max(1);
    let mut acc_s = vec![0f32; period];
    let mut acc_z = vec![0f32; period];
    let mut wide_s = vec![0f64; period];
    let mut wide_z = vec![0f64; period];
    let flush = |acc: &mut [f32], wide: &mut [f64]| {
        for (w, a) in wide.iter_mut().zip(acc.iter_mut()) {
            *w += *a as f64;
            *a = 0.0;
        }
    };
    let periods = dx
        .chunks_mut(period)
        .zip(x.chunks(period))
        .zip(dy.chunks(period));
    for (k, ((g, x), dy)) in periods.enumerate() {
        let n = x.len().min(dy.len()).min(g.len()).min(period);
        let (x, dy, g) = (&x[..n], &dy[..n], &mut g[..n]);
        let (s, inv, zp) = (&e.scale[..n], &e.inv[..n], &e.zero_point[..n]);
        let (acc_sn, acc_zn) = (&mut acc_s[..n], &mut acc_z[..n]);
        for i in 0..n {
            let p = Affine {
                scale: s[i],
                inv: inv[i],
                lo: 0.0,
                hi: 0.0,
                zero_point: zp[i],
                zero_point_i: 0,
                quant_min: e.quant_min,
                quant_max: e.quant_max,
            };
            let t = lsq_terms::<R>(x[i], dy[i], &p);
            g[i] += t.dx;
            acc_sn[i] += t.ds;
            acc_zn[i] += t.dz;
        }
        if k % FLUSH == FLUSH - 1 {
            flush(&mut acc_s, &mut wide_s);
            flush(&mut acc_z, &mut wide_z);
        }
    }
    flush(&mut acc_s, &mut wide_s);
    flush(&mut acc_z, &mut wide_z);
    for (sum, (s, z)) in sums
        .iter_mut()
        .zip(wide_s.chunks(inner).zip(wide_z.chunks(inner)))
    {
        sum.dscale += s.iter().sum::<f64>();
        sum.dzero += z.iter().sum::<f64>();
    }
    if sums.iter().any(LsqSums::is_nan) {
        // Rare: a NaN input or gradient. Recompute the sums with NaN inputs left out.
        sums.iter_mut().for_each(|s| *s = LsqSums::default());
        let period = period.max(1);
        for (i, (xi, dyi)) in x
            .iter()
            .zip(dy)
            .enumerate()
            .filter(|(_, (xi, _))| !xi.is_nan())
        {
            let k = i % period;
            let p = Affine {
                scale: e.scale[k],
                inv: e.inv[k],
                lo: 0.0,
                hi: 0.0,
                zero_point: e.zero_point[k],
                zero_point_i: 0,
                quant_min: e.quant_min,
                quant_max: e.quant_max,
            };
            let t = lsq_terms::<R>(*xi, *dyi, &p);
            if let Some(sum) = sums.get_mut(k / inner) {
                sum.dscale += t.ds as f64;
                sum.dzero += t.dz as f64;
            }
        }
    }
}

fn lsq_driver<R: Round>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    walk: &Walk<'_>,
    channels: usize,
) -> Vec<LsqSums> {
    let mut sums = vec![LsqSums::default(); channels];
    let job = walk.job_len(x.len());
    if job >= x.len() {
        fold_lsq(walk, 0, &lsq_job::<R>(0, x, dy, dx, walk), &mut sums);
        return sums;
    }
    let partial: Vec<Vec<LsqSums>> = dx
        .par_chunks_mut(job)
        .zip(x.par_chunks(job))
        .zip(dy.par_chunks(job))
        .enumerate()
        .map(|(j, ((g, x), dy))| lsq_job::<R>(j * job, x, dy, g, walk))
        .collect();
    // Folded in job order: the same result whatever the number of threads.
    for (j, part) in partial.iter().enumerate() {
        fold_lsq(walk, j * job, part, &mut sums);
    }
    sums
}

/// The exact path for grids too wide for the fast rounding.
fn lsq_slow(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    params: &[Affine],
    torch: Torch,
) -> Vec<LsqSums> {
    let mut sums = vec![LsqSums::default(); layout.channels];
    for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
        let c = layout.channel_of(i);
        if let Some((inside, ds, dz)) = torch.lsq(*xi, &params[c]) {
            *g += if inside { *dyi } else { 0.0 };
            sums[c].dscale += (*dyi * ds) as f64;
            sums[c].dzero += (*dyi * dz) as f64;
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
/// applied to the scale and zero-point gradients. With `q = round(x * (1/scale) + z)` (the
/// zero point added before rounding, as PyTorch's backward does) and `z` the zero point
/// rounded as the forward rounds it (see the module docs for where PyTorch differs):
///
/// ```text
/// inside:      dx = dy,  dscale = dy * (x_fq - x) / scale * g,               dzero = 0
/// below/above: dx = 0,   dscale = dy * (quant_min|quant_max - z) * g,   dzero = -dy * scale * g
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
/// channel). Zero points are learnable floats, rounded as [`round_zero_point`] says. Per
/// channel this is PyTorch's `_fake_quantize_learnable_per_channel_affine_backward`.
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
    if x.is_empty() {
        return Ok(());
    }
    let sums = if fast_path(&params, quant_min, quant_max) {
        let walk = Walk::new(layout, &params);
        with_rounding!(rounding, lsq_driver(x, dy, dx, &walk, layout.channels))
    } else {
        lsq_slow(
            x,
            dy,
            dx,
            layout,
            &params,
            Torch::new(layout, quant_min, quant_max, rounding),
        )
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

/// PACT's backward over a span: adds into `dx`, returns `Σ dy·[x ≥ α]`.
#[inline(always)]
fn pact_span(x: &[f32], dy: &[f32], dx: &mut [f32], alpha: f32) -> f64 {
    #[inline(always)]
    fn terms(x: f32, dy: f32, alpha: f32) -> (f32, f32) {
        let inside = x >= 0.0 && x < alpha;
        (
            if inside { dy } else { 0.0 },
            if x >= alpha { dy } else { 0.0 },
        )
    }
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    // As in LSQ: element-wise terms into a stack buffer, then f32 lanes and f64 blocks.
    let mut wide = [0f64; LANES];
    let mut dalpha = 0f64;
    let mut ta = [0f32; CHUNK];
    for ((x, dy), g) in x
        .chunks(CHUNK)
        .zip(dy.chunks(CHUNK))
        .zip(dx.chunks_mut(CHUNK))
    {
        let m = x.len().min(dy.len()).min(g.len()).min(CHUNK);
        let (x, dy, g, ta) = (&x[..m], &dy[..m], &mut g[..m], &mut ta[..m]);
        for i in 0..m {
            let (d, a) = terms(x[i], dy[i], alpha);
            g[i] += d;
            ta[i] = a;
        }
        let whole = m - m % BLOCK;
        reduce_blocks(&ta[..whole], &mut wide);
        dalpha += ta[whole..].iter().map(|a| *a as f64).sum::<f64>();
    }
    dalpha + wide.iter().sum::<f64>()
}

multiversion! {
    fn pact_job<>(x: &[f32], dy: &[f32], dx: &mut [f32], alpha: f32) -> f64 {
        pact_span(x, dy, dx, alpha)
    }
}

/// PACT backward: adds `dy·[0 ≤ x < α]` into `dx` and returns `dα = Σ dy·[x ≥ α]`. Extra
/// elements of the longer buffers, if the lengths differ, are left alone.
pub fn pact_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    alpha: f32,
    grid: crate::grid::IntegerGrid,
) -> f32 {
    let a = pact_alpha(alpha, grid);
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    if n < PARALLEL_THRESHOLD {
        return pact_job(x, dy, dx, a) as f32;
    }
    let parts: Vec<f64> = dx
        .par_chunks_mut(PARALLEL_CHUNK)
        .zip(x.par_chunks(PARALLEL_CHUNK))
        .zip(dy.par_chunks(PARALLEL_CHUNK))
        .map(|((g, x), dy)| pact_job(x, dy, g, a))
        .collect();
    parts.iter().sum::<f64>() as f32
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
                    // At most 17 bits: exact in i32 and in f32, and vectorises (cvtdq2ps).
                    (self as i32 - zero_point) as f32
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

/// An integer-valued `f32` with `|v| < 2^22` as `i32`, exactly: vectorises where `as i32` on
/// a float (a saturating conversion) does not.
#[inline(always)]
fn small_int(v: f32) -> i32 {
    (v + MAGIC).to_bits() as i32 - MAGIC_BITS
}

#[inline(always)]
fn q_span<T: QuantInt, R: Round>(x: &[f32], q: &mut [T], p: &Affine) {
    for (qi, xi) in q.iter_mut().zip(x) {
        *qi = T::from_i32(small_int(
            R::round(clamp(*xi * p.inv, p.lo, p.hi)) + p.zero_point,
        ));
    }
}

#[inline(always)]
fn q_period<T: QuantInt, R: Round>(x: &[f32], q: &mut [T], e: &Expanded) {
    let n = x.len().min(q.len()).min(e.period());
    let (x, q) = (&x[..n], &mut q[..n]);
    let (inv, lo, hi, zp) = (&e.inv[..n], &e.lo[..n], &e.hi[..n], &e.zero_point[..n]);
    for i in 0..n {
        q[i] = T::from_i32(small_int(
            R::round(clamp(x[i] * inv[i], lo[i], hi[i])) + zp[i],
        ));
    }
}

multiversion! {
    fn q_job<T: QuantInt, R: Round>(start: usize, x: &[f32], q: &mut [T], walk: &Walk<'_>) {
        match walk {
            Walk::Periods(e) => {
                for (q, x) in q.chunks_mut(e.period()).zip(x.chunks(e.period())) {
                    q_period::<T, R>(x, q, e);
                }
            }
            Walk::Rows { inner, params } => {
                let rows = q.chunks_mut(*inner).zip(x.chunks(*inner));
                for (p, (q, x)) in rows_params(params, start / inner).zip(rows) {
                    q_span::<T, R>(x, q, p);
                }
            }
            Walk::Tensor(p) => q_span::<T, R>(x, q, p),
        }
    }
}

fn q_driver<T: QuantInt, R: Round>(x: &[f32], q: &mut [T], walk: &Walk<'_>) {
    let job = walk.job_len(x.len());
    if job >= x.len() {
        q_job::<T, R>(0, x, q, walk);
    } else {
        q.par_chunks_mut(job)
            .zip(x.par_chunks(job))
            .enumerate()
            .for_each(|(j, (q, x))| q_job::<T, R>(j * job, x, q, walk));
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
    let params = affines(scales, zero_points, quant_min, quant_max, layout.channels)?;
    if x.is_empty() {
        return Ok(());
    }
    if fast_path(&params, quant_min, quant_max) {
        let walk = Walk::new(layout, &params);
        match rounding {
            RoundingPolicy::HalfEven => q_driver::<T, HalfEven>(x, q, &walk),
            RoundingPolicy::HalfAwayFromZero => q_driver::<T, HalfAwayFromZero>(x, q, &walk),
            RoundingPolicy::HalfUp => q_driver::<T, HalfUp>(x, q, &walk),
            RoundingPolicy::HalfDown => q_driver::<T, HalfDown>(x, q, &walk),
            RoundingPolicy::HalfTowardZero => q_driver::<T, HalfTowardZero>(x, q, &walk),
            RoundingPolicy::Floor => q_driver::<T, Floor>(x, q, &walk),
            RoundingPolicy::Ceil => q_driver::<T, Ceil>(x, q, &walk),
        }
    } else {
        for (i, (qi, xi)) in q.iter_mut().zip(x).enumerate() {
            let p = &params[layout.channel_of(i)];
            // PyTorch's quantize_val: `clamp(int64(z + round(x * (1/s))))`; NaN was rejected.
            let code = (p.zero_point + rounding.round(*xi * p.inv)) as i64;
            *qi = T::from_i32(code.clamp(quant_min as i64, quant_max as i64) as i32);
        }
    }
    Ok(())
}

#[inline(always)]
fn dq_span<T: QuantInt>(q: &[T], y: &mut [f32], scale: f32, zero_point: i32) {
    for (yi, qi) in y.iter_mut().zip(q) {
        *yi = qi.minus_zero_point(zero_point) * scale;
    }
}

multiversion! {
    fn dq_job<T: QuantInt>(start: usize, q: &[T], y: &mut [f32], walk: &Walk<'_>) {
        match walk {
            Walk::Periods(e) => {
                // Short rows: one row at a time (dequantization is not on the training path).
                let inner = e.inner.max(1);
                let rows = y.chunks_mut(inner).zip(q.chunks(inner));
                for (p, (y, q)) in rows_params(&e.params, start / inner).zip(rows) {
                    dq_span(q, y, p.scale, p.zero_point_i);
                }
            }
            Walk::Rows { inner, params } => {
                let rows = y.chunks_mut(*inner).zip(q.chunks(*inner));
                for (p, (y, q)) in rows_params(params, start / inner).zip(rows) {
                    dq_span(q, y, p.scale, p.zero_point_i);
                }
            }
            Walk::Tensor(p) => dq_span(q, y, p.scale, p.zero_point_i),
        }
    }
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
    let job = walk.job_len(q.len());
    if job >= q.len() {
        dq_job(0, q, y, &walk);
    } else {
        y.par_chunks_mut(job)
            .zip(q.par_chunks(job))
            .enumerate()
            .for_each(|(j, (y, q))| dq_job(j * job, q, y, &walk));
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

    // ----- every kernel against a scalar reference, on every walk and both SIMD levels -------

    /// Deterministic inputs with exact ties for `scale` (and plenty of out-of-range values).
    fn inputs(n: usize, scale: f32, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let k = ((s >> 40) % 400) as f32 - 200.0;
                match i % 4 {
                    // Exact ties k + 1/2 (scale is a power of two in the tests that need it).
                    0 => (k + 0.5) * scale,
                    1 => k * scale,
                    _ => ((s >> 20) as u32 as f32 / u32::MAX as f32 - 0.5) * 300.0 * scale,
                }
            })
            .collect()
    }

    /// The layouts the drivers treat differently: per tensor, long rows, short rows (periods),
    /// short rows that do not repeat, each small and above the parallel threshold.
    fn layouts() -> Vec<(Vec<usize>, Option<usize>)> {
        vec![
            (vec![1000], None),
            (vec![3, 5, 7], Some(0)),
            (vec![3, 5, 7], Some(1)),
            (vec![3, 5, 7], Some(2)),
            (vec![PARALLEL_THRESHOLD + 999], None),
            (vec![70, 31, 130], Some(1)),
            (vec![300, 17, 60], Some(1)),
            (vec![2, 150_001, 1], Some(1)),
        ]
    }

    fn params(channels: usize) -> (Vec<f32>, Vec<i32>) {
        let scales = (0..channels)
            .map(|c| [0.5, 0.25, 0.125, 0.0625][c % 4])
            .collect();
        let zps = (0..channels).map(|c| (c % 7) as i32 - 3).collect();
        (scales, zps)
    }

    fn lsq_reference(
        x: f32,
        dy: f32,
        s: f32,
        z: i32,
        qmin: i32,
        qmax: i32,
        policy: RoundingPolicy,
    ) -> Option<(bool, f64, f64)> {
        let w = x * (1.0 / s) + z as f32;
        if w.is_nan() {
            return None;
        }
        let q = policy.round(w) as i64;
        let (lo, hi) = (qmin as i64, qmax as i64);
        Some(if q < lo || q > hi {
            let k = (q.clamp(lo, hi) - z as i64) as f32;
            (false, (dy * k) as f64, dy as f64)
        } else {
            let fq = (q - z as i64) as f32 * s;
            (true, (dy * ((fq - x) * (1.0 / s))) as f64, 0.0)
        })
    }

    /// Runs `f` with the AVX2 code (where the CPU has it) and with the baseline code.
    fn both_levels(mut f: impl FnMut(&str)) {
        use std::sync::atomic::Ordering::Relaxed;
        f("default");
        FORCE_BASELINE.store(true, Relaxed);
        f("baseline");
        FORCE_BASELINE.store(false, Relaxed);
    }

    #[test]
    fn every_kernel_matches_the_scalar_reference_on_every_layout() {
        let (qmin, qmax) = (-128, 127);
        both_levels(|level| {
            for (shape, axis) in layouts() {
                let layout = ChannelLayout::new(&shape, axis).unwrap();
                let n = layout.numel();
                let (scales, zps) = params(layout.channels);
                let x = inputs(n, 0.5, 7);
                let dy = inputs(n, 0.01, 11);
                for policy in RoundingPolicy::ALL {
                    let what = format!("{level} {shape:?} {axis:?} {policy:?}");
                    let mut y = vec![0.0; n];
                    fake_quantize_affine_into(
                        &x, &mut y, layout, &scales, &zps, qmin, qmax, policy,
                    )
                    .unwrap();
                    let mut dx = vec![0.0; n];
                    fake_quantize_affine_backward_into(
                        &x, &dy, &mut dx, layout, &scales, &zps, qmin, qmax, policy,
                    )
                    .unwrap();
                    let mut q = vec![0i8; n];
                    quantize_into(&x, &mut q, layout, &scales, &zps, qmin, qmax, policy).unwrap();
                    let mut dq = vec![0.0; n];
                    dequantize_into(&q, &mut dq, layout, &scales, &zps, qmin, qmax).unwrap();
                    for i in (0..n).step_by(1 + n / 20_000) {
                        let c = layout.channel_of(i);
                        let e = reference(x[i], scales[c], zps[c], qmin, qmax, policy);
                        assert_eq!(y[i].to_bits(), e.to_bits(), "{what}: y[{i}], x = {}", x[i]);
                        assert_eq!(
                            dq[i].to_bits(),
                            e.to_bits(),
                            "{what}: dequantize(quantize)[{i}]"
                        );
                        let code = policy.round(x[i] * (1.0 / scales[c])) as i64 + zps[c] as i64;
                        let inside = (qmin as i64..=qmax as i64).contains(&code);
                        assert_eq!(dx[i], if inside { dy[i] } else { 0.0 }, "{what}: dx[{i}]");
                    }
                }
            }
        });
    }

    #[test]
    fn lsq_matches_the_scalar_reference_on_every_layout() {
        let (qmin, qmax) = (-8, 7);
        both_levels(|level| {
            for (shape, axis) in layouts() {
                let layout = ChannelLayout::new(&shape, axis).unwrap();
                let n = layout.numel();
                let (scales, zps) = params(layout.channels);
                let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
                let x = inputs(n, 0.5, 3);
                let dy = inputs(n, 0.01, 5);
                for policy in [
                    RoundingPolicy::HalfEven,
                    RoundingPolicy::HalfUp,
                    RoundingPolicy::Floor,
                ] {
                    let what = format!("{level} {shape:?} {axis:?} {policy:?}");
                    let channels = layout.channels;
                    let mut dx = vec![0.0; n];
                    let (mut ds, mut dz) = (vec![0.0; channels], vec![0.0; channels]);
                    fake_quantize_learnable_affine_backward_into(
                        &x, &dy, &mut dx, layout, &scales, &zf, qmin, qmax, 1.0, policy, &mut ds,
                        &mut dz,
                    )
                    .unwrap();
                    // (ds, dz, Σ|ds terms|, Σ|dz terms|)
                    let mut exact = vec![(0f64, 0f64, 0f64, 0f64); channels];
                    for i in 0..n {
                        let c = layout.channel_of(i);
                        let (inside, t, u) =
                            lsq_reference(x[i], dy[i], scales[c], zps[c], qmin, qmax, policy)
                                .unwrap();
                        assert_eq!(dx[i], if inside { dy[i] } else { 0.0 }, "{what}: dx[{i}]");
                        exact[c].0 += t;
                        exact[c].1 += u;
                        exact[c].2 += t.abs();
                        exact[c].3 += u.abs();
                    }
                    // Within 1e-6 of the exact sum, relative to the sum or (when terms of both
                    // signs cancel) to 1e-3 of the sum of their absolute values.
                    let close = |got: f32, e: f64, l1: f64| {
                        (got as f64 - e).abs() <= 1e-6 * e.abs().max(l1 * 1e-3)
                    };
                    for c in 0..channels {
                        let (es, ez, l1s, l1z) = exact[c];
                        let s = scales[c] as f64;
                        assert!(close(ds[c], es, l1s), "{what}: ds[{c}] {} vs {es}", ds[c]);
                        assert!(
                            close(dz[c], -ez * s, l1z * s),
                            "{what}: dz[{c}] {} vs {}",
                            dz[c],
                            -ez * s
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn nan_inputs_add_nothing_to_lsq_sums_and_nan_gradients_propagate() {
        for (shape, axis) in layouts() {
            let layout = ChannelLayout::new(&shape, axis).unwrap();
            let n = layout.numel();
            let channels = layout.channels;
            let (scales, zps) = params(channels);
            let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
            let x = inputs(n, 0.5, 9);
            let dy = inputs(n, 0.01, 13);
            let run = |x: &[f32], dy: &[f32]| {
                let mut dx = vec![0.0; n];
                let (mut ds, mut dz) = (vec![0.0; channels], vec![0.0; channels]);
                fake_quantize_learnable_affine_backward_into(
                    x,
                    dy,
                    &mut dx,
                    layout,
                    &scales,
                    &zf,
                    -128,
                    127,
                    1.0,
                    RoundingPolicy::HalfEven,
                    &mut ds,
                    &mut dz,
                )
                .unwrap();
                (dx, ds, dz)
            };
            // Element 0 dropped from the sums: its terms are recomputed without it.
            let mut x_nan = x.clone();
            x_nan[0] = f32::NAN;
            let (dx_nan, ds_nan, dz_nan) = run(&x_nan, &dy);
            let mut dy_zero = dy.clone();
            dy_zero[0] = 0.0;
            let (_, ds_ref, dz_ref) = run(&x, &dy_zero);
            assert_eq!(dx_nan[0], 0.0, "{shape:?}");
            for c in 0..channels {
                assert!(
                    ds_nan[c].is_finite() && dz_nan[c].is_finite(),
                    "{shape:?} channel {c}"
                );
                assert!(
                    (ds_nan[c] - ds_ref[c]).abs() <= 1e-5 * ds_ref[c].abs().max(1.0),
                    "{shape:?} {c}"
                );
                assert!(
                    (dz_nan[c] - dz_ref[c]).abs() <= 1e-5 * dz_ref[c].abs().max(1.0),
                    "{shape:?} {c}"
                );
            }
            let mut dy_nan = dy.clone();
            dy_nan[0] = f32::NAN;
            let (_, ds, _) = run(&x, &dy_nan);
            assert!(ds[layout.channel_of(0)].is_nan(), "{shape:?}");
        }
    }

    #[test]
    fn results_do_not_depend_on_the_number_of_threads() {
        let layout = ChannelLayout::new(&[300, 17, 60], Some(1)).unwrap();
        let n = layout.numel();
        let (scales, zps) = params(17);
        let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
        let (x, dy) = (inputs(n, 0.5, 21), inputs(n, 0.01, 23));
        let run = || {
            let mut dx = vec![0.0; n];
            let (mut ds, mut dz) = (vec![0.0; 17], vec![0.0; 17]);
            fake_quantize_learnable_affine_backward_into(
                &x,
                &dy,
                &mut dx,
                layout,
                &scales,
                &zf,
                -128,
                127,
                0.01,
                RoundingPolicy::HalfEven,
                &mut ds,
                &mut dz,
            )
            .unwrap();
            let t = ChannelLayout::per_tensor(n);
            let (mut dst, mut dzt) = ([0.0], [0.0]);
            fake_quantize_learnable_affine_backward_into(
                &x,
                &dy,
                &mut dx,
                t,
                &[0.5],
                &[1.0],
                -128,
                127,
                0.01,
                RoundingPolicy::HalfEven,
                &mut dst,
                &mut dzt,
            )
            .unwrap();
            let grid = crate::grid::IntegerGrid::new(8, false, false).unwrap();
            let da = pact_backward_into(&x, &dy, &mut dx, 20.0, grid);
            (dx, ds, dz, dst, dzt, da)
        };
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(run);
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(run);
        assert_eq!(format!("{one:?}"), format!("{three:?}"));
    }

    #[test]
    fn pact_backward_matches_the_scalar_reference() {
        let grid = crate::grid::IntegerGrid::new(8, false, false).unwrap();
        both_levels(|level| {
            for n in [37, PARALLEL_THRESHOLD + 77] {
                let x = inputs(n, 0.05, 31);
                let dy = inputs(n, 0.01, 37);
                let mut dx = vec![0.5; n];
                let da = pact_backward_into(&x, &dy, &mut dx, 3.0, grid);
                let mut exact = 0f64;
                for i in 0..n {
                    let inside = x[i] >= 0.0 && x[i] < 3.0;
                    assert_eq!(
                        dx[i],
                        0.5 + if inside { dy[i] } else { 0.0 },
                        "{level} {n} dx[{i}]"
                    );
                    exact += if x[i] >= 3.0 { dy[i] as f64 } else { 0.0 };
                }
                assert!(
                    (da as f64 - exact).abs() <= 1e-6 * exact.abs().max(1e-3),
                    "{level} {n}: {da} vs {exact}"
                );
            }
        });
    }

    #[test]
    fn wide_grids_keep_integer_codes_exact() {
        // Codes beyond 2^24 follow PyTorch's quantize_val: `int64(float(z) + round(x/s))`, the
        // addition in f32 (so 2^24 + 3 rounds to 2^24 + 4), then clamped to the range.
        let x = [16_777_217.0f32, -16_777_219.0, 1e12, -1e12, 0.5, 1.5];
        let layout = ChannelLayout::per_tensor(x.len());
        let mut q = [0i32; 6];
        quantize_into(
            &x,
            &mut q,
            layout,
            &[1.0],
            &[3],
            i32::MIN,
            i32::MAX,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        assert_eq!(q, [16_777_220, -16_777_216, i32::MAX, i32::MIN, 3, 5]);
        let mut y = [0.0; 6];
        dequantize_into(&q, &mut y, layout, &[1.0], &[3], i32::MIN, i32::MAX).unwrap();
        assert_eq!(y[0], 16_777_216.0); // (2^24 + 1) as f32
                                        // PyTorch's per-tensor mask compares f32 codes with f32(quant_max): 2^31 is inside.
        let mut dx = [0.0; 1];
        let top = [2_147_483_648.0f32];
        let l1 = ChannelLayout::per_tensor(1);
        fake_quantize_affine_backward_into(
            &top,
            &[1.0],
            &mut dx,
            l1,
            &[1.0],
            &[0],
            i32::MIN,
            i32::MAX,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        assert_eq!(dx, [1.0]);
        // Per channel, the code is an int64: 2^31 is outside.
        let lc = ChannelLayout::new(&[1], Some(0)).unwrap();
        let mut dx = [0.0; 1];
        fake_quantize_affine_backward_into(
            &top,
            &[1.0],
            &mut dx,
            lc,
            &[1.0],
            &[0],
            i32::MIN,
            i32::MAX,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        assert_eq!(dx, [0.0]);
    }

    #[test]
    fn empty_tensors_are_fine() {
        let l = ChannelLayout::new(&[0, 4], Some(1)).unwrap();
        let (s, z) = params(4);
        fake_quantize_affine_into(&[], &mut [], l, &s, &z, -128, 127, RoundingPolicy::HalfEven)
            .unwrap();
        fake_quantize_affine_backward_into(
            &[],
            &[],
            &mut [],
            l,
            &s,
            &z,
            -128,
            127,
            RoundingPolicy::HalfEven,
        )
        .unwrap();
        let (mut ds, mut dz) = (vec![0.0; 4], vec![0.0; 4]);
        let zf = [0.0; 4];
        fake_quantize_learnable_affine_backward_into(
            &[],
            &[],
            &mut [],
            l,
            &s,
            &zf,
            -128,
            127,
            1.0,
            RoundingPolicy::HalfEven,
            &mut ds,
            &mut dz,
        )
        .unwrap();
        assert_eq!(ds, vec![0.0; 4]);
        quantize_into::<i8>(&[], &mut [], l, &s, &z, -128, 127, RoundingPolicy::HalfEven).unwrap();
        dequantize_into::<i8>(&[], &mut [], l, &s, &z, -128, 127).unwrap();
    }
}

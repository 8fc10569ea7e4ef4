//! Threshold and range selection on a [`Histogram`]: percentile, minimum MSE and minimum KL
//! divergence (TensorRT's entropy calibration).

use quant_core::{
    power_of_two_threshold, qparams_from_range, uniform_qparams, IntegerGrid, QuantError,
    QuantizationMethod, Result, RoundingPolicy,
};

use super::config::Percentile;
use super::histogram::Histogram;

/// `1.5 · 2^23`: adding and subtracting it rounds half to even for `|v| ≤ 2^22` (as quant-core's
/// kernels do), so the MSE loops vectorise without `roundps`. The values are clamped to the
/// grid first (at most `2^17` away from 0), which commutes with rounding.
const MAGIC: f32 = 12_582_912.0;

/// Rounding of an already clamped value, one zero-sized type per [`RoundingPolicy`]; agrees
/// with [`RoundingPolicy::round`] (tested).
trait Round {
    fn round(v: f32) -> f32;
}

macro_rules! rounding {
    ($name:ident, |$v:ident, $r:ident, $d:ident| $body:expr) => {
        struct $name;
        impl Round for $name {
            #[inline(always)]
            #[allow(unused_variables)]
            fn round($v: f32) -> f32 {
                let $r = ($v + MAGIC) - MAGIC;
                // Exact (Sterbenz): |v - r| <= 0.5.
                let $d = $v - $r;
                $body
            }
        }
    };
}

fn one(c: bool) -> f32 {
    if c {
        1.0
    } else {
        0.0
    }
}

rounding!(HalfEven, |v, r, d| r);
rounding!(HalfAwayFromZero, |v, r, d| r + one(d == 0.5 && v > 0.0)
    - one(d == -0.5 && v < 0.0));
rounding!(HalfUp, |v, r, d| r + one(d == 0.5));
rounding!(HalfDown, |v, r, d| r - one(d == -0.5));
rounding!(HalfTowardZero, |v, r, d| r + one(d == 0.5 && v < 0.0)
    - one(d == -0.5 && v > 0.0));
rounding!(Floor, |v, r, d| r - one(d < 0.0));
rounding!(Ceil, |v, r, d| r + one(d > 0.0));

/// The nonempty bins of a histogram as weighted points at their centres.
struct Points {
    centres: Vec<f32>,
    weights: Vec<f64>,
}

/// Sum of `w · (fq(c) − c)²` with `fq` the affine fake quantization of quant-core's kernels:
/// `R(clamp(c · (1/s), quant_min − z, quant_max − z)) · s`. Differences are taken and squared
/// in `f64` so values near `f32::MAX` cannot overflow.
fn sse<R: Round>(p: &Points, scale: f32, lo: f32, hi: f32) -> f64 {
    let inv = 1.0 / scale;
    let mut acc = [0f64; 4];
    let mut cs = p.centres.chunks_exact(4);
    let mut ws = p.weights.chunks_exact(4);
    for (c, w) in (&mut cs).zip(&mut ws) {
        for i in 0..4 {
            let y = R::round((c[i] * inv).max(lo).min(hi)) * scale;
            let d = f64::from(y) - f64::from(c[i]);
            acc[i] += w[i] * d * d;
        }
    }
    for (c, w) in cs.remainder().iter().zip(ws.remainder()) {
        let y = R::round((c * inv).max(lo).min(hi)) * scale;
        let d = f64::from(y) - f64::from(*c);
        acc[0] += w * d * d;
    }
    acc.iter().sum()
}

impl Points {
    /// Summed squared error of quantizing every point with `(scale, zero_point)` on `grid`.
    fn sse(&self, scale: f32, zero_point: i32, grid: IntegerGrid, rounding: RoundingPolicy) -> f64 {
        let lo = (grid.quant_min() - zero_point) as f32;
        let hi = (grid.quant_max() - zero_point) as f32;
        match rounding {
            RoundingPolicy::HalfEven => sse::<HalfEven>(self, scale, lo, hi),
            RoundingPolicy::HalfAwayFromZero => sse::<HalfAwayFromZero>(self, scale, lo, hi),
            RoundingPolicy::HalfUp => sse::<HalfUp>(self, scale, lo, hi),
            RoundingPolicy::HalfDown => sse::<HalfDown>(self, scale, lo, hi),
            RoundingPolicy::HalfTowardZero => sse::<HalfTowardZero>(self, scale, lo, hi),
            RoundingPolicy::Floor => sse::<Floor>(self, scale, lo, hi),
            RoundingPolicy::Ceil => sse::<Ceil>(self, scale, lo, hi),
        }
    }
}

/// `(100 − p) · total`: how many values (times 100) percentile `p` may leave outside. Counts
/// are compared as `count · 100` against it, so round percentiles (80, 99) stay exact where
/// `1 − p/100` would not be (`1 − 0.8 = 0.19999…`).
fn allowed_outside(p: Percentile, total: u64) -> f64 {
    (100.0 - p.get()) * total as f64
}

/// Most power-of-two thresholds [`Histogram::mse_threshold`] tries below the first.
const MAX_POW2_CANDIDATES: usize = 64;
/// Most rounds of coordinate descent in [`Histogram::mse_range`].
const MAX_DESCENT_ROUNDS: usize = 8;

impl Histogram {
    fn points(&self) -> Points {
        let w = self.bin_width();
        let b = self.bins() as f64;
        let (centres, weights) = self
            .counts()
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(j, n)| {
                // While the range is 0 every value is 0, and so is every centre.
                let c = if self.range() == 0.0 {
                    0.0
                } else {
                    ((j as f64 - b + 0.5) * w) as f32
                };
                (c, *n as f64)
            })
            .unzip();
        Points { centres, weights }
    }

    /// Mean squared error of fake-quantizing the histogram's values (each taken at its bin
    /// centre) with `(scale, zero_point)` on `grid` and `rounding`; 0 for an empty histogram.
    ///
    /// # Errors
    /// A scale that is not finite and positive.
    pub fn quantization_error(
        &self,
        scale: f32,
        zero_point: i32,
        grid: IntegerGrid,
        rounding: RoundingPolicy,
    ) -> Result<f64> {
        if !(scale.is_finite() && scale >= f32::MIN_POSITIVE) {
            return Err(QuantError::InvalidScale {
                what: "scale".into(),
                value: scale,
            });
        }
        let total = self.total();
        if total == 0 {
            return Ok(0.0);
        }
        Ok(self.points().sse(scale, zero_point, grid, rounding) / total as f64)
    }

    /// The symmetric threshold of percentile `p`: the smallest bin edge `k·w` of the `|x|`
    /// histogram with at most `(1 − p/100)·total` values above it, capped at `max|x|`
    /// (exactly `max|x|` when that edge cuts nothing). 0 for an empty histogram.
    pub fn percentile_threshold(&self, p: Percentile) -> f32 {
        let total = self.total();
        if total == 0 || self.range() == 0.0 {
            return 0.0;
        }
        let allowed = allowed_outside(p, total);
        let w = self.bin_width();
        let mut above = total;
        for (k, n) in self.abs_counts().iter().enumerate() {
            above -= n;
            if above == 0 {
                // Nothing cut: the exact extreme, not the edge of the bin float binning put it in.
                return self.max_abs();
            }
            if above as f64 * 100.0 <= allowed {
                return (((k + 1) as f64 * w) as f32).min(self.max_abs());
            }
        }
        self.max_abs()
    }

    /// The two-sided range of percentile `p` on the signed histogram: `lo` is the largest bin
    /// edge with at most `(1 − p/100)·total` values below it, `hi` the smallest with at most as
    /// many above it, clamped to the observed `[min, max]` (exactly `min` or `max` on a side
    /// that cuts nothing). `(0, 0)` for an empty histogram.
    pub fn percentile_range(&self, p: Percentile) -> (f32, f32) {
        let Some((min, max)) = self.min_max() else {
            return (0.0, 0.0);
        };
        if self.range() == 0.0 {
            return (min, max);
        }
        let allowed = allowed_outside(p, self.total());
        let counts = self.counts();
        let mut below = 0u64;
        let mut lo_edge = 0;
        for (j, n) in counts.iter().enumerate() {
            if (below + n) as f64 * 100.0 > allowed {
                lo_edge = j;
                break;
            }
            below += n;
        }
        let mut above = 0u64;
        let mut hi_edge = counts.len();
        for (j, n) in counts.iter().enumerate().rev() {
            if (above + n) as f64 * 100.0 > allowed {
                hi_edge = j + 1;
                break;
            }
            above += n;
        }
        // Nothing cut on a side: the exact extreme, not the edge of the bin float binning put it in.
        let lo = if below == 0 {
            min
        } else {
            self.edge(lo_edge).max(min)
        };
        let hi = if above == 0 {
            max
        } else {
            self.edge(hi_edge).min(max)
        };
        (lo.min(hi), hi.max(lo))
    }

    /// TensorRT's entropy calibration threshold, as NVIDIA's pytorch-quantization computes it
    /// (`_compute_amax_entropy`), on the `|x|` histogram `h` of `B = bins` bins of width `w`,
    /// merged into `n = target_bins` quantized bins:
    ///
    /// 1. `h[0] = h[1]` (NVIDIA's damping of the zero bin, which ReLU outputs flood).
    /// 2. For every candidate `i` in `n..=B` (TensorRT's 128..=2048 for int8):
    ///    - reference `P = h[0..i]` with the outliers `Σ h[i..]` added to `P[i-1]`;
    ///    - candidate `Q`: bin `t < i` belongs to quantized bin `floor(t·n / i)`; each
    ///      quantized bin's mass `Σ h[t]` is spread evenly over its nonempty bins, and empty
    ///      bins get 0 (the outliers are not in `Q`);
    ///    - `KL(P‖Q) = Σ p·ln(p/q)` over `p > 0` after normalising both to sum 1, infinite where
    ///      `p > 0 = q`.
    /// 3. The threshold is `i·w` for the candidate with the smallest divergence, the largest
    ///    such `i` on ties, capped at `max|x|`.
    ///
    /// With fewer bins than quantized bins (`B < n`, e.g. 16-bit grids) no clipping can be
    /// justified at this resolution and the result is `max|x|`. 0 for an empty histogram.
    pub fn kl_threshold(&self, target_bins: usize) -> f32 {
        let max_abs = self.max_abs();
        let b = self.bins();
        let n = target_bins;
        if self.total() == 0 || self.range() == 0.0 {
            return 0.0;
        }
        if n == 0 || n > b {
            return max_abs;
        }
        let mut h: Vec<f64> = self.abs_counts().iter().map(|c| *c as f64).collect();
        h[0] = h[1];
        let total: f64 = h.iter().sum();
        // suffix[i] = Σ h[i..]: the outliers of candidate i.
        let mut suffix = vec![0f64; b + 1];
        for t in (0..b).rev() {
            suffix[t] = suffix[t + 1] + h[t];
        }
        let mut q = vec![0f64; b];
        let mut best = (f64::INFINITY, b);
        for (i, outliers) in suffix.iter().enumerate().skip(n) {
            let start = |k: usize| (k * i).div_ceil(n);
            for k in 0..n {
                let (s, e) = (start(k), start(k + 1));
                let bucket = &h[s..e];
                let mass: f64 = bucket.iter().sum();
                let nonempty = bucket.iter().filter(|v| **v != 0.0).count();
                for (qt, ht) in q[s..e].iter_mut().zip(bucket) {
                    *qt = if *ht != 0.0 {
                        mass / nonempty as f64
                    } else {
                        0.0
                    };
                }
            }
            let zq = total - outliers;
            let mut kl = 0f64;
            for (t, (ht, qt)) in h[..i].iter().zip(&q[..i]).enumerate() {
                let p = if t == i - 1 { ht + outliers } else { *ht };
                if p == 0.0 {
                    continue;
                }
                if *qt == 0.0 {
                    kl = f64::INFINITY;
                    break;
                }
                let (pn, qn) = (p / total, qt / zq);
                kl += pn * (pn / qn).ln();
            }
            if kl <= best.0 {
                best = (kl, i);
            }
        }
        ((best.1 as f64 * self.bin_width()) as f32).min(max_abs)
    }

    /// The symmetric threshold `T` minimising the summed squared error of quantizing the
    /// histogram (every value at its bin centre) with the parameters `method` derives from
    /// `[-T, T]` on `grid`, rounding with `rounding`.
    ///
    /// Candidates, from the largest down (ties keep the larger threshold, so nothing is
    /// clipped unless clipping strictly helps): Symmetric tries `max|x|` and every bin edge
    /// `k·w` below it; PowerOfTwo tries `2^ceil(log2 max|x|)` and the powers of two below it
    /// down to half a bin width (at most 64). 0 for an empty or all-zero histogram.
    ///
    /// # Errors
    /// [`QuantError::InvalidValue`] for Uniform (see [`Histogram::mse_range`]); the errors of
    /// quant-core's formulas for thresholds they cannot represent.
    pub fn mse_threshold(
        &self,
        method: QuantizationMethod,
        grid: IntegerGrid,
        rounding: RoundingPolicy,
    ) -> Result<f32> {
        if method == QuantizationMethod::Uniform {
            return Err(QuantError::InvalidValue {
                what: "method".into(),
                value: "Uniform".into(),
                expected: "Symmetric or PowerOfTwo (Histogram::mse_range searches Uniform ranges)"
                    .into(),
            });
        }
        let max_abs = self.max_abs();
        if self.total() == 0 || max_abs == 0.0 {
            return Ok(0.0);
        }
        let points = self.points();
        let w = self.bin_width();
        let mut candidates = Vec::new();
        if method == QuantizationMethod::Symmetric {
            candidates.push(max_abs);
            let top = (f64::from(max_abs) / w).ceil() as usize;
            candidates.extend(
                (1..=top)
                    .rev()
                    .map(|k| (k as f64 * w) as f32)
                    .filter(|t| *t < max_abs && *t > 0.0),
            );
        } else {
            let mut t = power_of_two_threshold(max_abs)?;
            for _ in 0..=MAX_POW2_CANDIDATES {
                candidates.push(t);
                t /= 2.0;
                if f64::from(t) < w / 2.0 || t < f32::MIN_POSITIVE {
                    break;
                }
            }
        }
        let mut best = (f64::INFINITY, max_abs);
        for t in candidates {
            let (s, z) = qparams_from_range(method, grid, -t, t)?;
            let e = points.sse(s, z, grid, rounding);
            if e < best.0 {
                best = (e, t);
            }
        }
        Ok(best.1)
    }

    /// The Uniform range `[lo, hi]` minimising the summed squared error of quantizing the
    /// histogram with [`uniform_qparams`]`(lo, hi)` on `grid` and `rounding`.
    ///
    /// Start from the observed range widened to contain 0, `[lo0, hi0]`. Stage 1 shrinks it
    /// proportionally, `[α·lo0, α·hi0]` for `α = k/B`, `k = B..1` (which keeps the zero point
    /// roughly in place). Stage 2 refines the best by coordinate descent: `lo` over
    /// `lo0·j/B` for `j = B..=0` with `hi` fixed, then `hi` likewise, until a round improves
    /// nothing (at most 8 rounds). Ties keep the wider range. `(0, 0)` for an empty histogram.
    ///
    /// # Errors
    /// The errors of [`uniform_qparams`] for a range wider than `f32::MAX`.
    pub fn mse_range(&self, grid: IntegerGrid, rounding: RoundingPolicy) -> Result<(f32, f32)> {
        let Some((min, max)) = self.min_max() else {
            return Ok((0.0, 0.0));
        };
        let (lo0, hi0) = (min.min(0.0), max.max(0.0));
        if lo0 == hi0 {
            return Ok((lo0, hi0));
        }
        let points = self.points();
        let steps = self.bins();
        let eval = |lo: f32, hi: f32| -> Result<f64> {
            let (s, z) = uniform_qparams(lo, hi, grid)?;
            Ok(points.sse(s, z, grid, rounding))
        };
        let frac = |v: f32, j: usize| (f64::from(v) * j as f64 / steps as f64) as f32;
        let mut best = (eval(lo0, hi0)?, lo0, hi0);
        for k in (1..steps).rev() {
            let (lo, hi) = (frac(lo0, k), frac(hi0, k));
            let e = eval(lo, hi)?;
            if e < best.0 {
                best = (e, lo, hi);
            }
        }
        // A scan that moves nothing leaves the next scan of the other end with the pairs it
        // saw last time and the minimum it found then: nothing can beat it strictly, so the
        // descent has converged. Stopping there skips those repeated scans (a third to a half
        // of the search) and returns the same range as scanning them would.
        for round in 0..MAX_DESCENT_ROUNDS {
            let mut lo_moved = false;
            if lo0 < 0.0 {
                for j in (0..=steps).rev() {
                    let lo = frac(lo0, j);
                    let e = eval(lo, best.2)?;
                    if e < best.0 {
                        best = (e, lo, best.2);
                        lo_moved = true;
                    }
                }
            }
            // From the second round on, the `hi` scan would repeat the last one from the same
            // `lo`.
            if round > 0 && !lo_moved {
                break;
            }
            let mut hi_moved = false;
            if hi0 > 0.0 {
                for j in (0..=steps).rev() {
                    let hi = frac(hi0, j);
                    let e = eval(best.1, hi)?;
                    if e < best.0 {
                        best = (e, best.1, hi);
                        hi_moved = true;
                    }
                }
            }
            // The next `lo` scan would repeat this round's at the same `hi`.
            if !hi_moved {
                break;
            }
        }
        Ok((best.1, best.2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<R: Round>(policy: RoundingPolicy) {
        let mut v = -20.0f32;
        while v <= 20.0 {
            for x in [v, v + 0.25, v + 0.5, v + 0.75, v + 1e-3, v - 1e-3] {
                assert_eq!(R::round(x), policy.round(x), "{policy:?} {x}");
            }
            v += 1.0;
        }
    }

    #[test]
    fn rounding_agrees_with_the_reference() {
        check::<HalfEven>(RoundingPolicy::HalfEven);
        check::<HalfAwayFromZero>(RoundingPolicy::HalfAwayFromZero);
        check::<HalfUp>(RoundingPolicy::HalfUp);
        check::<HalfDown>(RoundingPolicy::HalfDown);
        check::<HalfTowardZero>(RoundingPolicy::HalfTowardZero);
        check::<Floor>(RoundingPolicy::Floor);
        check::<Ceil>(RoundingPolicy::Ceil);
    }

    #[test]
    fn sse_matches_the_kernel() {
        let points = Points {
            centres: vec![-3.3, -0.25, 0.0, 0.7, 1.25, 9.0, 0.375],
            weights: vec![1.0, 2.0, 3.0, 1.0, 1.0, 2.0, 1.0],
        };
        let grid = IntegerGrid::new(4, true, false).unwrap();
        for rounding in RoundingPolicy::ALL {
            for (s, z) in [(0.5f32, 0i32), (0.25, 3), (1.0, -2)] {
                let mut y = vec![0.0; points.centres.len()];
                quant_core::kernels::fake_quantize_per_tensor_affine_into(
                    &points.centres,
                    &mut y,
                    s,
                    z,
                    grid.quant_min(),
                    grid.quant_max(),
                    rounding,
                )
                .unwrap();
                let expect: f64 = y
                    .iter()
                    .zip(&points.centres)
                    .zip(&points.weights)
                    .map(|((y, c), w)| w * f64::from(y - c).powi(2))
                    .sum();
                let got = points.sse(s, z, grid, rounding);
                assert!(
                    (got - expect).abs() < 1e-9,
                    "{rounding:?} s={s} z={z}: {got} vs {expect}"
                );
            }
        }
    }
}

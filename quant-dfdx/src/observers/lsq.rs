//! LSQ's initial step size.

use quant_core::{
    power_of_two_scale, uniform_qparams, ChannelLayout, IntegerGrid, QParams, QuantError,
    QuantizationMethod, Result, RoundingPolicy, MIN_SCALE,
};

use super::config::ObserverConfig;
use super::minmax::Extremes;
use super::{collect_qparams, not_initialized, observer_statistics, seen_or_zero, Observer};

/// The initial step size of learned step-size quantization (Esser et al. 2020; mmrazor's
/// `LSQObserver` / `LSQPerChannelObserver`), per channel:
///
/// ```text
/// s0 = 2 · mean|x| / sqrt(quant_max)
/// ```
///
/// - Symmetric: `s = s0`, zero point 0.
/// - PowerOfTwo: the threshold `s0 · 2^(b-1)` (the grid's threshold divisor) is rounded up to
///   a power of two and turned back into a scale.
/// - Uniform: `s = s0`, and the zero point is the one the min/max range would give
///   ([`uniform_qparams`]), as mmrazor combines `MinMaxObserver`'s zero point with the LSQ scale.
///
/// Every scale is floored at [`MIN_SCALE`]. The mean runs over every finite value observed
/// since the last reset (mmrazor keeps only the last batch's mean; for the usual single
/// initialisation batch the two agree).
///
/// ```
/// use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
/// use quant_dfdx::observers::{LsqInitObserver, Observer};
/// let mut o = LsqInitObserver::new();
/// o.observe(&[1.0, -3.0, 2.0, -2.0], ChannelLayout::per_tensor(4))?;
/// // mean|x| = 2, quant_max = 127 on INT8: s0 = 4 / sqrt(127).
/// let q = o.qparams(QuantizationMethod::Symmetric, IntegerGrid::INT8, RoundingPolicy::HalfEven)?;
/// assert!((q.scales()[0] - 4.0 / 127f32.sqrt()).abs() < 1e-6);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct LsqInitObserver {
    extremes: Extremes,
    abs_sums: Vec<f64>,
    counts: Vec<u64>,
}

impl LsqInitObserver {
    /// An observer that has seen nothing.
    pub fn new() -> LsqInitObserver {
        LsqInitObserver::default()
    }

    /// Per-channel `mean|x|` of the finite values seen (0 for channels without any); `None`
    /// before any finite value.
    pub fn mean_abs(&self) -> Option<Vec<f64>> {
        if self.counts.iter().all(|c| *c == 0) {
            return None;
        }
        Some(
            self.abs_sums
                .iter()
                .zip(&self.counts)
                .map(|(s, n)| if *n == 0 { 0.0 } else { s / *n as f64 })
                .collect(),
        )
    }
}

/// LSQ's step size for one channel on `grid` and `method`, with the zero point of `[min, max]`.
fn lsq_qparams(
    mean_abs: f64,
    min: f32,
    max: f32,
    method: QuantizationMethod,
    grid: IntegerGrid,
) -> Result<(f32, i32)> {
    let s0_wide = 2.0 * mean_abs / f64::from(grid.quant_max()).sqrt();
    let s0 = s0_wide as f32;
    if !s0.is_finite() {
        return Err(QuantError::NonFinite {
            what: "LSQ initial step size 2·mean|x|/sqrt(quant_max)".into(),
            value: s0_wide,
        });
    }
    match method {
        QuantizationMethod::Symmetric => Ok((s0.max(MIN_SCALE), 0)),
        QuantizationMethod::PowerOfTwo => {
            let divisor = grid.power_of_two_divisor();
            // The threshold in f64 first: one rounding to f32, not two.
            let t = (s0_wide * f64::from(divisor)) as f32;
            Ok((power_of_two_scale(t, grid)?, 0))
        }
        QuantizationMethod::Uniform => {
            let (_, z) = uniform_qparams(min, max, grid)?;
            Ok((s0.max(MIN_SCALE), z))
        }
    }
}

impl Observer for LsqInitObserver {
    fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()> {
        let st = self.extremes.observe(x, layout, true, |lo, hi, s| {
            *lo = lo.min(s.min);
            *hi = hi.max(s.max);
        })?;
        if self.abs_sums.len() != layout.channels {
            self.abs_sums = vec![0.0; layout.channels];
            self.counts = vec![0; layout.channels];
        }
        for (c, s) in st.channels.iter().enumerate() {
            self.abs_sums[c] += s.abs_sum;
            self.counts[c] += st.finite_count(c);
        }
        Ok(())
    }

    fn qparams(
        &self,
        method: QuantizationMethod,
        grid: IntegerGrid,
        _rounding: RoundingPolicy,
    ) -> Result<QParams> {
        let means = self
            .mean_abs()
            .ok_or_else(|| not_initialized("LsqInit", self.extremes.skipped()))?;
        let pairs = means
            .iter()
            .zip(self.extremes.channels())
            .map(|(m, (lo, hi))| {
                let (lo, hi) = seen_or_zero(lo, hi);
                lsq_qparams(*m, lo, hi, method, grid)
            })
            .collect::<Result<Vec<_>>>()?;
        collect_qparams(pairs, self.extremes.axis())
    }

    observer_statistics!(extremes);

    fn reset(&mut self) {
        *self = LsqInitObserver::default();
    }

    fn config(&self) -> ObserverConfig {
        ObserverConfig::LsqInit
    }
}

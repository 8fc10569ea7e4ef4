//! Min/max observers: the running extremes, and their exponential moving average.

use quant_core::{ChannelLayout, IntegerGrid, QParams, QuantizationMethod, Result, RoundingPolicy};

use super::config::{Momentum, ObserverConfig};
use super::stats::{batch_stats, BatchStats, BlockStats};
use super::{
    extremes_observer_common, not_initialized, observer_statistics, seen_or_zero, LayoutGuard,
    Observer,
};

/// The running minimum and maximum of every finite value seen, per channel (PyTorch's
/// `MinMaxObserver` / `PerChannelMinMaxObserver`, MCT's and PPQ's `minmax`).
///
/// Parameters follow quant-core's range formulas, which widen the range to contain 0:
/// `min ≤ 0 ≤ max` always holds for the range that is quantized.
///
/// ```
/// use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
/// use quant_dfdx::observers::{MinMaxObserver, Observer};
/// let mut o = MinMaxObserver::new();
/// o.observe(&[0.5, -1.0, 3.0, f32::NAN], ChannelLayout::per_tensor(4))?;
/// assert_eq!(o.ranges(), Some((vec![-1.0], vec![3.0])));
/// assert_eq!(o.skipped(), 1);
/// let q = o.qparams(QuantizationMethod::Uniform, IntegerGrid::UINT8, RoundingPolicy::HalfEven)?;
/// assert_eq!(q.scales(), &[4.0 / 255.0]);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct MinMaxObserver {
    extremes: Extremes,
}

impl MinMaxObserver {
    /// An observer that has seen nothing.
    pub fn new() -> MinMaxObserver {
        MinMaxObserver::default()
    }
}

/// The per-channel extremes behind the min/max-based observers (MinMax, MovingAverageMinMax,
/// LsqInit): the layout they committed to, each channel's `[min, max]` (`+Inf` / `-Inf` for
/// channels without finite values) and the count of skipped NaN/Inf values.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extremes {
    guard: LayoutGuard,
    mins: Vec<f32>,
    maxs: Vec<f32>,
    skipped: u64,
}

impl Extremes {
    /// Checks a batch against the committed layout, then folds each channel's batch extremes
    /// into its running ones with `update(min, max, batch_stats)` and counts the skipped
    /// values. Returns the batch's statistics (with `|x|` sums when `with_abs_sum`).
    pub(crate) fn observe(
        &mut self,
        x: &[f32],
        layout: ChannelLayout,
        with_abs_sum: bool,
        mut update: impl FnMut(&mut f32, &mut f32, &BlockStats),
    ) -> Result<BatchStats> {
        self.guard.check(x, layout)?;
        let st = batch_stats(x, layout, with_abs_sum);
        if self.mins.len() != layout.channels {
            self.mins = vec![f32::INFINITY; layout.channels];
            self.maxs = vec![f32::NEG_INFINITY; layout.channels];
        }
        for ((lo, hi), s) in self.mins.iter_mut().zip(&mut self.maxs).zip(&st.channels) {
            update(lo, hi, s);
        }
        self.skipped += st.nonfinite();
        Ok(st)
    }

    /// Parameters from the per-channel ranges, or the not-initialised error (naming the
    /// observer `name`) when no channel has a finite value.
    pub(crate) fn qparams(
        &self,
        name: &str,
        method: QuantizationMethod,
        grid: IntegerGrid,
    ) -> Result<QParams> {
        let (lo, hi) = self
            .ranges()
            .ok_or_else(|| not_initialized(name, self.skipped))?;
        QParams::from_ranges(method, grid, &lo, &hi, self.axis())
    }

    /// The per-channel ranges, `None` when no channel has a finite value.
    pub(crate) fn ranges(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        ranges_of(&self.mins, &self.maxs)
    }

    /// Each channel's `[min, max]` (`+Inf` / `-Inf` where nothing finite was seen).
    pub(crate) fn channels(&self) -> impl Iterator<Item = (f32, f32)> + '_ {
        self.mins.iter().copied().zip(self.maxs.iter().copied())
    }

    /// NaN/Inf values skipped so far.
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The channel axis of the observed layout.
    pub(crate) fn axis(&self) -> Option<usize> {
        self.guard.axis()
    }
}

/// The per-channel ranges, `None` when no channel has a finite value.
pub(crate) fn ranges_of(mins: &[f32], maxs: &[f32]) -> Option<(Vec<f32>, Vec<f32>)> {
    if !mins.iter().zip(maxs).any(|(lo, hi)| lo <= hi) {
        return None;
    }
    Some(
        mins.iter()
            .zip(maxs)
            .map(|(l, h)| seen_or_zero(*l, *h))
            .unzip(),
    )
}

impl Observer for MinMaxObserver {
    fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()> {
        self.extremes.observe(x, layout, false, |lo, hi, s| {
            *lo = lo.min(s.min);
            *hi = hi.max(s.max);
        })?;
        Ok(())
    }

    extremes_observer_common!("MinMax");

    fn reset(&mut self) {
        *self = MinMaxObserver::default();
    }

    fn config(&self) -> ObserverConfig {
        ObserverConfig::MinMax
    }
}

/// The exponential moving average of each batch's minimum and maximum, per channel
/// (PyTorch's `MovingAverageMinMaxObserver`): `v += c·(v_batch − v)` with the momentum `c`
/// (0.01 by default); a channel's first batch with finite values initialises it, and a batch
/// without finite values in a channel leaves that channel alone.
///
/// The average runs in `f64` and is stored as `f32`, so extreme ranges cannot overflow.
///
/// ```
/// use quant_core::ChannelLayout;
/// use quant_dfdx::observers::{Momentum, MovingAverageMinMaxObserver, Observer};
/// let mut o = MovingAverageMinMaxObserver::new(Momentum::new(0.5)?);
/// o.observe(&[-2.0, 2.0], ChannelLayout::per_tensor(2))?;
/// o.observe(&[-4.0, 6.0], ChannelLayout::per_tensor(2))?;
/// assert_eq!(o.ranges(), Some((vec![-3.0], vec![4.0])));
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MovingAverageMinMaxObserver {
    momentum: Momentum,
    extremes: Extremes,
}

impl MovingAverageMinMaxObserver {
    /// An observer with momentum `c` that has seen nothing.
    pub fn new(momentum: Momentum) -> MovingAverageMinMaxObserver {
        MovingAverageMinMaxObserver {
            momentum,
            extremes: Extremes::default(),
        }
    }

    /// The momentum `c`.
    pub fn momentum(&self) -> Momentum {
        self.momentum
    }
}

impl Default for MovingAverageMinMaxObserver {
    fn default() -> Self {
        MovingAverageMinMaxObserver::new(Momentum::DEFAULT)
    }
}

impl Observer for MovingAverageMinMaxObserver {
    fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()> {
        let c = self.momentum.get();
        let ema = |v: f32, cur: f32| (f64::from(v) + c * (f64::from(cur) - f64::from(v))) as f32;
        self.extremes.observe(x, layout, false, |lo, hi, s| {
            // A channel without finite values in this batch is left alone.
            if s.min <= s.max {
                if *lo > *hi {
                    (*lo, *hi) = (s.min, s.max);
                } else {
                    (*lo, *hi) = (ema(*lo, s.min), ema(*hi, s.max));
                }
            }
        })?;
        Ok(())
    }

    extremes_observer_common!("MovingAverageMinMax");

    fn reset(&mut self) {
        *self = MovingAverageMinMaxObserver::new(self.momentum);
    }

    fn config(&self) -> ObserverConfig {
        ObserverConfig::MovingAverageMinMax {
            momentum: self.momentum,
        }
    }
}

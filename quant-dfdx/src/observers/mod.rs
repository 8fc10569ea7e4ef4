//! Observers: statistics of tensors turned into quantization parameters.
//!
//! An observer watches calibration batches ([`Observer::observe`]) and then proposes a scale
//! and zero point for a [`QuantizationMethod`] on an [`IntegerGrid`] ([`Observer::qparams`]).
//! Pick one in code by type, or by name in a policy file through [`ObserverConfig`]:
//!
//! ```
//! use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
//! use quant_dfdx::observers::{Observer, ObserverConfig};
//!
//! let config: ObserverConfig = serde_json::from_str(r#"{ "kind": "Percentile", "percentile": 99.0 }"#)?;
//! let mut observer = config.build();
//! let x: Vec<f32> = (0..1000).map(|i| i as f32 / 100.0).collect(); // 0.00 ..= 9.99
//! observer.observe(&x, ChannelLayout::per_tensor(x.len()))?;
//! let q = observer.qparams(QuantizationMethod::Symmetric, IntegerGrid::INT8, RoundingPolicy::HalfEven)?;
//! // The 99th percentile of |x| is 9.9 (a bin edge of the 2048-bin histogram of |x|, close to it).
//! assert!((q.scales()[0] * 128.0 - 9.9).abs() < 0.01);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The observers
//!
//! | observer | statistic | per channel |
//! |---|---|---|
//! | [`MinMaxObserver`] | running minimum and maximum | yes |
//! | [`MovingAverageMinMaxObserver`] | `v += c·(v_batch − v)` on min and max, first batch initialises | yes |
//! | [`PercentileObserver`] | a percentile of the histogram (99.99 by default) | yes |
//! | [`MseObserver`] | the threshold / range minimising the simulated quantization MSE | yes |
//! | [`EntropyObserver`] | TensorRT's entropy (KL-divergence) calibration | yes |
//! | [`LsqInitObserver`] | LSQ's `s0 = 2·mean|x| / sqrt(quant_max)` | yes |
//!
//! Per channel means: give a [`ChannelLayout`] with several channels and get one scale and zero
//! point per channel, with the layout's axis. The histogram observers keep one [`Histogram`]
//! per channel (`16 · bins` bytes each), so per-channel use suits weights and narrow
//! activations; their selection runs on rayon's threads across channels.
//!
//! # Conventions shared by every observer
//!
//! - A range `[min, max]` becomes parameters through quant-core's formulas
//!   ([`qparams_from_range`](quant_core::qparams_from_range)): Symmetric uses the threshold
//!   `max(|min|, |max|)` and `s = T / 2^(b-1)` (MCT; `T / (2^(b-1)-1)` with narrow range,
//!   NVIDIA's `amax / 127`); PowerOfTwo rounds `T` up to a power of two first; Uniform widens
//!   the range to contain 0 (so `min ≤ 0 ≤ max` always holds) and rounds the zero point half to
//!   even. A threshold-based observer (Percentile, Mse, Entropy) applied with Uniform clips
//!   the observed range to `[-T, T]` where its own two-sided rule does not apply.
//! - The `rounding` argument of [`Observer::qparams`] only changes what [`MseObserver`]
//!   simulates; every other observer is independent of it.
//! - NaN and ±Inf are skipped and counted ([`Observer::skipped`]); they never reach a
//!   statistic. A channel that never saw a finite value gets the range `[0, 0]`.
//! - A constant or all-zero tensor still gives a finite scale of at least
//!   [`MIN_SCALE`](quant_core::MIN_SCALE).
//! - Asking for parameters before any finite value was observed is
//!   [`QuantError::NotInitialized`]; a batch whose channel count or axis differs from the first
//!   one is [`QuantError::LengthMismatch`] / [`QuantError::InvalidValue`] (call
//!   [`Observer::reset`] to observe another layout).

use std::fmt;

use quant_core::{
    ChannelLayout, IntegerGrid, QParams, QuantError, QuantizationMethod, Result, RoundingPolicy,
};

mod config;
mod histogram;
mod lsq;
mod minmax;
mod select;
mod stats;

pub use config::{HistogramBins, Momentum, ObserverConfig, Percentile};
pub use histogram::{EntropyObserver, Histogram, MseObserver, PercentileObserver};
pub use lsq::LsqInitObserver;
pub use minmax::{MinMaxObserver, MovingAverageMinMaxObserver};

/// Collects statistics of the tensors it is shown and turns them into quantization parameters.
///
/// Object safe: policies hold observers as `Box<dyn Observer>` (built from an
/// [`ObserverConfig`]), and `Box<dyn Observer>` is [`Clone`].
pub trait Observer: Send + Sync + fmt::Debug {
    /// Adds one batch. `x` is contiguous row-major data laid out as `layout`; one channel means
    /// per tensor. NaN/±Inf values are skipped and counted.
    ///
    /// # Errors
    /// [`QuantError::LengthMismatch`] when `x.len() != layout.numel()` or when the channel count
    /// differs from the first batch's; [`QuantError::InvalidValue`] for a layout without
    /// channels or with another axis than the first batch's. A failed call changes nothing.
    fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()>;

    /// Quantization parameters for `method` on `grid`, one scale and zero point per observed
    /// channel (carrying the observed layout's axis), or one per tensor.
    ///
    /// # Errors
    /// [`QuantError::NotInitialized`] before any finite value was observed; the errors of
    /// quant-core's range formulas for ranges they cannot represent (a PowerOfTwo threshold
    /// above `2^127`, a Uniform range wider than `f32::MAX`).
    fn qparams(
        &self,
        method: QuantizationMethod,
        grid: IntegerGrid,
        rounding: RoundingPolicy,
    ) -> Result<QParams>;

    /// Per-channel minimum and maximum of the finite values seen (for moving averages: the
    /// averaged ones); `None` before any finite value. Channels without finite values report
    /// `(0, 0)`.
    fn ranges(&self) -> Option<(Vec<f32>, Vec<f32>)>;

    /// How many NaN/±Inf values were skipped since construction or the last [`reset`](Observer::reset).
    fn skipped(&self) -> u64;

    /// Forgets everything observed, including the layout and the skipped count.
    fn reset(&mut self);

    /// A boxed copy (what `Clone for Box<dyn Observer>` calls).
    fn box_clone(&self) -> Box<dyn Observer>;

    /// The configuration that builds a fresh observer like this one (for reports).
    fn config(&self) -> ObserverConfig;
}

impl Clone for Box<dyn Observer> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}

/// The `Observer` methods every observer implements alike over its statistics field `$state`
/// (a type with `ranges()` and `skipped()`): `ranges`, `skipped` and `box_clone`.
macro_rules! observer_statistics {
    ($state:ident) => {
        fn ranges(&self) -> Option<(Vec<f32>, Vec<f32>)> {
            self.$state.ranges()
        }

        fn skipped(&self) -> u64 {
            self.$state.skipped()
        }

        fn box_clone(&self) -> Box<dyn Observer> {
            Box::new(self.clone())
        }
    };
}
use observer_statistics;

/// `qparams` and the statistics of an [`Observer`] whose quantization parameters follow from
/// its per-channel extremes (`self.extremes`) alone, as MinMax's do; `$name` names the
/// observer in errors.
macro_rules! extremes_observer_common {
    ($name:literal) => {
        fn qparams(
            &self,
            method: QuantizationMethod,
            grid: IntegerGrid,
            _rounding: RoundingPolicy,
        ) -> Result<QParams> {
            self.extremes.qparams($name, method, grid)
        }

        observer_statistics!(extremes);
    };
}
use extremes_observer_common;

/// Most channels an empty batch may claim (a non-empty one has at most one per value).
const MAX_EMPTY_BATCH_CHANNELS: usize = 1 << 20;

/// The layout an observer committed to with its first batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LayoutGuard {
    seen: Option<(usize, Option<usize>)>,
}

impl LayoutGuard {
    /// Checks `x` against `layout` and `layout` against earlier batches, and remembers it.
    pub(crate) fn check(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()> {
        if layout.channels == 0 {
            return Err(QuantError::InvalidValue {
                what: "layout.channels".into(),
                value: "0".into(),
                expected: "at least one channel (1 for per-tensor statistics)".into(),
            });
        }
        if x.len() != layout.numel() {
            return Err(QuantError::LengthMismatch {
                what: format!(
                    "observed tensor (layout {} x {} x {})",
                    layout.outer, layout.channels, layout.inner
                ),
                expected: layout.numel(),
                actual: x.len(),
            });
        }
        // Statistics are kept per channel: a layout claiming more channels than values (possible
        // only for an empty batch, whose shape has a zero elsewhere) must not size them.
        if layout.channels > x.len().max(MAX_EMPTY_BATCH_CHANNELS) {
            return Err(QuantError::InvalidValue {
                what: "layout.channels".into(),
                value: layout.channels.to_string(),
                expected: format!(
                    "at most one channel per observed value ({}), or {MAX_EMPTY_BATCH_CHANNELS} for an empty batch",
                    x.len()
                ),
            });
        }
        if let Some((channels, axis)) = self.seen {
            if channels != layout.channels {
                return Err(QuantError::LengthMismatch {
                    what: format!(
                        "channels of the observed tensor (earlier batches had {channels}; reset() the observer to \
                         observe another layout)"
                    ),
                    expected: channels,
                    actual: layout.channels,
                });
            }
            if axis != layout.axis {
                return Err(QuantError::InvalidValue {
                    what: "layout.axis".into(),
                    value: format!("{:?}", layout.axis),
                    expected: format!(
                        "{axis:?}, the axis of earlier batches (reset() the observer to observe another layout)"
                    ),
                });
            }
        }
        self.seen = Some((layout.channels, layout.axis));
        Ok(())
    }

    /// The channel axis of the observed layout.
    pub(crate) fn axis(&self) -> Option<usize> {
        self.seen.and_then(|(_, a)| a)
    }
}

/// The error for parameters requested before any finite value was seen.
pub(crate) fn not_initialized(observer: &str, skipped: u64) -> QuantError {
    let skipped = if skipped > 0 {
        format!(" ({skipped} NaN/Inf values were skipped)")
    } else {
        String::new()
    };
    QuantError::NotInitialized {
        hint: format!(
            "the {observer} observer has seen no finite values yet{skipped}; call observe() on calibration data \
             before qparams()"
        ),
    }
}

/// Replaces the `(+Inf, -Inf)` of channels without finite values by `(0, 0)`.
pub(crate) fn seen_or_zero(min: f32, max: f32) -> (f32, f32) {
    if min <= max {
        (min, max)
    } else {
        (0.0, 0.0)
    }
}

/// Builds parameters with the observed axis from per-channel `(scale, zero_point)` pairs.
pub(crate) fn collect_qparams(pairs: Vec<(f32, i32)>, axis: Option<usize>) -> Result<QParams> {
    let (scales, zero_points): (Vec<f32>, Vec<i32>) = pairs.into_iter().unzip();
    // Per-tensor statistics of a layout with an axis (a single channel) keep the axis, so the
    // parameters say what they were computed for.
    QParams::new(scales, zero_points, axis)
}

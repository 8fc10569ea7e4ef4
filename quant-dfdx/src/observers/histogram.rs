//! The histogram the calibrating observers share, and those observers: Percentile, Mse and
//! Entropy. The selection rules themselves live in `select.rs`.

use std::fmt;

use rayon::prelude::*;

use quant_core::{
    qparams_from_range, ChannelLayout, IntegerGrid, QParams, QuantError, QuantizationMethod,
    Result, RoundingPolicy,
};

use super::config::{HistogramBins, ObserverConfig, Percentile};
use super::minmax::ranges_of;
use super::stats::{batch_stats, block_stats, finite, MIN_BLOCK};
use super::{collect_qparams, not_initialized, observer_statistics, LayoutGuard, Observer};

/// Smallest range a histogram with nonzero data takes, so `bins / range` stays a finite `f32`
/// for every bin count. Scales this small are floored at `MIN_SCALE` anyway.
const MIN_RANGE: f64 = 1e-30;
/// Indices computed per batch before they are counted (fits in L1 with the counts).
const INDEX_CHUNK: usize = 512;
/// Blocks from this length on are counted into four sub-histograms.
const SPLIT_MIN: usize = 1 << 14;
/// `2^23`: for `0 ≤ t < 2^22`, `t + 2^23` holds `round(t)` in its low mantissa bits.
const TWO_23: f32 = 8_388_608.0;

/// Value → signed bin index: `floor(clamp(v · bins/range + bins, 0, 2·bins − 1))`, or the
/// trash slot for NaN/Inf.
struct BinMap {
    inv: f32,
    off: f32,
    top: f32,
    trash: u32,
}

impl BinMap {
    /// Indices of `chunk` into `idx`. Float-to-int conversion goes through the mantissa bits
    /// (`floor` by round-then-correct, both with the `2^23` trick), because Rust's saturating
    /// `as` casts do not vectorise on SSE2 and made this loop the bottleneck.
    #[inline(always)]
    fn indices(&self, chunk: &[f32], idx: &mut [u32; INDEX_CHUNK]) {
        for (o, v) in idx.iter_mut().zip(chunk) {
            *o = self.index(*v);
        }
    }

    #[inline(always)]
    fn index(&self, v: f32) -> u32 {
        let t = (v * self.inv + self.off).max(0.0).min(self.top);
        let r = (t + TWO_23) - TWO_23;
        let f = r - if r > t { 1.0 } else { 0.0 };
        let k = (f + TWO_23).to_bits() & 0x007f_ffff;
        if finite(v) {
            k
        } else {
            self.trash
        }
    }
}

/// A histogram of one channel's finite values over the symmetric range `[-range, range]`
/// in `2 · bins` equal bins of width `w = range / bins`: signed bin `j` (0-based) covers
/// `[-range + j·w, -range + (j+1)·w)`, and the top bin also holds `range` itself.
///
/// Folding the two halves gives the histogram of `|x|` in `bins` bins over `[0, range]`
/// ([`Histogram::abs_counts`]) exactly — TensorRT's 2048-bin histogram of `|x|` — while the
/// signed bins serve the asymmetric (Uniform) selections.
///
/// # Range and growth
/// The first batch with a nonzero value sets `range = max|x|` (while every value seen is 0 the
/// range is 0 and the zeros wait in the bin `[0, w)`, which is that bin for any later width).
/// A later batch with a larger `|x|` grows the range by the smallest power of two `2^k` that
/// covers it, and every `2^k` adjacent old bins merge into one new bin. Because both old and
/// new edges are multiples of the old width counted from 0, the merge is exact: no count is
/// split or moved across a value, the total is preserved, and old bin `j` lands in new bin
/// `B + floor((j - B) / 2^k)` (`B = bins`). The price is resolution: after growth the data
/// spans between half and all of the bins.
///
/// The exact minimum and maximum are tracked alongside, so selections never go beyond the data.
#[derive(Clone, PartialEq)]
pub struct Histogram {
    /// Bins per side: the number of bins of `|x|`.
    half: usize,
    /// 0 while every finite value seen is 0.
    range: f64,
    /// `2 · half` signed bins, then one slot that collects NaN/Inf while binning and is
    /// cleared afterwards (so the binning loop needs no branch).
    counts: Vec<u64>,
    min: f32,
    max: f32,
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The counts are thousands of numbers: summarise them.
        f.debug_struct("Histogram")
            .field("bins", &self.half)
            .field("range", &self.range)
            .field("total", &self.total())
            .field("min_max", &self.min_max())
            .finish()
    }
}

impl Histogram {
    /// An empty histogram with `bins` bins of `|x|`.
    pub fn new(bins: HistogramBins) -> Histogram {
        let half = bins.get();
        Histogram {
            half,
            range: 0.0,
            counts: vec![0; 2 * half + 1],
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
        }
    }

    /// A histogram with given signed counts (`2 · bins` of them, as [`Histogram::counts`]
    /// returns) over `[-range, range]`, for tests and for restoring saved statistics. The
    /// minimum and maximum are taken as the outer edges of the first and last nonempty bins.
    ///
    /// # Errors
    /// An odd number of counts or one outside `2 · (8..=65536)`, a range that is negative or
    /// not finite, or a zero range with counts outside the bin `[0, w)`.
    pub fn from_counts(range: f32, counts: Vec<u64>) -> Result<Histogram> {
        let half = counts.len() / 2;
        let bins = HistogramBins::new(half)
            .ok()
            .filter(|_| counts.len().is_multiple_of(2))
            .ok_or_else(|| QuantError::InvalidValue {
                what: "histogram counts".into(),
                value: format!("{} counts", counts.len()),
                expected: format!(
                    "an even number of signed bins, 2 x ({}..={})",
                    HistogramBins::MIN,
                    HistogramBins::MAX
                ),
            })?;
        if !(range.is_finite() && range >= 0.0) {
            return Err(QuantError::InvalidValue {
                what: "histogram range".into(),
                value: range.to_string(),
                expected: "a finite number >= 0".into(),
            });
        }
        let mut h = Histogram::new(bins);
        if range == 0.0 {
            if counts.iter().enumerate().any(|(j, n)| *n > 0 && j != half) {
                return Err(QuantError::InvalidValue {
                    what: "histogram range".into(),
                    value: "0".into(),
                    expected: "a positive range when any count lies outside the bin holding 0"
                        .into(),
                });
            }
        } else {
            h.range = f64::from(range).max(MIN_RANGE);
        }
        h.counts[..2 * half].copy_from_slice(&counts);
        if let (Some(first), Some(last)) = (
            counts.iter().position(|n| *n > 0),
            counts.iter().rposition(|n| *n > 0),
        ) {
            h.min = h.edge(first);
            h.max = h.edge(last + 1);
            if h.range == 0.0 {
                (h.min, h.max) = (0.0, 0.0);
            }
        }
        Ok(h)
    }

    /// Bins of `|x|` (half the signed bins).
    pub fn bins(&self) -> usize {
        self.half
    }

    /// The histogram covers `[-range, range]`; 0 while every value seen is 0. An `f64`:
    /// growth by powers of two can take it past `f32::MAX`.
    pub fn range(&self) -> f64 {
        self.range
    }

    /// Width of one bin, `range / bins`.
    pub fn bin_width(&self) -> f64 {
        self.range / self.half as f64
    }

    /// The `2 · bins` signed counts, from `-range` up.
    pub fn counts(&self) -> &[u64] {
        &self.counts[..2 * self.half]
    }

    /// The histogram of `|x|`: `bins` counts over `[0, range]`, the two halves folded.
    pub fn abs_counts(&self) -> Vec<u64> {
        let b = self.half;
        (0..b)
            .map(|k| self.counts[b + k] + self.counts[b - 1 - k])
            .collect()
    }

    /// Number of values counted.
    pub fn total(&self) -> u64 {
        self.counts().iter().sum()
    }

    /// The smallest and largest finite value seen, `None` before any.
    pub fn min_max(&self) -> Option<(f32, f32)> {
        (self.min <= self.max).then_some((self.min, self.max))
    }

    /// `max(|min|, |max|)` of the values seen (0 before any).
    pub(crate) fn max_abs(&self) -> f32 {
        self.min_max()
            .map_or(0.0, |(lo, hi)| lo.abs().max(hi.abs()))
    }

    /// The signed bin edge `-range + j·w` (edge `2·bins` is `range`).
    pub(crate) fn edge(&self, j: usize) -> f32 {
        (-self.range + j as f64 * self.bin_width()) as f32
    }

    /// Adds the finite values of `x` (growing the range first if they exceed it) and returns
    /// how many NaN/Inf values it skipped.
    pub fn add(&mut self, x: &[f32]) -> u64 {
        let st = block_stats(x, false);
        self.extend(st.min, st.max);
        self.bin(x);
        st.nonfinite
    }

    /// Makes room for values in `[min, max]` (nothing when `min > max`: no finite value).
    pub(crate) fn extend(&mut self, min: f32, max: f32) {
        if min > max {
            return;
        }
        self.min = self.min.min(min);
        self.max = self.max.max(max);
        let m = f64::from(min.abs().max(max.abs()));
        if m <= self.range {
            return;
        }
        if self.range == 0.0 {
            // Only zeros so far: they sit in bin `half`, which is `[0, w)` for any width.
            self.range = m.max(MIN_RANGE);
            return;
        }
        let mut k = 0u32;
        let mut r = self.range;
        while r < m {
            r *= 2.0;
            k += 1;
        }
        self.range = r;
        // Merge 2^k old bins into one, counting from the bin edge at 0. Beyond 2^62 every
        // negative bin lands in `half - 1` and every other in `half` anyway.
        let factor = 1i64 << k.min(62);
        let b = self.half as i64;
        let mut merged = vec![0u64; self.counts.len()];
        for (j, n) in self.counts[..2 * self.half].iter().enumerate() {
            let to = (j as i64 - b).div_euclid(factor) + b;
            merged[to as usize] += n;
        }
        self.counts = merged;
    }

    /// Counts the finite values of `x`, which must lie within the range (see [`extend`](Self::extend)).
    pub(crate) fn bin(&mut self, x: &[f32]) {
        let b = self.half;
        if self.range == 0.0 {
            self.counts[b] += x.iter().filter(|v| finite(**v)).count() as u64;
            return;
        }
        let map = self.bin_map();
        let mut idx = [0u32; INDEX_CHUNK];
        if x.len() < SPLIT_MIN {
            for chunk in x.chunks(INDEX_CHUNK) {
                map.indices(chunk, &mut idx);
                for i in &idx[..chunk.len()] {
                    self.counts[*i as usize] += 1;
                }
            }
        } else {
            // Four interleaved sub-histograms: consecutive values often fall in the same bin,
            // and one counter would serialise on its own store-to-load latency.
            let stride = self.counts.len();
            let mut sub = vec![0u32; 4 * stride];
            // u32 sub-counts cannot overflow within a piece of this size.
            for piece in x.chunks(1 << 30) {
                for chunk in piece.chunks(INDEX_CHUNK) {
                    map.indices(chunk, &mut idx);
                    let mut quads = idx[..chunk.len()].chunks_exact(4);
                    for q in &mut quads {
                        sub[q[0] as usize] += 1;
                        sub[stride + q[1] as usize] += 1;
                        sub[2 * stride + q[2] as usize] += 1;
                        sub[3 * stride + q[3] as usize] += 1;
                    }
                    for i in quads.remainder() {
                        sub[*i as usize] += 1;
                    }
                }
                for (k, c) in self.counts.iter_mut().enumerate() {
                    *c += u64::from(sub[k]) + u64::from(sub[stride + k]);
                    *c += u64::from(sub[2 * stride + k]) + u64::from(sub[3 * stride + k]);
                }
                sub.fill(0);
            }
        }
        self.counts[2 * b] = 0;
    }

    fn bin_map(&self) -> BinMap {
        let b = self.half;
        BinMap {
            inv: (b as f64 / self.range) as f32,
            off: b as f32,
            top: (2 * b - 1) as f32,
            trash: (2 * b) as u32,
        }
    }

    /// Counts one value (the per-element path of short per-channel blocks), which must lie
    /// within the range.
    pub(crate) fn bin_one(&mut self, v: f32) {
        if !finite(v) {
            return;
        }
        let j = if self.range == 0.0 {
            self.half
        } else {
            self.bin_map().index(v) as usize
        };
        self.counts[j] += 1;
    }
}

/// What the three histogram observers share: the layout, one histogram per channel, the
/// skipped count. The default has the default bins.
#[derive(Debug, Clone, Default)]
pub(crate) struct HistogramState {
    bins: HistogramBins,
    guard: LayoutGuard,
    hists: Vec<Histogram>,
    skipped: u64,
}

impl HistogramState {
    fn new(bins: HistogramBins) -> HistogramState {
        HistogramState {
            bins,
            guard: LayoutGuard::default(),
            hists: Vec::new(),
            skipped: 0,
        }
    }

    fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()> {
        self.guard.check(x, layout)?;
        if self.hists.len() != layout.channels {
            self.hists = vec![Histogram::new(self.bins); layout.channels];
        }
        // Extremes first, so each histogram grows once per batch before counting.
        let st = batch_stats(x, layout, false);
        for (h, s) in self.hists.iter_mut().zip(&st.channels) {
            h.extend(s.min, s.max);
        }
        if layout.channels == 1 {
            self.hists[0].bin(x);
        } else if layout.inner >= MIN_BLOCK {
            for (b, block) in x.chunks_exact(layout.inner).enumerate() {
                self.hists[b % layout.channels].bin(block);
            }
        } else if layout.inner > 0 {
            for (b, block) in x.chunks_exact(layout.inner).enumerate() {
                let h = &mut self.hists[b % layout.channels];
                for v in block {
                    h.bin_one(*v);
                }
            }
        }
        self.skipped += st.nonfinite();
        Ok(())
    }

    fn skipped(&self) -> u64 {
        self.skipped
    }

    fn ranges(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        let (mins, maxs): (Vec<f32>, Vec<f32>) = self
            .hists
            .iter()
            .map(|h| h.min_max().unwrap_or((f32::INFINITY, f32::NEG_INFINITY)))
            .unzip();
        ranges_of(&mins, &maxs)
    }

    /// Applies `select` to every channel's histogram (in parallel across channels) and
    /// collects the parameters with the observed axis.
    fn qparams<F>(&self, name: &str, select: F) -> Result<QParams>
    where
        F: Fn(&Histogram) -> Result<(f32, i32)> + Sync,
    {
        if self.hists.iter().all(|h| h.total() == 0) {
            return Err(not_initialized(name, self.skipped));
        }
        let pairs = if self.hists.len() > 1 {
            self.hists
                .par_iter()
                .map(&select)
                .collect::<Result<Vec<_>>>()?
        } else {
            self.hists.iter().map(&select).collect::<Result<Vec<_>>>()?
        };
        collect_qparams(pairs, self.guard.axis())
    }
}

/// `(scale, zero_point)` of the symmetric threshold `t`, or of the range `[lo, hi]` for Uniform.
fn from_threshold_or_range(
    method: QuantizationMethod,
    grid: IntegerGrid,
    t: f32,
    range: impl FnOnce() -> (f32, f32),
) -> Result<(f32, i32)> {
    match method {
        QuantizationMethod::Symmetric | QuantizationMethod::PowerOfTwo => {
            qparams_from_range(method, grid, -t, t)
        }
        QuantizationMethod::Uniform => {
            let (lo, hi) = range();
            qparams_from_range(method, grid, lo, hi)
        }
    }
}

/// The `Observer` methods the histogram observers share: all but `qparams` and `config`.
macro_rules! histogram_observer_common {
    () => {
        fn observe(&mut self, x: &[f32], layout: ChannelLayout) -> Result<()> {
            self.state.observe(x, layout)
        }

        fn reset(&mut self) {
            self.state = HistogramState::new(self.state.bins);
        }

        observer_statistics!(state);
    };
}

/// A percentile of the observed values (PPQ's `percentile`, NVIDIA's percentile calibrator),
/// per channel, over a [`Histogram`].
///
/// - Symmetric / PowerOfTwo: the threshold `T` is the smallest bin edge of the `|x|`
///   histogram with at most `(1 − p/100)` of the values above it, capped at `max|x|`
///   (NVIDIA takes the left edge of that bin; the right edge keeps at least `p` percent, and
///   `p = 100` gives exactly MinMax's threshold).
/// - Uniform: `[lo, hi]` on the signed histogram, each end cutting at most `(1 − p/100)` of the
///   values (PPQ's two-sided percentile), clamped to the observed `[min, max]`.
///
/// ```
/// use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
/// use quant_dfdx::observers::{HistogramBins, Observer, Percentile, PercentileObserver};
/// let mut o = PercentileObserver::new(Percentile::new(90.0)?, HistogramBins::new(10)?);
/// let x: Vec<f32> = (1..=10).map(|i| i as f32 - 0.5).collect(); // one value per |x| bin
/// o.observe(&x, ChannelLayout::per_tensor(10))?;
/// // |x| range 9.5, bins of 0.95: at most 10% above the edge 9 · 0.95 = 8.55.
/// let q = o.qparams(QuantizationMethod::Symmetric, IntegerGrid::INT8, RoundingPolicy::HalfEven)?;
/// assert!((q.scales()[0] * 128.0 - 8.55).abs() < 1e-5);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct PercentileObserver {
    percentile: Percentile,
    state: HistogramState,
}

impl PercentileObserver {
    /// An observer of percentile `p` with `bins` bins of `|x|`.
    pub fn new(percentile: Percentile, bins: HistogramBins) -> PercentileObserver {
        PercentileObserver {
            percentile,
            state: HistogramState::new(bins),
        }
    }

    /// One histogram per observed channel (empty before the first batch).
    pub fn histograms(&self) -> &[Histogram] {
        &self.state.hists
    }
}

impl Observer for PercentileObserver {
    histogram_observer_common!();

    fn qparams(
        &self,
        method: QuantizationMethod,
        grid: IntegerGrid,
        _rounding: RoundingPolicy,
    ) -> Result<QParams> {
        let p = self.percentile;
        self.state.qparams("Percentile", |h| {
            from_threshold_or_range(method, grid, h.percentile_threshold(p), || {
                h.percentile_range(p)
            })
        })
    }

    fn config(&self) -> ObserverConfig {
        ObserverConfig::Percentile {
            percentile: self.percentile,
            bins: self.state.bins,
        }
    }
}

/// The threshold (Symmetric, PowerOfTwo) or range (Uniform) that minimises the mean squared
/// quantization error of the observed values, per channel, simulating the requested grid,
/// method and rounding policy on the bin centres of a [`Histogram`]
/// (see [`Histogram::mse_threshold`] and [`Histogram::mse_range`] for the search).
///
/// ```
/// use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
/// use quant_dfdx::observers::{MseObserver, Observer};
/// let mut o = MseObserver::default();
/// // 100k values in [-1, 1] and one far outlier: clipping it costs less than coarse steps.
/// let mut x: Vec<f32> = (0..100_000).map(|i| i as f32 / 50_000.0 - 1.0).collect();
/// x.push(100.0);
/// o.observe(&x, ChannelLayout::per_tensor(x.len()))?;
/// let grid = IntegerGrid::new(4, true, false)?;
/// let q = o.qparams(QuantizationMethod::Symmetric, grid, RoundingPolicy::HalfEven)?;
/// assert!(q.scales()[0] * 8.0 < 5.0); // MinMax would take the threshold 100
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct MseObserver {
    state: HistogramState,
}

impl MseObserver {
    /// An observer with `bins` bins of `|x|`.
    pub fn new(bins: HistogramBins) -> MseObserver {
        MseObserver {
            state: HistogramState::new(bins),
        }
    }

    /// One histogram per observed channel (empty before the first batch).
    pub fn histograms(&self) -> &[Histogram] {
        &self.state.hists
    }
}

impl Observer for MseObserver {
    histogram_observer_common!();

    fn qparams(
        &self,
        method: QuantizationMethod,
        grid: IntegerGrid,
        rounding: RoundingPolicy,
    ) -> Result<QParams> {
        self.state.qparams("Mse", |h| match method {
            QuantizationMethod::Symmetric | QuantizationMethod::PowerOfTwo => {
                let t = h.mse_threshold(method, grid, rounding)?;
                qparams_from_range(method, grid, -t, t)
            }
            QuantizationMethod::Uniform => {
                let (lo, hi) = h.mse_range(grid, rounding)?;
                qparams_from_range(method, grid, lo, hi)
            }
        })
    }

    fn config(&self) -> ObserverConfig {
        ObserverConfig::Mse {
            bins: self.state.bins,
        }
    }
}

/// TensorRT's entropy calibration (minimum KL divergence between the clipped reference
/// distribution and its quantized version), per channel, on the histogram of `|x|`; see
/// [`Histogram::kl_threshold`] for exactly what is computed.
///
/// Like TensorRT's, it is made for 8-bit grids and continuous distributions. On data with few
/// distinct values (images with 17 intensity levels, say) at low bit widths, many candidate
/// thresholds reach a divergence of 0 and the rule can clip most of the range:
/// `examples/calibrate_digits.rs` shows it on the digits at 4 bits, where Mse or Percentile
/// are the observers to use.
///
/// The number of quantized bins generalises TensorRT's 128 (int8) to the grid
/// ([`EntropyObserver::target_bins`]). Uniform clips the observed range to `[-T, T]`.
///
/// ```
/// use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
/// use quant_dfdx::observers::{EntropyObserver, Observer};
/// let mut o = EntropyObserver::default();
/// let x: Vec<f32> = (0..10_000).map(|i| ((i % 200) as f32 - 100.0) / 100.0).collect();
/// o.observe(&x, ChannelLayout::per_tensor(x.len()))?;
/// let q = o.qparams(QuantizationMethod::Symmetric, IntegerGrid::INT8, RoundingPolicy::HalfEven)?;
/// assert!(q.scales()[0] > 0.0 && q.scales()[0] <= 1.0 / 128.0 + 1e-6);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct EntropyObserver {
    state: HistogramState,
}

impl EntropyObserver {
    /// An observer with `bins` bins of `|x|` (TensorRT: 2048).
    pub fn new(bins: HistogramBins) -> EntropyObserver {
        EntropyObserver {
            state: HistogramState::new(bins),
        }
    }

    /// One histogram per observed channel (empty before the first batch).
    pub fn histograms(&self) -> &[Histogram] {
        &self.state.hists
    }

    /// The number of quantized bins the `|x|` histogram is merged into: the grid's levels at
    /// or above zero for the symmetric methods (`quant_max + 1`: 128 for signed 8 bits, 256
    /// for unsigned — TensorRT's `1 << (bits - 1 + unsigned)`); for Uniform all the grid's
    /// levels when the data has one sign (`[min, max]` observed), half of them otherwise.
    pub fn target_bins(method: QuantizationMethod, grid: IntegerGrid, min: f32, max: f32) -> usize {
        match method {
            QuantizationMethod::Symmetric | QuantizationMethod::PowerOfTwo => {
                grid.quant_max() as usize + 1
            }
            QuantizationMethod::Uniform => {
                let levels = grid.levels() as usize;
                if min >= 0.0 || max <= 0.0 {
                    levels
                } else {
                    levels.div_ceil(2)
                }
            }
        }
    }
}

impl Observer for EntropyObserver {
    histogram_observer_common!();

    fn qparams(
        &self,
        method: QuantizationMethod,
        grid: IntegerGrid,
        _rounding: RoundingPolicy,
    ) -> Result<QParams> {
        self.state.qparams("Entropy", |h| {
            let (lo, hi) = h.min_max().unwrap_or((0.0, 0.0));
            let t = h.kl_threshold(EntropyObserver::target_bins(method, grid, lo, hi));
            from_threshold_or_range(method, grid, t, || (lo.max(-t), hi.min(t)))
        })
    }

    fn config(&self) -> ObserverConfig {
        ObserverConfig::Entropy {
            bins: self.state.bins,
        }
    }
}

//! Batch statistics on slices: per-channel minimum, maximum, count of skipped NaN/Inf values
//! and (for LSQ initialisation) sum of magnitudes, in one pass over the data.
//!
//! # Speed
//! The per-tensor pass is the hot path of calibration (every batch of every activation goes
//! through it), so it is written to vectorise on baseline x86-64 (SSE2, no `target-cpu`):
//! [`LANES`] independent accumulators per statistic, updated by compare + select only. The
//! finiteness test is an integer compare on the bits (`|bits| < 0x7f80_0000`), folded into
//! the same loop as a count, so clean data needs exactly one read of memory; only data that
//! holds NaN/Inf is read a second time to exclude them from the extremes.

use quant_core::ChannelLayout;

/// Independent accumulator lanes: four SSE registers per statistic, enough to hide the
/// latency of the compare/select chains so the loop runs at memory speed.
const LANES: usize = 16;
/// Elements per call of the counting pass, so its `u32` lane counters cannot overflow.
const FLUSH: usize = 1 << 28;
/// Channel blocks shorter than this are reduced row by row (vectorised across the row)
/// instead of block by block.
pub(crate) const MIN_BLOCK: usize = 16;

/// Whether `v` is finite, as an integer compare that vectorises (no `is_finite` branch).
#[inline(always)]
pub(crate) fn finite(v: f32) -> bool {
    (v.to_bits() & 0x7fff_ffff) < 0x7f80_0000
}

/// Statistics of one block of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BlockStats {
    /// Smallest finite value (`+Inf` when there is none).
    pub min: f32,
    /// Largest finite value (`-Inf` when there is none).
    pub max: f32,
    /// Number of NaN/Inf values.
    pub nonfinite: u64,
    /// Sum of `|v|` over finite values (0 unless asked for).
    pub abs_sum: f64,
}

impl BlockStats {
    pub(crate) const EMPTY: BlockStats = BlockStats {
        min: f32::INFINITY,
        max: f32::NEG_INFINITY,
        nonfinite: 0,
        abs_sum: 0.0,
    };

    fn merge(&mut self, o: BlockStats) {
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.nonfinite += o.nonfinite;
        self.abs_sum += o.abs_sum;
    }
}

/// The fast pass: `if v < acc { v } else { acc }` is exactly `minps`/`maxps`, which leaves the
/// accumulator alone for NaN; ±Inf do enter it, and the count of non-finite values (an
/// integer compare on the bits, in the same loop) tells the caller to redo the extremes with
/// [`min_max_filtered`]. Clean data is therefore read once.
fn min_max_counting(x: &[f32]) -> (f32, f32, u64) {
    let mut lo = [f32::INFINITY; LANES];
    let mut hi = [f32::NEG_INFINITY; LANES];
    let mut bad = [0u32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            let v = c[i];
            bad[i] += u32::from(!finite(v));
            lo[i] = if v < lo[i] { v } else { lo[i] };
            hi[i] = if v > hi[i] { v } else { hi[i] };
        }
    }
    let mut nonfinite: u64 = bad.iter().map(|b| u64::from(*b)).sum();
    let (mut lo, mut hi) = reduce(&lo, &hi);
    for v in chunks.remainder() {
        nonfinite += u64::from(!finite(*v));
        lo = if *v < lo { *v } else { lo };
        hi = if *v > hi { *v } else { hi };
    }
    (lo, hi, nonfinite)
}

/// One element into one lane of the filtered extremes: non-finite values become NaN, which
/// the compare + select ignores.
#[inline(always)]
fn filtered_lane(v: f32, lo: &mut f32, hi: &mut f32) {
    let w = f32::from_bits(if finite(v) { v.to_bits() } else { 0x7fc0_0000 });
    *lo = if w < *lo { w } else { *lo };
    *hi = if w > *hi { w } else { *hi };
}

/// Extremes of the finite values only (the second pass for data with NaN/Inf).
fn min_max_filtered(x: &[f32]) -> (f32, f32) {
    let mut lo = [f32::INFINITY; LANES];
    let mut hi = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            filtered_lane(c[i], &mut lo[i], &mut hi[i]);
        }
    }
    let (mut lo, mut hi) = reduce(&lo, &hi);
    for v in chunks.remainder() {
        filtered_lane(*v, &mut lo, &mut hi);
    }
    (lo, hi)
}

/// Sum of `|v|` over the finite values, in `f64` (a sum of finite `f32` magnitudes can
/// overflow `f32`).
fn abs_sum(x: &[f32]) -> f64 {
    const W: usize = 8;
    let mut acc = [0f64; W];
    let mut chunks = x.chunks_exact(W);
    for c in &mut chunks {
        for i in 0..W {
            acc[i] += if finite(c[i]) {
                f64::from(c[i].abs())
            } else {
                0.0
            };
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .filter(|v| finite(**v))
        .map(|v| f64::from(v.abs()))
        .sum();
    acc.iter().sum::<f64>() + tail
}

fn reduce(lo: &[f32], hi: &[f32]) -> (f32, f32) {
    (
        lo.iter().copied().fold(f32::INFINITY, f32::min),
        hi.iter().copied().fold(f32::NEG_INFINITY, f32::max),
    )
}

/// Statistics of a contiguous block.
pub(crate) fn block_stats(x: &[f32], with_abs_sum: bool) -> BlockStats {
    let mut st = BlockStats::EMPTY;
    // Chunks keep the u32 lane counters of `min_max_counting` from overflowing.
    for c in x.chunks(FLUSH) {
        let (mut lo, mut hi, nonfinite) = min_max_counting(c);
        if nonfinite > 0 {
            (lo, hi) = min_max_filtered(c);
        }
        st.merge(BlockStats {
            min: lo,
            max: hi,
            nonfinite,
            abs_sum: if with_abs_sum { abs_sum(c) } else { 0.0 },
        });
    }
    st
}

/// Per-channel statistics of one batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchStats {
    /// One entry per channel.
    pub channels: Vec<BlockStats>,
    /// Elements per channel in this batch (`outer * inner`).
    pub per_channel: u64,
}

impl BatchStats {
    /// NaN/Inf values in the whole batch.
    pub(crate) fn nonfinite(&self) -> u64 {
        self.channels.iter().map(|c| c.nonfinite).sum()
    }
    /// Finite values of channel `c` in this batch.
    pub(crate) fn finite_count(&self, c: usize) -> u64 {
        self.per_channel - self.channels[c].nonfinite
    }
}

/// Per-channel statistics of `x` laid out as `layout` (the caller checked the length).
pub(crate) fn batch_stats(x: &[f32], layout: ChannelLayout, with_abs_sum: bool) -> BatchStats {
    let channels = layout.channels.max(1);
    let per_channel = (layout.outer * layout.inner) as u64;
    if channels == 1 {
        return BatchStats {
            channels: vec![block_stats(x, with_abs_sum)],
            per_channel,
        };
    }
    let mut out = vec![BlockStats::EMPTY; channels];
    if layout.inner >= MIN_BLOCK {
        // Long blocks (e.g. axis 0 of a weight): the fast kernel on each.
        for (b, block) in x.chunks_exact(layout.inner).enumerate() {
            out[b % channels].merge(block_stats(block, with_abs_sum));
        }
    } else if layout.inner > 0 {
        // Short blocks (e.g. the feature axis of `[batch, features]`): accumulate element-wise
        // over whole rows, which vectorises across the row, then reduce each channel's lanes.
        let row = channels * layout.inner;
        let mut lo = vec![f32::INFINITY; row];
        let mut hi = vec![f32::NEG_INFINITY; row];
        let mut bad = vec![0u64; row];
        let mut sum = vec![0f64; row];
        for xs in x.chunks_exact(row) {
            for i in 0..row {
                let v = xs[i];
                filtered_lane(v, &mut lo[i], &mut hi[i]);
                bad[i] += u64::from(!finite(v));
            }
            if with_abs_sum {
                for i in 0..row {
                    sum[i] += if finite(xs[i]) {
                        f64::from(xs[i].abs())
                    } else {
                        0.0
                    };
                }
            }
        }
        for i in 0..row {
            out[i / layout.inner].nonfinite += bad[i];
            let o = &mut out[i / layout.inner];
            o.min = o.min.min(lo[i]);
            o.max = o.max.max(hi[i]);
            o.abs_sum += sum[i];
        }
    }
    BatchStats {
        channels: out,
        per_channel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_stats_skip_non_finite() {
        let mut x: Vec<f32> = (0..100).map(|i| i as f32 - 50.0).collect();
        x[3] = f32::NAN;
        x[17] = f32::INFINITY;
        x[40] = f32::NEG_INFINITY;
        let s = block_stats(&x, true);
        assert_eq!((s.min, s.max, s.nonfinite), (-50.0, 49.0, 3));
        let expect: f64 = x
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| f64::from(v.abs()))
            .sum();
        assert_eq!(s.abs_sum, expect);
        assert_eq!(block_stats(&[], false), BlockStats::EMPTY);
    }

    #[test]
    fn layouts_agree_with_a_scalar_reference() {
        for shape in [[3usize, 4, 5], [2, 3, 40], [5, 2, 1], [1, 1, 7]] {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.5)
                .collect();
            for axis in 0..3 {
                let layout = ChannelLayout::new(&shape, Some(axis)).unwrap();
                let st = batch_stats(&x, layout, true);
                for c in 0..layout.channels {
                    let vals: Vec<f32> = (0..n)
                        .filter(|i| layout.channel_of(*i) == c)
                        .map(|i| x[i])
                        .collect();
                    let s = &st.channels[c];
                    assert_eq!(s.min, vals.iter().copied().fold(f32::INFINITY, f32::min));
                    assert_eq!(
                        s.max,
                        vals.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                    );
                    let sum: f64 = vals.iter().map(|v| f64::from(v.abs())).sum();
                    assert!((s.abs_sum - sum).abs() < 1e-9);
                }
            }
        }
    }
}

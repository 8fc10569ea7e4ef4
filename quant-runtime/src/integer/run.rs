//! Running a prepared graph on a batch.

use std::cell::RefCell;

use quant_core::int8::PARALLEL_MACS;
use quant_core::{QuantError, Result};
use rayon::prelude::*;

use super::prepare::{Step, Weighted};
use super::{IntegerModel, Layout, Rep};
use crate::graph::Conv2dGeometry;
use quant_core::int8::{conv_u8, gemm_u8, im2col_u8, Window};

/// Buffers of finished values, kept on their thread for the next values: a batch's buffers
/// are megabytes, and fresh ones cost page faults (the kernel zeroing new pages) on every
/// forward pass. At most [`SPARE_BUFFERS`] of each type, of at most [`SPARE_BYTES`] each.
#[derive(Default)]
struct Spare {
    bytes: Vec<Vec<u8>>,
    words: Vec<Vec<i32>>,
}

/// The working memory of one chunk of samples [`forward`] aims for: the L2 cache of one core
/// on any x86-64 of the last decade holds it.
const CHUNK_CACHE_BYTES: usize = 256 << 10;

const SPARE_BUFFERS: usize = 8;
const SPARE_BYTES: usize = 8 << 20;

thread_local! {
    static SPARE: RefCell<Spare> = RefCell::default();
}

/// A spare buffer of at least `len` elements from `pick` (or a new one), not yet sized: the
/// shortest one already that long if there is one (sizing it down touches nothing, and the
/// longer ones stay for longer values), else the longest one with room (the least to fill).
fn spare<T>(len: usize, pick: fn(&mut Spare) -> &mut Vec<Vec<T>>) -> Vec<T> {
    let spare = SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let list = pick(&mut s);
        let long_enough = (list.iter().enumerate())
            .filter(|(_, v)| v.len() >= len)
            .min_by_key(|(_, v)| v.len());
        let with_room = (list.iter().enumerate())
            .filter(|(_, v)| v.capacity() >= len)
            .max_by_key(|(_, v)| v.len());
        let (i, _) = long_enough.or(with_room)?;
        Some(list.swap_remove(i))
    });
    spare.unwrap_or_default()
}

/// A spare buffer of `len` elements, every one zero.
fn zeroed<T: Copy + Default>(len: usize, pick: fn(&mut Spare) -> &mut Vec<Vec<T>>) -> Vec<T> {
    let mut v = spare(len, pick);
    v.clear();
    v.resize(len, T::default());
    v
}

/// A spare buffer of `len` elements holding whatever an earlier value left there, for the
/// kernels that write every element of their output: zeroing it first would cost a pass over
/// memory for nothing.
fn overwritten<T: Copy + Default>(len: usize, pick: fn(&mut Spare) -> &mut Vec<Vec<T>>) -> Vec<T> {
    let mut v = spare(len, pick);
    // Shortens without touching the elements, or zero-fills only the new ones.
    v.resize(len, T::default());
    v
}

pub(crate) fn zeroed_u8(len: usize) -> Vec<u8> {
    zeroed(len, |s| &mut s.bytes)
}

pub(crate) fn zeroed_i32(len: usize) -> Vec<i32> {
    zeroed(len, |s| &mut s.words)
}

pub(crate) fn overwritten_u8(len: usize) -> Vec<u8> {
    overwritten(len, |s| &mut s.bytes)
}

pub(crate) fn overwritten_i32(len: usize) -> Vec<i32> {
    overwritten(len, |s| &mut s.words)
}

/// Keeps `buf`'s storage for a later [`spare`] on this thread.
pub(crate) fn recycle(buf: Buf) {
    fn keep<T>(list: &mut Vec<Vec<T>>, v: Vec<T>) {
        let bytes = v.capacity() * std::mem::size_of::<T>();
        if bytes == 0 || bytes > SPARE_BYTES {
            return;
        }
        list.push(v);
        // Full: the shortest goes (a long buffer serves any value, a short one only short ones).
        if list.len() > SPARE_BUFFERS {
            if let Some((i, _)) = list.iter().enumerate().min_by_key(|(_, v)| v.len()) {
                list.swap_remove(i);
            }
        }
    }
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        match buf {
            Buf::U8(v) => keep(&mut s.bytes, v),
            Buf::I32(v) => keep(&mut s.words, v),
            Buf::F32(_) => {}
        }
    });
}

/// A value of a batch.
#[derive(Debug, Clone)]
pub(crate) enum Buf {
    F32(Vec<f32>),
    U8(Vec<u8>),
    I32(Vec<i32>),
}

pub(super) fn forward(m: &IntegerModel, x: &[f32]) -> Result<Vec<f32>> {
    let in_f = m.numels[0];
    if in_f == 0 || !x.len().is_multiple_of(in_f) {
        return Err(QuantError::LengthMismatch {
            what: format!("input (whole samples of {:?})", m.graph.input.shape),
            expected: x.len().div_ceil(in_f.max(1)) * in_f,
            actual: x.len(),
        });
    }
    let n = x.len() / in_f;
    let total = (n as u64).saturating_mul(m.macs_per_sample());
    if total > m.budget.multiply_adds {
        return Err(QuantError::InvalidValue {
            what: "batch".into(),
            value: format!(
                "{n} samples of {} multiply-adds each ({total} in all)",
                m.macs_per_sample()
            ),
            expected: format!(
                "at most {} multiply-adds per call (the budget): run the samples in parts",
                m.budget.multiply_adds
            ),
        });
    }
    // Samples are independent: a batch worth splitting runs as one chunk per thread (one
    // fork-join per batch, not one per layer), and the chunks together stay within
    // the budget's working memory. Any split gives the same bits.
    let threads = rayon::current_num_threads().max(1);
    let worth_splitting = (n as u64).saturating_mul(m.macs_per_sample()) >= PARALLEL_MACS as u64;
    // No more chunks at once than fit the budget together (one sample always fits).
    let fit = m.samples_per_chunk();
    let (ways, memory_bound) = if threads > 1 && worth_splitting {
        let ways = threads.min(fit);
        (ways, (fit / ways).max(1))
    } else {
        (1, fit)
    };
    // And, for a batch whose values far outgrow a core's cache, chunks that fit it: each node
    // then reads what the last one wrote from cache rather than memory (measured 20% faster on
    // the ViTs at batch 360). A batch that nearly fits runs whole: splitting it costs more
    // in per-chunk overhead than it saves (the MLP, measured 1.4x slower in 4 chunks).
    let batch_bytes = n.saturating_mul(m.sample_bytes);
    let cache_bound = if batch_bytes > 4 * CHUNK_CACHE_BYTES {
        (CHUNK_CACHE_BYTES / m.sample_bytes.max(1)).max(1)
    } else {
        n
    };
    let chunk = chunk_samples(n, ways, n.div_ceil(ways).min(memory_bound).min(cache_bound));
    let chunks: Vec<&[f32]> = x.chunks(chunk * in_f).collect();
    // At most `ways` chunks run at once, so their memory stays within the budget.
    let mut outputs: Vec<Result<Vec<f32>>> = Vec::with_capacity(chunks.len());
    for group in chunks.chunks(ways) {
        if group.len() > 1 {
            outputs.extend(
                group
                    .par_iter()
                    .map(|xs| run_chunk(m, xs, xs.len() / in_f))
                    .collect::<Vec<_>>(),
            );
        } else {
            outputs.extend(group.iter().map(|xs| run_chunk(m, xs, xs.len() / in_f)));
        }
    }
    let mut out = Vec::with_capacity(n * m.numels[m.output]);
    for chunk_out in outputs {
        out.extend(chunk_out?);
    }
    Ok(out)
}

/// Samples per chunk for a batch of `n` run `ways` chunks at a time, each of at most `cap`
/// samples: as many chunks as rounds of `ways` need, shared out evenly. Cutting at `cap`
/// alone can leave a last round of one or two chunks while the other threads wait (360
/// samples of at most 20 on 16 threads: 16 chunks, then 2, the time of two full rounds of
/// 20; evenly, 30 chunks of 12: two rounds of 12).
fn chunk_samples(n: usize, ways: usize, cap: usize) -> usize {
    let (ways, cap) = (ways.max(1), cap.max(1));
    let rounds = n.div_ceil(cap).div_ceil(ways);
    n.div_ceil((rounds * ways).max(1)).clamp(1, cap)
}

fn run_chunk(m: &IntegerModel, x: &[f32], n: usize) -> Result<Vec<f32>> {
    let mut values: Vec<Option<Buf>> = vec![None; m.numels.len()];
    values[0] = Some(Buf::F32(x.to_vec()));
    for (i, node) in m.graph.nodes.iter().enumerate() {
        if m.steps[i].composed {
            continue;
        }
        let mut run = RunNode {
            name: &node.name,
            model: m,
            index: i,
            values: &mut values,
            step: &m.steps[i],
            samples: n,
        };
        let y = node.op.rules().run(&mut run)?;
        values[i + 1] = Some(y);
        for &v in &m.frees[i] {
            if let Some(buf) = values[v].take() {
                recycle(buf);
            }
        }
    }
    output(m, values[m.output].take(), n)
}

/// One node as the integer runtime runs it: its inputs' values (taken when it is their last
/// reader), how they are held, and what `OpRules::prepare` left for it.
pub(crate) struct RunNode<'a> {
    /// The node's name, for errors.
    pub name: &'a str,
    model: &'a IntegerModel,
    index: usize,
    values: &'a mut [Option<Buf>],
    /// What the preparation left for the kernel.
    pub step: &'a Step,
    /// Samples in the batch.
    pub samples: usize,
}

impl RunNode<'_> {
    fn value_number(&self, k: usize) -> usize {
        self.model.inputs[self.index][k]
    }

    /// The node's `k`-th input.
    pub fn input(&self, k: usize) -> Option<&Buf> {
        self.values[self.value_number(k)].as_ref()
    }

    /// The node's `k`-th input, taken when this node is its last reader, else cloned.
    pub fn take(&mut self, k: usize) -> Buf {
        let v = self.value_number(k);
        let value = if self.model.frees[self.index].contains(&v) {
            self.values[v].take()
        } else {
            self.values[v].clone()
        };
        value.unwrap_or(Buf::U8(Vec::new()))
    }

    /// How the node's `k`-th input is held.
    pub fn rep(&self, k: usize) -> &Rep {
        &self.model.reps[self.value_number(k)]
    }

    /// The layout of the node's `k`-th input.
    pub fn layout(&self, k: usize) -> Layout {
        self.model.layouts[self.value_number(k)]
    }

    /// The per-sample element count of the node's `k`-th input.
    pub fn numel(&self, k: usize) -> usize {
        self.model.numels[self.value_number(k)]
    }

    /// The layout of the node's output.
    pub fn output_layout(&self) -> Layout {
        self.model.layouts[self.index + 1]
    }

    /// The per-sample element count of the node's output.
    pub fn output_numel(&self) -> usize {
        self.model.numels[self.index + 1]
    }

    /// The error of a node whose inputs are not what its preparation promised (a bug, or a
    /// model changed after preparation).
    pub fn internal(&self) -> QuantError {
        internal(self.name)
    }
}

pub(crate) fn internal(node: &str) -> QuantError {
    QuantError::InvalidValue {
        what: "integer runtime state".into(),
        value: node.to_string(),
        expected: "a value prepared for this node (IntegerModel::new checks this)".into(),
    }
}

/// Planes `[c][hw]` → `[hw][c]` for each sample.
pub(crate) fn nchw_to_nhwc<T: Copy + Default>(x: &[T], c: usize, hw: usize) -> Vec<T> {
    let mut y = vec![T::default(); x.len()];
    for (xs, ys) in x.chunks(c * hw).zip(y.chunks_mut(c * hw)) {
        for ch in 0..c {
            for p in 0..hw {
                ys[p * c + ch] = xs[ch * hw + p];
            }
        }
    }
    y
}

/// A Linear or Conv2d layer on a batch of `n` samples of codes.
pub(crate) fn weighted(w: &Weighted, codes: &[u8], n: usize) -> Result<Vec<i32>> {
    // A Linear layer, or a 1x1 convolution with stride 1 and no padding, whose patches are each
    // pixel's channels (NHWC): one product on the codes, which writes every accumulator.
    let pointwise = |g: &Conv2dGeometry| g.groups <= 1 && g.window() == Window::square(1, 1, 0);
    let Some(conv) = w.conv.filter(|conv| !pointwise(&conv.geometry)) else {
        let rows = codes.len() / w.fan_in.max(1);
        let mut acc = overwritten_i32(rows * w.out);
        gemm_u8(
            codes,
            rows,
            w.input_zero,
            &w.groups[0],
            &w.biases[0],
            &mut acc,
        )?;
        return Ok(acc);
    };
    let (h, wd, c) = conv.input;
    let (oh, ow) = conv.output;
    let g = conv.geometry;
    let groups = g.groups.max(1);
    let (cg, og) = (c / groups, w.out / groups);
    let positions = oh * ow;
    let pad = w.input_zero as u8;
    let window = g.window();
    if let Some(filter) = &w.depthwise {
        // The filter writes every accumulator (bias first).
        let mut out = overwritten_i32(n * positions * w.out);
        for (xs, ys) in codes
            .chunks(h * wd * c)
            .zip(out.chunks_mut(positions * w.out))
        {
            filter.run(xs, [h, wd, c], window, w.input_zero, ys)?;
        }
        return Ok(out);
    }
    if groups == 1 {
        // Padding included; the convolution writes every accumulator.
        let mut out = overwritten_i32(n * positions * w.out);
        conv_u8(
            codes,
            [n, h, wd, c],
            window,
            w.input_zero,
            &w.groups[0],
            &w.biases[0],
            &mut out,
        )?;
        return Ok(out);
    }
    // Grouped: each group's channels on their own, scattered into the output's columns.
    let mut out = zeroed_i32(n * positions * w.out);
    let mut sample = vec![0u8; h * wd * cg];
    let mut patches = vec![0u8; positions * w.fan_in];
    let mut acc = vec![0i32; positions * og];
    for (b, xs) in codes.chunks(h * wd * c).enumerate() {
        for gi in 0..groups {
            for (p, dst) in sample.chunks_mut(cg).enumerate() {
                dst.copy_from_slice(&xs[p * c + gi * cg..p * c + (gi + 1) * cg]);
            }
            im2col_u8(&sample, [h, wd, cg], window, pad, &mut patches)?;
            gemm_u8(
                &patches,
                positions,
                w.input_zero,
                &w.groups[gi],
                &w.biases[gi],
                &mut acc,
            )?;
            for p in 0..positions {
                out[(b * positions + p) * w.out + gi * og..][..og]
                    .copy_from_slice(&acc[p * og..(p + 1) * og]);
            }
        }
    }
    Ok(out)
}

/// The output value as float, in the graph's (NCHW) order.
fn output(m: &IntegerModel, value: Option<Buf>, n: usize) -> Result<Vec<f32>> {
    let layout = m.layouts[m.output];
    let floats: Vec<f32> = match (value, &m.reps[m.output]) {
        (Some(Buf::I32(acc)), Rep::Acc { .. }) => {
            let scales = m
                .output
                .checked_sub(1)
                .map(|i| m.steps[i].logit_scales.as_slice())
                .unwrap_or(&[]);
            let c = scales.len().max(1);
            acc.iter()
                .enumerate()
                .map(|(i, a)| *a as f32 * scales.get(i % c).copied().unwrap_or(1.0))
                .collect()
        }
        (Some(Buf::U8(codes)), Rep::Codes(g)) => {
            let s = g.scale as f32;
            codes
                .iter()
                .map(|q| (*q as i32 - g.zero) as f32 * s)
                .collect()
        }
        _ => return Err(internal(&m.graph.output)),
    };
    Ok(match layout {
        Layout::Maps { c, h, w } | Layout::FlatMaps { c, h, w } => {
            // Stored [hw][c] → the graph's [c][hw].
            let mut y = vec![0f32; floats.len()];
            for (xs, ys) in floats.chunks(c * h * w).zip(y.chunks_mut(c * h * w)) {
                for p in 0..h * w {
                    for ch in 0..c {
                        ys[ch * h * w + p] = xs[p * c + ch];
                    }
                }
            }
            debug_assert_eq!(y.len(), n * c * h * w);
            y
        }
        Layout::Flat { .. } => floats,
    })
}

#[cfg(test)]
mod tests {
    use super::chunk_samples;

    /// The chunks of a plan: their sizes, in order.
    fn plan(n: usize, ways: usize, cap: usize) -> Vec<usize> {
        let chunk = chunk_samples(n, ways, cap);
        (0..n).step_by(chunk).map(|at| chunk.min(n - at)).collect()
    }

    #[test]
    fn chunks_fill_every_round_and_keep_to_the_cap() {
        // The case that left 14 of 16 threads idle: 16 chunks of 20, then 2.
        assert_eq!(plan(360, 16, 20), vec![12; 30]);
        for n in [1, 2, 15, 16, 17, 63, 64, 100, 360, 1000] {
            for ways in [1, 2, 3, 7, 16] {
                for cap in [1, 5, 20, 23, 64, 360] {
                    let sizes = plan(n, ways, cap);
                    let case = format!("{n} samples, {ways} at a time, at most {cap} each");
                    assert_eq!(sizes.iter().sum::<usize>(), n, "{case}");
                    assert!(
                        sizes.iter().all(|s| (1..=cap).contains(s)),
                        "{case}: {sizes:?}"
                    );
                    // No more rounds than cutting at the cap needs.
                    let rounds = sizes.len().div_ceil(ways);
                    assert_eq!(rounds, n.div_ceil(cap).div_ceil(ways), "{case}: {sizes:?}");
                    // The time, in rounds of the longest chunk, within a sample per round
                    // of the ideal share (cut at the cap alone, 360 on 16 at 20: 40 > 25).
                    assert!(
                        rounds * sizes[0] <= n.div_ceil(ways) + rounds,
                        "{case}: {sizes:?}"
                    );
                }
            }
        }
    }
}

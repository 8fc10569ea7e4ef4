//! Running a prepared graph on a batch.

use std::cell::RefCell;

use quant_core::int8::PARALLEL_MACS;
use quant_core::{QuantError, Result};
use rayon::prelude::*;

use super::prepare::{Nonlinear, Quantize, Weighted};
use super::{IntegerModel, Layout, Rep};
use crate::graph::{AttentionContext, AttentionScores, AvgPool2d, MaxPool2d, Op};
use quant_core::int8::{
    attention_context_u8, attention_scores_u8, gemm_u8, im2col_u8, max_pool_i32, max_pool_u8,
    AttentionShape, Isa, Window,
};

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

/// A spare buffer of at least `len` elements from `pick` (or a new one), not yet sized.
fn spare<T>(len: usize, pick: fn(&mut Spare) -> &mut Vec<Vec<T>>) -> Vec<T> {
    let spare = SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let list = pick(&mut s);
        let i = list.iter().position(|v| v.capacity() >= len)?;
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

fn zeroed_u8(len: usize) -> Vec<u8> {
    zeroed(len, |s| &mut s.bytes)
}

fn zeroed_i32(len: usize) -> Vec<i32> {
    zeroed(len, |s| &mut s.words)
}

fn overwritten_u8(len: usize) -> Vec<u8> {
    overwritten(len, |s| &mut s.bytes)
}

fn overwritten_i32(len: usize) -> Vec<i32> {
    overwritten(len, |s| &mut s.words)
}

/// Keeps `buf`'s storage for a later [`spare`] on this thread.
fn recycle(buf: Buf) {
    fn keep<T>(list: &mut Vec<Vec<T>>, v: Vec<T>) {
        let bytes = v.capacity() * std::mem::size_of::<T>();
        if list.len() < SPARE_BUFFERS && bytes > 0 && bytes <= SPARE_BYTES {
            list.push(v);
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
enum Buf {
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
    let chunk = n.div_ceil(ways).min(memory_bound).min(cache_bound).max(1);
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

/// Takes value `v` when node `i` is its last reader, clones it otherwise.
fn take(values: &mut [Option<Buf>], frees: &[usize], v: usize) -> Buf {
    if frees.contains(&v) {
        values[v].take().unwrap_or(Buf::U8(Vec::new()))
    } else {
        values[v].clone().unwrap_or(Buf::U8(Vec::new()))
    }
}

fn run_chunk(m: &IntegerModel, x: &[f32], n: usize) -> Result<Vec<f32>> {
    let mut values: Vec<Option<Buf>> = vec![None; m.numels.len()];
    values[0] = Some(Buf::F32(x.to_vec()));
    for (i, node) in m.graph.nodes.iter().enumerate() {
        let a = m.inputs[i][0];
        let step = &m.steps[i];
        let frees = &m.frees[i];
        let y = match &node.op {
            Op::QuantizeDequantize(_) => match step.quantize.as_ref() {
                Some(q) => quantize(q, values[a].as_ref(), m.layouts[a])?,
                None => return Err(internal(&node.name)),
            },
            Op::Linear(_) | Op::Conv2d(_) => match (&step.weighted, values[a].as_ref()) {
                (Some(w), Some(Buf::U8(codes))) => Buf::I32(weighted(w, codes, n)?),
                _ => return Err(internal(&node.name)),
            },
            Op::Relu => match (take(&mut values, frees, a), &m.reps[a]) {
                (Buf::I32(mut v), _) => {
                    v.iter_mut().for_each(|x| *x = (*x).max(0));
                    Buf::I32(v)
                }
                (Buf::U8(mut v), Rep::Codes(g)) => {
                    let z = g.zero as u8;
                    v.iter_mut().for_each(|x| *x = (*x).max(z));
                    Buf::U8(v)
                }
                _ => return Err(internal(&node.name)),
            },
            Op::Flatten => take(&mut values, frees, a),
            Op::Add => {
                let b = m.inputs[i][1];
                match (values[a].as_ref(), values[b].as_ref(), &m.reps[a]) {
                    (Some(Buf::U8(x)), Some(Buf::U8(y)), Rep::Codes(g)) => Buf::I32(
                        x.iter()
                            .zip(y)
                            .map(|(p, q)| *p as i32 + *q as i32 - 2 * g.zero)
                            .collect(),
                    ),
                    _ => return Err(internal(&node.name)),
                }
            }
            Op::MaxPool2d(MaxPool2d { window: p }) => {
                let ((c, h, w), (oh, ow)) = pool_dims(m, a, i + 1, &node.name)?;
                let (per_in, per_out) = (h * w * c, oh * ow * c);
                match values[a].as_ref() {
                    Some(Buf::U8(v)) => {
                        let mut y = zeroed_u8(n * per_out);
                        let window = Window::square(p.kernel, p.stride, p.padding);
                        for (xs, ys) in v.chunks(per_in).zip(y.chunks_mut(per_out)) {
                            max_pool_u8(xs, [h, w, c], window, ys)?;
                        }
                        Buf::U8(y)
                    }
                    Some(Buf::I32(v)) => {
                        let mut y = zeroed_i32(n * per_out);
                        let window = Window::square(p.kernel, p.stride, p.padding);
                        for (xs, ys) in v.chunks(per_in).zip(y.chunks_mut(per_out)) {
                            max_pool_i32(xs, [h, w, c], window, ys)?;
                        }
                        Buf::I32(y)
                    }
                    _ => return Err(internal(&node.name)),
                }
            }
            Op::AvgPool2d(AvgPool2d { window: p }) => {
                let ((c, h, w), (oh, ow)) = pool_dims(m, a, i + 1, &node.name)?;
                // Window sums of centered values; the scale carries the division.
                let centered: Vec<i32> = match (values[a].as_ref(), &m.reps[a]) {
                    (Some(Buf::U8(v)), Rep::Codes(g)) => {
                        v.iter().map(|q| *q as i32 - g.zero).collect()
                    }
                    (Some(Buf::I32(v)), _) => v.clone(),
                    _ => return Err(internal(&node.name)),
                };
                Buf::I32(sum_pool(&centered, n, (h, w, c), p, (oh, ow)))
            }
            Op::GlobalAvgPool | Op::GlobalMaxPool => {
                let Layout::Maps { c, h, w } = m.layouts[a] else {
                    return Err(internal(&node.name));
                };
                let avg = matches!(node.op, Op::GlobalAvgPool);
                match (values[a].as_ref(), &m.reps[a]) {
                    (Some(Buf::U8(v)), Rep::Codes(g)) if avg => {
                        Buf::I32(channel_reduce(v, c, h * w, 0, |s, q| {
                            s + (*q as i32 - g.zero)
                        }))
                    }
                    (Some(Buf::U8(v)), _) => {
                        Buf::U8(channel_reduce(v, c, h * w, u8::MIN, |s, q| s.max(*q)))
                    }
                    (Some(Buf::I32(v)), _) if avg => {
                        Buf::I32(channel_reduce(v, c, h * w, 0, |s, q| s + q))
                    }
                    (Some(Buf::I32(v)), _) => {
                        Buf::I32(channel_reduce(v, c, h * w, i32::MIN, |s, q| s.max(*q)))
                    }
                    _ => return Err(internal(&node.name)),
                }
            }
            Op::LayerNorm(_) | Op::Gelu | Op::Softmax => {
                let mut y = overwritten_i32(n * m.numels[i + 1]);
                match (&step.nonlinear, values[a].as_ref()) {
                    (Some(Nonlinear::LayerNorm(k)), Some(Buf::U8(x))) => k.run(x, &mut y)?,
                    (Some(Nonlinear::Gelu(k)), Some(Buf::U8(x))) => k.run(x, &mut y)?,
                    (Some(Nonlinear::Softmax(k)), Some(Buf::I32(x))) => k.run(x, &mut y)?,
                    _ => return Err(internal(&node.name)),
                }
                Buf::I32(y)
            }
            Op::ImageTokens(_) => {
                let pos = &step.position;
                let mut y = match (take(&mut values, frees, a), &m.reps[a]) {
                    (Buf::I32(v), _) => v,
                    (Buf::U8(v), Rep::Codes(g)) => v.iter().map(|q| *q as i32 - g.zero).collect(),
                    _ => return Err(internal(&node.name)),
                };
                // NHWC maps are already [tokens, channels]; prepare bounds the result in i32.
                let shift = step.position_shift;
                for sample in y.chunks_mut(pos.len().max(1)) {
                    sample
                        .iter_mut()
                        .zip(pos)
                        .for_each(|(v, p)| *v = (*v << shift) + p);
                }
                Buf::I32(y)
            }
            Op::MeanTokens => {
                let Layout::Flat { features: c } = m.layouts[a] else {
                    return Err(internal(&node.name));
                };
                let tokens = m.numels[a] / c.max(1);
                match (values[a].as_ref(), &m.reps[a]) {
                    // Prepare bounds the sum of centered codes within i32.
                    (Some(Buf::U8(v)), Rep::Codes(g)) => Buf::I32(
                        token_sums(v, c, tokens, |q| i64::from(*q) - i64::from(g.zero))
                            .map(|s| s as i32)
                            .collect(),
                    ),
                    // The mean, rounded to nearest (ties to even) at the accumulators' scale.
                    (Some(Buf::I32(v)), _) => Buf::I32(
                        token_sums(v, c, tokens, |q| i64::from(*q))
                            .map(|s| rounded_div(s, tokens as i64))
                            .collect(),
                    ),
                    _ => return Err(internal(&node.name)),
                }
            }
            Op::AttentionScores(AttentionScores { heads })
            | Op::AttentionContext(AttentionContext { heads }) => {
                let b = m.inputs[i][1];
                let (Some(Buf::U8(x)), Some(Buf::U8(y)), Rep::Codes(gx), Rep::Codes(gy)) = (
                    values[a].as_ref(),
                    values[b].as_ref(),
                    &m.reps[a],
                    &m.reps[b],
                ) else {
                    return Err(internal(&node.name));
                };
                let (fx, fy, zeros) = (features(m, a), features(m, b), [gx.zero, gy.zero]);
                let isa = Isa::detected();
                Buf::I32(if matches!(node.op, Op::AttentionScores(_)) {
                    let shape = AttentionShape {
                        queries: m.numels[a] / fx,
                        keys: m.numels[b] / fy,
                        features: fx,
                        heads: *heads,
                    };
                    let mut scores = overwritten_i32(n * heads * shape.queries * shape.keys);
                    attention_scores_u8(isa, x, y, shape, zeros, &mut scores)?;
                    scores
                } else {
                    let shape = AttentionShape {
                        queries: m.numels[a] / (fx * heads),
                        keys: fx,
                        features: fy,
                        heads: *heads,
                    };
                    let mut out = overwritten_i32(n * shape.queries * shape.features);
                    attention_context_u8(isa, x, y, shape, zeros, &mut out)?;
                    out
                })
            }
            Op::Tanh | Op::Sigmoid | Op::ChannelAffine(_) => return Err(internal(&node.name)),
        };
        values[i + 1] = Some(y);
        for &v in frees {
            if let Some(buf) = values[v].take() {
                recycle(buf);
            }
        }
    }
    output(m, values[m.output].take(), n)
}

/// The features per row of value `v` (a `Flat` value).
fn features(m: &IntegerModel, v: usize) -> usize {
    match m.layouts[v] {
        Layout::Flat { features } => features.max(1),
        _ => 1,
    }
}

/// Per sample, the sum over `tokens` rows of each of `c` features, in `i64` (`2^31` tokens of
/// `i32` values fit).
fn token_sums<'a, T>(
    x: &'a [T],
    c: usize,
    tokens: usize,
    value: impl Fn(&T) -> i64 + 'a,
) -> impl Iterator<Item = i64> + 'a {
    x.chunks(c * tokens).flat_map(move |sample| {
        let mut sums = vec![0i64; c];
        for row in sample.chunks(c) {
            sums.iter_mut().zip(row).for_each(|(s, q)| *s += value(q));
        }
        sums
    })
}

/// `a / b` rounded to nearest, ties to even, for `b > 0` (a mean of `i32` values fits).
fn rounded_div(a: i64, b: i64) -> i32 {
    let (q, r) = (a.div_euclid(b), a.rem_euclid(b));
    let up = match (2 * r).cmp(&b) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Equal => q % 2 != 0,
        std::cmp::Ordering::Less => false,
    };
    (q + i64::from(up)) as i32
}

/// A pooling node's input maps `(channels, height, width)` and output maps `(height, width)`.
type PoolDims = ((usize, usize, usize), (usize, usize));

/// The [`PoolDims`] of a pooling node reading value `a` and writing value `y`.
fn pool_dims(m: &IntegerModel, a: usize, y: usize, node: &str) -> Result<PoolDims> {
    match (m.layouts[a], m.layouts[y]) {
        (Layout::Maps { c, h, w }, Layout::Maps { h: oh, w: ow, .. }) => Ok(((c, h, w), (oh, ow))),
        _ => Err(internal(node)),
    }
}

fn internal(node: &str) -> QuantError {
    QuantError::InvalidValue {
        what: "integer runtime state".into(),
        value: node.to_string(),
        expected: "a value prepared for this node (IntegerModel::new checks this)".into(),
    }
}

fn quantize(q: &Quantize, x: Option<&Buf>, layout: Layout) -> Result<Buf> {
    match (q, x) {
        (Quantize::Float { quantizer, offset }, Some(Buf::F32(x))) => {
            let codes: Vec<i32> = quantizer.quantize(x, &[x.len()])?;
            let stored: Vec<u8> = codes.iter().map(|c| (c + offset) as u8).collect();
            Ok(Buf::U8(match layout {
                // The float input is NCHW; codes are stored NHWC.
                Layout::Maps { c, h, w } => nchw_to_nhwc(&stored, c, h * w),
                _ => stored,
            }))
        }
        (
            Quantize::Requantize {
                requantizer,
                input_zero,
            },
            Some(buf),
        ) => {
            let centered;
            let acc: &[i32] = match (buf, input_zero) {
                (Buf::I32(v), None) => v,
                (Buf::U8(v), Some(z)) => {
                    centered = v.iter().map(|q| *q as i32 - z).collect::<Vec<i32>>();
                    &centered
                }
                _ => return Err(internal("quantize")),
            };
            let mut out = overwritten_u8(acc.len());
            requantizer.run(acc, &mut out)?;
            Ok(Buf::U8(out))
        }
        _ => Err(internal("quantize")),
    }
}

/// Planes `[c][hw]` → `[hw][c]` for each sample.
fn nchw_to_nhwc<T: Copy + Default>(x: &[T], c: usize, hw: usize) -> Vec<T> {
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
fn weighted(w: &Weighted, codes: &[u8], n: usize) -> Result<Vec<i32>> {
    let Some(conv) = w.conv else {
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
    let window = Window::square(g.kernel, g.stride, g.padding);
    if let Some(filter) = &w.depthwise {
        let mut out = zeroed_i32(n * positions * w.out);
        for (xs, ys) in codes
            .chunks(h * wd * c)
            .zip(out.chunks_mut(positions * w.out))
        {
            filter.run(xs, [h, wd, c], window, w.input_zero, ys)?;
        }
        return Ok(out);
    }
    if groups == 1 {
        // im2col writes every patch (padding included) and the product every accumulator.
        let mut out = overwritten_i32(n * positions * w.out);
        let mut patches = overwritten_u8(n * positions * w.fan_in);
        for (xs, ps) in codes
            .chunks(h * wd * c)
            .zip(patches.chunks_mut(positions * w.fan_in))
        {
            im2col_u8(xs, [h, wd, c], window, pad, ps)?;
        }
        gemm_u8(
            &patches,
            n * positions,
            w.input_zero,
            &w.groups[0],
            &w.biases[0],
            &mut out,
        )?;
        recycle(Buf::U8(patches));
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

/// Per sample and channel, `f` folded over the `plane` positions of NHWC values from `init`.
fn channel_reduce<T: Copy, A: Copy>(
    x: &[T],
    c: usize,
    plane: usize,
    init: A,
    f: impl Fn(A, &T) -> A,
) -> Vec<A> {
    let mut out = Vec::with_capacity(x.len() / plane.max(1));
    for sample in x.chunks_exact((c * plane).max(1)) {
        let mut acc = vec![init; c];
        for pos in sample.chunks_exact(c.max(1)) {
            for (a, v) in acc.iter_mut().zip(pos) {
                *a = f(*a, v);
            }
        }
        out.extend(acc);
    }
    out
}

/// Window sums of NHWC values (padding counts as zero).
fn sum_pool(
    x: &[i32],
    n: usize,
    (h, w, c): (usize, usize, usize),
    p: &crate::graph::PoolGeometry,
    (oh, ow): (usize, usize),
) -> Vec<i32> {
    let mut y = zeroed_i32(n * oh * ow * c);
    for (xs, ys) in x.chunks(h * w * c).zip(y.chunks_mut(oh * ow * c)) {
        for oy in 0..oh {
            for ox in 0..ow {
                let dst = &mut ys[(oy * ow + ox) * c..(oy * ow + ox + 1) * c];
                for ky in 0..p.kernel {
                    let iy = (oy * p.stride + ky) as isize - p.padding as isize;
                    if iy < 0 || iy as usize >= h {
                        continue;
                    }
                    for kx in 0..p.kernel {
                        let ix = (ox * p.stride + kx) as isize - p.padding as isize;
                        if ix < 0 || ix as usize >= w {
                            continue;
                        }
                        let src = &xs[(iy as usize * w + ix as usize) * c..][..c];
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += *s;
                        }
                    }
                }
            }
        }
    }
    y
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

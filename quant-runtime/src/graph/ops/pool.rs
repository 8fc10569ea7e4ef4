//! Pooling: `MaxPool2d` and `AvgPool2d` over windows, `GlobalAvgPool` and `GlobalMaxPool` over
//! whole channels.

use serde::{Deserialize, Serialize};

use super::expect_axes;
use super::{maps, pair_text, taps, window_output, OpRules};
use crate::export::onnx::proto::AttributeProto;
use crate::export::onnx::writer::{int_attr, ints_attr, OnnxNode, Writer};
use crate::graph::eval::EvalNode;
use crate::graph::Axes;
use crate::graph::MAX_ELEMENTS;
use crate::integer::prepare::{reach, unsupported, within_i32, PrepareNode, Prepared};
use crate::integer::run::{zeroed_i32, zeroed_u8, Buf, RunNode};
use crate::integer::{Layout, Rep};
use crate::GraphError;
use quant_core::int8::{max_pool_i32, max_pool_u8, Window};

/// Geometry of a pooling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolGeometry {
    /// Window size, `[height, width]` (files write a square window as one number).
    #[serde(with = "super::square_or_pair")]
    pub kernel: [usize; 2],
    /// Steps between windows, `[down, across]`.
    #[serde(with = "super::square_or_pair")]
    pub stride: [usize; 2],
    /// Padding on each side, `[top and bottom, left and right]` (never selected by max
    /// pooling; counted as zeros by average pooling, as dfdx's and ONNX's
    /// `count_include_pad = 1`).
    #[serde(with = "super::square_or_pair")]
    pub padding: [usize; 2],
}

/// Max pooling of `[channels, height, width]` maps (padding never wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MaxPool2d {
    /// The window.
    pub window: PoolGeometry,
}

/// Average pooling of `[channels, height, width]` maps (padding counts as zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AvgPool2d {
    /// The window.
    pub window: PoolGeometry,
}

impl PoolGeometry {
    /// The window the integer kernels slide.
    pub fn window(&self) -> Window {
        Window {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
        }
    }

    /// The output shape of maps of `inputs` shape, the window checked against them.
    fn shape(&self, inputs: &[&[usize]], what: &str) -> Result<Vec<usize>, String> {
        let p = self;
        let (c, h, w) = maps(inputs, what)?;
        let bad_axis = |a: usize| {
            p.kernel[a] == 0
                || p.stride[a] == 0
                || p.kernel[a] > MAX_ELEMENTS
                || p.stride[a] > MAX_ELEMENTS
                || p.padding[a] > p.kernel[a] / 2
        };
        if bad_axis(0) || bad_axis(1) {
            return Err(format!(
                "kernel {}, stride {}, padding {}: kernel and stride must be in 1..={MAX_ELEMENTS} and the padding at most half the kernel",
                pair_text(p.kernel),
                pair_text(p.stride),
                pair_text(p.padding)
            ));
        }
        match window_output([h, w], p.kernel, p.stride, p.padding) {
            Some([oh, ow]) => Ok(vec![c, oh, ow]),
            None => Err(format!(
                "a {h}x{w} input is smaller than its {}x{} window",
                p.kernel[0], p.kernel[1]
            )),
        }
    }

    /// Max or average pooling, NCHW; padding never wins a max and counts as zero in an average.
    fn evaluate(&self, node: &EvalNode<'_>, max: bool) -> Vec<f32> {
        let (in_shape, out_shape) = (node.shapes[0], node.output_shape);
        let (c, h, w) = (in_shape[0], in_shape[1], in_shape[2]);
        let (oh, ow) = (out_shape[1], out_shape[2]);
        let ([kh, kw], [sh, sw], [ph, pw]) = (self.kernel, self.stride, self.padding);
        let mut y = Vec::with_capacity(node.samples * c * oh * ow);
        for plane in node.inputs[0].chunks_exact(h * w).take(node.samples * c) {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut best = f32::NEG_INFINITY;
                    let mut sum = 0f32;
                    for (_, iy) in taps(oy, kh, sh, ph, h) {
                        for (_, ix) in taps(ox, kw, sw, pw, w) {
                            let v = plane[iy * w + ix];
                            best = best.max(v);
                            sum += v;
                        }
                    }
                    y.push(if max { best } else { sum / (kh * kw) as f32 });
                }
            }
        }
        y
    }

    /// `MaxPool` / `AveragePool` with the window's geometry (ceil_mode 0: the graph's floor).
    fn write_onnx(
        &self,
        op_type: &str,
        w: &mut Writer<'_>,
        node: &OnnxNode<'_>,
        mut attrs: Vec<AttributeProto>,
    ) {
        attrs.extend([
            ints_attr("kernel_shape", &self.kernel),
            ints_attr("strides", &self.stride),
            // ONNX: [top, left, bottom, right].
            ints_attr(
                "pads",
                &[
                    self.padding[0],
                    self.padding[1],
                    self.padding[0],
                    self.padding[1],
                ],
            ),
        ]);
        let x = node.inputs[0].clone();
        w.op(op_type, &node.node.name, &[x], node.out.clone(), attrs);
    }
}

/// The output maps `[c, oh, ow]` of a pooling node, or why it cannot run.
fn pooled_maps(node: &PrepareNode<'_>) -> Result<Layout, GraphError> {
    let Layout::Maps { c, .. } = node.layout(0) else {
        return Err(unsupported(node.name, "its input is not feature maps"));
    };
    let out = node.output_shape();
    Ok(Layout::Maps {
        c,
        h: out[1],
        w: out[2],
    })
}

impl OpRules for MaxPool2d {
    fn name(&self) -> &'static str {
        "MaxPool2d"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        self.window.shape(inputs, self.name())
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes(self.name(), inputs, 0, Axes::Maps)?;
        Ok(Axes::Maps)
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        Ok(self.window.evaluate(node, true))
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let layout = pooled_maps(node)?;
        let [kh, kw] = self.window.kernel;
        node.cost = (node.output_numel() as u64) * (kh as u64) * (kw as u64);
        Ok((node.rep(0).clone(), layout))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let ((c, h, w), (oh, ow)) = pool_dims(node)?;
        let (per_in, per_out, n) = (h * w * c, oh * ow * c, node.samples);
        let window = self.window.window();
        match node.input(0) {
            Some(Buf::U8(v)) => {
                let mut y = zeroed_u8(n * per_out);
                for (xs, ys) in v.chunks(per_in).zip(y.chunks_mut(per_out)) {
                    max_pool_u8(xs, [h, w, c], window, ys)?;
                }
                Ok(Buf::U8(y))
            }
            Some(Buf::I32(v)) => {
                let mut y = zeroed_i32(n * per_out);
                for (xs, ys) in v.chunks(per_in).zip(y.chunks_mut(per_out)) {
                    max_pool_i32(xs, [h, w, c], window, ys)?;
                }
                Ok(Buf::I32(y))
            }
            _ => Err(node.internal()),
        }
    }

    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        self.window.write_onnx("MaxPool", w, node, Vec::new());
        Ok(())
    }
}

impl OpRules for AvgPool2d {
    fn name(&self) -> &'static str {
        "AvgPool2d"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        self.window.shape(inputs, self.name())
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes(self.name(), inputs, 0, Axes::Maps)?;
        Ok(Axes::Maps)
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        Ok(self.window.evaluate(node, false))
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let layout = pooled_maps(node)?;
        let window = (self.window.kernel[0] * self.window.kernel[1]) as u64;
        node.cost = (node.output_numel() as u64) * window;
        let (scales, bound) = match node.rep(0) {
            Rep::Codes(g) => (vec![g.scale], reach(g)),
            Rep::Acc { scales, bound } => (scales.clone(), *bound),
            Rep::Float => unreachable!("float inputs are refused before any op prepares"),
        };
        let bound = bound.saturating_mul(window as i64);
        within_i32(node.name, bound, "a window sum of")?;
        let scales = scales.iter().map(|s| s / window as f64).collect();
        Ok((Rep::Acc { scales, bound }, layout))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let ((c, h, w), (oh, ow)) = pool_dims(node)?;
        // Window sums of centered values; the scale carries the division.
        let centered: Vec<i32> = match (node.input(0), node.rep(0)) {
            (Some(Buf::U8(v)), Rep::Codes(g)) => v.iter().map(|q| *q as i32 - g.zero).collect(),
            (Some(Buf::I32(v)), _) => v.clone(),
            _ => return Err(node.internal()),
        };
        let sums = sum_pool(&centered, node.samples, (h, w, c), &self.window, (oh, ow));
        Ok(Buf::I32(sums))
    }

    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        // Padding counts as zeros, as in the graph (and dfdx).
        let attrs = vec![int_attr("count_include_pad", 1)];
        self.window.write_onnx("AveragePool", w, node, attrs);
        Ok(())
    }
}

/// The mean or the maximum of each channel of `[channels, height, width]` maps.
pub(crate) enum GlobalPool {
    Average,
    Max,
}

impl OpRules for GlobalPool {
    fn name(&self) -> &'static str {
        match self {
            GlobalPool::Average => "GlobalAvgPool",
            GlobalPool::Max => "GlobalMaxPool",
        }
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        let (c, _, _) = maps(inputs, self.name())?;
        Ok(vec![c])
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes(self.name(), inputs, 0, Axes::Maps)?;
        Ok(Axes::Features)
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let plane: usize = node.shapes[0][1..].iter().product();
        Ok(node.inputs[0]
            .chunks_exact(plane.max(1))
            .map(|p| match self {
                GlobalPool::Average => p.iter().sum::<f32>() / plane as f32,
                GlobalPool::Max => p.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            })
            .collect())
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let Layout::Maps { c, h, w } = node.layout(0) else {
            return Err(unsupported(node.name, "its input is not feature maps"));
        };
        let plane = (h * w) as u64;
        node.cost = node.numel(0) as u64;
        let rep = match (self, node.rep(0)) {
            (GlobalPool::Max, r) => r.clone(),
            // The sum of centered values; the scale carries the division.
            (GlobalPool::Average, Rep::Codes(g)) => Rep::Acc {
                scales: vec![g.scale / plane as f64],
                bound: reach(g).saturating_mul(plane as i64),
            },
            (GlobalPool::Average, Rep::Acc { scales, bound }) => Rep::Acc {
                scales: scales.iter().map(|s| s / plane as f64).collect(),
                bound: bound.saturating_mul(plane as i64),
            },
            (GlobalPool::Average, Rep::Float) => {
                unreachable!("float inputs are refused before any op prepares")
            }
        };
        if let Rep::Acc { bound, .. } = &rep {
            within_i32(node.name, *bound, "a sum")?;
        }
        Ok((rep, Layout::Flat { features: c }))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let Layout::Maps { c, h, w } = node.layout(0) else {
            return Err(node.internal());
        };
        let avg = matches!(self, GlobalPool::Average);
        Ok(match (node.input(0), node.rep(0)) {
            (Some(Buf::U8(v)), Rep::Codes(g)) if avg => {
                Buf::I32(channel_reduce(v, c, h * w, 0, |s, q| {
                    s + (*q as i32 - g.zero)
                }))
            }
            (Some(Buf::U8(v)), _) => {
                Buf::U8(channel_reduce(v, c, h * w, u8::MIN, |s, q| s.max(*q)))
            }
            (Some(Buf::I32(v)), _) if avg => Buf::I32(channel_reduce(v, c, h * w, 0, |s, q| s + q)),
            (Some(Buf::I32(v)), _) => {
                Buf::I32(channel_reduce(v, c, h * w, i32::MIN, |s, q| s.max(*q)))
            }
            _ => return Err(node.internal()),
        })
    }

    /// `[N, C, H, W]` → `[N, C, 1, 1]`, flattened to the graph's `[N, C]`.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let op_type = match self {
            GlobalPool::Average => "GlobalAveragePool",
            GlobalPool::Max => "GlobalMaxPool",
        };
        let x = node.inputs[0].clone();
        let pooled = w.step(node.node, op_type, &[x], Vec::new(), "pooled");
        let attrs = vec![int_attr("axis", 1)];
        w.op(
            "Flatten",
            &node.node.name,
            &[pooled],
            node.out.clone(),
            attrs,
        );
        Ok(())
    }
}

/// A pooling node's input maps `(channels, height, width)` and output maps `(height, width)`.
type PoolDims = ((usize, usize, usize), (usize, usize));

/// The [`PoolDims`] of a pooling node.
fn pool_dims(node: &RunNode<'_>) -> quant_core::Result<PoolDims> {
    match (node.layout(0), node.output_layout()) {
        (Layout::Maps { c, h, w }, Layout::Maps { h: oh, w: ow, .. }) => Ok(((c, h, w), (oh, ow))),
        _ => Err(node.internal()),
    }
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
    p: &PoolGeometry,
    (oh, ow): (usize, usize),
) -> Vec<i32> {
    let mut y = zeroed_i32(n * oh * ow * c);
    for (xs, ys) in x.chunks(h * w * c).zip(y.chunks_mut(oh * ow * c)) {
        for oy in 0..oh {
            for ox in 0..ow {
                let dst = &mut ys[(oy * ow + ox) * c..(oy * ow + ox + 1) * c];
                for (_, iy) in taps(oy, p.kernel[0], p.stride[0], p.padding[0], h) {
                    for (_, ix) in taps(ox, p.kernel[1], p.stride[1], p.padding[1], w) {
                        let src = &xs[(iy * w + ix) * c..][..c];
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

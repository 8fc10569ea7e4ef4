//! `Conv2d`: 2-D convolution of `[channels, height, width]` maps with zero padding.

use serde::{Deserialize, Serialize};

use super::expect_axes;
use super::{check_bias, maps, pair_text, OpRules};
use crate::export::onnx::writer::{int_attr, ints_attr, OnnxNode, Writer};
use crate::graph::eval::{bias_values, dequantized, EvalNode};
use crate::graph::params::check_parameter;
use crate::graph::Axes;
use crate::graph::{checked_numel, Parameter, MAX_ELEMENTS};
use crate::integer::prepare::{
    accumulator_bias, accumulator_bound, reach, unsupported, weight_codes, PrepareNode, Prepared,
};
use crate::integer::{Conv, Layout, Rep, Weighted, MAX_SAMPLE_ELEMENTS};
use crate::GraphError;
use quant_core::int8::{DepthwiseFilter, Isa, PackedMatrix, Window};

/// Geometry of a 2-D convolution with zero padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conv2dGeometry {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel size, `[height, width]` (files write a square kernel as one number).
    #[serde(with = "super::square_or_pair")]
    pub kernel: [usize; 2],
    /// Steps between windows, `[down, across]`.
    #[serde(with = "super::square_or_pair")]
    pub stride: [usize; 2],
    /// Zero padding on each side, `[top and bottom, left and right]`.
    #[serde(with = "super::square_or_pair")]
    pub padding: [usize; 2],
    /// Channel groups: each output channel sees `in_channels / groups` input channels
    /// (`groups = in_channels` is a depthwise convolution).
    #[serde(default = "one")]
    pub groups: usize,
}

fn one() -> usize {
    1
}

impl Conv2dGeometry {
    /// Input channels each output channel sees.
    pub fn group_in_channels(&self) -> usize {
        self.in_channels / self.groups.max(1)
    }

    /// The weight's shape, `[out_channels, in_channels / groups, kernel height, kernel width]`.
    pub fn weight_shape(&self) -> [usize; 4] {
        let [kh, kw] = self.kernel;
        [self.out_channels, self.group_in_channels(), kh, kw]
    }

    /// Inputs per output value: `in_channels / groups · kernel height · kernel width`.
    pub fn fan_in(&self) -> usize {
        self.group_in_channels() * self.kernel[0] * self.kernel[1]
    }

    /// The window the integer kernels slide.
    pub fn window(&self) -> Window {
        Window {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
        }
    }

    /// The output `[height, width]` over `[h, w]` maps, when the kernel fits them.
    pub fn output(&self, input: [usize; 2]) -> Option<[usize; 2]> {
        super::window_output(input, self.kernel, self.stride, self.padding)
    }
}

/// 2-D convolution of `[channels, height, width]` maps with zero padding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conv2d {
    /// Geometry.
    pub geometry: Conv2dGeometry,
    /// Weight `[out, in / groups, kernel height, kernel width]`, float or codes.
    pub weight: Parameter,
    /// Bias `[out]`, float or accumulator values.
    pub bias: Parameter,
}

impl Conv2d {
    /// The shapes of the weight and the bias.
    pub(crate) fn weight_and_bias_shapes(&self) -> [Vec<usize>; 2] {
        [
            self.geometry.weight_shape().to_vec(),
            vec![self.geometry.out_channels],
        ]
    }
}

impl OpRules for Conv2d {
    fn name(&self) -> &'static str {
        "Conv2d"
    }

    fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String> {
        let g = &self.geometry;
        let (c, h, w) = maps(inputs, "Conv2d")?;
        if g.groups == 0
            || !g.in_channels.is_multiple_of(g.groups)
            || !g.out_channels.is_multiple_of(g.groups)
        {
            return Err(format!(
                "{} groups must divide {} input and {} output channels",
                g.groups, g.in_channels, g.out_channels
            ));
        }
        if c != g.in_channels {
            return Err(format!("receives {c} channels; expects {}", g.in_channels));
        }
        let bad_axis = |a: usize| {
            g.kernel[a] == 0
                || g.stride[a] == 0
                || g.stride[a] > MAX_ELEMENTS
                || g.padding[a] >= g.kernel[a]
        };
        if bad_axis(0) || bad_axis(1) {
            return Err(format!(
                "kernel {}, stride {}, padding {}: kernel and stride must be at least 1 and the padding smaller than the kernel",
                pair_text(g.kernel),
                pair_text(g.stride),
                pair_text(g.padding)
            ));
        }
        let numel = checked_numel(&g.weight_shape()).ok_or_else(|| {
            format!(
                "weight {:?} is empty or holds more than {MAX_ELEMENTS} values",
                g.weight_shape()
            )
        })?;
        if values {
            check_parameter(
                &self.weight,
                "weight",
                numel,
                g.out_channels,
                &["float", "codes"],
            )?;
            check_bias(&self.bias, &self.weight, g.out_channels)?;
        }
        match g.output([h, w]) {
            Some([oh, ow]) => Ok(vec![g.out_channels, oh, ow]),
            None => Err(format!(
                "a {h}x{w} input is smaller than its {}x{} kernel",
                g.kernel[0], g.kernel[1]
            )),
        }
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes(self.name(), inputs, 0, Axes::Maps)?;
        Ok(Axes::Maps)
    }

    /// Direct grouped convolution with zero padding, NCHW. Each output sums its taps in the
    /// order (input channel, ky, kx), padding skipped, then adds the bias: the loops run over
    /// the taps outside and the output positions inside (one weight against a row of inputs)
    /// and give every output that same sequence of additions, so the same bits as a loop per
    /// output, without per-output tap bookkeeping.
    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let g = &self.geometry;
        let w = dequantized(&self.weight, &g.weight_shape())?;
        let b = bias_values(node, &self.bias, &self.weight)?;
        let (x, n) = (node.inputs[0], node.samples);
        let (c, h, wd) = (node.shapes[0][0], node.shapes[0][1], node.shapes[0][2]);
        let out_shape = node.output_shape;
        let (o, oh, ow) = (out_shape[0], out_shape[1], out_shape[2]);
        let ([kh, kw], [sh, sw], [ph, pw]) = (g.kernel, g.stride, g.padding);
        let cg = g.group_in_channels();
        let og = o / g.groups.max(1);
        let mut y = vec![0f32; n * o * oh * ow];
        // No samples or an empty output: nothing to sum (and no chunks of zero to cut).
        if y.is_empty() {
            return Ok(y);
        }
        for (xs, ys) in x.chunks(c * h * wd).zip(y.chunks_mut(o * oh * ow)) {
            for (oc, plane) in ys.chunks_mut(oh * ow).enumerate() {
                let group = oc / og;
                let wk = &w[oc * cg * kh * kw..(oc + 1) * cg * kh * kw];
                for ci in 0..cg {
                    let ch = group * cg + ci;
                    let input = &xs[ch * h * wd..(ch + 1) * h * wd];
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let weight = wk[(ci * kh + ky) * kw + kx];
                            let columns = tap_outputs(kx, sw, pw, wd, ow);
                            for oy in tap_outputs(ky, sh, ph, h, oh) {
                                let iy = oy * sh + ky - ph;
                                let row = &input[iy * wd..(iy + 1) * wd];
                                let out = &mut plane[oy * ow..(oy + 1) * ow];
                                for ox in columns.clone() {
                                    out[ox] += row[ox * sw + kx - pw] * weight;
                                }
                            }
                        }
                    }
                }
                for v in plane {
                    *v += b[oc];
                }
            }
        }
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let (name, geometry) = (node.name, &self.geometry);
        let Rep::Codes(g) = node.rep(0).clone() else {
            return Err(unsupported(name, "its input is not quantized"));
        };
        let Layout::Maps { c, h, w } = node.layout(0) else {
            return Err(unsupported(name, "its input is not feature maps"));
        };
        let (o, oh, ow) = match node.output_shape() {
            [o, oh, ow] => (*o, *oh, *ow),
            _ => return Err(unsupported(name, "its output is not feature maps")),
        };
        let (codes, zeros, scales) = weight_codes(name, &self.weight)?;
        let bias = accumulator_bias(name, &self.bias)?;
        let ([kh, kw], groups) = (geometry.kernel, geometry.groups);
        let (cg, og) = (c / groups, o / groups);
        let fan_in = cg * kh * kw;
        // OIHW → per group, rows (ky, kx, c) of each output channel.
        let mut centered = vec![0i32; o * fan_in];
        for oc in 0..o {
            let z = zeros[if zeros.len() == 1 { 0 } else { oc }];
            for ci in 0..cg {
                for ky in 0..kh {
                    for kx in 0..kw {
                        centered[oc * fan_in + (ky * kw + kx) * cg + ci] =
                            codes[((oc * cg + ci) * kh + ky) * kw + kx] - z;
                    }
                }
            }
        }
        let bound = accumulator_bound(name, &centered, fan_in, &bias, reach(&g))?;
        let positions = oh * ow;
        let patches = positions.saturating_mul(fan_in);
        if patches > MAX_SAMPLE_ELEMENTS {
            return Err(unsupported(
                name,
                format!("one sample's patches would hold more than {MAX_SAMPLE_ELEMENTS} values"),
            ));
        }
        node.patches = patches;
        node.cost = (positions as u64) * (fan_in as u64) * (o as u64);
        let mut packed = Vec::with_capacity(groups);
        let mut biases = Vec::with_capacity(groups);
        let depthwise = if groups > 1 && cg == 1 && og == 1 {
            // One channel in and out per group: the rows are the filters, `[c][ky][kx]`.
            Some(DepthwiseFilter::new(&centered, &bias, o, [kh, kw])?)
        } else {
            None
        };
        for gi in (0..groups).filter(|_| depthwise.is_none()) {
            let rows = &centered[gi * og * fan_in..(gi + 1) * og * fan_in];
            packed.push(if groups == 1 {
                // The convolution reads its windows in place (`conv_u8`).
                PackedMatrix::for_windows(rows, og, [kh, kw, cg], Isa::detected())?
            } else {
                PackedMatrix::new(rows, og, fan_in)?
            });
            biases.push(bias[gi * og..(gi + 1) * og].to_vec());
        }
        node.step.weighted = Some(Weighted {
            groups: packed,
            depthwise,
            biases,
            input_zero: g.zero,
            fan_in,
            out: o,
            conv: Some(Conv {
                geometry: *geometry,
                input: (h, w, c),
                output: (oh, ow),
            }),
        });
        Ok((
            Rep::Acc {
                scales: scales.iter().map(|s| g.scale * s).collect(),
                bound,
            },
            Layout::Maps { c: o, h: oh, w: ow },
        ))
    }

    /// `Conv` with its groups, strides and zero padding.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let (n, g) = (node.node, &self.geometry);
        let weight = w.weight(n, &self.weight, &g.weight_shape(), false)?;
        let b = w.bias(n, &self.bias, &self.weight, g.out_channels)?;
        let attrs = vec![
            int_attr("group", g.groups as i64),
            ints_attr("kernel_shape", &g.kernel),
            ints_attr("strides", &g.stride),
            // ONNX: [top, left, bottom, right].
            ints_attr(
                "pads",
                &[g.padding[0], g.padding[1], g.padding[0], g.padding[1]],
            ),
            ints_attr("dilations", &[1, 1]),
        ];
        let x = node.inputs[0].clone();
        w.op("Conv", &n.name, &[x, weight, b], node.out.clone(), attrs);
        Ok(())
    }

    weighted_layer_rules!();
}

/// The outputs (of `outputs` along one axis) that tap `t` of a kernel reaches inside the input
/// (`len` along that axis): those `o` with `0 <= o·stride + t - padding < len`.
fn tap_outputs(
    t: usize,
    stride: usize,
    padding: usize,
    len: usize,
    outputs: usize,
) -> std::ops::Range<usize> {
    let stride = stride.max(1);
    let first = padding.saturating_sub(t).div_ceil(stride);
    let end = match (len + padding).checked_sub(t + 1) {
        Some(last_input) => (last_input / stride + 1).min(outputs),
        None => 0,
    };
    first..end.max(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: one sum per output, its taps in (channel, ky, kx) order, then the bias.
    fn per_output(x: &[f32], w: &[f32], b: &[f32], g: &Conv2dGeometry, hw: [usize; 2]) -> Vec<f32> {
        let (c, [h, wd]) = (g.in_channels, hw);
        let [oh, ow] = g.output(hw).unwrap();
        let (o, cg) = (g.out_channels, g.group_in_channels());
        let og = o / g.groups;
        let ([kh, kw], [sh, sw], [ph, pw]) = (g.kernel, g.stride, g.padding);
        let inside = |o: usize, t: usize, s: usize, p: usize, len: usize| {
            let i = (o * s + t) as isize - p as isize;
            (i >= 0 && (i as usize) < len).then_some(i as usize)
        };
        let mut y = Vec::new();
        for xs in x.chunks(c * h * wd) {
            for oc in 0..o {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = 0f32;
                        for ci in 0..cg {
                            let ch = oc / og * cg + ci;
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let (Some(iy), Some(ix)) =
                                        (inside(oy, ky, sh, ph, h), inside(ox, kx, sw, pw, wd))
                                    else {
                                        continue;
                                    };
                                    acc += xs[(ch * h + iy) * wd + ix]
                                        * w[((oc * cg + ci) * kh + ky) * kw + kx];
                                }
                            }
                        }
                        y.push(acc + b[oc]);
                    }
                }
            }
        }
        y
    }

    /// Strides, paddings wider than the kernel's reach, grouped and depthwise channels, kernels
    /// larger than the input: the evaluation gives the per-output sums' bits.
    #[test]
    fn evaluation_gives_the_per_output_sums_bits() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut value = || {
            let (v, pick) = super::super::next_test_value(&mut state);
            // Mixed magnitudes, so that the order of the additions shows in the bits.
            v * [1.0, 1e-3, 37.0][pick % 3]
        };
        let cases = [
            // (in, out, groups, kernel, stride, padding, [h, w])
            (3, 4, 1, [3, 3], [1, 1], [1, 1], [5, 6]),
            (4, 6, 2, [3, 2], [2, 1], [0, 1], [7, 5]),
            (4, 4, 4, [3, 3], [2, 2], [1, 1], [6, 6]),
            (2, 3, 1, [5, 5], [3, 2], [3, 2], [4, 3]),
            (1, 2, 1, [1, 1], [2, 3], [0, 0], [5, 7]),
            (2, 2, 1, [3, 3], [1, 1], [4, 4], [2, 2]),
        ];
        for (i, o, groups, kernel, stride, padding, hw) in cases {
            let g = Conv2dGeometry {
                in_channels: i,
                out_channels: o,
                kernel,
                stride,
                padding,
                groups,
            };
            let w: Vec<f32> = (0..g.weight_shape().iter().product())
                .map(|_| value())
                .collect();
            let b: Vec<f32> = (0..o).map(|_| value()).collect();
            let samples = 3;
            let x: Vec<f32> = (0..samples * i * hw[0] * hw[1]).map(|_| value()).collect();
            let conv = Conv2d {
                geometry: g,
                weight: Parameter::float("w", w.clone()),
                bias: Parameter::float("b", b.clone()),
            };
            let [oh, ow] = g.output(hw).unwrap();
            let got = conv
                .evaluate(&EvalNode {
                    name: "conv",
                    inputs: vec![&x],
                    shapes: vec![&[i, hw[0], hw[1]]],
                    output_shape: &[o, oh, ow],
                    samples,
                    input_quantizer: None,
                })
                .unwrap();
            let want = per_output(&x, &w, &b, &g, hw);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{g:?} on {hw:?}");
        }
    }
}

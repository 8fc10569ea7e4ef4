//! The ops of the graph IR, their shapes and the checks of their parameters.

use serde::{Deserialize, Serialize};

use super::params::{check_parameter, check_quantizer};
use super::{checked_numel, ExportedQuantizer, Parameter, MAX_ELEMENTS};

/// Geometry of a 2-D convolution with zero padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conv2dGeometry {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel size (square).
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
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

    /// The weight's shape, `[out_channels, in_channels / groups, kernel, kernel]`.
    pub fn weight_shape(&self) -> [usize; 4] {
        [
            self.out_channels,
            self.group_in_channels(),
            self.kernel,
            self.kernel,
        ]
    }

    /// Inputs per output value: `in_channels / groups · kernel²`.
    pub fn fan_in(&self) -> usize {
        self.group_in_channels() * self.kernel * self.kernel
    }
}

/// Geometry of a pooling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolGeometry {
    /// Window size (square).
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Padding on each side (never selected by max pooling; counted as zeros by average
    /// pooling, as dfdx's and ONNX's `count_include_pad = 1`).
    pub padding: usize,
}

/// What a node computes. Shapes are per sample; see the module docs of [`crate::graph`].
// Ops hold their parameters inline: a graph holds a handful of them.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum Op {
    /// Quantizes its input onto the quantizer's grid and back (a QDQ pair): in the integer
    /// runtime its output is integer codes. Per tensor. (Files written before it had this name
    /// call it `Quantize`; they still load.)
    #[serde(alias = "Quantize")]
    QuantizeDequantize {
        /// The quantizer.
        quantizer: ExportedQuantizer,
    },
    /// `y = x·Wᵀ + b` over the last axis: weight `[out_features, in_features]`, bias
    /// `[out_features]`.
    Linear {
        /// Input features (the input's last axis).
        in_features: usize,
        /// Output features.
        out_features: usize,
        /// Weight, float or codes.
        weight: Parameter,
        /// Bias, float or accumulator values.
        bias: Parameter,
    },
    /// 2-D convolution of `[channels, height, width]` maps with zero padding.
    Conv2d {
        /// Geometry.
        geometry: Conv2dGeometry,
        /// Weight `[out, in / groups, kernel, kernel]`, float or codes.
        weight: Parameter,
        /// Bias `[out]`, float or accumulator values.
        bias: Parameter,
    },
    /// Per-channel affine map `y = x·scale[c] + shift[c]` (a BatchNorm in inference mode), on
    /// the channel axis (the first; the only one for features).
    ChannelAffine {
        /// One factor per channel.
        scale: Parameter,
        /// One offset per channel.
        shift: Parameter,
    },
    /// `max(x, 0)`.
    Relu,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// Max pooling of `[channels, height, width]` maps.
    MaxPool2d(PoolGeometry),
    /// Average pooling of `[channels, height, width]` maps (padding counts as zeros).
    AvgPool2d(PoolGeometry),
    /// Row-major flattening to `[features]`.
    Flatten,
    /// The elementwise sum of two values of one shape (a residual connection).
    Add,
    /// The mean of each channel of `[channels, height, width]` maps, giving `[channels]`.
    GlobalAvgPool,
    /// The maximum of each channel of `[channels, height, width]` maps, giving `[channels]`.
    GlobalMaxPool,
    /// Layer normalisation over the last axis: `(x − mean) / √(var + epsilon) · scale + shift`
    /// (the biased variance, as dfdx and PyTorch compute it).
    LayerNorm {
        /// One factor per feature of the last axis.
        scale: Parameter,
        /// One offset per feature of the last axis.
        shift: Parameter,
        /// Added to the variance.
        epsilon: f64,
    },
    /// GELU, `x · Φ(x)` with the normal CDF `Φ` (dfdx's `AccurateGeLU`).
    Gelu,
    /// Softmax over the last axis.
    Softmax,
    /// `[channels, height, width]` maps as `[height · width, channels]` tokens (token
    /// `y · width + x` holds the channels at `(y, x)`), plus a learned position embedding
    /// `[tokens, channels]`: a vision transformer's patch tokens.
    ImageTokens {
        /// One vector per token.
        position: Parameter,
    },
    /// The mean of `[tokens, features]` over the tokens, giving `[features]`.
    MeanTokens,
    /// Attention scores of `heads` heads: inputs `Q [s1, heads · d]` and `K [s2, heads · d]`,
    /// output `[heads, s1, s2]` with `scores[h][i][j] = Σₑ Q[i][h·d + e] · K[j][h·d + e] / √d`.
    AttentionScores {
        /// Heads; they split the features of `Q` and `K` into equal parts.
        heads: usize,
    },
    /// Attention's weighted sum of values: inputs `P [heads, s1, s2]` (the softmax of the
    /// scores) and `V [s2, heads · d]`, output `[s1, heads · d]` with
    /// `out[i][h·d + e] = Σⱼ P[h][i][j] · V[j][h·d + e]` (the heads side by side).
    AttentionContext {
        /// Heads; they split the features of `V` into equal parts.
        heads: usize,
    },
}

/// Output positions along one axis, `None` when the window does not fit (or sizes overflow).
pub fn out_len(len: usize, kernel: usize, stride: usize, padding: usize) -> Option<usize> {
    len.checked_add(padding.checked_mul(2)?)?
        .checked_sub(kernel)
        .and_then(|d| d.checked_div(stride))
        .map(|d| d + 1)
}

/// The taps of a window that land inside the input along one axis: for output position `o` of
/// a `kernel`-tap window with `stride` and zero `padding` over `len` inputs, each tap `t` whose
/// input `o * stride + t - padding` lies in `0..len`, as `(t, input)` in tap order (the
/// reference loops of the interpreters, which skip padding).
pub(crate) fn taps(
    o: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    len: usize,
) -> impl Iterator<Item = (usize, usize)> {
    (0..kernel).filter_map(move |t| {
        let i = (o * stride + t) as isize - padding as isize;
        (i >= 0 && (i as usize) < len).then_some((t, i as usize))
    })
}

fn maps(inputs: &[&[usize]], what: &str) -> Result<(usize, usize, usize), String> {
    match inputs {
        [[c, h, w]] => Ok((*c, *h, *w)),
        [other] => Err(format!(
            "{what} needs [channels, height, width] maps; it receives {other:?}"
        )),
        _ => Err(format!("{what} takes one input; it has {}", inputs.len())),
    }
}

/// Two `[tokens, features]` inputs.
fn token_pair(inputs: &[&[usize]], what: &str) -> Result<([usize; 2], [usize; 2]), String> {
    match inputs {
        [[a, b], [c, d]] => Ok(([*a, *b], [*c, *d])),
        _ => Err(format!(
            "{what} takes two [tokens, features] inputs; it receives {inputs:?}"
        )),
    }
}

/// At least one head, dividing each of `features`.
fn check_heads(heads: usize, features: &[(&str, usize)]) -> Result<(), String> {
    for (what, f) in features {
        if heads == 0 || f % heads != 0 {
            return Err(format!(
                "{heads} heads must be at least 1 and divide the {f} features of the {what}"
            ));
        }
    }
    Ok(())
}

fn single<'a>(inputs: &[&'a [usize]], what: &str) -> Result<&'a [usize], String> {
    match inputs {
        [x] => Ok(x),
        _ => Err(format!("{what} takes one input; it has {}", inputs.len())),
    }
}

impl Op {
    /// The op's name, as the metadata writes it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::QuantizeDequantize { .. } => "QuantizeDequantize",
            Op::Linear { .. } => "Linear",
            Op::Conv2d { .. } => "Conv2d",
            Op::ChannelAffine { .. } => "ChannelAffine",
            Op::Relu => "Relu",
            Op::Tanh => "Tanh",
            Op::Sigmoid => "Sigmoid",
            Op::MaxPool2d(_) => "MaxPool2d",
            Op::AvgPool2d(_) => "AvgPool2d",
            Op::Flatten => "Flatten",
            Op::Add => "Add",
            Op::GlobalAvgPool => "GlobalAvgPool",
            Op::GlobalMaxPool => "GlobalMaxPool",
            Op::LayerNorm { .. } => "LayerNorm",
            Op::Gelu => "Gelu",
            Op::Softmax => "Softmax",
            Op::ImageTokens { .. } => "ImageTokens",
            Op::MeanTokens => "MeanTokens",
            Op::AttentionScores { .. } => "AttentionScores",
            Op::AttentionContext { .. } => "AttentionContext",
        }
    }

    /// The op's parameters with their shapes (weight, then bias; scale, then shift), for a node
    /// whose output has the per-sample shape `output` (a position embedding has its shape).
    pub fn parameters(&self, output: &[usize]) -> Vec<(&Parameter, Vec<usize>)> {
        match (self, self.weight_and_bias_shapes()) {
            (Op::Linear { weight, bias, .. } | Op::Conv2d { weight, bias, .. }, Some([w, b])) => {
                vec![(weight, w), (bias, b)]
            }
            (Op::ChannelAffine { scale, shift } | Op::LayerNorm { scale, shift, .. }, _) => {
                let c = scale.values.len();
                vec![(scale, vec![c]), (shift, vec![c])]
            }
            (Op::ImageTokens { position }, _) => vec![(position, output.to_vec())],
            _ => Vec::new(),
        }
    }

    /// The op's parameters, mutably, with the shapes its geometry or its output shape `output`
    /// gives them (`None` for a per-channel parameter whose length only the input fixes).
    pub fn parameters_mut(
        &mut self,
        output: &[usize],
    ) -> Vec<(&mut Parameter, Option<Vec<usize>>)> {
        let shapes = self.weight_and_bias_shapes();
        match (self, shapes) {
            (Op::Linear { weight, bias, .. } | Op::Conv2d { weight, bias, .. }, Some([w, b])) => {
                vec![(weight, Some(w)), (bias, Some(b))]
            }
            (Op::ChannelAffine { scale, shift } | Op::LayerNorm { scale, shift, .. }, _) => {
                vec![(scale, None), (shift, None)]
            }
            (Op::ImageTokens { position }, _) => vec![(position, Some(output.to_vec()))],
            _ => Vec::new(),
        }
    }

    /// The shapes of a weighted op's weight and bias, as its geometry fixes them.
    fn weight_and_bias_shapes(&self) -> Option<[Vec<usize>; 2]> {
        match self {
            Op::Linear {
                in_features,
                out_features,
                ..
            } => Some([vec![*out_features, *in_features], vec![*out_features]]),
            Op::Conv2d { geometry, .. } => Some([
                geometry.weight_shape().to_vec(),
                vec![geometry.out_channels],
            ]),
            _ => None,
        }
    }

    /// Whether the op multiplies by weights.
    pub fn has_weights(&self) -> bool {
        matches!(self, Op::Linear { .. } | Op::Conv2d { .. })
    }

    /// Whether it is a layer whose output a report measures: one with weights, an add, an
    /// attention matrix product, a LayerNorm or a GELU (the nodes named like their layers).
    pub fn is_measured_layer(&self) -> bool {
        self.has_weights()
            || matches!(
                self,
                Op::Add
                    | Op::AttentionScores { .. }
                    | Op::AttentionContext { .. }
                    | Op::LayerNorm { .. }
                    | Op::Gelu
            )
    }

    /// The bias of an op with weights, if it is held at the accumulator's scale (which needs a
    /// quantized input and quantized weights).
    pub(crate) fn accumulator_bias(&self) -> bool {
        match self {
            Op::Linear { bias, .. } | Op::Conv2d { bias, .. } => {
                matches!(bias.values, super::ParamValues::Accumulator(_))
            }
            _ => false,
        }
    }

    /// The output shape for inputs of `inputs` shapes, after checking the op's geometry and
    /// parameters against them.
    ///
    /// # Errors
    /// What does not fit, as text.
    pub fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>, String> {
        self.shape(inputs, true)
    }

    /// [`Op::output_shape`], checking the geometry only when `values` is false (parameters
    /// not loaded yet).
    pub(crate) fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String> {
        match self {
            Op::QuantizeDequantize { quantizer } => {
                check_quantizer(quantizer, "the quantizer", None)?;
                Ok(single(inputs, "QuantizeDequantize")?.to_vec())
            }
            Op::Relu | Op::Tanh | Op::Sigmoid | Op::Gelu | Op::Softmax => {
                Ok(single(inputs, self.name())?.to_vec())
            }
            Op::ImageTokens { position } => {
                let (c, h, w) = maps(inputs, "ImageTokens")?;
                let tokens = h * w;
                if values {
                    check_parameter(position, "position", tokens * c, tokens * c, &["float"])?;
                }
                Ok(vec![tokens, c])
            }
            Op::MeanTokens => match inputs {
                [[_, c]] => Ok(vec![*c]),
                [other] => Err(format!(
                    "MeanTokens needs [tokens, features]; it receives {other:?}"
                )),
                _ => Err(format!("MeanTokens takes one input; it has {}", inputs.len())),
            },
            Op::AttentionScores { heads } => {
                let ([s1, fq], [s2, fk]) = token_pair(inputs, "AttentionScores")?;
                check_heads(*heads, &[("queries", fq), ("keys", fk)])?;
                if fq != fk {
                    return Err(format!(
                        "queries have {fq} features and keys {fk}; they must match"
                    ));
                }
                Ok(vec![*heads, s1, s2])
            }
            Op::AttentionContext { heads } => match inputs {
                [[h, s1, s2], [sv, fv]] => {
                    check_heads(*heads, &[("values", *fv)])?;
                    if h != heads || s2 != sv {
                        return Err(format!(
                            "probabilities {:?} do not fit {heads} heads over {sv} values",
                            [h, s1, s2]
                        ));
                    }
                    Ok(vec![*s1, *fv])
                }
                _ => Err(format!(
                    "AttentionContext takes probabilities [heads, s1, s2] and values [s2, features]; it receives {inputs:?}"
                )),
            },
            Op::Flatten => {
                let x = single(inputs, "Flatten")?;
                Ok(vec![checked_numel(x).ok_or("the input is too large")?])
            }
            Op::GlobalAvgPool | Op::GlobalMaxPool => {
                let (c, _, _) = maps(inputs, self.name())?;
                Ok(vec![c])
            }
            Op::LayerNorm {
                scale,
                shift,
                epsilon,
            } => {
                let x = single(inputs, "LayerNorm")?;
                let features = x.last().copied().unwrap_or(0);
                if !(epsilon.is_finite() && *epsilon > 0.0) {
                    return Err(format!("epsilon {epsilon} must be finite and positive"));
                }
                if values {
                    check_parameter(scale, "scale", features, features, &["float"])?;
                    check_parameter(shift, "shift", features, features, &["float"])?;
                }
                Ok(x.to_vec())
            }
            Op::Add => match inputs {
                [a, b] if a == b => Ok(a.to_vec()),
                [a, b] => Err(format!(
                    "adds values of shapes {a:?} and {b:?}; they must match"
                )),
                _ => Err(format!("Add takes two inputs; it has {}", inputs.len())),
            },
            Op::Linear {
                in_features,
                out_features,
                weight,
                bias,
            } => {
                let x = single(inputs, "Linear")?;
                if x.last() != Some(in_features) {
                    return Err(format!(
                        "receives {x:?}; expects {in_features} features on the last axis"
                    ));
                }
                let numel = in_features
                    .checked_mul(*out_features)
                    .filter(|n| *n > 0 && *n <= MAX_ELEMENTS)
                    .ok_or_else(|| {
                        format!(
                            "weight [{out_features}, {in_features}] is empty or holds more than {MAX_ELEMENTS} values"
                        )
                    })?;
                if values {
                    check_parameter(weight, "weight", numel, *out_features, &["float", "codes"])?;
                    check_bias(bias, weight, *out_features)?;
                }
                let mut y = x.to_vec();
                if let Some(last) = y.last_mut() {
                    *last = *out_features;
                }
                Ok(y)
            }
            Op::Conv2d {
                geometry: g,
                weight,
                bias,
            } => {
                let (c, h, w) = maps(inputs, "Conv2d")?;
                if g.groups == 0 || g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0
                {
                    return Err(format!(
                        "{} groups must divide {} input and {} output channels",
                        g.groups, g.in_channels, g.out_channels
                    ));
                }
                if c != g.in_channels {
                    return Err(format!("receives {c} channels; expects {}", g.in_channels));
                }
                if g.kernel == 0
                    || g.stride == 0
                    || g.stride > MAX_ELEMENTS
                    || g.padding >= g.kernel
                {
                    return Err(format!(
                        "kernel {}, stride {}, padding {}: kernel and stride must be at least 1 and the padding smaller than the kernel",
                        g.kernel, g.stride, g.padding
                    ));
                }
                let numel = checked_numel(&g.weight_shape()).ok_or_else(|| {
                    format!(
                        "weight {:?} is empty or holds more than {MAX_ELEMENTS} values",
                        g.weight_shape()
                    )
                })?;
                if values {
                    check_parameter(weight, "weight", numel, g.out_channels, &["float", "codes"])?;
                    check_bias(bias, weight, g.out_channels)?;
                }
                match (
                    out_len(h, g.kernel, g.stride, g.padding),
                    out_len(w, g.kernel, g.stride, g.padding),
                ) {
                    (Some(oh), Some(ow)) if oh > 0 && ow > 0 => Ok(vec![g.out_channels, oh, ow]),
                    _ => Err(format!(
                        "a {h}x{w} input is smaller than its {}x{} kernel",
                        g.kernel, g.kernel
                    )),
                }
            }
            Op::ChannelAffine { scale, shift } => {
                let x = single(inputs, "ChannelAffine")?;
                let channels = x.first().copied().unwrap_or(0);
                if values {
                    check_parameter(scale, "scale", channels, channels, &["float"])?;
                    check_parameter(shift, "shift", channels, channels, &["float"])?;
                }
                Ok(x.to_vec())
            }
            Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
                let (c, h, w) = maps(inputs, self.name())?;
                if p.kernel == 0
                    || p.stride == 0
                    || p.kernel > MAX_ELEMENTS
                    || p.stride > MAX_ELEMENTS
                    || p.padding > p.kernel / 2
                {
                    return Err(format!(
                        "kernel {}, stride {}, padding {}: kernel and stride must be in 1..={MAX_ELEMENTS} and the padding at most half the kernel",
                        p.kernel, p.stride, p.padding
                    ));
                }
                match (
                    out_len(h, p.kernel, p.stride, p.padding),
                    out_len(w, p.kernel, p.stride, p.padding),
                ) {
                    (Some(oh), Some(ow)) if oh > 0 && ow > 0 => Ok(vec![c, oh, ow]),
                    _ => Err(format!(
                        "a {h}x{w} input is smaller than its {}x{} window",
                        p.kernel, p.kernel
                    )),
                }
            }
        }
    }
}

/// A bias of `out` values: float, or accumulator values beside codes.
fn check_bias(bias: &Parameter, weight: &Parameter, out: usize) -> Result<(), String> {
    check_parameter(bias, "bias", out, out, &["float", "accumulator"])?;
    if matches!(bias.values, super::ParamValues::Accumulator(_))
        && !matches!(weight.values, super::ParamValues::Codes { .. })
    {
        return Err(
            "the bias is held at the accumulator's scale, which needs quantized weights".into(),
        );
    }
    Ok(())
}

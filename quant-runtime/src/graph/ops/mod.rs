//! The ops of the graph IR, one file per op or per family of ops (the pools, the activations,
//! the attention products, the token ops): what an op holds (the `Op` variant's data), its
//! shape rule and parameter checks, what its output's axes mean, its float reference, its
//! integer preparation and kernel, and its ONNX form live together, as the methods of one
//! [`OpRules`] impl. [`Op::rules`] (and [`Op::rules_mut`] for the parameters) is the one place
//! that maps a variant to its rules; every interpreter and writer goes through it.

/// The rules a layer with `weight` and `bias` fields (and `weight_and_bias_shapes`) shares:
/// its parameters, its weights, its measured output and the weighted-layer kernel.
macro_rules! weighted_layer_rules {
    () => {
        fn run(
            &self,
            node: &mut crate::integer::run::RunNode<'_>,
        ) -> quant_core::Result<crate::integer::run::Buf> {
            use crate::integer::run::{weighted, Buf};
            match (&node.step.weighted, node.input(0)) {
                (Some(w), Some(Buf::U8(codes))) => Ok(Buf::I32(weighted(w, codes, node.samples)?)),
                _ => Err(node.internal()),
            }
        }

        fn parameters(&self, _output: &[usize]) -> Vec<(&Parameter, Vec<usize>)> {
            let [w, b] = self.weight_and_bias_shapes();
            vec![(&self.weight, w), (&self.bias, b)]
        }

        fn parameters_mut(
            &mut self,
            _output: &[usize],
        ) -> Vec<(&mut Parameter, Option<Vec<usize>>)> {
            let [w, b] = self.weight_and_bias_shapes();
            vec![(&mut self.weight, Some(w)), (&mut self.bias, Some(b))]
        }

        fn weight_and_bias(&self) -> Option<[&Parameter; 2]> {
            Some([&self.weight, &self.bias])
        }

        fn is_measured_layer(&self) -> bool {
            true
        }
    };
}

mod activation;
mod add;
mod attention;
mod channel_affine;
mod conv;
mod flatten;
mod layer_norm;
mod linear;
mod pool;
mod quantize;
mod softmax_gelu;
mod tokens;

pub use attention::{AttentionContext, AttentionScores};
pub use channel_affine::ChannelAffine;
pub use conv::{Conv2d, Conv2dGeometry};
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use pool::{AvgPool2d, MaxPool2d, PoolGeometry};
pub use quantize::QuantizeDequantize;
pub use tokens::ImageTokens;

use serde::{Deserialize, Serialize};

use super::eval::EvalNode;
use super::params::check_parameter;
use super::{Axes, Parameter};
use crate::export::onnx::writer::{OnnxNode, Writer};
use crate::integer::prepare::{PrepareNode, Prepared};
use crate::integer::run::{Buf, RunNode};
use crate::GraphError;

/// What a node computes. Shapes are per sample; see the module docs of [`crate::graph`]. The
/// files hold each variant as `"type": "<variant>"` beside its data's fields.
// Ops hold their parameters inline: a graph holds a handful of them.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum Op {
    /// Quantizes its input onto a grid and back (a QDQ pair): in the integer runtime its output
    /// is integer codes. (Files written before it had this name call it `Quantize`; they still
    /// load.)
    #[serde(alias = "Quantize")]
    QuantizeDequantize(QuantizeDequantize),
    /// `y = x·Wᵀ + b` over the last axis.
    Linear(Linear),
    /// 2-D convolution of `[channels, height, width]` maps with zero padding.
    Conv2d(Conv2d),
    /// Per-channel affine map (a BatchNorm in inference mode).
    ChannelAffine(ChannelAffine),
    /// `max(x, 0)`.
    Relu,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// Max pooling of `[channels, height, width]` maps.
    MaxPool2d(MaxPool2d),
    /// Average pooling of `[channels, height, width]` maps (padding counts as zeros).
    AvgPool2d(AvgPool2d),
    /// Row-major flattening to `[features]`.
    Flatten,
    /// The elementwise sum of two values of one shape (a residual connection).
    Add,
    /// The mean of each channel of `[channels, height, width]` maps, giving `[channels]`.
    GlobalAvgPool,
    /// The maximum of each channel of `[channels, height, width]` maps, giving `[channels]`.
    GlobalMaxPool,
    /// Layer normalisation over the last axis.
    LayerNorm(LayerNorm),
    /// GELU, `x · Φ(x)` with the normal CDF `Φ` (dfdx's `AccurateGeLU`).
    Gelu,
    /// Softmax over the last axis.
    Softmax,
    /// Feature maps as a vision transformer's patch tokens, plus a position embedding.
    ImageTokens(ImageTokens),
    /// The mean of `[tokens, features]` over the tokens, giving `[features]`.
    MeanTokens,
    /// Attention scores of queries and keys, per head.
    AttentionScores(AttentionScores),
    /// Attention's weighted sum of values, per head.
    AttentionContext(AttentionContext),
}

/// Everything one op means, in one impl: adding an op is a file with its data and this impl,
/// its `Op` variant and its arms in [`Op::rules`] and `Op::rules_mut`.
pub(crate) trait OpRules {
    /// The op's name, as files and messages write it.
    fn name(&self) -> &'static str;

    /// The output shape for inputs of `inputs` shapes (per sample), after checking the op's
    /// geometry against them and, when `values`, its parameters' values.
    fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String>;

    /// What the output's axes mean, after checking what its inputs' mean (as many as
    /// [`OpRules::shape`] accepted). By default an op keeps its first input's meaning.
    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        Ok(inputs[0])
    }

    /// The float reference: the op on `f32` values, as the fake-quantized model computes it.
    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>>;

    /// The integer runtime's preparation: how the output is held and what the kernel needs,
    /// or why the op cannot run on integers ([`GraphError::Unsupported`]).
    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError>;

    /// The integer kernel: the output of a batch, from the inputs as the preparation holds
    /// them. An op whose preparation refuses every graph never runs.
    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        Err(node.internal())
    }

    /// The op's ONNX nodes and initializers (or [`GraphError::Unsupported`] naming the node).
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError>;

    /// Its parameters with their shapes, for a node whose output has the shape `output`.
    fn parameters(&self, _output: &[usize]) -> Vec<(&Parameter, Vec<usize>)> {
        Vec::new()
    }

    /// Its parameters, mutably, with the shapes its geometry or `output` gives them (`None`
    /// for a per-channel parameter whose length only the input fixes).
    fn parameters_mut(&mut self, _output: &[usize]) -> Vec<(&mut Parameter, Option<Vec<usize>>)> {
        Vec::new()
    }

    /// A layer that multiplies by weights: its weight and bias.
    fn weight_and_bias(&self) -> Option<[&Parameter; 2]> {
        None
    }

    /// Whether a report measures its output as a layer's (named like its layer).
    fn is_measured_layer(&self) -> bool {
        false
    }
}

impl Op {
    /// The rules of this op (see [`OpRules`]): the one `match` over the ops.
    pub(crate) fn rules(&self) -> &dyn OpRules {
        match self {
            Op::QuantizeDequantize(op) => op,
            Op::Linear(op) => op,
            Op::Conv2d(op) => op,
            Op::ChannelAffine(op) => op,
            Op::Relu => &activation::Activation::Relu,
            Op::Tanh => &activation::Activation::Tanh,
            Op::Sigmoid => &activation::Activation::Sigmoid,
            Op::MaxPool2d(op) => op,
            Op::AvgPool2d(op) => op,
            Op::Flatten => &flatten::Flatten,
            Op::Add => &add::Add,
            Op::GlobalAvgPool => &pool::GlobalPool::Average,
            Op::GlobalMaxPool => &pool::GlobalPool::Max,
            Op::LayerNorm(op) => op,
            Op::Gelu => &softmax_gelu::Gelu,
            Op::Softmax => &softmax_gelu::Softmax,
            Op::ImageTokens(op) => op,
            Op::MeanTokens => &tokens::MeanTokens,
            Op::AttentionScores(op) => op,
            Op::AttentionContext(op) => op,
        }
    }

    /// The rules of an op with data, mutably (`None` for the ops without: their rules change
    /// nothing). Lists every variant, so a new one cannot be missed.
    fn rules_mut(&mut self) -> Option<&mut dyn OpRules> {
        match self {
            Op::QuantizeDequantize(op) => Some(op),
            Op::Linear(op) => Some(op),
            Op::Conv2d(op) => Some(op),
            Op::ChannelAffine(op) => Some(op),
            Op::MaxPool2d(op) => Some(op),
            Op::AvgPool2d(op) => Some(op),
            Op::LayerNorm(op) => Some(op),
            Op::ImageTokens(op) => Some(op),
            Op::AttentionScores(op) => Some(op),
            Op::AttentionContext(op) => Some(op),
            Op::Relu
            | Op::Tanh
            | Op::Sigmoid
            | Op::Flatten
            | Op::Add
            | Op::GlobalAvgPool
            | Op::GlobalMaxPool
            | Op::Gelu
            | Op::Softmax
            | Op::MeanTokens => None,
        }
    }

    /// The op's name, as the metadata writes it.
    pub fn name(&self) -> &'static str {
        self.rules().name()
    }

    /// The op's parameters with their shapes (weight, then bias; scale, then shift), for a node
    /// whose output has the per-sample shape `output` (a position embedding has its shape).
    pub fn parameters(&self, output: &[usize]) -> Vec<(&Parameter, Vec<usize>)> {
        self.rules().parameters(output)
    }

    /// The op's parameters, mutably, with the shapes its geometry or its output shape `output`
    /// gives them (`None` for a per-channel parameter whose length only the input fixes).
    pub fn parameters_mut(
        &mut self,
        output: &[usize],
    ) -> Vec<(&mut Parameter, Option<Vec<usize>>)> {
        match self.rules_mut() {
            Some(rules) => rules.parameters_mut(output),
            None => Vec::new(),
        }
    }

    /// Whether the op multiplies by weights.
    pub fn has_weights(&self) -> bool {
        self.rules().weight_and_bias().is_some()
    }

    /// Whether it is a layer whose output a report measures: one with weights, an add, an
    /// attention matrix product, a LayerNorm or a GELU (the nodes named like their layers).
    pub fn is_measured_layer(&self) -> bool {
        self.rules().is_measured_layer()
    }

    /// The bias of an op with weights, if it is held at the accumulator's scale (which needs a
    /// quantized input and quantized weights).
    pub(crate) fn accumulator_bias(&self) -> bool {
        match self.rules().weight_and_bias() {
            Some([_, bias]) => matches!(bias.values, super::ParamValues::Accumulator(_)),
            None => false,
        }
    }

    /// The output shape for inputs of `inputs` shapes, after checking the op's geometry and
    /// parameters against them.
    ///
    /// # Errors
    /// What does not fit, as text.
    pub fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>, String> {
        self.rules().shape(inputs, true)
    }

    /// What the output's axes mean for inputs whose axes mean `inputs` (their shapes checked by
    /// [`Op::output_shape`] first).
    ///
    /// # Errors
    /// An input whose axes mean something the op does not take, as text.
    pub fn output_axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        if inputs.is_empty() {
            return Err(format!("{} takes an input; it has none", self.name()));
        }
        self.rules().axes(inputs)
    }

    /// [`Op::output_shape`], checking the geometry only when `values` is false (parameters
    /// not loaded yet).
    pub(crate) fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String> {
        self.rules().shape(inputs, values)
    }
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

/// Reproducible values for the ops' tests: advances `state` (xorshift64) and returns a value in
/// `[-0.5, 0.5)` from its top bits, and the state itself to pick with.
#[cfg(test)]
pub(crate) fn next_test_value(state: &mut u64) -> (f32, usize) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (
        (*state >> 40) as f32 / (1u64 << 24) as f32 - 0.5,
        *state as usize,
    )
}

pub(crate) fn maps(inputs: &[&[usize]], what: &str) -> Result<(usize, usize, usize), String> {
    match inputs {
        [[c, h, w]] => Ok((*c, *h, *w)),
        [other] => Err(format!(
            "{what} needs [channels, height, width] maps; it receives {other:?}"
        )),
        _ => Err(format!("{what} takes one input; it has {}", inputs.len())),
    }
}

/// Two `[tokens, features]` inputs.
pub(crate) fn token_pair(
    inputs: &[&[usize]],
    what: &str,
) -> Result<([usize; 2], [usize; 2]), String> {
    match inputs {
        [[a, b], [c, d]] => Ok(([*a, *b], [*c, *d])),
        _ => Err(format!(
            "{what} takes two [tokens, features] inputs; it receives {inputs:?}"
        )),
    }
}

/// At least one head, dividing each of `features`.
pub(crate) fn check_heads(heads: usize, features: &[(&str, usize)]) -> Result<(), String> {
    for (what, f) in features {
        if heads == 0 || f % heads != 0 {
            return Err(format!(
                "{heads} heads must be at least 1 and divide the {f} features of the {what}"
            ));
        }
    }
    Ok(())
}

pub(crate) fn single<'a>(inputs: &[&'a [usize]], what: &str) -> Result<&'a [usize], String> {
    match inputs {
        [x] => Ok(x),
        _ => Err(format!("{what} takes one input; it has {}", inputs.len())),
    }
}

/// A bias of `out` values: float, or accumulator values beside codes.
pub(crate) fn check_bias(bias: &Parameter, weight: &Parameter, out: usize) -> Result<(), String> {
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

/// Sizes along the two spatial axes, `[height, width]`, as files write them: one number for
/// equal sizes (every file written before kernels could be rectangular), a pair otherwise.
pub(crate) mod square_or_pair {
    use serde::de::{Error, SeqAccess, Unexpected, Visitor};
    use serde::{Deserializer, Serialize, Serializer};

    /// Writes `[h, w]`, one number when `h == w`.
    pub fn serialize<S: Serializer>(pair: &[usize; 2], s: S) -> Result<S::Ok, S::Error> {
        if pair[0] == pair[1] {
            pair[0].serialize(s)
        } else {
            pair.serialize(s)
        }
    }

    /// Reads one number (both axes) or a pair `[h, w]`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[usize; 2], D::Error> {
        d.deserialize_any(SizeVisitor)
    }

    /// Names what it found, and what is valid, when the value is neither.
    struct SizeVisitor;

    impl<'de> Visitor<'de> for SizeVisitor {
        type Value = [usize; 2];

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a size (one number for both axes) or [height, width]")
        }

        fn visit_u64<E: Error>(self, v: u64) -> Result<[usize; 2], E> {
            let k =
                usize::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))?;
            Ok([k, k])
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[usize; 2], A::Error> {
            let h = seq
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(0, &self))?;
            let w = seq
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(1, &self))?;
            if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                return Err(A::Error::invalid_length(3, &self));
            }
            Ok([h, w])
        }
    }
}

/// A pair of sizes in messages: one number when both are equal, `HxW` otherwise.
pub(crate) fn pair_text([h, w]: [usize; 2]) -> String {
    if h == w {
        h.to_string()
    } else {
        format!("{h}x{w}")
    }
}

/// The output `[height, width]` of a window over `[h, w]` maps, when it fits.
pub(crate) fn window_output(
    [h, w]: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Option<[usize; 2]> {
    match (
        out_len(h, kernel[0], stride[0], padding[0]),
        out_len(w, kernel[1], stride[1], padding[1]),
    ) {
        (Some(oh), Some(ow)) if oh > 0 && ow > 0 => Some([oh, ow]),
        _ => None,
    }
}

/// An error unless input `k` of `what` has axes meaning `wanted`.
pub(crate) fn expect_axes(
    what: &str,
    inputs: &[Axes],
    k: usize,
    wanted: Axes,
) -> Result<(), String> {
    match inputs.get(k) {
        Some(a) if *a == wanted => Ok(()),
        Some(a) => Err(format!(
            "{what} needs {}; it receives {}",
            wanted.describe(),
            a.describe()
        )),
        None => Err(format!(
            "{what} takes {} inputs; it has {}",
            k + 1,
            inputs.len()
        )),
    }
}

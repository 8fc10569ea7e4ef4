//! Quantized layers: dfdx modules whose weights and inputs pass through quantizers.
//!
//! - [`TensorQuantizer`]: a quantizer chosen at run time (registry, policy file), holding its
//!   parameters as dfdx tensors; `TensorQuantizer<1>` quantizes an activation anywhere.
//! - [`QLinear`]: a Linear layer with a weights quantizer (per channel or per tensor) and an
//!   input quantizer. The quantizers are type parameters: [`TensorQuantizer`] by default, or a
//!   quantizer fixed at compile time that owns its own typed parameters ([`FakeQuantizer`]).
//! - [`QuantInput`]: quantizes the input of any module (pooling, flatten, ...).
//! - [`QMultiHeadAttention`], [`QTransformerEncoderBlock`]: dfdx's attention and encoder
//!   block, with quantized projections and quantizers on the inputs of both attention matrix
//!   products.
//! - [`Float`]: a float module inside a quantized model.
//!
//! Every layer declares its quantizer [`Slot`]s (`weights`, `input`, ...); every quantizer is
//! reachable by its dotted name, `<layer>.<slot>` (`0.weights`, `fc1.input`), through
//! [`QuantizedModule::visit_slots`], to configure it from a policy, change modes (like
//! pytorch-quantization's `disable()` / `enable_calib()`), calibrate and report; and every
//! module lowers itself into the [graph IR](quant_runtime::graph) ([`QuantizedModule::lower`]) for
//! export and integer inference.

mod attention;
mod conv;
#[doc(hidden)]
pub mod derive;
mod embedding;
mod float;
mod input;
mod linear;
mod param;
mod quantizer;
mod residual;

pub use attention::{
    AttentionParams, AttentionQuantizers, QFeedForward, QLinearOn, QMultiHeadAttention,
    QTransformerEncoderBlock,
};
pub use conv::QConv2d;
pub use embedding::QEmbedding;
pub use float::Float;
pub use input::{OnGrid, QuantInput};
pub use linear::{LinearParams, QLinear};
pub use param::{fake_quantize_param, fake_quantize_param_mut, LayerInput};
pub use quantizer::{
    QuantizerControl, QuantizerDescription, QuantizerMode, QuantizerSpec, TensorQuantizer,
};
pub use residual::{
    AddQuantizer, QAddInto, QGeneralizedResidual, QRepeated, QResidual, QSplitInto,
};

use dfdx::prelude::*;
use quant_core::accumulator::{bias_scale, check_bias_scales};
use quant_core::dfdx_ops::DynQuantization;
use quant_core::{QuantError, QuantizationTarget, Result};

use crate::convert::LayerKind;
use crate::lower::QuantizeNodes;
use quant_runtime::graph::{GraphBuilder, ValueId};
use quant_runtime::GraphError;

/// A quantizer usable in a layer's slot. [`TensorQuantizer`] implements it for quantizers
/// chosen at run time; implement it for a quantizer fixed at compile time that owns its
/// parameters as typed tensors (any number, any shape).
pub trait FakeQuantizer: QuantizerControl + Clone + std::fmt::Debug {
    /// Fake-quantizes `x` according to the mode (per-channel quantizers use axis 0).
    fn fake_quantize<S: Shape, T: Tape<f32, Cpu>>(
        &self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>>;
    /// Like `fake_quantize`, but may record statistics (Calibrating mode).
    fn fake_quantize_mut<S: Shape, T: Tape<f32, Cpu>>(
        &mut self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>>;
    /// The op `fake_quantize` runs on a tensor of `shape`, taken apart for a layer's op that
    /// quantizes a tensor it reads (`QLinear` quantizes its weights inside its product with it),
    /// or `None` where `fake_quantize` runs no op or must not be bypassed (Calibrating). The
    /// default is `None`: the layer calls `fake_quantize`.
    ///
    /// # Errors
    /// As `fake_quantize`.
    fn quantization<S: Shape>(&self, _shape: &S) -> Result<Option<DynQuantization>> {
        Ok(None)
    }
}

impl<const C: usize> FakeQuantizer for TensorQuantizer<C> {
    fn fake_quantize<S: Shape, T: Tape<f32, Cpu>>(
        &self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        TensorQuantizer::fake_quantize(self, x)
    }
    fn fake_quantize_mut<S: Shape, T: Tape<f32, Cpu>>(
        &mut self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        TensorQuantizer::fake_quantize_mut(self, x)
    }
    fn quantization<S: Shape>(&self, shape: &S) -> Result<Option<DynQuantization>> {
        TensorQuantizer::quantization(self, shape)
    }
}

/// The bias a quantized layer adds: while both its input and its weights quantize, the bias
/// as integer deployment holds it (int32 at scale `s_input · s_weight`), with a straight-through
/// gradient; otherwise the float bias. Keeping the two equal is what makes the integer model
/// reproduce the fake-quantized one.
///
/// # Errors
/// A quantizer's parameters cannot be read.
pub fn layer_bias<S: ConstShape, T: Tape<f32, Cpu>>(
    bias: &Tensor<S, f32, Cpu>,
    input: &dyn QuantizerControl,
    weights: &dyn QuantizerControl,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let both = input.mode().quantizes() && weights.mode().quantizes();
    let (Some(qi), Some(qw)) = (
        both.then(|| input.qparams()).transpose()?.flatten(),
        both.then(|| weights.qparams()).transpose()?.flatten(),
    ) else {
        return Ok(bias.retaped::<T>());
    };
    let s_in = qi.scales()[0];
    let weight_scales = qw.scales();
    check_bias_scales(bias.shape().num_elements(), weight_scales)?;
    // One pass: each bias to its int32 code (as `quantize_bias`, but saturating at the int32
    // range: a step size that is tiny for a while must not stop QAT; export reports an
    // overflow that remains) and back (as `accumulator_to_float`); the gradient passes
    // straight through.
    quant_core::dfdx_ops::elementwise_op(
        bias.retaped::<T>(),
        |b, y| {
            for (o, (y, b)) in y.iter_mut().zip(b).enumerate() {
                let s = bias_scale(s_in, weight_scales, o);
                let code = (*b as f64 / s)
                    .round_ties_even()
                    .clamp(i32::MIN as f64, i32::MAX as f64) as i32;
                *y = (code as f64 * s) as f32;
            }
            Ok(())
        },
        |(), _, dy, dx| {
            for (g, d) in dx.iter_mut().zip(dy) {
                *g += d;
            }
        },
        |(), _| Ok(()),
    )
}

/// A quantizer slot a layer declares: what it quantizes, under which name. The name is the
/// last part of the quantizer's dotted name (`fc1.weights`) and the slot's key in policy
/// files (`weights = { bits = 8 }`, or `slots.weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The slot's name.
    pub name: &'static str,
    /// What it quantizes: weights (settings from `[weights]`) or an activation (from `[input]`).
    pub target: QuantizationTarget,
    /// Whether the quantized tensor has output channels along axis 0, so per-channel settings
    /// apply; otherwise it quantizes per tensor whatever the settings say.
    pub per_channel: bool,
    /// An optional slot stays float unless a table names it (`slots.<name>`): the policy's
    /// defaults and the `weights` / `input` groups leave it alone.
    pub optional: bool,
}

impl Slot {
    /// The weights of a Linear or Conv2d layer, per output channel or per tensor.
    pub const WEIGHTS: Slot = Slot {
        name: "weights",
        target: QuantizationTarget::Weights,
        per_channel: true,
        optional: false,
    };
    /// A layer's input activation, per tensor (both inputs of an add, on one grid).
    pub const INPUT: Slot = Slot {
        name: "input",
        target: QuantizationTarget::Activation,
        per_channel: false,
        optional: false,
    };
    /// A layer's output activation, per tensor: optional (the next layer's input quantizer
    /// usually quantizes it).
    pub const OUTPUT: Slot = Slot {
        name: "output",
        target: QuantizationTarget::Activation,
        per_channel: false,
        optional: true,
    };
    /// The queries `Q`, left input of attention's `Q·Kᵀ`, per tensor.
    pub const QUERY: Slot = Slot::activation("query");
    /// The keys `K`, right input of attention's `Q·Kᵀ`, per tensor.
    pub const KEY: Slot = Slot::activation("key");
    /// The attention probabilities (the softmax output), left input of `probs·V`, per tensor.
    pub const PROBS: Slot = Slot::activation("probs");
    /// The values `V`, right input of attention's `probs·V`, per tensor.
    pub const VALUE: Slot = Slot::activation("value");

    /// A per-tensor activation slot the policy's defaults quantize.
    const fn activation(name: &'static str) -> Slot {
        Slot {
            name,
            target: QuantizationTarget::Activation,
            per_channel: false,
            optional: false,
        }
    }
}

/// One quantizer slot of a model, as [`QuantizedModule::visit_slots`] visits it.
pub struct SlotRef<'a> {
    /// The dotted name of the layer holding it.
    pub layer: &'a str,
    /// The layer's kind.
    pub kind: LayerKind,
    /// The slot.
    pub slot: Slot,
    /// Its quantizer.
    pub quantizer: &'a mut dyn QuantizerControl,
}

impl SlotRef<'_> {
    /// The quantizer's dotted name, `<layer>.<slot>`.
    pub fn name(&self) -> String {
        join_name(self.layer, self.slot.name)
    }
}

/// The callback [`QuantizedModule::visit_slots`] calls with each slot. Its own lifetime
/// `'f` is free, so an implementation written with this alias accepts every callback the
/// trait's spelled-out signature does.
pub type SlotVisitor<'f> = dyn FnMut(SlotRef<'_>) -> Result<()> + 'f;

/// Calls `f` with each of `slots` (a slot and its quantizer) as a slot of `layer`, of kind
/// `kind`, in order: what a layer's [`QuantizedModule::visit_slots`] does with its own
/// quantizers.
///
/// # Errors
/// The first error of `f`.
pub(crate) fn visit_layer_slots<const N: usize>(
    layer: &str,
    kind: LayerKind,
    slots: [(Slot, &mut dyn QuantizerControl); N],
    f: &mut SlotVisitor<'_>,
) -> Result<()> {
    for (slot, quantizer) in slots {
        f(SlotRef {
            layer,
            kind,
            slot,
            quantizer,
        })?;
    }
    Ok(())
}

/// A quantized model or layer, walked once for everything that needs its structure: its
/// quantizer slots by dotted name (configuration by a policy, modes, calibration, reports) and
/// its graph form (export, integer inference, reports).
///
/// Tuples, the built-in layers and `#[derive(QuantizedModel)]` structs implement it; a layer
/// of your own implements it by listing its slots and lowering itself into graph ops.
pub trait QuantizedModule {
    /// Calls `f` with each quantizer slot of this module (named `name`, the dotted path from
    /// the model's root) and of its children, in model order.
    ///
    /// # Errors
    /// The first error of `f`.
    fn visit_slots(
        &mut self,
        name: &str,
        f: &mut dyn FnMut(SlotRef<'_>) -> Result<()>,
    ) -> Result<()>;

    /// Adds this module's graph form to `g`, reading `x`, with nodes named under `name`;
    /// returns the module's output.
    ///
    /// # Errors
    /// A part with no graph form, a quantizer still calibrating, a shape that does not fit.
    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError>;

    /// [`lower`](Self::lower) for modules that take or give several values (a tuple: dfdx's
    /// `SplitInto` gives one per branch, `AddInto` takes one per branch). By default one value
    /// in, one out.
    ///
    /// # Errors
    /// As [`lower`](Self::lower); a number of values the module does not take.
    fn lower_values(
        &self,
        name: &str,
        g: &mut GraphBuilder,
        xs: &[ValueId],
    ) -> Result<Vec<ValueId>, GraphError> {
        match xs {
            [x] => Ok(vec![self.lower(name, g, *x)?]),
            _ => Err(GraphError::Unsupported {
                layer: name.to_string(),
                reason: format!("takes one value; it receives {} (a tuple)", xs.len()),
            }),
        }
    }
}

/// Lowers a layer with weights: its input quantizer (a quantize node named `<name>.input`), its
/// weight (codes while the weights quantizer quantizes) and its bias (int32 at the
/// accumulator's scale while both quantize, as the forward pass adds it), then `op(weight,
/// bias)` as node `name`.
pub fn lower_weighted(
    name: &str,
    g: &mut GraphBuilder,
    x: ValueId,
    (input, weights): (&dyn QuantizerControl, &dyn QuantizerControl),
    (weight, weight_shape): (&[f32], &[usize]),
    bias: &[f32],
    op: impl FnOnce(
        quant_runtime::graph::Parameter,
        quant_runtime::graph::Parameter,
    ) -> quant_runtime::graph::Op,
) -> Result<ValueId, GraphError> {
    let xq = g.quantize(&join_name(name, Slot::INPUT.name), input, x)?;
    let input_quantizer = match g.producer(xq) {
        Some(quant_runtime::graph::Op::QuantizeDequantize(
            quant_runtime::graph::QuantizeDequantize { quantizer },
        )) if xq != x => Some(quantizer.clone()),
        _ => None,
    };
    let weight = crate::lower::weight_parameter(
        &join_name(name, "weight"),
        weight,
        weight_shape,
        &join_name(name, Slot::WEIGHTS.name),
        weights,
    )?;
    let bias = quant_runtime::graph::bias_parameter(
        &join_name(name, "bias"),
        bias,
        input_quantizer.as_ref(),
        &weight,
        name,
    )?;
    g.add(name, op(weight, bias), &[xq])
}

/// PyTorch's default initialisation of a layer's weight and bias, as dfdx's `Linear` computes
/// it (in `E`): uniform in `±1/sqrt(fan_in)`.
pub(crate) fn fan_in_uniform<E>(fan_in: usize) -> rand_distr::Uniform<E>
where
    E: dfdx::prelude::Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
{
    let bound: E = E::ONE / E::from_usize(fan_in).unwrap_or(E::ONE).sqrt();
    rand_distr::Uniform::new(-bound, bound)
}

/// `prefix.name`, or `name` at the root.
pub fn join_name(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

macro_rules! tuple_quantized_module {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: QuantizedModule),+> QuantizedModule for ($($name,)+) {
            fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
                $(self.$idx.visit_slots(&join_name(name, stringify!($idx)), f)?;)+
                Ok(())
            }
            fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
                match self.lower_values(name, g, &[x])?.as_slice() {
                    [y] => Ok(*y),
                    ys => Err(GraphError::Unsupported {
                        layer: name.to_string(),
                        reason: format!("gives {} values (a tuple) where one is expected", ys.len()),
                    }),
                }
            }
            fn lower_values(&self, name: &str, g: &mut GraphBuilder, xs: &[ValueId]) -> Result<Vec<ValueId>, GraphError> {
                let xs = xs.to_vec();
                $(let xs = self.$idx.lower_values(&join_name(name, stringify!($idx)), g, &xs)?;)+
                Ok(xs)
            }
        }
    };
}
for_each_tuple!(tuple_quantized_module);

/// Model-wide operations on quantizers selected by name pattern.
pub trait QuantizedModuleExt: QuantizedModule {
    /// Sets the mode of every quantizer whose dotted name matches `pattern` (a glob: `*` any
    /// run of characters, `?` one; `"*"` selects all, `"fc1.*"` one layer's). Returns how many
    /// matched.
    ///
    /// # Errors
    /// An invalid pattern; a quantizer that cannot enter `mode` (the error names it).
    fn set_mode(&mut self, pattern: &str, mode: QuantizerMode) -> Result<usize> {
        let matcher = glob(pattern)?;
        let mut n = 0;
        self.visit_slots("", &mut |s| {
            if s.quantizer.describe().is_some() && matcher.is_match(&s.name()) {
                s.quantizer.set_mode(mode)?;
                n += 1;
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// Finishes calibration of every configured quantizer that is calibrating.
    fn finish_calibration(&mut self) -> Result<usize> {
        let mut n = 0;
        self.visit_slots("", &mut |s| {
            if s.quantizer.mode() == QuantizerMode::Calibrating {
                s.quantizer.finish_calibration()?;
                n += 1;
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// Names and descriptions of every configured quantizer, in model order.
    fn quantizers(&mut self) -> Result<Vec<(String, QuantizerDescription)>> {
        let mut out = Vec::new();
        self.visit_slots("", &mut |s| {
            if let Some(d) = s.quantizer.describe() {
                out.push((s.name(), d));
            }
            Ok(())
        })?;
        Ok(out)
    }
}

impl<M: QuantizedModule + ?Sized> QuantizedModuleExt for M {}

/// Longest glob pattern [`glob`] accepts, in bytes. Dotted layer names are far shorter, and
/// a bound on the pattern bounds the time of every match against it.
pub const MAX_PATTERN_BYTES: usize = 512;

/// A glob over dotted quantizer names, checked by [`glob`]: `*` any run of characters, `?`
/// one, `[a-z]` / `[!0-9]` a character in (or not in) a set, `{a,b}` either pattern, `\`
/// escapes the next character, and a leading `!` matches every name the rest does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamePattern(String);

impl NamePattern {
    /// Whether `name` matches the whole pattern.
    pub fn is_match(&self, name: &str) -> bool {
        fast_glob::glob_match(&self.0, name)
    }
}

/// A glob over dotted quantizer names, at most [`MAX_PATTERN_BYTES`] long.
///
/// # Errors
/// [`QuantError::InvalidValue`] (the pattern cut to a readable length) when the pattern is too
/// long or not a valid glob (an unclosed `[` or `{`, a trailing `\`, braces nested deeper than
/// ten or too many brace groups).
pub fn glob(pattern: &str) -> Result<NamePattern> {
    let invalid = |why: String| QuantError::InvalidValue {
        what: "name pattern".into(),
        value: quant_runtime::fs::shorten(pattern).into_owned(),
        expected: format!(
            "a glob over dotted layer names such as `fc1.*` or `*input_quantizer` ({why})"
        ),
    };
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(invalid(format!(
            "at most {MAX_PATTERN_BYTES} bytes; this one has {}",
            pattern.len()
        )));
    }
    fast_glob::validate(pattern)
        .map(|()| NamePattern(pattern.to_string()))
        .map_err(|e| invalid(e.to_string()))
}

//! Converting a float dfdx model into its quantized twin under a policy, layer by layer
//! (QuanTransformer's model transformer, ModelOpt's `quantize`).
//!
//! The twin's type follows from the float model's type: `Linear` becomes [`QLinear`], weight-free
//! layers that a policy may quantize the input of become [`QuantInput`], everything else
//! stays float inside [`Float`]; tuples convert element by element. What each layer's quantizers
//! are is decided at run time by a [`LayerPolicy`], from the layer's dotted name (dfdx's own
//! names for tuples: `0`, `2.1`, ...; field names for derived models) and kind. A layer the
//! policy leaves float keeps unconfigured quantizers and computes exactly the float result.
//! Float weights are copied, never re-initialised.

use std::fmt;

use dfdx::nn::modules::{
    AccurateGeLU, BatchNorm1D, BatchNorm2D, Dropout, DropoutOneIn, FastGeLU, LeakyReLU, Linear,
    ReLU, Sigmoid, Softmax, Tanh,
};
use dfdx::prelude::*;
use serde::{Deserialize, Serialize};

use quant_core::{QuantizationTarget, Result};

use crate::layers::{join_name, FakeQuantizer, Float, QConv2d, QLinear, QuantInput, QuantizerSpec};
use crate::nn::{AvgPool2d, Conv2d, Flatten, MaxPool2d};

/// The kinds of layer a policy configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LayerKind {
    /// A fully connected layer (dfdx `Linear`).
    Linear,
    /// A 2-D convolution.
    Conv2d,
    /// Max pooling (input quantizer only).
    MaxPool2d,
    /// Average pooling (input quantizer only).
    AvgPool2d,
    /// Flattening (input quantizer only).
    Flatten,
    /// An activation quantizer placed on its own (`TensorQuantizer<1>` as a module).
    Activation,
    /// A user's own layer wrapped by `#[derive(QuantizedLayer)]`: its weight fields take the
    /// weights settings, its input the input settings.
    Custom,
}

impl LayerKind {
    /// Every kind.
    pub const ALL: [LayerKind; 7] = [
        LayerKind::Linear,
        LayerKind::Conv2d,
        LayerKind::MaxPool2d,
        LayerKind::AvgPool2d,
        LayerKind::Flatten,
        LayerKind::Activation,
        LayerKind::Custom,
    ];

    /// Whether layers of this kind have weights to quantize.
    pub fn has_weights(self) -> bool {
        matches!(
            self,
            LayerKind::Linear | LayerKind::Conv2d | LayerKind::Custom
        )
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What a policy decides for one layer: its weights quantizer and its input quantizer, each
/// `None` to stay float.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LayerQuantization {
    /// The weights quantizer (ignored for layers without weights).
    pub weights: Option<QuantizerSpec>,
    /// The input quantizer.
    pub input: Option<QuantizerSpec>,
}

/// Decides each layer's quantizers from its dotted name and kind.
pub trait LayerPolicy {
    /// The quantizers of layer `name` of kind `kind`.
    ///
    /// # Errors
    /// Whatever the policy finds wrong for this layer (the error should name it).
    fn layer(&self, name: &str, kind: LayerKind) -> Result<LayerQuantization>;
}

impl<F: Fn(&str, LayerKind) -> Result<LayerQuantization>> LayerPolicy for F {
    fn layer(&self, name: &str, kind: LayerKind) -> Result<LayerQuantization> {
        self(name, kind)
    }
}

/// Configures the quantizer in a layer's slot from a policy's spec, or leaves it float.
///
/// # Errors
/// A spec whose target does not fit the slot, or that the quantizer rejects.
pub fn configure_slot<Q: FakeQuantizer>(
    slot: &mut Q,
    layer: &str,
    role: &str,
    target: QuantizationTarget,
    spec: Option<&QuantizerSpec>,
) -> Result<()> {
    let name = join_name(layer, role);
    match spec {
        None => {
            slot.clear();
            Ok(())
        }
        Some(spec) if spec.config.target() != target => {
            Err(quant_core::QuantError::ConfigMismatch {
                quantizer: name.clone(),
                reason: format!(
                    "this slot quantizes {target}, the policy gives a {} config",
                    spec.config.target()
                ),
            }
            .at(&name))
        }
        Some(spec) => slot.configure(&name, spec),
    }
}

/// A float module that converts into its quantized twin.
pub trait Quantize {
    /// The quantized twin's type.
    type Quantized;
    /// Converts, naming this module `name` (dotted path from the model's root; empty at the
    /// root) and asking `policy` for each layer's quantizers.
    ///
    /// # Errors
    /// The policy's errors, or a quantizer that cannot be built from the policy's config.
    fn quantize(&self, name: &str, policy: &dyn LayerPolicy) -> Result<Self::Quantized>;
}

/// Configures a weighted layer's two slots as `policy` decides for `name`.
fn configure_weighted<WQ: FakeQuantizer, AQ: FakeQuantizer>(
    weights: &mut WQ,
    input: &mut AQ,
    name: &str,
    kind: LayerKind,
    policy: &dyn LayerPolicy,
) -> Result<()> {
    let decision = policy.layer(name, kind)?;
    configure_slot(
        weights,
        name,
        "weight_quantizer",
        QuantizationTarget::Weights,
        decision.weights.as_ref(),
    )?;
    configure_slot(
        input,
        name,
        "input_quantizer",
        QuantizationTarget::Activation,
        decision.input.as_ref(),
    )
}

impl<const I: usize, const O: usize> Quantize for Linear<I, O, f32, Cpu> {
    type Quantized = QLinear<I, O>;

    fn quantize(&self, name: &str, policy: &dyn LayerPolicy) -> Result<Self::Quantized> {
        let mut q = QLinear::from_linear(self);
        configure_weighted(
            &mut q.weight_quantizer,
            &mut q.input_quantizer,
            name,
            LayerKind::Linear,
            policy,
        )?;
        Ok(q)
    }
}

impl<const C_IN: usize, const C_OUT: usize, const K: usize, const S: usize, const P: usize> Quantize
    for Conv2d<C_IN, C_OUT, K, S, P, f32, Cpu>
{
    type Quantized = QConv2d<C_IN, C_OUT, K, S, P>;

    fn quantize(&self, name: &str, policy: &dyn LayerPolicy) -> Result<Self::Quantized> {
        let mut q = QConv2d::from_conv(self);
        configure_weighted(
            &mut q.weight_quantizer,
            &mut q.input_quantizer,
            name,
            LayerKind::Conv2d,
            policy,
        )?;
        Ok(q)
    }
}

/// Weight-free layers whose input a policy may quantize: their twin is `QuantInput<Self>`.
macro_rules! input_only {
    ($kind:expr => $($ty:ty where [$($g:tt)*]),+ $(,)?) => {
        $(
            impl<$($g)*> Quantize for $ty {
                type Quantized = QuantInput<$ty>;
                fn quantize(&self, name: &str, policy: &dyn LayerPolicy) -> Result<Self::Quantized> {
                    let decision = policy.layer(name, $kind)?;
                    let mut q = QuantInput::new(*self, &Cpu::default());
                    configure_slot(&mut q.input_quantizer, name, "input_quantizer", QuantizationTarget::Activation, decision.input.as_ref())?;
                    Ok(q)
                }
            }
        )+
    };
}
input_only!(LayerKind::MaxPool2d => MaxPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize]);
input_only!(LayerKind::AvgPool2d => AvgPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize]);
input_only!(LayerKind::Flatten => Flatten<N> where [const N: usize]);

/// Float modules that stay float: their twin is `Float<Self>`, a copy.
macro_rules! stays_float {
    ($($ty:ty $(where [$($g:tt)*])?),+ $(,)?) => {
        $(
            impl$(<$($g)*>)? Quantize for $ty {
                type Quantized = Float<$ty>;
                fn quantize(&self, _name: &str, _policy: &dyn LayerPolicy) -> Result<Self::Quantized> {
                    Ok(Float(self.clone()))
                }
            }
        )+
    };
}

stays_float!(
    ReLU,
    Tanh,
    Sigmoid,
    FastGeLU,
    AccurateGeLU,
    Softmax,
    Dropout,
    DropoutOneIn<N> where [const N: usize],
    LeakyReLU<f32>,
    BatchNorm1D<C, f32, Cpu> where [const C: usize],
    BatchNorm2D<C, f32, Cpu> where [const C: usize],
);

macro_rules! tuple_quantize {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Quantize),+> Quantize for ($($name,)+) {
            type Quantized = ($($name::Quantized,)+);
            fn quantize(&self, name: &str, policy: &dyn LayerPolicy) -> Result<Self::Quantized> {
                Ok(($(self.$idx.quantize(&join_name(name, stringify!($idx)), policy)?,)+))
            }
        }
    };
}
tuple_quantize!(A 0);
tuple_quantize!(A 0, B 1);
tuple_quantize!(A 0, B 1, C 2);
tuple_quantize!(A 0, B 1, C 2, D 3);
tuple_quantize!(A 0, B 1, C 2, D 3, E 4);
tuple_quantize!(A 0, B 1, C 2, D 3, E 4, F 5);

/// Converts `model` at the root: `quantize_model(&mlp, &policy)`.
///
/// # Errors
/// See [`Quantize::quantize`].
pub fn quantize_model<M: Quantize>(model: &M, policy: &dyn LayerPolicy) -> Result<M::Quantized> {
    model.quantize("", policy)
}

//! Converting a float dfdx model into its quantized twin under a policy (QuanTransformer's
//! model transformer, ModelOpt's `quantize`; PyTorch's `prepare_qat`), and the registry of what each float layer becomes.
//!
//! Conversion is two steps. [`Convert::convert`] builds the twin, whose type follows
//! from the float model's type: `Linear` becomes [`QLinear`](crate::layers::QLinear), `Conv2d`
//! [`QConv2d`], a weight-free layer whose input a policy may quantize (pooling, flattening)
//! [`QuantInput`], everything else stays float inside [`Float`]; tuples convert element by
//! element. Float weights are copied, never re-initialised. Then [`configure_model`] walks the
//! twin's quantizer slots ([`QuantizedModule::visit_slots`]) and asks a [`LayerPolicy`] for
//! each one, from the layer's dotted name (dfdx's own names for tuples: `0`, `2.1`, ...; field
//! names for derived models), its [`LayerKind`] and the [`Slot`]. A slot the policy leaves
//! float stays unconfigured and computes exactly the float result.
//!
//! # Adding a layer kind
//! A weight-free layer whose graph form is one op: implement [`GraphOp`] for it (below, next
//! to its `Convert` impl, through `stays_float!` or `input_only!`), add its op to
//! [`Op`] with its shape ([`quant_runtime::graph`]), its float reference
//! ([`quant_runtime::graph::evaluate`]) and its integer kernel ([`quant_runtime::integer`]). A layer with
//! weights or several slots: a twin struct that implements [`QuantizedModule`] (its slots, its
//! lowering) and a `Convert` impl here. The README's architecture section has the checklist.

use std::fmt;

use dfdx::nn::modules::{
    Abs, AccurateGeLU, AddInto, AvgPoolGlobal, BatchNorm1D, BatchNorm2D, Cos, Dropout,
    DropoutOneIn, Embedding, Exp, FastGeLU, GeneralizedResidual, LayerNorm1D, LeakyReLU, Ln,
    LogSoftmax, MaxPoolGlobal, MinPoolGlobal, ReLU, Repeated, Residual, Sigmoid, Sin, Softmax,
    SplitInto, Sqrt, Square, Tanh,
};
use dfdx::prelude::*;
use serde::{Deserialize, Serialize};

use quant_core::{QuantError, Result};

use crate::fold::{BatchNormParams, BatchNormValues};
use crate::layers::{
    AddQuantizer, Float, QAddInto, QConv2d, QEmbedding, QGeneralizedResidual, QRepeated, QResidual,
    QSplitInto, QuantInput, QuantizedModule, QuantizerSpec, Slot,
};
use crate::nn::{AvgPool2d, Conv2d, Flatten, ImageTokens, MaxPool2d, MeanTokens};
use quant_runtime::graph::{Op, Parameter, PoolGeometry};

/// Declares [`LayerKind`] and [`LayerKind::ALL`] from one list, so that a new kind cannot be
/// left out of `ALL` (which the policy's error messages and `quant kinds` list).
macro_rules! layer_kinds {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// The kinds of layer a policy configures.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum LayerKind {
            $($(#[$doc])* $kind,)*
        }

        impl LayerKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [LayerKind] = &[$(LayerKind::$kind),*];
        }
    };
}

layer_kinds! {
    /// A fully connected layer (dfdx's `Linear` or `quant_dfdx::nn::Linear`): slots `weights`
    /// and `input`.
    Linear,
    /// A 2-D convolution: slots `weights` and `input`.
    Conv2d,
    /// Max pooling: slot `input`.
    MaxPool2d,
    /// Average pooling: slot `input`.
    AvgPool2d,
    /// Flattening: slot `input`.
    Flatten,
    /// The add of a residual connection (dfdx's `Residual`, `GeneralizedResidual`,
    /// `AddInto`): slot `input` quantizes both inputs on one grid, optional slot `output` the
    /// sum.
    Add,
    /// Global average pooling (dfdx's `AvgPoolGlobal`): slot `input`.
    GlobalAvgPool,
    /// Global max pooling (dfdx's `MaxPoolGlobal`): slot `input`.
    GlobalMaxPool,
    /// Layer normalisation (dfdx's `LayerNorm1D`, or [`LayerNorm`](crate::nn::LayerNorm), its
    /// fused twin): slot `input`. On a quantized input it runs
    /// the integer kernel the integer runtime runs ([`quant_core::int8::nonlinear::IntLayerNorm`]).
    LayerNorm,
    /// GELU (dfdx's `AccurateGeLU`, or [`Gelu`](crate::nn::Gelu), its vectorised twin): slot
    /// `input`. On a quantized input it runs the integer kernel the integer runtime runs
    /// ([`quant_core::int8::nonlinear::IntGelu`]).
    Gelu,
    /// An embedding table (dfdx's `Embedding`): slot `weights`, per row.
    Embedding,
    /// Attention's `Q·Kᵀ` (layer `<attention>.scores` of a
    /// [`QMultiHeadAttention`](crate::layers::QMultiHeadAttention)): slots `query` and `key`,
    /// its two inputs.
    AttentionScores,
    /// Attention's `softmax(·)·V` (layer `<attention>.context`): slots `probs` (the softmax
    /// output) and `value`, its two inputs.
    AttentionContext,
    /// A user's own layer wrapped by `#[derive(QuantizedLayer)]`: one weights slot per
    /// quantized field (named like the field), and `input` when it quantizes its input.
    Custom,
}

impl LayerKind {
    /// The slots layers of this kind have (a custom layer declares its own: empty here).
    pub fn slots(self) -> &'static [Slot] {
        match self {
            LayerKind::Linear | LayerKind::Conv2d => &[Slot::WEIGHTS, Slot::INPUT],
            LayerKind::MaxPool2d
            | LayerKind::AvgPool2d
            | LayerKind::Flatten
            | LayerKind::GlobalAvgPool
            | LayerKind::GlobalMaxPool
            | LayerKind::LayerNorm
            | LayerKind::Gelu => &[Slot::INPUT],
            LayerKind::Add => &[Slot::INPUT, Slot::OUTPUT],
            LayerKind::Embedding => &[Slot::WEIGHTS],
            LayerKind::AttentionScores => &[Slot::QUERY, Slot::KEY],
            LayerKind::AttentionContext => &[Slot::PROBS, Slot::VALUE],
            LayerKind::Custom => &[],
        }
    }

    /// Whether layers of this kind have weights to quantize.
    pub fn has_weights(self) -> bool {
        self == LayerKind::Custom
            || self
                .slots()
                .iter()
                .any(|s| s.target == quant_core::QuantizationTarget::Weights)
    }

    /// Whether a policy's defaults (`[weights]`, `[input]`) apply to its (non-optional) slots:
    /// layers with weights, adds, attention's matrix products, layer normalisation and GELU
    /// (their integer forms need their inputs quantized); the slots of other kinds (pooling,
    /// flattening) stay float unless their kind's table or an override turns them on.
    pub fn quantized_by_default(self) -> bool {
        self.has_weights()
            || matches!(
                self,
                LayerKind::Add
                    | LayerKind::AttentionScores
                    | LayerKind::AttentionContext
                    | LayerKind::LayerNorm
                    | LayerKind::Gelu
            )
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Decides each quantizer slot of a model from its layer's dotted name and kind.
pub trait LayerPolicy {
    /// The quantizer of `slot` of layer `layer` (of `kind`); `None` leaves it float.
    ///
    /// # Errors
    /// Whatever the policy finds wrong for this slot (the error should name the layer).
    fn slot(&self, layer: &str, kind: LayerKind, slot: Slot) -> Result<Option<QuantizerSpec>>;
}

impl<F: Fn(&str, LayerKind, Slot) -> Result<Option<QuantizerSpec>>> LayerPolicy for F {
    fn slot(&self, layer: &str, kind: LayerKind, slot: Slot) -> Result<Option<QuantizerSpec>> {
        self(layer, kind, slot)
    }
}

/// A float module that converts into its quantized twin.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no quantized twin: quant cannot convert it",
    label = "this layer cannot be converted",
    note = "quant converts dfdx's Linear, MultiHeadAttention, TransformerEncoderBlock (and TransformerEncoder), LayerNorm1D, Embedding, BatchNorm1D/2D, Dropout, the activations, Residual, GeneralizedResidual, AddInto, SplitInto, Repeated, AvgPoolGlobal and MaxPoolGlobal, quant_dfdx::nn's Linear, MultiHeadAttention, Conv2d, BatchNorm2d, LayerNorm, Gelu, ImageTokens, MeanTokens, MaxPool2d, AvgPool2d and Flatten, tuples of these, and #[derive(QuantizedLayer)] / #[derive(QuantizedModel)] structs",
    note = "for a layer of your own, derive `QuantizedLayer` on it (its tensors become quantizer slots), or implement `Convert` for it"
)]
pub trait Convert {
    /// The quantized twin's type.
    type Quantized: QuantizedModule;
    /// The twin, with this module's weights and every quantizer slot unconfigured (it computes
    /// exactly what this module computes until [`configure_model`] configures it).
    fn convert(&self) -> Self::Quantized;
}

/// Configures every quantizer slot of `model` as `policy` decides (see the module docs):
/// a spec builds the slot's quantizer (which starts Calibrating), `None` clears it. A slot
/// without a channel axis quantizes per tensor whatever the spec says.
///
/// # Errors
/// The policy's errors; a spec for the other target than the slot's (weights for an
/// activation); a quantizer that cannot be built from its spec. Each names the quantizer.
pub fn configure_model<M: QuantizedModule + ?Sized>(
    model: &mut M,
    policy: &dyn LayerPolicy,
) -> Result<()> {
    model.visit_slots("", &mut |s| {
        let name = s.name();
        match policy.slot(s.layer, s.kind, s.slot)? {
            None => {
                s.quantizer.clear();
                Ok(())
            }
            Some(spec) if spec.config.target() != s.slot.target => {
                Err(QuantError::ConfigMismatch {
                    quantizer: name.clone(),
                    reason: format!(
                        "this slot quantizes {}, the policy gives a {} config",
                        s.slot.target,
                        spec.config.target()
                    ),
                }
                .at(&name))
            }
            Some(mut spec) => {
                if !s.slot.per_channel {
                    if let quant_core::QuantizerConfig::Weights(w) = &mut spec.config {
                        w.per_channel = false;
                    }
                }
                s.quantizer.configure(&name, &spec)
            }
        }
    })
}

/// Converts `model` and configures it under `policy`: `convert_model(&mlp, &policy)`.
///
/// # Errors
/// See [`configure_model`].
pub fn convert_model<M: Convert>(model: &M, policy: &dyn LayerPolicy) -> Result<M::Quantized> {
    let mut q = model.convert();
    configure_model(&mut q, policy)?;
    Ok(q)
}

/// A module whose graph form is one op on its input, or nothing (the identity at inference).
pub trait GraphOp {
    /// Its op, `Ok(None)` for the identity.
    ///
    /// # Errors
    /// Why it has no graph form, as text.
    fn graph_op(&self) -> std::result::Result<Option<Op>, String>;
}

/// A weight-free layer whose input a policy may quantize: it converts into `QuantInput<Self>`.
pub trait InputOnly: GraphOp {
    /// Its kind, for policies.
    const KIND: LayerKind;
}

impl_for_conv! {
    [] Convert for Conv2d<C_IN, C_OUT, K, S, P, G, CG, f32, Cpu> {
        type Quantized = QConv2d<C_IN, C_OUT, K, S, P, G, CG>;

        fn convert(&self) -> Self::Quantized {
            QConv2d::from_conv(self)
        }
    }
}

/// Weight-free layers whose input a policy may quantize: `Convert` into `QuantInput<Self>`,
/// their kind and their graph op, in one line each.
macro_rules! input_only {
    ($($ty:ty where [$($g:tt)*] => $kind:expr, |$s:ident| $op:expr;)+) => {
        $(
            impl<$($g)*> Convert for $ty {
                type Quantized = QuantInput<$ty>;
                fn convert(&self) -> Self::Quantized {
                    QuantInput::new(self.clone(), &Cpu::default())
                }
            }
            impl<$($g)*> InputOnly for $ty {
                const KIND: LayerKind = $kind;
            }
            impl<$($g)*> GraphOp for $ty {
                fn graph_op(&self) -> std::result::Result<Option<Op>, String> {
                    let $s = self;
                    Ok(Some($op))
                }
            }
        )+
    };
}
/// The graph op of a LayerNorm (dfdx's or ours) with these parameters.
fn layer_norm_op<const M: usize>(
    gamma: &Tensor<Rank1<M>, f32, Cpu>,
    beta: &Tensor<Rank1<M>, f32, Cpu>,
    epsilon: f64,
) -> Op {
    Op::LayerNorm(quant_runtime::graph::LayerNorm {
        scale: Parameter::float("gamma", gamma.as_vec()),
        shift: Parameter::float("beta", beta.as_vec()),
        epsilon,
    })
}

input_only!(
    MaxPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize] => LayerKind::MaxPool2d,
        |_m| Op::MaxPool2d(quant_runtime::graph::MaxPool2d { window: PoolGeometry { kernel: [K, K], stride: [S, S], padding: [P, P] } });
    AvgPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize] => LayerKind::AvgPool2d,
        |_m| Op::AvgPool2d(quant_runtime::graph::AvgPool2d { window: PoolGeometry { kernel: [K, K], stride: [S, S], padding: [P, P] } });
    Flatten<N> where [const N: usize] => LayerKind::Flatten, |_m| Op::Flatten;
    AvgPoolGlobal where [] => LayerKind::GlobalAvgPool, |_m| Op::GlobalAvgPool;
    MaxPoolGlobal where [] => LayerKind::GlobalMaxPool, |_m| Op::GlobalMaxPool;
    LayerNorm1D<M, f32, Cpu> where [const M: usize] => LayerKind::LayerNorm,
        |m| layer_norm_op(&m.gamma, &m.beta, m.epsilon);
    crate::nn::LayerNorm<M, f32, Cpu> where [const M: usize] => LayerKind::LayerNorm,
        |m| layer_norm_op(&m.gamma, &m.beta, m.epsilon);
    AccurateGeLU where [] => LayerKind::Gelu, |_m| Op::Gelu;
    crate::nn::Gelu where [] => LayerKind::Gelu, |_m| Op::Gelu;
);

/// Float modules that stay float: `Convert` into `Float<Self>` (a copy), and their graph op.
macro_rules! stays_float {
    ($($ty:ty $(where [$($g:tt)*])? => |$s:ident| $op:expr;)+) => {
        $(
            impl$(<$($g)*>)? Convert for $ty {
                type Quantized = Float<$ty>;
                fn convert(&self) -> Self::Quantized {
                    Float(self.clone())
                }
            }
            impl$(<$($g)*>)? GraphOp for $ty {
                fn graph_op(&self) -> std::result::Result<Option<Op>, String> {
                    let $s = self;
                    $op
                }
            }
        )+
    };
}

fn no_graph_op(what: &str) -> std::result::Result<Option<Op>, String> {
    Err(format!(
        "{what} has no graph op yet, so the model cannot be exported: replace it by an activation that has one (ReLU, Tanh, Sigmoid)"
    ))
}

stays_float!(
    ReLU => |_m| Ok(Some(Op::Relu));
    crate::nn::Relu => |_m| Ok(Some(Op::Relu));
    Tanh => |_m| Ok(Some(Op::Tanh));
    Sigmoid => |_m| Ok(Some(Op::Sigmoid));
    FastGeLU => |_m| no_graph_op("FastGeLU");
    Softmax => |_m| no_graph_op("Softmax");
    LogSoftmax => |_m| no_graph_op("LogSoftmax");
    LeakyReLU<f32> => |_m| no_graph_op("LeakyReLU");
    dfdx::nn::prelu::PReLU<f32, Cpu> => |_m| no_graph_op("PReLU");
    dfdx::nn::prelu::PReLU1D<C, f32, Cpu> where [C: ConstDim] => |_m| no_graph_op("PReLU1D");
    Sin => |_m| no_graph_op("Sin");
    Cos => |_m| no_graph_op("Cos");
    Ln => |_m| no_graph_op("Ln");
    Exp => |_m| no_graph_op("Exp");
    Square => |_m| no_graph_op("Square");
    Sqrt => |_m| no_graph_op("Sqrt");
    Abs => |_m| no_graph_op("Abs");
    MinPoolGlobal => |_m| no_graph_op("MinPoolGlobal");
    ImageTokens<C, N, f32, Cpu> where [const C: usize, const N: usize] => |m| Ok(Some(Op::ImageTokens(quant_runtime::graph::ImageTokens {
        position: Parameter::float("position", m.position.as_vec()),
    })));
    MeanTokens => |_m| Ok(Some(Op::MeanTokens));
    Dropout => |_m| Ok(None);
    DropoutOneIn<N> where [const N: usize] => |_m| Ok(None);
    BatchNorm1D<C, f32, Cpu> where [const C: usize] => |m| Ok(Some(batch_norm(&m.values())));
    BatchNorm2D<C, f32, Cpu> where [const C: usize] => |m| Ok(Some(batch_norm(&m.values())));
    crate::nn::BatchNorm2d<C, f32, Cpu> where [const C: usize] => |m| Ok(Some(batch_norm(&m.values())));
);

/// A BatchNorm in inference mode as its per-channel affine map:
/// `scale = γ/√(σ²+ε)`, `shift = β − μ·scale`.
fn batch_norm(bn: &BatchNormValues) -> Op {
    let scale: Vec<f32> = bn
        .gamma
        .iter()
        .zip(&bn.var)
        .map(|(g, v)| (*g as f64 / (*v as f64 + bn.epsilon).sqrt()) as f32)
        .collect();
    let shift = bn
        .beta
        .iter()
        .zip(&bn.mean)
        .zip(&scale)
        .map(|((b, m), s)| (*b as f64 - *m as f64 * *s as f64) as f32)
        .collect();
    Op::ChannelAffine(quant_runtime::graph::ChannelAffine {
        scale: Parameter::float("scale", scale),
        shift: Parameter::float("shift", shift),
    })
}

impl<const V: usize, const M: usize> Convert for Embedding<V, M, f32, Cpu> {
    type Quantized = QEmbedding<V, M>;

    fn convert(&self) -> Self::Quantized {
        QEmbedding::from_embedding(self)
    }
}

/// A residual's twin: its branch converted, the add's quantizers unconfigured.
fn q_residual<F: Convert>(branch: &F) -> QResidual<F::Quantized> {
    QResidual {
        module: branch.convert(),
        add: AddQuantizer::new(&Cpu::default()),
    }
}

impl<F: Convert> Convert for Residual<F> {
    type Quantized = QResidual<F::Quantized>;

    fn convert(&self) -> Self::Quantized {
        q_residual(&self.0)
    }
}

impl<F: Convert> Convert for crate::nn::Residual<F> {
    type Quantized = QResidual<F::Quantized>;

    fn convert(&self) -> Self::Quantized {
        q_residual(&self.0)
    }
}

impl<F: Convert, R: Convert> Convert for GeneralizedResidual<F, R> {
    type Quantized = QGeneralizedResidual<F::Quantized, R::Quantized>;

    fn convert(&self) -> Self::Quantized {
        QGeneralizedResidual {
            f: self.f.convert(),
            r: self.r.convert(),
            add: AddQuantizer::new(&Cpu::default()),
        }
    }
}

impl<T: Convert, const N: usize> Convert for Repeated<T, N> {
    type Quantized = QRepeated<T::Quantized, N>;

    fn convert(&self) -> Self::Quantized {
        QRepeated {
            modules: self.modules.iter().map(Convert::convert).collect(),
        }
    }
}

/// dfdx's `SplitInto` and `AddInto` over tuples of 2 to 4 modules.
macro_rules! split_add_convert {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Convert),+> Convert for SplitInto<($($name,)+)>
        where
            QSplitInto<($($name::Quantized,)+)>: QuantizedModule,
        {
            type Quantized = QSplitInto<($($name::Quantized,)+)>;
            fn convert(&self) -> Self::Quantized {
                QSplitInto(($(self.0.$idx.convert(),)+))
            }
        }
        impl<$($name: Convert),+> Convert for AddInto<($($name,)+)>
        where
            QAddInto<($($name::Quantized,)+)>: QuantizedModule,
        {
            type Quantized = QAddInto<($($name::Quantized,)+)>;
            fn convert(&self) -> Self::Quantized {
                QAddInto {
                    modules: ($(self.0.$idx.convert(),)+),
                    add: AddQuantizer::new(&Cpu::default()),
                }
            }
        }
    };
}
split_add_convert!(A 0, B 1);
split_add_convert!(A 0, B 1, C 2);
split_add_convert!(A 0, B 1, C 2, D 3);

macro_rules! tuple_convert {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Convert),+> Convert for ($($name,)+) {
            type Quantized = ($($name::Quantized,)+);
            fn convert(&self) -> Self::Quantized {
                ($(self.$idx.convert(),)+)
            }
        }
    };
}
for_each_tuple!(tuple_convert);

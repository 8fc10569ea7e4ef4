//! `QLinear`: dfdx's Linear with a weights quantizer and an input quantizer.

use dfdx::nn::modules::Linear;
use dfdx::nn::tensor_collection::{TensorCollection, TensorOptions};
use dfdx::prelude::*;

use quant_core::{QuantError, Result};

use super::fan_in_uniform;
use super::{
    lower_weighted, visit_layer_slots, FakeQuantizer, QuantizedModule, Slot, SlotVisitor,
    TensorQuantizer,
};
use crate::convert::{Convert, LayerKind};
use crate::nn::LinearInput;
use quant_runtime::graph::{GraphBuilder, Op, ValueId};
use quant_runtime::GraphError;

/// A Linear layer (`y = x·Wᵀ + b`, weight `[O, I]`) on inputs of any rank dfdx's Linear takes
/// (`[I]`, `[batch, I]`, `[batch, seq, I]`), whose weight passes through
/// `weights_quantizer` (per output channel on axis 0, or per tensor) and whose input passes
/// through `input_quantizer` (per tensor). The bias stays float in training; export quantizes it
/// to int32 with `s_bias = s_input · s_weight`.
///
/// The quantizers default to [`TensorQuantizer`] (chosen at run time); any [`FakeQuantizer`]
/// fixed at compile time works too.
#[derive(Debug, Clone)]
pub struct QLinear<
    const I: usize,
    const O: usize,
    WQ = TensorQuantizer<O>,
    AQ = TensorQuantizer<1>,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// Weight matrix `[O, I]`, as in dfdx's Linear.
    pub weight: Tensor<Rank2<O, I>, E, D>,
    /// Bias `[O]`.
    pub bias: Tensor<Rank1<O>, E, D>,
    /// Quantizer of the weight.
    pub weights_quantizer: WQ,
    /// Quantizer of the input.
    pub input_quantizer: AQ,
}

tensor_collection! {
    impl[
        const I: usize,
        const O: usize,
        WQ: TensorCollection<E, D>,
        AQ: TensorCollection<E, D>,
        E: Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
        D: Device<E>,
    ] QLinear<I, O, WQ, AQ, E, D> => QLinear<I, O, WQ::To<E2, D2>, AQ::To<E2, D2>, E2, D2>;
    QLinear {
        weight: tensor(TensorOptions::reset_with(|t| t.try_fill_with_distr(fan_in_uniform(I)))),
        bias: tensor(TensorOptions::reset_with(|t| t.try_fill_with_distr(fan_in_uniform(I)))),
        weights_quantizer,
        input_quantizer,
    }
}

/// A float fully connected layer [`QLinear::from_linear`] wraps: dfdx's `Linear` or
/// [`crate::nn::Linear`].
pub trait LinearParams<const I: usize, const O: usize> {
    /// The weights, `[O, I]`.
    fn weight(&self) -> &Tensor<Rank2<O, I>, f32, Cpu>;
    /// The bias, `[O]`.
    fn bias(&self) -> &Tensor<Rank1<O>, f32, Cpu>;
}

/// [`LinearParams`] and conversion into [`QLinear`] for a Linear type with fields `weight`
/// and `bias`.
macro_rules! linear_params {
    ($($ty:ty),+) => {$(
        impl<const I: usize, const O: usize> LinearParams<I, O> for $ty {
            fn weight(&self) -> &Tensor<Rank2<O, I>, f32, Cpu> {
                &self.weight
            }
            fn bias(&self) -> &Tensor<Rank1<O>, f32, Cpu> {
                &self.bias
            }
        }

        impl<const I: usize, const O: usize> Convert for $ty {
            type Quantized = QLinear<I, O>;

            fn convert(&self) -> Self::Quantized {
                QLinear::from_linear(self)
            }
        }
    )+};
}

linear_params!(Linear<I, O, f32, Cpu>, crate::nn::Linear<I, O, f32, Cpu>);

impl<const I: usize, const O: usize> QLinear<I, O> {
    /// Wraps a float Linear (weights copied, not re-initialised) with unconfigured quantizers:
    /// until configured, the layer computes exactly what the float Linear does.
    pub fn from_linear(linear: &(impl LinearParams<I, O> + ?Sized)) -> Self {
        let dev = linear.weight().device();
        QLinear {
            weight: linear.weight().clone(),
            bias: linear.bias().clone(),
            weights_quantizer: TensorQuantizer::new(dev),
            input_quantizer: TensorQuantizer::new(dev),
        }
    }
}

/// `Module` and `ModuleMut` for every input rank dfdx's Linear takes: `[I]`, `[batch, I]` and
/// `[batch, seq, I]` (features on the last axis; the other axes are rows, as in dfdx). The input
/// quantizer is per tensor whatever the rank; the weights quantizer's channels are the weight's
/// output rows (axis 0 of `[O, I]`), whatever the input.
macro_rules! linear_modules {
    ($([$($dim:ident),*];)+) => {$(
        linear_modules!(@impl Module::try_forward() => fake_quantize; [$($dim),*]);
        linear_modules!(@impl ModuleMut::try_forward_mut(mut) => fake_quantize_mut; [$($dim),*]);
    )+};
    // One impl; `Module` evaluates (`fake_quantize`), `ModuleMut` trains and calibrates
    // (`fake_quantize_mut`, `(mut)` for `&mut self`): weights calibrate from themselves, the
    // observer seeing the weight on every step while the weight passes through.
    (@impl $trait:ident::$method:ident($($mut:ident)?) => $fake_quantize:ident;
        [$($dim:ident),*]) => {
        impl<
                $($dim: Dim,)*
                const I: usize,
                const O: usize,
                WQ: FakeQuantizer,
                AQ: FakeQuantizer,
                T: Tape<f32, Cpu> + Merge<T>,
            > $trait<Tensor<($($dim,)* Const<I>,), f32, Cpu, T>> for QLinear<I, O, WQ, AQ>
        {
            type Output = Tensor<($($dim,)* Const<O>,), f32, Cpu, T>;
            type Error = QuantError;

            fn $method(
                &$($mut)? self,
                x: Tensor<($($dim,)* Const<I>,), f32, Cpu, T>,
            ) -> Result<Self::Output> {
                // In training, the weights (and the input, when its quantizer runs an op) are
                // quantized inside the product: the same numbers, without tensors and zeroed
                // gradient buffers for the quantized values.
                if T::OWNS_TAPE {
                    if let Some(weights) = self.weights_quantizer.quantization(self.weight.shape())? {
                        let input = self.input_quantizer.quantization(x.shape())?;
                        // Without an op of its own the input quantizer observes (Calibrating)
                        // or passes the input through.
                        let x = match input {
                            Some(_) => x,
                            None => self.input_quantizer.$fake_quantize(x)?,
                        };
                        let b: Tensor<Rank1<O>, f32, Cpu, T> = super::layer_bias(
                            &self.bias,
                            &self.input_quantizer,
                            &self.weights_quantizer,
                        )?;
                        return x.linear_quantized(input, &self.weight, weights, b);
                    }
                }
                let x = self.input_quantizer.$fake_quantize(x)?;
                let w = self
                    .weights_quantizer
                    .$fake_quantize(self.weight.retaped::<T>())?;
                // After the weights quantizer: calibration may have moved its scales.
                let b: Tensor<Rank1<O>, f32, Cpu, T> =
                    super::layer_bias(&self.bias, &self.input_quantizer, &self.weights_quantizer)?;
                // dfdx's `x · wᵀ + b` to the bit, one product for the batch.
                crate::nn::linear(x, w, b)
            }
        }
    };
}

linear_modules!(
    [];
    [B];
    [B, S];
);

impl<const I: usize, const O: usize, WQ: FakeQuantizer, AQ: FakeQuantizer> QuantizedModule
    for QLinear<I, O, WQ, AQ>
{
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        visit_layer_slots(
            name,
            LayerKind::Linear,
            [
                (Slot::INPUT, &mut self.input_quantizer),
                (Slot::WEIGHTS, &mut self.weights_quantizer),
            ],
            f,
        )
    }

    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        lower_weighted(
            name,
            g,
            x,
            (&self.input_quantizer, &self.weights_quantizer),
            (&self.weight.as_vec(), &[O, I]),
            &self.bias.as_vec(),
            |weight, bias| {
                Op::Linear(quant_runtime::graph::Linear {
                    in_features: I,
                    out_features: O,
                    weight,
                    bias,
                })
            },
        )
    }
}

//! `QConv2d`: the stable 2-D convolution with a weights quantizer and an input quantizer.

use dfdx::nn::tensor_collection::{TensorCollection, TensorOptions};
use dfdx::prelude::*;

use quant_core::{QuantError, Result};

use super::fan_in_uniform;
use super::{
    layer_bias, lower_weighted, visit_layer_slots, FakeQuantizer, QuantizedModule, Slot,
    SlotVisitor, TensorQuantizer,
};
use crate::convert::LayerKind;
use crate::nn::{conv2d_grouped, Conv2d, FeatureMaps};
use quant_runtime::graph::{Conv2dGeometry, GraphBuilder, Op, ValueId};
use quant_runtime::GraphError;

/// A 2-D convolution (`weight [C_OUT, C_IN, K, K]`, stride `S`, zero padding `P`) whose weight
/// passes through `weights_quantizer` (per output channel on axis 0, or per tensor) and whose
/// input passes through `input_quantizer` (per tensor). Like [`QLinear`](super::QLinear), the
/// bias is added as int32 deployment holds it while both quantizers quantize.
#[derive(Debug, Clone)]
pub struct QConv2d<
    const C_IN: usize,
    const C_OUT: usize,
    const K: usize,
    const S: usize = 1,
    const P: usize = 0,
    const G: usize = 1,
    const CG: usize = C_IN,
    WQ = TensorQuantizer<C_OUT>,
    AQ = TensorQuantizer<1>,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// The kernels `[C_OUT, CG, K, K]` (`CG = C_IN / G` input channels per group).
    pub weight: Tensor<Rank4<C_OUT, CG, K, K>, E, D>,
    /// One bias per output channel.
    pub bias: Tensor<Rank1<C_OUT>, E, D>,
    /// Quantizer of the weight.
    pub weights_quantizer: WQ,
    /// Quantizer of the input.
    pub input_quantizer: AQ,
}

tensor_collection! {
    impl[
        const C_IN: usize,
        const C_OUT: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const G: usize,
        const CG: usize,
        WQ: TensorCollection<E, D>,
        AQ: TensorCollection<E, D>,
        E: Dtype + num_traits::Float + rand_distr::uniform::SampleUniform,
        D: Device<E>,
    ] QConv2d<C_IN, C_OUT, K, S, P, G, CG, WQ, AQ, E, D>
        => QConv2d<C_IN, C_OUT, K, S, P, G, CG, WQ::To<E2, D2>, AQ::To<E2, D2>, E2, D2>;
    QConv2d {
        weight: tensor(TensorOptions::reset_with(|t| {
            t.try_fill_with_distr(fan_in_uniform(CG * K * K))
        })),
        bias: tensor(TensorOptions::reset_with(|t| {
            t.try_fill_with_distr(fan_in_uniform(CG * K * K))
        })),
        weights_quantizer,
        input_quantizer,
    }
}

impl_for_conv! {
    [] QConv2d<C_IN, C_OUT, K, S, P, G, CG> {
        /// Wraps a float convolution (weights copied) with unconfigured quantizers: until
        /// configured, the layer computes exactly what the float convolution does.
        pub fn from_conv(conv: &Conv2d<C_IN, C_OUT, K, S, P, G, CG, f32, Cpu>) -> Self {
            let dev = conv.weight.device();
            QConv2d {
                weight: conv.weight.clone(),
                bias: conv.bias.clone(),
                weights_quantizer: TensorQuantizer::new(dev),
                input_quantizer: TensorQuantizer::new(dev),
            }
        }
    }
}

/// `Module` (evaluation) and `ModuleMut` (training and calibration) run the same forward pass;
/// only the quantizer call differs: `fake_quantize_mut` lets the quantizers calibrate, the
/// weights from themselves (see QLinear). `(mut)` gives the method `&mut self`.
macro_rules! conv_modules {
    ($($trait:ident::$method:ident($($mut:ident)?) => $fake_quantize:ident;)+) => {$(
        impl_for_conv! {
            [
                B: Dim,
                H: Dim,
                W: Dim,
                WQ: FakeQuantizer,
                AQ: FakeQuantizer,
                T: Tape<f32, Cpu> + Merge<T>,
            ] $trait<Tensor<(B, Const<C_IN>, H, W), f32, Cpu, T>>
            for QConv2d<C_IN, C_OUT, K, S, P, G, CG, WQ, AQ>
            {
                type Output = FeatureMaps<B, C_OUT, T>;
                type Error = QuantError;

                fn $method(
                    &$($mut)? self,
                    x: Tensor<(B, Const<C_IN>, H, W), f32, Cpu, T>,
                ) -> Result<Self::Output> {
                    let x = self.input_quantizer.$fake_quantize(x)?;
                    let w = self
                        .weights_quantizer
                        .$fake_quantize(self.weight.retaped::<T>())?;
                    let bias =
                        layer_bias(&self.bias, &self.input_quantizer, &self.weights_quantizer)?;
                    conv2d_grouped(x, w, bias, S, P, G)
                }
            }
        }
    )+};
}

conv_modules! {
    Module::try_forward() => fake_quantize;
    ModuleMut::try_forward_mut(mut) => fake_quantize_mut;
}

impl_for_conv! {
    [WQ: FakeQuantizer, AQ: FakeQuantizer] QuantizedModule
    for QConv2d<C_IN, C_OUT, K, S, P, G, CG, WQ, AQ>
    {
        fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
            visit_layer_slots(
                name,
                LayerKind::Conv2d,
                [
                    (Slot::INPUT, &mut self.input_quantizer),
                    (Slot::WEIGHTS, &mut self.weights_quantizer),
                ],
                f,
            )
        }

        fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
            let geometry = Conv2dGeometry {
                in_channels: C_IN,
                out_channels: C_OUT,
                kernel: [K, K],
                stride: [S, S],
                padding: [P, P],
                groups: G,
            };
            lower_weighted(
                name,
                g,
                x,
                (&self.input_quantizer, &self.weights_quantizer),
                (&self.weight.as_vec(), &geometry.weight_shape()),
                &self.bias.as_vec(),
                |weight, bias| Op::Conv2d(quant_runtime::graph::Conv2d {
                    geometry,
                    weight,
                    bias,
                }),
            )
        }
    }
}

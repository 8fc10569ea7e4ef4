//! `QuantInput<M>`: quantize the input of any module.

use dfdx::nn::tensor_collection::TensorCollection;
use dfdx::prelude::*;

use quant_core::{QuantError, Result};

use super::float::lower_op;
use super::{join_name, visit_layer_slots, QuantizedModule, Slot, SlotVisitor, TensorQuantizer};
use crate::convert::InputOnly;
use crate::export::ExportError;
use crate::graph::{GraphBuilder, ValueId};

/// Quantizes the input of a module that has no weights (pooling, flatten, a residual add)
/// with a per-tensor quantizer, then runs the module: pytorch-quantization's
/// `QuantInputMixin` (`QuantMaxPool2d`, `QuantAvgPool2d`) for any module.
#[derive(Debug, Clone)]
pub struct QuantInput<M, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// The wrapped module.
    pub module: M,
    /// Quantizer of the module's input.
    pub input_quantizer: TensorQuantizer<1, E, D>,
}

impl<M> QuantInput<M> {
    /// Wraps `module` with an unconfigured (pass-through) input quantizer.
    pub fn new(module: M, dev: &Cpu) -> Self {
        QuantInput {
            module,
            input_quantizer: TensorQuantizer::new(dev),
        }
    }
}

tensor_collection! {
    impl[E: Dtype, D: Device<E>, M: TensorCollection<E, D>] QuantInput<M, E, D>
        => QuantInput<M::To<E2, D2>, E2, D2>;
    QuantInput { module, input_quantizer }
}

impl<S: Shape, T: Tape<f32, Cpu>, M: Module<Tensor<S, f32, Cpu, T>>> Module<Tensor<S, f32, Cpu, T>>
    for QuantInput<M>
where
    M::Error: Into<QuantError>,
{
    type Output = M::Output;
    type Error = QuantError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
        let x = self.input_quantizer.fake_quantize(x)?;
        self.module.try_forward(x).map_err(Into::into)
    }
}

impl<S: Shape, T: Tape<f32, Cpu>, M: ModuleMut<Tensor<S, f32, Cpu, T>>>
    ModuleMut<Tensor<S, f32, Cpu, T>> for QuantInput<M>
where
    M::Error: Into<QuantError>,
{
    type Output = M::Output;
    type Error = QuantError;

    fn try_forward_mut(&mut self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
        let x = self.input_quantizer.fake_quantize_mut(x)?;
        self.module.try_forward_mut(x).map_err(Into::into)
    }
}

impl<M: InputOnly> QuantizedModule for QuantInput<M> {
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        visit_layer_slots(name, M::KIND, [(Slot::INPUT, &mut self.input_quantizer)], f)
    }

    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, ExportError> {
        let x = g.quantize(&join_name(name, Slot::INPUT.name), &self.input_quantizer, x)?;
        lower_op(&self.module, name, g, x)
    }
}

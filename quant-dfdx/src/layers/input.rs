//! `QuantInput<M>`: quantize the input of any module.

use dfdx::nn::tensor_collection::TensorCollection;
use dfdx::prelude::*;

use dfdx::nn::modules::{AccurateGeLU, AvgPoolGlobal, LayerNorm1D, MaxPoolGlobal};
use dfdx::tensor::CpuError;
use quant_core::dfdx_ops::{int_gelu, int_layer_norm, CodeGrid};
use quant_core::int8::nonlinear::IntGelu;
use quant_core::{QuantError, Result};

use super::float::lower_op;
use super::{join_name, visit_layer_slots, QuantizedModule, Slot, SlotVisitor, TensorQuantizer};
use crate::convert::InputOnly;
use crate::lower::QuantizeNodes;
use crate::nn::{AvgPool2d, Flatten, MaxPool2d};
use quant_runtime::graph::{GraphBuilder, ValueId};
use quant_runtime::GraphError;

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

impl<S: Shape, T: Tape<f32, Cpu>, M: OnGrid<Tensor<S, f32, Cpu, T>>> Module<Tensor<S, f32, Cpu, T>>
    for QuantInput<M>
{
    type Output = M::Output;
    type Error = QuantError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
        let x = self.input_quantizer.fake_quantize(x)?;
        self.module.forward_on_grid(x, &self.input_quantizer)
    }
}

impl<S: Shape, T: Tape<f32, Cpu>, M: OnGrid<Tensor<S, f32, Cpu, T>>>
    ModuleMut<Tensor<S, f32, Cpu, T>> for QuantInput<M>
{
    type Output = M::Output;
    type Error = QuantError;

    fn try_forward_mut(&mut self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output> {
        let x = self.input_quantizer.fake_quantize_mut(x)?;
        self.module.forward_on_grid(x, &self.input_quantizer)
    }
}

/// How a weight-free layer computes on its input once [`QuantInput`] has quantized it.
///
/// Pooling and flattening compute on grid values as on any floats. Layer normalisation and
/// GELU have no exact integer form: on a quantized input they run the integer kernel the
/// integer runtime runs ([`quant_core::int8::nonlinear::IntLayerNorm`], [`quant_core::int8::nonlinear::IntGelu`]),
/// simulated on the grid's values ([`quant_core::dfdx_ops`]), so that the fake-quantized model and
/// the integer model agree; on a float input (quantizer disabled or calibrating) they run the
/// float layer.
pub trait OnGrid<X> {
    /// The layer's output.
    type Output;

    /// The forward pass on `x`, as `quantizer` left it: on its grid
    /// ([`TensorQuantizer::code_grid`], read only by the layers that need it) while it quantizes.
    ///
    /// # Errors
    /// The layer's error, or a grid its integer kernel cannot be prepared for.
    fn forward_on_grid(&self, x: X, quantizer: &TensorQuantizer<1>) -> Result<Self::Output>;
}

/// [`OnGrid`] for layers that compute on grid values as on any floats.
macro_rules! float_on_grid {
    ($($ty:ty $(where [$($g:tt)*])?;)+) => {$(
        impl<X, $($($g)*)?> OnGrid<X> for $ty
        where
            $ty: Module<X>,
            <$ty as Module<X>>::Error: Into<QuantError>,
        {
            type Output = <$ty as Module<X>>::Output;

            fn forward_on_grid(&self, x: X, _: &TensorQuantizer<1>) -> Result<Self::Output> {
                self.try_forward(x).map_err(Into::into)
            }
        }
    )+};
}

float_on_grid!(
    MaxPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize];
    AvgPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize];
    Flatten<N> where [const N: usize];
    AvgPoolGlobal;
    MaxPoolGlobal;
);

/// [`OnGrid`] for layers with an integer kernel: `$kernel` on a quantized input (values on
/// `$grid`), the float layer otherwise.
macro_rules! kernel_on_grid {
    ($([$($g:tt)*] $ty:ty => |$m:ident, $x:ident, $grid:ident| $kernel:expr;)+) => {$(
        impl<$($g)* S: Shape, T: Tape<f32, Cpu>> OnGrid<Tensor<S, f32, Cpu, T>> for $ty
        where
            $ty: Module<Tensor<S, f32, Cpu, T>, Output = Tensor<S, f32, Cpu, T>, Error = CpuError>,
        {
            type Output = Tensor<S, f32, Cpu, T>;

            fn forward_on_grid(
                &self,
                $x: Tensor<S, f32, Cpu, T>,
                quantizer: &TensorQuantizer<1>,
            ) -> Result<Self::Output> {
                let $m = self;
                match quantizer.code_grid()?.as_ref() {
                    Some($grid) => $kernel,
                    None => Ok(self.try_forward($x)?),
                }
            }
        }
    )+};
}

kernel_on_grid!(
    [const M: usize,] LayerNorm1D<M, f32, Cpu> => |m, x, grid|
        int_layer_norm(x, &m.gamma, &m.beta, m.epsilon as f32, grid, true);
    [const M: usize,] crate::nn::LayerNorm<M, f32, Cpu> => |m, x, grid|
        int_layer_norm(x, &m.gamma, &m.beta, m.epsilon as f32, grid, true);
    [] AccurateGeLU => |_m, x, grid| int_gelu(x, &gelu_kernel(grid)?);
    [] crate::nn::Gelu => |_m, x, grid| int_gelu(x, &gelu_kernel(grid)?);
);

/// The GELU kernel of codes on `grid`, as the integer runtime prepares it.
pub(crate) fn gelu_kernel(grid: &CodeGrid) -> Result<IntGelu> {
    IntGelu::deployed(grid.scale, grid.zero_point, grid.codes.clone())
}

impl<M: InputOnly> QuantizedModule for QuantInput<M> {
    fn visit_slots(&mut self, name: &str, f: &mut SlotVisitor<'_>) -> Result<()> {
        visit_layer_slots(name, M::KIND, [(Slot::INPUT, &mut self.input_quantizer)], f)
    }

    fn lower(&self, name: &str, g: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let x = g.quantize(&join_name(name, Slot::INPUT.name), &self.input_quantizer, x)?;
        lower_op(&self.module, name, g, x)
    }
}

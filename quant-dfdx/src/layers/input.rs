//! `QuantInput<M>`: quantize the input of any module.

use dfdx::nn::tensor_collection::TensorCollection;
use dfdx::prelude::*;

use dfdx::nn::modules::{AccurateGeLU, AvgPoolGlobal, LayerNorm1D, MaxPoolGlobal};
use dfdx::tensor::CpuError;
use quant_core::dfdx_ops::{
    int_gelu, int_gelu_quantized, int_layer_norm, int_layer_norm_quantized, CodeGrid,
    DynQuantization,
};
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
        if let Some(quantization) = self.quantization_inside(&x)? {
            return self
                .module
                .forward_quantized(x, quantization, &self.input_quantizer);
        }
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
        if let Some(quantization) = self.quantization_inside(&x)? {
            return self
                .module
                .forward_quantized(x, quantization, &self.input_quantizer);
        }
        let x = self.input_quantizer.fake_quantize_mut(x)?;
        self.module.forward_on_grid(x, &self.input_quantizer)
    }
}

impl<M> QuantInput<M> {
    /// In training, for a layer that quantizes its input inside its own op
    /// ([`OnGrid::QUANTIZES_INSIDE`]), the input quantizer's op on `x`; `None` without a tape,
    /// for other layers, or where the quantizer runs no op of its own (disabled,
    /// unconfigured, Calibrating: it then observes or passes `x` through first).
    fn quantization_inside<S: Shape, T: Tape<f32, Cpu>>(
        &self,
        x: &Tensor<S, f32, Cpu, T>,
    ) -> Result<Option<DynQuantization>>
    where
        M: OnGrid<Tensor<S, f32, Cpu, T>>,
    {
        if !(T::OWNS_TAPE && M::QUANTIZES_INSIDE) {
            return Ok(None);
        }
        self.input_quantizer.quantization(x.shape())
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

    /// Whether the layer's op can quantize its input itself ([`Self::forward_quantized`]):
    /// in training, the quantized values then need no dfdx tensor and gradient of their own.
    const QUANTIZES_INSIDE: bool = false;

    /// The forward pass on `x` as `quantization` (`quantizer`'s op) quantizes it, inside the
    /// layer's op: the numbers of [`Self::forward_on_grid`] on `quantizer`'s output. Called
    /// only where [`Self::QUANTIZES_INSIDE`]; the default is an error saying so.
    ///
    /// # Errors
    /// The quantizer's or the layer's error.
    fn forward_quantized(
        &self,
        x: X,
        quantization: DynQuantization,
        quantizer: &TensorQuantizer<1>,
    ) -> Result<Self::Output> {
        let _ = (x, quantization, quantizer);
        Err(QuantError::InvalidValue {
            what: "OnGrid::forward_quantized".into(),
            value: "a layer without an op that quantizes its input".into(),
            expected: "a layer whose OnGrid::QUANTIZES_INSIDE is true".into(),
        })
    }
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
/// `$grid`), the float layer otherwise; `$quantized` the kernel's op with the input's
/// quantization `$q` inside it.
macro_rules! kernel_on_grid {
    ($([$($g:tt)*] $ty:ty => |$m:ident, $x:ident, $grid:ident| $kernel:expr,
        |$q:ident| $quantized:expr;)+) => {$(
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

            const QUANTIZES_INSIDE: bool = true;

            fn forward_quantized(
                &self,
                $x: Tensor<S, f32, Cpu, T>,
                $q: DynQuantization,
                quantizer: &TensorQuantizer<1>,
            ) -> Result<Self::Output> {
                let $m = self;
                match quantizer.code_grid()?.as_ref() {
                    Some($grid) => $quantized,
                    // A quantizer with an op has a grid; were it not so, its op then the layer.
                    None => Ok(self.try_forward(
                        $q.apply($x)?
                    )?),
                }
            }
        }
    )+};
}

kernel_on_grid!(
    [const M: usize,] LayerNorm1D<M, f32, Cpu> => |m, x, grid|
        int_layer_norm(x, &m.gamma, &m.beta, m.epsilon as f32, grid, true),
        |q| int_layer_norm_quantized(x, q, &m.gamma, &m.beta, m.epsilon as f32, grid, true);
    [const M: usize,] crate::nn::LayerNorm<M, f32, Cpu> => |m, x, grid|
        int_layer_norm(x, &m.gamma, &m.beta, m.epsilon as f32, grid, true),
        |q| int_layer_norm_quantized(x, q, &m.gamma, &m.beta, m.epsilon as f32, grid, true);
    [] AccurateGeLU => |_m, x, grid| int_gelu(x, &gelu_kernel(grid)?),
        |q| int_gelu_quantized(x, q, &gelu_kernel(grid)?);
    [] crate::nn::Gelu => |_m, x, grid| int_gelu(x, &gelu_kernel(grid)?),
        |q| int_gelu_quantized(x, q, &gelu_kernel(grid)?);
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

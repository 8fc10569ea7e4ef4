//! What the expansions of `#[derive(QuantizedLayer)]` and `#[derive(QuantizedModel)]` refer to.
//! Not public API: the macros emit paths into this module, so a user's crate needs no direct
//! dependency on dfdx's internals, num-traits or rand.

use std::any::Any;

use dfdx::nn::tensor_collection::{
    RecursiveWalker, TensorCollection, TensorOptions, TensorVisitor,
};
use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use rand::distributions::uniform::SampleUniform;

pub use dfdx;
pub use quant_core::{QuantError, QuantizationTarget, Result};

pub use crate::convert::{Convert, LayerKind};
pub use crate::layers::{
    fake_quantize_param, fake_quantize_param_mut, join_name, FakeQuantizer, LayerInput,
    QuantizedModule, QuantizerControl, Slot, SlotRef, TensorQuantizer,
};
pub use crate::lower::QuantizeNodes;
pub use quant_runtime::graph::{GraphBuilder, ValueId};
pub use quant_runtime::GraphError;

/// The bounds a dtype needs for the layers of a model written dfdx-style (generic over
/// `E: Dtype, D: Device<E>`): dfdx's `Linear` needs `Float`, every initialiser `SampleUniform`.
pub trait FloatDtype: Dtype + num_traits::Float + SampleUniform {}
impl<T: Dtype + num_traits::Float + SampleUniform> FloatDtype for T {}

/// Options of a tensor field of a derived layer: trained; reset like PyTorch's Linear and Conv
/// weights (uniform in `±1/sqrt(fan_in)`, `fan_in` the product of all dimensions but the first)
/// when of rank 2 or more, to zeros otherwise (biases, per-channel scales are set by the user).
pub fn param_options<S: ConstShape, E: Dtype + SampleUniform, D: Device<E>>(
) -> TensorOptions<S, E, D> {
    TensorOptions::reset_with(reset_param::<S, E, D>)
}

fn reset_param<S: ConstShape, E: Dtype + SampleUniform, D: Device<E>>(
    t: &mut Tensor<S, E, D>,
) -> std::result::Result<(), D::Err> {
    let dims = S::default().concrete();
    let dims = dims.as_ref();
    if dims.len() < 2 {
        return t.try_fill_with_zeros();
    }
    let fan_in: usize = dims[1..].iter().product();
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let zero = E::default();
    // Every float dtype represents the bound; the fallback keeps the range non-empty, which
    // `Uniform::new` requires.
    let b = match E::from_f64(bound) {
        Some(b) if b > zero => b,
        _ => E::ONE,
    };
    t.try_fill_with_distr(rand::distributions::Uniform::new(zero - b, b))
}

/// A field rebuilt by a `TensorCollection` visitor, as the concrete type `F` of a struct that is
/// not generic over the dtype and device: `Some` when the visitor built `F` itself (f32 on the
/// CPU) or `Some(F)` (a derived concrete struct, whose `To` is `Option<Self>`); `None` for
/// any other dtype or device, or a field that could not be built.
pub fn field<F: 'static, X: 'static>(x: X) -> Option<F> {
    let mut slot = Some(x);
    let any: &mut dyn Any = &mut slot;
    if let Some(f) = any.downcast_mut::<Option<F>>() {
        return f.take();
    }
    if let Some(f) = any.downcast_mut::<Option<Option<F>>>() {
        return f.take().flatten();
    }
    None
}

/// Builds a struct that is not generic over the dtype and device (its `To` is `Option<Self>`):
/// every tensor is allocated and reset by its options, as dfdx's `build_module` does.
///
/// # Errors
/// Allocation fails, or a field could not be rebuilt: a dfdx container (tuple, `Residual`, ...)
/// holding a derived concrete struct, whose `To` is not the container itself.
pub fn build<M>(dev: &Cpu) -> Result<M>
where
    M: TensorCollection<f32, Cpu> + 'static,
    M::To<f32, Cpu>: 'static,
{
    let built = M::iter_tensors(&mut RecursiveWalker {
        m: (),
        f: &mut Builder { dev },
    })?;
    built
        .and_then(field::<M, _>)
        .ok_or_else(|| QuantError::InvalidValue {
            what: "model".into(),
            value: std::any::type_name::<M>().into(),
            expected:
                "fields that dfdx's visitors can rebuild: a dfdx container (tuple, Residual, ...) \
                   holding a struct that is not generic over the dtype and device cannot be; \
                   build that part with its own `build` and assemble the model by hand"
                    .into(),
        })
}

struct Builder<'a> {
    dev: &'a Cpu,
}

impl TensorVisitor<f32, Cpu> for Builder<'_> {
    type Viewer = ();
    type Err = CpuError;
    type E2 = f32;
    type D2 = Cpu;

    fn visit<S: Shape>(
        &mut self,
        opts: TensorOptions<S, f32, Cpu>,
        _: (),
    ) -> std::result::Result<Option<Tensor<S, f32, Cpu>>, CpuError> {
        let mut t: Tensor<S, f32, Cpu> = self.dev.try_zeros_like(&opts.shape)?;
        (opts.reset)(&mut t)?;
        Ok(Some(t))
    }
}

/// A shape whose first dimension is `N`: what `#[quantized(weights, channels = N)]` requires of
/// its field.
#[diagnostic::on_unimplemented(
    message = "the first dimension of this weight is not `{N}`",
    label = "`channels = {N}` quantizes per channel along axis 0, so the field's shape must start with `Const<{N}>`"
)]
pub trait FirstDim<const N: usize> {}
impl<const N: usize> FirstDim<N> for (Const<N>,) {}
impl<const N: usize, B: Dim> FirstDim<N> for (Const<N>, B) {}
impl<const N: usize, B: Dim, C: Dim> FirstDim<N> for (Const<N>, B, C) {}
impl<const N: usize, B: Dim, C: Dim, D: Dim> FirstDim<N> for (Const<N>, B, C, D) {}
impl<const N: usize, B: Dim, C: Dim, D: Dim, E: Dim> FirstDim<N> for (Const<N>, B, C, D, E) {}
impl<const N: usize, B: Dim, C: Dim, D: Dim, E: Dim, F: Dim> FirstDim<N>
    for (Const<N>, B, C, D, E, F)
{
}

/// A tensor whose first dimension is `N`.
pub trait ChannelsFirst<const N: usize> {}
impl<const N: usize, S: Shape + FirstDim<N>, E, D: Storage<E>, T> ChannelsFirst<N>
    for Tensor<S, E, D, T>
{
}

/// Compiles only when `W`'s first dimension is `N`.
pub fn assert_channels<const N: usize, W: ChannelsFirst<N>>() {}

//! The residual connection `f(x) + x` with the add of [`quant_core::dfdx_ops::add`]: dfdx's
//! `Residual` bit for bit, without its strided binary kernels.

use dfdx::nn::tensor_collection::{ModuleVisitor, TensorCollection};
use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use quant_core::dfdx_ops::add;

/// `f(x) + x`: dfdx's `Residual` bit for bit (the output, and the gradients of the input and of
/// `f`'s parameters), its add in plain passes over the values (a float ViT's step spends about
/// 5% in dfdx's). A drop-in for it: the branch under the same name (`0`, so safetensors files
/// load either way), and it converts and quantizes as dfdx's does (an add layer).
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::Residual;
///
/// let dev = Cpu::default();
/// let x = dev.tensor([-3.0f32, -0.5, 0.0, 0.5, 3.0]);
/// let ours = Residual(ReLU).forward(x.clone());
/// let dfdx = dfdx::nn::modules::Residual(ReLU).forward(x);
/// assert_eq!(ours.as_vec(), dfdx.as_vec());
/// ```
#[derive(Debug, Default, Clone)]
pub struct Residual<F>(pub F);

impl<D: Device<E>, E: Dtype, F: BuildOnDevice<D, E>> BuildOnDevice<D, E> for Residual<F> {
    type Built = Residual<F::Built>;
}

impl<E: Dtype, D: Device<E>, F: TensorCollection<E, D>> TensorCollection<E, D> for Residual<F> {
    type To<E2: Dtype, D2: Device<E2>> = Residual<F::To<E2, D2>>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(Self::module("0", |s| &s.0, |s| &mut s.0), Residual)
    }
}

impl<S: Shape, T, F> Module<Tensor<S, f32, Cpu, T>> for Residual<F>
where
    T: Tape<f32, Cpu> + Merge<T>,
    F: Module<Tensor<S, f32, Cpu, T>, Output = Tensor<S, f32, Cpu, T>, Error = CpuError>,
{
    type Output = Tensor<S, f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        let y = self.0.try_forward(x.with_empty_tape())?;
        add(y, x).map_err(super::to_cpu_error)
    }
}

impl<S: Shape, T, F> ModuleMut<Tensor<S, f32, Cpu, T>> for Residual<F>
where
    T: Tape<f32, Cpu> + Merge<T>,
    F: ModuleMut<Tensor<S, f32, Cpu, T>, Output = Tensor<S, f32, Cpu, T>, Error = CpuError>,
{
    type Output = Tensor<S, f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward_mut(&mut self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        let y = self.0.try_forward_mut(x.with_empty_tape())?;
        add(y, x).map_err(super::to_cpu_error)
    }
}

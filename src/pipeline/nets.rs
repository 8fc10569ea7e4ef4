//! The networks of the main job, and what the pipeline needs to know about each.

use dfdx::prelude::*;

use quant_core::QuantError;
use quant_ops::convert::Quantize;
use quant_ops::export::Export;
use quant_ops::layers::QuantizedModule;

use super::config::ModelKind;
use super::train::{InputShape, Logits, Taped};

/// The MLP, as dfdx builders: 64-256-256-10 with ReLU.
pub type MlpBuilder = (
    dfdx::nn::builders::Linear<64, 256>,
    ReLU,
    dfdx::nn::builders::Linear<256, 256>,
    ReLU,
    dfdx::nn::builders::Linear<256, 10>,
);
/// The built MLP.
pub type Mlp = <MlpBuilder as BuildOnDevice<Cpu, f32>>::Built;
/// The quantized MLP.
pub type QMlp = <Mlp as Quantize>::Quantized;

/// A network of the main job: its float form, the float form prepared for quantization, and
/// its quantized twin.
pub trait Net {
    /// Which network.
    const KIND: ModelKind;
    /// The shape of an input batch.
    type Input: InputShape;
    /// The float network as trained.
    type Float: TensorCollection<f32, Cpu, To<f32, Cpu> = Self::Float>
        + Clone
        + ModuleMut<
            Tensor<Self::Input, f32, Cpu, Taped>,
            Output = Logits<Taped>,
            Error = dfdx::tensor::CpuError,
        > + Module<
            Tensor<Self::Input, f32, Cpu>,
            Output = Logits<NoneTape>,
            Error = dfdx::tensor::CpuError,
        >;
    /// The float network with everything folded that has no integer form (BatchNorm).
    type Deploy: Quantize<Quantized = Self::Quantized>
        + Module<
            Tensor<Self::Input, f32, Cpu>,
            Output = Logits<NoneTape>,
            Error = dfdx::tensor::CpuError,
        >;
    /// The quantized twin.
    type Quantized: TensorCollection<f32, Cpu>
        + Clone
        + QuantizedModule
        + Export
        + ModuleMut<Tensor<Self::Input, f32, Cpu, Taped>, Output = Logits<Taped>, Error = QuantError>
        + ModuleMut<Tensor<Self::Input, f32, Cpu>, Output = Logits<NoneTape>, Error = QuantError>
        + Module<Tensor<Self::Input, f32, Cpu>, Output = Logits<NoneTape>, Error = QuantError>;

    /// A freshly initialised float network (weights from `dev`'s seeded generator).
    fn build(dev: &Cpu) -> Self::Float;
    /// The float network prepared for quantization.
    fn deploy(float: &Self::Float) -> Self::Deploy;
}

/// The 64-256-256-10 MLP.
pub struct MlpNet;

impl Net for MlpNet {
    const KIND: ModelKind = ModelKind::Mlp;
    type Input = (usize, Const<64>);
    type Float = Mlp;
    type Deploy = Mlp;
    type Quantized = QMlp;

    fn build(dev: &Cpu) -> Mlp {
        dev.build_module::<MlpBuilder, f32>()
    }

    fn deploy(float: &Mlp) -> Mlp {
        float.clone()
    }
}

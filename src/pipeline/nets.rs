//! The networks of the main job, and what the pipeline needs to know about each.

use dfdx::prelude::*;

use quant_core::QuantError;
use quant_ops::convert::Convert;
/// BatchNorm folding, now in the library ([`quant_ops::fold`]).
pub use quant_ops::fold::fold_batchnorm;
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
pub type QMlp = <Mlp as Convert>::Quantized;

/// A network of the main job: its float form, the float form prepared for quantization, and
/// its quantized twin.
pub trait Net {
    /// Which network.
    const KIND: ModelKind;
    /// Shape of one input sample.
    const INPUT_SHAPE: &'static [usize];
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
    type Deploy: Convert<Quantized = Self::Quantized>
        + Module<
            Tensor<Self::Input, f32, Cpu>,
            Output = Logits<NoneTape>,
            Error = dfdx::tensor::CpuError,
        >;
    /// The quantized twin.
    type Quantized: TensorCollection<f32, Cpu>
        + Clone
        + QuantizedModule
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
    const INPUT_SHAPE: &'static [usize] = &[64];
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

/// The CNN, as builders: two stages of 3×3 convolution (padding 1), BatchNorm, ReLU and 2×2
/// max pooling (8×8 → 4×4 → 2×2), then a Linear head on the 128 features.
pub type CnnBuilder = (
    (
        quant_ops::nn::builders::Conv2d<1, 16, 3, 1, 1>,
        dfdx::nn::builders::BatchNorm2D<16>,
        ReLU,
        quant_ops::nn::MaxPool2d<2>,
    ),
    (
        quant_ops::nn::builders::Conv2d<16, 32, 3, 1, 1>,
        dfdx::nn::builders::BatchNorm2D<32>,
        ReLU,
        quant_ops::nn::MaxPool2d<2>,
    ),
    (
        quant_ops::nn::Flatten<128>,
        dfdx::nn::builders::Linear<128, 10>,
    ),
);
/// The built CNN.
pub type Cnn = <CnnBuilder as BuildOnDevice<Cpu, f32>>::Built;
/// The CNN with BatchNorm folded into the convolutions.
pub type FoldedCnn = (
    (
        quant_ops::nn::Conv2d<1, 16, 3, 1, 1>,
        ReLU,
        quant_ops::nn::MaxPool2d<2>,
    ),
    (
        quant_ops::nn::Conv2d<16, 32, 3, 1, 1>,
        ReLU,
        quant_ops::nn::MaxPool2d<2>,
    ),
    (
        quant_ops::nn::Flatten<128>,
        dfdx::nn::modules::Linear<128, 10, f32, Cpu>,
    ),
);
/// The quantized CNN.
pub type QCnn = <FoldedCnn as Convert>::Quantized;

/// The small CNN with BatchNorm.
pub struct CnnNet;

impl Net for CnnNet {
    const KIND: ModelKind = ModelKind::Cnn;
    const INPUT_SHAPE: &'static [usize] = &[1, 8, 8];
    type Input = (usize, Const<1>, Const<8>, Const<8>);
    type Float = Cnn;
    type Deploy = FoldedCnn;
    type Quantized = QCnn;

    fn build(dev: &Cpu) -> Cnn {
        dev.build_module::<CnnBuilder, f32>()
    }

    fn deploy(float: &Cnn) -> FoldedCnn {
        let ((c1, bn1, r1, p1), (c2, bn2, r2, p2), head) = float.clone();
        (
            (fold_batchnorm(&c1, &bn1), r1, p1),
            (fold_batchnorm(&c2, &bn2), r2, p2),
            head,
        )
    }
}

/// The residual CNN, as builders: a stem (3x3 conv to 16 channels, BatchNorm, ReLU), a residual
/// block on 16 channels whose branch is a depthwise 3x3 conv and a 1x1 conv (MobileNet's
/// separable convolution), a block down to 4x4 and 32 channels with a strided 1x1 projection
/// shortcut, global average pooling and a Linear head. Every convolution has its BatchNorm.
pub type ResnetBuilder = (
    (
        quant_ops::nn::builders::Conv2d<1, 16, 3, 1, 1>,
        dfdx::nn::builders::BatchNorm2D<16>,
        ReLU,
    ),
    (
        dfdx::nn::builders::Residual<(
            quant_ops::nn::builders::DepthwiseConv2d<16, 3, 1, 1>,
            dfdx::nn::builders::BatchNorm2D<16>,
            ReLU,
            quant_ops::nn::builders::Conv2d<16, 16, 1>,
            dfdx::nn::builders::BatchNorm2D<16>,
        )>,
        ReLU,
    ),
    (
        dfdx::nn::builders::GeneralizedResidual<
            (
                quant_ops::nn::builders::Conv2d<16, 32, 3, 2, 1>,
                dfdx::nn::builders::BatchNorm2D<32>,
                ReLU,
                quant_ops::nn::builders::Conv2d<32, 32, 3, 1, 1>,
                dfdx::nn::builders::BatchNorm2D<32>,
            ),
            (
                quant_ops::nn::builders::Conv2d<16, 32, 1, 2>,
                dfdx::nn::builders::BatchNorm2D<32>,
            ),
        >,
        ReLU,
    ),
    (
        dfdx::nn::builders::AvgPoolGlobal,
        dfdx::nn::builders::Linear<32, 10>,
    ),
);
/// The built residual CNN.
pub type Resnet = <ResnetBuilder as BuildOnDevice<Cpu, f32>>::Built;

type Conv<const I: usize, const O: usize, const K: usize, const S: usize = 1, const P: usize = 0> =
    quant_ops::nn::Conv2d<I, O, K, S, P, 1, I, f32, Cpu>;

/// The residual CNN with every BatchNorm folded into its convolution.
pub type FoldedResnet = (
    (Conv<1, 16, 3, 1, 1>, ReLU),
    (
        dfdx::nn::modules::Residual<(
            quant_ops::nn::DepthwiseConv2d<16, 3, 1, 1>,
            ReLU,
            Conv<16, 16, 1>,
        )>,
        ReLU,
    ),
    (
        dfdx::nn::modules::GeneralizedResidual<
            (Conv<16, 32, 3, 2, 1>, ReLU, Conv<32, 32, 3, 1, 1>),
            Conv<16, 32, 1, 2>,
        >,
        ReLU,
    ),
    (
        dfdx::nn::modules::AvgPoolGlobal,
        dfdx::nn::modules::Linear<32, 10, f32, Cpu>,
    ),
);
/// The quantized residual CNN.
pub type QResnet = <FoldedResnet as Convert>::Quantized;

/// The residual CNN.
pub struct ResnetNet;

impl Net for ResnetNet {
    const KIND: ModelKind = ModelKind::Resnet;
    const INPUT_SHAPE: &'static [usize] = &[1, 8, 8];
    type Input = (usize, Const<1>, Const<8>, Const<8>);
    type Float = Resnet;
    type Deploy = FoldedResnet;
    type Quantized = QResnet;

    fn build(dev: &Cpu) -> Resnet {
        dev.build_module::<ResnetBuilder, f32>()
    }

    fn deploy(float: &Resnet) -> FoldedResnet {
        let ((c0, bn0, r0), (block1, r1), (block2, r2), head) = float.clone();
        let (dw, bn_dw, relu, pw, bn_pw) = block1.0;
        let (c1, bn1, relu1, c2, bn2) = block2.f;
        let (proj, bn_proj) = block2.r;
        (
            (fold_batchnorm(&c0, &bn0), r0),
            (
                dfdx::nn::modules::Residual((
                    fold_batchnorm(&dw, &bn_dw),
                    relu,
                    fold_batchnorm(&pw, &bn_pw),
                )),
                r1,
            ),
            (
                dfdx::nn::modules::GeneralizedResidual {
                    f: (fold_batchnorm(&c1, &bn1), relu1, fold_batchnorm(&c2, &bn2)),
                    r: fold_batchnorm(&proj, &bn_proj),
                },
                r2,
            ),
            head,
        )
    }
}

/// The ViT's token width.
pub const VIT_WIDTH: usize = 48;
/// The width of the ViT's GeLU MLPs.
pub const VIT_HIDDEN: usize = 96;

/// One pre-norm encoder block of the ViT: LayerNorm, 4-head self-attention and a residual
/// add; LayerNorm, a GeLU MLP and a residual add.
pub type VitBlockBuilder = (
    dfdx::nn::builders::Residual<(
        dfdx::nn::builders::LayerNorm1D<VIT_WIDTH>,
        dfdx::nn::builders::MultiHeadAttention<VIT_WIDTH, 4>,
    )>,
    dfdx::nn::builders::Residual<(
        dfdx::nn::builders::LayerNorm1D<VIT_WIDTH>,
        dfdx::nn::builders::Linear<VIT_WIDTH, VIT_HIDDEN>,
        dfdx::nn::builders::AccurateGeLU,
        dfdx::nn::builders::Linear<VIT_HIDDEN, VIT_WIDTH>,
    )>,
);

/// The vision transformer, as builders: the 2x2 patches of the 8x8 image embedded by a
/// strided convolution (a 4x4 map of `VIT_WIDTH` channels), turned into 16 tokens with a learned
/// position embedding, three pre-norm encoder blocks, a final LayerNorm, the mean of the tokens
/// and a Linear head. No BatchNorm: the trained model is the one quantized.
pub type VitBuilder = (
    quant_ops::nn::builders::Conv2d<1, VIT_WIDTH, 2, 2, 0>,
    quant_ops::nn::builders::ImageTokens<VIT_WIDTH, 16>,
    VitBlockBuilder,
    VitBlockBuilder,
    VitBlockBuilder,
    (
        dfdx::nn::builders::LayerNorm1D<VIT_WIDTH>,
        quant_ops::nn::MeanTokens,
        dfdx::nn::builders::Linear<VIT_WIDTH, 10>,
    ),
);
/// The built vision transformer.
pub type Vit = <VitBuilder as BuildOnDevice<Cpu, f32>>::Built;
/// The quantized vision transformer.
pub type QVit = <Vit as Convert>::Quantized;

/// The small vision transformer.
pub struct VitNet;

impl Net for VitNet {
    const KIND: ModelKind = ModelKind::Vit;
    const INPUT_SHAPE: &'static [usize] = &[1, 8, 8];
    type Input = (usize, Const<1>, Const<8>, Const<8>);
    type Float = Vit;
    type Deploy = Vit;
    type Quantized = QVit;

    fn build(dev: &Cpu) -> Vit {
        dev.build_module::<VitBuilder, f32>()
    }

    fn deploy(float: &Vit) -> Vit {
        float.clone()
    }
}

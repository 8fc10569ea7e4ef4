//! The networks `quant run` trains (`[model] kind`), each sized for the data: the 8x8 digits
//! (64 values a sample) or 28x28 images (784 values: MNIST, Fashion-MNIST). Each is a
//! [`Model`] like any model of your own, run by [`run_model`].

use dfdx::prelude::*;

use quant_dfdx::convert::Convert;
/// BatchNorm folding, now in the library ([`quant_dfdx::fold`]).
pub use quant_dfdx::fold::fold_batchnorm;
use quant_dfdx::nn::Relu;

use super::config::{ModelKind, RunConfig};
use super::model::{BatchShape, DeployModel, FloatModel, Model};
use super::{run_model, RunError, RunOptions, SeedDone, StagedRun};
use crate::data::{DataError, Dataset};

/// A batch of 8x8 one-channel images.
pub type Digits8x8 = (usize, Const<1>, Const<8>, Const<8>);
/// A batch of 28x28 one-channel images.
pub type Images28x28 = (usize, Const<1>, Const<28>, Const<28>);

/// The MLP, as dfdx builders: 64-256-256-10 with ReLU.
pub type MlpBuilder = (
    quant_dfdx::nn::builders::Linear<64, 256>,
    Relu,
    quant_dfdx::nn::builders::Linear<256, 256>,
    Relu,
    quant_dfdx::nn::builders::Linear<256, 10>,
);
/// The built MLP.
pub type Mlp = <MlpBuilder as BuildOnDevice<Cpu, f32>>::Built;
/// The quantized MLP.
pub type QMlp = <Mlp as Convert>::Quantized;

/// The digits MLP, 64-256-256-10.
pub fn mlp() -> Model<(usize, Const<64>), 10, Mlp> {
    Model::new("mlp", |dev| dev.build_module::<MlpBuilder, f32>())
}

/// The CNN, as builders: two stages of 3×3 convolution (padding 1), BatchNorm, ReLU and 2×2
/// max pooling (8×8 → 4×4 → 2×2), then a Linear head on the 128 features.
pub type CnnBuilder = (
    (
        quant_dfdx::nn::builders::Conv2d<1, 16, 3, 1, 1>,
        quant_dfdx::nn::builders::BatchNorm2d<16>,
        Relu,
        quant_dfdx::nn::MaxPool2d<2>,
    ),
    (
        quant_dfdx::nn::builders::Conv2d<16, 32, 3, 1, 1>,
        quant_dfdx::nn::builders::BatchNorm2d<32>,
        Relu,
        quant_dfdx::nn::MaxPool2d<2>,
    ),
    (
        quant_dfdx::nn::Flatten<128>,
        quant_dfdx::nn::builders::Linear<128, 10>,
    ),
);
/// The built CNN.
pub type Cnn = <CnnBuilder as BuildOnDevice<Cpu, f32>>::Built;
/// The CNN with BatchNorm folded into the convolutions.
pub type FoldedCnn = (
    (
        quant_dfdx::nn::Conv2d<1, 16, 3, 1, 1>,
        Relu,
        quant_dfdx::nn::MaxPool2d<2>,
    ),
    (
        quant_dfdx::nn::Conv2d<16, 32, 3, 1, 1>,
        Relu,
        quant_dfdx::nn::MaxPool2d<2>,
    ),
    (
        quant_dfdx::nn::Flatten<128>,
        quant_dfdx::nn::Linear<128, 10>,
    ),
);
/// The quantized CNN.
pub type QCnn = <FoldedCnn as Convert>::Quantized;

/// The digits CNN, BatchNorm folded into the convolutions before quantization.
pub fn cnn() -> Model<Digits8x8, 10, Cnn, FoldedCnn> {
    Model::new("cnn", |dev| dev.build_module::<CnnBuilder, f32>()).with_deploy(|float: &Cnn| {
        let ((c1, bn1, r1, p1), (c2, bn2, r2, p2), head) = float.clone();
        (
            (fold_batchnorm(&c1, &bn1), r1, p1),
            (fold_batchnorm(&c2, &bn2), r2, p2),
            head,
        )
    })
}

/// The residual CNN, as builders: a stem (3x3 conv to 16 channels, BatchNorm, ReLU), a residual
/// block on 16 channels whose branch is a depthwise 3x3 conv and a 1x1 conv (MobileNet's
/// separable convolution), a block down to 4x4 and 32 channels with a strided 1x1 projection
/// shortcut, global average pooling and a Linear head. Every convolution has its BatchNorm.
pub type ResnetBuilder = (
    (
        quant_dfdx::nn::builders::Conv2d<1, 16, 3, 1, 1>,
        quant_dfdx::nn::builders::BatchNorm2d<16>,
        Relu,
    ),
    (
        dfdx::nn::builders::Residual<(
            quant_dfdx::nn::builders::DepthwiseConv2d<16, 3, 1, 1>,
            quant_dfdx::nn::builders::BatchNorm2d<16>,
            Relu,
            quant_dfdx::nn::builders::Conv2d<16, 16, 1>,
            quant_dfdx::nn::builders::BatchNorm2d<16>,
        )>,
        Relu,
    ),
    (
        dfdx::nn::builders::GeneralizedResidual<
            (
                quant_dfdx::nn::builders::Conv2d<16, 32, 3, 2, 1>,
                quant_dfdx::nn::builders::BatchNorm2d<32>,
                Relu,
                quant_dfdx::nn::builders::Conv2d<32, 32, 3, 1, 1>,
                quant_dfdx::nn::builders::BatchNorm2d<32>,
            ),
            (
                quant_dfdx::nn::builders::Conv2d<16, 32, 1, 2>,
                quant_dfdx::nn::builders::BatchNorm2d<32>,
            ),
        >,
        Relu,
    ),
    (
        dfdx::nn::builders::AvgPoolGlobal,
        quant_dfdx::nn::builders::Linear<32, 10>,
    ),
);
/// The built residual CNN.
pub type Resnet = <ResnetBuilder as BuildOnDevice<Cpu, f32>>::Built;

type Conv<const I: usize, const O: usize, const K: usize, const S: usize = 1, const P: usize = 0> =
    quant_dfdx::nn::Conv2d<I, O, K, S, P, 1, I, f32, Cpu>;

/// The residual CNN with every BatchNorm folded into its convolution.
pub type FoldedResnet = (
    (Conv<1, 16, 3, 1, 1>, Relu),
    (
        dfdx::nn::modules::Residual<(
            quant_dfdx::nn::DepthwiseConv2d<16, 3, 1, 1>,
            Relu,
            Conv<16, 16, 1>,
        )>,
        Relu,
    ),
    (
        dfdx::nn::modules::GeneralizedResidual<
            (Conv<16, 32, 3, 2, 1>, Relu, Conv<32, 32, 3, 1, 1>),
            Conv<16, 32, 1, 2>,
        >,
        Relu,
    ),
    (
        dfdx::nn::modules::AvgPoolGlobal,
        quant_dfdx::nn::Linear<32, 10>,
    ),
);
/// The quantized residual CNN.
pub type QResnet = <FoldedResnet as Convert>::Quantized;

/// The digits residual CNN, every BatchNorm folded into its convolution.
pub fn resnet() -> Model<Digits8x8, 10, Resnet, FoldedResnet> {
    Model::new("resnet", |dev| dev.build_module::<ResnetBuilder, f32>()).with_deploy(
        |float: &Resnet| {
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
        },
    )
}

/// The ViT's token width.
pub const VIT_WIDTH: usize = 48;
/// The width of the ViT's GeLU MLPs.
pub const VIT_HIDDEN: usize = 96;

/// One pre-norm encoder block of the ViT: LayerNorm, 4-head self-attention and a residual
/// add; LayerNorm, a GeLU MLP and a residual add. The GeLU is [`quant_dfdx::nn::Gelu`]:
/// dfdx's `AccurateGeLU` bit for bit, vectorised; the LayerNorm [`quant_dfdx::nn::LayerNorm`],
/// dfdx's `LayerNorm1D` bit for bit, fused; the residuals [`quant_dfdx::nn::Residual`], dfdx's
/// `Residual` bit for bit, in plain passes.
pub type VitBlockBuilder = (
    quant_dfdx::nn::builders::Residual<(
        quant_dfdx::nn::builders::LayerNorm<VIT_WIDTH>,
        quant_dfdx::nn::builders::MultiHeadAttention<VIT_WIDTH, 4>,
    )>,
    quant_dfdx::nn::builders::Residual<(
        quant_dfdx::nn::builders::LayerNorm<VIT_WIDTH>,
        quant_dfdx::nn::builders::Linear<VIT_WIDTH, VIT_HIDDEN>,
        quant_dfdx::nn::builders::Gelu,
        quant_dfdx::nn::builders::Linear<VIT_HIDDEN, VIT_WIDTH>,
    )>,
);

/// The vision transformer, as builders: the 2x2 patches of the 8x8 image embedded by a
/// strided convolution (a 4x4 map of `VIT_WIDTH` channels), turned into 16 tokens with a learned
/// position embedding, three pre-norm encoder blocks, a final LayerNorm, the mean of the tokens
/// and a Linear head. No BatchNorm: the trained model is the one quantized.
pub type VitBuilder = (
    quant_dfdx::nn::builders::Conv2d<1, VIT_WIDTH, 2, 2, 0>,
    quant_dfdx::nn::builders::ImageTokens<VIT_WIDTH, 16>,
    VitBlockBuilder,
    VitBlockBuilder,
    VitBlockBuilder,
    (
        quant_dfdx::nn::builders::LayerNorm<VIT_WIDTH>,
        quant_dfdx::nn::MeanTokens,
        quant_dfdx::nn::builders::Linear<VIT_WIDTH, 10>,
    ),
);
/// The built vision transformer.
pub type Vit = <VitBuilder as BuildOnDevice<Cpu, f32>>::Built;
/// The quantized vision transformer.
pub type QVit = <Vit as Convert>::Quantized;

/// The digits vision transformer (no BatchNorm: the trained model is the one quantized).
pub fn vit() -> Model<Digits8x8, 10, Vit> {
    Model::new("vit", |dev| dev.build_module::<VitBuilder, f32>())
}

// ----- 28x28 images (MNIST, Fashion-MNIST) ------------------------------------------------------

/// The 28x28 MLP, as dfdx builders: 784-256-256-10 with ReLU.
pub type Mlp784Builder = (
    quant_dfdx::nn::builders::Linear<784, 256>,
    Relu,
    quant_dfdx::nn::builders::Linear<256, 256>,
    Relu,
    quant_dfdx::nn::builders::Linear<256, 10>,
);
/// The built 28x28 MLP.
pub type Mlp784 = <Mlp784Builder as BuildOnDevice<Cpu, f32>>::Built;

/// The MLP for 28x28 images, 784-256-256-10.
pub fn mlp_784() -> Model<(usize, Const<784>), 10, Mlp784> {
    Model::new("mlp-784", |dev| dev.build_module::<Mlp784Builder, f32>())
}

/// One convolution stage as builders: a 3x3 convolution (padding 1), BatchNorm, ReLU, 2x2 max
/// pooling.
pub type ConvStageBuilder<const I: usize, const O: usize> = (
    quant_dfdx::nn::builders::Conv2d<I, O, 3, 1, 1>,
    quant_dfdx::nn::builders::BatchNorm2d<O>,
    Relu,
    quant_dfdx::nn::MaxPool2d<2>,
);
/// A built convolution stage.
pub type ConvStage<const I: usize, const O: usize> =
    <ConvStageBuilder<I, O> as BuildOnDevice<Cpu, f32>>::Built;
/// A convolution stage with its BatchNorm folded.
pub type FoldedConvStage<const I: usize, const O: usize> =
    (Conv<I, O, 3, 1, 1>, Relu, quant_dfdx::nn::MaxPool2d<2>);

/// Folds a convolution stage's BatchNorm into its convolution.
pub fn fold_conv_stage<const I: usize, const O: usize>(
    (conv, bn, relu, pool): &ConvStage<I, O>,
) -> FoldedConvStage<I, O> {
    (fold_batchnorm(conv, bn), *relu, *pool)
}

/// The 28x28 CNN, as builders: three convolution stages of 16, 32 and 64 channels (28 → 14 →
/// 7 → 3), then a Linear head on the 576 features.
pub type Cnn28Builder = (
    ConvStageBuilder<1, 16>,
    ConvStageBuilder<16, 32>,
    ConvStageBuilder<32, 64>,
    (
        quant_dfdx::nn::Flatten<576>,
        quant_dfdx::nn::builders::Linear<576, 10>,
    ),
);
/// The built 28x28 CNN.
pub type Cnn28 = <Cnn28Builder as BuildOnDevice<Cpu, f32>>::Built;
/// The 28x28 CNN with BatchNorm folded.
pub type FoldedCnn28 = (
    FoldedConvStage<1, 16>,
    FoldedConvStage<16, 32>,
    FoldedConvStage<32, 64>,
    (
        quant_dfdx::nn::Flatten<576>,
        quant_dfdx::nn::Linear<576, 10>,
    ),
);

/// The CNN for 28x28 images: three conv-BatchNorm-ReLU-maxpool stages of 16, 32 and 64
/// channels and a Linear head, BatchNorm folded before quantization.
pub fn cnn_28() -> Model<Images28x28, 10, Cnn28, FoldedCnn28> {
    Model::new("cnn-28x28", |dev| dev.build_module::<Cnn28Builder, f32>()).with_deploy(
        |(s1, s2, s3, head): &Cnn28| {
            (
                fold_conv_stage(s1),
                fold_conv_stage(s2),
                fold_conv_stage(s3),
                head.clone(),
            )
        },
    )
}

/// A basic residual block as builders (ResNet's): two 3x3 convolutions with BatchNorm around
/// a ReLU, the identity added, then a ReLU.
pub type BasicBlockBuilder<const C: usize> = (
    dfdx::nn::builders::Residual<(
        quant_dfdx::nn::builders::Conv2d<C, C, 3, 1, 1>,
        quant_dfdx::nn::builders::BatchNorm2d<C>,
        Relu,
        quant_dfdx::nn::builders::Conv2d<C, C, 3, 1, 1>,
        quant_dfdx::nn::builders::BatchNorm2d<C>,
    )>,
    Relu,
);
/// A built basic block.
pub type BasicBlock<const C: usize> = <BasicBlockBuilder<C> as BuildOnDevice<Cpu, f32>>::Built;
/// A basic block with its BatchNorms folded.
pub type FoldedBasicBlock<const C: usize> = (
    dfdx::nn::modules::Residual<(Conv<C, C, 3, 1, 1>, Relu, Conv<C, C, 3, 1, 1>)>,
    Relu,
);

/// A downsampling residual block as builders: the basic block's branch with a first
/// convolution of stride 2 to `O` channels, and a strided 1x1 projection (with BatchNorm) as
/// the shortcut.
pub type DownBlockBuilder<const I: usize, const O: usize> = (
    dfdx::nn::builders::GeneralizedResidual<
        (
            quant_dfdx::nn::builders::Conv2d<I, O, 3, 2, 1>,
            quant_dfdx::nn::builders::BatchNorm2d<O>,
            Relu,
            quant_dfdx::nn::builders::Conv2d<O, O, 3, 1, 1>,
            quant_dfdx::nn::builders::BatchNorm2d<O>,
        ),
        (
            quant_dfdx::nn::builders::Conv2d<I, O, 1, 2>,
            quant_dfdx::nn::builders::BatchNorm2d<O>,
        ),
    >,
    Relu,
);
/// A built downsampling block.
pub type DownBlock<const I: usize, const O: usize> =
    <DownBlockBuilder<I, O> as BuildOnDevice<Cpu, f32>>::Built;
/// A downsampling block with its BatchNorms folded.
pub type FoldedDownBlock<const I: usize, const O: usize> = (
    dfdx::nn::modules::GeneralizedResidual<
        (Conv<I, O, 3, 2, 1>, Relu, Conv<O, O, 3, 1, 1>),
        Conv<I, O, 1, 2>,
    >,
    Relu,
);

/// Folds a basic block's BatchNorms.
pub fn fold_basic_block<const C: usize>((block, out): &BasicBlock<C>) -> FoldedBasicBlock<C> {
    let (c1, bn1, relu, c2, bn2) = &block.0;
    (
        dfdx::nn::modules::Residual((fold_batchnorm(c1, bn1), *relu, fold_batchnorm(c2, bn2))),
        *out,
    )
}

/// Folds a downsampling block's BatchNorms.
pub fn fold_down_block<const I: usize, const O: usize>(
    (block, out): &DownBlock<I, O>,
) -> FoldedDownBlock<I, O> {
    let (c1, bn1, relu, c2, bn2) = &block.f;
    let (proj, bn_proj) = &block.r;
    (
        dfdx::nn::modules::GeneralizedResidual {
            f: (fold_batchnorm(c1, bn1), *relu, fold_batchnorm(c2, bn2)),
            r: fold_batchnorm(proj, bn_proj),
        },
        *out,
    )
}

/// The 28x28 ResNet, as builders: a stride-2 stem (3x3 to 16 channels, 28 → 14), two basic
/// blocks at 16 channels, blocks down to 32 (7x7) and 64 channels (4x4) at stride 2, global
/// average pooling and a Linear head.
pub type Resnet28Builder = (
    (
        quant_dfdx::nn::builders::Conv2d<1, 16, 3, 2, 1>,
        quant_dfdx::nn::builders::BatchNorm2d<16>,
        Relu,
    ),
    BasicBlockBuilder<16>,
    BasicBlockBuilder<16>,
    DownBlockBuilder<16, 32>,
    DownBlockBuilder<32, 64>,
    (
        dfdx::nn::builders::AvgPoolGlobal,
        quant_dfdx::nn::builders::Linear<64, 10>,
    ),
);
/// The built 28x28 ResNet.
pub type Resnet28 = <Resnet28Builder as BuildOnDevice<Cpu, f32>>::Built;
/// The 28x28 ResNet with every BatchNorm folded.
pub type FoldedResnet28 = (
    (Conv<1, 16, 3, 2, 1>, Relu),
    FoldedBasicBlock<16>,
    FoldedBasicBlock<16>,
    FoldedDownBlock<16, 32>,
    FoldedDownBlock<32, 64>,
    (
        dfdx::nn::modules::AvgPoolGlobal,
        quant_dfdx::nn::Linear<64, 10>,
    ),
);

/// The ResNet for 28x28 images, every BatchNorm folded before quantization; its four residual
/// adds quantized with both inputs on one grid.
pub fn resnet_28() -> Model<Images28x28, 10, Resnet28, FoldedResnet28> {
    Model::new("resnet-28x28", |dev| {
        dev.build_module::<Resnet28Builder, f32>()
    })
    .with_deploy(|((stem, bn, relu), b1, b2, b3, b4, head): &Resnet28| {
        (
            (fold_batchnorm(stem, bn), *relu),
            fold_basic_block(b1),
            fold_basic_block(b2),
            fold_down_block(b3),
            fold_down_block(b4),
            head.clone(),
        )
    })
}

/// The 28x28 ViT's token width.
pub const VIT28_WIDTH: usize = 64;
/// The width of the 28x28 ViT's GeLU MLPs.
pub const VIT28_HIDDEN: usize = 128;

/// One pre-norm encoder block of the 28x28 ViT (4 heads).
pub type Vit28BlockBuilder = (
    quant_dfdx::nn::builders::Residual<(
        quant_dfdx::nn::builders::LayerNorm<VIT28_WIDTH>,
        quant_dfdx::nn::builders::MultiHeadAttention<VIT28_WIDTH, 4>,
    )>,
    quant_dfdx::nn::builders::Residual<(
        quant_dfdx::nn::builders::LayerNorm<VIT28_WIDTH>,
        quant_dfdx::nn::builders::Linear<VIT28_WIDTH, VIT28_HIDDEN>,
        quant_dfdx::nn::builders::Gelu,
        quant_dfdx::nn::builders::Linear<VIT28_HIDDEN, VIT28_WIDTH>,
    )>,
);

/// The 28x28 vision transformer, as builders: the 7x7 patches embedded by a strided
/// convolution (a 4x4 map of 64 channels), 16 tokens with a learned position embedding, four
/// pre-norm encoder blocks (4-head attention, GeLU MLP 64-128-64), LayerNorm, the mean of the
/// tokens and a Linear head.
pub type Vit28Builder = (
    quant_dfdx::nn::builders::Conv2d<1, VIT28_WIDTH, 7, 7, 0>,
    quant_dfdx::nn::builders::ImageTokens<VIT28_WIDTH, 16>,
    (
        Vit28BlockBuilder,
        Vit28BlockBuilder,
        Vit28BlockBuilder,
        Vit28BlockBuilder,
    ),
    (
        quant_dfdx::nn::builders::LayerNorm<VIT28_WIDTH>,
        quant_dfdx::nn::MeanTokens,
        quant_dfdx::nn::builders::Linear<VIT28_WIDTH, 10>,
    ),
);
/// The built 28x28 vision transformer.
pub type Vit28 = <Vit28Builder as BuildOnDevice<Cpu, f32>>::Built;

/// The vision transformer for 28x28 images.
pub fn vit_28() -> Model<Images28x28, 10, Vit28> {
    Model::new("vit-28x28", |dev| dev.build_module::<Vit28Builder, f32>())
}

/// Something done with whichever bundled network a run file names, sized for the data: what
/// [`with_bundled`] calls with the network as a [`Model`] like any model of your own.
pub trait BundledTask {
    /// What the task gives.
    type Output;

    /// Does the task with `model`.
    ///
    /// # Errors
    /// Whatever the task fails with.
    fn run<S, const C: usize, F, D>(
        self,
        model: &Model<S, C, F, D>,
    ) -> Result<Self::Output, RunError>
    where
        S: BatchShape,
        F: FloatModel<S, C>,
        D: DeployModel<S, C>;
}

/// Calls `task` with the bundled network `kind`, sized for `data`: 8x8 images (64 values a
/// sample, the digits) or 28x28 (784 values, MNIST and Fashion-MNIST).
///
/// # Errors
/// Data of another size (the error points to [`run_model`] for models of your own); the
/// task's errors.
pub fn with_bundled<T: BundledTask>(
    kind: ModelKind,
    data: &Dataset,
    task: T,
) -> Result<T::Output, RunError> {
    match (kind, data.train.sample_len()) {
        (ModelKind::Mlp, 64) => task.run(&mlp()),
        (ModelKind::Cnn, 64) => task.run(&cnn()),
        (ModelKind::Resnet, 64) => task.run(&resnet()),
        (ModelKind::Vit, 64) => task.run(&vit()),
        (ModelKind::Mlp, 784) => task.run(&mlp_784()),
        (ModelKind::Cnn, 784) => task.run(&cnn_28()),
        (ModelKind::Resnet, 784) => task.run(&resnet_28()),
        (ModelKind::Vit, 784) => task.run(&vit_28()),
        (_, n) => Err(DataError::Unusable {
            origin: data.origin.clone(),
            message: format!(
                "samples of shape {:?} ({n} values); quant run's `{kind}` comes in two sizes: 8x8 images (64 values, the digits) and 28x28 (784 values, MNIST and Fashion-MNIST). For other data, define your model and run it with quant::pipeline::run_model",
                data.train.shape()
            ),
        }
        .into()),
    }
}

/// Runs the pipeline ([`run_model`]) on the bundled network `kind`, sized for `data`.
///
/// # Errors
/// See [`with_bundled`] and [`run_model`].
pub fn run_bundled(
    kind: ModelKind,
    cfg: &RunConfig,
    opts: &RunOptions,
    data: &Dataset,
    on_seed: &mut (dyn FnMut(SeedDone<'_>) + Send),
) -> Result<StagedRun, RunError> {
    struct Run<'a> {
        cfg: &'a RunConfig,
        opts: &'a RunOptions,
        data: &'a Dataset,
        on_seed: &'a mut (dyn FnMut(SeedDone<'_>) + Send),
    }
    impl BundledTask for Run<'_> {
        type Output = StagedRun;
        fn run<S, const C: usize, F, D>(
            self,
            model: &Model<S, C, F, D>,
        ) -> Result<StagedRun, RunError>
        where
            S: BatchShape,
            F: FloatModel<S, C>,
            D: DeployModel<S, C>,
        {
            run_model(self.cfg, self.opts, self.data, model, self.on_seed)
        }
    }
    with_bundled(
        kind,
        data,
        Run {
            cfg,
            opts,
            data,
            on_seed,
        },
    )
}

//! Float layers dfdx 0.13 only has behind its `nightly` feature: 2-D convolution, max and
//! average pooling, and flattening, implemented on stable Rust for `f32` on the CPU; and the
//! two a vision transformer needs around its attention ([`ImageTokens`], [`MeanTokens`]);
//! and [`Linear`], [`MultiHeadAttention`], [`BatchNorm2d`], [`Gelu`], [`LayerNorm`],
//! [`Residual`] and [`Relu`], dfdx's `Linear`, `MultiHeadAttention` (self-attention),
//! `BatchNorm2D`, `AccurateGeLU`, `LayerNorm1D`, `Residual` and `ReLU` bit for bit but batched,
//! fused, vectorised or split across threads (each of the first five takes a sixth or more off a
//! float ViT's or CNN's training step, the last two a few percent).
//!
//! Two layers of API:
//!
//! - functional ops ([`conv2d`], [`max_pool2d`], [`avg_pool2d`], [`flatten()`]) that take
//!   kernel, stride and padding at run time, work with any tape, record a hand-written
//!   backward pass, and return a [`QuantError`] that says what was
//!   wrong with a shape and what is valid;
//! - dfdx modules ([`Conv2d`], [`MaxPool2d`], [`AvgPool2d`], [`Flatten`]) with the geometry in
//!   const generics, which compose with dfdx's layers in tuples, train with dfdx optimizers and
//!   save/load with safetensors. Their `Error` is dfdx's `CpuError`, like every dfdx layer's,
//!   because a tuple of modules needs a single error type.
//!
//! Images are NCHW, `(batch, channels, height, width)`, with the channel count a type-level
//! constant and the other dimensions anything (`usize` or `Const`). Spatial output sizes are
//! run-time `usize`s.
//!
//! ```
//! use dfdx::optim::Adam;
//! use dfdx::prelude::*;
//! use quant_dfdx::nn::builders as qnn;
//!
//! type Cnn = (
//!     qnn::Conv2d<1, 8, 3, 1, 1>,
//!     BatchNorm2D<8>,
//!     ReLU,
//!     qnn::MaxPool2d<2>,
//!     qnn::Flatten<128>,
//!     Linear<128, 10>,
//! );
//! let dev = Cpu::default();
//! let mut model = dev.build_module::<Cnn, f32>();
//! let mut opt = Adam::new(&model, AdamConfig::default());
//! let x: Tensor<Rank4<4, 1, 8, 8>, f32, _> = dev.sample_normal();
//! let y: Tensor<Rank2<4, 10>, f32, _> = dev.sample_normal();
//!
//! let grads = model.alloc_grads();
//! let logits = model.forward_mut(x.trace(grads));
//! let grads = mse_loss(logits, y).backward();
//! opt.update(&mut model, &grads).unwrap();
//! ```

/// The dfdx module impls of a zero-sized, parameter-free layer `$layer` whose forward pass is
/// the op `$op` on a tensor of any shape (GELU, ReLU).
macro_rules! elementwise_layer {
    ($layer:ty, $op:path) => {
        impl dfdx::nn::ZeroSizedModule for $layer {}
        impl dfdx::nn::NonMutableModule for $layer {}

        impl<S: dfdx::shapes::Shape, T: dfdx::tensor::Tape<f32, dfdx::tensor::Cpu>>
            dfdx::nn::Module<dfdx::tensor::Tensor<S, f32, dfdx::tensor::Cpu, T>> for $layer
        {
            type Output = dfdx::tensor::Tensor<S, f32, dfdx::tensor::Cpu, T>;
            type Error = dfdx::tensor::CpuError;

            fn try_forward(
                &self,
                x: dfdx::tensor::Tensor<S, f32, dfdx::tensor::Cpu, T>,
            ) -> Result<Self::Output, Self::Error> {
                $op(x).map_err($crate::nn::to_cpu_error)
            }
        }
    };
}

mod attention;
mod batch_norm;
mod conv;
mod flatten;
mod gelu;
mod layer_norm;
mod linear;
mod pool;
mod relu;
mod residual;
mod tape;
mod tokens;
mod window;

use dfdx::tensor::CpuError;
use quant_core::QuantError;

pub use attention::MultiHeadAttention;
pub use attention::{attention_context, attention_scores, HeadScores};
pub use batch_norm::{batch_norm2d_inference, batch_norm2d_training, BatchNorm2d};
pub use conv::{conv2d, conv2d_grouped, Conv2d, DepthwiseConv2d};
pub use flatten::{flatten, Flatten, ImageBatch};
pub use gelu::{gelu, Gelu};
pub use layer_norm::{layer_norm, LayerNorm};
pub use linear::{linear, Linear, LinearInput};
pub use pool::{avg_pool2d, max_pool2d, AvgPool2d, MaxPool2d};
pub use relu::{relu, Relu};
pub use residual::Residual;
pub use tokens::{ImageTokens, MeanTokens, Tokens};

/// A batch of `C`-channel feature maps with run-time height and width, as [`conv2d`] and the
/// pooling ops produce: `(batch, C, height, width)`.
pub type FeatureMaps<B, const C: usize, T> =
    dfdx::tensor::Tensor<(B, dfdx::shapes::Const<C>, usize, usize), f32, dfdx::tensor::Cpu, T>;

/// A batch of `N`-wide feature vectors, as [`flatten()`] produces: `(batch, N)`.
pub type Features<B, const N: usize, T> =
    dfdx::tensor::Tensor<(B, dfdx::shapes::Const<N>), f32, dfdx::tensor::Cpu, T>;

/// What to name in `dev.build_module::<M, f32>()`, like dfdx's `nn::builders`: the
/// convolution's builder, and the zero-sized layers (which build themselves).
pub mod builders {
    pub use super::attention::builder::MultiHeadAttention;
    pub use super::batch_norm::builder::BatchNorm2d;
    pub use super::conv::builder::{Conv2d, DepthwiseConv2d};
    pub use super::flatten::Flatten;
    pub use super::gelu::Gelu;
    pub use super::layer_norm::builder::LayerNorm;
    pub use super::linear::builder::Linear;
    pub use super::pool::{AvgPool2d, MaxPool2d};
    pub use super::relu::Relu;
    pub use super::residual::Residual;
    pub use super::tokens::builder::ImageTokens;
    pub use super::tokens::MeanTokens;
}

/// The `CpuError` a module reports for an op's error: allocation failures stay
/// `OutOfMemory`; everything else is a shape problem, `WrongNumElements`.
fn to_cpu_error(e: QuantError) -> CpuError {
    match e.root() {
        QuantError::Device(msg) if *msg == CpuError::OutOfMemory.to_string() => {
            CpuError::OutOfMemory
        }
        _ => CpuError::WrongNumElements,
    }
}

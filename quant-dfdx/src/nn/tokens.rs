//! The two pieces a vision transformer needs around dfdx's attention: feature maps turned into
//! a sequence of tokens with a learned position embedding, and the mean of a sequence's tokens.
//!
//! With a convolution whose kernel and stride are the patch size in front (the usual ViT patch
//! embedding), `ImageTokens` makes one token per patch:
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_dfdx::nn::builders as qnn;
//!
//! const D: usize = 16;
//! type Vit = (
//!     qnn::Conv2d<1, D, 2, 2, 0>,  // 2x2 patches of an 8x8 image: a 4x4 map of D channels
//!     qnn::ImageTokens<D, 16>,     // 16 tokens of D features, plus their positions
//!     Residual<(LayerNorm1D<D>, MultiHeadAttention<D, 2>)>,
//!     (LayerNorm1D<D>, qnn::MeanTokens, Linear<D, 10>),
//! );
//! let dev = Cpu::default();
//! let vit = dev.build_module::<Vit, f32>();
//! let x: Tensor<Rank4<3, 1, 8, 8>, f32, _> = dev.sample_normal();
//! let logits = vit.forward(x.reshape_like(&(3usize, Const::<1>, Const::<8>, Const::<8>)));
//! assert_eq!(logits.shape().concrete(), [3, 10]);
//! ```

use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::Device;
use rand_distr::uniform::SampleUniform;

/// A batch of `N` tokens of `C` features each: `(batch, N, C)`.
pub type Tokens<B, const N: usize, const C: usize, T> =
    Tensor<(B, Const<N>, Const<C>), f32, Cpu, T>;

/// Turns `(batch, C, h, w)` feature maps with `h·w = N` into `(batch, N, C)` tokens (token
/// `y·w + x` holds the `C` channels at `(y, x)`) and adds a learned position embedding
/// `position[N, C]`, initialised uniform in `±0.02`.
///
/// A map of another size is `CpuError::WrongNumElements`, as for [`Flatten`](super::Flatten).
#[derive(Debug, Clone)]
pub struct ImageTokens<const C: usize, const N: usize, E: Dtype, D: Storage<E>> {
    /// One learned vector per token position.
    pub position: Tensor<(Const<N>, Const<C>), E, D>,
}

/// Builders, as for dfdx's layers.
pub(super) mod builder {
    /// Builds [`ImageTokens`](super::ImageTokens) with `N` tokens of `C` features.
    #[derive(Debug, Clone, Copy)]
    pub struct ImageTokens<const C: usize, const N: usize>;
}

impl<const C: usize, const N: usize, E, D> BuildOnDevice<D, E> for builder::ImageTokens<C, N>
where
    E: Dtype + SampleUniform,
    D: Device<E>,
{
    type Built = ImageTokens<C, N, E, D>;
    fn try_build_on_device(device: &D) -> std::result::Result<Self::Built, D::Err> {
        Self::Built::try_build(device)
    }
}

tensor_collection! {
    impl[const C: usize, const N: usize, E: Dtype + SampleUniform, D: Device<E>]
        ImageTokens<C, N, E, D> => ImageTokens<C, N, E2, D2>;
    ImageTokens {
        position: tensor(TensorOptions::reset_with(|t| {
            // Small, as ViT's truncated normal(0.02): positions start as a nudge.
            let bound = E::from_f64(0.02).unwrap_or(E::ONE);
            t.try_fill_with_distr(rand::distributions::Uniform::new(E::default() - bound, bound))
        })),
    }
}

impl<const C: usize, const N: usize, B: Dim, H: Dim, W: Dim, T: Tape<f32, Cpu>>
    Module<Tensor<(B, Const<C>, H, W), f32, Cpu, T>> for ImageTokens<C, N, f32, Cpu>
{
    type Output = Tokens<B, N, C, T>;
    type Error = CpuError;

    fn try_forward(
        &self,
        x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    ) -> std::result::Result<Self::Output, CpuError> {
        let (batch, _, h, w) = *x.shape();
        if h.size() * w.size() != N {
            return Err(CpuError::WrongNumElements);
        }
        let maps = x.try_reshape_like(&(batch, Const::<C>, Const::<N>))?;
        let tokens = maps.try_permute::<_, Axes3<0, 2, 1>>()?;
        let position = self
            .position
            .retaped::<T>()
            .try_broadcast_like(tokens.shape())?;
        tokens.try_add(position)
    }
}

impl<const C: usize, const N: usize, B: Dim, H: Dim, W: Dim, T: Tape<f32, Cpu>>
    ModuleMut<Tensor<(B, Const<C>, H, W), f32, Cpu, T>> for ImageTokens<C, N, f32, Cpu>
{
    type Output = Tokens<B, N, C, T>;
    type Error = CpuError;

    fn try_forward_mut(
        &mut self,
        x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    ) -> std::result::Result<Self::Output, CpuError> {
        self.try_forward(x)
    }
}

/// The mean of a sequence's tokens: `(batch, N, C)` → `(batch, C)`, the pooling a ViT without
/// a class token puts before its head.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MeanTokens;

impl ZeroSizedModule for MeanTokens {}
impl NonMutableModule for MeanTokens {}

impl<const N: usize, const C: usize, B: Dim, T: Tape<f32, Cpu>> Module<Tokens<B, N, C, T>>
    for MeanTokens
{
    type Output = Tensor<(B, Const<C>), f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tokens<B, N, C, T>) -> std::result::Result<Self::Output, CpuError> {
        x.try_mean::<_, Axis<1>>()
    }
}

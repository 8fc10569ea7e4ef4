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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_hold_each_position_s_channels_plus_its_embedding() {
        let dev = Cpu::seed_from_u64(1);
        let layer = dev.build_module::<builder::ImageTokens<3, 4>, f32>();
        let x: Tensor<Rank4<2, 3, 2, 2>, f32, Cpu> = dev.sample_normal();
        let y = layer
            .try_forward(
                x.clone()
                    .reshape_like(&(2usize, Const::<3>, 2usize, 2usize)),
            )
            .unwrap();
        let (xs, ys, pos) = (x.as_vec(), y.as_vec(), layer.position.as_vec());
        assert!(pos.iter().all(|p| p.abs() <= 0.02) && pos.iter().any(|p| *p != 0.0));
        for b in 0..2 {
            for n in 0..4 {
                for c in 0..3 {
                    let expected = xs[(b * 3 + c) * 4 + n] + pos[n * 3 + c];
                    assert_eq!(ys[(b * 4 + n) * 3 + c], expected, "b{b} n{n} c{c}");
                }
            }
        }
    }

    #[test]
    fn a_map_of_another_size_is_a_shape_error() {
        let dev = Cpu::default();
        let layer = dev.build_module::<builder::ImageTokens<3, 4>, f32>();
        let x = dev.zeros_like(&(1usize, Const::<3>, 3usize, 2usize));
        assert!(matches!(
            layer.try_forward(x),
            Err(CpuError::WrongNumElements)
        ));
    }

    #[test]
    fn gradients_reach_the_input_and_the_positions() {
        let dev = Cpu::seed_from_u64(2);
        let layer = dev.build_module::<builder::ImageTokens<2, 4>, f32>();
        let x: Tensor<Rank4<3, 2, 2, 2>, f32, Cpu> = dev.sample_normal();
        let x = x.reshape_like(&(3usize, Const::<2>, 2usize, 2usize));
        // Loss: sum of token (n, c) times weight n·2 + c + 1, so each gradient is known.
        let weights: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let w = dev
            .tensor_from_vec(weights.clone(), (Const::<4>, Const::<2>))
            .broadcast_like(&(3usize, Const::<4>, Const::<2>));
        // Leaky: keep the input's gradient too, not only the parameters'.
        let y = layer.try_forward(x.trace(Gradients::leaky())).unwrap();
        let grads = (y * w).sum().backward();
        let dpos = grads.get(&layer.position).as_vec();
        let dx = grads.get(&x).as_vec();
        for n in 0..4 {
            for c in 0..2 {
                assert_eq!(dpos[n * 2 + c], 3.0 * weights[n * 2 + c]);
                for b in 0..3 {
                    assert_eq!(dx[(b * 2 + c) * 4 + n], weights[n * 2 + c]);
                }
            }
        }
    }

    #[test]
    fn mean_tokens_averages_over_the_sequence() {
        let dev = Cpu::default();
        let x = dev.tensor_from_vec(
            (0..12).map(|i| i as f32).collect(),
            (2usize, Const::<3>, Const::<2>),
        );
        let y = MeanTokens.try_forward(x).unwrap().as_vec();
        assert_eq!(y, [2.0, 3.0, 8.0, 9.0]);
    }
}

//! Folding an inference-mode BatchNorm into the convolution before it, so that a model
//! trained with BatchNorm converts, quantizes and exports without it: the integer runtime has
//! no BatchNorm op, and a quantized convolution followed by a float normalisation could not
//! run on integers.
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_dfdx::fold::fold_batchnorm;
//! use quant_dfdx::nn::builders::Conv2d;
//!
//! let dev = Cpu::seed_from_u64(0);
//! let (conv, mut bn) = dev.build_module::<(Conv2d<1, 4, 3, 1, 1>, BatchNorm2D<4>), f32>();
//! bn.running_mean = dev.tensor([0.5, -0.25, 0.0, 1.0]);
//! bn.running_var = dev.tensor([2.0, 0.5, 1.0, 4.0]);
//!
//! let folded = fold_batchnorm(&conv, &bn);
//! let x: Tensor<Rank4<2, 1, 8, 8>, f32, _> = dev.sample_normal();
//! let reference = bn.forward(conv.forward(x.clone())).as_vec();
//! for (a, b) in folded.forward(x).as_vec().iter().zip(&reference) {
//!     assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()));
//! }
//! ```

use dfdx::nn::modules::{BatchNorm1D, BatchNorm2D};
use dfdx::prelude::*;

use crate::nn::{BatchNorm2d, Conv2d};

/// A BatchNorm's inference-mode parameters, one per channel, and its `ε`.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchNormValues {
    /// `γ`.
    pub gamma: Vec<f32>,
    /// `β`.
    pub beta: Vec<f32>,
    /// The running mean.
    pub mean: Vec<f32>,
    /// The running variance.
    pub var: Vec<f32>,
    /// `ε`.
    pub epsilon: f64,
}

/// A BatchNorm over `C` channels whose inference-mode parameters folding and conversion read:
/// dfdx's `BatchNorm2D` and `BatchNorm1D`, and [`BatchNorm2d`].
pub trait BatchNormParams<const C: usize> {
    /// The parameters, in channel order.
    fn values(&self) -> BatchNormValues;
}

macro_rules! batch_norm_params {
    ($($ty:ident),+) => {$(
        impl<const C: usize> BatchNormParams<C> for $ty<C, f32, Cpu> {
            fn values(&self) -> BatchNormValues {
                BatchNormValues {
                    gamma: self.scale.as_vec(),
                    beta: self.bias.as_vec(),
                    mean: self.running_mean.as_vec(),
                    var: self.running_var.as_vec(),
                    epsilon: self.epsilon,
                }
            }
        }
    )+};
}
batch_norm_params!(BatchNorm1D, BatchNorm2D, BatchNorm2d);

/// Folds an inference-mode BatchNorm into the convolution before it:
/// `W' = W·γ/√(σ²+ε)` per output channel and `b' = (b − μ)·γ/√(σ²+ε) + β`, computed in `f64`
/// and rounded once to `f32`. The folded convolution computes what the convolution followed by
/// the BatchNorm compute in evaluation mode (with its running statistics), up to float
/// rounding.
///
/// The BatchNorm's running variance is expected to be non-negative, as training leaves it: a
/// channel with `σ² + ε ≤ 0` gets non-finite weights, which calibration then refuses to turn
/// into a scale.
pub fn fold_batchnorm<
    const C: usize,
    const O: usize,
    const K: usize,
    const S: usize,
    const P: usize,
    const G: usize,
    const CG: usize,
>(
    conv: &Conv2d<C, O, K, S, P, G, CG, f32, Cpu>,
    bn: &impl BatchNormParams<O>,
) -> Conv2d<C, O, K, S, P, G, CG, f32, Cpu> {
    let BatchNormValues {
        gamma,
        beta,
        mean,
        var,
        epsilon,
    } = bn.values();
    let factor: Vec<f64> = (0..O)
        .map(|o| gamma[o] as f64 / (var[o] as f64 + epsilon).sqrt())
        .collect();
    // A grouped convolution's output channel reads only its group's `CG` input channels.
    let per_out = CG * K * K;
    let weight: Vec<f32> = conv
        .weight
        .as_vec()
        .iter()
        .enumerate()
        .map(|(i, w)| (*w as f64 * factor[i / per_out]) as f32)
        .collect();
    let bias: Vec<f32> = conv
        .bias
        .as_vec()
        .iter()
        .enumerate()
        .map(|(o, b)| ((*b as f64 - mean[o] as f64) * factor[o] + beta[o] as f64) as f32)
        .collect();
    let mut folded = conv.clone();
    folded.weight.copy_from(&weight);
    folded.bias.copy_from(&bias);
    folded
}

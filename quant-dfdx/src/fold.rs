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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::builders;

    /// A trained-looking BatchNorm: statistics and affine parameters far from their defaults.
    fn batchnorm<const O: usize>(dev: &Cpu) -> BatchNorm2D<O, f32, Cpu> {
        let mut bn = dev.build_module::<dfdx::nn::builders::BatchNorm2D<O>, f32>();
        let ramp = |a: f32, b: f32| -> Vec<f32> { (0..O).map(|o| a + b * o as f32).collect() };
        bn.scale.copy_from(&ramp(0.5, 0.25));
        bn.bias.copy_from(&ramp(-1.0, 0.3));
        bn.running_mean.copy_from(&ramp(0.2, -0.15));
        bn.running_var.copy_from(&ramp(0.05, 0.7));
        bn
    }

    /// Folding reorders float operations: equal up to a few rounding steps.
    fn assert_close(got: &[f32], reference: &[f32]) {
        assert_eq!(got.len(), reference.len());
        for (i, (a, b)) in got.iter().zip(reference).enumerate() {
            assert!(
                (a - b).abs() <= 2e-6 * (1.0 + b.abs()),
                "element {i}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn folded_convolution_computes_convolution_then_batchnorm() {
        let dev = Cpu::seed_from_u64(3);
        let conv = dev.build_module::<builders::Conv2d<3, 6, 3, 2, 1>, f32>();
        let bn = batchnorm::<6>(&dev);
        let folded = fold_batchnorm(&conv, &bn);
        let x: Tensor<Rank4<4, 3, 9, 9>, f32, Cpu> = dev.sample_normal();
        let reference = bn.forward(conv.forward(x.clone())).as_vec();
        assert_close(&folded.forward(x).as_vec(), &reference);
        // The geometry and the input are untouched; only weight and bias change.
        assert_ne!(folded.weight.as_vec(), conv.weight.as_vec());
        assert_ne!(folded.bias.as_vec(), conv.bias.as_vec());
    }

    #[test]
    fn folded_depthwise_convolution_computes_convolution_then_batchnorm() {
        let dev = Cpu::seed_from_u64(5);
        let conv = dev.build_module::<builders::DepthwiseConv2d<4, 3, 1, 1>, f32>();
        let bn = batchnorm::<4>(&dev);
        let folded = fold_batchnorm(&conv, &bn);
        let x: Tensor<Rank4<2, 4, 6, 6>, f32, Cpu> = dev.sample_normal();
        let reference = bn.forward(conv.forward(x.clone())).as_vec();
        assert_close(&folded.forward(x).as_vec(), &reference);
    }

    #[test]
    fn folding_follows_the_formula_per_output_channel() {
        let dev = Cpu::seed_from_u64(4);
        let conv = dev.build_module::<builders::Conv2d<2, 3, 1, 1, 0>, f32>();
        let bn = batchnorm::<3>(&dev);
        let folded = fold_batchnorm(&conv, &bn);
        let (w, b) = (conv.weight.as_vec(), conv.bias.as_vec());
        let (fw, fb) = (folded.weight.as_vec(), folded.bias.as_vec());
        let (gamma, beta) = (bn.scale.as_vec(), bn.bias.as_vec());
        let (mean, var) = (bn.running_mean.as_vec(), bn.running_var.as_vec());
        for o in 0..3 {
            let f = gamma[o] as f64 / (var[o] as f64 + bn.epsilon).sqrt();
            for c in 0..2 {
                assert_eq!(fw[o * 2 + c], (w[o * 2 + c] as f64 * f) as f32);
            }
            assert_eq!(
                fb[o],
                ((b[o] as f64 - mean[o] as f64) * f + beta[o] as f64) as f32
            );
        }
    }
}

//! Folding a BatchNorm into the convolution before it: the folded layer computes both, by the formula per output channel.

use dfdx::nn::modules::BatchNorm2D;
use dfdx::prelude::*;
use quant_dfdx::fold::fold_batchnorm;
use quant_dfdx::nn::builders;

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

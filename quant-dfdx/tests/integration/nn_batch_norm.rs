//! `quant_dfdx::nn::BatchNorm2d`: dfdx's `BatchNorm2D` bit for bit (outputs, gradients, running statistics), on any number of threads.

use crate::common::all_same;
use dfdx::prelude::*;
use quant_dfdx::nn::builders as builder;
use quant_dfdx::nn::{batch_norm2d_inference, BatchNorm2d};

type Images = Tensor<(usize, Const<5>, usize, usize), f32, Cpu>;
type Traced = Tensor<(usize, Const<5>, usize, usize), f32, Cpu, OwnedTape<f32, Cpu>>;

/// Two training steps (so the running statistics move twice) of `norm(x) + x` under a loss
/// that weighs every output differently, then inference: the outputs, the gradients of
/// `x`, `scale` and `bias` of the second step, the running statistics and the inference
/// output.
fn run<N>(norm: &mut N, x: &Images, w: &Images) -> Vec<Vec<f32>>
where
    N: ModuleMut<Traced, Output = Traced> + Module<Images, Output = Images> + Params<5>,
{
    let mut out = Vec::new();
    for _ in 0..2 {
        let t = x.clone().leaky_traced();
        let y = norm.forward_mut(t.retaped::<OwnedTape<f32, Cpu>>()) + t;
        out.push(y.as_vec());
        let grads = (y * w.clone()).sum().backward();
        out.push(grads.get(x).as_vec());
        let [scale, bias, _, _] = norm.params();
        out.push(grads.get(scale).as_vec());
        out.push(grads.get(bias).as_vec());
    }
    let [_, _, mean, var] = norm.params();
    out.push(mean.as_vec());
    out.push(var.as_vec());
    out.push(norm.forward(x.clone()).as_vec());
    out
}

type Wide = Tensor<(usize, Const<20>, usize, usize), f32, Cpu>;
type WideTraced = Tensor<(usize, Const<20>, usize, usize), f32, Cpu, OwnedTape<f32, Cpu>>;

/// Our layer with dfdx's layer's parameters and statistics.
fn copy_of<const C: usize>(
    theirs: &dfdx::nn::modules::BatchNorm2D<C, f32, Cpu>,
) -> BatchNorm2d<C, f32, Cpu> {
    BatchNorm2d {
        scale: theirs.scale.clone(),
        bias: theirs.bias.clone(),
        running_mean: theirs.running_mean.clone(),
        running_var: theirs.running_var.clone(),
        epsilon: theirs.epsilon,
        momentum: theirs.momentum,
    }
}

/// Scale, bias, running mean and running variance of either layer.
trait Params<const C: usize> {
    fn params(&self) -> [&Tensor<Rank1<C>, f32, Cpu>; 4];
}
impl<const C: usize> Params<C> for BatchNorm2d<C, f32, Cpu> {
    fn params(&self) -> [&Tensor<Rank1<C>, f32, Cpu>; 4] {
        [
            &self.scale,
            &self.bias,
            &self.running_mean,
            &self.running_var,
        ]
    }
}
impl<const C: usize> Params<C> for dfdx::nn::modules::BatchNorm2D<C, f32, Cpu> {
    fn params(&self) -> [&Tensor<Rank1<C>, f32, Cpu>; 4] {
        [
            &self.scale,
            &self.bias,
            &self.running_mean,
            &self.running_var,
        ]
    }
}

#[test]
fn training_and_inference_are_dfdx_batch_norms_bit_for_bit() {
    let dev = Cpu::default();
    let what = [
        "outputs",
        "input gradients",
        "scale gradients",
        "bias gradients",
    ];
    for (batch, h, w, spread) in [(8, 4, 4, 1.0f32), (3, 5, 7, 1e-3), (16, 2, 2, 40.0)] {
        let mut theirs = dev.build_module::<dfdx::nn::builders::BatchNorm2D<5>, f32>();
        theirs.scale = dev.sample_normal::<Rank1<5>>() * 0.5 + 1.0;
        theirs.bias = dev.sample_normal::<Rank1<5>>() * 0.3;
        let mut ours = copy_of(&theirs);
        let x: Images = dev.sample_normal_like(&(batch, Const, h, w)) * spread + 0.7;
        let wt: Images = dev.sample_normal_like(&(batch, Const, h, w));
        let a = run(&mut ours, &x, &wt);
        let b = run(&mut theirs, &x, &wt);
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            let name = match i {
                0..=7 => what[i % 4],
                8 => "running mean",
                9 => "running variance",
                _ => "inference outputs",
            };
            assert!(
                all_same(a, b),
                "{name} (step {}), {batch}x5x{h}x{w}, spread {spread}",
                i / 4 + 1
            );
        }
    }
}

/// A batch large enough for the parallel passes, over channels in three groups (8, 8, 4):
/// outputs, gradients and running statistics the same bits on one thread, on three, and
/// as dfdx's.
#[test]
fn the_parallel_passes_give_dfdx_bits_on_any_number_of_threads() {
    let dev = Cpu::seed_from_u64(9);
    let x: Wide = dev.sample_normal_like(&(40, Const, 8, 8)) * 3.0 - 0.4;
    let w: Wide = dev.sample_normal_like(&(40, Const, 8, 8));
    // The layer's passes run in parallel from 2^15 values (its `PARALLEL_VALUES`).
    assert!(x.shape().num_elements() >= 1 << 15);
    let mut theirs = dev.build_module::<dfdx::nn::builders::BatchNorm2D<20>, f32>();
    theirs.scale = dev.sample_normal::<Rank1<20>>() * 0.5 + 1.0;
    theirs.bias = dev.sample_normal::<Rank1<20>>() * 0.3;
    let ours = copy_of(&theirs);
    /// Output, gradients of the input, scale and bias, and the running statistics after
    /// one training step.
    fn step<N>(norm: &mut N, x: &Wide, w: &Wide) -> [Vec<f32>; 6]
    where
        N: ModuleMut<WideTraced, Output = WideTraced> + Params<20>,
    {
        let y = norm.forward_mut(x.clone().leaky_traced());
        let out = y.as_vec();
        let grads = (y * w.clone()).sum().backward();
        let [scale, bias, mean, var] = norm.params();
        [
            out,
            grads.get(x).as_vec(),
            grads.get(scale).as_vec(),
            grads.get(bias).as_vec(),
            mean.as_vec(),
            var.as_vec(),
        ]
    }
    let on = |threads: usize| {
        let mut norm = ours.clone();
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| step(&mut norm, &x, &w))
    };
    let (one, three) = (on(1), on(3));
    let dfdx = step(&mut theirs, &x, &w);
    let what = [
        "outputs",
        "input gradients",
        "scale gradients",
        "bias gradients",
        "running mean",
        "running variance",
    ];
    for i in 0..6 {
        assert!(all_same(&one[i], &three[i]), "{}: 1 vs 3 threads", what[i]);
        assert!(all_same(&one[i], &dfdx[i]), "{}: ours vs dfdx", what[i]);
    }
}

#[test]
fn an_input_of_other_channels_is_an_error_naming_them() {
    let dev = Cpu::default();
    let norm = dev.build_module::<builder::BatchNorm2d<4>, f32>();
    let x: Tensor<(usize, usize, usize, usize), f32, Cpu> = dev.zeros_like(&(2, 3, 2, 2));
    let err = batch_norm2d_inference(x, &norm).unwrap_err();
    assert!(
        err.to_string().contains("BatchNorm2d input's channels"),
        "{err}"
    );
}

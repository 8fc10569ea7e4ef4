//! `quant_dfdx::nn::LayerNorm`: dfdx's `LayerNorm1D` bit for bit, on any number of threads; a wrong width is an error.

use crate::common::all_same;
use dfdx::prelude::*;
use quant_dfdx::nn::builders as builder;
use quant_dfdx::nn::{layer_norm, LayerNorm};

type Traced<S> = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;

/// Output, and the gradients of `x`, `gamma` and `beta`, of `norm(x) + x` under a loss
/// that weighs every output differently: the residual add makes the input's gradient hold
/// a value already when the LayerNorm's arrives, as in a transformer block.
fn run<S: Shape, N: Module<Traced<S>, Output = Traced<S>>>(
    norm: &N,
    gamma: &Tensor<Rank1<48>, f32, Cpu>,
    beta: &Tensor<Rank1<48>, f32, Cpu>,
    x: &Tensor<S, f32, Cpu>,
    w: &Tensor<S, f32, Cpu>,
) -> [Vec<f32>; 4] {
    let t = x.clone().leaky_traced();
    let out = norm.forward(t.retaped::<OwnedTape<f32, Cpu>>()) + t;
    let y = out.as_vec();
    let grads = (out * w.clone()).sum().backward();
    [
        y,
        grads.get(x).as_vec(),
        grads.get(gamma).as_vec(),
        grads.get(beta).as_vec(),
    ]
}

/// dfdx's layer with random `gamma` and `beta` drawn from `dev`, and ours with the same.
fn pair(dev: &Cpu) -> (dfdx::nn::modules::LayerNorm1D<48, f32, Cpu>, LayerNorm<48>) {
    let mut theirs = dev.build_module::<dfdx::nn::builders::LayerNorm1D<48>, f32>();
    theirs.gamma = dev.sample_normal::<Rank1<48>>() * 0.5 + 1.0;
    theirs.beta = dev.sample_normal::<Rank1<48>>() * 0.3;
    let ours = LayerNorm {
        gamma: theirs.gamma.clone(),
        beta: theirs.beta.clone(),
        epsilon: theirs.epsilon,
    };
    (theirs, ours)
}

#[test]
fn outputs_and_gradients_are_dfdx_layer_norms_bit_for_bit() {
    let dev = Cpu::default();
    let (theirs, ours) = pair(&dev);
    let what = [
        "outputs",
        "input gradients",
        "gamma gradients",
        "beta gradients",
    ];
    // Rows of tiny, ordinary and large spreads around an offset.
    for spread in [1e-3f32, 1.0, 40.0] {
        let x: Tensor<(usize, Const<16>, Const<48>), f32, Cpu> =
            dev.sample_normal_like(&(8, Const, Const)) * spread + 0.7;
        let w = dev.sample_normal_like(x.shape());
        let a = run(&ours, &ours.gamma, &ours.beta, &x, &w);
        let b = run(&theirs, &theirs.gamma, &theirs.beta, &x, &w);
        for i in 0..4 {
            assert!(
                all_same(&a[i], &b[i]),
                "{}, rank 3, spread {spread}",
                what[i]
            );
        }
        let x: Tensor<(usize, Const<48>), f32, Cpu> =
            dev.sample_normal_like(&(33, Const)) * spread - 2.0;
        let w = dev.sample_normal_like(x.shape());
        let a = run(&ours, &ours.gamma, &ours.beta, &x, &w);
        let b = run(&theirs, &theirs.gamma, &theirs.beta, &x, &w);
        for i in 0..4 {
            assert!(
                all_same(&a[i], &b[i]),
                "{}, rank 2, spread {spread}",
                what[i]
            );
        }
    }
}

/// Enough rows for the parallel pieces (and a tail of single rows, 403 = 4·100 + 3): the
/// same bits as dfdx's layer on one thread and on three.
#[test]
fn the_parallel_passes_give_dfdx_bits_on_any_number_of_threads() {
    let dev = Cpu::seed_from_u64(21);
    let (theirs, ours) = pair(&dev);
    let x: Tensor<(usize, Const<48>), f32, Cpu> = dev.sample_normal_like(&(403, Const)) * 3.0 + 0.7;
    assert!(x.shape().num_elements() >= 1 << 14);
    let w = dev.sample_normal_like(x.shape());
    let b = run(&theirs, &theirs.gamma, &theirs.beta, &x, &w);
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let a = pool.install(|| run(&ours, &ours.gamma, &ours.beta, &x, &w));
        for i in 0..4 {
            assert!(all_same(&a[i], &b[i]), "part {i}, {threads} threads");
        }
    }
}

#[test]
fn an_input_of_another_width_is_an_error_naming_it() {
    let dev = Cpu::default();
    let norm = dev.build_module::<builder::LayerNorm<4>, f32>();
    let x: Tensor<(usize, usize), f32, Cpu> = dev.zeros_like(&(2, 5));
    let err = layer_norm(x, &norm.gamma, &norm.beta, norm.epsilon).unwrap_err();
    assert!(
        err.to_string().contains("LayerNorm input's last dimension"),
        "{err}"
    );
}

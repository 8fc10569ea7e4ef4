//! `quant_dfdx::nn::Linear`: dfdx's `Linear` bit for bit (outputs and every gradient, at every rank, on any number of threads, applied twice).

use crate::common::{all_same, every_fma_path};
use dfdx::prelude::*;
use quant_dfdx::nn::builders as builder;
use quant_dfdx::nn::Linear;

type Traced<S> = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;

/// Output, and the gradients of `x`, `weight` and `bias`, under a loss that weighs every
/// output differently, with `x` also feeding a second op recorded after the layer (so that
/// the input's gradient holds a value already when the layer's arrives, as in a residual
/// block).
fn run<Si: Shape, So: Shape, M>(
    layer: &M,
    (weight, bias): (
        &Tensor<Rank2<16, 45>, f32, Cpu>,
        &Tensor<Rank1<16>, f32, Cpu>,
    ),
    x: &Tensor<Si, f32, Cpu>,
    w: &Tensor<So, f32, Cpu>,
) -> [Vec<f32>; 4]
where
    M: Module<Traced<Si>, Output = Traced<So>>,
{
    let t = x.clone().leaky_traced();
    let out = layer.forward(t.retaped::<OwnedTape<f32, Cpu>>());
    let y = out.as_vec();
    let side = (t * 0.37).sum();
    let grads = ((out * w.clone()).sum() + side).backward();
    [
        y,
        grads.get(x).as_vec(),
        grads.get(weight).as_vec(),
        grads.get(bias).as_vec(),
    ]
}

fn pair(seed: u64) -> (Linear<45, 16>, dfdx::nn::modules::Linear<45, 16, f32, Cpu>) {
    let ours = Cpu::seed_from_u64(seed).build_module::<builder::Linear<45, 16>, f32>();
    let theirs = Cpu::seed_from_u64(seed).build_module::<dfdx::nn::builders::Linear<45, 16>, f32>();
    (ours, theirs)
}

const WHAT: [&str; 4] = [
    "outputs",
    "input gradients",
    "weight gradients",
    "bias gradients",
];

fn check<Si: Shape, So: Shape>(
    ours: &Linear<45, 16>,
    theirs: &dfdx::nn::modules::Linear<45, 16, f32, Cpu>,
    x: &Tensor<Si, f32, Cpu>,
    w: &Tensor<So, f32, Cpu>,
    case: &str,
) where
    Linear<45, 16>: Module<Traced<Si>, Output = Traced<So>>,
    dfdx::nn::modules::Linear<45, 16, f32, Cpu>: Module<Traced<Si>, Output = Traced<So>>,
{
    let a = run(ours, (&ours.weight, &ours.bias), x, w);
    let b = run(theirs, (&theirs.weight, &theirs.bias), x, w);
    for i in 0..4 {
        assert!(all_same(&a[i], &b[i]), "{}, {case}", WHAT[i]);
    }
}

#[test]
fn initial_parameters_are_dfdx_draws() {
    let (ours, theirs) = pair(7);
    assert!(all_same(&ours.weight.as_vec(), &theirs.weight.as_vec()));
    assert!(all_same(&ours.bias.as_vec(), &theirs.bias.as_vec()));
}

#[test]
fn outputs_and_gradients_are_dfdx_linears_bit_for_bit() {
    every_fma_path(bit_for_bit_cases);
}

fn bit_for_bit_cases(path: &str) {
    let (ours, theirs) = pair(1);
    let dev = Cpu::seed_from_u64(2);
    for spread in [1e-3f32, 1.0, 40.0] {
        // Sequences of tokens (the one-product path), and of one or two tokens (dfdx's).
        for seq in [16, 7, 2, 1] {
            let x: Tensor<(usize, usize, Const<45>), f32, Cpu> =
                dev.sample_normal_like(&(5, seq, Const)) * spread + 0.3;
            let w = dev.sample_normal_like(&(5, seq, Const::<16>));
            check(
                &ours,
                &theirs,
                &x,
                &w,
                &format!("rank 3, {seq} tokens, spread {spread}, {path}"),
            );
        }
        for batch in [33, 2, 1] {
            let x: Tensor<(usize, Const<45>), f32, Cpu> =
                dev.sample_normal_like(&(batch, Const)) * spread - 1.0;
            let w = dev.sample_normal_like(&(batch, Const::<16>));
            check(
                &ours,
                &theirs,
                &x,
                &w,
                &format!("rank 2, batch {batch}, spread {spread}, {path}"),
            );
        }
        let x: Tensor<Rank1<45>, f32, Cpu> = dev.sample_normal();
        let w: Tensor<Rank1<16>, f32, Cpu> = dev.sample_normal();
        check(&ours, &theirs, &x, &w, &format!("rank 1, {path}"));
    }
}

#[test]
fn the_same_bits_on_one_thread_and_on_three() {
    let (ours, theirs) = pair(3);
    let dev = Cpu::seed_from_u64(4);
    let x: Tensor<(usize, usize, Const<45>), f32, Cpu> = dev.sample_normal_like(&(64, 16, Const));
    let w = dev.sample_normal_like(&(64, 16, Const::<16>));
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| run(&ours, (&ours.weight, &ours.bias), &x, &w))
    };
    let (one, three) = (on(1), on(3));
    let theirs = run(&theirs, (&theirs.weight, &theirs.bias), &x, &w);
    for i in 0..4 {
        assert!(all_same(&one[i], &three[i]), "{}", WHAT[i]);
        assert!(all_same(&one[i], &theirs[i]), "{}", WHAT[i]);
    }
}

/// Gradients that accumulate over two calls of one layer (a weight shared by two
/// positions, or a layer applied twice) add into the buffers as dfdx's do.
#[test]
fn a_layer_applied_twice_accumulates_as_dfdx_does() {
    let dev = Cpu::seed_from_u64(5);
    let ours = Cpu::seed_from_u64(6).build_module::<builder::Linear<20, 20>, f32>();
    let theirs = Cpu::seed_from_u64(6).build_module::<dfdx::nn::builders::Linear<20, 20>, f32>();
    let x: Tensor<(usize, usize, Const<20>), f32, Cpu> = dev.sample_normal_like(&(6, 9, Const));
    let w = dev.sample_normal_like(x.shape());
    type Tokens = Traced<(usize, usize, Const<20>)>;
    let twice = |weight: &Tensor<Rank2<20, 20>, f32, Cpu>,
                 bias: &Tensor<Rank1<20>, f32, Cpu>,
                 f: &dyn Fn(Tokens) -> Tokens| {
        let t = x.clone().leaky_traced();
        let out = f(f(t));
        let grads = (out * w.clone()).sum().backward();
        [
            grads.get(&x).as_vec(),
            grads.get(weight).as_vec(),
            grads.get(bias).as_vec(),
        ]
    };
    let a = twice(&ours.weight, &ours.bias, &|t| ours.forward(t));
    let b = twice(&theirs.weight, &theirs.bias, &|t| theirs.forward(t));
    for i in 0..3 {
        assert!(all_same(&a[i], &b[i]), "{}", WHAT[i + 1]);
    }
}

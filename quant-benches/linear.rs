//! [`quant_dfdx::nn::Linear`] against dfdx's `Linear` (the same numbers, bit for bit): forward
//! and backward on a transformer's token batches (64 sequences of 16 tokens, 64 features to
//! 128 and back, and 64 to 64) and on a batch of 64 vectors (256 to 256), one thread.
//!
//! ```text
//! cargo bench -p quant-benches --bench linear
//! ```
//!
//! Rounds alternate the two layers (`common::compare`).

mod common;

use std::hint::black_box;
use std::time::Instant;

use dfdx::prelude::*;
use quant_dfdx::nn::builders;

const ROUNDS: usize = 201;
type Traced<S> = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;

/// Seconds for one forward and backward pass of `layer` on `x`.
fn step<S: Shape, So: Shape, M>(layer: &M, x: &Tensor<S, f32, Cpu>) -> f64
where
    M: Module<Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>, Output = Traced<So>>,
{
    let start = Instant::now();
    let y = layer.forward(x.clone().leaky_traced());
    let grads = y.sum().backward();
    black_box(grads.get(x));
    start.elapsed().as_secs_f64()
}

fn tokens<const I: usize, const O: usize>(dev: &Cpu) {
    let theirs = dev.build_module::<Linear<I, O>, f32>();
    let ours = dev.build_module::<builders::Linear<I, O>, f32>();
    let x: Tensor<(usize, Const<16>, Const<I>), f32, Cpu> =
        dev.sample_normal_like(&(64, Const, Const));
    common::compare(
        &format!("Linear<{I}, {O}> forward + backward, input (64, 16, {I})"),
        x.shape().num_elements(),
        ROUNDS,
        ("dfdx Linear", || step(&theirs, &x)),
        ("quant_dfdx Linear", || step(&ours, &x)),
    );
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    pool.install(|| {
        let dev = Cpu::default();
        tokens::<64, 128>(&dev);
        tokens::<128, 64>(&dev);
        tokens::<64, 64>(&dev);
        let theirs = dev.build_module::<Linear<256, 256>, f32>();
        let ours = dev.build_module::<builders::Linear<256, 256>, f32>();
        let x: Tensor<(usize, Const<256>), f32, Cpu> = dev.sample_normal_like(&(64, Const));
        common::compare(
            "Linear<256, 256> forward + backward, input (64, 256)",
            x.shape().num_elements(),
            ROUNDS,
            ("dfdx Linear", || step(&theirs, &x)),
            ("quant_dfdx Linear", || step(&ours, &x)),
        );
    });
}

//! [`quant_dfdx::nn::BatchNorm2d`] against dfdx's `BatchNorm2D` (the same numbers, bit for
//! bit): a training-mode forward and backward pass on the MNIST CNN's first BatchNorm input
//! (batch 64, 16 channels of 28x28), on rayon's default pool (the summary prints its thread
//! count).
//!
//! ```text
//! cargo bench -p quant-benches --bench batch_norm
//! ```
//!
//! Rounds alternate the two layers (`common::compare`), each less the time of the same step
//! through an identity layer (the loss's sum and its backward pass) measured right after it.

mod common;

use dfdx::prelude::*;
use quant_dfdx::nn::builders;

const ROUNDS: usize = 51;
type Input = Tensor<(usize, Const<16>, usize, usize), f32, Cpu>;

fn main() {
    let dev = Cpu::default();
    let mut theirs = dev.build_module::<BatchNorm2D<16>, f32>();
    let mut ours = dev.build_module::<builders::BatchNorm2d<16>, f32>();
    let x: Input = dev.sample_normal_like(&(64, Const, 28, 28));
    // The loss's own forward and backward pass (through an identity layer), taken off each
    // round right after it, in the same state of the allocator (measured once up front, the
    // loss's pass took the first allocations' page faults and came out larger than ours).
    let without_loss = |layer_step: f64| layer_step - common::step(&x, |x| x);
    let loss = common::median((0..ROUNDS).map(|_| common::step(&x, |x| x)).collect());
    println!("the loss's own pass: {:.1} µs (first rounds)", loss * 1e6);
    common::compare(
        "BatchNorm training step",
        x.shape().num_elements(),
        ROUNDS,
        ("dfdx BatchNorm2D", || {
            without_loss(common::step(&x, |x| theirs.forward_mut(x)))
        }),
        ("quant_dfdx BatchNorm2d", || {
            without_loss(common::step(&x, |x| ours.forward_mut(x)))
        }),
    );
}

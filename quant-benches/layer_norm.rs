//! [`quant_dfdx::nn::LayerNorm`] against dfdx's `LayerNorm1D` (the same numbers, bit for bit):
//! forward and backward on a float ViT's LayerNorm input (batch 32, 16 tokens, 48 features),
//! one thread.
//!
//! ```text
//! cargo bench -p quant-benches --bench layer_norm
//! ```
//!
//! Rounds alternate the two layers (`common::compare`).

mod common;

use std::hint::black_box;
use std::time::Instant;

use dfdx::prelude::*;
use quant_dfdx::nn::builders;

const ROUNDS: usize = 201;
type Input = Tensor<(usize, Const<16>, Const<48>), f32, Cpu>;
type Traced = Tensor<(usize, Const<16>, Const<48>), f32, Cpu, OwnedTape<f32, Cpu>>;

/// Seconds for one forward and backward pass of `layer` on `x`.
fn step<M: Module<Traced, Output = Traced>>(layer: &M, x: &Input) -> f64 {
    let start = Instant::now();
    let y = layer.forward(x.clone().leaky_traced());
    let grads = y.sum().backward();
    black_box(grads.get(x));
    start.elapsed().as_secs_f64()
}

fn main() {
    let dev = Cpu::default();
    let theirs = dev.build_module::<LayerNorm1D<48>, f32>();
    let ours = dev.build_module::<builders::LayerNorm<48>, f32>();
    let x: Input = dev.sample_normal_like(&(32, Const, Const));
    common::compare(
        "LayerNorm forward + backward",
        x.shape().num_elements(),
        ROUNDS,
        ("dfdx LayerNorm1D", || step(&theirs, &x)),
        ("quant_dfdx LayerNorm", || step(&ours, &x)),
    );
}

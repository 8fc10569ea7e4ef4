//! [`quant_dfdx::nn::LayerNorm`] against dfdx's `LayerNorm1D` (the same numbers, bit for bit):
//! forward and backward on a float ViT's LayerNorm input (batch 32, 16 tokens, 48 features),
//! on rayon's default pool (the summary prints its thread count).
//!
//! ```text
//! cargo bench -p quant-benches --bench layer_norm
//! ```
//!
//! Rounds alternate the two layers (`common::compare`).

mod common;

use dfdx::prelude::*;
use quant_dfdx::nn::builders;

const ROUNDS: usize = 201;
type Input = Tensor<(usize, Const<16>, Const<48>), f32, Cpu>;

fn main() {
    let dev = Cpu::default();
    let theirs = dev.build_module::<LayerNorm1D<48>, f32>();
    let ours = dev.build_module::<builders::LayerNorm<48>, f32>();
    let x: Input = dev.sample_normal_like(&(32, Const, Const));
    common::compare(
        "LayerNorm forward + backward",
        x.shape().num_elements(),
        ROUNDS,
        ("dfdx LayerNorm1D", || {
            common::step(&x, |x| theirs.forward(x))
        }),
        ("quant_dfdx LayerNorm", || {
            common::step(&x, |x| ours.forward(x))
        }),
    );
}

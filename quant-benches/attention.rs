//! [`quant_dfdx::nn::MultiHeadAttention`] against dfdx's `MultiHeadAttention` (the same
//! numbers, bit for bit): forward and backward of the MNIST ViT's self-attention (64 sequences
//! of 16 tokens, 64 features, 4 heads), one thread. Ours runs its projections as
//! [`quant_dfdx::nn::Linear`]s (see `--bench linear` for them alone) and its core (scores,
//! softmax, weighted values) as one op; dfdx's as per-sequence, per-head products and ops.
//!
//! ```text
//! cargo bench -p quant-benches --bench attention
//! ```
//!
//! Rounds alternate the two layers (`common::compare`).

mod common;

use dfdx::prelude::*;
use quant_dfdx::nn::builders;

const ROUNDS: usize = 101;
type Input = Tensor<(usize, Const<16>, Const<64>), f32, Cpu>;

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    pool.install(|| {
        let dev = Cpu::default();
        let theirs = dev.build_module::<MultiHeadAttention<64, 4>, f32>();
        let ours = dev.build_module::<builders::MultiHeadAttention<64, 4>, f32>();
        let x: Input = dev.sample_normal_like(&(64, Const, Const));
        common::compare(
            "MultiHeadAttention<64, 4> forward + backward, input (64, 16, 64)",
            x.shape().num_elements(),
            ROUNDS,
            ("dfdx MultiHeadAttention", || {
                common::step(&x, |x| theirs.forward(x))
            }),
            ("quant_dfdx MultiHeadAttention", || {
                common::step(&x, |x| ours.forward(x))
            }),
        );
    });
}

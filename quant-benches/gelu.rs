//! [`quant_dfdx::nn::Gelu`] against dfdx's `AccurateGeLU` (the same numbers, bit for bit):
//! forward and backward on a float ViT's GELU input (batch 32, 16 tokens, 96 features, three
//! blocks: 147,456 values), one thread.
//!
//! ```text
//! cargo bench -p quant-benches --bench gelu
//! ```
//!
//! The inputs are roughly normal with a spread of 2 (sum of four uniforms), as a trained ViT's
//! GELU inputs are, so every range of `erf` occurs. Rounds alternate the two layers
//! (`common::compare`).

mod common;

use std::hint::black_box;
use std::time::Instant;

use dfdx::prelude::*;
use quant_dfdx::nn::Gelu;

const N: usize = 32 * 16 * 96 * 3;
const ROUNDS: usize = 101;

fn data(n: usize) -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (uniform() + uniform() + uniform() + uniform() - 2.0) * 3.5)
        .collect()
}

/// Seconds for one forward and backward pass of `layer` on `x`.
fn step<M>(layer: &M, x: &Tensor<(usize,), f32, Cpu>) -> f64
where
    M: Module<
        Tensor<(usize,), f32, Cpu, OwnedTape<f32, Cpu>>,
        Output = Tensor<(usize,), f32, Cpu, OwnedTape<f32, Cpu>>,
    >,
{
    let start = Instant::now();
    let y = layer.forward(x.clone().leaky_traced());
    let grads = y.sum().backward();
    black_box(grads.get(x));
    start.elapsed().as_secs_f64()
}

fn main() {
    let dev = Cpu::default();
    let x = dev.tensor_from_vec(data(N), (N,));
    common::compare(
        "GELU forward + backward",
        N,
        ROUNDS,
        ("dfdx AccurateGeLU", || step(&AccurateGeLU, &x)),
        ("quant_dfdx Gelu", || step(&Gelu, &x)),
    );
}

//! [`quant_dfdx::nn::Gelu`] against dfdx's `AccurateGeLU` (the same numbers, bit for bit):
//! forward and backward on a float ViT's GELU input (batch 32, 16 tokens, 96 features, three
//! blocks: 147,456 values), on rayon's default pool (the summary prints its thread count).
//!
//! ```text
//! cargo bench -p quant-benches --bench gelu
//! ```
//!
//! The inputs are roughly normal with a spread of 2 (sum of four uniforms), as a trained ViT's
//! GELU inputs are, so every range of `erf` occurs. Rounds alternate the two layers
//! (`common::compare`).

mod common;

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

fn main() {
    let dev = Cpu::default();
    let x = dev.tensor_from_vec(data(N), (N,));
    common::compare(
        "GELU forward + backward",
        N,
        ROUNDS,
        ("dfdx AccurateGeLU", || {
            common::step(&x, |x| AccurateGeLU.forward(x))
        }),
        ("quant_dfdx Gelu", || common::step(&x, |x| Gelu.forward(x))),
    );
}

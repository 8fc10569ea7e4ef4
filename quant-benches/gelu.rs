//! [`quant_dfdx::nn::Gelu`] against dfdx's `AccurateGeLU` (the same numbers, bit for bit):
//! forward and backward on a float ViT's GELU input (batch 32, 16 tokens, 96 features, three
//! blocks: 147,456 values), on rayon's default pool (the summary prints its thread count).
//!
//! ```text
//! cargo bench -p quant-benches --bench gelu
//! ```
//!
//! The inputs are roughly normal (sum of four uniforms) at three spreads, and each run names
//! the share of them in `erf`'s far range (`|x| ≥ 1.25·√2`, where dfdx's `erff` calls `expf`
//! twice and `quant_dfdx::nn::Gelu` computes the lanes apart): a ViT's GELU inputs at
//! initialisation sit mostly below it, a trained ViT's a tenth to a half beyond it. Rounds
//! alternate the two layers (`common::compare`).

mod common;

use dfdx::prelude::*;
use quant_dfdx::nn::Gelu;

const N: usize = 32 * 16 * 96 * 3;
const ROUNDS: usize = 101;

/// Sums of four uniforms on `[-1, 1]`, times `spread / 2`: a standard deviation of
/// `0.58·spread`.
fn data(n: usize, spread: f32) -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (uniform() + uniform() + uniform() + uniform() - 2.0) * spread)
        .collect()
}

fn main() {
    let dev = Cpu::default();
    for spread in [0.5, 2.0, 3.5] {
        let values = data(N, spread);
        let far = values
            .iter()
            .filter(|x| x.abs() >= 1.25 * std::f32::consts::SQRT_2)
            .count();
        let x = dev.tensor_from_vec(values, (N,));
        common::compare(
            &format!(
                "GELU forward + backward, {:.0}% of the inputs in erf's far range",
                100.0 * far as f64 / N as f64
            ),
            N,
            ROUNDS,
            ("dfdx AccurateGeLU", || {
                common::step(&x, |x| AccurateGeLU.forward(x))
            }),
            ("quant_dfdx Gelu", || common::step(&x, |x| Gelu.forward(x))),
        );
    }
}

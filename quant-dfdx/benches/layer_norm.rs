//! [`quant_dfdx::nn::LayerNorm`] against dfdx's `LayerNorm1D` (the same numbers, bit for bit):
//! forward and backward on a float ViT's LayerNorm input (batch 32, 16 tokens, 48 features),
//! one thread.
//!
//! ```text
//! cargo bench -p quant-dfdx --bench layer_norm
//! ```
//!
//! Each round times both layers one after the other; the summary prints the median over
//! rounds of the ratio, so a noisy neighbour slows both sides alike.

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
    let values = x.shape().num_elements();
    let (mut t_ours, mut t_theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let a = step(&theirs, &x);
        let b = step(&ours, &x);
        t_theirs.push(a);
        t_ours.push(b);
        ratios.push(b / a);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ns = |t: f64| t * 1e9 / values as f64;
    let (a, b) = (median(t_theirs), median(t_ours));
    println!(
        "LayerNorm forward + backward, {values} values, one thread (median of {ROUNDS} rounds):"
    );
    println!(
        "  dfdx LayerNorm1D      {:>8.1} µs  {:>5.2} ns/value",
        a * 1e6,
        ns(a)
    );
    println!(
        "  quant_dfdx LayerNorm  {:>8.1} µs  {:>5.2} ns/value",
        b * 1e6,
        ns(b)
    );
    println!("  LayerNorm / LayerNorm1D: {:.2}x", median(ratios));
}

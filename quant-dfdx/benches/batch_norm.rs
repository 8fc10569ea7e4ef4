//! [`quant_dfdx::nn::BatchNorm2d`] against dfdx's `BatchNorm2D` (the same numbers, bit for
//! bit): a training-mode forward and backward pass on the MNIST CNN's first BatchNorm input
//! (batch 64, 16 channels of 28x28), one thread.
//!
//! ```text
//! cargo bench -p quant-dfdx --bench batch_norm
//! ```
//!
//! Each round times both layers one after the other, less the time of the same step through an
//! identity layer (the loss's sum and its backward pass); the summary prints the median over
//! rounds of the ratio, so a noisy neighbour slows both sides alike.

use std::hint::black_box;
use std::time::Instant;

use dfdx::prelude::*;
use quant_dfdx::nn::builders;

const ROUNDS: usize = 51;
type Input = Tensor<(usize, Const<16>, usize, usize), f32, Cpu>;
type Traced = Tensor<(usize, Const<16>, usize, usize), f32, Cpu, OwnedTape<f32, Cpu>>;

/// Seconds for one training-mode forward and backward pass of `layer` on `x`.
fn step<M: ModuleMut<Traced, Output = Traced>>(layer: &mut M, x: &Input) -> f64 {
    let start = Instant::now();
    let y = layer.forward_mut(x.clone().leaky_traced());
    let grads = y.sum().backward();
    black_box(grads.get(x));
    start.elapsed().as_secs_f64()
}

fn main() {
    let dev = Cpu::default();
    let mut theirs = dev.build_module::<BatchNorm2D<16>, f32>();
    let mut ours = dev.build_module::<builders::BatchNorm2d<16>, f32>();
    let x: Input = dev.sample_normal_like(&(64, Const, 28, 28));
    let values = x.shape().num_elements();
    let (mut t_ours, mut t_theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut t_loss = Vec::new();
    for _ in 0..ROUNDS {
        // The loss's own forward and backward pass (an identity layer), taken off both.
        let l = step(&mut (), &x);
        let a = step(&mut theirs, &x) - l;
        let b = step(&mut ours, &x) - l;
        t_loss.push(l);
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
    println!("BatchNorm training step, {values} values, one thread (median of {ROUNDS} rounds,");
    println!("the loss's {:.1} µs taken off):", median(t_loss) * 1e6);
    println!(
        "  dfdx BatchNorm2D       {:>8.1} µs  {:>5.2} ns/value",
        a * 1e6,
        ns(a)
    );
    println!(
        "  quant_dfdx BatchNorm2d {:>8.1} µs  {:>5.2} ns/value",
        b * 1e6,
        ns(b)
    );
    println!("  BatchNorm2d / BatchNorm2D: {:.2}x", median(ratios));
}

//! What the layer benches (ours against dfdx's) share: a timed training step, interleaved
//! rounds, medians, the printed summary.

use std::hint::black_box;
use std::time::Instant;

use dfdx::prelude::*;

/// A traced `f32` tensor on the CPU.
pub type Traced<S> = Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>;

/// Seconds for one forward and backward pass of `forward` on `x`, the loss being the output's
/// sum (so the layer's backward pass gets a gradient of ones).
pub fn step<S: Shape, So>(
    x: &Tensor<S, f32, Cpu>,
    forward: impl FnOnce(Traced<S>) -> Traced<So>,
) -> f64
where
    So: Shape + ReduceShapeTo<(), <So as Shape>::AllAxes>,
{
    let start = Instant::now();
    let y = forward(x.clone().leaky_traced());
    let grads = y.sum::<Rank0, _>().backward();
    black_box(grads.get(x));
    start.elapsed().as_secs_f64()
}

/// Runs `rounds` rounds, each timing `theirs` then `ours` (seconds); prints the medians as
/// time per call and per value, and the median over rounds of the ratio (so a noisy
/// neighbour slows both sides alike).
pub fn compare(
    title: &str,
    values: usize,
    rounds: usize,
    (their_name, mut theirs): (&str, impl FnMut() -> f64),
    (our_name, mut ours): (&str, impl FnMut() -> f64),
) {
    let (mut t_theirs, mut t_ours, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let a = theirs();
        let b = ours();
        t_theirs.push(a);
        t_ours.push(b);
        ratios.push(b / a);
    }
    let ns = |t: f64| t * 1e9 / values as f64;
    let (a, b) = (median(t_theirs), median(t_ours));
    let threads = rayon::current_num_threads();
    println!("{title}, {values} values, {threads} thread(s) (median of {rounds} rounds):");
    println!(
        "  {their_name:<24} {:>9.1} µs  {:>5.2} ns/value",
        a * 1e6,
        ns(a)
    );
    println!(
        "  {our_name:<24} {:>9.1} µs  {:>5.2} ns/value",
        b * 1e6,
        ns(b)
    );
    println!("  {our_name} / {their_name}: {:.2}x", median(ratios));
}

/// The median of `v` (the upper one for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

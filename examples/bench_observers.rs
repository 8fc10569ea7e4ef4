//! Observer throughput against a memcpy of the same bytes, single-threaded.
//!
//! ```text
//! cargo run --release --example bench_observers [-- ELEMENTS]
//! ```
//!
//! Prints the time of a 4M-element `f32` memcpy, then for every observer the time of one
//! `observe` of the same 4M values, its ratio to the memcpy and its nanoseconds per element,
//! and the time of one `qparams` afterwards (int8, symmetric). The per-tensor `observe` and
//! `qparams` paths are single-threaded.

use std::hint::black_box;
use std::time::{Duration, Instant};

use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
use quant_ops::observers::ObserverConfig;

/// Wall time of one call of `f`.
fn time(f: &mut dyn FnMut()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Deterministic, roughly normal data (sum of four uniforms), with a few outliers as real
/// activations have.
fn data(n: usize) -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|i| {
            let v = (uniform() + uniform() + uniform() + uniform() - 2.0) * 1.7;
            if i % 100_003 == 0 {
                v * 40.0
            } else {
                v
            }
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 4 << 20,
    };
    let x = data(n);
    let mut dst = vec![0f32; n];
    let layout = ChannelLayout::per_tensor(n);
    let names = [
        "MinMax",
        "MovingAverageMinMax",
        "LsqInit",
        "Percentile",
        "Mse",
        "Entropy",
    ];
    let mut observers = Vec::new();
    for name in names {
        let config: ObserverConfig = name.parse()?;
        let mut observer = config.build();
        // One checked call (also the warm-up); the timed ones repeat it on the same data
        // and cannot fail.
        observer.observe(&x, layout)?;
        observers.push((config, observer));
    }
    let mut memcpy = || {
        dst.copy_from_slice(black_box(&x));
        black_box(&mut dst);
    };
    memcpy();

    // Rounds interleave memcpy and every observer, so a noisy neighbour on a shared machine
    // slows both sides of a ratio alike; each ratio is the median of its per-round ratios.
    let runs = 21;
    let mut copy_ms = Vec::new();
    let mut observe_ms = vec![Vec::new(); observers.len()];
    let mut ratios = vec![Vec::new(); observers.len()];
    for _ in 0..runs {
        let c = time(&mut memcpy).as_secs_f64() * 1e3;
        copy_ms.push(c);
        for (i, (_, observer)) in observers.iter_mut().enumerate() {
            let t = time(&mut || {
                let _ = black_box(observer.observe(black_box(&x), layout));
            })
            .as_secs_f64()
                * 1e3;
            observe_ms[i].push(t);
            ratios[i].push(t / c);
        }
    }

    println!(
        "{n} f32 ({} MiB), median of {runs} interleaved rounds, single-threaded",
        (n * 4) >> 20
    );
    println!(
        "{:<28} {:>9.3} ms   1.00x memcpy",
        "memcpy",
        median(copy_ms)
    );
    for (i, (config, observer)) in observers.iter().enumerate() {
        let t = median(observe_ms[i].clone());
        let start = Instant::now();
        let q = observer.qparams(
            QuantizationMethod::Symmetric,
            IntegerGrid::INT8,
            RoundingPolicy::HalfEven,
        )?;
        let qt = start.elapsed().as_secs_f64() * 1e3;
        println!(
            "{:<28} {:>9.3} ms {:>6.2}x memcpy {:>7.3} ns/element   qparams {:>7.3} ms (int8 symmetric scale {:.5})",
            format!("{config} observe"),
            t,
            median(ratios[i].clone()),
            t * 1e6 / n as f64,
            qt,
            q.scales()[0],
        );
    }
    Ok(())
}

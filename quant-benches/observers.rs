//! Observer throughput on 4M `f32` against a memcpy of the same bytes.
//!
//! ```text
//! cargo bench -p quant-benches --bench observers
//! ```
//!
//! Criterion measures memcpy and every observer's `observe` (throughput in bytes, so its
//! report reads as GiB/s), and the histogram observers' `qparams`. At the end a summary prints,
//! from one set of interleaved rounds in this process, each `observe` time, its ratio to the
//! memcpy and its nanoseconds per element (the ratio is the median of per-round ratios, so a
//! noisy neighbour slows both sides alike).

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use quant_core::{ChannelLayout, IntegerGrid, QuantizationMethod, RoundingPolicy};
use quant_dfdx::observers::{Observer, ObserverConfig};

const N: usize = 4 << 20;
const KINDS: [&str; 6] = [
    "MinMax",
    "MovingAverageMinMax",
    "LsqInit",
    "Percentile",
    "Mse",
    "Entropy",
];

/// Deterministic, roughly normal data (sum of four uniforms) with a few outliers, as real
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

fn observer(kind: &str, x: &[f32]) -> Box<dyn Observer> {
    let config: ObserverConfig = kind.parse().expect("a built-in observer kind");
    let mut o = config.build();
    o.observe(x, ChannelLayout::per_tensor(x.len()))
        .expect("observe");
    o
}

fn bench(c: &mut Criterion, x: &[f32]) {
    let layout = ChannelLayout::per_tensor(x.len());
    let mut group = c.benchmark_group("observe_4M_f32");
    group.throughput(Throughput::Bytes((x.len() * 4) as u64));
    let mut dst = vec![0f32; x.len()];
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(x));
            black_box(&mut dst);
        })
    });
    for kind in KINDS {
        let mut o = observer(kind, x);
        group.bench_function(BenchmarkId::new("observe", kind), |b| {
            b.iter(|| o.observe(black_box(x), layout).expect("observe"))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("qparams_int8_symmetric");
    for kind in ["Percentile", "Mse", "Entropy"] {
        let o = observer(kind, x);
        group.bench_function(kind, |b| {
            b.iter(|| {
                o.qparams(
                    QuantizationMethod::Symmetric,
                    IntegerGrid::INT8,
                    RoundingPolicy::HalfEven,
                )
                .expect("qparams")
            })
        });
    }
    group.finish();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The ratio table: interleaved rounds of memcpy and every observer.
fn summary(x: &[f32]) {
    let layout = ChannelLayout::per_tensor(x.len());
    let mut observers: Vec<_> = KINDS.iter().map(|k| observer(k, x)).collect();
    let mut dst = vec![0f32; x.len()];
    let rounds = 21;
    let mut copy = Vec::new();
    let mut times = vec![Vec::new(); KINDS.len()];
    let mut ratios = vec![Vec::new(); KINDS.len()];
    for _ in 0..rounds {
        let t = Instant::now();
        dst.copy_from_slice(black_box(x));
        black_box(&mut dst);
        let c = t.elapsed().as_secs_f64();
        copy.push(c);
        for (i, o) in observers.iter_mut().enumerate() {
            let t = Instant::now();
            o.observe(black_box(x), layout).expect("observe");
            let e = t.elapsed().as_secs_f64();
            times[i].push(e);
            ratios[i].push(e / c);
        }
    }
    println!(
        "\nsummary: {} f32, median of {rounds} interleaved rounds, single-threaded",
        x.len()
    );
    println!(
        "{:<22} {:>9.3} ms  1.00x memcpy",
        "memcpy",
        median(copy) * 1e3
    );
    for (i, kind) in KINDS.iter().enumerate() {
        let t = median(times[i].clone());
        println!(
            "{:<22} {:>9.3} ms {:>5.2}x memcpy {:>7.3} ns/element",
            kind,
            t * 1e3,
            median(ratios[i].clone()),
            t * 1e9 / x.len() as f64
        );
    }
}

fn main() {
    let x = data(N);
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &x);
    c.final_summary();
    summary(&x);
}

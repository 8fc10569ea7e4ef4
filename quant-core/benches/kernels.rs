//! Criterion benchmarks of the fake-quantization kernels on 4Mi `f32` elements, into buffers
//! allocated once, next to a memcpy of the same bytes; each one single-threaded and on rayon's
//! default pool. `cargo bench -p quant-core --bench kernels` (add `-- per-tensor` to filter).
//! `examples/bench_kernels.rs` prints the same figures as ratios to memcpy in one table.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quant_core::kernels::{
    dequantize_into, fake_quantize_affine_backward_into, fake_quantize_affine_into,
    fake_quantize_learnable_affine_backward_into, quantize_into,
};
use quant_core::{ChannelLayout, RoundingPolicy};
use rayon::prelude::*;

const N: usize = 1 << 22;
const QMIN: i32 = -128;
const QMAX: i32 = 127;

/// Deterministic pseudo-normal data (a sum of four uniforms).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (uniform() + uniform() + uniform() + uniform() - 2.0) * 1.7)
        .collect()
}

/// Per-channel parameters: slightly different scales, zero points in -3..=3.
fn channel_params(c: usize) -> (Vec<f32>, Vec<i32>) {
    let scales = (0..c).map(|k| 0.03 + 0.0001 * (k % 97) as f32).collect();
    let zps = (0..c).map(|k| (k % 7) as i32 - 3).collect();
    (scales, zps)
}

struct Buffers {
    x: Vec<f32>,
    dy: Vec<f32>,
    y: Vec<f32>,
    dx: Vec<f32>,
    q: Vec<i8>,
}

type Kernel = Box<dyn Fn(&mut Buffers) + Send + Sync>;

fn kernels() -> Vec<(String, Kernel)> {
    use RoundingPolicy::HalfEven;
    let (scale, zp) = (0.05f32, 3i32);
    let per_tensor = ChannelLayout::per_tensor(N);
    let mut out: Vec<(String, Kernel)> = vec![(
        "memcpy".into(),
        Box::new(|b: &mut Buffers| b.y.copy_from_slice(black_box(&b.x))),
    )];
    for policy in RoundingPolicy::ALL {
        out.push((
            format!("fake-quant per-tensor {policy:?}"),
            Box::new(move |b: &mut Buffers| {
                fake_quantize_affine_into(
                    &b.x,
                    &mut b.y,
                    per_tensor,
                    &[scale],
                    &[zp],
                    QMIN,
                    QMAX,
                    policy,
                )
                .expect("valid parameters")
            }),
        ));
    }
    for (name, shape) in [
        ("linear [2048,2048] axis 0", vec![2048, 2048]),
        ("conv [1820,256,3,3] axis 0", vec![1820, 256, 3, 3]),
    ] {
        let layout = ChannelLayout::new(&shape, Some(0)).expect("valid shape");
        let (scales, zps) = channel_params(layout.channels);
        let m = layout.numel();
        out.push((
            format!("fake-quant per-channel {name}"),
            Box::new(move |b: &mut Buffers| {
                fake_quantize_affine_into(
                    &b.x[..m],
                    &mut b.y[..m],
                    layout,
                    &scales,
                    &zps,
                    QMIN,
                    QMAX,
                    HalfEven,
                )
                .expect("valid parameters")
            }),
        ));
    }
    out.push((
        "STE backward per-tensor".into(),
        Box::new(move |b: &mut Buffers| {
            fake_quantize_affine_backward_into(
                &b.x,
                &b.dy,
                &mut b.dx,
                per_tensor,
                &[scale],
                &[zp],
                QMIN,
                QMAX,
                HalfEven,
            )
            .expect("valid parameters")
        }),
    ));
    let g = 1.0 / ((N as f32) * QMAX as f32).sqrt();
    let lsq = move |b: &mut Buffers| {
        let (mut ds, mut dz) = ([0.0], [0.0]);
        fake_quantize_learnable_affine_backward_into(
            &b.x,
            &b.dy,
            &mut b.dx,
            per_tensor,
            &[scale],
            &[zp as f32],
            QMIN,
            QMAX,
            g,
            HalfEven,
            &mut ds,
            &mut dz,
        )
        .expect("valid parameters");
        black_box((ds, dz));
    };
    out.push((
        "LSQ fwd+bwd per-tensor".into(),
        Box::new(move |b: &mut Buffers| {
            fake_quantize_affine_into(
                &b.x,
                &mut b.y,
                per_tensor,
                &[scale],
                &[zp],
                QMIN,
                QMAX,
                HalfEven,
            )
            .expect("valid parameters");
            lsq(b);
        }),
    ));
    out.push((
        "quantize to i8 per-tensor".into(),
        Box::new(move |b: &mut Buffers| {
            quantize_into(
                &b.x,
                &mut b.q,
                per_tensor,
                &[scale],
                &[zp],
                QMIN,
                QMAX,
                HalfEven,
            )
            .expect("valid parameters")
        }),
    ));
    out.push((
        "dequantize from i8 per-tensor".into(),
        Box::new(move |b: &mut Buffers| {
            dequantize_into(&b.q, &mut b.y, per_tensor, &[scale], &[zp], QMIN, QMAX)
                .expect("valid parameters")
        }),
    ));
    out
}

fn bench(c: &mut Criterion) {
    let mut b = Buffers {
        x: data(N, 1),
        dy: data(N, 2),
        y: vec![1.0; N],
        dx: vec![0.0; N],
        q: vec![1; N],
    };
    let pools = [
        (
            "1 thread",
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("a thread pool"),
        ),
        (
            "pool",
            rayon::ThreadPoolBuilder::new()
                .build()
                .expect("a thread pool"),
        ),
    ];
    let mut group = c.benchmark_group("kernels");
    group
        .sample_size(20)
        .throughput(Throughput::Bytes((N * 4) as u64));
    for (name, kernel) in kernels() {
        for (threads, pool) in &pools {
            group.bench_function(BenchmarkId::new(name.as_str(), threads), |bench| {
                bench.iter(|| pool.install(|| kernel(&mut b)))
            });
        }
    }
    // A parallel memcpy, the fair baseline for the pool figures.
    let pool = &pools[1].1;
    group.bench_function(BenchmarkId::new("memcpy (rayon chunks)", "pool"), |bench| {
        bench.iter(|| {
            pool.install(|| {
                b.y.par_chunks_mut(1 << 16)
                    .zip(black_box(&b.x).par_chunks(1 << 16))
                    .for_each(|(y, x)| y.copy_from_slice(x))
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

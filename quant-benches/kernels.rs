//! The fake-quantization kernels on 4Mi `f32` elements, into buffers allocated (and touched)
//! once, against a memcpy of the same bytes, each one single-threaded and on rayon's default
//! pool; and the functions that return a `Vec` against a `to_vec` of the same bytes, next to the
//! same work into the caller's buffers (one thread).
//!
//! ```text
//! cargo bench -p quant-benches --bench kernels              # add `-- LSQ` to filter by name
//! ```
//!
//! Criterion measures each kernel beside its baseline in one group; at the end a summary
//! prints each kernel's time as a ratio to its baseline, the median of per-round ratios of
//! interleaved rounds in this process (a noisy neighbour slows both sides alike). Per-channel
//! shapes use the largest multiple of their row size that fits, and their ratio is scaled to
//! the same element count.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use quant_core::kernels::{
    dequantize_into, fake_quantize_affine_backward_into, fake_quantize_affine_into,
    fake_quantize_learnable_affine_backward_into,
    fake_quantize_learnable_per_tensor_affine_backward, fake_quantize_per_tensor_affine,
    pact_backward_into, pact_forward_into, quantize_into,
};
use quant_core::{ChannelLayout, IntegerGrid, RoundingPolicy};
use rayon::prelude::*;

const N: usize = 1 << 22;

/// Deterministic pseudo-normal data (sum of four uniforms), so runs are comparable.
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

struct Buffers {
    x: Vec<f32>,
    dy: Vec<f32>,
    y: Vec<f32>,
    dx: Vec<f32>,
    q: Vec<i8>,
}

/// A named kernel and the number of elements it processes.
struct Case {
    name: String,
    numel: usize,
    run: Box<dyn Fn(&mut Buffers) + Send + Sync>,
}

fn case(
    name: impl Into<String>,
    numel: usize,
    run: impl Fn(&mut Buffers) + Send + Sync + 'static,
) -> Case {
    Case {
        name: name.into(),
        numel,
        run: Box::new(run),
    }
}

/// Per-channel parameters for `c` channels: slightly different scales, zero points in -3..=3.
fn channel_params(c: usize) -> (Vec<f32>, Vec<i32>) {
    let scales = (0..c).map(|k| 0.03 + 0.0001 * (k % 97) as f32).collect();
    let zps = (0..c).map(|k| (k % 7) as i32 - 3).collect();
    (scales, zps)
}

fn cases(n: usize) -> Vec<Case> {
    use RoundingPolicy::HalfEven;
    let (scale, zp, qmin, qmax) = (0.05f32, 3i32, -128, 127);
    let per_tensor = ChannelLayout::per_tensor(n);
    let mut out = Vec::new();
    for policy in RoundingPolicy::ALL {
        out.push(case(
            format!("fake-quant per-tensor {policy:?}"),
            n,
            move |b| {
                fake_quantize_affine_into(
                    &b.x,
                    &mut b.y,
                    per_tensor,
                    &[scale],
                    &[zp],
                    qmin,
                    qmax,
                    policy,
                )
                .expect("valid parameters");
            },
        ));
    }
    // A Linear weight [O, I] and a conv weight [O, C, 3, 3] on axis 0, and activations
    // [N, C, H, W] on axis 1 with 8x8 planes (rows of 64) and short 4x4 planes (expanded
    // per-element constants).
    let shapes: [(&str, Vec<usize>, usize); 4] = [
        (
            "per-channel linear [O,2048] axis 0",
            vec![n / 2048, 2048],
            0,
        ),
        (
            "per-channel conv [O,256,3,3] axis 0",
            vec![n / (256 * 9), 256, 3, 3],
            0,
        ),
        (
            "per-channel act [N,64,8,8] axis 1",
            vec![n / (64 * 64), 64, 8, 8],
            1,
        ),
        (
            "per-channel act [N,64,4,4] axis 1",
            vec![n / (64 * 16), 64, 4, 4],
            1,
        ),
    ];
    for (name, shape, axis) in shapes {
        let layout = ChannelLayout::new(&shape, Some(axis)).expect("valid shape");
        let (scales, zps) = channel_params(layout.channels);
        let m = layout.numel();
        out.push(case(format!("fake-quant {name}"), m, move |b| {
            fake_quantize_affine_into(
                &b.x[..m],
                &mut b.y[..m],
                layout,
                &scales,
                &zps,
                qmin,
                qmax,
                HalfEven,
            )
            .expect("valid parameters");
        }));
    }
    out.push(case("STE backward per-tensor", n, move |b| {
        fake_quantize_affine_backward_into(
            &b.x,
            &b.dy,
            &mut b.dx,
            per_tensor,
            &[scale],
            &[zp],
            qmin,
            qmax,
            HalfEven,
        )
        .expect("valid parameters");
    }));
    let g = 1.0 / ((n as f32) * qmax as f32).sqrt();
    let lsq_backward = move |b: &mut Buffers| {
        let (mut ds, mut dz) = ([0.0], [0.0]);
        fake_quantize_learnable_affine_backward_into(
            &b.x,
            &b.dy,
            &mut b.dx,
            per_tensor,
            &[scale],
            &[zp as f32],
            qmin,
            qmax,
            g,
            HalfEven,
            &mut ds,
            Some(&mut dz[..]),
        )
        .expect("valid parameters");
        black_box((ds, dz));
    };
    out.push(case("LSQ backward per-tensor", n, lsq_backward));
    out.push(case("LSQ fwd+bwd per-tensor", n, move |b| {
        fake_quantize_affine_into(
            &b.x,
            &mut b.y,
            per_tensor,
            &[scale],
            &[zp],
            qmin,
            qmax,
            HalfEven,
        )
        .expect("valid parameters");
        lsq_backward(b);
    }));
    for (name, shape, axis) in [
        ("linear [O,2048] axis 0", vec![n / 2048, 2048], 0),
        ("act [N,64,4,4] axis 1", vec![n / (64 * 16), 64, 4, 4], 1),
    ] {
        let layout = ChannelLayout::new(&shape, Some(axis)).expect("valid shape");
        let c = layout.channels;
        let (scales, zps) = channel_params(c);
        let zf: Vec<f32> = zps.iter().map(|z| *z as f32).collect();
        let m = layout.numel();
        let gc = 1.0 / ((m / c) as f32 * qmax as f32).sqrt();
        let fwd_scales = scales.clone();
        let lsq_backward = move |b: &mut Buffers| {
            let (mut ds, mut dz) = (vec![0.0; c], vec![0.0; c]);
            fake_quantize_learnable_affine_backward_into(
                &b.x[..m],
                &b.dy[..m],
                &mut b.dx[..m],
                layout,
                &scales,
                &zf,
                qmin,
                qmax,
                gc,
                HalfEven,
                &mut ds,
                Some(&mut dz[..]),
            )
            .expect("valid parameters");
            black_box((ds, dz));
        };
        out.push(case(
            format!("LSQ backward per-channel {name}"),
            m,
            lsq_backward.clone(),
        ));
        out.push(case(
            format!("LSQ fwd+bwd per-channel {name}"),
            m,
            move |b| {
                fake_quantize_affine_into(
                    &b.x[..m],
                    &mut b.y[..m],
                    layout,
                    &fwd_scales,
                    &zps,
                    qmin,
                    qmax,
                    HalfEven,
                )
                .expect("valid parameters");
                lsq_backward(b);
            },
        ));
    }
    let grid = IntegerGrid::new(8, false, false).expect("valid grid");
    out.push(case("PACT forward", n, move |b| {
        pact_forward_into(&b.x, &mut b.y, per_tensor, 3.0, grid, HalfEven).expect("valid alpha");
    }));
    out.push(case("PACT backward", n, move |b| {
        black_box(pact_backward_into(&b.x, &b.dy, &mut b.dx, 3.0, grid));
    }));
    out.push(case("quantize to i8 per-tensor", n, move |b| {
        quantize_into(
            &b.x,
            &mut b.q,
            per_tensor,
            &[scale],
            &[zp],
            qmin,
            qmax,
            HalfEven,
        )
        .expect("valid parameters");
    }));
    out.push(case("dequantize from i8 per-tensor", n, move |b| {
        dequantize_into(&b.q, &mut b.y, per_tensor, &[scale], &[zp], qmin, qmax)
            .expect("valid parameters");
    }));
    out
}

/// The functions that return a `Vec`, and the same work into buffers the caller owns. The LSQ
/// step is PyTorch's pair: the forward and the learnable backward.
fn allocating(n: usize) -> Vec<Case> {
    let (scale, zp, qmin, qmax) = (0.05f32, 3i32, -128, 127);
    let g = 1.0 / ((n as f32) * qmax as f32).sqrt();
    let per_tensor = ChannelLayout::per_tensor(n);
    type Step = Box<dyn Fn(&mut Buffers) + Send + Sync>;
    let cases: Vec<(&str, Step)> = vec![
        (
            "fake_quantize_per_tensor_affine (Vec)",
            Box::new(move |b| {
                let y = fake_quantize_per_tensor_affine(&b.x, scale, zp, qmin, qmax);
                black_box(y.expect("valid parameters"));
            }),
        ),
        (
            "  the same into a buffer",
            Box::new(move |b| {
                fake_quantize_affine_into(
                    &b.x,
                    &mut b.y,
                    per_tensor,
                    &[scale],
                    &[zp],
                    qmin,
                    qmax,
                    RoundingPolicy::HalfEven,
                )
                .expect("valid parameters");
            }),
        ),
        (
            "LSQ forward + backward (Vecs)",
            Box::new(move |b| {
                let y = fake_quantize_per_tensor_affine(&b.x, scale, zp, qmin, qmax);
                let grads = fake_quantize_learnable_per_tensor_affine_backward(
                    &b.x, &b.dy, scale, zp as f32, qmin, qmax, g,
                );
                black_box((y.expect("valid"), grads.expect("valid")));
            }),
        ),
        (
            "  the same into buffers",
            Box::new(move |b| {
                fake_quantize_affine_into(
                    &b.x,
                    &mut b.y,
                    per_tensor,
                    &[scale],
                    &[zp],
                    qmin,
                    qmax,
                    RoundingPolicy::HalfEven,
                )
                .expect("valid parameters");
                let (mut ds, mut dz) = ([0.0], [0.0]);
                fake_quantize_learnable_affine_backward_into(
                    &b.x,
                    &b.dy,
                    &mut b.dx,
                    per_tensor,
                    &[scale],
                    &[zp as f32],
                    qmin,
                    qmax,
                    g,
                    RoundingPolicy::HalfEven,
                    &mut ds,
                    Some(&mut dz[..]),
                )
                .expect("valid parameters");
                black_box((ds, dz));
            }),
        ),
    ];
    cases
        .into_iter()
        .map(|(name, run)| Case {
            name: name.trim().to_string(),
            numel: n,
            run,
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds of one call of `f`: the best of 5 calls after a warm-up.
fn seconds(f: &mut dyn FnMut()) -> f64 {
    f();
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Criterion's group `group`: `baseline` and every case, each on `pool`.
fn measure(
    c: &mut Criterion,
    group: &str,
    pool: &rayon::ThreadPool,
    baseline: &Case,
    cases: &[Case],
    b: &mut Buffers,
) {
    let mut g = c.benchmark_group(group);
    g.sample_size(20)
        .throughput(Throughput::Bytes((N * 4) as u64));
    for case in std::iter::once(baseline).chain(cases) {
        g.bench_function(BenchmarkId::from_parameter(&case.name), |bench| {
            bench.iter(|| pool.install(|| (case.run)(b)))
        });
    }
    g.finish();
}

/// The ratio table of one group: interleaved rounds of the baseline and each case.
fn summary(
    title: &str,
    pool: &rayon::ThreadPool,
    baseline: &Case,
    cases: &[Case],
    b: &mut Buffers,
) {
    let mut ratios = vec![Vec::new(); cases.len()];
    let mut base = Vec::new();
    for _ in 0..7 {
        let t = seconds(&mut || pool.install(|| (baseline.run)(b)));
        base.push(t);
        for (r, case) in ratios.iter_mut().zip(cases) {
            let per_n = N as f64 / case.numel as f64;
            r.push(seconds(&mut || pool.install(|| (case.run)(b))) * per_n / t);
        }
    }
    println!(
        "\n{title}: time / {}, median of 7 interleaved rounds",
        baseline.name
    );
    println!(
        "{:<44} {:>9.3} ms  1.00x",
        baseline.name,
        median(base) * 1e3
    );
    for (r, case) in ratios.into_iter().zip(cases) {
        println!("{:<44} {:>12.2}x", case.name, median(r));
    }
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let mut b = Buffers {
        x: data(N, 1),
        dy: data(N, 2),
        y: vec![1.0; N],
        dx: vec![0.0; N],
        q: vec![1; N],
    };
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a thread pool");
    let all = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a thread pool");
    let wanted = |cases: Vec<Case>| -> Vec<Case> {
        cases
            .into_iter()
            .filter(|c| c.name.contains(&filter))
            .collect()
    };
    let kernels = wanted(cases(N));
    let allocating = wanted(allocating(N));
    let memcpy = case("memcpy", N, |b: &mut Buffers| {
        b.y.copy_from_slice(black_box(&b.x))
    });
    // A parallel memcpy, the fair baseline for the pool figures.
    let par_memcpy = case("memcpy (rayon chunks)", N, |b: &mut Buffers| {
        b.y.par_chunks_mut(1 << 16)
            .zip(black_box(&b.x).par_chunks(1 << 16))
            .for_each(|(y, x)| y.copy_from_slice(x))
    });
    let to_vec = case("x.to_vec()", N, |b: &mut Buffers| {
        black_box(black_box(&b.x).to_vec());
    });
    let groups = [
        ("kernels, 1 thread", &one, &memcpy, &kernels),
        ("kernels, rayon's pool", &all, &par_memcpy, &kernels),
        ("allocating, 1 thread", &one, &to_vec, &allocating),
    ];
    let mut c = Criterion::default().configure_from_args();
    for (group, pool, baseline, cases) in groups {
        if !cases.is_empty() {
            measure(&mut c, group, pool, baseline, cases, &mut b);
        }
    }
    c.final_summary();
    println!(
        "rayon's default pool: {} threads",
        all.current_num_threads()
    );
    for (group, pool, baseline, cases) in groups {
        if !cases.is_empty() {
            summary(group, pool, baseline, cases, &mut b);
        }
    }
}

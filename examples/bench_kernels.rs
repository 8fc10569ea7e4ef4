//! Times the fake-quantization kernels against a memcpy of the same bytes, single-threaded and
//! with rayon's default pool, and prints each kernel's time and its ratio to memcpy.
//!
//! ```text
//! cargo run --release --example bench_kernels            # 4Mi elements, best of 15 runs
//! cargo run --release --example bench_kernels -- 1048576 30        # 1Mi elements, best of 30
//! cargo run --release --example bench_kernels -- 4194304 15 LSQ    # only kernels named *LSQ*
//! ```
//!
//! The int8 tables time `quant_core::int8` on one thread, on every instruction-set path this
//! CPU has: `gemm_u8` against dfdx's `f32` matmul of the same shape (the digits MLP's layers at
//! batch 64 and 360, and a CNN's im2col rows), and requantization against a memcpy of the
//! accumulators. `-- 0 0 int8` runs only those.
//!
//! A second table times the functions that return a `Vec` (fake quantization, and the LSQ
//! forward + backward pair) against a `to_vec` of the same bytes, next to the same work into
//! the caller's buffers.
//!
//! Every kernel writes into buffers allocated (and touched) once, before timing. The figure is
//! the best of several runs in this process: the machine is shared, so the minimum is the
//! least noisy estimate of what the code costs. All kernels are timed in three passes (best
//! of the three), memcpy again before every kernel, and its best time over the whole run is
//! the reference. Nothing here is asserted; speed is never
//! a test.

use std::hint::black_box;
use std::time::{Duration, Instant};

use quant_core::int8::{fixed_point_multiplier, gemm_u8, Isa, PackedMatrix, Requantizer};
use quant_core::kernels::{
    dequantize_into, fake_quantize_affine_backward_into, fake_quantize_affine_into,
    fake_quantize_learnable_affine_backward_into,
    fake_quantize_learnable_per_tensor_affine_backward, fake_quantize_per_tensor_affine,
    pact_backward_into, pact_forward_into, quantize_into, PARALLEL_THRESHOLD,
};
use quant_core::{ChannelLayout, IntegerGrid, RoundingPolicy};
use rayon::prelude::*;

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

/// Best wall time of `runs` calls of `f`, after one warm-up call.
fn best(runs: usize, mut f: impl FnMut()) -> Duration {
    f();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
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
            &mut dz,
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
                &mut dz,
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1 << 22);
    let runs: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(15);
    let filter = args.next().unwrap_or_default();
    // Every benchmark shape must fit; the per-channel shapes use the largest multiple of their
    // row size that does, and their ratio is scaled to the same element count.
    let n = n.max(256 * 9);
    let mut b = Buffers {
        x: data(n, 1),
        dy: data(n, 2),
        y: vec![1.0; n],
        dx: vec![0.0; n],
        q: vec![1; n],
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.to_string())
        })
        .unwrap_or_else(|| "model name: unknown".into());
    println!("{cpu}");
    println!(
        "{n} f32 elements ({:.1} MiB per buffer), best of 3 passes x {runs} runs; parallel threshold {PARALLEL_THRESHOLD}",
        (n * 4) as f64 / (1 << 20) as f64
    );
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let all = rayon::ThreadPoolBuilder::new().build()?;
    println!("rayon default pool: {} threads", all.current_num_threads());
    println!(
        "ratios: time / memcpy time, scaled to {n} elements; the pool column uses a parallel memcpy, \
         whose 2 buffers may fit the last-level cache where a kernel's 3 or 4 do not"
    );

    // memcpy is timed between every kernel too, and the best time over the whole run is the
    // reference: on a shared machine one early measurement can be far off.
    let memcpy = |b: &mut Buffers| b.y.copy_from_slice(black_box(&b.x));
    let par_memcpy = |b: &mut Buffers| {
        b.y.par_chunks_mut(1 << 16)
            .zip(black_box(&b.x).par_chunks(1 << 16))
            .for_each(|(y, x)| y.copy_from_slice(x))
    };
    let (mut memcpy_1, mut memcpy_n) = (Duration::MAX, Duration::MAX);
    let cases: Vec<Case> = cases(n)
        .into_iter()
        .filter(|c| c.name.contains(&filter))
        .collect();
    let mut times = vec![(Duration::MAX, Duration::MAX); cases.len()];
    // Three passes over all kernels, keeping each one's best: a burst of load from another
    // process then spoils one pass, not the figure.
    for _ in 0..3 {
        for (c, (t1, tn)) in cases.iter().zip(times.iter_mut()) {
            memcpy_1 = memcpy_1.min(one.install(|| best(runs, || memcpy(&mut b))));
            *t1 = (*t1).min(one.install(|| best(runs, || (c.run)(&mut b))));
            memcpy_n = memcpy_n.min(all.install(|| best(runs, || par_memcpy(&mut b))));
            *tn = (*tn).min(all.install(|| best(runs, || (c.run)(&mut b))));
        }
    }
    if !cases.is_empty() {
        // Scaled to n elements: a per-channel shape may cover slightly fewer.
        let rows = cases
            .iter()
            .zip(times)
            .map(|(c, (t1, tn))| (c.name.clone(), t1, tn, n as f64 / c.numel as f64));
        println!();
        println!(
            "{:<44} {:>10} {:>7} {:>10} {:>7}",
            "", "1 thread", "ratio", "pool", "ratio"
        );
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<44} {:>8.3}ms {:>7.2} {:>8.3}ms {:>7.2}",
            "memcpy",
            ms(memcpy_1),
            1.0,
            ms(memcpy_n),
            1.0
        );
        for (name, t1, tn, per_n) in rows {
            println!(
                "{:<44} {:>8.3}ms {:>7.2} {:>8.3}ms {:>7.2}",
                name,
                ms(t1),
                t1.as_secs_f64() * per_n / memcpy_1.as_secs_f64(),
                ms(tn),
                tn.as_secs_f64() * per_n / memcpy_n.as_secs_f64()
            );
        }
    }
    black_box(&b.y);
    allocating(&mut b, runs, &one, &filter);
    if "int8 gemm requantize".contains(filter.as_str()) {
        one.install(int8);
        int8_threads(&one, &all);
    }
    Ok(())
}

/// The functions that return a `Vec` against a `to_vec` of the same bytes (the least an
/// allocating function can cost), next to the same work into buffers the caller owns, on one
/// thread. The LSQ step is PyTorch's pair: the forward and the learnable backward.
fn allocating(b: &mut Buffers, runs: usize, one: &rayon::ThreadPool, filter: &str) {
    let (scale, zp, qmin, qmax) = (0.05f32, 3i32, -128, 127);
    let n = b.x.len();
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
                    &mut dz,
                )
                .expect("valid parameters");
                black_box((ds, dz));
            }),
        ),
    ];
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|(name, _)| name.contains(filter) || filter.is_empty())
        .collect();
    if cases.is_empty() {
        return;
    }
    let to_vec = |b: &mut Buffers| {
        black_box(black_box(&b.x).to_vec());
    };
    let mut reference = Duration::MAX;
    let mut times = vec![Duration::MAX; cases.len()];
    for _ in 0..3 {
        for ((_, run), t) in cases.iter().zip(times.iter_mut()) {
            reference = reference.min(one.install(|| best(runs, || to_vec(b))));
            *t = (*t).min(one.install(|| best(runs, || run(b))));
        }
    }
    println!();
    println!(
        "{:<44} {:>10} {:>7}   (allocating functions; ratio: time / to_vec time, 1 thread)",
        "", "1 thread", "ratio"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{:<44} {:>8.3}ms {:>7.2}", "x.to_vec()", ms(reference), 1.0);
    for ((name, _), t) in cases.iter().zip(times) {
        println!(
            "{:<44} {:>8.3}ms {:>7.2}",
            name,
            ms(t),
            t.as_secs_f64() / reference.as_secs_f64()
        );
    }
}

/// Best wall time of `f` over at least 10 calls and about `budget`, after one warm-up call.
fn best_within(budget: Duration, mut f: impl FnMut()) -> Duration {
    f();
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut calls = 0;
    while calls < 10 || (start.elapsed() < budget && calls < 100_000) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
        calls += 1;
    }
    best
}

/// Deterministic codes in `[lo, hi]`.
fn codes(len: usize, seed: u64, lo: i32, hi: i32) -> Vec<i32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + ((s >> 33) % (hi - lo + 1) as u64) as i32
        })
        .collect()
}

/// `quant_core::int8` against `f32` on the same shapes, on the calling thread (a one-thread
/// pool): `gemm_u8` on every path this CPU has against dfdx's matmul, requantization against a
/// memcpy of the accumulators.
fn int8() {
    use dfdx::prelude::*;
    let budget = Duration::from_millis(60);
    let dev: Cpu = Default::default();
    let paths = Isa::available();
    println!();
    println!(
        "int8 GEMM, one thread: time of gemm_u8 (u8 activations x centered weights + bias -> i32) \
         / time of dfdx's f32 matmul x · wᵀ of the same shape; detected path: {}",
        Isa::detected()
    );
    // The digits MLP 64-256-256-10 at batch 64 and 360, and a CNN layer's im2col rows
    // (batch 64 × 8x8 positions, 3x3x16 fan-in, 32 channels).
    let shapes: [(&str, usize, usize, usize); 7] = [
        ("MLP fc1, batch 64", 64, 64, 256),
        ("MLP fc2, batch 64", 64, 256, 256),
        ("MLP fc3, batch 64", 64, 256, 10),
        ("MLP fc1, batch 360", 360, 64, 256),
        ("MLP fc2, batch 360", 360, 256, 256),
        ("MLP fc3, batch 360", 360, 256, 10),
        ("CNN conv 3x3x16->32, batch 64", 64 * 64, 144, 32),
    ];
    for (bits, (w_lo, w_hi)) in [(8, (-127, 127)), (4, (-8, 7))] {
        print!("\n{:<32} {:>10}", format!("W{bits}A8 (m x k -> n)"), "f32");
        for isa in &paths {
            print!(" {:>20}", isa.name());
        }
        println!();
        let mut total = vec![(Duration::ZERO, Duration::ZERO); paths.len()];
        let mut total_f32 = [Duration::ZERO; 2];
        for (name, m, k, n) in shapes {
            let a: Vec<u8> = codes(m * k, 1, 0, 255).iter().map(|c| *c as u8).collect();
            let w = codes(n * k, 2, w_lo, w_hi);
            let bias = codes(n, 3, -1000, 1000);
            let x = dev.tensor_from_vec(a.iter().map(|c| *c as f32 * 0.01).collect(), (m, k));
            let wf = dev.tensor_from_vec(w.iter().map(|c| *c as f32 * 0.01).collect(), (n, k));
            let mut out = vec![0i32; m * n];
            let packed: Vec<PackedMatrix> = paths
                .iter()
                .map(|isa| PackedMatrix::with_isa(&w, n, k, *isa).expect("available path"))
                .collect();
            let mut t_f32 = Duration::MAX;
            let mut t_int = vec![Duration::MAX; paths.len()];
            for _ in 0..3 {
                t_f32 = t_f32.min(best_within(budget, || {
                    let wt = wf.clone().permute::<(usize, usize), Axes2<1, 0>>();
                    black_box(x.clone().matmul(wt));
                }));
                for (t, p) in t_int.iter_mut().zip(&packed) {
                    *t = (*t).min(best_within(budget, || {
                        gemm_u8(black_box(&a), m, 3, p, &bias, &mut out).expect("valid shapes");
                        black_box(&out);
                    }));
                }
            }
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            print!(
                "{:<32} {:>8.1}µs",
                format!("{name} ({m}x{k}->{n})"),
                us(t_f32)
            );
            for (t, total) in t_int.iter().zip(total.iter_mut()) {
                print!(
                    " {:>9.1}µs {:>6.2}x",
                    us(*t),
                    t.as_secs_f64() / t_f32.as_secs_f64()
                );
                if name.starts_with("MLP") {
                    let batch = usize::from(m == 360);
                    if batch == 0 {
                        total.0 += *t;
                    } else {
                        total.1 += *t;
                    }
                }
            }
            if name.starts_with("MLP") {
                total_f32[usize::from(m == 360)] += t_f32;
            }
            println!();
        }
        for (batch, i) in [(64, 0), (360, 1)] {
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            print!(
                "{:<32} {:>8.1}µs",
                format!("MLP's 3 products, batch {batch}"),
                us(total_f32[i])
            );
            for t in &total {
                let t = if i == 0 { t.0 } else { t.1 };
                print!(
                    " {:>9.1}µs {:>6.2}x",
                    us(t),
                    t.as_secs_f64() / total_f32[i].as_secs_f64()
                );
            }
            println!();
        }
    }

    println!();
    println!(
        "requantization, one thread: time of Requantizer::run (i32 accumulators -> u8 codes) / \
         time of a memcpy of the accumulators (4 bytes per value)"
    );
    print!("{:<32} {:>10}", "accumulators [rows, channels]", "memcpy");
    for isa in &paths {
        print!(" {:>20}", isa.name());
    }
    println!();
    for (rows, n, rounding) in [
        (360, 256, RoundingPolicy::HalfEven),
        (64 * 64, 32, RoundingPolicy::HalfEven),
        (360, 256, RoundingPolicy::Floor),
    ] {
        let acc = codes(rows * n, 4, -200_000, 200_000);
        let multipliers: Vec<(i64, u32)> = (0..n)
            .map(|o| fixed_point_multiplier(0.0004 + o as f64 * 1e-6).expect("positive"))
            .collect();
        let mut copy = vec![0i32; acc.len()];
        let mut out = vec![0u8; acc.len()];
        let requantizers: Vec<Requantizer> = paths
            .iter()
            .map(|isa| {
                Requantizer::new(&multipliers, 128, 0, 255, rounding)
                    .and_then(|q| q.with_isa(*isa))
                    .expect("valid parameters")
            })
            .collect();
        let mut t_copy = Duration::MAX;
        let mut t_q = vec![Duration::MAX; paths.len()];
        for _ in 0..3 {
            t_copy = t_copy.min(best_within(budget, || {
                copy.copy_from_slice(black_box(&acc));
                black_box(&copy);
            }));
            for (t, q) in t_q.iter_mut().zip(&requantizers) {
                *t = (*t).min(best_within(budget, || {
                    q.run(black_box(&acc), &mut out).expect("valid lengths");
                    black_box(&out);
                }));
            }
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        print!(
            "{:<32} {:>8.1}µs",
            format!("[{rows}, {n}] {rounding:?}"),
            us(t_copy)
        );
        for t in &t_q {
            print!(
                " {:>9.1}µs {:>6.2}x",
                us(*t),
                t.as_secs_f64() / t_copy.as_secs_f64()
            );
        }
        println!();
    }
}

/// The detected path's `gemm_u8` on the largest shapes, on one thread and on rayon's default
/// pool (products of at least `PARALLEL_MACS` multiply-adds are split by rows).
fn int8_threads(one: &rayon::ThreadPool, all: &rayon::ThreadPool) {
    let budget = Duration::from_millis(60);
    println!();
    println!(
        "int8 GEMM on {} threads against one thread ({} path)",
        all.current_num_threads(),
        Isa::detected()
    );
    for (name, m, k, n) in [
        ("MLP fc2, batch 360", 360, 256, 256),
        ("CNN conv 3x3x16->32, batch 64", 64 * 64, 144, 32),
    ] {
        let a: Vec<u8> = codes(m * k, 1, 0, 255).iter().map(|c| *c as u8).collect();
        let w = PackedMatrix::new(&codes(n * k, 2, -127, 127), n, k).expect("valid weights");
        let bias = codes(n, 3, -1000, 1000);
        let mut out = vec![0i32; m * n];
        let mut run = || {
            gemm_u8(black_box(&a), m, 3, &w, &bias, &mut out).expect("valid shapes");
            black_box(&out);
        };
        let (mut t1, mut tn) = (Duration::MAX, Duration::MAX);
        for _ in 0..3 {
            t1 = t1.min(one.install(|| best_within(budget, &mut run)));
            tn = tn.min(all.install(|| best_within(budget, &mut run)));
        }
        println!(
            "{:<32} {:>8.1}µs on 1 thread, {:>8.1}µs on {}: {:.2}x",
            format!("{name} ({m}x{k}->{n})"),
            t1.as_secs_f64() * 1e6,
            tn.as_secs_f64() * 1e6,
            all.current_num_threads(),
            tn.as_secs_f64() / t1.as_secs_f64()
        );
    }
}

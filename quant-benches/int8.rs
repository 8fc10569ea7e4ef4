//! The int8 kernels against `f32` on the same shapes, one thread, on every instruction-set
//! path this CPU has:
//!
//! ```text
//! cargo bench -p quant-benches --bench int8              # add `-- gemm` or `-- requantize` to filter
//! ```
//!
//! - `gemm_u8` (u8 activations × centered weights + bias → i32) against dfdx's `f32` matmul
//!   `x · wᵀ` of the same shape: the digits MLP's layers at batch 64 and 360 and a CNN layer's
//!   im2col rows, with 8-bit and 4-bit weights;
//! - `Requantizer::run` (i32 accumulators → u8 codes) against a memcpy of the accumulators;
//! - the transformer kernels (softmax, at an 8-bit and at a 4-bit attention's scale, LayerNorm,
//!   GELU, both attention products) of the MNIST ViT at batch 64 against a memcpy of their
//!   output (`-- softmax`, `-- attention`, ...);
//! - the detected path's `gemm_u8` on rayon's default pool against one thread.
//!
//! Each baseline sits in its kernel's criterion group; at the end a summary prints each
//! kernel's time as a ratio to its baseline, the median of per-round ratios of interleaved
//! rounds in this process (a noisy neighbour slows both sides alike).

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion};
use dfdx::prelude::*;
use quant_core::int8::nonlinear::{IntGelu, IntLayerNorm, IntSoftmax};
use quant_core::int8::{
    attention_context_u8, attention_scores_u8, fixed_point_multiplier, gemm_u8, AttentionShape,
    Isa, PackedMatrix, Requantizer,
};
use quant_core::RoundingPolicy;

/// (name, rows m, fan-in k, outputs n): the digits MLP 64-256-256-10 at batch 64 and 360, and
/// a CNN layer's im2col rows (batch 64 × 8x8 positions, 3x3x16 fan-in, 32 channels).
const GEMM_SHAPES: [(&str, usize, usize, usize); 7] = [
    ("MLP fc1 b64", 64, 64, 256),
    ("MLP fc2 b64", 64, 256, 256),
    ("MLP fc3 b64", 64, 256, 10),
    ("MLP fc1 b360", 360, 64, 256),
    ("MLP fc2 b360", 360, 256, 256),
    ("MLP fc3 b360", 360, 256, 10),
    ("CNN conv b64", 64 * 64, 144, 32),
];

/// (bits, weight codes' range).
const WEIGHTS: [(u32, (i32, i32)); 2] = [(8, (-127, 127)), (4, (-8, 7))];

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

/// One case: a baseline and the same work by each kernel, as closures over prepared buffers.
struct Case {
    group: String,
    baseline: (&'static str, Box<dyn FnMut() + Send>),
    kernels: Vec<(String, Box<dyn FnMut() + Send>)>,
}

fn gemm_cases(dev: &Cpu) -> Vec<Case> {
    let mut cases = Vec::new();
    for (bits, (w_lo, w_hi)) in WEIGHTS {
        for (name, m, k, n) in GEMM_SHAPES {
            let a: Vec<u8> = codes(m * k, 1, 0, 255).iter().map(|c| *c as u8).collect();
            let w = codes(n * k, 2, w_lo, w_hi);
            let bias = codes(n, 3, -1000, 1000);
            let x = dev.tensor_from_vec(a.iter().map(|c| *c as f32 * 0.01).collect(), (m, k));
            let wf = dev.tensor_from_vec(w.iter().map(|c| *c as f32 * 0.01).collect(), (n, k));
            let baseline: Box<dyn FnMut() + Send> = Box::new(move || {
                let wt = wf.clone().permute::<(usize, usize), Axes2<1, 0>>();
                black_box(x.clone().matmul(wt));
            });
            let kernels = Isa::available()
                .into_iter()
                .map(|isa| {
                    let packed = PackedMatrix::with_isa(&w, n, k, isa).expect("available path");
                    let (a, bias) = (a.clone(), bias.clone());
                    let mut out = vec![0i32; m * n];
                    let run: Box<dyn FnMut() + Send> = Box::new(move || {
                        gemm_u8(black_box(&a), m, 3, &packed, &bias, &mut out)
                            .expect("valid shapes");
                        black_box(&out);
                    });
                    (isa.name().to_string(), run)
                })
                .collect();
            cases.push(Case {
                group: format!("gemm W{bits}A8 {name} ({m}x{k}->{n})"),
                baseline: ("f32 matmul (dfdx)", baseline),
                kernels,
            });
        }
    }
    cases
}

fn requantize_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // The last case's multipliers (shift 55, as a W4A4 ViT has) are too small for the `f64`
    // product to be exact: the vector paths take them in integer lanes (32-bit on AVX2,
    // 64-bit on AVX-512).
    for (rows, n, rounding, multiplier, reach) in [
        (360, 256, RoundingPolicy::HalfEven, 0.0004, 200_000),
        (64 * 64, 32, RoundingPolicy::HalfEven, 0.0004, 200_000),
        (360, 256, RoundingPolicy::Floor, 0.0004, 200_000),
        (1024, 48, RoundingPolicy::HalfEven, 3e-8, 1 << 30),
    ] {
        let acc = codes(rows * n, 4, -reach, reach);
        let multipliers: Vec<(i64, u32)> = (0..n)
            .map(|o| {
                fixed_point_multiplier(multiplier * (1.0 + o as f64 * 0.0025)).expect("positive")
            })
            .collect();
        let baseline: Box<dyn FnMut() + Send> = {
            let acc = acc.clone();
            let mut copy = vec![0i32; acc.len()];
            Box::new(move || {
                copy.copy_from_slice(black_box(&acc));
                black_box(&copy);
            })
        };
        let kernels = Isa::available()
            .into_iter()
            .map(|isa| {
                let q = Requantizer::new(&multipliers, 128, 0, 255, rounding)
                    .and_then(|q| q.with_isa(isa))
                    .expect("valid parameters");
                let acc = acc.clone();
                let mut out = vec![0u8; acc.len()];
                let run: Box<dyn FnMut() + Send> = Box::new(move || {
                    q.run(black_box(&acc), &mut out).expect("valid lengths");
                    black_box(&out);
                });
                (isa.name().to_string(), run)
            })
            .collect();
        cases.push(Case {
            group: format!("requantize [{rows}, {n}] {rounding:?}"),
            baseline: ("memcpy of the accumulators", baseline),
            kernels,
        });
    }
    cases
}

/// The transformer kernels of the MNIST ViT (16 tokens of 64 features, 4 heads, MLP 128) at
/// batch 64 on every path, each against a memcpy of its output: softmax over rows of 16
/// scores, LayerNorm over rows of 64 codes, GELU of 8-bit codes (a table) and of 16-bit codes
/// (evaluated), and both attention products.
fn transformer_cases() -> Vec<Case> {
    let (n, tokens, width, heads, hidden) = (64, 16, 64, 4, 128);
    let shape = AttentionShape {
        queries: tokens,
        keys: tokens,
        features: width,
        heads,
    };
    let memcpy = |len: usize| -> (&'static str, Box<dyn FnMut() + Send>) {
        let (from, mut to) = (vec![1i32; len], vec![0i32; len]);
        let copy: Box<dyn FnMut() + Send> = Box::new(move || {
            to.copy_from_slice(black_box(&from));
            black_box(&to);
        });
        ("memcpy of the output", copy)
    };
    let per_path = |mut make: Box<dyn FnMut(Isa) -> Box<dyn FnMut() + Send>>| {
        Isa::available()
            .into_iter()
            .map(|isa| (isa.name().to_string(), make(isa)))
            .collect::<Vec<_>>()
    };
    let scores_len = n * heads * tokens * tokens;
    let scores = codes(scores_len, 5, -40_000, 40_000);
    let softmax = IntSoftmax::deployed(2e-4, tokens).expect("valid softmax");
    // A 4-bit attention's scores: a coarse scale, where `exp` comes from a table.
    let coarse_scores = codes(scores_len, 12, -2_000, 2_000);
    let coarse_softmax = IntSoftmax::deployed(0.04, tokens).expect("valid softmax");
    let rows = codes(n * tokens * width, 6, 0, 255);
    let gamma: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 / width as f32).collect();
    let layer_norm = IntLayerNorm::new(0.05, 0..=255, &gamma, &gamma, 1e-5).expect("valid");
    let hidden_codes = codes(n * tokens * hidden, 7, 0, 255);
    let gelu8 = IntGelu::deployed(0.05, 128, 0..=255).expect("valid GELU");
    let gelu16 = IntGelu::deployed(2e-4, 0, -32768..=32767).expect("valid GELU");
    let wide_codes = codes(n * tokens * hidden, 8, -32768, 32767);
    let bytes = |len: usize, seed: u64| -> Vec<u8> {
        codes(len, seed, 0, 255).iter().map(|c| *c as u8).collect()
    };
    let (q, k, p) = (
        bytes(n * tokens * width, 9),
        bytes(n * tokens * width, 10),
        bytes(scores_len, 11),
    );
    let softmax_case = |label: &str, softmax: IntSoftmax, scores: Vec<i32>| Case {
        group: format!("{label} [{}, {tokens}]", scores_len / tokens),
        baseline: memcpy(scores_len),
        kernels: per_path(Box::new(move |isa| {
            let (k, x, mut out) = (
                softmax.clone().with_isa(isa).expect("available"),
                scores.clone(),
                vec![0i32; scores_len],
            );
            Box::new(move || k.run(black_box(&x), &mut out).expect("whole rows"))
        })),
    };
    let mut cases = vec![
        softmax_case("softmax", softmax, scores),
        softmax_case("softmax, 4-bit scale", coarse_softmax, coarse_scores),
        Case {
            group: format!("layer norm [{}, {width}]", n * tokens),
            baseline: memcpy(rows.len()),
            kernels: per_path(Box::new(move |isa| {
                let (k, x, mut out) = (
                    layer_norm.clone().with_isa(isa).expect("available"),
                    rows.clone(),
                    vec![0i32; rows.len()],
                );
                Box::new(move || k.run(black_box(&x), &mut out).expect("whole rows"))
            })),
        },
        Case {
            group: format!("gelu 8-bit codes (table) [{}]", hidden_codes.len()),
            baseline: memcpy(hidden_codes.len()),
            kernels: per_path(Box::new(move |isa| {
                let (k, x, mut out) = (
                    gelu8.clone().with_isa(isa).expect("available"),
                    hidden_codes.clone(),
                    vec![0i32; hidden_codes.len()],
                );
                Box::new(move || k.run(black_box(&x), &mut out).expect("same lengths"))
            })),
        },
        Case {
            group: format!("gelu 16-bit codes (evaluated) [{}]", wide_codes.len()),
            baseline: memcpy(wide_codes.len()),
            kernels: per_path(Box::new(move |isa| {
                let (k, x, mut out) = (
                    gelu16.clone().with_isa(isa).expect("available"),
                    wide_codes.clone(),
                    vec![0i32; wide_codes.len()],
                );
                Box::new(move || k.run(black_box(&x), &mut out).expect("same lengths"))
            })),
        },
    ];
    // Both products on 8-bit codes (zero points 128: on the VNNI paths the keys and values fit
    // `i8`, so the products run on the int8 GEMM's tiles; without VNNI, on `i16` pairs) and on
    // 4-bit codes (zero points 8: the tiles on every path).
    let narrow = |len: usize, seed: u64| -> Vec<u8> {
        codes(len, seed, 0, 15).iter().map(|c| *c as u8).collect()
    };
    let inputs = [
        ("8-bit", (q, k, p), 128),
        (
            "4-bit",
            (
                narrow(n * tokens * width, 9),
                narrow(n * tokens * width, 10),
                narrow(scores_len, 11),
            ),
            8,
        ),
    ];
    for (bits, (q, k, p), zero) in inputs {
        cases.push(Case {
            group: format!("attention scores {bits} codes {n} x {shape:?}"),
            baseline: memcpy(scores_len),
            kernels: per_path(Box::new({
                let (q, k) = (q.clone(), k.clone());
                move |isa| {
                    let (q, k, mut out) = (q.clone(), k.clone(), vec![0i32; scores_len]);
                    Box::new(move || {
                        attention_scores_u8(isa, black_box(&q), &k, shape, [zero, zero], &mut out)
                            .expect("valid shape")
                    })
                }
            })),
        });
        cases.push(Case {
            group: format!("attention context {bits} codes {n} x {shape:?}"),
            baseline: memcpy(n * tokens * width),
            kernels: per_path(Box::new(move |isa| {
                let (p, v, mut out) = (p.clone(), k.clone(), vec![0i32; n * tokens * width]);
                Box::new(move || {
                    attention_context_u8(isa, black_box(&p), &v, shape, [0, zero], &mut out)
                        .expect("valid shape")
                })
            })),
        });
    }
    cases
}

/// The detected path on rayon's default pool against the same on one thread (the baseline).
fn thread_cases(one: &'static rayon::ThreadPool, all: &'static rayon::ThreadPool) -> Vec<Case> {
    let mut cases = Vec::new();
    for (name, m, k, n) in [
        ("MLP fc2 b360", 360, 256, 256),
        ("CNN conv b64", 64 * 64, 144, 32),
    ] {
        let a: Vec<u8> = codes(m * k, 1, 0, 255).iter().map(|c| *c as u8).collect();
        let w = std::sync::Arc::new(
            PackedMatrix::new(&codes(n * k, 2, -127, 127), n, k).expect("valid weights"),
        );
        let bias = codes(n, 3, -1000, 1000);
        let on = |pool: &'static rayon::ThreadPool| -> Box<dyn FnMut() + Send> {
            let (a, w, bias) = (a.clone(), w.clone(), bias.clone());
            let mut out = vec![0i32; m * n];
            Box::new(move || {
                pool.install(|| gemm_u8(black_box(&a), m, 3, &w, &bias, &mut out))
                    .expect("valid shapes");
                black_box(&out);
            })
        };
        cases.push(Case {
            group: format!("gemm threads {name} ({m}x{k}->{n}), {}", Isa::detected()),
            baseline: ("1 thread", on(one)),
            kernels: vec![(format!("{} threads", all.current_num_threads()), on(all))],
        });
    }
    cases
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds of one call of `f`: the median of 5 timings of enough calls to take about 2 ms.
fn seconds(f: &mut dyn FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let calls = ((2e-3 / t.elapsed().as_secs_f64().max(1e-9)) as usize).clamp(1, 100_000);
    median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..calls {
                    f();
                }
                t.elapsed().as_secs_f64() / calls as f64
            })
            .collect(),
    )
}

/// The ratio table: per case, interleaved rounds of the baseline and each kernel.
fn summary(cases: &mut [Case]) {
    println!("\nsummary: time / baseline, median of 11 interleaved rounds");
    for case in cases {
        let mut ratios = vec![Vec::new(); case.kernels.len()];
        let mut base = Vec::new();
        for _ in 0..11 {
            let b = seconds(&mut case.baseline.1);
            base.push(b);
            for (r, (_, k)) in ratios.iter_mut().zip(&mut case.kernels) {
                r.push(seconds(k) / b);
            }
        }
        print!(
            "{:<44} {}: {:>9.1} µs",
            case.group,
            case.baseline.0,
            median(base) * 1e6
        );
        for (r, (name, _)) in ratios.into_iter().zip(&case.kernels) {
            print!("  {name} {:.2}x", median(r));
        }
        println!();
    }
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let one: &'static rayon::ThreadPool = Box::leak(Box::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a thread pool"),
    ));
    let all: &'static rayon::ThreadPool = Box::leak(Box::new(
        rayon::ThreadPoolBuilder::new()
            .build()
            .expect("a thread pool"),
    ));
    let dev: Cpu = Default::default();
    let mut cases: Vec<Case> = one.install(|| {
        let mut cases = gemm_cases(&dev);
        cases.extend(requantize_cases());
        cases.extend(transformer_cases());
        cases
    });
    cases.extend(thread_cases(one, all));
    cases.retain(|c| c.group.contains(&filter));
    println!("detected path: {}", Isa::detected());
    let mut c = Criterion::default().configure_from_args();
    for case in &mut cases {
        let mut group = c.benchmark_group(&case.group);
        group.sample_size(20);
        // dfdx's matmul would use every thread of the global pool: one thread for both sides.
        let baseline = &mut case.baseline;
        group.bench_function(baseline.0, |b| b.iter(|| one.install(&mut baseline.1)));
        for (name, kernel) in &mut case.kernels {
            group.bench_function(BenchmarkId::from_parameter(&*name), |b| {
                b.iter(|| one.install(&mut *kernel))
            });
        }
        group.finish();
    }
    c.final_summary();
    one.install(|| summary(&mut cases));
}

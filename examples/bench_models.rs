//! Model-level benchmarks, each against its float baseline in the same process:
//!
//! 1. QAT overhead: one training step (forward, backward, Adam update, gradients zeroed for
//!    the next step, as the pipeline trains) of the float MLP and of the W4A4 LSQ-quantized
//!    MLP, batch 64, one thread.
//! 2. Integer inference: the exported W4A4 integer model against the float dfdx model it was
//!    converted from (BatchNorm folded, as exported), for every network of the main job (MLP,
//!    CNN, ResNet, ViT), on the test split (360 images) and on a batch of 64 with one thread, and
//!    on the test split with rayon's default pool (every core).
//!
//! The two sides of a comparison are timed in alternating blocks of consecutive runs (a block
//! of float runs, a block of quantized runs, and so on) and compared by their medians: a change
//! in the machine's load while the benchmark runs affects both sides alike, and each side
//! runs as it would in a loop of its own (alternating single runs would make each side start
//! from the memory the other left behind). The models are untrained (random weights,
//! calibrated on 4 training batches): their speed does not depend on the values.
//!
//! Run: `cargo run --release --example bench_models [qat] [mlp] [cnn] [resnet] [vit]` (no
//! argument: every section).

use std::time::{Duration, Instant};

use dfdx::optim::{Adam, AdamConfig, Optimizer};
use dfdx::prelude::*;
use quant::data::Dataset;
use quant::digits;
use quant::pipeline::nets;
use quant::pipeline::train::{input, targets, Logits, Taped};
use quant::pipeline::{quantize, BatchShape, DeployModel, FloatModel, Model};
use quant_ops::layers::{QuantizedModuleExt, QuantizerMode};
use quant_ops::lower::export_model;
use quant_ops::policy::Policy;
use quant_runtime::integer::IntegerModel;

type BoxError = Box<dyn std::error::Error>;

/// The policy benchmarked: LSQ, 4-bit weights (per channel) and inputs.
const W4A4: &str = "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n\
                    [input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n";

/// Consecutive runs of one side before the other side's turn.
const BLOCK: usize = 8;
/// Time spent measuring each side of a comparison (beyond warm-up).
const BUDGET: Duration = Duration::from_millis(800);

/// Medians of the run times of `a` and of `b`, timed in alternating blocks of [`BLOCK`] runs
/// (after one warm-up block each), for about [`BUDGET`] per side and at least 8 blocks each.
fn compare(mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    fn block(f: &mut dyn FnMut(), times: &mut Vec<Duration>) {
        for _ in 0..BLOCK {
            let start = Instant::now();
            f();
            times.push(start.elapsed());
        }
    }
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    block(&mut a, &mut ta);
    block(&mut b, &mut tb);
    let per_block = ta.iter().chain(&tb).sum::<Duration>() / 2;
    let blocks = (BUDGET.as_secs_f64() / per_block.as_secs_f64().max(1e-9)).clamp(8.0, 500.0);
    ta.clear();
    tb.clear();
    for _ in 0..blocks as usize {
        block(&mut a, &mut ta);
        block(&mut b, &mut tb);
    }
    (median(ta), median(tb))
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// The CPU's model name (Linux), for the figures' record.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The quantized `model` under `policy`, calibrated on 4 training batches.
fn calibrated<S: BatchShape, const C: usize, F, D: DeployModel<S, C>>(
    model: &Model<S, C, F, D>,
    dev: &Cpu,
    float: &F,
    policy: &str,
    data: &Dataset,
) -> Result<D::Quantized, BoxError> {
    let policy = Policy::from_toml_str(policy, "bench policy")?;
    Ok(quantize::<S, C, D>(
        dev,
        &model.deploy(float),
        &policy,
        &data.train,
        4,
        64,
        0,
    )?)
}

/// One training step as the pipeline takes it: forward with the gradients of the last step
/// (zeroed), backward, Adam update, gradients zeroed for the next step.
fn train_step<M>(
    model: &mut M,
    opt: &mut Adam<M, f32, Cpu>,
    grads: &mut Option<dfdx::tensor::Gradients<f32, Cpu>>,
    x: &Tensor<(usize, Const<64>), f32, Cpu>,
    y: &Tensor<(usize, Const<10>), f32, Cpu>,
) where
    M: TensorCollection<f32, Cpu>
        + ModuleMut<Tensor<(usize, Const<64>), f32, Cpu, Taped>, Output = Logits<10, Taped>>,
    <M as ModuleMut<Tensor<(usize, Const<64>), f32, Cpu, Taped>>>::Error: std::fmt::Debug,
{
    let g = grads.take().unwrap_or_else(|| model.alloc_grads());
    let logits = model.try_forward_mut(x.clone().traced(g)).expect("forward");
    let mut g = cross_entropy_with_logits_loss(logits, y.clone()).backward();
    opt.update(model, &g).expect("update");
    model.zero_grads(&mut g);
    *grads = Some(g);
}

/// Section 1: the W4A4 LSQ QAT step against the float step, MLP, batch 64, one thread.
fn qat_step(data: &Dataset, single: &rayon::ThreadPool) -> Result<(), BoxError> {
    let mlp = nets::mlp();
    let dev = Cpu::seed_from_u64(0);
    let float = mlp.build(&dev);
    let mut qat = calibrated(&mlp, &dev, &float, W4A4, data)?;
    qat.set_mode("*", QuantizerMode::Training)?;

    let idx: Vec<usize> = (0..64).collect();
    let (pixels, labels) = data.train.gather(&idx);
    let x = input::<(usize, Const<64>)>(&dev, pixels, 64)?;
    let y = dev.tensor_from_vec(targets(&labels, 10, 0.0), (64usize, Const::<10>));

    let (t_float, t_qat) = single.install(|| {
        let mut f = float.clone();
        let mut f_opt = Adam::new(&f, AdamConfig::default());
        let mut f_grads = None;
        let mut q = qat.clone();
        let mut q_opt = Adam::new(&q, AdamConfig::default());
        let mut q_grads = None;
        compare(
            || train_step(&mut f, &mut f_opt, &mut f_grads, &x, &y),
            || train_step(&mut q, &mut q_opt, &mut q_grads, &x, &y),
        )
    });
    println!("1. One training step, MLP 64-256-256-10, batch 64, one thread");
    println!("   float step            {:>9.1} µs", micros(t_float));
    println!("   W4A4 LSQ QAT step     {:>9.1} µs", micros(t_qat));
    println!("   ratio QAT / float     {:>9.2}x", ratio(t_qat, t_float));
    Ok(())
}

/// Section 2, one network: its float model (deployable form) against its exported integer
/// model, at batch 360 and 64 on one thread, and at 360 on rayon's default pool.
fn inference<S, const C: usize, F, D>(
    name: &str,
    model: &Model<S, C, F, D>,
    data: &Dataset,
    single: &rayon::ThreadPool,
) -> Result<(), BoxError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C> + Module<Tensor<S, f32, Cpu>, Output = Logits<C>>,
    <D as Module<Tensor<S, f32, Cpu>>>::Error: std::fmt::Debug,
{
    let dev = Cpu::seed_from_u64(0);
    let float = model.build(&dev);
    let quantized = calibrated(model, &dev, &float, W4A4, data)?;
    let deploy = model.deploy(&float);
    let integer = IntegerModel::new(&export_model(
        &quantized,
        &model.sample_shape(),
        Default::default(),
    )?)?;
    let pixels = data.test.sample_len();
    let mut integer_360 = [Duration::ZERO; 2];
    for (n, pool) in [
        (data.test.len(), Some(single)),
        (64, Some(single)),
        (data.test.len(), None),
    ] {
        let images = data.test.features()[..n * pixels].to_vec();
        let x = input::<S>(&dev, images.clone(), n)?;
        let measure = || {
            compare(
                || {
                    let _ = deploy.try_forward(x.clone()).expect("float forward");
                },
                || {
                    let _ = integer.forward(&images).expect("integer forward");
                },
            )
        };
        let (t_float, t_integer, threads) = match pool {
            Some(p) => {
                let (f, i) = p.install(measure);
                (f, i, 1)
            }
            None => {
                let (f, i) = measure();
                (f, i, rayon::current_num_threads())
            }
        };
        if n == data.test.len() {
            integer_360[usize::from(pool.is_none())] = t_integer;
        }
        println!(
            "   {name:<6} {n:>5} {threads:>7}  {:>10.1}  {:>12.1}  {:>13.2}x",
            micros(t_float),
            micros(t_integer),
            ratio(t_integer, t_float)
        );
    }
    println!(
        "   {name:<6} integer, batch {}: speed-up on all threads {:.2}x (one-thread time / all-thread time)",
        data.test.len(),
        ratio(integer_360[0], integer_360[1])
    );
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let data = digits::bundled()?;
    let single = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    println!(
        "{}, {} threads in rayon's default pool; medians of alternating blocks of {BLOCK} runs\n",
        cpu_name(),
        rayon::current_num_threads()
    );
    // Optional filter: the section names to run (`qat`, `mlp`, `cnn`, `resnet`, `vit`).
    let only: Vec<String> = std::env::args().skip(1).map(|a| a.to_lowercase()).collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    if wanted("qat") {
        qat_step(&data, &single)?;
    }
    println!("\n2. Inference: the float dfdx model (BatchNorm folded) against its exported W4A4 integer model");
    println!("   model  batch threads  float (µs)  integer (µs)  integer/float");
    if wanted("mlp") {
        inference("MLP", &nets::mlp(), &data, &single)?;
    }
    if wanted("cnn") {
        inference("CNN", &nets::cnn(), &data, &single)?;
    }
    if wanted("resnet") {
        inference("ResNet", &nets::resnet(), &data, &single)?;
    }
    if wanted("vit") {
        inference("ViT", &nets::vit(), &data, &single)?;
    }
    Ok(())
}

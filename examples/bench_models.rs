//! Model-level benchmarks, each against its float baseline in the same process:
//!
//! 1. QAT overhead: one training step (forward, backward, Adam update, gradients zeroed for
//!    the next step, as the pipeline trains) of each float network and of its W4A4
//!    LSQ-quantized model, batch 64, one thread.
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
//! 3. MNIST training steps (`train28`) and 4. the MNIST ViT's integer inference (`vit28`), as
//!    above on the MNIST data of `configs/`, only when named.
//!
//! Run: `cargo run --release --example bench_models [qat] [mlp] [cnn] [resnet] [vit] [train28]
//! [vit28] [--max-isa avx2]` (no section named: sections 1 and 2).
//!
//! For a profiler: `bench_models --step-only MODEL float|qat [--steps N]` runs only that
//! model's training step (`mlp`, `cnn`, `resnet`, `vit` on the digits as in section 1, but the
//! float model as trained; `cnn28`, `vit28` on MNIST as in section 3), `N` times (default
//! 150) on a thread of a pool of rayon's default size (`RAYON_NUM_THREADS=1` for one thread),
//! as section 1 runs its steps, and prints the median,
//! so that `perf record` sees one model and one kind of step.

use std::time::{Duration, Instant};

use dfdx::prelude::*;
use quant::data::Dataset;
use quant::digits;
use quant::integer::IntegerModel;
use quant::layers::{QuantizedModuleExt, QuantizerMode};
use quant::lower::export_model;
use quant::pipeline::config::{Optimizer as PipelineOptimizer, Schedule};
use quant::pipeline::nets;
use quant::pipeline::train::{input, Logits, Phase, Taped, Trainer};
use quant::pipeline::{
    quantize, BatchShape, DeployModel, FloatModel, Model, QuantizedModel, RunConfig,
};
use quant::policy::Policy;

type BoxError = Box<dyn std::error::Error>;

/// The policy benchmarked: LSQ, 4-bit weights (per channel) and inputs.
const W4A4: &str = "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n\
                    [input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n";

/// Consecutive runs of one side before the other side's turn.
const BLOCK: usize = 8;
/// Time spent measuring each side of a comparison (beyond warm-up).
const BUDGET: Duration = Duration::from_millis(800);

/// Blocks per side that training steps are timed over: a fixed count, not [`BUDGET`]'s. Each
/// step trains its model further on the same batch, and after about a thousand steps they slow
/// down (values fading into subnormals: the digits MLP's float step took 2x its early time by
/// step 3,000), so a count that grew with the speed timed a faster build on slower steps.
const TRAINING_BLOCKS: usize = 24;

/// Medians of the run times of `a` and of `b`, timed in alternating blocks of [`BLOCK`] runs
/// (after one warm-up block each): `blocks` of them per side, or (`None`) as many as take
/// about [`BUDGET`] per side, at least 8.
fn compare(
    mut a: impl FnMut(),
    mut b: impl FnMut(),
    blocks: Option<usize>,
) -> (Duration, Duration) {
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
    let blocks = blocks.unwrap_or_else(|| {
        (BUDGET.as_secs_f64() / per_block.as_secs_f64().max(1e-9)).clamp(8.0, 500.0) as usize
    });
    ta.clear();
    tb.clear();
    for _ in 0..blocks {
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

/// The training phase both sides of section 1 step with: Adam at 1e-3, no decay, no
/// smoothing (the step's cost does not depend on them).
fn phase() -> Phase {
    Phase {
        epochs: 1,
        batch_size: 64,
        lr: 1e-3,
        schedule: Schedule::Constant,
        warmup_epochs: 0,
        shift: 0,
        optimizer: PipelineOptimizer::Adam,
        weight_decay: 0.0,
        label_smoothing: 0.0,
    }
}

/// The MNIST rows of `configs/` (the `train28` section's and `--step-only cnn28|vit28`'s).
fn mnist() -> Result<Dataset, BoxError> {
    let config = RunConfig::from_file(std::path::Path::new("configs/mnist_cnn_w4a4.toml"))?;
    Ok(quant::data::load(&config.data)?)
}

/// The median times of a training step of `a` and of `b` (a float model and a quantized one),
/// timed against each other (see [`compare`]).
fn steps<S: BatchShape, const C: usize, A, B>(
    dev: &Cpu,
    (mut a, mut b): (A, B),
    pixels: &[f32],
    labels: &[usize],
) -> Result<(Duration, Duration), quant::QuantError>
where
    A: FloatModel<S, C>,
    B: QuantizedModel<S, C>,
{
    let mut a_trainer = Trainer::<A, S, C>::new(dev, &a, &phase(), None)?;
    let mut b_trainer = Trainer::<B, S, C>::new(dev, &b, &phase(), None)?;
    Ok(compare(
        || {
            a_trainer
                .step(&mut a, pixels.to_vec(), labels, 1e-3)
                .expect("float step");
        },
        || {
            b_trainer
                .step(&mut b, pixels.to_vec(), labels, 1e-3)
                .expect("QAT step");
        },
        Some(TRAINING_BLOCKS),
    ))
}

/// What both training-step sections time: a network's float model, its W4A4 LSQ model
/// (calibrated, in training mode), and the first 64 training samples.
struct Training<F, Q> {
    dev: Cpu,
    float: F,
    qat: Q,
    pixels: Vec<f32>,
    labels: Vec<usize>,
}

fn training<S, const C: usize, F, D>(
    model: &Model<S, C, F, D>,
    data: &Dataset,
) -> Result<Training<F, D::Quantized>, BoxError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    let dev = Cpu::seed_from_u64(0);
    let float = model.build(&dev);
    let mut qat = calibrated(model, &dev, &float, W4A4, data)?;
    qat.set_mode("*", QuantizerMode::Training)?;
    let idx: Vec<usize> = (0..64).collect();
    let (pixels, labels) = data.train.gather(&idx);
    Ok(Training {
        dev,
        float,
        qat,
        pixels,
        labels,
    })
}

/// Section 1, one network: a training step as the pipeline takes it ([`Trainer::step`]:
/// forward, backward, Adam update, gradients zeroed for the next step), batch 64, one thread,
/// of the W4A4 LSQ-quantized model against the float model in the same form (BatchNorm
/// folded, as it is quantized: the same layers without quantizers, the overhead of
/// quantization) and against the float model as the pipeline trains it (BatchNorm in
/// training mode, where the network has it).
fn qat_step<S, const C: usize, F, D>(
    name: &str,
    model: &Model<S, C, F, D>,
    data: &Dataset,
    single: &rayon::ThreadPool,
) -> Result<(), BoxError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C> + FloatModel<S, C>,
{
    let Training {
        dev,
        float,
        qat,
        pixels,
        labels,
    } = training(model, data)?;
    let deploy = model.deploy(&float);
    // Moved in: a quantized model is Send but not Sync.
    let (folded, trained) = single.install(move || -> Result<_, quant::QuantError> {
        let trained = steps::<S, C, F, D::Quantized>(&dev, (float, qat.clone()), &pixels, &labels)?;
        let folded = steps::<S, C, D, D::Quantized>(&dev, (deploy, qat), &pixels, &labels)?;
        Ok((folded, trained))
    })?;
    println!(
        "   {name:<6} {:>10.1}  {:>10.1}  {:>9.2}x  {:>16.1}  {:>9.2}x",
        micros(folded.0),
        micros(folded.1),
        ratio(folded.1, folded.0),
        micros(trained.0),
        ratio(trained.1, trained.0),
    );
    Ok(())
}

/// Section 3, one network on MNIST (28x28): the float step (as the pipeline trains it) and the
/// W4A4 LSQ QAT step, batch 64, on one thread and on every core, timed against each other.
/// `tools/bench_pytorch_training.py` reads the `train28` lines.
fn mnist_steps<S, const C: usize, F, D>(
    name: &str,
    model: &Model<S, C, F, D>,
    data: &Dataset,
    single: &rayon::ThreadPool,
) -> Result<(), BoxError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    let Training {
        dev,
        float,
        qat,
        pixels,
        labels,
    } = training(model, data)?;
    for pool in [Some(single), None] {
        let (f, q, p, l, d) = (
            float.clone(),
            qat.clone(),
            pixels.clone(),
            labels.clone(),
            dev.clone(),
        );
        // Moved in: a quantized model is Send but not Sync.
        let measure = move || steps::<S, C, F, D::Quantized>(&d, (f, q), &p, &l);
        let ((t_float, t_qat), threads) = match pool {
            Some(pool) => (pool.install(measure)?, 1),
            None => (measure()?, rayon::current_num_threads()),
        };
        println!(
            "   {name:<6} {threads:>7}  {:>10.1}  {:>10.1}  {:>9.2}x",
            micros(t_float),
            micros(t_qat),
            ratio(t_qat, t_float)
        );
        println!(
            "train28 {} {threads} {:.1} {:.1}",
            name.to_lowercase(),
            micros(t_float),
            micros(t_qat)
        );
    }
    // On every core: each step with the pool's other threads kept awake (the default) against
    // the same step with `QUANT_KEEP_AWAKE=0` (they sleep between kernels).
    let keep_awake = |on: bool| {
        if on {
            std::env::remove_var("QUANT_KEEP_AWAKE");
        } else {
            std::env::set_var("QUANT_KEEP_AWAKE", "0");
        }
    };
    let (t_asleep, t_awake) =
        awake_against_asleep::<S, C, F>(&dev, &float, &pixels, &labels, keep_awake)?;
    let (q_asleep, q_awake) =
        awake_against_asleep::<S, C, D::Quantized>(&dev, &qat, &pixels, &labels, keep_awake)?;
    keep_awake(true);
    println!(
        "   {name:<6} {:>7}  kept awake / asleep: float {:.2}x ({:.1} / {:.1} µs), QAT {:.2}x ({:.1} / {:.1} µs)",
        rayon::current_num_threads(),
        ratio(t_awake, t_asleep),
        micros(t_awake),
        micros(t_asleep),
        ratio(q_awake, q_asleep),
        micros(q_awake),
        micros(q_asleep),
    );
    Ok(())
}

/// `--step-only`: `count` (at least 1) training steps of `model`'s float model, or of its W4A4
/// LSQ QAT model where `qat`, on a thread of a pool of rayon's default size, after three to warm
/// up; prints the median.
fn step_only<S, const C: usize, F, D>(
    model: &Model<S, C, F, D>,
    data: &Dataset,
    qat: bool,
    count: usize,
) -> Result<(), BoxError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    fn repeat<M, S: BatchShape, const C: usize>(
        dev: &Cpu,
        mut model: M,
        (pixels, labels): (&[f32], &[usize]),
        count: usize,
    ) -> Result<Duration, BoxError>
    where
        M: TensorCollection<f32, Cpu>
            + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>>
            + Send,
        <M as ModuleMut<Tensor<S, f32, Cpu, Taped>>>::Error: Into<quant::QuantError>,
    {
        let mut trainer = Trainer::<M, S, C>::new(dev, &model, &phase(), None)?;
        let mut times = Vec::with_capacity(count);
        for i in 0..count + 3 {
            let start = Instant::now();
            trainer.step(&mut model, pixels.to_vec(), labels, 1e-3)?;
            if i >= 3 {
                times.push(start.elapsed());
            }
        }
        Ok(median(times))
    }
    let Training {
        dev,
        float,
        qat: quantized,
        pixels,
        labels,
    } = training(model, data)?;
    // The steps run on a pool thread, as `bench_models qat` runs them: called from outside the
    // pool, every parallel section of a step would first wake a pool thread and wait for it
    // (the digits MLP's float step on one thread took 1.5x its time so).
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    let threads = pool.current_num_threads();
    // Moved in: a quantized model is Send but not Sync.
    let (side, time) = pool.install(move || {
        let batch = (pixels.as_slice(), labels.as_slice());
        // As a `String`: a boxed error is not `Send`.
        match qat {
            false => repeat::<F, S, C>(&dev, float, batch, count).map(|t| ("float", t)),
            true => repeat::<D::Quantized, S, C>(&dev, quantized, batch, count).map(|t| ("qat", t)),
        }
        .map_err(|e| e.to_string())
    })?;
    println!(
        "{} {side} step, batch 64, {threads} thread(s): median of {} steps {:.1} µs",
        model.name(),
        count,
        micros(time)
    );
    Ok(())
}

/// The median times of a training step of `model` on rayon's default pool with its other
/// threads left to sleep between kernels and kept awake (`set(false)` / `set(true)` switches
/// `QUANT_KEEP_AWAKE` before each block), timed against each other.
fn awake_against_asleep<S: BatchShape, const C: usize, M>(
    dev: &Cpu,
    model: &M,
    pixels: &[f32],
    labels: &[usize],
    set: impl Fn(bool),
) -> Result<(Duration, Duration), quant::QuantError>
where
    M: TensorCollection<f32, Cpu>
        + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>>
        + Clone
        + Send,
    <M as ModuleMut<Tensor<S, f32, Cpu, Taped>>>::Error: Into<quant::QuantError>,
{
    let (mut a, mut b) = (model.clone(), model.clone());
    let mut a_trainer = Trainer::<M, S, C>::new(dev, &a, &phase(), None)?;
    let mut b_trainer = Trainer::<M, S, C>::new(dev, &b, &phase(), None)?;
    Ok(compare(
        || {
            set(false);
            a_trainer
                .step(&mut a, pixels.to_vec(), labels, 1e-3)
                .expect("step");
        },
        || {
            set(true);
            b_trainer
                .step(&mut b, pixels.to_vec(), labels, 1e-3)
                .expect("step");
        },
        Some(TRAINING_BLOCKS),
    ))
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
    // The digits' test split is 360 images; MNIST's 2,000 are timed at the same batch.
    let batch = data.test.len().min(360);
    let mut integer_360 = [Duration::ZERO; 2];
    for (n, pool) in [(batch, Some(single)), (64, Some(single)), (batch, None)] {
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
                None,
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
        if n == batch {
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
        "   {name:<6} integer, batch {batch}: speed-up on all threads {:.2}x (one-thread time / all-thread time)",
        ratio(integer_360[0], integer_360[1])
    );
    Ok(())
}

/// As the `quant` binary allocates (see its `main.rs`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), BoxError> {
    // `--max-isa NAME` keeps the kernels on that path or older ones (`quant eval --max-isa`);
    // the other arguments name sections.
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == "--max-isa") {
        let name = args.get(at + 1).ok_or("--max-isa needs a path name")?;
        quant::int8::Isa::limit_to(quant::int8::Isa::from_name(name)?);
        args.drain(at..at + 2);
    }
    if let Some(at) = args.iter().position(|a| a == "--step-only") {
        let (model, side) =
            match (args.get(at + 1), args.get(at + 2)) {
                (Some(model), Some(side)) => (model.clone(), side.clone()),
                _ => return Err(
                    "--step-only needs a model (mlp, cnn, resnet, vit, cnn28, vit28) and a side \
                     (float, qat)"
                        .into(),
                ),
            };
        // Both checked before the data are loaded and the model calibrated (seconds).
        type StepOnly = fn(bool, usize) -> Result<(), BoxError>;
        let run: StepOnly = match model.as_str() {
            "mlp" => |qat, count| step_only(&nets::mlp(), &digits::bundled()?, qat, count),
            "cnn" => |qat, count| step_only(&nets::cnn(), &digits::bundled()?, qat, count),
            "resnet" => |qat, count| step_only(&nets::resnet(), &digits::bundled()?, qat, count),
            "vit" => |qat, count| step_only(&nets::vit(), &digits::bundled()?, qat, count),
            "cnn28" => |qat, count| step_only(&nets::cnn_28(), &mnist()?, qat, count),
            "vit28" => |qat, count| step_only(&nets::vit_28(), &mnist()?, qat, count),
            other => {
                return Err(format!(
                    "--step-only: no model {other:?} (mlp, cnn, resnet, vit, cnn28, vit28)"
                )
                .into())
            }
        };
        let qat = match side.as_str() {
            "float" => false,
            "qat" => true,
            other => return Err(format!("--step-only: no side {other:?} (float, qat)").into()),
        };
        let count = match args.iter().position(|a| a == "--steps") {
            Some(at) => {
                let count = args.get(at + 1).ok_or("--steps needs a count")?;
                match count.parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(format!("--steps {count:?}: a whole number from 1").into()),
                }
            }
            None => 150,
        };
        return run(qat, count);
    }
    // A name that is no section is an error before anything runs, not an empty run.
    const SECTIONS: [&str; 8] = [
        "qat", "qatvit", "mlp", "cnn", "resnet", "vit", "train28", "vit28",
    ];
    if let Some(unknown) = args
        .iter()
        .find(|a| !SECTIONS.contains(&a.to_lowercase().as_str()))
    {
        return Err(format!(
            "no section or option {unknown:?}: sections {}; options --max-isa NAME, \
             --step-only MODEL SIDE [--steps N]",
            SECTIONS.join(", ")
        )
        .into());
    }
    let data = digits::bundled()?;
    let single = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    println!(
        "{}, integer kernels on {}, {} threads in rayon's default pool; medians of alternating blocks of {BLOCK} runs\n",
        cpu_name(),
        quant::int8::Isa::detected(),
        rayon::current_num_threads()
    );
    // Optional filter: the section names to run (the MNIST sections `train28` and `vit28` run
    // only when named).
    let only: Vec<String> = args.iter().map(|a| a.to_lowercase()).collect();
    let named = |name: &str| only.iter().any(|o| o == name);
    let mnist_section = |name: &str| name == "train28" || name == "vit28";
    let wanted = |name: &str| (only.is_empty() && !mnist_section(name)) || named(name);
    println!("1. One training step, batch 64, one thread: the W4A4 LSQ QAT model against the float model");
    println!("   model  float, folded (µs)  QAT (µs)  QAT/float   float, trained (µs)  QAT/float");
    if wanted("qat") {
        qat_step("MLP", &nets::mlp(), &data, &single)?;
        qat_step("CNN", &nets::cnn(), &data, &single)?;
        qat_step("ResNet", &nets::resnet(), &data, &single)?;
    }
    if wanted("qat") || wanted("qatvit") {
        qat_step("ViT", &nets::vit(), &data, &single)?;
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
    if wanted("train28") {
        let mnist = mnist()?;
        println!("\n3. MNIST training steps, batch 64: float (as trained) and W4A4 LSQ QAT");
        println!("   model  threads  float (µs)    QAT (µs)  QAT/float");
        mnist_steps("CNN", &nets::cnn_28(), &mnist, &single)?;
        mnist_steps("ViT", &nets::vit_28(), &mnist, &single)?;
    }
    if wanted("vit28") {
        let config = RunConfig::from_file(std::path::Path::new("configs/mnist_vit_w4a8.toml"))?;
        let mnist = quant::data::load(&config.data)?;
        println!(
            "\n4. MNIST ViT inference: the float model against its exported W4A4 integer model"
        );
        println!("   model  batch threads  float (µs)  integer (µs)  integer/float");
        inference("ViT 28", &nets::vit_28(), &mnist, &single)?;
    }
    Ok(())
}

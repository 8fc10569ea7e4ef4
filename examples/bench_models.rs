//! Model-level benchmarks, each against its float baseline in the same run:
//!
//! 1. QAT overhead: one training step (forward, backward, Adam update) of the float MLP and of
//!    the W4A4 LSQ-quantized MLP, batch 64, one thread.
//! 2. Integer inference: the exported integer MLP against the float dfdx MLP on the same batch
//!    (the test split, and a batch of 64), one thread and with rayon's default pool.
//!
//! Run: `cargo run --release --example bench_models`

use std::time::{Duration, Instant};

use dfdx::optim::{Adam, AdamConfig, Optimizer};
use dfdx::prelude::*;
use quant::digits;
use quant::pipeline::nets::{Mlp, MlpBuilder, QMlp};
use quant::pipeline::train::{calibration_inputs, input};
use quant_ops::calibration::calibrate;
use quant_ops::convert::convert_model;
use quant_ops::export::export_model;
use quant_ops::integer::IntegerModel;
use quant_ops::layers::{QuantizedModuleExt, QuantizerMode};
use quant_ops::policy::Policy;

type X = (usize, Const<64>);

/// Median of `rounds` timings of `f` after two warm-ups.
fn median(rounds: usize, mut f: impl FnMut()) -> Duration {
    f();
    f();
    let mut t: Vec<Duration> = (0..rounds)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[t.len() / 2]
}

fn train_step<M>(
    dev: &Cpu,
    model: &mut M,
    opt: &mut Adam<M, f32, Cpu>,
    x: &Tensor<X, f32, Cpu>,
    y: &Tensor<(usize, Const<10>), f32, Cpu>,
) where
    M: TensorCollection<f32, Cpu>
        + ModuleMut<
            Tensor<X, f32, Cpu, OwnedTape<f32, Cpu>>,
            Output = Tensor<(usize, Const<10>), f32, Cpu, OwnedTape<f32, Cpu>>,
        >,
    <M as ModuleMut<Tensor<X, f32, Cpu, OwnedTape<f32, Cpu>>>>::Error: std::fmt::Debug,
{
    let _ = dev;
    let grads = model.alloc_grads();
    let logits = model
        .try_forward_mut(x.clone().traced(grads))
        .expect("forward");
    let grads = cross_entropy_with_logits_loss(logits, y.clone()).backward();
    let _ = opt.update(model, &grads);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = digits::load(&digits::bundled_path())?;
    let dev = Cpu::seed_from_u64(0);
    let float: Mlp = dev.build_module::<MlpBuilder, f32>();
    let policy = Policy::from_toml_str(
        "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n\
         [input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n",
        "bench policy",
    )?;
    let mut qmlp: QMlp = convert_model(&float, &policy)?;
    calibrate(
        &mut qmlp,
        calibration_inputs::<X>(&dev, &data.train, 4, 64, 0)?,
    )?;

    let single = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let idx: Vec<usize> = (0..64).collect();
    let (pixels, labels) = data.train.gather(&idx);
    let x = input::<X>(&dev, pixels.clone(), 64)?;
    let mut onehot = vec![0f32; 64 * 10];
    for (i, l) in labels.iter().enumerate() {
        onehot[i * 10 + l] = 1.0;
    }
    let y = dev.tensor_from_vec(onehot, (64usize, Const::<10>));

    println!("1. One training step, MLP 64-256-256-10, batch 64, one thread");
    let (t_float, t_qat) = single.install(|| -> Result<_, quant::QuantError> {
        let mut f = float.clone();
        let mut fopt = Adam::new(&f, AdamConfig::default());
        let t_float = median(200, || train_step(&dev, &mut f, &mut fopt, &x, &y));
        let mut q = qmlp.clone();
        q.set_mode("*", QuantizerMode::Training)?;
        let mut qopt = Adam::new(&q, AdamConfig::default());
        let t_qat = median(200, || train_step(&dev, &mut q, &mut qopt, &x, &y));
        Ok((t_float, t_qat))
    })?;
    println!(
        "   float step            {:>9.1} µs",
        t_float.as_secs_f64() * 1e6
    );
    println!(
        "   W4A4 LSQ QAT step     {:>9.1} µs",
        t_qat.as_secs_f64() * 1e6
    );
    println!(
        "   ratio QAT / float     {:>9.2}x",
        t_qat.as_secs_f64() / t_float.as_secs_f64()
    );

    println!("\n2. Inference, exported integer MLP vs float dfdx MLP (same weights' model)");
    let exported = export_model(&qmlp, &[64], Default::default())?;
    let integer = IntegerModel::new(&exported)?;
    for (label, n) in [("test split (360)", data.test.len()), ("batch of 64", 64)] {
        let images = data.test.images[..n * 64].to_vec();
        let xt = input::<X>(&dev, images.clone(), n)?;
        for (threads, pool) in [("1 thread ", Some(&single)), ("default  ", None)] {
            let run = |f: &mut (dyn FnMut() + Send)| match pool {
                Some(p) => p.install(|| median(100, f)),
                None => median(100, f),
            };
            let t_f = run(&mut || {
                let _ = float.forward(xt.clone());
            });
            let t_i = run(&mut || {
                let _ = integer.forward(&images);
            });
            println!(
                "   {label:<17} {threads} float {:>8.1} µs   integer {:>8.1} µs   integer/float {:>5.2}x",
                t_f.as_secs_f64() * 1e6,
                t_i.as_secs_f64() * 1e6,
                t_i.as_secs_f64() / t_f.as_secs_f64()
            );
        }
    }
    Ok(())
}

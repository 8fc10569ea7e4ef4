//! Training, evaluation and calibration loops, generic over the model (float or quantized).

use dfdx::optim::{Adam, AdamConfig};
use dfdx::prelude::*;
use indicatif::ProgressBar;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use quant_core::{QuantError, Result};
use quant_ops::integer::argmax_rows;

use super::config::{Distillation, Schedule};
use crate::digits::{Split, CLASSES};

/// A batch's logits with tape `T`.
pub type Logits<T> = Tensor<(usize, Const<CLASSES>), f32, Cpu, T>;
/// The training tape.
pub type Taped = OwnedTape<f32, Cpu>;

/// Turns flat pixels of `n` samples into the network's input tensor.
pub trait InputShape: Shape {
    /// The shape of a batch of `n` samples.
    fn batch(n: usize) -> Self;
}

impl InputShape for (usize, Const<64>) {
    fn batch(n: usize) -> Self {
        (n, Const)
    }
}

impl InputShape for (usize, Const<1>, Const<8>, Const<8>) {
    fn batch(n: usize) -> Self {
        (n, Const, Const, Const)
    }
}

/// One phase of training.
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    /// Epochs.
    pub epochs: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Schedule.
    pub schedule: Schedule,
}

fn lr_at(phase: &Phase, epoch: usize) -> f64 {
    match phase.schedule {
        Schedule::Constant => phase.lr,
        Schedule::Cosine => {
            let t = epoch as f64 / phase.epochs.max(1) as f64;
            0.5 * phase.lr * (1.0 + (std::f64::consts::PI * t).cos())
        }
    }
}

/// Builds an input tensor of `n` samples from flat pixels.
pub fn input<S: InputShape>(dev: &Cpu, pixels: Vec<f32>, n: usize) -> Result<Tensor<S, f32, Cpu>> {
    Ok(dev.try_tensor_from_vec(pixels, S::batch(n))?)
}

/// Softmax of each row of `logits / temperature`.
fn soft_targets(logits: &[f32], temperature: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(logits.len());
    for row in logits.chunks(CLASSES) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        let exps: Vec<f32> = row
            .iter()
            .map(|v| ((v - max) / temperature).exp())
            .collect();
        let sum: f32 = exps.iter().sum();
        out.extend(exps.iter().map(|e| e / sum));
    }
    out
}

/// Trains `model` with Adam on `data` for a phase; returns the mean loss of each epoch.
/// With `teacher` (the float model's logits for every training sample) and a distillation
/// config, the loss mixes the labels' cross-entropy with the cross-entropy against the
/// teacher's softened predictions (Hinton et al.'s distillation, `T²`-scaled).
#[allow(clippy::too_many_arguments)]
pub fn train<M, S>(
    dev: &Cpu,
    model: &mut M,
    data: &Split,
    phase: &Phase,
    seed: u64,
    teacher: Option<(&[f32], Distillation)>,
    bar: &ProgressBar,
) -> Result<Vec<f32>>
where
    S: InputShape,
    M: TensorCollection<f32, Cpu> + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<Taped>>,
    <M as ModuleMut<Tensor<S, f32, Cpu, Taped>>>::Error: Into<QuantError>,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let mut opt: Adam<M, f32, Cpu> = Adam::new(
        model,
        AdamConfig {
            lr: phase.lr,
            ..Default::default()
        },
    );
    let mut order: Vec<usize> = (0..data.len()).collect();
    let mut epoch_losses = Vec::with_capacity(phase.epochs);
    let mut grads = model.try_alloc_grads()?;
    for epoch in 0..phase.epochs {
        opt.cfg.lr = lr_at(phase, epoch);
        order.shuffle(&mut rng);
        let mut total = 0.0f64;
        let mut batches = 0usize;
        for idx in order.chunks(phase.batch_size) {
            let n = idx.len();
            let (pixels, labels) = data.gather(idx);
            let x: Tensor<S, f32, Cpu> = input(dev, pixels, n)?;
            let mut onehot = vec![0f32; n * CLASSES];
            for (i, l) in labels.iter().enumerate() {
                onehot[i * CLASSES + l] = 1.0;
            }
            let y = dev.try_tensor_from_vec(onehot, (n, Const::<CLASSES>))?;
            let logits = model.try_forward_mut(x.traced(grads)).map_err(Into::into)?;
            let loss = match teacher {
                None => cross_entropy_with_logits_loss(logits, y),
                Some((all, d)) => {
                    let t = d.temperature as f32;
                    let picked: Vec<f32> = idx
                        .iter()
                        .flat_map(|i| all[i * CLASSES..(i + 1) * CLASSES].to_vec())
                        .collect();
                    let soft =
                        dev.try_tensor_from_vec(soft_targets(&picked, t), (n, Const::<CLASSES>))?;
                    let w = d.weight as f32;
                    let hard = cross_entropy_with_logits_loss(logits.with_empty_tape(), y);
                    let distill = cross_entropy_with_logits_loss(logits / t, soft);
                    hard * (1.0 - w) + distill * (w * t * t)
                }
            };
            total += loss.array() as f64;
            batches += 1;
            grads = loss.backward();
            match opt.update(model, &grads) {
                Ok(()) | Err(OptimizerUpdateError::UnusedParams(_)) => {}
                Err(OptimizerUpdateError::DeviceError(e)) => return Err(e.into()),
            }
            model.try_zero_grads(&mut grads)?;
        }
        epoch_losses.push((total / batches.max(1) as f64) as f32);
        bar.inc(1);
    }
    Ok(epoch_losses)
}

/// Logits of every sample of `data` (evaluation mode: no tape), batch by batch.
pub fn logits<M, S>(dev: &Cpu, model: &M, data: &Split, batch_size: usize) -> Result<Vec<f32>>
where
    S: InputShape,
    M: Module<Tensor<S, f32, Cpu>, Output = Logits<NoneTape>>,
    M::Error: Into<QuantError>,
{
    let mut out = Vec::with_capacity(data.len() * CLASSES);
    let all: Vec<usize> = (0..data.len()).collect();
    for idx in all.chunks(batch_size.max(1)) {
        let (pixels, _) = data.gather(idx);
        let x: Tensor<S, f32, Cpu> = input(dev, pixels, idx.len())?;
        out.extend(model.try_forward(x).map_err(Into::into)?.as_vec());
    }
    Ok(out)
}

/// Predicted classes from logits.
pub fn predictions(logits: &[f32]) -> Vec<usize> {
    argmax_rows(logits, CLASSES)
}

/// Fraction of `predicted` equal to `labels`.
pub fn accuracy(predicted: &[usize], labels: &[usize]) -> f64 {
    let hits = predicted.iter().zip(labels).filter(|(p, l)| p == l).count();
    hits as f64 / labels.len().max(1) as f64
}

/// Shows `batches` shuffled training batches to a model in Calibrating mode (`forward_mut`).
pub fn calibrate<M, S>(
    dev: &Cpu,
    model: &mut M,
    data: &Split,
    batches: usize,
    batch_size: usize,
    seed: u64,
) -> Result<()>
where
    S: InputShape,
    M: ModuleMut<Tensor<S, f32, Cpu>, Output = Logits<NoneTape>>,
    M::Error: Into<QuantError>,
{
    let mut rng = StdRng::seed_from_u64(seed ^ 0xca11_b4a7);
    let mut order: Vec<usize> = (0..data.len()).collect();
    order.shuffle(&mut rng);
    for idx in order.chunks(batch_size).take(batches.max(1)) {
        let (pixels, _) = data.gather(idx);
        let x: Tensor<S, f32, Cpu> = input(dev, pixels, idx.len())?;
        model.try_forward_mut(x).map_err(Into::into)?;
    }
    Ok(())
}

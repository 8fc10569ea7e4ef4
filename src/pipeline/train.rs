//! Training and evaluation loops, generic over the model (float or quantized), and the digits'
//! calibration batches.

use dfdx::nn::tensor_collection::{
    RecursiveWalker, TensorOptions, TensorVisitor, ViewTensorMut, ViewTensorName,
};
use dfdx::optim::{Adam, AdamConfig, Momentum, Optimizer as _, Sgd, SgdConfig};
use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use indicatif::ProgressBar;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use quant_core::{QuantError, Result};
use quant_ops::calibration::BatchPlan;
use quant_ops::integer::argmax_rows;

use super::config::{Distillation, Optimizer, Schedule};
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
    /// Schedule, over the epochs after the warm-up.
    pub schedule: Schedule,
    /// Epochs of linear warm-up (see [`lr_at`]); 0 = none.
    pub warmup_epochs: usize,
    /// Random translation of each training image by up to this many pixels in x and y (zero
    /// fill); 0 disables it.
    pub shift: usize,
    /// The optimiser.
    pub optimizer: Optimizer,
    /// Decoupled weight decay on the layers' weights (see [`decay_weights`]); 0 = none.
    pub weight_decay: f64,
    /// Label smoothing of the labels' cross-entropy (see [`targets`]); 0 = none.
    pub label_smoothing: f64,
}

/// Adam, or SGD with momentum 0.9 (LSQ's recipe, where the gradient scale `g` balances the
/// step sizes' updates against the weights').
enum Opt<M> {
    Adam(Adam<M, f32, Cpu>),
    Sgd(Sgd<M, f32, Cpu>),
}

impl<M: TensorCollection<f32, Cpu>> Opt<M> {
    fn new(model: &M, kind: Optimizer, lr: f64) -> Self {
        match kind {
            Optimizer::Adam => Opt::Adam(Adam::new(
                model,
                AdamConfig {
                    lr,
                    ..Default::default()
                },
            )),
            Optimizer::Sgd => Opt::Sgd(Sgd::new(
                model,
                SgdConfig {
                    lr,
                    momentum: Some(Momentum::Classic(0.9)),
                    weight_decay: None,
                },
            )),
        }
    }
    fn set_lr(&mut self, lr: f64) {
        match self {
            Opt::Adam(o) => o.cfg.lr = lr,
            Opt::Sgd(o) => o.cfg.lr = lr,
        }
    }
    fn update(&mut self, model: &mut M, grads: &dfdx::tensor::Gradients<f32, Cpu>) -> Result<()> {
        let r = match self {
            Opt::Adam(o) => o.update(model, grads),
            Opt::Sgd(o) => o.update(model, grads),
        };
        match r {
            // Frozen or float slots get no gradient: not an error here.
            Ok(()) | Err(OptimizerUpdateError::UnusedParams(_)) => Ok(()),
            Err(OptimizerUpdateError::DeviceError(e)) => Err(e.into()),
        }
    }
}

/// The float model's logits for a batch of (augmented) pixels, for distillation.
pub type Teacher<'a> = &'a dyn Fn(Vec<f32>, usize) -> Result<Vec<f32>>;

/// Translates each 8×8 image of `pixels` by a random offset in `[-shift, shift]²`, filling with
/// zeros (the digits' background).
fn augment(pixels: &mut [f32], shift: usize, rng: &mut StdRng) {
    use rand::Rng;
    if shift == 0 {
        return;
    }
    let s = shift as isize;
    for img in pixels.chunks_mut(64) {
        let (dx, dy) = (rng.gen_range(-s..=s), rng.gen_range(-s..=s));
        if dx == 0 && dy == 0 {
            continue;
        }
        let src: Vec<f32> = img.to_vec();
        for y in 0..8isize {
            for x in 0..8isize {
                let (sx, sy) = (x - dx, y - dy);
                img[(y * 8 + x) as usize] = if (0..8).contains(&sx) && (0..8).contains(&sy) {
                    src[(sy * 8 + sx) as usize]
                } else {
                    0.0
                };
            }
        }
    }
}

/// The learning rate of step `step` (0-based) of epoch `epoch`, with `steps` steps per epoch.
///
/// During the first `warmup_epochs` epochs it rises linearly, step by step, from `lr / n` to
/// `lr` at the last warm-up step (`n` warm-up steps in all); after them the schedule runs over
/// the remaining epochs, epoch by epoch (cosine: `lr` at the first, towards 0 at the end).
/// Without warm-up, that is the schedule over the whole phase.
pub fn lr_at(phase: &Phase, epoch: usize, step: usize, steps: usize) -> f64 {
    let warmup = phase.warmup_epochs.min(phase.epochs);
    if epoch < warmup {
        let warm_steps = (warmup * steps).max(1);
        let k = epoch * steps + step + 1;
        return phase.lr * k.min(warm_steps) as f64 / warm_steps as f64;
    }
    match phase.schedule {
        Schedule::Constant => phase.lr,
        Schedule::Cosine => {
            let t = (epoch - warmup) as f64 / (phase.epochs - warmup).max(1) as f64;
            0.5 * phase.lr * (1.0 + (std::f64::consts::PI * t).cos())
        }
    }
}

/// Whether a tensor of a model, by its dotted name, is a layer's weight (`0.weight`,
/// `1.0.weight`): not a bias, a BatchNorm parameter or statistic, or a quantizer's parameter.
pub fn is_layer_weight(name: &str) -> bool {
    name.rsplit('.').next() == Some("weight") && !name.contains("quantizer")
}

/// Multiplies every layer weight of a model (see [`is_layer_weight`]) by `factor`.
struct ScaleWeights {
    factor: f32,
}

impl TensorVisitor<f32, Cpu> for ScaleWeights {
    type Viewer = (ViewTensorName, ViewTensorMut);
    type Err = CpuError;
    type E2 = f32;
    type D2 = Cpu;

    fn visit<S: Shape>(
        &mut self,
        _opts: TensorOptions<S, f32, Cpu>,
        (name, t): (String, &mut Tensor<S, f32, Cpu>),
    ) -> std::result::Result<Option<Tensor<S, f32, Cpu>>, CpuError> {
        if is_layer_weight(&name) {
            let scaled: Vec<f32> = t.as_vec().iter().map(|w| w * self.factor).collect();
            t.copy_from(&scaled);
        }
        Ok(None)
    }
}

/// Decoupled weight decay (Loshchilov & Hutter's AdamW): `w ← (1 − lr·wd)·w` on the layers'
/// weights only, so biases and the quantizers' step sizes and zero points are not pulled to 0.
pub fn decay_weights<M: TensorCollection<f32, Cpu>>(
    model: &mut M,
    lr: f64,
    weight_decay: f64,
) -> Result<()> {
    if weight_decay == 0.0 {
        return Ok(());
    }
    let mut visitor = ScaleWeights {
        factor: (1.0 - lr * weight_decay) as f32,
    };
    M::iter_tensors(&mut RecursiveWalker {
        m: (String::new(), model),
        f: &mut visitor,
    })?;
    Ok(())
}

/// Training targets for `labels`: one-hot rows, smoothed to `(1 − ε)·onehot + ε/CLASSES`
/// when `label_smoothing = ε > 0` (Szegedy et al.).
pub fn targets(labels: &[usize], label_smoothing: f64) -> Vec<f32> {
    let eps = label_smoothing as f32;
    let off = eps / CLASSES as f32;
    let mut out = vec![off; labels.len() * CLASSES];
    for (i, l) in labels.iter().enumerate() {
        out[i * CLASSES + l] = 1.0 - eps + off;
    }
    out
}

/// Splits the training split into (kept, held out): row `i` is held out when
/// `i % folds == fold`. Deterministic, independent of the seed, and, since the digits file
/// cycles through the classes, close to stratified.
pub fn holdout(train: &Split, folds: usize, fold: usize) -> (Split, Split) {
    let (held, kept): (Vec<usize>, Vec<usize>) =
        (0..train.len()).partition(|i| i % folds.max(1) == fold);
    let split = |idx: &[usize]| {
        let (images, labels) = train.gather(idx);
        Split { images, labels }
    };
    (split(&kept), split(&held))
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

/// Trains `model` with Adam on `data` (at least one row) for a phase; returns the mean loss of
/// each epoch.
/// With a `teacher` (the float model, run on the same augmented batch) and a distillation
/// config, the loss mixes the labels' cross-entropy with the cross-entropy against the
/// teacher's softened predictions (Hinton et al.'s distillation, `T²`-scaled).
#[allow(clippy::too_many_arguments)]
pub fn train<M, S>(
    dev: &Cpu,
    model: &mut M,
    data: &Split,
    phase: &Phase,
    seed: u64,
    teacher: Option<(Teacher<'_>, Distillation)>,
    bar: &ProgressBar,
) -> Result<Vec<f32>>
where
    S: InputShape,
    M: TensorCollection<f32, Cpu> + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<Taped>>,
    <M as ModuleMut<Tensor<S, f32, Cpu, Taped>>>::Error: Into<QuantError>,
{
    if data.is_empty() {
        return Err(QuantError::InvalidValue {
            what: "training split".into(),
            value: "0 rows".into(),
            expected: "at least one row to train on".into(),
        });
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut opt = Opt::new(model, phase.optimizer, phase.lr);
    let mut order: Vec<usize> = (0..data.len()).collect();
    // The run file's limit bounds the epochs; a caller's count does not size an allocation.
    let mut epoch_losses = Vec::with_capacity(phase.epochs.min(super::config::MAX_EPOCHS));
    let mut grads = model.try_alloc_grads()?;
    let steps = data.len().div_ceil(phase.batch_size.max(1));
    for epoch in 0..phase.epochs {
        order.shuffle(&mut rng);
        let mut total = 0.0f64;
        let mut batches = 0usize;
        for (step, idx) in order.chunks(phase.batch_size).enumerate() {
            let lr = lr_at(phase, epoch, step, steps);
            opt.set_lr(lr);
            let n = idx.len();
            let (mut pixels, labels) = data.gather(idx);
            augment(&mut pixels, phase.shift, &mut rng);
            let teacher_logits = match &teacher {
                Some((t, _)) => Some(t(pixels.clone(), n)?),
                None => None,
            };
            let x: Tensor<S, f32, Cpu> = input(dev, pixels, n)?;
            let y = dev.try_tensor_from_vec(
                targets(&labels, phase.label_smoothing),
                (n, Const::<CLASSES>),
            )?;
            let logits = model.try_forward_mut(x.traced(grads)).map_err(Into::into)?;
            let loss = match (&teacher, teacher_logits) {
                (Some((_, d)), Some(picked)) => {
                    let t = d.temperature as f32;
                    let soft =
                        dev.try_tensor_from_vec(soft_targets(&picked, t), (n, Const::<CLASSES>))?;
                    let w = d.weight as f32;
                    let hard = cross_entropy_with_logits_loss(logits.with_empty_tape(), y);
                    let distill = cross_entropy_with_logits_loss(logits / t, soft);
                    hard * (1.0 - w) + distill * (w * t * t)
                }
                _ => cross_entropy_with_logits_loss(logits, y),
            };
            total += loss.array() as f64;
            batches += 1;
            grads = loss.backward();
            opt.update(model, &grads)?;
            decay_weights(model, lr, phase.weight_decay)?;
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

/// Fraction of `predicted` equal to `labels` (0 for no labels: the pipeline refuses empty
/// splits before it gets here).
pub fn accuracy(predicted: &[usize], labels: &[usize]) -> f64 {
    let hits = predicted.iter().zip(labels).filter(|(p, l)| p == l).count();
    hits as f64 / labels.len().max(1) as f64
}

/// Mixed into a seed for the calibration batches' shuffle, so that calibration does not see
/// the rows in the order of the first training epoch.
pub const CALIBRATION_SEED_SALT: u64 = 0xca11_b4a7;

/// The input tensors of `batches` shuffled training batches of `batch_size` rows, for
/// [`quant_ops::calibration::calibrate`]: the rows of [`BatchPlan`] with the seed
/// `seed ^` [`CALIBRATION_SEED_SALT`].
///
/// # Errors
/// `batches` or `batch_size` is 0, or `data` has no rows.
pub fn calibration_inputs<S: InputShape>(
    dev: &Cpu,
    data: &Split,
    batches: usize,
    batch_size: usize,
    seed: u64,
) -> Result<Vec<Tensor<S, f32, Cpu>>> {
    let plan = BatchPlan {
        batches,
        batch_size,
        seed: seed ^ CALIBRATION_SEED_SALT,
    };
    plan.rows(data.len())?
        .iter()
        .map(|idx| input(dev, data.gather(idx).0, idx.len()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_smoothing_targets() {
        let plain = targets(&[3, 0], 0.0);
        assert_eq!(plain.len(), 2 * CLASSES);
        assert_eq!(plain[3], 1.0);
        assert_eq!(plain[CLASSES], 1.0);
        assert_eq!(plain.iter().sum::<f32>(), 2.0);
        let smooth = targets(&[3, 0], 0.1);
        for row in smooth.chunks(CLASSES) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        assert!((smooth[3] - 0.91).abs() < 1e-6);
        assert!((smooth[0] - 0.01).abs() < 1e-6);
        assert!((smooth[CLASSES] - 0.91).abs() < 1e-6);
    }

    #[test]
    fn warmup_rises_step_by_step_then_the_schedule_runs_over_the_rest() {
        let phase = |schedule, warmup_epochs| Phase {
            epochs: 10,
            batch_size: 4,
            lr: 1.0,
            schedule,
            warmup_epochs,
            shift: 0,
            optimizer: Optimizer::Adam,
            weight_decay: 0.0,
            label_smoothing: 0.0,
        };
        // Without warm-up: the schedule over the whole phase, constant within an epoch.
        let plain = phase(Schedule::Cosine, 0);
        assert_eq!(lr_at(&plain, 0, 0, 5), 1.0);
        assert_eq!(lr_at(&plain, 0, 4, 5), 1.0);
        assert!((lr_at(&plain, 5, 2, 5) - 0.5).abs() < 1e-12);
        // Two warm-up epochs of 5 steps: 0.1, 0.2, ..., 1.0, then cosine over 8 epochs.
        let warm = phase(Schedule::Cosine, 2);
        for k in 0..10 {
            let lr = lr_at(&warm, k / 5, k % 5, 5);
            assert!((lr - (k + 1) as f64 / 10.0).abs() < 1e-12, "step {k}: {lr}");
        }
        assert_eq!(lr_at(&warm, 2, 0, 5), 1.0);
        assert!((lr_at(&warm, 6, 3, 5) - 0.5).abs() < 1e-12);
        assert!(lr_at(&warm, 9, 4, 5) < 0.05);
        let constant = phase(Schedule::Constant, 2);
        assert!((lr_at(&constant, 0, 0, 5) - 0.1).abs() < 1e-12);
        assert_eq!(lr_at(&constant, 9, 0, 5), 1.0);
        // A warm-up of the whole phase ends at lr.
        let all = phase(Schedule::Cosine, 10);
        assert!((lr_at(&all, 9, 4, 5) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn holdout_partitions_the_training_split() {
        let n = 23;
        let split = Split {
            images: (0..n * 64).map(|i| (i / 64) as f32).collect(),
            labels: (0..n).map(|i| i % CLASSES).collect(),
        };
        let mut seen = vec![0; n];
        for fold in 0..5 {
            let (kept, held) = holdout(&split, 5, fold);
            assert_eq!(kept.len() + held.len(), n);
            for i in 0..held.len() {
                // The held-out rows are fold, fold + 5, ...; each image travels with its label.
                let row = held.image(i)[0] as usize;
                assert_eq!(row % 5, fold);
                assert_eq!(held.labels[i], row % CLASSES);
                seen[row] += 1;
            }
            for i in 0..kept.len() {
                assert_ne!(kept.image(i)[0] as usize % 5, fold);
            }
            // Deterministic.
            assert_eq!(holdout(&split, 5, fold), (kept, held));
        }
        // Every row is held out by exactly one fold.
        assert!(seen.iter().all(|&c| c == 1));
    }

    #[test]
    fn weight_decay_touches_layer_weights_only() {
        assert!(is_layer_weight("0.weight"));
        assert!(is_layer_weight("1.0.weight"));
        assert!(!is_layer_weight("0.bias"));
        assert!(!is_layer_weight("0.weights_quantizer.learned"));
        assert!(!is_layer_weight("0.input_quantizer.learned"));
        assert!(!is_layer_weight("0.1.scale"));

        let dev = Cpu::seed_from_u64(0);
        let mut m = dev.build_module::<dfdx::nn::builders::Linear<3, 2>, f32>();
        let (w, b) = (m.weight.as_vec(), m.bias.as_vec());
        decay_weights(&mut m, 0.5, 0.0).unwrap();
        assert_eq!(m.weight.as_vec(), w);
        decay_weights(&mut m, 0.5, 0.1).unwrap();
        for (after, before) in m.weight.as_vec().iter().zip(&w) {
            assert!((after - before * 0.95).abs() < 1e-7);
        }
        assert_eq!(m.bias.as_vec(), b);

        // In a quantized model the quantizers' parameters are left alone.
        let mut q = quant_ops::layers::QLinear::from_linear(&m);
        q.weights_quantizer.learned = dev.ones();
        q.input_quantizer.learned = dev.ones();
        let w = q.weight.as_vec();
        decay_weights(&mut q, 1.0, 0.5).unwrap();
        for (after, before) in q.weight.as_vec().iter().zip(&w) {
            assert!((after - before * 0.5).abs() < 1e-7);
        }
        assert!(q
            .weights_quantizer
            .learned
            .as_vec()
            .iter()
            .all(|v| *v == 1.0));
        assert!(q.input_quantizer.learned.as_vec().iter().all(|v| *v == 1.0));
    }
}

//! Training and evaluation loops, generic over the model (float or quantized), its input shape
//! and its classes; the QAT (or float) step as a helper for your own loop ([`Trainer`]); the
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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quant_core::{QuantError, Result};
use quant_dfdx::calibration::BatchPlan;
use quant_runtime::integer::argmax_rows;

use super::config::{Distillation, Optimizer, Schedule};
pub use super::model::{BatchShape, Logits, Taped};
use crate::data::Samples;

/// One phase of training (default: `[float]`'s defaults).
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

/// `[float]` and `[qat]` name the same settings.
macro_rules! phase_from_section {
    ($section:ty) => {
        impl From<&$section> for Phase {
            fn from(section: &$section) -> Phase {
                Phase {
                    epochs: section.epochs,
                    batch_size: section.batch_size,
                    lr: section.lr,
                    schedule: section.schedule,
                    warmup_epochs: section.warmup_epochs,
                    shift: section.shift,
                    optimizer: section.optimizer,
                    weight_decay: section.weight_decay,
                    label_smoothing: section.label_smoothing,
                }
            }
        }
    };
}
phase_from_section!(super::config::FloatSection);

impl Default for Phase {
    fn default() -> Phase {
        Phase::from(&super::config::FloatSection::default())
    }
}
phase_from_section!(super::config::QatSection);

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

/// The image geometry `(channels, height, width)` of samples of `shape`: the last two
/// dimensions of a shape of rank 2 or more, or a square of one channel for a flat shape whose
/// length is a square (`[64]` is 8x8, `[784]` 28x28); `None` otherwise.
pub fn image_geometry(shape: &[usize]) -> Option<(usize, usize, usize)> {
    match shape {
        [n] => {
            let k = (*n as f64).sqrt().round() as usize;
            (k * k == *n).then_some((1, k, k))
        }
        [h, w] => Some((1, *h, *w)),
        [c, h, w] => Some((*c, *h, *w)),
        [a, c, h, w] => Some((a * c, *h, *w)),
        _ => None,
    }
}

/// Translates each image of `pixels` (geometry `(channels, height, width)`) by a random offset
/// in `[-shift, shift]²`, filling with zeros (the background of digit images).
fn augment(
    pixels: &mut [f32],
    (channels, h, w): (usize, usize, usize),
    shift: usize,
    rng: &mut StdRng,
) {
    use rand::Rng;
    if shift == 0 || h * w == 0 {
        return;
    }
    let s = shift as isize;
    let mut src = vec![0f32; h * w];
    for img in pixels.chunks_mut(channels * h * w) {
        let (dx, dy) = (rng.gen_range(-s..=s), rng.gen_range(-s..=s));
        if dx == 0 && dy == 0 {
            continue;
        }
        for plane in img.chunks_mut(h * w) {
            src.copy_from_slice(plane);
            for y in 0..h as isize {
                for x in 0..w as isize {
                    let (sx, sy) = (x - dx, y - dy);
                    plane[(y * w as isize + x) as usize] =
                        if (0..w as isize).contains(&sx) && (0..h as isize).contains(&sy) {
                            src[(sy * w as isize + sx) as usize]
                        } else {
                            0.0
                        };
                }
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

/// Training targets for `labels` of `classes` classes: one-hot rows, smoothed to
/// `(1 − ε)·onehot + ε/classes` when `label_smoothing = ε > 0` (Szegedy et al.).
pub fn targets(labels: &[usize], classes: usize, label_smoothing: f64) -> Vec<f32> {
    let eps = label_smoothing as f32;
    let off = eps / classes as f32;
    let mut out = vec![off; labels.len() * classes];
    for (i, l) in labels.iter().enumerate() {
        out[i * classes + l] = 1.0 - eps + off;
    }
    out
}

/// Builds an input tensor of `n` samples from flat features.
pub fn input<S: BatchShape>(dev: &Cpu, pixels: Vec<f32>, n: usize) -> Result<Tensor<S, f32, Cpu>> {
    Ok(dev.try_tensor_from_vec(pixels, S::batch(n))?)
}

/// Softmax of each row (of `classes`) of `logits / temperature`.
fn soft_targets(logits: &[f32], classes: usize, temperature: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(logits.len());
    for row in logits.chunks(classes) {
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

/// One training step at a time, for a model of `S` inputs and `C` classes (float or quantized):
/// the optimiser, its gradients and the phase's loss. [`train`] runs a whole phase with it; a
/// program with its own loop calls [`Trainer::step`] per batch (MCT's and ModelOpt's "bring
/// your own training loop"): a quantized model trains its weights and its quantizers'
/// parameters together, with fake quantization in the forward pass.
pub struct Trainer<'t, M, S, const C: usize> {
    opt: Opt<M>,
    grads: Option<dfdx::tensor::Gradients<f32, Cpu>>,
    phase: Phase,
    dev: Cpu,
    teacher: Option<(Teacher<'t>, Distillation)>,
    input: std::marker::PhantomData<fn() -> S>,
}

impl<'t, M, S, const C: usize> Trainer<'t, M, S, C>
where
    S: BatchShape,
    M: TensorCollection<f32, Cpu>
        + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>>
        + Send,
    <M as ModuleMut<Tensor<S, f32, Cpu, Taped>>>::Error: Into<QuantError>,
{
    /// A trainer of `model` with the phase's optimiser, learning rate and loss; with a
    /// `teacher` (the float model's logits for a batch) and a distillation config, the loss
    /// mixes the labels' cross-entropy with the cross-entropy against the teacher's softened
    /// predictions (Hinton et al.'s distillation, `T²`-scaled).
    ///
    /// # Errors
    /// The gradients cannot be allocated.
    pub fn new(
        dev: &Cpu,
        model: &M,
        phase: &Phase,
        teacher: Option<(Teacher<'t>, Distillation)>,
    ) -> Result<Self> {
        Ok(Trainer {
            opt: Opt::new(model, phase.optimizer, phase.lr),
            grads: Some(model.try_alloc_grads()?),
            phase: *phase,
            dev: dev.clone(),
            teacher,
            input: std::marker::PhantomData,
        })
    }

    /// One optimiser step on a batch (`features` of `labels.len()` samples) at learning rate
    /// `lr`, then the phase's weight decay; returns the batch's loss. The forward and backward
    /// passes run on a thread of rayon's current pool (the calling thread when it is one), so
    /// that the layers' parallel kernels split their work from inside it; the results do not
    /// depend on the thread. While no other step runs in the process, the pool's other threads
    /// wait for those kernels spinning rather than asleep, which saves a wake-up per kernel
    /// (`QUANT_KEEP_AWAKE=0` in the environment turns that off).
    ///
    /// # Errors
    /// A label is not below `C`; the features do not make a batch of `S`; the model's forward
    /// pass or the optimiser fails.
    pub fn step(
        &mut self,
        model: &mut M,
        features: Vec<f32>,
        labels: &[usize],
        lr: f64,
    ) -> Result<f32> {
        let n = labels.len();
        if let Some(l) = labels.iter().find(|l| **l >= C) {
            return Err(QuantError::InvalidValue {
                what: "label".into(),
                value: l.to_string(),
                expected: format!("a class below {C}"),
            });
        }
        self.opt.set_lr(lr);
        let teacher_logits = match &self.teacher {
            Some((t, _)) => Some(t(features.clone(), n)?),
            None => None,
        };
        let x: Tensor<S, f32, Cpu> = input(&self.dev, features, n)?;
        let y = self.dev.try_tensor_from_vec(
            targets(labels, C, self.phase.label_smoothing),
            (n, Const::<C>),
        )?;
        let grads = match self.grads.take() {
            Some(g) => g,
            None => model.try_alloc_grads()?,
        };
        let (_running, alone) = StepRunning::start();
        let distillation = self.teacher.as_ref().map(|(_, d)| *d);
        let dev = &self.dev;
        let forward_backward = || -> Result<(f32, dfdx::tensor::Gradients<f32, Cpu>)> {
            let _awake = KeepAwake::start(alone);
            let logits = model.try_forward_mut(x.traced(grads)).map_err(Into::into)?;
            let loss = match (distillation, teacher_logits) {
                (Some(d), Some(picked)) => {
                    let t = d.temperature as f32;
                    let soft =
                        dev.try_tensor_from_vec(soft_targets(&picked, C, t), (n, Const::<C>))?;
                    let w = d.weight as f32;
                    let hard = cross_entropy_with_logits_loss(logits.with_empty_tape(), y);
                    let distill = cross_entropy_with_logits_loss(logits / t, soft);
                    hard * (1.0 - w) + distill * (w * t * t)
                }
                _ => cross_entropy_with_logits_loss(logits, y),
            };
            // Only the parameters' gradients are read: the layers free the rest once used.
            let _released = quant_core::dfdx_ops::release_used_gradients();
            Ok((loss.array(), loss.backward()))
        };
        let (value, mut grads) = on_pool(forward_backward)?;
        self.opt.update(model, &grads)?;
        decay_weights(model, lr, self.phase.weight_decay)?;
        model.try_zero_grads(&mut grads)?;
        self.grads = Some(grads);
        Ok(value)
    }
}

/// Trains `model` on `data` (at least one sample) for a phase; returns the mean loss of each
/// epoch. Batches are shuffled with `seed`; images are shifted by up to `phase.shift` pixels
/// (see [`image_geometry`]). With a `teacher`, the loss distills from it (see [`Trainer::new`]).
/// `bar`, if any, advances by one per epoch.
///
/// # Errors
/// No samples; a shift on samples that are not images; a label not below `C`; the model fails.
pub fn train<M, S, const C: usize>(
    dev: &Cpu,
    model: &mut M,
    data: &Samples,
    phase: &Phase,
    seed: u64,
    teacher: Option<(Teacher<'_>, Distillation)>,
    bar: Option<&ProgressBar>,
) -> Result<Vec<f32>>
where
    S: BatchShape,
    M: TensorCollection<f32, Cpu>
        + ModuleMut<Tensor<S, f32, Cpu, Taped>, Output = Logits<C, Taped>>
        + Send,
    <M as ModuleMut<Tensor<S, f32, Cpu, Taped>>>::Error: Into<QuantError>,
{
    if data.is_empty() {
        return Err(QuantError::InvalidValue {
            what: "training split".into(),
            value: "0 rows".into(),
            expected: "at least one row to train on".into(),
        });
    }
    let geometry = match (phase.shift, image_geometry(data.shape())) {
        (0, g) => g.unwrap_or((1, 0, 0)),
        (_, Some(g)) => g,
        (shift, None) => {
            return Err(QuantError::InvalidValue {
                what: "shift".into(),
                value: format!("{shift} pixels on samples of shape {:?}", data.shape()),
                expected: "0, or images (a shape [C, H, W], [H, W], or a square number of values)"
                    .into(),
            })
        }
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut trainer = Trainer::<M, S, C>::new(dev, model, phase, teacher)?;
    let mut order: Vec<usize> = (0..data.len()).collect();
    // The run file's limit bounds the epochs; a caller's count does not size an allocation.
    let mut epoch_losses = Vec::with_capacity(phase.epochs.min(super::config::MAX_EPOCHS));
    let steps = data.len().div_ceil(phase.batch_size.max(1));
    for epoch in 0..phase.epochs {
        order.shuffle(&mut rng);
        let mut total = 0.0f64;
        let mut batches = 0usize;
        for (step, idx) in order.chunks(phase.batch_size.max(1)).enumerate() {
            let lr = lr_at(phase, epoch, step, steps);
            let (mut pixels, labels) = data.gather(idx);
            augment(&mut pixels, geometry, phase.shift, &mut rng);
            total += trainer.step(model, pixels, &labels, lr)? as f64;
            batches += 1;
        }
        epoch_losses.push((total / batches.max(1) as f64) as f32);
        if let Some(bar) = bar {
            bar.inc(1);
        }
    }
    Ok(epoch_losses)
}

/// Logits of every sample of `data` (evaluation mode: no tape), batch by batch, on a thread
/// of rayon's current pool (as [`Trainer::step`]).
///
/// # Errors
/// The samples do not make batches of `S`; the model fails.
pub fn logits<M, S, const C: usize>(
    dev: &Cpu,
    model: &M,
    data: &Samples,
    batch_size: usize,
) -> Result<Vec<f32>>
where
    S: BatchShape,
    M: Module<Tensor<S, f32, Cpu>, Output = Logits<C>> + Sync,
    M::Error: Into<QuantError>,
{
    let all_batches = || -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(data.len() * C);
        let all: Vec<usize> = (0..data.len()).collect();
        for idx in all.chunks(batch_size.max(1)) {
            let (pixels, _) = data.gather(idx);
            let x: Tensor<S, f32, Cpu> = input(dev, pixels, idx.len())?;
            out.extend(model.try_forward(x).map_err(Into::into)?.as_vec());
        }
        Ok(out)
    };
    on_pool(all_batches)
}

/// Runs `f` on a thread of rayon's current pool (in place when called from one): the layers'
/// parallel kernels then split their work from inside the pool instead of being handed to it
/// one by one from outside and waited for, which cost a quarter of the MNIST ViT's float step
/// on two threads.
fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// Predicted classes from logits (rows of `classes`).
pub fn predictions(logits: &[f32], classes: usize) -> Vec<usize> {
    argmax_rows(logits, classes)
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
/// [`quant_dfdx::calibration::calibrate`]: the rows of [`BatchPlan`] with the seed
/// `seed ^` [`CALIBRATION_SEED_SALT`].
///
/// # Errors
/// `batches` or `batch_size` is 0, or `data` has no rows.
pub fn calibration_inputs<S: BatchShape>(
    dev: &Cpu,
    data: &Samples,
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

/// Keeps the current pool's other threads busy-waiting for work while a training step runs,
/// so that each of the step's parallel kernels finds them awake.
///
/// rayon puts a thread to sleep after a short spin without work, and waking it again takes
/// tens of microseconds on a virtual machine: after the serial stretches of a step (dfdx's
/// element-wise ops, the loss) every parallel kernel paid that before its second half began.
/// While the guard lives, each other thread of the pool runs a job that takes pending work
/// (`rayon::yield_now`, which runs whatever it finds, the step's kernels and anyone else's
/// jobs alike) and spins between jobs, as OpenMP's threads do; it returns when the guard is
/// dropped, or after [`KeepAwake::IDLE_LIMIT`] without finding work.
///
/// Only while no other step runs in the process: a thread that picks up this job while it
/// waits inside other work (another seed's step) holds that work's continuation until the job
/// returns, so two steps keeping each other's threads would each stall until the idle limit.
/// Which thread runs what never changes a result: every kernel gives the same bits on any
/// number of threads. `QUANT_KEEP_AWAKE=0` in the environment turns it off (the threads then
/// sleep between kernels, as rayon has them, and burn no time spinning).
struct KeepAwake {
    done: Arc<AtomicBool>,
}

/// Training steps under way in this process (see [`KeepAwake`]).
static STEPS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Counts a step as running for as long as it lives.
struct StepRunning;

impl StepRunning {
    /// Registers a step; true when it is the only one.
    fn start() -> (StepRunning, bool) {
        let before = STEPS_RUNNING.fetch_add(1, Ordering::SeqCst);
        (StepRunning, before == 0)
    }
}

impl Drop for StepRunning {
    fn drop(&mut self) {
        STEPS_RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

impl KeepAwake {
    /// How long a kept thread spins without finding work before it goes back to rayon's own
    /// sleep: longer than the serial stretches of a step, short enough to bound what it holds.
    const IDLE_LIMIT: Duration = Duration::from_millis(1);

    /// Starts the other threads' jobs when called from a pool of two or more threads and
    /// `alone` (no other step runs), unless `QUANT_KEEP_AWAKE=0`; `None` otherwise.
    fn start(alone: bool) -> Option<KeepAwake> {
        if !alone || std::env::var_os("QUANT_KEEP_AWAKE").is_some_and(|v| v == "0") {
            return None;
        }
        let caller = rayon::current_thread_index()?;
        if rayon::current_num_threads() < 2 {
            return None;
        }
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        rayon::spawn_broadcast(move |ctx| {
            if ctx.index() == caller {
                return;
            }
            let mut idle_since: Option<Instant> = None;
            while !flag.load(Ordering::Acquire) {
                if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                    idle_since = None;
                    continue;
                }
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > KeepAwake::IDLE_LIMIT {
                    return;
                }
                std::hint::spin_loop();
            }
        });
        Some(KeepAwake { done })
    }
}

impl Drop for KeepAwake {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_smoothing_targets() {
        const CLASSES: usize = 10;
        let plain = targets(&[3, 0], CLASSES, 0.0);
        assert_eq!(plain.len(), 2 * CLASSES);
        assert_eq!(plain[3], 1.0);
        assert_eq!(plain[CLASSES], 1.0);
        assert_eq!(plain.iter().sum::<f32>(), 2.0);
        let smooth = targets(&[3, 0], CLASSES, 0.1);
        for row in smooth.chunks(CLASSES) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        assert!((smooth[3] - 0.91).abs() < 1e-6);
        assert!((smooth[0] - 0.01).abs() < 1e-6);
        assert!((smooth[CLASSES] - 0.91).abs() < 1e-6);
        let five = targets(&[4], 5, 0.1);
        assert!((five[4] - 0.92).abs() < 1e-6 && (five[0] - 0.02).abs() < 1e-6);
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
    fn shifts_move_every_channel_of_an_image_together() {
        assert_eq!(image_geometry(&[64]), Some((1, 8, 8)));
        assert_eq!(image_geometry(&[784]), Some((1, 28, 28)));
        assert_eq!(image_geometry(&[10]), None);
        assert_eq!(image_geometry(&[3, 4, 5]), Some((3, 4, 5)));
        // Two channels of a 3x3 image, shifted by the same offset.
        let img: Vec<f32> = (1..=18).map(|v| v as f32).collect();
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..20 {
            let mut x = img.clone();
            augment(&mut x, (2, 3, 3), 1, &mut rng);
            let (a, b) = x.split_at(9);
            for (p, q) in a.iter().zip(b) {
                assert!(*p == 0.0 && *q == 0.0 || q - p == 9.0, "{a:?} {b:?}");
            }
            // Every kept value moved by at most one pixel in each direction.
            for (i, v) in a.iter().enumerate().filter(|(_, v)| **v != 0.0) {
                let j = *v as usize - 1;
                assert!((i % 3).abs_diff(j % 3) <= 1 && (i / 3).abs_diff(j / 3) <= 1);
            }
        }
    }

    #[test]
    fn steps_side_by_side_on_two_threads_give_the_losses_of_steps_alone() {
        use rand::Rng;
        type Mlp = super::super::nets::Mlp;
        let phase = Phase {
            epochs: 1,
            batch_size: 64,
            lr: 1e-3,
            schedule: Schedule::Constant,
            warmup_epochs: 0,
            shift: 0,
            optimizer: Optimizer::Adam,
            weight_decay: 0.0,
            label_smoothing: 0.0,
        };
        // Three steps of the MLP with weights drawn from `seed`, on fixed random batches.
        let losses = |seed: u64| -> Vec<f32> {
            let dev = Cpu::seed_from_u64(seed);
            let mut model: Mlp = super::super::nets::mlp().build(&dev);
            let mut trainer =
                Trainer::<Mlp, (usize, Const<64>), 10>::new(&dev, &model, &phase, None).unwrap();
            (0..3u64)
                .map(|k| {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(k);
                    let x = (0..64 * 64).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                    let y: Vec<usize> = (0..64).map(|_| rng.gen_range(0..10)).collect();
                    trainer.step(&mut model, x, &y, 1e-3).unwrap()
                })
                .collect()
        };
        let pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        };
        let (a, b) = pool(1).install(|| (losses(1), losses(2)));
        // Alone on two threads (the other thread kept awake for each step), and two models'
        // steps side by side on two threads (each may find the other's step running): the
        // same losses, and no step waits on the other for good.
        assert_eq!(pool(2).install(|| losses(1)), a);
        let (a2, b2) = pool(2).install(|| rayon::join(|| losses(1), || losses(2)));
        assert_eq!(a2, a);
        assert_eq!(b2, b);
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
        let mut q = quant_dfdx::layers::QLinear::from_linear(&m);
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

//! The pipeline: train a float model (or take one already trained), convert it under a policy,
//! calibrate (PTQ), train with quantization (QAT), export the integer model, run it on integers,
//! and report every figure, for several seeds.
//!
//! - [`run_model`] runs it on **your** dfdx model ([`Model`]: any model that converts, any input
//!   shape, any number of classes) and **your** data ([`Dataset`]), with
//!   the run file's sections as a typed [`RunConfig`] (parsed, or built in code).
//! - [`run`] is what `quant run` does: the data of the run file's `[data]`, and the bundled
//!   network its `[model]` names, sized for that data ([`nets`]): they are ordinary users of
//!   [`run_model`].
//! - The stages are functions of their own, for programs that keep their own training loop
//!   (MCT's init/finalize style): [`quantize`] (convert and calibrate),
//!   [`train::Trainer`] (one QAT step at a time, or [`train::train`] for a whole phase), and
//!   [`export_and_check`] (lower to the graph, run on integers, compare).
//!
//! ```no_run
//! use quant::dfdx::prelude::*;
//! use quant::data::{self, DataSection};
//! use quant::pipeline::{run_model, Model, RunConfig, RunOptions};
//!
//! // A model of your own: 784 inputs (28x28 images, flat), 10 classes.
//! type Mlp = (Linear<784, 128>, ReLU, Linear<128, 10>);
//! let model: Model<(usize, Const<784>), 10, _> =
//!     Model::new("my-mlp", |dev| dev.build_module::<Mlp, f32>());
//! let cfg = RunConfig::from_file("configs/mnist_mlp_w4a4.toml".as_ref())?;
//! let data = data::load(&cfg.data)?;
//! let report = run_model(&cfg, &RunOptions::default(), &data, &model, &mut |_| {})?.report;
//! println!("{}", report.table());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cache;
pub mod config;
pub mod mixed_precision;
mod model;
pub mod nets;
pub mod report;
mod schedule;
pub mod sensitivity;
mod stages;
pub mod train;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dfdx::prelude::*;
use indicatif::{MultiProgress, ProgressDrawTarget};

use quant_core::QuantError;
use quant_dfdx::convert::convert_model;
use quant_dfdx::lower::export_model;
use quant_dfdx::policy::{ConfigError, Policy};
use quant_dfdx::ptq::{RefinedLayer, RefinedTensors, Smoothing};
use quant_runtime::export::{self};
pub use quant_runtime::fs::OutputError;
use quant_runtime::fs::{check_output_file, StagedDir};
use quant_runtime::graph::Graph;
use quant_runtime::integer::{Budget, IntegerModel};
use quant_runtime::GraphError;

use crate::data::{self, DataError, Dataset, Samples};
pub use cache::CACHE_KEY_VERSION;
pub use config::{ModelKind, QatInit, RunConfig};
pub use model::{
    BatchShape, DeployModel, FloatModel, FloatWeights, Logits, Model, QuantizedModel, Taped,
};
pub use report::{RunReport, SeedResult};
use schedule::{lock, run_seeds};
use stages::{Seed, SeedOutcome};
use train::{accuracy, calibration_inputs, logits, predictions};

/// Everything that can stop a run, each naming the file or layer concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The run file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The data file.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A quantization step (the message names the layer or quantizer).
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// Export or loading of the integer model.
    #[error(transparent)]
    Export(#[from] GraphError),
    /// The export directory or the report cannot be written there (checked before the run
    /// starts), or writing it failed.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Reading or writing the float checkpoint cache or the report.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

/// Where a run reads and writes (default: no cache, no export, no progress bars).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Float checkpoints are cached here (per model, seed and schedule); `None` disables it.
    pub cache_dir: Option<PathBuf>,
    /// The first seed's integer model is exported here.
    pub export_dir: Option<PathBuf>,
    /// Draw progress bars (on stderr).
    pub progress: bool,
    /// The run file's name, for the report.
    pub policy_name: String,
}

/// A seed has finished: what [`run_staged`] tells its caller after each seed.
#[derive(Debug, Clone, Copy)]
pub struct SeedDone<'a> {
    /// The seed's figures.
    pub result: &'a SeedResult,
    /// How many seeds have finished, this one included.
    pub done: usize,
    /// How many seeds the run has.
    pub total: usize,
    /// Time since the run started.
    pub elapsed: Duration,
}

/// A finished run whose integer model is written but not yet in place.
#[derive(Debug)]
pub struct StagedRun {
    /// The report (its `export_dir` names where the export goes).
    pub report: RunReport,
    /// The first seed's export, staged beside its directory: [`StagedDir::commit`] puts it in
    /// place; dropping it leaves the directory as it was. `None` when the model has no graph
    /// form or without [`RunOptions::export_dir`]; a graph the integer runtime cannot run (a
    /// layer the policy leaves float) is still exported, with its ONNX.
    pub export: Option<StagedDir>,
}

/// Runs the whole pipeline for every seed of `cfg`, and puts the export in place only once
/// every seed has succeeded.
///
/// # Errors
/// See [`run_staged`]; also the export cannot be put in place. A failed run leaves an
/// existing export directory as it was.
pub fn run(cfg: &RunConfig, opts: &RunOptions) -> Result<RunReport, RunError> {
    let staged = run_staged(cfg, opts, &mut |_| {})?;
    if let Some(export) = staged.export {
        export.commit()?;
    }
    Ok(staged.report)
}

/// Runs the whole pipeline for every seed of `cfg`, calling `on_seed` after each, and returns
/// the report with the export staged (see [`StagedRun`]), for callers that put several
/// outputs in place together: the data of `[data]`, and the bundled network `[model]` names,
/// sized for that data ([`nets::run_bundled`]).
///
/// Seeds run in parallel on the threads of the current rayon pool (the global one, or the
/// pool this is called in), each with its own device and generators: the report, the export
/// and the cache files are the same, bit for bit, whatever the number of threads. `on_seed` is
/// called once per seed as it finishes (in the order they finish, from the thread that ran
/// it, one call at a time).
///
/// The export directory is checked before anything else
/// ([`check_export_dir`](quant_runtime::fs::check_export_dir): absent, empty or a previous
/// export), so a run that could not write its result fails at once.
///
/// # Errors
/// Output, data, quantization, export and file errors; a run file without `[model]`; data no
/// bundled network takes; an empty training or test split (a hold-out fold of a small file).
pub fn run_staged(
    cfg: &RunConfig,
    opts: &RunOptions,
    on_seed: &mut (dyn FnMut(SeedDone<'_>) + Send),
) -> Result<StagedRun, RunError> {
    if let Some(dir) = &opts.export_dir {
        // Checked before the data is read, like every output.
        quant_runtime::fs::check_export_dir(dir)?;
    }
    let kind = cfg.bundled_model()?;
    let data = data::load(&cfg.data)?;
    nets::run_bundled(kind, cfg, opts, &data, on_seed)
}

/// Runs the whole pipeline on a model of your own and your data, for every seed of `cfg`
/// (its `[model]` and `[data]` sections are not read), calling `on_seed` after each; returns
/// the report with the export staged (see [`StagedRun`]).
///
/// The data is checked against the model before anything trains: the sample size (any shape
/// of the same size is taken: `[784]` data for a model of `[1, 28, 28]` inputs) and every
/// label below `C`. Float training uses `[float]` unless the model brings its weights
/// ([`Model::with_weights`]); calibration uses the data set's calibration samples, or its
/// training split. Seeds run as [`run_staged`] describes.
///
/// # Errors
/// The data does not fit the model; output, quantization, export and file errors.
pub fn run_model<S, const C: usize, F, D>(
    cfg: &RunConfig,
    opts: &RunOptions,
    data: &Dataset,
    model: &Model<S, C, F, D>,
    on_seed: &mut (dyn FnMut(SeedDone<'_>) + Send),
) -> Result<StagedRun, RunError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    let export = opts.export_dir.as_deref().map(StagedDir::new).transpose()?;
    let data = data.clone().for_model(&S::sample_shape(), C)?;
    // The policy against the model's layers before anything trains: an override that matches
    // no layer, or names a slot none of its layers has, fails now, not after float training.
    {
        let policy = cfg.quantization.clone();
        let untrained = model.deploy(&model.build(&Cpu::default()));
        convert_model(&untrained, &policy)?;
        policy.check_unmatched()?;
    }
    let progress = MultiProgress::with_draw_target(if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let started = Instant::now();
    let seeds = &cfg.run.seeds;
    let (cache_files, float_after) = seed_plan(cfg, opts, &data, model);
    // Cache files are checked before any training, like the other outputs.
    for path in cache_files.iter().flatten() {
        check_output_file(path).map_err(output_error)?;
    }
    let tasks = SeedTasks::new(cfg, opts, &data, progress);
    let export = Mutex::new(export);
    let finished = Mutex::new((0usize, on_seed));
    let outcomes = run_seeds(
        float_after,
        |i| {
            tasks.run(i, |seed| {
                stages::float_model(seed, model, cache_files[i].as_deref())
            })
        },
        |i, float| {
            let outcome = tasks.run(i, |seed| {
                let staged = if i == 0 { lock(&export).take() } else { None };
                stages::quantized(seed, model, float, i == 0, staged)
            })?;
            let mut finished = lock(&finished);
            finished.0 += 1;
            let done = finished.0;
            (finished.1)(SeedDone {
                result: &outcome.result,
                done,
                total: seeds.len(),
                elapsed: started.elapsed(),
            });
            Ok(outcome)
        },
    )?;
    Ok(report(model.name(), cfg, opts, &data, outcomes))
}

/// Converts `deploy` under `policy` and calibrates it on `batches` shuffled batches of
/// `batch_size` samples of `calibration` (the shuffle seeded by `seed`), then runs the learned
/// rounding and bias correction the policy asks for on the first of those samples
/// ([`quant_dfdx::ptq`]): the PTQ model, every quantizer frozen. A policy pattern that matches
/// no layer is an error naming it.
///
/// # Errors
/// The policy cannot be applied (an override matching nothing, a setting no quantizer
/// supports); no samples; an observer fails; the samples do not make batches of `S`.
pub fn quantize<S, const C: usize, D>(
    dev: &Cpu,
    deploy: &D,
    policy: &Policy,
    calibration: &Samples,
    batches: usize,
    batch_size: usize,
    seed: u64,
) -> Result<D::Quantized, RunError>
where
    S: BatchShape,
    D: DeployModel<S, C>,
{
    let plan = (batches, batch_size, seed);
    Ok(quantize_and_refine::<S, C, D>(dev, deploy, policy, calibration, plan)?.model)
}

/// What [`quantize_and_refine`] returns: the calibrated model and what the steps around
/// calibration did to it.
#[derive(Debug, Clone)]
pub struct Calibrated<Q> {
    /// The calibrated (and refined) model.
    pub model: Q,
    /// What SmoothQuant did before calibration ([`quant_dfdx::ptq::smooth`]).
    pub smoothed: Smoothing,
    /// What learned rounding and bias correction did, per layer they ran on
    /// ([`quant_dfdx::ptq::refine`]).
    pub refined: Vec<RefinedLayer>,
    /// The tensors they replaced, with their float values (empty when nothing was refined).
    pub replaced: RefinedTensors,
}

/// [`quantize`], with smoothing before calibration and learned rounding and bias correction
/// after it, as the policy asks, reporting what each did; `plan` is
/// `(batches, batch_size, seed)`.
///
/// # Errors
/// As [`quantize`].
pub fn quantize_and_refine<S, const C: usize, D>(
    dev: &Cpu,
    deploy: &D,
    policy: &Policy,
    calibration: &Samples,
    (batches, batch_size, seed): (usize, usize, u64),
) -> Result<Calibrated<D::Quantized>, RunError>
where
    S: BatchShape,
    D: DeployModel<S, C>,
{
    // The policy records the layers it matched: each conversion gets its own copy.
    let policy = policy.clone();
    let mut model = convert_model(deploy, &policy)?;
    policy.check_unmatched()?;
    let inputs = calibration_inputs::<S>(dev, calibration, batches, batch_size, seed)?;
    // Smoothing, learned rounding and bias correction fit on the first calibration samples.
    let wanted = policy
        .adaround
        .samples
        .saturating_mul(S::sample_shape().iter().product());
    let mut samples: Vec<f32> = Vec::new();
    for x in &inputs {
        if samples.len() >= wanted {
            break;
        }
        samples.extend(x.as_vec());
    }
    let smoothed = quant_dfdx::ptq::smooth(&mut model, &policy, &S::sample_shape(), &samples)?;
    quant_dfdx::calibration::calibrate(&mut model, inputs)?;
    let (refined, replaced) =
        quant_dfdx::ptq::refine(&mut model, &policy, &S::sample_shape(), &samples)?;
    Ok(Calibrated {
        model,
        smoothed,
        refined,
        replaced,
    })
}

/// What [`export_and_check`] found: the exported graph, and how the integer model did.
#[derive(Debug, Clone)]
pub struct IntegerCheck {
    /// The graph, ready for [`export::save`].
    pub graph: Graph,
    /// The integer model's predictions on the samples.
    pub predictions: Vec<usize>,
    /// Their accuracy.
    pub accuracy: f64,
    /// The share of samples where the integer model predicts what the quantized (fake-quantized,
    /// in `f32`) model predicts.
    pub agreement: f64,
}

/// Lowers a trained quantized model to the graph, runs it on integers on `samples`, and
/// compares its predictions with the quantized model's (frozen, evaluation mode).
///
/// # Errors
/// The model has a layer without a graph form, or one the integer runtime cannot run (the
/// error names it); the samples do not make batches of `S`.
pub fn export_and_check<S, const C: usize, Q>(
    model: &Q,
    samples: &Samples,
    info: std::collections::BTreeMap<String, String>,
) -> Result<IntegerCheck, RunError>
where
    S: BatchShape,
    Q: QuantizedModel<S, C>,
{
    let graph = export_model(model, &S::sample_shape(), info)?;
    let integer = IntegerModel::new(&graph)?;
    let predicted = integer.predict(samples.features())?;
    let dev = Cpu::default();
    let reference = predictions(&logits::<Q, S, C>(&dev, model, samples, 256)?, C);
    Ok(IntegerCheck {
        accuracy: accuracy(&predicted, samples.labels()),
        agreement: accuracy(&predicted, &reference),
        predictions: predicted,
        graph,
    })
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> RunError {
    RunError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn output_error(e: OutputError) -> RunError {
    match e {
        OutputError::Refused { path, reason } => RunError::File {
            path,
            message: reason,
        },
        OutputError::Io { path, source } => RunError::File {
            path,
            message: source.to_string(),
        },
        other => RunError::Output(other),
    }
}

/// What the tasks of a run's seeds share. Each seed runs with its own copy of the run file (the
/// policy records the layers it matched), locked for the task; a seed's two tasks never run at
/// once, so its lock is never contended.
struct SeedTasks<'a> {
    configs: Vec<Mutex<RunConfig>>,
    opts: &'a RunOptions,
    data: &'a Dataset,
    seeds: &'a [u64],
    progress: MultiProgress,
}

/// Per seed of `cfg`, for [`run_seeds`]: its float model's cache file (trained models with a
/// cache directory only), and the earlier listing of the same seed whose float model it waits
/// for (a seed listed twice trains or loads its float model after the previous listing has
/// written it to the cache, as a sequential run does).
fn seed_plan<S: BatchShape, const C: usize, F, D>(
    cfg: &RunConfig,
    opts: &RunOptions,
    data: &Dataset,
    model: &Model<S, C, F, D>,
) -> (Vec<Option<PathBuf>>, Vec<Option<usize>>) {
    let seeds = &cfg.run.seeds;
    let train_digest = cache::split_digest(&data.train);
    let cache_files = seeds
        .iter()
        .map(|&seed| match (model.weights(), opts.cache_dir.as_deref()) {
            (FloatWeights::Train, Some(dir)) => Some(cache::cache_path(
                dir,
                model.name(),
                cfg,
                seed,
                &train_digest,
            )),
            _ => None,
        })
        .collect();
    let float_after = (0..seeds.len())
        .map(|i| seeds[..i].iter().rposition(|s| *s == seeds[i]))
        .collect();
    (cache_files, float_after)
}

impl<'a> SeedTasks<'a> {
    /// The tasks of `cfg`'s seeds, each with its own copy of `cfg`.
    fn new(
        cfg: &'a RunConfig,
        opts: &'a RunOptions,
        data: &'a Dataset,
        progress: MultiProgress,
    ) -> SeedTasks<'a> {
        SeedTasks {
            configs: cfg
                .run
                .seeds
                .iter()
                .map(|_| Mutex::new(cfg.clone()))
                .collect(),
            opts,
            data,
            seeds: &cfg.run.seeds,
            progress,
        }
    }

    /// Runs `task` for the seed at index `i`.
    fn run<T>(&self, i: usize, task: impl FnOnce(&Seed<'_>) -> T) -> T {
        let cfg = lock(&self.configs[i]);
        task(&Seed {
            cfg: &cfg,
            opts: self.opts,
            data: self.data,
            seed: self.seeds[i],
            progress: &self.progress,
        })
    }
}

/// The report of a run from its seeds' outcomes, in seed order; the first seed's export.
fn report(
    model: &str,
    cfg: &RunConfig,
    opts: &RunOptions,
    data: &Dataset,
    outcomes: Vec<SeedOutcome>,
) -> StagedRun {
    let mut results = Vec::with_capacity(outcomes.len());
    let mut no_integer = None;
    let mut first = None;
    for outcome in outcomes {
        results.push(outcome.result);
        no_integer = outcome.no_integer.or(no_integer);
        first = first.or(outcome.first);
    }
    let first = first.unwrap_or_default();
    let mut report = RunReport::new(
        model.to_string(),
        opts.policy_name.clone(),
        report::recipe(cfg),
        results,
        first.layers,
        first.exported_dir,
        no_integer,
    );
    report.no_onnx_model = first.no_onnx;
    report.refined = first.refined;
    report.smoothed = first.smoothed;
    report.data = Some(data.origin.clone());
    StagedRun {
        report,
        export: first.export,
    }
}

/// Evaluates an exported integer model on the test split of `data` under `budget`: returns
/// the accuracy, the number of test samples and the predictions.
///
/// # Errors
/// The export cannot be loaded or is inconsistent, or exceeds the budget; it does not take the
/// data's samples or has fewer outputs than the data's labels need.
pub fn eval_export(
    dir: &Path,
    data: &Dataset,
    budget: Budget,
) -> Result<(f64, usize, Vec<usize>), RunError> {
    let model = IntegerModel::with_budget(&export::load(dir)?, budget)?;
    let needed = data.classes_needed();
    if model.input_features() != data.test.sample_len() || model.output_features() < needed {
        return Err(RunError::Export(GraphError::Unsupported {
            layer: "(model)".into(),
            reason: format!(
                "takes {} inputs and gives {} outputs; the data ({}) has {} values per sample and labels up to {}",
                model.input_features(),
                model.output_features(),
                data.origin,
                data.test.sample_len(),
                needed.saturating_sub(1)
            ),
        }));
    }
    let predicted = model.predict(data.test.features())?;
    Ok((
        accuracy(&predicted, data.test.labels()),
        data.test.len(),
        predicted,
    ))
}

/// Loads a float checkpoint of `model` (used by tests).
#[doc(hidden)]
pub fn load_float<S, const C: usize, F, D>(
    model: &Model<S, C, F, D>,
    dev: &Cpu,
    path: &Path,
) -> Result<F, RunError>
where
    F: TensorCollection<f32, Cpu>,
{
    let mut m = model.build(dev);
    quant_dfdx::checkpoint::load_checkpoint(&mut m, path).map_err(|e| file_error(path, e))?;
    Ok(m)
}

//! The main job: train a float model on the digits, convert it under a policy, calibrate (PTQ),
//! train with quantization (QAT), export the integer model and run it on integers.
//!
//! [`run`] does all of it from a [`RunConfig`]; the `quant run` command is a thin shell around
//! it.

mod cache;
pub mod config;
pub mod nets;
pub mod report;
mod schedule;
mod stages;
pub mod train;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dfdx::prelude::*;
use indicatif::{MultiProgress, ProgressDrawTarget};

use quant_core::QuantError;
use quant_ops::export::{self, ExportError};
pub use quant_ops::fs::OutputError;
use quant_ops::fs::{check_output_file, StagedDir};
use quant_ops::integer::IntegerModel;
use quant_ops::policy::PolicyError;

use crate::digits::{self, DataError, Digits};
pub use cache::CACHE_KEY_VERSION;
pub use config::{ModelKind, QatInit, RunConfig};
use nets::{MlpNet, Net};
pub use report::{RunReport, SeedResult};
use schedule::{lock, run_seeds};
use stages::{Seed, SeedOutcome};
use train::accuracy;

/// Everything that can stop a run, each naming the file or layer concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The run file.
    #[error(transparent)]
    Config(#[from] PolicyError),
    /// The data file.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A quantization step (the message names the layer or quantizer).
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// Export or loading of the integer model.
    #[error(transparent)]
    Export(#[from] ExportError),
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

/// Where a run reads and writes.
#[derive(Debug, Clone)]
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
/// outputs in place together.
///
/// Seeds run in parallel on the threads of the current rayon pool (the global one, or the
/// pool this is called in), each with its own device and generators: the report, the export
/// and the cache files are the same, bit for bit, whatever the number of threads. `on_seed` is
/// called once per seed as it finishes (in the order they finish, from the thread that ran
/// it, one call at a time).
///
/// The export directory is checked before anything else
/// ([`check_export_dir`](quant_ops::fs::check_export_dir): absent, empty or a previous
/// export), so a run that could not write its result fails at once.
///
/// # Errors
/// Output, data, quantization, export and file errors; an empty training or test split (a
/// hold-out fold of a small file).
pub fn run_staged(
    cfg: &RunConfig,
    opts: &RunOptions,
    on_seed: &mut (dyn FnMut(SeedDone<'_>) + Send),
) -> Result<StagedRun, RunError> {
    let export = opts.export_dir.as_deref().map(StagedDir::new).transpose()?;
    let (mut data, origin) = match &cfg.data.path {
        Some(path) => (digits::load(path)?, path.clone()),
        None => (digits::bundled()?, PathBuf::from(digits::BUNDLED_NAME)),
    };
    if let Some(h) = cfg.data.holdout {
        // Recipe development: the held-out fold of the training split stands in for the test
        // split, which is dropped unread.
        let rows = data.train.len();
        let (kept, held) = train::holdout(&data.train, h.folds, h.fold);
        if held.is_empty() || kept.is_empty() {
            return Err(DataError::EmptySplit {
                path: origin,
                message: format!(
                    "data.holdout = {{ folds = {}, fold = {} }} leaves {} rows to train on and {} to evaluate on, of the {rows} rows of the training split; both need at least one: use a fold below {} or a larger data file",
                    h.folds,
                    h.fold,
                    kept.len(),
                    held.len(),
                    h.folds.min(rows)
                ),
            }
            .into());
        }
        data = Digits {
            train: kept,
            test: held,
        };
    }
    for (split, name) in [(&data.train, "training"), (&data.test, "test")] {
        if split.is_empty() {
            return Err(DataError::EmptySplit {
                path: origin,
                message: format!("the {name} split has no rows; a run needs at least one"),
            }
            .into());
        }
    }
    match cfg.model.kind {
        ModelKind::Mlp => run_net::<MlpNet>(cfg, opts, &data, export, on_seed),
        ModelKind::Cnn => run_net::<nets::CnnNet>(cfg, opts, &data, export, on_seed),
        ModelKind::Resnet => run_net::<nets::ResnetNet>(cfg, opts, &data, export, on_seed),
        ModelKind::Vit => run_net::<nets::VitNet>(cfg, opts, &data, export, on_seed),
    }
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
    data: &'a Digits,
    seeds: &'a [u64],
    progress: MultiProgress,
}

impl SeedTasks<'_> {
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

/// Runs every seed of `cfg` on the network `N`, seeds in parallel on the threads of the
/// current rayon pool (see `schedule`), and assembles the report in seed order.
fn run_net<N: Net>(
    cfg: &RunConfig,
    opts: &RunOptions,
    data: &Digits,
    export: Option<StagedDir>,
    on_seed: &mut (dyn FnMut(SeedDone<'_>) + Send),
) -> Result<StagedRun, RunError>
where
    N::Float: Send,
    N::Deploy: Send,
    N::Quantized: Send,
{
    let progress = MultiProgress::with_draw_target(if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let started = Instant::now();
    let seeds = &cfg.run.seeds;
    let train_digest = cache::split_digest(&data.train);
    let cache_files: Vec<Option<PathBuf>> = seeds
        .iter()
        .map(|&seed| {
            opts.cache_dir
                .as_deref()
                .map(|dir| cache::cache_path(dir, cfg, seed, &train_digest))
        })
        .collect();
    // Cache files are checked before any training, like the other outputs.
    for path in cache_files.iter().flatten() {
        check_output_file(path).map_err(output_error)?;
    }
    // A seed listed twice trains (or loads) its float model after the previous listing has
    // written it to the cache, as a sequential run does.
    let float_after: Vec<Option<usize>> = (0..seeds.len())
        .map(|i| seeds[..i].iter().rposition(|s| *s == seeds[i]))
        .collect();
    let tasks = SeedTasks {
        configs: seeds.iter().map(|_| Mutex::new(cfg.clone())).collect(),
        opts,
        data,
        seeds,
        progress,
    };
    let export = Mutex::new(export);
    let finished = Mutex::new((0usize, on_seed));
    let outcomes = run_seeds(
        float_after,
        |i| {
            tasks.run(i, |seed| {
                stages::float_model::<N>(seed, cache_files[i].as_deref())
            })
        },
        |i, float| {
            let outcome = tasks.run(i, |seed| {
                let staged = if i == 0 { lock(&export).take() } else { None };
                stages::quantized::<N>(seed, float, i == 0, staged)
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
    Ok(report(cfg, opts, outcomes))
}

/// The report of a run from its seeds' outcomes, in seed order; the first seed's export.
fn report(cfg: &RunConfig, opts: &RunOptions, outcomes: Vec<SeedOutcome>) -> StagedRun {
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
        cfg.model.kind.to_string(),
        opts.policy_name.clone(),
        report::recipe(cfg),
        results,
        first.layers,
        first.exported_dir,
        no_integer,
    );
    report.no_onnx_model = first.no_onnx;
    StagedRun {
        report,
        export: first.export,
    }
}

/// Evaluates an exported integer model on the test split of `data_path` (default: the bundled
/// file): returns the accuracy and the number of test samples.
///
/// # Errors
/// The export cannot be loaded or is inconsistent; the data file cannot be read.
pub fn eval_export(dir: &Path, data_path: Option<&Path>) -> Result<(f64, usize), RunError> {
    let data = match data_path {
        Some(path) => digits::load(path)?,
        None => digits::bundled()?,
    };
    let model = IntegerModel::new(&export::load(dir)?)?;
    if model.input_features() != digits::PIXELS || model.output_features() != digits::CLASSES {
        return Err(RunError::Export(ExportError::Unsupported {
            layer: "(model)".into(),
            reason: format!(
                "takes {} inputs and gives {} outputs; the digits need {} and {}",
                model.input_features(),
                model.output_features(),
                digits::PIXELS,
                digits::CLASSES
            ),
        }));
    }
    let predicted = model.predict(&data.test.images)?;
    Ok((accuracy(&predicted, &data.test.labels), data.test.len()))
}

/// Loads a float checkpoint of `N` (used by tests).
#[doc(hidden)]
pub fn load_float<N: Net>(dev: &Cpu, path: &Path) -> Result<N::Float, RunError> {
    let mut m = N::build(dev);
    quant_ops::checkpoint::load_checkpoint(&mut m, path).map_err(|e| file_error(path, e))?;
    Ok(m)
}

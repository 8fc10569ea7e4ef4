//! The main job: train a float model on the digits, convert it under a policy, calibrate (PTQ),
//! train with quantization (QAT), export the integer model and run it on integers.
//!
//! [`run`] does all of it from a [`RunConfig`]; the `quant run` command is a thin shell around
//! it.

pub mod config;
pub mod nets;
pub mod report;
pub mod train;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dfdx::nn::SaveToSafetensors;
use dfdx::prelude::*;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use quant_core::QuantError;
use quant_ops::convert::convert_model;
use quant_ops::export::{self, export_model, ExportError, OnnxFormat, QuantFormat};
pub use quant_ops::fs::OutputError;
use quant_ops::fs::{check_output_file, StagedDir, StagedFile};
use quant_ops::integer::IntegerModel;
use quant_ops::layers::{QuantizedModuleExt, QuantizerMode};
use quant_ops::policy::PolicyError;
use quant_ops::report::{layer_report, LayerReport};

use crate::digits::{self, DataError, Digits, Split};
pub use config::{ModelKind, QatInit, RunConfig};
use nets::{MlpNet, Net};
pub use report::{RunReport, SeedResult};
use train::{accuracy, calibrate, input, logits, predictions, train, Phase};

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

fn bar(multi: &MultiProgress, len: u64, label: String, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = multi.add(ProgressBar::new(len));
    b.set_style(
        ProgressStyle::with_template("{prefix:>22} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b.set_prefix(label);
    b.enable_steady_tick(Duration::from_millis(200));
    b
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
    /// place; dropping it leaves the directory as it was. `None` without an integer model or
    /// without [`RunOptions::export_dir`].
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
    on_seed: &mut dyn FnMut(SeedDone<'_>),
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
    }
}

fn recipe(cfg: &RunConfig) -> String {
    let q = &cfg.qat;
    let mut s = format!(
        "float: {:?} lr {} ({:?}), {} epochs, batch {}; PTQ: {} calibration batches of {}; QAT: {:?} lr {} ({:?}), {} epochs, batch {}, init {:?}",
        cfg.float.optimizer,
        cfg.float.lr,
        cfg.float.schedule,
        cfg.float.epochs,
        cfg.float.batch_size,
        cfg.calibration.batches,
        cfg.calibration.batch_size,
        q.optimizer,
        q.lr,
        q.schedule,
        q.epochs,
        q.batch_size,
        q.init
    );
    if cfg.float.shift > 0 || q.shift > 0 {
        s.push_str(&format!(
            "; random shifts of up to {} px (float) / {} px (QAT)",
            cfg.float.shift, q.shift
        ));
    }
    if let Some(d) = q.distillation {
        s.push_str(&format!(
            ", distillation from the float model (weight {}, temperature {})",
            d.weight, d.temperature
        ));
    }
    for (phase, wd, ls) in [
        ("float", cfg.float.weight_decay, cfg.float.label_smoothing),
        ("QAT", q.weight_decay, q.label_smoothing),
    ] {
        if wd > 0.0 {
            s.push_str(&format!("; {phase} weight decay {wd}"));
        }
        if ls > 0.0 {
            s.push_str(&format!("; {phase} label smoothing {ls}"));
        }
    }
    if let Some(h) = cfg.data.holdout {
        s.push_str(&format!(
            "; HOLD-OUT MODE: trained without fold {} of {} of the training split, figures on that fold (not the test split)",
            h.fold, h.folds
        ));
    }
    s
}

/// Version of the float-checkpoint cache key: bump it when a change of the code changes the
/// float model that the same recipe, data and seed train.
pub const CACHE_KEY_VERSION: u32 = 2;

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// SHA-256 of a split's rows: what the float model is trained on.
fn split_digest(split: &Split) -> String {
    let mut bytes = Vec::with_capacity(8 + split.images.len() * 4 + split.len());
    bytes.extend_from_slice(&(split.len() as u64).to_le_bytes());
    bytes.extend(split.images.iter().flat_map(|v| v.to_le_bytes()));
    bytes.extend(split.labels.iter().map(|l| *l as u8));
    sha256_hex(&bytes)
}

/// The float checkpoint of `seed`, keyed by everything that determines it: the training
/// data (a SHA-256 of its rows), the model kind, the whole `[float]` recipe, the hold-out, the
/// seed, the key's version and quant's version. A run that changes any of them trains anew.
fn cache_path(dir: &Path, cfg: &RunConfig, seed: u64, train_digest: &str) -> PathBuf {
    let code = (CACHE_KEY_VERSION, env!("CARGO_PKG_VERSION"));
    versioned_cache_path(dir, cfg, seed, train_digest, code)
}

/// [`cache_path`] for the code version `(key version, quant version)`.
fn versioned_cache_path(
    dir: &Path,
    cfg: &RunConfig,
    seed: u64,
    train_digest: &str,
    (key_version, quant_version): (u32, &str),
) -> PathBuf {
    let ingredients = serde_json::json!({
        "key_version": key_version,
        "quant_version": quant_version,
        "model": cfg.model.kind,
        "float": cfg.float,
        "holdout": cfg.data.holdout,
        "seed": seed,
        "train_data_sha256": train_digest,
    });
    let key = sha256_hex(ingredients.to_string().as_bytes());
    dir.join(format!(
        "{}-seed{seed}-{}.safetensors",
        cfg.model.kind,
        &key[..16]
    ))
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

fn run_net<N: Net>(
    cfg: &RunConfig,
    opts: &RunOptions,
    data: &Digits,
    mut export: Option<StagedDir>,
    on_seed: &mut dyn FnMut(SeedDone<'_>),
) -> Result<StagedRun, RunError> {
    let multi = MultiProgress::with_draw_target(if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let started = Instant::now();
    let train_digest = split_digest(&data.train);
    // Cache files are checked before any training, like the other outputs.
    if let Some(dir) = &opts.cache_dir {
        for &seed in &cfg.run.seeds {
            check_output_file(&cache_path(dir, cfg, seed, &train_digest)).map_err(output_error)?;
        }
    }
    let mut results = Vec::new();
    let mut first_layers: Vec<LayerReport> = Vec::new();
    let mut exported_dir = None;
    let mut staged_export = None;
    let mut no_integer: Option<String> = None;
    let mut no_onnx: Option<String> = None;
    for (i, &seed) in cfg.run.seeds.iter().enumerate() {
        let dev = Cpu::seed_from_u64(seed);
        let eval_batch = 256;

        // 1. Float model: from the cache, or trained.
        let mut float = N::build(&dev);
        let cached = opts
            .cache_dir
            .as_ref()
            .map(|d| cache_path(d, cfg, seed, &train_digest));
        let float_from_cache = match &cached {
            Some(path) if path.exists() => {
                // A checked load: a corrupted cache file is a typed error, not a panic in dfdx.
                quant_ops::checkpoint::load_checkpoint(&mut float, path)
                    .map_err(|e| file_error(path, format!("cannot load float checkpoint: {e}")))?;
                true
            }
            _ => false,
        };
        if !float_from_cache {
            let phase = Phase {
                epochs: cfg.float.epochs,
                batch_size: cfg.float.batch_size,
                lr: cfg.float.lr,
                schedule: cfg.float.schedule,
                shift: cfg.float.shift,
                optimizer: cfg.float.optimizer,
                weight_decay: cfg.float.weight_decay,
                label_smoothing: cfg.float.label_smoothing,
            };
            let b = bar(
                &multi,
                phase.epochs as u64,
                format!("seed {seed}: float"),
                opts.progress,
            );
            train::<N::Float, N::Input>(&dev, &mut float, &data.train, &phase, seed, None, &b)?;
            b.finish_and_clear();
            if let Some(path) = &cached {
                save_checkpoint(&float, path)?;
            }
        }
        let fp32_logits = logits::<N::Float, N::Input>(&dev, &float, &data.test, eval_batch)?;
        let fp32_accuracy = accuracy(&predictions(&fp32_logits), &data.test.labels);

        // 2. PTQ: convert the deployable float model, calibrate, evaluate.
        let deploy = N::deploy(&float);
        let policy = cfg.quantization.clone();
        let mut ptq = convert_model(&deploy, &policy)?;
        policy.check_unmatched()?;
        let b = bar(
            &multi,
            1,
            format!("seed {seed}: calibration"),
            opts.progress,
        );
        calibrate::<N::Quantized, N::Input>(
            &dev,
            &mut ptq,
            &data.train,
            cfg.calibration.batches,
            cfg.calibration.batch_size,
            seed,
        )?;
        ptq.finish_calibration()?;
        b.finish_and_clear();
        let ptq_accuracy = accuracy(
            &predictions(&logits::<N::Quantized, N::Input>(
                &dev, &ptq, &data.test, eval_batch,
            )?),
            &data.test.labels,
        );

        // 3. QAT.
        let mut qat = match cfg.qat.init {
            QatInit::Ptq => ptq.clone(),
            QatInit::FirstBatch => {
                let mut m = convert_model(&deploy, &policy)?;
                calibrate::<N::Quantized, N::Input>(
                    &dev,
                    &mut m,
                    &data.train,
                    1,
                    cfg.qat.batch_size,
                    seed,
                )?;
                m.finish_calibration()?;
                m
            }
        };
        if cfg.qat.epochs > 0 {
            qat.set_mode("*", QuantizerMode::Training)?;
            let teacher_fn = |pixels: Vec<f32>, n: usize| -> quant_core::Result<Vec<f32>> {
                let x = input::<N::Input>(&dev, pixels, n)?;
                Ok(float.try_forward(x)?.as_vec())
            };
            let phase = Phase {
                epochs: cfg.qat.epochs,
                batch_size: cfg.qat.batch_size,
                lr: cfg.qat.lr,
                schedule: cfg.qat.schedule,
                shift: cfg.qat.shift,
                optimizer: cfg.qat.optimizer,
                weight_decay: cfg.qat.weight_decay,
                label_smoothing: cfg.qat.label_smoothing,
            };
            let b = bar(
                &multi,
                phase.epochs as u64,
                format!("seed {seed}: QAT"),
                opts.progress,
            );
            train::<N::Quantized, N::Input>(
                &dev,
                &mut qat,
                &data.train,
                &phase,
                seed.wrapping_add(1),
                cfg.qat
                    .distillation
                    .map(|d| (&teacher_fn as train::Teacher<'_>, d)),
                &b,
            )?;
            b.finish_and_clear();
            qat.set_mode("*", QuantizerMode::Frozen)?;
        }
        let qat_logits = logits::<N::Quantized, N::Input>(&dev, &qat, &data.test, eval_batch)?;
        let qat_predictions = predictions(&qat_logits);
        let qat_accuracy = accuracy(&qat_predictions, &data.test.labels);
        let qat_train_accuracy = accuracy(
            &predictions(&logits::<N::Quantized, N::Input>(
                &dev,
                &qat,
                &data.train,
                eval_batch,
            )?),
            &data.train.labels,
        );

        // 4. Export and integer inference.
        let mut info = BTreeMap::new();
        info.insert("model".into(), cfg.model.kind.to_string());
        info.insert("policy".into(), opts.policy_name.clone());
        info.insert("seed".into(), seed.to_string());
        // A policy that leaves a layer float has no integer form: the run still reports the
        // rest, and says why there is no integer model.
        let graph = export_model(&qat, N::INPUT_SHAPE, info)?;
        let integer = match IntegerModel::new(&graph) {
            Ok(model) => {
                let predicted = model.predict(&data.test.images)?;
                Some((graph, predicted))
            }
            Err(ExportError::Unsupported { layer, reason }) => {
                no_integer = Some(format!("layer `{layer}`: {reason}"));
                None
            }
            Err(e) => return Err(e.into()),
        };
        let integer_accuracy = integer
            .as_ref()
            .map(|(_, p)| accuracy(p, &data.test.labels));
        let integer_agreement = integer.as_ref().map(|(_, p)| accuracy(p, &qat_predictions));

        if i == 0 {
            let n = data.train.len().min(256);
            let idx: Vec<usize> = (0..n).collect();
            let (pixels, _) = data.train.gather(&idx);
            // Against the same model with every quantizer disabled: after QAT its weights differ
            // from the float model's, and the report measures quantization alone.
            first_layers = layer_report(&qat, N::INPUT_SHAPE, &pixels)?;
            if let (Some(staged), Some((graph, int_predictions))) = (export.take(), &integer) {
                // Written beside the target; put in place only when every seed has succeeded.
                // model.onnx too, unless ONNX cannot express the model (the report says why).
                let onnx = OnnxFormat::for_platform(cfg.quantization.platform.as_deref());
                for (_, why) in
                    export::save_with_optional(graph, staged.path(), &[&QuantFormat], &[&onnx])?
                {
                    no_onnx = Some(why.to_string());
                }
                // Prove the files load and reproduce the in-memory model.
                let reloaded = IntegerModel::new(&export::load(staged.path())?)?;
                if reloaded.predict(&data.test.images)? != *int_predictions {
                    return Err(RunError::File {
                        path: staged.target().to_path_buf(),
                        message: "the saved export does not reproduce the in-memory integer model"
                            .into(),
                    });
                }
                exported_dir = Some(staged.target().display().to_string());
                staged_export = Some(staged);
            }
        }
        results.push(SeedResult {
            seed,
            fp32_accuracy,
            ptq_accuracy,
            qat_accuracy,
            integer_accuracy,
            integer_agreement,
            qat_train_accuracy,
            float_from_cache,
        });
        if let Some(r) = results.last() {
            on_seed(SeedDone {
                result: r,
                done: i + 1,
                total: cfg.run.seeds.len(),
                elapsed: started.elapsed(),
            });
        }
    }
    let mut report = RunReport::new(
        cfg.model.kind.to_string(),
        opts.policy_name.clone(),
        recipe(cfg),
        results,
        first_layers,
        exported_dir,
        no_integer,
    );
    report.no_onnx_model = no_onnx;
    Ok(StagedRun {
        report,
        export: staged_export,
    })
}

/// Writes a float checkpoint through a temporary file and a rename (a concurrent run reading
/// the cache sees the old file or the new one, never half of one).
fn save_checkpoint<M: SaveToSafetensors<f32, Cpu>>(model: &M, path: &Path) -> Result<(), RunError> {
    StagedFile::with(path, |tmp| {
        model
            .save_safetensors(tmp)
            .map_err(|e| std::io::Error::other(format!("{e:?}")))
    })
    .and_then(StagedFile::commit)
    .map_err(output_error)
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

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[model]\nkind = \"mlp\"\n[quantization.weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n[quantization.input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n";

    #[test]
    fn float_cache_key_covers_every_ingredient() {
        let base = RunConfig::from_toml_str(BASE, "t").unwrap();
        let dir = Path::new("cache");
        let data = Split {
            images: vec![0.5; 3 * digits::PIXELS],
            labels: vec![1, 2, 3],
        };
        let digest = split_digest(&data);
        let key = |cfg: &RunConfig, seed: u64, digest: &str| cache_path(dir, cfg, seed, digest);
        let reference = key(&base, 3, &digest);
        // Stable: the same ingredients give the same file, named after the model and seed.
        assert_eq!(
            reference,
            key(&base.clone(), 3, &split_digest(&data.clone()))
        );
        let name = reference
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with("mlp-seed3-") && name.ends_with(".safetensors"),
            "{name}"
        );

        // Each ingredient, changed alone, gives another file.
        let mut variants: Vec<(&str, PathBuf)> = Vec::new();
        let mut shifted = data.clone();
        shifted.labels = vec![2, 3, 4];
        variants.push(("labels", key(&base, 3, &split_digest(&shifted))));
        let mut pixel = data.clone();
        pixel.images[100] = 0.25;
        variants.push(("one pixel", key(&base, 3, &split_digest(&pixel))));
        let fewer = Split {
            images: data.images[..2 * digits::PIXELS].to_vec(),
            labels: data.labels[..2].to_vec(),
        };
        variants.push(("rows", key(&base, 3, &split_digest(&fewer))));
        variants.push(("seed", key(&base, 4, &digest)));
        type Edit = (&'static str, fn(&mut RunConfig));
        let edits: Vec<Edit> = vec![
            ("model kind", |c| c.model.kind = ModelKind::Cnn),
            ("epochs", |c| c.float.epochs += 1),
            ("batch size", |c| c.float.batch_size += 1),
            ("lr", |c| c.float.lr *= 2.0),
            ("schedule", |c| {
                c.float.schedule = config::Schedule::Constant
            }),
            ("shift", |c| c.float.shift = 1),
            ("optimizer", |c| c.float.optimizer = config::Optimizer::Sgd),
            ("weight decay", |c| c.float.weight_decay = 0.01),
            ("label smoothing", |c| c.float.label_smoothing = 0.1),
            ("holdout fold", |c| {
                c.data.holdout = Some(config::Holdout { folds: 5, fold: 1 })
            }),
            ("holdout folds", |c| {
                c.data.holdout = Some(config::Holdout { folds: 4, fold: 1 })
            }),
        ];
        for (what, edit) in edits {
            let mut cfg = base.clone();
            edit(&mut cfg);
            variants.push((what, key(&cfg, 3, &digest)));
        }
        let mut seen = std::collections::BTreeMap::new();
        seen.insert(reference, "reference");
        for (what, path) in variants {
            if let Some(other) = seen.insert(path.clone(), what) {
                panic!(
                    "`{what}` and `{other}` share the cache file {}",
                    path.display()
                );
            }
        }

        // The code's version.
        let code = (CACHE_KEY_VERSION, env!("CARGO_PKG_VERSION"));
        let versioned = |code: (u32, &str)| versioned_cache_path(dir, &base, 3, &digest, code);
        assert_eq!(versioned(code), key(&base, 3, &digest));
        assert_ne!(versioned((CACHE_KEY_VERSION + 1, code.1)), versioned(code));
        assert_ne!(
            versioned((CACHE_KEY_VERSION, "0.0.0-other")),
            versioned(code)
        );

        // The QAT recipe and the policy do not change the float model: same file.
        let mut cfg = base.clone();
        cfg.qat.epochs += 7;
        cfg.calibration.batches += 1;
        assert_eq!(key(&cfg, 3, &digest), key(&base, 3, &digest));
    }
}

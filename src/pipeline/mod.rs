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
use std::time::Duration;

use dfdx::nn::SaveToSafetensors;
use dfdx::prelude::*;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use quant_core::QuantError;
use quant_ops::convert::quantize_model;
use quant_ops::export::{self, export_model, ExportError, QuantFormat};
use quant_ops::integer::IntegerModel;
use quant_ops::layers::{QuantizedModuleExt, QuantizerMode};
use quant_ops::policy::PolicyError;
use quant_ops::report::{layer_report, LayerReport};

use crate::digits::{self, DataError, Digits};
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

/// Runs the whole pipeline for every seed of `cfg`.
///
/// # Errors
/// Data, quantization, export and file errors; nothing is written half-way (checkpoints and
/// exports are renamed into place).
pub fn run(cfg: &RunConfig, opts: &RunOptions) -> Result<RunReport, RunError> {
    let data_path = cfg.data.path.clone().unwrap_or_else(digits::bundled_path);
    let mut data = digits::load(&data_path)?;
    if let Some(h) = cfg.data.holdout {
        // Recipe development: the held-out fold of the training split stands in for the test
        // split, which is dropped unread.
        let (kept, held) = train::holdout(&data.train, h.folds, h.fold);
        data = Digits {
            train: kept,
            test: held,
        };
    }
    match cfg.model.kind {
        ModelKind::Mlp => run_net::<MlpNet>(cfg, opts, &data),
        ModelKind::Cnn => run_net::<nets::CnnNet>(cfg, opts, &data),
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

fn cache_path(dir: &Path, cfg: &RunConfig, seed: u64) -> PathBuf {
    let f = &cfg.float;
    // Everything that changes the float model is in the name; options at their defaults add
    // nothing, so older checkpoints keep their names.
    let mut extra = String::new();
    if f.optimizer != config::Optimizer::Adam {
        extra.push_str(&format!("-{:?}", f.optimizer));
    }
    if f.weight_decay > 0.0 {
        extra.push_str(&format!("-wd{}", f.weight_decay));
    }
    if f.label_smoothing > 0.0 {
        extra.push_str(&format!("-ls{}", f.label_smoothing));
    }
    if let Some(h) = cfg.data.holdout {
        extra.push_str(&format!("-holdout{}of{}", h.fold, h.folds));
    }
    dir.join(format!(
        "{}-seed{seed}-e{}-b{}-lr{}-{:?}-shift{}{extra}.safetensors",
        cfg.model.kind, f.epochs, f.batch_size, f.lr, f.schedule, f.shift
    ))
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> RunError {
    RunError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn run_net<N: Net>(cfg: &RunConfig, opts: &RunOptions, data: &Digits) -> Result<RunReport, RunError> {
    let multi = MultiProgress::with_draw_target(if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let mut results = Vec::new();
    let mut first_layers: Vec<LayerReport> = Vec::new();
    let mut exported_dir = None;
    let mut no_integer: Option<String> = None;
    for (i, &seed) in cfg.run.seeds.iter().enumerate() {
        let dev = Cpu::seed_from_u64(seed);
        let eval_batch = 256;

        // 1. Float model: from the cache, or trained.
        let mut float = N::build(&dev);
        let cached = opts.cache_dir.as_ref().map(|d| cache_path(d, cfg, seed));
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
        let mut ptq = quantize_model(&deploy, &policy)?;
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
                let mut m = quantize_model(&deploy, &policy)?;
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
            if let (Some(dir), Some((graph, int_predictions))) = (&opts.export_dir, &integer) {
                export::save(graph, dir, &[&QuantFormat])?;
                // Prove the files load and reproduce the in-memory model.
                let reloaded = IntegerModel::new(&export::load(dir)?)?;
                if reloaded.predict(&data.test.images)? != *int_predictions {
                    return Err(RunError::File {
                        path: dir.clone(),
                        message: "the saved export does not reproduce the in-memory integer model"
                            .into(),
                    });
                }
                exported_dir = Some(dir.display().to_string());
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
    }
    Ok(RunReport::new(
        cfg.model.kind.to_string(),
        opts.policy_name.clone(),
        recipe(cfg),
        results,
        first_layers,
        exported_dir,
        no_integer,
    ))
}

fn save_checkpoint<M: SaveToSafetensors<f32, Cpu>>(model: &M, path: &Path) -> Result<(), RunError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| file_error(parent, e))?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    model
        .save_safetensors(&tmp)
        .map_err(|e| file_error(&tmp, format!("{e:?}")))?;
    std::fs::rename(&tmp, path).map_err(|e| file_error(path, e))
}

/// Evaluates an exported integer model on the test split of `data_path` (default: the bundled
/// file): returns the accuracy and the number of test samples.
///
/// # Errors
/// The export cannot be loaded or is inconsistent; the data file cannot be read.
pub fn eval_export(dir: &Path, data_path: Option<&Path>) -> Result<(f64, usize), RunError> {
    let data = digits::load(
        &data_path
            .map(Path::to_path_buf)
            .unwrap_or_else(digits::bundled_path),
    )?;
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

    #[test]
    fn float_cache_key_covers_the_float_recipe_and_the_holdout() {
        let text = "[model]\nkind = \"mlp\"\n[quantization.weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = 4\n[quantization.input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = 4\n";
        let base = RunConfig::from_toml_str(text, "t").unwrap();
        let dir = Path::new("cache");
        // Defaults keep the names older checkpoints were saved under.
        assert_eq!(
            cache_path(dir, &base, 3),
            dir.join("mlp-seed3-e60-b64-lr0.001-Cosine-shift0.safetensors")
        );
        let mut names = vec![cache_path(dir, &base, 3)];
        let mut cfg = base.clone();
        cfg.float.label_smoothing = 0.1;
        names.push(cache_path(dir, &cfg, 3));
        cfg.float.weight_decay = 0.01;
        names.push(cache_path(dir, &cfg, 3));
        cfg.float.optimizer = config::Optimizer::Sgd;
        names.push(cache_path(dir, &cfg, 3));
        // A model trained without a fold must never be reused where that fold is trained on.
        cfg.data.holdout = Some(config::Holdout { folds: 5, fold: 1 });
        names.push(cache_path(dir, &cfg, 3));
        cfg.data.holdout = Some(config::Holdout { folds: 5, fold: 2 });
        names.push(cache_path(dir, &cfg, 3));
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }
}

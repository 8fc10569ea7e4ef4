//! The run file: model, data, training schedules and the quantization policy, in one TOML file.
//!
//! ```toml
//! [model]
//! kind = "mlp"                  # "mlp" (64-256-256-10) or "cnn" (conv + BatchNorm, folded)
//!
//! [run]
//! seeds = [1, 2, 3]             # accuracies are reported per seed and as their mean
//!
//! [float]                       # float training (cached per model, seed and schedule)
//! epochs = 60
//! lr = 1e-3
//!
//! [calibration]                 # PTQ
//! batches = 8
//!
//! [qat]
//! epochs = 60
//! lr = 1e-3
//! init = "first_batch"          # or "ptq": start from the PTQ-calibrated parameters
//! distillation = { weight = 0.5, temperature = 4.0 }
//!
//! [quantization]                # a policy: see quant_ops::policy
//! platform = "Academic"
//! weights = { training_method = "Lsq", bits = 4 }
//! input = { training_method = "Lsq", bits = 4 }
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use quant_ops::policy::{Policy, PolicyError};

/// Which network to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// 64-256-256-10 multilayer perceptron with ReLU.
    Mlp,
    /// A small CNN on the 8×8 images: two conv + BatchNorm + ReLU + max-pool stages and a
    /// Linear head. BatchNorm is folded into the convolutions before quantization.
    Cnn,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
        })
    }
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// The network.
    pub kind: ModelKind,
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// A digits file (gzip CSV); default: the bundled one.
    pub path: Option<PathBuf>,
}

fn default_seeds() -> Vec<u64> {
    vec![0]
}

/// `[run]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Seeds to run; every figure is reported per seed and as the mean.
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            seeds: default_seeds(),
        }
    }
}

/// Learning-rate schedule over the epochs of a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Constant learning rate.
    Constant,
    /// Cosine decay from `lr` to 0 over the phase.
    #[default]
    Cosine,
}

fn default_float_epochs() -> usize {
    60
}
fn default_batch() -> usize {
    64
}
fn default_lr() -> f64 {
    1e-3
}

/// `[float]`: float training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloatSection {
    /// Epochs over the training split.
    #[serde(default = "default_float_epochs")]
    pub epochs: usize,
    /// Batch size.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Adam learning rate.
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// Learning-rate schedule.
    #[serde(default)]
    pub schedule: Schedule,
}

impl Default for FloatSection {
    fn default() -> Self {
        FloatSection {
            epochs: default_float_epochs(),
            batch_size: default_batch(),
            lr: default_lr(),
            schedule: Schedule::default(),
        }
    }
}

fn default_calibration_batches() -> usize {
    8
}

/// `[calibration]`: post-training quantization.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationSection {
    /// Training batches shown to the observers.
    #[serde(default = "default_calibration_batches")]
    pub batches: usize,
    /// Batch size.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
}

impl Default for CalibrationSection {
    fn default() -> Self {
        CalibrationSection {
            batches: default_calibration_batches(),
            batch_size: default_batch(),
        }
    }
}

/// How QAT initialises the quantizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QatInit {
    /// Calibrate on the first training batch with the policy's observers (LSQ's data-driven
    /// initialisation with the `LsqInit` observer).
    #[default]
    FirstBatch,
    /// Start from the PTQ-calibrated parameters.
    Ptq,
}

/// Knowledge distillation from the float model during QAT.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Distillation {
    /// Weight of the distillation term; `1 - weight` goes to the labels' cross-entropy.
    pub weight: f64,
    /// Softmax temperature of teacher and student.
    pub temperature: f64,
}

fn default_qat_epochs() -> usize {
    40
}

/// `[qat]`: quantization-aware training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QatSection {
    /// Epochs; 0 skips QAT (the QAT figures then equal PTQ's).
    #[serde(default = "default_qat_epochs")]
    pub epochs: usize,
    /// Batch size.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Adam learning rate (weights and quantizer parameters).
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// Learning-rate schedule.
    #[serde(default)]
    pub schedule: Schedule,
    /// Initialisation of the quantizers.
    #[serde(default)]
    pub init: QatInit,
    /// Distillation from the float model, if any.
    pub distillation: Option<Distillation>,
}

impl Default for QatSection {
    fn default() -> Self {
        QatSection {
            epochs: default_qat_epochs(),
            batch_size: default_batch(),
            lr: default_lr(),
            schedule: Schedule::default(),
            init: QatInit::default(),
            distillation: None,
        }
    }
}

/// A whole run file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The network.
    pub model: ModelSection,
    /// The data file.
    #[serde(default)]
    pub data: DataSection,
    /// Seeds.
    #[serde(default)]
    pub run: RunSection,
    /// Float training.
    #[serde(default)]
    pub float: FloatSection,
    /// PTQ.
    #[serde(default)]
    pub calibration: CalibrationSection,
    /// QAT.
    #[serde(default)]
    pub qat: QatSection,
    /// The quantization policy.
    pub quantization: Policy,
}

impl RunConfig {
    /// Parses and validates a run file's text; `origin` names it in errors.
    ///
    /// # Errors
    /// [`PolicyError::Parse`] with the key path for syntax errors, unknown keys and bad values;
    /// [`PolicyError::Invalid`] for values out of range and policies no quantizer supports.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<RunConfig, PolicyError> {
        let de = toml::Deserializer::new(text);
        let cfg: RunConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let message = match inner.span() {
                Some(span) => format!("{} (at byte {})", inner.message(), span.start),
                None => inner.message().to_string(),
            };
            PolicyError::Parse {
                origin: origin.to_string(),
                key,
                message,
            }
        })?;
        let invalid = |key: &str, expected: &str, value: String| PolicyError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            source: quant_core::QuantError::InvalidValue {
                what: key.to_string(),
                value,
                expected: expected.to_string(),
            },
        };
        if cfg.run.seeds.is_empty() {
            return Err(invalid("run.seeds", "at least one seed", "[]".into()));
        }
        for (key, v) in [
            ("float.batch_size", cfg.float.batch_size),
            ("calibration.batch_size", cfg.calibration.batch_size),
            ("qat.batch_size", cfg.qat.batch_size),
            ("calibration.batches", cfg.calibration.batches),
        ] {
            if v == 0 || v > 4096 {
                return Err(invalid(key, "an integer in 1..=4096", v.to_string()));
            }
        }
        for (key, v) in [("float.lr", cfg.float.lr), ("qat.lr", cfg.qat.lr)] {
            if !(v.is_finite() && v > 0.0 && v < 10.0) {
                return Err(invalid(key, "a learning rate in (0, 10)", v.to_string()));
            }
        }
        if let Some(d) = cfg.qat.distillation {
            if !(0.0..=1.0).contains(&d.weight) {
                return Err(invalid(
                    "qat.distillation.weight",
                    "a weight in [0, 1]",
                    d.weight.to_string(),
                ));
            }
            if !(d.temperature.is_finite() && d.temperature > 0.0) {
                return Err(invalid(
                    "qat.distillation.temperature",
                    "a temperature > 0",
                    d.temperature.to_string(),
                ));
            }
        }
        cfg.quantization.validate(origin, "quantization")?;
        Ok(cfg)
    }

    /// Reads and validates a run file.
    ///
    /// # Errors
    /// See [`RunConfig::from_toml_str`]; also [`PolicyError::Read`].
    pub fn from_file(path: &Path) -> Result<RunConfig, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        RunConfig::from_toml_str(&text, &path.display().to_string())
    }
}

//! The run file: model, data, training schedules and the quantization policy, in one TOML file.
//!
//! ```toml
//! [model]                       # quant run's network (run_model, with a model of your own,
//! kind = "mlp"                  # does not read it): "mlp", "cnn" (conv + BatchNorm, folded),
//!                               # "resnet" (residual blocks, projection shortcuts) or "vit"
//!                               # (vision transformer), each sized for the data: 8x8 images
//!                               # (the digits) or 28x28 (MNIST)
//!
//! [data]                        # default: the bundled digits; see quant::data::DataSection
//! # format = "idx"              # digits, csv, idx, npy, npz
//! # images = "data/mnist-10k-images-idx3-ubyte.gz"
//! # labels = "data/mnist-10k-labels-idx1-ubyte.gz"
//! # test = { from_row = 8000 }
//! # holdout = { folds = 5, fold = 0 }  # recipe development: train without fold 0 of 5 of the
//! #                             # training split and report on it instead of the test split
//!
//! [run]
//! seeds = [1, 2, 3]             # accuracies are reported per seed and as their mean
//!
//! [float]                       # float training (cached per model, seed and schedule)
//! epochs = 60
//! lr = 1e-3
//! warmup_epochs = 0             # linear warm-up of the learning rate, step by step, from
//!                               # lr/steps to lr over these epochs, then the schedule over the
//!                               # rest (cosine: from lr to 0); 0..=epochs, default 0
//! label_smoothing = 0.1         # targets (1 - 0.1)·onehot + 0.1/10; default 0
//! weight_decay = 0.0            # decoupled (AdamW-style) decay of layer weights; default 0
//!
//! [calibration]                 # PTQ
//! batches = 8
//!
//! [qat]
//! epochs = 60
//! lr = 1e-3
//! warmup_epochs = 0             # as in [float]
//! init = "first_batch"          # or "ptq": start from the PTQ-calibrated parameters
//! distillation = { weight = 0.5, temperature = 4.0 }
//! label_smoothing = 0.1         # as in [float]
//! weight_decay = 0.0            # as in [float]; never applied to quantizer parameters
//!
//! [quantization]                # a policy: see quant_dfdx::policy
//! platform = "Academic"
//! weights = { training_method = "Lsq", bits = 4 }
//! input = { training_method = "Lsq", bits = 4 }
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use quant_dfdx::policy::{ConfigError, Policy};

/// Most epochs of one training phase (`float.epochs`, `qat.epochs`); the recipes use 30 to 60.
pub const MAX_EPOCHS: usize = 10_000;
/// Most seeds of one run file (`run.seeds`).
pub const MAX_SEEDS: usize = 1_000;
/// Most epochs one run may train in all, over every seed: `seeds × (float.epochs +
/// qat.epochs)`. About a day and a half of the digits MLP on two cores; the committed configs
/// train 270.
pub const MAX_TOTAL_EPOCHS: usize = 100_000;
/// Longest `data.path`, in bytes (the longest path Linux opens).
pub const MAX_PATH_BYTES: usize = 4096;

/// Which network to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// 64-256-256-10 multilayer perceptron with ReLU.
    Mlp,
    /// A small CNN on the 8×8 images: two conv + BatchNorm + ReLU + max-pool stages and a
    /// Linear head. BatchNorm is folded into the convolutions before quantization.
    Cnn,
    /// A small residual CNN on the 8×8 images: a stem convolution, a residual block with a
    /// depthwise convolution, a block with a strided 1x1 projection shortcut, global average
    /// pooling and a Linear head. BatchNorm is folded into the convolutions before quantization.
    Resnet,
    /// A small vision transformer on the 8×8 images: 2×2 patches (a strided convolution) as
    /// 16 tokens of 48 features with a learned position embedding, three pre-norm encoder blocks
    /// (4-head self-attention; a GeLU MLP 48-96-48), LayerNorm, the mean of the tokens and a
    /// Linear head.
    Vit,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Resnet => "resnet",
            ModelKind::Vit => "vit",
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

pub use crate::data::{DataSection, Holdout};

fn default_seeds() -> Vec<u64> {
    vec![0]
}

/// `[run]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Seeds to run (1 to [`MAX_SEEDS`]); every figure is reported per seed and as the mean.
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

/// The optimiser of a training phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Adam (β = 0.9, 0.999).
    #[default]
    Adam,
    /// SGD with classic momentum 0.9.
    Sgd,
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

/// Leaves a warm-up of 0 epochs out of the serialized config, so that the float cache key of a
/// recipe without warm-up is what it was before the key existed.
fn is_zero(v: &usize) -> bool {
    *v == 0
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
    /// Epochs over the training split, at most [`MAX_EPOCHS`].
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
    /// Linear warm-up: over the first `warmup_epochs` epochs the learning rate rises step by
    /// step from `lr / steps` to `lr`, then [`schedule`](Self::schedule) runs over the
    /// remaining epochs; 0 (the default) = none, at most `epochs`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warmup_epochs: usize,
    /// Augmentation: random translation by up to this many pixels (0 = none).
    #[serde(default)]
    pub shift: usize,
    /// The optimiser.
    #[serde(default)]
    pub optimizer: Optimizer,
    /// Decoupled weight decay (AdamW-style `w -= lr·wd·w` after each step) on the layers'
    /// weights, not on biases or quantizer parameters; 0 = none.
    #[serde(default)]
    pub weight_decay: f64,
    /// Label smoothing `ε`: the targets are `(1 − ε)·onehot + ε/10`; 0 = none.
    #[serde(default)]
    pub label_smoothing: f64,
}

impl Default for FloatSection {
    fn default() -> Self {
        FloatSection {
            epochs: default_float_epochs(),
            batch_size: default_batch(),
            lr: default_lr(),
            schedule: Schedule::default(),
            warmup_epochs: 0,
            shift: 0,
            optimizer: Optimizer::Adam,
            weight_decay: 0.0,
            label_smoothing: 0.0,
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
    /// Epochs, at most [`MAX_EPOCHS`]; 0 skips QAT (the QAT figures then equal PTQ's).
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
    /// Linear warm-up of the learning rate, as in [`FloatSection::warmup_epochs`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warmup_epochs: usize,
    /// Initialisation of the quantizers.
    #[serde(default)]
    pub init: QatInit,
    /// Distillation from the float model, if any.
    pub distillation: Option<Distillation>,
    /// Augmentation: random translation by up to this many pixels (0 = none).
    #[serde(default)]
    pub shift: usize,
    /// The optimiser.
    #[serde(default)]
    pub optimizer: Optimizer,
    /// Decoupled weight decay on the layers' weights (not biases, not quantizer parameters).
    #[serde(default)]
    pub weight_decay: f64,
    /// Label smoothing `ε` of the labels' cross-entropy.
    #[serde(default)]
    pub label_smoothing: f64,
}

impl Default for QatSection {
    fn default() -> Self {
        QatSection {
            epochs: default_qat_epochs(),
            batch_size: default_batch(),
            lr: default_lr(),
            schedule: Schedule::default(),
            warmup_epochs: 0,
            init: QatInit::default(),
            distillation: None,
            shift: 0,
            optimizer: Optimizer::Adam,
            weight_decay: 0.0,
            label_smoothing: 0.0,
        }
    }
}

/// A whole run file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The bundled network `quant run` trains (a model of your own runs through
    /// [`run_model`](super::run_model), which does not read this section).
    #[serde(default)]
    pub model: Option<ModelSection>,
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
    /// Where the run file came from (its path, or the name given to
    /// [`RunConfig::from_toml_str`]), for errors.
    #[serde(skip)]
    pub origin: String,
}

impl RunConfig {
    /// Parses and validates a run file's text; `origin` names it in errors.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] with the key path for syntax errors, unknown keys and bad values;
    /// [`ConfigError::Invalid`] for values out of range and policies no quantizer supports.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<RunConfig, ConfigError> {
        let mut cfg: RunConfig = quant_dfdx::policy::deserialize_toml(text, origin)?;
        cfg.origin = origin.to_string();
        cfg.quantization.set_location(origin, "quantization");
        let invalid = |key: &str, expected: &str, value: String| ConfigError::Invalid {
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
        if cfg.run.seeds.len() > MAX_SEEDS {
            return Err(invalid(
                "run.seeds",
                &format!("at most {MAX_SEEDS} seeds"),
                format!("a list of {} seeds", cfg.run.seeds.len()),
            ));
        }
        for (key, v) in [
            ("float.epochs", cfg.float.epochs),
            ("qat.epochs", cfg.qat.epochs),
        ] {
            if v > MAX_EPOCHS {
                return Err(invalid(
                    key,
                    &format!("at most {MAX_EPOCHS} epochs"),
                    v.to_string(),
                ));
            }
        }
        for (key, warmup, epochs) in [
            (
                "float.warmup_epochs",
                cfg.float.warmup_epochs,
                cfg.float.epochs,
            ),
            ("qat.warmup_epochs", cfg.qat.warmup_epochs, cfg.qat.epochs),
        ] {
            if warmup > epochs {
                return Err(invalid(
                    key,
                    &format!("a warm-up of 0..={epochs} epochs (at most the phase's epochs)"),
                    warmup.to_string(),
                ));
            }
        }
        let total = cfg.run.seeds.len() * (cfg.float.epochs + cfg.qat.epochs);
        if total > MAX_TOTAL_EPOCHS {
            return Err(invalid(
                "run.seeds",
                &format!(
                    "at most {MAX_TOTAL_EPOCHS} epochs in all: {} seeds × ({} float + {} QAT epochs) = {total}",
                    cfg.run.seeds.len(),
                    cfg.float.epochs,
                    cfg.qat.epochs
                ),
                format!("a list of {} seeds", cfg.run.seeds.len()),
            ));
        }
        for p in cfg.data.files() {
            let len = p.as_os_str().len();
            if len == 0 || len > MAX_PATH_BYTES {
                return Err(invalid(
                    "data.path",
                    &format!("a file path of 1..={MAX_PATH_BYTES} bytes"),
                    quant_runtime::fs::shorten(&p.display().to_string()).into_owned(),
                ));
            }
        }
        if let Err(e) = cfg.data.validate() {
            let (key, message) = match e {
                crate::data::DataError::Config { key, message } => (format!("data.{key}"), message),
                other => ("data".to_string(), other.to_string()),
            };
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                key: key.clone(),
                source: quant_core::QuantError::InvalidValue {
                    what: key,
                    value: "this setting".into(),
                    expected: message,
                },
            });
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
        for (key, v) in [
            ("float.shift", cfg.float.shift),
            ("qat.shift", cfg.qat.shift),
        ] {
            if v > 8 {
                return Err(invalid(
                    key,
                    "a shift of 0..=8 pixels (the digits are 8x8, MNIST 28x28)",
                    v.to_string(),
                ));
            }
        }
        for (key, v) in [
            ("float.weight_decay", cfg.float.weight_decay),
            ("qat.weight_decay", cfg.qat.weight_decay),
        ] {
            if !(v.is_finite() && (0.0..1.0).contains(&v)) {
                return Err(invalid(key, "a weight decay in [0, 1)", v.to_string()));
            }
        }
        for (key, v) in [
            ("float.label_smoothing", cfg.float.label_smoothing),
            ("qat.label_smoothing", cfg.qat.label_smoothing),
        ] {
            if !(v.is_finite() && (0.0..1.0).contains(&v)) {
                return Err(invalid(key, "a label smoothing in [0, 1)", v.to_string()));
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
            // Outside this range the softened targets are one-hot or uniform to f32 and the
            // T²-scaled loss overflows or vanishes: training would end in NaN.
            if !(d.temperature.is_finite() && (0.1..=100.0).contains(&d.temperature)) {
                return Err(invalid(
                    "qat.distillation.temperature",
                    "a temperature in 0.1..=100 (Hinton et al. use 1 to 20)",
                    d.temperature.to_string(),
                ));
            }
        }
        cfg.quantization.validate(origin, "quantization")?;
        Ok(cfg)
    }

    /// The bundled network `[model]` names, which `quant run` needs.
    ///
    /// # Errors
    /// The run file has no `[model]` (the message names the file and says what to add).
    pub fn bundled_model(&self) -> Result<ModelKind, ConfigError> {
        self.model.as_ref().map(|m| m.kind).ok_or_else(|| ConfigError::Invalid {
            origin: self.origin.clone(),
            key: "model".into(),
            source: quant_core::QuantError::InvalidValue {
                what: "model".into(),
                value: "missing".into(),
                expected: "[model] kind = \"mlp\", \"cnn\", \"resnet\" or \"vit\" for quant run (a model of your own runs through quant::pipeline::run_model, which does not read [model])".into(),
            },
        })
    }

    /// Reads and validates a run file: a regular file of at most
    /// [`MAX_CONFIG_FILE_BYTES`](quant_dfdx::policy::MAX_CONFIG_FILE_BYTES), UTF-8 (see
    /// [`read_config_file`](quant_dfdx::policy::read_config_file)).
    ///
    /// # Errors
    /// See [`RunConfig::from_toml_str`]; also [`ConfigError::Read`].
    pub fn from_file(path: &Path) -> Result<RunConfig, ConfigError> {
        let text = quant_dfdx::policy::read_config_file(path)?;
        RunConfig::from_toml_str(&text, &path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[model]
kind = "mlp"

[quantization.weights]
training_method = "Lsq"
method = "Symmetric"
bits = 4

[quantization.input]
training_method = "Lsq"
method = "Uniform"
bits = 4
"#;

    fn with(extra: &str) -> Result<RunConfig, ConfigError> {
        // Tables in `extra` go before the policy, so that they are not read as part of it.
        RunConfig::from_toml_str(&format!("{extra}\n{BASE}"), "test.toml")
    }

    #[test]
    fn recipe_options_default_to_off() {
        let cfg = with("").unwrap();
        assert_eq!(cfg.float.label_smoothing, 0.0);
        assert_eq!(cfg.float.weight_decay, 0.0);
        assert_eq!(cfg.qat.label_smoothing, 0.0);
        assert_eq!(cfg.qat.weight_decay, 0.0);
        assert_eq!(cfg.float.warmup_epochs, 0);
        assert_eq!(cfg.qat.warmup_epochs, 0);
        assert_eq!(cfg.data.holdout, None);
    }

    #[test]
    fn recipe_options_parse() {
        let cfg = with(
            "[data]\nholdout = { folds = 5, fold = 4 }\n\
             [float]\nlabel_smoothing = 0.1\nweight_decay = 0.01\nwarmup_epochs = 2\n\
             [qat]\nlabel_smoothing = 0.2\nweight_decay = 0.001\nepochs = 5\nwarmup_epochs = 5\n",
        )
        .unwrap();
        assert_eq!(cfg.float.warmup_epochs, 2);
        assert_eq!(cfg.qat.warmup_epochs, 5);
        assert_eq!(cfg.data.holdout, Some(Holdout { folds: 5, fold: 4 }));
        assert_eq!(cfg.float.label_smoothing, 0.1);
        assert_eq!(cfg.float.weight_decay, 0.01);
        assert_eq!(cfg.qat.label_smoothing, 0.2);
        assert_eq!(cfg.qat.weight_decay, 0.001);
    }

    #[test]
    fn bad_recipe_options_name_their_key() {
        for (extra, key) in [
            ("[float]\nlabel_smoothing = 1.0", "float.label_smoothing"),
            ("[qat]\nlabel_smoothing = -0.1", "qat.label_smoothing"),
            ("[float]\nweight_decay = -1.0", "float.weight_decay"),
            ("[qat]\nweight_decay = nan", "qat.weight_decay"),
            (
                "[float]\nepochs = 10\nwarmup_epochs = 11",
                "float.warmup_epochs",
            ),
            ("[qat]\nepochs = 0\nwarmup_epochs = 1", "qat.warmup_epochs"),
            (
                "[data]\nholdout = { folds = 1, fold = 0 }",
                "data.holdout.folds",
            ),
            (
                "[data]\nholdout = { folds = 5, fold = 5 }",
                "data.holdout.fold",
            ),
        ] {
            let e = with(extra).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { key: k, .. } if k == key),
                "{extra}: {e}"
            );
            assert!(e.to_string().contains(key), "{e}");
        }
        // Unknown and mistyped keys are parse errors naming the key path.
        let e = with("[data]\nholdout = { folds = 5, fold = 0, seed = 1 }").unwrap_err();
        assert!(e.to_string().contains("data.holdout"), "{e}");
        let e = with("[qat]\nlabel_smoothing = \"a lot\"").unwrap_err();
        assert!(e.to_string().contains("qat.label_smoothing"), "{e}");
        let e = with("[float]\nwarmup_epochs = -1").unwrap_err();
        assert!(e.to_string().contains("float.warmup_epochs"), "{e}");
    }

    #[test]
    fn vit_is_a_model_kind_and_unknown_kinds_list_it() {
        let cfg = RunConfig::from_toml_str(&BASE.replace("\"mlp\"", "\"vit\""), "t").unwrap();
        let kind = cfg.model.unwrap().kind;
        assert_eq!(kind, ModelKind::Vit);
        assert_eq!(kind.to_string(), "vit");
        let e = RunConfig::from_toml_str(&BASE.replace("\"mlp\"", "\"vgg\""), "t").unwrap_err();
        let message = e.to_string();
        for kind in ["mlp", "cnn", "resnet", "vit"] {
            assert!(message.contains(kind), "{message}");
        }
    }
}

//! Typed configs from which trainable quantizers are built (MCT's
//! `TrainableQuantizerWeightsConfig` / `TrainableQuantizerActivationConfig`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{QuantError, Result};
use crate::grid::IntegerGrid;
use crate::vocab::{QuantizationMethod, QuantizationTarget, RoundingPolicy, TrainingMethod};

fn default_true() -> bool {
    true
}

/// How to quantize a layer's weights.
///
/// ```
/// use quant_core::{WeightsQuantizerConfig, QuantizationMethod, TrainingMethod};
/// let cfg = WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 4);
/// assert!(cfg.per_channel);
/// assert_eq!(cfg.grid().unwrap().quant_min(), -8);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsQuantizerConfig {
    /// Which trainable quantizer (with `method`, selects the registry entry).
    pub training_method: TrainingMethod,
    /// Grid layout. Symmetric and PowerOfTwo use a signed grid; Uniform an unsigned grid with
    /// a zero point.
    pub method: QuantizationMethod,
    /// Bit width, 2..=16.
    pub bits: u32,
    /// One scale per output channel (default) or one for the whole tensor.
    #[serde(default = "default_true")]
    pub per_channel: bool,
    /// Drop the most negative level (`[-127, 127]` for 8 bits), as TensorRT does for weights.
    #[serde(default)]
    pub narrow_range: bool,
    /// How values are rounded to the grid.
    #[serde(default)]
    pub rounding: RoundingPolicy,
    /// Method-specific options (e.g. DSQ's `alpha`); each quantizer documents and checks its own.
    #[serde(default)]
    pub options: BTreeMap<String, f64>,
}

impl WeightsQuantizerConfig {
    /// A per-channel, full-range, half-even config with no options.
    pub fn new(training_method: TrainingMethod, method: QuantizationMethod, bits: u32) -> Self {
        WeightsQuantizerConfig {
            training_method,
            method,
            bits,
            per_channel: true,
            narrow_range: false,
            rounding: RoundingPolicy::HalfEven,
            options: BTreeMap::new(),
        }
    }

    /// The integer grid (signed unless the method is Uniform).
    pub fn grid(&self) -> Result<IntegerGrid> {
        IntegerGrid::new(self.bits, self.method.is_symmetric(), self.narrow_range)
    }
}

/// How to quantize an activation (a layer's input or any tensor in the forward pass). Always
/// per tensor.
///
/// ```
/// use quant_core::{ActivationQuantizerConfig, QuantizationMethod, TrainingMethod};
/// let cfg = ActivationQuantizerConfig::new(TrainingMethod::Ste, QuantizationMethod::Uniform, 8);
/// assert_eq!(cfg.grid(false).unwrap().quant_max(), 255);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivationQuantizerConfig {
    /// Which trainable quantizer (with `method`, selects the registry entry).
    pub training_method: TrainingMethod,
    /// Grid layout.
    pub method: QuantizationMethod,
    /// Bit width, 2..=16.
    pub bits: u32,
    /// Signedness of a Symmetric/PowerOfTwo grid; `None` (the default) decides from the data
    /// when the quantizer is initialised (signed iff a negative value was seen), as MCT does.
    /// Uniform always uses an unsigned grid with a zero point.
    #[serde(default)]
    pub signed: Option<bool>,
    /// Drop the most negative (signed) or highest (unsigned) level.
    #[serde(default)]
    pub narrow_range: bool,
    /// How values are rounded to the grid.
    #[serde(default)]
    pub rounding: RoundingPolicy,
    /// Method-specific options (e.g. PACT's `alpha`); each quantizer documents and checks its own.
    #[serde(default)]
    pub options: BTreeMap<String, f64>,
}

impl ActivationQuantizerConfig {
    /// A full-range, half-even config whose signedness is decided from the data.
    pub fn new(training_method: TrainingMethod, method: QuantizationMethod, bits: u32) -> Self {
        ActivationQuantizerConfig {
            training_method,
            method,
            bits,
            signed: None,
            narrow_range: false,
            rounding: RoundingPolicy::HalfEven,
            options: BTreeMap::new(),
        }
    }

    /// The integer grid, given whether the data seen so far had negative values (ignored when
    /// `signed` is set or the method is Uniform).
    pub fn grid(&self, data_has_negatives: bool) -> Result<IntegerGrid> {
        let signed = match self.method {
            QuantizationMethod::Uniform => false,
            _ => self.signed.unwrap_or(data_has_negatives),
        };
        IntegerGrid::new(self.bits, signed, self.narrow_range)
    }
}

/// A weights or an activation config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "target", deny_unknown_fields)]
pub enum QuantizerConfig {
    /// For a weights quantizer.
    Weights(WeightsQuantizerConfig),
    /// For an activation quantizer.
    Activation(ActivationQuantizerConfig),
}

impl QuantizerConfig {
    /// What the config quantizes.
    pub fn target(&self) -> QuantizationTarget {
        match self {
            QuantizerConfig::Weights(_) => QuantizationTarget::Weights,
            QuantizerConfig::Activation(_) => QuantizationTarget::Activation,
        }
    }
    /// The grid layout.
    pub fn method(&self) -> QuantizationMethod {
        match self {
            QuantizerConfig::Weights(c) => c.method,
            QuantizerConfig::Activation(c) => c.method,
        }
    }
    /// The training method.
    pub fn training_method(&self) -> TrainingMethod {
        match self {
            QuantizerConfig::Weights(c) => c.training_method,
            QuantizerConfig::Activation(c) => c.training_method,
        }
    }
    /// The bit width.
    pub fn bits(&self) -> u32 {
        match self {
            QuantizerConfig::Weights(c) => c.bits,
            QuantizerConfig::Activation(c) => c.bits,
        }
    }
    /// The rounding policy.
    pub fn rounding(&self) -> RoundingPolicy {
        match self {
            QuantizerConfig::Weights(c) => c.rounding,
            QuantizerConfig::Activation(c) => c.rounding,
        }
    }
    /// Method-specific options.
    pub fn options(&self) -> &BTreeMap<String, f64> {
        match self {
            QuantizerConfig::Weights(c) => &c.options,
            QuantizerConfig::Activation(c) => &c.options,
        }
    }
    /// Whether parameters are per channel (activations never are).
    pub fn per_channel(&self) -> bool {
        match self {
            QuantizerConfig::Weights(c) => c.per_channel,
            QuantizerConfig::Activation(_) => false,
        }
    }
    /// The grid, resolving data-dependent signedness with `data_has_negatives`.
    pub fn grid(&self, data_has_negatives: bool) -> Result<IntegerGrid> {
        match self {
            QuantizerConfig::Weights(c) => c.grid(),
            QuantizerConfig::Activation(c) => c.grid(data_has_negatives),
        }
    }

    /// Reads option `key` (default `default`), checking it with `valid`, which says what is
    /// valid when it returns `Err`.
    pub fn option(
        &self,
        key: &str,
        default: f64,
        valid: impl FnOnce(f64) -> std::result::Result<(), String>,
    ) -> Result<f64> {
        let v = self.options().get(key).copied().unwrap_or(default);
        valid(v).map_err(|expected| QuantError::InvalidValue {
            what: format!("options.{key}"),
            value: v.to_string(),
            expected,
        })?;
        Ok(v)
    }

    /// Checks that every option key is in `known`; the error names the quantizer and lists
    /// the valid keys.
    pub fn check_option_keys(&self, quantizer: &str, known: &[&str]) -> Result<()> {
        for key in self.options().keys() {
            if !known.contains(&key.as_str()) {
                return Err(QuantError::UnknownOption {
                    quantizer: quantizer.to_string(),
                    key: key.clone(),
                    valid: if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    },
                });
            }
        }
        Ok(())
    }
}

impl From<WeightsQuantizerConfig> for QuantizerConfig {
    fn from(c: WeightsQuantizerConfig) -> Self {
        QuantizerConfig::Weights(c)
    }
}

impl From<ActivationQuantizerConfig> for QuantizerConfig {
    fn from(c: ActivationQuantizerConfig) -> Self {
        QuantizerConfig::Activation(c)
    }
}

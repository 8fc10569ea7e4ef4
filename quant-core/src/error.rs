//! The error type of quant-core.

use crate::vocab::{QuantizationMethod, QuantizationTarget, TrainingMethod};

/// Everything that can go wrong in quant-core: bad quantization parameters, mismatched shapes,
/// registry lookups, quantizer configuration and device failures.
///
/// Each message says what was wrong, where, and what is valid. Errors raised inside a named
/// layer or quantizer are wrapped in [`QuantError::At`] so the message starts with the name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// A bit width outside the supported `2..=16`.
    #[error("bits = {bits} is out of range: quantizers support 2..=16 bits")]
    InvalidBits {
        /// The bit width that was given.
        bits: u32,
    },

    /// A scale that is zero, negative, NaN or infinite.
    #[error("{what} = {value} is not a valid scale: a scale must be finite and at least 1.2e-38 (f32::MIN_POSITIVE)")]
    InvalidScale {
        /// Which scale (e.g. `scale`, `scales[3]`).
        what: String,
        /// The offending value.
        value: f32,
    },

    /// A zero point outside the integer range.
    #[error("{what} = {value} lies outside the integer range [{quant_min}, {quant_max}]")]
    InvalidZeroPoint {
        /// Which zero point (e.g. `zero_point`, `zero_points[1]`).
        what: String,
        /// The offending value.
        value: f64,
        /// Lower end of the integer range.
        quant_min: i32,
        /// Upper end of the integer range.
        quant_max: i32,
    },

    /// `quant_min > quant_max`, or a range the kernels cannot represent.
    #[error("invalid integer range [{quant_min}, {quant_max}]: {reason}")]
    InvalidRange {
        /// Lower end that was given.
        quant_min: i32,
        /// Upper end that was given.
        quant_max: i32,
        /// Why the range is rejected.
        reason: &'static str,
    },

    /// Two buffers or a buffer and a shape that must agree in length do not.
    #[error("length mismatch for {what}: expected {expected}, got {actual}")]
    LengthMismatch {
        /// What was measured (e.g. `dy`, `scales`).
        what: String,
        /// The length required.
        expected: usize,
        /// The length given.
        actual: usize,
    },

    /// A channel axis that does not exist in the tensor.
    #[error("axis {axis} is out of range for a tensor of rank {rank} (valid: 0..{rank})")]
    InvalidAxis {
        /// The axis that was given.
        axis: usize,
        /// The rank of the tensor.
        rank: usize,
    },

    /// A non-finite value where only finite values are allowed (e.g. a threshold, a range end).
    #[error("{what} = {value} is not finite")]
    NonFinite {
        /// What held the value.
        what: String,
        /// The offending value.
        value: f64,
    },

    /// An option value outside its valid range.
    #[error("{what} = {value} is invalid: {expected}")]
    InvalidValue {
        /// The option or quantity (e.g. `options.alpha`).
        what: String,
        /// The value given, as text.
        value: String,
        /// What is valid.
        expected: String,
    },

    /// No registered quantizer matches the requested combination.
    #[error(
        "no quantizer registered for target {target}, method {method}, training method {training_method}; \
         registered for {target}: {registered}"
    )]
    NotFound {
        /// Requested target.
        target: QuantizationTarget,
        /// Requested method.
        method: QuantizationMethod,
        /// Requested training method.
        training_method: TrainingMethod,
        /// What is registered for that target, one `id {methods}` entry each (or `none`).
        registered: String,
    },

    /// More than one registered quantizer matches.
    #[error(
        "{count} quantizers are registered for target {target}, method {method}, training method \
         {training_method}: {candidates}; remove one or give them different training-method ids"
    )]
    Ambiguous {
        /// Requested target.
        target: QuantizationTarget,
        /// Requested method.
        method: QuantizationMethod,
        /// Requested training method.
        training_method: TrainingMethod,
        /// How many matched.
        count: usize,
        /// The candidates, with their module paths.
        candidates: String,
    },

    /// A training-method name no built-in or registered quantizer uses.
    #[error("unknown training method `{name}`; known: {known}")]
    UnknownTrainingMethod {
        /// The name that was given.
        name: String,
        /// The known names.
        known: String,
    },

    /// A quantizer was given a config it cannot honour (wrong target, method not declared, ...).
    #[error("quantizer `{quantizer}` cannot be built from this config: {reason}")]
    ConfigMismatch {
        /// The quantizer's name.
        quantizer: String,
        /// What did not match, and what would.
        reason: String,
    },

    /// A method-specific option the quantizer does not know.
    #[error("quantizer `{quantizer}` has no option `{key}`; valid options: {valid}")]
    UnknownOption {
        /// The quantizer's name.
        quantizer: String,
        /// The unknown key.
        key: String,
        /// The options it accepts.
        valid: String,
    },

    /// A quantizer used before its parameters were initialised.
    #[error("quantizer is not initialised: {hint}")]
    NotInitialized {
        /// What to do about it.
        hint: String,
    },

    /// More learnable parameters than a runtime-chosen quantizer's parameter bank holds.
    #[error("quantizer `{quantizer}` declares {count} parameters; a runtime quantizer slot holds at most {max}")]
    TooManyParameters {
        /// The quantizer's name.
        quantizer: String,
        /// How many it declared.
        count: usize,
        /// The limit.
        max: usize,
    },

    /// The dfdx CPU device failed (allocation).
    #[error("device error: {0}")]
    Device(String),

    /// An error raised inside a named layer or quantizer.
    #[error("{location}: {source}")]
    At {
        /// The layer or quantizer name (e.g. `encoder.fc1.weights`).
        location: String,
        /// The underlying error.
        #[source]
        source: Box<QuantError>,
    },
}

impl QuantError {
    /// Wraps this error with the name of the layer or quantizer where it happened.
    pub fn at(self, location: impl Into<String>) -> Self {
        QuantError::At {
            location: location.into(),
            source: Box::new(self),
        }
    }

    /// The innermost error, without the locations added by [`QuantError::at`].
    pub fn root(&self) -> &QuantError {
        match self {
            QuantError::At { source, .. } => source.root(),
            other => other,
        }
    }
}

/// `Ok` when `actual == expected`, else a [`QuantError::LengthMismatch`] naming `what` (a
/// buffer, a batch size, a sequence length).
pub fn check_len(what: &str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(QuantError::LengthMismatch {
            what: what.into(),
            expected,
            actual,
        });
    }
    Ok(())
}

#[cfg(feature = "dfdx")]
impl From<dfdx::tensor::CpuError> for QuantError {
    fn from(e: dfdx::tensor::CpuError) -> Self {
        QuantError::Device(e.to_string())
    }
}

/// Shorthand for `Result<T, QuantError>`.
pub type Result<T, E = QuantError> = std::result::Result<T, E>;

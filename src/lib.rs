//! # quant
//!
//! Quantization-aware training (QAT), calibration (PTQ) and integer inference for
//! [dfdx](https://docs.rs/dfdx) 0.13 models.
//!
//! This facade re-exports the three crates of the workspace: `quant-core` (vocabulary,
//! numerics, dfdx ops, quantizer traits, registry) at the root and as [`core`], `quant-ops`
//! (built-in quantizers, observers, layers, conversion, calibration, export) at the root, and the
//! macros of `quant-macros`.
//!
//! ```
//! use quant::prelude::*;
//!
//! // Pick a built-in trainable quantizer by enum, as a config file would by name.
//! let config = WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 4);
//! let entry = quant::registry::find(QuantizationTarget::Weights, QuantizationMethod::Symmetric, TrainingMethod::Lsq)?;
//! assert_eq!(entry.metadata.name, "LsqWeightsQuantizer");
//! let quantizer = entry.build(&config.into())?;
//! assert_eq!(quantizer.parameters()[0].name, "scale");
//! # Ok::<(), quant::QuantError>(())
//! ```

#![warn(missing_docs)]
// Errors carry the file, key path or layer and a message that says what is valid: they are
// returned once per failed load or run, never on a hot path, so their size does not matter.
#![allow(clippy::result_large_err)]

pub use quant_core as core;
pub use quant_core::*;
pub use quant_macros::*;
pub use quant_ops;
pub use quant_ops::*;

pub mod digits;
#[cfg(feature = "onnx-runtime")]
pub mod onnx_runtime;
pub mod pipeline;

/// dfdx, as this crate uses it.
pub use dfdx;

/// The names most programs need.
pub mod prelude {
    pub use quant_core::{
        ActivationQuantizer, ActivationQuantizerConfig, ChannelLayout, InferableQuantizer,
        IntegerGrid, MarkedQuantizer, ParamBank, ParamBankMut, ParamDecl, QParams, QuantError,
        QuantizationMethod, QuantizationTarget, QuantizerConfig, QuantizerInput, QuantizerMetadata,
        RoundingPolicy, TrainableQuantizer, TrainingMethod, WeightsQuantizer,
        WeightsQuantizerConfig,
    };
    pub use quant_macros::{mark_quantizer, QuantizedLayer, QuantizedModel};
}

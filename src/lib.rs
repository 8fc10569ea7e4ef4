//! # quant
//!
//! Quantization-aware training (QAT), calibration (PTQ) and integer inference for
//! [dfdx](https://docs.rs/dfdx) 0.13 models.
//!
//! This facade re-exports every item of the workspace's crates at its root, each under one path:
//! `quant-core` (vocabulary, numerics, integer kernels, quantizer traits, registry),
//! `quant-dfdx` (built-in quantizers, observers, quantized dfdx layers, conversion, calibration,
//! learned rounding, lowering to the graph), `quant-runtime` (the graph IR, the integer runtime,
//! export files, ONNX; no dfdx, for deployment alone) and the macros of `quant-macros`.
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
//!
//! ## A quantizer of your own
//!
//! `#[mark_quantizer]` records a quantizer's metadata and registers it, so that code and run
//! files find it by (target, method, training method) like a built-in:
//!
//! ```
//! use quant::prelude::*;
//! use quant::{kernels, registry};
//!
//! quant::training_methods!(pub trait MyMethods { HalfStep });
//!
//! /// Symmetric weights with a fixed scale of 1/2 (a real quantizer learns or observes it).
//! #[mark_quantizer(target = Weights, method = [Symmetric], id = HalfStep)]
//! #[derive(Debug)]
//! pub struct HalfStepQuantizer(QuantizerConfig);
//!
//! impl WeightsQuantizer for HalfStepQuantizer {
//!     fn from_config(config: &WeightsQuantizerConfig) -> quant::Result<Self> {
//!         Ok(HalfStepQuantizer(config.clone().into()))
//!     }
//! }
//!
//! impl TrainableQuantizer for HalfStepQuantizer {
//!     fn config(&self) -> &QuantizerConfig {
//!         &self.0
//!     }
//!     fn parameters(&self) -> Vec<ParamDecl> {
//!         Vec::new()
//!     }
//!     fn set_qparams(&self, _: &QParams, _: IntegerGrid, _: &mut ParamBankMut<'_>) -> quant::Result<()> {
//!         Ok(())
//!     }
//!     fn qparams(&self, _: &ParamBank<'_>, _: IntegerGrid, _: Option<usize>) -> quant::Result<QParams> {
//!         QParams::per_tensor(0.5, 0)
//!     }
//!     fn forward(&self, x: QuantizerInput<'_>, _: &ParamBank<'_>, y: &mut [f32]) -> quant::Result<()> {
//!         let (g, r) = (x.grid, self.0.rounding());
//!         kernels::fake_quantize_per_tensor_affine_into(x.data, y, 0.5, 0, g.quant_min(), g.quant_max(), r)
//!     }
//!     fn backward(&self, _: QuantizerInput<'_>, _: &ParamBank<'_>, dy: &[f32], dx: &mut [f32], _: &mut ParamBankMut<'_>) {
//!         for (g, d) in dx.iter_mut().zip(dy) {
//!             *g += d;
//!         }
//!     }
//! }
//!
//! // The attribute recorded the metadata and registered the quantizer: code and config files
//! // find it by (target, method, training method).
//! assert_eq!(HalfStepQuantizer::METADATA.training_method, TrainingMethod::HalfStep);
//! let config = WeightsQuantizerConfig::new(TrainingMethod::HalfStep, QuantizationMethod::Symmetric, 4);
//! let entry = registry::find(QuantizationTarget::Weights, QuantizationMethod::Symmetric, TrainingMethod::HalfStep)?;
//! assert_eq!(entry.metadata.name, "HalfStepQuantizer");
//! assert_eq!(entry.build(&config.into())?.config().bits(), 4);
//! # Ok::<(), quant::QuantError>(())
//! ```

#![forbid(unsafe_code)]

// Every item of the workspace's crates at this crate's root, under one path each (`quant::graph`,
// `quant::layers`, `quant::int8`…): their module names are distinct.
pub use quant_core::*;
pub use quant_dfdx::*;
pub use quant_macros::*;
pub use quant_runtime::*;

pub mod data;
pub mod digits;
pub mod pipeline;
#[cfg(feature = "tract")]
pub mod tract;

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

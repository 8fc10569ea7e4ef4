//! # quant-ops
//!
//! The catalogue of `quant`: built-in trainable quantizers, observers, float convolution and
//! pooling for stable Rust, quantized layers, model conversion, calibration, platforms, export
//! and integer inference.

#![warn(missing_docs)]

extern crate self as quant_ops;

pub mod checkpoint;
pub mod convert;
pub mod export;
pub mod integer;
pub mod layers;
pub mod nn;
pub mod observers;
pub mod platform;
pub mod policy;
pub mod quantizers;
pub mod report;

/// Not public API: what the macros' expansions refer to.
#[doc(hidden)]
pub mod __ops_private {
    pub use linkme;
}

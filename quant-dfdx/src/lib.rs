//! # quant-dfdx
//!
//! The catalogue of `quant`: built-in trainable quantizers, observers, float convolution and
//! pooling for stable Rust, quantized layers, model conversion, calibration, platforms,
//! learned rounding, and lowering to the graph IR that `quant-runtime` exports and runs on
//! integers.
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_dfdx::{convert::convert_model, lower::export_model};
//! use quant_runtime::integer::IntegerModel;
//! use quant_dfdx::{layers::QuantizedModuleExt, policy::Policy};
//!
//! // A float model, and a policy file: 8-bit LSQ weights and inputs in every layer.
//! let dev = Cpu::seed_from_u64(0);
//! let float = dev.build_module::<(Linear<4, 8>, ReLU, Linear<8, 3>), f32>();
//! let policy = Policy::from_toml_str(
//!     r#"
//!     [weights]
//!     training_method = "Lsq"
//!     method = "Symmetric"
//!     bits = 8
//!     [input]
//!     training_method = "Lsq"
//!     method = "Uniform"
//!     bits = 8
//!     "#,
//!     "policy.toml",
//! )?;
//!
//! // Convert (every quantizer starts calibrating), observe a batch, freeze (PTQ).
//! let mut model = convert_model(&float, &policy)?;
//! let x = dev.sample_normal::<Rank2<16, 4>>();
//! model.try_forward_mut(x.clone())?;
//! assert_eq!(model.finish_calibration()?, 4);
//!
//! // Export and run on integers: the logits match the fake-quantized model's.
//! let fake_quantized = model.try_forward(x.clone())?.as_vec();
//! let integer = IntegerModel::new(&export_model(&model, &[4], Default::default())?)?;
//! let logits = integer.forward(&x.as_vec())?;
//! let range = fake_quantized.iter().fold(0f32, |m, v| m.max(v.abs()));
//! for (a, b) in logits.iter().zip(&fake_quantized) {
//!     assert!((a - b).abs() <= quant_runtime::integer::LOGIT_TOLERANCE * range);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// No unsafe code: only linkme's registration statics (link sections), allowed where declared.
#![deny(unsafe_code)]

extern crate self as quant_dfdx;

#[macro_use]
mod macros;

pub mod calibration;
pub mod checkpoint;
pub mod convert;
pub mod fold;
pub mod layers;
pub mod lower;
pub mod nn;
pub mod observers;
#[doc(hidden)]
pub mod optimizer_kernels;
pub mod platform;
pub mod policy;
pub mod ptq;
pub mod quantizers;
pub mod report;

/// Not public API: what the macros' expansions refer to.
#[doc(hidden)]
pub mod __dfdx_private {
    pub use linkme;
}

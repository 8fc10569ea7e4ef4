//! Built-in trainable quantizers, each registered with `#[mark_quantizer]`.
//!
//! | id | target | methods | learns | scale convention |
//! |---|---|---|---|---|
//! | `Ste` | Weights, Activation | Symmetric, PowerOfTwo, Uniform | nothing (straight-through) | MCT: `s = T / 2^(b-1)` signed (with `narrow_range`, NVIDIA's `T / (2^(b-1)-1)`), `T / 2^b` unsigned; PowerOfTwo rounds `T` up to `2^ceil(log2 T)`; Uniform: MCT's nudged `[min, max]`, `s = (max-min)/(2^b-1)` |
//! | `Lsq` | Weights, Activation | Symmetric, Uniform | the scale (and zero point for Uniform) | PyTorch: the scale itself is the parameter, initialised from calibration |
//! | `Pact` | Activation | Uniform | the clip value α | Uniform over `[0, α]`: `s = α / (2^b-1)`, zero point 0 |
//! | `Dsq` | Weights, Activation | Uniform | α (sharpness), the range `[l, u]` | Uniform over the nudged `[l, u]` |
//!
//! Every one fake-quantizes with the exact kernels of `quant_core::kernels` (PyTorch's
//! formula, any rounding policy) and converts to an [`InferableQuantizer`] that reproduces its
//! forward pass bit for bit.
//!
//! [`InferableQuantizer`]: quant_core::InferableQuantizer

mod affine;
mod dsq;
mod lsq;
mod pact;
mod ste;

pub use dsq::{DsqActivationQuantizer, DsqWeightsQuantizer};
pub use lsq::{LsqActivationQuantizer, LsqWeightsQuantizer};
pub use pact::PactActivationQuantizer;
pub use ste::{SteActivationQuantizer, SteWeightsQuantizer};

use quant_core::{IntegerGrid, ParamBankMut, QuantizerConfig, QuantizerInput, Result};

/// The range `[min, max]` covered by affine parameters on `grid`: `(q - z) * s` at both ends.
pub(crate) fn affine_range(scale: f32, zero_point: i32, grid: IntegerGrid) -> (f32, f32) {
    (
        (grid.quant_min() - zero_point) as f32 * scale,
        (grid.quant_max() - zero_point) as f32 * scale,
    )
}

/// The axis of a layout with more than one channel.
pub(crate) fn axis_of(x: &QuantizerInput<'_>) -> Option<usize> {
    if x.layout.channels > 1 {
        x.layout.axis
    } else {
        None
    }
}

/// Reads an option that is off when absent or 0: `Some(v)` for a finite `v > 0`, `None` for 0.
/// `expected` says what a valid value is (the error's last part).
pub(crate) fn optional_positive_option(
    config: &QuantizerConfig,
    key: &str,
    expected: &str,
) -> Result<Option<f32>> {
    let v = config.option(key, 0.0, |v| {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(expected.into())
        }
    })?;
    Ok((v > 0.0).then_some(v as f32))
}

/// Adds each parameter gradient `(slot, values)` into its slot of `dparams`.
pub(crate) fn add_param_grads(dparams: &mut ParamBankMut<'_>, grads: &[(usize, &[f32])]) {
    for (slot, values) in grads {
        for (d, v) in dparams.slot_mut(*slot).iter_mut().zip(values.iter()) {
            *d += v;
        }
    }
}

/// Declares a target-specific quantizer around a shared engine: the struct (a newtype of the
/// engine, with the given docs and `#[mark_quantizer]` attribute) and a `TrainableQuantizer`
/// impl that delegates to the engine, so the weights and activation quantizers of one
/// training method share one implementation. Each file writes its `from_config` itself, so
/// the compiler's list of implementors (shown to a user whose own quantizer lacks one) points
/// at plain code.
macro_rules! engine_quantizer {
    ($(#[$attr:meta])* pub struct $name:ident($engine:ident);) => {
        $(#[$attr])*
        #[derive(Debug, Clone)]
        pub struct $name($engine);

        impl quant_core::TrainableQuantizer for $name {
            fn config(&self) -> &quant_core::QuantizerConfig {
                self.0.config()
            }
            fn parameters(&self) -> Vec<quant_core::ParamDecl> {
                self.0.parameters()
            }
            fn set_qparams(
                &self,
                qparams: &quant_core::QParams,
                grid: quant_core::IntegerGrid,
                params: &mut quant_core::ParamBankMut<'_>,
            ) -> quant_core::Result<()> {
                self.0.set_qparams(qparams, grid, params)
            }
            fn qparams(
                &self,
                params: &quant_core::ParamBank<'_>,
                grid: quant_core::IntegerGrid,
                axis: Option<usize>,
            ) -> quant_core::Result<quant_core::QParams> {
                self.0.qparams(params, grid, axis)
            }
            fn forward(
                &self,
                x: quant_core::QuantizerInput<'_>,
                params: &quant_core::ParamBank<'_>,
                y: &mut [f32],
            ) -> quant_core::Result<()> {
                self.0.forward(x, params, y)
            }
            fn backward(
                &self,
                x: quant_core::QuantizerInput<'_>,
                params: &quant_core::ParamBank<'_>,
                dy: &[f32],
                dx: &mut [f32],
                dparams: &mut quant_core::ParamBankMut<'_>,
            ) {
                self.0.backward(x, params, dy, dx, dparams)
            }
        }
    };
}
pub(crate) use engine_quantizer;

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

mod dsq;
mod lsq;
mod pact;
mod ste;

pub use dsq::{DsqActivationQuantizer, DsqWeightsQuantizer};
pub use lsq::{LsqActivationQuantizer, LsqWeightsQuantizer};
pub use pact::PactActivationQuantizer;
pub use ste::{SteActivationQuantizer, SteWeightsQuantizer};

use quant_core::{kernels, IntegerGrid, QParams, QuantizerConfig, QuantizerInput, Result};

/// Fake-quantizes `x` into `y` with fixed `qparams` (one per channel of `x.layout`, or one).
pub(crate) fn forward_affine(
    x: QuantizerInput<'_>,
    q: &QParams,
    config: &QuantizerConfig,
    y: &mut [f32],
) -> Result<()> {
    kernels::fake_quantize_affine_into(
        x.data,
        y,
        x.layout,
        q.scales(),
        q.zero_points(),
        x.grid.quant_min(),
        x.grid.quant_max(),
        config.rounding(),
    )
}

/// Adds the straight-through gradient of [`forward_affine`] into `dx`.
pub(crate) fn backward_ste(
    x: QuantizerInput<'_>,
    q: &QParams,
    config: &QuantizerConfig,
    dy: &[f32],
    dx: &mut [f32],
) {
    // Cannot fail: the forward pass validated the same arguments.
    let _ = kernels::fake_quantize_affine_backward_into(
        x.data,
        dy,
        dx,
        x.layout,
        q.scales(),
        q.zero_points(),
        x.grid.quant_min(),
        x.grid.quant_max(),
        config.rounding(),
    );
}

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

/// Implements `TrainableQuantizer` for a target-specific wrapper by delegating to its inner
/// engine (`self.0`), so weights and activation quantizers share one implementation.
macro_rules! delegate_trainable {
    ($name:ident) => {
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
pub(crate) use delegate_trainable;

#[cfg(test)]
mod tests;

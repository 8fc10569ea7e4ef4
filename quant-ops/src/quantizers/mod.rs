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

use quant_core::{
    kernels, power_of_two_scale, IntegerGrid, ParamBank, ParamBankMut, ParamDecl, QParams,
    QuantizationMethod, QuantizerConfig, QuantizerInput, Result,
};

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

/// The parameter slots of an affine engine: slot 0 the scale, slot 1 the zero point (read
/// with [`read_zero_points`], written with [`write_affine`]).
pub(crate) fn affine_parameters(
    scale_trainable: bool,
    zero_point_trainable: bool,
) -> Vec<ParamDecl> {
    vec![
        ParamDecl {
            name: "scale",
            trainable: scale_trainable,
        },
        ParamDecl {
            name: "zero_point",
            trainable: zero_point_trainable,
        },
    ]
}

/// The zero points kept in slot 1 (as floats), rounded onto `grid`.
pub(crate) fn read_zero_points(
    params: &ParamBank<'_>,
    grid: IntegerGrid,
    axis: Option<usize>,
) -> Result<Vec<i32>> {
    kernels::round_zero_points(params.values(1, axis), grid.quant_min(), grid.quant_max())
}

/// Stores `qparams` as (scale, zero point) slots, adjusted to `method`: Symmetric zeroes the
/// zero point, PowerOfTwo also rounds the threshold up to a power of two.
pub(crate) fn write_affine(
    qparams: &QParams,
    method: QuantizationMethod,
    grid: IntegerGrid,
    params: &mut ParamBankMut<'_>,
) -> Result<()> {
    qparams.check_zero_points(grid)?;
    let scales: Vec<f32> = match method {
        QuantizationMethod::PowerOfTwo => qparams
            .scales()
            .iter()
            .map(|s| power_of_two_scale(s * grid.power_of_two_divisor(), grid))
            .collect::<Result<Vec<f32>>>()?,
        _ => qparams.scales().to_vec(),
    };
    let zero_points: Vec<f32> = match method {
        QuantizationMethod::Uniform => qparams.zero_points().iter().map(|z| *z as f32).collect(),
        _ => vec![0.0; qparams.channels()],
    };
    params.set(0, &scales)?;
    params.set(1, &zero_points)
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

#[cfg(test)]
mod tests;

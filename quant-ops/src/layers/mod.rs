//! Quantized layers: dfdx modules whose weights and inputs pass through quantizers.
//!
//! - [`TensorQuantizer`]: a quantizer chosen at run time (registry, policy file), holding its
//!   parameters as dfdx tensors; `TensorQuantizer<1>` quantizes an activation anywhere.
//! - [`QLinear`]: a Linear layer with a weights quantizer (per channel or per tensor) and an
//!   input quantizer. The quantizers are type parameters: [`TensorQuantizer`] by default, or a
//!   quantizer fixed at compile time that owns its own typed parameters ([`FakeQuantizer`]).
//! - [`QuantInput`]: quantizes the input of any module (pooling, flatten, ...).
//! - [`Float`]: a float module inside a quantized model.
//!
//! Every quantizer is reachable by its dotted name (`0.weight_quantizer`, `fc1.input_quantizer`)
//! through [`QuantizedModule::visit_quantizers`], to change modes (like pytorch-quantization's
//! `disable()` / `enable_calib()`), calibrate, report and export.

mod conv;
#[doc(hidden)]
pub mod derive;
mod float;
mod input;
mod linear;
mod param;
mod quantizer;

pub use conv::QConv2d;
pub use float::Float;
pub use input::QuantInput;
pub use linear::QLinear;
pub use param::{quantize_param, quantize_param_mut, LayerInput};
pub use quantizer::{
    QuantizerControl, QuantizerDescription, QuantizerMode, QuantizerSpec, TensorQuantizer,
};

use dfdx::prelude::*;
use quant_core::{QuantError, Result};

/// A quantizer usable as a layer's weights or input quantizer. [`TensorQuantizer`] implements
/// it for quantizers chosen at run time; implement it for a quantizer fixed at compile time
/// that owns its parameters as typed tensors (any number, any shape).
pub trait FakeQuantizer: QuantizerControl + Clone + std::fmt::Debug {
    /// Fake-quantizes `x` according to the mode (per-channel quantizers use axis 0).
    fn quantize<S: Shape, T: Tape<f32, Cpu>>(
        &self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>>;
    /// Like `quantize`, but may record statistics (Calibrating mode).
    fn quantize_mut<S: Shape, T: Tape<f32, Cpu>>(
        &mut self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>>;
    /// Sets the quantizer up as a policy says, naming it `name`. A quantizer fixed at compile
    /// time checks that `spec` describes it, and rejects it otherwise.
    fn configure(&mut self, name: &str, spec: &QuantizerSpec) -> Result<()>;
    /// Leaves the slot float for good.
    fn clear(&mut self);
}

impl<const C: usize> FakeQuantizer for TensorQuantizer<C> {
    fn quantize<S: Shape, T: Tape<f32, Cpu>>(
        &self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        TensorQuantizer::quantize(self, x)
    }
    fn quantize_mut<S: Shape, T: Tape<f32, Cpu>>(
        &mut self,
        x: Tensor<S, f32, Cpu, T>,
    ) -> Result<Tensor<S, f32, Cpu, T>> {
        TensorQuantizer::quantize_mut(self, x)
    }
    fn configure(&mut self, name: &str, spec: &QuantizerSpec) -> Result<()> {
        TensorQuantizer::configure(self, name, spec.clone())
    }
    fn clear(&mut self) {
        TensorQuantizer::clear(self)
    }
}

/// Int32 bias codes at scale `s_input · s_weight[o]` (zero point 0, round half to even), as
/// integer deployment holds the bias. A bias int32 cannot hold at that scale is an error, not
/// a silently clamped value.
///
/// # Errors
/// [`QuantError::LengthMismatch`] unless there is one weight scale, or one per bias element;
/// [`QuantError::InvalidValue`] naming the output channel, the bias and the scales when a bias
/// does not fit int32 (typically a tiny input scale, calibrated on constant inputs).
pub fn quantize_bias(bias: &[f32], input_scale: f32, weight_scales: &[f32]) -> Result<Vec<i32>> {
    check_bias_scales(bias.len(), weight_scales)?;
    bias.iter()
        .enumerate()
        .map(|(o, b)| {
            let s = bias_scale(input_scale, weight_scales, o);
            let q = (*b as f64 / s).round_ties_even();
            if q >= i32::MIN as f64 && q <= i32::MAX as f64 {
                return Ok(q as i32);
            }
            Err(QuantError::InvalidValue {
                what: format!("bias of output channel {o}"),
                value: b.to_string(),
                expected: format!(
                    "a bias that int32 holds at the bias scale s_input * s_weight = {input_scale:e} * {:e} = {s:e}; it needs {q:e} steps, beyond the int32 range, and would be clamped. An input scale this small comes from calibration inputs that are (nearly) constant, such as all-zero pixels",
                    weight_scales[if weight_scales.len() == 1 { 0 } else { o }]
                ),
            })
        })
        .collect()
}

/// [`quantize_bias`] saturating at the int32 range, for training: a step size that is tiny for
/// a while must not stop QAT (export reports the overflow if it remains).
fn quantize_bias_saturating(
    bias: &[f32],
    input_scale: f32,
    weight_scales: &[f32],
) -> Result<Vec<i32>> {
    check_bias_scales(bias.len(), weight_scales)?;
    Ok(bias
        .iter()
        .enumerate()
        .map(|(o, b)| {
            let s = bias_scale(input_scale, weight_scales, o);
            (*b as f64 / s)
                .round_ties_even()
                .clamp(i32::MIN as f64, i32::MAX as f64) as i32
        })
        .collect())
}

fn check_bias_scales(outputs: usize, weight_scales: &[f32]) -> Result<()> {
    if weight_scales.len() == 1 || weight_scales.len() == outputs {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            what: "weight scales (one, or one per output channel of the bias)".into(),
            expected: outputs,
            actual: weight_scales.len(),
        })
    }
}

/// Only after [`check_bias_scales`].
fn bias_scale(input_scale: f32, weight_scales: &[f32], o: usize) -> f64 {
    input_scale as f64 * weight_scales[if weight_scales.len() == 1 { 0 } else { o }] as f64
}

/// The bias a quantized layer adds: while both its input and its weights quantize, the bias
/// as integer deployment holds it (int32 at scale `s_input · s_weight`), with a straight-through
/// gradient; otherwise the float bias. Keeping the two equal is what makes the integer model
/// reproduce the fake-quantized one.
///
/// # Errors
/// A quantizer's parameters cannot be read.
pub fn layer_bias<S: ConstShape, T: Tape<f32, Cpu>>(
    bias: &Tensor<S, f32, Cpu>,
    input: &dyn QuantizerControl,
    weights: &dyn QuantizerControl,
) -> Result<Tensor<S, f32, Cpu, T>> {
    let both = input.mode().quantizes() && weights.mode().quantizes();
    let (Some(qi), Some(qw)) = (
        both.then(|| input.qparams()).transpose()?.flatten(),
        both.then(|| weights.qparams()).transpose()?.flatten(),
    ) else {
        return Ok(bias.retaped::<T>());
    };
    let s_in = qi.scales()[0];
    let codes =
        quantize_bias_saturating(&quant_core::ops::read_contiguous(bias), s_in, qw.scales())?;
    let values: Vec<f32> = codes
        .iter()
        .enumerate()
        .map(|(o, q)| (*q as f64 * bias_scale(s_in, qw.scales(), o)) as f32)
        .collect();
    quant_core::ops::custom_op(
        bias.retaped::<T>(),
        Vec::new(),
        Box::new(move |_, _, y| {
            y.copy_from_slice(&values);
            Ok(())
        }),
        Box::new(|_, _, dy, dx, _| {
            for (g, d) in dx.iter_mut().zip(dy) {
                *g += d;
            }
        }),
    )
}

/// A model (or layer) whose quantizers can be visited by name.
pub trait QuantizedModule {
    /// Calls `f` with each quantizer's full dotted name (under `prefix`) and its control.
    fn visit_quantizers(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut dyn QuantizerControl) -> Result<()>,
    ) -> Result<()>;
}

/// `prefix.name`, or `name` at the root.
pub fn join_name(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

macro_rules! tuple_quantized_module {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: QuantizedModule),+> QuantizedModule for ($($name,)+) {
            fn visit_quantizers(
                &mut self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &mut dyn QuantizerControl) -> Result<()>,
            ) -> Result<()> {
                $(self.$idx.visit_quantizers(&join_name(prefix, stringify!($idx)), f)?;)+
                Ok(())
            }
        }
    };
}
tuple_quantized_module!(A 0);
tuple_quantized_module!(A 0, B 1);
tuple_quantized_module!(A 0, B 1, C 2);
tuple_quantized_module!(A 0, B 1, C 2, D 3);
tuple_quantized_module!(A 0, B 1, C 2, D 3, E 4);
tuple_quantized_module!(A 0, B 1, C 2, D 3, E 4, F 5);

/// Model-wide operations on quantizers selected by name pattern.
pub trait QuantizedModuleExt: QuantizedModule {
    /// Sets the mode of every quantizer whose dotted name matches `pattern` (a glob: `*` any
    /// run of characters, `?` one; `"*"` selects all, `"fc1.*"` one layer's). Returns how many
    /// matched.
    ///
    /// # Errors
    /// An invalid pattern; a quantizer that cannot enter `mode` (the error names it).
    fn set_mode(&mut self, pattern: &str, mode: QuantizerMode) -> Result<usize> {
        let matcher = glob(pattern)?;
        let mut n = 0;
        self.visit_quantizers("", &mut |name, q| {
            if matcher.is_match(name) && q.describe().is_some() {
                q.set_mode(mode)?;
                n += 1;
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// Finishes calibration of every configured quantizer that is calibrating.
    fn finish_calibration(&mut self) -> Result<usize> {
        let mut n = 0;
        self.visit_quantizers("", &mut |_, q| {
            if q.mode() == QuantizerMode::Calibrating {
                q.finish_calibration()?;
                n += 1;
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// Names and descriptions of every configured quantizer, in model order.
    fn quantizers(&mut self) -> Result<Vec<(String, QuantizerDescription)>> {
        let mut out = Vec::new();
        self.visit_quantizers("", &mut |name, q| {
            if let Some(d) = q.describe() {
                out.push((name.to_string(), d));
            }
            Ok(())
        })?;
        Ok(out)
    }
}

impl<M: QuantizedModule + ?Sized> QuantizedModuleExt for M {}

/// Longest glob pattern [`glob`] accepts, in bytes. Dotted layer names are far shorter, and
/// globset panics compiling some patterns of hundreds of kilobytes (`*?` repeated, huge
/// `{a,b,...}` alternations), so longer patterns never reach it.
pub const MAX_PATTERN_BYTES: usize = 512;

/// A glob over dotted quantizer names, at most [`MAX_PATTERN_BYTES`] long.
///
/// # Errors
/// [`QuantError::InvalidValue`] (the pattern cut to a readable length) when the pattern is too
/// long or not a valid glob.
pub fn glob(pattern: &str) -> Result<globset::GlobMatcher> {
    let invalid = |why: String| QuantError::InvalidValue {
        what: "name pattern".into(),
        value: crate::fs::shorten(pattern).into_owned(),
        expected: format!(
            "a glob over dotted layer names such as `fc1.*` or `*input_quantizer` ({why})"
        ),
    };
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(invalid(format!(
            "at most {MAX_PATTERN_BYTES} bytes; this one has {}",
            pattern.len()
        )));
    }
    globset::Glob::new(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| invalid(e.to_string()))
}

//! Biases in integer deployment: int32 codes at the accumulator's scale `s_input · s_weight[o]`
//! (zero point 0), as a quantized layer adds them and as the integer runtime and ONNX hold
//! them.

use crate::{QuantError, Result};

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

/// Checks that there is one weight scale, or one per output channel of a bias of `outputs`.
///
/// # Errors
/// [`QuantError::LengthMismatch`] otherwise.
pub fn check_bias_scales(outputs: usize, weight_scales: &[f32]) -> Result<()> {
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

/// The accumulator scale of output channel `o`, `s_input · s_weight[o]` in `f64` (one weight
/// scale for all, or one per channel). Only after [`check_bias_scales`].
pub fn bias_scale(input_scale: f32, weight_scales: &[f32], o: usize) -> f64 {
    input_scale as f64 * weight_scales[if weight_scales.len() == 1 { 0 } else { o }] as f64
}

/// The float values of int32 bias codes at scale `s_input · s_weight[o]`: what a quantized
/// layer adds in its fake-quantized forward pass. One weight scale, or one per code.
pub fn accumulator_to_float(codes: &[i32], input_scale: f32, weight_scales: &[f32]) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(o, q)| {
            let s = input_scale as f64
                * weight_scales
                    .get(if weight_scales.len() == 1 { 0 } else { o })
                    .copied()
                    .unwrap_or(0.0) as f64;
            (*q as f64 * s) as f32
        })
        .collect()
}

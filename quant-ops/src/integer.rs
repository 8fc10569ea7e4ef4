//! Integer-only inference of an exported model.
//!
//! The float input is quantized once by the first layer's input quantizer. From there on every
//! layer works on integers: centered codes `q - z` (at most 8 bits, held in `i16`), products
//! accumulated in `i32` with the int32 bias, then requantized into the next layer's input grid
//! with a fixed-point multiplier: `q = round(acc · m / 2^shift) + z`, clamped to the grid, where
//! `m / 2^shift` is `s_input · s_weight[o] / s_next` to 31 bits and the rounding is the next
//! quantizer's policy (ties to even by default), carried out exactly in integer arithmetic. A
//! ReLU after a layer is fused as `max(q, z)`. The last layer's accumulators become logits by
//! one `f32` multiplication each, `acc as f32 · (s_input · s_weight[o])`.

use rayon::prelude::*;

use quant_core::{QuantError, RoundingPolicy};

use crate::export::{ExportError, ExportedLinear, ExportedModel, ExportedOp};

/// How a layer's accumulators leave it.
#[derive(Debug, Clone)]
enum Output {
    /// Into the next layer's input grid.
    Requantize {
        /// Per output channel: multiplier and right shift.
        multipliers: Vec<(i64, u32)>,
        zero_point: i32,
        quant_min: i32,
        quant_max: i32,
        rounding: RoundingPolicy,
    },
    /// Out of the model as float logits.
    Dequantize {
        /// Per output channel: `s_input · s_weight[o]`.
        scales: Vec<f32>,
    },
}

#[derive(Debug, Clone)]
struct IntLinear {
    in_features: usize,
    out_features: usize,
    /// Centered weight codes `q - z_w`, `[out, in]`.
    weight: Vec<i16>,
    bias: Vec<i32>,
    relu: bool,
    output: Output,
}

/// An exported model, ready to run on integers.
#[derive(Debug, Clone)]
pub struct IntegerModel {
    /// Quantizes the float input.
    input: quant_core::InferableQuantizer,
    layers: Vec<IntLinear>,
}

/// `m · 2^-shift ≈ multiplier`, with `m` in `[2^30, 2^31)`.
///
/// # Errors
/// A multiplier that is not finite and positive, or too large for the representation.
pub fn fixed_point_multiplier(multiplier: f64) -> Result<(i64, u32), QuantError> {
    if !(multiplier.is_finite() && multiplier > 0.0) {
        return Err(QuantError::NonFinite {
            what: "requantization multiplier".into(),
            value: multiplier,
        });
    }
    // multiplier = f · 2^e with f in [0.5, 1).
    let mut e = multiplier.log2().floor() as i32 + 1;
    let mut f = multiplier / 2f64.powi(e);
    if f >= 1.0 {
        f /= 2.0;
        e += 1;
    }
    if f < 0.5 {
        f *= 2.0;
        e -= 1;
    }
    let mut m = (f * 2f64.powi(31)).round() as i64;
    if m == 1 << 31 {
        m = 1 << 30;
        e += 1;
    }
    let shift = 31 - e;
    if shift < 0 {
        return Err(QuantError::InvalidValue {
            what: "requantization multiplier".into(),
            value: multiplier.to_string(),
            expected: "a value below 2^31 (scales of consecutive layers this far apart cannot be requantized)".into(),
        });
    }
    if shift > 62 {
        // So small that every product rounds to zero; keep the shift representable.
        return Ok((m >> (shift - 62).min(63), 62));
    }
    Ok((m, shift as u32))
}

/// `round(n / 2^shift)` with `policy`, in exact integer arithmetic.
#[inline]
pub fn rounding_shift(n: i64, shift: u32, policy: RoundingPolicy) -> i64 {
    if shift == 0 {
        return n;
    }
    let q = n >> shift;
    let rem = n - (q << shift);
    let half = 1i64 << (shift - 1);
    let up = match policy {
        RoundingPolicy::HalfEven => rem > half || (rem == half && q & 1 == 1),
        RoundingPolicy::HalfUp => rem >= half,
        RoundingPolicy::HalfDown => rem > half,
        RoundingPolicy::HalfAwayFromZero => {
            if n >= 0 {
                rem >= half
            } else {
                rem > half
            }
        }
        RoundingPolicy::HalfTowardZero => {
            if n >= 0 {
                rem > half
            } else {
                rem >= half
            }
        }
        RoundingPolicy::Floor => false,
        RoundingPolicy::Ceil => rem > 0,
    };
    q + up as i64
}

fn layer_of(
    l: &ExportedLinear,
    relu: bool,
    next: Option<&ExportedLinear>,
) -> Result<IntLinear, ExportError> {
    let wq = &l.weights.inferable;
    let s_in = l.input.inferable.qparams().scales()[0] as f64;
    let w_scales = wq.qparams().scales();
    let w_zeros = wq.qparams().zero_points();
    let per_channel = w_scales.len() > 1;
    let weight: Vec<i16> = l
        .weight
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let o = i / l.in_features;
            (q - w_zeros[if per_channel { o } else { 0 }]) as i16
        })
        .collect();
    let scale_of = |o: usize| s_in * w_scales[if per_channel { o } else { 0 }] as f64;
    let output = match next {
        Some(n) => {
            let nq = &n.input.inferable;
            let s_next = nq.qparams().scales()[0] as f64;
            let multipliers = (0..l.out_features)
                .map(|o| fixed_point_multiplier(scale_of(o) / s_next))
                .collect::<Result<Vec<_>, QuantError>>()?;
            Output::Requantize {
                multipliers,
                zero_point: nq.qparams().zero_points()[0],
                quant_min: nq.grid().quant_min(),
                quant_max: nq.grid().quant_max(),
                rounding: nq.rounding(),
            }
        }
        None => Output::Dequantize {
            scales: (0..l.out_features).map(|o| scale_of(o) as f32).collect(),
        },
    };
    Ok(IntLinear {
        in_features: l.in_features,
        out_features: l.out_features,
        weight,
        bias: l.bias.clone(),
        relu,
        output,
    })
}

impl IntegerModel {
    /// Prepares an exported model for integer inference.
    ///
    /// # Errors
    /// An empty model, a ReLU without a layer before it, or consecutive layers whose features
    /// do not match.
    pub fn new(model: &ExportedModel) -> Result<IntegerModel, ExportError> {
        let unsupported = |layer: &str, reason: &str| ExportError::Unsupported {
            layer: layer.to_string(),
            reason: reason.to_string(),
        };
        // Pair each layer with whether a ReLU follows it.
        let mut linears: Vec<(&ExportedLinear, bool)> = Vec::new();
        for op in &model.ops {
            match op {
                ExportedOp::Linear(l) => linears.push((l, false)),
                ExportedOp::Relu => match linears.last_mut() {
                    Some(last) => last.1 = true,
                    None => return Err(unsupported("(input)", "a ReLU comes before any layer")),
                },
            }
        }
        let first = linears
            .first()
            .ok_or_else(|| unsupported("(model)", "the export has no layers"))?
            .0;
        for pair in linears.windows(2) {
            let (a, b) = (pair[0].0, pair[1].0);
            if a.out_features != b.in_features {
                return Err(unsupported(
                    &b.name,
                    &format!(
                        "takes {} features but layer `{}` gives {}",
                        b.in_features, a.name, a.out_features
                    ),
                ));
            }
        }
        let mut layers = Vec::with_capacity(linears.len());
        for (i, (l, relu)) in linears.iter().enumerate() {
            layers.push(layer_of(l, *relu, linears.get(i + 1).map(|n| n.0))?);
        }
        Ok(IntegerModel {
            input: first.input.inferable.clone(),
            layers,
        })
    }

    /// Input features per sample.
    pub fn input_features(&self) -> usize {
        self.layers[0].in_features
    }

    /// Output features (logits) per sample.
    pub fn output_features(&self) -> usize {
        self.layers.last().map_or(0, |l| l.out_features)
    }

    /// Runs a batch of `n` samples (`x` holds `n × input_features` floats) and returns
    /// `n × output_features` logits.
    ///
    /// # Errors
    /// `x` is not a whole number of samples, or holds NaN.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>, QuantError> {
        let in_f = self.input_features();
        if x.len() % in_f != 0 {
            return Err(QuantError::LengthMismatch {
                what: format!("input (a multiple of {in_f} features)"),
                expected: x.len().div_ceil(in_f) * in_f,
                actual: x.len(),
            });
        }
        let n = x.len() / in_f;
        let codes: Vec<i32> = self.input.quantize(x, &[n, in_f])?;
        let z = self.input.qparams().zero_points()[0];
        let mut act: Vec<i16> = codes.iter().map(|q| (q - z) as i16).collect();
        let mut logits = Vec::new();
        for layer in &self.layers {
            let mut next = vec![0i16; n * layer.out_features];
            let mut out = match layer.output {
                Output::Dequantize { .. } => vec![0f32; n * layer.out_features],
                Output::Requantize { .. } => Vec::new(),
            };
            let run = |b: usize, next_row: &mut [i16], out_row: &mut [f32]| {
                let xb = &act[b * layer.in_features..(b + 1) * layer.in_features];
                for o in 0..layer.out_features {
                    let w = &layer.weight[o * layer.in_features..(o + 1) * layer.in_features];
                    let acc = dot(w, xb) + layer.bias[o];
                    match &layer.output {
                        Output::Requantize {
                            multipliers,
                            zero_point,
                            quant_min,
                            quant_max,
                            rounding,
                        } => {
                            let (m, shift) = multipliers[o];
                            let q = rounding_shift(acc as i64 * m, shift, *rounding)
                                + *zero_point as i64;
                            let lo = if layer.relu {
                                (*quant_min).max(*zero_point)
                            } else {
                                *quant_min
                            };
                            next_row[o] =
                                (q.clamp(lo as i64, *quant_max as i64) - *zero_point as i64) as i16;
                        }
                        Output::Dequantize { scales } => {
                            let v = acc as f32 * scales[o];
                            out_row[o] = if layer.relu { v.max(0.0) } else { v };
                        }
                    }
                }
            };
            let out_f = layer.out_features;
            if matches!(layer.output, Output::Dequantize { .. }) {
                out.par_chunks_mut(out_f)
                    .enumerate()
                    .for_each(|(b, row)| run(b, &mut [], row));
                logits = out;
            } else {
                next.par_chunks_mut(out_f)
                    .enumerate()
                    .for_each(|(b, row)| run(b, row, &mut []));
            }
            act = next;
        }
        Ok(logits)
    }

    /// The predicted class of each sample (argmax of the logits; the first on ties).
    ///
    /// # Errors
    /// See [`IntegerModel::forward`].
    pub fn predict(&self, x: &[f32]) -> Result<Vec<usize>, QuantError> {
        let logits = self.forward(x)?;
        Ok(argmax_rows(&logits, self.output_features()))
    }
}

/// `Σ w[i]·x[i]` in i32 (vectorises to multiply-add of 16-bit pairs).
#[inline]
fn dot(w: &[i16], x: &[i16]) -> i32 {
    w.iter().zip(x).map(|(a, b)| *a as i32 * *b as i32).sum()
}

/// Index of the largest value in each row of `cols` values (the first on ties).
pub fn argmax_rows(values: &[f32], cols: usize) -> Vec<usize> {
    values
        .chunks(cols.max(1))
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, v)| {
                    if *v > bv {
                        (i, *v)
                    } else {
                        (bi, bv)
                    }
                })
                .0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_multipliers_are_accurate() {
        for m in [0.5, 0.75, 1.0, 3.0e-4, 0.123456789, 1234.5, 1e-12] {
            let (q, shift) = fixed_point_multiplier(m).unwrap();
            let back = q as f64 / 2f64.powi(shift as i32);
            assert!(
                ((back - m) / m).abs() < 1e-9 || m < 1e-10,
                "{m}: {q} >> {shift} = {back}"
            );
        }
        assert!(fixed_point_multiplier(0.0).is_err());
        assert!(fixed_point_multiplier(f64::NAN).is_err());
        assert!(fixed_point_multiplier(1e12).is_err());
    }

    #[test]
    fn rounding_shift_follows_each_policy_on_ties() {
        // 5/2 = 2.5, -5/2 = -2.5, 7/4 = 1.75, -7/4 = -1.75
        let cases = [
            (RoundingPolicy::HalfEven, [2, -2, 2, -2]),
            (RoundingPolicy::HalfUp, [3, -2, 2, -2]),
            (RoundingPolicy::HalfDown, [2, -3, 2, -2]),
            (RoundingPolicy::HalfAwayFromZero, [3, -3, 2, -2]),
            (RoundingPolicy::HalfTowardZero, [2, -2, 2, -2]),
            (RoundingPolicy::Floor, [2, -3, 1, -2]),
            (RoundingPolicy::Ceil, [3, -2, 2, -1]),
        ];
        for (policy, want) in cases {
            let got = [
                rounding_shift(5, 1, policy),
                rounding_shift(-5, 1, policy),
                rounding_shift(7, 2, policy),
                rounding_shift(-7, 2, policy),
            ];
            assert_eq!(got, want, "{policy:?}");
            // Agrees with the float rounding of the kernels.
            for (n, s) in [
                (5i64, 1u32),
                (-5, 1),
                (7, 2),
                (-7, 2),
                (13, 3),
                (-13, 3),
                (12, 3),
                (-12, 3),
            ] {
                let v = n as f32 / (1 << s) as f32;
                assert_eq!(
                    rounding_shift(n, s, policy) as f32,
                    policy.round(v),
                    "{policy:?} {n}>>{s}"
                );
            }
        }
    }
}

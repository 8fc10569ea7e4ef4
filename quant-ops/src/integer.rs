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

use crate::export::{ExportError, ExportedModel, ExportedOp, ExportedWeighted, WeightedKind};

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
struct IntWeighted {
    name: String,
    kind: WeightedKind,
    fan_in: usize,
    /// Centered weight codes `q - z_w`, `[out, fan_in]`.
    weight: Vec<i16>,
    bias: Vec<i32>,
    relu: bool,
    output: Output,
}

#[derive(Debug, Clone)]
enum IntOp {
    Weighted(IntWeighted),
    MaxPool2d {
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    Flatten {
        features: usize,
    },
}

/// How far the integer model's logits may lie from the fake-quantized model's, relative to the
/// largest |logit| of the batch: `|int - fq| <= LOGIT_TOLERANCE · max|fq|`.
///
/// Every intermediate code is computed exactly in integers here, while the fake-quantized model
/// sums `f32` products; the two pick the same code except where a value lies within `f32`
/// rounding (about `1e-6` relative) of a rounding boundary, and then only the final
/// dequantization (`acc · s_input · s_weight`, one `f32` product against an `f32` sum) differs.
/// On random MLPs and CNNs (tests/properties.rs) the largest difference seen is about `2e-7` of
/// the range; the bound leaves a margin of 50. Where a value does fall on such a boundary, the
/// two codes differ by one level and the logits by that level's contribution: the pipeline
/// reports how often the predictions agree (`integer_agreement`).
///
/// This holds for the five round-to-nearest policies. With `Floor` or `Ceil` the integer model
/// is still exact, but the fake-quantized one is not: a sum that is exactly on a level (most
/// often exactly zero, when products cancel, which is common at low bit widths) comes out of
/// the `f32` sum a hair above or below it, and a directed rounding moves it one level, so the
/// two models disagree far more often than at the rare near-ties above.
pub const LOGIT_TOLERANCE: f32 = 1e-5;

/// Most values one sample may hold between two ops, or in a convolution's patches (64 Mi,
/// 128 MiB of 16-bit codes): [`IntegerModel::new`] refuses larger models.
pub const MAX_SAMPLE_ELEMENTS: usize = 1 << 26;
/// Most multiply-adds one sample may take (about 16 times a ResNet-50):
/// [`IntegerModel::new`] refuses costlier models.
pub const MAX_SAMPLE_MACS: u64 = 1 << 36;

/// An exported model, ready to run on integers.
#[derive(Debug, Clone)]
pub struct IntegerModel {
    input_shape: Vec<usize>,
    /// Quantizes the float input.
    input: quant_core::InferableQuantizer,
    ops: Vec<IntOp>,
    output_features: usize,
    /// Multiply-adds (and pooling comparisons) per sample.
    macs: u64,
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

/// `round(n / 2^shift)`, ties to even, in exact integer arithmetic, branch-free:
/// `floor((n + 2^(shift-1) - 1 + bit0(n >> shift)) / 2^shift)`.
#[inline(always)]
fn round_shift_half_even(n: i64, shift: u32) -> i64 {
    if shift == 0 {
        return n;
    }
    (n + (1i64 << (shift - 1)) - 1 + ((n >> shift) & 1)) >> shift
}

/// One row of accumulators requantized with ties to even and clamped to `[lo, hi]`.
fn requantize_half_even(
    row: &[i32],
    ms: &[i64],
    shifts: &[u32],
    lo: i64,
    hi: i64,
    out: &mut [i16],
) {
    for (((code, a), m), shift) in out.iter_mut().zip(row).zip(ms).zip(shifts) {
        *code = round_shift_half_even(*a as i64 * m, *shift).max(lo).min(hi) as i16;
    }
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

fn weighted_of(
    l: &ExportedWeighted,
    relu: bool,
    next: Option<&ExportedWeighted>,
) -> Result<IntWeighted, ExportError> {
    let fan_in = l.kind.fan_in().ok_or_else(|| ExportError::Unsupported {
        layer: l.name.clone(),
        reason: "its weight shape overflows".into(),
    })?;
    let wq = &l.weights.inferable;
    let s_in = l.input.inferable.qparams().scales()[0] as f64;
    let unsupported = |reason: String| ExportError::Unsupported {
        layer: l.name.clone(),
        reason,
    };
    let w_scales = wq.qparams().scales();
    let w_zeros = wq.qparams().zero_points();
    let per_channel = w_scales.len() > 1;
    let weight: Vec<i16> = l
        .weight
        .iter()
        .enumerate()
        .map(|(i, q)| (q - w_zeros[if per_channel { i / fan_in } else { 0 }]) as i16)
        .collect();
    let scale_of = |o: usize| s_in * w_scales[if per_channel { o } else { 0 }] as f64;
    let out = l.kind.out_channels();
    let output = match next {
        Some(n) => {
            let nq = &n.input.inferable;
            let s_next = nq.qparams().scales()[0] as f64;
            let multipliers = (0..out)
                .map(|o| fixed_point_multiplier(scale_of(o) / s_next))
                .collect::<Result<Vec<_>, QuantError>>()
                .map_err(|e| unsupported(format!("requantizing into `{}`: {e}", n.name)))?;
            Output::Requantize {
                multipliers,
                zero_point: nq.qparams().zero_points()[0],
                quant_min: nq.grid().quant_min(),
                quant_max: nq.grid().quant_max(),
                rounding: nq.rounding(),
            }
        }
        None => {
            // Logits are `acc · scale`: finite for every accumulator the layer can produce.
            let gi = l.input.inferable.grid();
            let zi = i64::from(l.input.inferable.qparams().zero_points()[0]);
            let x_max = (zi - i64::from(gi.quant_min())).max(i64::from(gi.quant_max()) - zi);
            let mut scales = Vec::with_capacity(out);
            for o in 0..out {
                let row = l.weight.get(o * fan_in..(o + 1) * fan_in).unwrap_or(&[]);
                let z = i64::from(w_zeros[if per_channel { o } else { 0 }]);
                let w_abs: i64 = row.iter().map(|q| (i64::from(*q) - z).abs()).sum();
                let bound = (w_abs * x_max + i64::from(l.bias[o]).abs()) as f64;
                let s = scale_of(o);
                if !((s as f32).is_finite() && bound * s <= f64::from(f32::MAX)) {
                    return Err(unsupported(format!(
                        "output channel {o}: logits up to {bound} · {s} (s_input · s_weight) overflow f32"
                    )));
                }
                scales.push(s as f32);
            }
            Output::Dequantize { scales }
        }
    };
    Ok(IntWeighted {
        name: l.name.clone(),
        kind: l.kind,
        fan_in,
        weight,
        bias: l.bias.clone(),
        relu,
        output,
    })
}

/// Per-sample layout of the activations between ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dims {
    Flat(usize),
    Maps(usize, usize, usize),
}

impl Dims {
    /// Values per sample (at most [`MAX_SAMPLE_ELEMENTS`] once traced).
    fn numel(self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }
    fn checked_numel(self) -> Option<usize> {
        match self {
            Dims::Flat(f) => Some(f),
            Dims::Maps(c, h, w) => c.checked_mul(h)?.checked_mul(w),
        }
    }
}

/// Output positions along one axis, `None` when the window does not fit (or the sizes overflow).
fn out_len(len: usize, kernel: usize, stride: usize, padding: usize) -> Option<usize> {
    len.checked_add(padding.checked_mul(2)?)?
        .checked_sub(kernel)
        .and_then(|d| d.checked_div(stride))
        .map(|d| d + 1)
}

impl IntegerModel {
    /// Prepares an exported model for integer inference.
    ///
    /// # Errors
    /// No layer with weights, an op before the first one or after the last one that the
    /// runtime cannot place, consecutive layers whose sizes do not match.
    pub fn new(model: &ExportedModel) -> Result<IntegerModel, ExportError> {
        model.check()?;
        let unsupported = |layer: &str, reason: String| ExportError::Unsupported {
            layer: layer.to_string(),
            reason,
        };
        let weighted: Vec<(usize, &ExportedWeighted)> = model
            .ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                ExportedOp::Weighted(w) => Some((i, w)),
                _ => None,
            })
            .collect();
        let Some(&(first_index, first)) = weighted.first() else {
            return Err(unsupported(
                "(model)",
                "the export has no layer with weights".into(),
            ));
        };
        if first_index != 0 {
            return Err(unsupported(
                "(model)",
                "the first op must be a layer with weights: its input quantizer turns the float input into integers"
                    .into(),
            ));
        }
        let Some(&(last_index, _)) = weighted.last() else {
            return Err(unsupported(
                "(model)",
                "the export has no layer with weights".into(),
            ));
        };
        let mut ops = Vec::with_capacity(model.ops.len());
        for (k, &(index, layer)) in weighted.iter().enumerate() {
            let end = weighted.get(k + 1).map_or(model.ops.len(), |n| n.0);
            let relu = model.ops[index + 1..end]
                .iter()
                .any(|op| matches!(op, ExportedOp::Relu));
            ops.push(IntOp::Weighted(weighted_of(
                layer,
                relu,
                weighted.get(k + 1).map(|n| n.1),
            )?));
            for op in &model.ops[index + 1..end] {
                match op {
                    ExportedOp::Relu | ExportedOp::Weighted(_) => {}
                    ExportedOp::MaxPool2d {
                        kernel,
                        stride,
                        padding,
                    } => {
                        if index == last_index {
                            return Err(unsupported(
                                "(model)",
                                "max pooling after the last layer with weights".into(),
                            ));
                        }
                        ops.push(IntOp::MaxPool2d {
                            kernel: *kernel,
                            stride: *stride,
                            padding: *padding,
                        })
                    }
                    ExportedOp::Flatten { features } => {
                        if index == last_index {
                            return Err(unsupported(
                                "(model)",
                                "flattening after the last layer with weights".into(),
                            ));
                        }
                        ops.push(IntOp::Flatten {
                            features: *features,
                        })
                    }
                }
            }
        }
        let output_features = weighted.last().map_or(0, |w| w.1.kind.out_channels());
        let mut model = IntegerModel {
            input_shape: model.input_shape.clone(),
            input: first.input.inferable.clone(),
            ops,
            output_features,
            macs: 0,
        };
        // Walk the shapes once so that mismatched layers fail here, not at the first batch,
        // and so that the cost of a sample is known and bounded.
        model.macs = model.trace_cost()?;
        Ok(model)
    }

    /// Multiply-adds (and pooling comparisons) one sample takes, at most [`MAX_SAMPLE_MACS`].
    pub fn macs_per_sample(&self) -> u64 {
        self.macs
    }

    fn input_dims(&self) -> Result<Dims, ExportError> {
        match self.input_shape.as_slice() {
            [f] => Ok(Dims::Flat(*f)),
            [c, h, w] => Ok(Dims::Maps(*c, *h, *w)),
            other => Err(ExportError::Unsupported {
                layer: "(input)".into(),
                reason: format!(
                    "input shape {other:?}: expected [features] or [channels, height, width]"
                ),
            }),
        }
    }

    /// Checks every op fits its input, and that no sample holds more than
    /// [`MAX_SAMPLE_ELEMENTS`] values at once or takes more than [`MAX_SAMPLE_MACS`]
    /// multiply-adds; returns the multiply-adds.
    fn trace_cost(&self) -> Result<u64, ExportError> {
        let too_big = |layer: &str, what: String| ExportError::Unsupported {
            layer: layer.to_string(),
            reason: what,
        };
        let mut dims = self.input_dims()?;
        let mut macs: u64 = 0;
        for op in &self.ops {
            let next = self.step_dims(op, dims)?;
            let (name, values, cost) = match op {
                IntOp::Weighted(l) => {
                    let out = l.kind.out_channels().max(1);
                    let positions = next.numel() / out;
                    // Conv2d holds its patches: positions × fan_in values.
                    let patches = match l.kind {
                        WeightedKind::Conv2d { .. } => positions.checked_mul(l.fan_in),
                        WeightedKind::Linear { .. } => Some(0),
                    };
                    let cost = (next.numel() as u64).checked_mul(l.fan_in as u64);
                    (l.name.as_str(), patches.map(|p| p.max(next.numel())), cost)
                }
                IntOp::MaxPool2d { kernel, .. } => (
                    "(max pool)",
                    Some(next.numel()),
                    (next.numel() as u64)
                        .checked_mul((*kernel as u64).saturating_mul(*kernel as u64)),
                ),
                IntOp::Flatten { .. } => ("(flatten)", Some(next.numel()), Some(0)),
            };
            if !matches!(values, Some(v) if v <= MAX_SAMPLE_ELEMENTS) {
                return Err(too_big(
                    name,
                    format!(
                        "one sample would hold more than {MAX_SAMPLE_ELEMENTS} values here ({next:?})"
                    ),
                ));
            }
            macs = match cost.and_then(|c| macs.checked_add(c)) {
                Some(m) if m <= MAX_SAMPLE_MACS => m,
                _ => {
                    return Err(too_big(
                        name,
                        format!(
                        "one sample would take more than {MAX_SAMPLE_MACS} multiply-adds by here"
                    ),
                    ))
                }
            };
            dims = next;
        }
        Ok(macs)
    }

    fn step_dims(&self, op: &IntOp, dims: Dims) -> Result<Dims, ExportError> {
        let bad = |layer: &str, reason: String| ExportError::Unsupported {
            layer: layer.to_string(),
            reason,
        };
        match (op, dims) {
            (IntOp::Weighted(l), Dims::Flat(f)) => match l.kind {
                WeightedKind::Linear {
                    in_features,
                    out_features,
                } if in_features == f => Ok(Dims::Flat(out_features)),
                _ => Err(bad(
                    &l.name,
                    format!("receives {f} features, expects {:?}", l.kind),
                )),
            },
            (IntOp::Weighted(l), Dims::Maps(c, h, w)) => match l.kind {
                WeightedKind::Conv2d {
                    in_channels,
                    out_channels,
                    kernel,
                    stride,
                    padding,
                } if in_channels == c => match (
                    out_len(h, kernel, stride, padding),
                    out_len(w, kernel, stride, padding),
                ) {
                    (Some(oh), Some(ow)) if oh > 0 && ow > 0 => {
                        Ok(Dims::Maps(out_channels, oh, ow))
                    }
                    _ => Err(bad(
                        &l.name,
                        format!("a {h}x{w} input is smaller than its {kernel}x{kernel} kernel"),
                    )),
                },
                _ => Err(bad(
                    &l.name,
                    format!("receives {c}x{h}x{w} feature maps, expects {:?}", l.kind),
                )),
            },
            (
                IntOp::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                },
                Dims::Maps(c, h, w),
            ) => {
                match (
                    out_len(h, *kernel, *stride, *padding),
                    out_len(w, *kernel, *stride, *padding),
                ) {
                    (Some(oh), Some(ow)) if oh > 0 && ow > 0 => Ok(Dims::Maps(c, oh, ow)),
                    _ => Err(bad(
                        "(max pool)",
                        format!("a {h}x{w} input is smaller than its {kernel}x{kernel} window"),
                    )),
                }
            }
            (IntOp::Flatten { features }, d) if d.numel() == *features => Ok(Dims::Flat(*features)),
            (IntOp::Flatten { features }, d) => Err(bad(
                "(flatten)",
                format!("flattens {d:?} but expects {features} features"),
            )),
            (IntOp::MaxPool2d { .. }, d) => Err(bad(
                "(max pool)",
                format!("needs feature maps, receives {d:?}"),
            )),
        }
    }

    /// Shape of one input sample.
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// Input values per sample.
    pub fn input_features(&self) -> usize {
        self.input_shape.iter().product()
    }

    /// Output features (logits) per sample.
    pub fn output_features(&self) -> usize {
        self.output_features
    }

    /// Runs a batch (`x` holds whole samples of [`input_shape`](Self::input_shape), row-major)
    /// and returns `n × output_features` logits.
    ///
    /// # Errors
    /// `x` is not a whole number of samples, or holds NaN.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>, QuantError> {
        let in_f = self.input_features();
        if in_f == 0 || x.len() % in_f != 0 {
            return Err(QuantError::LengthMismatch {
                what: format!("input (whole samples of {:?})", self.input_shape),
                expected: x.len().div_ceil(in_f.max(1)) * in_f,
                actual: x.len(),
            });
        }
        let n = x.len() / in_f;
        let codes: Vec<i32> = self.input.quantize(x, &[n * in_f])?;
        let z = self.input.qparams().zero_points()[0];
        let mut act: Vec<i16> = codes.iter().map(|q| (q - z) as i16).collect();
        let mut dims = self.input_dims().map_err(|e| QuantError::InvalidValue {
            what: "input shape".into(),
            value: format!("{:?}", self.input_shape),
            expected: e.to_string(),
        })?;
        let mut logits = Vec::new();
        for op in &self.ops {
            let next_dims = self
                .step_dims(op, dims)
                .map_err(|e| QuantError::InvalidValue {
                    what: "layer sizes".into(),
                    value: format!("{dims:?}"),
                    expected: e.to_string(),
                })?;
            match op {
                IntOp::Weighted(l) => {
                    let (next, out) = run_weighted(l, &act, dims, next_dims, n);
                    act = next;
                    if matches!(l.output, Output::Dequantize { .. }) {
                        logits = out;
                    }
                }
                IntOp::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                } => {
                    act = max_pool(&act, dims, next_dims, n, *kernel, *stride, *padding);
                }
                IntOp::Flatten { .. } => {}
            }
            dims = next_dims;
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

/// Gathers the `fan_in` centered codes feeding output position `(oy, ox)` of a convolution
/// (zero padding is the centered code 0, i.e. the real value 0).
#[allow(clippy::too_many_arguments)]
fn patch(
    sample: &[i16],
    (c, h, w): (usize, usize, usize),
    k: usize,
    s: usize,
    p: usize,
    oy: usize,
    ox: usize,
    out: &mut [i16],
) {
    let mut i = 0;
    for ch in 0..c {
        for ky in 0..k {
            let y = (oy * s + ky) as isize - p as isize;
            for kx in 0..k {
                let xx = (ox * s + kx) as isize - p as isize;
                out[i] = if y >= 0 && (y as usize) < h && xx >= 0 && (xx as usize) < w {
                    sample[(ch * h + y as usize) * w + xx as usize]
                } else {
                    0
                };
                i += 1;
            }
        }
    }
}

/// One layer with weights on a batch: returns the next layer's centered codes (when
/// requantizing) or the logits (when dequantizing).
///
/// The layer is one integer matrix product `acc[r][o] = Σ_i x[r][i] · w[o][i] + bias[o]` over
/// rows `r` (samples for Linear, samples × output positions for Conv2d, whose rows are im2col
/// patches), followed by requantization per output channel.
fn run_weighted(
    l: &IntWeighted,
    act: &[i16],
    dims: Dims,
    next_dims: Dims,
    n: usize,
) -> (Vec<i16>, Vec<f32>) {
    let out_per = next_dims.numel();
    let out_c = l.kind.out_channels();
    let positions = out_per / out_c.max(1);
    // Rows of the product: the activations themselves for Linear, im2col patches for Conv2d.
    let patches;
    let rows: &[i16] = match (l.kind, dims, next_dims) {
        (
            WeightedKind::Conv2d {
                kernel,
                stride,
                padding,
                ..
            },
            Dims::Maps(c, h, w),
            Dims::Maps(_, _, ow),
        ) => {
            let in_per = c * h * w;
            let mut m = vec![0i16; n * positions * l.fan_in];
            m.par_chunks_mut(positions * l.fan_in)
                .enumerate()
                .for_each(|(b, sample_rows)| {
                    let xs = &act[b * in_per..(b + 1) * in_per];
                    for (pos, row) in sample_rows.chunks_mut(l.fan_in).enumerate() {
                        patch(
                            xs,
                            (c, h, w),
                            kernel,
                            stride,
                            padding,
                            pos / ow,
                            pos % ow,
                            row,
                        );
                    }
                });
            patches = m;
            &patches
        }
        _ => act,
    };
    let acc = gemm_i16(rows, &l.weight, &l.bias, l.fan_in, out_c);
    // acc is [n·positions, out]; the next layer wants NCHW: [n][out][positions].
    let at = |b: usize, o: usize, pos: usize| acc[(b * positions + pos) * out_c + o];
    match &l.output {
        Output::Requantize {
            multipliers,
            zero_point,
            quant_min,
            quant_max,
            rounding,
        } => {
            let lo = if l.relu {
                (*quant_min).max(*zero_point)
            } else {
                *quant_min
            } as i64
                - *zero_point as i64;
            let hi = *quant_max as i64 - *zero_point as i64;
            let mut next = vec![0i16; n * out_per];
            // acc is [n·positions, out]; the next layer wants NCHW: [n][out][positions].
            let (ms, shifts): (Vec<i64>, Vec<u32>) = multipliers.iter().copied().unzip();
            let mut row_codes = vec![0i16; out_c];
            for b in 0..n {
                for pos in 0..positions {
                    let row =
                        &acc[(b * positions + pos) * out_c..(b * positions + pos + 1) * out_c];
                    let codes: &mut [i16] = if positions == 1 {
                        &mut next[b * out_per..(b + 1) * out_per]
                    } else {
                        &mut row_codes
                    };
                    match rounding {
                        // The common case gets its own loop without a per-element dispatch.
                        RoundingPolicy::HalfEven => {
                            requantize_half_even(row, &ms, &shifts, lo, hi, codes)
                        }
                        policy => {
                            for (((code, a), m), shift) in
                                codes.iter_mut().zip(row).zip(&ms).zip(&shifts)
                            {
                                *code = rounding_shift(*a as i64 * m, *shift, *policy).clamp(lo, hi)
                                    as i16;
                            }
                        }
                    }
                    if positions > 1 {
                        // NCHW: channel-major within a sample.
                        for (o, code) in row_codes.iter().enumerate() {
                            next[b * out_per + o * positions + pos] = *code;
                        }
                    }
                }
            }
            (next, Vec::new())
        }
        Output::Dequantize { scales } => {
            let mut logits = vec![0f32; n * out_per];
            for (b, sample) in logits.chunks_mut(out_per).enumerate() {
                for (o, plane) in sample.chunks_mut(positions).enumerate() {
                    for (pos, v) in plane.iter_mut().enumerate() {
                        let y = at(b, o, pos) as f32 * scales[o];
                        *v = if l.relu { y.max(0.0) } else { y };
                    }
                }
            }
            (Vec::new(), logits)
        }
    }
}

/// `acc[r][o] = Σ_i x[r][i] · w[o][i] + bias[o]` in i32, for `x: [rows, k]`, `w: [outs, k]`,
/// split across rayon's threads by blocks of rows.
fn gemm_i16(x: &[i16], w: &[i16], bias: &[i32], k: usize, outs: usize) -> Vec<i32> {
    const ROW_BLOCK: usize = 16;
    let rows = x.len() / k.max(1);
    let mut acc = vec![0i32; rows * outs];
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    acc.par_chunks_mut(ROW_BLOCK * outs)
        .zip(x.par_chunks(ROW_BLOCK * k))
        .for_each(|(acc, x)| {
            // Two input rows at a time share each load of four weight rows.
            for (xs, accs) in x.chunks(2 * k).zip(acc.chunks_mut(2 * outs)) {
                let (x0, x1) = xs.split_at(k.min(xs.len()));
                let x1 = if x1.is_empty() { x0 } else { x1 };
                let mut o = 0;
                while o + 4 <= outs {
                    let ws = [
                        &w[o * k..(o + 1) * k],
                        &w[(o + 1) * k..(o + 2) * k],
                        &w[(o + 2) * k..(o + 3) * k],
                        &w[(o + 3) * k..(o + 4) * k],
                    ];
                    #[cfg(target_arch = "x86_64")]
                    let (s0, s1) = if avx2 {
                        // SAFETY: AVX2 is available on this CPU (checked above).
                        unsafe { simd::dot2x4_avx2(x0, x1, ws) }
                    } else {
                        (simd::dot4_sse2(x0, ws), simd::dot4_sse2(x1, ws))
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let (s0, s1) = (ws.map(|wr| dot(wr, x0)), ws.map(|wr| dot(wr, x1)));
                    for j in 0..4 {
                        accs[o + j] = s0[j] + bias[o + j];
                        if accs.len() > outs {
                            accs[outs + o + j] = s1[j] + bias[o + j];
                        }
                    }
                    o += 4;
                }
                while o < outs {
                    let wr = &w[o * k..(o + 1) * k];
                    accs[o] = dot(wr, x0) + bias[o];
                    if accs.len() > outs {
                        accs[outs + o] = dot(wr, x1) + bias[o];
                    }
                    o += 1;
                }
            }
        });
    acc
}

/// Four 16-bit dot products sharing one input row, with the x86 multiply-add of 16-bit pairs
/// (`pmaddwd`): SSE2 is part of x86-64, AVX2 doubles the width where the CPU has it.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// Horizontal sum of four i32 lanes.
    #[inline(always)]
    fn hsum128(v: __m128i) -> i32 {
        // SAFETY: SSE2 is part of x86-64.
        unsafe {
            let hi = _mm_unpackhi_epi64(v, v);
            let s = _mm_add_epi32(v, hi);
            let hi = _mm_shuffle_epi32(s, 0b01);
            _mm_cvtsi128_si32(_mm_add_epi32(s, hi))
        }
    }

    /// `[Σ x·w0, Σ x·w1, Σ x·w2, Σ x·w3]` (all slices of one length).
    pub(super) fn dot4_sse2(x: &[i16], w: [&[i16]; 4]) -> [i32; 4] {
        let k = w.iter().fold(x.len(), |k, r| k.min(r.len()));
        let mut sums = [0i32; 4];
        let full = k / 8 * 8;
        // SAFETY: SSE2 is part of x86-64; every load reads 8 lanes below `full <= len`.
        unsafe {
            let mut acc = [_mm_setzero_si128(); 4];
            let mut i = 0;
            while i < full {
                let xv = _mm_loadu_si128(x.as_ptr().add(i) as *const __m128i);
                for j in 0..4 {
                    let wv = _mm_loadu_si128(w[j].as_ptr().add(i) as *const __m128i);
                    acc[j] = _mm_add_epi32(acc[j], _mm_madd_epi16(wv, xv));
                }
                i += 8;
            }
            for j in 0..4 {
                sums[j] = hsum128(acc[j]);
            }
        }
        for i in full..k {
            for j in 0..4 {
                sums[j] += w[j][i] as i32 * x[i] as i32;
            }
        }
        sums
    }

    /// [`dot4_avx2`] for two input rows sharing the weight loads.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot2x4_avx2(
        x0: &[i16],
        x1: &[i16],
        w: [&[i16]; 4],
    ) -> ([i32; 4], [i32; 4]) {
        // Every slice has this length in `gemm_i16`; the minimum keeps each load in bounds
        // whatever the caller passes.
        let k = w.iter().fold(x0.len().min(x1.len()), |k, r| k.min(r.len()));
        let full = k / 16 * 16;
        let mut a0 = [_mm256_setzero_si256(); 4];
        let mut a1 = [_mm256_setzero_si256(); 4];
        let mut i = 0;
        while i < full {
            // SAFETY: every load reads 16 lanes below `full <= len` of slices of length `k`.
            let (xv0, xv1) = unsafe {
                (
                    _mm256_loadu_si256(x0.as_ptr().add(i) as *const __m256i),
                    _mm256_loadu_si256(x1.as_ptr().add(i) as *const __m256i),
                )
            };
            for j in 0..4 {
                let wv = unsafe { _mm256_loadu_si256(w[j].as_ptr().add(i) as *const __m256i) };
                a0[j] = _mm256_add_epi32(a0[j], _mm256_madd_epi16(wv, xv0));
                a1[j] = _mm256_add_epi32(a1[j], _mm256_madd_epi16(wv, xv1));
            }
            i += 16;
        }
        let mut s0 = [0i32; 4];
        let mut s1 = [0i32; 4];
        for j in 0..4 {
            s0[j] = hsum128(_mm_add_epi32(
                _mm256_castsi256_si128(a0[j]),
                _mm256_extracti128_si256(a0[j], 1),
            ));
            s1[j] = hsum128(_mm_add_epi32(
                _mm256_castsi256_si128(a1[j]),
                _mm256_extracti128_si256(a1[j], 1),
            ));
        }
        for i in full..k {
            for j in 0..4 {
                s0[j] += w[j][i] as i32 * x0[i] as i32;
                s1[j] += w[j][i] as i32 * x1[i] as i32;
            }
        }
        (s0, s1)
    }
}

/// Max pooling on centered codes; padding never wins.
fn max_pool(
    act: &[i16],
    dims: Dims,
    next_dims: Dims,
    n: usize,
    k: usize,
    s: usize,
    p: usize,
) -> Vec<i16> {
    let (Dims::Maps(c, h, w), Dims::Maps(_, oh, ow)) = (dims, next_dims) else {
        return act.to_vec();
    };
    let mut out = vec![0i16; n * c * oh * ow];
    for b in 0..n {
        for ch in 0..c {
            let plane = &act[((b * c) + ch) * h * w..((b * c) + ch + 1) * h * w];
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut best = i16::MIN;
                    for ky in 0..k {
                        let y = (oy * s + ky) as isize - p as isize;
                        if y < 0 || y as usize >= h {
                            continue;
                        }
                        for kx in 0..k {
                            let x = (ox * s + kx) as isize - p as isize;
                            if x >= 0 && (x as usize) < w {
                                best = best.max(plane[y as usize * w + x as usize]);
                            }
                        }
                    }
                    out[((b * c + ch) * oh + oy) * ow + ox] = best;
                }
            }
        }
    }
    out
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
    fn branch_free_half_even_matches_the_reference() {
        for shift in 1..12u32 {
            for n in -5000i64..5000 {
                assert_eq!(
                    round_shift_half_even(n, shift),
                    rounding_shift(n, shift, RoundingPolicy::HalfEven),
                    "{n} >> {shift}"
                );
            }
        }
        assert_eq!(round_shift_half_even(-7, 0), -7);
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

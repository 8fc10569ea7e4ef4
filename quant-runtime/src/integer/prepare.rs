//! Preparing a graph for the integer runtime: how each value is held, packed weights,
//! requantization multipliers, cost and memory bounds.

use quant_core::InferableQuantizer;

use quant_core::int8::nonlinear::attention_scale;
use quant_core::int8::{IntGelu, IntLayerNorm, IntSoftmax};

use super::{
    Budget, IntegerModel, Layout, Rep, StoredGrid, MAX_BITS, MAX_SAMPLE_ELEMENTS, MAX_SAMPLE_MACS,
};
use crate::graph::{Conv2dGeometry, Graph, Op, ParamValues, Parameter};
use crate::GraphError;
use quant_core::int8::{fixed_point_multiplier, DepthwiseFilter, PackedMatrix, Requantizer};

/// What the runtime prepared for one node.
#[derive(Debug, Clone, Default)]
pub(super) struct Step {
    /// A layer with weights.
    pub weighted: Option<Weighted>,
    /// A quantize node.
    pub quantize: Option<Quantize>,
    /// Logits of an accumulator output: one scale per channel (or one).
    pub logit_scales: Vec<f32>,
    /// The integer kernel of a LayerNorm, Gelu or Softmax node.
    pub nonlinear: Option<Nonlinear>,
    /// An ImageTokens node's position embedding `[tokens, channels]`, at its input's scale
    /// divided by `2^position_shift`.
    pub position: Vec<i32>,
    /// The shift that refines an ImageTokens node's input before the embedding joins it.
    pub position_shift: u32,
}

/// The integer kernels of the ops without an exact integer form, from
/// [`quant_core::int8::nonlinear`]: what the fake-quantized model simulates.
#[derive(Debug, Clone)]
pub(super) enum Nonlinear {
    LayerNorm(IntLayerNorm),
    Gelu(IntGelu),
    Softmax(IntSoftmax),
}

/// Most bits by which an ImageTokens node refines its accumulators' scale.
const MAX_POSITION_SHIFT: u32 = 24;

/// A quantize node, by what it reads.
#[derive(Debug, Clone)]
pub(super) enum Quantize {
    /// The float input: quantize with the inferable quantizer, add the storage offset.
    Float {
        quantizer: InferableQuantizer,
        offset: i32,
    },
    /// Accumulators or codes: requantize, per channel (the last stored axis) or with one
    /// multiplier.
    Requantize {
        requantizer: Requantizer,
        /// The stored zero point of codes read (subtracted first); `None` for accumulators.
        input_zero: Option<i32>,
    },
}

/// A Linear or Conv2d layer.
#[derive(Debug, Clone)]
pub(super) struct Weighted {
    /// Per group: the weight rows of its output channels, `(ky, kx, c)` ordered for a
    /// convolution. Empty for a depthwise convolution, which runs on `depthwise`.
    pub groups: Vec<PackedMatrix>,
    /// A depthwise convolution's filters (one input and one output channel per group).
    pub depthwise: Option<DepthwiseFilter>,
    /// Per group: its output channels' biases.
    pub biases: Vec<Vec<i32>>,
    /// The input's stored zero point.
    pub input_zero: i32,
    /// Values per product row (fan-in of one group).
    pub fan_in: usize,
    /// Output channels.
    pub out: usize,
    /// The convolution's geometry and input and output sizes; `None` for Linear.
    pub conv: Option<Conv>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Conv {
    pub geometry: Conv2dGeometry,
    pub input: (usize, usize, usize),
    pub output: (usize, usize),
}

fn unsupported(node: &str, reason: impl Into<String>) -> GraphError {
    GraphError::Unsupported {
        layer: crate::graph::short(node),
        reason: reason.into(),
    }
}

/// Rejects a quantizer wider than [`MAX_BITS`]; `what` starts the reason ("it uses").
fn check_bits(node: &str, what: &str, q: &InferableQuantizer) -> Result<(), GraphError> {
    let bits = q.grid().bits();
    if bits > MAX_BITS {
        return Err(unsupported(
            node,
            format!("{what} {bits} bits; integer inference supports up to {MAX_BITS}"),
        ));
    }
    Ok(())
}

fn stored_grid(q: &InferableQuantizer) -> (StoredGrid, i32) {
    let g = q.grid();
    let offset = if g.signed() { 128 } else { 0 };
    (
        StoredGrid {
            scale: q.qparams().scales()[0] as f64,
            zero: q.qparams().zero_points()[0] + offset,
            lo: g.quant_min() + offset,
            hi: g.quant_max() + offset,
            rounding: q.rounding(),
        },
        offset,
    )
}

/// Largest |code − zero| on a stored grid.
fn reach(g: &StoredGrid) -> i64 {
    i64::from(g.zero - g.lo).max(i64::from(g.hi - g.zero))
}

pub(super) fn prepare(graph: &Graph, budget: Budget) -> Result<IntegerModel, GraphError> {
    let shapes = graph.check()?;
    let n_values = graph.nodes.len() + 1;
    let (inputs, output) = graph.value_numbers();
    let numels: Vec<usize> = (0..n_values)
        .map(|v| shapes.of_value(v).iter().product())
        .collect();
    let mut reps = vec![Rep::Float];
    let mut layouts = vec![match shapes.of_value(0) {
        [c, h, w] => Layout::Maps {
            c: *c,
            h: *h,
            w: *w,
        },
        s => Layout::Flat {
            features: s.last().copied().unwrap_or(1),
        },
    }];
    let mut steps = Vec::with_capacity(graph.nodes.len());
    let mut macs: u64 = 0;
    // Per node: the bytes of one sample's im2col patches it needs while it runs.
    let mut patches_of = vec![0usize; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        let name = node.name.as_str();
        let a = inputs[i][0];
        let (rep_a, lay_a) = (reps[a].clone(), layouts[a]);
        if numels[i + 1] > MAX_SAMPLE_ELEMENTS {
            return Err(unsupported(
                name,
                format!("one sample would hold more than {MAX_SAMPLE_ELEMENTS} values here"),
            ));
        }
        if rep_a == Rep::Float && !matches!(node.op, Op::QuantizeDequantize { .. }) {
            return Err(unsupported(
                name,
                format!(
                    "it reads float values (`{}`); integer inference needs its input quantized",
                    crate::graph::short(&node.inputs[0])
                ),
            ));
        }
        let mut step = Step::default();
        let mut cost: u64 = 0;
        let (rep, layout) = match &node.op {
            Op::QuantizeDequantize { quantizer } => {
                let q = &quantizer.inferable;
                check_bits(name, "it uses", q)?;
                let (grid, offset) = stored_grid(q);
                step.quantize = Some(match &rep_a {
                    Rep::Float => Quantize::Float {
                        quantizer: q.clone(),
                        offset,
                    },
                    Rep::Acc { scales, .. } => Quantize::Requantize {
                        requantizer: requantizer(name, scales, &grid)?,
                        input_zero: None,
                    },
                    Rep::Codes(g) => Quantize::Requantize {
                        requantizer: requantizer(name, &[g.scale], &grid)?,
                        input_zero: Some(g.zero),
                    },
                });
                (Rep::Codes(grid), lay_a)
            }
            Op::Linear {
                in_features,
                out_features,
                weight,
                bias,
            } => {
                let Rep::Codes(g) = &rep_a else {
                    return Err(unsupported(name, "its input is not quantized"));
                };
                if matches!(lay_a, Layout::Maps { .. }) {
                    return Err(unsupported(
                        name,
                        "it reads feature maps; flatten them first",
                    ));
                }
                let (codes, zeros, scales) = weight_codes(name, weight)?;
                let bias = accumulator_bias(name, bias)?;
                let (k, o) = (*in_features, *out_features);
                // Columns follow the stored order of the input's features.
                let column = |j: usize| -> usize {
                    match lay_a {
                        // Stored (y, x, c) → the graph's (c, y, x) index.
                        Layout::FlatMaps { c, h, w } => {
                            let (y, x, ch) = (j / (w * c), (j / c) % w, j % c);
                            (ch * h + y) * w + x
                        }
                        _ => j,
                    }
                };
                let mut centered = vec![0i32; o * k];
                for oc in 0..o {
                    let z = zeros[if zeros.len() == 1 { 0 } else { oc }];
                    for j in 0..k {
                        centered[oc * k + j] = codes[oc * k + column(j)] - z;
                    }
                }
                let bound = accumulator_bound(name, &centered, k, &bias, reach(g))?;
                let rows = (numels[a] / k) as u64;
                cost = rows * (k as u64) * (o as u64);
                step.weighted = Some(Weighted {
                    groups: vec![PackedMatrix::new(&centered, o, k)?],
                    depthwise: None,
                    biases: vec![bias],
                    input_zero: g.zero,
                    fan_in: k,
                    out: o,
                    conv: None,
                });
                (
                    Rep::Acc {
                        scales: scales.iter().map(|s| g.scale * s).collect(),
                        bound,
                    },
                    Layout::Flat { features: o },
                )
            }
            Op::Conv2d {
                geometry,
                weight,
                bias,
            } => {
                let Rep::Codes(g) = &rep_a else {
                    return Err(unsupported(name, "its input is not quantized"));
                };
                let Layout::Maps { c, h, w } = lay_a else {
                    return Err(unsupported(name, "its input is not feature maps"));
                };
                let (o, oh, ow) = match shapes.of_value(i + 1) {
                    [o, oh, ow] => (*o, *oh, *ow),
                    _ => return Err(unsupported(name, "its output is not feature maps")),
                };
                let (codes, zeros, scales) = weight_codes(name, weight)?;
                let bias = accumulator_bias(name, bias)?;
                let (k, groups) = (geometry.kernel, geometry.groups);
                let (cg, og) = (c / groups, o / groups);
                let fan_in = cg * k * k;
                // OIHW → per group, rows (ky, kx, c) of each output channel.
                let mut centered = vec![0i32; o * fan_in];
                for oc in 0..o {
                    let z = zeros[if zeros.len() == 1 { 0 } else { oc }];
                    for ci in 0..cg {
                        for ky in 0..k {
                            for kx in 0..k {
                                centered[oc * fan_in + (ky * k + kx) * cg + ci] =
                                    codes[((oc * cg + ci) * k + ky) * k + kx] - z;
                            }
                        }
                    }
                }
                let bound = accumulator_bound(name, &centered, fan_in, &bias, reach(g))?;
                let positions = oh * ow;
                let patches = positions.saturating_mul(fan_in);
                if patches > MAX_SAMPLE_ELEMENTS {
                    return Err(unsupported(
                        name,
                        format!(
                            "one sample's patches would hold more than {MAX_SAMPLE_ELEMENTS} values"
                        ),
                    ));
                }
                patches_of[i] = patches;
                cost = (positions as u64) * (fan_in as u64) * (o as u64);
                let mut packed = Vec::with_capacity(groups);
                let mut biases = Vec::with_capacity(groups);
                let depthwise = if groups > 1 && cg == 1 && og == 1 {
                    // One channel in and out per group: the rows are the filters, `[c][ky][kx]`.
                    Some(DepthwiseFilter::new(&centered, &bias, o, [k, k])?)
                } else {
                    None
                };
                for gi in (0..groups).filter(|_| depthwise.is_none()) {
                    packed.push(PackedMatrix::new(
                        &centered[gi * og * fan_in..(gi + 1) * og * fan_in],
                        og,
                        fan_in,
                    )?);
                    biases.push(bias[gi * og..(gi + 1) * og].to_vec());
                }
                step.weighted = Some(Weighted {
                    groups: packed,
                    depthwise,
                    biases,
                    input_zero: g.zero,
                    fan_in,
                    out: o,
                    conv: Some(Conv {
                        geometry: *geometry,
                        input: (h, w, c),
                        output: (oh, ow),
                    }),
                });
                (
                    Rep::Acc {
                        scales: scales.iter().map(|s| g.scale * s).collect(),
                        bound,
                    },
                    Layout::Maps { c: o, h: oh, w: ow },
                )
            }
            Op::Relu => (rep_a, lay_a),
            Op::Add => {
                // Integer adds need both inputs on one grid (TensorRT's and OpenVINO's rule):
                // the sum of centered codes is then exact at that grid's scale.
                let b = inputs[i][1];
                match (&rep_a, &reps[b]) {
                    (Rep::Codes(ga), Rep::Codes(gb)) if ga == gb => {
                        if layouts[b] != lay_a {
                            return Err(unsupported(name, "its inputs are laid out differently"));
                        }
                        cost = numels[i + 1] as u64;
                        (
                            Rep::Acc {
                                scales: vec![ga.scale],
                                bound: 2 * reach(ga),
                            },
                            lay_a,
                        )
                    }
                    _ => {
                        return Err(unsupported(
                            name,
                            "integer addition needs both inputs quantized on one grid (the same scale and zero point): quantize them with one quantizer",
                        ))
                    }
                }
            }
            Op::Flatten => (
                rep_a,
                match lay_a {
                    Layout::Maps { c, h, w } | Layout::FlatMaps { c, h, w } => {
                        Layout::FlatMaps { c, h, w }
                    }
                    Layout::Flat { .. } => Layout::Flat {
                        features: numels[a],
                    },
                },
            ),
            Op::MaxPool2d(p) => {
                let Layout::Maps { c, .. } = lay_a else {
                    return Err(unsupported(name, "its input is not feature maps"));
                };
                let (oh, ow) = (shapes.of_value(i + 1)[1], shapes.of_value(i + 1)[2]);
                cost = (numels[i + 1] as u64) * (p.kernel as u64) * (p.kernel as u64);
                (rep_a, Layout::Maps { c, h: oh, w: ow })
            }
            Op::AvgPool2d(p) => {
                let Layout::Maps { c, .. } = lay_a else {
                    return Err(unsupported(name, "its input is not feature maps"));
                };
                let (oh, ow) = (shapes.of_value(i + 1)[1], shapes.of_value(i + 1)[2]);
                let window = (p.kernel * p.kernel) as u64;
                cost = (numels[i + 1] as u64) * window;
                let (scales, bound) = match &rep_a {
                    Rep::Codes(g) => (vec![g.scale], reach(g)),
                    Rep::Acc { scales, bound } => (scales.clone(), *bound),
                    Rep::Float => unreachable!("float inputs are refused above"),
                };
                let bound = bound.saturating_mul(window as i64);
                within_i32(name, bound, "a window sum of")?;
                (
                    Rep::Acc {
                        scales: scales.iter().map(|s| s / window as f64).collect(),
                        bound,
                    },
                    Layout::Maps { c, h: oh, w: ow },
                )
            }
            Op::GlobalAvgPool | Op::GlobalMaxPool => {
                let Layout::Maps { c, h, w } = lay_a else {
                    return Err(unsupported(name, "its input is not feature maps"));
                };
                let plane = (h * w) as u64;
                cost = numels[a] as u64;
                let rep = match (&node.op, &rep_a) {
                    (Op::GlobalMaxPool, r) => r.clone(),
                    // The sum of centered values; the scale carries the division.
                    (_, Rep::Codes(g)) => Rep::Acc {
                        scales: vec![g.scale / plane as f64],
                        bound: reach(g).saturating_mul(plane as i64),
                    },
                    (_, Rep::Acc { scales, bound }) => Rep::Acc {
                        scales: scales.iter().map(|s| s / plane as f64).collect(),
                        bound: bound.saturating_mul(plane as i64),
                    },
                    (_, Rep::Float) => unreachable!("float inputs are refused above"),
                };
                if let Rep::Acc { bound, .. } = &rep {
                    within_i32(name, *bound, "a sum")?;
                }
                (rep, Layout::Flat { features: c })
            }
            Op::LayerNorm {
                scale,
                shift,
                epsilon,
            } => {
                let g = codes_in(name, &rep_a, "LayerNorm")?;
                let (ParamValues::Float(gamma), ParamValues::Float(beta)) =
                    (&scale.values, &shift.values)
                else {
                    return Err(unsupported(name, "its scale and shift are not float"));
                };
                let kernel =
                    IntLayerNorm::new(g.scale as f32, g.lo..=g.hi, gamma, beta, *epsilon as f32)
                        .map_err(|e| unsupported(name, format!("integer LayerNorm: {e}")))?;
                cost = numels[a] as u64;
                let rep = Rep::Acc {
                    scales: vec![kernel.output_scale() as f64],
                    bound: i64::from(i32::MAX),
                };
                step.nonlinear = Some(Nonlinear::LayerNorm(kernel));
                (rep, lay_a)
            }
            Op::Gelu => {
                let g = codes_in(name, &rep_a, "Gelu")?;
                let kernel = IntGelu::deployed(g.scale as f32, g.zero, g.lo..=g.hi)
                    .map_err(|e| unsupported(name, format!("integer GELU: {e}")))?;
                cost = numels[a] as u64;
                let rep = Rep::Acc {
                    scales: vec![kernel.output_scale() as f64],
                    // |d · Φ| / 2^shift with |d| < 2^shift and Φ ≤ 2^30.
                    bound: (1 << 30) + 1,
                };
                step.nonlinear = Some(Nonlinear::Gelu(kernel));
                (rep, lay_a)
            }
            Op::Softmax => {
                let Rep::Acc { scales, .. } = &rep_a else {
                    return Err(unsupported(
                        name,
                        "Softmax runs on the accumulators of attention scores; its input here is not one",
                    ));
                };
                let [scale] = scales.as_slice() else {
                    return Err(unsupported(
                        name,
                        "its input has a scale per channel; softmax needs one",
                    ));
                };
                let row = shapes.of_value(a).last().copied().unwrap_or(1);
                let kernel = IntSoftmax::deployed(*scale as f32, row)
                    .map_err(|e| unsupported(name, format!("integer softmax: {e}")))?;
                cost = numels[a] as u64;
                let rep = Rep::Acc {
                    scales: vec![kernel.output_scale() as f64],
                    bound: i64::from(kernel.max_code()),
                };
                step.nonlinear = Some(Nonlinear::Softmax(kernel));
                (rep, Layout::Flat { features: row })
            }
            Op::ImageTokens { position } => {
                let Layout::Maps { c, h, w } = lay_a else {
                    return Err(unsupported(name, "its input is not feature maps"));
                };
                let ParamValues::Float(p) = &position.values else {
                    return Err(unsupported(name, "its position embedding is not float"));
                };
                let (scales, bound) = match &rep_a {
                    Rep::Codes(g) => (vec![g.scale], reach(g)),
                    Rep::Acc { scales, bound } => (scales.clone(), *bound),
                    Rep::Float => unreachable!("float inputs are refused above"),
                };
                // The embedding joins the accumulators at their scale (per channel), refined
                // by 2^shift first: at 4 bits that scale (s_in · s_w) is coarse next to a
                // position embedding, which would otherwise be rounded by up to half of it.
                let (shift, at_scale, bound) = (0..=MAX_POSITION_SHIFT)
                    .rev()
                    .find_map(|shift| {
                        let finer = 2f64.powi(shift as i32);
                        let at_scale: Option<Vec<i64>> = p
                            .iter()
                            .enumerate()
                            .map(|(k, v)| {
                                let s = scales[if scales.len() == 1 { 0 } else { k % c }];
                                let q = (*v as f64 * finer / s).round();
                                (q.abs() <= f64::from(i32::MAX)).then_some(q as i64)
                            })
                            .collect();
                        let at_scale = at_scale?;
                        let largest = at_scale.iter().map(|q| q.abs()).max().unwrap_or(0);
                        let total = bound.checked_mul(1 << shift)?.checked_add(largest)?;
                        (total <= i64::from(i32::MAX)).then_some((shift, at_scale, total))
                    })
                    .ok_or_else(|| {
                        unsupported(
                            name,
                            "tokens plus positions could overflow an i32 accumulator at the accumulators' scale",
                        )
                    })?;
                let finer = 2f64.powi(shift as i32);
                let scales = scales.iter().map(|s| s / finer).collect();
                let at_scale: Vec<i32> = at_scale.into_iter().map(|q| q as i32).collect();
                debug_assert_eq!(at_scale.len(), h * w * c);
                step.position = at_scale;
                step.position_shift = shift;
                cost = numels[a] as u64;
                (Rep::Acc { scales, bound }, Layout::Flat { features: c })
            }
            Op::MeanTokens => {
                let Layout::Flat { features: c } = lay_a else {
                    return Err(unsupported(name, "its input is not tokens"));
                };
                let tokens = numels[a] / c.max(1);
                cost = numels[a] as u64;
                let rep = match &rep_a {
                    // The sum of centered codes; the scale carries the division.
                    Rep::Codes(g) => Rep::Acc {
                        scales: vec![g.scale / tokens as f64],
                        bound: reach(g).saturating_mul(tokens as i64),
                    },
                    // The mean, rounded to the accumulators' own step (their sum may not fit
                    // i32).
                    Rep::Acc { scales, bound } => Rep::Acc {
                        scales: scales.clone(),
                        bound: *bound,
                    },
                    Rep::Float => unreachable!("float inputs are refused above"),
                };
                if let Rep::Acc { bound, .. } = &rep {
                    within_i32(name, *bound, "a sum")?;
                }
                (rep, Layout::Flat { features: c })
            }
            Op::AttentionScores { .. } | Op::AttentionContext { .. } => {
                let b = inputs[i][1];
                let what = match node.op {
                    Op::AttentionScores { .. } => {
                        ["AttentionScores (queries)", "AttentionScores (keys)"]
                    }
                    _ => [
                        "AttentionContext (probabilities)",
                        "AttentionContext (values)",
                    ],
                };
                let ga = codes_in(name, &rep_a, what[0])?;
                let gb = codes_in(name, &reps[b], what[1])?;
                let (x, y) = (shapes.of_value(a), shapes.of_value(b));
                // Scores: queries [s1, f] by keys [s2, f], d = f / heads terms per output.
                // Context: probabilities [heads, s1, s2] by values [s2, f], s2 terms per output.
                let (terms, features, scale, sums) = match node.op {
                    Op::AttentionScores { heads } => {
                        let d = x[1] / heads;
                        let scale = attention_scale(ga.scale, gb.scale, d);
                        (d, y[0], scale, format!("dot products of {d} features"))
                    }
                    _ => (
                        x[2],
                        y[1],
                        ga.scale * gb.scale,
                        format!("weighted sums of {} values", x[2]),
                    ),
                };
                let bound = (terms as i64)
                    .saturating_mul(reach(&ga))
                    .saturating_mul(reach(&gb));
                within_i32(name, bound, &sums)?;
                cost = (numels[i + 1] as u64) * (terms as u64);
                let scales = vec![scale];
                (Rep::Acc { scales, bound }, Layout::Flat { features })
            }
            Op::Tanh | Op::Sigmoid | Op::ChannelAffine { .. } => {
                let reason = match &node.op {
                    Op::ChannelAffine { .. } => {
                        "an unfolded BatchNorm has no integer form: fold it into the convolution or Linear layer before it"
                    }
                    _ => "this activation has no integer form: integer inference supports ReLU and GELU",
                };
                return Err(unsupported(name, format!("{}: {reason}", node.op.name())));
            }
        };
        // Every op touches at least each value it writes (a ReLU, a Flatten that copies).
        let cost = cost.max(numels[i + 1] as u64);
        macs = match macs.checked_add(cost) {
            Some(m) if m <= MAX_SAMPLE_MACS => m,
            _ => {
                return Err(unsupported(
                    name,
                    format!(
                        "one sample would take more than {MAX_SAMPLE_MACS} multiply-adds by here"
                    ),
                ))
            }
        };
        reps.push(rep);
        layouts.push(layout);
        steps.push(step);
    }
    match &reps[output] {
        Rep::Acc { scales, bound } => {
            let mut logit_scales = Vec::with_capacity(scales.len());
            for (o, s) in scales.iter().enumerate() {
                if !((*s as f32).is_finite() && (*bound as f64) * s <= f64::from(f32::MAX)) {
                    return Err(unsupported(
                        &graph.output,
                        format!(
                            "output channel {o}: logits up to {bound} · {s} (the accumulator's scale) overflow f32"
                        ),
                    ));
                }
                logit_scales.push(*s as f32);
            }
            if let Some(step) = output.checked_sub(1).map(|i| &mut steps[i]) {
                step.logit_scales = logit_scales;
            }
        }
        Rep::Codes(_) => {}
        Rep::Float => {
            return Err(unsupported(
                &graph.output,
                "the model's output is float: integer inference needs a quantized model",
            ))
        }
    }
    // Each value is freed once its last reader has run; a value nothing reads (nor returns) as
    // soon as it is written.
    let mut frees = vec![Vec::new(); graph.nodes.len()];
    let mut last_use: Vec<Option<usize>> = vec![None; n_values];
    for (i, ins) in inputs.iter().enumerate() {
        for &v in ins {
            last_use[v] = Some(i);
        }
    }
    for (v, last) in last_use.iter().enumerate() {
        if v == output {
            continue;
        }
        match (last, v.checked_sub(1)) {
            (Some(i), _) => frees[*i].push(v),
            (None, Some(producer)) => frees[producer].push(v),
            (None, None) => {}
        }
    }
    // The working memory of one sample: the peak of the values alive at once (i32
    // accumulators, u8 codes, the f32 input) plus the running node's patches.
    let bytes_of = |v: usize| {
        numels[v]
            * if matches!(reps[v], Rep::Codes(_)) {
                1
            } else {
                4
            }
    };
    let mut alive = bytes_of(0);
    let mut sample_bytes = alive;
    for i in 0..graph.nodes.len() {
        alive += bytes_of(i + 1);
        sample_bytes = sample_bytes.max(alive + patches_of[i]);
        alive -= frees[i].iter().map(|&v| bytes_of(v)).sum::<usize>();
    }
    if sample_bytes > budget.working_bytes {
        return Err(unsupported(
            "(model)",
            format!(
                "one sample needs {sample_bytes} bytes of working memory at once; the budget is {} bytes",
                budget.working_bytes
            ),
        ));
    }
    Ok(IntegerModel {
        graph: graph.clone(),
        reps,
        layouts,
        numels,
        inputs,
        steps,
        output,
        frees,
        macs,
        sample_bytes,
        budget,
    })
}

/// An error unless values up to `bound` (`what` they are) fit an `i32` accumulator.
fn within_i32(node: &str, bound: i64, what: &str) -> Result<(), GraphError> {
    if bound > i64::from(i32::MAX) {
        return Err(unsupported(
            node,
            format!("{what} up to {bound} could overflow an i32 accumulator"),
        ));
    }
    Ok(())
}

/// The grid of codes an op needs as its input, or why it cannot run.
fn codes_in(node: &str, rep: &Rep, what: &str) -> Result<StoredGrid, GraphError> {
    match rep {
        Rep::Codes(g) => Ok(*g),
        _ => Err(unsupported(
            node,
            format!("{what} needs its input quantized to run on integers; quantize it (its layer's input slot)"),
        )),
    }
}

/// The requantization of values at `scales` (per channel, or one) into `grid`.
fn requantizer(node: &str, scales: &[f64], grid: &StoredGrid) -> Result<Requantizer, GraphError> {
    let multipliers = scales
        .iter()
        .map(|s| fixed_point_multiplier(s / grid.scale))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unsupported(node, format!("requantizing into this grid: {e}")))?;
    Ok(Requantizer::new(
        &multipliers,
        grid.zero,
        grid.lo,
        grid.hi,
        grid.rounding,
    )?)
}

/// A weight's codes, their zero points (one, or one per output channel) and scales.
type WeightCodes<'a> = (&'a [i32], Vec<i32>, Vec<f64>);

/// Weight codes (at most [`MAX_BITS`]), their zero points and scales.
fn weight_codes<'a>(node: &str, weight: &'a Parameter) -> Result<WeightCodes<'a>, GraphError> {
    match &weight.values {
        ParamValues::Codes { codes, quantizer } => {
            let q = &quantizer.inferable;
            check_bits(node, "its weights use", q)?;
            Ok((
                codes,
                q.qparams().zero_points().to_vec(),
                q.qparams().scales().iter().map(|s| *s as f64).collect(),
            ))
        }
        _ => Err(unsupported(
            node,
            "its weights are float; integer inference needs its weights quantized",
        )),
    }
}

fn accumulator_bias(node: &str, bias: &Parameter) -> Result<Vec<i32>, GraphError> {
    match &bias.values {
        ParamValues::Accumulator(v) => Ok(v.clone()),
        _ => Err(unsupported(
            node,
            "its bias is float; integer inference needs it in int32 at the accumulator's scale",
        )),
    }
}

/// The largest |accumulator| of each row, `Σ|w| · reach + |bias|`, checked within `i32`.
fn accumulator_bound(
    node: &str,
    centered: &[i32],
    fan_in: usize,
    bias: &[i32],
    reach: i64,
) -> Result<i64, GraphError> {
    let mut worst = 0i64;
    for (o, (row, b)) in centered.chunks(fan_in.max(1)).zip(bias).enumerate() {
        let w_abs: i64 = row.iter().map(|q| i64::from(*q).abs()).sum();
        let bound = w_abs * reach + i64::from(*b).abs();
        if bound > i64::from(i32::MAX) {
            return Err(unsupported(
                node,
                format!(
                    "output channel {o}: an i32 accumulator could overflow (|weights| sum to {w_abs}, inputs reach ±{reach}, bias {b})"
                ),
            ));
        }
        worst = worst.max(bound);
    }
    Ok(worst)
}

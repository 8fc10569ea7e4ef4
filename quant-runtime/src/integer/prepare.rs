//! Preparing a graph for the integer runtime: how each value is held, packed weights,
//! requantization multipliers, cost and memory bounds.

use quant_core::InferableQuantizer;

use quant_core::int8::nonlinear::{IntGelu, IntLayerNorm, IntSoftmax};

use super::{
    Budget, IntegerModel, Layout, Rep, StoredGrid, MAX_BITS, MAX_SAMPLE_ELEMENTS, MAX_SAMPLE_MACS,
};
use crate::graph::{Axes, Conv2dGeometry, Graph, Op, ParamValues, Parameter};
use crate::GraphError;
use quant_core::int8::{
    fixed_point_multiplier, CodeMap, DepthwiseFilter, PackedMatrix, Requantizer, SumMap,
};

/// What the runtime prepared for one node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Step {
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
    /// The node's work is part of its readers' tables ([`Quantize::Map`], [`Quantize::SumMap`],
    /// [`compose_code_maps`]): it does not run, and its output is never held.
    pub composed: bool,
}

/// The integer kernels of the ops without an exact integer form, from
/// [`quant_core::int8::nonlinear`]: what the fake-quantized model simulates.
#[derive(Debug, Clone)]
pub(crate) enum Nonlinear {
    LayerNorm(IntLayerNorm),
    Gelu(IntGelu),
    Softmax(IntSoftmax),
}

/// A quantize node, by what it reads.
#[derive(Debug, Clone)]
pub(crate) enum Quantize {
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
    /// Codes onto codes by table: a per-tensor requantization of codes, or of a GELU's output
    /// composed with the GELU ([`compose_code_maps`]).
    Map(CodeMap),
    /// The sums of two code tensors onto codes by table: a residual add composed with a
    /// per-tensor requantization of its output ([`compose_code_maps`]).
    SumMap(SumMap),
}

/// One node being prepared: what its inputs are (value numbers as
/// [`Graph::value_numbers`] gives them), and what the op's `OpRules::prepare`
/// leaves for the runtime besides the output's representation and layout.
pub(crate) struct PrepareNode<'a> {
    /// The node's name, for errors.
    pub name: &'a str,
    inputs: &'a [usize],
    output: usize,
    reps: &'a [Rep],
    layouts: &'a [Layout],
    shapes: &'a crate::graph::Shapes,
    numels: &'a [usize],
    /// What the kernel needs at run time.
    pub step: Step,
    /// Multiply-adds (or values touched) per sample.
    pub cost: u64,
    /// Bytes of one sample's im2col patches while it runs.
    pub patches: usize,
}

/// How an op's output is held: its representation and layout.
pub(crate) type Prepared = (Rep, Layout);

impl PrepareNode<'_> {
    /// How the node's `k`-th input is held.
    pub fn rep(&self, k: usize) -> &Rep {
        &self.reps[self.inputs[k]]
    }

    /// The layout of the node's `k`-th input.
    pub fn layout(&self, k: usize) -> Layout {
        self.layouts[self.inputs[k]]
    }

    /// The per-sample shape of the node's `k`-th input.
    pub fn shape(&self, k: usize) -> &[usize] {
        self.shapes.of_value(self.inputs[k])
    }

    /// The per-sample element count of the node's `k`-th input.
    pub fn numel(&self, k: usize) -> usize {
        self.numels[self.inputs[k]]
    }

    /// The per-sample shape of the node's output.
    pub fn output_shape(&self) -> &[usize] {
        self.shapes.of_value(self.output)
    }

    /// The per-sample element count of the node's output.
    pub fn output_numel(&self) -> usize {
        self.numels[self.output]
    }
}

/// A Linear or Conv2d layer.
#[derive(Debug, Clone)]
pub(crate) struct Weighted {
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
pub(crate) struct Conv {
    pub geometry: Conv2dGeometry,
    pub input: (usize, usize, usize),
    pub output: (usize, usize),
}

pub(crate) fn unsupported(node: &str, reason: impl Into<String>) -> GraphError {
    GraphError::Unsupported {
        layer: crate::graph::short(node),
        reason: reason.into(),
    }
}

/// Rejects a quantizer wider than [`MAX_BITS`]; `what` starts the reason ("it uses").
pub(crate) fn check_bits(node: &str, what: &str, q: &InferableQuantizer) -> Result<(), GraphError> {
    let bits = q.grid().bits();
    if bits > MAX_BITS {
        return Err(unsupported(
            node,
            format!("{what} {bits} bits; integer inference supports up to {MAX_BITS}"),
        ));
    }
    Ok(())
}

pub(crate) fn stored_grid(q: &InferableQuantizer) -> (StoredGrid, i32) {
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
pub(crate) fn reach(g: &StoredGrid) -> i64 {
    i64::from(g.zero - g.lo).max(i64::from(g.hi - g.zero))
}

pub(super) fn prepare(graph: &Graph, budget: Budget) -> Result<IntegerModel, GraphError> {
    prepare_with(graph, budget, true)
}

/// [`prepare`], composing code maps ([`compose_code_maps`]) or not (tests compare the two).
pub(super) fn prepare_with(
    graph: &Graph,
    budget: Budget,
    compose: bool,
) -> Result<IntegerModel, GraphError> {
    let shapes = graph.check()?;
    let n_values = graph.nodes.len() + 1;
    let (mut inputs, output) = graph.value_numbers();
    let numels: Vec<usize> = (0..n_values)
        .map(|v| shapes.of_value(v).iter().product())
        .collect();
    let mut reps = vec![Rep::Float];
    let mut layouts = vec![match (shapes.axes_of_value(0), shapes.of_value(0)) {
        (Axes::Maps, [c, h, w]) => Layout::Maps {
            c: *c,
            h: *h,
            w: *w,
        },
        (_, s) => Layout::Flat {
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
        if numels[i + 1] > MAX_SAMPLE_ELEMENTS {
            return Err(unsupported(
                name,
                format!("one sample would hold more than {MAX_SAMPLE_ELEMENTS} values here"),
            ));
        }
        if reps[a] == Rep::Float && !matches!(node.op, Op::QuantizeDequantize(_)) {
            return Err(unsupported(
                name,
                format!(
                    "it reads float values (`{}`); integer inference needs its input quantized",
                    crate::graph::short(&node.inputs[0])
                ),
            ));
        }
        let mut prepared = PrepareNode {
            name,
            inputs: &inputs[i],
            output: i + 1,
            reps: &reps,
            layouts: &layouts,
            shapes: &shapes,
            numels: &numels,
            step: Step::default(),
            cost: 0,
            patches: 0,
        };
        let (rep, layout) = node.op.rules().prepare(&mut prepared)?;
        let (step, cost) = (prepared.step, prepared.cost);
        patches_of[i] = prepared.patches;
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
    if compose {
        fold_relus(graph, &mut inputs, &reps, &mut steps, output)?;
        compose_code_maps(graph, &mut inputs, &reps, &mut steps, output)?;
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
        let held = v.checked_sub(1).is_none_or(|i| !steps[i].composed);
        usize::from(held)
            * numels[v]
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

/// Which nodes read each of `values` values, in node order.
fn readers_of(inputs: &[Vec<usize>], values: usize) -> Vec<Vec<usize>> {
    let mut readers = vec![Vec::new(); values];
    for (i, ins) in inputs.iter().enumerate() {
        for v in ins {
            readers[*v].push(i);
        }
    }
    readers
}

/// Folds a ReLU on accumulators into the requantizations that read it: each then reads the
/// ReLU's input, with its lowest code raised to what 0 gives ([`Requantizer::after_relu`]),
/// and computes the same codes; the ReLU does not run once nothing else reads it. That saves
/// a pass over the accumulators after most convolutions of a residual network.
fn fold_relus(
    graph: &Graph,
    inputs: &mut [Vec<usize>],
    reps: &[Rep],
    steps: &mut [Step],
    output: usize,
) -> Result<(), GraphError> {
    let readers = readers_of(inputs, reps.len());
    for i in 0..steps.len() {
        let Some(v) = inputs[i].first().copied() else {
            continue;
        };
        let Some(j) = v.checked_sub(1) else { continue };
        let Some(relu_input) = inputs[j].first().copied() else {
            continue;
        };
        if !matches!(graph.nodes[j].op, Op::Relu) || !matches!(reps[relu_input], Rep::Acc { .. }) {
            continue;
        }
        let Some(Quantize::Requantize {
            requantizer,
            input_zero: None,
        }) = &mut steps[i].quantize
        else {
            continue;
        };
        *requantizer = requantizer.after_relu().map_err(|e| {
            unsupported(&graph.nodes[i].name, format!("a ReLU folded into it: {e}"))
        })?;
        inputs[i][0] = relu_input;
        if v != output && readers[v].iter().all(|r| !inputs[*r].contains(&v)) {
            inputs[j].clear();
            steps[j] = Step {
                composed: true,
                ..Step::default()
            };
        }
    }
    Ok(())
}

/// Turns per-tensor requantizations whose input is a function of one code, or of the sum of
/// two, into tables ([`Quantize::Map`], [`Quantize::SumMap`]): a requantization of codes; one
/// whose input is a GELU's output that nothing else reads (GELU of a code depends on that code
/// alone); and those of a residual add of two code tensors (`x + y - 2z`) that only such
/// requantizations read. They then read the GELU's or the add's inputs, and the GELU or the
/// add does not run. The tables come from the kernels themselves, run once on every input
/// code or sum, so the model computes the same codes as without them. Only for input grids of
/// at most [`CodeMap::SHUFFLE_CODES`] codes, where the tables run vectorized.
fn compose_code_maps(
    graph: &Graph,
    inputs: &mut [Vec<usize>],
    reps: &[Rep],
    steps: &mut [Step],
    output: usize,
) -> Result<(), GraphError> {
    let readers = readers_of(inputs, reps.len());
    let per_tensor = |step: &Step| match &step.quantize {
        Some(Quantize::Requantize {
            requantizer,
            input_zero: None,
        }) => requantizer.channels() == 1,
        _ => false,
    };
    // Decided before any reader changes.
    let only_requantized: Vec<bool> = (readers.iter())
        .map(|rs| rs.iter().all(|r| per_tensor(&steps[*r])))
        .collect();
    for i in 0..steps.len() {
        let Some(Quantize::Requantize {
            requantizer,
            input_zero,
        }) = &steps[i].quantize
        else {
            continue;
        };
        if requantizer.channels() != 1 {
            continue;
        }
        let v = inputs[i][0];
        let name = graph.nodes[i].name.as_str();
        let failed = |e: quant_core::QuantError| unsupported(name, format!("code map: {e}"));
        // What the requantization reads, as a function of which codes: the values it then
        // reads, the accumulators of each input code (or sum), and the node it replaces.
        let (sources, grid, acc, replaced) = match (input_zero, v.checked_sub(1)) {
            (Some(zero), _) => {
                let Rep::Codes(g) = &reps[v] else { continue };
                let acc = (g.lo..=g.hi).map(|c| c - zero).collect();
                (vec![v], *g, acc, None)
            }
            (None, Some(j)) if v != output => match (&graph.nodes[j].op, &steps[j].nonlinear) {
                (Op::Gelu, Some(Nonlinear::Gelu(k))) if readers[v] == [i] => {
                    let Rep::Codes(g) = &reps[inputs[j][0]] else {
                        continue;
                    };
                    let codes: Vec<u8> = (g.lo..=g.hi).map(|c| c as u8).collect();
                    let mut acc = vec![0; codes.len()];
                    k.run(&codes, &mut acc).map_err(failed)?;
                    (inputs[j].clone(), *g, acc, Some(j))
                }
                (Op::Add, _) if only_requantized[v] => {
                    let Rep::Codes(g) = &reps[inputs[j][0]] else {
                        continue;
                    };
                    // The add's sums `x + y - 2z`, each sum of two codes once.
                    let acc = (2 * g.lo..=2 * g.hi).map(|s| s - 2 * g.zero).collect();
                    (inputs[j].clone(), *g, acc, Some(j))
                }
                _ => continue,
            },
            (None, _) => continue,
        };
        // Wider grids would read the table one value at a time: slower than the requantization
        // (the W8A8 MNIST ViT took 1.25x its time with its residual adds composed so).
        if (grid.hi - grid.lo) as usize >= CodeMap::SHUFFLE_CODES {
            continue;
        }
        let mut mapped = vec![0u8; acc.len()];
        requantizer.run(&acc, &mut mapped).map_err(failed)?;
        let codes = grid.lo as u8..=grid.hi as u8;
        steps[i].quantize = Some(if sources.len() == 2 {
            Quantize::SumMap(SumMap::new(codes, &mapped).map_err(failed)?)
        } else {
            Quantize::Map(CodeMap::new(codes, &mapped).map_err(failed)?)
        });
        inputs[i] = sources;
        // The replaced node runs no more once none of its readers reads it.
        if let Some(j) = replaced {
            if readers[v].iter().all(|r| inputs[*r][0] != v) {
                inputs[j].clear();
                steps[j] = Step {
                    composed: true,
                    ..Step::default()
                };
            }
        }
    }
    Ok(())
}

/// An error unless values up to `bound` (`what` they are) fit an `i32` accumulator.
pub(crate) fn within_i32(node: &str, bound: i64, what: &str) -> Result<(), GraphError> {
    if bound > i64::from(i32::MAX) {
        return Err(unsupported(
            node,
            format!("{what} up to {bound} could overflow an i32 accumulator"),
        ));
    }
    Ok(())
}

/// The grid of codes an op needs as its input, or why it cannot run.
pub(crate) fn codes_in(node: &str, rep: &Rep, what: &str) -> Result<StoredGrid, GraphError> {
    match rep {
        Rep::Codes(g) => Ok(*g),
        _ => Err(unsupported(
            node,
            format!("{what} needs its input quantized to run on integers; quantize it (its layer's input slot)"),
        )),
    }
}

/// The requantization of values at `scales` (per channel, or one) into `grid`, for
/// accumulators within `±bound` where that is known (faster paths, never other codes).
pub(crate) fn requantizer(
    node: &str,
    scales: &[f64],
    bound: Option<i64>,
    grid: &StoredGrid,
) -> Result<Requantizer, GraphError> {
    let multipliers = scales
        .iter()
        .map(|s| fixed_point_multiplier(s / grid.scale))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unsupported(node, format!("requantizing into this grid: {e}")))?;
    let requantizer = Requantizer::new(&multipliers, grid.zero, grid.lo, grid.hi, grid.rounding)?;
    Ok(match bound {
        Some(b) => requantizer.with_accumulator_bound(b.unsigned_abs()),
        None => requantizer,
    })
}

/// A weight's codes, their zero points (one, or one per output channel) and scales.
pub(crate) type WeightCodes<'a> = (&'a [i32], Vec<i32>, Vec<f64>);

/// Weight codes (at most [`MAX_BITS`]), their zero points and scales.
pub(crate) fn weight_codes<'a>(
    node: &str,
    weight: &'a Parameter,
) -> Result<WeightCodes<'a>, GraphError> {
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

pub(crate) fn accumulator_bias(node: &str, bias: &Parameter) -> Result<Vec<i32>, GraphError> {
    match &bias.values {
        ParamValues::Accumulator(v) => Ok(v.clone()),
        _ => Err(unsupported(
            node,
            "its bias is float; integer inference needs it in int32 at the accumulator's scale",
        )),
    }
}

/// The largest |accumulator| of each row, `Σ|w| · reach + |bias|`, checked within `i32`.
pub(crate) fn accumulator_bound(
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use quant_core::{
        InferableQuantizer, IntegerGrid, QParams, QuantizationMethod, RoundingPolicy,
    };

    use super::{prepare_with, Quantize};
    use crate::graph::{
        ExportedQuantizer, Graph, GraphBuilder, Op, QuantizeDequantize, QuantizerOrigin,
    };
    use crate::integer::Budget;
    use crate::integer::IntegerModel;

    fn qdq(bits: u32, signed: bool, scale: f32, zero: i32) -> Op {
        let method = if signed {
            QuantizationMethod::Symmetric
        } else {
            QuantizationMethod::Uniform
        };
        let grid = IntegerGrid::new(bits, signed, false).unwrap();
        let qparams = QParams::per_tensor(scale, zero).unwrap();
        let inferable =
            InferableQuantizer::new(method, grid, RoundingPolicy::HalfEven, qparams).unwrap();
        Op::QuantizeDequantize(QuantizeDequantize {
            quantizer: ExportedQuantizer {
                inferable,
                origin: QuantizerOrigin {
                    training_method: "Ste".into(),
                    quantizer: None,
                    bits,
                    method,
                },
            },
        })
    }

    /// ReLUs on accumulators fold into the requantizations that read them, zero points above
    /// the grid's bottom included (where the raised lowest code matters): one read only by a
    /// requantization stops running, one also read by another ReLU runs on; the codes are the
    /// unfolded model's.
    #[test]
    fn relus_fold_into_requantizations_with_the_same_bits() {
        let mut g = GraphBuilder::new(&[4, 24]).unwrap();
        let x = g.input();
        let codes = g.add("in", qdq(8, false, 0.05, 128), &[x]).unwrap();
        let a = g.add("a", qdq(8, true, 0.25, 0), &[codes]).unwrap();
        let b = g.add("b", qdq(8, true, 0.25, 0), &[a]).unwrap();
        let s1 = g.add("s1", Op::Add, &[a, b]).unwrap();
        let r1 = g.add("r1", Op::Relu, &[s1]).unwrap();
        let q1 = g.add("q1", qdq(8, false, 0.03, 100), &[r1]).unwrap();
        let c = g.add("c", qdq(8, true, 0.2, 0), &[q1]).unwrap();
        let d = g.add("d", qdq(8, true, 0.2, 0), &[a]).unwrap();
        let s2 = g.add("s2", Op::Add, &[c, d]).unwrap();
        let r2 = g.add("r2", Op::Relu, &[s2]).unwrap();
        let q2 = g.add("q2", qdq(8, false, 0.04, 60), &[r2]).unwrap();
        let r3 = g.add("r3", Op::Relu, &[r2]).unwrap();
        let q3 = g.add("q3", qdq(8, false, 0.05, 0), &[r3]).unwrap();
        let e = g.add("e", qdq(8, true, 0.1, 0), &[q2]).unwrap();
        let f = g.add("f", qdq(8, true, 0.1, 0), &[q3]).unwrap();
        let out = g.add("out", Op::Add, &[e, f]).unwrap();
        let graph = g.finish(out, BTreeMap::new()).unwrap();
        let (_, composed) = composed_with_the_same_bits(&graph);
        assert_eq!(composed, ["r1", "r3"]);
    }

    /// A GELU read by one per-tensor requantization, a requantization of codes, a GELU read
    /// twice (left as it is), residual adds read only by per-tensor requantizations (composed),
    /// one of them through a ReLU that folds into its requantization ([`fold_relus`]), an add
    /// that is the output, and 8-bit inputs (left): the model with code maps gives the bits of
    /// the one without, and never holds more at once.
    #[test]
    fn code_maps_give_the_same_bits() {
        let mut g = GraphBuilder::new(&[4, 24]).unwrap();
        let x = g.input();
        let codes = g.add("in", qdq(8, false, 0.05, 128), &[x]).unwrap();
        let g1 = g.add("g1", Op::Gelu, &[codes]).unwrap();
        let q1 = g.add("q1", qdq(4, true, 0.4, 0), &[g1]).unwrap();
        let g2 = g.add("g2", Op::Gelu, &[q1]).unwrap();
        let q2 = g.add("q2", qdq(8, false, 0.02, 20), &[g2]).unwrap();
        let q3 = g.add("q3", qdq(4, false, 0.3, 2), &[q2]).unwrap();
        let q4 = g.add("q4", qdq(4, true, 0.35, 0), &[q3]).unwrap();
        let g3 = g.add("g3", Op::Gelu, &[q4]).unwrap();
        let a = g.add("a", qdq(4, true, 0.25, 0), &[g3]).unwrap();
        let b = g.add("b", qdq(4, true, 0.25, 0), &[g3]).unwrap();
        let sum1 = g.add("sum1", Op::Add, &[a, b]).unwrap();
        let r1 = g.add("r1", qdq(4, false, 0.5, 7), &[sum1]).unwrap();
        let r2 = g.add("r2", qdq(4, false, 0.5, 7), &[sum1]).unwrap();
        let sum2 = g.add("sum2", Op::Add, &[r1, r2]).unwrap();
        let relu = g.add("relu", Op::Relu, &[sum2]).unwrap();
        let q5 = g.add("q5", qdq(8, false, 0.03, 9), &[sum2]).unwrap();
        let q6 = g.add("q6", qdq(8, false, 0.03, 9), &[relu]).unwrap();
        let sum3 = g.add("sum3", Op::Add, &[q5, q6]).unwrap();
        let graph = g.finish(sum3, BTreeMap::new()).unwrap();
        let (mapped, composed) = composed_with_the_same_bits(&graph);
        assert_eq!(composed, ["g2", "sum1", "sum2", "relu"]);
        let kinds: Vec<(&str, &str)> = (graph.nodes.iter().zip(&mapped.steps))
            .filter_map(|(n, s)| {
                let kind = match s.quantize.as_ref()? {
                    Quantize::Map(_) => "map",
                    Quantize::SumMap(_) => "sum map",
                    _ => "requantize",
                };
                Some((n.name.as_str(), kind))
            })
            .collect();
        let expected = [
            ("in", "requantize"),
            ("q1", "requantize"),
            ("q2", "map"),
            ("q3", "requantize"),
            ("q4", "map"),
            ("a", "requantize"),
            ("b", "requantize"),
            ("r1", "sum map"),
            ("r2", "sum map"),
            ("q5", "sum map"),
            ("q6", "sum map"),
        ];
        assert_eq!(kinds, expected);
    }

    /// `graph` prepared with the passes that compose and fold nodes, after checking that it
    /// gives the bits of `graph` prepared without them on values over the input grid's range
    /// and beyond it (±8 against ±6.4), and never holds more at once; with the names of the
    /// nodes that no longer run.
    fn composed_with_the_same_bits(graph: &Graph) -> (IntegerModel, Vec<String>) {
        let plain = prepare_with(graph, Budget::default(), false).unwrap();
        let composed = prepare_with(graph, Budget::default(), true).unwrap();
        assert!(plain.steps.iter().all(|s| !s.composed));
        assert!(composed.working_bytes_per_sample() <= plain.working_bytes_per_sample());
        let xs: Vec<f32> = (0..37 * 96u32)
            .map(|i| ((i.wrapping_mul(2654435761) >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 16.0)
            .collect();
        let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let expected = bits(plain.forward(&xs).unwrap());
        assert_eq!(bits(composed.forward(&xs).unwrap()), expected);
        // Not a model that ignores its input.
        let ys: Vec<f32> = xs.iter().map(|v| -v).collect();
        assert_ne!(bits(plain.forward(&ys).unwrap()), expected);
        let names = (graph.nodes.iter().zip(&composed.steps))
            .filter(|(_, s)| s.composed)
            .map(|(n, _)| n.name.clone())
            .collect();
        (composed, names)
    }
}

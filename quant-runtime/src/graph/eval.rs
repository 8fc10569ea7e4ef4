//! The float reference interpreter of the graph IR: what the fake-quantized model computes,
//! op by op in `f32` (quantized values are quantized and dequantized, weights are their
//! dequantized codes, accumulator biases their float values). Reports measure each layer's
//! output with it; export formats are checked against it.
//!
//! It is written for clarity, not speed: plain loops in the order the ops are defined.

use quant_core::{QuantError, Result};

use super::{ExportedQuantizer, Graph, Op, ParamValues, Parameter};

/// The result of [`evaluate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The graph's output, `batch × output elements`.
    pub output: Vec<f32>,
    /// The output of each node `keep` selected, in node order: `(node name, values)`.
    pub kept: Vec<(String, Vec<f32>)>,
}

/// Runs `graph` in `f32` on `x` (whole samples of the input shape) and returns its output and
/// the outputs of the nodes for which `keep(node index, op)` is true.
///
/// # Errors
/// An invalid graph ([`Graph::check`]), or `x` not a whole number of samples.
pub fn evaluate(graph: &Graph, x: &[f32], keep: &dyn Fn(usize, &Op) -> bool) -> Result<Evaluation> {
    Ok(evaluate_rewriting(graph, x, keep, &mut |_, _| Ok(None))?.0)
}

/// What [`evaluate_rewriting`]'s hook sees of a node about to run: its input value (the first,
/// whole batch) and that value's per-sample shape.
pub struct NodeInput<'a> {
    /// The node's first input, `samples × per-sample elements`.
    pub values: &'a [f32],
    /// Its per-sample shape.
    pub shape: &'a [usize],
    /// Samples in the batch.
    pub samples: usize,
}

/// [`evaluate`], letting `rewrite(node index, input)` replace each node's op just before it runs
/// (with an op of the same kind and shapes): later nodes then see the rewritten node's output.
/// Returns the evaluation and the replaced ops, `(node index, op)` in node order. Learned
/// rounding uses it to fit each layer on the outputs of the layers already fitted.
///
/// # Errors
/// As [`evaluate`]; the first error of `rewrite`.
#[allow(clippy::type_complexity)]
pub fn evaluate_rewriting(
    graph: &Graph,
    x: &[f32],
    keep: &dyn Fn(usize, &Op) -> bool,
    rewrite: &mut dyn FnMut(usize, NodeInput<'_>) -> Result<Option<Op>>,
) -> Result<(Evaluation, Vec<(usize, Op)>)> {
    let shapes = graph.check().map_err(|e| QuantError::InvalidValue {
        what: "graph".into(),
        value: "(graph)".into(),
        expected: e.to_string(),
    })?;
    let in_numel: usize = shapes.input.iter().product();
    if !x.len().is_multiple_of(in_numel) {
        return Err(QuantError::LengthMismatch {
            what: format!("input (whole samples of {:?})", shapes.input),
            expected: x.len().div_ceil(in_numel) * in_numel,
            actual: x.len(),
        });
    }
    let n = x.len() / in_numel;
    // Value 0 is the input, value i + 1 node i's output; freed after their last use.
    let count = graph.nodes.len() + 1;
    let (inputs, output) = graph.value_numbers();
    let mut last_use = vec![0usize; count];
    for (i, ins) in inputs.iter().enumerate() {
        for &v in ins {
            last_use[v] = i + 1;
        }
    }
    last_use[output] = usize::MAX;
    let mut values: Vec<Option<Vec<f32>>> = vec![None; count];
    values[0] = Some(x.to_vec());
    let mut kept = Vec::new();
    let mut rewritten = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let a = inputs[i][0];
        let xs = values[a].as_deref().unwrap_or(&[]);
        let in_shape = shapes.of_value(a);
        let replaced = rewrite(
            i,
            NodeInput {
                values: xs,
                shape: in_shape,
                samples: n,
            },
        )?;
        let op = replaced.as_ref().unwrap_or(&node.op);
        let node_inputs: Vec<&[f32]> = inputs[i]
            .iter()
            .map(|&v| values[v].as_deref().unwrap_or(&[]))
            .collect();
        let input_quantizer = a.checked_sub(1).and_then(|p| match &graph.nodes[p].op {
            Op::QuantizeDequantize(q) => Some(&q.quantizer),
            _ => None,
        });
        let y = op.rules().evaluate(&EvalNode {
            name: &node.name,
            inputs: node_inputs,
            shapes: inputs[i].iter().map(|&v| shapes.of_value(v)).collect(),
            output_shape: shapes.of_value(i + 1),
            samples: n,
            input_quantizer,
        })?;
        if keep(i, op) {
            kept.push((node.name.clone(), y.clone()));
        }
        if let Some(op) = replaced {
            rewritten.push((i, op));
        }
        values[i + 1] = Some(y);
        for &v in &inputs[i] {
            if last_use[v] == i + 1 {
                values[v] = None;
            }
        }
    }
    Ok((
        Evaluation {
            output: values[output].take().unwrap_or_default(),
            kept,
        },
        rewritten,
    ))
}

/// One node as the float reference runs it: its inputs' values and shapes, whole batches.
pub(crate) struct EvalNode<'a> {
    /// The node's name, for errors.
    pub name: &'a str,
    /// Each input's values, `samples × per-sample elements`.
    pub inputs: Vec<&'a [f32]>,
    /// Each input's per-sample shape.
    pub shapes: Vec<&'a [usize]>,
    /// The output's per-sample shape.
    pub output_shape: &'a [usize],
    /// Samples in the batch.
    pub samples: usize,
    /// The quantizer of the `QuantizeDequantize` node producing the first input, if one does
    /// (an accumulator bias is at its scale).
    pub input_quantizer: Option<&'a ExportedQuantizer>,
}

/// The values of a float parameter; an error naming the op and node otherwise.
pub(crate) fn float_values<'a>(op: &str, node: &str, p: &'a Parameter) -> Result<&'a [f32]> {
    match &p.values {
        ParamValues::Float(v) => Ok(v),
        _ => Err(QuantError::InvalidValue {
            what: format!("{op} parameter"),
            value: node.to_string(),
            expected: "float values".into(),
        }),
    }
}

/// The float values of an op's `(scale, shift)` parameters (ChannelAffine, LayerNorm); an
/// error naming the op and node when either is not float.
pub(crate) fn float_pair<'a>(
    op: &str,
    node: &str,
    scale: &'a Parameter,
    shift: &'a Parameter,
) -> Result<(&'a [f32], &'a [f32])> {
    match (&scale.values, &shift.values) {
        (ParamValues::Float(s), ParamValues::Float(t)) => Ok((s, t)),
        _ => Err(QuantError::InvalidValue {
            what: format!("{op} parameters"),
            value: node.to_string(),
            expected: "float values".into(),
        }),
    }
}

/// The values a weight computes with: float values, or dequantized codes.
pub(crate) fn dequantized(p: &Parameter, shape: &[usize]) -> Result<Vec<f32>> {
    match &p.values {
        ParamValues::Float(v) => Ok(v.clone()),
        ParamValues::Codes { codes, quantizer } => quantizer.inferable.dequantize(codes, shape),
        ParamValues::Accumulator(_) => Err(QuantError::InvalidValue {
            what: "weight encoding".into(),
            value: p.tensor.clone(),
            expected: "float or codes".into(),
        }),
    }
}

/// The float bias: its values, or the accumulator values times `s_input · s_weight[o]`.
pub(crate) fn bias_values(
    node: &EvalNode<'_>,
    bias: &Parameter,
    weight: &Parameter,
) -> Result<Vec<f32>> {
    match &bias.values {
        ParamValues::Float(v) => Ok(v.clone()),
        ParamValues::Accumulator(v) => match (node.input_quantizer, weight.values.quantizer()) {
            (Some(qi), Some(qw)) => Ok(quant_core::accumulator::accumulator_to_float(
                v,
                qi.inferable.qparams().scales()[0],
                qw.inferable.qparams().scales(),
            )),
            _ => Err(QuantError::InvalidValue {
                what: "bias".into(),
                value: bias.tensor.clone(),
                expected: "an accumulator bias after a quantized input, with quantized weights"
                    .into(),
            }),
        },
        ParamValues::Codes { .. } => Err(QuantError::InvalidValue {
            what: "bias encoding".into(),
            value: bias.tensor.clone(),
            expected: "float or accumulator".into(),
        }),
    }
}

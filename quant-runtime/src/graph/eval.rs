//! The float reference interpreter of the graph IR: what the fake-quantized model computes,
//! op by op in `f32` (quantized values are quantized and dequantized, weights are their
//! dequantized codes, accumulator biases their float values). Reports measure each layer's
//! output with it; export formats are checked against it.
//!
//! It is written for clarity, not speed: plain loops in the order the ops are defined.

use quant_core::{QuantError, Result};

use super::ops::{out_len, taps};
use super::{Conv2dGeometry, Graph, Op, ParamValues, Parameter, PoolGeometry};

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
        let y = match op {
            Op::QuantizeDequantize { quantizer } => {
                quantizer.inferable.fake_quantize(xs, &[xs.len()])?
            }
            Op::Relu => xs.iter().map(|v| v.max(0.0)).collect(),
            Op::Tanh => xs.iter().map(|v| v.tanh()).collect(),
            Op::Sigmoid => xs.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
            Op::Flatten => xs.to_vec(),
            Op::Gelu => xs.iter().map(|v| gelu(*v)).collect(),
            Op::Softmax => {
                let row = in_shape.last().copied().unwrap_or(1).max(1);
                xs.chunks_exact(row).flat_map(softmax).collect()
            }
            Op::ImageTokens { position } => {
                let p = float_values("ImageTokens", &node.name, position)?;
                let (c, hw) = (in_shape[0], in_shape[1] * in_shape[2]);
                let mut y = Vec::with_capacity(xs.len());
                for sample in xs.chunks_exact(c * hw) {
                    for t in 0..hw {
                        y.extend((0..c).map(|ch| sample[ch * hw + t] + p[t * c + ch]));
                    }
                }
                y
            }
            Op::MeanTokens => {
                let (tokens, c) = (in_shape[0], in_shape[1]);
                let mut y = Vec::with_capacity(n * c);
                for sample in xs.chunks_exact(tokens * c) {
                    y.extend((0..c).map(|ch| {
                        (0..tokens).map(|t| sample[t * c + ch]).sum::<f32>() / tokens as f32
                    }));
                }
                y
            }
            Op::AttentionScores { heads } => {
                let k = values[inputs[i][1]].as_deref().unwrap_or(&[]);
                let [s2, _] = shapes.of_value(inputs[i][1]) else {
                    unreachable!("checked: keys are [tokens, features]")
                };
                attention_scores(xs, k, n, in_shape, *s2, *heads)
            }
            Op::AttentionContext { heads } => {
                let v = values[inputs[i][1]].as_deref().unwrap_or(&[]);
                attention_context(xs, v, n, in_shape, shapes.of_value(inputs[i][1]), *heads)
            }
            Op::GlobalAvgPool | Op::GlobalMaxPool => {
                let plane: usize = in_shape[1..].iter().product();
                xs.chunks_exact(plane.max(1))
                    .map(|p| match op {
                        Op::GlobalAvgPool => p.iter().sum::<f32>() / plane as f32,
                        _ => p.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    })
                    .collect()
            }
            Op::LayerNorm {
                scale,
                shift,
                epsilon,
            } => {
                let (g, b) = float_pair("LayerNorm", &node.name, scale, shift)?;
                let f = g.len().max(1);
                let mut y = Vec::with_capacity(xs.len());
                for row in xs.chunks_exact(f) {
                    let mean = row.iter().sum::<f32>() / f as f32;
                    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / f as f32;
                    let inv = 1.0 / (var + *epsilon as f32).sqrt();
                    y.extend(
                        row.iter()
                            .zip(g)
                            .zip(b)
                            .map(|((v, g), b)| (v - mean) * inv * g + b),
                    );
                }
                y
            }
            Op::Add => {
                let b = values[inputs[i][1]].as_deref().unwrap_or(&[]);
                xs.iter().zip(b).map(|(x, y)| x + y).collect()
            }
            Op::Linear {
                in_features,
                out_features,
                weight,
                bias,
            } => {
                let w = dequantized(weight, &[*out_features, *in_features])?;
                let b = bias_values(graph, &inputs[i], bias, weight)?;
                linear(xs, &w, &b, *in_features, *out_features)
            }
            Op::Conv2d {
                geometry,
                weight,
                bias,
            } => {
                let w = dequantized(weight, &geometry.weight_shape())?;
                let b = bias_values(graph, &inputs[i], bias, weight)?;
                conv2d(xs, n, in_shape, shapes.of_value(i + 1), geometry, &w, &b)
            }
            Op::ChannelAffine { scale, shift } => {
                let (s, t) = float_pair("ChannelAffine", &node.name, scale, shift)?;
                let c = in_shape[0];
                let per: usize = in_shape[1..].iter().product();
                xs.iter()
                    .enumerate()
                    .map(|(k, v)| {
                        let ch = (k / per) % c;
                        v * s[ch] + t[ch]
                    })
                    .collect()
            }
            Op::MaxPool2d(p) => pool(xs, n, in_shape, shapes.of_value(i + 1), p, true),
            Op::AvgPool2d(p) => pool(xs, n, in_shape, shapes.of_value(i + 1), p, false),
        };
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

/// `x · Φ(x)`, in `f64`.
fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (x * quant_core::int8::nonlinear::normal_cdf(x)) as f32
}

/// The softmax of one row, in `f64`.
fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
    let e: Vec<f64> = row.iter().map(|v| (*v as f64 - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| (v / sum) as f32).collect()
}

/// `[heads, s1, s2]` scores of queries `[s1, f]` and keys `[s2, f]` per sample.
fn attention_scores(
    q: &[f32],
    k: &[f32],
    n: usize,
    q_shape: &[usize],
    s2: usize,
    heads: usize,
) -> Vec<f32> {
    let (s1, f) = (q_shape[0], q_shape[1]);
    let d = f / heads;
    let scale = 1.0 / (d as f32).sqrt();
    let mut y = Vec::with_capacity(n * heads * s1 * s2);
    for b in 0..n {
        let (qs, ks) = (&q[b * s1 * f..], &k[b * s2 * f..]);
        for h in 0..heads {
            for i in 0..s1 {
                for j in 0..s2 {
                    let dot: f32 = (0..d)
                        .map(|e| qs[i * f + h * d + e] * ks[j * f + h * d + e])
                        .sum();
                    y.push(dot * scale);
                }
            }
        }
    }
    y
}

/// `[s1, f]` weighted sums of values `[s2, f]` by probabilities `[heads, s1, s2]` per sample.
fn attention_context(
    p: &[f32],
    v: &[f32],
    n: usize,
    p_shape: &[usize],
    v_shape: &[usize],
    heads: usize,
) -> Vec<f32> {
    let (s1, s2, f) = (p_shape[1], p_shape[2], v_shape[1]);
    let d = f / heads;
    let mut y = vec![0f32; n * s1 * f];
    for b in 0..n {
        let (ps, vs) = (&p[b * heads * s1 * s2..], &v[b * s2 * f..]);
        let ys = &mut y[b * s1 * f..(b + 1) * s1 * f];
        for h in 0..heads {
            for i in 0..s1 {
                for e in 0..d {
                    ys[i * f + h * d + e] = (0..s2)
                        .map(|j| ps[(h * s1 + i) * s2 + j] * vs[j * f + h * d + e])
                        .sum();
                }
            }
        }
    }
    y
}

/// The values of a float parameter; an error naming the op and node otherwise.
fn float_values<'a>(op: &str, node: &str, p: &'a Parameter) -> Result<&'a [f32]> {
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
fn float_pair<'a>(
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
fn dequantized(p: &Parameter, shape: &[usize]) -> Result<Vec<f32>> {
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
fn bias_values(
    graph: &Graph,
    inputs: &[usize],
    bias: &Parameter,
    weight: &Parameter,
) -> Result<Vec<f32>> {
    match &bias.values {
        ParamValues::Float(v) => Ok(v.clone()),
        ParamValues::Accumulator(v) => {
            let input_quantizer = inputs.first().and_then(|i| i.checked_sub(1)).and_then(|i| {
                match &graph.nodes[i].op {
                    Op::QuantizeDequantize { quantizer } => Some(quantizer),
                    _ => None,
                }
            });
            match (input_quantizer, weight.values.quantizer()) {
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
            }
        }
        ParamValues::Codes { .. } => Err(QuantError::InvalidValue {
            what: "bias encoding".into(),
            value: bias.tensor.clone(),
            expected: "float or accumulator".into(),
        }),
    }
}

/// `y[r][o] = Σ_i x[r][i]·w[o][i] + b[o]` over rows of `k` values.
fn linear(x: &[f32], w: &[f32], b: &[f32], k: usize, outs: usize) -> Vec<f32> {
    let rows = x.len() / k;
    let mut y = Vec::with_capacity(rows * outs);
    for row in x.chunks_exact(k) {
        for (o, wr) in w.chunks_exact(k).enumerate() {
            let s: f32 = row.iter().zip(wr).map(|(a, c)| a * c).sum();
            y.push(s + b[o]);
        }
    }
    y
}

/// Direct grouped convolution with zero padding, NCHW.
fn conv2d(
    x: &[f32],
    n: usize,
    in_shape: &[usize],
    out_shape: &[usize],
    g: &Conv2dGeometry,
    w: &[f32],
    b: &[f32],
) -> Vec<f32> {
    let (c, h, wd) = (in_shape[0], in_shape[1], in_shape[2]);
    let (o, oh, ow) = (out_shape[0], out_shape[1], out_shape[2]);
    let (k, s, p) = (g.kernel, g.stride, g.padding);
    let cg = g.group_in_channels();
    let og = o / g.groups.max(1);
    let mut y = vec![0f32; n * o * oh * ow];
    for bi in 0..n {
        let xs = &x[bi * c * h * wd..(bi + 1) * c * h * wd];
        for oc in 0..o {
            let group = oc / og;
            let wk = &w[oc * cg * k * k..(oc + 1) * cg * k * k];
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0f32;
                    for ci in 0..cg {
                        let ch = group * cg + ci;
                        for (ky, iy) in taps(oy, k, s, p, h) {
                            for (kx, ix) in taps(ox, k, s, p, wd) {
                                acc += xs[(ch * h + iy) * wd + ix] * wk[(ci * k + ky) * k + kx];
                            }
                        }
                    }
                    y[((bi * o + oc) * oh + oy) * ow + ox] = acc + b[oc];
                }
            }
        }
    }
    y
}

/// Max or average pooling, NCHW; padding never wins a max and counts as zero in an average.
fn pool(
    x: &[f32],
    n: usize,
    in_shape: &[usize],
    out_shape: &[usize],
    g: &PoolGeometry,
    max: bool,
) -> Vec<f32> {
    let (c, h, w) = (in_shape[0], in_shape[1], in_shape[2]);
    let (oh, ow) = (out_shape[1], out_shape[2]);
    debug_assert_eq!(Some(oh), out_len(h, g.kernel, g.stride, g.padding));
    let (k, s, p) = (g.kernel, g.stride, g.padding);
    let mut y = Vec::with_capacity(n * c * oh * ow);
    for plane in x.chunks_exact(h * w).take(n * c) {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best = f32::NEG_INFINITY;
                let mut sum = 0f32;
                for (_, iy) in taps(oy, k, s, p, h) {
                    for (_, ix) in taps(ox, k, s, p, w) {
                        let v = plane[iy * w + ix];
                        best = best.max(v);
                        sum += v;
                    }
                }
                y.push(if max { best } else { sum / (k * k) as f32 });
            }
        }
    }
    y
}

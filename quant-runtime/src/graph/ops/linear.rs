//! `Linear`: `y = x·Wᵀ + b` over the last axis.

use serde::{Deserialize, Serialize};

use super::{check_bias, single, OpRules};
use crate::export::onnx::writer::{int_attr, OnnxNode, Writer};
use crate::graph::eval::{bias_values, dequantized, EvalNode};
use crate::graph::params::check_parameter;
use crate::graph::{Parameter, MAX_ELEMENTS};
use crate::integer::prepare::{
    accumulator_bias, accumulator_bound, reach, unsupported, weight_codes, PrepareNode, Prepared,
};
use crate::integer::{Layout, Rep, Weighted};
use crate::GraphError;
use quant_core::int8::PackedMatrix;

/// `y = x·Wᵀ + b` over the last axis: weight `[out_features, in_features]`, bias
/// `[out_features]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Linear {
    /// Input features (the input's last axis).
    pub in_features: usize,
    /// Output features.
    pub out_features: usize,
    /// Weight, float or codes.
    pub weight: Parameter,
    /// Bias, float or accumulator values.
    pub bias: Parameter,
}

impl Linear {
    /// The shapes of the weight and the bias.
    pub(crate) fn weight_and_bias_shapes(&self) -> [Vec<usize>; 2] {
        [
            vec![self.out_features, self.in_features],
            vec![self.out_features],
        ]
    }
}

impl OpRules for Linear {
    fn name(&self) -> &'static str {
        "Linear"
    }

    fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String> {
        let (in_features, out_features) = (self.in_features, self.out_features);
        let x = single(inputs, "Linear")?;
        if x.last() != Some(&in_features) {
            return Err(format!(
                "receives {x:?}; expects {in_features} features on the last axis"
            ));
        }
        let numel = in_features
            .checked_mul(out_features)
            .filter(|n| *n > 0 && *n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                format!(
                    "weight [{out_features}, {in_features}] is empty or holds more than {MAX_ELEMENTS} values"
                )
            })?;
        if values {
            check_parameter(
                &self.weight,
                "weight",
                numel,
                out_features,
                &["float", "codes"],
            )?;
            check_bias(&self.bias, &self.weight, out_features)?;
        }
        let mut y = x.to_vec();
        if let Some(last) = y.last_mut() {
            *last = out_features;
        }
        Ok(y)
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let (k, outs) = (self.in_features, self.out_features);
        let w = dequantized(&self.weight, &[outs, k])?;
        let b = bias_values(node, &self.bias, &self.weight)?;
        // `y[r][o] = Σ_i x[r][i]·w[o][i] + b[o]` over rows of `k` values, each sum in order of
        // `i` from -0.0 (as `Iterator::sum` adds), then the bias. The outputs of a row run side
        // by side over the transposed weights, each its own sequence of additions: the same
        // bits as one sum per output, in lanes the compiler can vectorise.
        let x = node.inputs[0];
        // The shape check refuses an empty weight; nothing to compute (or divide by) if one
        // came through.
        if k == 0 || outs == 0 {
            return Ok(Vec::new());
        }
        let mut transposed = vec![0f32; k * outs];
        for (o, wr) in w.chunks_exact(k).enumerate().take(outs) {
            for (i, v) in wr.iter().enumerate() {
                transposed[i * outs + o] = *v;
            }
        }
        let mut y = vec![-0.0f32; x.len() / k * outs];
        for (row, out) in x.chunks_exact(k).zip(y.chunks_exact_mut(outs)) {
            for (a, wt) in row.iter().zip(transposed.chunks_exact(outs)) {
                for (acc, c) in out.iter_mut().zip(wt) {
                    *acc += a * c;
                }
            }
            for (acc, b) in out.iter_mut().zip(&b) {
                *acc += b;
            }
        }
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let name = node.name;
        let Rep::Codes(g) = node.rep(0).clone() else {
            return Err(unsupported(name, "its input is not quantized"));
        };
        let layout = node.layout(0);
        if matches!(layout, Layout::Maps { .. }) {
            return Err(unsupported(
                name,
                "it reads feature maps; flatten them first",
            ));
        }
        let (codes, zeros, scales) = weight_codes(name, &self.weight)?;
        let bias = accumulator_bias(name, &self.bias)?;
        let (k, o) = (self.in_features, self.out_features);
        // Columns follow the stored order of the input's features.
        let column = |j: usize| -> usize {
            match layout {
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
        let bound = accumulator_bound(name, &centered, k, &bias, reach(&g))?;
        let rows = (node.numel(0) / k) as u64;
        node.cost = rows * (k as u64) * (o as u64);
        node.step.weighted = Some(Weighted {
            groups: vec![PackedMatrix::new(&centered, o, k)?],
            depthwise: None,
            biases: vec![bias],
            input_zero: g.zero,
            fan_in: k,
            out: o,
            conv: None,
        });
        Ok((
            Rep::Acc {
                scales: scales.iter().map(|s| g.scale * s).collect(),
                bound,
            },
            Layout::Flat { features: o },
        ))
    }

    /// `Gemm` on `[N, in]`, `MatMul` + `Add` over the last axis of larger values.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let n = node.node;
        let gemm = node.shapes[0].len() == 1;
        let shape = [self.out_features, self.in_features];
        let weight = w.weight(n, &self.weight, &shape, !gemm)?;
        let b = w.bias(n, &self.bias, &self.weight, self.out_features)?;
        let (x, out) = (node.inputs[0].clone(), node.out.clone());
        if gemm {
            let attrs = vec![int_attr("transB", 1)];
            w.op("Gemm", &n.name, &[x, weight, b], out, attrs);
        } else {
            let product = w.step(n, "MatMul", &[x, weight], Vec::new(), "matmul");
            w.op("Add", &n.name, &[product, b], out, Vec::new());
        }
        Ok(())
    }

    weighted_layer_rules!();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeros against negative weights (a sum of -0.0), a -0.0 bias, mixed magnitudes, one and
    /// several rows: the evaluation gives the bits of one `Iterator::sum` per output plus the
    /// bias.
    #[test]
    fn evaluation_gives_one_sum_per_outputs_bits() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut value = || {
            let (v, pick) = super::super::next_test_value(&mut state);
            let v = v * 2.0;
            [v, v * 1e-3, v * 37.0, 0.0, -0.0][pick % 5]
        };
        for (k, outs, rows) in [(1, 1, 1), (5, 3, 2), (16, 9, 4), (33, 17, 3)] {
            let w: Vec<f32> = (0..k * outs).map(|_| value()).collect();
            let mut b: Vec<f32> = (0..outs).map(|_| value()).collect();
            b[0] = -0.0;
            let mut x: Vec<f32> = (0..rows * k).map(|_| value()).collect();
            x[..k].fill(0.0);
            let linear = Linear {
                in_features: k,
                out_features: outs,
                weight: Parameter::float("w", w.clone()),
                bias: Parameter::float("b", b.clone()),
            };
            let got = linear
                .evaluate(&EvalNode {
                    name: "fc",
                    inputs: vec![&x],
                    shapes: vec![&[k]],
                    output_shape: &[outs],
                    samples: rows,
                    input_quantizer: None,
                })
                .unwrap();
            let want: Vec<f32> = x
                .chunks_exact(k)
                .flat_map(|row| {
                    w.chunks_exact(k)
                        .zip(&b)
                        .map(move |(wr, b)| row.iter().zip(wr).map(|(a, c)| a * c).sum::<f32>() + b)
                })
                .collect();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "k {k}, {outs} outputs, {rows} rows"
            );
        }
    }
}

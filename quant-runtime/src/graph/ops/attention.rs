//! The attention products: `AttentionScores` (queries by keys, per head) and
//! `AttentionContext` (probabilities by values, per head).

use serde::{Deserialize, Serialize};

use super::expect_axes;
use super::{check_heads, token_pair, OpRules};
use crate::export::onnx::writer::{OnnxNode, Writer};
use crate::graph::eval::EvalNode;
use crate::graph::Axes;
use crate::integer::prepare::{codes_in, reach, within_i32, PrepareNode, Prepared};
use crate::integer::run::{overwritten_i32, Buf, RunNode};
use crate::integer::{Layout, Rep, StoredGrid};
use crate::GraphError;
use quant_core::int8::nonlinear::attention_scale;
use quant_core::int8::{attention_context_u8, attention_scores_u8, AttentionShape, Isa};

/// Attention scores of `heads` heads: inputs `Q [s1, heads · d]` and `K [s2, heads · d]`,
/// output `[heads, s1, s2]` with `scores[h][i][j] = Σₑ Q[i][h·d + e] · K[j][h·d + e] / √d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionScores {
    /// Heads; they split the features of `Q` and `K` into equal parts.
    pub heads: usize,
}

/// Attention's weighted sum of values: inputs `P [heads, s1, s2]` (the softmax of the scores)
/// and `V [s2, heads · d]`, output `[s1, heads · d]` with
/// `out[i][h·d + e] = Σⱼ P[h][i][j] · V[j][h·d + e]` (the heads side by side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionContext {
    /// Heads; they split the features of `V` into equal parts.
    pub heads: usize,
}

/// The grids of both inputs of an attention product, or why it cannot run on integers.
fn input_grids(node: &PrepareNode<'_>, what: [&str; 2]) -> Result<[StoredGrid; 2], GraphError> {
    Ok([
        codes_in(node.name, node.rep(0), what[0])?,
        codes_in(node.name, node.rep(1), what[1])?,
    ])
}

/// An attention product's accumulators: `terms` products of centered codes per output, at
/// `scale`, `features` per row; `sums` says what they are.
fn product(
    node: &mut PrepareNode<'_>,
    grids: [StoredGrid; 2],
    terms: usize,
    features: usize,
    scale: f64,
    sums: &str,
) -> Result<Prepared, GraphError> {
    let bound = (terms as i64)
        .saturating_mul(reach(&grids[0]))
        .saturating_mul(reach(&grids[1]));
    within_i32(node.name, bound, sums)?;
    node.cost = (node.output_numel() as u64) * (terms as u64);
    let scales = vec![scale];
    Ok((Rep::Acc { scales, bound }, Layout::Flat { features }))
}

/// Both inputs' codes and stored zero points, as the preparation promised them.
fn code_inputs<'n>(node: &'n RunNode<'_>) -> quant_core::Result<([&'n [u8]; 2], [i32; 2])> {
    match (node.input(0), node.input(1), node.rep(0), node.rep(1)) {
        (Some(Buf::U8(x)), Some(Buf::U8(y)), Rep::Codes(gx), Rep::Codes(gy)) => {
            Ok(([x, y], [gx.zero, gy.zero]))
        }
        _ => Err(node.internal()),
    }
}

/// The features per row of a `Flat` value.
fn features(layout: Layout) -> usize {
    match layout {
        Layout::Flat { features } => features.max(1),
        _ => 1,
    }
}

impl OpRules for AttentionScores {
    fn name(&self) -> &'static str {
        "AttentionScores"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        let ([s1, fq], [s2, fk]) = token_pair(inputs, "AttentionScores")?;
        check_heads(self.heads, &[("queries", fq), ("keys", fk)])?;
        if fq != fk {
            return Err(format!(
                "queries have {fq} features and keys {fk}; they must match"
            ));
        }
        Ok(vec![self.heads, s1, s2])
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes("AttentionScores (queries)", inputs, 0, Axes::Tokens)?;
        expect_axes("AttentionScores (keys)", inputs, 1, Axes::Tokens)?;
        Ok(Axes::Heads)
    }

    /// `[heads, s1, s2]` scores of queries `[s1, f]` and keys `[s2, f]` per sample.
    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let (q, k, heads) = (node.inputs[0], node.inputs[1], self.heads);
        let (s1, f, s2) = (node.shapes[0][0], node.shapes[0][1], node.shapes[1][0]);
        let d = f / heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut y = Vec::with_capacity(node.samples * heads * s1 * s2);
        for b in 0..node.samples {
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
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let what = ["AttentionScores (queries)", "AttentionScores (keys)"];
        let grids = input_grids(node, what)?;
        // Queries [s1, f] by keys [s2, f], d = f / heads terms per output.
        let d = node.shape(0)[1] / self.heads;
        let scale = attention_scale(grids[0].scale, grids[1].scale, d);
        let keys = node.shape(1)[0];
        product(
            node,
            grids,
            d,
            keys,
            scale,
            &format!("dot products of {d} features"),
        )
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let ([q, k], zeros) = code_inputs(node)?;
        let (fq, fk) = (features(node.layout(0)), features(node.layout(1)));
        let shape = AttentionShape {
            queries: node.numel(0) / fq,
            keys: node.numel(1) / fk,
            features: fq,
            heads: self.heads,
        };
        let mut scores = overwritten_i32(node.samples * self.heads * shape.queries * shape.keys);
        attention_scores_u8(Isa::detected(), q, k, shape, zeros, &mut scores)?;
        Ok(Buf::I32(scores))
    }

    /// Queries `[N, s1, f]` by keys `[N, s2, f]` per head, scaled by `1/√d`:
    /// `[N, heads, s1, s2]`.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let (n, heads) = (node.node, self.heads);
        let [a, b] = [node.inputs[0].clone(), node.inputs[1].clone()];
        let (s2, f) = (node.shapes[1][0], node.shapes[1][1]);
        let d = f / heads;
        let b = w.reshape(n, b, &[s2, heads, d], "right_heads");
        let q = w.reshape(n, a, &[node.shapes[0][0], heads, d], "query_heads");
        let q = w.transpose(n, q, &[0, 2, 1, 3], "query_by_head");
        let k = w.transpose(n, b, &[0, 2, 3, 1], "key_by_head");
        let dots = w.step(n, "MatMul", &[q, k], Vec::new(), "dots");
        let scale = w.scalar(n, "scale", 1.0 / (d as f32).sqrt());
        w.op("Mul", &n.name, &[dots, scale], node.out.clone(), Vec::new());
        Ok(())
    }

    fn is_measured_layer(&self) -> bool {
        true
    }
}

impl OpRules for AttentionContext {
    fn name(&self) -> &'static str {
        "AttentionContext"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        let heads = self.heads;
        match inputs {
            [[h, s1, s2], [sv, fv]] => {
                check_heads(heads, &[("values", *fv)])?;
                if *h != heads || s2 != sv {
                    return Err(format!(
                        "probabilities {:?} do not fit {heads} heads over {sv} values",
                        [h, s1, s2]
                    ));
                }
                Ok(vec![*s1, *fv])
            }
            _ => Err(format!(
                "AttentionContext takes probabilities [heads, s1, s2] and values [s2, features]; it receives {inputs:?}"
            )),
        }
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        expect_axes("AttentionContext (probabilities)", inputs, 0, Axes::Heads)?;
        expect_axes("AttentionContext (values)", inputs, 1, Axes::Tokens)?;
        Ok(Axes::Tokens)
    }

    /// `[s1, f]` weighted sums of values `[s2, f]` by probabilities `[heads, s1, s2]` per
    /// sample.
    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let (p, v, heads, n) = (node.inputs[0], node.inputs[1], self.heads, node.samples);
        let (s1, s2, f) = (node.shapes[0][1], node.shapes[0][2], node.shapes[1][1]);
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
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let what = [
            "AttentionContext (probabilities)",
            "AttentionContext (values)",
        ];
        let grids = input_grids(node, what)?;
        // Probabilities [heads, s1, s2] by values [s2, f], s2 terms per output.
        let s2 = node.shape(0)[2];
        let scale = grids[0].scale * grids[1].scale;
        let features = node.shape(1)[1];
        product(
            node,
            grids,
            s2,
            features,
            scale,
            &format!("weighted sums of {s2} values"),
        )
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let ([p, v], zeros) = code_inputs(node)?;
        let (keys, fv) = (features(node.layout(0)), features(node.layout(1)));
        let shape = AttentionShape {
            queries: node.numel(0) / (keys * self.heads),
            keys,
            features: fv,
            heads: self.heads,
        };
        let mut out = overwritten_i32(node.samples * shape.queries * shape.features);
        attention_context_u8(Isa::detected(), p, v, shape, zeros, &mut out)?;
        Ok(Buf::I32(out))
    }

    /// Probabilities `[N, heads, s1, s2]` by values `[N, s2, f]` per head, the heads
    /// concatenated: `[N, s1, f]`.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let (n, heads) = (node.node, self.heads);
        let [a, b] = [node.inputs[0].clone(), node.inputs[1].clone()];
        let (s2, f) = (node.shapes[1][0], node.shapes[1][1]);
        let d = f / heads;
        let b = w.reshape(n, b, &[s2, heads, d], "right_heads");
        let v = w.transpose(n, b, &[0, 2, 1, 3], "value_by_head");
        let context = w.step(n, "MatMul", &[a, v], Vec::new(), "context_by_head");
        let context = w.transpose(n, context, &[0, 2, 1, 3], "context_heads");
        let shape = [0, node.shapes[0][1], f];
        let shape = w.shape_constant(&format!("{}.context_shape", n.name), &shape);
        w.op(
            "Reshape",
            &n.name,
            &[context, shape],
            node.out.clone(),
            Vec::new(),
        );
        Ok(())
    }

    fn is_measured_layer(&self) -> bool {
        true
    }
}

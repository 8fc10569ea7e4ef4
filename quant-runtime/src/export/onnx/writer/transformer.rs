//! The transformer ops in opset-13 operators: LayerNorm as reductions (LayerNormalization came
//! with opset 17), GELU through `Erf` (`Gelu` came with opset 20), the softmax over the last
//! axis, the attention products as per-head `MatMul`s between `Reshape`s and `Transpose`s, and
//! the ViT's token ops. Each computes what the graph's float reference computes; the values
//! around them are quantized by the `QuantizeLinear` / `DequantizeLinear` pairs the graph's
//! `QuantizeDequantize` nodes become.

use super::{float_values, int_attr, ints_attr, Writer};
use crate::export::onnx::proto::data_type;
use crate::graph::{Node, Op, Parameter};
use crate::GraphError;

impl Writer<'_> {
    /// An int64 initializer (the shape input of `Reshape`); `0` copies the input's dimension,
    /// which keeps the batch dynamic.
    fn shape_constant(&mut self, base: &str, dims: &[usize]) -> String {
        let raw = dims
            .iter()
            .flat_map(|d| (*d as i64).to_le_bytes())
            .collect();
        self.initializer(base, data_type::INT64, &[dims.len()], raw)
    }

    /// `x` reshaped to `[N, dims...]`.
    fn reshape(&mut self, node: &Node, x: String, dims: &[usize], what: &str) -> String {
        let mut shape = vec![0];
        shape.extend_from_slice(dims);
        let shape = self.shape_constant(&format!("{}.{what}_shape", node.name), &shape);
        self.step(node, "Reshape", &[x, shape], Vec::new(), what)
    }

    /// `x` with its axes permuted (`perm` includes the batch axis 0).
    fn transpose(&mut self, node: &Node, x: String, perm: &[usize], what: &str) -> String {
        self.step(node, "Transpose", &[x], vec![ints_attr("perm", perm)], what)
    }

    /// A one-element float initializer.
    fn scalar(&mut self, node: &Node, what: &str, value: f32) -> String {
        self.floats(&format!("{}.{what}", node.name), &[], &[value])
    }

    /// The mean over the last of `rank` per-sample axes, kept as an axis of one.
    fn mean_last(&mut self, node: &Node, x: String, rank: usize, what: &str) -> String {
        let attrs = vec![ints_attr("axes", &[rank]), int_attr("keepdims", 1)];
        self.step(node, "ReduceMean", &[x], attrs, what)
    }

    /// `LayerNorm` over the last axis: `(x − mean) / √(var + ε) · γ + β`, the variance the
    /// biased one.
    pub(super) fn layer_norm(
        &mut self,
        node: &Node,
        [scale, shift]: [&Parameter; 2],
        epsilon: f64,
        (x, in_shape): (String, &[usize]),
        out: String,
    ) -> Result<(), GraphError> {
        let rank = in_shape.len();
        let features = in_shape.last().copied().unwrap_or(1);
        let gamma = float_values(node, scale)?;
        let beta = float_values(node, shift)?;
        let mean = self.mean_last(node, x.clone(), rank, "mean");
        let centered = self.step(node, "Sub", &[x, mean], Vec::new(), "centered");
        let squared = [centered.clone(), centered.clone()];
        let squares = self.step(node, "Mul", &squared, Vec::new(), "squares");
        let variance = self.mean_last(node, squares, rank, "variance");
        let eps = self.scalar(node, "epsilon", epsilon as f32);
        let shifted = self.step(node, "Add", &[variance, eps], Vec::new(), "variance_eps");
        let deviation = self.step(node, "Sqrt", &[shifted], Vec::new(), "deviation");
        let normalized = self.step(
            node,
            "Div",
            &[centered, deviation],
            Vec::new(),
            "normalized",
        );
        let g = self.floats(&format!("{}.scale", node.name), &[features], gamma);
        let scaled = self.step(node, "Mul", &[normalized, g], Vec::new(), "scaled");
        let b = self.floats(&format!("{}.shift", node.name), &[features], beta);
        self.op("Add", &node.name, &[scaled, b], out, Vec::new());
        Ok(())
    }

    /// GELU, exactly: `x · ½(1 + erf(x / √2))`.
    pub(super) fn gelu(&mut self, node: &Node, x: String, out: String) {
        let sqrt2 = self.scalar(node, "sqrt2", std::f32::consts::SQRT_2);
        let scaled = self.step(node, "Div", &[x.clone(), sqrt2], Vec::new(), "scaled");
        let erf = self.step(node, "Erf", &[scaled], Vec::new(), "erf");
        let one = self.scalar(node, "one", 1.0);
        let cdf2 = self.step(node, "Add", &[erf, one], Vec::new(), "erf_plus_one");
        let product = self.step(node, "Mul", &[x, cdf2], Vec::new(), "product");
        let half = self.scalar(node, "half", 0.5);
        self.op("Mul", &node.name, &[product, half], out, Vec::new());
    }

    /// `ImageTokens`: the feature maps `[N, C, H, W]` as `H·W` tokens of `C` channels (row-major
    /// positions), plus the position embedding.
    pub(super) fn image_tokens(
        &mut self,
        node: &Node,
        position: &Parameter,
        (x, in_shape): (String, &[usize]),
        out: String,
    ) -> Result<(), GraphError> {
        let (c, tokens) = (in_shape[0], in_shape[1] * in_shape[2]);
        let p = float_values(node, position)?;
        let planes = self.reshape(node, x, &[c, tokens], "planes");
        let t = self.transpose(node, planes, &[0, 2, 1], "tokens");
        let p = self.floats(&format!("{}.position", node.name), &[tokens, c], p);
        self.op("Add", &node.name, &[t, p], out, Vec::new());
        Ok(())
    }

    /// `MeanTokens`: `[N, T, C]` → `[N, C]`.
    pub(super) fn mean_tokens(&mut self, node: &Node, x: String, out: String) {
        let attrs = vec![ints_attr("axes", &[1]), int_attr("keepdims", 0)];
        self.op("ReduceMean", &node.name, &[x], out, attrs);
    }

    /// The attention products, each head over its `d = f / heads` features:
    /// - `AttentionScores`: queries `[N, s1, f]` by keys `[N, s2, f]`, scaled by `1/√d`:
    ///   `[N, heads, s1, s2]`;
    /// - `AttentionContext`: probabilities `[N, heads, s1, s2]` by values `[N, s2, f]`, the
    ///   heads concatenated: `[N, s1, f]`.
    pub(super) fn attention(
        &mut self,
        node: &Node,
        heads: usize,
        [a, b]: [String; 2],
        [a_shape, b_shape]: [&[usize]; 2],
        out: String,
    ) {
        // The right operand, keys or values, is `[N, s2, f]` either way: split into heads.
        let (s2, f) = (b_shape[0], b_shape[1]);
        let d = f / heads;
        let b = self.reshape(node, b, &[s2, heads, d], "right_heads");
        if let Op::AttentionScores { .. } = node.op {
            let q = self.reshape(node, a, &[a_shape[0], heads, d], "query_heads");
            let q = self.transpose(node, q, &[0, 2, 1, 3], "query_by_head");
            let k = self.transpose(node, b, &[0, 2, 3, 1], "key_by_head");
            let dots = self.step(node, "MatMul", &[q, k], Vec::new(), "dots");
            let scale = self.scalar(node, "scale", 1.0 / (d as f32).sqrt());
            self.op("Mul", &node.name, &[dots, scale], out, Vec::new());
        } else {
            let v = self.transpose(node, b, &[0, 2, 1, 3], "value_by_head");
            let context = self.step(node, "MatMul", &[a, v], Vec::new(), "context_by_head");
            let context = self.transpose(node, context, &[0, 2, 1, 3], "context_heads");
            let shape = [0, a_shape[1], f];
            let shape = self.shape_constant(&format!("{}.context_shape", node.name), &shape);
            self.op("Reshape", &node.name, &[context, shape], out, Vec::new());
        }
    }
}

//! The steps the transformer ops write themselves with in opset-13 operators (reshapes,
//! transposes, scalars, reductions over the last axis): LayerNorm as reductions, GELU through
//! `Erf`, the attention products as per-head `MatMul`s between `Reshape`s and `Transpose`s.

use super::{int_attr, ints_attr, Writer};
use crate::export::onnx::proto::data_type;
use crate::graph::Node;

impl Writer<'_> {
    /// An int64 initializer (the shape input of `Reshape`); `0` copies the input's dimension,
    /// which keeps the batch dynamic.
    pub(crate) fn shape_constant(&mut self, base: &str, dims: &[usize]) -> String {
        let raw = dims
            .iter()
            .flat_map(|d| (*d as i64).to_le_bytes())
            .collect();
        self.initializer(base, data_type::INT64, &[dims.len()], raw)
    }

    /// `x` reshaped to `[N, dims...]`.
    pub(crate) fn reshape(&mut self, node: &Node, x: String, dims: &[usize], what: &str) -> String {
        let mut shape = vec![0];
        shape.extend_from_slice(dims);
        let shape = self.shape_constant(&format!("{}.{what}_shape", node.name), &shape);
        self.step(node, "Reshape", &[x, shape], Vec::new(), what)
    }

    /// `x` with its axes permuted (`perm` includes the batch axis 0).
    pub(crate) fn transpose(
        &mut self,
        node: &Node,
        x: String,
        perm: &[usize],
        what: &str,
    ) -> String {
        self.step(node, "Transpose", &[x], vec![ints_attr("perm", perm)], what)
    }

    /// A one-element float initializer.
    pub(crate) fn scalar(&mut self, node: &Node, what: &str, value: f32) -> String {
        self.floats(&format!("{}.{what}", node.name), &[], &[value])
    }

    /// The mean over the last of `rank` per-sample axes, kept as an axis of one.
    pub(crate) fn mean_last(&mut self, node: &Node, x: String, rank: usize, what: &str) -> String {
        let attrs = vec![ints_attr("axes", &[rank]), int_attr("keepdims", 1)];
        self.step(node, "ReduceMean", &[x], attrs, what)
    }
}

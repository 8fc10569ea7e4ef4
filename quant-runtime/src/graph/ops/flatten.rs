//! `Flatten`: row-major flattening to `[features]`.

use super::{single, OpRules};
use crate::export::onnx::writer::{int_attr, OnnxNode, Writer};
use crate::graph::checked_numel;
use crate::graph::eval::EvalNode;
use crate::graph::Axes;
use crate::integer::prepare::{PrepareNode, Prepared};
use crate::integer::run::{Buf, RunNode};
use crate::integer::Layout;
use crate::GraphError;

/// Row-major flattening to `[features]`.
pub(crate) struct Flatten;

impl OpRules for Flatten {
    fn name(&self) -> &'static str {
        "Flatten"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        let x = single(inputs, "Flatten")?;
        Ok(vec![checked_numel(x).ok_or("the input is too large")?])
    }

    fn axes(&self, _inputs: &[Axes]) -> Result<Axes, String> {
        Ok(Axes::Features)
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        Ok(node.inputs[0].to_vec())
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        // Maps stay stored `[h, w, c]`: the Linear layer that reads them permutes its columns.
        let layout = match node.layout(0) {
            Layout::Maps { c, h, w } | Layout::FlatMaps { c, h, w } => Layout::FlatMaps { c, h, w },
            Layout::Flat { .. } => Layout::Flat {
                features: node.numel(0),
            },
        };
        Ok((node.rep(0).clone(), layout))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        Ok(node.take(0))
    }

    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let (x, attrs) = (node.inputs[0].clone(), vec![int_attr("axis", 1)]);
        w.op("Flatten", &node.node.name, &[x], node.out.clone(), attrs);
        Ok(())
    }
}

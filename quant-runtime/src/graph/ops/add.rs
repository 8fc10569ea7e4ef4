//! `Add`: the elementwise sum of two values of one shape (a residual connection).

use super::OpRules;
use crate::export::onnx::writer::{OnnxNode, Writer};
use crate::graph::eval::EvalNode;
use crate::graph::Axes;
use crate::integer::prepare::{reach, unsupported, PrepareNode, Prepared};
use crate::integer::run::{Buf, RunNode};
use crate::integer::Rep;
use crate::GraphError;

/// The elementwise sum of two values of one shape.
pub(crate) struct Add;

impl OpRules for Add {
    fn name(&self) -> &'static str {
        "Add"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        match inputs {
            [a, b] if a == b => Ok(a.to_vec()),
            [a, b] => Err(format!(
                "adds values of shapes {a:?} and {b:?}; they must match"
            )),
            _ => Err(format!("Add takes two inputs; it has {}", inputs.len())),
        }
    }

    fn axes(&self, inputs: &[Axes]) -> Result<Axes, String> {
        match inputs {
            [a, b] if a == b => Ok(*a),
            [a, b] => Err(format!(
                "adds {} to {}; their axes must mean the same",
                a.describe(),
                b.describe()
            )),
            _ => Err(format!("Add takes two inputs; it has {}", inputs.len())),
        }
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let (a, b) = (node.inputs[0], node.inputs[1]);
        Ok(a.iter().zip(b).map(|(x, y)| x + y).collect())
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        // Integer adds need both inputs on one grid (TensorRT's and OpenVINO's rule): the sum
        // of centered codes is then exact at that grid's scale.
        match (node.rep(0), node.rep(1)) {
            (Rep::Codes(ga), Rep::Codes(gb)) if ga == gb => {
                if node.layout(1) != node.layout(0) {
                    return Err(unsupported(node.name, "its inputs are laid out differently"));
                }
                let rep = Rep::Acc {
                    scales: vec![ga.scale],
                    bound: 2 * reach(ga),
                };
                node.cost = node.output_numel() as u64;
                Ok((rep, node.layout(0)))
            }
            _ => Err(unsupported(
                node.name,
                "integer addition needs both inputs quantized on one grid (the same scale and zero point): quantize them with one quantizer",
            )),
        }
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        match (node.input(0), node.input(1), node.rep(0)) {
            (Some(Buf::U8(x)), Some(Buf::U8(y)), Rep::Codes(g)) => {
                Ok(Buf::I32(quant_core::int8::add_u8(x, y, -2 * g.zero)?))
            }
            _ => Err(node.internal()),
        }
    }

    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let inputs = [node.inputs[0].clone(), node.inputs[1].clone()];
        w.op(
            "Add",
            &node.node.name,
            &inputs,
            node.out.clone(),
            Vec::new(),
        );
        Ok(())
    }

    fn is_measured_layer(&self) -> bool {
        true
    }
}

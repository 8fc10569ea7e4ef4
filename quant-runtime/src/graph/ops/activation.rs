//! The elementwise activations `Relu`, `Tanh` and `Sigmoid`.

use super::{single, OpRules};
use crate::export::onnx::writer::{OnnxNode, Writer};
use crate::graph::eval::EvalNode;
use crate::integer::prepare::{unsupported, PrepareNode, Prepared};
use crate::integer::run::{Buf, RunNode};
use crate::integer::Rep;
use crate::GraphError;

/// `max(x, 0)`, `tanh(x)` or `1 / (1 + e^-x)`.
pub(crate) enum Activation {
    Relu,
    Tanh,
    Sigmoid,
}

impl OpRules for Activation {
    fn name(&self) -> &'static str {
        match self {
            Activation::Relu => "Relu",
            Activation::Tanh => "Tanh",
            Activation::Sigmoid => "Sigmoid",
        }
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        Ok(single(inputs, self.name())?.to_vec())
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let xs = node.inputs[0].iter();
        Ok(match self {
            Activation::Relu => xs.map(|v| v.max(0.0)).collect(),
            Activation::Tanh => xs.map(|v| v.tanh()).collect(),
            Activation::Sigmoid => xs.map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
        })
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        match self {
            // Codes: max with the zero point; accumulators: max with 0 (see `integer::run`).
            Activation::Relu => Ok((node.rep(0).clone(), node.layout(0))),
            _ => Err(unsupported(
                node.name,
                format!(
                    "{}: this activation has no integer form: integer inference supports ReLU and GELU",
                    self.name()
                ),
            )),
        }
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let Activation::Relu = self else {
            return Err(node.internal());
        };
        let zero = match node.rep(0) {
            Rep::Codes(g) => Some(g.zero as u8),
            _ => None,
        };
        match (node.take(0), zero) {
            (Buf::I32(mut v), _) => {
                v.iter_mut().for_each(|x| *x = (*x).max(0));
                Ok(Buf::I32(v))
            }
            (Buf::U8(mut v), Some(z)) => {
                v.iter_mut().for_each(|x| *x = (*x).max(z));
                Ok(Buf::U8(v))
            }
            _ => Err(node.internal()),
        }
    }

    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let x = node.inputs[0].clone();
        w.op(
            self.name(),
            &node.node.name,
            &[x],
            node.out.clone(),
            Vec::new(),
        );
        Ok(())
    }
}

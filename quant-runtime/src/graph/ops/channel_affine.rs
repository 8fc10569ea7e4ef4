//! `ChannelAffine`: a per-channel affine map (a BatchNorm in inference mode).

use serde::{Deserialize, Serialize};

use super::{single, OpRules};
use crate::export::onnx::writer::{float_values, OnnxNode, Writer};
use crate::graph::eval::{float_pair, EvalNode};
use crate::graph::params::check_parameter;
use crate::graph::Parameter;
use crate::integer::prepare::{unsupported, PrepareNode, Prepared};
use crate::GraphError;

/// Per-channel affine map `y = x·scale[c] + shift[c]` (a BatchNorm in inference mode), on the
/// channel axis (the first; the only one for features).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelAffine {
    /// One factor per channel.
    pub scale: Parameter,
    /// One offset per channel.
    pub shift: Parameter,
}

impl OpRules for ChannelAffine {
    fn name(&self) -> &'static str {
        "ChannelAffine"
    }

    fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String> {
        let x = single(inputs, "ChannelAffine")?;
        let channels = x.first().copied().unwrap_or(0);
        if values {
            check_parameter(&self.scale, "scale", channels, channels, &["float"])?;
            check_parameter(&self.shift, "shift", channels, channels, &["float"])?;
        }
        Ok(x.to_vec())
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let (s, t) = float_pair("ChannelAffine", node.name, &self.scale, &self.shift)?;
        let in_shape = node.shapes[0];
        let c = in_shape[0];
        let per: usize = in_shape[1..].iter().product();
        Ok(node.inputs[0]
            .iter()
            .enumerate()
            .map(|(k, v)| {
                let ch = (k / per) % c;
                v * s[ch] + t[ch]
            })
            .collect())
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        Err(unsupported(
            node.name,
            "ChannelAffine: an unfolded BatchNorm has no integer form: fold it into the convolution or Linear layer before it",
        ))
    }

    /// `Mul` and `Add` by per-channel factors shaped to broadcast over the first per-sample
    /// axis.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let n = node.node;
        let in_shape = node.shapes[0];
        let mut dims = vec![1usize; in_shape.len()];
        dims[0] = in_shape[0];
        let s = w.floats(&self.scale.tensor, &dims, float_values(n, &self.scale)?);
        let t = w.floats(&self.shift.tensor, &dims, float_values(n, &self.shift)?);
        let x = node.inputs[0].clone();
        let scaled = w.step(n, "Mul", &[x, s], Vec::new(), "scaled");
        w.op("Add", &n.name, &[scaled, t], node.out.clone(), Vec::new());
        Ok(())
    }

    fn parameters(&self, _output: &[usize]) -> Vec<(&Parameter, Vec<usize>)> {
        let c = self.scale.values.len();
        vec![(&self.scale, vec![c]), (&self.shift, vec![c])]
    }

    fn parameters_mut(&mut self, _output: &[usize]) -> Vec<(&mut Parameter, Option<Vec<usize>>)> {
        vec![(&mut self.scale, None), (&mut self.shift, None)]
    }
}

//! `LayerNorm`: layer normalisation over the last axis.

use serde::{Deserialize, Serialize};

use super::{single, OpRules};
use crate::export::onnx::writer::{float_values, OnnxNode, Writer};
use crate::graph::eval::{float_pair, EvalNode};
use crate::graph::params::check_parameter;
use crate::graph::{ParamValues, Parameter};
use crate::integer::prepare::{codes_in, unsupported, PrepareNode, Prepared};
use crate::integer::run::{overwritten_i32, Buf, RunNode};
use crate::integer::{Nonlinear, Rep};
use crate::GraphError;
use quant_core::int8::nonlinear::IntLayerNorm;

/// Layer normalisation over the last axis: `(x − mean) / √(var + epsilon) · scale + shift` (the
/// biased variance, as dfdx and PyTorch compute it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerNorm {
    /// One factor per feature of the last axis.
    pub scale: Parameter,
    /// One offset per feature of the last axis.
    pub shift: Parameter,
    /// Added to the variance.
    pub epsilon: f64,
}

impl OpRules for LayerNorm {
    fn name(&self) -> &'static str {
        "LayerNorm"
    }

    fn shape(&self, inputs: &[&[usize]], values: bool) -> Result<Vec<usize>, String> {
        let x = single(inputs, "LayerNorm")?;
        let features = x.last().copied().unwrap_or(0);
        let epsilon = self.epsilon;
        if !(epsilon.is_finite() && epsilon > 0.0) {
            return Err(format!("epsilon {epsilon} must be finite and positive"));
        }
        if values {
            check_parameter(&self.scale, "scale", features, features, &["float"])?;
            check_parameter(&self.shift, "shift", features, features, &["float"])?;
        }
        Ok(x.to_vec())
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let (g, b) = float_pair("LayerNorm", node.name, &self.scale, &self.shift)?;
        let f = g.len().max(1);
        let xs = node.inputs[0];
        let mut y = Vec::with_capacity(xs.len());
        for row in xs.chunks_exact(f) {
            let mean = row.iter().sum::<f32>() / f as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / f as f32;
            let inv = 1.0 / (var + self.epsilon as f32).sqrt();
            y.extend(
                row.iter()
                    .zip(g)
                    .zip(b)
                    .map(|((v, g), b)| (v - mean) * inv * g + b),
            );
        }
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let name = node.name;
        let g = codes_in(name, node.rep(0), "LayerNorm")?;
        let (ParamValues::Float(gamma), ParamValues::Float(beta)) =
            (&self.scale.values, &self.shift.values)
        else {
            return Err(unsupported(name, "its scale and shift are not float"));
        };
        let kernel = IntLayerNorm::new(
            g.scale as f32,
            g.lo..=g.hi,
            gamma,
            beta,
            self.epsilon as f32,
        )
        .map_err(|e| unsupported(name, format!("integer LayerNorm: {e}")))?;
        node.cost = node.numel(0) as u64;
        let rep = Rep::Acc {
            scales: vec![kernel.output_scale() as f64],
            bound: i64::from(i32::MAX),
        };
        node.step.nonlinear = Some(Nonlinear::LayerNorm(kernel));
        Ok((rep, node.layout(0)))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let mut y = overwritten_i32(node.samples * node.output_numel());
        match (&node.step.nonlinear, node.input(0)) {
            (Some(Nonlinear::LayerNorm(k)), Some(Buf::U8(x))) => k.run(x, &mut y)?,
            _ => return Err(node.internal()),
        }
        Ok(Buf::I32(y))
    }

    /// `(x − mean) / √(var + ε) · γ + β` as reductions, the variance the biased one
    /// (`LayerNormalization` came with opset 17).
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let n = node.node;
        let in_shape = node.shapes[0];
        let rank = in_shape.len();
        let features = in_shape.last().copied().unwrap_or(1);
        let gamma = float_values(n, &self.scale)?;
        let beta = float_values(n, &self.shift)?;
        let x = node.inputs[0].clone();
        let mean = w.mean_last(n, x.clone(), rank, "mean");
        let centered = w.step(n, "Sub", &[x, mean], Vec::new(), "centered");
        let squared = [centered.clone(), centered.clone()];
        let squares = w.step(n, "Mul", &squared, Vec::new(), "squares");
        let variance = w.mean_last(n, squares, rank, "variance");
        let eps = w.scalar(n, "epsilon", self.epsilon as f32);
        let shifted = w.step(n, "Add", &[variance, eps], Vec::new(), "variance_eps");
        let deviation = w.step(n, "Sqrt", &[shifted], Vec::new(), "deviation");
        let normalized = w.step(n, "Div", &[centered, deviation], Vec::new(), "normalized");
        let g = w.floats(&format!("{}.scale", n.name), &[features], gamma);
        let scaled = w.step(n, "Mul", &[normalized, g], Vec::new(), "scaled");
        let b = w.floats(&format!("{}.shift", n.name), &[features], beta);
        w.op("Add", &n.name, &[scaled, b], node.out.clone(), Vec::new());
        Ok(())
    }

    fn parameters(&self, _output: &[usize]) -> Vec<(&Parameter, Vec<usize>)> {
        let c = self.scale.values.len();
        vec![(&self.scale, vec![c]), (&self.shift, vec![c])]
    }

    fn parameters_mut(&mut self, _output: &[usize]) -> Vec<(&mut Parameter, Option<Vec<usize>>)> {
        vec![(&mut self.scale, None), (&mut self.shift, None)]
    }

    fn is_measured_layer(&self) -> bool {
        true
    }
}

//! `Softmax` over the last axis and `Gelu`, the transformer's nonlinear ops without an exact
//! integer form: the integer runtime runs the fixed-point kernels QAT simulates.

use super::{single, OpRules};
use crate::export::onnx::writer::{int_attr, OnnxNode, Writer};
use crate::graph::eval::EvalNode;
use crate::integer::prepare::{codes_in, unsupported, PrepareNode, Prepared};
use crate::integer::run::{overwritten_i32, Buf, RunNode};
use crate::integer::{Layout, Nonlinear, Rep};
use crate::GraphError;
use quant_core::int8::nonlinear::{IntGelu, IntSoftmax};

/// Softmax over the last axis.
pub(crate) struct Softmax;

/// GELU, `x · Φ(x)` with the normal CDF `Φ`.
pub(crate) struct Gelu;

impl OpRules for Softmax {
    fn name(&self) -> &'static str {
        "Softmax"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        Ok(single(inputs, self.name())?.to_vec())
    }

    /// Each row in `f64`.
    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let row = node.shapes[0].last().copied().unwrap_or(1).max(1);
        let mut y = Vec::with_capacity(node.inputs[0].len());
        for r in node.inputs[0].chunks_exact(row) {
            let max = r.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
            let e: Vec<f64> = r.iter().map(|v| (*v as f64 - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            y.extend(e.iter().map(|v| (v / sum) as f32));
        }
        Ok(y)
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let name = node.name;
        let Rep::Acc { scales, .. } = node.rep(0) else {
            return Err(unsupported(
                name,
                "Softmax runs on the accumulators of attention scores; its input here is not one",
            ));
        };
        let [scale] = scales.as_slice() else {
            return Err(unsupported(
                name,
                "its input has a scale per channel; softmax needs one",
            ));
        };
        let row = node.shape(0).last().copied().unwrap_or(1);
        let kernel = IntSoftmax::deployed(*scale as f32, row)
            .map_err(|e| unsupported(name, format!("integer softmax: {e}")))?;
        node.cost = node.numel(0) as u64;
        let rep = Rep::Acc {
            scales: vec![kernel.output_scale() as f64],
            bound: i64::from(kernel.max_code()),
        };
        node.step.nonlinear = Some(Nonlinear::Softmax(kernel));
        Ok((rep, Layout::Flat { features: row }))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let mut y = overwritten_i32(node.samples * node.output_numel());
        match (&node.step.nonlinear, node.input(0)) {
            (Some(Nonlinear::Softmax(k)), Some(Buf::I32(x))) => k.run(x, &mut y)?,
            _ => return Err(node.internal()),
        }
        Ok(Buf::I32(y))
    }

    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let axis = node.shapes[0].len() as i64;
        let x = node.inputs[0].clone();
        let attrs = vec![int_attr("axis", axis)];
        w.op("Softmax", &node.node.name, &[x], node.out.clone(), attrs);
        Ok(())
    }
}

impl OpRules for Gelu {
    fn name(&self) -> &'static str {
        "Gelu"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        Ok(single(inputs, self.name())?.to_vec())
    }

    /// `x · Φ(x)`, in `f64`.
    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let gelu = |x: f32| {
            let x = x as f64;
            (x * quant_core::int8::nonlinear::normal_cdf(x)) as f32
        };
        Ok(node.inputs[0].iter().map(|v| gelu(*v)).collect())
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let name = node.name;
        let g = codes_in(name, node.rep(0), "Gelu")?;
        let kernel = IntGelu::deployed(g.scale as f32, g.zero, g.lo..=g.hi)
            .map_err(|e| unsupported(name, format!("integer GELU: {e}")))?;
        node.cost = node.numel(0) as u64;
        let rep = Rep::Acc {
            scales: vec![kernel.output_scale() as f64],
            // |d · Φ| / 2^shift with |d| < 2^shift and Φ ≤ 2^30.
            bound: (1 << 30) + 1,
        };
        node.step.nonlinear = Some(Nonlinear::Gelu(kernel));
        Ok((rep, node.layout(0)))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let mut y = overwritten_i32(node.samples * node.output_numel());
        match (&node.step.nonlinear, node.input(0)) {
            (Some(Nonlinear::Gelu(k)), Some(Buf::U8(x))) => k.run(x, &mut y)?,
            _ => return Err(node.internal()),
        }
        Ok(Buf::I32(y))
    }

    /// Exactly: `x · ½(1 + erf(x / √2))` (`Gelu` came with opset 20).
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let n = node.node;
        let x = node.inputs[0].clone();
        let sqrt2 = w.scalar(n, "sqrt2", std::f32::consts::SQRT_2);
        let scaled = w.step(n, "Div", &[x.clone(), sqrt2], Vec::new(), "scaled");
        let erf = w.step(n, "Erf", &[scaled], Vec::new(), "erf");
        let one = w.scalar(n, "one", 1.0);
        let cdf2 = w.step(n, "Add", &[erf, one], Vec::new(), "erf_plus_one");
        let product = w.step(n, "Mul", &[x, cdf2], Vec::new(), "product");
        let half = w.scalar(n, "half", 0.5);
        w.op(
            "Mul",
            &n.name,
            &[product, half],
            node.out.clone(),
            Vec::new(),
        );
        Ok(())
    }

    fn is_measured_layer(&self) -> bool {
        true
    }
}

//! `QuantizeDequantize`: a value onto a quantizer's grid and back (a QDQ pair).

use serde::{Deserialize, Serialize};

use super::{single, OpRules};
use crate::export::onnx::writer::{CodeType, OnnxNode, Writer};
use crate::export::onnx::Role;
use crate::graph::eval::EvalNode;
use crate::graph::params::check_quantizer;
use crate::graph::ExportedQuantizer;
use crate::integer::prepare::{check_bits, requantizer, stored_grid, PrepareNode, Prepared};
use crate::integer::run::{nchw_to_nhwc, overwritten_i32, overwritten_u8, recycle, Buf, RunNode};
use crate::integer::{Layout, Quantize, Rep};
use crate::GraphError;

/// Quantizes its input onto the quantizer's grid and back: in the float reference a
/// fake-quantization, in the integer runtime the codes. Per tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantizeDequantize {
    /// The quantizer.
    pub quantizer: ExportedQuantizer,
}

impl OpRules for QuantizeDequantize {
    fn name(&self) -> &'static str {
        "QuantizeDequantize"
    }

    fn shape(&self, inputs: &[&[usize]], _values: bool) -> Result<Vec<usize>, String> {
        check_quantizer(&self.quantizer, "the quantizer", None)?;
        Ok(single(inputs, "QuantizeDequantize")?.to_vec())
    }

    fn evaluate(&self, node: &EvalNode<'_>) -> quant_core::Result<Vec<f32>> {
        let xs = node.inputs[0];
        self.quantizer.inferable.fake_quantize(xs, &[xs.len()])
    }

    fn prepare(&self, node: &mut PrepareNode<'_>) -> Result<Prepared, GraphError> {
        let q = &self.quantizer.inferable;
        check_bits(node.name, "it uses", q)?;
        let (grid, offset) = stored_grid(q);
        node.step.quantize = Some(match node.rep(0) {
            Rep::Float => Quantize::Float {
                quantizer: q.clone(),
                offset,
            },
            Rep::Acc { scales, bound } => Quantize::Requantize {
                requantizer: requantizer(node.name, scales, Some(*bound), &grid)?,
                input_zero: None,
            },
            Rep::Codes(g) => Quantize::Requantize {
                requantizer: requantizer(node.name, &[g.scale], None, &grid)?,
                input_zero: Some(g.zero),
            },
        });
        let layout: Layout = node.layout(0);
        Ok((Rep::Codes(grid), layout))
    }

    fn run(&self, node: &mut RunNode<'_>) -> quant_core::Result<Buf> {
        let (Some(q), layout) = (node.step.quantize.as_ref(), node.layout(0)) else {
            return Err(node.internal());
        };
        match (q, node.input(0)) {
            (Quantize::Float { quantizer, offset }, Some(Buf::F32(x))) => {
                let codes: Vec<i32> = quantizer.quantize(x, &[x.len()])?;
                let stored: Vec<u8> = codes.iter().map(|c| (c + offset) as u8).collect();
                Ok(Buf::U8(match layout {
                    // The float input is NCHW; codes are stored NHWC.
                    Layout::Maps { c, h, w } => nchw_to_nhwc(&stored, c, h * w),
                    _ => stored,
                }))
            }
            (
                Quantize::Requantize {
                    requantizer,
                    input_zero,
                },
                Some(buf),
            ) => {
                let mut centered = Vec::new();
                let acc: &[i32] = match (buf, input_zero) {
                    (Buf::I32(v), None) => v,
                    (Buf::U8(v), Some(z)) => {
                        centered = overwritten_i32(v.len());
                        for (c, q) in centered.iter_mut().zip(v) {
                            *c = *q as i32 - z;
                        }
                        &centered
                    }
                    _ => return Err(node.internal()),
                };
                let mut out = overwritten_u8(acc.len());
                requantizer.run(acc, &mut out)?;
                recycle(Buf::I32(centered));
                Ok(Buf::U8(out))
            }
            (Quantize::Map(map), Some(Buf::U8(codes))) => {
                let mut out = overwritten_u8(codes.len());
                map.run(codes, &mut out)?;
                Ok(Buf::U8(out))
            }
            (Quantize::SumMap(map), Some(Buf::U8(x))) => {
                let Some(Buf::U8(y)) = node.input(1) else {
                    return Err(node.internal());
                };
                let mut out = overwritten_u8(x.len());
                map.run(x, y, &mut out)?;
                Ok(Buf::U8(out))
            }
            _ => Err(node.internal()),
        }
    }

    /// `[Clip →] QuantizeLinear → DequantizeLinear`, per tensor.
    fn write_onnx<'g>(&self, w: &mut Writer<'g>, node: &OnnxNode<'g>) -> Result<(), GraphError> {
        let (q, name) = (&self.quantizer, &node.node.name);
        w.convention.check(name, Role::Activation, q)?;
        let code = CodeType::of(q);
        let grid = q.inferable.grid();
        let (scale, zero, _) = w.qparams(name, q, code, 0);
        let s = q.inferable.qparams().scales()[0];
        let z = q.inferable.qparams().zero_points()[0];
        let mut x = node.inputs[0].clone();
        if (grid.quant_min(), grid.quant_max()) != code.range() {
            // A narrow grid in wider storage: clip to the grid's real range, so that
            // QuantizeLinear yields codes on the grid ((q - z)·s divided by s rounds back to
            // q: the relative error of the two f32 operations is far below 0.5 / 2^8).
            let lo = (grid.quant_min() - z) as f32 * s;
            let hi = (grid.quant_max() - z) as f32 * s;
            let lo = w.floats(&format!("{name}.min"), &[], &[lo]);
            let hi = w.floats(&format!("{name}.max"), &[], &[hi]);
            x = w.step(node.node, "Clip", &[x, lo, hi], Vec::new(), "clipped");
        }
        let inputs = [x, scale.clone(), zero.clone()];
        let codes = w.step(node.node, "QuantizeLinear", &inputs, Vec::new(), "codes");
        w.op(
            "DequantizeLinear",
            name,
            &[codes, scale, zero],
            node.out.clone(),
            Vec::new(),
        );
        Ok(())
    }
}

//! ONNX export: the graph as a standard QDQ model (`model.onnx`) that onnxruntime, TensorRT and
//! OpenVINO load.
//!
//! # What is written
//!
//! ONNX opset [`OPSET`] (IR version 7), one input `input` (`[N, features]` or
//! `[N, channels, height, width]`), one output `logits`, `N` a symbolic (dynamic) batch. Each
//! op of the [graph](crate::graph) becomes standard operators:
//!
//! | graph op | ONNX |
//! |---|---|
//! | `QuantizeDequantize` | `QuantizeLinear` → `DequantizeLinear` (per tensor), after a `Clip` when the grid is narrower than int8/uint8 |
//! | weights held as codes | int8/uint8 initializer → `DequantizeLinear` (per axis on the output channels for per-channel weights) |
//! | accumulator bias | int32 initializer → `DequantizeLinear` at scale `s_input · s_weight[o]`, zero point 0 (or a float initializer, see [`OnnxConvention`]) |
//! | `Linear` | `Gemm` (`transB = 1`) on `[N, features]`; `MatMul` + `Add` over the last axis of larger values |
//! | `Conv2d` | `Conv` (`group`, `pads`, `strides`) |
//! | `ChannelAffine` | `Mul` + `Add` by per-channel initializers |
//! | `Relu`, `Tanh`, `Sigmoid`, `Add` | the operator of that name |
//! | `MaxPool2d`, `AvgPool2d` | `MaxPool`, `AveragePool` (`count_include_pad = 1`) |
//! | `Flatten` | `Flatten` (`axis = 1`) |
//! | `LayerNorm` | `ReduceMean`, `Sub`, `Mul`, `ReduceMean`, `Add` ε, `Sqrt`, `Div`, then `Mul` γ and `Add` β over the last axis (`LayerNormalization` came with opset 17) |
//! | `Gelu` | `x · ½(1 + Erf(x/√2))` (`Gelu` came with opset 20) |
//! | `Softmax` | `Softmax` over the last axis |
//! | `AttentionScores`, `AttentionContext` | per head: `Reshape` + `Transpose` into `[N, heads, tokens, d]`, `MatMul` (and `Mul` by `1/√d` for the scores); the context's heads are transposed and reshaped back to `[N, tokens, features]` |
//! | `ImageTokens` | `Reshape` + `Transpose` of `[N, C, H, W]` into `[N, H·W, C]`, `Add` of the position embedding |
//! | `MeanTokens` | `ReduceMean` over the tokens |
//!
//! A runtime that fuses each `DequantizeLinear` → op → `QuantizeLinear` pattern runs the model on
//! integers; one that does not runs it in float on the dequantized values. Either computes
//! what the fake-quantized model computes, up to [`LOGIT_TOLERANCE`]. LayerNorm, GELU and the
//! softmax are written as their exact functions, as the graph's float reference computes them:
//! quant's integer runtime (and QAT, which trains through the same kernels) computes them in
//! fixed point within a small fraction of an output step, so a value that falls that close to a
//! rounding boundary of the next quantizer can land one level apart (see the README's
//! Transformers section for the measured agreement).
//!
//! # Widths below 8 bits
//!
//! Codes of any width from 2 to 8 bits are written as int8 (signed grids) or uint8 (unsigned
//! grids) whose values lie on the narrower grid: weight codes are stored as they are, and an
//! activation whose grid is narrower than the storage type (4 bits, or 8 bits with
//! `narrow_range`) is clipped to the grid's real range `[(q_min - z)·s, (q_max - z)·s]` just
//! before its `QuantizeLinear`, which then yields exactly the codes of the narrow grid. Opset
//! 21's int4/uint4 was not chosen: it covers 4 bits only (not 2, 3, 5, 6 or 7), TensorRT runs
//! int4 for weights only, and onnxruntime and OpenVINO run it only on recent versions, while
//! int8 with the narrow range is loaded by every QDQ runtime and computes the same values.
//! Grids wider than 8 bits are refused ([`GraphError::Unsupported`]): opset 13 has no int16.
//!
//! # Rounding
//!
//! ONNX's `QuantizeLinear` rounds ties to even; an activation quantizer with any other
//! [`RoundingPolicy`] is refused with [`GraphError::Unsupported`] naming its node, and
//! nothing is written. Weights are stored as the codes the model computes with, so their
//! quantizers' rounding (applied once, at export) needs no ONNX counterpart and is accepted.
//!
//! ```
//! use quant_runtime::export::ExportFormat;
//! use quant_runtime::export::onnx::{OnnxConvention, OnnxFormat};
//! use quant_runtime::graph::{GraphBuilder, Op};
//!
//! let mut g = GraphBuilder::new(&[4])?;
//! let x = g.input();
//! let y = g.add("act", Op::Relu, &[x])?;
//! let graph = g.finish(y, Default::default())?;
//! let files = OnnxFormat::new(OnnxConvention::Standard).encode(&graph)?;
//! assert_eq!(files[0].0, "model.onnx");
//! # Ok::<(), quant_runtime::GraphError>(())
//! ```

pub(crate) mod proto;
#[cfg(test)]
mod tests;
pub(crate) mod writer;

use quant_core::RoundingPolicy;

use super::ExportFormat;
use crate::graph::{ExportedQuantizer, Graph};
use crate::GraphError;

/// The file [`OnnxFormat`] writes into an export directory.
pub const ONNX_FILE: &str = "model.onnx";

/// The ONNX operator set the model imports: the first with per-axis `QuantizeLinear` /
/// `DequantizeLinear`, loaded by TensorRT 8+, OpenVINO, onnxruntime 1.8+ and tract.
pub const OPSET: i64 = 13;

/// The ONNX IR version written (the one that introduced opset 13).
pub const IR_VERSION: i64 = 7;

/// How far an ONNX runtime's logits may lie from the fake-quantized model's (the graph's float
/// reference, [`crate::graph::evaluate`]), relative to the largest |logit| of the batch, on
/// the samples where every activation gets the same code in both.
///
/// Both compute the same float operators on the same dequantized values, so the logits differ
/// by the order of `f32` sums only (a runtime's GEMM blocks and vectorises them): below `1e-6`
/// of the range on the committed configs, a margin of 100 here. An activation code can
/// differ, by one level, in two cases: a value within `f32` rounding of a rounding boundary,
/// where the two sums round to different sides; and an exact tie, because ONNX's
/// `QuantizeLinear` *divides* by the scale where quant (like PyTorch, and tract per tensor)
/// multiplies by the `f32` reciprocal of the scale, and `x / s` and `x · (1/s)` can fall on
/// different sides of the half-way point. Such a sample's logits differ by that level's
/// contribution, which no relative bound covers. tests/integration/onnx.rs therefore requires this
/// tolerance on at least 99% of the samples (all but at most one of the 360 digits test
/// samples, measured), and predictions (the argmax) that agree with quant's integer model on
/// at least 99.7% of them (all, measured).
pub const LOGIT_TOLERANCE: f32 = 1e-4;

/// The quantization layout an ONNX export follows: which deployment runtime it is written for.
///
/// Every convention writes the same operators and computes the same values; they differ in
/// what they accept and in how a bias is stored. Each platform of quant-dfdx carries its
/// convention (`Platform::onnx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnnxConvention {
    /// onnxruntime's QDQ format (what `onnxruntime.quantization.quantize_static` writes): int8
    /// or uint8 codes with any zero points, int32 biases at `s_input · s_weight[o]` behind a
    /// `DequantizeLinear`.
    #[default]
    Standard,
    /// TensorRT's explicit quantization: every `QuantizeLinear` / `DequantizeLinear` int8 with
    /// zero point 0 (TensorRT's Q/DQ layers are symmetric int8 only), per-channel weights on
    /// the output axis, biases as float initializers (TensorRT refuses a `DequantizeLinear` of
    /// int32 and quantizes the bias itself). A quantizer that is unsigned or has a non-zero
    /// zero point is refused, naming its node. The `TensorRtInt8` preset's activations are
    /// narrow-range (`[-127, 127]`), so each gets a `Clip` before its `QuantizeLinear`, which
    /// TensorRT runs as a pointwise op.
    TensorRt,
    /// OpenVINO's QDQ import (its ONNX frontend turns each activation Q/DQ pair into a
    /// `FakeQuantize` and each weight `DequantizeLinear` into int8 constants with a
    /// dequantization, which its low-precision transformations run on int8): signed weights
    /// with zero point 0, activations int8 or uint8 with any zero point, biases as float
    /// initializers (as NNCF, OpenVINO's quantization tool, writes them). A weight quantizer
    /// that is unsigned or has a non-zero zero point is refused, naming its node.
    OpenVino,
}

impl OnnxConvention {
    /// The convention's name, as the model's metadata records it.
    pub fn name(self) -> &'static str {
        match self {
            OnnxConvention::Standard => "Standard",
            OnnxConvention::TensorRt => "TensorRt",
            OnnxConvention::OpenVino => "OpenVino",
        }
    }

    /// Whether an accumulator bias is written as int32 codes behind a `DequantizeLinear`
    /// (otherwise as the float values it stands for).
    fn int32_bias(self) -> bool {
        self == OnnxConvention::Standard
    }

    /// Checks a quantizer against the convention: `role` is `activation` or `weights`.
    pub(crate) fn check(
        self,
        node: &str,
        role: Role,
        q: &ExportedQuantizer,
    ) -> Result<(), GraphError> {
        let inferable = &q.inferable;
        let grid = inferable.grid();
        let refuse = |reason: String| {
            Err(GraphError::Unsupported {
                layer: node.to_string(),
                reason,
            })
        };
        if grid.bits() > 8 {
            return refuse(format!(
                "{} quantizer has {} bits; ONNX opset {OPSET} holds codes of at most 8 bits (int8/uint8): use a width from 2 to 8",
                role.name(),
                grid.bits()
            ));
        }
        if role == Role::Activation && inferable.rounding() != RoundingPolicy::HalfEven {
            return refuse(format!(
                "activation quantizer rounds {}; ONNX QuantizeLinear rounds ties to even only: set `rounding = \"HalfEven\"` for this slot, or export without ONNX",
                inferable.rounding()
            ));
        }
        let nonzero = inferable.qparams().zero_points().iter().find(|z| **z != 0);
        let strict = match (self, role) {
            (OnnxConvention::TensorRt, _) => Some("TensorRT's Q/DQ layers"),
            (OnnxConvention::OpenVino, Role::Weights) => Some("OpenVINO's int8 weights"),
            _ => None,
        };
        if let Some(who) = strict {
            if !grid.signed() || nonzero.is_some() {
                return refuse(format!(
                    "{} quantizer is {} with zero point {}; {who} are signed (int8) with zero point 0: use a symmetric signed quantizer (method `Symmetric`, `signed = true`), or another ONNX convention",
                    role.name(),
                    if grid.signed() { "signed" } else { "unsigned" },
                    nonzero.copied().unwrap_or(0)
                ));
            }
        }
        Ok(())
    }
}

/// What a quantizer quantizes, for the convention checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Activation,
    Weights,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Activation => "the activation",
            Role::Weights => "the weights",
        }
    }
}

/// The ONNX export format: writes [`ONNX_FILE`] (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OnnxFormat {
    /// The layout written.
    pub convention: OnnxConvention,
}

impl OnnxFormat {
    /// The format with `convention`.
    pub const fn new(convention: OnnxConvention) -> OnnxFormat {
        OnnxFormat { convention }
    }

    /// The ONNX model of `graph`, serialised.
    ///
    /// # Errors
    /// [`GraphError::Invalid`] for a graph that does not check; [`GraphError::Unsupported`]
    /// naming the node for what ONNX (or the convention) cannot express: an activation
    /// rounding other than ties to even, a grid wider than 8 bits, a quantizer the convention
    /// refuses, a model larger than protobuf's 2 GiB.
    pub fn to_bytes(&self, graph: &Graph) -> Result<Vec<u8>, GraphError> {
        writer::write(graph, self.convention)
    }
}

impl ExportFormat for OnnxFormat {
    fn name(&self) -> &'static str {
        "ONNX"
    }

    fn encode(&self, graph: &Graph) -> Result<Vec<(&'static str, Vec<u8>)>, GraphError> {
        Ok(vec![(ONNX_FILE, self.to_bytes(graph)?)])
    }
}

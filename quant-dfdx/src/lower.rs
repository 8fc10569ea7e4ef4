//! Lowering a quantized model into the [graph IR](quant_runtime::graph): each module adds its
//! nodes ([`QuantizedModule::lower`]), reading its quantizers in their current modes. Arrows run
//! one way: the layers know the graph, the graph (in `quant-runtime`) knows nothing of them.

use std::collections::BTreeMap;

use quant_runtime::export::onnx::{OnnxConvention, OnnxFormat};
use quant_runtime::graph::{
    ExportedQuantizer, Graph, GraphBuilder, Op, ParamValues, Parameter, QuantizerOrigin, ValueId,
};
use quant_runtime::GraphError;

use crate::layers::{QuantizedModule, QuantizerControl, QuantizerMode};

/// Lowers `model` (named from the root) into a graph whose float input has per-sample shape
/// `input_shape`, recording `info` (model name, policy, seed, ...) in it.
///
/// The graph computes what the model's forward pass computes in its current modes: a quantizer
/// that quantizes becomes a quantize node (activations) or integer codes (weights); a disabled
/// one leaves its value float.
///
/// # Errors
/// A module with no graph form, a quantizer still calibrating or not calibrated, a shape that
/// does not fit.
pub fn export_model<M: QuantizedModule + ?Sized>(
    model: &M,
    input_shape: &[usize],
    info: BTreeMap<String, String>,
) -> Result<Graph, GraphError> {
    let mut g = GraphBuilder::new(input_shape)?;
    let x = g.input();
    let y = model.lower("", &mut g, x)?;
    g.finish(y, info)
}

/// Lowers `model` ([`export_model`]) and returns its ONNX model in `convention`, serialised:
/// the bytes of a `model.onnx`. To write it beside quant's own files, pass an [`OnnxFormat`]
/// to [`quant_runtime::export::save`].
///
/// # Errors
/// See [`export_model`] and [`OnnxFormat::to_bytes`].
pub fn export_onnx<M: QuantizedModule + ?Sized>(
    model: &M,
    input_shape: &[usize],
    info: BTreeMap<String, String>,
    convention: OnnxConvention,
) -> Result<Vec<u8>, GraphError> {
    OnnxFormat::new(convention).to_bytes(&export_model(model, input_shape, info)?)
}

/// Quantize nodes from a model's live quantizers, added to a [`GraphBuilder`].
pub trait QuantizeNodes {
    /// Adds the quantizer of slot `slot` (its dotted name, `fc1.input`) on `x`: a
    /// [`Op::QuantizeDequantize`] node while the quantizer quantizes, nothing (`x` itself) while it is
    /// disabled or unconfigured, so the graph computes what the model's forward pass does.
    ///
    /// # Errors
    /// A quantizer still calibrating, or whose parameters cannot be read.
    fn quantize(
        &mut self,
        slot: &str,
        quantizer: &dyn QuantizerControl,
        x: ValueId,
    ) -> Result<ValueId, GraphError> {
        self.quantize_as(slot, slot, quantizer, x)
    }

    /// [`QuantizeNodes::quantize`] with a node name of its own: a quantizer that quantizes
    /// several values (an add's two inputs) adds one node per value, `node`, all of slot
    /// `slot`.
    ///
    /// # Errors
    /// See [`QuantizeNodes::quantize`].
    fn quantize_as(
        &mut self,
        node: &str,
        slot: &str,
        quantizer: &dyn QuantizerControl,
        x: ValueId,
    ) -> Result<ValueId, GraphError>;
}

impl QuantizeNodes for GraphBuilder {
    fn quantize_as(
        &mut self,
        node: &str,
        slot: &str,
        quantizer: &dyn QuantizerControl,
        x: ValueId,
    ) -> Result<ValueId, GraphError> {
        match exported_quantizer(slot, quantizer)? {
            Some(q) => self.add(
                node,
                Op::QuantizeDequantize(quant_runtime::graph::QuantizeDequantize { quantizer: q }),
                &[x],
            ),
            None => Ok(x),
        }
    }
}

/// The exported form of a quantizer that quantizes in its current mode; `None` when it passes
/// values through (disabled or unconfigured).
///
/// # Errors
/// A quantizer still calibrating or not initialised (named `slot`), or whose parameters
/// cannot be read.
pub fn exported_quantizer(
    slot: &str,
    quantizer: &dyn QuantizerControl,
) -> Result<Option<ExportedQuantizer>, GraphError> {
    let mode = quantizer.mode();
    let Some(d) = quantizer.describe() else {
        return Ok(None);
    };
    if !mode.quantizes() {
        if mode == QuantizerMode::Calibrating {
            return Err(GraphError::Unsupported {
                layer: slot.to_string(),
                reason:
                    "the quantizer is still calibrating; finish calibration (or train it) first"
                        .into(),
            });
        }
        return Ok(None);
    }
    let inferable = quantizer
        .inferable()?
        .ok_or_else(|| GraphError::Unsupported {
            layer: slot.to_string(),
            reason: "the quantizer is not calibrated; calibrate or train it first".into(),
        })?;
    Ok(Some(ExportedQuantizer {
        inferable,
        origin: QuantizerOrigin {
            training_method: d.training_method.name().to_string(),
            quantizer: d.metadata.map(|m| m.path()),
            bits: d.bits,
            method: d.method,
        },
    }))
}

/// A weight parameter `tensor` of `shape` (output channels first): codes on the weights
/// quantizer's grid while it quantizes (named `slot` in errors), the float values otherwise.
///
/// # Errors
/// See [`exported_quantizer`]; values that do not fit the quantizer.
pub fn weight_parameter(
    tensor: &str,
    values: &[f32],
    shape: &[usize],
    slot: &str,
    quantizer: &dyn QuantizerControl,
) -> Result<Parameter, GraphError> {
    Ok(Parameter {
        tensor: tensor.to_string(),
        values: match exported_quantizer(slot, quantizer)? {
            Some(q) => ParamValues::Codes {
                codes: q
                    .inferable
                    .quantize(values, shape)
                    .map_err(|e| e.at(slot.to_string()))?,
                quantizer: q,
            },
            None => ParamValues::Float(values.to_vec()),
        },
    })
}

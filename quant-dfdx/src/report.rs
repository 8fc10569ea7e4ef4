//! Per-layer report after calibration or QAT: each quantized layer's quantizers (slot, id,
//! method, bits, scale range) and its quantization error, the SQNR in dB of the layer's output
//! in the quantized model against the same layer's output with every quantizer disabled, on
//! one batch (so the error accumulated through the earlier layers counts, as a deployment
//! would see it). Layer outputs come from the model's graph ([`quant_runtime::graph`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use quant_core::{QuantizationMethod, TrainingMethod};

use crate::layers::{QuantizedModule, QuantizedModuleExt, QuantizerMode};
use crate::lower::export_model;
use quant_runtime::graph::{evaluate, Op};
use quant_runtime::GraphError;

/// One quantizer of a layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantizerReport {
    /// The slot's name (`weights`, `input`, ...).
    pub slot: String,
    /// Training method id.
    pub training_method: TrainingMethod,
    /// Grid layout.
    pub method: QuantizationMethod,
    /// Bit width.
    pub bits: u32,
    /// Per-channel parameters.
    pub per_channel: bool,
    /// Observer used in calibration.
    pub observer: String,
    /// Smallest scale.
    pub scale_min: f32,
    /// Largest scale.
    pub scale_max: f32,
    /// Registry path of the trainable quantizer.
    pub quantizer: Option<String>,
}

/// One quantized layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerReport {
    /// Dotted layer name.
    pub layer: String,
    /// Its quantizers (none if it was left float).
    pub quantizers: Vec<QuantizerReport>,
    /// SQNR of the layer's output against the float model, in dB (`None` when not measured;
    /// infinite when identical).
    pub sqnr_db: Option<f64>,
}

/// SQNR in dB of `quantized` against `reference`: `10·log10(Σ r² / Σ (r - q)²)`; infinite when
/// they are equal.
pub fn sqnr_db(reference: &[f32], quantized: &[f32]) -> f64 {
    let signal: f64 = reference.iter().map(|r| (*r as f64).powi(2)).sum();
    let noise: f64 = reference
        .iter()
        .zip(quantized)
        .map(|(r, q)| (*r as f64 - *q as f64).powi(2))
        .sum();
    if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal / noise).log10()
    }
}

/// The per-layer report of `quantized` on the batch `x` (whole samples of `input_shape`): each
/// layer's configured quantizers, and for each layer with weights, add, attention matrix
/// product, LayerNorm and GELU ([`Op::is_measured_layer`]) the SQNR of its output
/// against the same model with every quantizer disabled, so that it measures quantization
/// alone. Both models run through their graphs ([`quant_runtime::graph::evaluate`]); a model holding a
/// layer with no graph form (a user's own layer) gets its quantizers reported without SQNRs.
///
/// # Errors
/// A model part with no graph form, a quantizer still calibrating, parameters that cannot be
/// read, `x` not whole samples.
pub fn layer_report<Q: QuantizedModule + Clone>(
    quantized: &Q,
    input_shape: &[usize],
    x: &[f32],
) -> std::result::Result<Vec<LayerReport>, GraphError> {
    let mut reference = quantized.clone();
    reference.set_mode("*", QuantizerMode::Disabled)?;
    let measured = |_: usize, op: &Op| op.is_measured_layer();
    // A model holding a layer with no graph form (a user's own layer) still gets its
    // quantizers reported, without SQNRs.
    let taps = |m: &Q| -> std::result::Result<Vec<(String, Vec<f32>)>, GraphError> {
        match export_model(m, input_shape, BTreeMap::new()) {
            Ok(graph) => Ok(evaluate(&graph, x, &measured)?.kept),
            Err(GraphError::Unsupported { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    };
    let float_by_name: BTreeMap<String, Vec<f32>> = taps(&reference)?.into_iter().collect();
    let mut layers: Vec<LayerReport> = taps(quantized)?
        .into_iter()
        .map(|(name, q)| LayerReport {
            sqnr_db: float_by_name.get(&name).map(|f| sqnr_db(f, &q)),
            layer: name,
            quantizers: Vec::new(),
        })
        .collect();
    quantized.clone().visit_slots("", &mut |s| {
        let Some(d) = s.quantizer.describe() else {
            return Ok(());
        };
        let scales = s
            .quantizer
            .qparams()?
            .map(|p| p.scales().to_vec())
            .unwrap_or_default();
        let report = QuantizerReport {
            slot: s.slot.name.to_string(),
            training_method: d.training_method,
            method: d.method,
            bits: d.bits,
            per_channel: d.per_channel,
            observer: d.observer,
            scale_min: scales.iter().copied().fold(f32::INFINITY, f32::min),
            scale_max: scales.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            quantizer: d.metadata.map(|m| m.path()),
        };
        match layers.iter_mut().find(|l| l.layer == s.layer) {
            Some(l) => l.quantizers.push(report),
            None => layers.push(LayerReport {
                layer: s.layer.to_string(),
                quantizers: vec![report],
                sqnr_db: None,
            }),
        }
        Ok(())
    })?;
    Ok(layers)
}

/// The report as a text table.
pub fn layer_table(layers: &[LayerReport]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "  {:<10} {:<8} {:<6} {:<11} {:>4} {:<5} {:<16} {:>21} {:>9}",
        "layer", "slot", "id", "method", "bits", "axis", "observer", "scale range", "SQNR dB"
    );
    for l in layers {
        let sqnr = match l.sqnr_db {
            Some(v) if v.is_infinite() => "inf".to_string(),
            Some(v) => format!("{v:.1}"),
            None => "-".to_string(),
        };
        if l.quantizers.is_empty() {
            let _ = writeln!(s, "  {:<10} (float){:>82}", l.layer, sqnr);
        }
        for (i, q) in l.quantizers.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {:<10} {:<8} {:<6} {:<11} {:>4} {:<5} {:<16} {:>9.3e}..{:<9.3e} {:>9}",
                if i == 0 { l.layer.as_str() } else { "" },
                q.slot,
                q.training_method.name(),
                q.method.name(),
                q.bits,
                if q.per_channel { "ch" } else { "tensor" },
                q.observer,
                q.scale_min,
                q.scale_max,
                if i == 0 { sqnr.as_str() } else { "" },
            );
        }
    }
    s
}

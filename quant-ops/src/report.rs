//! Per-layer report after calibration or QAT: each quantized layer's quantizers (id, method,
//! bits, scale range) and its quantization error, the SQNR in dB of the layer's output in the
//! quantized model against the same layer's output in the float model on one batch (so the
//! error accumulated through the earlier layers counts, as a deployment would see it).
//!
//! Layer outputs are recorded by [`Trace`], implemented for the built-in layers and tuples; a
//! model derived with the macros gets it too.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use dfdx::nn::modules::{BatchNorm1D, BatchNorm2D, Linear, ReLU, Sigmoid, Tanh};
use dfdx::prelude::*;
use serde::Serialize;

use quant_core::{QuantError, QuantizationMethod, Result, TrainingMethod};

use crate::layers::{
    join_name, FakeQuantizer, Float, QConv2d, QLinear, QuantInput, QuantizedModule,
    QuantizerControl,
};
use crate::nn::{AvgPool2d, Conv2d, Flatten, MaxPool2d};

/// One quantizer of a layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantizerReport {
    /// `weights` or `input`.
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

/// Records the output of every layer with weights, by dotted name, in evaluation mode.
pub trait Trace<X> {
    /// The module's output.
    type Output;
    /// Runs the module on `x`, appending `(name, output values)` for layers with weights.
    ///
    /// # Errors
    /// The module's forward errors.
    fn trace(&self, x: X, name: &str, taps: &mut Vec<(String, Vec<f32>)>) -> Result<Self::Output>;
}

/// A module traced as a whole (not a tuple); `TAP` says whether its output is recorded.
pub trait TraceLeaf {
    /// Whether the output is recorded (layers with weights).
    const TAP: bool;
}

impl<X, S: Shape, M: TraceLeaf + Module<X, Output = Tensor<S, f32, Cpu>>> Trace<X> for M
where
    M::Error: Into<QuantError>,
{
    type Output = Tensor<S, f32, Cpu>;
    fn trace(&self, x: X, name: &str, taps: &mut Vec<(String, Vec<f32>)>) -> Result<Self::Output> {
        let y = self.try_forward(x).map_err(Into::into)?;
        if M::TAP {
            taps.push((name.to_string(), y.as_vec()));
        }
        Ok(y)
    }
}

macro_rules! leaves {
    ($tap:expr => $($ty:ty $(where [$($g:tt)*])?),+ $(,)?) => {
        $(impl$(<$($g)*>)? TraceLeaf for $ty { const TAP: bool = $tap; })+
    };
}
leaves!(true => Linear<I, O, f32, Cpu> where [const I: usize, const O: usize]);
leaves!(true => QLinear<I, O, WQ, AQ> where [const I: usize, const O: usize, WQ: FakeQuantizer, AQ: FakeQuantizer]);
leaves!(true => Conv2d<C, O, K, S, P, f32, Cpu> where [const C: usize, const O: usize, const K: usize, const S: usize, const P: usize]);
leaves!(true => QConv2d<C, O, K, S, P, WQ, AQ> where [const C: usize, const O: usize, const K: usize, const S: usize, const P: usize, WQ: FakeQuantizer, AQ: FakeQuantizer]);
leaves!(false => ReLU, Tanh, Sigmoid, Float<M> where [M], QuantInput<M> where [M]);
leaves!(false => MaxPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize], AvgPool2d<K, S, P> where [const K: usize, const S: usize, const P: usize], Flatten<N> where [const N: usize]);
leaves!(false => BatchNorm1D<C, f32, Cpu> where [const C: usize], BatchNorm2D<C, f32, Cpu> where [const C: usize]);

/// `Trace` for tuples: each element's output feeds the next, names are the indices. Each
/// element is listed with the type it receives.
macro_rules! tuple_trace {
    ($([$t:ident $i:tt $input:ty])+ ; $last:ident) => {
        impl<X, $($t: Trace<$input>),+> Trace<X> for ($($t,)+) {
            type Output = $last::Output;
            fn trace(&self, x: X, name: &str, taps: &mut Vec<(String, Vec<f32>)>) -> Result<Self::Output> {
                $(let x = self.$i.trace(x, &join_name(name, stringify!($i)), taps)?;)+
                Ok(x)
            }
        }
    };
}
tuple_trace!([A 0 X]; A);
tuple_trace!([A 0 X] [B 1 A::Output]; B);
tuple_trace!([A 0 X] [B 1 A::Output] [C 2 B::Output]; C);
tuple_trace!([A 0 X] [B 1 A::Output] [C 2 B::Output] [D 3 C::Output]; D);
tuple_trace!([A 0 X] [B 1 A::Output] [C 2 B::Output] [D 3 C::Output] [E 4 D::Output]; E);
tuple_trace!([A 0 X] [B 1 A::Output] [C 2 B::Output] [D 3 C::Output] [E 4 D::Output] [F 5 E::Output]; F);

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

/// The per-layer report of `quantized`, with SQNRs against `float` on the batch `x` (both
/// models traced in evaluation mode).
///
/// # Errors
/// A forward pass fails, or a quantizer's parameters cannot be read.
pub fn layer_report<X: Clone, F: Trace<X>, Q: Trace<X> + QuantizedModule>(
    float: &F,
    quantized: &mut Q,
    x: X,
) -> Result<Vec<LayerReport>> {
    let mut float_taps = Vec::new();
    float.trace(x.clone(), "", &mut float_taps)?;
    let mut quant_taps = Vec::new();
    quantized.trace(x, "", &mut quant_taps)?;
    let float_by_name: BTreeMap<String, Vec<f32>> = float_taps.into_iter().collect();
    let mut layers: Vec<LayerReport> = quant_taps
        .iter()
        .map(|(name, q)| LayerReport {
            layer: name.clone(),
            quantizers: Vec::new(),
            sqnr_db: float_by_name.get(name).map(|f| sqnr_db(f, q)),
        })
        .collect();
    quantized.visit_quantizers("", &mut |name, q: &mut dyn QuantizerControl| {
        let Some(d) = q.describe() else { return Ok(()) };
        let (layer, slot) = match name.rsplit_once('.') {
            Some((layer, slot)) => (
                layer.to_string(),
                slot.trim_end_matches("_quantizer").to_string(),
            ),
            None => (
                String::new(),
                name.trim_end_matches("_quantizer").to_string(),
            ),
        };
        let scales = q
            .qparams()?
            .map(|p| p.scales().to_vec())
            .unwrap_or_default();
        let report = QuantizerReport {
            slot: if slot == "weight" {
                "weights".into()
            } else {
                slot
            },
            training_method: d.training_method,
            method: d.method,
            bits: d.bits,
            per_channel: d.per_channel,
            observer: d.observer,
            scale_min: scales.iter().copied().fold(f32::INFINITY, f32::min),
            scale_max: scales.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            quantizer: d.metadata.map(|m| m.path()),
        };
        match layers.iter_mut().find(|l| l.layer == layer) {
            Some(l) => l.quantizers.push(report),
            None => layers.push(LayerReport {
                layer,
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

//! What runs between calibration and QAT on the weights of Linear and Conv2d layers: learned
//! rounding (AdaRound or GPTQ) and bias correction, chosen per weights slot by the policy
//! (`learned_rounding = "AdaRound"` or `"GPTQ"`, `bias_correction = true`, per kind or per
//! name like every other setting), with the samples both use and AdaRound's optimisation in the
//! policy's `[adaround]` table, GPTQ's dampening and order in its `[gptq]` table.
//!
//! [`refine`] walks the layers in graph order on a few hundred unlabeled samples. Each layer is
//! fitted on its float inputs (the model with every quantizer disabled) and on the inputs the
//! quantized model gives it, the earlier layers already refined ("asymmetric" reconstruction):
//!
//! - **AdaRound** (Nagel et al., 2020) chooses, for each weight, the code below or above it on
//!   the calibrated grid, minimising the layer's output error `E‖W x − W̃ x̃‖²` with a
//!   regulariser that drives each soft choice to 0 or 1. Where its error is not below nearest
//!   rounding's (it rarely is not), the layer keeps nearest rounding.
//! - **GPTQ** (Frantar et al., 2022) rounds the same loss one input column at a time, moving
//!   the columns not yet rounded to absorb each column's error through the inverse of the
//!   inputs' second moments: one pass instead of AdaRound's iterations (a layer of the bundled
//!   models takes milliseconds), without AdaRound's restriction to the codes either side of
//!   each weight. The same fallback to nearest rounding applies.
//! - **Bias correction** (Nagel et al., 2019) adds the mean output error to the bias,
//!   `b ← b + E[W x] − E[W̃ x̃]`, per output channel.
//!
//! The model's weights become the dequantized learned codes and its bias the corrected one, so
//! the fake-quantized model, the export and the integer model all use the learned codes; the
//! quantizers' scales stay as calibrated.
//!
//! Before calibration, [`smooth()`] (SmoothQuant, `smoothing = α` on the input slots of Linear
//! layers a LayerNorm feeds) moves the spread of the normalised activations' channels into the
//! weights, the float model unchanged.

mod adaround;
mod gptq;
mod smooth;

pub use smooth::{smooth, SmoothedLayerNorm, Smoothing};

use std::collections::{BTreeMap, BTreeSet};

use dfdx::nn::tensor_collection::{
    RecursiveWalker, ScalarOptions, TensorCollection, TensorOptions, TensorVisitor, ViewTensorMut,
    ViewTensorName, ViewTensorRef,
};
use dfdx::prelude::*;
use serde::{Deserialize, Serialize};

use quant_core::{QuantError, QuantizationTarget};

use crate::convert::LayerKind;
use crate::layers::{QuantizedModule, QuantizedModuleExt, QuantizerMode};
use crate::lower::export_model;
use crate::policy::Policy;
use quant_core::accumulator::quantize_bias;
use quant_runtime::graph::{evaluate, Graph, Op, ParamValues, Parameter};
use quant_runtime::GraphError;

use adaround::{Moments, RowGrid, Schedule};

/// How a weights slot's values round onto its grid once calibrated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum WeightRounding {
    /// To the nearest code (ties as the quantizer's rounding policy says).
    #[default]
    Nearest,
    /// Learned per layer by AdaRound: each weight to the code below or above it.
    AdaRound,
    /// Learned per layer by GPTQ: column by column, the later columns absorbing each one's
    /// error. Written `"GPTQ"`.
    #[serde(rename = "GPTQ", alias = "Gptq")]
    Gptq,
}

/// What runs on one weights slot after calibration ([`Policy::refinement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Refinement {
    /// The rounding of the weights.
    pub rounding: WeightRounding,
    /// Whether the bias absorbs the mean output error.
    pub bias_correction: bool,
}

impl Refinement {
    /// Whether it changes anything.
    pub fn is_some(&self) -> bool {
        self.rounding != WeightRounding::Nearest || self.bias_correction
    }
}

/// The policy's `[adaround]` table: how many samples the post-calibration steps use, and
/// AdaRound's optimisation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaRoundSettings {
    /// Calibration samples (the first of the calibration batches) both steps fit on.
    pub samples: usize,
    /// Most input rows per layer (a convolution has one per output position and sample;
    /// beyond this, every n-th row).
    pub max_rows: usize,
    /// Adam steps per layer.
    pub iterations: usize,
    /// Adam's learning rate on the soft rounding variables.
    pub learning_rate: f64,
    /// Weight of the rounding regulariser, against the reconstruction loss measured in units
    /// of its mean curvature per weight code (so that one weight suits layers of any scale).
    pub regularization: f64,
}

impl Default for AdaRoundSettings {
    fn default() -> AdaRoundSettings {
        AdaRoundSettings {
            samples: 256,
            max_rows: 1 << 16,
            iterations: 1000,
            learning_rate: 0.01,
            regularization: 1.0,
        }
    }
}

impl AdaRoundSettings {
    /// Checks every field, naming the first one out of range.
    ///
    /// # Errors
    /// [`QuantError::InvalidValue`] naming the field and its range.
    pub fn validate(&self) -> quant_core::Result<()> {
        let bad = |field: &str, value: String, expected: &str| {
            Err(QuantError::InvalidValue {
                what: format!("adaround.{field}"),
                value,
                expected: expected.into(),
            })
        };
        if !(1..=1 << 20).contains(&self.samples) {
            return bad("samples", self.samples.to_string(), "1 to 1048576 samples");
        }
        if !(1..=1 << 24).contains(&self.max_rows) {
            return bad("max_rows", self.max_rows.to_string(), "1 to 16777216 rows");
        }
        if !(1..=1_000_000).contains(&self.iterations) {
            return bad(
                "iterations",
                self.iterations.to_string(),
                "1 to 1000000 steps",
            );
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return bad(
                "learning_rate",
                self.learning_rate.to_string(),
                "a finite rate above 0",
            );
        }
        if !(self.regularization.is_finite() && self.regularization >= 0.0) {
            return bad(
                "regularization",
                self.regularization.to_string(),
                "a finite weight of at least 0",
            );
        }
        Ok(())
    }
}

/// The policy's `[gptq]` table: GPTQ's dampening and column order (its samples are
/// [`AdaRoundSettings::samples`] and [`AdaRoundSettings::max_rows`], shared by every step
/// after calibration).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GptqSettings {
    /// What GPTQ adds to the diagonal of the inputs' second moments, as a share of its mean
    /// (AutoGPTQ's `damp_percent`, with the same default): keeps inputs that never vary from
    /// making them singular, and pulls the weights toward their float values.
    pub damping: f64,
    /// Round the input columns in decreasing order of their energy (AutoGPTQ's `desc_act`),
    /// else in input order.
    pub act_order: bool,
}

impl Default for GptqSettings {
    fn default() -> GptqSettings {
        GptqSettings {
            damping: 0.01,
            act_order: true,
        }
    }
}

impl GptqSettings {
    /// Checks every field, naming the first one out of range.
    ///
    /// # Errors
    /// [`QuantError::InvalidValue`] naming the field and its range.
    pub fn validate(&self) -> quant_core::Result<()> {
        // Above 0 (a singular moment matrix has no inverse) and at most 100 times the mean
        // diagonal (beyond, the inputs no longer matter: nearest rounding).
        if !(self.damping.is_finite() && self.damping > 0.0 && self.damping <= 100.0) {
            return Err(QuantError::InvalidValue {
                what: "gptq.damping".into(),
                value: self.damping.to_string(),
                expected: "a share of the mean diagonal above 0 and at most 100 (0.01 is usual)"
                    .into(),
            });
        }
        Ok(())
    }
}

/// The first whole samples of `input_shape` in `samples`, at most `most` of them.
///
/// # Errors
/// Not one whole sample; `what` names the step that needs them.
fn whole_samples<'a>(
    samples: &'a [f32],
    input_shape: &[usize],
    most: usize,
    what: &str,
) -> Result<&'a [f32], QuantError> {
    let per_sample: usize = input_shape.iter().product();
    let n = (samples.len() / per_sample.max(1)).min(most);
    if n == 0 {
        return Err(QuantError::InvalidValue {
            what: format!("samples for {what}"),
            value: "0".into(),
            expected: "at least one whole sample of the model's input".into(),
        });
    }
    Ok(&samples[..n * per_sample])
}

/// The graph of `model` with every quantizer disabled: the float model it computes.
fn float_graph<M: QuantizedModule + Clone>(
    model: &M,
    input_shape: &[usize],
) -> Result<Graph, GraphError> {
    let mut reference = model.clone();
    reference.set_mode("*", QuantizerMode::Disabled)?;
    export_model(&reference, input_shape, BTreeMap::new())
}

/// What [`refine`] did to one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefinedLayer {
    /// The layer's dotted name.
    pub layer: String,
    /// The rounding its weights got (`Nearest` where the learned rounding did not beat it).
    pub rounding: WeightRounding,
    /// Whether its bias was corrected.
    pub bias_corrected: bool,
    /// Mean squared output error per output against the float layer on float inputs, with
    /// nearest rounding (before bias correction).
    pub error_nearest: f64,
    /// The same with the refined weights and bias.
    pub error_refined: f64,
    /// Share of AdaRound's soft rounding variables at exactly 0 or 1 when it stopped.
    pub settled: Option<f64>,
}

/// Learned rounding and bias correction of every Linear and Conv2d layer whose weights slot
/// asks for them under `policy` ([`Policy::refinement`]), on `samples` (whole samples of
/// `input_shape`, the first [`AdaRoundSettings::samples`] used); see the module docs. The
/// model must be calibrated (its quantizers frozen). Returns what each refined layer got, in
/// graph order, and the tensors it replaced with their float values; nothing when no slot
/// asks.
///
/// # Errors
/// A layer without a graph form, a quantizer still calibrating, a corrected bias that int32
/// cannot hold at its scale, invalid `[adaround]` settings; nothing in the model changes then.
pub fn refine<M>(
    model: &mut M,
    policy: &Policy,
    input_shape: &[usize],
    samples: &[f32],
) -> Result<(Vec<RefinedLayer>, RefinedTensors), GraphError>
where
    M: QuantizedModule + Clone + TensorCollection<f32, Cpu>,
{
    let settings = policy.adaround;
    settings.validate()?;
    policy.gptq.validate()?;
    let mut requests: BTreeMap<String, Refinement> = BTreeMap::new();
    let mut failed = None;
    model.visit_slots("", &mut |s| {
        if s.slot.target == QuantizationTarget::Weights
            && matches!(s.kind, LayerKind::Linear | LayerKind::Conv2d)
            && s.quantizer.describe().is_some()
        {
            match policy.refinement(s.layer, s.kind, s.slot) {
                Ok(r) if r.is_some() => {
                    requests.insert(s.layer.to_string(), r);
                }
                Ok(_) => {}
                Err(e) => failed = Some(e),
            }
        }
        Ok(())
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if requests.is_empty() {
        return Ok((Vec::new(), RefinedTensors::default()));
    }
    let x = whole_samples(
        samples,
        input_shape,
        settings.samples,
        "learned rounding and bias correction",
    )?;

    // The float inputs of every requested layer, from the model with every quantizer disabled.
    let float_graph = float_graph(model, input_shape)?;
    let float_layers = float_layers(&float_graph, x, &requests)?;

    let graph = export_model(model, input_shape, BTreeMap::new())?;
    let dev = Cpu::default();
    let mut refined = Vec::new();
    let mut assigned: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    // Each assigned tensor's layer.
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    let (_, rewritten) =
        quant_runtime::graph::evaluate_rewriting(&graph, x, &|_, _| false, &mut |i, input| {
            let node = &graph.nodes[i];
            let (Some(request), Some(float)) =
                (requests.get(&node.name), float_layers.get(&node.name))
            else {
                return Ok(None);
            };
            let layer = Layer::of(&graph, i)?;
            let fitted = layer.refine(
                &dev,
                *request,
                (&settings, &policy.gptq),
                float,
                input.values,
                (input.samples, input.shape),
            )?;
            assigned.insert(layer.weight.tensor.clone(), fitted.weight);
            owners.insert(layer.weight.tensor.clone(), node.name.clone());
            if let Some(bias) = fitted.bias {
                assigned.insert(layer.bias.tensor.clone(), bias);
                owners.insert(layer.bias.tensor.clone(), node.name.clone());
            }
            refined.push(fitted.report);
            Ok(Some(fitted.op))
        })?;
    // Write back, then check that the model now exports exactly the learned parameters.
    let mut updated = model.clone();
    assign(&mut updated, &assigned)?;
    let check = export_model(&updated, input_shape, BTreeMap::new())?;
    for (i, op) in &rewritten {
        if check.nodes.get(*i).map(|n| &n.op) != Some(op) {
            return Err(GraphError::Invalid {
                node: graph.nodes[*i].name.clone(),
                reason: "the model's quantizers do not reproduce the learned weights and bias (a quantizer that re-derives its scales from the weights?)".into(),
            });
        }
    }
    // What the model held before: the float values of every tensor refinement changed.
    let mut float = tensor_values(model)?;
    let replaced = RefinedTensors {
        tensors: assigned
            .into_iter()
            .filter_map(|(name, values)| {
                let before = float.remove(&name).filter(|f| *f != values)?;
                let layer = owners.remove(&name)?;
                Some((name, (layer, before, values)))
            })
            .collect(),
    };
    *model = updated;
    Ok((refined, replaced))
}

/// The tensors learned rounding and bias correction replaced in a model, each with the float
/// values it replaced: a refined model's weights hold the dequantized learned codes and its
/// biases the corrected ones, so disabling a weights quantizer alone would leave them rounded.
/// [`RefinedTensors::apply`] puts each refined layer's float or refined values back, so that a
/// measurement with a layer's weights float (a sensitivity analysis, a fallback) sees the float
/// layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RefinedTensors {
    /// Per tensor name: its layer, its float values, its refined values.
    tensors: BTreeMap<String, (String, Vec<f32>, Vec<f32>)>,
}

impl RefinedTensors {
    /// Writes into `model` the float values of every refined layer for which `float_layer`
    /// holds, and the refined values of the others.
    ///
    /// # Errors
    /// `model` lacks one of the tensors (not the model these were taken from).
    pub fn apply<M: TensorCollection<f32, Cpu>>(
        &self,
        model: &mut M,
        float_layer: impl Fn(&str) -> bool,
    ) -> Result<(), GraphError> {
        if self.tensors.is_empty() {
            return Ok(());
        }
        let values = self
            .tensors
            .iter()
            .map(|(name, (layer, float, refined))| {
                let v = if float_layer(layer) { float } else { refined };
                (name.clone(), v.clone())
            })
            .collect();
        assign(model, &values)
    }
}

/// The values of every tensor of `model`, by name.
fn tensor_values<M: TensorCollection<f32, Cpu>>(
    model: &M,
) -> Result<BTreeMap<String, Vec<f32>>, GraphError> {
    struct Read(BTreeMap<String, Vec<f32>>);
    impl TensorVisitor<f32, Cpu> for Read {
        type Viewer = (ViewTensorRef, ViewTensorName);
        type Err = QuantError;
        type E2 = f32;
        type D2 = Cpu;
        fn visit<S: Shape>(
            &mut self,
            _: TensorOptions<S, f32, Cpu>,
            (t, name): (&Tensor<S, f32, Cpu>, String),
        ) -> Result<Option<Tensor<S, f32, Cpu>>, QuantError> {
            self.0.insert(name, t.as_vec());
            Ok(None)
        }
        fn visit_scalar<N: num_traits::NumCast>(
            &mut self,
            _: ScalarOptions<N>,
            _: (&N, String),
        ) -> Result<Option<N>, QuantError> {
            Ok(None)
        }
    }
    let mut read = Read(BTreeMap::new());
    M::iter_tensors(&mut RecursiveWalker {
        m: (model, String::new()),
        f: &mut read,
    })?;
    Ok(read.0)
}

/// The name of every tensor of a model of type `M` (the names come from the type: no values
/// are read).
fn tensor_names<M: TensorCollection<f32, Cpu>>() -> Result<Vec<String>, GraphError> {
    struct Names(Vec<String>);
    impl TensorVisitor<f32, Cpu> for Names {
        type Viewer = ViewTensorName;
        type Err = QuantError;
        type E2 = f32;
        type D2 = Cpu;
        fn visit<S: Shape>(
            &mut self,
            _: TensorOptions<S, f32, Cpu>,
            name: String,
        ) -> Result<Option<Tensor<S, f32, Cpu>>, QuantError> {
            self.0.push(name);
            Ok(None)
        }
        fn visit_scalar<N: num_traits::NumCast>(
            &mut self,
            _: ScalarOptions<N>,
            _: String,
        ) -> Result<Option<N>, QuantError> {
            Ok(None)
        }
    }
    let mut names = Names(Vec::new());
    M::iter_tensors(&mut RecursiveWalker {
        m: String::new(),
        f: &mut names,
    })?;
    Ok(names.0)
}

/// A requested layer in the float graph: its input on the samples, its weight and its bias.
struct FloatLayer {
    input: Vec<f32>,
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// Each requested Linear or Conv2d layer of `float_graph` (by name), on `x`.
fn float_layers(
    float_graph: &Graph,
    x: &[f32],
    requests: &BTreeMap<String, Refinement>,
) -> quant_core::Result<BTreeMap<String, FloatLayer>> {
    let mut found: Vec<(&str, &str, Vec<f32>, Vec<f32>)> = Vec::new();
    for node in &float_graph.nodes {
        let (Op::Linear(quant_runtime::graph::Linear { weight, bias, .. })
        | Op::Conv2d(quant_runtime::graph::Conv2d { weight, bias, .. })) = &node.op
        else {
            continue;
        };
        if let (true, Some(input), ParamValues::Float(w), ParamValues::Float(b)) = (
            requests.contains_key(&node.name),
            node.inputs.first(),
            &weight.values,
            &bias.values,
        ) {
            found.push((&node.name, input, w.clone(), b.clone()));
        }
    }
    let wanted: BTreeSet<&str> = found.iter().map(|f| f.1).collect();
    let names: Vec<&str> = float_graph.nodes.iter().map(|n| n.name.as_str()).collect();
    let kept = evaluate(float_graph, x, &|i, _| wanted.contains(names[i]))?.kept;
    let kept: BTreeMap<String, Vec<f32>> = kept.into_iter().collect();
    Ok(found
        .into_iter()
        .filter_map(|(layer, input, weight, bias)| {
            let input = if input == float_graph.input.name {
                Some(x.to_vec())
            } else {
                kept.get(input).cloned()
            };
            input.map(|input| {
                (
                    layer.to_string(),
                    FloatLayer {
                        input,
                        weight,
                        bias,
                    },
                )
            })
        })
        .collect())
}

/// How a layer's input splits into rows of `k` values, one per output vector: per token of a
/// Linear, per output position and channel group of a Conv2d (its input patch).
struct Rows {
    /// Output channels.
    outputs: usize,
    /// Values per row (the fan-in).
    k: usize,
    /// Channel groups (1 but for grouped convolutions).
    groups: usize,
    /// Rows per sample.
    per_sample: usize,
    /// Conv2d: geometry and the per-sample input `[c, h, w]` and output `[oh, ow]` sizes.
    conv: Option<(quant_runtime::graph::Conv2dGeometry, [usize; 3], [usize; 2])>,
}

impl Rows {
    fn of(op: &Op, in_shape: &[usize]) -> quant_core::Result<Rows> {
        match (op, in_shape) {
            (
                Op::Linear(quant_runtime::graph::Linear {
                    in_features,
                    out_features,
                    ..
                }),
                _,
            ) => Ok(Rows {
                outputs: *out_features,
                k: *in_features,
                groups: 1,
                per_sample: in_shape.iter().product::<usize>() / (*in_features).max(1),
                conv: None,
            }),
            (Op::Conv2d(quant_runtime::graph::Conv2d { geometry: g, .. }), [c, h, w]) => {
                let Some([oh, ow]) = g.output([*h, *w]) else {
                    return Err(shape_error(op, in_shape));
                };
                Ok(Rows {
                    outputs: g.out_channels,
                    k: g.fan_in(),
                    groups: g.groups.max(1),
                    per_sample: oh * ow,
                    conv: Some((*g, [*c, *h, *w], [oh, ow])),
                })
            }
            _ => Err(shape_error(op, in_shape)),
        }
    }

    /// Appends row `r` (of all samples' rows) of group `group` of `x` to `out`.
    fn push(&self, x: &[f32], r: usize, group: usize, out: &mut Vec<f32>) {
        let Some((g, [c, h, w], [_, ow])) = self.conv else {
            out.extend_from_slice(&x[r * self.k..(r + 1) * self.k]);
            return;
        };
        let (sample, pos) = (r / self.per_sample, r % self.per_sample);
        let (oy, ox) = (pos / ow, pos % ow);
        let cg = g.group_in_channels();
        let maps = &x[sample * c * h * w..(sample + 1) * c * h * w];
        for ci in 0..cg {
            let ch = group * cg + ci;
            for ky in 0..g.kernel[0] {
                for kx in 0..g.kernel[1] {
                    let iy = (oy * g.stride[0] + ky) as isize - g.padding[0] as isize;
                    let ix = (ox * g.stride[1] + kx) as isize - g.padding[1] as isize;
                    let inside = iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w;
                    out.push(if inside {
                        maps[(ch * h + iy as usize) * w + ix as usize]
                    } else {
                        0.0
                    });
                }
            }
        }
    }
}

/// One value per output row: per-channel values as they are, a per-tensor value repeated.
fn per_row<T: Copy>(v: &[T], outputs: usize) -> Vec<T> {
    match v {
        [one] => vec![*one; outputs],
        _ => v.to_vec(),
    }
}

fn shape_error(op: &Op, in_shape: &[usize]) -> QuantError {
    QuantError::InvalidValue {
        what: format!("input of a {} layer", op.name()),
        value: format!("{in_shape:?}"),
        expected: "the input shape the op takes".into(),
    }
}

/// Rows of a block of [`Moments`] accumulation.
const BLOCK_ROWS: usize = 2048;

/// A Linear or Conv2d node of the quantized graph, as refinement reads it.
struct Layer<'a> {
    name: &'a str,
    op: &'a Op,
    weight: &'a Parameter,
    bias: &'a Parameter,
    /// The input quantizer's scale, when the input is quantized.
    input_scale: Option<f32>,
}

/// What refinement made of one layer: its new op, the report, and the float weight and bias
/// the model must hold for it.
struct Fitted {
    op: Op,
    report: RefinedLayer,
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl<'a> Layer<'a> {
    fn of(graph: &'a Graph, i: usize) -> quant_core::Result<Layer<'a>> {
        let node = &graph.nodes[i];
        let (weight, bias) = match &node.op {
            Op::Linear(quant_runtime::graph::Linear { weight, bias, .. })
            | Op::Conv2d(quant_runtime::graph::Conv2d { weight, bias, .. }) => (weight, bias),
            other => {
                return Err(QuantError::InvalidValue {
                    what: format!("layer `{}`", node.name),
                    value: other.name().into(),
                    expected: "a Linear or Conv2d layer for learned rounding and bias correction"
                        .into(),
                })
            }
        };
        let input_scale = node
            .inputs
            .first()
            .and_then(|v| graph.node_index(v))
            .and_then(|p| match &graph.nodes[p].op {
                Op::QuantizeDequantize(quant_runtime::graph::QuantizeDequantize { quantizer }) => {
                    Some(quantizer.inferable.qparams().scales()[0])
                }
                _ => None,
            });
        Ok(Layer {
            name: &node.name,
            op: &node.op,
            weight,
            bias,
            input_scale,
        })
    }

    /// Refines the layer on its float form and inputs `float` and its quantized inputs `xq`
    /// (`samples` whole samples of per-sample shape `in_shape`).
    fn refine(
        &self,
        dev: &Cpu,
        request: Refinement,
        (settings, gptq_settings): (&AdaRoundSettings, &GptqSettings),
        float: &FloatLayer,
        xq: &[f32],
        (samples, in_shape): (usize, &[usize]),
    ) -> quant_core::Result<Fitted> {
        let rows = Rows::of(self.op, in_shape)?;
        let (outputs, k, groups) = (rows.outputs, rows.k, rows.groups);
        let per_group = outputs / groups;
        let total = samples * rows.per_sample;
        let stride = total.div_ceil(settings.max_rows).max(1);
        let w = &float.weight;
        // The grid of each output row, and the nearest codes the quantizer gave.
        let (mut codes, grid) = match &self.weight.values {
            ParamValues::Codes { codes, quantizer } => {
                let q = &quantizer.inferable;
                let scales = per_row(q.qparams().scales(), outputs);
                let zero_points = per_row(q.qparams().zero_points(), outputs);
                let grid = q.grid();
                (
                    Some(codes.clone()),
                    Some((scales, zero_points, grid.quant_min(), grid.quant_max())),
                )
            }
            _ => (None, None),
        };
        let row_grid = |g: usize| {
            grid.as_ref().map(|(s, z, min, max)| RowGrid {
                scales: &s[g * per_group..(g + 1) * per_group],
                zero_points: &z[g * per_group..(g + 1) * per_group],
                min: *min,
                max: *max,
            })
        };
        let mut weight = w.clone();
        let mut mean_error = vec![0f64; outputs];
        let (mut error_nearest, mut error_refined) = (0.0, 0.0);
        let (mut settled, mut learned_any) = (Vec::new(), false);
        for g in 0..groups {
            let mut moments = Moments::new(k);
            let (mut bx, mut bq) = (Vec::new(), Vec::new());
            for r in (0..total).step_by(stride) {
                rows.push(&float.input, r, g, &mut bx);
                rows.push(xq, r, g, &mut bq);
                if bx.len() >= BLOCK_ROWS * k {
                    moments.add(dev, &bx, &bq);
                    bx.clear();
                    bq.clear();
                }
            }
            moments.add(dev, &bx, &bq);
            let span = g * per_group * k..(g + 1) * per_group * k;
            let wg = &w[span.clone()];
            let nearest = match (&codes, row_grid(g)) {
                (Some(c), Some(rg)) => adaround::dequantize(&c[span.clone()], k, rg),
                _ => wg.to_vec(),
            };
            let e_nearest = moments.output_error(wg, &nearest);
            let mut chosen = nearest;
            let mut e_chosen = e_nearest;
            if let (Some(c), Some(rg)) = (codes.as_mut(), row_grid(g)) {
                let learned_codes = match request.rounding {
                    WeightRounding::Nearest => None,
                    WeightRounding::AdaRound => {
                        let schedule = Schedule {
                            iterations: settings.iterations,
                            learning_rate: settings.learning_rate as f32,
                            regularization: settings.regularization as f32,
                        };
                        let r = adaround::adaround(dev, &moments, wg, rg, schedule);
                        settled.push(r.settled);
                        Some(r.codes)
                    }
                    WeightRounding::Gptq => gptq::gptq(&moments, wg, rg, gptq_settings),
                };
                if let Some(learned_codes) = learned_codes {
                    let learned = adaround::dequantize(&learned_codes, k, rg);
                    let e_learned = moments.output_error(wg, &learned);
                    if e_learned < e_nearest {
                        c[span.clone()].copy_from_slice(&learned_codes);
                        chosen = learned;
                        e_chosen = e_learned;
                        learned_any = true;
                    }
                }
            }
            // The mean output error E[W x − W̃ x̃] of each output channel.
            let n = moments.rows.max(1) as f64;
            for (o, (wo, wqo)) in wg.chunks_exact(k).zip(chosen.chunks_exact(k)).enumerate() {
                mean_error[g * per_group + o] = (0..k)
                    .map(|j| {
                        wo[j] as f64 * moments.sum_float[j] / n
                            - wqo[j] as f64 * moments.sum_quantized[j] / n
                    })
                    .sum();
            }
            error_nearest += e_nearest * per_group as f64;
            error_refined += e_chosen * per_group as f64;
            weight[span].copy_from_slice(&chosen);
        }
        let (error_nearest, mut error_refined) = (
            error_nearest / outputs as f64,
            error_refined / outputs as f64,
        );
        let mut op = self.op.clone();
        let (Op::Linear(quant_runtime::graph::Linear {
            weight: new_weight,
            bias: new_bias,
            ..
        })
        | Op::Conv2d(quant_runtime::graph::Conv2d {
            weight: new_weight,
            bias: new_bias,
            ..
        })) = &mut op
        else {
            return Err(shape_error(self.op, in_shape));
        };
        if let (Some(c), ParamValues::Codes { codes: target, .. }) = (codes, &mut new_weight.values)
        {
            *target = c;
        }
        let bias = if request.bias_correction {
            let corrected: Vec<f32> = float
                .bias
                .iter()
                .zip(&mean_error)
                .map(|(b, e)| (*b as f64 + e) as f32)
                .collect();
            let (values, held) = match (&new_bias.values, self.input_scale, &grid) {
                (ParamValues::Accumulator(_), Some(s_in), Some((scales, ..))) => {
                    let codes = quantize_bias(&corrected, s_in, scales)
                        .map_err(|e| e.at(format!("layer `{}` bias correction", self.name)))?;
                    let held = quant_core::accumulator::accumulator_to_float(&codes, s_in, scales);
                    (ParamValues::Accumulator(codes), held)
                }
                _ => (ParamValues::Float(corrected.clone()), corrected),
            };
            // E‖e − d‖² = E‖e‖² − 2·d·E[e] + ‖d‖² per output, d the bias change.
            error_refined += float
                .bias
                .iter()
                .zip(&held)
                .zip(&mean_error)
                .map(|((b, h), e)| {
                    let d = (*h - *b) as f64;
                    d * d - 2.0 * d * e
                })
                .sum::<f64>()
                / outputs as f64;
            new_bias.values = values;
            Some(held)
        } else {
            None
        };
        Ok(Fitted {
            op,
            report: RefinedLayer {
                layer: self.name.to_string(),
                rounding: if learned_any {
                    request.rounding
                } else {
                    WeightRounding::Nearest
                },
                bias_corrected: request.bias_correction,
                error_nearest,
                error_refined: error_refined.max(0.0),
                settled: (!settled.is_empty())
                    .then(|| settled.iter().sum::<f64>() / settled.len() as f64),
            },
            weight,
            bias,
        })
    }
}

/// Sets each tensor of `model` named in `values` to those values.
fn assign<M: TensorCollection<f32, Cpu>>(
    model: &mut M,
    values: &BTreeMap<String, Vec<f32>>,
) -> Result<(), GraphError> {
    struct Assign<'a> {
        values: &'a BTreeMap<String, Vec<f32>>,
        done: BTreeSet<String>,
    }
    impl TensorVisitor<f32, Cpu> for Assign<'_> {
        type Viewer = (ViewTensorMut, ViewTensorName);
        type Err = QuantError;
        type E2 = f32;
        type D2 = Cpu;
        fn visit<S: Shape>(
            &mut self,
            _: TensorOptions<S, f32, Cpu>,
            (t, name): (&mut Tensor<S, f32, Cpu>, String),
        ) -> Result<Option<Tensor<S, f32, Cpu>>, QuantError> {
            if let Some(v) = self.values.get(&name) {
                if v.len() != t.shape().num_elements() {
                    return Err(QuantError::LengthMismatch {
                        what: format!("values for tensor `{name}`"),
                        expected: t.shape().num_elements(),
                        actual: v.len(),
                    });
                }
                t.copy_from(v);
                self.done.insert(name);
            }
            Ok(None)
        }
        fn visit_scalar<N: num_traits::NumCast>(
            &mut self,
            _: ScalarOptions<N>,
            _: (&mut N, String),
        ) -> Result<Option<N>, QuantError> {
            Ok(None)
        }
    }
    let mut visitor = Assign {
        values,
        done: BTreeSet::new(),
    };
    M::iter_tensors(&mut RecursiveWalker {
        m: (model, String::new()),
        f: &mut visitor,
    })?;
    if let Some(missing) = values.keys().find(|k| !visitor.done.contains(*k)) {
        return Err(GraphError::Unsupported {
            layer: missing.clone(),
            reason: "learned rounding and bias correction write the layer's weight and bias by the names its graph form gives them; the model has no tensor of this name".into(),
        });
    }
    Ok(())
}

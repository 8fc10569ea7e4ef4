//! SmoothQuant (Xiao et al., 2023) for the Linear layers a LayerNorm feeds: a transformer's
//! normalised activations have a few channels far wider than the rest, and one per-tensor
//! activation grid must cover the widest. Each input channel `c` is divided by
//! `s_c = max|x_c|^α / max_o|W_oc|^(1−α)` (in the LayerNorm's scale and shift, which absorb it
//! exactly) and the weights' column `c` multiplied by it: the float model computes the same,
//! the activation's channels come closer in range, and the per-channel weight grids take part
//! of the spread.

use std::collections::{BTreeMap, BTreeSet};

use dfdx::nn::tensor_collection::TensorCollection;
use dfdx::prelude::*;
use serde::{Deserialize, Serialize};

use quant_core::QuantizationTarget;
use quant_runtime::graph::{evaluate, Graph, Op, ParamValues, Parameter};
use quant_runtime::GraphError;

use crate::convert::LayerKind;
use crate::layers::{QuantizedModule, Slot};
use crate::policy::Policy;

/// What [`smooth`] did to one LayerNorm and the Linear layers reading its output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SmoothedLayerNorm {
    /// The LayerNorm's dotted name.
    pub layer_norm: String,
    /// The Linear layers whose weights took the factors, in graph order.
    pub linears: Vec<String>,
    /// The migration strength `α`.
    pub strength: f64,
    /// The activation's widest channel range over its mean channel range (`max|x_c|`),
    /// before smoothing, on the samples.
    pub spread_before: f64,
    /// The same after.
    pub spread_after: f64,
}

/// What [`smooth`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Smoothing {
    /// Each smoothed LayerNorm, in graph order.
    pub layer_norms: Vec<SmoothedLayerNorm>,
    /// The Linear layers that asked for smoothing but were left as they were: their input is
    /// not the output of a LayerNorm that only Linear layers read.
    pub not_applied: Vec<String>,
}

impl Smoothing {
    /// Whether no layer asked for smoothing.
    pub fn is_empty(&self) -> bool {
        self.layer_norms.is_empty() && self.not_applied.is_empty()
    }
}

/// A LayerNorm whose output only Linear layers read (directly, or through the mean of the
/// tokens, which acts on each channel alone), with the strength they ask for.
struct Group<'g> {
    /// The LayerNorm's name.
    layer_norm: &'g str,
    /// Its scale and shift, and their float values.
    scale: (&'g Parameter, &'g [f32]),
    shift: (&'g Parameter, &'g [f32]),
    /// The value the Linear layers read.
    value: String,
    /// Each Linear layer's name, its weight and the weight's float values.
    linears: Vec<(&'g str, &'g Parameter, &'g [f32])>,
    strength: f64,
}

/// A parameter's values, when float (every parameter of a graph with its quantizers disabled).
fn float_values(p: &Parameter) -> Option<&[f32]> {
    match &p.values {
        ParamValues::Float(v) => Some(v),
        _ => None,
    }
}

/// Smooths every LayerNorm → Linear pair whose Linear input slots ask for it under `policy`
/// (`smoothing = α`, [`Policy::smoothing`]), with statistics from `samples` (whole samples of
/// `input_shape`) through the float model. Runs before calibration; the model's float function
/// is unchanged (up to `f32` rounding). Returns what each smoothed LayerNorm got, in graph
/// order, and the Linear layers that asked but were left as they were: those reading something
/// else than a LayerNorm's output, or sharing it with a layer that is not a Linear (only a
/// per-channel op right before a layer can absorb its factors). Nothing when no slot asks.
///
/// # Errors
/// Linear layers reading one LayerNorm ask for different strengths; a layer without a graph
/// form; no whole sample in `samples`. Nothing in the model changes then.
pub fn smooth<M>(
    model: &mut M,
    policy: &Policy,
    input_shape: &[usize],
    samples: &[f32],
) -> Result<Smoothing, GraphError>
where
    M: QuantizedModule + Clone + TensorCollection<f32, Cpu>,
{
    // Per Linear layer whose input is quantized: the strength it asks for, if any (a float
    // input does not care how its channels are scaled).
    let mut requests: BTreeMap<String, Option<f64>> = BTreeMap::new();
    let mut failed = None;
    model.visit_slots("", &mut |s| {
        if s.kind == LayerKind::Linear
            && s.slot.name == Slot::INPUT.name
            && s.slot.target == QuantizationTarget::Activation
            && s.quantizer.describe().is_some()
        {
            match policy.smoothing(s.layer, s.kind, s.slot) {
                Ok(a) => {
                    requests.insert(s.layer.to_string(), a);
                }
                Err(e) => failed = Some(e),
            }
        }
        Ok(())
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if requests.values().all(Option::is_none) {
        return Ok(Smoothing::default());
    }
    let x = super::whole_samples(samples, input_shape, usize::MAX, "smoothing")?;
    let graph = super::float_graph(model, input_shape)?;
    let groups = groups(&graph, &requests)?;
    let applied: BTreeSet<&str> = groups
        .iter()
        .flat_map(|g| g.linears.iter().map(|l| l.0))
        .collect();
    let not_applied: Vec<String> = requests
        .iter()
        .filter(|(name, a)| a.is_some() && !applied.contains(name.as_str()))
        .map(|(name, _)| name.clone())
        .collect();
    if groups.is_empty() {
        return Ok(Smoothing {
            layer_norms: Vec::new(),
            not_applied,
        });
    }
    let wanted: BTreeSet<&str> = groups.iter().map(|g| g.value.as_str()).collect();
    let kept: BTreeMap<String, Vec<f32>> = evaluate(&graph, x, &|i, _| {
        wanted.contains(graph.nodes[i].name.as_str())
    })?
    .kept
    .into_iter()
    .collect();

    let mut assigned: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let mut done = Vec::new();
    for group in &groups {
        let ((scale, gamma), (shift, beta)) = (group.scale, group.shift);
        let channels = gamma.len();
        let Some(values) = kept.get(&group.value) else {
            continue;
        };
        let ranges = channel_ranges(values, channels);
        let mut weight_ranges = vec![0.0f32; channels];
        for (_, _, w) in &group.linears {
            for (r, v) in weight_ranges.iter_mut().zip(channel_ranges(w, channels)) {
                *r = r.max(v);
            }
        }
        let mut factors = smoothing_factors(&ranges, &weight_ranges, group.strength);
        keep_parameters_finite(&mut factors, gamma, beta, &weight_ranges);
        assigned.insert(
            scale.tensor.clone(),
            gamma.iter().zip(&factors).map(|(g, s)| g / s).collect(),
        );
        assigned.insert(
            shift.tensor.clone(),
            beta.iter().zip(&factors).map(|(b, s)| b / s).collect(),
        );
        for (_, weight, w) in &group.linears {
            let scaled = w
                .iter()
                .enumerate()
                .map(|(i, v)| v * factors[i % channels])
                .collect();
            assigned.insert(weight.tensor.clone(), scaled);
        }
        let after: Vec<f32> = ranges.iter().zip(&factors).map(|(r, s)| r / s).collect();
        done.push(SmoothedLayerNorm {
            layer_norm: group.layer_norm.to_string(),
            linears: group.linears.iter().map(|l| l.0.to_string()).collect(),
            strength: group.strength,
            spread_before: spread(&ranges),
            spread_after: spread(&after),
        });
    }
    let names = super::tensor_names::<M>()?;
    let assigned = assigned
        .into_iter()
        .map(|(name, values)| Ok((model_tensor(&names, &name)?, values)))
        .collect::<Result<BTreeMap<_, _>, GraphError>>()?;
    let mut updated = model.clone();
    super::assign(&mut updated, &assigned)?;
    *model = updated;
    Ok(Smoothing {
        layer_norms: done,
        not_applied,
    })
}

/// The LayerNorms of `graph` whose output only Linear layers read, each with the strength its
/// Linear layers ask for (those that ask nothing are skipped).
fn groups<'g>(
    graph: &'g Graph,
    requests: &BTreeMap<String, Option<f64>>,
) -> Result<Vec<Group<'g>>, GraphError> {
    let readers = |value: &str| -> Vec<usize> {
        (0..graph.nodes.len())
            .filter(|&i| graph.nodes[i].inputs.iter().any(|v| v == value))
            .collect()
    };
    let mut found = Vec::new();
    for node in &graph.nodes {
        let Op::LayerNorm(norm) = &node.op else {
            continue;
        };
        let (Some(gamma), Some(beta)) = (float_values(&norm.scale), float_values(&norm.shift))
        else {
            continue;
        };
        if graph.output == node.name {
            continue;
        }
        // The mean of the tokens scales with each channel: look through it.
        let mut value = node.name.clone();
        let mut reading = readers(&value);
        while let [single] = reading[..] {
            if !matches!(graph.nodes[single].op, Op::MeanTokens) || graph.output == value {
                break;
            }
            value = graph.nodes[single].name.clone();
            reading = readers(&value);
        }
        // Every reader a Linear with float weights and no other input, or no group.
        let linears: Option<Vec<_>> = reading
            .iter()
            .map(|&l| match &graph.nodes[l].op {
                Op::Linear(linear) if graph.nodes[l].inputs == [value.clone()] => {
                    float_values(&linear.weight)
                        .map(|w| (graph.nodes[l].name.as_str(), &linear.weight, w))
                }
                _ => None,
            })
            .collect();
        let Some(linears) = linears.filter(|l| !l.is_empty() && graph.output != value) else {
            continue;
        };
        // Those with a quantized input, and what each asks.
        let asked: Vec<(&str, Option<f64>)> = linears
            .iter()
            .filter_map(|&(name, _, _)| requests.get(name).map(|&a| (name, a)))
            .collect();
        let Some(&(first, Some(strength))) = asked.iter().find(|a| a.1.is_some()) else {
            continue;
        };
        if let Some((other, a)) = asked.iter().find(|a| a.1 != Some(strength)) {
            return Err(GraphError::Unsupported {
                layer: (*other).to_string(),
                reason: format!(
                    "its input is LayerNorm `{}`'s output, as `{first}`'s, which asks for smoothing {strength} while it asks for {}: the Linear layers reading one LayerNorm share its factors, give them one `smoothing`",
                    node.name,
                    a.map_or("none".to_string(), |a| a.to_string()),
                ),
            });
        }
        found.push(Group {
            layer_norm: &node.name,
            scale: (&norm.scale, gamma),
            shift: (&norm.shift, beta),
            value,
            linears,
            strength,
        });
    }
    Ok(found)
}

/// The model's name of a graph tensor `<layer>.<param>`: the same, or `<layer>.<field>.<param>`
/// for a layer that wraps its module (a LayerNorm behind its input quantizer).
fn model_tensor(names: &[String], graph_name: &str) -> Result<String, GraphError> {
    if names.iter().any(|n| n == graph_name) {
        return Ok(graph_name.to_string());
    }
    let (layer, param) = graph_name.rsplit_once('.').unwrap_or(("", graph_name));
    let wrapped: Vec<&String> = names
        .iter()
        .filter(|n| {
            let inner = if layer.is_empty() {
                Some(n.as_str())
            } else {
                n.strip_prefix(layer).and_then(|r| r.strip_prefix('.'))
            };
            inner
                .and_then(|r| r.strip_suffix(param))
                .and_then(|r| r.strip_suffix('.'))
                .is_some_and(|field| !field.is_empty() && !field.contains('.'))
        })
        .collect();
    match wrapped[..] {
        [one] => Ok(one.clone()),
        _ => Err(GraphError::Invalid {
            node: graph_name.to_string(),
            reason: format!(
                "smoothing writes this tensor, but the model has {} tensors it could be",
                wrapped.len()
            ),
        }),
    }
}

/// `max|x_c|` per channel of values whose last axis has `channels` entries.
fn channel_ranges(values: &[f32], channels: usize) -> Vec<f32> {
    let mut ranges = vec![0.0f32; channels];
    for row in values.chunks_exact(channels) {
        for (r, v) in ranges.iter_mut().zip(row) {
            *r = r.max(v.abs());
        }
    }
    ranges
}

/// SmoothQuant's factors `s_c = a_c^α / w_c^(1−α)`, computed in `f64`; 1 for a channel
/// without range on either side (nothing to balance) or a factor that is not a finite positive
/// `f32`.
fn smoothing_factors(activations: &[f32], weights: &[f32], strength: f64) -> Vec<f32> {
    activations
        .iter()
        .zip(weights)
        .map(|(&a, &w)| {
            if !(a > 0.0 && w > 0.0) {
                return 1.0;
            }
            let s = (f64::from(a).powf(strength) / f64::from(w).powf(1.0 - strength)) as f32;
            if s.is_finite() && s > 0.0 {
                s
            } else {
                1.0
            }
        })
        .collect()
}

/// Sets to 1 each factor that would take a parameter it divides (the LayerNorm's scale and
/// shift) or multiplies (the weights' widest value in its column) out of `f32`'s range: a
/// channel that extreme keeps its values rather than becoming infinite.
fn keep_parameters_finite(factors: &mut [f32], scale: &[f32], shift: &[f32], weights: &[f32]) {
    for (((s, g), b), w) in factors.iter_mut().zip(scale).zip(shift).zip(weights) {
        if !((g / *s).is_finite() && (b / *s).is_finite() && (w * *s).is_finite()) {
            *s = 1.0;
        }
    }
}

/// The widest channel range over the mean one.
fn spread(ranges: &[f32]) -> f64 {
    let mean = ranges.iter().map(|&r| f64::from(r)).sum::<f64>() / ranges.len().max(1) as f64;
    let max = ranges.iter().fold(0.0f64, |m, &r| m.max(f64::from(r)));
    if mean > 0.0 {
        max / mean
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_balance_the_ranges_and_leave_degenerate_channels_alone() {
        // α 0.5: both sides end at √(a·w).
        let s = smoothing_factors(&[16.0, 1.0, 0.0, 4.0], &[1.0, 4.0, 2.0, 0.0], 0.5);
        assert_eq!(s, [4.0, 0.5, 1.0, 1.0]);
        assert_eq!(smoothing_factors(&[8.0], &[2.0], 1.0), [8.0]);
        assert_eq!(smoothing_factors(&[8.0], &[2.0], 0.0), [0.5]);
        // A factor beyond f32: none.
        assert_eq!(smoothing_factors(&[f32::MAX], &[1e-45], 0.5), [1.0]);
        assert_eq!(smoothing_factors(&[f32::MAX], &[1.0], 1.0), [f32::MAX]);

        let mut factors = [1e-30, 2.0, 1e30, 0.5];
        keep_parameters_finite(
            &mut factors,
            &[1e10, 1.0, 1.0, 1.0],
            &[0.0, 0.0, 0.0, f32::MAX],
            &[1.0, 1.0, 1e10, 1.0],
        );
        assert_eq!(factors, [1.0, 2.0, 1.0, 1.0]);
    }
}

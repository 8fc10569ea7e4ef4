//! Sensitivity analysis (`quant analyze`): what each quantizer slot of the calibrated (PTQ)
//! model costs, measured with only that slot quantized and with every slot but that one
//! quantized, as the SQNR of the logits against the float model's and as accuracy, on rows
//! held out of the training split (never the test split).
//!
//! A slot that alone costs much (a low SQNR with only it quantized) is a candidate for more
//! bits; one whose removal recovers much (a high SQNR with all but it quantized) too. Slots
//! are ranked by the first, ties broken by the second. Every figure is a deterministic
//! function of the model and the rows: the logits are computed batch by batch in order, so
//! the ranking does not depend on the number of threads.

use std::fmt::Write as _;

use dfdx::prelude::*;
use rayon::prelude::*;
use serde::Serialize;

use std::collections::BTreeMap;

use quant_core::QuantizationTarget;
use quant_dfdx::layers::{QuantizedModule, QuantizedModuleExt, QuantizerMode, Slot};
use quant_dfdx::policy::{Override, Policy, QuantizerSettings, SlotSetting};
use quant_dfdx::ptq::RefinedTensors;
use quant_runtime::graph::Op;

use super::mixed_precision::{pareto_front, solve, Choice};

use super::config::RunConfig;
use super::model::{BatchShape, DeployModel, FloatModel, Model, QuantizedModel};
use super::nets::{with_bundled, BundledTask};
use super::stages::{self, Seed};
use super::train::{accuracy, logits, predictions};
use super::{RunError, RunOptions};
use crate::data::{self, Dataset, Holdout, Samples};

/// Batch size of the analysis's forward passes (no tape: only memory).
const EVAL_BATCH: usize = 256;

/// The SQNR reported for logits equal to the float model's (no error at all).
pub const MAX_SQNR_DB: f64 = 300.0;

/// The hold-out fold `quant analyze` measures on when the run file names none: every fifth
/// training row, from the first.
pub const DEFAULT_HOLDOUT: Holdout = Holdout { folds: 5, fold: 0 };

/// How far a model's logits are from the float model's on the analysis rows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Effect {
    /// Signal-to-quantization-noise ratio of the logits against the float model's, in dB
    /// (higher: closer; [`MAX_SQNR_DB`] for no error).
    pub sqnr_db: f64,
    /// Accuracy on the analysis rows.
    pub accuracy: f64,
}

/// One quantizer slot's sensitivity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotSensitivity {
    /// The slot's dotted name (`layer.slot`), as the report names it.
    pub slot: String,
    /// The layer's dotted name (a policy override's pattern).
    pub layer: String,
    /// The slot's name within its layer (`weights`, `input`, `query`, ...).
    pub slot_name: String,
    /// With only this slot quantized.
    pub alone: Effect,
    /// With every slot but this one quantized.
    pub all_but: Effect,
}

/// The sensitivity of every quantizer slot of a model, most sensitive first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sensitivity {
    /// Rows measured on.
    pub rows: usize,
    /// The float model's accuracy on them.
    pub float_accuracy: f64,
    /// With every slot quantized (the PTQ model).
    pub quantized: Effect,
    /// Every configured slot, most sensitive first.
    pub slots: Vec<SlotSensitivity>,
}

/// `10 log10(Σ f² / Σ (f − q)²)` over all logits, at most [`MAX_SQNR_DB`].
pub fn sqnr_db(float: &[f32], quantized: &[f32]) -> f64 {
    let (mut signal, mut noise) = (0f64, 0f64);
    for (&f, &q) in float.iter().zip(quantized) {
        signal += f64::from(f) * f64::from(f);
        noise += (f64::from(f) - f64::from(q)).powi(2);
    }
    if noise == 0.0 {
        return MAX_SQNR_DB;
    }
    (10.0 * (signal / noise).log10()).min(MAX_SQNR_DB)
}

/// A glob matching exactly `name` (dotted names hold no glob characters, but a derive's field
/// names are the user's): every character a glob gives a meaning to is escaped.
fn exactly(name: &str) -> String {
    name.chars().fold(String::new(), |mut out, c| {
        if "*?[]{},!\\".contains(c) {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// Most sensitive first: the lowest SQNR alone, then the highest SQNR with all but the slot,
/// then by name.
fn rank(slots: &mut [SlotSensitivity]) {
    slots.sort_by(|a, b| {
        a.alone
            .sqnr_db
            .total_cmp(&b.alone.sqnr_db)
            .then(b.all_but.sqnr_db.total_cmp(&a.all_but.sqnr_db))
            .then(a.slot.cmp(&b.slot))
    });
}

/// Measures every configured slot of the calibrated model `ptq` on `rows`, against the float
/// model's logits `float_logits` on the same rows (`rows.len() × C` values).
///
/// # Errors
/// A quantizer that cannot change mode (the error names it); a forward pass fails; the float
/// logits are not `rows.len() × C` values.
pub fn sensitivity<S, const C: usize, Q>(
    dev: &Cpu,
    (ptq, replaced): (&Q, &RefinedTensors),
    float_logits: &[f32],
    rows: &Samples,
) -> Result<Sensitivity, RunError>
where
    S: BatchShape,
    Q: QuantizedModel<S, C>,
{
    if float_logits.len() != rows.len() * C {
        return Err(quant_core::QuantError::LengthMismatch {
            what: "float logits of the analysis rows".into(),
            expected: rows.len() * C,
            actual: float_logits.len(),
        }
        .into());
    }
    let effect = |q: &Q| -> Result<Effect, RunError> {
        let l = logits::<Q, S, C>(dev, q, rows, EVAL_BATCH)?;
        Ok(Effect {
            sqnr_db: sqnr_db(float_logits, &l),
            accuracy: accuracy(&predictions(&l, C), rows.labels()),
        })
    };
    let float_accuracy = accuracy(&predictions(float_logits, C), rows.labels());
    let mut q = ptq.clone();
    let names = configured_slots(&mut q, |_| true)?;
    q.set_mode("*", QuantizerMode::Frozen)?;
    let quantized = effect(&q)?;
    // The slots in parallel, each measured on a copy of the model whose every quantizer's
    // mode (and every refined layer's weights) it sets first: no slot sees another's state.
    let mut slots = names
        .into_par_iter()
        .map_init(
            || ptq.clone(),
            |q, (name, layer, slot_name)| {
                quantize_only(q, &name, replaced)?;
                let alone = effect(q)?;
                leave_float(q, &[name.as_str()], replaced)?;
                let all_but = effect(q)?;
                Ok(SlotSensitivity {
                    slot: name,
                    layer,
                    slot_name,
                    alone,
                    all_but,
                })
            },
        )
        .collect::<Result<Vec<_>, RunError>>()?;
    rank(&mut slots);
    Ok(Sensitivity {
        rows: rows.len(),
        float_accuracy,
        quantized,
        slots,
    })
}

/// The sensitivity of each seed of a run file, and their mean.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Analysis {
    /// The model's name.
    pub model: String,
    /// Where the data came from, and which rows were measured on.
    pub data: String,
    /// The seeds analysed.
    pub seeds: Vec<u64>,
    /// The mean over seeds of every figure, ranked again on the means.
    pub mean: Sensitivity,
    /// Each seed's own.
    pub runs: Vec<Sensitivity>,
    /// The accuracy-aware fallback, when asked for.
    pub fallback: Option<Fallback>,
    /// Mixed-precision weights under a budget, when asked for.
    pub mixed_precision: Option<MixedPrecision>,
}

/// What [`analyze`] does beyond the ranking.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnalyzeRequest {
    /// The accuracy-aware fallback's allowed drop, in points.
    pub max_drop: Option<f64>,
    /// What the fallback raises slots to.
    pub raise: Raise,
    /// A mixed-precision search under this budget.
    pub budget: Option<PrecisionBudget>,
}

impl AnalyzeRequest {
    /// Checks every setting.
    ///
    /// # Errors
    /// See [`check_max_drop`] and [`check_budget`].
    pub fn check(&self) -> Result<(), RunError> {
        if let Some(d) = self.max_drop {
            check_max_drop(d)?;
        }
        if let Raise::Bits(b) = self.raise {
            if !(2..=16).contains(&b) {
                return Err(quant_core::QuantError::InvalidValue {
                    what: "raise_to".into(),
                    value: b.to_string(),
                    expected: "a bit width from 2 to 16, or float".into(),
                }
                .into());
            }
        }
        if let Some(b) = &self.budget {
            check_budget(b)?;
        }
        Ok(())
    }
}

/// What the fallback does to the slots it raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum Raise {
    /// Leaves them float (their quantizers disabled).
    #[default]
    Float,
    /// Quantizes them at this many bits, recalibrated (a slot already this wide goes float):
    /// 8 keeps the model deployable on integers.
    Bits(u8),
}

/// The fewest slots, in sensitivity order, raised (to float or to more bits) so that PTQ
/// comes within a drop of float on the analysis rows (mean over seeds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fallback {
    /// The drop allowed, in points of accuracy.
    pub max_drop: f64,
    /// What the raised slots became.
    pub raise: Raise,
    /// The slots raised, most sensitive first.
    pub raised: Vec<String>,
    /// Of how many.
    pub slots: usize,
    /// PTQ's accuracy with them raised (mean over seeds).
    pub accuracy: f64,
    /// The float model's (mean over seeds).
    pub float_accuracy: f64,
    /// Whether the drop was met (raising every slot to float always meets it).
    pub met: bool,
    /// The run file's policy with one override per slot raised: a policy file to commit.
    #[serde(skip)]
    pub policy: Policy,
}

/// What a mixed-precision budget limits, and so which slots the search gives widths to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Resource {
    /// The weights' size: the widths of the weights slots; a slot's units are its weights.
    Weights,
    /// Bit operations of the layers with weights, multiply-adds × weight bits × input bits:
    /// the widths of the weights slots, the inputs at the policy's widths (a float input
    /// counts 32 bits); a slot's units are its layer's multiply-adds per sample times its
    /// input's bits.
    Bops,
    /// The quantized activations' size per sample: the widths of the activation slots; a
    /// slot's units are its values per sample.
    Activations,
}

impl Resource {
    /// The command-line option that sets a budget on it (also the key its errors name).
    pub fn option(self) -> &'static str {
        match self {
            Resource::Weights => "weight_budget",
            Resource::Bops => "bops_budget",
            Resource::Activations => "activation_budget",
        }
    }

    /// The slots whose widths the search chooses.
    fn target(self) -> QuantizationTarget {
        match self {
            Resource::Weights | Resource::Bops => QuantizationTarget::Weights,
            Resource::Activations => QuantizationTarget::Activation,
        }
    }

    /// What one unit is, in words.
    fn unit(self) -> &'static str {
        match self {
            Resource::Weights => "weights",
            Resource::Bops => "multiply-adds × input bits",
            Resource::Activations => "activation values per sample",
        }
    }
}

/// A mixed-precision budget (MCT's resource utilization): the mean bits per unit of the
/// resource allowed (4.0 allows what every searched slot at 4 bits takes), and the widths each
/// slot may get.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrecisionBudget {
    /// What it limits.
    pub resource: Resource,
    /// Mean bits per unit, over every searched slot's units.
    pub bits: f64,
    /// The candidate widths (default 2, 4 and 8).
    pub candidates: Vec<u8>,
}

/// One slot in the mixed-precision search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetSlot {
    /// The slot's dotted name.
    pub slot: String,
    /// Its units of the budget's resource (see [`Resource`]).
    pub units: u64,
    /// Per candidate width: the noise-to-signal ratio of the logits with only this slot
    /// quantized at that width (mean over seeds), the additive loss the solver minimises.
    pub noise: Vec<f64>,
    /// The width chosen.
    pub bits: u8,
}

/// One point of the exact Pareto front of size against summed noise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrontPoint {
    /// Mean bits per unit of the resource.
    pub bits: f64,
    /// Summed noise of the slots' widths.
    pub noise: f64,
    /// PTQ's accuracy with those widths (mean over seeds, on the analysed rows), measured for
    /// up to [`FRONT_ACCURACIES`] points spread over the front.
    pub accuracy: Option<f64>,
}

/// How many points of the front get their accuracy measured.
pub const FRONT_ACCURACIES: usize = 8;

/// Mixed precision under a [`PrecisionBudget`]: the exact optimum of the summed per-slot noise within
/// the budget, and the accuracy/size front.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixedPrecision {
    /// The budget.
    pub budget: PrecisionBudget,
    /// Every searched slot, in model order, with the width chosen.
    pub slots: Vec<BudgetSlot>,
    /// The chosen widths' mean bits per unit.
    pub bits: f64,
    /// PTQ's accuracy with the chosen widths (mean over seeds, on the analysed rows).
    pub accuracy: f64,
    /// PTQ's accuracy with every searched slot at the largest candidate within the budget,
    /// for comparison (mean over seeds); `None` when no candidate fits uniformly.
    pub uniform_accuracy: Option<f64>,
    /// The exact Pareto front, smallest first.
    pub front: Vec<FrontPoint>,
    /// The run file's policy with one override per searched slot: a policy file to commit.
    #[serde(skip)]
    pub policy: Policy,
}

/// Checks a budget: a finite mean of bits within the candidates' range, candidates from 2 to
/// 16, at least one.
///
/// # Errors
/// What is wrong, naming the budget's option ([`Resource::option`]) or `candidates`.
pub fn check_budget(b: &PrecisionBudget) -> Result<(), RunError> {
    let invalid = |what: &str, value: String, expected: &str| -> RunError {
        quant_core::QuantError::InvalidValue {
            what: what.into(),
            value,
            expected: expected.into(),
        }
        .into()
    };
    if b.candidates.is_empty() {
        return Err(invalid(
            "candidates",
            "[]".into(),
            "at least one bit width, such as 2,4,8",
        ));
    }
    if let Some(c) = b.candidates.iter().find(|c| !(2..=16).contains(*c)) {
        return Err(invalid(
            "candidates",
            c.to_string(),
            "bit widths from 2 to 16",
        ));
    }
    let (lo, hi) = (
        *b.candidates.iter().min().unwrap_or(&2),
        *b.candidates.iter().max().unwrap_or(&8),
    );
    if !(b.bits.is_finite() && (f64::from(lo)..=f64::from(hi)).contains(&b.bits)) {
        return Err(invalid(
            b.resource.option(),
            b.bits.to_string(),
            &format!(
                "mean bits per unit ({}) from the smallest candidate to the largest ({lo} to {hi})",
                b.resource.unit()
            ),
        ));
    }
    Ok(())
}

/// `policy` with every slot of `target` (that the `weights` / `input` groups reach) at `bits`.
fn with_bits(policy: &Policy, target: QuantizationTarget, bits: u8) -> Policy {
    let mut p = policy.clone();
    let setting = Some(SlotSetting::Quantize(QuantizerSettings {
        bits: Some(u32::from(bits)),
        ..QuantizerSettings::default()
    }));
    let (weights, input) = match target {
        QuantizationTarget::Weights => (setting, None),
        QuantizationTarget::Activation => (None, setting),
    };
    p.overrides.push(Override {
        pattern: "*".into(),
        weights,
        input,
        slots: BTreeMap::new(),
    });
    p
}

/// The configured slots of `q` that `keep` accepts, in model order: (dotted name, layer,
/// slot name).
fn configured_slots<Q: QuantizedModuleExt>(
    q: &mut Q,
    keep: impl Fn(&Slot) -> bool,
) -> Result<Vec<(String, String, String)>, RunError> {
    let mut out = Vec::new();
    q.visit_slots("", &mut |s| {
        if s.quantizer.describe().is_some() && keep(&s.slot) {
            out.push((s.name(), s.layer.to_string(), s.slot.name.to_string()));
        }
        Ok(())
    })?;
    Ok(out)
}

/// Leaves every slot of `q` float but the one named `name`, which quantizes; every layer's
/// weights and bias float but that slot's layer's, when it is a refined weights slot
/// (`replaced`).
fn quantize_only<Q: QuantizedModuleExt + TensorCollection<f32, Cpu>>(
    q: &mut Q,
    name: &str,
    replaced: &RefinedTensors,
) -> Result<(), RunError> {
    q.set_mode("*", QuantizerMode::Disabled)?;
    q.set_mode(&exactly(name), QuantizerMode::Frozen)?;
    replaced.apply(q, |layer| name != weights_slot(layer))?;
    Ok(())
}

/// Quantizes every slot of `q` but the slots `float`, which are left float, with the float
/// weights and bias of each refined layer whose weights slot is among them (`replaced`).
fn leave_float<Q: QuantizedModuleExt + TensorCollection<f32, Cpu>>(
    q: &mut Q,
    float: &[&str],
    replaced: &RefinedTensors,
) -> Result<(), RunError> {
    q.set_mode("*", QuantizerMode::Frozen)?;
    for name in float {
        q.set_mode(&exactly(name), QuantizerMode::Disabled)?;
    }
    replaced.apply(q, |layer| float.contains(&weights_slot(layer).as_str()))?;
    Ok(())
}

/// The name of the weights slot of `layer`.
fn weights_slot(layer: &str) -> String {
    format!("{layer}.weights")
}

/// The SQNR of the logits with only the slot `name` of `q` quantized.
fn alone<S, const C: usize, Q>(
    dev: &Cpu,
    (q, replaced): (&mut Q, &RefinedTensors),
    name: &str,
    float_logits: &[f32],
    rows: &Samples,
) -> Result<f64, RunError>
where
    S: BatchShape,
    Q: QuantizedModel<S, C>,
{
    quantize_only(q, name, replaced)?;
    let l = logits::<Q, S, C>(dev, q, rows, EVAL_BATCH)?;
    Ok(sqnr_db(float_logits, &l))
}

/// Checks a fallback's allowed drop: finite, 0 to 100 points.
///
/// # Errors
/// A negative, NaN or infinite drop, or one above 100, naming `max_drop`.
pub fn check_max_drop(max_drop: f64) -> Result<(), RunError> {
    if max_drop.is_finite() && (0.0..=100.0).contains(&max_drop) {
        Ok(())
    } else {
        Err(quant_core::QuantError::InvalidValue {
            what: "max_drop".into(),
            value: max_drop.to_string(),
            expected: "points of accuracy from 0 to 100, such as 0.5".into(),
        }
        .into())
    }
}

/// Leaves the first `k` slots of `ranked` float in each seed's PTQ model (every other slot
/// quantized; the seeds in parallel, each on its device of `devs`) and returns the mean
/// accuracy on `rows`.
fn accuracy_with_float<S, const C: usize, Q>(
    devs: &[Cpu],
    models: &mut [(Q, RefinedTensors)],
    ranked: &[SlotSensitivity],
    k: usize,
    rows: &Samples,
) -> Result<f64, RunError>
where
    S: BatchShape,
    Q: QuantizedModel<S, C>,
{
    let float: Vec<&str> = ranked[..k].iter().map(|s| s.slot.as_str()).collect();
    let accuracies = models
        .par_iter_mut()
        .zip(devs)
        .map(|((q, replaced), dev)| {
            leave_float(q, &float, replaced)?;
            let l = logits::<Q, S, C>(dev, q, rows, EVAL_BATCH)?;
            Ok(accuracy(&predictions(&l, C), rows.labels()))
        })
        .collect::<Result<Vec<f64>, RunError>>()?;
    Ok(mean_of(&accuracies))
}

/// The mean of the seeds' figures, summed in seed order (the same bits however the seeds ran).
fn mean_of(per_seed: &[f64]) -> f64 {
    per_seed.iter().sum::<f64>() / per_seed.len().max(1) as f64
}

/// `policy` with the slots `raised` raised as `raise` says (`widths`: each slot's bits).
fn with_raised(
    policy: &Policy,
    raised: &[SlotSensitivity],
    raise: Raise,
    widths: &BTreeMap<String, u32>,
) -> Policy {
    let mut policy = policy.clone();
    for s in raised {
        let setting = match raise {
            Raise::Bits(b) if widths.get(&s.slot).is_some_and(|w| *w < u32::from(b)) => {
                SlotSetting::Quantize(QuantizerSettings {
                    bits: Some(u32::from(b)),
                    ..QuantizerSettings::default()
                })
            }
            _ => SlotSetting::Float,
        };
        policy.overrides.push(Override {
            pattern: exactly(&s.layer),
            weights: None,
            input: None,
            slots: [(s.slot_name.clone(), setting)].into(),
        });
    }
    policy
}

/// The fallback of `max_drop` points: the seeds' PTQ `models` with slots disabled in the order
/// of the ranking (raising to float), or the seeds' `deploys` recalibrated with slots widened
/// (raising to bits).
#[allow(clippy::too_many_arguments)]
fn fallback<S, const C: usize, D>(
    cfg: &RunConfig,
    data: &Dataset,
    deploys: &[(Cpu, D, u64)],
    models: &mut [(D::Quantized, RefinedTensors)],
    mean: &Sensitivity,
    max_drop: f64,
    raise: Raise,
) -> Result<Fallback, RunError>
where
    S: BatchShape,
    D: DeployModel<S, C>,
{
    let ranked = &mean.slots;
    let within = |acc: f64| 100.0 * (mean.float_accuracy - acc) <= max_drop + 1e-9;
    let mut widths = BTreeMap::new();
    if let Some((q, _)) = models.first_mut() {
        for (name, d) in q.quantizers()? {
            widths.insert(name, d.bits);
        }
    }
    let policy_of = |k: usize| with_raised(&cfg.quantization, &ranked[..k], raise, &widths);
    let devs: Vec<Cpu> = deploys.iter().map(|d| d.0.clone()).collect();
    let mut accuracy_at = |k: usize| -> Result<f64, RunError> {
        match raise {
            Raise::Float => {
                accuracy_with_float::<S, C, D::Quantized>(&devs, models, ranked, k, &data.test)
            }
            Raise::Bits(_) => ptq_accuracy::<S, C, D>(cfg, data, deploys, &policy_of(k)),
        }
    };
    let mut k = 0;
    let mut acc = accuracy_at(0)?;
    while !within(acc) && k < ranked.len() {
        k += 1;
        acc = accuracy_at(k)?;
    }
    Ok(Fallback {
        max_drop,
        raise,
        raised: ranked[..k].iter().map(|s| s.slot.clone()).collect(),
        slots: ranked.len(),
        accuracy: acc,
        float_accuracy: mean.float_accuracy,
        met: within(acc),
        policy: policy_of(k),
    })
}

impl Analysis {
    /// The ranking as a table, most sensitive first.
    pub fn table(&self) -> String {
        let m = &self.mean;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "sensitivity of {} on {} ({} rows), mean of seeds {:?}",
            self.model, self.data, m.rows, self.seeds
        );
        let _ = writeln!(
            out,
            "float {:.2}%; every slot quantized (PTQ) {:.2}%, logits SQNR {:.1} dB\n",
            100.0 * m.float_accuracy,
            100.0 * m.quantized.accuracy,
            m.quantized.sqnr_db
        );
        let width = m
            .slots
            .iter()
            .map(|s| s.slot.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:>4}  {:<width$}  {:>14} {:>9}  {:>14} {:>9}",
            "rank", "slot", "alone: SQNR dB", "accuracy", "all but: SQNR", "accuracy"
        );
        for (i, s) in m.slots.iter().enumerate() {
            let _ = writeln!(
                out,
                "{:>4}  {:<width$}  {:>14.1} {:>8.2}%  {:>14.1} {:>8.2}%",
                i + 1,
                s.slot,
                s.alone.sqnr_db,
                100.0 * s.alone.accuracy,
                s.all_but.sqnr_db,
                100.0 * s.all_but.accuracy
            );
        }
        if let Some(f) = &self.fallback {
            let raised = match f.raise {
                Raise::Float => "left float".to_string(),
                Raise::Bits(b) => format!("raised to {b} bits"),
            };
            let _ = writeln!(
                out,
                "\nfallback (max_drop {} points): {} of {} slots {raised}, PTQ {:.2}% against float {:.2}%{}{}",
                f.max_drop,
                f.raised.len(),
                f.slots,
                100.0 * f.accuracy,
                100.0 * f.float_accuracy,
                if f.raised.is_empty() { "" } else { ": " },
                f.raised.join(", ")
            );
            if !f.met {
                let _ = writeln!(out, "the drop is not met even with every slot float");
            }
        }
        if let Some(m) = &self.mixed_precision {
            let uniform = m.uniform_accuracy.map_or_else(String::new, |a| {
                format!(" (uniform at the budget's width: {:.2}%)", 100.0 * a)
            });
            let unit = m.budget.resource.unit();
            let _ = writeln!(
                out,
                "\nmixed precision ({:?}: at most {} bits per unit of {unit}, widths {:?}): {:.3} bits per unit, PTQ {:.2}%{uniform}",
                m.budget.resource,
                m.budget.bits,
                m.budget.candidates,
                m.bits,
                100.0 * m.accuracy
            );
            for w in &m.slots {
                let _ = writeln!(
                    out,
                    "  {:<width$}  {:>2} bits  ({} {unit})",
                    w.slot, w.bits, w.units
                );
            }
            let _ = writeln!(
                out,
                "front (bits per unit, summed noise, PTQ accuracy where measured):"
            );
            let step = m.front.len().div_ceil(12).max(1);
            for (i, p) in m.front.iter().enumerate() {
                if i % step == 0 || p.accuracy.is_some() || i + 1 == m.front.len() {
                    let accuracy = p
                        .accuracy
                        .map_or_else(String::new, |a| format!("  {:.2}%", 100.0 * a));
                    let _ = writeln!(out, "  {:.3}  {:.3e}{accuracy}", p.bits, p.noise);
                }
            }
        }
        out
    }

    /// The ranking as an SVG bar chart: each slot's SQNR alone (lower: more sensitive), most
    /// sensitive at the top.
    pub fn svg(&self) -> String {
        let slots = &self.mean.slots;
        let (row, label_w, bar_w, top) = (18.0, 260.0, 420.0, 40.0);
        let height = top + row * slots.len() as f64 + 30.0;
        let total_height = height
            + if self.mixed_precision.is_some() {
                310.0
            } else {
                0.0
            };
        let max = slots
            .iter()
            .map(|s| s.alone.sqnr_db)
            .fold(1.0f64, f64::max)
            .min(MAX_SQNR_DB);
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{total_height}" font-family="sans-serif" font-size="12">"#,
            label_w + bar_w + 80.0
        );
        let _ = writeln!(
            out,
            r#"<text x="8" y="20" font-size="14">{}: SQNR of the logits with only this slot quantized (dB; shorter: more sensitive)</text>"#,
            xml_escape(&self.model)
        );
        for (i, s) in slots.iter().enumerate() {
            let y = top + row * i as f64;
            let w = (s.alone.sqnr_db.max(0.0) / max * bar_w).max(1.0);
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{label_w}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="#4a78b5"/><text x="{:.1}" y="{:.1}">{:.1}</text>"##,
                label_w - 6.0,
                y + 13.0,
                xml_escape(&s.slot),
                y + 3.0,
                row - 5.0,
                label_w + w + 4.0,
                y + 13.0,
                s.alone.sqnr_db
            );
        }
        if let Some(m) = &self.mixed_precision {
            out.push_str(&front_svg(m, height, label_w + bar_w + 80.0));
        }
        out.push_str("</svg>\n");
        out
    }
}

/// The mixed-precision front as a chart below the ranking, starting at `y0`, `width` wide: PTQ
/// accuracy (where measured, dots joined) and summed noise (log scale, line) against mean
/// bits, the chosen point ringed.
fn front_svg(m: &MixedPrecision, y0: f64, width: f64) -> String {
    let (left, top, w, h) = (70.0, y0 + 50.0, width - 140.0, 220.0);
    let (lo, hi) = m
        .front
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.bits), b.max(p.bits))
        });
    let span = (hi - lo).max(1e-9);
    let x = |bits: f64| left + (bits - lo) / span * w;
    let measured: Vec<(f64, f64)> = m
        .front
        .iter()
        .filter_map(|p| p.accuracy.map(|a| (p.bits, a)))
        .chain(std::iter::once((m.bits, m.accuracy)))
        .collect();
    let (amin, amax) = measured
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
    let arange = (amax - amin).max(1e-3);
    let ya = |acc: f64| top + h - (acc - amin) / arange * h;
    let logs: Vec<f64> = m.front.iter().map(|p| p.noise.max(1e-12).log10()).collect();
    let (nmin, nmax) = logs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    let nrange = (nmax - nmin).max(1e-9);
    let yn = |log: f64| top + h - (log - nmin) / nrange * h;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<text x="8" y="{:.1}" font-size="14">Mixed precision ({:?}): PTQ accuracy (blue dots) and summed noise (grey, log scale) against mean bits per unit</text>"#,
        y0 + 25.0,
        m.budget.resource
    );
    let _ = writeln!(
        out,
        r##"<rect x="{left}" y="{top:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#999"/>"##
    );
    let noise_line: Vec<String> = m
        .front
        .iter()
        .zip(&logs)
        .map(|(p, l)| format!("{:.1},{:.1}", x(p.bits), yn(*l)))
        .collect();
    let _ = writeln!(
        out,
        r##"<polyline points="{}" fill="none" stroke="#aaa"/>"##,
        noise_line.join(" ")
    );
    let mut dots: Vec<(f64, f64)> = measured.clone();
    dots.sort_by(|a, b| a.0.total_cmp(&b.0));
    let acc_line: Vec<String> = dots
        .iter()
        .map(|(b, a)| format!("{:.1},{:.1}", x(*b), ya(*a)))
        .collect();
    let _ = writeln!(
        out,
        r##"<polyline points="{}" fill="none" stroke="#4a78b5"/>"##,
        acc_line.join(" ")
    );
    for (b, a) in &dots {
        let _ = writeln!(
            out,
            r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#4a78b5"/>"##,
            x(*b),
            ya(*a)
        );
    }
    let _ = writeln!(
        out,
        r##"<circle cx="{:.1}" cy="{:.1}" r="7" fill="none" stroke="#c0392b" stroke-width="2"/><text x="{:.1}" y="{:.1}" fill="#c0392b">chosen: {:.2} bits, {:.2}%</text>"##,
        x(m.bits),
        ya(m.accuracy),
        x(m.bits) + 10.0,
        ya(m.accuracy) - 8.0,
        m.bits,
        100.0 * m.accuracy
    );
    for (v, anchor, at) in [(lo, "start", left), (hi, "end", left + w)] {
        let _ = writeln!(
            out,
            r#"<text x="{at:.1}" y="{:.1}" text-anchor="{anchor}">{v:.2} bits</text>"#,
            top + h + 16.0
        );
    }
    for (v, y) in [(amax, top + 4.0), (amin, top + h)] {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{y:.1}" text-anchor="end">{:.2}%</text>"#,
            left - 4.0,
            100.0 * v
        );
    }
    out
}

/// `text` safe inside SVG text.
fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The mean of each figure over `runs` (the same slots in each), ranked again.
fn mean(runs: &[Sensitivity]) -> Sensitivity {
    let n = runs.len().max(1) as f64;
    let avg = |f: &dyn Fn(&Sensitivity) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let effect = |f: &dyn Fn(&Sensitivity) -> Effect| Effect {
        sqnr_db: avg(&|r| f(r).sqnr_db),
        accuracy: avg(&|r| f(r).accuracy),
    };
    let mut slots: Vec<SlotSensitivity> = runs
        .first()
        .map(|first| {
            first
                .slots
                .iter()
                .map(|s| {
                    let of = |r: &Sensitivity| {
                        r.slots
                            .iter()
                            .find(|x| x.slot == s.slot)
                            .cloned()
                            .unwrap_or_else(|| s.clone())
                    };
                    SlotSensitivity {
                        alone: effect(&|r| of(r).alone),
                        all_but: effect(&|r| of(r).all_but),
                        ..s.clone()
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    rank(&mut slots);
    Sensitivity {
        rows: runs.first().map_or(0, |r| r.rows),
        float_accuracy: avg(&|r| r.float_accuracy),
        quantized: effect(&|r| r.quantized),
        slots,
    }
}

/// The units of `resource` of each slot in `slots` ([`Resource`]), read from the lowered graph:
/// its layer's Linear or Conv2d node for weights slots, its own quantize node for activation
/// slots.
fn slot_units<S: BatchShape, Q: QuantizedModule>(
    q: &Q,
    slots: &[(String, String, String)],
    resource: Resource,
) -> Result<Vec<u64>, RunError> {
    let graph = quant_dfdx::lower::export_model(q, &S::sample_shape(), BTreeMap::new())?;
    let shapes = graph.check()?;
    let numel = |i: usize| shapes.nodes[i].iter().product::<usize>() as u64;
    slots
        .iter()
        .map(|(name, layer, _)| {
            let units = graph.nodes.iter().enumerate().find_map(|(i, n)| {
                match (&n.op, resource) {
                    (Op::QuantizeDequantize(crate::graph::QuantizeDequantize { .. }), Resource::Activations) if n.name == *name => {
                        Some(numel(i))
                    }
                    (Op::Linear(crate::graph::Linear { weight, out_features, .. }), Resource::Weights | Resource::Bops)
                        if n.name == *layer =>
                    {
                        // Multiply-adds: every weight once per row (token) of the output.
                        let rows = numel(i) / (*out_features).max(1) as u64;
                        Some(weighted(&graph, n, weight.values.len() as u64, rows, resource))
                    }
                    (Op::Conv2d(crate::graph::Conv2d { weight, geometry, .. }), Resource::Weights | Resource::Bops)
                        if n.name == *layer =>
                    {
                        let positions = numel(i) / geometry.out_channels.max(1) as u64;
                        Some(weighted(&graph, n, weight.values.len() as u64, positions, resource))
                    }
                    _ => None,
                }
            });
            units.ok_or_else(|| {
                quant_core::QuantError::InvalidValue {
                    what: format!("slot {name}"),
                    value: layer.clone(),
                    expected: format!(
                        "a slot whose {} the lowered graph shows (a Linear or Conv2d layer's weights, an activation's quantize node)",
                        resource.unit()
                    ),
                }
                .into()
            })
        })
        .collect()
}

/// A layer's units: its weights, or its multiply-adds (`weights × rows`) times its input's
/// bits (32 for a float input).
fn weighted(
    graph: &quant_runtime::graph::Graph,
    node: &quant_runtime::graph::Node,
    weights: u64,
    rows: u64,
    resource: Resource,
) -> u64 {
    if resource != Resource::Bops {
        return weights;
    }
    let input_bits = node
        .inputs
        .first()
        .and_then(|v| graph.node_index(v))
        .and_then(|p| match &graph.nodes[p].op {
            Op::QuantizeDequantize(crate::graph::QuantizeDequantize { quantizer }) => {
                Some(u64::from(quantizer.origin.bits))
            }
            _ => None,
        })
        .unwrap_or(32);
    weights.saturating_mul(rows).saturating_mul(input_bits)
}

/// The mean PTQ accuracy over the seeds' deployable models under `policy`.
fn ptq_accuracy<S, const C: usize, D>(
    cfg: &RunConfig,
    data: &Dataset,
    deploys: &[(Cpu, D, u64)],
    policy: &Policy,
) -> Result<f64, RunError>
where
    S: BatchShape,
    D: DeployModel<S, C>,
{
    let accuracies = ptq_accuracies::<S, C, D>(cfg, data, deploys, std::slice::from_ref(policy))?;
    Ok(accuracies[0])
}

/// [`ptq_accuracy`] of each of `policies`, every (policy, seed) pair in parallel.
fn ptq_accuracies<S, const C: usize, D>(
    cfg: &RunConfig,
    data: &Dataset,
    deploys: &[(Cpu, D, u64)],
    policies: &[Policy],
) -> Result<Vec<f64>, RunError>
where
    S: BatchShape,
    D: DeployModel<S, C>,
{
    let calibration = data.calibration.as_ref().unwrap_or(&data.train);
    let (batches, batch_size) = (cfg.calibration.batches, cfg.calibration.batch_size);
    // A copy of its policy per pair: a policy records the layers it matched, so it is not
    // shared between threads.
    let pairs: Vec<(Policy, &(Cpu, D, u64))> = policies
        .iter()
        .flat_map(|p| deploys.iter().map(move |d| (p.clone(), d)))
        .collect();
    let accuracies = pairs
        .into_par_iter()
        .map(|(policy, (dev, deploy, seed))| {
            let q = super::quantize::<S, C, D>(
                dev,
                deploy,
                &policy,
                calibration,
                batches,
                batch_size,
                *seed,
            )?;
            let l = logits::<D::Quantized, S, C>(dev, &q, &data.test, EVAL_BATCH)?;
            Ok(accuracy(&predictions(&l, C), data.test.labels()))
        })
        .collect::<Result<Vec<f64>, RunError>>()?;
    // One figure per policy, also without seeds.
    let n = deploys.len();
    Ok((0..policies.len())
        .map(|p| mean_of(&accuracies[p * n..(p + 1) * n]))
        .collect())
}

/// `policy` with each of `slots` at the width `choices` gives it (an index into `candidates`).
fn with_widths(
    policy: &Policy,
    slots: &[(String, String, String)],
    choices: &[usize],
    candidates: &[u8],
) -> Policy {
    let mut policy = policy.clone();
    for ((_, layer, slot_name), &j) in slots.iter().zip(choices) {
        policy.overrides.push(Override {
            pattern: exactly(layer),
            weights: None,
            input: None,
            slots: [(
                slot_name.clone(),
                SlotSetting::Quantize(QuantizerSettings {
                    bits: Some(u32::from(candidates[j])),
                    ..QuantizerSettings::default()
                }),
            )]
            .into(),
        });
    }
    policy
}

/// The mixed-precision search: the seeds' mean noise per slot and width (`noises`, per seed
/// `[slot][candidate]`), the exact optimum within the budget, its policy and accuracy, and the
/// front with the accuracy of some of its points.
fn search<S, const C: usize, D>(
    cfg: &RunConfig,
    data: &Dataset,
    deploys: &[(Cpu, D, u64)],
    noises: &[Vec<Vec<f64>>],
    slots: &[(String, String, String)],
    units: &[u64],
    budget: &PrecisionBudget,
) -> Result<MixedPrecision, RunError>
where
    S: BatchShape,
    D: DeployModel<S, C>,
{
    let n = noises.len().max(1) as f64;
    let noise: Vec<Vec<f64>> = (0..slots.len())
        .map(|i| {
            (0..budget.candidates.len())
                .map(|j| noises.iter().map(|s| s[i][j]).sum::<f64>() / n)
                .collect()
        })
        .collect();
    let choices: Vec<Vec<Choice>> = (0..slots.len())
        .map(|i| {
            budget
                .candidates
                .iter()
                .zip(&noise[i])
                .map(|(&bits, &loss)| Choice {
                    bits,
                    cost: units[i].saturating_mul(u64::from(bits)),
                    loss,
                })
                .collect()
        })
        .collect();
    let total: u64 = units.iter().sum::<u64>().max(1);
    let allowed = (budget.bits * total as f64).floor() as u64;
    let budget_error =
        |e: super::mixed_precision::SolveError| quant_core::QuantError::InvalidValue {
            what: budget.resource.option().into(),
            value: budget.bits.to_string(),
            expected: e.to_string(),
        };
    let best = solve(&choices, allowed).map_err(budget_error)?;
    let policy = with_widths(&cfg.quantization, slots, &best.choices, &budget.candidates);
    let target = budget.resource.target();
    let uniform = budget
        .candidates
        .iter()
        .filter(|&&b| f64::from(b) <= budget.bits)
        .max();
    let assignments = pareto_front(&choices, u64::MAX).map_err(budget_error)?;
    let step = assignments.len().div_ceil(FRONT_ACCURACIES).max(1);
    let measured: Vec<usize> = (0..assignments.len())
        .filter(|&i| i % step == 0 || i + 1 == assignments.len())
        .collect();
    // Every policy measured, in one batch: the optimum, uniform bits (if a candidate fits the
    // budget), then the measured points of the front.
    let mut policies = vec![policy.clone()];
    policies.extend(uniform.map(|&b| with_bits(&cfg.quantization, target, b)));
    policies.extend(measured.iter().map(|&i| {
        with_widths(
            &cfg.quantization,
            slots,
            &assignments[i].choices,
            &budget.candidates,
        )
    }));
    let accuracies = ptq_accuracies::<S, C, D>(cfg, data, deploys, &policies)?;
    let accuracy = accuracies[0];
    let uniform_accuracy = uniform.map(|_| accuracies[1]);
    let mut front_accuracies = accuracies[1 + usize::from(uniform.is_some())..].iter();
    let front = assignments
        .iter()
        .enumerate()
        .map(|(i, a)| FrontPoint {
            bits: a.cost as f64 / total as f64,
            noise: a.loss,
            accuracy: if measured.contains(&i) {
                front_accuracies.next().copied()
            } else {
                None
            },
        })
        .collect();
    Ok(MixedPrecision {
        budget: budget.clone(),
        slots: slots
            .iter()
            .zip(units)
            .zip(noise)
            .zip(&best.choices)
            .map(|((((name, _, _), &units), noise), &j)| BudgetSlot {
                slot: name.clone(),
                units,
                noise,
                bits: budget.candidates[j],
            })
            .collect(),
        bits: best.cost as f64 / total as f64,
        accuracy,
        uniform_accuracy,
        front,
        policy,
    })
}

/// What one seed of an analysis measured, with the models the search and the fallback go on
/// with.
struct SeedAnalysis<D: quant_dfdx::convert::Convert> {
    sensitivity: Sensitivity,
    /// The PTQ model, and what learned rounding replaced in it.
    model: (D::Quantized, RefinedTensors),
    /// The seed's device, its deployable float model, and the seed.
    deploy: (Cpu, D, u64),
    /// With a budget: the searched slots, their units and noise at each candidate width.
    noise: Option<SearchedNoise>,
}

/// A seed's measurements for the mixed-precision search.
struct SearchedNoise {
    /// The slots of the budget's target: (dotted name, layer, slot name).
    slots: Vec<(String, String, String)>,
    /// Each slot's size in the budget's units per bit.
    units: Vec<u64>,
    /// The logits' noise with only that slot quantized, `[slot][candidate]`.
    noise: Vec<Vec<f64>>,
}

/// One seed of [`analyze_model`]: the PTQ model from the seed's float model, its sensitivity
/// on the analysis rows and, with a budget, the noise of each slot of the budget's target at
/// each candidate width (the model recalibrated and refined at that width, only that slot
/// quantized).
fn analyze_seed<S, const C: usize, F, D>(
    s: &Seed<'_>,
    model: &Model<S, C, F, D>,
    float: stages::FloatStage<F>,
    request: &AnalyzeRequest,
) -> Result<SeedAnalysis<D>, RunError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    let ptq = stages::ptq(s, model, &float)?;
    let rows = &s.data.test;
    let float_logits = logits::<F, S, C>(&float.dev, &float.model, rows, EVAL_BATCH)?;
    let sensitivity = sensitivity::<S, C, D::Quantized>(
        &float.dev,
        (&ptq.model, &ptq.replaced),
        &float_logits,
        rows,
    )?;
    let noise = match &request.budget {
        Some(budget) => {
            let target = budget.resource.target();
            let mut q = ptq.model.clone();
            let slots = configured_slots(&mut q, |slot| slot.target == target)?;
            let units = slot_units::<S, _>(&ptq.model, &slots, budget.resource)?;
            let calibration = s.data.calibration.as_ref().unwrap_or(&s.data.train);
            let c = &s.cfg.calibration;
            let (batches, batch_size, seed) = (c.batches, c.batch_size, s.seed);
            let policies: Vec<Policy> = (budget.candidates.iter())
                .map(|&bits| with_bits(&s.cfg.quantization, target, bits))
                .collect();
            // Per candidate width (in parallel): the model recalibrated and refined at that
            // width, then each slot's noise with only it quantized.
            let by_width = policies
                .into_par_iter()
                .map(|policy| {
                    let super::Calibrated {
                        model: mut q,
                        replaced,
                        ..
                    } = super::quantize_and_refine::<S, C, D>(
                        &float.dev,
                        &ptq.deploy,
                        &policy,
                        calibration,
                        (batches, batch_size, seed),
                    )?;
                    slots
                        .iter()
                        .map(|(name, _, _)| {
                            let db = alone::<S, C, _>(
                                &float.dev,
                                (&mut q, &replaced),
                                name,
                                &float_logits,
                                rows,
                            )?;
                            Ok(10f64.powf(-db / 10.0))
                        })
                        .collect::<Result<Vec<f64>, RunError>>()
                })
                .collect::<Result<Vec<Vec<f64>>, RunError>>()?;
            let noise = (0..slots.len())
                .map(|i| by_width.iter().map(|w| w[i]).collect())
                .collect();
            Some(SearchedNoise {
                slots,
                units,
                noise,
            })
        }
        None => None,
    };
    Ok(SeedAnalysis {
        sensitivity,
        model: (ptq.model, ptq.replaced),
        deploy: (float.dev, ptq.deploy, s.seed),
        noise,
    })
}

/// Analyses `model` for every seed of `cfg`: the float model (from the cache, trained or
/// given, as [`run_model`](super::run_model) gets it), calibrated under the policy, measured
/// on `data.test`, which must be rows held out of the training split (see [`analyze`]).
///
/// # Errors
/// The data does not fit the model; the policy does not apply; training, calibration or a
/// forward pass fails; the cache cannot be read or written.
pub fn analyze_model<S, const C: usize, F, D>(
    cfg: &RunConfig,
    opts: &RunOptions,
    data: &Dataset,
    model: &Model<S, C, F, D>,
    request: &AnalyzeRequest,
) -> Result<Analysis, RunError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    request.check()?;
    let data = data.clone().for_model(&S::sample_shape(), C)?;
    let progress = indicatif::MultiProgress::with_draw_target(if opts.progress {
        indicatif::ProgressDrawTarget::stderr()
    } else {
        indicatif::ProgressDrawTarget::hidden()
    });
    let (cache_files, float_after) = super::seed_plan(cfg, opts, &data, model);
    let tasks = super::SeedTasks::new(cfg, opts, &data, progress);
    // The seeds run in parallel, as in `quant run`: each seed's figures are its own, whatever
    // runs beside it.
    let seeds = super::schedule::run_seeds(
        float_after,
        |i| {
            tasks.run(i, |s| {
                stages::float_model(s, model, cache_files[i].as_deref())
            })
        },
        |i, float| tasks.run(i, |s| analyze_seed(s, model, float, request)),
    )?;
    let mut runs = Vec::with_capacity(seeds.len());
    let mut models = Vec::with_capacity(seeds.len());
    // Per seed, for the mixed-precision search and the fallback: the seed's device and
    // deployable model.
    let mut deploys = Vec::with_capacity(seeds.len());
    let mut noises: Vec<Vec<Vec<f64>>> = Vec::new();
    let mut searched: Vec<(String, String, String)> = Vec::new();
    let mut units: Vec<u64> = Vec::new();
    for seed in seeds {
        runs.push(seed.sensitivity);
        models.push(seed.model);
        deploys.push(seed.deploy);
        if let Some(noise) = seed.noise {
            // Every seed's model has the same slots; the first seed's list is the search's.
            if searched.is_empty() {
                searched = noise.slots;
                units = noise.units;
            }
            noises.push(noise.noise);
        }
    }
    let mean = mean(&runs);
    let mixed_precision = match &request.budget {
        Some(budget) => Some(search::<S, C, D>(
            cfg, &data, &deploys, &noises, &searched, &units, budget,
        )?),
        None => None,
    };
    let max_drop = request.max_drop;
    let fallback = max_drop
        .map(|d| fallback::<S, C, D>(cfg, &data, &deploys, &mut models, &mean, d, request.raise))
        .transpose()?;
    Ok(Analysis {
        model: model.name().to_string(),
        data: data.origin.clone(),
        seeds: cfg.run.seeds.clone(),
        mean,
        runs,
        fallback,
        mixed_precision,
    })
}

/// What `quant analyze` does: the bundled network of the run file, its data with the run
/// file's hold-out fold (or [`DEFAULT_HOLDOUT`]) as the rows measured on.
///
/// # Errors
/// See [`analyze_model`]; a run file without `[model]`; data no bundled network takes.
pub fn analyze(
    cfg: &RunConfig,
    opts: &RunOptions,
    request: &AnalyzeRequest,
) -> Result<Analysis, RunError> {
    request.check()?;
    let mut cfg = cfg.clone();
    cfg.data.holdout.get_or_insert(DEFAULT_HOLDOUT);
    let kind = cfg.bundled_model()?;
    let data = data::load(&cfg.data)?;
    struct Analyze<'a> {
        cfg: &'a RunConfig,
        opts: &'a RunOptions,
        data: &'a Dataset,
        request: &'a AnalyzeRequest,
    }
    impl BundledTask for Analyze<'_> {
        type Output = Analysis;
        fn run<S, const C: usize, F, D>(
            self,
            model: &Model<S, C, F, D>,
        ) -> Result<Analysis, RunError>
        where
            S: BatchShape,
            F: FloatModel<S, C>,
            D: DeployModel<S, C>,
        {
            analyze_model(self.cfg, self.opts, self.data, model, self.request)
        }
    }
    with_bundled(
        kind,
        &data,
        Analyze {
            cfg: &cfg,
            opts,
            data: &data,
            request,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqnr_is_infinite_only_in_name() {
        assert_eq!(sqnr_db(&[1.0, 2.0], &[1.0, 2.0]), MAX_SQNR_DB);
        let db = sqnr_db(&[3.0, 4.0], &[3.0, 3.0]);
        assert!((db - 10.0 * 25f64.log10()).abs() < 1e-12, "{db}");
    }

    #[test]
    fn glob_characters_in_names_match_literally() {
        for name in ["a[0].b*", "!x", "{a,b}.c?", "a\\b", "[!a]"] {
            let g = quant_dfdx::layers::glob(&exactly(name)).unwrap();
            assert!(g.is_match(name), "{name}");
        }
        let g = quant_dfdx::layers::glob(&exactly("a[0].b*")).unwrap();
        assert!(!g.is_match("a0.bx"));
        assert!(!g.is_match("a[0].bx"));
        let g = quant_dfdx::layers::glob(&exactly("!x")).unwrap();
        assert!(!g.is_match("y"));
        let g = quant_dfdx::layers::glob(&exactly("{a,b}.c?")).unwrap();
        assert!(!g.is_match("a.cd"));
    }
}

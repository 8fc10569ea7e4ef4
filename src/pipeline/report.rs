//! The run report: per-seed and mean accuracies, per-layer quantizer report, as a table and as
//! JSON.

use std::fmt::Write as _;

use serde::Serialize;

use quant_dfdx::ptq::{RefinedLayer, Smoothing};
use quant_dfdx::report::LayerReport;

use super::RunConfig;

/// Figures of one seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// Float accuracy on the test split.
    pub fp32_accuracy: f64,
    /// Accuracy after calibration (PTQ).
    pub ptq_accuracy: f64,
    /// Accuracy after QAT (fake-quantized model).
    pub qat_accuracy: f64,
    /// Accuracy of the exported model run on integers (`None` when the policy leaves a layer
    /// float, so there is no integer model).
    pub integer_accuracy: Option<f64>,
    /// Fraction of test samples where the integer model predicts what the fake-quantized
    /// model predicts.
    pub integer_agreement: Option<f64>,
    /// Accuracy of the QAT model on the training split (to see over- or under-fitting).
    pub qat_train_accuracy: f64,
    /// Whether the float model came from the checkpoint cache.
    pub float_from_cache: bool,
}

/// The report of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// The model's name (`mlp`, `mnist-cnn`, a model of your own).
    pub model: String,
    /// The run file.
    pub policy: String,
    /// Where the data came from (its files; the bundled digits otherwise).
    pub data: Option<String>,
    /// The first seed.
    pub seed: u64,
    /// Every seed run.
    pub seeds: Vec<u64>,
    /// Mean over seeds.
    pub fp32_accuracy: f64,
    /// Mean over seeds.
    pub ptq_accuracy: f64,
    /// Mean over seeds.
    pub qat_accuracy: f64,
    /// Mean over seeds (`None` without an integer model).
    pub integer_accuracy: Option<f64>,
    /// Mean over seeds (`None` without an integer model).
    pub integer_agreement: Option<f64>,
    /// Why there is no integer model, when there is none.
    pub no_integer_model: Option<String>,
    /// Why the export has no `model.onnx` (a model ONNX cannot express, naming the node), when
    /// it has quant's files but not that one.
    pub no_onnx_model: Option<String>,
    /// The training recipe, in words.
    pub recipe: String,
    /// Per seed.
    pub runs: Vec<SeedResult>,
    /// Per quantized layer, of the first seed's QAT model.
    pub layers: Vec<LayerReport>,
    /// What learned rounding and bias correction did to the first seed's PTQ model, per layer
    /// they ran on (policy settings `learned_rounding`, `bias_correction`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refined: Vec<RefinedLayer>,
    /// What SmoothQuant did to the first seed's model before calibration (policy setting
    /// `smoothing`).
    #[serde(default, skip_serializing_if = "Smoothing::is_empty")]
    pub smoothed: Smoothing,
    /// Where the first seed's integer model was exported.
    pub export_dir: Option<String>,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn mean_some(xs: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Option<Vec<f64>> = xs.collect();
    v.map(|v| mean(v.into_iter()))
}

impl RunReport {
    /// Aggregates per-seed results.
    pub fn new(
        model: String,
        policy: String,
        recipe: String,
        runs: Vec<SeedResult>,
        layers: Vec<LayerReport>,
        export_dir: Option<String>,
        no_integer_model: Option<String>,
    ) -> RunReport {
        RunReport {
            model,
            policy,
            data: None,
            seed: runs.first().map_or(0, |r| r.seed),
            seeds: runs.iter().map(|r| r.seed).collect(),
            fp32_accuracy: mean(runs.iter().map(|r| r.fp32_accuracy)),
            ptq_accuracy: mean(runs.iter().map(|r| r.ptq_accuracy)),
            qat_accuracy: mean(runs.iter().map(|r| r.qat_accuracy)),
            integer_accuracy: mean_some(runs.iter().map(|r| r.integer_accuracy)),
            integer_agreement: mean_some(runs.iter().map(|r| r.integer_agreement)),
            no_integer_model,
            no_onnx_model: None,
            recipe,
            runs,
            layers,
            refined: Vec::new(),
            smoothed: Smoothing::default(),
            export_dir,
        }
    }

    /// The human-readable report.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let pct = |v: f64| format!("{:6.2}%", 100.0 * v);
        let opt = |v: Option<f64>| v.map_or_else(|| "      -".to_string(), pct);
        let _ = writeln!(s, "model {}   policy {}", self.model, self.policy);
        if let Some(data) = &self.data {
            let _ = writeln!(s, "data: {data}");
        }
        let _ = writeln!(s, "recipe: {}", self.recipe);
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  seed      fp32       PTQ       QAT   integer   int=QAT   QAT(train)"
        );
        for r in &self.runs {
            let _ = writeln!(
                s,
                "  {:>4}   {}   {}   {}   {}   {}   {}",
                r.seed,
                pct(r.fp32_accuracy),
                pct(r.ptq_accuracy),
                pct(r.qat_accuracy),
                opt(r.integer_accuracy),
                opt(r.integer_agreement),
                pct(r.qat_train_accuracy)
            );
        }
        if self.runs.len() > 1 {
            let _ = writeln!(
                s,
                "  mean   {}   {}   {}   {}   {}",
                pct(self.fp32_accuracy),
                pct(self.ptq_accuracy),
                pct(self.qat_accuracy),
                opt(self.integer_accuracy),
                opt(self.integer_agreement)
            );
        }
        let _ = writeln!(s);
        s.push_str(&quant_dfdx::report::layer_table(&self.layers));
        if !self.smoothed.layer_norms.is_empty() {
            s.push_str("  smoothing (first seed, before calibration; widest channel range over the mean one):\n");
            for m in &self.smoothed.layer_norms {
                s.push_str(&format!(
                    "  {:<10} -> {} (alpha {}): {:.2} -> {:.2}\n",
                    m.layer_norm,
                    m.linears.join(", "),
                    m.strength,
                    m.spread_before,
                    m.spread_after,
                ));
            }
        }
        if !self.smoothed.not_applied.is_empty() {
            s.push_str(&format!(
                "  smoothing not applied (the input is not a LayerNorm's output read by Linear layers alone): {}\n",
                self.smoothed.not_applied.join(", ")
            ));
        }
        if !self.refined.is_empty() {
            s.push_str("  learned rounding and bias correction (first seed, PTQ; output MSE against the float layer):\n");
            for r in &self.refined {
                let settled = r
                    .settled
                    .map(|v| format!(", {:.1}% of rounding choices settled", v * 100.0))
                    .unwrap_or_default();
                s.push_str(&format!(
                    "  {:<10} {:?}{}{}: {:.3e} -> {:.3e}\n",
                    r.layer,
                    r.rounding,
                    if r.bias_corrected {
                        " + bias correction"
                    } else {
                        ""
                    },
                    settled,
                    r.error_nearest,
                    r.error_refined,
                ));
            }
        }
        if let Some(why) = &self.no_integer_model {
            let _ = writeln!(s, "\nno integer model: {why}");
        }
        if let Some(dir) = &self.export_dir {
            let what = match self.no_integer_model {
                None => "integer model",
                Some(_) => "model (graph and ONNX, for the policy's runtime; no integer model)",
            };
            let _ = writeln!(s, "\nexported {what} (seed {}): {dir}", self.seed);
        }
        if let Some(why) = &self.no_onnx_model {
            let _ = writeln!(s, "no model.onnx: {why}");
        }
        s
    }
}

/// The training recipe of a run file, in words (the report's `recipe`).
pub(crate) fn recipe(cfg: &RunConfig) -> String {
    let q = &cfg.qat;
    let mut s = format!(
        "float: {:?} lr {} ({:?}), {} epochs, batch {}; PTQ: {} calibration batches of {}; QAT: {:?} lr {} ({:?}), {} epochs, batch {}, init {:?}",
        cfg.float.optimizer,
        cfg.float.lr,
        cfg.float.schedule,
        cfg.float.epochs,
        cfg.float.batch_size,
        cfg.calibration.batches,
        cfg.calibration.batch_size,
        q.optimizer,
        q.lr,
        q.schedule,
        q.epochs,
        q.batch_size,
        q.init
    );
    for (phase, warmup) in [("float", cfg.float.warmup_epochs), ("QAT", q.warmup_epochs)] {
        if warmup > 0 {
            s.push_str(&format!("; {phase} warm-up {warmup} epochs"));
        }
    }
    if cfg.float.shift > 0 || q.shift > 0 {
        s.push_str(&format!(
            "; random shifts of up to {} px (float) / {} px (QAT)",
            cfg.float.shift, q.shift
        ));
    }
    if let Some(d) = q.distillation {
        s.push_str(&format!(
            ", distillation from the float model (weight {}, temperature {})",
            d.weight, d.temperature
        ));
    }
    for (phase, wd, ls) in [
        ("float", cfg.float.weight_decay, cfg.float.label_smoothing),
        ("QAT", q.weight_decay, q.label_smoothing),
    ] {
        if wd > 0.0 {
            s.push_str(&format!("; {phase} weight decay {wd}"));
        }
        if ls > 0.0 {
            s.push_str(&format!("; {phase} label smoothing {ls}"));
        }
    }
    if let Some(h) = cfg.data.holdout {
        s.push_str(&format!(
            "; HOLD-OUT MODE: trained without fold {} of {} of the training split, figures on that fold (not the test split)",
            h.fold, h.folds
        ));
    }
    s
}

//! The stages of one seed, each a function of what the stages before it produced: the float
//! model (from the cache, or trained), PTQ, QAT, the integer model, and the first seed's
//! outputs (export, reload check, layer report).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use dfdx::prelude::*;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use quant_ops::calibration;
use quant_ops::convert::convert_model;
use quant_ops::export::{self, export_model, ExportError, OnnxFormat, QuantFormat};
use quant_ops::fs::StagedDir;
use quant_ops::graph::Graph;
use quant_ops::integer::IntegerModel;
use quant_ops::layers::{QuantizedModuleExt, QuantizerMode};
use quant_ops::report::{layer_report, LayerReport};

use super::cache::save_checkpoint;
use super::config::{QatInit, RunConfig};
use super::nets::Net;
use super::train::{self, accuracy, calibration_inputs, input, logits, predictions, Phase};
use super::{file_error, RunError, RunOptions, SeedResult};
use crate::digits::Digits;

/// Batch size of evaluation (no tape: only memory).
const EVAL_BATCH: usize = 256;

/// The training [`Phase`] of a config section: `[float]` and `[qat]` name the same settings.
macro_rules! phase_of {
    ($section:expr) => {{
        let section = $section;
        Phase {
            epochs: section.epochs,
            batch_size: section.batch_size,
            lr: section.lr,
            schedule: section.schedule,
            warmup_epochs: section.warmup_epochs,
            shift: section.shift,
            optimizer: section.optimizer,
            weight_decay: section.weight_decay,
            label_smoothing: section.label_smoothing,
        }
    }};
}

/// What every stage of one seed reads.
pub(crate) struct Seed<'a> {
    /// The seed's own copy of the run file (conversion records which layers a policy matched).
    pub cfg: &'a RunConfig,
    pub opts: &'a RunOptions,
    pub data: &'a Digits,
    pub seed: u64,
    pub progress: &'a MultiProgress,
}

impl Seed<'_> {
    /// A progress bar of `len` steps labelled `seed <seed>: <what>` (hidden without progress).
    fn bar(&self, len: u64, what: &str) -> ProgressBar {
        if !self.opts.progress {
            return ProgressBar::hidden();
        }
        let b = self.progress.add(ProgressBar::new(len));
        b.set_style(
            ProgressStyle::with_template("{prefix:>22} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b.set_prefix(format!("seed {}: {what}", self.seed));
        b.enable_steady_tick(Duration::from_millis(200));
        b
    }
}

/// Stage 1: the float model.
pub(crate) struct FloatStage<N: Net> {
    /// The seed's device: its generator initialised the model.
    pub dev: Cpu,
    pub model: N::Float,
    pub from_cache: bool,
    /// On the test split.
    pub accuracy: f64,
}

/// Stage 1: the float model from `cache_file` when it exists, else trained (and written to
/// `cache_file`).
pub(crate) fn float_model<N: Net>(
    s: &Seed<'_>,
    cache_file: Option<&Path>,
) -> Result<FloatStage<N>, RunError> {
    let dev = Cpu::seed_from_u64(s.seed);
    let mut model = N::build(&dev);
    let from_cache = match cache_file {
        Some(path) if path.exists() => {
            // A checked load: a corrupted cache file is a typed error, not a panic in dfdx.
            quant_ops::checkpoint::load_checkpoint(&mut model, path)
                .map_err(|e| file_error(path, format!("cannot load float checkpoint: {e}")))?;
            true
        }
        _ => false,
    };
    if !from_cache {
        let f = &s.cfg.float;
        let phase = phase_of!(f);
        let b = s.bar(phase.epochs as u64, "float");
        train::train::<N::Float, N::Input>(
            &dev,
            &mut model,
            &s.data.train,
            &phase,
            s.seed,
            None,
            &b,
        )?;
        b.finish_and_clear();
        if let Some(path) = cache_file {
            save_checkpoint(&model, path)?;
        }
    }
    let test = &s.data.test;
    let accuracy = accuracy(
        &predictions(&logits::<N::Float, N::Input>(
            &dev, &model, test, EVAL_BATCH,
        )?),
        &test.labels,
    );
    Ok(FloatStage {
        dev,
        model,
        from_cache,
        accuracy,
    })
}

/// Stage 2: the calibrated model.
pub(crate) struct PtqStage<N: Net> {
    /// The float model prepared for quantization (BatchNorm folded).
    pub deploy: N::Deploy,
    pub model: N::Quantized,
    /// On the test split.
    pub accuracy: f64,
}

/// A converted model calibrated on `batches` training batches of `batch_size`.
fn calibrated<N: Net>(
    s: &Seed<'_>,
    dev: &Cpu,
    deploy: &N::Deploy,
    batches: usize,
    batch_size: usize,
) -> Result<N::Quantized, RunError> {
    let policy = s.cfg.quantization.clone();
    let mut model = convert_model(deploy, &policy)?;
    policy.check_unmatched()?;
    let inputs = calibration_inputs::<N::Input>(dev, &s.data.train, batches, batch_size, s.seed)?;
    calibration::calibrate(&mut model, inputs)?;
    Ok(model)
}

/// Stage 2: converts the deployable float model under the policy and calibrates it (PTQ).
pub(crate) fn ptq<N: Net>(s: &Seed<'_>, float: &FloatStage<N>) -> Result<PtqStage<N>, RunError> {
    let deploy = N::deploy(&float.model);
    let b = s.bar(1, "calibration");
    let c = &s.cfg.calibration;
    let model = calibrated::<N>(s, &float.dev, &deploy, c.batches, c.batch_size)?;
    b.finish_and_clear();
    let test = &s.data.test;
    let accuracy = accuracy(
        &predictions(&logits::<N::Quantized, N::Input>(
            &float.dev, &model, test, EVAL_BATCH,
        )?),
        &test.labels,
    );
    Ok(PtqStage {
        deploy,
        model,
        accuracy,
    })
}

/// Stage 3: the model after QAT (frozen).
pub(crate) struct QatStage<N: Net> {
    pub model: N::Quantized,
    /// On the test split.
    pub predictions: Vec<usize>,
    pub accuracy: f64,
    /// On the training split.
    pub train_accuracy: f64,
}

/// Stage 3: QAT from the PTQ model (or from one calibrated batch), distilling from the float
/// model when the run file says so.
pub(crate) fn qat<N: Net>(
    s: &Seed<'_>,
    float: &FloatStage<N>,
    ptq: &PtqStage<N>,
) -> Result<QatStage<N>, RunError> {
    let q = &s.cfg.qat;
    let dev = &float.dev;
    let mut model = match q.init {
        QatInit::Ptq => ptq.model.clone(),
        QatInit::FirstBatch => calibrated::<N>(s, dev, &ptq.deploy, 1, q.batch_size)?,
    };
    if q.epochs > 0 {
        model.set_mode("*", QuantizerMode::Training)?;
        let teacher = |pixels: Vec<f32>, n: usize| -> quant_core::Result<Vec<f32>> {
            let x = input::<N::Input>(dev, pixels, n)?;
            Ok(float.model.try_forward(x)?.as_vec())
        };
        let phase = phase_of!(q);
        let b = s.bar(phase.epochs as u64, "QAT");
        train::train::<N::Quantized, N::Input>(
            dev,
            &mut model,
            &s.data.train,
            &phase,
            s.seed.wrapping_add(1),
            q.distillation.map(|d| (&teacher as train::Teacher<'_>, d)),
            &b,
        )?;
        b.finish_and_clear();
        model.set_mode("*", QuantizerMode::Frozen)?;
    }
    let (test, training) = (&s.data.test, &s.data.train);
    let predictions = predictions(&logits::<N::Quantized, N::Input>(
        dev, &model, test, EVAL_BATCH,
    )?);
    let test_accuracy = accuracy(&predictions, &test.labels);
    let train_accuracy = accuracy(
        &train::predictions(&logits::<N::Quantized, N::Input>(
            dev, &model, training, EVAL_BATCH,
        )?),
        &training.labels,
    );
    Ok(QatStage {
        model,
        predictions,
        accuracy: test_accuracy,
        train_accuracy,
    })
}

/// Stage 4: the QAT model lowered to a graph and run on integers.
pub(crate) struct IntegerStage {
    pub graph: Graph,
    /// On the test split; `Err(reason)` when the integer runtime cannot run the graph (a layer
    /// the policy leaves float, as TensorRT's and OpenVINO's presets leave LayerNorm and GELU):
    /// the graph and its ONNX are still exported, for the runtime the policy targets.
    pub predictions: Result<Vec<usize>, String>,
}

/// Stage 4: exports the QAT model to a graph and runs it on integers. `Ok(Err(reason))` when
/// the graph cannot express the model (a layer with no graph form yet): there is then no
/// integer model and no export, and the run still reports the rest.
pub(crate) fn integer<N: Net>(
    s: &Seed<'_>,
    qat: &QatStage<N>,
) -> Result<Result<IntegerStage, String>, RunError> {
    let mut info = BTreeMap::new();
    info.insert("model".into(), s.cfg.model.kind.to_string());
    info.insert("policy".into(), s.opts.policy_name.clone());
    info.insert("seed".into(), s.seed.to_string());
    let graph = match export_model(&qat.model, N::INPUT_SHAPE, info) {
        Ok(graph) => graph,
        Err(ExportError::Unsupported { layer, reason }) => {
            return Ok(Err(format!("layer `{layer}`: {reason}")))
        }
        Err(e) => return Err(e.into()),
    };
    let predictions = match IntegerModel::new(&graph) {
        Ok(model) => Ok(model.predict(&s.data.test.images)?),
        Err(ExportError::Unsupported { layer, reason }) => {
            Err(format!("layer `{layer}`: {reason}"))
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Ok(IntegerStage { graph, predictions }))
}

/// What only the first seed produces.
#[derive(Default)]
pub(crate) struct FirstSeedOutputs {
    /// Per quantized layer, of the QAT model.
    pub layers: Vec<LayerReport>,
    /// Where the export goes, once committed.
    pub exported_dir: Option<String>,
    /// The export, written and checked, not yet in place.
    pub export: Option<StagedDir>,
    /// Why the export has no `model.onnx`, when ONNX cannot express the model.
    pub no_onnx: Option<String>,
}

/// Stage 5 (first seed only): the per-layer report, and the export written beside its
/// directory and reloaded, to prove the files reproduce the in-memory integer model.
pub(crate) fn first_seed_outputs<N: Net>(
    s: &Seed<'_>,
    qat: &QatStage<N>,
    integer: Option<&IntegerStage>,
    export: Option<StagedDir>,
) -> Result<FirstSeedOutputs, RunError> {
    let train = &s.data.train;
    let idx: Vec<usize> = (0..train.len().min(256)).collect();
    let (pixels, _) = train.gather(&idx);
    // Against the same model with every quantizer disabled: after QAT its weights differ from
    // the float model's, and the report measures quantization alone.
    let layers = layer_report(&qat.model, N::INPUT_SHAPE, &pixels)?;
    let (Some(staged), Some(integer)) = (export, integer) else {
        return Ok(FirstSeedOutputs {
            layers,
            ..FirstSeedOutputs::default()
        });
    };
    // Written beside the target; put in place only when every seed has succeeded.
    // model.onnx too, unless ONNX cannot express the model (the report says why).
    let onnx = OnnxFormat::for_platform(s.cfg.quantization.platform.as_deref());
    let skipped =
        export::save_with_optional(&integer.graph, staged.path(), &[&QuantFormat], &[&onnx])?;
    let no_onnx = skipped.into_iter().map(|(_, why)| why.to_string()).last();
    let reloaded = export::load(staged.path())?;
    let reproduced = match &integer.predictions {
        Ok(predictions) => {
            IntegerModel::new(&reloaded)?.predict(&s.data.test.images)? == *predictions
        }
        Err(_) => reloaded == integer.graph,
    };
    if !reproduced {
        return Err(RunError::File {
            path: staged.target().to_path_buf(),
            message: "the saved export does not reproduce the in-memory model".into(),
        });
    }
    Ok(FirstSeedOutputs {
        layers,
        exported_dir: Some(staged.target().display().to_string()),
        export: Some(staged),
        no_onnx,
    })
}

/// Everything a seed leaves for the report.
pub(crate) struct SeedOutcome {
    pub result: SeedResult,
    /// Why there is no integer model, when there is none.
    pub no_integer: Option<String>,
    /// The first seed's outputs.
    pub first: Option<FirstSeedOutputs>,
}

/// Stages 2 to 5 of a seed, from its float model. `export` is `Some` for the first seed only
/// (with [`RunOptions::export_dir`]); `first` says whether this is the first seed.
pub(crate) fn quantized<N: Net>(
    s: &Seed<'_>,
    float: FloatStage<N>,
    first: bool,
    export: Option<StagedDir>,
) -> Result<SeedOutcome, RunError> {
    let ptq = ptq(s, &float)?;
    let qat = qat(s, &float, &ptq)?;
    let integer = integer(s, &qat)?;
    let first = if first {
        Some(first_seed_outputs(s, &qat, integer.as_ref().ok(), export)?)
    } else {
        None
    };
    let integer_predictions = match &integer {
        Ok(i) => i.predictions.as_ref().map_err(Clone::clone),
        Err(why) => Err(why.clone()),
    };
    let (integer_accuracy, integer_agreement) = match &integer_predictions {
        Ok(p) => (
            Some(accuracy(p, &s.data.test.labels)),
            Some(accuracy(p, &qat.predictions)),
        ),
        Err(_) => (None, None),
    };
    Ok(SeedOutcome {
        result: SeedResult {
            seed: s.seed,
            fp32_accuracy: float.accuracy,
            ptq_accuracy: ptq.accuracy,
            qat_accuracy: qat.accuracy,
            integer_accuracy,
            integer_agreement,
            qat_train_accuracy: qat.train_accuracy,
            float_from_cache: float.from_cache,
        },
        no_integer: integer_predictions.err(),
        first,
    })
}

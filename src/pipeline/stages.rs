//! The stages of one seed, each a function of what the stages before it produced: the float
//! model (from the cache, or trained), PTQ, QAT, the integer model, and the first seed's
//! outputs (export, reload check, layer report).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use dfdx::prelude::*;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use quant_dfdx::convert::Convert;
use quant_dfdx::layers::{QuantizedModule, QuantizedModuleExt, QuantizerMode};
use quant_dfdx::lower::export_model;
use quant_dfdx::ptq::{RefinedLayer, RefinedTensors, Smoothing};
use quant_dfdx::report::{layer_report, LayerReport};
use quant_runtime::export::onnx::OnnxFormat;
use quant_runtime::export::{self, QuantFormat};
use quant_runtime::fs::StagedDir;
use quant_runtime::graph::Graph;
use quant_runtime::integer::IntegerModel;
use quant_runtime::GraphError;

use super::cache::save_checkpoint;
use super::config::{QatInit, RunConfig};
use super::model::{BatchShape, DeployModel, FloatModel, FloatWeights, Model};
use super::train::{self, accuracy, input, logits, predictions, Phase};
use super::{file_error, RunError, RunOptions, SeedResult};
use crate::data::Dataset;

/// Batch size of evaluation (no tape: only memory).
const EVAL_BATCH: usize = 256;

/// What every stage of one seed reads.
pub(crate) struct Seed<'a> {
    /// The seed's own copy of the run file (conversion records which layers a policy matched).
    pub cfg: &'a RunConfig,
    pub opts: &'a RunOptions,
    pub data: &'a Dataset,
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
pub(crate) struct FloatStage<F> {
    /// The seed's device: its generator initialised the model.
    pub dev: Cpu,
    pub model: F,
    pub from_cache: bool,
    /// On the test split.
    pub accuracy: f64,
}

/// Stage 1: the float model: the model's own weights, or from `cache_file` when it exists, else
/// trained (and written to `cache_file`).
pub(crate) fn float_model<S, const C: usize, F, D>(
    s: &Seed<'_>,
    model: &Model<S, C, F, D>,
    cache_file: Option<&Path>,
) -> Result<FloatStage<F>, RunError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
{
    let dev = Cpu::seed_from_u64(s.seed);
    let (float, from_cache) = match (model.weights(), cache_file) {
        (FloatWeights::Given(trained), _) => (trained.clone(), true),
        (FloatWeights::Safetensors(path), _) => {
            let mut float = model.build(&dev);
            quant_dfdx::checkpoint::load_checkpoint(&mut float, path)
                .map_err(|e| file_error(path, format!("cannot load the float weights: {e}")))?;
            (float, true)
        }
        (FloatWeights::Train, Some(path)) if path.exists() => {
            let mut float = model.build(&dev);
            // A checked load: a corrupted cache file is a typed error, not a panic in dfdx.
            quant_dfdx::checkpoint::load_checkpoint(&mut float, path)
                .map_err(|e| {
                    file_error(
                        path,
                        format!("cannot load this cached float checkpoint ({e}): delete the file, or run with --no-cache"),
                    )
                })?;
            (float, true)
        }
        (FloatWeights::Train, _) => {
            let mut float = model.build(&dev);
            let f = &s.cfg.float;
            let phase = Phase::from(f);
            let b = s.bar(phase.epochs as u64, "float");
            train::train::<F, S, C>(
                &dev,
                &mut float,
                &s.data.train,
                &phase,
                s.seed,
                None,
                Some(&b),
            )?;
            b.finish_and_clear();
            if let Some(path) = cache_file {
                save_checkpoint(&float, path)?;
            }
            (float, false)
        }
    };
    let test = &s.data.test;
    let accuracy = accuracy(
        &predictions(&logits::<F, S, C>(&dev, &float, test, EVAL_BATCH)?, C),
        test.labels(),
    );
    Ok(FloatStage {
        dev,
        model: float,
        from_cache,
        accuracy,
    })
}

/// Stage 2: the calibrated model.
pub(crate) struct PtqStage<D: Convert> {
    /// The float model prepared for quantization (BatchNorm folded).
    pub deploy: D,
    pub model: D::Quantized,
    /// On the test split.
    pub accuracy: f64,
    /// What smoothing did.
    pub smoothed: Smoothing,
    /// What learned rounding and bias correction did, per layer they ran on.
    pub refined: Vec<RefinedLayer>,
    /// The tensors they replaced, with their float values.
    pub replaced: RefinedTensors,
}

/// Stage 2: converts the deployable float model under the policy and calibrates it (PTQ), on
/// the data set's calibration samples (or its training split).
pub(crate) fn ptq<S, const C: usize, F, D>(
    s: &Seed<'_>,
    model: &Model<S, C, F, D>,
    float: &FloatStage<F>,
) -> Result<PtqStage<D>, RunError>
where
    S: BatchShape,
    D: DeployModel<S, C>,
{
    let deploy = model.deploy(&float.model);
    let b = s.bar(1, "calibration");
    let c = &s.cfg.calibration;
    let calibration = s.data.calibration.as_ref().unwrap_or(&s.data.train);
    let calibrated = super::quantize_and_refine::<S, C, D>(
        &float.dev,
        &deploy,
        &s.cfg.quantization,
        calibration,
        (c.batches, c.batch_size, s.seed),
    )?;
    b.finish_and_clear();
    let test = &s.data.test;
    let accuracy = accuracy(
        &predictions(
            &logits::<D::Quantized, S, C>(&float.dev, &calibrated.model, test, EVAL_BATCH)?,
            C,
        ),
        test.labels(),
    );
    Ok(PtqStage {
        deploy,
        model: calibrated.model,
        accuracy,
        smoothed: calibrated.smoothed,
        refined: calibrated.refined,
        replaced: calibrated.replaced,
    })
}

/// Stage 3: the model after QAT (frozen).
pub(crate) struct QatStage<Q> {
    pub model: Q,
    /// On the test split.
    pub predictions: Vec<usize>,
    pub accuracy: f64,
    /// On the training split.
    pub train_accuracy: f64,
}

/// Stage 3: QAT from the PTQ model (or from one calibrated batch), distilling from the float
/// model when the run file says so.
pub(crate) fn qat<S, const C: usize, F, D>(
    s: &Seed<'_>,
    float: &FloatStage<F>,
    ptq: &PtqStage<D>,
) -> Result<QatStage<D::Quantized>, RunError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    let q = &s.cfg.qat;
    let dev = &float.dev;
    let mut model = match q.init {
        QatInit::Ptq => ptq.model.clone(),
        QatInit::FirstBatch => super::quantize::<S, C, D>(
            dev,
            &ptq.deploy,
            &s.cfg.quantization,
            &s.data.train,
            1,
            q.batch_size,
            s.seed,
        )?,
    };
    if q.epochs > 0 {
        model.set_mode("*", QuantizerMode::Training)?;
        let teacher = |pixels: Vec<f32>, n: usize| -> quant_core::Result<Vec<f32>> {
            let x = input::<S>(dev, pixels, n)?;
            Ok(float.model.try_forward(x).map_err(Into::into)?.as_vec())
        };
        let phase = Phase::from(q);
        let b = s.bar(phase.epochs as u64, "QAT");
        train::train::<D::Quantized, S, C>(
            dev,
            &mut model,
            &s.data.train,
            &phase,
            s.seed.wrapping_add(1),
            q.distillation.map(|d| (&teacher as train::Teacher<'_>, d)),
            Some(&b),
        )?;
        b.finish_and_clear();
        model.set_mode("*", QuantizerMode::Frozen)?;
    }
    let (test, training) = (&s.data.test, &s.data.train);
    let predictions = predictions(
        &logits::<D::Quantized, S, C>(dev, &model, test, EVAL_BATCH)?,
        C,
    );
    let test_accuracy = accuracy(&predictions, test.labels());
    let train_accuracy = accuracy(
        &train::predictions(
            &logits::<D::Quantized, S, C>(dev, &model, training, EVAL_BATCH)?,
            C,
        ),
        training.labels(),
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
pub(crate) fn integer<S: BatchShape, Q: QuantizedModule>(
    s: &Seed<'_>,
    model_name: &str,
    qat: &QatStage<Q>,
) -> Result<Result<IntegerStage, String>, RunError> {
    let mut info = BTreeMap::new();
    info.insert("model".into(), model_name.to_string());
    info.insert("policy".into(), s.opts.policy_name.clone());
    info.insert("seed".into(), s.seed.to_string());
    let graph = match export_model(&qat.model, &S::sample_shape(), info) {
        Ok(graph) => graph,
        Err(GraphError::Unsupported { layer, reason }) => {
            return Ok(Err(format!("layer `{layer}`: {reason}")))
        }
        Err(e) => return Err(e.into()),
    };
    let predictions = match IntegerModel::new(&graph) {
        Ok(model) => Ok(model.predict(s.data.test.features())?),
        Err(GraphError::Unsupported { layer, reason }) => Err(format!("layer `{layer}`: {reason}")),
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
    /// What smoothing did.
    pub smoothed: Smoothing,
    /// What learned rounding and bias correction did, per layer they ran on.
    pub refined: Vec<RefinedLayer>,
}

/// Stage 5 (first seed only): the per-layer report, and the export written beside its
/// directory and reloaded, to prove the files reproduce the in-memory integer model.
pub(crate) fn first_seed_outputs<S: BatchShape, Q: QuantizedModule + Clone>(
    s: &Seed<'_>,
    qat: &QatStage<Q>,
    integer: Option<&IntegerStage>,
    export: Option<StagedDir>,
) -> Result<FirstSeedOutputs, RunError> {
    let train = &s.data.train;
    let idx: Vec<usize> = (0..train.len().min(256)).collect();
    let (pixels, _) = train.gather(&idx);
    // Against the same model with every quantizer disabled: after QAT its weights differ from
    // the float model's, and the report measures quantization alone.
    let layers = layer_report(&qat.model, &S::sample_shape(), &pixels)?;
    let (Some(staged), Some(integer)) = (export, integer) else {
        return Ok(FirstSeedOutputs {
            layers,
            ..FirstSeedOutputs::default()
        });
    };
    // Written beside the target; put in place only when every seed has succeeded.
    // model.onnx too, unless ONNX cannot express the model (the report says why).
    let onnx = OnnxFormat::new(s.cfg.quantization.onnx_convention()?);
    let skipped =
        export::save_with_optional(&integer.graph, staged.path(), &[&QuantFormat], &[&onnx])?;
    let no_onnx = skipped.into_iter().map(|(_, why)| why.to_string()).last();
    let reloaded = export::load(staged.path())?;
    let reproduced = match &integer.predictions {
        Ok(predictions) => {
            IntegerModel::new(&reloaded)?.predict(s.data.test.features())? == *predictions
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
        smoothed: Smoothing::default(),
        refined: Vec::new(),
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
pub(crate) fn quantized<S, const C: usize, F, D>(
    s: &Seed<'_>,
    model: &Model<S, C, F, D>,
    float: FloatStage<F>,
    first: bool,
    export: Option<StagedDir>,
) -> Result<SeedOutcome, RunError>
where
    S: BatchShape,
    F: FloatModel<S, C>,
    D: DeployModel<S, C>,
{
    let ptq = ptq(s, model, &float)?;
    let qat = qat::<S, C, F, D>(s, &float, &ptq)?;
    let integer = integer::<S, _>(s, model.name(), &qat)?;
    let first = if first {
        let outputs = first_seed_outputs::<S, _>(s, &qat, integer.as_ref().ok(), export)?;
        Some(FirstSeedOutputs {
            smoothed: ptq.smoothed.clone(),
            refined: ptq.refined.clone(),
            ..outputs
        })
    } else {
        None
    };
    let integer_predictions = match &integer {
        Ok(i) => i.predictions.as_ref().map_err(Clone::clone),
        Err(why) => Err(why.clone()),
    };
    let (integer_accuracy, integer_agreement) = match &integer_predictions {
        Ok(p) => (
            Some(accuracy(p, s.data.test.labels())),
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

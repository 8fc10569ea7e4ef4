//! Runs ONNX files with [tract](https://docs.rs/tract-onnx), a pure-Rust ONNX runtime: `quant
//! eval --onnx`, and the tests that check what quant exports against a runtime that is not
//! quant's. Behind the default `onnx-runtime` feature.
//!
//! ```no_run
//! use quant::onnx_runtime::OnnxModel;
//! let model = OnnxModel::load("runs/mlp_w4a4/export/model.onnx".as_ref())?;
//! let logits = model.forward(&vec![0.5; 64])?; // one sample of the digits MLP
//! assert_eq!(logits.len(), model.output_features());
//! # Ok::<(), quant::onnx_runtime::OnnxRunError>(())
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::{bail, DimLike};

use crate::data::{DataError, Dataset};
use crate::pipeline::train::accuracy;

/// Largest ONNX file [`OnnxModel::load`] reads (larger files are refused before reading).
pub const MAX_ONNX_FILE_BYTES: u64 = 256 << 20;

/// Why an ONNX file could not be loaded or run; each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnnxRunError {
    /// The file could not be read (missing, not a regular file, larger than
    /// [`MAX_ONNX_FILE_BYTES`]).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime refused the model or failed to run it, or the model does not fit the input.
    #[error("{path}: {message}")]
    Model {
        /// The file.
        path: PathBuf,
        /// What tract (or the check) said.
        message: String,
    },
    /// The data file.
    #[error(transparent)]
    Data(#[from] DataError),
}

type Plan = std::sync::Arc<TypedRunnableModel>;

/// An ONNX model with one float input `[N, ...]` and one float output `[N, ...]`, optimised
/// by tract for any batch size.
#[derive(Debug, Clone)]
pub struct OnnxModel {
    path: PathBuf,
    plan: Plan,
    input_shape: Vec<usize>,
    output_features: usize,
}

/// Runs `f`, turning an error or a panic inside tract into [`OnnxRunError::Model`].
fn guarded<T>(path: &Path, f: impl FnOnce() -> TractResult<T>) -> Result<T, OnnxRunError> {
    let model_error = |message: String| OnnxRunError::Model {
        path: path.to_path_buf(),
        message,
    };
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(model_error(format!("{e:#}"))),
        Err(_) => Err(model_error(
            "the ONNX runtime (tract) panicked on this model".into(),
        )),
    }
}

/// Per-sample dims of a fact `[N, d1, d2, ...]`: `d1, d2, ...`, which must be concrete.
fn sample_dims(fact: &TypedFact) -> TractResult<Vec<usize>> {
    let dims: Vec<TDim> = fact.shape.iter().cloned().collect();
    if dims.len() < 2 {
        bail!(
            "expects a batch axis and at least one more; its shape is {:?}",
            fact.shape
        );
    }
    dims[1..]
        .iter()
        .map(|d| {
            d.to_usize()
                .map_err(|_| TractError::msg(format!("dimension {d} is not a fixed size")))
        })
        .collect()
}

impl OnnxModel {
    /// Reads, checks and optimises the ONNX model at `path`.
    ///
    /// # Errors
    /// [`OnnxRunError::Io`] for a file that cannot be read; [`OnnxRunError::Model`] for one
    /// tract cannot load, or without exactly one float input and one float output of fixed
    /// per-sample shapes.
    pub fn load(path: &Path) -> Result<OnnxModel, OnnxRunError> {
        let bytes = quant_ops::fs::read_limited(path, MAX_ONNX_FILE_BYTES).map_err(|source| {
            OnnxRunError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let (plan, input_shape, output_features) = guarded(path, || {
            let model = tract_onnx::onnx()
                .model_for_read(&mut bytes.as_slice())?
                .into_optimized()?;
            if model.inputs.len() != 1 || model.outputs.len() != 1 {
                bail!(
                    "has {} inputs and {} outputs; expected one of each",
                    model.inputs.len(),
                    model.outputs.len()
                );
            }
            let (input, output) = (model.input_fact(0)?.clone(), model.output_fact(0)?.clone());
            if input.datum_type != f32::datum_type() || output.datum_type != f32::datum_type() {
                bail!("its input and output must be float");
            }
            let input_shape = sample_dims(&input).map_err(|e| e.context("input"))?;
            let output_features = sample_dims(&output)
                .map_err(|e| e.context("output"))?
                .iter()
                .product();
            Ok((model.into_runnable()?, input_shape, output_features))
        })?;
        Ok(OnnxModel {
            path: path.to_path_buf(),
            plan,
            input_shape,
            output_features,
        })
    }

    /// Shape of one input sample (without the batch axis).
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// Input values per sample.
    pub fn input_features(&self) -> usize {
        self.input_shape.iter().product()
    }

    /// Output values per sample.
    pub fn output_features(&self) -> usize {
        self.output_features
    }

    /// Runs a batch (`x` holds whole samples of [`input_shape`](Self::input_shape), row-major)
    /// and returns `n × output_features` values.
    ///
    /// # Errors
    /// `x` is not a whole number of samples, or tract fails.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>, OnnxRunError> {
        let per = self.input_features();
        if per == 0 || !x.len().is_multiple_of(per) {
            return Err(OnnxRunError::Model {
                path: self.path.clone(),
                message: format!(
                    "{} input values are not whole samples of {:?}",
                    x.len(),
                    self.input_shape
                ),
            });
        }
        let mut shape = vec![x.len() / per];
        shape.extend(&self.input_shape);
        guarded(&self.path, || {
            let input = Tensor::from_shape(&shape, x)?;
            let out = self.plan.run(tvec!(input.into_tvalue()))?;
            Ok(out[0]
                .to_plain_array_view::<f32>()?
                .iter()
                .copied()
                .collect())
        })
    }

    /// The predicted class of each sample (argmax of the outputs; the first on ties).
    ///
    /// # Errors
    /// See [`OnnxModel::forward`].
    pub fn predict(&self, x: &[f32]) -> Result<Vec<usize>, OnnxRunError> {
        let y = self.forward(x)?;
        Ok(quant_ops::integer::argmax_rows(&y, self.output_features))
    }
}

/// Runs the ONNX model at `path` on the test split of `data` and returns its accuracy, the
/// number of test samples and the predictions.
///
/// # Errors
/// The model cannot be loaded, does not take the data's samples or gives fewer logits than the
/// labels need, or fails.
pub fn eval_onnx(path: &Path, data: &Dataset) -> Result<(f64, usize, Vec<usize>), OnnxRunError> {
    let model = OnnxModel::load(path)?;
    let needed = data.classes_needed();
    if model.input_features() != data.test.sample_len() || model.output_features() < needed {
        return Err(OnnxRunError::Model {
            path: path.to_path_buf(),
            message: format!(
                "takes {:?} per sample and gives {} outputs; the data ({}) has {:?} per sample and labels up to {}",
                model.input_shape(),
                model.output_features(),
                data.origin,
                data.test.shape(),
                needed.saturating_sub(1)
            ),
        });
    }
    let predicted = model.predict(data.test.features())?;
    Ok((
        accuracy(&predicted, data.test.labels()),
        data.test.len(),
        predicted,
    ))
}

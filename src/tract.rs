//! Runs ONNX files with [tract](https://docs.rs/tract-onnx), a pure-Rust ONNX runtime: `quant
//! eval --onnx`, and the tests that check what quant exports against a runtime that is not
//! quant's. Behind the default `tract` feature.
//!
//! ```no_run
//! use quant::tract::OnnxModel;
//! let model = OnnxModel::load("runs/mlp_w4a4/export/model.onnx".as_ref())?;
//! let logits = model.forward(&vec![0.5; 64])?; // one sample of the digits MLP
//! assert_eq!(logits.len(), model.output_features());
//! # Ok::<(), quant::tract::OnnxRunError>(())
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::{bail, DimLike};

use crate::data::{DataError, Dataset};
use crate::pipeline::train::accuracy;
use quant_runtime::integer::Budget;

/// Largest ONNX file [`OnnxModel::load`] reads (larger files are refused before reading).
pub const MAX_ONNX_FILE_BYTES: u64 = 256 << 20;
/// Most nodes an ONNX graph may have.
pub const MAX_ONNX_NODES: usize = 100_000;
/// Most values the initializers and constants of an ONNX graph may hold, together.
pub const MAX_ONNX_CONSTANT_VALUES: u64 = 64 << 20;
/// Largest padding, kernel, stride or dilation a convolution or pooling may declare.
pub const MAX_ONNX_WINDOW: i64 = 256;

/// The operators [`OnnxModel::load`] accepts: what quant's exports write, and the common ops of
/// quantized (QDQ) classifiers. Operators that size their outputs from data (`ConstantOfShape`,
/// `Range`, `Expand`, `Tile`, `Resize`, control flow) are refused: their cost cannot be bounded
/// before they run.
pub const ONNX_OPERATORS: &[&str] = &[
    "Add",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Clip",
    "Concat",
    "Constant",
    "Conv",
    "DequantizeLinear",
    "Div",
    "Erf",
    "Flatten",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Identity",
    "LayerNormalization",
    "MatMul",
    "MaxPool",
    "Mul",
    "Pow",
    "QuantizeLinear",
    "ReduceMean",
    "Relu",
    "Reshape",
    "Sigmoid",
    "Softmax",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Tanh",
    "Transpose",
    "Unsqueeze",
];

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
    /// Working memory and multiply-adds of one sample.
    sample_bytes: usize,
    sample_macs: u64,
    budget: Budget,
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

/// Values a tensor declares (`dims` of an initializer or constant), or why it cannot be held.
fn declared_values(dims: &[i64]) -> Result<u64, String> {
    dims.iter().try_fold(1u64, |n, d| {
        u64::try_from(*d)
            .ok()
            .and_then(|d| n.checked_mul(d))
            .ok_or_else(|| format!("dimensions {dims:?} are negative or overflow"))
    })
}

/// Checks an ONNX model against the budget before tract sees it (tract folds constants and
/// sizes buffers while it loads, so what it would allocate must be bounded first): a graph
/// with nodes, each reading values defined before it, outputs that name values, operators from
/// [`ONNX_OPERATORS`], constants within [`MAX_ONNX_CONSTANT_VALUES`] together, windows within
/// [`MAX_ONNX_WINDOW`], reshapes to constant shapes.
fn check_budget(model: &tract_onnx::pb::ModelProto) -> Result<(), String> {
    let graph = model.graph.as_ref().ok_or("the model has no graph")?;
    if graph.node.is_empty() {
        return Err("the graph has no nodes".into());
    }
    if graph.node.len() > MAX_ONNX_NODES {
        return Err(format!(
            "{} nodes; at most {MAX_ONNX_NODES}",
            graph.node.len()
        ));
    }
    let mut constants = 0u64;
    let mut constant_shapes = std::collections::HashMap::new();
    let mut defined: std::collections::HashSet<&str> =
        graph.input.iter().map(|v| v.name.as_str()).collect();
    for t in &graph.initializer {
        constants = constants.saturating_add(
            declared_values(&t.dims)
                .map_err(|e| format!("initializer `{}`: {e}", short(&t.name)))?,
        );
        defined.insert(&t.name);
        constant_shapes.insert(t.name.as_str(), t);
    }
    for (i, node) in graph.node.iter().enumerate() {
        let at = || {
            format!(
                "node {i} (`{}`, {})",
                short(&node.name),
                short(&node.op_type)
            )
        };
        if !(node.domain.is_empty() || node.domain == "ai.onnx")
            || !ONNX_OPERATORS.contains(&node.op_type.as_str())
        {
            return Err(format!(
                "{}: operator not run here; quant eval --onnx runs {}",
                at(),
                ONNX_OPERATORS.join(", ")
            ));
        }
        for input in node.input.iter().filter(|n| !n.is_empty()) {
            if !defined.contains(input.as_str()) {
                return Err(format!(
                    "{}: reads `{}`, which no input, initializer or earlier node defines",
                    at(),
                    short(input)
                ));
            }
        }
        for a in &node.attribute {
            if let Some(t) = &a.t {
                constants = constants.saturating_add(
                    declared_values(&t.dims).map_err(|e| format!("{}: {e}", at()))?,
                );
                if node.op_type == "Constant" {
                    if let Some(out) = node.output.first() {
                        constant_shapes.insert(out.as_str(), t);
                    }
                }
            }
            let window = matches!(
                a.name.as_str(),
                "pads" | "kernel_shape" | "strides" | "dilations"
            );
            if window && a.ints.iter().any(|v| !(0..=MAX_ONNX_WINDOW).contains(v)) {
                return Err(format!(
                    "{}: {} = {:?}; each at most {MAX_ONNX_WINDOW}",
                    at(),
                    a.name,
                    &a.ints[..a.ints.len().min(8)]
                ));
            }
        }
        if node.op_type == "Reshape" {
            let target = node
                .input
                .get(1)
                .and_then(|n| constant_shapes.get(n.as_str()));
            let Some(shape) = target else {
                return Err(format!("{}: the shape must be a constant", at()));
            };
            if shape.int64_data.iter().any(|d| *d < -1)
                || declared_values(&shape.int64_data.iter().map(|d| d.abs()).collect::<Vec<_>>())
                    .map_or(true, |n| n > MAX_ONNX_CONSTANT_VALUES)
            {
                return Err(format!(
                    "{}: target shape {:?} is too large or invalid",
                    at(),
                    &shape.int64_data[..shape.int64_data.len().min(8)]
                ));
            }
        }
        if constants > MAX_ONNX_CONSTANT_VALUES {
            return Err(format!(
                "its constants hold more than {MAX_ONNX_CONSTANT_VALUES} values"
            ));
        }
        for out in &node.output {
            defined.insert(out);
        }
    }
    if constants > MAX_ONNX_CONSTANT_VALUES {
        return Err(format!(
            "its constants hold more than {MAX_ONNX_CONSTANT_VALUES} values"
        ));
    }
    for out in &graph.output {
        if !defined.contains(out.name.as_str()) {
            return Err(format!(
                "its output `{}` names no value of the graph",
                short(&out.name)
            ));
        }
    }
    Ok(())
}

/// A name for a message: cut, control characters escaped.
fn short(name: &str) -> String {
    quant_runtime::fs::escape_controls(&quant_runtime::fs::shorten(name)).into_owned()
}

/// One sample's working memory (the bytes of every value tract computes, together) and
/// multiply-adds, with the batch axis `batch` set to 1.
fn per_sample_cost(model: &TypedModel, batch: &Symbol) -> TractResult<(usize, u64)> {
    let one = SymbolValues::default().with(batch, 1);
    let (mut bytes, mut macs) = (0usize, 0u64);
    for node in &model.nodes {
        for out in &node.outputs {
            let dims = out.fact.shape.eval_to_usize(&one).map_err(|_| {
                TractError::msg(format!(
                    "node `{}`: its output's size depends on the data",
                    node.name
                ))
            })?;
            let n = dims.iter().try_fold(1usize, |a, d| a.checked_mul(*d));
            let size = n
                .and_then(|n| n.checked_mul(out.fact.datum_type.size_of()))
                .ok_or_else(|| {
                    TractError::msg(format!("node `{}`: its output overflows", node.name))
                })?;
            bytes = bytes.saturating_add(size);
        }
        let inputs: TVec<&TypedFact> = node
            .inputs
            .iter()
            .map(|o| model.outlet_fact(*o))
            .collect::<TractResult<_>>()?;
        for (cost, count) in node.op.cost(&inputs)? {
            if cost.is_compute() {
                let n = count.eval(&one).to_i64().unwrap_or(i64::MAX);
                macs = macs.saturating_add(n.max(0) as u64);
            }
        }
    }
    Ok((bytes, macs))
}

impl OnnxModel {
    /// Reads, checks and optimises the ONNX model at `path`.
    ///
    /// # Errors
    /// [`OnnxRunError::Io`] for a file that cannot be read; [`OnnxRunError::Model`] for one
    /// tract cannot load, or without exactly one float input and one float output of fixed
    /// per-sample shapes.
    pub fn load(path: &Path) -> Result<OnnxModel, OnnxRunError> {
        OnnxModel::load_with_budget(path, Budget::default())
    }

    /// [`OnnxModel::load`] under `budget` instead of the default: a model one sample of which
    /// needs more working memory (every value tract computes for it, together) is refused;
    /// [`OnnxModel::forward`] runs batches in chunks within it and refuses a call of more
    /// multiply-adds.
    ///
    /// # Errors
    /// As [`OnnxModel::load`].
    pub fn load_with_budget(path: &Path, budget: Budget) -> Result<OnnxModel, OnnxRunError> {
        let bytes =
            quant_runtime::fs::read_limited(path, MAX_ONNX_FILE_BYTES).map_err(|source| {
                OnnxRunError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        let model_error = |message: String| OnnxRunError::Model {
            path: path.to_path_buf(),
            message,
        };
        let proto = <tract_onnx::pb::ModelProto as prost::Message>::decode(bytes.as_slice())
            .map_err(|e| model_error(format!("not an ONNX model (protobuf): {e}")))?;
        check_budget(&proto).map_err(model_error)?;
        let (plan, input_shape, output_features, sample_bytes, sample_macs) = guarded(
            path,
            || {
                let model = tract_onnx::onnx()
                    .model_for_proto_model(&proto)?
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
                let TDim::Sym(batch) = input.shape[0].clone() else {
                    bail!("its input's first axis is not a free batch size");
                };
                let (sample_bytes, sample_macs) = per_sample_cost(&model, &batch)?;
                if sample_bytes > budget.working_bytes {
                    bail!(
                        "one sample needs {sample_bytes} bytes of working memory; the budget is {} bytes",
                        budget.working_bytes
                    );
                }
                Ok((
                    model.into_runnable()?,
                    input_shape,
                    output_features,
                    sample_bytes,
                    sample_macs,
                ))
            },
        )?;
        Ok(OnnxModel {
            path: path.to_path_buf(),
            plan,
            input_shape,
            output_features,
            sample_bytes,
            sample_macs,
            budget,
        })
    }

    /// Shape of one input sample (without the batch axis).
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// Multiply-adds one sample takes (tract's count of the optimised model).
    pub fn multiply_adds_per_sample(&self) -> u64 {
        self.sample_macs
    }

    /// Bytes of every value tract computes for one sample, together: a batch runs in chunks
    /// within the budget's working memory.
    pub fn working_bytes_per_sample(&self) -> usize {
        self.sample_bytes
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
    /// `x` is not a whole number of samples; the batch would take more than the budget's
    /// multiply-adds (checked before it runs); tract fails.
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
        let n = x.len() / per;
        let total = (n as u64).saturating_mul(self.sample_macs);
        if total > self.budget.multiply_adds {
            return Err(OnnxRunError::Model {
                path: self.path.clone(),
                message: format!(
                    "{n} samples of {} multiply-adds each ({total} in all); the budget is {} per call: run the samples in parts",
                    self.sample_macs, self.budget.multiply_adds
                ),
            });
        }
        // In chunks whose values fit the budget's working memory together.
        let chunk = (self.budget.working_bytes / self.sample_bytes.max(1)).max(1);
        let mut out = Vec::with_capacity(n * self.output_features);
        for xs in x.chunks(chunk * per) {
            let mut shape = vec![xs.len() / per];
            shape.extend(&self.input_shape);
            out.extend(guarded(&self.path, || {
                let input = Tensor::from_shape(&shape, xs)?;
                let y = self.plan.run(tvec!(input.into_tvalue()))?;
                Ok(y[0]
                    .to_plain_array_view::<f32>()?
                    .iter()
                    .copied()
                    .collect::<Vec<f32>>())
            })?);
        }
        Ok(out)
    }

    /// The predicted class of each sample (argmax of the outputs; the first on ties).
    ///
    /// # Errors
    /// See [`OnnxModel::forward`].
    pub fn predict(&self, x: &[f32]) -> Result<Vec<usize>, OnnxRunError> {
        let y = self.forward(x)?;
        Ok(quant_runtime::integer::argmax_rows(
            &y,
            self.output_features,
        ))
    }
}

/// Runs the ONNX model at `path` on the test split of `data` under `budget` and returns its accuracy, the
/// number of test samples and the predictions.
///
/// # Errors
/// The model cannot be loaded, does not take the data's samples or gives fewer logits than the
/// labels need, or fails.
pub fn eval_onnx(
    path: &Path,
    data: &Dataset,
    budget: Budget,
) -> Result<(f64, usize, Vec<usize>), OnnxRunError> {
    let model = OnnxModel::load_with_budget(path, budget)?;
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

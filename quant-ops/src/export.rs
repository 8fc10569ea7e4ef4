//! Export of a quantized model to an inferable, integer-only form: integer weights, int32
//! biases (`s_bias = s_input · s_weight`, zero point 0) and the inferable quantizers of every
//! input, as a sequence of ops. Saved as a directory holding `model.safetensors` (the integer
//! tensors) and `model.json` (ops, quantizer ids, methods, bits, qparams, versions), written
//! to a temporary name and renamed, so a failed export leaves nothing half-written.
//!
//! Loading checks everything (hostile files get a typed error, never a panic and never an
//! allocation larger than the file justifies): the JSON schema, every inferable quantizer's
//! invariants, tensor names, dtypes and shapes against the ops, and the integer range of every
//! weight code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dfdx::nn::modules::ReLU;
use safetensors::tensor::{Dtype as StDtype, TensorView};
use serde::{Deserialize, Serialize};

use quant_core::{InferableQuantizer, QuantError, QuantizationMethod};

use crate::layers::{
    quantize_bias, FakeQuantizer, Float, QConv2d, QLinear, QuantInput, QuantizerControl,
};
use crate::nn::{Flatten, MaxPool2d};

/// Version of the export format; loaders reject other versions.
pub const FORMAT_VERSION: u32 = 1;
/// The metadata file in an export directory.
pub const METADATA_FILE: &str = "model.json";
/// The tensor file in an export directory.
pub const TENSORS_FILE: &str = "model.safetensors";
/// Largest `model.json` a loader reads (larger files are refused before reading).
pub const MAX_METADATA_BYTES: u64 = 16 << 20;
/// Largest `model.safetensors` a loader reads (larger files are refused before reading): 64 Mi
/// one-byte weight codes, which the loader widens to 256 MiB of `i32`.
pub const MAX_TENSOR_FILE_BYTES: u64 = 64 << 20;
/// Largest integer width the integer runtime supports for weights and activations.
pub const MAX_EXPORT_BITS: u32 = 8;

/// Errors of export and of loading exports; each names the file, op or tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// A quantizer problem while exporting (uncalibrated, unsupported bit width, ...).
    #[error("cannot export: {0}")]
    Quant(#[from] QuantError),
    /// A model part that has no integer form (at export), or that the integer runtime cannot
    /// run (when preparing a model for it).
    #[error("layer `{layer}` cannot run on integers: {reason}")]
    Unsupported {
        /// The layer's dotted name.
        layer: String,
        /// Why, and what would work.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The metadata is not valid export JSON.
    #[error("{path}: invalid export metadata: {message}")]
    Metadata {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The tensor file is not valid, or does not match the metadata.
    #[error("{path}: {message}")]
    Tensors {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the tensor).
        message: String,
    },
}

/// Provenance of an exported quantizer: which trainable quantizer produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantizerOrigin {
    /// Training method id (`Lsq`, ...), by name: custom ids of crates not linked into the
    /// loading program still load.
    pub training_method: String,
    /// Registry name of the trainable quantizer, when registered.
    pub quantizer: Option<String>,
    /// Bit width.
    pub bits: u32,
    /// Grid layout.
    pub method: QuantizationMethod,
}

/// An exported quantizer: the inferable form plus where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportedQuantizer {
    /// The deployable quantizer.
    pub inferable: InferableQuantizer,
    /// Where it came from.
    pub origin: QuantizerOrigin,
}

/// The geometry of a layer with weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "layer", deny_unknown_fields)]
pub enum WeightedKind {
    /// Fully connected: weight `[out_features, in_features]`.
    Linear {
        /// Input features.
        in_features: usize,
        /// Output features.
        out_features: usize,
    },
    /// 2-D convolution with zero padding: weight `[out_channels, in_channels, kernel, kernel]`.
    Conv2d {
        /// Input channels.
        in_channels: usize,
        /// Output channels.
        out_channels: usize,
        /// Kernel size.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Zero padding on each side.
        padding: usize,
    },
}

impl WeightedKind {
    /// Output channels (features).
    pub fn out_channels(&self) -> usize {
        match *self {
            WeightedKind::Linear { out_features, .. } => out_features,
            WeightedKind::Conv2d { out_channels, .. } => out_channels,
        }
    }
    /// Inputs per output value: `in_features`, or `in_channels · kernel²`.
    pub fn fan_in(&self) -> Option<usize> {
        match *self {
            WeightedKind::Linear { in_features, .. } => Some(in_features),
            WeightedKind::Conv2d {
                in_channels,
                kernel,
                ..
            } => in_channels.checked_mul(kernel)?.checked_mul(kernel),
        }
    }
    /// The weight tensor's shape.
    pub fn weight_shape(&self) -> Vec<usize> {
        match *self {
            WeightedKind::Linear {
                in_features,
                out_features,
            } => vec![out_features, in_features],
            WeightedKind::Conv2d {
                in_channels,
                out_channels,
                kernel,
                ..
            } => vec![out_channels, in_channels, kernel, kernel],
        }
    }
}

/// A layer with weights (Linear or Conv2d) in integer form.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportedWeighted {
    /// Dotted layer name.
    pub name: String,
    /// Geometry.
    pub kind: WeightedKind,
    /// Quantizer of the input.
    pub input: ExportedQuantizer,
    /// Quantizer of the weights (per channel on axis 0, or per tensor).
    pub weights: ExportedQuantizer,
    /// Weight codes on the weights grid, row-major in [`WeightedKind::weight_shape`].
    pub weight: Vec<i32>,
    /// Bias in int32 at scale `s_input · s_weight[o]`.
    pub bias: Vec<i32>,
}

/// One op of an exported model, run in order.
// A model holds a handful of ops; boxing the layers would only add an indirection to the API.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ExportedOp {
    /// A Linear or Conv2d layer.
    Weighted(ExportedWeighted),
    /// `max(x, 0)`, fused into the preceding layer's requantization.
    Relu,
    /// Max pooling on the integer codes (monotone, so it commutes with quantization).
    MaxPool2d {
        /// Window size.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Padding (never selected).
        padding: usize,
    },
    /// `(C, H, W)` → `C·H·W` features, row-major.
    Flatten {
        /// Features after flattening.
        features: usize,
    },
}

/// An exported model: the shape of one input sample, its ops, and free-form provenance.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportedModel {
    /// Shape of one sample (`[64]`, or `[channels, height, width]`).
    pub input_shape: Vec<usize>,
    /// The ops, in order.
    pub ops: Vec<ExportedOp>,
    /// What produced it (model name, policy, seed, ...), saved in the metadata.
    pub info: BTreeMap<String, String>,
}

/// A module that can be exported to integer ops.
pub trait Export {
    /// Appends this module's ops, named under `name`.
    ///
    /// # Errors
    /// A quantizer that is not calibrated, wider than [`MAX_EXPORT_BITS`], or a part with no
    /// integer form.
    fn export(&self, name: &str, ops: &mut Vec<ExportedOp>) -> Result<(), ExportError>;
}

/// Exports `model` (named from the root), whose samples have `input_shape`.
///
/// # Errors
/// See [`Export::export`].
pub fn export_model<M: Export>(
    model: &M,
    input_shape: &[usize],
    info: BTreeMap<String, String>,
) -> Result<ExportedModel, ExportError> {
    let mut ops = Vec::new();
    model.export("", &mut ops)?;
    Ok(ExportedModel {
        input_shape: input_shape.to_vec(),
        ops,
        info,
    })
}

fn exported_quantizer<Q: QuantizerControl>(
    q: &Q,
    layer: &str,
    role: &str,
) -> Result<ExportedQuantizer, ExportError> {
    let unsupported = |reason: String| ExportError::Unsupported {
        layer: layer.to_string(),
        reason,
    };
    let d = q.describe().ok_or_else(|| {
        unsupported(format!(
            "its {role} is float; integer inference needs every weighted layer's {role} quantized"
        ))
    })?;
    if d.bits > MAX_EXPORT_BITS {
        return Err(unsupported(format!(
            "its {role} uses {} bits; integer export supports up to {MAX_EXPORT_BITS}",
            d.bits
        )));
    }
    let inferable = q.inferable()?.ok_or_else(|| {
        unsupported(format!(
            "its {role} is not calibrated; calibrate or train it before exporting"
        ))
    })?;
    Ok(ExportedQuantizer {
        inferable,
        origin: QuantizerOrigin {
            training_method: d.training_method.name().to_string(),
            quantizer: d.metadata.map(|m| m.path()),
            bits: d.bits,
            method: d.method,
        },
    })
}

/// The integer form of a layer with weights.
fn export_weighted<WQ: QuantizerControl, AQ: QuantizerControl>(
    name: &str,
    kind: WeightedKind,
    weight: &[f32],
    bias: &[f32],
    weight_quantizer: &WQ,
    input_quantizer: &AQ,
) -> Result<ExportedOp, ExportError> {
    let input = exported_quantizer(input_quantizer, name, "input")?;
    let weights = exported_quantizer(weight_quantizer, name, "weights")?;
    let codes: Vec<i32> = weights.inferable.quantize(weight, &kind.weight_shape())?;
    let bias = quantize_bias(
        bias,
        input.inferable.qparams().scales()[0],
        weights.inferable.qparams().scales(),
    )
    .map_err(|e| e.at(format!("layer `{name}`")))?;
    Ok(ExportedOp::Weighted(ExportedWeighted {
        name: name.to_string(),
        kind,
        input,
        weights,
        weight: codes,
        bias,
    }))
}

impl<const I: usize, const O: usize, WQ: FakeQuantizer, AQ: FakeQuantizer> Export
    for QLinear<I, O, WQ, AQ>
{
    fn export(&self, name: &str, ops: &mut Vec<ExportedOp>) -> Result<(), ExportError> {
        let kind = WeightedKind::Linear {
            in_features: I,
            out_features: O,
        };
        ops.push(export_weighted(
            name,
            kind,
            &self.weight.as_vec(),
            &self.bias.as_vec(),
            &self.weight_quantizer,
            &self.input_quantizer,
        )?);
        Ok(())
    }
}

impl<
        const C: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        WQ: FakeQuantizer,
        AQ: FakeQuantizer,
    > Export for QConv2d<C, O, K, S, P, WQ, AQ>
{
    fn export(&self, name: &str, ops: &mut Vec<ExportedOp>) -> Result<(), ExportError> {
        let kind = WeightedKind::Conv2d {
            in_channels: C,
            out_channels: O,
            kernel: K,
            stride: S,
            padding: P,
        };
        ops.push(export_weighted(
            name,
            kind,
            &self.weight.as_vec(),
            &self.bias.as_vec(),
            &self.weight_quantizer,
            &self.input_quantizer,
        )?);
        Ok(())
    }
}

impl Export for Float<ReLU> {
    fn export(&self, _name: &str, ops: &mut Vec<ExportedOp>) -> Result<(), ExportError> {
        ops.push(ExportedOp::Relu);
        Ok(())
    }
}

/// A weight-free layer exports as its integer op, on the codes of the next weighted layer's
/// input grid; a quantizer of its own would need a requantization step the runtime does not
/// have.
fn input_only<M>(q: &QuantInput<M>, name: &str, op: ExportedOp) -> Result<ExportedOp, ExportError> {
    if q.input_quantizer.describe().is_some() {
        return Err(ExportError::Unsupported {
            layer: name.to_string(),
            reason: "its input has a quantizer of its own; integer export takes pooling and flattening on the \
                     next weighted layer's input grid, so leave this layer's input float in the policy"
                .into(),
        });
    }
    Ok(op)
}

impl<const K: usize, const S: usize, const P: usize> Export for QuantInput<MaxPool2d<K, S, P>> {
    fn export(&self, name: &str, ops: &mut Vec<ExportedOp>) -> Result<(), ExportError> {
        ops.push(input_only(
            self,
            name,
            ExportedOp::MaxPool2d {
                kernel: K,
                stride: S,
                padding: P,
            },
        )?);
        Ok(())
    }
}

impl<const N: usize> Export for QuantInput<Flatten<N>> {
    fn export(&self, name: &str, ops: &mut Vec<ExportedOp>) -> Result<(), ExportError> {
        ops.push(input_only(self, name, ExportedOp::Flatten { features: N })?);
        Ok(())
    }
}

macro_rules! tuple_export {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Export),+> Export for ($($name,)+) {
            fn export(&self, name: &str, ops: &mut Vec<ExportedOp>) -> Result<(), ExportError> {
                $(self.$idx.export(&crate::layers::join_name(name, stringify!($idx)), ops)?;)+
                Ok(())
            }
        }
    };
}
tuple_export!(A 0);
tuple_export!(A 0, B 1);
tuple_export!(A 0, B 1, C 2);
tuple_export!(A 0, B 1, C 2, D 3);
tuple_export!(A 0, B 1, C 2, D 3, E 4);
tuple_export!(A 0, B 1, C 2, D 3, E 4, F 5);

// ----- files ---------------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    format: String,
    format_version: u32,
    quant_version: String,
    input_shape: Vec<usize>,
    info: BTreeMap<String, String>,
    ops: Vec<OpMeta>,
}

#[allow(clippy::large_enum_variant)]
#[derive(Serialize, Deserialize)]
#[serde(tag = "op", deny_unknown_fields)]
enum OpMeta {
    Weighted {
        name: String,
        geometry: WeightedKind,
        input: ExportedQuantizer,
        weights: ExportedQuantizer,
        weight_tensor: String,
        bias_tensor: String,
    },
    Relu,
    MaxPool2d {
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    Flatten {
        features: usize,
    },
}

const FORMAT: &str = "quant-integer-model";
/// Largest element count of any one shape in a loaded export (guards allocations driven by
/// hostile metadata).
pub const MAX_ELEMENTS: usize = 1 << 28;

fn io(path: &Path) -> impl Fn(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The safetensors dtype holding codes of `grid`.
fn storage_dtype(q: &InferableQuantizer) -> StDtype {
    if q.grid().signed() {
        StDtype::I8
    } else {
        StDtype::U8
    }
}

impl ExportedModel {
    /// Writes `model.json` and `model.safetensors` as the directory `dir`. Both files are written
    /// into a temporary sibling directory which then replaces `dir`, so a failure leaves any
    /// previous export untouched and no partial one.
    ///
    /// # Errors
    /// `dir` is not absent, empty or a previous export ([`crate::fs::check_export_dir`]: a
    /// user's directory or file is never replaced), or it cannot be created or written.
    pub fn save(&self, dir: &Path) -> Result<(), ExportError> {
        let mut buffers: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut ops = Vec::new();
        for op in &self.ops {
            ops.push(match op {
                ExportedOp::Relu => OpMeta::Relu,
                ExportedOp::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                } => OpMeta::MaxPool2d {
                    kernel: *kernel,
                    stride: *stride,
                    padding: *padding,
                },
                ExportedOp::Flatten { features } => OpMeta::Flatten {
                    features: *features,
                },
                ExportedOp::Weighted(l) => {
                    let wname = format!("{}.weight", l.name);
                    let bname = format!("{}.bias", l.name);
                    let dtype = storage_dtype(&l.weights.inferable);
                    let bytes: Vec<u8> = match dtype {
                        StDtype::I8 => l.weight.iter().map(|v| *v as i8 as u8).collect(),
                        _ => l.weight.iter().map(|v| *v as u8).collect(),
                    };
                    buffers.push((wname.clone(), dtype, l.kind.weight_shape(), bytes));
                    let bias_bytes: Vec<u8> = l.bias.iter().flat_map(|b| b.to_le_bytes()).collect();
                    buffers.push((
                        bname.clone(),
                        StDtype::I32,
                        vec![l.kind.out_channels()],
                        bias_bytes,
                    ));
                    OpMeta::Weighted {
                        name: l.name.clone(),
                        geometry: l.kind,
                        input: l.input.clone(),
                        weights: l.weights.clone(),
                        weight_tensor: wname,
                        bias_tensor: bname,
                    }
                }
            });
        }
        let meta = Metadata {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            quant_version: env!("CARGO_PKG_VERSION").into(),
            input_shape: self.input_shape.clone(),
            info: self.info.clone(),
            ops,
        };
        let views: Vec<(String, TensorView<'_>)> = buffers
            .iter()
            .map(|(n, d, shape, b)| {
                TensorView::new(*d, shape.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| ExportError::Tensors {
                        path: dir.join(TENSORS_FILE),
                        message: format!("tensor `{n}`: {e:?}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        let tensor_bytes =
            safetensors::serialize(views, &None).map_err(|e| ExportError::Tensors {
                path: dir.join(TENSORS_FILE),
                message: format!("{e:?}"),
            })?;
        let json = serde_json::to_vec_pretty(&meta).map_err(|e| ExportError::Metadata {
            path: dir.join(METADATA_FILE),
            message: e.to_string(),
        })?;
        crate::fs::replace_dir(
            dir,
            &[(TENSORS_FILE, &tensor_bytes), (METADATA_FILE, &json)],
        )
        .map_err(|e| ExportError::Io {
            path: e.path().to_path_buf(),
            source: e.into_io_error(),
        })
    }

    /// Loads an export directory, validating everything (see the module docs).
    ///
    /// # Errors
    /// Missing or unreadable files, invalid JSON or safetensors, a version this program does
    /// not read, tensors missing or not matching the ops, codes outside their grid, geometry or
    /// parameters the integer runtime cannot run (see [`ExportedModel::check`]).
    pub fn load(dir: &Path) -> Result<ExportedModel, ExportError> {
        let meta_path = dir.join(METADATA_FILE);
        let tensors_path = dir.join(TENSORS_FILE);
        let meta_bytes =
            crate::fs::read_limited(&meta_path, MAX_METADATA_BYTES).map_err(io(&meta_path))?;
        let meta: Metadata =
            serde_json::from_slice(&meta_bytes).map_err(|e| ExportError::Metadata {
                path: meta_path.clone(),
                message: e.to_string(),
            })?;
        let bad_meta = |message: String| ExportError::Metadata {
            path: meta_path.clone(),
            message,
        };
        if meta.format != FORMAT {
            return Err(bad_meta(format!(
                "format is `{}`; expected `{FORMAT}`",
                meta.format
            )));
        }
        if meta.format_version != FORMAT_VERSION {
            return Err(bad_meta(format!(
                "format_version {} is not supported; this program reads version {FORMAT_VERSION}",
                meta.format_version
            )));
        }
        check_input_shape(&meta.input_shape).map_err(bad_meta)?;
        let tensor_bytes = crate::fs::read_limited(&tensors_path, MAX_TENSOR_FILE_BYTES)
            .map_err(io(&tensors_path))?;
        let bad_tensor = |message: String| ExportError::Tensors {
            path: tensors_path.clone(),
            message,
        };
        // The header is checked in full before `safetensors` parses it (see crate::checkpoint).
        let (_, tensors) =
            crate::checkpoint::read_safetensors(&tensor_bytes).map_err(bad_tensor)?;
        let mut ops = Vec::with_capacity(meta.ops.len().min(1 << 16));
        let mut used = std::collections::BTreeSet::new();
        for op in meta.ops {
            match op {
                OpMeta::Relu => ops.push(ExportedOp::Relu),
                OpMeta::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                } => {
                    let op = ExportedOp::MaxPool2d {
                        kernel,
                        stride,
                        padding,
                    };
                    check_op(&op).map_err(|(_, m)| bad_meta(m))?;
                    ops.push(op)
                }
                OpMeta::Flatten { features } => {
                    let op = ExportedOp::Flatten { features };
                    check_op(&op).map_err(|(_, m)| bad_meta(m))?;
                    ops.push(op)
                }
                OpMeta::Weighted {
                    name,
                    geometry,
                    input,
                    weights,
                    weight_tensor,
                    bias_tensor,
                } => {
                    let at = |m: String| format!("op `{name}`: {m}");
                    // Geometry and quantizers first: they size what is read from the tensors.
                    let numel = geometry.check().map_err(|m| bad_meta(at(m)))?;
                    let out = geometry.out_channels();
                    check_export_quantizer(&input, "input", None).map_err(|m| bad_meta(at(m)))?;
                    check_export_quantizer(&weights, "weights", Some(out))
                        .map_err(|m| bad_meta(at(m)))?;
                    for t in [&weight_tensor, &bias_tensor] {
                        if !used.insert(t.clone()) {
                            return Err(bad_meta(at(format!(
                                "tensor `{t}` is already used by another op or role"
                            ))));
                        }
                    }
                    let shape = geometry.weight_shape();
                    let w = tensors.tensor(&weight_tensor).map_err(|_| {
                        bad_tensor(format!(
                            "tensor `{weight_tensor}` (weights of op `{name}`) is missing"
                        ))
                    })?;
                    let expected_dtype = storage_dtype(&weights.inferable);
                    if w.dtype() != expected_dtype
                        || w.shape() != shape.as_slice()
                        || w.data().len() != numel
                    {
                        return Err(bad_tensor(format!(
                            "tensor `{weight_tensor}` is {:?} {:?}; op `{name}` needs {expected_dtype:?} {shape:?}",
                            w.dtype(),
                            w.shape()
                        )));
                    }
                    let weight: Vec<i32> = match expected_dtype {
                        StDtype::I8 => w.data().iter().map(|b| *b as i8 as i32).collect(),
                        _ => w.data().iter().map(|b| *b as i32).collect(),
                    };
                    let b = tensors.tensor(&bias_tensor).map_err(|_| {
                        bad_tensor(format!(
                            "tensor `{bias_tensor}` (bias of op `{name}`) is missing"
                        ))
                    })?;
                    if b.dtype() != StDtype::I32
                        || b.shape() != [out]
                        || Some(b.data().len()) != out.checked_mul(4)
                    {
                        return Err(bad_tensor(format!(
                            "tensor `{bias_tensor}` is {:?} {:?}; op `{name}` needs I32 [{out}]",
                            b.dtype(),
                            b.shape()
                        )));
                    }
                    let bias: Vec<i32> = b
                        .data()
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    let layer = ExportedWeighted {
                        name,
                        kind: geometry,
                        input,
                        weights,
                        weight,
                        bias,
                    };
                    // Codes on the grid, accumulators that fit in i32.
                    layer.check().map_err(|m| {
                        bad_tensor(format!(
                            "tensors `{weight_tensor}`, `{bias_tensor}` of op `{}`: {m}",
                            layer.name
                        ))
                    })?;
                    ops.push(ExportedOp::Weighted(layer));
                }
            }
        }
        Ok(ExportedModel {
            input_shape: meta.input_shape,
            ops,
            info: meta.info,
        })
    }

    /// Checks what [`ExportedModel::load`] checks on a model built in code (its fields are
    /// public): the sample shape, every op's geometry ([`check_op`]) and every layer's
    /// quantizers, tensors and accumulator range ([`ExportedWeighted::check`]).
    /// [`IntegerModel::new`](crate::integer::IntegerModel::new) calls it.
    ///
    /// # Errors
    /// [`ExportError::Unsupported`] naming the layer (or `(input)`, `(max pool)`, `(flatten)`).
    pub fn check(&self) -> Result<(), ExportError> {
        let unsupported = |layer: &str, reason: String| ExportError::Unsupported {
            layer: layer.to_string(),
            reason,
        };
        check_input_shape(&self.input_shape).map_err(|m| unsupported("(input)", m))?;
        for op in &self.ops {
            check_op(op).map_err(|(layer, m)| unsupported(&layer, m))?;
        }
        Ok(())
    }
}

fn check_input_shape(shape: &[usize]) -> Result<(), String> {
    let elements = shape.iter().try_fold(1usize, |a, d| a.checked_mul(*d));
    if shape.is_empty() || !matches!(elements, Some(n) if n > 0 && n <= MAX_ELEMENTS) {
        return Err(format!(
            "input_shape {shape:?} is not a valid sample shape (non-empty, no zero, at most {MAX_ELEMENTS} elements)"
        ));
    }
    Ok(())
}

/// Checks one op on its own: a layer with [`ExportedWeighted::check`]; max pooling with a
/// kernel and stride of at least 1 and at most [`MAX_ELEMENTS`], padding at most half the
/// kernel; flattening to `1..=MAX_ELEMENTS` features. Returns the layer's name with the reason.
///
/// # Errors
/// `(name, reason)`; the name is `(max pool)` or `(flatten)` for the weight-free ops.
pub fn check_op(op: &ExportedOp) -> Result<(), (String, String)> {
    match op {
        ExportedOp::Relu => Ok(()),
        ExportedOp::Weighted(l) => l.check().map_err(|m| (l.name.clone(), m)),
        &ExportedOp::MaxPool2d {
            kernel,
            stride,
            padding,
        } => {
            if kernel == 0
                || stride == 0
                || kernel > MAX_ELEMENTS
                || stride > MAX_ELEMENTS
                || padding > kernel / 2
            {
                return Err((
                    "(max pool)".into(),
                    format!(
                        "MaxPool2d kernel {kernel}, stride {stride}, padding {padding}: kernel and stride must be in 1..={MAX_ELEMENTS} and padding at most kernel / 2"
                    ),
                ));
            }
            Ok(())
        }
        &ExportedOp::Flatten { features } => {
            if features == 0 || features > MAX_ELEMENTS {
                return Err((
                    "(flatten)".into(),
                    format!("Flatten to {features} features is not valid (1..={MAX_ELEMENTS})"),
                ));
            }
            Ok(())
        }
    }
}

impl WeightedKind {
    /// Checks the geometry and returns the weight's element count: every dimension at least 1,
    /// at most [`MAX_ELEMENTS`] weights, and for Conv2d a stride of at least 1 and padding
    /// smaller than the kernel.
    ///
    /// # Errors
    /// What is wrong, as text.
    pub fn check(&self) -> Result<usize, String> {
        let shape = self.weight_shape();
        let numel = shape
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(*d))
            .filter(|n| *n > 0 && *n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                format!(
                    "weight shape {shape:?} is not valid (no zero, at most {MAX_ELEMENTS} elements)"
                )
            })?;
        if let WeightedKind::Conv2d {
            stride,
            padding,
            kernel,
            ..
        } = *self
        {
            if stride == 0 || stride > MAX_ELEMENTS || padding >= kernel {
                return Err(format!(
                    "stride {stride}, padding {padding}: the stride must be in 1..={MAX_ELEMENTS} and the padding smaller than the kernel ({kernel})"
                ));
            }
        }
        Ok(numel)
    }
}

impl ExportedWeighted {
    /// Checks the invariants the integer runtime relies on: the geometry
    /// ([`WeightedKind::check`]); a per-tensor input quantizer and a weights quantizer per
    /// tensor or per output channel (axis 0), both at most [`MAX_EXPORT_BITS`] wide; as many
    /// weight codes as the geometry has weights, all on the weights grid, and one bias per
    /// output channel; and, for every output channel, `Σ|w - z_w| · max|x - z_x| + |bias|` within
    /// `i32`, so that no accumulator can overflow whatever the input.
    ///
    /// # Errors
    /// What is wrong, as text (the caller adds the layer's name).
    pub fn check(&self) -> Result<(), String> {
        let numel = self.kind.check()?;
        let out = self.kind.out_channels();
        check_export_quantizer(&self.input, "input", None)?;
        check_export_quantizer(&self.weights, "weights", Some(out))?;
        if self.weight.len() != numel {
            return Err(format!(
                "{} weight codes; the geometry has {numel} weights",
                self.weight.len()
            ));
        }
        if self.bias.len() != out {
            return Err(format!(
                "{} bias values; the layer has {out} output channels",
                self.bias.len()
            ));
        }
        let g = self.weights.inferable.grid();
        if let Some(v) = self
            .weight
            .iter()
            .find(|v| **v < g.quant_min() || **v > g.quant_max())
        {
            return Err(format!(
                "weight code {v} lies outside the weights grid [{}, {}]",
                g.quant_min(),
                g.quant_max()
            ));
        }
        let gi = self.input.inferable.grid();
        let zi = i64::from(self.input.inferable.qparams().zero_points()[0]);
        let x_max = (zi - i64::from(gi.quant_min())).max(i64::from(gi.quant_max()) - zi);
        let zw = self.weights.inferable.qparams().zero_points();
        let fan_in = numel / out;
        for (o, (row, b)) in self.weight.chunks(fan_in).zip(&self.bias).enumerate() {
            let z = i64::from(zw[if zw.len() == 1 { 0 } else { o }]);
            let w_abs: i64 = row.iter().map(|q| (i64::from(*q) - z).abs()).sum();
            let bound = w_abs * x_max + i64::from(*b).abs();
            if bound > i64::from(i32::MAX) {
                return Err(format!(
                    "output channel {o}: an i32 accumulator could overflow (|weights| sum to {w_abs}, inputs reach ±{x_max}, bias {b})"
                ));
            }
        }
        Ok(())
    }
}

fn check_export_quantizer(
    q: &ExportedQuantizer,
    role: &str,
    channels: Option<usize>,
) -> Result<(), String> {
    let bits = q.inferable.grid().bits();
    if bits > MAX_EXPORT_BITS {
        return Err(format!(
            "{role} uses {bits} bits; at most {MAX_EXPORT_BITS} are supported"
        ));
    }
    let qp = q.inferable.qparams();
    let n = qp.channels();
    match (channels, qp.axis()) {
        (None, None) => Ok(()),
        (None, Some(axis)) => Err(format!(
            "{role} must be per tensor; it is per channel on axis {axis} with {n} channels"
        )),
        (Some(_), None) => Ok(()),
        (Some(c), Some(0)) if n == 1 || n == c => Ok(()),
        (Some(c), Some(0)) => Err(format!(
            "{role} has {n} channels; expected 1 or {c} (one per output channel)"
        )),
        (Some(_), Some(axis)) => Err(format!(
            "{role} is per channel on axis {axis}; only the output channels (axis 0) are supported"
        )),
    }
}

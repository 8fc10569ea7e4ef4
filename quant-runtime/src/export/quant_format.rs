//! quant's own export format: `model.json` (the graph: nodes, ops, quantizers, tensor names)
//! and `model.safetensors` (the parameters).
//!
//! Parameters are stored as what they are: integer codes in the narrowest integer dtype of
//! their grid (`I8`/`U8` up to 8 bits, `I16`/`U16` up to 16), accumulator biases in `I32`,
//! float parameters in `F32`. Version 2 holds a graph; version 1 (a chain of ops, quant 0.1)
//! is refused with a message saying to re-export.

use std::collections::BTreeSet;
use std::path::Path;

use safetensors::tensor::{Dtype as StDtype, TensorView};
use serde::{Deserialize, Serialize};

use quant_core::IntegerGrid;

use super::{ExportFormat, GraphError};
use crate::graph::{checked_numel, Graph, ParamValues, Parameter};

/// Version of the format; loaders reject other versions.
pub const FORMAT_VERSION: u32 = 2;
/// The metadata file in an export directory.
pub const METADATA_FILE: &str = "model.json";
/// The tensor file in an export directory.
pub const TENSORS_FILE: &str = "model.safetensors";
/// The `format` field of the metadata.
const FORMAT: &str = "quant-integer-model";
/// Largest `model.json` a loader reads (larger files are refused before reading; the graph of
/// a model with thousands of nodes fits easily).
pub const MAX_METADATA_BYTES: u64 = 16 << 20;
/// Largest `model.safetensors` a loader reads (larger files are refused before reading): 64 Mi
/// one-byte weight codes, which the loader widens to 256 MiB of `i32`.
pub const MAX_TENSOR_FILE_BYTES: u64 = 64 << 20;

/// quant's export format; see the module docs. Writes [`METADATA_FILE`] and [`TENSORS_FILE`].
#[derive(Debug, Clone, Copy, Default)]
pub struct QuantFormat;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    format: String,
    format_version: u32,
    quant_version: String,
    graph: Graph,
}

/// The fields that say which format and version a file is, read before the rest.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    format_version: Option<u32>,
}

/// The safetensors dtype of a parameter's values.
fn dtype(values: &ParamValues) -> StDtype {
    match values {
        ParamValues::Float(_) => StDtype::F32,
        ParamValues::Accumulator(_) => StDtype::I32,
        ParamValues::Codes { quantizer, .. } => codes_dtype(quantizer.inferable.grid()),
    }
}

fn codes_dtype(g: IntegerGrid) -> StDtype {
    match (g.bits() <= 8, g.bits() <= 16, g.signed()) {
        (true, _, true) => StDtype::I8,
        (true, _, false) => StDtype::U8,
        (false, true, true) => StDtype::I16,
        (false, true, false) => StDtype::U16,
        _ => StDtype::I32,
    }
}

fn encode_values(values: &ParamValues) -> Vec<u8> {
    match values {
        ParamValues::Float(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ParamValues::Accumulator(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ParamValues::Codes { codes, quantizer } => match codes_dtype(quantizer.inferable.grid()) {
            StDtype::I8 => codes.iter().map(|c| *c as i8 as u8).collect(),
            StDtype::U8 => codes.iter().map(|c| *c as u8).collect(),
            StDtype::I16 => codes
                .iter()
                .flat_map(|c| (*c as i16).to_le_bytes())
                .collect(),
            StDtype::U16 => codes
                .iter()
                .flat_map(|c| (*c as u16).to_le_bytes())
                .collect(),
            _ => codes.iter().flat_map(|c| c.to_le_bytes()).collect(),
        },
    }
}

/// Decodes `bytes` of `dtype` into `values`' encoding (the caller checked dtype and length).
fn decode_values(values: &mut ParamValues, dtype: StDtype, bytes: &[u8]) {
    let i32s = |b: &[u8]| -> Vec<i32> {
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    match values {
        ParamValues::Float(v) => {
            *v = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }
        ParamValues::Accumulator(v) => *v = i32s(bytes),
        ParamValues::Codes { codes, .. } => {
            *codes = match dtype {
                StDtype::I8 => bytes.iter().map(|b| *b as i8 as i32).collect(),
                StDtype::U8 => bytes.iter().map(|b| *b as i32).collect(),
                StDtype::I16 => bytes
                    .chunks_exact(2)
                    .map(|c| i16::from_le_bytes([c[0], c[1]]) as i32)
                    .collect(),
                StDtype::U16 => bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]) as i32)
                    .collect(),
                _ => i32s(bytes),
            }
        }
    }
}

fn dtype_size(d: StDtype) -> usize {
    match d {
        StDtype::I8 | StDtype::U8 => 1,
        StDtype::I16 | StDtype::U16 => 2,
        _ => 4,
    }
}

impl ExportFormat for QuantFormat {
    fn name(&self) -> &'static str {
        "quant"
    }

    fn encode(&self, graph: &Graph) -> Result<Vec<(&'static str, Vec<u8>)>, GraphError> {
        let tensors_path = Path::new(TENSORS_FILE);
        let mut buffers: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut names = BTreeSet::new();
        let shapes = graph.check()?;
        for (node, output) in graph.nodes.iter().zip(&shapes.nodes) {
            for (p, shape) in node.op.parameters(output) {
                if !names.insert(p.tensor.clone()) {
                    return Err(GraphError::Invalid {
                        node: node.name.clone(),
                        reason: format!("tensor name `{}` is used twice", p.tensor),
                    });
                }
                buffers.push((
                    p.tensor.clone(),
                    dtype(&p.values),
                    shape,
                    encode_values(&p.values),
                ));
            }
        }
        let views: Vec<(String, TensorView<'_>)> = buffers
            .iter()
            .map(|(n, d, shape, b)| {
                TensorView::new(*d, shape.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| GraphError::Tensors {
                        path: tensors_path.to_path_buf(),
                        message: format!("tensor `{n}`: {e:?}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        let tensor_bytes =
            safetensors::serialize(views, &None).map_err(|e| GraphError::Tensors {
                path: tensors_path.to_path_buf(),
                message: format!("{e:?}"),
            })?;
        let meta = Metadata {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            quant_version: env!("CARGO_PKG_VERSION").into(),
            graph: graph.clone(),
        };
        let json = serde_json::to_vec_pretty(&meta).map_err(|e| GraphError::Metadata {
            path: METADATA_FILE.into(),
            message: e.to_string(),
        })?;
        Ok(vec![(TENSORS_FILE, tensor_bytes), (METADATA_FILE, json)])
    }
}

impl QuantFormat {
    /// Loads an export directory, validating everything (see the module docs of
    /// [`crate::export`]).
    ///
    /// # Errors
    /// See [`crate::export::load`].
    pub fn load(dir: &Path) -> Result<Graph, GraphError> {
        let meta_path = dir.join(METADATA_FILE);
        let tensors_path = dir.join(TENSORS_FILE);
        let bad_meta = |message: String| GraphError::Metadata {
            path: meta_path.clone(),
            message,
        };
        let meta_bytes = read_file(&meta_path, MAX_METADATA_BYTES)?;
        let header: Header =
            serde_json::from_slice(&meta_bytes).map_err(|e| bad_meta(e.to_string()))?;
        match (header.format.as_deref(), header.format_version) {
            (Some(FORMAT), Some(FORMAT_VERSION)) => {}
            (Some(FORMAT), Some(1)) => {
                return Err(bad_meta(format!(
                    "format_version 1 (a chain of ops, written by quant 0.1) is no longer read; this program reads version {FORMAT_VERSION} (a graph): export the model again"
                )))
            }
            (Some(FORMAT), Some(v)) => {
                return Err(bad_meta(format!(
                    "format_version {v} is not supported; this program reads version {FORMAT_VERSION}"
                )))
            }
            (Some(FORMAT), None) => return Err(bad_meta("missing field `format_version`".into())),
            (Some(other), _) => {
                return Err(bad_meta(format!(
                    "format is `{}`; expected `{FORMAT}`",
                    crate::graph::short(other)
                )))
            }
            (None, _) => return Err(bad_meta("missing field `format`".into())),
        }
        let meta: Metadata =
            serde_json::from_slice(&meta_bytes).map_err(|e| bad_meta(e.to_string()))?;
        let mut graph = meta.graph;
        // The graph's structure and geometry first: they size what is read from the tensors.
        let in_meta = |e: GraphError| match e {
            GraphError::Invalid { node, reason } => {
                bad_meta(format!("node `{}`: {reason}", crate::graph::short(&node)))
            }
            other => other,
        };
        let shapes = graph.check_structure().map_err(in_meta)?;
        let tensor_bytes = read_file(&tensors_path, MAX_TENSOR_FILE_BYTES)?;
        let bad_tensor = |message: String| GraphError::Tensors {
            path: tensors_path.clone(),
            message,
        };
        // The header is checked in full before `safetensors` parses it (see crate::safetensors).
        let (_, tensors) =
            crate::safetensors::read_safetensors(&tensor_bytes).map_err(&bad_tensor)?;
        let mut used = BTreeSet::new();
        for (node, output) in graph.nodes.iter_mut().zip(&shapes.nodes) {
            let node_name = crate::graph::short(&node.name);
            for (p, expected) in node.op.parameters_mut(output) {
                read_parameter(p, expected, &node_name, &tensors, &mut used)
                    .map_err(&bad_tensor)?;
            }
        }
        graph.check().map_err(in_meta)?;
        Ok(graph)
    }
}

/// Fills `p` from its tensor, checking dtype, shape (`expected`, or any 1-D shape) and length.
fn read_parameter(
    p: &mut Parameter,
    expected: Option<Vec<usize>>,
    node: &str,
    tensors: &safetensors::SafeTensors<'_>,
    used: &mut BTreeSet<String>,
) -> Result<(), String> {
    let name = crate::graph::short(&p.tensor);
    if !used.insert(p.tensor.clone()) {
        return Err(format!(
            "tensor `{name}` is used twice (again by node `{node}`)"
        ));
    }
    let t = tensors
        .tensor(&p.tensor)
        .map_err(|_| format!("tensor `{name}` (of node `{node}`) is missing"))?;
    let want = dtype(&p.values);
    let shape_ok = match &expected {
        Some(shape) => t.shape() == shape.as_slice(),
        None => t.shape().len() == 1,
    };
    let numel = checked_numel(t.shape());
    if t.dtype() != want || !shape_ok || numel.is_none() {
        return Err(format!(
            "tensor `{name}` is {:?} {:?}; node `{node}` needs {want:?} {}",
            t.dtype(),
            t.shape(),
            expected.map_or("[channels]".to_string(), |s| format!("{s:?}"))
        ));
    }
    let numel = numel.unwrap_or(0);
    if Some(t.data().len()) != numel.checked_mul(dtype_size(want)) {
        return Err(format!(
            "tensor `{name}` holds {} bytes; {numel} values of {want:?} need {}",
            t.data().len(),
            numel * dtype_size(want)
        ));
    }
    decode_values(&mut p.values, want, t.data());
    Ok(())
}

/// The bytes of the file at `path`, at most `limit` of them (see [`crate::fs::read_limited`]).
fn read_file(path: &std::path::Path, limit: u64) -> Result<Vec<u8>, GraphError> {
    crate::fs::read_limited(path, limit).map_err(|source| GraphError::Io {
        path: path.to_path_buf(),
        source,
    })
}

//! Export formats: they write a [graph](crate::graph) (lowered from a model by quant-dfdx'
//! `export_model`) into a directory ([`save`]) and read it back ([`load`]).
//!
//! Formats sit behind one trait, [`ExportFormat`]: [`QuantFormat`] (`model.json` with the graph
//! and `model.safetensors` with integer weight codes, int32 biases and float parameters) is the
//! one quant reads back ([`load`]) and runs on integers; [`OnnxFormat`](onnx::OnnxFormat) (`model.onnx`, standard
//! QDQ ONNX for onnxruntime, TensorRT and OpenVINO, see [`onnx`]) is written from the same
//! graph. A directory is written whole or not at all: every file goes into a
//! temporary sibling directory that then replaces the export directory.
//!
//! Loading checks everything (hostile files get a typed error, never a panic and never an
//! allocation larger than the file justifies): sizes before reading, the JSON schema, every
//! inferable quantizer's invariants, tensor names, dtypes and shapes against the ops, codes on
//! their grids, and the whole graph ([`Graph::check`]).

pub mod onnx;
mod quant_format;

pub use quant_format::{
    QuantFormat, FORMAT_VERSION, MAX_METADATA_BYTES, MAX_TENSOR_FILE_BYTES, METADATA_FILE,
    TENSORS_FILE,
};

use std::path::Path;

use crate::graph::Graph;
use crate::GraphError;

/// A file format an exported graph can be written in.
pub trait ExportFormat {
    /// The format's name, for messages (`quant`, `ONNX`).
    fn name(&self) -> &'static str;
    /// The files it writes into an export directory, with their contents.
    ///
    /// # Errors
    /// A graph the format cannot express (naming the node or setting).
    fn encode(&self, graph: &Graph) -> Result<Vec<(&'static str, Vec<u8>)>, GraphError>;
}

/// Writes `graph` in each of `formats` as the directory `dir`, whole or not at all (see the
/// module docs). `dir` must be absent, empty or a previous export
/// ([`crate::fs::check_export_dir`]): a user's directory or file is never replaced.
///
/// # Errors
/// A format that cannot express the graph (nothing is written then), a `dir` that is not an
/// export, or a directory that cannot be written.
pub fn save(graph: &Graph, dir: &Path, formats: &[&dyn ExportFormat]) -> Result<(), GraphError> {
    save_with_optional(graph, dir, formats, &[]).map(|_| ())
}

/// Writes `graph` as the directory `dir` (like [`save`]) in every `required` format and in
/// every `optional` format that can express it, and returns the optional formats left out,
/// each with the [`GraphError::Unsupported`] that says why (`quant run` writes `model.onnx`
/// this way: a model ONNX cannot express still gets quant's own files, and the report says
/// why there is no `model.onnx`).
///
/// # Errors
/// A required format that cannot express the graph, any other error of an optional format, a
/// `dir` that is not an export, or a directory that cannot be written; nothing is written
/// then.
pub fn save_with_optional(
    graph: &Graph,
    dir: &Path,
    required: &[&dyn ExportFormat],
    optional: &[&dyn ExportFormat],
) -> Result<Vec<(&'static str, GraphError)>, GraphError> {
    let mut files: Vec<(&'static str, Vec<u8>)> = Vec::new();
    for format in required {
        files.extend(format.encode(graph)?);
    }
    let mut skipped = Vec::new();
    for format in optional {
        match format.encode(graph) {
            Ok(more) => files.extend(more),
            Err(e @ GraphError::Unsupported { .. }) => skipped.push((format.name(), e)),
            Err(e) => return Err(e),
        }
    }
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    crate::fs::replace_dir(dir, &refs).map_err(|e| GraphError::Io {
        path: e.path().to_path_buf(),
        source: e.into_io_error(),
    })?;
    Ok(skipped)
}

/// Loads the graph of an export directory written in [`QuantFormat`], checking everything.
///
/// # Errors
/// Missing, oversized or unreadable files, invalid JSON or safetensors, a format version this
/// program does not read, tensors missing or not matching the ops, codes off their grid, an
/// invalid graph.
pub fn load(dir: &Path) -> Result<Graph, GraphError> {
    QuantFormat::load(dir)
}

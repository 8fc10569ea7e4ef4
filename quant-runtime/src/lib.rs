//! # quant-runtime
//!
//! What runs an exported `quant` model, without dfdx: the [graph IR](graph) with its float
//! reference interpreter, the [integer runtime](integer), the export formats ([`export`]: quant's
//! own files and ONNX) and the file handling they share ([`fs`], [`safetensors`]). A program that
//! only loads exports and classifies depends on this crate and `quant-core`, nothing of the
//! training stack.
//!
//! ```no_run
//! use quant_runtime::{export, integer::IntegerModel};
//!
//! let graph = export::load(std::path::Path::new("runs/mlp_w4a4/export"))?;
//! let model = IntegerModel::new(&graph)?;
//! let classes = model.predict(&vec![0.0; 64])?;
//! println!("class {}", classes[0]);
//! # Ok::<(), quant_runtime::GraphError>(())
//! ```

#![deny(unsafe_code)]

use std::path::PathBuf;

use quant_core::QuantError;

pub mod export;
pub mod fs;
pub mod graph;
pub mod integer;
pub mod safetensors;

/// Errors of the graph IR and everything that reads or writes it: lowering a model, checking
/// a graph, preparing and running it on integers, writing and loading exports. Each names the
/// file, node, layer or tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// A quantizer problem while exporting (unsupported bit width, values off the grid, ...).
    #[error("cannot export: {0}")]
    Quant(#[from] QuantError),
    /// A model part that has no graph form (at export), or that a backend cannot run or write
    /// (the integer runtime, a format).
    #[error("layer `{layer}`: {reason}")]
    Unsupported {
        /// The layer's (or node's) dotted name.
        layer: String,
        /// Why, and what would work.
        reason: String,
    },
    /// A graph that is not consistent: a node that does not fit its inputs, a dangling input,
    /// a parameter that does not fit its op.
    #[error("node `{node}`: {reason}")]
    Invalid {
        /// The node's name (`(graph)` for the graph as a whole).
        node: String,
        /// What is wrong.
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
    /// The metadata is not valid export JSON, or describes an invalid graph.
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

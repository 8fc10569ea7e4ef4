//! A checked loader for dfdx checkpoints (float models, quantized models).
//!
//! dfdx's `load_safetensors` does not check dtypes or the size of scalars, so a tensor of the
//! right shape but the wrong dtype panics inside dfdx. [`load_checkpoint`] first validates the
//! header completely ([`check_safetensors`](quant_runtime::safetensors::check_safetensors)), then checks every tensor the model expects (name,
//! dtype, shape) before loading it.
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_dfdx::checkpoint::{load_checkpoint, CheckpointError};
//!
//! let dev = Cpu::default();
//! let model = dev.build_module::<Linear<3, 2>, f32>();
//! let dir = std::env::temp_dir().join(format!("quant-checkpoint-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("linear.safetensors");
//! model.save_safetensors(&path).unwrap();
//!
//! let mut other = dev.build_module::<Linear<3, 2>, f32>();
//! load_checkpoint(&mut other, &path)?;
//! assert_eq!(other.weight.as_vec(), model.weight.as_vec());
//!
//! // A model of another shape is refused with the tensor's name, before anything is loaded.
//! let mut wrong = dev.build_module::<Linear<4, 2>, f32>();
//! let err = load_checkpoint(&mut wrong, &path).unwrap_err().to_string();
//! assert!(err.contains("`weight`") && err.contains("[2, 3]"), "{err}");
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), CheckpointError>(())
//! ```

use std::path::{Path, PathBuf};

use dfdx::nn::tensor_collection::{
    RecursiveWalker, ScalarOptions, TensorCollection, TensorOptions, TensorVisitor, ViewTensorName,
    ViewTensorRef,
};
use dfdx::prelude::{Cpu, HasShape, Shape, Tensor};
use quant_runtime::safetensors::{read_safetensors, SafetensorsHeader, MAX_HEADER_BYTES};
use safetensors::tensor::Dtype;

/// Errors of reading a checkpoint; each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid safetensors file, or does not hold what the model needs.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the tensor).
        message: String,
    },
}

/// Checks what a model expects against a header, without loading anything.
struct Expect<'a> {
    header: &'a SafetensorsHeader,
    bytes: &'a [u8],
    problems: Vec<String>,
}

impl TensorVisitor<f32, Cpu> for Expect<'_> {
    type Viewer = (ViewTensorRef, ViewTensorName);
    type Err = std::convert::Infallible;
    type E2 = f32;
    type D2 = Cpu;

    fn visit<S: Shape>(
        &mut self,
        _: TensorOptions<S, f32, Cpu>,
        (t, name): (&Tensor<S, f32, Cpu>, String),
    ) -> Result<Option<Tensor<S, f32, Cpu>>, Self::Err> {
        let want: Vec<usize> = t.shape().concrete().into();
        match self.header.tensors.get(&name) {
            None => self.problems.push(format!("tensor `{name}` is missing")),
            Some(info) if info.dtype != Dtype::F32 || info.shape != want => {
                self.problems.push(format!(
                    "tensor `{name}` is {:?} {:?}; the model needs F32 {want:?}",
                    info.dtype, info.shape
                ))
            }
            Some(_) => {}
        }
        Ok(None)
    }

    fn visit_scalar<N: num_traits::NumCast>(
        &mut self,
        _: ScalarOptions<N>,
        (_, name): (&N, String),
    ) -> Result<Option<N>, Self::Err> {
        // dfdx reads a scalar as the 8 bytes of an f64 and keeps its default when it is absent.
        if let Some(data) = self.header.data(self.bytes, &name) {
            let value = <[u8; 8]>::try_from(data).ok().map(f64::from_le_bytes);
            match value {
                None => self.problems.push(format!(
                    "scalar `{name}` holds {} bytes; expected the 8 bytes of an f64",
                    data.len()
                )),
                Some(v) if N::from(v).is_none() => self.problems.push(format!(
                    "scalar `{name}` = {v} does not fit a {}",
                    std::any::type_name::<N>()
                )),
                Some(_) => {}
            }
        }
        Ok(None)
    }
}

/// Counts the bytes a checkpoint of a model takes: 4 per f32 element, 8 per scalar.
struct Size {
    bytes: u64,
}

impl TensorVisitor<f32, Cpu> for Size {
    type Viewer = ViewTensorRef;
    type Err = std::convert::Infallible;
    type E2 = f32;
    type D2 = Cpu;

    fn visit<S: Shape>(
        &mut self,
        _: TensorOptions<S, f32, Cpu>,
        t: &Tensor<S, f32, Cpu>,
    ) -> Result<Option<Tensor<S, f32, Cpu>>, Self::Err> {
        self.bytes = self
            .bytes
            .saturating_add((t.shape().num_elements() as u64).saturating_mul(4));
        Ok(None)
    }

    fn visit_scalar<N: num_traits::NumCast>(
        &mut self,
        _: ScalarOptions<N>,
        _: &N,
    ) -> Result<Option<N>, Self::Err> {
        self.bytes = self.bytes.saturating_add(8);
        Ok(None)
    }
}

/// The largest checkpoint file of `model` [`load_checkpoint`] reads: the 8-byte length, a
/// header of at most [`MAX_HEADER_BYTES`], and the model's own tensors and scalars.
pub fn checkpoint_size_limit<M: TensorCollection<f32, Cpu>>(model: &M) -> u64 {
    let mut size = Size { bytes: 0 };
    let Ok(_) = M::iter_tensors(&mut RecursiveWalker {
        m: model,
        f: &mut size,
    });
    size.bytes.saturating_add(8 + MAX_HEADER_BYTES as u64)
}

/// Loads a safetensors checkpoint into `model` after checking the file ([`check_safetensors`](quant_runtime::safetensors::check_safetensors))
/// and that it holds every tensor the model has, as F32 of the model's shape (and every scalar
/// present as an f64 the field can hold). Nothing is loaded when a check fails. Only a regular
/// file is read, and only when it is no larger than such a checkpoint can be
/// ([`checkpoint_size_limit`]).
///
/// # Errors
/// [`CheckpointError::Io`] when the file cannot be read, is not a regular file or is too
/// large, [`CheckpointError::Invalid`] naming the first problems found otherwise.
pub fn load_checkpoint<M: TensorCollection<f32, Cpu>>(
    model: &mut M,
    path: &Path,
) -> Result<(), CheckpointError> {
    let bytes = quant_runtime::fs::read_limited(path, checkpoint_size_limit(&*model)).map_err(
        |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        },
    )?;
    let invalid = |message: String| CheckpointError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let (header, mut tensors) = read_safetensors(&bytes).map_err(invalid)?;
    let mut expect = Expect {
        header: &header,
        bytes: &bytes,
        problems: Vec::new(),
    };
    let checked = M::iter_tensors(&mut RecursiveWalker {
        m: (&*model, String::new()),
        f: &mut expect,
    });
    let Ok(_) = checked;
    if !expect.problems.is_empty() {
        let n = expect.problems.len();
        let mut message = expect
            .problems
            .into_iter()
            .take(5)
            .collect::<Vec<_>>()
            .join("; ");
        if n > 5 {
            message.push_str(&format!("; and {} more", n - 5));
        }
        return Err(invalid(message));
    }
    M::iter_tensors(&mut RecursiveWalker {
        m: (model, String::new()),
        f: &mut tensors,
    })
    .map_err(|e| invalid(format!("{e:?}")))?;
    Ok(())
}

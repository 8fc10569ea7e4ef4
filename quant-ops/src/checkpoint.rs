//! Safetensors files from users: a header check that runs before the `safetensors` crate parses
//! a file, and a checked loader for dfdx checkpoints (float models, quantized models).
//!
//! `safetensors` 0.3 trusts parts of a file's header: an offset near `usize::MAX` overflows its
//! size check (a panic in debug builds, and in release builds a header it accepts, whose tensor
//! then panics when sliced), and dfdx's `load_safetensors` does not check dtypes or the size of
//! scalars, so a tensor of the right shape but the wrong dtype panics inside dfdx.
//! [`check_safetensors`] validates the header completely before either library sees the bytes,
//! and [`load_checkpoint`] additionally checks every tensor the model expects (name, dtype,
//! shape) before loading it.
//!
//! ```
//! use dfdx::prelude::*;
//! use quant_ops::checkpoint::{load_checkpoint, CheckpointError};
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dfdx::nn::tensor_collection::{
    RecursiveWalker, ScalarOptions, TensorCollection, TensorOptions, TensorVisitor, ViewTensorName,
    ViewTensorRef,
};
use dfdx::prelude::{Cpu, HasShape, Shape, Tensor};
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;
use serde::de::{Deserializer, MapAccess, Visitor};

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

/// Largest safetensors header read (its JSON text). `safetensors` 0.3 itself accepts 100 MB,
/// which parses into more than a gigabyte of entries; a header of 16 MiB describes
/// [`MAX_TENSORS`] tensors with room to spare.
pub const MAX_HEADER_BYTES: usize = 16 << 20;

/// Most tensors one safetensors file may describe: a model with more parameter tensors than
/// this is not one quant exports or trains. Checked while the header is parsed, so a header
/// of a million empty tensors stops at this count.
pub const MAX_TENSORS: usize = 65_536;

/// The validated header of a safetensors file: every tensor's entry, by name.
#[derive(Debug, Clone)]
pub struct SafetensorsHeader {
    /// Each tensor: dtype, shape and byte range within the data section.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// Free-form `__metadata__`, when present.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Offset of the data section within the file (`8 + header length`).
    pub data_start: usize,
}

impl SafetensorsHeader {
    /// The bytes of tensor `name` within the whole file `bytes` this header was read from.
    pub fn data<'a>(&self, bytes: &'a [u8], name: &str) -> Option<&'a [u8]> {
        let info = self.tensors.get(name)?;
        let (s, e) = info.data_offsets;
        bytes.get(self.data_start.checked_add(s)?..self.data_start.checked_add(e)?)
    }
}

/// The header's top-level map, rejecting duplicated names (serde's maps keep the last one
/// silently, and `safetensors` would then read another tensor's bytes than the one checked).
struct Entries(Vec<(String, Entry)>);

enum Entry {
    Metadata(BTreeMap<String, String>),
    Tensor(TensorInfo),
}

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map from tensor names to {dtype, shape, data_offsets}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut seen = std::collections::BTreeSet::new();
                let mut out = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if out.len() == MAX_TENSORS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_TENSORS} tensors (the most a file may hold)"
                        )));
                    }
                    if !seen.insert(name.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "tensor `{name}` appears twice"
                        )));
                    }
                    let entry = if name == "__metadata__" {
                        Entry::Metadata(map.next_value()?)
                    } else {
                        Entry::Tensor(map.next_value().map_err(|e: A::Error| {
                            serde::de::Error::custom(format!("tensor `{name}`: {e}"))
                        })?)
                    };
                    out.push((name, entry));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Validates the header of a safetensors file completely: its length against the file's and
/// [`MAX_HEADER_BYTES`], UTF-8 JSON, at most [`MAX_TENSORS`] entries, no duplicated names, every tensor's byte range inside the file and equal to its
/// shape's element count times its dtype's size (with overflow checks), ranges contiguous and
/// covering the data section exactly. After this, `safetensors::SafeTensors::deserialize`
/// accepts the bytes and every tensor slices within them.
///
/// # Errors
/// What is wrong, naming the tensor where one is concerned.
pub fn check_safetensors(bytes: &[u8]) -> Result<SafetensorsHeader, String> {
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(format!(
            "{} bytes: too short for a safetensors file (an 8-byte header length comes first)",
            bytes.len()
        ));
    };
    let mut le = [0u8; 8];
    le.copy_from_slice(len_bytes);
    let claimed = u64::from_le_bytes(le);
    let available = bytes.len() - 8;
    let n = match usize::try_from(claimed) {
        Ok(n) if n <= available && n <= MAX_HEADER_BYTES => n,
        _ => {
            return Err(format!(
                "the header claims {claimed} bytes; the file holds {available} after the length (and headers are at most {MAX_HEADER_BYTES} bytes)"
            ))
        }
    };
    let data_start = 8 + n;
    let data_len = bytes.len() - data_start;
    let text = std::str::from_utf8(&bytes[8..data_start])
        .map_err(|e| format!("the header is not UTF-8: {e}"))?;
    if !text.starts_with('{') {
        return Err("the header is not a JSON object".into());
    }
    let Entries(entries) =
        serde_json::from_str(text).map_err(|e| format!("invalid header: {e}"))?;
    let mut tensors = BTreeMap::new();
    let mut metadata = None;
    for (name, entry) in entries {
        let info = match entry {
            Entry::Metadata(m) => {
                metadata = Some(m);
                continue;
            }
            Entry::Tensor(info) => info,
        };
        let (s, e) = info.data_offsets;
        if s > e || e > data_len {
            return Err(format!(
                "tensor `{name}`: bytes {s}..{e} lie outside the {data_len}-byte data section"
            ));
        }
        let bytes_needed = info
            .shape
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(*d))
            .and_then(|n| n.checked_mul(info.dtype.size()));
        if bytes_needed != Some(e - s) {
            return Err(format!(
                "tensor `{name}`: shape {:?} of {:?} does not take the {} bytes {s}..{e}",
                info.shape,
                info.dtype,
                e - s
            ));
        }
        tensors.insert(name, info);
    }
    let mut ranges: Vec<(usize, usize, &str)> = tensors
        .iter()
        .map(|(n, i)| (i.data_offsets.0, i.data_offsets.1, n.as_str()))
        .collect();
    ranges.sort();
    let mut end = 0;
    for (s, e, name) in ranges {
        if s != end {
            return Err(format!(
                "tensor `{name}`: bytes {s}..{e} do not follow the previous tensor's end {end} (tensors must be contiguous)"
            ));
        }
        end = e;
    }
    if end != data_len {
        return Err(format!(
            "the tensors take {end} bytes; the data section holds {data_len}"
        ));
    }
    Ok(SafetensorsHeader {
        tensors,
        metadata,
        data_start,
    })
}

/// Checks the header with [`check_safetensors`], then parses the file with `safetensors`.
///
/// # Errors
/// See [`check_safetensors`]; `safetensors`' own complaint otherwise.
pub fn read_safetensors(bytes: &[u8]) -> Result<(SafetensorsHeader, SafeTensors<'_>), String> {
    let header = check_safetensors(bytes)?;
    let tensors = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e:?}"))?;
    Ok((header, tensors))
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

/// Loads a safetensors checkpoint into `model` after checking the file ([`check_safetensors`])
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
    let bytes =
        crate::fs::read_limited(path, checkpoint_size_limit(&*model)).map_err(|source| {
            CheckpointError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
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

//! The safetensors header check: it runs before the `safetensors` crate parses a file.
//!
//! `safetensors` 0.3 trusts parts of a file's header: an offset near `usize::MAX` overflows its
//! size check (a panic in debug builds, and in release builds a header it accepts, whose tensor
//! then panics when sliced). [`check_safetensors`] validates the header completely before the
//! library sees the bytes; the export loader and quant-dfdx' checkpoint loader both call it.

use std::collections::BTreeMap;

use safetensors::tensor::TensorInfo;
use safetensors::SafeTensors;
use serde::de::{Deserializer, MapAccess, Visitor};

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

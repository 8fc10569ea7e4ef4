//! NumPy's `.npy` format (magic `\x93NUMPY`, a version, a header length, a Python-dict header
//! with `descr`, `fortran_order` and `shape`, then the data) and `.npz` archives (a zip of
//! `.npy` files, stored or deflated, as `numpy.savez` and `savez_compressed` write them).
//! Unknown dtypes, Fortran order of more than one dimension, shapes that overflow and shapes
//! that disagree with the data's length are refused before anything is allocated.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    check_size, read_file, split_rows, DataError, DataSection, Dataset, Samples, MAX_FILE_BYTES,
};

/// The names of the arrays in an `.npz` archive (`arrays = { images = "x_train", ... }`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpzArrays {
    /// The training features (default `x_train`).
    #[serde(default = "x_train")]
    pub images: String,
    /// The training labels (default `y_train`).
    #[serde(default = "y_train")]
    pub labels: String,
    /// The test features (default `x_test`).
    #[serde(default = "x_test")]
    pub test_images: String,
    /// The test labels (default `y_test`).
    #[serde(default = "y_test")]
    pub test_labels: String,
}

fn x_train() -> String {
    "x_train".into()
}
fn y_train() -> String {
    "y_train".into()
}
fn x_test() -> String {
    "x_test".into()
}
fn y_test() -> String {
    "y_test".into()
}

impl Default for NpzArrays {
    fn default() -> Self {
        NpzArrays {
            images: x_train(),
            labels: y_train(),
            test_images: x_test(),
            test_labels: y_test(),
        }
    }
}

/// An element type of a `.npy` array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dtype {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F32,
    F64,
}

impl Dtype {
    fn parse(descr: &str) -> Option<Dtype> {
        // Byte order: `<` little-endian, `|` not applicable (one byte), `=` native (little on
        // every machine this runs on).
        let (order, code) = descr.split_at_checked(1)?;
        let one_byte = matches!(code, "u1" | "i1" | "b1");
        if !(order == "<" || order == "=" || (order == "|" && one_byte)) {
            return None;
        }
        Some(match code {
            "u1" | "b1" => Dtype::U8,
            "i1" => Dtype::I8,
            "u2" => Dtype::U16,
            "i2" => Dtype::I16,
            "u4" => Dtype::U32,
            "i4" => Dtype::I32,
            "u8" => Dtype::U64,
            "i8" => Dtype::I64,
            "f4" => Dtype::F32,
            "f8" => Dtype::F64,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F64)
    }
}

/// A parsed `.npy` array.
#[derive(Debug)]
struct Array {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Array {
    /// Element `i` as `f64` (exact for every supported type but 64-bit integers beyond 2^53).
    fn get(&self, i: usize) -> f64 {
        let s = self.dtype.size();
        let b = &self.data[i * s..(i + 1) * s];
        let mut w = [0u8; 8];
        w[..s].copy_from_slice(b);
        match self.dtype {
            Dtype::U8 => f64::from(b[0]),
            Dtype::I8 => f64::from(b[0] as i8),
            Dtype::U16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            Dtype::I16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
            Dtype::U32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::U64 => u64::from_le_bytes(w) as f64,
            Dtype::I64 => i64::from_le_bytes(w) as f64,
            Dtype::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::F64 => f64::from_le_bytes(w),
        }
    }

    fn len(&self) -> usize {
        self.data.len() / self.dtype.size()
    }
}

fn format_error(path: &Path, message: impl Into<String>) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The value of `key` in a `.npy` header dict (`{'descr': '<f4', 'fortran_order': False,
/// 'shape': (2, 3), }`), as the text between the colon and the value's end.
fn dict_value<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let at = header.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else if let Some(quoted) = rest.strip_prefix('\'') {
        quoted.find('\'')? + 2
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    Some(rest[..end].trim())
}

/// Parses a `.npy` file's bytes.
fn parse(path: &Path, bytes: Vec<u8>) -> Result<Array, DataError> {
    let bad = |m: String| format_error(path, m);
    if !bytes.starts_with(b"\x93NUMPY") || bytes.len() < 10 {
        return Err(bad(
            "not a .npy file (it starts with \\x93NUMPY, a version and a header)".into(),
        ));
    }
    let major = bytes[6];
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(bad(format!("format version {major}: expected 1, 2 or 3"))),
    };
    let end = start
        .checked_add(header_len)
        .filter(|e| *e <= bytes.len())
        .ok_or_else(|| {
            bad(format!(
                "the header claims {header_len} bytes but the file holds {}",
                bytes.len()
            ))
        })?;
    let header = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| bad("the header is not text".into()))?;
    let field = |key: &str| {
        dict_value(header, key).ok_or_else(|| {
            bad(format!(
                "the header has no `{key}` (a .npy header holds descr, fortran_order and shape)"
            ))
        })
    };
    let descr = field("descr")?.trim_matches('\'');
    let dtype = Dtype::parse(descr).ok_or_else(|| {
        bad(format!(
            "dtype `{}`: expected little-endian integers (u1 to i8), float32 or float64",
            quant_runtime::fs::shorten(descr)
        ))
    })?;
    let fortran = field("fortran_order")?;
    let shape_text = field("shape")?;
    let shape: Vec<usize> = shape_text
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            bad(format!(
                "shape `{}`: expected a tuple of sizes",
                quant_runtime::fs::shorten(shape_text)
            ))
        })?;
    if shape.is_empty() || shape.len() > 5 {
        return Err(bad(format!(
            "shape {shape:?}: expected 1 dimension (labels) to 5 (samples of up to 4 dimensions)"
        )));
    }
    match fortran {
        "False" => {}
        "True" if shape.len() == 1 => {}
        "True" => {
            return Err(bad(
                "Fortran (column-major) order: save the array in C order (numpy.ascontiguousarray)"
                    .into(),
            ))
        }
        other => {
            return Err(bad(format!(
                "fortran_order `{}`: expected True or False",
                quant_runtime::fs::shorten(other)
            )))
        }
    }
    let count = shape[0];
    let sample_len = shape[1..]
        .iter()
        .try_fold(1usize, |a, d| a.checked_mul(*d))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    check_size(count, sample_len, path)?;
    let data_len = count * sample_len * dtype.size();
    if bytes.len() - end != data_len {
        return Err(bad(format!(
            "the header declares shape {shape:?} of {descr} ({data_len} bytes) but {} bytes follow it",
            bytes.len() - end
        )));
    }
    let mut data = bytes;
    data.drain(..end);
    Ok(Array { dtype, shape, data })
}

/// Features and labels into samples; the natural scale is 255 for byte features.
fn samples(x: Array, y: Array, x_name: &Path, y_name: &Path) -> Result<(Samples, f64), DataError> {
    if x.shape.len() < 2 {
        return Err(format_error(
            x_name,
            format!(
                "shape {:?}: features have a count and at least one sample dimension",
                x.shape
            ),
        ));
    }
    if !matches!(x.dtype, Dtype::U8 | Dtype::F32) {
        return Err(format_error(
            x_name,
            format!("features of dtype {:?}: expected uint8 or float32", x.dtype),
        ));
    }
    if y.shape.len() != 1 || y.dtype.is_float() {
        return Err(format_error(
            y_name,
            format!(
                "labels of shape {:?} and dtype {:?}: expected one integer per sample",
                y.shape, y.dtype
            ),
        ));
    }
    if x.shape[0] != y.shape[0] {
        return Err(DataError::Unusable {
            origin: format!("{} and {}", x_name.display(), y_name.display()),
            message: format!(
                "{} samples but {} labels: the counts must agree",
                x.shape[0], y.shape[0]
            ),
        });
    }
    let mut labels = Vec::with_capacity(y.len());
    for i in 0..y.len() {
        let l = y.get(i);
        if !(0.0..=1e6).contains(&l) {
            return Err(format_error(
                y_name,
                format!("label {i} is {l}: expected a class index from 0"),
            ));
        }
        labels.push(l as usize);
    }
    let features = (0..x.len()).map(|i| x.get(i) as f32).collect();
    let scale = if x.dtype == Dtype::U8 { 255.0 } else { 1.0 };
    Ok((Samples::new(features, labels, &x.shape[1..])?, scale))
}

fn missing(key: &str) -> DataError {
    DataError::Config {
        key: key.into(),
        message: "this format needs it".into(),
    }
}

/// Loads `[data]` with `format = "npy"`.
pub(super) fn load_npy(section: &DataSection) -> Result<(Dataset, f64), DataError> {
    let images = section.images.as_deref().ok_or_else(|| missing("images"))?;
    let labels = section.labels.as_deref().ok_or_else(|| missing("labels"))?;
    let pair =
        |x: &Path, y: &Path| samples(parse(x, read_file(x)?)?, parse(y, read_file(y)?)?, x, y);
    let (all, scale) = pair(images, labels)?;
    let (train, test) = match (&section.test_images, &section.test_labels, section.test) {
        (Some(ti), Some(tl), _) => (all, pair(ti, tl)?.0),
        (_, _, Some(split)) => split_rows(all, split, images)?,
        _ => return Err(missing("test")),
    };
    Ok((
        Dataset::new(train, test, images.display().to_string())?,
        scale,
    ))
}

/// Reads the entries of a zip archive named `names` (as `<name>.npy`), each within
/// [`MAX_FILE_BYTES`] after decompression.
fn npz_entries(path: &Path, names: &[&str]) -> Result<Vec<Option<Vec<u8>>>, DataError> {
    let bytes = read_file(path)?;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| format_error(path, format!("not a .npz (zip) archive: {e}")))?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let entry_name = format!("{name}.npy");
        let mut entry = match archive.by_name(&entry_name) {
            Ok(e) => e,
            Err(zip::result::ZipError::FileNotFound) => {
                out.push(None);
                continue;
            }
            Err(e) => return Err(format_error(path, format!("{entry_name}: {e}"))),
        };
        if entry.size() > MAX_FILE_BYTES {
            return Err(DataError::TooLarge {
                path: path.to_path_buf(),
                message: format!(
                    "{entry_name} declares {} bytes; an array holds at most {MAX_FILE_BYTES}",
                    entry.size()
                ),
            });
        }
        let mut data = Vec::new();
        (&mut entry)
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut data)
            .map_err(|e| format_error(path, format!("{entry_name}: {e}")))?;
        if data.len() as u64 > MAX_FILE_BYTES {
            return Err(DataError::TooLarge {
                path: path.to_path_buf(),
                message: format!("{entry_name} holds more than {MAX_FILE_BYTES} bytes"),
            });
        }
        out.push(Some(data));
    }
    Ok(out)
}

/// Loads `[data]` with `format = "npz"`.
pub(super) fn load_npz(section: &DataSection) -> Result<(Dataset, f64), DataError> {
    let path = section.path.as_deref().ok_or_else(|| missing("path"))?;
    let arrays = section.arrays.clone().unwrap_or_default();
    let names = [
        arrays.images.as_str(),
        arrays.labels.as_str(),
        arrays.test_images.as_str(),
        arrays.test_labels.as_str(),
    ];
    let mut entries = npz_entries(path, &names)?.into_iter();
    let in_archive = |name: &str| PathBuf::from(format!("{}:{name}.npy", path.display()));
    let mut array = |name: &str| -> Result<Option<(Array, PathBuf)>, DataError> {
        let place = in_archive(name);
        match entries.next().flatten() {
            Some(bytes) => Ok(Some((parse(&place, bytes)?, place))),
            None => Ok(None),
        }
    };
    let (Some((x, xn)), Some((y, yn))) = (array(names[0])?, array(names[1])?) else {
        return Err(format_error(
            path,
            format!(
                "the archive has no `{}.npy` and `{}.npy` (set arrays = {{ images = ..., labels = ... }} to their names)",
                names[0], names[1]
            ),
        ));
    };
    let (all, scale) = samples(x, y, &xn, &yn)?;
    let test = match (array(names[2])?, array(names[3])?) {
        (Some((tx, txn)), Some((ty, tyn))) => Some(samples(tx, ty, &txn, &tyn)?.0),
        (None, None) => None,
        _ => {
            return Err(format_error(
                path,
                format!(
                    "the archive has only one of `{}.npy` and `{}.npy`",
                    names[2], names[3]
                ),
            ))
        }
    };
    let (train, test) = match (test, section.test) {
        (Some(_), Some(_)) => {
            return Err(DataError::Config {
                key: "test".into(),
                message: format!(
                    "the archive holds its own test arrays ({}, {}); leave `test` out",
                    names[2], names[3]
                ),
            })
        }
        (Some(test), None) => (all, test),
        (None, Some(split)) => split_rows(all, split, path)?,
        (None, None) => {
            return Err(DataError::Config {
                key: "test".into(),
                message: format!(
                    "the archive has no test arrays ({}, {}): say which rows are test rows, test = {{ fraction = 0.2 }}",
                    names[2], names[3]
                ),
            })
        }
    };
    Ok((
        Dataset::new(train, test, path.display().to_string())?,
        scale,
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `.npy` file of `descr` with `shape` and raw little-endian `data`.
    pub(crate) fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
        npy_ordered(descr, shape, data, "False")
    }

    fn npy_ordered(descr: &str, shape: &[usize], data: &[u8], fortran: &str) -> Vec<u8> {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let shape = if dims.len() == 1 {
            format!("({},)", dims[0])
        } else {
            format!("({})", dims.join(", "))
        };
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn parses_headers_and_refuses_what_it_cannot_read() {
        let p = Path::new("a.npy");
        let a = parse(p, npy("|u1", &[2, 3], &[1, 2, 3, 4, 5, 6])).unwrap();
        assert_eq!(
            (a.dtype, a.shape.clone(), a.len()),
            (Dtype::U8, vec![2, 3], 6)
        );
        assert_eq!(a.get(5), 6.0);
        let f = parse(p, npy("<f4", &[1, 1], &1.5f32.to_le_bytes())).unwrap();
        assert_eq!(f.get(0), 1.5);
        let l = parse(p, npy("<i8", &[1], &7i64.to_le_bytes())).unwrap();
        assert_eq!(l.get(0), 7.0);
        for (bytes, want) in [
            (npy(">f4", &[1, 1], &[0; 4]), "dtype `>f4`"),
            (npy("<c8", &[1, 1], &[0; 8]), "dtype `<c8`"),
            (npy("|u1", &[2, 3], &[0; 5]), "but 5 bytes follow"),
            (npy("|u1", &[1_000_000_000, 1000], &[]), "samples of"),
            (b"\x93NUMPY\x01\x00\xff\xff{".to_vec(), "claims 65535 bytes"),
            (b"PK\x03\x04".to_vec(), "not a .npy file"),
        ] {
            let e = parse(p, bytes).unwrap_err().to_string();
            assert!(e.contains(want), "{e} (wanted {want})");
        }
        let e = parse(p, npy_ordered("|u1", &[2, 2], &[0; 4], "True"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Fortran"), "{e}");
    }
}

//! MNIST's IDX format: a big-endian header (two zero bytes, the element type, the number of
//! dimensions, then each dimension as a `u32`), then the elements. Images are
//! `0x00000803` (unsigned bytes, 3 dimensions: count, rows, columns), labels `0x00000801`
//! (unsigned bytes, 1 dimension). The header is checked against the file's length before
//! anything is allocated.

use std::path::Path;

use super::{check_size, read_file, split_rows, DataError, DataSection, Dataset, Samples};

/// IDX's element type code for unsigned bytes (the only one MNIST and Fashion-MNIST use).
const UNSIGNED_BYTE: u8 = 0x08;

/// A parsed IDX file: its dimensions and its bytes.
#[derive(Debug)]
struct Idx {
    dims: Vec<usize>,
    data: Vec<u8>,
}

fn format_error(path: &Path, message: impl Into<String>) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Parses an IDX file of unsigned bytes with 1 to 4 dimensions.
fn parse(path: &Path, bytes: Vec<u8>) -> Result<Idx, DataError> {
    let Some(&[z0, z1, kind, rank]) = bytes.first_chunk::<4>() else {
        return Err(format_error(
            path,
            format!("{} bytes: too short for an IDX header", bytes.len()),
        ));
    };
    if z0 != 0 || z1 != 0 {
        return Err(format_error(
            path,
            format!(
                "magic number {:02x}{:02x}{kind:02x}{rank:02x}: not an IDX file (it starts with 0x00000801 for labels, 0x00000803 for images)",
                z0, z1
            ),
        ));
    }
    if kind != UNSIGNED_BYTE {
        return Err(format_error(
            path,
            format!("element type 0x{kind:02x}: only unsigned bytes (0x08) are read, as MNIST and Fashion-MNIST use"),
        ));
    }
    if !(1..=4).contains(&rank) {
        return Err(format_error(
            path,
            format!("{rank} dimensions: expected 1 (labels) to 4"),
        ));
    }
    let header = 4 + 4 * rank as usize;
    if bytes.len() < header {
        return Err(format_error(
            path,
            format!(
                "{} bytes: too short for the header of {rank} dimensions",
                bytes.len()
            ),
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let sample_len: usize = dims[1..].iter().product();
    if dims[1..].contains(&0) {
        return Err(format_error(
            path,
            format!("dimensions {dims:?}: a sample dimension is 0"),
        ));
    }
    check_size(dims[0], sample_len, path)?;
    let expected = dims[0] * sample_len;
    if bytes.len() - header != expected {
        return Err(format_error(
            path,
            format!(
                "the header declares {dims:?} ({expected} bytes of data) but the file holds {} bytes after its header: truncated or not this file",
                bytes.len() - header
            ),
        ));
    }
    let mut data = bytes;
    data.drain(..header);
    Ok(Idx { dims, data })
}

/// Reads one images file and its labels file into samples (raw byte values).
fn read_pair(images: &Path, labels: &Path) -> Result<Samples, DataError> {
    let x = parse(images, read_file(images)?)?;
    if x.dims.len() < 2 {
        return Err(format_error(
            images,
            format!(
                "dimensions {:?}: an images file has a count and at least one sample dimension",
                x.dims
            ),
        ));
    }
    let y = parse(labels, read_file(labels)?)?;
    if y.dims.len() != 1 {
        return Err(format_error(
            labels,
            format!(
                "dimensions {:?}: a labels file has one dimension (the count)",
                y.dims
            ),
        ));
    }
    if x.dims[0] != y.dims[0] {
        return Err(DataError::Unusable {
            origin: format!("{} and {}", images.display(), labels.display()),
            message: format!(
                "{} images but {} labels: the counts must agree",
                x.dims[0], y.dims[0]
            ),
        });
    }
    let features = x.data.iter().map(|b| f32::from(*b)).collect();
    let labels = y.data.iter().map(|b| usize::from(*b)).collect();
    Samples::new(features, labels, &x.dims[1..])
}

/// Loads `[data]` with `format = "idx"`; the natural scale is 255.
pub(super) fn load(section: &DataSection) -> Result<(Dataset, f64), DataError> {
    let missing = |key: &str| DataError::Config {
        key: key.into(),
        message: "format = \"idx\" needs it".into(),
    };
    let images = section.images.as_deref().ok_or_else(|| missing("images"))?;
    let labels = section.labels.as_deref().ok_or_else(|| missing("labels"))?;
    let all = read_pair(images, labels)?;
    let origin = images.display().to_string();
    let (train, test) = match (&section.test_images, &section.test_labels, section.test) {
        (Some(ti), Some(tl), _) => (all, read_pair(ti, tl)?),
        (_, _, Some(split)) => split_rows(all, split, images)?,
        _ => return Err(missing("test")),
    };
    Ok((Dataset::new(train, test, origin)?, 255.0))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An IDX file of bytes with `dims`.
    pub(crate) fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, UNSIGNED_BYTE, dims.len() as u8];
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn parses_images_and_refuses_lying_headers() {
        let p = Path::new("x");
        let ok = parse(p, idx(&[2, 2, 3], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])).unwrap();
        assert_eq!(ok.dims, vec![2, 2, 3]);
        assert_eq!(ok.data.len(), 12);
        let e = parse(p, idx(&[3, 2, 3], &[0; 12])).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = parse(p, idx(&[1_000_000_000, 28, 28], &[])).unwrap_err();
        assert!(matches!(e, DataError::TooLarge { .. }), "{e}");
        let mut bad = idx(&[1], &[0]);
        bad[2] = 0x0D;
        assert!(parse(p, bad)
            .unwrap_err()
            .to_string()
            .contains("element type 0x0d"));
        let e = parse(p, vec![0x1f, 0x8b, 8, 3]).unwrap_err().to_string();
        assert!(e.contains("not an IDX file"), "{e}");
        let e = parse(p, vec![0, 0, 8, 9, 0, 0]).unwrap_err().to_string();
        assert!(e.contains("9 dimensions"), "{e}");
    }
}

//! The bundled digits data set (`data/digits.csv.gz`): 1797 8×8 images of handwritten digits,
//! 64 pixel values 0..=16 then the label 0..=9 per line. Rows whose 0-based index is a multiple
//! of 5 are the test set (360), the others the training set (1437); inputs are `pixel / 16`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Pixels per image.
pub const PIXELS: usize = 64;
/// Number of classes.
pub const CLASSES: usize = 10;

/// Why the data could not be loaded; every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The file could not be opened or read (or is not valid gzip).
    #[error("cannot read data file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not 64 pixels and a label.
    #[error("{path}, line {line}: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong and what is expected.
        message: String,
    },
    /// The file holds fewer rows than the split needs.
    #[error("{path}: {rows} rows; the digits split needs at least 10 (one test row in 5)")]
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Rows read.
        rows: usize,
    },
}

/// One split: images (row-major, `len × 64`, scaled to `[0, 1]`) and labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// `len × 64` pixel values in `[0, 1]`.
    pub images: Vec<f32>,
    /// Labels `0..=9`.
    pub labels: Vec<usize>,
}

impl Split {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    /// Whether the split is empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
    /// The pixels of sample `i`.
    pub fn image(&self, i: usize) -> &[f32] {
        &self.images[i * PIXELS..(i + 1) * PIXELS]
    }
    /// The samples at `indices`, as (pixels, labels).
    pub fn gather(&self, indices: &[usize]) -> (Vec<f32>, Vec<usize>) {
        let mut x = Vec::with_capacity(indices.len() * PIXELS);
        let mut y = Vec::with_capacity(indices.len());
        for &i in indices {
            x.extend_from_slice(self.image(i));
            y.push(self.labels[i]);
        }
        (x, y)
    }
}

/// The training and test splits.
#[derive(Debug, Clone, PartialEq)]
pub struct Digits {
    /// 1437 rows on the bundled file.
    pub train: Split,
    /// 360 rows on the bundled file.
    pub test: Split,
}

/// The bundled data file, relative to the workspace root.
pub fn bundled_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join("digits.csv.gz")
}

/// Loads a digits file (gzip-compressed CSV, or plain CSV when the name does not end in `.gz`).
///
/// # Errors
/// The file is missing or unreadable, not gzip, or a line is not 64 integers in `0..=16`
/// followed by a label in `0..=9`.
pub fn load(path: &Path) -> Result<Digits, DataError> {
    let read_err = |source| DataError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut rows: Vec<(Vec<f32>, usize)> = Vec::new();
    for (n, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(read_err)?;
        if line.trim().is_empty() {
            continue;
        }
        let malformed = |message: String| DataError::Malformed {
            path: path.to_path_buf(),
            line: n + 1,
            message,
        };
        let fields: Vec<&str> = line.trim().split(',').collect();
        if fields.len() != PIXELS + 1 {
            return Err(malformed(format!(
                "{} fields; expected {} (64 pixels and a label)",
                fields.len(),
                PIXELS + 1
            )));
        }
        let mut pixels = Vec::with_capacity(PIXELS);
        for (i, f) in fields[..PIXELS].iter().enumerate() {
            let v: u8 = f.trim().parse().map_err(|_| {
                malformed(format!("pixel {i} is `{f}`; expected an integer 0..=16"))
            })?;
            if v > 16 {
                return Err(malformed(format!("pixel {i} is {v}; expected 0..=16")));
            }
            pixels.push(v as f32 / 16.0);
        }
        let label_text = fields[PIXELS].trim();
        let label: usize = label_text
            .parse()
            .ok()
            .filter(|l| *l < CLASSES)
            .ok_or_else(|| malformed(format!("label is `{label_text}`; expected 0..=9")))?;
        rows.push((pixels, label));
    }
    if rows.len() < 10 {
        return Err(DataError::TooSmall {
            path: path.to_path_buf(),
            rows: rows.len(),
        });
    }
    let mut train = Split {
        images: Vec::new(),
        labels: Vec::new(),
    };
    let mut test = train.clone();
    for (i, (pixels, label)) in rows.into_iter().enumerate() {
        let split = if i % 5 == 0 { &mut test } else { &mut train };
        split.images.extend(pixels);
        split.labels.push(label);
    }
    Ok(Digits { train, test })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_file_splits_as_documented() {
        let d = load(&bundled_path()).unwrap();
        assert_eq!((d.train.len(), d.test.len()), (1437, 360));
        assert_eq!(d.train.images.len(), 1437 * 64);
        assert!(d.train.images.iter().all(|v| (0.0..=1.0).contains(v)));
        // Row 0 (test) is a 0; its first pixels are 0,0,5,13 / 16.
        assert_eq!(d.test.labels[0], 0);
        assert_eq!(&d.test.image(0)[..4], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0]);
        let counts = (0..10).map(|c| d.test.labels.iter().filter(|l| **l == c).count());
        assert!(
            counts.clone().all(|n| n > 20),
            "{:?}",
            counts.collect::<Vec<_>>()
        );
    }

    #[test]
    fn bad_files_name_the_file_and_line() {
        let dir = std::env::temp_dir().join(format!("quant-digits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.csv.gz");
        let e = load(&missing).unwrap_err().to_string();
        assert!(e.contains("missing.csv.gz"), "{e}");
        let not_gzip = dir.join("plain.csv.gz");
        std::fs::write(&not_gzip, "0,1,2\n").unwrap();
        assert!(matches!(load(&not_gzip), Err(DataError::Read { .. })));
        let row = |label: &str| format!("{}{label}\n", "1,".repeat(64));
        let bad = dir.join("bad.csv");
        std::fs::write(&bad, format!("{}{}", row("3").repeat(4), row("12"))).unwrap();
        let e = load(&bad).unwrap_err().to_string();
        assert!(
            e.contains("bad.csv, line 5: label is `12`; expected 0..=9"),
            "{e}"
        );
        std::fs::write(&bad, "1,2\n").unwrap();
        let e = load(&bad).unwrap_err().to_string();
        assert!(e.contains("line 1: 2 fields; expected 65"), "{e}");
        std::fs::write(&bad, row("1").replacen("1,", "17,", 1)).unwrap();
        let e = load(&bad).unwrap_err().to_string();
        assert!(e.contains("pixel 0 is 17"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

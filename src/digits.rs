//! The digits data set: 1797 8×8 images of handwritten digits, 64 pixel values 0..=16 then
//! the label 0..=9 per line. Rows whose 0-based index is a multiple of 5 are the test set
//! (360), the others the training set (1437); inputs are `pixel / 16`.
//!
//! The data is compiled into the program ([`BUNDLED_GZ`], read by [`bundled`]), so a `quant`
//! binary copied anywhere runs the main job; [`load`] reads another file of the same format
//! (gzip-compressed, or plain CSV when the name does not end in `.gz`).
//!
//! Loading is bounded whatever the file holds: only regular files are read (a FIFO or
//! `/dev/zero` is refused before reading), at most [`MAX_DATA_FILE_BYTES`] from disk and
//! [`MAX_TEXT_BYTES`] after decompression, lines of at most [`MAX_LINE_BYTES`], at most
//! [`MAX_ROWS`] rows. A leading UTF-8 byte-order mark is accepted; values quoted in errors are
//! cut to a readable length.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use quant_ops::fs::{describe_size, shorten};

/// Pixels per image.
pub const PIXELS: usize = 64;
/// Number of classes.
pub const CLASSES: usize = 10;

/// The bundled data file (`data/digits.csv.gz`), compiled into the program.
pub const BUNDLED_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");

/// How errors about the bundled data name it.
pub const BUNDLED_NAME: &str = "<bundled data/digits.csv.gz>";

/// Largest data file read from disk, in bytes (the bundled one is 57 KB compressed).
pub const MAX_DATA_FILE_BYTES: u64 = 64 << 20;
/// Largest text a data file may hold after decompression, in bytes (the bundled one holds
/// 265 KB); decompression stops there.
pub const MAX_TEXT_BYTES: u64 = 64 << 20;
/// Longest line, in bytes: 65 numbers need at most a few hundred.
pub const MAX_LINE_BYTES: usize = 4096;
/// Most rows a data file may hold: 250,000 images take 64 MB as f32.
pub const MAX_ROWS: usize = 250_000;

/// Why the data could not be loaded; every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The file could not be opened or read (or is not valid gzip, or not a regular file).
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
    /// The file holds more than a data file may (see the module's limits).
    #[error("{path}: {message}")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Which limit, and its value.
        message: String,
    },
    /// A split the run needs holds no rows (a hold-out fold of a small file, say).
    #[error("{path}: {message}")]
    EmptySplit {
        /// The file.
        path: PathBuf,
        /// Which split, how many rows there are, and what would work.
        message: String,
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

/// Where the bundled data file lies in a source checkout (`data/digits.csv.gz`). Programs read
/// the copy compiled into them with [`bundled`], which needs no checkout.
pub fn bundled_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join("digits.csv.gz")
}

/// The bundled digits, from the copy compiled into the program.
///
/// # Errors
/// None in practice (the bundled file is valid); the same checks as [`load`] run.
pub fn bundled() -> Result<Digits, DataError> {
    let text = flate2::read::MultiGzDecoder::new(BUNDLED_GZ);
    parse(text, Path::new(BUNDLED_NAME))
}

/// Loads a digits file (gzip-compressed CSV, or plain CSV when the name does not end in `.gz`).
///
/// # Errors
/// The file is missing, unreadable, not a regular file, larger than [`MAX_DATA_FILE_BYTES`],
/// not gzip, more than [`MAX_TEXT_BYTES`] of text or [`MAX_ROWS`] rows, or a line is not 64
/// integers in `0..=16` followed by a label in `0..=9`.
pub fn load(path: &Path) -> Result<Digits, DataError> {
    let read_err = |source| DataError::Read {
        path: path.to_path_buf(),
        source,
    };
    let (file, len) = quant_ops::fs::open_regular(path).map_err(read_err)?;
    if len > MAX_DATA_FILE_BYTES {
        return Err(read_err(quant_ops::fs::too_large(len, MAX_DATA_FILE_BYTES)));
    }
    let file = file.take(MAX_DATA_FILE_BYTES);
    if path.extension().is_some_and(|e| e == "gz") {
        parse(
            flate2::read::MultiGzDecoder::new(BufReader::new(file)),
            path,
        )
    } else {
        parse(file, path)
    }
}

/// Parses digits text from `reader` (`path` names it in errors), within the module's limits.
fn parse(reader: impl Read, path: &Path) -> Result<Digits, DataError> {
    let read_err = |source| DataError::Read {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |message: String| DataError::TooLarge {
        path: path.to_path_buf(),
        message,
    };
    // One byte more than allowed tells a file at the limit from one past it.
    let mut reader = BufReader::new(reader.take(MAX_TEXT_BYTES + 1));
    let mut train = Split {
        images: Vec::new(),
        labels: Vec::new(),
    };
    let mut test = train.clone();
    let mut rows = 0usize;
    let mut total = 0u64;
    let mut buf = Vec::with_capacity(256);
    for n in 1.. {
        buf.clear();
        let read = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(read_err)?;
        if read == 0 {
            break;
        }
        total += read as u64;
        if total > MAX_TEXT_BYTES {
            return Err(too_large(format!(
                "more than {} of text (after decompression); a digits file holds at most that",
                describe_size(MAX_TEXT_BYTES)
            )));
        }
        let malformed = |message: String| DataError::Malformed {
            path: path.to_path_buf(),
            line: n,
            message,
        };
        if buf.len() > MAX_LINE_BYTES {
            return Err(malformed(format!(
                "the line is longer than {MAX_LINE_BYTES} bytes; a row is 64 pixels and a label"
            )));
        }
        let mut bytes = &buf[..];
        if n == 1 {
            // Editors on Windows start UTF-8 files with a byte-order mark.
            bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
            if bytes.starts_with(b"\xFF\xFE") || bytes.starts_with(b"\xFE\xFF") {
                return Err(malformed(
                    "the file starts with a UTF-16 byte-order mark; save it as UTF-8 or ASCII"
                        .into(),
                ));
            }
        }
        let line = std::str::from_utf8(bytes).map_err(|e| {
            malformed(format!(
                "not UTF-8 text (invalid byte at column {})",
                e.valid_up_to() + 1
            ))
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.trim().split(',').collect();
        if fields.len() != PIXELS + 1 {
            return Err(malformed(format!(
                "{} fields; expected {} (64 pixels and a label)",
                fields.len(),
                PIXELS + 1
            )));
        }
        if rows == MAX_ROWS {
            return Err(too_large(format!(
                "more than {MAX_ROWS} rows; a digits file holds at most that"
            )));
        }
        let split = if rows.is_multiple_of(5) {
            &mut test
        } else {
            &mut train
        };
        for (i, f) in fields[..PIXELS].iter().enumerate() {
            let v: u8 = f.trim().parse().map_err(|_| {
                malformed(format!(
                    "pixel {i} is `{}`; expected an integer 0..=16",
                    shorten(f)
                ))
            })?;
            if v > 16 {
                return Err(malformed(format!("pixel {i} is {v}; expected 0..=16")));
            }
            split.images.push(v as f32 / 16.0);
        }
        let label_text = fields[PIXELS].trim();
        let label: usize = label_text
            .parse()
            .ok()
            .filter(|l| *l < CLASSES)
            .ok_or_else(|| {
                malformed(format!(
                    "label is `{}`; expected 0..=9",
                    shorten(label_text)
                ))
            })?;
        split.labels.push(label);
        rows += 1;
    }
    if rows < 10 {
        return Err(DataError::TooSmall {
            path: path.to_path_buf(),
            rows,
        });
    }
    Ok(Digits { train, test })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_file_splits_as_documented() {
        let d = bundled().unwrap();
        // The compiled-in copy is the checkout's file.
        assert_eq!(load(&bundled_path()).unwrap(), d);
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

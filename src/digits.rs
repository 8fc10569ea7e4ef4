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

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use quant_runtime::fs::{describe_size, shorten};

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

pub use crate::data::DataError;
use crate::data::{Dataset, Samples};

/// One digits sample's shape: a one-channel 8x8 image (models that take 64 flat values take
/// it too: [`Dataset::for_model`]).
pub const SHAPE: [usize; 3] = [1, 8, 8];

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
pub fn bundled() -> Result<Dataset, DataError> {
    let text = flate2::read::MultiGzDecoder::new(BUNDLED_GZ);
    parse(text, Path::new(BUNDLED_NAME))
}

/// Loads a digits file (gzip-compressed CSV, or plain CSV when the name does not end in `.gz`).
///
/// # Errors
/// The file is missing, unreadable, not a regular file, larger than [`MAX_DATA_FILE_BYTES`],
/// not gzip, more than [`MAX_TEXT_BYTES`] of text or [`MAX_ROWS`] rows, or a line is not 64
/// integers in `0..=16` followed by a label in `0..=9`.
pub fn load(path: &Path) -> Result<Dataset, DataError> {
    let read_err = |source| DataError::Read {
        path: path.to_path_buf(),
        source,
    };
    let (file, len) = quant_runtime::fs::open_regular(path).map_err(read_err)?;
    if len > MAX_DATA_FILE_BYTES {
        return Err(read_err(quant_runtime::fs::too_large(
            len,
            MAX_DATA_FILE_BYTES,
        )));
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
fn parse(reader: impl Read, path: &Path) -> Result<Dataset, DataError> {
    let too_large = |message: String| DataError::TooLarge {
        path: path.to_path_buf(),
        message,
    };
    // One byte more than allowed tells a file at the limit from one past it.
    let total = std::cell::Cell::new(0u64);
    let counting = CountingReader {
        inner: reader.take(MAX_TEXT_BYTES + 1),
        total: &total,
    };
    let over_limit = || {
        too_large(format!(
            "more than {} of text (after decompression); a digits file holds at most that",
            describe_size(MAX_TEXT_BYTES)
        ))
    };
    let (mut train, mut test) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    let mut rows = 0usize;
    crate::data::csv::for_each_line(
        counting,
        path,
        MAX_LINE_BYTES,
        "a row is 64 pixels and a label",
        |n, line| {
            if total.get() > MAX_TEXT_BYTES {
                return Err(over_limit());
            }
            let malformed = |message: String| DataError::Malformed {
                path: path.to_path_buf(),
                line: n,
                message,
            };
            let fields: Vec<&str> = line.split(',').collect();
            if fields.len() != PIXELS + 1 {
                return Err(malformed(format!(
                    "{} fields; expected {} (64 pixels and a label: the digits format; for a CSV of another width set format = \"csv\" in [data])",
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
                split.0.push(v as f32 / 16.0);
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
            split.1.push(label);
            rows += 1;
            Ok(())
        },
    )?;
    if total.get() > MAX_TEXT_BYTES {
        return Err(over_limit());
    }
    if rows < 10 {
        return Err(DataError::TooSmall {
            path: path.to_path_buf(),
            rows,
        });
    }
    Dataset::new(
        Samples::new(train.0, train.1, &SHAPE)?,
        Samples::new(test.0, test.1, &SHAPE)?,
        path.display().to_string(),
    )
}

/// Counts the bytes read through it (the text limit is checked on the total).
struct CountingReader<'a, R> {
    inner: R,
    total: &'a std::cell::Cell<u64>,
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.total.set(self.total.get() + n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_file_splits_as_documented() {
        let d = bundled().unwrap();
        // The compiled-in copy is the checkout's file.
        let from_file = load(&bundled_path()).unwrap();
        assert_eq!((&from_file.train, &from_file.test), (&d.train, &d.test));
        assert_eq!((d.train.len(), d.test.len()), (1437, 360));
        assert_eq!(d.train.features().len(), 1437 * 64);
        assert_eq!(d.train.shape(), &SHAPE);
        assert!(d.train.features().iter().all(|v| (0.0..=1.0).contains(v)));
        // Row 0 (test) is a 0; its first pixels are 0,0,5,13 / 16.
        assert_eq!(d.test.labels()[0], 0);
        assert_eq!(&d.test.sample(0)[..4], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0]);
        let counts = (0..10).map(|c| d.test.labels().iter().filter(|l| **l == c).count());
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

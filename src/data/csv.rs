//! CSV of any width: each line the features of one sample, then its label (or the label
//! first), comma separated; an optional header line; UTF-8 (a byte-order mark is skipped),
//! `\n` or `\r\n` line ends, gzipped or not. Lines are read one at a time within
//! [`MAX_LINE_BYTES`], and the values within [`super::MAX_VALUES`].

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use quant_runtime::fs::shorten;

use super::{
    check_size, read_file, split_rows, DataError, DataSection, Dataset, LabelColumn, Samples,
};

/// Longest line of a CSV data file, in bytes (a 3x32x32 image takes about 12 KB as text).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Calls `row(line_number, text)` for every non-blank line of `reader` (UTF-8, a leading
/// byte-order mark skipped, lines of at most `max_line` bytes; `what` says what a line holds,
/// for the error about a long one).
pub(crate) fn for_each_line(
    reader: impl Read,
    path: &Path,
    max_line: usize,
    what: &str,
    mut row: impl FnMut(usize, &str) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::with_capacity(256);
    for n in 1.. {
        buf.clear();
        let read = (&mut reader)
            .take(max_line as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|source| DataError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        if read == 0 {
            break;
        }
        let malformed = |message: String| DataError::Malformed {
            path: path.to_path_buf(),
            line: n,
            message,
        };
        if buf.len() > max_line {
            return Err(malformed(format!(
                "the line is longer than {max_line} bytes; {what}"
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
        row(n, line.trim())?;
    }
    Ok(())
}

/// Reads one CSV file into samples of flat features (raw values).
fn read(path: &Path, header: bool, label: LabelColumn) -> Result<Samples, DataError> {
    let bytes = read_file(path)?;
    let mut features = Vec::new();
    let mut labels = Vec::new();
    let mut width = None;
    let mut skip_header = header;
    for_each_line(
        &bytes[..],
        path,
        MAX_LINE_BYTES,
        "a row is the features and a label",
        |n, line| {
            if std::mem::take(&mut skip_header) {
                return Ok(());
            }
            let malformed = |message: String| DataError::Malformed {
                path: path.to_path_buf(),
                line: n,
                message,
            };
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let w = *width.get_or_insert(fields.len());
            if fields.len() != w {
                return Err(malformed(format!(
                    "{} fields; the first row has {w} (every row is the features and a label)",
                    fields.len()
                )));
            }
            if w < 2 {
                return Err(malformed(
                    "one field; a row is at least one feature and a label".into(),
                ));
            }
            check_size(labels.len() + 1, w - 1, path)?;
            let (label_text, values) = match label {
                LabelColumn::Last => (fields[w - 1], &fields[..w - 1]),
                LabelColumn::First => (fields[0], &fields[1..]),
            };
            for (i, f) in values.iter().enumerate() {
                let v: f32 = f.parse().map_err(|_| {
                    malformed(format!(
                        "feature {i} is `{}`; expected a number",
                        shorten(f)
                    ))
                })?;
                if !v.is_finite() {
                    return Err(malformed(format!(
                        "feature {i} is `{}`; features must be finite",
                        shorten(f)
                    )));
                }
                features.push(v);
            }
            let l: usize = label_text.parse().map_err(|_| {
                malformed(format!(
                    "label is `{}`; expected a class index 0, 1, 2, ...",
                    shorten(label_text)
                ))
            })?;
            labels.push(l);
            Ok(())
        },
    )?;
    let Some(width) = width else {
        return Err(DataError::EmptySplit {
            path: path.to_path_buf(),
            message: "no rows".into(),
        });
    };
    Samples::new(features, labels, &[width - 1])
}

/// Loads `[data]` with `format = "csv"`; the natural scale is 1.
pub(super) fn load(section: &DataSection) -> Result<(Dataset, f64), DataError> {
    let missing = |key: &str| DataError::Config {
        key: key.into(),
        message: "format = \"csv\" needs it".into(),
    };
    let path = section.path.as_deref().ok_or_else(|| missing("path"))?;
    let all = read(path, section.header, section.label)?;
    let (train, test) = match (&section.test_path, section.test) {
        (Some(test), _) => (all, read(test, section.header, section.label)?),
        (None, Some(split)) => split_rows(all, split, path)?,
        (None, None) => return Err(missing("test")),
    };
    Ok((Dataset::new(train, test, path.display().to_string())?, 1.0))
}

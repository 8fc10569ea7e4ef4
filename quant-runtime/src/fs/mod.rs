//! Files from and to users, handled so that no input makes a loader block or read more than
//! its kind of file needs, and no output destroys anything quant did not write itself.
//!
//! **Reading.** [`read_limited`] and [`open_regular`] refuse anything but a regular file (a
//! FIFO would block forever, `/dev/zero` never ends; symbolic links are followed to what they
//! name) and anything larger than the caller's documented limit, checked before reading and
//! enforced while reading. The file is opened non-blocking and its type checked again on the
//! open handle, so a file swapped for a FIFO in between cannot block either.
//!
//! **Writing.** Outputs are written into a temporary sibling whose name marks it as quant's
//! (`.NAME.quant-tmp-PID-N`) and renamed into place, so a failure or a kill leaves the previous
//! file or directory exactly as it was:
//!
//! - [`write_atomic`] / [`StagedFile`]: a file (the run report, a float checkpoint). The target
//!   must be absent or a regular file; directories, devices, FIFOs and symbolic links are
//!   refused.
//! - [`replace_dir`] / [`StagedDir`]: an export directory. A new export goes into a fresh
//!   directory. An existing directory is replaced only when it is empty or a previous export
//!   ([`check_export_dir`]: nothing but [`EXPORT_FILES`], and a `model.json` whose `format`
//!   begins with [`EXPORT_FORMAT_PREFIX`]); anything else is refused with the reason. On Linux
//!   the final swap is one atomic `renameat2(RENAME_EXCHANGE)`; elsewhere it is two renames,
//!   and a kill between them leaves the previous export under `.NAME.quant-old-PID-N`, which
//!   the next write to `NAME` puts back.
//!
//! - [`commit_together`]: an export and its report, which land together or not at all (a
//!   journal beside the export; a kill part-way is rolled back by the next quant command that
//!   writes or reads the export).
//!
//! Temporary files and directories left by a killed process (its PID no longer runs) are
//! removed by the next write to the same parent directory, and only when they hold nothing but
//! files quant writes; those of a process still running (a concurrent run) are left alone.
//!
//! ```
//! use quant_runtime::fs::{check_export_dir, replace_dir, ExportTarget};
//!
//! let parent = std::env::temp_dir().join(format!("quant-fs-doc-{}", std::process::id()));
//! let out = parent.join("export");
//! assert_eq!(check_export_dir(&out)?, ExportTarget::Absent);
//! replace_dir(&out, &[("model.json", br#"{"format": "quant-integer-model"}"#)])?;
//! assert_eq!(check_export_dir(&out)?, ExportTarget::PreviousExport);
//!
//! // A directory holding a file of the user's is never replaced.
//! std::fs::write(out.join("notes.txt"), "mine")?;
//! let err = replace_dir(&out, &[("model.json", b"{}")]).unwrap_err().to_string();
//! assert!(err.contains("notes.txt"), "{err}");
//! assert_eq!(std::fs::read_to_string(out.join("notes.txt"))?, "mine");
//! # std::fs::remove_dir_all(&parent).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::fs::{File, Metadata};
use std::io::{self, ErrorKind, Read};
use std::path::{Component, Path, PathBuf};

/// The files quant writes into an export directory (`model.onnx` for the ONNX export). An
/// existing directory holding anything else is never replaced.
pub const EXPORT_FILES: &[&str] = &["model.json", "model.safetensors", "model.onnx"];

/// The `format` field of a quant export's `model.json` begins with this.
pub const EXPORT_FORMAT_PREFIX: &str = "quant-";

/// Largest `model.json` read to recognise a previous export.
pub const MAX_RECOGNISED_METADATA_BYTES: u64 = 64 << 20;

/// Values quoted in error messages are cut after this many characters (see [`shorten`]).
pub const MAX_SHOWN_CHARS: usize = 200;

const TMP_TAG: &str = ".quant-tmp-";
const OLD_TAG: &str = ".quant-old-";

/// Why an output could not be written; the path is the output concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The target exists and is not something quant may replace, or cannot be created.
    #[error("{path}: {reason}")]
    Refused {
        /// The output path.
        path: PathBuf,
        /// Why, and what would work.
        reason: String,
    },
    /// A file system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

impl OutputError {
    /// The path concerned.
    pub fn path(&self) -> &Path {
        match self {
            OutputError::Refused { path, .. } | OutputError::Io { path, .. } => path,
        }
    }

    /// The error as an `io::Error` whose message is the reason (for error types that hold a
    /// path and an `io::Error`).
    pub fn into_io_error(self) -> io::Error {
        match self {
            OutputError::Refused { reason, .. } => io::Error::new(ErrorKind::InvalidInput, reason),
            OutputError::Io { source, .. } => source,
        }
    }
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> OutputError + '_ {
    move |source| OutputError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn refused(path: &Path, reason: String) -> OutputError {
    OutputError::Refused {
        path: path.to_path_buf(),
        reason,
    }
}

/// `text` safe to print on a terminal: every control character (C0 but newline and tab, DEL,
/// C1) written as an escape (`\u{1b}`), so that a name or value read from a file cannot move
/// the cursor, erase a line or fake output.
///
/// ```
/// assert_eq!(quant_runtime::fs::escape_controls("a\x1b[2Kb\0"), "a\\u{1b}[2Kb\\u{0}");
/// ```
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if unsafe_char(c) {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// `value` for an error message: at most [`MAX_SHOWN_CHARS`] characters, then
/// `… (N bytes)` with the whole value's length.
pub fn shorten(value: &str) -> Cow<'_, str> {
    match value.char_indices().nth(MAX_SHOWN_CHARS) {
        None => Cow::Borrowed(value),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes)", &value[..cut], value.len())),
    }
}

/// `message` with every value quoted in it (between backticks or double quotes) cut by
/// [`shorten`], and the whole cut if it is still long: parser messages quote what they read,
/// which can be as long as the file.
pub fn shorten_quoted(message: &str) -> Cow<'_, str> {
    if message.chars().nth(MAX_SHOWN_CHARS).is_none() {
        return Cow::Borrowed(message);
    }
    let mut out = String::new();
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = rest[open..].chars().next().unwrap_or('`');
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        match after.find(quote) {
            Some(close) => {
                out.push_str(&shorten(&after[..close]));
                out.push(quote);
                rest = &after[close + 1..];
            }
            None => {
                rest = after;
                break;
            }
        }
    }
    out.push_str(rest);
    if out.chars().nth(4 * MAX_SHOWN_CHARS).is_some() {
        return Cow::Owned(shorten(&out).into_owned());
    }
    Cow::Owned(out)
}

/// A byte count in words: `67108864 bytes (64 MiB)`.
pub fn describe_size(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{bytes} bytes ({} {unit})", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

/// What kind of file system object `meta` describes, with its article: `a FIFO (named pipe)`.
pub fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    let mut kinds = vec![
        (t.is_file(), "a regular file"),
        (t.is_dir(), "a directory"),
        (t.is_symlink(), "a symbolic link"),
    ];
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        kinds.extend([
            (t.is_fifo(), "a FIFO (named pipe)"),
            (t.is_char_device(), "a character device"),
            (t.is_block_device(), "a block device"),
            (t.is_socket(), "a socket"),
        ]);
    }
    kinds
        .into_iter()
        .find(|(is, _)| *is)
        .map_or("not a regular file", |(_, kind)| kind)
}

// ----- reading -------------------------------------------------------------------------------

fn not_regular(meta: &Metadata) -> io::Error {
    io::Error::new(
        ErrorKind::InvalidInput,
        format!("it is {}, not a regular file", kind_of(meta)),
    )
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // A FIFO opened for reading without O_NONBLOCK waits for a writer, forever.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// Opens `path` for reading if it is a regular file (after following symbolic links), and
/// returns it with its length.
///
/// # Errors
/// The file cannot be opened, or is a directory, FIFO, device or socket (the message says
/// which).
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let file = open_nonblocking(path)?;
    // What was opened, in case the path changed since.
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    Ok((file, meta.len()))
}

/// The error for a file over its limit.
pub fn too_large(len: u64, limit: u64) -> io::Error {
    io::Error::new(
        ErrorKind::InvalidData,
        format!(
            "it is {}, over the limit of {} for this file",
            describe_size(len),
            describe_size(limit)
        ),
    )
}

/// Reads a regular file of at most `limit` bytes: the size is checked before reading, and no
/// more than `limit + 1` bytes are ever read (a file that grows meanwhile is refused).
///
/// # Errors
/// See [`open_regular`]; the file is larger than `limit`; reading fails.
pub fn read_limited(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    if len > limit {
        return Err(too_large(len, limit));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            format!("it grew past {} while being read", describe_size(limit)),
        ));
    }
    Ok(bytes)
}

/// Text of a configuration file: [`read_limited`], then UTF-8. A leading UTF-8 byte-order
/// mark is dropped; a UTF-16 one is named in the error.
///
/// # Errors
/// See [`read_limited`]; the bytes are not UTF-8.
pub fn read_text_limited(path: &Path, limit: u64) -> io::Result<String> {
    let bytes = read_limited(path, limit)?;
    text_of(bytes)
}

/// `bytes` as UTF-8 text, dropping a leading UTF-8 byte-order mark and naming a UTF-16 one.
///
/// # Errors
/// The bytes are not UTF-8.
pub fn text_of(mut bytes: Vec<u8>) -> io::Result<String> {
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes.drain(..3);
    }
    if bytes.starts_with(b"\xFF\xFE") || bytes.starts_with(b"\xFE\xFF") {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            "it starts with a UTF-16 byte-order mark: save it as UTF-8",
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        io::Error::new(
            ErrorKind::InvalidData,
            format!(
                "it is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

// ----- checks of output paths -----------------------------------------------------------------

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn name_of(path: &Path) -> Result<String, OutputError> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            refused(
                path,
                "names no file or directory of its own (it ends in `..` or is a root): give a path that ends in a name".into(),
            )
        })
}

#[cfg(unix)]
fn check_writable(dir: &Path, output: &Path) -> Result<(), OutputError> {
    use rustix::fs::Access;
    rustix::fs::access(dir, Access::WRITE_OK | Access::EXEC_OK).map_err(|e| {
        refused(
            output,
            format!(
                "cannot be written: the directory {} is not writable ({})",
                dir.display(),
                io::Error::from(e)
            ),
        )
    })
}

#[cfg(not(unix))]
fn check_writable(_dir: &Path, _output: &Path) -> Result<(), OutputError> {
    Ok(())
}

/// Checks that `output`'s parent directory exists and is writable, or can be created: its
/// nearest existing ancestor must be a writable directory (not a regular file).
fn check_parent(output: &Path) -> Result<(), OutputError> {
    let parent = parent_of(output);
    for ancestor in parent.ancestors() {
        let ancestor = if ancestor.as_os_str().is_empty() {
            Path::new(".")
        } else {
            ancestor
        };
        match std::fs::metadata(ancestor) {
            Ok(m) if m.is_dir() => return check_writable(ancestor, output),
            Ok(m) => {
                return Err(refused(
                    output,
                    format!(
                        "cannot be created: {} is {}, not a directory",
                        ancestor.display(),
                        kind_of(&m)
                    ),
                ))
            }
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {}
            Err(e) => return Err(io_at(ancestor)(e)),
        }
    }
    Ok(())
}

/// Checks that a file (a report) can be written at `path` without destroying anything but a
/// previous regular file there: `path` is absent or a regular file (not a directory, device,
/// FIFO, socket or symbolic link), and its directory exists and is writable or can be created.
/// Writes nothing.
///
/// # Errors
/// [`OutputError::Refused`] saying why.
pub fn check_output_file(path: &Path) -> Result<(), OutputError> {
    name_of(path)?;
    check_output_file_kind(path)?;
    staged::probe_writable(path)
}

/// [`check_output_file`] without the probe that something can be created beside it.
fn check_output_file_kind(path: &Path) -> Result<(), OutputError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => check_parent(path),
        Ok(m) if m.file_type().is_symlink() => Err(refused(
            path,
            "is a symbolic link; quant writes a new file and renames it into place, which would replace the link: name the file itself".into(),
        )),
        Ok(m) => Err(refused(
            path,
            format!(
                "is {}, not a regular file: quant writes only regular files here and never replaces anything else",
                kind_of(&m)
            ),
        )),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            check_parent(path)
        }
        Err(e) => Err(io_at(path)(e)),
    }
}

/// What an export directory's path holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportTarget {
    /// Nothing: a new directory is created.
    Absent,
    /// An empty directory: replaced (there is nothing to lose).
    Empty,
    /// A previous quant export: replaced.
    PreviousExport,
}

/// Checks whether an export may be written as the directory `dir`, and what is there now:
/// nothing, an empty directory, or a previous export (nothing but [`EXPORT_FILES`], all regular
/// files, including a `model.json` whose `format` begins with [`EXPORT_FORMAT_PREFIX`]).
/// Writes nothing.
///
/// # Errors
/// [`OutputError::Refused`] when `dir` is a file, link, device or FIFO, a directory holding
/// anything else (the message lists some of it), or cannot be created (a parent is a regular
/// file, or not writable).
pub fn check_export_dir(dir: &Path) -> Result<ExportTarget, OutputError> {
    name_of(dir)?;
    match std::fs::symlink_metadata(dir) {
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            check_parent(dir)?;
            Ok(ExportTarget::Absent)
        }
        Err(e) => Err(io_at(dir)(e)),
        Ok(m) if m.file_type().is_symlink() => Err(refused(
            dir,
            "is a symbolic link; quant replaces only an export directory it wrote itself: name that directory, not a link to it".into(),
        )),
        Ok(m) if !m.is_dir() => Err(refused(
            dir,
            format!(
                "is {}, not a directory: the export is a directory quant creates ({}), and quant never replaces a file",
                kind_of(&m),
                EXPORT_FILES.join(", ")
            ),
        )),
        Ok(_) => {
            check_parent(dir)?;
            classify_dir(dir)
        }
    }
}

/// An existing directory: empty, a previous export, or something quant must not touch.
fn classify_dir(dir: &Path) -> Result<ExportTarget, OutputError> {
    let mut foreign = Vec::new();
    let mut more = false;
    let mut entries = 0usize;
    let mut has_metadata = false;
    for entry in std::fs::read_dir(dir).map_err(io_at(dir))? {
        let entry = entry.map_err(io_at(dir))?;
        entries += 1;
        let name = entry.file_name().to_string_lossy().into_owned();
        let file_type = entry.file_type().map_err(io_at(&entry.path()))?;
        if file_type.is_file() && EXPORT_FILES.contains(&name.as_str()) {
            has_metadata |= name == EXPORT_FILES[0];
            continue;
        }
        if foreign.len() == 5 {
            more = true;
            break;
        }
        let shown = shorten(&name).into_owned();
        foreign.push(if file_type.is_dir() {
            format!("{shown}/")
        } else if file_type.is_file() {
            shown
        } else {
            format!("{shown} (not a regular file)")
        });
    }
    if !foreign.is_empty() {
        return Err(refused(
            dir,
            format!(
                "holds files quant did not write ({}{}): quant replaces an existing directory only when it holds nothing but a previous export's files ({}). Choose another output directory, or move these files away yourself",
                foreign.join(", "),
                if more { ", ..." } else { "" },
                EXPORT_FILES.join(", ")
            ),
        ));
    }
    if entries == 0 {
        return Ok(ExportTarget::Empty);
    }
    let metadata_path = dir.join(EXPORT_FILES[0]);
    if !has_metadata {
        return Err(refused(
            dir,
            format!(
                "holds export-like files but no {}, so it is not recognisably a previous quant export; it is left alone",
                EXPORT_FILES[0]
            ),
        ));
    }
    let bytes = read_limited(&metadata_path, MAX_RECOGNISED_METADATA_BYTES)
        .map_err(io_at(&metadata_path))?;
    #[derive(serde::Deserialize)]
    struct Marker {
        format: String,
    }
    match serde_json::from_slice::<Marker>(&bytes) {
        Ok(m) if m.format.starts_with(EXPORT_FORMAT_PREFIX) => Ok(ExportTarget::PreviousExport),
        Ok(m) => Err(refused(
            dir,
            format!(
                "its {} says format `{}`, not a quant export (`{EXPORT_FORMAT_PREFIX}...`); it is left alone",
                EXPORT_FILES[0],
                shorten(&m.format)
            ),
        )),
        Err(e) => Err(refused(
            dir,
            format!(
                "its {} is not a quant export's metadata ({e}); it is left alone",
                EXPORT_FILES[0]
            ),
        )),
    }
}

/// `path` made absolute, `.` and `..` removed, and the part that exists resolved through
/// symbolic links: two paths naming the same file resolve equal, and a path inside a
/// directory resolves to a path that starts with the directory's.
pub fn resolve(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut normal = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    let mut existing = normal.clone();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return rest.iter().rev().fold(real, |p, n| p.join(n));
        }
        match existing.file_name() {
            Some(n) => {
                rest.push(n.to_os_string());
                existing.pop();
            }
            None => return normal,
        }
    }
}

mod staged;
mod together;
pub use staged::{replace_dir, write_atomic, StagedDir, StagedFile};
pub use together::{commit_together, recover_outputs};

/// A fresh, empty directory for one test: `quant-{name}-{process id}` in the system's
/// temporary directory.
#[cfg(test)]
pub(crate) fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quant-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;
    fn scratch(name: &str) -> PathBuf {
        scratch_dir(&format!("fs-{name}"))
    }

    #[test]
    fn shorten_cuts_long_values_and_says_how_long() {
        assert_eq!(shorten("short"), "short");
        let long = "é".repeat(300);
        let s = shorten(&long);
        assert!(s.ends_with("… (600 bytes)"), "{s}");
        assert_eq!(
            s.chars().count(),
            MAX_SHOWN_CHARS + "… (600 bytes)".chars().count()
        );
    }

    #[test]
    fn quoted_values_are_cut_and_the_rest_kept() {
        let long = "x".repeat(5000);
        let m = format!("unknown field `{long}`, expected `platform` (line 3)");
        let s = shorten_quoted(&m);
        assert!(
            s.contains("… (5000 bytes)`, expected `platform` (line 3)"),
            "{s}"
        );
        let m = format!("invalid value: string \"{long}\", expected a glob");
        assert!(shorten_quoted(&m).ends_with("… (5000 bytes)\", expected a glob"));
        assert_eq!(shorten_quoted("short `x`"), "short `x`");
        assert!(shorten_quoted(&format!("unquoted {long}")).len() < 300);
    }

    #[cfg(unix)]
    #[test]
    fn devices_fifos_and_links_are_neither_read_nor_replaced() {
        let dir = scratch("special");
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let e = read_limited(&fifo, 100).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        let e = read_limited(Path::new("/dev/zero"), 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("character device"), "{e}");
        let link = dir.join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_limited(&link, 100).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");

        for target in [fifo.as_path(), Path::new("/dev/null"), link.as_path()] {
            let e = check_output_file(target).unwrap_err().to_string();
            assert!(
                e.contains("not a regular file") || e.contains("symbolic link"),
                "{e}"
            );
            assert!(check_export_dir(target).is_err());
        }
        let e = check_output_file(&dir).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");

        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; 101]).unwrap();
        let e = read_limited(&big, 100).unwrap_err().to_string();
        assert!(
            e.contains("101 bytes") && e.contains("limit of 100 bytes"),
            "{e}"
        );
        assert_eq!(read_limited(&big, 101).unwrap().len(), 101);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn text_names_byte_order_marks() {
        assert_eq!(text_of(b"\xEF\xBB\xBFa = 1".to_vec()).unwrap(), "a = 1");
        let e = text_of(b"\xFF\xFEa".to_vec()).unwrap_err().to_string();
        assert!(e.contains("UTF-16") && e.contains("UTF-8"), "{e}");
        let e = text_of(b"ab\xC3\x28".to_vec()).unwrap_err().to_string();
        assert!(e.contains("offset 2"), "{e}");
    }

    #[test]
    fn resolve_sees_through_dots() {
        let a = resolve(Path::new("x/../y/./r.json"));
        let b = resolve(Path::new("y/r.json"));
        assert_eq!(a, b);
        assert!(resolve(Path::new("y/r.json")).starts_with(resolve(Path::new("y"))));
    }
}

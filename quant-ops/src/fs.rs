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
//! Temporary files and directories left by a killed process (its PID no longer runs) are
//! removed by the next write to the same parent directory, and only when they hold nothing but
//! files quant writes; those of a process still running (a concurrent run) are left alone.
//!
//! ```
//! use quant_ops::fs::{check_export_dir, replace_dir, ExportTarget};
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
use std::io::{self, ErrorKind, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{bytes} bytes ({} {unit})", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

/// What kind of file system object `meta` describes, with its article: `a FIFO (named pipe)`.
pub fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_file() {
        return "a regular file";
    }
    if t.is_dir() {
        return "a directory";
    }
    if t.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
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
            format!(
                "it grew past {} while being read",
                describe_size(limit)
            ),
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

// ----- temporary siblings and leftovers ------------------------------------------------------

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A fresh sibling of `target` named `.NAME{tag}PID-N`.
fn sibling(target: &Path, tag: &str) -> Result<PathBuf, OutputError> {
    let name = name_of(target)?;
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    Ok(parent_of(target).join(format!(".{name}{tag}{}-{n}", std::process::id())))
}

/// A leftover's name: `.BASE.quant-tmp-PID-N` or `.BASE.quant-old-PID-N`.
struct Leftover {
    base: String,
    old: bool,
    pid: u32,
}

fn parse_leftover(name: &str) -> Option<Leftover> {
    let rest = name.strip_prefix('.')?;
    let (at, old) = match (rest.rfind(TMP_TAG), rest.rfind(OLD_TAG)) {
        (Some(t), Some(o)) if o > t => (o, true),
        (Some(t), _) => (t, false),
        (None, Some(o)) => (o, true),
        (None, None) => return None,
    };
    let (pid, n) = rest[at + TMP_TAG.len()..].split_once('-')?;
    n.parse::<u64>().ok()?;
    Some(Leftover {
        base: rest[..at].to_string(),
        old,
        pid: pid.parse().ok()?,
    })
}

/// Whether process `pid` may still be running (then its temporary files are left alone).
fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    #[cfg(unix)]
    {
        match i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
            None => false,
            Some(p) => !matches!(
                rustix::process::test_kill_process(p),
                Err(rustix::io::Errno::SRCH)
            ),
        }
    }
    #[cfg(not(unix))]
    {
        true
    }
}

/// Removes `dir` if it holds nothing but [`EXPORT_FILES`] (regular files); otherwise leaves it
/// whole. Returns whether it was removed.
fn remove_quant_dir(dir: &Path) -> io::Result<bool> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let ours = entry.file_type()?.is_file()
            && name.to_str().is_some_and(|n| EXPORT_FILES.contains(&n));
        if !ours {
            return Ok(false);
        }
        files.push(entry.path());
    }
    for f in files {
        std::fs::remove_file(f)?;
    }
    std::fs::remove_dir(dir)?;
    Ok(true)
}

/// Cleans what killed processes left beside `target`: their temporary files and directories
/// are removed (directories only when they hold nothing but export files), and a previous
/// export that a kill left renamed aside is put back when `target` is missing.
fn clean_leftovers(target: &Path) {
    let parent = parent_of(target);
    let Ok(name) = name_of(target) else { return };
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(leftover) = file_name.to_str().and_then(parse_leftover) else {
            continue;
        };
        if process_alive(leftover.pid) {
            continue;
        }
        let path = entry.path();
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_file() {
            let _ = std::fs::remove_file(&path);
        } else if file_type.is_dir() {
            let target_missing = matches!(std::fs::symlink_metadata(target), Err(e) if e.kind() == ErrorKind::NotFound);
            if leftover.old
                && leftover.base == name
                && target_missing
                && matches!(classify_dir(&path), Ok(ExportTarget::PreviousExport))
            {
                let _ = std::fs::rename(&path, target);
            } else {
                let _ = remove_quant_dir(&path);
            }
        }
    }
}

// ----- staged outputs --------------------------------------------------------------------------

fn write_new_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// A file written under a temporary name beside its target, renamed into place by
/// [`StagedFile::commit`]; dropped uncommitted, it is removed and the target never changed.
#[derive(Debug)]
pub struct StagedFile {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl StagedFile {
    /// Checks `path` ([`check_output_file`]), creates its directory, and writes `bytes` to a
    /// temporary sibling.
    ///
    /// # Errors
    /// The target is refused, or writing fails.
    pub fn new(path: &Path, bytes: &[u8]) -> Result<StagedFile, OutputError> {
        StagedFile::with(path, |tmp| write_new_file(tmp, bytes))
    }

    /// Like [`StagedFile::new`], with `write` writing the temporary file at the path it is
    /// given (for writers that take a path, such as dfdx's `save_safetensors`).
    ///
    /// # Errors
    /// The target is refused, or `write` fails.
    pub fn with(
        path: &Path,
        write: impl FnOnce(&Path) -> io::Result<()>,
    ) -> Result<StagedFile, OutputError> {
        check_output_file(path)?;
        let parent = parent_of(path);
        std::fs::create_dir_all(&parent).map_err(io_at(&parent))?;
        clean_leftovers(path);
        let staged = StagedFile {
            tmp: sibling(path, TMP_TAG)?,
            target: path.to_path_buf(),
            committed: false,
        };
        write(&staged.tmp).map_err(io_at(&staged.tmp))?;
        Ok(staged)
    }

    /// Renames the file into place, replacing a regular file there (checked again first).
    ///
    /// # Errors
    /// The target became something quant must not replace, or the rename fails.
    pub fn commit(mut self) -> Result<(), OutputError> {
        check_output_file(&self.target)?;
        std::fs::rename(&self.tmp, &self.target).map_err(io_at(&self.target))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `path` through a temporary sibling and a rename: a failure leaves what was
/// at `path` as it was. `path` must be absent or a regular file ([`check_output_file`]).
///
/// # Errors
/// The target is refused, or writing fails.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    StagedFile::new(path, bytes)?.commit()
}

/// An export directory being prepared under a temporary name beside its target; written by
/// whoever writes exports (at [`StagedDir::path`]), put in place by [`StagedDir::commit`].
/// Dropped uncommitted, it is removed and the target never changed.
#[derive(Debug)]
pub struct StagedDir {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl StagedDir {
    /// Checks the target ([`check_export_dir`]) and reserves a temporary sibling (not created
    /// yet: write the export there).
    ///
    /// # Errors
    /// The target is refused.
    pub fn new(target: &Path) -> Result<StagedDir, OutputError> {
        check_export_dir(target)?;
        Ok(StagedDir {
            tmp: sibling(target, TMP_TAG)?,
            target: target.to_path_buf(),
            committed: false,
        })
    }

    /// Where to write the export (a path that does not exist yet).
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// The directory the export will replace or create.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Creates the temporary directory holding `files` (names from [`EXPORT_FILES`]).
    ///
    /// # Errors
    /// A name outside [`EXPORT_FILES`], or writing fails.
    pub fn write(&self, files: &[(&str, &[u8])]) -> Result<(), OutputError> {
        if let Some((name, _)) = files.iter().find(|(n, _)| !EXPORT_FILES.contains(n)) {
            return Err(refused(
                &self.target,
                format!(
                    "an export holds only {}; `{name}` is not one of them",
                    EXPORT_FILES.join(", ")
                ),
            ));
        }
        let parent = parent_of(&self.tmp);
        std::fs::create_dir_all(&parent).map_err(io_at(&parent))?;
        std::fs::create_dir(&self.tmp).map_err(io_at(&self.tmp))?;
        for (name, bytes) in files {
            let p = self.tmp.join(name);
            write_new_file(&p, bytes).map_err(io_at(&p))?;
        }
        Ok(())
    }

    /// Puts the export in place: the target is checked again, then created, or swapped with
    /// the previous export (or empty directory), which is then removed.
    ///
    /// # Errors
    /// The staged directory holds something else than an export's files, the target became
    /// something quant must not replace, or a rename fails (the target is then as it was).
    pub fn commit(self) -> Result<(), OutputError> {
        self.commit_with(true)
    }

    /// [`StagedDir::commit`]; `atomic` chooses `renameat2` where the system has it, or the two
    /// renames of other systems (tested on every system).
    fn commit_with(mut self, atomic: bool) -> Result<(), OutputError> {
        match std::fs::read_dir(&self.tmp) {
            Ok(mut entries) => {
                let foreign = entries.any(|e| {
                    e.map_or(true, |e| {
                        !e.file_name()
                            .to_str()
                            .is_some_and(|n| EXPORT_FILES.contains(&n))
                    })
                });
                if foreign {
                    return Err(refused(
                        &self.tmp,
                        format!(
                            "the staged export holds files other than {}",
                            EXPORT_FILES.join(", ")
                        ),
                    ));
                }
            }
            Err(e) => return Err(io_at(&self.tmp)(e)),
        }
        clean_leftovers(&self.target);
        let state = check_export_dir(&self.target)?;
        let parent = parent_of(&self.target);
        std::fs::create_dir_all(&parent).map_err(io_at(&parent))?;
        swap_into_place(&self.tmp, &self.target, state, atomic)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed && self.tmp.exists() {
            let _ = remove_quant_dir(&self.tmp);
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn rename_with(from: &Path, to: &Path, exchange: bool) -> Option<io::Result<()>> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    use rustix::io::Errno;
    let flags = if exchange {
        RenameFlags::EXCHANGE
    } else {
        RenameFlags::NOREPLACE
    };
    match renameat_with(CWD, from, CWD, to, flags) {
        Ok(()) => Some(Ok(())),
        // The file system (or kernel) does not support the flag: fall back to plain renames.
        Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => None,
        Err(e) => Some(Err(e.into())),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn rename_with(_from: &Path, _to: &Path, _exchange: bool) -> Option<io::Result<()>> {
    None
}

fn swap_into_place(
    tmp: &Path,
    target: &Path,
    state: ExportTarget,
    atomic: bool,
) -> Result<(), OutputError> {
    let rename_with = |from: &Path, to: &Path, exchange: bool| {
        atomic.then(|| rename_with(from, to, exchange)).flatten()
    };
    let state = match state {
        ExportTarget::Absent => match rename_with(tmp, target, false) {
            Some(Ok(())) => return Ok(()),
            // Something appeared there meanwhile (a concurrent run's export): check it again.
            Some(Err(e)) if e.kind() == ErrorKind::AlreadyExists => check_export_dir(target)?,
            Some(Err(e)) => return Err(io_at(target)(e)),
            None => {
                return std::fs::rename(tmp, target).map_err(io_at(target));
            }
        },
        other => other,
    };
    if state == ExportTarget::Absent {
        return std::fs::rename(tmp, target).map_err(io_at(target));
    }
    match rename_with(tmp, target, true) {
        Some(Ok(())) => {
            // `tmp` now holds the previous export.
            let _ = remove_quant_dir(tmp);
            Ok(())
        }
        Some(Err(e)) => Err(io_at(target)(e)),
        None => {
            // Two renames; a kill between them leaves the previous export at `old`, which the
            // next write puts back (clean_leftovers).
            let old = sibling(target, OLD_TAG)?;
            std::fs::rename(target, &old).map_err(io_at(target))?;
            if let Err(e) = std::fs::rename(tmp, target) {
                let _ = std::fs::rename(&old, target);
                return Err(io_at(target)(e));
            }
            let _ = remove_quant_dir(&old);
            Ok(())
        }
    }
}

/// Makes `dir` hold exactly `files` (names from [`EXPORT_FILES`]): writes them into a
/// temporary sibling directory, then puts it in place of `dir` ([`StagedDir`]). `dir` must be
/// absent, empty or a previous export ([`check_export_dir`]); anything else is refused and left
/// untouched.
///
/// # Errors
/// The target is refused, or writing fails (the target is then as it was).
pub fn replace_dir(dir: &Path, files: &[(&str, &[u8])]) -> Result<(), OutputError> {
    let staged = StagedDir::new(dir)?;
    staged.write(files)?;
    staged.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("quant-fs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const META: &[u8] = br#"{"format": "quant-integer-model"}"#;

    #[test]
    fn leftover_names_parse() {
        let l = parse_leftover(".export.quant-tmp-123-4").unwrap();
        assert_eq!((l.base.as_str(), l.old, l.pid), ("export", false, 123));
        let l = parse_leftover(".a.b.quant-old-7-0").unwrap();
        assert_eq!((l.base.as_str(), l.old, l.pid), ("a.b", true, 7));
        let l = parse_leftover("..export.quant-tmp-1-2.quant-tmp-3-4").unwrap();
        assert_eq!((l.old, l.pid), (false, 3));
        for name in ["export", ".export", ".export.quant-tmp-x-1", ".e.quant-tmp-1", "e.quant-tmp-1-2"] {
            assert!(parse_leftover(name).is_none(), "{name}");
        }
    }

    #[test]
    fn shorten_cuts_long_values_and_says_how_long() {
        assert_eq!(shorten("short"), "short");
        let long = "é".repeat(300);
        let s = shorten(&long);
        assert!(s.ends_with("… (600 bytes)"), "{s}");
        assert_eq!(s.chars().count(), MAX_SHOWN_CHARS + "… (600 bytes)".chars().count());
    }

    #[test]
    fn quoted_values_are_cut_and_the_rest_kept() {
        let long = "x".repeat(5000);
        let m = format!("unknown field `{long}`, expected `platform` (line 3)");
        let s = shorten_quoted(&m);
        assert!(s.contains("… (5000 bytes)`, expected `platform` (line 3)"), "{s}");
        let m = format!("invalid value: string \"{long}\", expected a glob");
        assert!(shorten_quoted(&m).ends_with("… (5000 bytes)\", expected a glob"));
        assert_eq!(shorten_quoted("short `x`"), "short `x`");
        assert!(shorten_quoted(&format!("unquoted {long}")).len() < 300);
    }

    #[test]
    fn exports_replace_only_previous_exports() {
        let dir = scratch("replace");
        let out = dir.join("export");
        replace_dir(&out, &[("model.json", META), ("model.safetensors", b"1")]).unwrap();
        assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), b"1");
        replace_dir(&out, &[("model.json", META), ("model.safetensors", b"2")]).unwrap();
        assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), b"2");
        // Nothing of quant's is left beside it.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["export"]);
        // An empty directory is used.
        let empty = dir.join("empty");
        std::fs::create_dir(&empty).unwrap();
        replace_dir(&empty, &[("model.json", META)]).unwrap();
        assert!(empty.join("model.json").is_file());

        // A user's directory, a foreign model.json, a file: refused and untouched.
        let user = dir.join("user");
        std::fs::create_dir_all(user.join("sub")).unwrap();
        std::fs::write(user.join("model.json"), META).unwrap();
        let e = replace_dir(&user, &[("model.json", META)]).unwrap_err().to_string();
        assert!(e.contains("sub/") && e.contains("did not write"), "{e}");
        let other = dir.join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("model.json"), br#"{"format": "onnx"}"#).unwrap();
        let e = replace_dir(&other, &[("model.json", META)]).unwrap_err().to_string();
        assert!(e.contains("format `onnx`"), "{e}");
        let file = dir.join("file");
        std::fs::write(&file, "x").unwrap();
        let e = replace_dir(&file, &[("model.json", META)]).unwrap_err().to_string();
        assert!(e.contains("is a regular file, not a directory"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
        let e = replace_dir(&file.join("export"), &[("model.json", META)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("file is a regular file, not a directory"), "{e}");
        // Only export files are ever written.
        let e = replace_dir(&dir.join("x"), &[("notes.txt", b"")]).unwrap_err().to_string();
        assert!(e.contains("notes.txt"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The PID of a process that has exited.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn leftovers_of_killed_runs_are_cleaned_or_restored() {
        let dir = scratch("leftovers");
        let out = dir.join("exp");
        let pid = dead_pid();
        // Killed between the two renames of the fallback swap: the previous export sits aside.
        let old = dir.join(format!(".exp.quant-old-{pid}-0"));
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("model.json"), META).unwrap();
        // Killed while writing: a partial staged export, and a report's temporary file.
        let tmp = dir.join(format!(".exp.quant-tmp-{pid}-1"));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join("model.safetensors"), b"partial").unwrap();
        let report_tmp = dir.join(format!(".r.json.quant-tmp-{pid}-2"));
        std::fs::write(&report_tmp, b"{").unwrap();
        // A running process's temporary directory, and a look-alike holding a user's file.
        let live = dir.join(format!(".exp.quant-tmp-{}-99", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let lookalike = dir.join(format!(".exp.quant-tmp-{pid}-3"));
        std::fs::create_dir(&lookalike).unwrap();
        std::fs::write(lookalike.join("notes.txt"), b"mine").unwrap();

        // The next write restores the previous export, then replaces it.
        assert_eq!(check_export_dir(&out).unwrap(), ExportTarget::Absent);
        let staged = StagedDir::new(&out).unwrap();
        clean_leftovers(&out);
        assert_eq!(std::fs::read(out.join("model.json")).unwrap(), META);
        staged.write(&[("model.json", META), ("model.safetensors", b"new")]).unwrap();
        staged.commit().unwrap();
        assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), b"new");
        write_atomic(&dir.join("r.json"), b"{}").unwrap();
        assert!(!old.exists() && !tmp.exists() && !report_tmp.exists());
        assert!(live.exists(), "a running process's files are left alone");
        assert_eq!(std::fs::read(lookalike.join("notes.txt")).unwrap(), b"mine");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_two_rename_swap_of_other_systems_works_too() {
        let dir = scratch("fallback");
        let out = dir.join("exp");
        for content in [b"1", b"2"] {
            let staged = StagedDir::new(&out).unwrap();
            staged.write(&[("model.json", META), ("model.safetensors", content)]).unwrap();
            staged.commit_with(false).unwrap();
            assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), content);
        }
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["exp"]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_dropped_stage_leaves_the_target_as_it_was() {
        let dir = scratch("drop");
        let out = dir.join("exp");
        replace_dir(&out, &[("model.json", META)]).unwrap();
        let staged = StagedDir::new(&out).unwrap();
        staged.write(&[("model.json", b"{\"format\": \"quant-new\"}")]).unwrap();
        let tmp = staged.path().to_path_buf();
        drop(staged);
        assert!(!tmp.exists());
        assert_eq!(std::fs::read(out.join("model.json")).unwrap(), META);

        let report = dir.join("r.json");
        std::fs::write(&report, "good").unwrap();
        let staged = StagedFile::new(&report, b"new").unwrap();
        drop(staged);
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "good");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        std::fs::remove_dir_all(&dir).ok();
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
        let e = read_limited(Path::new("/dev/zero"), 100).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
        let link = dir.join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_limited(&link, 100).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");

        for target in [fifo.as_path(), Path::new("/dev/null"), link.as_path()] {
            let e = check_output_file(target).unwrap_err().to_string();
            assert!(e.contains("not a regular file") || e.contains("symbolic link"), "{e}");
            assert!(check_export_dir(target).is_err());
        }
        let e = check_output_file(&dir).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");

        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; 101]).unwrap();
        let e = read_limited(&big, 100).unwrap_err().to_string();
        assert!(e.contains("101 bytes") && e.contains("limit of 100 bytes"), "{e}");
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

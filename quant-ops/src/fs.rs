//! Filesystem helpers for outputs: whole-or-nothing directory and file writes, and bounded
//! reads of user files.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::export::ExportError;

fn io(path: &Path) -> impl Fn(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads at most `limit` bytes of the regular file `path`: a larger file, or one that is not a
/// regular file (a FIFO, a device), is refused before anything is read.
///
/// # Errors
/// [`ExportError::Io`] naming the file.
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, ExportError> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if !meta.is_file() {
        return Err(io(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    if meta.len() > limit {
        return Err(io(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} bytes; at most {limit} are read", meta.len()),
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .map_err(io(path))?
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(io(path))?;
    if bytes.len() as u64 > limit {
        return Err(io(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("more than {limit} bytes"),
        )));
    }
    Ok(bytes)
}

/// Makes `dir` hold exactly `files`: writes them into a temporary sibling directory, then swaps
/// it in place of `dir` (removing what `dir` held before only once the new one is complete).
pub fn replace_dir(dir: &Path, files: &[(&str, &[u8])]) -> Result<(), ExportError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "export".into());
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let result = (|| {
        std::fs::create_dir(&tmp).map_err(io(&tmp))?;
        for (file, bytes) in files {
            let p = tmp.join(file);
            std::fs::write(&p, bytes).map_err(io(&p))?;
        }
        if dir.exists() {
            std::fs::rename(dir, &old).map_err(io(dir))?;
        }
        std::fs::rename(&tmp, dir).map_err(io(dir))
    })();
    match result {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&old);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            if old.exists() && !dir.exists() {
                let _ = std::fs::rename(&old, dir);
            }
            Err(e)
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ExportError> {
    let tmp = path.with_extension(format!(
        "{}.tmp-{}",
        path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(path)(e)
    })
}

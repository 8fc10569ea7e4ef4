//! Outputs written beside their target and renamed into place, and the cleanup of what killed
//! processes left behind (see the [parent module](super)).

use std::io::{self, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    check_export_dir, check_output_file, classify_dir, io_at, name_of, parent_of, refused,
    ExportTarget, OutputError, EXPORT_FILES, OLD_TAG, TMP_TAG,
};

// ----- temporary siblings and leftovers ------------------------------------------------------

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A fresh sibling of `target` named `.NAME{tag}PID-N`.
pub(super) fn sibling(target: &Path, tag: &str) -> Result<PathBuf, OutputError> {
    let name = name_of(target)?;
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    Ok(parent_of(target).join(format!(".{name}{tag}{}-{n}", std::process::id())))
}

/// A leftover's name: `.BASE.quant-tmp-PID-N` or `.BASE.quant-old-PID-N`.
pub(super) struct Leftover {
    pub(super) base: String,
    pub(super) old: bool,
    pub(super) pid: u32,
}

pub(super) fn parse_leftover(name: &str) -> Option<Leftover> {
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

/// The name a leftover's base is a leftover of, through any nesting:
/// `.exp.quant-tmp-1-2` gives `exp`, `exp` itself.
fn innermost_base(base: &str) -> &str {
    let mut base = base;
    while let Some(inner) = parse_leftover(base) {
        match base
            .strip_prefix('.')
            .and_then(|b| b.get(..inner.base.len()))
        {
            Some(b) if b == inner.base => base = b,
            _ => break,
        }
    }
    base
}

/// Whether process `pid` may still be running (then its temporary files are left alone).
pub(super) fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    #[cfg(unix)]
    {
        match i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
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
pub(super) fn remove_quant_dir(dir: &Path) -> io::Result<bool> {
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

/// Cleans what killed processes left in `target`'s directory: their temporary files and
/// directories are removed (directories only when they hold nothing but export files), and a
/// previous export that a kill left renamed aside (`.NAME.quant-old-PID-N`) is put back as
/// `NAME` when nothing has taken its place.
pub(super) fn clean_leftovers(target: &Path) {
    let parent = parent_of(target);
    let Ok(base) = name_of(target) else {
        return;
    };
    // An interrupted commit of outputs that land together is rolled back first: its journal
    // says which of the files below are the previous versions to put back.
    super::together::roll_back_interrupted(&parent);
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
        // Only what a run writing this very target left is deleted: a leftover of another
        // name is another output's (or not ours at all); a previous export that a kill set
        // aside is still put back, which destroys nothing. A temporary of a temporary (an
        // export written into the staged directory stages its own) is the target's too.
        let own = innermost_base(&leftover.base) == base;
        let path = entry.path();
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_file() {
            if own {
                let _ = std::fs::remove_file(&path);
            }
        } else if file_type.is_dir() {
            let home = parent.join(&leftover.base);
            let home_missing = matches!(
                std::fs::symlink_metadata(&home),
                Err(e) if e.kind() == ErrorKind::NotFound
            );
            if leftover.old
                && home_missing
                && matches!(classify_dir(&path), Ok(ExportTarget::PreviousExport))
            {
                let _ = std::fs::rename(&path, &home);
            } else if own {
                let _ = remove_quant_dir(&path);
            }
        }
    }
}

// ----- staged outputs --------------------------------------------------------------------------

/// Checks that a directory can be created beside `target` (or, where its parent does not
/// exist yet, in the nearest existing ancestor) by creating one and removing it: permission
/// bits say nothing of file systems like `/proc`, nor to root. Leaves nothing behind.
pub(super) fn probe_writable(target: &Path) -> Result<(), OutputError> {
    let mut dir = parent_of(target);
    while !dir.exists() {
        match dir.parent() {
            Some(up) if !up.as_os_str().is_empty() => dir = up.to_path_buf(),
            _ => {
                dir = PathBuf::from(".");
                break;
            }
        }
    }
    let probe = dir.join(format!(
        ".{}{TMP_TAG}{}-{}",
        name_of(target)?,
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            Ok(())
        }
        Err(e) => Err(refused(
            target,
            format!(
                "cannot be written: creating a directory in {} fails: {e}",
                dir.display()
            ),
        )),
    }
}

pub(super) fn write_new_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
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
    pub(super) tmp: PathBuf,
    pub(super) target: PathBuf,
    pub(super) committed: bool,
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
        // Errors name the user's path, not the temporary one beside it.
        write(&staged.tmp).map_err(io_at(&staged.target))?;
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
    pub(super) tmp: PathBuf,
    pub(super) target: PathBuf,
    pub(super) committed: bool,
}

impl StagedDir {
    /// Checks the target ([`check_export_dir`]) and reserves a temporary sibling (not created
    /// yet: write the export there).
    ///
    /// # Errors
    /// The target is refused.
    pub fn new(target: &Path) -> Result<StagedDir, OutputError> {
        check_export_dir(target)?;
        probe_writable(target)?;
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
        // Errors name the user's path, not the temporary one beside it.
        let parent = parent_of(&self.tmp);
        std::fs::create_dir_all(&parent).map_err(io_at(&parent))?;
        std::fs::create_dir(&self.tmp).map_err(io_at(&self.target))?;
        for (name, bytes) in files {
            write_new_file(&self.tmp.join(name), bytes).map_err(io_at(&self.target.join(name)))?;
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
        let state = self.prepare_commit()?;
        let aside = sibling(&self.target, OLD_TAG)?;
        let previous = swap_into_place(&self.tmp, &self.target, state, atomic, &aside)?;
        self.committed = true;
        if let Some(previous) = previous {
            let _ = remove_quant_dir(&previous);
        }
        Ok(())
    }

    /// Checks that the staged directory holds only export files and the target may still be
    /// replaced, cleans what killed runs left beside it, and creates its parent; returns what
    /// the target holds now.
    pub(super) fn prepare_commit(&self) -> Result<ExportTarget, OutputError> {
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
        Ok(state)
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
pub(super) fn rename_with(from: &Path, to: &Path, exchange: bool) -> Option<io::Result<()>> {
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
pub(super) fn rename_with(_from: &Path, _to: &Path, _exchange: bool) -> Option<io::Result<()>> {
    None
}

/// Puts `tmp` in place of `target` (in the state `state`), and returns where the previous
/// export now is (`None` if there was none): `tmp` after an atomic exchange, `aside` after the
/// two renames of other systems. The caller removes it.
pub(super) fn swap_into_place(
    tmp: &Path,
    target: &Path,
    state: ExportTarget,
    atomic: bool,
    aside: &Path,
) -> Result<Option<PathBuf>, OutputError> {
    let rename_with = |from: &Path, to: &Path, exchange: bool| {
        atomic.then(|| rename_with(from, to, exchange)).flatten()
    };
    let state = match state {
        ExportTarget::Absent => match rename_with(tmp, target, false) {
            Some(Ok(())) => return Ok(None),
            // Something appeared there meanwhile (a concurrent run's export): check it again.
            Some(Err(e)) if e.kind() == ErrorKind::AlreadyExists => check_export_dir(target)?,
            Some(Err(e)) => return Err(io_at(target)(e)),
            None => {
                return std::fs::rename(tmp, target)
                    .map(|()| None)
                    .map_err(io_at(target));
            }
        },
        other => other,
    };
    if state == ExportTarget::Absent {
        return std::fs::rename(tmp, target)
            .map(|()| None)
            .map_err(io_at(target));
    }
    match rename_with(tmp, target, true) {
        Some(Ok(())) => Ok(Some(tmp.to_path_buf())),
        Some(Err(e)) => Err(io_at(target)(e)),
        None => {
            // Two renames; a kill between them leaves the previous export at `aside`, which
            // the next write puts back (clean_leftovers).
            std::fs::rename(target, aside).map_err(io_at(target))?;
            if let Err(e) = std::fs::rename(tmp, target) {
                let _ = std::fs::rename(aside, target);
                return Err(io_at(target)(e));
            }
            Ok(Some(aside.to_path_buf()))
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
        crate::fs::scratch_dir(&format!("fs-{name}"))
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
        for name in [
            "export",
            ".export",
            ".export.quant-tmp-x-1",
            ".e.quant-tmp-1",
            "e.quant-tmp-1-2",
        ] {
            assert!(parse_leftover(name).is_none(), "{name}");
        }
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
        let e = replace_dir(&user, &[("model.json", META)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("sub/") && e.contains("did not write"), "{e}");
        let other = dir.join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("model.json"), br#"{"format": "onnx"}"#).unwrap();
        let e = replace_dir(&other, &[("model.json", META)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("format `onnx`"), "{e}");
        let file = dir.join("file");
        std::fs::write(&file, "x").unwrap();
        let e = replace_dir(&file, &[("model.json", META)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a regular file, not a directory"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
        let e = replace_dir(&file.join("export"), &[("model.json", META)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("file is a regular file, not a directory"), "{e}");
        // Only export files are ever written.
        let e = replace_dir(&dir.join("x"), &[("notes.txt", b"")])
            .unwrap_err()
            .to_string();
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
        // Another export's previous version, set aside by a kill: put back, whatever is written.
        let other_old = dir.join(format!(".other.quant-old-{pid}-4"));
        std::fs::create_dir(&other_old).unwrap();
        std::fs::write(other_old.join("model.json"), META).unwrap();
        // A running process's temporary directory, and a look-alike holding a user's file.
        let live = dir.join(format!(".exp.quant-tmp-{}-99", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let lookalike = dir.join(format!(".exp.quant-tmp-{pid}-3"));
        std::fs::create_dir(&lookalike).unwrap();
        std::fs::write(lookalike.join("notes.txt"), b"mine").unwrap();
        // A temporary of the staged directory (an export staged inside it stages its own).
        let nested = dir.join(format!("..exp.quant-tmp-{pid}-6.quant-tmp-{pid}-7"));
        std::fs::create_dir(&nested).unwrap();
        std::fs::write(nested.join("model.json"), b"partial").unwrap();
        // A file of another name that looks like a leftover: not this output's, left alone.
        let foreign = dir.join(format!(".notes.txt.quant-tmp-{pid}-5"));
        std::fs::write(&foreign, b"not quant's").unwrap();

        // The next write restores the previous export, then replaces it.
        assert_eq!(check_export_dir(&out).unwrap(), ExportTarget::Absent);
        let staged = StagedDir::new(&out).unwrap();
        clean_leftovers(&out);
        assert_eq!(std::fs::read(out.join("model.json")).unwrap(), META);
        staged
            .write(&[("model.json", META), ("model.safetensors", b"new")])
            .unwrap();
        staged.commit().unwrap();
        assert_eq!(
            std::fs::read(out.join("model.safetensors")).unwrap(),
            b"new"
        );
        write_atomic(&dir.join("r.json"), b"{}").unwrap();
        assert!(!old.exists() && !tmp.exists() && !report_tmp.exists() && !nested.exists());
        assert!(live.exists(), "a running process's files are left alone");
        assert_eq!(std::fs::read(dir.join("other/model.json")).unwrap(), META);
        assert!(!other_old.exists());
        assert_eq!(std::fs::read(lookalike.join("notes.txt")).unwrap(), b"mine");
        assert_eq!(std::fs::read(&foreign).unwrap(), b"not quant's");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_two_rename_swap_of_other_systems_works_too() {
        let dir = scratch("fallback");
        let out = dir.join("exp");
        for content in [b"1", b"2"] {
            let staged = StagedDir::new(&out).unwrap();
            staged
                .write(&[("model.json", META), ("model.safetensors", content)])
                .unwrap();
            staged.commit_with(false).unwrap();
            assert_eq!(
                std::fs::read(out.join("model.safetensors")).unwrap(),
                content
            );
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
        staged
            .write(&[("model.json", b"{\"format\": \"quant-new\"}")])
            .unwrap();
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
}

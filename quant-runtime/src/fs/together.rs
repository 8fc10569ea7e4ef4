//! An export and its report that land together or not at all (see [`commit_together`]).
//!
//! Two paths chosen by the user cannot change in one rename, so the commit is journalled: a
//! journal beside the export names both targets, where each new version waits and where each
//! previous version is kept. The journal is written before either target changes and removed
//! once both have (the commit point); only then are the previous versions deleted. A process
//! killed in between leaves the journal, and the next quant command that writes or reads the
//! export rolls both targets back to their previous versions before doing anything else.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::staged::{
    parse_leftover, process_alive, remove_quant_dir, rename_with, sibling, swap_into_place,
    write_new_file, StagedDir, StagedFile,
};
use super::{check_output_file, classify_dir, io_at, name_of, parent_of, ExportTarget};
use super::{OutputError, OLD_TAG};

const JOURNAL_TAG: &str = ".quant-journal-";

/// Journals are a few hundred bytes; anything larger is not one of ours.
const MAX_JOURNAL_BYTES: u64 = 64 << 10;

/// What a commit in progress changes, written before it changes anything.
#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    export: Entry,
    report: Entry,
}

/// One output of a journalled commit.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    target: PathBuf,
    /// The new version's temporary name (after an atomic exchange, the previous export's).
    staged: PathBuf,
    /// Where the previous version is kept until the commit point.
    aside: PathBuf,
    /// Whether the target existed before the commit.
    had_previous: bool,
    /// Device and inode of the new version, which renames keep: how recovery tells it from the
    /// previous one.
    new_id: (u64, u64),
}

#[cfg(unix)]
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_path: &Path) -> Option<(u64, u64)> {
    None
}

/// Puts a staged export and its staged report in place together: if the process is killed
/// part-way, the next quant command writing or reading either restores both previous versions
/// (or removes both new ones where there were none). Errors before the commit point put back
/// what had changed.
///
/// On systems without inode numbers (not Unix) the two are committed one after the other.
///
/// # Errors
/// Either target became something quant must not replace, or a rename fails; the targets are
/// then as they were.
pub fn commit_together(export: StagedDir, report: StagedFile) -> Result<(), OutputError> {
    if cfg!(unix) {
        commit_steps(export, report, std::process::id(), Step::All)
    } else {
        export.commit()?;
        report.commit()
    }
}

/// How far [`commit_steps`] goes: tests stop it where a kill could.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    JournalWritten,
    ExportSwapped,
    ReportRenamed,
    All,
}

fn commit_steps(
    mut export: StagedDir,
    mut report: StagedFile,
    pid: u32,
    stop_after: Step,
) -> Result<(), OutputError> {
    let state = export.prepare_commit()?;
    check_output_file(&report.target)?;
    let new_export = identity(&export.tmp).ok_or_else(|| {
        super::refused(
            &export.target,
            "the staged export vanished before it was put in place".into(),
        )
    })?;
    let new_report = identity(&report.tmp).ok_or_else(|| {
        super::refused(
            &report.target,
            "the staged report vanished before it was put in place".into(),
        )
    })?;
    let report_existed = report.target.is_file();
    let journal = Journal {
        export: Entry {
            target: export.target.clone(),
            staged: export.tmp.clone(),
            aside: sibling(&export.target, OLD_TAG)?,
            had_previous: state != ExportTarget::Absent,
            new_id: new_export,
        },
        report: Entry {
            target: report.target.clone(),
            staged: report.tmp.clone(),
            aside: sibling(&report.target, OLD_TAG)?,
            had_previous: report_existed,
            new_id: new_report,
        },
    };
    let journal_path = parent_of(&export.target).join(format!(
        ".{}{JOURNAL_TAG}{pid}-{}",
        name_of(&export.target)?,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let text = serde_json::to_vec_pretty(&journal).map_err(|e| {
        super::refused(
            &export.target,
            format!("cannot write the commit journal: {e}"),
        )
    })?;
    write_new_file(&journal_path, &text).map_err(io_at(&export.target))?;
    let killed = |export: &mut StagedDir, report: &mut StagedFile| {
        // As if killed here: nothing more happens, not even the drops' cleanup.
        export.committed = true;
        report.committed = true;
        Ok(())
    };
    if stop_after == Step::JournalWritten {
        return killed(&mut export, &mut report);
    }
    // The previous report stays reachable under its aside name (a second link to it).
    if report_existed {
        if let Err(e) = std::fs::hard_link(&report.target, &journal.report.aside) {
            let _ = std::fs::remove_file(&journal_path);
            return Err(io_at(&report.target)(e));
        }
    }
    let swapped = swap_into_place(
        &export.tmp,
        &export.target,
        state,
        true,
        &journal.export.aside,
    );
    let previous_export = match swapped {
        Ok(previous) => previous,
        Err(e) => {
            roll_back(&journal);
            let _ = std::fs::remove_file(&journal_path);
            return Err(e);
        }
    };
    export.committed = true;
    if stop_after == Step::ExportSwapped {
        return killed(&mut export, &mut report);
    }
    if let Err(e) = std::fs::rename(&report.tmp, &report.target) {
        roll_back(&journal);
        let _ = std::fs::remove_file(&journal_path);
        return Err(io_at(&report.target)(e));
    }
    report.committed = true;
    if stop_after == Step::ReportRenamed {
        return killed(&mut export, &mut report);
    }
    // The commit point: from here on the new versions stand.
    std::fs::remove_file(&journal_path).map_err(io_at(&export.target))?;
    if let Some(previous) = previous_export {
        let _ = remove_quant_dir(&previous);
    }
    if report_existed {
        let _ = std::fs::remove_file(&journal.report.aside);
    }
    Ok(())
}

/// Rolls back every commit whose journal lies in `dir` and whose process no longer runs, then
/// removes the journal. A journal that does not parse, or names paths other than a target and
/// its own temporary siblings, is left alone (it is not quant's).
pub(super) fn roll_back_interrupted(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(journal_pid) else {
            continue;
        };
        if process_alive(pid) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        let Ok(bytes) = super::read_limited(&path, MAX_JOURNAL_BYTES) else {
            continue;
        };
        let Ok(journal) = serde_json::from_slice::<Journal>(&bytes) else {
            continue;
        };
        if !(journal.export.is_plausible() && journal.report.is_plausible()) {
            continue;
        }
        roll_back(&journal);
        let _ = std::fs::remove_file(&path);
    }
}

/// The PID in a journal's name `.NAME.quant-journal-PID-N`.
fn journal_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let at = rest.rfind(JOURNAL_TAG)?;
    let (pid, n) = rest[at + JOURNAL_TAG.len()..].split_once('-')?;
    n.parse::<u128>().ok()?;
    pid.parse().ok()
}

impl Entry {
    /// Whether the journal entry names a target and temporary siblings of that target only, so
    /// that rolling it back cannot touch anything else.
    fn is_plausible(&self) -> bool {
        let Ok(base) = name_of(&self.target) else {
            return false;
        };
        let parent = parent_of(&self.target);
        [&self.staged, &self.aside].iter().all(|p| {
            parent_of(p) == parent
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(parse_leftover)
                    .is_some_and(|l| l.base == base)
        })
    }
}

/// Puts both previous versions back where the new ones stand, and removes the new versions.
fn roll_back(journal: &Journal) {
    roll_back_export(&journal.export);
    roll_back_report(&journal.report);
}

fn roll_back_export(e: &Entry) {
    if identity(&e.target) == Some(e.new_id) {
        // The new export stands: find the previous one (at `staged` after an exchange, at
        // `aside` after two renames) and swap it back.
        let previous = [&e.aside, &e.staged].into_iter().find(|p| {
            identity(p).is_some_and(|id| id != e.new_id)
                && matches!(
                    classify_dir(p),
                    Ok(ExportTarget::PreviousExport | ExportTarget::Empty)
                )
        });
        match previous {
            Some(previous) => {
                // One exchange where the system has it, so the target is never missing.
                if let Some(Ok(())) = rename_with(previous, &e.target, true) {
                    let _ = remove_quant_dir(previous);
                } else if let Ok(parked) = sibling(&e.target, super::TMP_TAG) {
                    if std::fs::rename(&e.target, &parked).is_ok() {
                        if std::fs::rename(previous, &e.target).is_ok() {
                            let _ = remove_quant_dir(&parked);
                        } else {
                            let _ = std::fs::rename(&parked, &e.target);
                        }
                    }
                }
            }
            // Where there was a previous export that cannot be found, the new one is kept.
            None if !e.had_previous => {
                let _ = remove_quant_dir(&e.target);
            }
            None => {}
        }
    } else if matches!(std::fs::symlink_metadata(&e.target), Err(x) if x.kind() == ErrorKind::NotFound)
        && matches!(
            classify_dir(&e.aside),
            Ok(ExportTarget::PreviousExport | ExportTarget::Empty)
        )
    {
        // Killed between the two renames of other systems.
        let _ = std::fs::rename(&e.aside, &e.target);
    }
    if identity(&e.staged) == Some(e.new_id) {
        let _ = remove_quant_dir(&e.staged);
    }
}

fn roll_back_report(e: &Entry) {
    if identity(&e.target) == Some(e.new_id) {
        if e.had_previous {
            if identity(&e.aside).is_some() {
                let _ = std::fs::rename(&e.aside, &e.target);
            }
        } else {
            let _ = std::fs::remove_file(&e.target);
        }
    }
    if identity(&e.staged) == Some(e.new_id) {
        let _ = std::fs::remove_file(&e.staged);
    }
    // The aside link of a previous report still in place is a second name for it.
    if e.had_previous && identity(&e.aside).is_some() && identity(&e.aside) == identity(&e.target) {
        let _ = std::fs::remove_file(&e.aside);
    }
}

/// Finishes what killed quant processes left beside `path` (an export directory or a report):
/// an interrupted [`commit_together`] is rolled back, so both outputs are their previous
/// versions again, and temporary files of `path` are removed. What a running process is
/// writing is left alone. Call it before reading or checking an output a killed run may have
/// been writing; the writers here call it themselves.
pub fn recover_outputs(path: &Path) {
    super::staged::clean_leftovers(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &[u8] = br#"{"format": "quant-integer-model"}"#;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn stage(export: &Path, report: &Path, version: &[u8]) -> (StagedDir, StagedFile) {
        let staged = StagedDir::new(export).unwrap();
        staged
            .write(&[("model.json", META), ("model.safetensors", version)])
            .unwrap();
        (staged, StagedFile::new(report, version).unwrap())
    }

    fn version(export: &Path, report: &Path) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        (
            std::fs::read(export.join("model.safetensors")).ok(),
            std::fs::read(report).ok(),
        )
    }

    #[test]
    fn both_land_and_nothing_is_left_beside_them() {
        let dir = crate::fs::scratch_dir("together-commit");
        let (export, report) = (dir.join("export"), dir.join("reports/r.json"));
        for v in [b"1", b"2"] {
            let (e, r) = stage(&export, &report, v);
            commit_together(e, r).unwrap();
            assert_eq!(
                version(&export, &report),
                (Some(v.to_vec()), Some(v.to_vec()))
            );
        }
        assert_eq!(names(&dir), ["export", "reports"]);
        assert_eq!(names(&dir.join("reports")), ["r.json"]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_kill_at_any_step_is_rolled_back_by_the_next_command() {
        for had_previous in [true, false] {
            for step in [
                Step::JournalWritten,
                Step::ExportSwapped,
                Step::ReportRenamed,
            ] {
                let dir = crate::fs::scratch_dir(&format!("together-kill-{had_previous}-{step:?}"));
                // The report in a directory of its own: recovery starts from the export.
                let (export, report) = (dir.join("export"), dir.join("reports/r.json"));
                if had_previous {
                    let (e, r) = stage(&export, &report, b"old");
                    commit_together(e, r).unwrap();
                }
                let before = version(&export, &report);
                let (e, r) = stage(&export, &report, b"new");
                commit_steps(e, r, dead_pid(), step).unwrap();
                let during = version(&export, &report);
                if step >= Step::ExportSwapped {
                    assert_eq!(during.0.as_deref(), Some(&b"new"[..]), "{step:?}");
                }
                recover_outputs(&export);
                assert_eq!(version(&export, &report), before, "{had_previous} {step:?}");
                let expected: &[&str] = if had_previous {
                    &["export", "reports"]
                } else {
                    &["reports"]
                };
                assert_eq!(names(&dir), expected, "{had_previous} {step:?}");
                let expected: &[&str] = if had_previous { &["r.json"] } else { &[] };
                assert_eq!(
                    names(&dir.join("reports")),
                    expected,
                    "{had_previous} {step:?}"
                );
                // The next commit then goes through.
                let (e, r) = stage(&export, &report, b"next");
                commit_together(e, r).unwrap();
                assert_eq!(
                    version(&export, &report),
                    (Some(b"next".to_vec()), Some(b"next".to_vec()))
                );
                std::fs::remove_dir_all(&dir).ok();
            }
        }
    }

    #[test]
    fn a_journal_of_a_running_process_or_naming_other_paths_is_left_alone() {
        let dir = crate::fs::scratch_dir("together-foreign");
        let (export, report) = (dir.join("export"), dir.join("r.json"));
        let (e, r) = stage(&export, &report, b"old");
        commit_together(e, r).unwrap();
        // A journal that would have recovery move the user's file over the export.
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        let entry = |target: &Path, other: &Path| Entry {
            target: target.to_path_buf(),
            staged: other.to_path_buf(),
            aside: other.to_path_buf(),
            had_previous: true,
            new_id: identity(target).unwrap(),
        };
        let journal = Journal {
            export: entry(&export, &dir.join("notes.txt")),
            report: entry(&report, &dir.join("notes.txt")),
        };
        let name = format!(".export{JOURNAL_TAG}{}-1", dead_pid());
        std::fs::write(dir.join(&name), serde_json::to_vec(&journal).unwrap()).unwrap();
        // One of a running process (this one), naming plausible siblings.
        let live = format!(".export{JOURNAL_TAG}{}-2", std::process::id());
        std::fs::write(dir.join(&live), b"{}").unwrap();
        recover_outputs(&export);
        assert_eq!(
            version(&export, &report),
            (Some(b"old".to_vec()), Some(b"old".to_vec()))
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
            "mine"
        );
        assert!(dir.join(&name).exists() && dir.join(&live).exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}

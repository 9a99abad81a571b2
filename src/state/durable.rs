//! Durable file replacement, shared by the ledger (manifests), bundle edits (config.json) and
//! metrics files: write a temp file beside the target, fsync it, rename it
//! over the target, fsync the directory. A crash leaves the old file or the new one, never a
//! mix; a failure (a full file system) leaves the old file and removes the temp file.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::kernel::safefile;

/// The step that failed and the file it failed on.
#[derive(Debug)]
pub struct Failure {
    pub action: &'static str,
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Replace `path` with `bytes` through the temp file `tmp` (same directory), created with
/// permissions `mode`.
pub fn replace(path: &Path, tmp: &Path, bytes: &[u8], mode: u32) -> Result<(), Failure> {
    fn fail<'p>(
        action: &'static str,
        path: &'p Path,
    ) -> impl FnOnce(std::io::Error) -> Failure + 'p {
        move |source| Failure {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
    // Never through a planted symlink, never into a file already there (`crate::kernel::safefile`).
    let mut file = safefile::create_new(tmp, mode).map_err(fail("create", tmp))?;
    let written = file
        .write_all(bytes)
        .map_err(fail("write", tmp))
        .and_then(|()| file.sync_all().map_err(fail("fsync", tmp)))
        .and_then(|()| fs::rename(tmp, path).map_err(fail("rename", path)));
    if let Err(failure) = written {
        // A full file system still unlinks: the temp file gives back what it took (a write
        // that ran out of room leaves neither a partial file nor an inode behind).
        let _ = fs::remove_file(tmp);
        return Err(failure);
    }
    match path.parent() {
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}

/// fsync a directory, so that a rename or an unlink in it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<(), Failure> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Failure {
            action: "fsync",
            path: dir.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replace that fails after its temp file was made (here the rename: the target is a
    /// directory) keeps the target and leaves no temp file.
    #[test]
    fn a_failed_replace_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("kept"), "x").unwrap();
        let tmp = dir.path().join(".target.tmp");
        let failure = replace(&target, &tmp, b"new", 0o600).unwrap_err();
        assert_eq!(
            (failure.action, failure.path.as_path()),
            ("rename", target.as_path())
        );
        assert!(!tmp.exists(), "the temp file stayed");
        assert_eq!(fs::read_to_string(target.join("kept")).unwrap(), "x");
    }
}

//! The plugin binary in the CNI bin dir: `natledger`, copied from this process's own binary
//! atomically (a temp file in the same directory, fsync, rename, mode 0755), and a marker
//! beside it ([`MARKER`]) naming the file install-cni wrote (its inode, size and mtime), written
//! before the rename; during an upgrade it names both the old file and the new one until the
//! rename is done, so a crash between the two leaves whichever is in place claimed. Only a file the marker names is ever replaced by a newer one or removed:
//! an operator's own file, or the Debian package's link (`scripts/cni-link.sh`), is left alone.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::InstallError;
use crate::kernel::safefile;
use crate::state::durable;

/// The plugin's name: a conflist's `type`.
pub const PLUGIN: &str = "natledger";
/// The marker: not a plugin name any conflist uses (CNI runtimes run plugins by `type` only).
pub const MARKER: &str = ".natledger.install-cni";
const TEMP: &str = ".natledger.install-cni.tmp";
/// Held (flock, exclusive) for a whole install-cni run: never a plugin name.
pub const LOCK: &str = ".natledger.install-cni.lock";

/// What became of the binary.
#[derive(Debug, PartialEq, Eq)]
pub enum Binary {
    Installed,
    /// The same bytes were there: nothing written.
    Unchanged,
    /// Not install-cni's (a link, another file): left alone.
    NotOurs(&'static str),
    Removed,
    /// Kept: removing it now would leave those attachments' rules with nothing to run on
    /// this host.
    Kept(String),
    Absent,
}

/// The identity of the file install-cni wrote.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    inode: u64,
    size: u64,
    mtime_ns: i128,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            inode: meta.ino(),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> InstallError + 'p {
    move |source| InstallError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn durable(f: durable::Failure) -> InstallError {
    InstallError::Io {
        action: f.action,
        path: f.path,
        source: f.source,
    }
}

/// The marker's stamps (none when there is no readable marker): one file (an older
/// install-cni's marker), or a list, during an upgrade both the file in place and the one about
/// to replace it (a crash before the rename leaves the old one still claimed).
fn marked(bin_dir: &Path) -> Vec<Stamp> {
    let Ok(text) = fs::read(bin_dir.join(MARKER)) else {
        return Vec::new();
    };
    serde_json::from_slice::<Vec<Stamp>>(&text)
        .or_else(|_| serde_json::from_slice::<Stamp>(&text).map(|one| vec![one]))
        .unwrap_or_default()
}

/// Whether the file at `target` (not followed) is one install-cni wrote.
fn ours(bin_dir: &Path, target: &fs::Metadata) -> bool {
    target.file_type().is_file() && marked(bin_dir).contains(&Stamp::of(target))
}

fn mark(bin_dir: &Path, stamps: Vec<Stamp>) -> Result<(), InstallError> {
    let bytes = serde_json::to_vec(&stamps).expect("stamps encode");
    durable::replace(
        &bin_dir.join(MARKER),
        &bin_dir.join(".natledger.install-cni.marker.tmp"),
        &bytes,
        0o644,
    )
    .map_err(durable)
}

/// Whether two files hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> Result<bool, InstallError> {
    let (mut fa, mut fb) = (
        File::open(a).map_err(io("read", a))?,
        File::open(b).map_err(io("read", b))?,
    );
    if fa.metadata().map_err(io("stat", a))?.len() != fb.metadata().map_err(io("stat", b))?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0; 1 << 16], vec![0; 1 << 16]);
    loop {
        let n = fa.read(&mut ba).map_err(io("read", a))?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n]).map_err(io("read", b))?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Take install-cni's lock in `bin_dir`, waiting for another run to finish; held until the
/// file is dropped.
pub fn lock(bin_dir: &Path) -> Result<File, InstallError> {
    use fs2::FileExt;
    let path = bin_dir.join(LOCK);
    let file = safefile::open_lock(&path).map_err(io("open", &path))?;
    file.lock_exclusive().map_err(io("lock", &path))?;
    Ok(file)
}

/// Install `source` (this process's binary) as `BIN_DIR/natledger`.
pub fn install(bin_dir: &Path, source: &Path) -> Result<Binary, InstallError> {
    let target = bin_dir.join(PLUGIN);
    let old = match fs::symlink_metadata(&target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("stat", &target)(e)),
        Ok(meta) if meta.file_type().is_symlink() => return Ok(Binary::NotOurs("a link")),
        Ok(meta) if !meta.file_type().is_file() => {
            return Ok(Binary::NotOurs("not a regular file"));
        }
        Ok(meta) => {
            if same_bytes(source, &target)? {
                return Ok(Binary::Unchanged);
            }
            if !ours(bin_dir, &meta) {
                return Ok(Binary::NotOurs("another file, not install-cni's"));
            }
            Some(Stamp::of(&meta))
        }
    };
    let tmp = stage(bin_dir, source, old)?;
    let placed = fs::rename(&tmp, &target)
        .map_err(io("rename", &target))
        .and_then(|()| durable::sync_dir(bin_dir).map_err(durable));
    if placed.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    placed?;
    // Only the new file claimed from now on (an old one's stamp left would claim a file an
    // operator later puts there with the same inode, size and mtime; unlikely, but needless).
    let new = Stamp::of(&fs::symlink_metadata(&target).map_err(io("stat", &target))?);
    mark(bin_dir, vec![new])?;
    Ok(Binary::Installed)
}

/// The new file written beside the target as a temp file, and the marker naming both it and
/// `old` (the file in place, install-cni's): a crash before the rename leaves the old one still
/// claimed, after it the new one. Returns the temp file's path.
fn stage(bin_dir: &Path, source: &Path, old: Option<Stamp>) -> Result<PathBuf, InstallError> {
    let tmp = bin_dir.join(TEMP);
    let mut input = File::open(source).map_err(io("read", source))?;
    let mut file = safefile::create_new(&tmp, 0o755).map_err(io("create", &tmp))?;
    let written = (|| {
        io::copy(&mut input, &mut file).map_err(io("write", &tmp))?;
        file.set_permissions(fs::Permissions::from_mode(0o755))
            .map_err(io("chmod", &tmp))?;
        file.flush().map_err(io("write", &tmp))?;
        file.sync_all().map_err(io("fsync", &tmp))?;
        let stamp = Stamp::of(&file.metadata().map_err(io("stat", &tmp))?);
        // Written ahead: the marker names the file before it is in place, so a crash between
        // the two leaves no file of install-cni's that the marker does not name.
        mark(bin_dir, old.into_iter().chain([stamp]).collect())
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map(|()| tmp)
}

/// Remove `BIN_DIR/natledger` when it is the file install-cni wrote, unless `keep` says why it
/// must stay.
pub fn uninstall(bin_dir: &Path, keep: Option<String>) -> Result<Binary, InstallError> {
    let target = bin_dir.join(PLUGIN);
    let marker = bin_dir.join(MARKER);
    let meta = match fs::symlink_metadata(&target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            remove(&marker)?;
            return Ok(Binary::Absent);
        }
        Err(e) => return Err(io("stat", &target)(e)),
        Ok(meta) => meta,
    };
    if !ours(bin_dir, &meta) {
        // A marker naming another file is stale.
        remove(&marker)?;
        return Ok(Binary::NotOurs(if meta.file_type().is_symlink() {
            "a link"
        } else {
            "not the file install-cni wrote"
        }));
    }
    if let Some(why) = keep {
        return Ok(Binary::Kept(why));
    }
    fs::remove_file(&target).map_err(io("remove", &target))?;
    remove(&marker)?;
    durable::sync_dir(bin_dir).map_err(durable)?;
    Ok(Binary::Removed)
}

fn remove(path: &Path) -> Result<(), InstallError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io("remove", path)(e)),
        _ => Ok(()),
    }
}

/// `BIN_DIR/natledger`, for the report.
pub fn path(bin_dir: &Path) -> PathBuf {
    bin_dir.join(PLUGIN)
}

/// The step before the rename, alone: what a crash there leaves (tests).
#[cfg(test)]
pub fn stage_only(bin_dir: &Path, source: &Path) -> Result<(), InstallError> {
    let old = fs::symlink_metadata(bin_dir.join(PLUGIN))
        .ok()
        .map(|m| Stamp::of(&m));
    stage(bin_dir, source, old).map(|_| ())
}

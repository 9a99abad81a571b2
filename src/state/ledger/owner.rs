//! Whose a state directory is: natledger acts only in a directory it made.
//!
//! A state directory is natledger's when it holds natledger's marker ([`MARKER`], written
//! when natledger creates or adopts the directory), or when it is exactly what an older
//! release left (no marker): entries only `lock`, `forwards.json` (and the cache's
//! `forwards.json.tmp`), and `containers/`, which holds only `<id>.json` manifests (each
//! beginning `{"schema":`) and `.<id>.tmp` temp files, all regular files. An empty directory
//! (systemd's `RuntimeDirectory=`, the package's `install -d -m 0700 /run/natledger`, an
//! operator's `mkdir`) is adopted as it is: natledger writes its marker and makes
//! `containers/` (0700) in it, and never changes the directory's own mode. Anything else (a
//! typo such as `/etc`, `/run`, `/var/lib`, a shared CNI directory) is refused before any
//! change: no chmod, no file created, nothing read as a manifest.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::LedgerError;
use crate::kernel::safefile;
use crate::model::echo::Echo;
use crate::model::oci::ContainerId;

/// The marker's file name in the state directory.
pub const MARKER: &str = "natledger-state";

/// The marker's contents: what the directory is, and the layout's version.
pub const MARKER_TEXT: &str = "natledger state directory, layout 1\n";

/// What an existing state directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// There is none.
    Absent,
    /// natledger's marker is there.
    Marked,
    /// Empty: adopted without changing its mode.
    Empty,
    /// An older release's layout without the marker: brought to 0700 and marked.
    Older,
}

/// Why an existing directory is not natledger's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Foreign {
    #[error("it holds {0}, which natledger never writes there")]
    Entry(Echo),
    #[error("its {name} is a {found}, where natledger keeps a {wanted}")]
    Kind {
        name: Echo,
        found: &'static str,
        wanted: &'static str,
    },
    #[error("it has no containers directory, which every natledger release creates first")]
    NoContainers,
    #[error(
        "its containers directory holds {0}, which is neither a manifest nor a manifest's temp file"
    )]
    ContainersEntry(Echo),
    #[error(
        "its containers/{0} is not a natledger manifest (it does not begin with {{\"schema\":)"
    )]
    NotManifest(Echo),
    #[error("its {MARKER} is not natledger's marker")]
    Marker,
}

/// One directory entry as listed (not followed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    fn of(t: fs::FileType) -> Kind {
        if t.is_symlink() {
            Kind::Symlink
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_file() {
            Kind::File
        } else {
            Kind::Other
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
            Kind::Other => "special file",
        }
    }
}

fn echo(name: &OsString) -> Echo {
    Echo::from(name.to_string_lossy().into_owned())
}

fn want(entry: &Entry, wanted: Kind) -> Result<(), Foreign> {
    if entry.kind == wanted {
        Ok(())
    } else {
        Err(Foreign::Kind {
            name: echo(&entry.name),
            found: entry.kind.name(),
            wanted: wanted.name(),
        })
    }
}

/// The state directory's own entries, without a marker: an older release's exactly, or empty.
pub fn judge_top(entries: &[Entry]) -> Result<Ownership, Foreign> {
    if entries.is_empty() {
        return Ok(Ownership::Empty);
    }
    let mut containers = false;
    for entry in entries {
        match entry.name.to_str() {
            Some("lock" | "forwards.json" | "forwards.json.tmp") => want(entry, Kind::File)?,
            Some("containers") => {
                want(entry, Kind::Dir)?;
                containers = true;
            }
            _ => return Err(Foreign::Entry(echo(&entry.name))),
        }
    }
    if containers {
        Ok(Ownership::Older)
    } else {
        Err(Foreign::NoContainers)
    }
}

/// An older release's containers directory: only `<id>.json` and `.<id>.tmp` regular files.
/// Returns the manifests, whose beginnings [`is_manifest_start`] then checks.
pub fn judge_containers(entries: &[Entry]) -> Result<Vec<&OsString>, Foreign> {
    let mut manifests = Vec::new();
    for entry in entries {
        let name = entry.name.to_str().unwrap_or_default();
        let id = |s: Option<&str>| s.is_some_and(|s| s.parse::<ContainerId>().is_ok());
        let manifest = id(name.strip_suffix(".json"));
        let temp = id(name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")));
        if !manifest && !temp {
            return Err(Foreign::ContainersEntry(echo(&entry.name)));
        }
        want(entry, Kind::File)?;
        if manifest {
            manifests.push(&entry.name);
        }
    }
    Ok(manifests)
}

/// How much of a manifest [`is_manifest_start`] reads.
pub const START: usize = 64;

/// Whether a file begins as every manifest natledger wrote does: `{"schema":` (whitespace
/// aside).
pub fn is_manifest_start(bytes: &[u8]) -> bool {
    let mut compact = bytes.iter().filter(|b| !b.is_ascii_whitespace());
    b"{\"schema\":"
        .iter()
        .all(|want| compact.next() == Some(want))
}

/// Whether a marker's contents are natledger's: the text, or a prefix of it (another process
/// is writing it this instant).
pub fn is_marker(bytes: &[u8]) -> bool {
    MARKER_TEXT.as_bytes().starts_with(bytes) || bytes.starts_with(b"natledger state directory")
}

/// What `dir` is, reading only: its marker, else its listing (and, for an older release's
/// layout, its containers directory and the first bytes of each manifest).
pub fn judge(dir: &Path) -> Result<Ownership, LedgerError> {
    let foreign = |why| LedgerError::NotOurs {
        path: dir.to_path_buf(),
        why,
    };
    match fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ownership::Absent),
        Err(e) => return Err(super::io("use state directory", dir)(e)),
    }
    let marker = dir.join(MARKER);
    let read_marker =
        || match safefile::read(&marker, safefile::Links::Refuse, safefile::Cap::State) {
            Ok(bytes) if is_marker(&bytes) => Ok(Some(Ownership::Marked)),
            Ok(_) => Err(foreign(Foreign::Marker)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(super::io("read", &marker)(e)),
        };
    if let Some(marked) = read_marker()? {
        return Ok(marked);
    }
    let top = list(dir).map_err(super::io("read", dir))?;
    // Another natledger marked it between the read and the listing (the first uses of a new
    // or an older release's directory, at once): judged by the marker, as it now has one.
    if top.iter().any(|e| e.name == MARKER) {
        return read_marker()?.ok_or_else(|| foreign(Foreign::Entry(Echo::from(MARKER))));
    }
    let ownership = judge_top(&top).map_err(foreign)?;
    if ownership == Ownership::Older {
        let containers = dir.join("containers");
        let entries = list(&containers).map_err(super::io("read", &containers))?;
        for name in judge_containers(&entries).map_err(foreign)? {
            let path = containers.join(name);
            let start = read_start(&path).map_err(super::io("read", &path))?;
            if !is_manifest_start(&start) {
                return Err(foreign(Foreign::NotManifest(echo(name))));
            }
        }
    }
    Ok(ownership)
}

fn list(dir: &Path) -> io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        entries.push(Entry {
            name: entry.file_name(),
            kind: Kind::of(entry.file_type()?),
        });
    }
    Ok(entries)
}

/// The first [`START`] bytes of a regular file (not through a symlink, never blocking).
fn read_start(path: &Path) -> io::Result<Vec<u8>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let mut start = Vec::with_capacity(START);
    file.take(START as u64).read_to_end(&mut start)?;
    Ok(start)
}

/// Write the marker into `dir` (0600, never through a link); one already there (another
/// natledger marking it this instant) is fine.
pub fn mark(dir: &Path) -> io::Result<()> {
    let path = dir.join(MARKER);
    let mut file = match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    };
    file.write_all(MARKER_TEXT.as_bytes())?;
    file.sync_all()?;
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, kind: Kind) -> Entry {
        Entry {
            name: name.into(),
            kind,
        }
    }

    #[test]
    fn an_older_release_layout_is_recognised_exactly() {
        use Kind::*;
        assert_eq!(judge_top(&[]), Ok(Ownership::Empty));
        for layout in [
            &[entry("containers", Dir)][..],
            &[entry("containers", Dir), entry("lock", File)],
            &[
                entry("lock", File),
                entry("forwards.json", File),
                entry("forwards.json.tmp", File),
                entry("containers", Dir),
            ],
        ] {
            assert_eq!(judge_top(layout), Ok(Ownership::Older), "{layout:?}");
        }
        // /etc, /run, /var/lib: anything else is someone else's.
        let etc = [
            entry("containers", Dir),
            entry("lock", File),
            entry("passwd", File),
        ];
        assert_eq!(judge_top(&etc), Err(Foreign::Entry(Echo::from("passwd"))));
        assert_eq!(
            judge_top(&[entry("lock", File)]),
            Err(Foreign::NoContainers)
        );
        let e = judge_top(&[entry("containers", Symlink)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "its \"containers\" is a symlink, where natledger keeps a directory"
        );
        assert!(judge_top(&[entry("containers", Dir), entry("lock", Dir)]).is_err());
        assert!(judge_top(&[entry("containers", Dir), entry("forwards.json", Other)]).is_err());
    }

    #[test]
    fn an_older_containers_directory_holds_only_manifests_and_their_temp_files() {
        use Kind::*;
        let ok = [
            entry("c1.json", File),
            entry(".c1.tmp", File),
            entry("cid+eth0.json", File),
        ];
        let names: Vec<&OsString> = judge_containers(&ok).unwrap();
        assert_eq!(names, [&OsString::from("c1.json"), &"cid+eth0.json".into()]);
        assert!(judge_containers(&[]).unwrap().is_empty());
        for bad in [
            entry("registries.conf", File),
            entry(".json", File),
            entry("..c1.tmp", File),
            entry(".c1.json", File),
            entry("c1.tmp", File),
            entry("c 1.json", File),
        ] {
            let e = judge_containers(std::slice::from_ref(&bad)).unwrap_err();
            assert!(matches!(e, Foreign::ContainersEntry(_)), "{bad:?}: {e}");
        }
        for odd in [Symlink, Dir, Other] {
            let e = judge_containers(&[entry("c1.json", odd)]).unwrap_err();
            assert!(matches!(e, Foreign::Kind { .. }), "{odd:?}: {e}");
        }
    }

    #[test]
    fn a_manifest_begins_with_its_schema() {
        assert!(is_manifest_start(
            b"{\n  \"schema\": 1,\n  \"container_id\": \"c1\""
        ));
        assert!(is_manifest_start(b"{\"schema\":1}"));
        assert!(!is_manifest_start(
            b"{\"default\": [{\"type\": \"insecureAcceptAnything\"}]}"
        ));
        assert!(!is_manifest_start(b""));
        assert!(!is_manifest_start(b"{\"sch"));
    }

    #[test]
    fn the_marker_is_its_text_or_a_part_being_written() {
        assert!(is_marker(MARKER_TEXT.as_bytes()));
        assert!(is_marker(b""));
        assert!(is_marker(b"natledger state"));
        assert!(is_marker(b"natledger state directory, layout 2\n"));
        assert!(!is_marker(b"something else\n"));
    }
}

//! A manifest too large to read whole (over `safefile::Cap::State`: an older release wrote
//! any size), read for what judging its container needs: one streaming pass over the file
//! (`serde_json` over a `BufReader`), its mappings and addresses skipped unread
//! (`IgnoredAny`), of its rules only where they are (backend, family, table) and how many,
//! so memory stays bounded by the largest single value, not by the file. Sweep then judges
//! the container as any other and removes a dead one's rules by its tag.

use std::io::BufReader;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{IgnoredAny, SeqAccess, Visitor};

use crate::kernel::netns_id::NetnsId;
use crate::kernel::safefile;
use crate::model::backend_name::Backend;
use crate::model::family::Family;
use crate::model::oci::ContainerId;

use super::{CniAttachment, LedgerError, Manifest, Phase, SCHEMA, Shared};

/// What [`summarize`] read of a manifest.
#[derive(Debug)]
pub struct Summary {
    /// Everything but `mappings`, `addresses` and `rules` (empty), and the mappings of its
    /// `shares` (empty: only the holders count).
    pub manifest: Manifest,
    /// Where its rules are: each (backend, family, table) once.
    pub places: Vec<(Backend, Family, String)>,
    /// How many rules it records.
    pub rules: usize,
    /// The file's size.
    pub bytes: u64,
    /// The file read, to tell whether a summary read before the lock is still of the file
    /// there under it.
    pub file: FileId,
}

/// A file's identity and version: device, inode, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl FileId {
    fn of(meta: &std::fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }

    /// The file at `path` now (not followed if a symlink).
    pub fn at(path: &Path) -> Option<FileId> {
        std::fs::symlink_metadata(path).ok().map(|m| FileId::of(&m))
    }
}

impl super::Ledger {
    /// The manifests too large to read whole, summarized ([`summarize`]) without the lock,
    /// so that a sweep does not hold it while it reads them: under the lock, a summary is
    /// used only while [`FileId::at`] its path is still the file read (natledger replaces
    /// a manifest by renaming a new file over it). Whatever fails here is read again under
    /// the lock.
    pub fn summarize_oversized(&self) -> Vec<(PathBuf, Summary)> {
        if self.check_dirs().is_err() {
            return Vec::new();
        }
        let Ok(entries) = std::fs::read_dir(self.containers()) else {
            return Vec::new();
        };
        let cap = safefile::Cap::State.bytes();
        entries
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                !name.starts_with('.') && name.ends_with(".json")
            })
            .filter(|e| {
                e.metadata()
                    .is_ok_and(|m| m.file_type().is_file() && m.len() > cap)
            })
            .filter_map(|e| {
                let path = e.path();
                summarize(&path).ok().map(|s| (path, s))
            })
            .collect()
    }
}

impl super::Ledger {
    /// Container `id`'s manifest, when too large to read whole, summarized without the lock
    /// (poststop's and a CNI DEL's, as [`Self::summarize_oversized`] is sweep's).
    pub fn summarize_one(&self, id: &ContainerId) -> Option<Summary> {
        let path = self.manifest_path(id);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.file_type().is_file() || meta.len() <= safefile::Cap::State.bytes() {
            return None;
        }
        self.check_dirs().ok()?;
        summarize(&path).ok()
    }

    /// Under the lock, container `id`'s manifest that [`Self::load`] found too large: `early`
    /// if the file is still the one it read, else read now; `None` if it cannot be read or
    /// names another container.
    pub fn summary_under_lock(&self, id: &ContainerId, early: Option<Summary>) -> Option<Summary> {
        let path = self.manifest_path(id);
        match early {
            Some(s) if Some(s.file) == FileId::at(&path) => Some(s),
            _ => summarize(&path).ok(),
        }
        .filter(|s| s.manifest.container_id == *id)
    }
}

impl LedgerError {
    /// A manifest refused only for its size (`safefile::Refused::TooLarge`): [`summarize`]
    /// can still read it.
    pub fn is_too_large(&self) -> bool {
        matches!(self, LedgerError::Io { source, .. }
            if matches!(safefile::reason(source), Some(safefile::Refused::TooLarge { .. })))
    }
}

/// Read the manifest at `path` in one pass (see the module comment). A manifest of another
/// schema, or not valid to its end, is an error as [`super::Ledger::load`] gives it.
pub fn summarize(path: &Path) -> Result<Summary, LedgerError> {
    let io = |source| LedgerError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    };
    let (file, bytes) = safefile::open_regular(path, safefile::Links::Refuse).map_err(io)?;
    let id = FileId::of(&file.metadata().map_err(io)?);
    let wire: Wire = serde_json::from_reader(BufReader::new(file)).map_err(|source| {
        if source.is_io() {
            io(source.into())
        } else {
            LedgerError::Corrupt {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    if wire.schema != SCHEMA {
        return Err(LedgerError::Schema {
            path: path.to_path_buf(),
            found: wire.schema,
        });
    }
    let manifest = Manifest {
        schema: wire.schema,
        container_id: wire.container_id,
        bundle: wire.bundle,
        pid: wire.pid,
        pid_start_time: wire.pid_start_time,
        boot_id: wire.boot_id,
        pid_namespace: wire.pid_namespace,
        phase: wire.phase,
        mappings: Vec::new(),
        addresses: Vec::new(),
        rules: Vec::new(),
        netns: wire.netns,
        pod: wire.pod,
        shares: wire
            .shares
            .into_iter()
            .map(|h| Shared {
                holder: h.holder,
                mappings: Vec::new(),
            })
            .collect(),
        shared_by: wire.shared_by,
        // Not needed to judge liveness.
        stacked_on: Vec::new(),
        cni: wire.cni,
    };
    Ok(Summary {
        manifest,
        places: wire.rules.places,
        rules: wire.rules.count,
        bytes,
        file: id,
    })
}

/// A manifest as [`summarize`] reads it: `Manifest`'s fields, the large ones skipped.
#[derive(Deserialize)]
struct Wire {
    schema: u32,
    container_id: ContainerId,
    bundle: Option<PathBuf>,
    pid: Option<i32>,
    pid_start_time: Option<u64>,
    #[serde(default)]
    boot_id: Option<String>,
    #[serde(default)]
    pid_namespace: Option<u64>,
    phase: Phase,
    #[allow(dead_code)]
    mappings: IgnoredAny,
    #[allow(dead_code)]
    addresses: IgnoredAny,
    rules: Places,
    #[serde(default)]
    netns: Option<NetnsId>,
    #[serde(default)]
    pod: Option<String>,
    #[serde(default)]
    shares: Vec<Holder>,
    #[serde(default)]
    shared_by: Vec<ContainerId>,
    #[serde(default)]
    cni: Option<CniAttachment>,
}

/// A `shares` entry's holder (its mappings skipped).
#[derive(Deserialize)]
struct Holder {
    holder: ContainerId,
}

/// A rule record's place (its chain and arguments skipped).
#[derive(Deserialize)]
struct Place {
    backend: Backend,
    family: Family,
    table: String,
}

/// The rules array, one record at a time.
#[derive(Default)]
struct Places {
    places: Vec<(Backend, Family, String)>,
    count: usize,
}

impl<'de> Deserialize<'de> for Places {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Each;
        impl<'de> Visitor<'de> for Each {
            type Value = Places;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of rule records")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Places, A::Error> {
                let mut out = Places::default();
                while let Some(p) = seq.next_element::<Place>()? {
                    out.count += 1;
                    let place = (p.backend, p.family, p.table);
                    if !out.places.contains(&place) {
                        out.places.push(place);
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Each)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::tests::sample;

    #[test]
    fn a_summary_is_the_manifest_without_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = sample();
        m.shared_by = vec!["c9".parse().unwrap()];
        let path = dir.path().join("c1.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
        let s = summarize(&path).unwrap();
        assert_eq!(s.rules, m.rules.len());
        assert_eq!(s.bytes, std::fs::metadata(&path).unwrap().len());
        let mut places: Vec<(Backend, Family, String)> = Vec::new();
        for r in &m.rules {
            let p = (r.backend, r.family, r.table_name().to_string());
            if !places.contains(&p) {
                places.push(p);
            }
        }
        assert_eq!(s.places, places);
        let mut expected = m.clone();
        expected.mappings.clear();
        expected.addresses.clear();
        expected.rules.clear();
        assert_eq!(s.manifest, expected);
    }

    #[test]
    fn a_broken_or_foreign_manifest_is_not_summarized() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c1.json");
        let json = serde_json::to_string(&sample()).unwrap();
        std::fs::write(&path, &json[..json.len() / 2]).unwrap();
        assert!(matches!(summarize(&path), Err(LedgerError::Corrupt { .. })));
        std::fs::write(&path, json.replace("\"schema\":1", "\"schema\":2")).unwrap();
        assert!(matches!(summarize(&path), Err(LedgerError::Schema { .. })));
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(summarize(&link).is_err());
    }
}

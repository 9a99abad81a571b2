//! The ledger: one manifest per container recording exactly the rules natledger wrote.
//!
//! On-disk layout (the state directory, `/run/natledger` by default; tmpfs, so a reboot
//! empties it exactly when the kernel forgets the rules):
//!
//! ```text
//! /run/natledger/
//! ├── natledger-state           the marker: natledger made or adopted this directory (`owner`)
//! ├── lock                      flock(2) target; every change to rules or manifests holds it
//! ├── forwards.json             other owners' iptables-nft forwards, valid for one nf_tables
//! │                             generation (the forwards analysis' cache; read and written
//! │                             under the lock, never synced, safe to delete)
//! ├── native-forwards.json      other owners' native nftables forwards, per port, kept the
//! │                             same way (`analysis::forwards`' nftables cache)
//! └── containers/
//!     ├── <container-id>.json   manifest, schema 1 (see `Manifest`)
//!     └── .<container-id>.tmp   a manifest being written; renamed over the real one
//! ```
//!
//! Write-ahead: a manifest naming every rule natledger is about to write is durable (temp
//! file, fsync, rename, fsync of the directory) before the first rule is applied, and is
//! rewritten after. So a crash at any point leaves a manifest naming every rule that might
//! exist, and poststop or sweep can remove them without regenerating anything from config.
//!
//! natledger acts only in a directory that is its own (`owner`): one it created or adopted
//! empty (the marker), or exactly an older release's layout; any other existing directory (a
//! typo: `/etc`, `/run`, a shared CNI directory) is refused before anything is changed or read
//! as a manifest.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use fs2::FileExt;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use serde::{Deserialize, Serialize};

use crate::kernel::machine::Host;
use crate::kernel::netns_id::NetnsId;
use crate::kernel::safefile;
use crate::model::oci::ContainerId;
use crate::model::portspec::PortMapping;
use crate::state::durable;
use crate::state::liveness::{self, Recorded};
use owner::{MARKER, Ownership};

pub mod owner;

mod record;
pub use record::{Entry, RuleRecord};

mod summary;
mod try_lock;
pub use summary::{FileId, Summary, summarize};

pub const SCHEMA: u32 = 1;

/// A ledger operation that failed, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("manifest {} is not valid", path.display())]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("manifest {} has schema {found}, this natledger reads schema {SCHEMA}", path.display())]
    Schema { path: PathBuf, found: u32 },
    #[error(
        "refusing state directory {}: {why}; natledger uses only a directory it created \
         (marked by its {MARKER} file), an empty one, or an older natledger release's \
         (lock, forwards.json, containers/ of manifests), and changed nothing here \
         (check --state-dir, NATLEDGER_STATE_DIR or the CNI stateDir)",
        path.display()
    )]
    NotOurs { path: PathBuf, why: owner::Foreign },
    #[error(
        "manifest {} records container {found}, not the container its file is named after; \
         natledger does not act on it (sweep keeps the rules of both)", path.display()
    )]
    Mismatch { path: PathBuf, found: ContainerId },
    /// [`Ledger::lock_existing`]: only what records (create, CNI ADD) creates the directory.
    #[error("state directory {} does not exist", dir.display())]
    Missing { dir: PathBuf },
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LedgerError + 'a {
    move |source| LedgerError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Where a manifest's rules stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Written ahead: the rules may or may not exist yet.
    Installing,
    /// Every rule was applied.
    Installed,
    /// Removal ran but some rules could not be deleted; they may still exist.
    Removing,
}

/// A container's manifest (schema 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: u32,
    pub container_id: ContainerId,
    pub bundle: Option<PathBuf>,
    /// Host pid of the container's process at create-runtime.
    pub pid: Option<i32>,
    /// Start time of `pid` (clock ticks after boot, /proc/PID/stat field 22): a live pid with
    /// another start time is a reused pid, so the container is dead.
    pub pid_start_time: Option<u64>,
    /// The boot `pid` (or a CNI attachment's `netns`) was recorded in
    /// (`/proc/sys/kernel/random/boot_id`), for state directories that survive a reboot.
    /// Absent in manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The pid namespace `pid` is a pid of (inode of `/proc/self/ns/pid` of the hook): a
    /// natledger in another pid namespace cannot judge it, and keeps it. Absent in older
    /// manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace: Option<u64>,
    pub phase: Phase,
    /// The mappings this container's own rules implement (not those it shares).
    pub mappings: Vec<PortMapping>,
    /// Container address per family the rules forward to.
    pub addresses: Vec<IpAddr>,
    pub rules: Vec<RuleRecord>,
    /// The network namespace `pid` was in at create-runtime. Absent in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<NetnsId>,
    /// The pod (its sandbox's id) the container's CRI annotations name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Mappings this container uses through the rules of another container in its network
    /// namespace (`state::sharing`): the truth about who needs whose rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Shared>,
    /// The containers that joined this one's rules: a hint for its poststop, which loads only
    /// these manifests to find a live sharer (each is checked against its `shares`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_by: Vec<ContainerId>,
    /// Live holders of its host ports in other network namespaces whose rules this
    /// container's went in front of at create (`ops::Held::Stack`): they wait behind it, and
    /// serve again once it goes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacked_on: Vec<ContainerId>,
    /// Set when the container is a CNI attachment (added by the CNI plugin): its manifest is named by
    /// the attachment's ledger id, and has no pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniAttachment>,
}

/// A CNI attachment as ADD saw it: what DEL, CHECK, GC and sweep need to find it again and
/// judge it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniAttachment {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The network's `name`.
    pub network: String,
    /// `CNI_NETNS`; the namespace's identity is the manifest's `netns`.
    pub netns_path: Option<PathBuf>,
    /// DEL ran, and the manifest stays only because live containers of the attachment's
    /// network namespace share its rules (`state::sharing`): the attachment is gone, and the
    /// last of them to stop removes the rules.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

impl std::fmt::Display for CniAttachment {
    /// As `list`, `sweep` and doctor show it: `cni net=podman ifname=eth0 container=ID`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cni net={} ifname={} container={}",
            word(&self.network),
            word(&self.ifname),
            word(&self.container_id)
        )
    }
}

/// A recorded value as one word: as it is when plain (what ADD validated it to be), quoted
/// and cut ([`crate::model::echo::Echo`]) otherwise.
fn word(value: &str) -> String {
    let plain = !value.is_empty()
        && value.len() <= crate::model::echo::SHOWN
        && value.bytes().all(|b| b.is_ascii_graphic() && b != b'"');
    if plain {
        value.to_string()
    } else {
        crate::model::echo::Echo::from(value).to_string()
    }
}

/// Mappings a container uses through `holder`'s rules, which are tagged with `holder`'s id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shared {
    pub holder: ContainerId,
    pub mappings: Vec<PortMapping>,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    dir: PathBuf,
}

/// Proof that the caller holds the ledger lock; every mutation needs one.
///
/// The lock serialises every natledger process on the host (hooks, sweep). It prevents:
/// two hooks both seeing the shared chains absent and both creating them (the second
/// `:CHAIN` declaration would flush the first container's rules); two containers both
/// passing the host-port claim check for the same port; a removal reading the rules while
/// another hook inserts, and so deleting or missing a rule; and a manifest being read
/// while it is replaced. Released when dropped, or when the process and every child it
/// started have exited (a killed hook never wedges the host, and its unfinished
/// iptables-restore cannot commit after another natledger has read the tables).
pub struct Locked<'a> {
    ledger: &'a Ledger,
    _file: File,
}

impl Manifest {
    /// Whether the container's process still runs, or for a CNI attachment its network
    /// namespace is still the one at its recorded path (see [`liveness::is_alive`]); an
    /// attachment whose DEL ran is gone. The one judgement sweep, create's claims, `list` and
    /// doctor use. A hook container's manifest without a pid (written by a release that
    /// accepted a create without one) is dead: nothing could ever show it gone, and it would
    /// hold its ports forever.
    pub fn alive(&self, host: &dyn Host) -> bool {
        if self.cni.as_ref().is_some_and(|c| c.deleted) {
            return false;
        }
        if self.cni.is_none() && self.pid.is_none_or(|p| p <= 0) {
            return false;
        }
        liveness::is_alive(host, self.recorded())
    }

    /// The process (or, for a CNI attachment, the namespace path) this manifest records, for
    /// [`liveness`] to judge.
    pub fn recorded(&self) -> Recorded<'_> {
        Recorded {
            pid: self.pid,
            start_time: self.pid_start_time,
            boot_id: self.boot_id.as_deref(),
            pid_namespace: self.pid_namespace,
            netns: self
                .cni
                .as_ref()
                .and_then(|c| c.netns_path.as_deref())
                .zip(self.netns),
        }
    }
}

impl Manifest {
    /// What started the container, for people: `pid 1234` (`pid -` when none was recorded),
    /// or a CNI attachment's network, interface and container id ([`CniAttachment`]).
    pub fn origin(&self) -> String {
        match (&self.cni, self.pid) {
            (Some(cni), _) => cni.to_string(),
            (None, Some(pid)) => format!("pid {pid}"),
            (None, None) => "pid -".to_string(),
        }
    }
}

impl Ledger {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Ledger { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn containers(&self) -> PathBuf {
        self.dir.join("containers")
    }

    /// A file of the state directory beside the manifests (see the layout above).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn manifest_path(&self, id: &ContainerId) -> PathBuf {
        self.containers().join(format!("{id}.json"))
    }

    /// Whether a manifest exists, without the lock and without reading it. A file of that name
    /// in a directory that is not natledger's (`owner`) counts too: the caller goes on to
    /// [`Self::lock`] or [`Self::load`], which refuse the directory and say why.
    pub fn has_manifest(&self, id: &ContainerId) -> bool {
        self.manifest_path(id).exists()
    }

    /// Create the state directory if needed (0700; the directory it is created in checked
    /// too), check it and its containers directory as sshd's `StrictModes` would
    /// ([`safefile::check_dir`]), refuse one that is not natledger's (`owner`: nothing is
    /// changed in it), mark one it adopts, and take the lock, waiting for it.
    pub fn lock(&self) -> Result<Locked<'_>, LedgerError> {
        if let Err(LedgerError::Missing { .. }) = self.exists() {
            if let Some(parent) = self.dir.parent().filter(|p| p.exists()) {
                safefile::check_dir(parent, true)
                    .map_err(io("create the state directory in", parent))?;
            }
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(io("create", &self.dir))?;
        }
        self.lock_existing()
    }

    /// [`Self::lock`], but never creating the state directory: [`LedgerError::Missing`] when
    /// there is none. For sweep and watch, which record nothing: a mistyped `--state-dir` must
    /// not become an empty ledger whose every tagged rule looks like an orphan.
    pub fn lock_existing(&self) -> Result<Locked<'_>, LedgerError> {
        self.exists()?;
        // Checked and judged before anything is created in it.
        self.check_dirs()?;
        match owner::judge(&self.dir)? {
            Ownership::Marked => {}
            Ownership::Empty => self.mark()?,
            Ownership::Older => {
                self.tighten()?;
                self.mark()?;
            }
            Ownership::Absent => {
                let gone = std::io::ErrorKind::NotFound.into();
                return Err(io("use state directory", &self.dir)(gone));
            }
        }
        let containers = self.containers();
        match fs::DirBuilder::new().mode(0o700).create(&containers) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(io("create", &containers)(e));
            }
            _ => {}
        }
        self.check_dirs()?;
        let path = self.dir.join("lock");
        // Not through a symlink, not a FIFO (that would block every hook at open).
        let file = safefile::open_lock(&path).map_err(io("open", &path))?;
        file.lock_exclusive().map_err(io("lock", &path))?;
        // Children inherit the locked file: an iptables-restore still running when natledger
        // is killed keeps the lock until it exits (flock follows the open file description),
        // so no other natledger can read the tables while that transaction may still commit.
        fcntl(file.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))
            .map_err(|e| io("set FD_CLOEXEC off on", &path)(e.into()))?;
        Ok(Locked {
            ledger: self,
            _file: file,
        })
    }

    /// Whether the state directory exists (as anything: [`Self::lock_existing`] judges it).
    pub fn exists(&self) -> Result<(), LedgerError> {
        match fs::symlink_metadata(&self.dir) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(LedgerError::Missing {
                dir: self.dir.clone(),
            }),
            Err(e) => Err(io("use state directory", &self.dir)(e)),
        }
    }

    /// Write natledger's marker: the directory is natledger's from now on.
    fn mark(&self) -> Result<(), LedgerError> {
        owner::mark(&self.dir).map_err(io("write", &self.dir.join(MARKER)))
    }

    /// Bring a state directory an older release created 0755 (and its containers directory)
    /// to 0700, as natledger creates them now: [`Self::check_dirs`] accepted them (owned by
    /// natledger's user, writable by no one else), so this only stops others reading them.
    /// Only for an older release's exact layout (`owner`), never a directory natledger adopted
    /// empty or did not make.
    fn tighten(&self) -> Result<(), LedgerError> {
        for dir in [self.dir.clone(), self.containers()] {
            let mode = fs::symlink_metadata(&dir)
                .map_err(io("use state directory", &dir))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                fs::set_permissions(&dir, fs::Permissions::from_mode(mode & 0o7700))
                    .map_err(io("chmod go-rwx", &dir))?;
            }
        }
        Ok(())
    }

    /// Refuse a state directory (or its containers directory, when they exist) that someone
    /// else owns or can write: a planted manifest could name anyone's rules.
    fn check_dirs(&self) -> Result<(), LedgerError> {
        match safefile::check_ancestors(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other.map_err(io("use state directory under", &self.dir))?,
        }
        for dir in [self.dir.clone(), self.containers()] {
            match safefile::check_dir(&dir, false) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other.map_err(io("use state directory", &dir))?,
            }
        }
        Ok(())
    }

    /// What the read-only entries check before reading: [`Self::check_dirs`], and that the
    /// directory is natledger's (`owner`; an older release's is read as it is, not adopted).
    pub fn readable(&self) -> Result<(), LedgerError> {
        self.check_dirs()?;
        owner::judge(&self.dir).map(drop)
    }

    /// Read one manifest; `None` if there is none. A manifest recording another container than
    /// its file name says is an error ([`LedgerError::Mismatch`]).
    pub fn load(&self, id: &ContainerId) -> Result<Option<Manifest>, LedgerError> {
        self.readable()?;
        let path = self.manifest_path(id);
        match read_manifest(&path)? {
            Some(m) if m.container_id != *id => Err(LedgerError::Mismatch {
                path,
                found: m.container_id,
            }),
            m => Ok(m),
        }
    }

    /// Every manifest, sorted by container id; unreadable ones as errors.
    pub fn list(&self) -> Result<Vec<Result<Manifest, LedgerError>>, LedgerError> {
        Ok(self
            .scan()?
            .manifests
            .into_iter()
            .map(|m| m.manifest)
            .collect())
    }

    /// Everything in the containers directory: manifests (sorted by file name), read or not,
    /// and temp files left by a crash between writing and renaming.
    pub fn scan(&self) -> Result<Scan, LedgerError> {
        self.readable()?;
        let dir = self.containers();
        let mut scan = Scan::default();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(scan),
            Err(e) => return Err(io("read", &dir)(e)),
        };
        let mut found = BTreeMap::new();
        for entry in entries {
            let path = entry.map_err(io("read", &dir))?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') {
                if name.ends_with(".tmp") {
                    scan.temps.push(path);
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let manifest = read_manifest(&path).and_then(|m| {
                m.ok_or_else(|| io("read", &path)(std::io::ErrorKind::NotFound.into()))
            });
            found.insert(
                path.clone(),
                Scanned {
                    id: stem.parse().ok(),
                    path,
                    manifest,
                },
            );
        }
        scan.manifests = found.into_values().collect();
        Ok(scan)
    }
}

/// The containers directory as [`Ledger::scan`] found it.
#[derive(Debug, Default)]
pub struct Scan {
    pub manifests: Vec<Scanned>,
    pub temps: Vec<PathBuf>,
}

/// One `<id>.json`.
#[derive(Debug)]
pub struct Scanned {
    pub path: PathBuf,
    /// The id its file name gives (`None`: not a valid container id).
    pub id: Option<ContainerId>,
    pub manifest: Result<Manifest, LedgerError>,
}

impl Locked<'_> {
    /// Durably replace the manifest: temp file, fsync, rename, fsync of the directory.
    pub fn store(&self, manifest: &Manifest) -> Result<(), LedgerError> {
        let dir = self.ledger.containers();
        let path = self.ledger.manifest_path(&manifest.container_id);
        let tmp = dir.join(format!(".{}.tmp", manifest.container_id));
        let mut json = serde_json::to_vec_pretty(manifest).expect("manifest serialises");
        json.push(b'\n');
        durable::replace(&path, &tmp, &json, 0o600).map_err(LedgerError::from)
    }

    /// Remove a manifest; absent is fine.
    pub fn remove(&self, id: &ContainerId) -> Result<(), LedgerError> {
        let path = self.ledger.manifest_path(id);
        self.remove_files(&[path])
            .into_iter()
            .next()
            .map_or(Ok(()), Err)
    }

    /// Remove files of the containers directory (manifests, temp files), then fsync the
    /// directory once; absent is fine. Returns what failed.
    pub fn remove_files(&self, paths: &[PathBuf]) -> Vec<LedgerError> {
        let dir = self.ledger.containers();
        let mut errors = Vec::new();
        let mut removed = false;
        for path in paths {
            if path.parent() != Some(dir.as_path()) {
                errors.push(io("remove", path)(std::io::ErrorKind::InvalidInput.into()));
                continue;
            }
            match fs::remove_file(path) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => errors.push(io("remove", path)(e)),
            }
        }
        if removed && let Err(e) = sync_dir(&dir) {
            errors.push(e);
        }
        errors
    }
}

fn sync_dir(dir: &Path) -> Result<(), LedgerError> {
    durable::sync_dir(dir).map_err(LedgerError::from)
}

impl From<durable::Failure> for LedgerError {
    fn from(f: durable::Failure) -> Self {
        LedgerError::Io {
            action: f.action,
            path: f.path,
            source: f.source,
        }
    }
}

fn read_manifest(path: &Path) -> Result<Option<Manifest>, LedgerError> {
    let bytes = match safefile::read(path, safefile::Links::Refuse, safefile::Cap::State) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read", path)(e)),
    };
    #[derive(Deserialize)]
    struct Version {
        schema: u32,
    }
    let corrupt = |source| LedgerError::Corrupt {
        path: path.to_path_buf(),
        source,
    };
    let version: Version = serde_json::from_slice(&bytes).map_err(corrupt)?;
    if version.schema != SCHEMA {
        return Err(LedgerError::Schema {
            path: path.to_path_buf(),
            found: version.schema,
        });
    }
    serde_json::from_slice(&bytes).map(Some).map_err(corrupt)
}

#[cfg(test)]
pub(crate) mod tests;

//! `natledger install-cni`: natledger put in portmap's place on a host, as a DaemonSet's init
//! container does it (Calico's and Cilium's install-cni are the model). The binary goes into
//! the CNI bin dir ([`binary`]), then every conflist libcni would load that chains portmap has
//! that plugin's `type` switched to `natledger`, in place ([`conflist`]), after a backup of the
//! file as it was ([`BACKUP`], a name libcni does not load). `--uninstall` switches back, in the
//! current file, removes the backup, and removes the binary if install-cni wrote it and the
//! ledger records no CNI attachment (their DEL now goes to portmap, so only `natledger sweep`
//! run from that binary removes their rules once they are gone). Every file is written
//! atomically; a second run changes nothing.

use std::fs;
use std::path::{Path, PathBuf};

use crate::entry::cni::{netconf, spec};
use crate::state::durable;
use crate::state::ledger::{Ledger, LedgerError};

pub mod binary;
pub mod conflist;
mod spans;
#[cfg(test)]
mod tests;

pub use binary::Binary;
use conflist::{Malformed, Plan};

/// The backup's suffix: `10-containerd-net.conflist.natledger-backup` (libcni loads only
/// `.conf`, `.conflist` and `.json`).
pub const BACKUP: &str = ".natledger-backup";
/// The type natledger replaces.
pub const PORTMAP: &str = "portmap";
/// The largest conflist read.
const CAP: u64 = 1 << 20;

/// `install-cni`'s options.
#[derive(Clone, Debug)]
pub struct Options {
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    pub uninstall: bool,
    /// The binary to install: `/proc/self/exe`.
    pub source: PathBuf,
}

/// A failure, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: refused, left unchanged", path.display())]
    Malformed { path: PathBuf, source: Malformed },
    #[error("{}: larger than {CAP} bytes, left unchanged", path.display())]
    TooLarge { path: PathBuf },
    /// A conflist that cannot be read (stat or read failed): left unchanged.
    #[error("{}: cannot be read, left unchanged", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl InstallError {
    /// Whether the error concerns one conflist that could not be read as one (libcni could not
    /// load it either, so it breaks no pod natledger could fix): warned about, left alone, and
    /// the run goes on. Every other error (a write) fails the run.
    pub fn is_unreadable_file(&self) -> bool {
        matches!(
            self,
            InstallError::Malformed { .. }
                | InstallError::TooLarge { .. }
                | InstallError::Unreadable { .. }
        )
    }
}

/// What happened to one conflist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflist {
    Switched {
        count: usize,
    },
    AlreadyNatledger,
    NoPortmap,
    NotAList,
    /// A symlink: its target is someone else's to edit.
    Link,
    /// portmap kept: natledger would refuse this configuration.
    Refused {
        plugin: usize,
        why: String,
    },
    Both,
    /// Several plugins of the type to switch: left alone (natledger runs once per attachment).
    Several {
        count: usize,
    },
    /// A Multus configuration: its delegates are not switched; `portmap` says whether one
    /// chains portmap.
    Delegates {
        portmap: bool,
    },
    SwitchedBack {
        count: usize,
    },
    /// `type: natledger` without install-cni's backup: an operator's own configuration.
    NotSwitchedHere,
    NoNatledger,
    /// Switched back by someone else since: only the backup removed.
    StaleBackup,
}

/// One line of the report: a file and what became of it.
#[derive(Debug, PartialEq, Eq)]
pub enum Done {
    Binary(PathBuf, Binary),
    Conflist(PathBuf, Conflist),
}

impl Done {
    /// Whether the line is a warning: something was left as it was that the operator may
    /// need to look at.
    pub fn warning(&self) -> bool {
        matches!(
            self,
            Done::Binary(_, Binary::NotOurs(_) | Binary::Kept(_))
                | Done::Conflist(
                    _,
                    Conflist::Link
                        | Conflist::Refused { .. }
                        | Conflist::Both
                        | Conflist::Several { .. }
                        | Conflist::Delegates { portmap: true }
                )
        )
    }

    /// Whether a file changed.
    pub fn changed(&self) -> bool {
        matches!(
            self,
            Done::Binary(_, Binary::Installed | Binary::Removed)
                | Done::Conflist(
                    _,
                    Conflist::Switched { .. }
                        | Conflist::SwitchedBack { .. }
                        | Conflist::StaleBackup
                )
        )
    }
}

impl std::fmt::Display for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Done::Binary(path, done) => {
                write!(f, "{}: ", path.display())?;
                match done {
                    Binary::Installed => write!(f, "installed"),
                    Binary::Unchanged => write!(f, "already this binary, unchanged"),
                    Binary::NotOurs(what) => write!(f, "{what}, left alone"),
                    Binary::Removed => write!(f, "removed"),
                    Binary::Kept(why) => write!(f, "kept: {why}"),
                    Binary::Absent => write!(f, "not there"),
                }
            }
            Done::Conflist(path, done) => {
                write!(f, "{}: ", path.display())?;
                match done {
                    Conflist::Switched { count } => write!(
                        f,
                        "portmap switched to natledger ({count} plugin{}), original kept as {}",
                        if *count == 1 { "" } else { "s" },
                        backup(path).display()
                    ),
                    Conflist::AlreadyNatledger => write!(f, "already natledger, unchanged"),
                    Conflist::NoPortmap => write!(f, "no portmap plugin, unchanged"),
                    Conflist::NotAList => write!(f, "one plugin, not a chain, unchanged"),
                    Conflist::Link => write!(f, "a symlink, left alone (switch its target)"),
                    Conflist::Refused { plugin, why } => write!(
                        f,
                        "left on portmap: plugin {plugin}'s configuration is one natledger \
                         refuses ({why}); switching it would break its pods"
                    ),
                    Conflist::Both => {
                        write!(f, "chains both portmap and natledger, left alone")
                    }
                    Conflist::Several { count } => write!(
                        f,
                        "chains {count} portmap (or natledger) plugins, left alone: natledger \
                         records one attachment per pod interface, so two in one chain would \
                         collide"
                    ),
                    Conflist::Delegates { portmap } => write!(
                        f,
                        "Multus configuration, its delegates{} are not switched (the \
                         conflists it delegates to in this directory are), unchanged",
                        if *portmap {
                            " (one chains portmap)"
                        } else {
                            ""
                        }
                    ),
                    Conflist::SwitchedBack { count } => write!(
                        f,
                        "natledger switched back to portmap ({count} plugin{}), backup removed",
                        if *count == 1 { "" } else { "s" }
                    ),
                    Conflist::NotSwitchedHere => write!(
                        f,
                        "natledger without install-cni's backup (configured by hand), left alone"
                    ),
                    Conflist::NoNatledger => write!(f, "no natledger plugin, unchanged"),
                    Conflist::StaleBackup => {
                        write!(f, "no natledger plugin, unchanged; stale backup removed")
                    }
                }
            }
        }
    }
}

/// What `install-cni` did: one line per file, and the conflists it could not read (each a
/// warning: left unchanged, the run still succeeds).
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<Done>,
    pub refused: Vec<InstallError>,
}

impl Report {
    pub fn changed(&self) -> bool {
        self.lines.iter().any(Done::changed)
    }
}

/// Install (or with `uninstall`, uninstall) natledger as the CNI plugin in portmap's place.
/// `ledger` is asked, on uninstall, whether CNI attachments are recorded.
pub fn run(opts: &Options, ledger: &Ledger) -> Result<Report, InstallError> {
    // One run at a time on a host (two pods' init containers, a rerun during a rollout): the
    // temp names are fixed, so a crash's leftover is replaced by the next run.
    let _lock = binary::lock(&opts.bin_dir)?;
    let mut report = Report::default();
    let conflists = conflists(&opts.conf_dir)?;
    let plugin = binary::path(&opts.bin_dir);
    if !opts.uninstall {
        // The state directory made (natledger's own, marked): every attachment through the
        // switched conflists records there, and an uninstall that finds none knows it was not
        // given the node's. Not mounted (a read-only root), it is made by the first ADD.
        if let Err(e) = ledger.lock() {
            log::warn!(
                "state directory not prepared (the first ADD makes it): {}",
                crate::causes::Causes(&e)
            );
        }
        // The plugin first: a conflist must never name a plugin the bin dir lacks.
        let done = binary::install(&opts.bin_dir, &opts.source)?;
        report.lines.push(Done::Binary(plugin.clone(), done));
    }
    for path in conflists {
        let done = if opts.uninstall {
            switch_back(&path)
        } else {
            switch(&path)
        };
        match done {
            Ok(done) => report.lines.push(Done::Conflist(path, done)),
            Err(e) if e.is_unreadable_file() => report.refused.push(e),
            Err(e) => return Err(e),
        }
    }
    if opts.uninstall {
        let keep = still_named(&self::conflists(&opts.conf_dir)?).or_else(|| keep_for(ledger));
        let done = binary::uninstall(&opts.bin_dir, keep)?;
        report.lines.push(Done::Binary(plugin, done));
    }
    Ok(report)
}

/// Why the binary must stay: a conflist libcni loads still names natledger (left by hand,
/// without its backup, chaining both, or a link to one), so its pods' ADD would fail.
fn still_named(conflists: &[PathBuf]) -> Option<String> {
    let named: Vec<String> = conflists
        .iter()
        .filter(|path| {
            // Followed: libcni reads a symlinked conflist's target.
            fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() <= CAP)
                && fs::read_to_string(path).is_ok_and(|text| conflist::names(&text, binary::PLUGIN))
        })
        .map(|path| path.display().to_string())
        .collect();
    (!named.is_empty()).then(|| {
        format!(
            "{} still name natledger: their pods' ADD would find no plugin; switch them to \
             portmap, then run install-cni --uninstall again",
            named.join(", ")
        )
    })
}

/// Why the binary must stay: the ledger records CNI attachments, cannot be read, or is missing.
/// install-cni creates the state directory, and every ADD through natledger records there: a
/// missing one is not the node's (a Job without `/run/natledger` mounted), so whether pods
/// still need the plugin cannot be told.
fn keep_for(ledger: &Ledger) -> Option<String> {
    if let Err(LedgerError::Missing { .. }) = ledger.exists() {
        return Some(format!(
            "the state directory {dir} does not exist, so whether pods still need the plugin \
             cannot be told: run install-cni --uninstall where the node's /run/natledger is \
             mounted (or pass --state-dir); if {dir} really is this node's (nothing recorded \
             since boot), `mkdir {dir}` and run it again",
            dir = ledger.dir().display()
        ));
    }
    let then = "their rules stay until those pods are gone and `natledger sweep` runs on this \
                host; run install-cni --uninstall again after that";
    match ledger.scan() {
        Ok(scan) => {
            let recorded = scan
                .manifests
                .iter()
                .filter(|m| m.manifest.as_ref().map_or(true, |m| m.cni.is_some()))
                .count();
            (recorded > 0).then(|| {
                format!(
                    "{} records {recorded} CNI attachment(s) (or unreadable manifests): {then}",
                    ledger.dir().display()
                )
            })
        }
        Err(e) => Some(format!(
            "{} cannot be read ({}): {then}",
            ledger.dir().display(),
            crate::causes::Causes(&e)
        )),
    }
}

/// The files of `dir` libcni would load (`.conf`, `.conflist`, `.json`), by name.
fn conflists(dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let err = |action| {
        move |source| InstallError::Io {
            action,
            path: dir.to_path_buf(),
            source,
        }
    };
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(err("read directory"))? {
        let path = entry.map_err(err("read directory"))?.path();
        let loaded = path
            .extension()
            .is_some_and(|e| e == "conf" || e == "conflist" || e == "json");
        if loaded {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// `FILE.natledger-backup`.
pub fn backup(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(BACKUP);
    PathBuf::from(name)
}

/// A temp file beside `path` that libcni does not load.
fn temp(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.natledger-tmp"))
}

/// The text of a conflist and its mode; `None` for a symlink or what is not a regular file.
fn read(path: &Path) -> Result<Option<(String, u32)>, InstallError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| InstallError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::symlink_metadata(path).map_err(io)?;
    if !meta.file_type().is_file() {
        return Ok(None);
    }
    if meta.len() > CAP {
        return Err(InstallError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let bytes = fs::read(path).map_err(io)?;
    let text = String::from_utf8(bytes).map_err(|e| InstallError::Malformed {
        path: path.to_path_buf(),
        source: Malformed::Json(serde::de::Error::custom(e)),
    })?;
    Ok(Some((text, meta.permissions().mode() & 0o7777)))
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), InstallError> {
    durable::replace(path, &temp(path), text.as_bytes(), mode).map_err(|f| InstallError::Io {
        action: f.action,
        path: f.path,
        source: f.source,
    })
}

fn is_list(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "conflist")
}

fn plan(
    path: &Path,
    text: &str,
    from: &str,
    to: &str,
    install: bool,
) -> Result<Plan, InstallError> {
    // The list's cniVersion is every plugin's (libcni puts it in each): one natledger does not
    // implement (absent is 0.1.0) would fail every ADD through the list.
    let version = install
        .then(|| serde_json::from_str::<serde_json::Value>(text).ok())
        .flatten()
        .and_then(|top| spec::version_of(&top).err())
        .map(|e| e.details);
    let judge = |plugin: &serde_json::Value| {
        install
            .then(|| {
                version
                    .clone()
                    .or_else(|| netconf::refused_as_portmap(plugin).map(|e| e.details))
            })
            .flatten()
    };
    conflist::switch(text, is_list(path), from, to, judge).map_err(|source| {
        InstallError::Malformed {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// portmap to natledger in one conflist, the backup written first.
fn switch(path: &Path) -> Result<Conflist, InstallError> {
    let Some((text, mode)) = read(path)? else {
        return Ok(Conflist::Link);
    };
    Ok(match plan(path, &text, PORTMAP, binary::PLUGIN, true)? {
        Plan::NotAList => Conflist::NotAList,
        Plan::Absent { to: true } => Conflist::AlreadyNatledger,
        Plan::Absent { to: false } => Conflist::NoPortmap,
        Plan::Both => Conflist::Both,
        Plan::Several { count } => Conflist::Several { count },
        Plan::Delegates { from } => Conflist::Delegates { portmap: from },
        Plan::Refused { plugin, why } => Conflist::Refused { plugin, why },
        Plan::Switch { text: new, count } => {
            write(&backup(path), &text, mode)?;
            write(path, &new, mode)?;
            Conflist::Switched { count }
        }
    })
}

/// natledger back to portmap in one conflist install-cni switched (it has a backup): the
/// backup's bytes again when nothing else changed since, else the current file with only
/// those types changed. Then the backup goes.
fn switch_back(path: &Path) -> Result<Conflist, InstallError> {
    let Some((text, mode)) = read(path)? else {
        return Ok(Conflist::Link);
    };
    let saved = backup(path);
    let original = match read(&saved) {
        Ok(original) => original,
        Err(InstallError::Unreadable { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        Err(e) => return Err(e),
    };
    let done = match plan(path, &text, binary::PLUGIN, PORTMAP, false)? {
        Plan::Switch { text: new, count } => {
            let Some((original, _)) = original else {
                return Ok(Conflist::NotSwitchedHere);
            };
            // What install-cni wrote from the backup, untouched since: the backup's own bytes.
            let untouched = matches!(
                plan(&saved, &original, PORTMAP, binary::PLUGIN, false),
                Ok(Plan::Switch { text: switched, .. }) if switched == text
            );
            write(path, if untouched { &original } else { &new }, mode)?;
            Conflist::SwitchedBack { count }
        }
        Plan::NotAList => return Ok(Conflist::NotAList),
        Plan::Both => return Ok(Conflist::Both),
        Plan::Several { count } => return Ok(Conflist::Several { count }),
        Plan::Delegates { .. } => return Ok(Conflist::Delegates { portmap: false }),
        Plan::Absent { .. } | Plan::Refused { .. } if original.is_some() => Conflist::StaleBackup,
        Plan::Absent { .. } | Plan::Refused { .. } => return Ok(Conflist::NoNatledger),
    };
    match fs::remove_file(&saved) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(InstallError::Io {
            action: "remove",
            path: saved,
            source: e,
        }),
        _ => Ok(done),
    }
}

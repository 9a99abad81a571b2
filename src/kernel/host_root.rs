//! `NATLEDGER_HOST_ROOT`: the host's root directory, when natledger runs from an image that has
//! no tools of its own (the DaemonSet mounts the host's `/` at `/host`). The tools natledger
//! runs are looked for under it ([`exists`], [`read_link`]: the host's absolute symlinks, such
//! as `/usr/sbin/iptables -> /etc/alternatives/iptables`, followed inside it) and run chrooted
//! into it (`super::exec::SystemRunner`). Set once at start (`entry::settings`); unset, every
//! path is this process's own.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

/// An existing directory, by absolute path: the root the host's tools are found and run in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoot {
    dir: PathBuf,
}

/// A host root that cannot be used, naming it.
#[derive(Debug, thiserror::Error)]
pub enum HostRootError {
    #[error("host root {}: not an absolute path", dir.display())]
    Relative { dir: PathBuf },
    #[error("host root {}", dir.display())]
    Unusable { dir: PathBuf, source: io::Error },
    #[error("host root {}: not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
}

/// Symlinks followed in one lookup at most (the kernel's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

impl HostRoot {
    /// `dir`, when it is an absolute path to a directory (through symlinks).
    pub fn new(dir: impl Into<PathBuf>) -> Result<HostRoot, HostRootError> {
        let dir = dir.into();
        if !dir.is_absolute() {
            return Err(HostRootError::Relative { dir });
        }
        match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(HostRoot { dir }),
            Ok(_) => Err(HostRootError::NotADirectory { dir }),
            Err(source) => Err(HostRootError::Unusable { dir, source }),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `path` (as the host names it, from its `/`) is from this process, its symlinks
    /// followed inside the root as the host's kernel would follow them (an absolute target
    /// starts again at the root, `..` never leaves it); `None` when nothing is there.
    pub fn resolve(&self, path: &Path) -> Option<PathBuf> {
        let mut pending: Vec<OsString> = Vec::new();
        push_front(&mut pending, path);
        let mut inner: Vec<OsString> = Vec::new();
        let mut links = 0;
        while let Some(part) = pending.pop() {
            if part == ".." {
                inner.pop();
                continue;
            }
            inner.push(part);
            let outer = self.outer(&inner);
            let meta = std::fs::symlink_metadata(&outer).ok()?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_LINKS {
                    return None;
                }
                let target = std::fs::read_link(&outer).ok()?;
                inner.pop();
                if target.is_absolute() {
                    inner.clear();
                }
                push_front(&mut pending, &target);
            }
        }
        Some(self.outer(&inner))
    }

    /// The target of the symlink at `path` (as the host names it): its directory resolved
    /// inside the root ([`Self::resolve`]), the link itself read, not followed.
    pub fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        let not_found = || io::Error::from(io::ErrorKind::NotFound);
        let (parent, name) = (path.parent(), path.file_name());
        let (Some(parent), Some(name)) = (parent, name) else {
            return Err(not_found());
        };
        let dir = self.resolve(parent).ok_or_else(not_found)?;
        std::fs::read_link(dir.join(name))
    }

    fn outer(&self, inner: &[OsString]) -> PathBuf {
        let mut outer = self.dir.clone();
        outer.extend(inner);
        outer
    }
}

impl std::fmt::Display for HostRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.dir.display())
    }
}

/// `path`'s parts put in front of `pending` (a stack: the next part is last), `.` dropped.
fn push_front(pending: &mut Vec<OsString>, path: &Path) {
    let parts = path.components().filter_map(|c| match c {
        Component::Normal(name) => Some(name.to_os_string()),
        Component::ParentDir => Some(OsString::from("..")),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    });
    let parts: Vec<OsString> = parts.collect();
    pending.extend(parts.into_iter().rev());
}

static ROOT: OnceLock<HostRoot> = OnceLock::new();

/// The process's host root, set once at start (`entry::settings`); a later call changes
/// nothing.
pub fn set(root: HostRoot) {
    let _ = ROOT.set(root);
}

/// The host root [`set`] set, if any.
pub fn get() -> Option<&'static HostRoot> {
    ROOT.get()
}

/// Where the host's paths are looked up: under a host root, or (`None`) in this process's
/// own root.
#[derive(Clone, Copy, Debug)]
pub struct Lookup<'a>(pub Option<&'a HostRoot>);

impl Lookup<'static> {
    /// Under the process's host root ([`get`]), if one is set.
    pub fn process() -> Lookup<'static> {
        Lookup(get())
    }
}

impl Lookup<'_> {
    /// Whether something is at the host's `path` (following symlinks).
    pub fn exists(self, path: &Path) -> bool {
        match self.0 {
            Some(root) => root.resolve(path).is_some(),
            None => path.exists(),
        }
    }

    /// The target of the host's symlink at `path`.
    pub fn read_link(self, path: &Path) -> io::Result<PathBuf> {
        match self.0 {
            Some(root) => root.read_link(path),
            None => std::fs::read_link(path),
        }
    }
}

/// Whether something is at the host's `path` (following symlinks), under the host root when
/// one is set.
pub fn exists(path: &Path) -> bool {
    Lookup::process().exists(path)
}

/// For messages about where a tool was looked for: ` under host root DIR`, or nothing.
pub fn under() -> String {
    get().map_or_else(String::new, |root| format!(" under host root {root}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A host laid out as Debian's: `/usr/sbin/iptables -> /etc/alternatives/iptables ->
    /// /usr/sbin/iptables-nft -> xtables-nft-multi`, and merged /usr's `/sbin -> usr/sbin`.
    fn debian() -> tempfile::TempDir {
        let host = tempfile::tempdir().unwrap();
        let at = |p: &str| host.path().join(p);
        std::fs::create_dir_all(at("usr/sbin")).unwrap();
        std::fs::create_dir_all(at("etc/alternatives")).unwrap();
        std::fs::write(at("usr/sbin/xtables-nft-multi"), "").unwrap();
        symlink("xtables-nft-multi", at("usr/sbin/iptables-nft")).unwrap();
        symlink("/usr/sbin/iptables-nft", at("etc/alternatives/iptables")).unwrap();
        symlink("/etc/alternatives/iptables", at("usr/sbin/iptables")).unwrap();
        symlink("usr/sbin", at("sbin")).unwrap();
        symlink("/nowhere", at("usr/sbin/dangling")).unwrap();
        symlink("../../../../../etc", at("usr/sbin/up")).unwrap();
        host
    }

    #[test]
    fn absolute_links_are_followed_inside_the_root() {
        let host = debian();
        let root = HostRoot::new(host.path()).unwrap();
        let multi = host.path().join("usr/sbin/xtables-nft-multi");
        assert_eq!(
            root.resolve(Path::new("/usr/sbin/iptables")),
            Some(multi.clone())
        );
        assert_eq!(root.resolve(Path::new("/sbin/iptables")), Some(multi));
        assert_eq!(root.resolve(Path::new("/usr/sbin/dangling")), None);
        assert_eq!(root.resolve(Path::new("/usr/sbin/absent")), None);
        // `..` stops at the root, as it does at `/`.
        assert_eq!(
            root.resolve(Path::new("/usr/sbin/up/alternatives")),
            Some(host.path().join("etc/alternatives"))
        );
        assert_eq!(
            root.read_link(Path::new("/sbin/iptables")).unwrap(),
            PathBuf::from("/etc/alternatives/iptables")
        );
    }

    #[test]
    fn a_loop_of_links_is_nothing() {
        let host = tempfile::tempdir().unwrap();
        symlink("/b", host.path().join("a")).unwrap();
        symlink("/a", host.path().join("b")).unwrap();
        let root = HostRoot::new(host.path()).unwrap();
        assert_eq!(root.resolve(Path::new("/a")), None);
    }

    #[test]
    fn a_root_that_is_no_directory_is_refused_by_name() {
        let host = tempfile::tempdir().unwrap();
        let missing = host.path().join("missing");
        let e = HostRoot::new(&missing).unwrap_err();
        assert_eq!(e.to_string(), format!("host root {}", missing.display()));
        assert!(matches!(e, HostRootError::Unusable { .. }));
        let file = host.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            HostRoot::new(&file),
            Err(HostRootError::NotADirectory { .. })
        ));
        assert!(matches!(
            HostRoot::new("host"),
            Err(HostRootError::Relative { .. })
        ));
    }
}

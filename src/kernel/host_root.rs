//! `NATLEDGER_HOST_ROOT`: the host's root directory, when natledger runs from an image that has
//! no tools of its own (the DaemonSet mounts the host's `/` at `/host`). The tools natledger
//! runs are looked for under it ([`Lookup`]: the host's absolute symlinks, such as
//! `/usr/sbin/iptables -> /etc/alternatives/iptables`, followed inside it) and run chrooted
//! into it (`super::exec::SystemRunner`). Resolved once at start (`entry::settings`) and
//! passed: to the runner (whose [`Lookup`] finds its tools), to the host seam
//! (`super::machine::Machine`, which reads CNI namespace paths under it) and to backend
//! detection. No root (`None`): every path is this process's own.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

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
        self.resolve_io(path).ok()
    }

    /// [`Self::resolve`], with why nothing is found: the error of the part that could not be
    /// read (`NotFound` when it is not there), `ELOOP` past [`MAX_LINKS`].
    pub fn resolve_io(&self, path: &Path) -> io::Result<PathBuf> {
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
            let meta = std::fs::symlink_metadata(&outer)?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = std::fs::read_link(&outer)?;
                inner.pop();
                if target.is_absolute() {
                    inner.clear();
                }
                push_front(&mut pending, &target);
            }
        }
        Ok(self.outer(&inner))
    }

    /// Where the host's file `path` is from this process, whether or not it exists yet (the
    /// iptables lock, which its first user creates): its directory resolved inside the root;
    /// `None` when that directory is not there.
    pub fn file(&self, path: &Path) -> Option<PathBuf> {
        let (parent, name) = (path.parent()?, path.file_name()?);
        Some(self.resolve(parent)?.join(name))
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

/// Where the host's paths are looked up: under a host root, or (`None`) in this process's
/// own root.
#[derive(Clone, Copy, Debug)]
pub struct Lookup<'a>(pub Option<&'a HostRoot>);

impl Lookup<'_> {
    /// Whether something is at the host's `path` (following symlinks).
    pub fn exists(self, path: &Path) -> bool {
        match self.0 {
            Some(root) => root.resolve(path).is_some(),
            None => path.exists(),
        }
    }

    /// Where the host's `path` is from this process: resolved under the host root (or why
    /// it cannot be: `NotFound` when it is not there), or `path` itself without one.
    pub fn at(self, path: &Path) -> io::Result<PathBuf> {
        match self.0 {
            Some(root) => root.resolve_io(path),
            None => Ok(path.to_path_buf()),
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

/// For messages about where a tool was looked for: ` under host root DIR`, or nothing.
pub fn under(root: Option<&HostRoot>) -> String {
    root.map_or_else(String::new, |root| format!(" under host root {root}"))
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

    /// A runtime's namespace path (`/var/run/netns/NAME`, `/var/run -> /run` as on Debian) is
    /// read under the root; one that is not there stays so, never a file outside the root.
    #[test]
    fn a_host_path_is_found_under_the_root() {
        let host = debian();
        let at = |p: &str| host.path().join(p);
        std::fs::create_dir_all(at("run/netns")).unwrap();
        std::fs::create_dir_all(at("var")).unwrap();
        symlink("/run", at("var/run")).unwrap();
        std::fs::write(at("run/netns/cni-1"), "").unwrap();
        let root = HostRoot::new(host.path()).unwrap();
        let lookup = Lookup(Some(&root));
        let found = lookup.at(Path::new("/var/run/netns/cni-1")).unwrap();
        assert_eq!(found, at("run/netns/cni-1"));
        let kind = |p: &str| lookup.at(Path::new(p)).unwrap_err().kind();
        assert_eq!(kind("/var/run/netns/cni-2"), std::io::ErrorKind::NotFound);
        assert_eq!(kind("/usr/sbin/dangling"), std::io::ErrorKind::NotFound);
        assert_eq!(
            Lookup(None).at(Path::new("/run/netns/x")).unwrap(),
            Path::new("/run/netns/x")
        );
    }

    /// The iptables lock under the root: in the host's `/run` (through `/var/run -> /run`),
    /// there or not yet; none when the directory is not there.
    #[test]
    fn a_host_file_is_in_its_directory_under_the_root() {
        let host = debian();
        let at = |p: &str| host.path().join(p);
        std::fs::create_dir_all(at("run")).unwrap();
        std::fs::create_dir_all(at("var")).unwrap();
        symlink("/run", at("var/run")).unwrap();
        let root = HostRoot::new(host.path()).unwrap();
        let lock = at("run/xtables.lock");
        assert_eq!(
            root.file(Path::new("/run/xtables.lock")),
            Some(lock.clone())
        );
        assert_eq!(root.file(Path::new("/var/run/xtables.lock")), Some(lock));
        assert_eq!(root.file(Path::new("/nowhere/xtables.lock")), None);
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

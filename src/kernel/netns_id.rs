//! A network namespace's identity (the device and inode of its nsfs file), as manifests
//! record it, and the judgement of what a recorded namespace path names now.

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A network namespace: the device and inode of its nsfs file. Unique among the namespaces
/// that exist at one moment; an inode may be reused once its namespace is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl NetnsId {
    /// The network namespace `pid` is in now (`None` when it cannot be read).
    pub fn of_pid(pid: i32) -> Option<NetnsId> {
        NetnsId::of_path(&proc_netns(pid))
    }

    /// The network namespace a path names: `/proc/PID/ns/net`, or a bind mount of one
    /// (`/run/netns/NAME`, a CNI runtime's `CNI_NETNS`). `None` when it cannot be read.
    pub fn of_path(path: &Path) -> Option<NetnsId> {
        NetnsId::at(path).ok()
    }

    /// What reading `path` gives: the namespace it names, or why it could not be read.
    pub fn at(path: &Path) -> std::io::Result<NetnsId> {
        let meta = std::fs::metadata(path)?;
        Ok(NetnsId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Whether a recorded namespace path (a CNI attachment's `CNI_NETNS`) still names this
    /// namespace, the one it named when recorded, given what reading the path gave `now`
    /// (the host seam's `Host::netns_at`). The one judgement of a recorded namespace
    /// path: both liveness and membership (`state::sharing`) read it.
    pub fn still_at(self, now: std::io::Result<NetnsId>) -> NetnsAtPath {
        match now {
            Ok(now) if now == self => NetnsAtPath::Same,
            // A namespace file again (nsfs: this one's device) of another inode: the name was
            // reused.
            Ok(now) if now.dev == self.dev => NetnsAtPath::Gone,
            // Not a namespace file from here: a mount namespace that does not see the
            // runtime's bind mount shows the empty file under it.
            Ok(_) => NetnsAtPath::Unknown,
            // ENOTDIR: a directory on the path is now something else.
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                NetnsAtPath::Gone
            }
            Err(_) => NetnsAtPath::Unknown,
        }
    }
}

/// `/proc/PID/ns/net`: the namespace file of a process's network namespace.
pub fn proc_netns(pid: i32) -> std::path::PathBuf {
    format!("/proc/{pid}/ns/net").into()
}

/// What a recorded network namespace path names now ([`NetnsId::still_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetnsAtPath {
    /// The recorded namespace.
    Same,
    /// Positive evidence that the recorded namespace is not there: the path is gone
    /// (`ENOENT`, `ENOTDIR`) or is a namespace file (the recorded device) of another inode.
    Gone,
    /// Cannot judge: unreadable for another reason (`EACCES`, `ELOOP`, ...), or a file that
    /// is no namespace file from here (another device).
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_path_is_judged_same_gone_or_unknown() {
        let a = NetnsId { dev: 4, ino: 100 };
        let b = NetnsId { dev: 4, ino: 200 };
        let plain = NetnsId { dev: 9, ino: 100 };
        let err = |kind| Err(std::io::Error::from(kind));
        assert_eq!(a.still_at(Ok(a)), NetnsAtPath::Same);
        assert_eq!(a.still_at(Ok(b)), NetnsAtPath::Gone, "another namespace");
        assert_eq!(a.still_at(Ok(plain)), NetnsAtPath::Unknown, "no nsfs file");
        assert_eq!(a.still_at(err(ErrorKind::NotFound)), NetnsAtPath::Gone);
        assert_eq!(a.still_at(err(ErrorKind::NotADirectory)), NetnsAtPath::Gone);
        assert_eq!(
            a.still_at(err(ErrorKind::PermissionDenied)),
            NetnsAtPath::Unknown
        );
    }
}

//! A network namespace's identity (the device and inode of its nsfs file, and its cookie where
//! the kernel gives one), as manifests record it, and the judgement of what a recorded
//! namespace path names now.

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A network namespace: the device and inode of its nsfs file, and its cookie when it was
/// read. The device and inode are unique among the namespaces that exist at one moment, but
/// the inode is reused once its namespace is gone (`ip netns del X; ip netns add X` often
/// gives the new one the old inode within a second); the cookie never is, within a boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
    /// `SO_NETNS_COOKIE` of a socket made in the namespace (`kernel::netns_cookie`). Absent
    /// when not read (a plain `stat`), on a kernel before 5.14, and in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<NetnsCookie>,
}

/// A network namespace's cookie: a number the kernel gives each network namespace when it is
/// made and never gives another within a boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NetnsCookie(pub u64);

impl NetnsId {
    /// What a `stat` of `path` (`/proc/PID/ns/net`, or a bind mount of one: `/run/netns/NAME`,
    /// a CNI runtime's `CNI_NETNS`) gives: the namespace's device and inode (no cookie:
    /// `kernel::netns_cookie` reads those), or why it could not be read. The operations read
    /// it through the host seam (`Host::netns_at`).
    pub fn at(path: &Path) -> std::io::Result<NetnsId> {
        let meta = std::fs::metadata(path)?;
        Ok(NetnsId::of_file(&meta))
    }

    /// The namespace whose nsfs file has this metadata (no cookie).
    pub fn of_file(meta: &std::fs::Metadata) -> NetnsId {
        NetnsId {
            dev: meta.dev(),
            ino: meta.ino(),
            cookie: None,
        }
    }

    /// Whether `other` is the same nsfs file (device and inode), whatever the cookies.
    pub fn same_file(self, other: NetnsId) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }

    /// Whether `other` names this namespace: the same nsfs file, and the same cookie where
    /// both have one (an inode reused by a newer namespace has another cookie).
    pub fn same(self, other: NetnsId) -> bool {
        let cookies_differ = matches!((self.cookie, other.cookie), (Some(a), Some(b)) if a != b);
        self.same_file(other) && !cookies_differ
    }

    /// Whether a recorded namespace path (a CNI attachment's `CNI_NETNS`) still names this
    /// namespace, the one it named when recorded, given what reading the path gave `now`
    /// (the host seam's `Host::netns_at`, or `Host::netns_with_cookie` when this one has a
    /// cookie and the device and inode match). The one judgement of a recorded namespace
    /// path: both liveness and membership (`state::sharing`) read it. The same device and
    /// inode is the same namespace unless both cookies are known and differ; without a cookie
    /// on either side (an older manifest, a kernel before 5.14) device and inode decide.
    pub fn still_at(self, now: std::io::Result<NetnsId>) -> NetnsAtPath {
        match now {
            Ok(now) if self.same(now) => NetnsAtPath::Same,
            // A namespace file again (nsfs: this one's device) of another inode, or of this
            // inode and another cookie: the name was reused.
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
    /// (`ENOENT`, `ENOTDIR`) or is a namespace file (the recorded device) of another inode, or
    /// of the recorded inode with another cookie.
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
        let id = |dev, ino| NetnsId {
            dev,
            ino,
            cookie: None,
        };
        let (a, b, plain) = (id(4, 100), id(4, 200), id(9, 100));
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

    /// With a recorded cookie, the same device and inode is the same namespace only with the
    /// same cookie (or none read now); without one, device and inode decide as before.
    #[test]
    fn a_reused_inode_with_another_cookie_is_gone() {
        let with = |cookie: Option<u64>| NetnsId {
            dev: 4,
            ino: 100,
            cookie: cookie.map(NetnsCookie),
        };
        let recorded = with(Some(7));
        assert_eq!(recorded.still_at(Ok(with(Some(7)))), NetnsAtPath::Same);
        assert_eq!(
            recorded.still_at(Ok(with(Some(8)))),
            NetnsAtPath::Gone,
            "the inode was reused"
        );
        assert_eq!(
            recorded.still_at(Ok(with(None))),
            NetnsAtPath::Same,
            "no cookie now: device and inode decide"
        );
        let old = with(None);
        assert_eq!(
            old.still_at(Ok(with(Some(8)))),
            NetnsAtPath::Same,
            "older manifest"
        );
        let other_inode = NetnsId {
            ino: 200,
            ..recorded
        };
        assert_eq!(recorded.still_at(Ok(other_inode)), NetnsAtPath::Gone);
        assert!(recorded.same(old) && old.same(recorded) && !recorded.same(with(Some(8))));
    }
}

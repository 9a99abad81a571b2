//! Processes that may write iptables-legacy tables without `/run/xtables.lock`.
//!
//! The kernel has no "open table" handle: an iptables-legacy writer (libiptc) opens a raw
//! socket, `socket(AF_INET[6], SOCK_RAW, IPPROTO_RAW)`, reads the whole table with
//! `getsockopt(IPT_SO_GET_ENTRIES)` and replaces it whole with
//! `setsockopt(IPT_SO_SET_REPLACE)`. Two writers that do not serialise on the xtables lock
//! lose each other's changes (the later replace wins). What the kernel does show:
//!
//! - `{net}/raw`, `{net}/raw6`: the raw sockets of this network namespace (the namespace the
//!   tables belong to); an `IPPROTO_RAW` one has local "port" 255 (`…:00FF`), its inode is
//!   column 10;
//! - `{proc}/PID/fd/*` → `socket:[INODE]`: who holds it;
//! - `{proc}/locks`: who holds the flock on the lock file (`FLOCK … PID MAJ:MIN:INODE`).
//!
//! A holder of such a socket none of whose processes holds the lock is what [`unlocked`]
//! returns. It is a hint, not proof: other programs send hand-made IP packets over
//! `IPPROTO_RAW` sockets too, and `iptables-legacy-save` reads without the lock (harmlessly).

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{Roots, entries};

/// A process holding an `IPPROTO_RAW` socket of this network namespace without the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawHolder {
    pub pid: i32,
    pub comm: Option<String>,
    /// `raw` or `raw6`.
    pub socket: &'static str,
}

/// The inodes of `IPPROTO_RAW` sockets listed in a `/proc/net/raw` or `raw6` text.
pub fn ipproto_raw_inodes(text: &str) -> Vec<u64> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let port = cols.get(1)?.rsplit(':').next()?;
            let inode = cols.get(9)?.parse().ok()?;
            (u16::from_str_radix(port, 16).ok()? == libc::IPPROTO_RAW as u16).then_some(inode)
        })
        .collect()
}

/// The pids holding a flock on the file `dev`/`ino`, from a `/proc/locks` text (waiters, the
/// `->` lines, do not hold it).
pub fn lock_holders(text: &str, dev: u64, ino: u64) -> HashSet<i32> {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t)
    );
    text.lines()
        .filter(|l| !l.contains("->"))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.get(1) == Some(&"FLOCK") && cols.get(5) == Some(&want.as_str()))
                .then(|| cols.get(4)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The processes other than this one that hold an `IPPROTO_RAW` socket of this network
/// namespace while none of the processes holding that socket holds the xtables lock.
pub fn unlocked(roots: &Roots) -> Vec<RawHolder> {
    let mut sockets: BTreeMap<u64, &'static str> = BTreeMap::new();
    for name in ["raw", "raw6"] {
        if let Ok(text) = std::fs::read_to_string(roots.net.join(name)) {
            for inode in ipproto_raw_inodes(&text) {
                sockets.insert(inode, name);
            }
        }
    }
    if sockets.is_empty() {
        return Vec::new();
    }
    let holders = match std::fs::metadata(&roots.xtables_lock) {
        Ok(meta) => std::fs::read_to_string(roots.proc.join("locks"))
            .map(|text| lock_holders(&text, meta.dev(), meta.ino()))
            .unwrap_or_default(),
        Err(_) => HashSet::new(),
    };
    let me = std::process::id() as i32;
    let mut by_socket: BTreeMap<u64, Vec<RawHolder>> = BTreeMap::new();
    let mut pids: Vec<i32> = entries(&roots.proc)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid| *pid != me)
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let dir = roots.proc.join(pid.to_string());
        for inode in socket_inodes(&dir.join("fd")) {
            if let Some(socket) = sockets.get(&inode) {
                let comm = std::fs::read_to_string(dir.join("comm"));
                let holder = RawHolder {
                    pid,
                    comm: comm.ok().map(|c| c.trim().to_string()),
                    socket,
                };
                let list = by_socket.entry(inode).or_default();
                if !list.contains(&holder) {
                    list.push(holder);
                }
            }
        }
    }
    by_socket
        .into_values()
        .filter(|list| !list.iter().any(|h| holders.contains(&h.pid)))
        .flatten()
        .collect()
}

/// The socket inodes among a process's fds.
fn socket_inodes(fd_dir: &Path) -> Vec<u64> {
    entries(fd_dir)
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_sockets_and_locks_are_read() {
        let raw = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                   \x20 255: 00000000:00FF 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 424242 2 0000000000000000 0\n\
                   \x20   1: 00000000:0001 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 111 2 0000000000000000 0\n";
        assert_eq!(ipproto_raw_inodes(raw), [424242]);
        let locks = "1: FLOCK  ADVISORY  WRITE 5471 fe:00:9805825 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 12310 fe:00:9805825 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 77 fe:00:9805825 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 99 fe:00:1 0 EOF\n";
        let dev = libc::makedev(0xfe, 0) as u64;
        assert_eq!(lock_holders(locks, dev, 9805825), HashSet::from([5471]));
    }
}

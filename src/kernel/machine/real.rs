//! [`Machine`]: the host seam read from this machine.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

use super::{Host, Process};
use crate::kernel::host::{self, Listener, Roots};
use crate::kernel::host_root::{HostRoot, Lookup};
use crate::kernel::netns::{self, NetnsError};
use crate::kernel::netns_cookie;
use crate::kernel::netns_id::NetnsId;
use crate::kernel::procfs;
use crate::model::family::IfAddr;

/// This machine, as seen from the calling thread: with a host root, the namespace paths
/// runtimes name are read under it (`on_host`).
#[derive(Clone, Debug, Default)]
pub struct Machine {
    root: Option<HostRoot>,
}

impl Machine {
    /// This machine, its runtimes' paths read under `root` (`None`: this process's own).
    pub fn in_root(root: Option<HostRoot>) -> Machine {
        Machine { root }
    }
}

impl Host for Machine {
    fn boot_id(&self) -> Option<String> {
        procfs::boot_id()
    }

    fn pid_namespace(&self) -> Option<u64> {
        procfs::pid_namespace()
    }

    fn process(&self, pid: i32) -> Process {
        if pid <= 0 || kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH) {
            return Process::Gone;
        }
        match procfs::stat(pid) {
            None => Process::Hidden,
            Some((state, start_time)) => Process::Seen {
                start_time,
                zombie: state == "Z",
            },
        }
    }

    fn check_procfs(&self) -> std::io::Result<()> {
        procfs::check_readable()
    }

    fn netns_at(&self, path: &Path) -> std::io::Result<NetnsId> {
        NetnsId::at(&on_host(self.root.as_ref(), path)?)
    }

    fn netns_with_cookie(&self, path: &Path) -> std::io::Result<NetnsId> {
        netns_cookie::read(&on_host(self.root.as_ref(), path)?)
    }

    fn netns_with_cookies(&self, paths: &[&Path]) -> Vec<std::io::Result<NetnsId>> {
        let found: Vec<std::io::Result<PathBuf>> = paths
            .iter()
            .map(|p| on_host(self.root.as_ref(), p))
            .collect();
        let readable: Vec<&Path> = found.iter().flatten().map(PathBuf::as_path).collect();
        let mut read = netns_cookie::read_all(&readable).into_iter();
        found
            .into_iter()
            .map(|f| f.and_then(|_| read.next().expect("an answer per path")))
            .collect()
    }

    fn container_addresses(&self, pid: i32) -> Result<Vec<IfAddr>, NetnsError> {
        netns::container_addresses(pid)
    }

    fn listeners(&self, keep: &dyn Fn(&Listener) -> bool) -> Vec<Listener> {
        host::listeners_where(&Roots::default(), keep)
    }

    fn enable_route_localnet(&self, dest: Ipv4Addr) -> Result<Option<String>, NetnsError> {
        netns::enable_route_localnet(dest)
    }
}

/// A namespace path as a runtime named it (`CNI_NETNS`: `/var/run/netns/cni-…`), read under
/// the machine's host root when it has one: a watch in a container that does not see the runtime's
/// netns directory would find the path gone and sweep a live pod's forward. Under a root whose
/// mount did not receive a newer bind mount, the path is the empty file under it: not a
/// namespace file, so not judged. `/proc` paths stay this process's (its pid namespace).
fn on_host(root: Option<&HostRoot>, path: &Path) -> std::io::Result<PathBuf> {
    match path.starts_with("/proc") {
        true => Ok(path.to_path_buf()),
        false => Lookup(root).at(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real reader on the one process a test may read: its own.
    #[test]
    fn this_process_is_seen_and_a_free_pid_is_gone() {
        let me = std::process::id() as i32;
        assert!(matches!(
            Machine::default().process(me),
            Process::Seen { zombie: false, .. }
        ));
        assert_eq!(Machine::default().process(i32::MAX), Process::Gone);
        assert_eq!(Machine::default().process(0), Process::Gone);
        assert_eq!(Machine::default().process(-1), Process::Gone);
        assert!(Machine::default().netns_of_pid(me).is_some());
        assert!(Machine::default().check_procfs().is_ok());
    }
}

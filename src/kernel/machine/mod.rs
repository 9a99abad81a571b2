//! The host seam: everything the operations read of the machine they run on (listeners,
//! processes in `/proc`, network namespaces, a container's addresses) and the one host
//! setting create changes (`route_localnet`), behind one trait. The operations reach it
//! through `ops::Context::host`: [`Machine`] in production, a fake filled with the facts a
//! unit test needs (`fake::FakeHost`) in tests, so that no unit test reads this machine.

mod real;

#[cfg(test)]
pub(crate) mod fake;

pub use real::Machine;

use std::net::Ipv4Addr;
use std::path::Path;

use crate::kernel::host::Listener;
use crate::kernel::netns::NetnsError;
use crate::kernel::netns_id::{NetnsId, proc_netns};
use crate::model::family::IfAddr;

/// What `/proc` shows of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// No such process (`kill(pid, 0)` says `ESRCH`; or a pid that is not positive).
    Gone,
    /// It exists, but its stat cannot be read (`hidepid`, or it exited meanwhile).
    Hidden,
    /// Its stat: the start time (clock ticks after boot) and whether it is a zombie.
    Seen { start_time: u64, zombie: bool },
}

impl Process {
    /// The start time, when its stat could be read.
    pub fn start_time(self) -> Option<u64> {
        match self {
            Process::Seen { start_time, .. } => Some(start_time),
            Process::Gone | Process::Hidden => None,
        }
    }
}

/// What the operations read of the host, and the one host setting they change. Every
/// method answers for the calling thread's network and pid namespaces.
pub trait Host {
    /// This boot's id (random per boot), if readable.
    fn boot_id(&self) -> Option<String>;

    /// The pid namespace this process sees pids in (the inode of `/proc/self/ns/pid`).
    fn pid_namespace(&self) -> Option<u64>;

    /// What `/proc` shows of `pid`.
    fn process(&self, pid: i32) -> Process;

    /// Fails unless what judging liveness needs can be read (this process's own stat, the
    /// boot id, its pid namespace): without /proc every container would look dead.
    fn check_procfs(&self) -> std::io::Result<()>;

    /// The network namespace a path names (`/proc/PID/ns/net`, `/run/netns/NAME`), or why
    /// it could not be read: its nsfs file's device and inode (a `stat`; no cookie).
    fn netns_at(&self, path: &Path) -> std::io::Result<NetnsId>;

    /// The network namespace a path names with its cookie where the kernel gives one
    /// (`kernel::netns_cookie`: device, inode and cookie of one open of the path), or why it
    /// could not be read (`EINVAL`: no network namespace file). Costs entering the
    /// namespace, on the one thread that does it for the whole process: asked when recording
    /// a namespace, and when judging one only where device and inode match.
    fn netns_with_cookie(&self, path: &Path) -> std::io::Result<NetnsId>;

    /// [`Host::netns_with_cookie`] of each path, an answer per path in order: for judging
    /// many namespaces at once (`state::liveness::Batched`).
    fn netns_with_cookies(&self, paths: &[&Path]) -> Vec<std::io::Result<NetnsId>> {
        paths.iter().map(|p| self.netns_with_cookie(p)).collect()
    }

    /// The global unicast addresses inside the network namespace of `pid`, in interface
    /// order, with their interfaces' prefix lengths.
    fn container_addresses(&self, pid: i32) -> Result<Vec<IfAddr>, NetnsError>;

    /// The listening sockets `keep` selects, with their owners
    /// ([`crate::kernel::host::listeners_where`]).
    fn listeners(&self, keep: &dyn Fn(&Listener) -> bool) -> Vec<Listener>;

    /// Turn on `route_localnet` on the interface towards `dest`
    /// ([`crate::kernel::netns::enable_route_localnet`]); the interface, when changed.
    fn enable_route_localnet(&self, dest: Ipv4Addr) -> Result<Option<String>, NetnsError>;

    /// The network namespace `pid` is in now (`None` when it cannot be read).
    fn netns_of_pid(&self, pid: i32) -> Option<NetnsId> {
        self.netns_at(&proc_netns(pid)).ok()
    }
}

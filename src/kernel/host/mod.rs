//! Host facts that `natledger doctor` cites as evidence: who listens on which port, which
//! addresses CNI's host-local IPAM has handed out, which containers the runc-style runtimes
//! know and whether they still run, which addresses the host routes, and which container ids
//! rule comments name, and where `route_localnet` is on.
//!
//! Every collector reads below a [`Roots`], so tests point it at a fake tree. Nothing here
//! fails: a missing or unreadable file yields an empty result (doctor says which evidence it
//! had, the caller can ask [`cni_networks_present`] and [`runtime_state_present`]).

mod cni;
mod comments;
mod listeners;
mod routes;
mod runtime;
mod sockdiag;
mod sysctl;
#[cfg(test)]
mod tests;
mod xtables;

pub use cni::*;
pub use comments::*;
pub use listeners::*;
pub use routes::*;
pub use runtime::*;
pub use sysctl::*;
pub use xtables::*;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The entries of `dir`; none if it cannot be read.
fn entries(dir: &Path) -> impl Iterator<Item = std::fs::DirEntry> {
    std::fs::read_dir(dir).into_iter().flatten().flatten()
}

/// Where the collectors look.
#[derive(Clone, Debug)]
pub struct Roots {
    /// procfs: processes (`PID/fd`, `PID/comm`, `PID/stat`). Default `/proc`.
    pub proc: PathBuf,
    /// The network files (`tcp`, `udp`, `route`, `ipv6_route`, `if_inet6`, …). Default
    /// `/proc/thread-self/net`: the calling thread's network namespace (`/proc/net` follows
    /// the thread-group leader's, which differs on a thread that has `setns`ed).
    pub net: PathBuf,
    /// CNI host-local IPAM state, one directory per network. Default `/var/lib/cni/networks`.
    pub cni_networks: PathBuf,
    /// runc-style state roots, holding `<id>/state.json` or, one level deeper,
    /// `<namespace>/<id>/state.json`. Default: `/run/runc` (runc, podman with runc),
    /// `/run/containerd/runc` (containerd's runc shim, per containerd namespace, e.g.
    /// `k8s.io`, `moby`), `/run/docker/runtime-runc` (dockerd, namespace `moby`). crun's
    /// `status` files and podman's storage directories are not read.
    pub runtime_state: Vec<PathBuf>,
    /// The network sysctls (`ipv4/conf/IFACE/route_localnet`, …) of the calling thread's
    /// network namespace. Default `/proc/sys/net`.
    pub sysctl_net: PathBuf,
    /// The host's own addresses. `None`: ask the kernel (`getifaddrs` for IPv4, `{net}/if_inet6`
    /// for IPv6). Tests inject a list.
    pub local_addresses: Option<Vec<IpAddr>>,
    /// The xtables lock iptables users take, whose holders are not reported by
    /// [`unlocked`]. Default [`crate::kernel::iptc::XTABLES_LOCK`]; natledger's own is the
    /// one its settings resolve (`XTABLES_LOCKFILE`, under a host root the host's).
    pub xtables_lock: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc: "/proc".into(),
            net: "/proc/thread-self/net".into(),
            sysctl_net: "/proc/sys/net".into(),
            cni_networks: "/var/lib/cni/networks".into(),
            runtime_state: [
                "/run/runc",
                "/run/containerd/runc",
                "/run/docker/runtime-runc",
            ]
            .map(PathBuf::from)
            .to_vec(),
            local_addresses: None,
            xtables_lock: crate::kernel::iptc::XTABLES_LOCK.into(),
        }
    }
}

//! A listening socket on this host, as a value: what the kernel side reads
//! (`kernel::host::listeners`) and the analysis weighs (a listener a rule hijacks or rejects).

use std::net::IpAddr;

use crate::model::portspec::Protocol;

/// Processes that listen on a port on purpose while a rule forwards it (to reserve it, or to
/// proxy what the rule cannot): their listeners are not hijacked.
pub const PORT_KEEPERS: &[&str] = &[
    "kube-proxy",
    "docker-proxy",
    "rootlessport",
    "conmon",
    "slirp4netns",
    "pasta",
];

/// A listening TCP socket or a bound, unconnected UDP socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub protocol: Protocol,
    /// The bound address; unspecified (`0.0.0.0`, `::`) means every address. An IPv4-mapped
    /// IPv6 address (`::ffff:a.b.c.d`) is given as the IPv4 address. procfs does not show
    /// `IPV6_V6ONLY`: a `::` socket usually receives IPv4 too.
    pub addr: IpAddr,
    pub port: u16,
    /// The socket inode (`socket:[INODE]` in `/proc/PID/fd`).
    pub inode: u64,
    /// The lowest pid holding the socket, if one could be seen (another user's processes may
    /// be unreadable without privileges).
    pub pid: Option<i32>,
    /// That process's `comm` (at most 15 characters, as the kernel keeps it).
    pub command: Option<String>,
}

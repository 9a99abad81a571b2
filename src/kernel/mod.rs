//! Interfaces to the kernel and to other processes: netlink and nf_tables, iptables-legacy's
//! socket options ([`iptc`]), conntrack, network namespaces, `/proc`, helper processes
//! ([`exec`]) and the host facts `doctor` cites ([`host`]). Nothing here decides policy.

pub mod conntrack;
pub mod exec;
pub mod host;
pub mod iptc;
pub mod named_netns;
pub mod netlink;
pub mod netns;
pub mod nftables;
pub mod procfs;

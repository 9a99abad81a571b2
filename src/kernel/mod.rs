//! Interfaces to the kernel and to other processes: netlink and nf_tables, iptables-legacy's
//! socket options ([`iptc`]), the xtables match and target decoders both rule readers share
//! ([`xt`]), conntrack, network namespaces, `/proc`, helper processes ([`exec`]), the one way a
//! path others can reach is opened ([`safefile`]), the host facts `doctor` cites ([`host`])
//! and the host root the tools are found and run in ([`host_root`]); [`machine`] is the seam
//! through which the operations read the host. Nothing here decides policy.

pub mod conntrack;
pub mod dbus;
pub mod exec;
pub mod host;
pub mod host_root;
pub mod iptc;
pub mod machine;
pub mod named_netns;
pub mod netlink;
pub mod netns;
pub mod netns_cookie;
pub mod netns_id;
pub mod nftables;
pub mod procfs;
pub mod safefile;
pub mod xt;

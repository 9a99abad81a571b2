//! natledger: host-port forwards for containers that are removed exactly, whatever fails.
//!
//! See ARCHITECTURE.md for the code map and the invariants. In short:
//! [`oci`] reads hook input, [`portspec`] parses mappings, [`layout`] turns them into typed
//! [`rule`]s, [`backend`] reads and writes iptables through [`exec`] using the [`save`]
//! format (or, in the hooks' steady state, natively: [`iptc`] for iptables-legacy,
//! [`nftables`] over [`netlink`] for iptables-nft deletions), [`ledger`] records what was
//! written, and [`ops`] puts them together.

pub mod backend;
pub mod bundle;
pub mod cli;
pub mod cni;
pub mod conntrack;
pub mod doctor;
pub mod durable;
pub mod echo;
pub mod exec;
pub mod family;
pub mod fault;
pub mod forwards;
pub mod host;
pub mod iptc;
pub mod layout;
pub mod ledger;
pub mod matchset;
pub mod metrics;
pub mod netlink;
pub mod netns;
pub mod nftables;
pub mod oci;
pub mod ops;
pub mod packet;
pub mod portspec;
pub mod procfs;
pub mod rule;
pub mod safefile;
pub mod save;
pub mod selftest;
pub mod sharing;
pub mod wrapper;
pub mod xt;

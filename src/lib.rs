//! natledger: host-port forwards for containers that are removed exactly, whatever fails.
//!
//! The folders are layers; each uses only the ones below it (ARCHITECTURE.md has the code
//! map and the invariants):
//! - [`entry`]: the ways in (command line, CNI plugin, wrapper runtime, selftest, metrics);
//! - [`ops`]: the operations (create, remove, sweep, list), backend-independent: claims, the
//!   ledger lock, write-ahead, rollback, flows and [`fault`] points;
//! - [`backend`]: one driver per backend (iptables-legacy, iptables-nft, natledger's own
//!   nftables tables) that reads and writes rules;
//! - [`analysis`]: reading any owner's rules (doctor, other owners' forwards), never writing;
//! - [`state`]: the ledger of manifests under its lock, and the file primitives;
//! - [`kernel`]: netlink, nf_tables, iptables-legacy's socket options, conntrack,
//!   namespaces, `/proc`, helper processes;
//! - [`model`]: pure values: families, port mappings, typed rules, natledger's chain layout.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod analysis;
pub mod backend;
pub mod causes;
pub mod entry;
pub mod fault;
pub mod kernel;
pub mod model;
pub mod ops;
pub mod state;

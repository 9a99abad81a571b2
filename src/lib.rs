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
pub mod chain;
pub mod entry;
pub mod fault;
pub mod kernel;
pub mod model;
pub mod ops;
pub mod state;

// The paths before the layers had folders; kept while callers move to the layered paths.
pub use analysis::{doctor, forwards, matchset, packet};
pub use entry::{bundle, cli, cni, metrics, selftest, settings, wrapper};
pub use kernel::{conntrack, exec, host, iptc, netlink, netns, nftables, procfs, xt};
pub use model::{capabilities, echo, family, layout, oci, portspec, rule, save, table};
pub use state::{durable, ledger, safefile, sharing};

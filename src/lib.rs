//! natledger: host-port forwards for containers that are removed exactly, whatever fails.
//!
//! See ARCHITECTURE.md for the code map and the invariants. In short:
//! [`oci`] reads hook input, [`portspec`] parses mappings, [`layout`] turns them into typed
//! [`rule`]s, [`backend`] reads and writes iptables through [`exec`] using the [`save`]
//! format (or, in the hooks' steady state, natively: [`iptc`] for iptables-legacy,
//! [`nftables`] over [`netlink`] for iptables-nft deletions), [`ledger`] records what was
//! written, and [`ops`] puts them together.

pub mod analysis;
pub mod backend;
pub mod entry;
pub mod fault;
pub mod kernel;
pub mod model;
pub mod ops;
pub mod state;

// The paths before the layers had folders; kept while callers move to the layered paths.
pub use analysis::{doctor, forwards, matchset, packet, xt};
pub use entry::{bundle, cli, cni, metrics, selftest, wrapper};
pub use kernel::{conntrack, exec, host, iptc, netlink, netns, nftables, procfs};
pub use model::{capabilities, echo, family, layout, oci, portspec, rule, save, table};
pub use state::{durable, ledger, safefile, sharing};

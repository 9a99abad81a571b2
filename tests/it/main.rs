//! natledger's integration tests, one crate: the real binary against the real backends
//! (iptables-legacy, iptables-nft, natledger's own nftables tables), each test in network
//! namespaces it creates and deletes (`tests/common`); the machine's own rules are never
//! changed. Each module is one area; its `//!` header says what it proves, a line per test.
//! Run one area with `cargo test --test it doctor::` (or `doctor::ladders::`, or a test's
//! name). The suites that drive real runtimes and shared daemons are the `runtimes` crate.
//!
//! The harness (`tests/common`, shared with `runtimes`): `topology` (namespaces, bridge,
//! containers, sleepers), `traffic` (TCP/UDP servers and clients, the long-lived
//! `UdpClient`), `dumps` (`*-save` normalisation and `nft list ruleset`'s native tables in
//! every dump, `load_nft`, `NFT_LOOK_ALIKES`: other owners' nftables tables named like
//! natledger's, `delete_recorded_rule`: a manifest's rule deleted behind natledger's back),
//! `node` (the `Node` fixture that runs natledger on a node; `both`: iptables-legacy,
//! iptables-nft and natledger's nftables tables; `iptables_both`: only what iptables has),
//! `cni` and `timed` (CNI calls, timed runs), `libcni` (a CNI runtime running a conflist of
//! real plugins as libcni does), `doctor` (running doctor and reading its
//! report, `garbled`), `localnet` (a neighbour that sends to the node's 127.0.0.1),
//! `conntrack`.
//!
//! Tests of different modules may run at once (on as many threads as the tests of one file
//! had when each file was its own crate): each builds its own namespaces, state directory and
//! xtables lock file, and none writes the machine's own tables or settings.

#[path = "../common/mod.rs"]
mod common;

mod alerts;
mod cni;
mod conflicts;
mod conflicts_native;
mod conntrack;
mod conntrack_kernel;
mod deploy;
mod docs;
mod doctor;
mod doctor_native;
mod forward;
mod hairpin;
mod harness_smoke;
mod hook_files;
mod hooks;
mod host_root;
mod hostile;
mod inject;
mod install_cni;
mod install_cni_cmd;
mod iptc;
mod iptc_edits;
mod lifecycle;
mod localnet;
mod metrics;
mod native_forwards;
mod nft_batch;
mod nft_dumps;
mod nft_ruleset;
mod nftables;
mod readers;
mod readers_skip;
mod release_manifests;
mod repair;
mod roundtrip;
mod selftest;
mod sharing;
mod state_dir;
mod sweep;
mod sweep_all_nft;
mod sweep_interleaved;
mod udp_flows;
mod watch;
mod watch_firewalld;
mod watch_holds;

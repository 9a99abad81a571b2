//! Fault injection for crash-safety tests: `NATLEDGER_FAULT=<point>` makes natledger kill
//! itself with SIGKILL when it reaches that point, as a crash or an OOM kill would.
//!
//! The points sit between the steps whose order the crash-safety invariants depend on
//! (ARCHITECTURE.md): manifest written ahead, each transaction applied, manifest updated.
//! Reading one environment variable once is the whole cost when it is unset.
//!
//! This is the one environment read left in the library (every other setting is resolved in
//! `main`, `natledger::entry::settings`): the points sit deep in the operations, where passing a
//! test-only value through every caller would cost more than it gives.

use std::sync::OnceLock;

use nix::sys::signal::{Signal, raise};

pub const ENV: &str = "NATLEDGER_FAULT";

/// Every point, in the order a create-runtime, a poststop and a sweep reach them.
pub const POINTS: &[&str] = &[
    CREATE_CLAIMS_RELEASED,
    CREATE_WRITTEN_AHEAD,
    CREATE_IPV4_APPLIED,
    CREATE_APPLIED,
    CREATE_RECORDED,
    POSTSTOP_LOCKED,
    POSTSTOP_DELETED,
    SWEEP_JUDGED,
    SWEEP_FIRST_TABLE_APPLIED,
    SWEEP_APPLIED,
];

/// Dead holders' rules removed; this container's manifest not written yet.
pub const CREATE_CLAIMS_RELEASED: &str = "create:claims-released";
/// Manifest written ahead (phase installing); no rule applied yet.
pub const CREATE_WRITTEN_AHEAD: &str = "create:written-ahead";
/// The IPv4 transaction applied; the IPv6 one (if any) not yet.
pub const CREATE_IPV4_APPLIED: &str = "create:ipv4-applied";
/// Every transaction applied; the manifest still says installing.
pub const CREATE_APPLIED: &str = "create:applied";
/// The manifest says installed; route_localnet not set yet.
pub const CREATE_RECORDED: &str = "create:recorded";
/// poststop holds the lock and has read the manifest; nothing deleted yet.
pub const POSTSTOP_LOCKED: &str = "poststop:locked";
/// poststop deleted the rules; the manifest is still there.
pub const POSTSTOP_DELETED: &str = "poststop:deleted";
/// sweep judged every container; no table read yet.
pub const SWEEP_JUDGED: &str = "sweep:judged";
/// sweep applied its first transaction; others and the manifests not yet.
pub const SWEEP_FIRST_TABLE_APPLIED: &str = "sweep:first-table-applied";
/// sweep applied every transaction; dead manifests not removed yet.
pub const SWEEP_APPLIED: &str = "sweep:applied";

/// Die here if `NATLEDGER_FAULT` names this point.
pub fn point(name: &str) {
    // OnceLock kept: the library's one documented environment read, a test-only fault point
    // reached from deep inside operations that no caller should have to thread a value to.
    static WANTED: OnceLock<Option<String>> = OnceLock::new();
    let wanted = WANTED.get_or_init(|| std::env::var(ENV).ok());
    if wanted.as_deref() == Some(name) {
        log::error!("{ENV}={name}: killing myself");
        let _ = raise(Signal::SIGKILL);
    }
}

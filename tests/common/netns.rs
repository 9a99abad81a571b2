//! Named network namespaces entered from a dedicated thread, and listed. They are made,
//! wired and deleted by natledger's own `kernel::named_netns` (the harness `selftest` and
//! the benches use too), which [`super::Topology`] holds.

use std::io;

use natledger::kernel::named_netns;
use natledger::kernel::netns::in_namespace;

use super::ip;

/// Moves the *calling thread* into the named network namespace. Only call this
/// from a thread dedicated to that namespace.
pub(super) fn enter_netns(ns: &str) -> io::Result<()> {
    named_netns::enter(ns).map_err(io::Error::other)
}

/// Runs `f` on a fresh thread that has entered network namespace `ns`, and
/// returns its result (panics in `f` propagate; panics if `ns` can't be entered).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    in_namespace(&named_netns::path(ns), f).unwrap_or_else(|e| panic!("in_netns({ns}): {e}"))
}

pub(super) fn try_in_netns<T: Send>(
    ns: &str,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    in_namespace(&named_netns::path(ns), f).map_err(|e| io::Error::other(e.to_string()))?
}

/// Names of all named network namespaces (`ip netns list`).
pub fn list_netns() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_else(|e| panic!("{e}"))
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

//! Named network namespaces: made, deleted and written to through natledger's own
//! `kernel::named_netns` (the harness `selftest` and the benches use too, with its one lock
//! around `ip netns add/del`), listed, and entered from a dedicated thread.

use std::fs::File;
use std::io;

use natledger::kernel::named_netns;
use natledger::kernel::netns::in_namespace;
use nix::sched::{CloneFlags, setns};

use super::ip;

/// Moves the *calling thread* into the named network namespace. Only call this
/// from a thread dedicated to that namespace.
pub(super) fn enter_netns(ns: &str) -> io::Result<()> {
    let path = named_netns::path(ns);
    let file = File::open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("setns({}): {e}", path.display()),
        )
    })
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

/// `ip netns add NS`.
pub(super) fn create_ns(ns: &str) -> Result<(), String> {
    named_netns::add(ns).map_err(|e| e.to_string())
}

/// Writes sysctls (paths relative to /proc/sys) inside namespace `ns`.
pub(super) fn set_sysctls(ns: &str, settings: &[(&str, &str)]) -> Result<(), String> {
    named_netns::set_sysctls(ns, settings).map_err(|e| format!("{e}: {}", cause(&e)))
}

/// `ip netns del NS`; a failure is a warning.
pub(super) fn delete_ns(ns: &str) {
    if let Err(e) = named_netns::delete(ns) {
        eprintln!("warning: cannot delete network namespace {ns}: {e}");
    }
}

/// The innermost cause of an error.
fn cause(e: &dyn std::error::Error) -> String {
    let mut last = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        last = c.to_string();
        next = c.source();
    }
    last
}

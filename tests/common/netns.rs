//! Named network namespaces: the lock around `ip netns add/del`, listing and deleting them,
//! and entering one from a dedicated thread.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Mutex;
use std::thread;

use nix::sched::{CloneFlags, setns};

use super::{ip, lock};

const NETNS_DIR: &str = "/var/run/netns";
/// Serialises `ip netns add/del` within this process (the first `add` also
/// sets up the /run/netns mount, which is racy).
pub(super) static NETNS_LOCK: Mutex<()> = Mutex::new(());

fn netns_path(ns: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(ns)
}

/// Moves the *calling thread* into the named network namespace. Only call this
/// from a thread dedicated to that namespace.
pub(super) fn enter_netns(ns: &str) -> io::Result<()> {
    let path = netns_path(ns);
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
    thread::scope(|s| {
        let handle = s.spawn(|| {
            enter_netns(ns).unwrap_or_else(|e| panic!("in_netns({ns}): {e}"));
            f()
        });
        handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

pub(super) fn try_in_netns<T: Send>(
    ns: &str,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    thread::scope(|s| {
        let handle = s.spawn(|| {
            enter_netns(ns)?;
            f()
        });
        handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Names of all named network namespaces (`ip netns list`).
pub fn list_netns() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_else(|e| panic!("{e}"))
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Writes sysctls (paths relative to /proc/sys) inside namespace `ns`.
pub(super) fn set_sysctls(ns: &str, settings: &[(&str, &str)]) -> Result<(), String> {
    in_netns(ns, || {
        for (key, value) in settings {
            let path = format!("/proc/sys/{key}");
            std::fs::write(&path, value)
                .map_err(|e| format!("sysctl {path}={value} in {ns}: {e}"))?;
        }
        Ok(())
    })
}

pub(super) fn delete_ns(ns: &str) {
    let _guard = lock(&NETNS_LOCK);
    if let Err(e) = ip(&["netns", "del", ns]) {
        eprintln!("warning: cannot delete network namespace {ns}: {e}");
    }
}

//! The suites that drive real runtimes and shared daemons, one crate: runc, crun, podman
//! (hooks and CNI), dockerd (natledger's wrapper, and beside Docker's own firewall),
//! containerd's CRI (annotations and natledger as a CNI plugin), the .deb package and the
//! systemd units. Each module's `//!` header says what it proves, a line per test. Run one
//! with `cargo test --test runtimes docker::`.
//!
//! They share daemons' directories and machine-wide paths (`/run/containerd`, dpkg's
//! database in the package test's overlay, the runtimes' roots), so two modules never run at
//! once: every test first takes [`one_suite_at_a_time`] with its module's name. Tests of one
//! module may still run together, as they did when each file was its own crate (and cargo
//! ran the crates one after another). `cargo test` runs this crate after `it`, never beside
//! it.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

#[path = "../common/mod.rs"]
mod common;

mod cri;
mod cri_cni;
mod crun;
mod docker;
mod docker_host;
mod package;
mod podman;
mod podman_cni;
mod runc;
mod units;

/// The module whose tests run now, and how many of them.
static RUNNING: Mutex<(Option<&'static str>, usize)> = Mutex::new((None, 0));
/// Signalled when the last test of a module ends.
static IDLE: Condvar = Condvar::new();

fn running() -> MutexGuard<'static, (Option<&'static str>, usize)> {
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held by a test of module `suite` while it runs: waits while a test of another module runs.
#[must_use = "the suite is held only while the guard lives"]
pub struct Suite;

/// Wait until no test of another module runs, then count this test in (`module_path!()`).
pub fn one_suite_at_a_time(suite: &'static str) -> Suite {
    let mut now = running();
    while now.0.is_some_and(|other| other != suite) {
        now = IDLE.wait(now).unwrap_or_else(PoisonError::into_inner);
    }
    *now = (Some(suite), now.1 + 1);
    Suite
}

impl Drop for Suite {
    fn drop(&mut self) {
        let mut now = running();
        now.1 -= 1;
        if now.1 == 0 {
            now.0 = None;
            IDLE.notify_all();
        }
    }
}

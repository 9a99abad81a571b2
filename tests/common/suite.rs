//! One module's tests at a time, for the crates whose modules must not overlap (`runtimes`:
//! shared daemons and machine-wide paths; `timed`: the tests that bound a time): every test
//! first takes [`one_suite_at_a_time`] with its module's name (`module_path!()`). Tests of
//! one module may still run together, as they did when each file was its own crate.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

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

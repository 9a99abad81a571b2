//! `sweep --wait`: give exiting containers time to die before they are judged.

use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::kernel::machine::Host;
use crate::state::ledger::Ledger;

/// With `--wait`, the wait ends early once no recorded process has exited for this long:
/// containers still running by then are kept (Docker's live-restore, containerd shims).
pub const QUIET: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(100);

/// Give containers that are exiting (their runtime was just stopped) up to `limit` to die,
/// polling their recorded pids. Ends when none is left alive, when `limit` passes, or when
/// none has exited for [`QUIET`]. Runs without the lock, so hooks are not held up.
pub fn wait_for_exits(host: &dyn Host, ledger: &Ledger, limit: Duration) {
    let start = Instant::now();
    let mut last_exit = start;
    let mut previous = usize::MAX;
    loop {
        let alive = ledger
            .list()
            .map(|all| {
                all.into_iter()
                    .flatten()
                    .filter(|m| m.pid.is_some() && m.alive(host))
                    .count()
            })
            .unwrap_or(0);
        let now = Instant::now();
        if alive == 0 || now - start >= limit {
            return;
        }
        if alive < previous {
            last_exit = now;
        }
        previous = alive;
        if now - last_exit >= QUIET.min(limit) {
            return;
        }
        sleep(POLL);
    }
}

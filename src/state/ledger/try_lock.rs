//! [`Ledger::try_lock`]: the lock without waiting, for `natledger watch`, whose loop must stay
//! free to read its signals while a hook holds the lock.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;

use fs2::FileExt;

use super::{Ledger, LedgerError, Locked, io};

impl Ledger {
    /// As [`Ledger::lock_existing`] (the directory never created), but `None` at once when
    /// another process holds the lock. The lock is probed first (its file opened to read,
    /// never created, not through a symlink), then taken by [`Ledger::lock_existing`], which
    /// checks the directory as always: one that another takes in the microseconds between is
    /// waited for.
    pub fn try_lock(&self) -> Result<Option<Locked<'_>>, LedgerError> {
        let path = self.dir.join("lock");
        let probe = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
        // No lock file yet, or not a plain file: `lock` creates it or says why.
        if let Some(probe) = probe {
            match probe.try_lock_exclusive() {
                Ok(()) => drop(probe),
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => return Ok(None),
                Err(e) => return Err(io("lock", &path)(e)),
            }
        }
        self.lock_existing().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_lock_gives_up_at_once_while_another_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (a, b) = (Ledger::new(&state), Ledger::new(&state));
        // No state directory yet: never created here (only what records creates it).
        assert!(matches!(b.try_lock(), Err(LedgerError::Missing { .. })));
        assert!(!state.exists());
        let held = a.lock().unwrap();
        let started = std::time::Instant::now();
        assert!(b.try_lock().unwrap().is_none());
        assert!(started.elapsed() < std::time::Duration::from_millis(100));
        drop(held);
        assert!(b.try_lock().unwrap().is_some());
    }
}

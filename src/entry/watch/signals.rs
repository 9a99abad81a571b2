//! SIGTERM, SIGINT and SIGHUP as watch reads them: blocked, with a handler of their own that
//! does nothing (so that as PID 1 of a container they are not dropped), and read from a
//! signalfd polled with the other wake sources ([`super::wake`]). Also the wait for the
//! state directory before the loop, which only they interrupt ([`wait_for_ledger`]).

use std::os::fd::AsFd;
use std::path::Path;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::state::ledger::{Ledger, LedgerError};

use super::WatchError;
use super::http::Served;

/// A signal read: SIGHUP, or one that ends watch (SIGTERM, SIGINT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sig {
    Hangup,
    Stop(Signal),
}

/// SIGTERM, SIGINT and SIGHUP blocked and read from a signalfd, with a handler that does
/// nothing (a process without a handler ignores them as PID 1 of a namespace).
pub fn signals() -> nix::Result<SignalFd> {
    extern "C" fn nothing(_: libc::c_int) {}
    let mut set = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(signal);
        let action = SigAction::new(
            SigHandler::Handler(nothing),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        unsafe { sigaction(signal, &action) }?;
    }
    set.thread_block()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
}

/// The signals pending, in order, up to the first that ends watch (those after it are left).
pub fn read(signals: &SignalFd) -> Result<Vec<Sig>, WatchError> {
    let mut read = Vec::new();
    while let Some(info) = signals.read_signal().map_err(WatchError::ReadSignal)? {
        match Signal::try_from(info.ssi_signo as i32) {
            Ok(Signal::SIGHUP) => read.push(Sig::Hangup),
            Ok(signal) => {
                read.push(Sig::Stop(signal));
                break;
            }
            Err(_) => {}
        }
    }
    Ok(read)
}

/// Until the state directory exists, checked every second, doing nothing else; `false` when
/// SIGTERM or SIGINT came first. A mistyped `--state-dir` is never created, and its empty
/// ledger never judged.
pub fn wait_for_ledger(
    dir: &Path,
    signals: &SignalFd,
    served: Option<&Served>,
) -> Result<bool, WatchError> {
    let ledger = Ledger::new(dir);
    let missing = || matches!(ledger.exists(), Err(LedgerError::Missing { .. }));
    if !missing() {
        return Ok(true);
    }
    log::info!("waiting for state directory {}", dir.display());
    loop {
        if let Some(served) = served {
            served.tick();
        }
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::try_from(1000u64).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(WatchError::Poll(e)),
        }
        if let Some(Sig::Stop(signal)) = read(signals)?.last() {
            log::info!("{signal}: stopping");
            return Ok(false);
        }
        if !missing() {
            log::info!("state directory {} exists", dir.display());
            return Ok(true);
        }
    }
}

//! `natledger watch`: keep the tables equal to the ledger, in both directions, for as long as
//! it runs. A foreground loop that runs `sweep --repair` ([`crate::ops::sweep`], under the
//! ledger lock, as every change) when something may have changed:
//! - an nf_tables commit, anyone's (iptables-nft's tables, natledger's own, a `nft flush
//!   ruleset`): told by the kernel through the `NFNLGRP_NFTABLES` multicast group
//!   ([`Monitor`]); only what touches natledger's tables, its chains or the built-in chains
//!   it jumps from counts, and the generation it announces says whether it was committed
//!   since the last reconcile;
//! - a changed iptables-legacy table, which tells no one: its `IPT_SO_GET_INFO` size and
//!   entry count and a digest of natledger's chains and the jumps into them
//!   ([`iptc::stamp`]), per family, nat and filter, compared every [`LEGACY_EVERY`] (the
//!   digest of a table over [`SMALL`] every [`DEEP_EVERY`]th time only);
//! - firewalld's `Reloaded` signal on the system bus ([`firewalld`]: a subscription made
//!   again with back-off where there is no bus or it dropped; never fatal);
//! - SIGHUP (at once, a back-off hold included), and the backstop period.
//!
//! Between them it sleeps in `poll(2)` on the signalfd, the monitor and the bus: idle costs
//! a wake-up per [`LEGACY_EVERY`]. Reconciles start at least [`GAP`] apart. The state before
//! a reconcile is what the next is compared with, and a reconcile that wrote is followed by
//! one more, so a change made during or right after a reconcile is never missed (a reconcile
//! that finds nothing writes nothing: no loop). SIGTERM and SIGINT end it with status 0 as
//! soon as the reconcile under way ends (the ledger lock is never waited for: while a hook
//! holds it, the reconcile is tried again every [`GAP`], the signals read in between); the
//! signals have a handler of their own (blocked, read from the signalfd), so that as PID 1 of
//! a container they are not dropped. Repairs undone again and again back off ([`backoff`]).
//!
//! It never creates the state directory (only what records does): while it is missing, watch
//! waits for it, checking every second, and touches nothing ([`wait_for_ledger`]). A ledger
//! that records nothing leaves the rules of containers no manifest knows (`sweep::held`).
//!
//! With `--doctor-period`, doctor runs on a thread of its own ([`doctor`]) and tells the loop
//! through a socket polled with the others; the loop logs what changed and publishes the
//! series ([`findings`]). With `--metrics-address`, the loop's every tick is told to the
//! serving thread, whose `/healthz` fails once the loop is silent longer than
//! [`health_bound`].

mod backoff;
mod counters;
mod doctor;
mod findings;
mod firewalld;
mod holds;
mod http;
mod publish;

pub use backoff::Backoff;
pub use counters::Counters;
pub use holds::Holds;

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::backend::{Netfilter, legacy_table_exists};
use crate::chain::Chain;
use crate::entry::settings::Settings;
use crate::kernel::exec::SystemRunner;
use crate::kernel::iptc::{self, Stamp};
use crate::kernel::nftables::monitor::{Events, Monitor};
use crate::model::family::Family;
use crate::model::oci::ContainerId;
use crate::ops::sweep::HeldBack;
use crate::ops::{self, Context, SweepOptions, SweepReport};
use crate::state::ledger::{Ledger, LedgerError};
use doctor::Doctoring;
use findings::Findings;
use firewalld::Firewalld;
use publish::{log_change, publish};

/// How often the iptables-legacy tables are compared.
pub const LEGACY_EVERY: Duration = Duration::from_millis(500);
/// A legacy table up to this size (about 250 rules) has its content (natledger's chains and
/// the jumps into them) read at every check; a larger one at every [`DEEP_EVERY`]th only,
/// its size and entry count in between (measured: reading 10,000 rules twice a second costs
/// 1.8% of a CPU).
pub const SMALL: u32 = 64 * 1024;
/// Every this many checks, the content of every legacy table is read: a restore that swaps
/// same-shaped rules in a large table is seen within 2 s.
pub const DEEP_EVERY: u32 = 4;
/// The backstop: a reconcile at least this often, whatever was told.
pub const PERIOD: Duration = Duration::from_secs(60);
/// Reconciles start at least this far apart: another owner committing to the nat table many
/// times a second (kube-proxy's resyncs) costs at most five reads a second.
pub const GAP: Duration = Duration::from_millis(200);

#[derive(Clone, Debug)]
pub struct Options {
    pub period: Duration,
    /// How often the iptables-legacy tables are compared: [`LEGACY_EVERY`] but in tests.
    pub legacy_every: Duration,
    pub metrics_file: Option<PathBuf>,
    /// Serve the counters as `GET /metrics` here, and `GET /healthz` ([`http`]).
    pub metrics_address: Option<SocketAddr>,
    /// Run doctor this often ([`doctor`]); `None`: never.
    pub doctor_period: Option<Duration>,
}

/// `/healthz` fails once the loop has not ticked for this long. Idle, it ticks every
/// `legacy_every`; a reconcile holds it (under a second for 1,000 containers, up to the
/// xtables lock's 5 s wait on a legacy write): a loop silent for the backstop period and ten
/// legacy checks more (65 s by default) has broken its promise of a reconcile every period.
pub fn health_bound(period: Duration, legacy_every: Duration) -> Duration {
    period + legacy_every * 10
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("setting up SIGTERM, SIGINT and SIGHUP")]
    Signals(#[source] nix::Error),
    #[error("waiting for a change")]
    Poll(#[source] nix::Error),
    #[error("reading the signalfd")]
    ReadSignal(#[source] nix::Error),
    #[error("listening on {address} for metrics requests")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("starting the doctor thread")]
    Doctor(#[source] std::io::Error),
}

/// What made a reconcile due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Start,
    Nftables,
    Legacy,
    Hangup,
    Firewalld,
    Period,
    /// The last reconcile failed.
    Retry,
    /// A container's back-off hold ended: its rules go back now.
    HoldOver,
}

/// Run until SIGTERM or SIGINT.
pub fn run(settings: &Settings, opts: &Options) -> Result<(), WatchError> {
    let signals = signals().map_err(WatchError::Signals)?;
    let mut counters = Counters::default();
    // Served while the state directory is awaited too: a liveness probe sees the loop alive.
    let served = match opts.metrics_address {
        Some(address) => {
            let served = Arc::new(http::Served::new(health_bound(
                opts.period,
                opts.legacy_every,
            )));
            served.tick();
            served.show(counters.exposition().render());
            http::spawn(address, served.clone())
                .map_err(|source| WatchError::Listen { address, source })?;
            Some(served)
        }
        None => None,
    };
    let served = served.as_deref();
    if !wait_for_ledger(&settings.state_dir, &signals, served)? {
        return Ok(());
    }
    // After the wait: doctor, too, judges only a ledger that exists.
    let mut doctoring = match opts.doctor_period {
        Some(period) => {
            Some(Doctoring::spawn(settings.state_dir.clone(), period).map_err(WatchError::Doctor)?)
        }
        None => None,
    };
    let mut findings = opts.doctor_period.map(Findings::new);
    let monitor = match Monitor::open() {
        Ok(m) => Some(m),
        Err(e) => {
            log::warn!(
                "not told of nf_tables changes ({e}); iptables-nft and nftables tables are \
                 checked every {}s only",
                opts.period.as_secs()
            );
            None
        }
    };
    log::info!(
        "watching: nf_tables commits{}, iptables-legacy every {} ms, firewalld's reloads, \
         everything every {} s{}",
        if monitor.is_some() {
            ""
        } else {
            " (not available)"
        },
        opts.legacy_every.as_millis(),
        opts.period.as_secs(),
        match opts.doctor_period {
            Some(p) => format!("; doctor every {} s", p.as_secs()),
            None => String::new(),
        }
    );
    let mut firewalld = Firewalld::new(&settings.system_bus, Instant::now());
    // Subscribed before the first reconcile, so a reload after what it reads is told.
    firewalld.tick(Instant::now());
    // Failures and the shared rules (every repair waits for them); `holds`: each container.
    let mut backoff = Backoff::default();
    let mut holds = Holds::default();
    let mut hold_ends: Option<Instant> = None;
    let mut due: Option<Why> = Some(Why::Start);
    let mut legacy = stamps(&[]);
    let mut checks: u32 = 0;
    let mut generation: Option<u32> = None;
    let mut next_legacy = Instant::now() + opts.legacy_every;
    let mut next_period = Instant::now() + opts.period;
    let mut last: Option<Instant> = None;
    let mut held: Option<HeldBack> = None;
    // Until when a due reconcile waits: a back-off hold, or the gap after the last one.
    let gate = |backoff: &Backoff, last: Option<Instant>, now: Instant| {
        let gap = last.map(|l| l + GAP).filter(|g| *g > now);
        backoff.held(now).max(gap)
    };
    loop {
        if let Some(served) = served {
            served.tick();
        }
        let now = Instant::now();
        if let (Some(why), None) = (due, gate(&backoff, last, now)) {
            last = Some(now);
            // What the reconcile reads is at least this new: changes after it are seen again.
            if let Some(m) = &monitor {
                generation = newer(generation, drain(m)).1;
            }
            let before = stamps(&[]);
            log::debug!("reconciling ({why:?})");
            let report = reconcile(settings, &mut held, holds.held(now));
            if let Err(ops::Error::Busy { .. }) = report {
                // A hook holds the ledger lock: tried again after the gap, the signals read
                // meanwhile.
                log::debug!(
                    "the ledger lock is taken: reconciling in {} ms",
                    GAP.as_millis()
                );
                continue;
            }
            let took = now.elapsed();
            counters.add(report.as_ref().ok(), took, SystemTime::now());
            let report = match report {
                Ok(report) => report,
                // Nothing written: what it read stays what the next check compares with, and
                // it is tried again after a hold that doubles while it keeps failing.
                Err(e) => {
                    let hold = backoff.failed(Instant::now());
                    log::warn!(
                        "reconcile failed: {}; trying again in {} ms",
                        Chain(&e),
                        hold.as_millis()
                    );
                    legacy = before;
                    publish(&counters, findings.as_ref(), opts, served);
                    due = Some(Why::Retry);
                    next_period = Instant::now() + opts.period;
                    continue;
                }
            };
            let restored = report.restored();
            // Compared with the tables as the reconcile read them, so a change made during
            // it is seen; after a write of its own, what it read is gone: the next check
            // reconciles once more (a deleter quicker than the check restores the same size).
            let wrote = restored > 0 || report.tables.iter().any(|t| !t.rules_removed.is_empty());
            legacy = if wrote { Vec::new() } else { before };
            let now = Instant::now();
            // Whose rules came back: each container counts for itself, the shared rules for all.
            let mut back: Vec<ContainerId> = Vec::new();
            let mut shared = 0;
            for r in report.tables.iter().flat_map(|t| &t.rules_restored) {
                match r
                    .container
                    .as_deref()
                    .and_then(|c| c.parse::<ContainerId>().ok())
                {
                    Some(id) if !back.contains(&id) => back.push(id),
                    Some(_) => {}
                    None => shared += 1,
                }
            }
            for begun in holds.after(&back, now) {
                counters.backoffs += 1;
                log::warn!(
                    "the rules of container {} that were put back were removed again: {} \
                     repairs in a row, each within {} s of the last; backing off: its next \
                     repair waits {} ms, other containers' are not held (something keeps \
                     deleting natledger's rules; to make a container's forward go, stop the \
                     container)",
                    begun.container,
                    begun.streak,
                    backoff::WINDOW.as_secs(),
                    begun.hold.as_millis()
                );
            }
            hold_ends = holds.next_end(now);
            counters.held = holds.held(now).len();
            if let Some(hold) = backoff.after(shared, now) {
                counters.backoffs += 1;
                log::warn!(
                    "the shared rules (jumps, guard) that were put back were removed again: {} \
                     repairs in a row, each within {} s of the last; backing off: the next \
                     repair waits {} ms (something keeps deleting natledger's rules)",
                    backoff.streak(),
                    backoff::WINDOW.as_secs(),
                    hold.as_millis()
                );
            }
            publish(&counters, findings.as_ref(), opts, served);
            due = None;
            next_period = Instant::now() + opts.period;
        }

        let now = Instant::now();
        firewalld.tick(now);
        if hold_ends.is_some_and(|end| end <= now) {
            hold_ends = None;
            counters.held = holds.held(now).len();
            due = due.or(Some(Why::HoldOver));
        }
        let mut wake = next_legacy.min(next_period);
        if let Some(end) = hold_ends {
            wake = wake.min(end);
        }
        if let (Some(_), Some(until)) = (due, gate(&backoff, last, now)) {
            wake = wake.min(until);
        }
        if let Some(retry) = firewalld.next_try() {
            wake = wake.min(retry);
        }
        let timeout = wake.saturating_duration_since(now);
        let timeout =
            PollTimeout::try_from(timeout.as_millis().max(1) as u64).unwrap_or(PollTimeout::MAX);
        // The signalfd, then the monitor, the bus and the doctor thread where there are.
        let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        let waited: Vec<Option<usize>> = [
            monitor.as_ref().map(|m| m.as_fd()),
            firewalld.fd(),
            doctoring.as_ref().and_then(Doctoring::fd),
        ]
        .into_iter()
        .map(|fd| {
            fd.map(|fd| {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                fds.len() - 1
            })
        })
        .collect();
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(WatchError::Poll(e)),
        }
        let ready = |at: Option<usize>| {
            at.and_then(|i| fds[i].revents())
                .is_some_and(|r| !r.is_empty())
        };
        let (signalled, told) = (ready(Some(0)), ready(waited[0]));
        let bus = ready(waited[1]);
        let doctored = ready(waited[2]);
        drop(fds);
        if let (true, Some(d), Some(f)) = (doctored, &mut doctoring, &mut findings)
            && let Some(run) = d.take()
        {
            for change in f.add(run) {
                log_change(&change);
            }
            publish(&counters, Some(f), opts, served);
        }
        if bus && firewalld.read(Instant::now()) {
            log::info!("firewalld reloaded: reconciling now");
            due = due.or(Some(Why::Firewalld));
        }
        if signalled {
            while let Some(info) = signals.read_signal().map_err(WatchError::ReadSignal)? {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGHUP) => {
                        log::info!("SIGHUP: reconciling now");
                        backoff.release();
                        holds.release();
                        hold_ends = None;
                        due = Some(Why::Hangup);
                    }
                    Ok(signal) => {
                        log::info!("{signal}: stopping");
                        return Ok(());
                    }
                    Err(_) => {}
                }
            }
        }
        if let (true, Some(m)) = (told, &monitor) {
            let (changed, newest) = newer(generation, drain(m));
            generation = newest;
            if changed {
                due = due.or(Some(Why::Nftables));
            }
        }
        let now = Instant::now();
        if now >= next_legacy {
            next_legacy = now + opts.legacy_every;
            checks = checks.wrapping_add(1);
            // Between deep checks, a large table whose size and count are unchanged is taken
            // as unchanged, unread.
            let known: Vec<Option<Stamp>> = if checks.is_multiple_of(DEEP_EVERY) {
                Vec::new()
            } else {
                legacy
                    .iter()
                    .map(|s| s.filter(|s| s.size > SMALL))
                    .collect()
            };
            if stamps(&known) != legacy {
                due = due.or(Some(Why::Legacy));
            }
        }
        if now >= next_period {
            due = due.or(Some(Why::Period));
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP blocked and read from a signalfd, with a handler that does
/// nothing (a process without a handler ignores them as PID 1 of a namespace).
fn signals() -> nix::Result<SignalFd> {
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

/// What the monitor holds; a failed read counts as a change.
fn drain(monitor: &Monitor) -> Events {
    monitor.drain().unwrap_or_else(|e| {
        log::debug!("reading nf_tables events: {e}");
        Events {
            any: true,
            generation: None,
            overflowed: true,
        }
    })
}

/// Whether `events` tell of a change to natledger's tables committed after generation
/// `seen`, and the newest generation.
fn newer(seen: Option<u32>, events: Events) -> (bool, Option<u32>) {
    let fresh = events.generation.is_none() || events.generation != seen;
    let changed = events.overflowed || (events.any && fresh);
    (changed, events.generation.or(seen))
}

/// The iptables-legacy nat and filter tables of both families, as [`iptc::stamp`] tells
/// them (absent ones, or unreadable, as `None`: never created by asking); `known[i]`, when
/// there, stands for table `i` if its size and count are still its own.
fn stamps(known: &[Option<Stamp>]) -> Vec<Option<Stamp>> {
    let mut out = Vec::with_capacity(4);
    for family in Family::ALL {
        for table in ["nat", "filter"] {
            let trusted = known.get(out.len()).copied().flatten();
            let stamp = match legacy_table_exists(family, table) {
                Ok(true) => iptc::stamp(family, table, trusted).ok(),
                _ => None,
            };
            out.push(stamp);
        }
    }
    out
}

/// Until the state directory exists, checked every second, doing nothing else; `false` when
/// SIGTERM or SIGINT came first. A mistyped `--state-dir` is never created, and its empty
/// ledger never judged.
fn wait_for_ledger(
    dir: &Path,
    signals: &SignalFd,
    served: Option<&http::Served>,
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
        while let Some(info) = signals.read_signal().map_err(WatchError::ReadSignal)? {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGHUP) | Err(_) => {}
                Ok(signal) => {
                    log::info!("{signal}: stopping");
                    return Ok(false);
                }
            }
        }
        if !missing() {
            log::info!("state directory {} exists", dir.display());
            return Ok(true);
        }
    }
}

/// One `sweep --repair`, as `natledger sweep --repair` runs it; the errors of a report are
/// logged, and what it held back once until that changes (`held`: the last); a failure is
/// the caller's.
fn reconcile(
    settings: &Settings,
    held: &mut Option<HeldBack>,
    hold: Vec<ContainerId>,
) -> Result<SweepReport, ops::Error> {
    let runner = SystemRunner::default();
    let ledger = Ledger::new(settings.state_dir.clone());
    let nf = Netfilter::on_kernel(&runner, settings.native);
    let ctx = Context::new(ledger, settings.backend.resolve(), nf);
    let opts = SweepOptions {
        repair: true,
        try_lock: true,
        hold,
        ..SweepOptions::default()
    };
    let report = ops::sweep(&ctx, &opts)?;
    let kind = |h: &Option<HeldBack>| h.as_ref().map(std::mem::discriminant);
    if kind(&report.held_back) != kind(held)
        && let Some(h) = &report.held_back
    {
        log::warn!("{h}");
    }
    held.clone_from(&report.held_back);
    for e in &report.errors {
        log::warn!("{e}");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_already_seen_or_another_owners_commit_is_no_change_an_overflow_always_is() {
        let told = |g: Option<u32>, overflowed| Events {
            any: true,
            generation: g,
            overflowed,
        };
        assert_eq!(newer(Some(5), told(Some(5), false)), (false, Some(5)));
        assert_eq!(newer(Some(5), told(Some(6), false)), (true, Some(6)));
        assert_eq!(newer(None, told(Some(1), false)), (true, Some(1)));
        assert_eq!(newer(Some(5), told(None, true)), (true, Some(5)));
        assert_eq!(newer(Some(5), Events::default()), (false, Some(5)));
        // Another owner's commit: a new generation, nothing of natledger's tables.
        let foreign = Events {
            generation: Some(6),
            ..Events::default()
        };
        assert_eq!(newer(Some(5), foreign), (false, Some(6)));
    }
}

//! Why the loop wakes: every source it sleeps on, in one `poll(2)` ([`Sources::wait`]), each
//! told as a [`Wake`]. The signalfd ([`super::signals`]), the nf_tables monitor ([`Monitor`]:
//! a commit that touches natledger's tables since the last reconcile), the iptables-legacy
//! stamps ([`Legacy`], every `legacy_every`), firewalld's `Reloaded` ([`Firewalld`]), the
//! doctor thread ([`Doctoring`]) and the backstop period; the reconciler's deadlines (a
//! back-off hold's end, the gate before a due reconcile: [`Deadlines`]) and the bus's retry
//! bound the sleep without being told. Timing only: what a wake-up means is the loop's.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signalfd::SignalFd;

use crate::entry::settings::Settings;
use crate::kernel::nftables::monitor::{Events, Monitor};

use super::doctor::{Doctoring, Run};
use super::firewalld::Firewalld;
use super::legacy::{Legacy, Stamps};
use super::signals::{self, Sig};
use super::{Options, WatchError};

/// Why the loop woke, one source each (a wake-up may tell several, in this order).
#[derive(Debug)]
pub enum Wake {
    /// A doctor run ended.
    Doctor(Run),
    /// firewalld reloaded.
    Firewalld,
    Signal(Sig),
    /// An nf_tables commit touched natledger's tables since the last reconcile.
    Nftables,
    /// An iptables-legacy table changed since the last reconcile.
    Legacy,
    /// The backstop period passed since the last reconcile.
    Period,
}

/// What bounds the next sleep besides the sources' own timers: the reconciler's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// When the first container's back-off hold ends.
    pub hold_end: Option<Instant>,
    /// When a due reconcile may start (a back-off hold, the gap after the last one).
    pub gate: Option<Instant>,
}

/// The wake sources and their timers.
pub struct Sources {
    signals: SignalFd,
    monitor: Option<Monitor>,
    /// The newest nf_tables generation read.
    generation: Option<u32>,
    legacy: Legacy,
    firewalld: Firewalld,
    doctoring: Option<Doctoring>,
    legacy_every: Duration,
    period: Duration,
    next_legacy: Instant,
    next_period: Instant,
}

impl Sources {
    /// Open what can be opened (a monitor that cannot is said once: the period stands in),
    /// start the doctor thread, subscribe to the bus (before the first reconcile, so a reload
    /// after what it reads is told), read the legacy tables.
    pub fn open(
        settings: &Settings,
        opts: &Options,
        signals: SignalFd,
    ) -> Result<Sources, WatchError> {
        // After the wait for the ledger: doctor, too, judges only a ledger that exists.
        let doctoring = match opts.doctor_period {
            Some(period) => {
                Some(Doctoring::spawn(settings.clone(), period).map_err(WatchError::Doctor)?)
            }
            None => None,
        };
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
        say_watching(opts, monitor.is_some());
        let mut firewalld = Firewalld::new(&settings.system_bus, Instant::now());
        firewalld.tick(Instant::now());
        let legacy = Legacy::new();
        Ok(Sources {
            signals,
            monitor,
            generation: None,
            legacy,
            firewalld,
            doctoring,
            legacy_every: opts.legacy_every,
            period: opts.period,
            next_legacy: Instant::now() + opts.legacy_every,
            next_period: Instant::now() + opts.period,
        })
    }

    /// Right before a reconcile: what it reads is at least this new, so changes after it are
    /// told again (the monitor drained); the legacy tables as they are, for
    /// [`Sources::reconciled`].
    pub fn reconciling(&mut self) -> Stamps {
        if let Some(m) = &self.monitor {
            self.generation = newer(self.generation, drain(m)).1;
        }
        Stamps::read(&[])
    }

    /// After a reconcile (one that ran, failed or not): the legacy checks compare with
    /// `baseline`, the period starts again.
    pub fn reconciled(&mut self, baseline: Stamps) {
        self.legacy.baseline = baseline;
        self.next_period = Instant::now() + self.period;
    }

    /// Sleep until a source tells something or a timer or deadline passes; what woke it.
    pub fn wait(&mut self, deadlines: Deadlines) -> Result<Vec<Wake>, WatchError> {
        let now = Instant::now();
        self.firewalld.tick(now);
        let ready = self.poll(self.timeout(deadlines, now))?;
        let mut woke = Vec::new();
        if let (true, Some(d)) = (ready.doctor, &mut self.doctoring)
            && let Some(run) = d.take()
        {
            woke.push(Wake::Doctor(run));
        }
        if ready.bus && self.firewalld.read(Instant::now()) {
            woke.push(Wake::Firewalld);
        }
        if ready.signals {
            let read = signals::read(&self.signals)?;
            let stop = matches!(read.last(), Some(Sig::Stop(_)));
            woke.extend(read.into_iter().map(Wake::Signal));
            if stop {
                return Ok(woke);
            }
        }
        if let (true, Some(m)) = (ready.monitor, &self.monitor) {
            let (changed, newest) = newer(self.generation, drain(m));
            self.generation = newest;
            if changed {
                woke.push(Wake::Nftables);
            }
        }
        self.timers(&mut woke);
        Ok(woke)
    }

    /// The legacy check when due, and the period.
    fn timers(&mut self, woke: &mut Vec<Wake>) {
        let now = Instant::now();
        if now >= self.next_legacy {
            self.next_legacy = now + self.legacy_every;
            if self.legacy.changed() {
                woke.push(Wake::Legacy);
            }
        }
        if now >= self.next_period {
            woke.push(Wake::Period);
        }
    }

    /// Until the first timer or deadline, at least a millisecond.
    fn timeout(&self, deadlines: Deadlines, now: Instant) -> PollTimeout {
        let wake = [
            Some(self.next_legacy),
            Some(self.next_period),
            deadlines.hold_end,
            deadlines.gate,
            self.firewalld.next_try(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.next_period);
        let timeout = wake.saturating_duration_since(now);
        PollTimeout::try_from(timeout.as_millis().max(1) as u64).unwrap_or(PollTimeout::MAX)
    }

    /// One `poll(2)`: the signalfd, then the monitor, the bus and the doctor thread where
    /// there are.
    fn poll(&self, timeout: PollTimeout) -> Result<Ready, WatchError> {
        let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
        let waited: Vec<Option<usize>> = [
            self.monitor.as_ref().map(|m| m.as_fd()),
            self.firewalld.fd(),
            self.doctoring.as_ref().and_then(Doctoring::fd),
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
        Ok(Ready {
            signals: ready(Some(0)),
            monitor: ready(waited[0]),
            bus: ready(waited[1]),
            doctor: ready(waited[2]),
        })
    }
}

/// Which descriptors polled readable.
struct Ready {
    signals: bool,
    monitor: bool,
    bus: bool,
    doctor: bool,
}

/// The line saying what is watched, once at the start.
fn say_watching(opts: &Options, monitor: bool) {
    log::info!(
        "watching: nf_tables commits{}, iptables-legacy every {} ms, firewalld's reloads, \
         everything every {} s{}",
        if monitor { "" } else { " (not available)" },
        opts.legacy_every.as_millis(),
        opts.period.as_secs(),
        match opts.doctor_period {
            Some(p) => format!("; doctor every {} s", p.as_secs()),
            None => String::new(),
        }
    );
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

//! firewalld's `Reloaded` signal for watch: a subscription on the system bus
//! ([`crate::kernel::dbus`]) whose descriptor the loop polls, made again with back-off where
//! there is no bus yet or the connection dropped. Never fatal: without the bus, the other
//! triggers stand. Each change between listening and not listening is logged once, at info;
//! failed retries only at debug.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::causes::Causes;
use crate::entry::settings::SystemBus;
use crate::kernel::dbus::Subscription;

/// The handshake with the bus, at most (the loop waits for it).
const HANDSHAKE: Duration = Duration::from_millis(500);

/// When to try the bus again. Pure (time is given).
#[derive(Debug)]
struct Retry {
    delay: Duration,
    at: Instant,
}

impl Retry {
    /// The first retry after a failure.
    const FIRST: Duration = Duration::from_secs(1);
    /// The longest wait between tries; also how long a connection must have lasted for the
    /// next retry to start again from [`Retry::FIRST`].
    const MAX: Duration = Duration::from_secs(60);

    fn now(now: Instant) -> Retry {
        Retry {
            delay: Retry::FIRST,
            at: now,
        }
    }

    /// After a failed try at `now`: the next one waits the delay, which doubles.
    fn failed(&mut self, now: Instant) {
        self.at = now + self.delay;
        self.delay = (self.delay * 2).min(Retry::MAX);
    }

    /// After a connection made at `since` dropped at `now`: one that lasted starts the
    /// delays over; one that dropped at once continues them (a bus that accepts and closes
    /// is tried at most once a minute).
    fn dropped(&mut self, since: Instant, now: Instant) {
        if now.saturating_duration_since(since) >= Retry::MAX {
            self.delay = Retry::FIRST;
        }
        self.failed(now);
    }
}

/// The subscription, or when to try again.
pub struct Firewalld {
    /// The bus's socket; `None` when the address names none natledger speaks.
    bus: Option<std::path::PathBuf>,
    subscribed: Option<(Subscription, Instant)>,
    retry: Retry,
    /// Whether "not listening" was said since the last "listening".
    told: bool,
}

impl Firewalld {
    pub fn new(bus: &SystemBus, now: Instant) -> Firewalld {
        let bus = match bus {
            SystemBus::At(path) => Some(path.clone()),
            SystemBus::Unspoken(address) => {
                log::info!(
                    "not listening for firewalld's Reloaded signal: DBUS_SYSTEM_BUS_ADDRESS {} \
                     names no unix:path= socket",
                    crate::model::echo::Echo::new(address.as_str())
                );
                None
            }
        };
        Firewalld {
            bus,
            subscribed: None,
            retry: Retry::now(now),
            told: false,
        }
    }

    /// The descriptor to poll while subscribed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.subscribed.as_ref().map(|(s, _)| s.as_fd())
    }

    /// When the loop must wake to try the bus again (`None`: subscribed, or never).
    pub fn next_try(&self) -> Option<Instant> {
        match (&self.bus, &self.subscribed) {
            (Some(_), None) => Some(self.retry.at),
            _ => None,
        }
    }

    /// Try the bus when a try is due at `now`.
    pub fn tick(&mut self, now: Instant) {
        let Some(path) = self.bus.as_deref() else {
            return;
        };
        if self.subscribed.is_some() || now < self.retry.at {
            return;
        }
        match Subscription::firewalld(path, HANDSHAKE) {
            Ok(sub) => {
                log::info!(
                    "listening for firewalld's Reloaded signal on {}",
                    path.display()
                );
                self.subscribed = Some((sub, now));
                self.told = false;
            }
            Err(e) => {
                self.retry.failed(now);
                if self.told {
                    log::debug!("{}", Causes(&e));
                } else {
                    log::info!(
                        "not listening for firewalld's Reloaded signal: {}; the other triggers \
                         stand, the bus is tried again with back-off",
                        Causes(&e)
                    );
                    self.told = true;
                }
            }
        }
    }

    /// After the descriptor polled readable at `now`: whether firewalld reloaded.
    pub fn read(&mut self, now: Instant) -> bool {
        let Some((sub, since)) = &mut self.subscribed else {
            return false;
        };
        match sub.drain() {
            Ok(reloaded) => reloaded,
            Err(e) => {
                log::info!(
                    "not listening for firewalld's Reloaded signal: {}; the other triggers \
                     stand, the bus is tried again with back-off",
                    Causes(&e)
                );
                self.retry.dropped(*since, now);
                self.subscribed = None;
                self.told = true;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_to_a_minute_and_start_over_after_a_lasting_connection() {
        let t0 = Instant::now();
        let mut retry = Retry::now(t0);
        assert_eq!(retry.at, t0);
        let mut waits = Vec::new();
        let mut now = t0;
        for _ in 0..9 {
            retry.failed(now);
            waits.push((retry.at - now).as_secs());
            now = retry.at;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        // Connected at `now`, dropped at once: the delays go on.
        retry.dropped(now, now + Duration::from_secs(1));
        assert_eq!(retry.at - now, Duration::from_secs(61));
        // Connected for an hour: from a second again.
        let later = now + Duration::from_secs(3600);
        retry.dropped(now, later);
        assert_eq!(retry.at - later, Duration::from_secs(1));
    }

    /// No bus at the path: not fatal, tried again a second later, then two.
    #[test]
    fn a_missing_bus_is_tried_again_later() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        let mut f = Firewalld::new(&SystemBus::At(dir.path().join("none")), now);
        assert_eq!(f.next_try(), Some(now));
        f.tick(now);
        assert!(f.fd().is_none() && f.told);
        assert_eq!(f.next_try(), Some(now + Duration::from_secs(1)));
        // Not yet due: nothing tried.
        f.tick(now + Duration::from_millis(500));
        assert_eq!(f.next_try(), Some(now + Duration::from_secs(1)));
        let later = now + Duration::from_secs(1);
        f.tick(later);
        assert_eq!(f.next_try(), Some(later + Duration::from_secs(2)));
    }

    #[test]
    fn an_unspoken_address_is_never_tried() {
        let now = Instant::now();
        let mut f = Firewalld::new(&SystemBus::Unspoken("tcp:host=x,port=1".into()), now);
        f.tick(now);
        assert!(f.fd().is_none());
        assert_eq!(f.next_try(), None);
        assert!(!f.read(now));
    }
}

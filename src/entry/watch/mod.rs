//! `natledger watch`: keep the tables equal to the ledger, in both directions, for as long as
//! it runs. A foreground loop that runs `sweep --repair` ([`crate::ops::sweep()`], under the
//! ledger lock, as every change) when something may have changed:
//! - an nf_tables commit, anyone's (iptables-nft's tables, natledger's own, a `nft flush
//!   ruleset`): told by the kernel through the `NFNLGRP_NFTABLES` multicast group
//!   ([`Monitor`](crate::kernel::nftables::monitor::Monitor)); only what touches natledger's tables, its chains or the built-in chains
//!   it jumps from counts, and the generation it announces says whether it was committed
//!   since the last reconcile;
//! - a changed iptables-legacy table, which tells no one: its `IPT_SO_GET_INFO` size and
//!   entry count and a digest of natledger's chains and the jumps into them
//!   ([`crate::kernel::iptc::stamp`], asked of each driver: [`crate::backend::Driver::stamp`]),
//!   per family, nat and filter, compared every [`LEGACY_EVERY`] (the digest of a table over
//!   [`SMALL`] every [`DEEP_EVERY`]th time only: [`legacy`]);
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
//! Timing is kept apart from the sync, as in kube-proxy's bounded-frequency runner: the wake
//! sources and their timers are [`wake`] (one [`wake::Sources::wait`] that says why it woke,
//! as [`wake::Wake`] values), the reconcile and what follows from it (holds, back-off,
//! counters, warnings, what is due and why) is [`reconciler`]; [`run`] only connects them.
//!
//! It never creates the state directory (only what records does): while it is missing, watch
//! waits for it, checking every second, and touches nothing ([`signals::wait_for_ledger`]). A ledger
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
mod legacy;
mod publish;
mod reconciler;
mod signals;
mod wake;

pub use backoff::Backoff;
pub use counters::Counters;
pub use holds::Holds;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::entry::settings::Settings;
use publish::Outside;
use reconciler::{Outcome, Reconciler, Why};
use signals::Sig;
use wake::{Sources, Wake};

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

/// Run until SIGTERM or SIGINT.
pub fn run(settings: &Settings, opts: &Options) -> Result<(), WatchError> {
    let signals = signals::signals().map_err(WatchError::Signals)?;
    let mut reconciler = Reconciler::new(settings);
    let mut outside = Outside::serve(opts, &reconciler.counters)?;
    if !signals::wait_for_ledger(&settings.state_dir, &signals, outside.served())? {
        return Ok(());
    }
    let mut sources = Sources::open(settings, opts, signals)?;
    loop {
        outside.tick();
        let now = Instant::now();
        if let Some(why) = reconciler.ready(now) {
            let before = sources.reconciling();
            let after = match reconciler.reconcile(why, now) {
                Outcome::Busy => continue,
                // What a failed reconcile read stays what the next check compares with.
                Outcome::Failed | Outcome::Ran { wrote: false } => before,
                Outcome::Ran { wrote: true } => legacy::Stamps::none(),
            };
            outside.publish(&reconciler.counters);
            sources.reconciled(after);
        }
        for wake in sources.wait(reconciler.deadlines(Instant::now()))? {
            match wake {
                Wake::Doctor(run) => outside.doctored(run, &reconciler.counters),
                Wake::Firewalld => {
                    log::info!("firewalld reloaded: reconciling now");
                    reconciler.due(Why::Firewalld);
                }
                Wake::Signal(Sig::Hangup) => {
                    log::info!("SIGHUP: reconciling now");
                    reconciler.hangup();
                }
                Wake::Signal(Sig::Stop(signal)) => {
                    log::info!("{signal}: stopping");
                    return Ok(());
                }
                Wake::Nftables => reconciler.due(Why::Nftables),
                Wake::Legacy => reconciler.due(Why::Legacy),
                Wake::Period => reconciler.due(Why::Period),
            }
        }
    }
}

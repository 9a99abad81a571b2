//! The operations: what each command does, in terms of the ledger, the rule model and the
//! drivers the [`Context`] holds as values ([`crate::backend::Driver`]: one call per family
//! to install, remove or apply a sweep's plan), never which backend one is. Every operation
//! that changes rules or manifests holds the ledger lock.

mod after_writes;
mod create;
mod detach;
mod flows;
mod list;
mod remove;
pub mod sweep;
#[cfg(test)]
mod testing;
mod verify;

pub use create::{Created, Creating, Held, create, create_runtime, planned};
pub use detach::{detach, remove_recorded};
pub use list::{ListEntry, Stack, list, render_table};
pub use remove::{Removal, Removed, poststop, remove_container};
pub use sweep::{SweepOptions, SweepReport, sweep};
pub use verify::missing_rules;

use std::net::IpAddr;

use crate::backend::{Backend, BackendError, DRIVERS, Driver, Netfilter};
use crate::kernel::machine::{Host, Machine};
use crate::kernel::netns::NetnsError;
use crate::kernel::safefile::{self, Cap, Links};
use crate::model::echo::{Echo, MESSAGE, limit};
use crate::model::family::Family;
use crate::model::oci::{ContainerId, HookInput, OciError, Runtime, Stage, State};
use crate::model::portspec::{PortMapping, SpecError};
use crate::state::ledger::{Ledger, LedgerError};
use crate::state::sharing::Membership;

/// What every operation needs: where the ledger is, the driver new rules go to and every
/// driver removal and sweep look in, the kernel handle they run on, and what it reads of the
/// host.
pub struct Context<'r> {
    pub ledger: Ledger,
    /// The driver create-runtime writes with.
    pub driver: &'r dyn Driver,
    /// Every driver, in the order removal, sweep and a CNI CHECK look in them (a record is
    /// matched to a driver by its backend: `record.backend == driver.backend()`).
    pub drivers: &'r [&'r dyn Driver],
    pub netfilter: Netfilter<'r>,
    /// Listeners, processes, namespaces and addresses: this machine ([`Machine`], what
    /// [`Context::new`] is given), or a unit test's fake.
    pub host: &'r dyn Host,
    /// A container's start is refused over a conflict unless its annotation says otherwise
    /// (`--port-conflict refuse`); else warned about.
    pub refuse_conflicts: bool,
}

impl<'r> Context<'r> {
    /// The production context: this machine (`host`, a [`Machine`] under the settings' host
    /// root), the real drivers
    /// ([`crate::backend::DRIVERS`]), new rules written with `backend`'s, on `netfilter`
    /// ([`Netfilter::on_kernel`] for the hooks, the CNI plugin, sweep and watch: the direct
    /// paths, conntrack, create's check of other owners' forwards; [`Netfilter::new`]: only
    /// the tools).
    pub fn new(
        ledger: Ledger,
        backend: Backend,
        netfilter: Netfilter<'r>,
        host: &'r Machine,
    ) -> Self {
        Context {
            ledger,
            driver: backend.driver(),
            drivers: &DRIVERS,
            netfilter,
            host,
            refuse_conflicts: false,
        }
    }

    /// A context of the given drivers and host (a unit test's fakes).
    #[cfg(test)]
    pub(crate) fn with_drivers(
        ledger: Ledger,
        driver: &'r dyn Driver,
        drivers: &'r [&'r dyn Driver],
        netfilter: Netfilter<'r>,
        host: &'r dyn Host,
    ) -> Self {
        Context {
            ledger,
            driver,
            drivers,
            netfilter,
            host,
            refuse_conflicts: false,
        }
    }

    /// The backend new rules go to (the name their records carry).
    pub fn backend(&self) -> Backend {
        self.driver.backend()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Oci(#[from] OciError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("invalid io.natledger.ip {value}: {}", limit(reason, MESSAGE))]
    BadIpAnnotation { value: Echo, reason: String },
    #[error(
        "container {0}: the createRuntime state has no pid; an OCI runtime always sends the \
         container's, and without it natledger could never tell that the container is gone"
    )]
    NoPid(ContainerId),
    #[error(
        "container {id}: pid {pid} in the createRuntime state is not a process id; an OCI \
         runtime sends the container's host pid"
    )]
    BadPid { id: ContainerId, pid: i32 },
    #[error("container {id} is not running (pid {pid} is gone)")]
    NotRunning { id: ContainerId, pid: i32 },
    #[error("{path} is held by another process")]
    Busy { path: std::path::PathBuf },
    #[error("no global address in the network namespace of pid {pid}: {}", runtime.no_address_advice())]
    NoAddress { pid: i32, runtime: Runtime },
    #[error(
        "mapping {mapping} needs an {family} container address, but the container has only {have:?}"
    )]
    FamilyMismatch {
        mapping: PortMapping,
        family: Family,
        have: Vec<IpAddr>,
    },
    #[error("host port {mapping} is held by live container {holder} ({origin}){membership}")]
    PortClaimed {
        mapping: PortMapping,
        holder: ContainerId,
        /// `pid N`, or a CNI attachment's network and ifname (`Manifest::origin`).
        origin: String,
        membership: Membership,
    },
    #[error(
        "host port {mapping} differs from {held}, which container {holder} in this network \
         namespace holds: containers of one namespace share a host port only with the same \
         mapping"
    )]
    MappingDiffers {
        mapping: PortMapping,
        held: PortMapping,
        holder: ContainerId,
    },
    #[error(
        "host port {mapping} is in use by {who} on {addr}, and io.natledger.port-conflict=refuse"
    )]
    PortInUse {
        mapping: PortMapping,
        who: String,
        addr: IpAddr,
    },
    #[error(
        "host port {mapping} is already forwarded by another owner's rule in {place}: {line}; \
         and io.natledger.port-conflict=refuse"
    )]
    PortForwarded {
        mapping: PortMapping,
        place: String,
        line: String,
    },
    #[error(
        "{0}; with io.natledger.port-conflict=refuse, a start whose ports cannot be checked \
         for other owners' forwards is refused"
    )]
    ForwardsUnchecked(String),
    #[error("another live container (pid {pid}) already uses the id {id}")]
    IdInUse { id: ContainerId, pid: String },
    #[error("cannot judge whether containers live: /proc is not readable")]
    Procfs(#[source] std::io::Error),
    #[error("container {id} asks for more than natledger records per container")]
    TooLarge {
        id: ContainerId,
        #[source]
        bound: crate::model::portspec::bounds::Bound,
    },
    #[error("{remaining} rule(s) of container {id} may remain: {first_error}")]
    Incomplete {
        id: ContainerId,
        remaining: usize,
        first_error: String,
    },
}

/// What a hook run did, for the caller to report.
#[derive(Debug)]
pub enum HookOutcome {
    Created(Created),
    Removed(Removed),
}

/// The hook input of `state`, its bundle's `config.json` read as every path others can
/// reach is: only a regular file, without waiting on a FIFO, of a bounded size.
pub(crate) fn hook_input(state: State) -> Result<HookInput, OciError> {
    HookInput::from_state(state, |path| {
        safefile::read(path, Links::Follow, Cap::Config)
    })
}

/// Run the hook for `stage`, or for the stage the state's status implies.
pub fn run_hook(ctx: &Context, stage: Option<Stage>, state: State) -> Result<HookOutcome, Error> {
    let stage = match stage {
        Some(stage) => stage,
        None => state.stage()?,
    };
    match stage {
        Stage::CreateRuntime => {
            let input = hook_input(state)?;
            create_runtime(ctx, &input).map(HookOutcome::Created)
        }
        Stage::Poststop => poststop(ctx, &state).map(HookOutcome::Removed),
    }
}

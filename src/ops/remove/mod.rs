//! Removal: poststop's flow, and what it shares with create-runtime (dead holders of a
//! port), sweep and a CNI DEL.
//!
//! - [`container`]: delete one container's recorded (or tagged) rules: which records, which
//!   drivers and families; one [`crate::backend::Driver::remove`] call each
//!   ([`remove_container`]).
//! - [`holders`]: sharing's side of a stop: holders kept only for the stopped container go.

mod container;
mod holders;

pub use container::{Removal, remove_container};

use crate::analysis::forwards;
use crate::causes::Causes;
use crate::fault;
use crate::kernel::conntrack::Flows;
use crate::model::layout::tag;
use crate::model::oci::{ContainerId, State};
use crate::state::ledger::{LedgerError, Locked, Manifest, Phase, Summary};
use crate::state::liveness;

use super::after_writes::{Carry, after_writes};
use super::{Context, Error};
use holders::{live_sharers, live_sharers_without_manifest, release_holders};

/// What poststop did.
#[derive(Debug, PartialEq, Eq)]
pub enum Removed {
    /// No manifest and no `io.natledger.ports`: nothing was run.
    Skipped,
    Done {
        rules: usize,
    },
    /// Its rules stay: live containers in its network namespace share them
    /// (`crate::state::sharing`); the last of them to go removes them. Without a manifest
    /// (its rules found by their tag only, and not counted: `rules` is 0), a sweep once they
    /// are gone.
    Kept {
        rules: usize,
        sharers: Vec<ContainerId>,
    },
    /// A poststop of an earlier instance: the container's recorded process (`pid`) still
    /// runs, so nothing was changed.
    Stale {
        pid: i32,
    },
    /// A CNI DEL or GC named a hook container's manifest (one without a `cni` attachment,
    /// its id of the `<containerID>+<ifname>` form by chance): nothing was changed.
    NotAnAttachment,
}

/// Who says that a container stopped.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stopping {
    /// Its poststop, with the pid its state names, if any.
    Poststop { pid: Option<i32> },
    /// A CNI DEL or GC: an attachment has no process, its runtime's word is final.
    Detach,
}

/// The poststop hook: delete exactly the rules natledger wrote for this container, wherever
/// they are now, then its manifest. Idempotent; keeps going past a failure. A poststop whose
/// container's recorded process still runs (same pid and start time), and whose state does
/// not name that process, is an earlier instance's under a reused id: it changes nothing and
/// warns ([`Removed::Stale`]).
pub fn poststop(ctx: &Context, state: &State) -> Result<Removed, Error> {
    let id: ContainerId = state.id.parse()?;
    if !ctx.ledger.has_manifest(&id) {
        // Without a manifest, only the annotation says whether natledger ever ran for it.
        match super::hook_input(state.clone()) {
            Ok(input) if input.ports().is_none() => return Ok(Removed::Skipped),
            Ok(_) => {}
            Err(e) => log::error!("{}; looking for rules tagged {}", Causes(&e), tag(&id)),
        }
    }
    // A runtime that kills the container's process and runs poststop at once (crun's and
    // youki's `delete --force`: SIGKILL, no wait) reaches here while that process is still
    // exiting. Waited for here, outside the lock, a bounded time; `stop` judges again.
    if let Ok(Some(manifest)) = ctx.ledger.load(&id) {
        let deadline = std::time::Instant::now() + EXIT_GRACE;
        while stale(ctx, &manifest, state.pid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    stop(ctx, &id, Stopping::Poststop { pid: state.pid })
}

/// How long a poststop waits for the container's recorded process to finish exiting before
/// it judges the poststop an earlier instance's ([`Removed::Stale`]). A killed process is
/// gone within milliseconds; a really stale poststop costs this once.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// A container or CNI attachment stops, whoever says so (poststop, a CNI DEL or GC): delete
/// exactly the rules natledger wrote for it, wherever they are now, then its manifest; unless
/// live containers of its network namespace share them (`crate::state::sharing`), in which case they
/// stay (a CNI attachment's manifest then records its DEL, [`CniAttachment::deleted`], for
/// the attachment has no process whose end says it is gone). Either way, the holders whose
/// rules were kept only for it go. Idempotent; keeps going past a failure.
///
/// [`CniAttachment::deleted`]: crate::state::ledger::CniAttachment::deleted
pub(super) fn stop(ctx: &Context, id: &ContainerId, by: Stopping) -> Result<Removed, Error> {
    // Read before the lock: a manifest too large to read whole takes its time.
    let early = ctx.ledger.summarize_one(id);
    let locked = ctx.ledger.lock()?;
    let loaded = load(ctx, id, early);
    if let Some(unchanged) = unchanged(ctx, id, by, &loaded) {
        return Ok(unchanged);
    }
    fault::point(fault::POSTSTOP_LOCKED);
    let sharers = match (&loaded.manifest, &loaded.summary) {
        (Some(m), _) => live_sharers(ctx, m, id),
        (None, None) => live_sharers_without_manifest(ctx, id),
        (None, Some(_)) => Vec::new(),
    };
    let holders: Vec<ContainerId> = loaded
        .manifest
        .iter()
        .chain(&loaded.summary)
        .flat_map(|m| m.shares.iter().map(|s| s.holder.clone()))
        .collect();
    let cache = ctx.ledger.file(forwards::CACHE_FILE);
    let generation = forwards::before_writes(&ctx.netfilter, &cache);
    let mut stale_flows = Vec::new();
    let result = if sharers.is_empty() {
        remove(ctx, &locked, id, loaded, &mut stale_flows)
    } else {
        keep(&locked, id, loaded.manifest, sharers)
    };
    release_holders(ctx, &locked, id, holders, &mut stale_flows);
    let carry = Carry {
        cache: &cache,
        before: generation,
    };
    after_writes(ctx, &stale_flows, Some(carry));
    result
}

/// What [`stop`] read of the container's manifest, under the lock.
struct Loaded {
    /// The manifest, when it reads whole and is this container's.
    manifest: Option<Manifest>,
    /// A manifest too large to read whole, read for its liveness fields and the holders it
    /// shares (`ledger::summarize`): enough to judge a stale poststop; its rules go by their
    /// tag.
    summary: Option<Manifest>,
    /// A manifest under another container's name (copied or edited) is not this container's:
    /// it stays for the operator and sweep (which keeps the rules of both), and only the rules
    /// tagged for this container go.
    foreign_file: bool,
}

/// Read `id`'s manifest under the lock (`early`: its summary read before the lock, if it is
/// too large to read whole); one that cannot be read is logged, its rules then go by tag.
fn load(ctx: &Context, id: &ContainerId, early: Option<Summary>) -> Loaded {
    let mut foreign_file = false;
    let mut summary: Option<Manifest> = None;
    let manifest = ctx.ledger.load(id).unwrap_or_else(|e| {
        foreign_file = matches!(e, LedgerError::Mismatch { .. });
        if e.is_too_large() {
            summary = ctx.ledger.summary_under_lock(id, early).map(|s| s.manifest);
        }
        log::error!(
            "{}; removing the rules tagged {} instead",
            Causes(&e),
            tag(id)
        );
        None
    });
    Loaded {
        manifest,
        summary,
        foreign_file,
    }
}

/// Why this stop changes nothing, warned: a poststop of an earlier instance
/// ([`Removed::Stale`]), or a CNI DEL or GC naming a hook container's manifest
/// ([`Removed::NotAnAttachment`]). `None`: the stop goes on.
fn unchanged(ctx: &Context, id: &ContainerId, by: Stopping, loaded: &Loaded) -> Option<Removed> {
    let recorded = loaded.manifest.as_ref().or(loaded.summary.as_ref());
    if let Stopping::Poststop { pid: named } = by
        && let Some(live) = recorded.and_then(|m| stale(ctx, m, named))
    {
        log::warn!(
            "ignoring a poststop for container {id}: its process (pid \
             {live}) still runs, so this poststop is an earlier instance's; its rules stay"
        );
        return Some(Removed::Stale { pid: live });
    }
    if let Stopping::Detach = by
        && recorded.is_some_and(|m| m.cni.is_none())
    {
        log::warn!(
            "{id} is a hook container's (its manifest records no CNI attachment), not an \
             attachment's: its rules and manifest stay for its poststop"
        );
        return Some(Removed::NotAnAttachment);
    }
    None
}

/// The rules stay: live `sharers` in the container's network namespace share them. A kept
/// manifest records a CNI attachment's DEL ([`mark_deleted`]); without a manifest, the rules
/// tagged for `id` stay for a sweep once the sharers are gone.
fn keep(
    locked: &Locked,
    id: &ContainerId,
    manifest: Option<Manifest>,
    sharers: Vec<ContainerId>,
) -> Result<Removed, Error> {
    let names: Vec<String> = sharers.iter().map(ToString::to_string).collect();
    let Some(m) = manifest else {
        log::warn!(
            "natledger has no manifest of {id}; kept the rules tagged {}: the manifests \
             of live container(s) {} say they share them (a sweep removes them once \
             those are gone)",
            tag(id),
            names.join(", ")
        );
        return Ok(Removed::Kept { rules: 0, sharers });
    };
    log::info!(
        "kept {} rule(s) of container {id}: live container(s) {} in its \
         network namespace share them",
        m.rules.len(),
        names.join(", ")
    );
    let kept = Removed::Kept {
        rules: m.rules.len(),
        sharers,
    };
    mark_deleted(locked, m).map(|()| kept)
}

/// Delete the container's rules ([`remove_container`]), their flows added to `stale_flows`,
/// then record the result ([`settle`]); a foreign manifest file stays as it is when nothing
/// failed.
fn remove(
    ctx: &Context,
    locked: &Locked,
    id: &ContainerId,
    loaded: Loaded,
    stale_flows: &mut Vec<Flows>,
) -> Result<Removed, Error> {
    let manifest = loaded.manifest;
    let removal = remove_container(ctx, locked, id, manifest.as_ref());
    fault::point(fault::POSTSTOP_DELETED);
    stale_flows.extend(removal.flows.iter().copied());
    if loaded.foreign_file && removal.failures.is_empty() {
        Ok(Removed::Done {
            rules: removal.removed,
        })
    } else {
        settle(locked, id, manifest, removal)
    }
}

/// The pid whose process makes a poststop stale: the container's recorded process provably
/// still runs ([`liveness::runs`]: same pid namespace, pid and start time), and the poststop's
/// state does not name that process. Without proof (no pid or start time recorded, another
/// pid namespace, an unreadable stat) the poststop is the container's, as before; a CNI
/// attachment has no process to judge.
fn stale(ctx: &Context, manifest: &Manifest, named: Option<i32>) -> Option<i32> {
    let pid = manifest.pid.filter(|p| *p > 0)?;
    if manifest.cni.is_some() || named == Some(pid) {
        return None;
    }
    liveness::runs(ctx.host, manifest.recorded()).then_some(pid)
}

/// Record a CNI attachment's DEL in its kept manifest, so that it counts as gone
/// ([`Manifest::alive`]); a container's manifest needs nothing (its process is gone).
fn mark_deleted(locked: &Locked, mut manifest: Manifest) -> Result<(), Error> {
    match &mut manifest.cni {
        Some(cni) if !cni.deleted => {
            cni.deleted = true;
            locked.store(&manifest)?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Record the result of a removal: drop the manifest when nothing can remain, otherwise keep
/// the rules that may remain so that a later poststop or sweep retries them.
pub(super) fn settle(
    locked: &Locked,
    id: &ContainerId,
    manifest: Option<Manifest>,
    removal: Removal,
) -> Result<Removed, Error> {
    // The first failure travels in the returned error; print only the others here.
    for failure in removal.failures.iter().skip(1) {
        log::error!("{}", Causes(failure));
    }
    let Some(first) = removal.failures.first() else {
        locked.remove(id)?;
        return Ok(Removed::Done {
            rules: removal.removed,
        });
    };
    let first_error = Causes(first).to_string();
    if let Some(mut manifest) = manifest {
        manifest.phase = Phase::Removing;
        manifest.rules = removal.remaining.clone();
        locked.store(&manifest)?;
    }
    Err(Error::Incomplete {
        id: id.clone(),
        remaining: removal.remaining.len().max(1),
        first_error,
    })
}

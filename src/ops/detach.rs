//! Removal by ledger id alone, for callers with no OCI state (a CNI DEL or GC): the way of a
//! poststop ([`super::remove`]), sharing included; and, without a manifest (natledger's
//! state directory lost: a tmpfs at reboot, an operator's `rm`), what natledger can prove is
//! an attachment's: the rules tagged with its ledger id in natledger's own chains.

use std::collections::BTreeSet;

use crate::analysis::forwards;
use crate::backend::{Backend, BackendError};
use crate::chain::Chain;
use crate::model::family::Family;
use crate::model::layout::{Owner, owner};
use crate::model::oci::ContainerId;
use crate::model::table::Table;
use crate::state::ledger::Manifest;

use super::remove::{Removed, Stopping, remove_container, settle, stop};
use super::{Context, Error, flows};

/// Delete the rules recorded under `id`, then its manifest, as a poststop does: kept while
/// live containers of its network namespace share them, and the holders kept only for it
/// released. Nothing recorded is success (`Removed::Skipped`), nothing read: for callers
/// that found the manifest (GC). Idempotent; keeps going past a failure.
pub fn remove_recorded(ctx: &Context, id: &ContainerId) -> Result<Removed, Error> {
    if !ctx.ledger.has_manifest(id) {
        return Ok(Removed::Skipped);
    }
    stop(ctx, id, Stopping::Detach)
}

/// A CNI DEL: [`remove_recorded`] when a manifest of `id` exists; without one, every rule
/// tagged `natledger:<id>` in natledger's chains, in every backend and family, as sweep
/// finds them ([`remove_container`] without records: each backend, family and table read
/// once, legacy's nothing when its table does not exist). A shared jump or chain, an
/// untagged rule or another id's is never touched. Idempotent: nothing found is success
/// (`Removed::Done` with no rule). No manifest is written back: what is found is removed.
pub fn detach(ctx: &Context, id: &ContainerId) -> Result<Removed, Error> {
    stop(ctx, id, Stopping::Detach)
}

/// Which of the unrecorded ids (tagged, no manifest) go, given every readable manifest.
pub type Choose<'a> = &'a dyn Fn(&[ContainerId], &[Manifest]) -> Vec<ContainerId>;

/// What [`remove_unrecorded`] did for one id.
#[derive(Debug)]
pub struct Unrecorded {
    pub id: ContainerId,
    /// The rules removed, or why some may remain.
    pub result: Result<usize, Error>,
}

/// Under the lock: the ids whose rules are tagged in natledger's chains (each backend,
/// family and table natledger writes read once) and that no manifest file names; `choose`
/// is given them (sorted) and every readable manifest, and returns those whose rules go,
/// each as [`detach`] removes them without a manifest. A table that cannot be read is
/// skipped, with a warning (its rules are not found, so not removed).
pub fn remove_unrecorded(ctx: &Context, choose: Choose) -> Result<Vec<Unrecorded>, Error> {
    let locked = ctx.ledger.lock()?;
    let manifests: Vec<Manifest> = ctx.ledger.list()?.into_iter().flatten().collect();
    let unrecorded: Vec<ContainerId> = tagged_ids(ctx)
        .into_iter()
        .filter(|id| !ctx.ledger.has_manifest(id))
        .collect();
    let chosen = choose(&unrecorded, &manifests);
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    let cache = ctx.ledger.file(forwards::CACHE_FILE);
    let generation = forwards::before_writes(&ctx.netfilter, &cache);
    let mut stale_flows = Vec::new();
    let mut done = Vec::new();
    for id in chosen {
        let removal = remove_container(ctx, &locked, &id, None);
        stale_flows.extend(removal.flows.iter().copied());
        let result = settle(&locked, &id, None, removal).map(|removed| match removed {
            Removed::Done { rules } => rules,
            _ => 0,
        });
        done.push(Unrecorded { id, result });
    }
    flows::forget(ctx, &stale_flows);
    forwards::carry(&ctx.netfilter, &cache, generation);
    ctx.netfilter.release_native();
    Ok(done)
}

/// Every container id a rule in one of natledger's chains is tagged for, in any backend,
/// family and table natledger writes.
fn tagged_ids(ctx: &Context) -> BTreeSet<ContainerId> {
    let mut ids = BTreeSet::new();
    for backend in Backend::ALL {
        for family in Family::ALL {
            for table in Table::ALL {
                let dump = match ctx.netfilter.read(backend, family, table.as_str()) {
                    Ok(dump) => dump,
                    // A backend whose tools are not installed holds nothing natledger wrote.
                    Err(BackendError::ToolNotFound { .. }) => None,
                    Err(e) => {
                        log::warn!("{}; the rules there are not looked at", Chain(&e));
                        None
                    }
                };
                for rule in dump.iter().flat_map(|t| t.rules.iter()) {
                    if let Owner::Container(id) = owner(&rule.chain, &rule.args)
                        && let Ok(id) = id.parse::<ContainerId>()
                    {
                        ids.insert(id);
                    }
                }
            }
        }
    }
    ids
}

//! Removal by ledger id alone, for callers with no OCI state (a CNI DEL): exactly what the
//! manifest records, or the rules tagged with the id when the manifest cannot be read.

use crate::forwards;
use crate::layout::tag;
use crate::oci::ContainerId;

use super::remove::{Removed, remove_container, settle};
use super::{Context, Error, flows};

/// Delete the rules recorded under `id`, then its manifest. Nothing recorded is success
/// (`Removed::Skipped`): every rule natledger writes is named by a manifest first, so without
/// one there is nothing of `id`'s. Idempotent; keeps going past a failure.
pub fn remove_recorded(ctx: &Context, id: &ContainerId) -> Result<Removed, Error> {
    if !ctx.ledger.has_manifest(id) {
        return Ok(Removed::Skipped);
    }
    let locked = ctx.ledger.lock()?;
    let manifest = ctx.ledger.load(id).unwrap_or_else(|e| {
        eprintln!(
            "natledger: {e}; removing the rules tagged {} instead",
            tag(id)
        );
        None
    });
    let cache = ctx.ledger.file(forwards::CACHE_FILE);
    let generation = forwards::before_writes(&ctx.netfilter, &cache);
    let removal = remove_container(ctx, &locked, id, manifest.as_ref());
    let stale_flows = removal.flows.clone();
    let result = settle(&locked, id, manifest, removal);
    flows::forget(ctx, &stale_flows);
    forwards::carry(&ctx.netfilter, &cache, generation);
    ctx.netfilter.release_native();
    result
}

//! Removal by ledger id alone, for callers with no OCI state (a CNI DEL): exactly what the
//! manifest records, or the rules tagged with the id when the manifest cannot be read.

use crate::forwards;
use crate::layout::tag;
use crate::ledger::LedgerError;
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
    // A manifest under another name (copied or edited) is not this attachment's: it stays for
    // the operator and sweep, and only the rules tagged with `id` go (as poststop does).
    let mut foreign_file = false;
    let manifest = ctx.ledger.load(id).unwrap_or_else(|e| {
        foreign_file = matches!(e, LedgerError::Mismatch { .. });
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
    let result = if foreign_file && removal.failures.is_empty() {
        Ok(Removed::Done {
            rules: removal.removed,
        })
    } else {
        settle(&locked, id, manifest, removal)
    };
    flows::forget(ctx, &stale_flows);
    forwards::carry(&ctx.netfilter, &cache, generation);
    ctx.netfilter.release_native();
    result
}

//! Removal by ledger id alone, for callers with no OCI state (a CNI DEL or GC): the way of a
//! poststop ([`super::remove`]), sharing included.

use crate::model::oci::ContainerId;

use super::remove::{Removed, Stopping, stop};
use super::{Context, Error};

/// Delete the rules recorded under `id`, then its manifest, as a poststop does: kept while
/// live containers of its network namespace share them, and the holders kept only for it
/// released. Nothing recorded is success (`Removed::Skipped`): every rule natledger writes
/// is named by a manifest first, so without one there is nothing of `id`'s. Idempotent;
/// keeps going past a failure.
pub fn remove_recorded(ctx: &Context, id: &ContainerId) -> Result<Removed, Error> {
    if !ctx.ledger.has_manifest(id) {
        return Ok(Removed::Skipped);
    }
    stop(ctx, id, Stopping::Detach)
}

//! Removal by ledger id alone, for callers with no OCI state (a CNI DEL or GC): the way of a
//! poststop ([`super::remove`]), sharing included; and, for a DEL without a manifest
//! (natledger's state directory lost: a tmpfs at reboot, an operator's `rm`), what natledger
//! can prove is the attachment's: the rules tagged with its ledger id in natledger's own
//! chains. GC finds attachments by their manifests only: a tag names an attachment, not its
//! network.

use crate::model::oci::ContainerId;

use super::remove::{Removed, Stopping, stop};
use super::{Context, Error};

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

/// A CNI DEL: [`remove_recorded`] when a manifest of `id` exists (one recording no CNI
/// attachment, a hook container's, changes nothing: `Removed::NotAnAttachment`); without
/// one, every rule tagged `natledger:<id>` in natledger's chains, in every backend and
/// family, as sweep finds them (`remove_container` without records: each backend, family
/// and table read once, legacy's nothing when its table does not exist), unless a live
/// container's manifest names `id` in its `shares` (`Removed::Kept`). A shared jump or
/// chain, an untagged rule or another id's is never touched. Idempotent: nothing found is
/// success (`Removed::Done` with no rule). No manifest is written back.
pub fn detach(ctx: &Context, id: &ContainerId) -> Result<Removed, Error> {
    stop(ctx, id, Stopping::Detach)
}

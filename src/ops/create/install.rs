//! A failed create's rules and manifest undone ([`roll_back`]); the rules themselves are
//! written by the backend's driver ([`crate::backend::Driver::install`]).

use super::*;

/// Undo a create that failed once its manifest was written ahead: remove the rules of
/// `applied` (what may have been written), then the manifest. Deleting and unlinking need no
/// room, so a full state directory ends with neither. When a rule cannot be removed, the
/// manifest keeps it (phase removing) for poststop or sweep; if even that cannot be recorded,
/// the manifest written ahead, which names every rule this create may have written, stays.
pub(super) fn roll_back(
    ctx: &Context,
    locked: &Locked,
    applied: Manifest,
    after: &mut AfterWrites,
) -> Result<(), Error> {
    let id = applied.container_id.clone();
    if applied.rules.is_empty() {
        locked.remove(&id)?;
        return Ok(());
    }
    let removal = remove_container(ctx, locked, &id, Some(&applied));
    after.stale_flows.extend(removal.flows.iter().copied());
    if let Err(undo) = settle(locked, &id, Some(applied), removal) {
        log::error!("rollback incomplete: {undo}");
    }
    Ok(())
}

//! create's install and record steps, once the manifest is written ahead: the rules written
//! exactly as it records them, family by family, by the backend's driver
//! ([`crate::backend::Driver::install`], [`install`]); the manifest stored as installed
//! ([`record`]); a failed create's rules and manifest undone ([`roll_back`]).

use crate::fault;
use crate::model::family::Family;
use crate::model::table::Table;
use crate::state::ledger::{Locked, Manifest, Phase, RuleRecord};

use super::super::remove::{remove_container, settle};
use super::after::AfterWrites;
use super::{Context, Error};

/// Write `manifest`'s rules, family by family (the transactions are built from its records).
/// Returns the tables that could not be written (the filter accept, see
/// [`crate::backend::Driver::install`]). On failure what was written is rolled back.
pub(super) fn install(
    ctx: &Context,
    locked: &Locked,
    manifest: &Manifest,
    after: &mut AfterWrites,
) -> Result<Vec<(Family, Table)>, Error> {
    let mut installed: Vec<Family> = Vec::new();
    let mut skipped: Vec<(Family, Table)> = Vec::new();
    for family in Family::ALL {
        let rules: Vec<&RuleRecord> = manifest
            .rules
            .iter()
            .filter(|r| r.family == family)
            .collect();
        if rules.is_empty() {
            continue;
        }
        match ctx.driver.install(&ctx.netfilter, family, &rules) {
            Ok(not_written) => skipped.extend(not_written.into_iter().map(|t| (family, t))),
            Err(failed) => {
                // Roll back the families installed before, and this one when one of its
                // tables went in before another failed. The manifest goes unless something
                // could not be removed, in which case it names what may remain.
                if failed.partial {
                    installed.push(family);
                }
                let mut applied = manifest.clone();
                applied.rules.retain(|r| installed.contains(&r.family));
                roll_back(ctx, locked, applied, after)?;
                return Err(failed.error.into());
            }
        }
        installed.push(family);
        if family == Family::Ipv4 {
            fault::point(fault::CREATE_IPV4_APPLIED);
        }
    }
    fault::point(fault::CREATE_APPLIED);
    Ok(skipped)
}

/// Store `manifest` as installed. A table that could not be written (`skipped`) holds none of
/// its rules: the manifest records exactly what was written.
pub(super) fn record(
    ctx: &Context,
    locked: &Locked,
    mut manifest: Manifest,
    skipped: &[(Family, Table)],
    after: &mut AfterWrites,
) -> Result<Manifest, Error> {
    manifest
        .rules
        .retain(|r| !skipped.iter().any(|(f, t)| r.family == *f && r.is_in(*t)));
    manifest.phase = Phase::Installed;
    if let Err(error) = locked.store(&manifest) {
        // The rules are in but the manifest cannot say so (a full state directory has room
        // for the manifest written ahead, not for the temp file of its update): the create
        // fails, so they go, and the manifest with them.
        roll_back(ctx, locked, manifest, after)?;
        return Err(error.into());
    }
    fault::point(fault::CREATE_RECORDED);
    Ok(manifest)
}

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

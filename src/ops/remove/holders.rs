//! Sharing's side of a stop (`crate::sharing`): a holder's rules stay while a container
//! sharing them lives, and the last one to stop releases the holders kept only for it.

use std::collections::HashSet;

use crate::conntrack::Flows;
use crate::ledger::{Locked, Manifest};
use crate::oci::ContainerId;

use super::super::Context;
use super::{remove_container, settle};

/// The rules this stopped container shared: each holder that is dead and has no other live
/// sharer was kept for it, and goes now; so, in turn, do the holders such a holder shared.
pub(super) fn release_holders(
    ctx: &Context,
    locked: &Locked,
    stopped: &ContainerId,
    mut queue: Vec<ContainerId>,
    stale_flows: &mut Vec<Flows>,
) {
    let mut seen = HashSet::new();
    while let Some(holder_id) = queue.pop() {
        if !seen.insert(holder_id.clone()) {
            continue;
        }
        let holder = match ctx.ledger.load(&holder_id) {
            Ok(Some(holder)) => holder,
            Ok(None) => continue,
            Err(e) => {
                eprintln!("natledger: warning: {e}; sweep will judge it");
                continue;
            }
        };
        if holder.alive() || !live_sharers(ctx, &holder, stopped).is_empty() {
            continue;
        }
        let removal = remove_container(ctx, locked, &holder_id, Some(&holder));
        stale_flows.extend(removal.flows.iter().copied());
        if removal.removed > 0 {
            eprintln!(
                "natledger: removed {} rule(s) of container {holder_id} (kept for {stopped}, \
                 its last live sharer)",
                removal.removed
            );
        }
        queue.extend(holder.shares.iter().map(|s| s.holder.clone()));
        if let Err(e) = settle(locked, &holder_id, Some(holder), removal) {
            eprintln!("natledger: warning: {e}");
        }
    }
}

/// The containers other than `except` that may share `holder`'s rules and live: those its
/// `shared_by` names whose manifest still says so and whose process lives, and, since
/// nothing can be judged of them, those whose manifest cannot be read.
pub(super) fn live_sharers(
    ctx: &Context,
    holder: &Manifest,
    except: &ContainerId,
) -> Vec<ContainerId> {
    holder
        .shared_by
        .iter()
        .filter(|id| *id != except)
        .filter(|id| match ctx.ledger.load(id) {
            Ok(Some(m)) => m.alive() && m.shares.iter().any(|s| s.holder == holder.container_id),
            Ok(None) => false,
            Err(_) => true,
        })
        .cloned()
        .collect()
}

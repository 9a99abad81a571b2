//! Held ports: what a create does about a host port that a live container (or attachment) in
//! another network namespace holds. portmap's way is to accept the second and let the newest
//! take the traffic; Docker, rootful podman and the Kubernetes scheduler each refuse a second
//! holder before any hook runs, so their users expect a start to fail. The caller chooses
//! ([`Held`]): the CNI plugin from `portConflict`, the OCI hooks always [`Held::Refuse`].
//!
//! Stacking changes nothing of the older holder: its rules and manifest stay behind the newer's
//! (DNATs go at the top of their chain, `layout::goes_first`), and its flows move to the newer
//! with the new DNATs' (create forgets every UDP/SCTP flow of a host port it adds). When the
//! newer goes first, its removal deletes only its own records, so the older's DNAT serves again;
//! when the older goes first, only the flows pinned to its address are forgotten
//! (`ops::flows`), so the newer's stay.

use crate::backend::Backend;
use crate::model::oci::ContainerId;
use crate::model::portspec::PortMapping;
use crate::state::ledger::{Locked, Manifest};
use crate::state::sharing::Membership;

use super::Error;

/// What a create does when a live container in another network namespace holds one of its
/// host ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Forward the port to the new container; the older keeps its rules behind and gets
    /// the port back when the newer goes (portmap's behaviour; CNI ADD by default).
    Stack,
    /// Refuse the start ([`Error::PortClaimed`]): the OCI hooks, and CNI with
    /// `portConflict: "refuse"`.
    Refuse,
}

/// A host port this create takes over from a live holder, which waits behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Stacked {
    /// The new container's mapping that clashes with the holder's.
    pub mapping: PortMapping,
    /// The holder whose rules stay behind.
    pub older: ContainerId,
    /// The backend of the holder's rules when it is not the one this container's go to:
    /// then which of them serves is the backends' hook order, not the newest first.
    pub elsewhere: Option<Backend>,
    /// The holder's manifest without this container in its `stacked_on`, when it names it:
    /// an earlier instance of this container (same id) went behind the holder, and now
    /// goes in front.
    pub turned: Option<Manifest>,
}

/// A live holder (`keeper`, of `holder`'s rules) of `mapping` that the new container is not a
/// member of: stacked on with [`Held::Stack`], else refused.
pub(super) fn judge(
    held: Held,
    backend: Backend,
    newer: &ContainerId,
    mapping: &PortMapping,
    holder: &Manifest,
    keeper: &Manifest,
    membership: Membership,
) -> Result<Stacked, Error> {
    match held {
        Held::Stack => Ok(Stacked {
            mapping: mapping.clone(),
            older: holder.container_id.clone(),
            elsewhere: holder
                .rules
                .iter()
                .map(|r| r.backend)
                .find(|b| *b != backend),
            turned: holder.stacked_on.contains(newer).then(|| {
                let mut turned = holder.clone();
                turned.stacked_on.retain(|id| id != newer);
                turned
            }),
        }),
        Held::Refuse => Err(Error::PortClaimed {
            mapping: mapping.clone(),
            holder: keeper.container_id.clone(),
            origin: keeper.origin(),
            membership,
        }),
    }
}

/// Say, once the new rules are in, whose port the new container now serves.
pub(super) fn log_stacked(newer: &ContainerId, backend: Backend, stacked: &[Stacked]) {
    for s in stacked {
        match s.elsewhere {
            None => log::info!(
                "host port {} of {} now forwarded to {newer}; {} gets it back when {newer} goes",
                s.mapping,
                s.older,
                s.older
            ),
            Some(theirs) => log::warn!(
                "host port {} of {} is forwarded in {theirs} and now to {newer} in {backend}: \
                 which of them serves depends on the backends' hook order, not on which came \
                 last",
                s.mapping,
                s.older
            ),
        }
    }
}

/// The holders this container goes in front of, each once (its manifest's `stacked_on`).
pub(super) fn stacked_on(stacked: &[Stacked]) -> Vec<ContainerId> {
    let mut ids: Vec<ContainerId> = Vec::new();
    for s in stacked {
        if !ids.contains(&s.older) {
            ids.push(s.older.clone());
        }
    }
    ids
}

/// Store the holders that named this container in their `stacked_on` without it, before this
/// container's manifest says it stacks on them: a crash in between leaves neither naming the
/// other, never both.
pub(super) fn store_turned(locked: &Locked, stacked: &[Stacked]) -> Result<(), Error> {
    for turned in stacked.iter().filter_map(|s| s.turned.as_ref()) {
        locked.store(turned)?;
    }
    Ok(())
}

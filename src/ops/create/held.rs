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
//!
//! A container joining a namespace whose holder is stacked shares that holder's place: the
//! holders it stacks on are no claim on the joiner, and a joiner that only shares writes no
//! rule, so it stacks on nothing ([`judge_foreign`]).

use crate::backend::Backend;
use crate::model::oci::ContainerId;
use crate::model::portspec::PortMapping;
use crate::state::ledger::{Locked, Manifest};
use crate::state::sharing::Membership;

use super::claims::Claims;
use super::{Creating, Error};

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

/// A live holder (or one kept for live sharers) of one of the new container's host ports,
/// in a network namespace the new container is not in (or one not known): judged once the
/// ports it shares in its own namespace are known ([`judge_foreign`]).
pub(super) struct Foreign<'m> {
    pub holder: &'m Manifest,
    /// Its live member named in a refusal: the holder, or a live sharer of its rules.
    pub keeper: &'m Manifest,
    pub membership: Membership,
}

/// Judge each [`Foreign`] holder against what the new container writes and what it shares
/// (`claims.own`, `claims.shared`). A clash with a port it writes rules for is stacked on or
/// refused ([`judge`]). A clash only with ports it shares with a holder of its own namespace
/// writes nothing: no claim at all where that holder stacks on this one (the namespace's
/// place in the stack is taken), else (that holder waits behind this one) refused with
/// [`Held::Refuse`] and left as it is with [`Held::Stack`].
pub(super) fn judge_foreign(
    input: &Creating,
    backend: Backend,
    foreign: &[Foreign],
    claims: &mut Claims,
) -> Result<(), Error> {
    for foreign in foreign {
        let holder = foreign.holder;
        let clashes = |m: &PortMapping| holder.mappings.iter().any(|o| m.conflicts_with(o));
        if let Some(first) = claims.own.iter().find(|m| clashes(m)) {
            let stacked = judge(
                input.held,
                backend,
                &input.id,
                first,
                holder,
                foreign.keeper,
                foreign.membership,
            )?;
            claims.stacked.push(stacked);
            continue;
        }
        let stacks_on_it = |id: &ContainerId| {
            claims
                .holders
                .iter()
                .any(|h| h.container_id == *id && h.stacked_on.contains(&holder.container_id))
        };
        let unstacked = claims
            .shared
            .iter()
            .flat_map(|s| s.mappings.iter().map(move |m| (&s.holder, m)))
            .find(|(id, m)| clashes(m) && !stacks_on_it(id));
        if let (Some((_, mapping)), Held::Refuse) = (unstacked, input.held) {
            return Err(Error::PortClaimed {
                mapping: mapping.clone(),
                holder: foreign.keeper.container_id.clone(),
                origin: foreign.keeper.origin(),
                membership: foreign.membership,
            });
        }
    }
    Ok(())
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

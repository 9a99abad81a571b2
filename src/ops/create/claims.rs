//! create's first step, under the lock: the host-port claims other manifests make on the new
//! container's mappings, judged changing nothing ([`judge_claims`]), and the dead ones released
//! once the manifest is about to be written ahead ([`release_dead`]).

use crate::causes::Causes;
use crate::kernel::conntrack::Flows;
use crate::model::portspec::PortMapping;
use crate::state::ledger::{Locked, Manifest, Phase, Shared};
use crate::state::sharing::{self, Membership, Needs};

use super::super::remove::{remove_container, settle};
use super::held::{self, Stacked};
use super::{Context, Creating, Error, share};

/// The host-port claims other manifests make on this container's mappings.
pub(super) struct Claims {
    /// Manifests whose rules go first, and why: holders of a clashing port whose container
    /// and sharers are all dead, and an earlier create of this same container.
    pub dead: Vec<(Manifest, String)>,
    /// The mappings this container holds itself: its own, less the ports it shares.
    pub own: Vec<PortMapping>,
    /// Mappings this container shares with a live group in its network namespace (pieces
    /// of its mappings, each inside one of the holder's: `share::split_shared`).
    pub shared: Vec<Shared>,
    /// The holders of `shared`, to record this container in their `shared_by`.
    pub holders: Vec<Manifest>,
    /// This container's earlier manifest, when live containers of its namespace share its
    /// rules (also in `dead`, unless its rules can be taken over as they are).
    pub restarted: Option<Manifest>,
    /// Live holders in other network namespaces whose ports this container takes over
    /// ([`super::Held::Stack`]).
    pub stacked: Vec<Stacked>,
}

/// Judge host-port claims, changing nothing: a live holder of the same address, port and
/// protocol in another network namespace is stacked on or refuses the start
/// ([`super::Held`]), judged after sharing (`held::judge_foreign`: ports only shared write
/// nothing to stack); a container in the holder's network namespace
/// (`crate::state::sharing`) asking for ports the holder forwards the same way shares them
/// port by port (`share::split_shared`: a range is cut around them); a holder whose container
/// and sharers are all dead is marked for removal. An earlier manifest of this same container
/// id (a retried create) is replaced the same way ([`judge_same_id`]).
pub(super) fn judge_claims(
    ctx: &Context,
    input: &Creating,
    me: &Manifest,
) -> Result<Claims, Error> {
    let mut others = Vec::new();
    for entry in ctx.ledger.list()? {
        match entry {
            Ok(m) => others.push(m),
            Err(e) => log::warn!("skipping {}", Causes(&e)),
        }
    }
    let needs = Needs::judge(ctx.host, &others);
    let mut claims = Claims {
        own: me.mappings.clone(),
        dead: Vec::new(),
        shared: Vec::new(),
        holders: Vec::new(),
        restarted: None,
        stacked: Vec::new(),
    };
    let mut foreign = Vec::new();
    for other in &others {
        if other.container_id == input.id {
            judge_same_id(ctx, input, me, other, &needs, &mut claims)?;
            continue;
        }
        if let Some(f) = judge_holder(ctx, me, other, &needs, &mut claims)? {
            foreign.push(f);
        }
    }
    held::judge_foreign(input, ctx.backend(), &foreign, &mut claims)?;
    Ok(claims)
}

/// An earlier manifest of this same container id: replaced (its rules go first), unless a
/// live container with this id and another pid holds it.
fn judge_same_id(
    ctx: &Context,
    input: &Creating,
    me: &Manifest,
    other: &Manifest,
    needs: &Needs,
    claims: &mut Claims,
) -> Result<(), Error> {
    let id = &other.container_id;
    // Ids are unique per runtime, not per host: a live container with this id and
    // another pid belongs to someone else (another runtime or namespace).
    if other.pid != input.pid && needs.alive(id) {
        return Err(Error::IdInUse {
            id: input.id.clone(),
            pid: pid_text(other.pid),
        });
    }
    // A holder created again (a restart under the same id) while live containers of
    // its namespace share its rules: they are still needed. In the same namespace it
    // takes its rules over as they are (see `super::adopt`); elsewhere it is
    // refused, like anyone else asking for a held port.
    let sharers = needs.sharers(id);
    if let Some(keeper) = sharers.first() {
        let membership = sharing::membership(ctx.host, me, other, &sharers);
        if membership != Membership::Same {
            return Err(Error::PortClaimed {
                mapping: other
                    .mappings
                    .first()
                    .cloned()
                    .unwrap_or_else(|| me.mappings.first().expect("create has mappings").clone()),
                holder: keeper.container_id.clone(),
                origin: keeper.origin(),
                membership,
            });
        }
        claims.restarted = Some(other.clone());
    }
    claims.dead.push((
        other.clone(),
        "an earlier create of the same container".to_string(),
    ));
    Ok(())
}

/// Another manifest whose mappings clash with this container's: dead (released), a holder of
/// this network namespace (its ports shared), or a holder elsewhere (returned, judged once the
/// shared ports are known).
fn judge_holder<'m>(
    ctx: &Context,
    me: &Manifest,
    other: &'m Manifest,
    needs: &Needs<'m>,
    claims: &mut Claims,
) -> Result<Option<held::Foreign<'m>>, Error> {
    let id = &other.container_id;
    // Every mapping asked for: a shared one may clash with a holder elsewhere too.
    let clash = me
        .mappings
        .iter()
        .find(|m| other.mappings.iter().any(|o| m.conflicts_with(o)));
    let Some(first) = clash.cloned() else {
        return Ok(None);
    };
    if !needs.needed(id) {
        claims
            .dead
            .push((other.clone(), format!("dead holder of {first}")));
        return Ok(None);
    }
    let mut members: Vec<&Manifest> = needs.sharers(id);
    if needs.alive(id) {
        members.insert(0, other);
    }
    let keeper = members[0];
    let membership = sharing::membership(ctx.host, me, other, &members);
    if membership != Membership::Same {
        // Not a member: another holder of the port, judged once the shared ports are known.
        return Ok(Some(held::Foreign {
            holder: other,
            keeper,
            membership,
        }));
    }
    if !claims
        .own
        .iter()
        .any(|m| other.mappings.iter().any(|o| m.conflicts_with(o)))
    {
        return Ok(None); // already shared with another holder of this namespace
    }
    // Only a complete set of rules is shared (not one written ahead by a create that
    // never finished, nor what a failed removal left).
    if other.phase != Phase::Installed {
        return Err(Error::PortClaimed {
            mapping: first,
            holder: keeper.container_id.clone(),
            origin: keeper.origin(),
            membership,
        });
    }
    let (own, shared) = share::split_shared(&claims.own, &other.mappings, id)?;
    claims.own = own;
    claims.shared.push(Shared {
        holder: id.clone(),
        mappings: shared,
    });
    claims.holders.push(other.clone());
    Ok(None)
}

/// Remove the rules and manifests of the dead claims. Returns the UDP and SCTP flows of the
/// forwards removed.
pub(super) fn release_dead(
    ctx: &Context,
    locked: &Locked,
    dead: Vec<(Manifest, String)>,
) -> Vec<Flows> {
    let mut flows = Vec::new();
    for (manifest, why) in dead {
        let id = manifest.container_id.clone();
        let removal = remove_container(ctx, locked, &id, Some(&manifest));
        flows.extend(removal.flows.iter().copied());
        if removal.removed > 0 {
            log::info!(
                "removed {} rule(s) of container {id} ({why})",
                removal.removed
            );
        }
        if let Err(e) = settle(locked, &id, Some(manifest), removal) {
            // The new rules go first in the chain, so leftovers cannot shadow them.
            log::warn!("{}", Causes(&e));
        }
    }
    flows
}

fn pid_text(pid: Option<i32>) -> String {
    pid.map_or_else(|| "unknown".into(), |p| p.to_string())
}

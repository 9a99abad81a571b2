//! What follows a create's writes, written once: under the lock, once the manifest records the
//! rules, the conflict warnings that waited for them and the flows of the DNATs added
//! ([`recorded`]); on every way out, the flows forgotten, the forwards cache carried and the
//! netlink socket released (`ops::after_writes`, shared with removal and sweep), then, on
//! success, who now serves a stacked port, route_localnet
//! and the shared ports said ([`finish`]).

use std::path::Path;

use crate::analysis::forwards;
use crate::kernel::conntrack::Flows;
use crate::kernel::host::Listener;
use crate::model::family::Family;
use crate::model::portspec::PortMapping;
use crate::state::ledger::Manifest;

use super::super::after_writes::{Carry, after_writes};
use super::super::flows;
use super::checks::check_forwards;
use super::held::{self, Stacked};
use super::loopback::allow_loopback_sources;
use super::{Context, Creating, Error};

/// What the way out of [`super::create`] settles, gathered on the way in.
#[derive(Default)]
pub(super) struct AfterWrites {
    /// The UDP and SCTP flows whose conntrack entries go once the rules are in place (or
    /// rolled back): dead holders', and this container's.
    pub stale_flows: Vec<Flows>,
    /// The iptables-nft generation before natledger wrote.
    pub generation: Option<forwards::Before>,
    /// The live holders this container's rules go in front of.
    pub stacked: Vec<Stacked>,
}

/// Under the lock, once `manifest` is recorded as installed: other owners' forwards warned of
/// (`check_after`: the keepers, when the conflicts warn rather than refuse; the legacy nat
/// table is walked as just written), then the flows of the new DNATs marked stale: a packet
/// arriving before them would only have made a new entry on the old path.
pub(super) fn recorded(
    ctx: &Context,
    input: &Creating,
    manifest: &Manifest,
    families: &[Family],
    check_after: Option<Vec<(Listener, PortMapping)>>,
    cache: &Path,
    after: &mut AfterWrites,
) -> Result<(), Error> {
    if let Some(keepers) = check_after {
        forwards::carry(&ctx.netfilter, cache, after.generation.take()); // own commits first
        check_forwards(ctx, input, &manifest.mappings, families, &keepers)?;
    }
    after.stale_flows.extend(flows::of_added(
        manifest
            .rules
            .iter()
            .filter_map(|r| Some((r.family, r.rule()?))),
    ));
    Ok(())
}

/// Whatever happens once rules may have changed, on every way out ([`after_writes`]): the
/// flows that would stay on an old path are forgotten, the forwards cache follows natledger's
/// own transactions, and the netlink socket is released. Then, when the create succeeded: whose
/// port the new container now serves, route_localnet towards it, and the ports it shares.
pub(super) fn finish(
    ctx: &Context,
    cache: &Path,
    after: AfterWrites,
    result: Result<Manifest, Error>,
) -> Result<Manifest, Error> {
    let carry = Carry {
        cache,
        before: after.generation,
    };
    after_writes(ctx, &after.stale_flows, Some(carry));
    let manifest = result?;
    held::log_stacked(&manifest.container_id, ctx.backend(), &after.stacked);
    allow_loopback_sources(ctx, &manifest);
    for shared in &manifest.shares {
        let mappings: Vec<String> = shared.mappings.iter().map(ToString::to_string).collect();
        log::info!(
            "{} shares {} with container {} (same network namespace)",
            manifest.container_id,
            mappings.join(","),
            shared.holder
        );
    }
    Ok(manifest)
}

//! create-runtime: install a container's port forwards and record them, write-ahead.

use std::net::IpAddr;
use std::path::PathBuf;

use crate::analysis::forwards;
use crate::chain::Chain;
use crate::fault;
use crate::kernel::host::{self, Listener};
use crate::kernel::netns::is_global_unicast;
use crate::kernel::netns_id::{NetnsId, proc_netns};
use crate::model::echo::Echo;
use crate::model::family::{Family, IfAddr};
use crate::model::oci::{ContainerId, HookInput, IP_ANNOTATION, PORT_CONFLICT_ANNOTATION};
use crate::model::portspec::bounds::{Bound, MAX_RULES, check_count, coalesce};
use crate::model::portspec::{PortMapping, check_conflicts, parse_entries};
use crate::model::table::Table;
use crate::state::ledger::{CniAttachment, Locked, Manifest, Phase, RuleRecord, SCHEMA, Shared};
use crate::state::liveness;
use crate::state::sharing::{self, Membership, Needs};

use super::remove::{remove_container, settle};
use super::{Context, Error, flows};
use crate::kernel::conntrack::Flows;

mod checks;
mod held;
mod install;
mod limits;
mod loopback;
mod plan;
mod planned;
mod share;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_held;
#[cfg(test)]
mod tests_host;
#[cfg(test)]
mod tests_share;

use checks::*;
pub use held::Held;
use held::Stacked;
use install::*;
use loopback::allow_loopback_sources;
use plan::plan;
pub use planned::planned;

/// What create-runtime did.
#[derive(Debug, PartialEq, Eq)]
pub enum Created {
    /// No `io.natledger.ports`: nothing was run.
    Skipped,
    Installed {
        rules: usize,
    },
}

/// The createRuntime hook. Fails loudly: on any error nothing of this container is left
/// installed (what was applied is rolled back) and the runtime aborts the start. A state
/// without a usable pid (missing, not positive, not a running process) is refused.
pub fn create_runtime(ctx: &Context, input: &HookInput) -> Result<Created, Error> {
    let Some(spec) = input.ports() else {
        return Ok(Created::Skipped);
    };
    // Without a process natledger could never tell that the container is gone: its port
    // would be held forever. (One that is not running is refused by `create`.)
    let pid = match input.pid {
        None => return Err(Error::NoPid(input.id.clone())),
        Some(pid) if pid <= 0 => {
            return Err(Error::BadPid {
                id: input.id.clone(),
                pid,
            });
        }
        Some(pid) => pid,
    };
    let lookup = || container_addresses(ctx, input);
    // Bounded before the conflicts are judged: that is quadratic in the merged mappings.
    let mappings = parse_entries(spec)?;
    check_count(&mappings).map_err(|bound| limits::too_large(&input.id, bound))?;
    check_conflicts(spec, &mappings)?;
    let creating = Creating {
        id: input.id.clone(),
        pid: Some(pid),
        bundle: input.bundle.clone(),
        mappings,
        addresses: &lookup,
        refuse_conflicts: refuse_conflicts(ctx, input),
        // Docker, podman and the Kubernetes scheduler refuse a second holder themselves:
        // their users expect the start to fail (`held`).
        held: Held::Refuse,
        pod: sharing::pod_of(&input.annotations),
        netns: liveness::netns_to_record(ctx.host, &proc_netns(pid)),
        cni: None,
    };
    create(ctx, &creating)
}

/// What a create needs to know of a container, whoever started it: an OCI hook
/// ([`create_runtime`]) or a CNI runtime (the CNI plugin, one attachment).
pub struct Creating<'a> {
    /// The ledger id: the manifest's name and the rules' tag.
    pub id: ContainerId,
    pub pid: Option<i32>,
    pub bundle: Option<PathBuf>,
    pub mappings: Vec<PortMapping>,
    /// The container's addresses, with their subnets' prefixes where known (read before the
    /// lock, and again under it when a create that shares nothing had none).
    pub addresses: &'a dyn Fn() -> Result<Vec<IfAddr>, Error>,
    /// Refuse the start over another owner's forward or a listener, instead of warning.
    pub refuse_conflicts: bool,
    /// A host port a live container in another network namespace holds: stacked on, or
    /// refused.
    pub held: Held,
    pub pod: Option<String>,
    /// The network namespace the container is in.
    pub netns: Option<NetnsId>,
    /// A CNI attachment's parameters, recorded in its manifest.
    pub cni: Option<CniAttachment>,
}

/// Install a container's forwards and record them, write-ahead: claims judged, rules written
/// as recorded, rolled back on failure. Consecutive mappings are recorded merged into ranges,
/// and a container past `portspec::bounds` is refused before the lock.
pub fn create(ctx: &Context, input: &Creating) -> Result<Created, Error> {
    let mappings = limits::merged(ctx.backend(), &input.id, &input.mappings)?;
    // A container that only shares the rules of its namespace needs no address of its own
    // (one joining `--network container:X` of an X forwarded by io.natledger.ip has none);
    // whether it does is known under the lock, where the address is read again if needed.
    let addresses = match (input.addresses)() {
        Ok(addresses) => addresses,
        Err(Error::NoAddress { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    limits::check_rules(ctx.backend(), &input.id, &mappings, &addresses)?;
    let keepers = check_listeners(ctx, input, &mappings)?;
    let pid_start_time = match input.pid {
        Some(pid) => Some(
            ctx.host
                .process(pid)
                .start_time()
                .ok_or_else(|| Error::NotRunning {
                    id: input.id.clone(),
                    pid,
                })?,
        ),
        None => None,
    };
    let locked = ctx.ledger.lock()?;
    // The rules and the split between own and shared mappings are decided under the lock.
    let manifest = Manifest {
        schema: SCHEMA,
        container_id: input.id.clone(),
        bundle: input.bundle.clone(),
        pid: input.pid,
        pid_start_time,
        boot_id: (input.pid.is_some() || input.netns.is_some())
            .then(|| ctx.host.boot_id())
            .flatten(),
        pid_namespace: input.pid.and_then(|_| ctx.host.pid_namespace()),
        phase: Phase::Installing,
        mappings,
        // Recorded bare; their prefixes live in the hairpin rules.
        addresses: addresses.iter().map(|a| a.addr).collect(),
        rules: Vec::new(),
        netns: input.netns,
        pod: input.pod.clone(),
        shares: Vec::new(),
        shared_by: Vec::new(),
        stacked_on: Vec::new(),
        cni: input.cni.clone(),
    };
    // Whatever happens once rules may have changed, on every way out: the flows that would
    // stay on an old path are forgotten, the forwards cache follows natledger's own
    // transactions, and the netlink socket is released.
    let cache = ctx.ledger.file(forwards::CACHE_FILE);
    let mut after = AfterWrites::default();
    let draft = Draft {
        manifest,
        addresses,
    };
    let result = install_locked(ctx, &locked, input, draft, &keepers, &cache, &mut after);
    flows::forget(ctx, &after.stale_flows);
    forwards::carry(&ctx.netfilter, &cache, after.generation);
    ctx.netfilter.release_native();
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
    Ok(Created::Installed {
        rules: manifest.rules.len(),
    })
}

/// The manifest drafted before the lock, and the addresses it records bare, with prefixes.
struct Draft {
    manifest: Manifest,
    addresses: Vec<IfAddr>,
}

/// What the way out of [`create_runtime`] settles, gathered on the way in.
#[derive(Default)]
struct AfterWrites {
    /// The UDP and SCTP flows whose conntrack entries go once the rules are in place (or
    /// rolled back): dead holders', and this container's.
    stale_flows: Vec<Flows>,
    /// The iptables-nft generation before natledger wrote.
    generation: Option<forwards::Before>,
    /// The live holders this container's rules go in front of.
    stacked: Vec<Stacked>,
}

/// create-runtime under the lock: the claims (dead holders, live ones, rules shared in one
/// network namespace), the rules of the mappings this container holds itself, other owners'
/// forwards, the manifest written ahead, the rules per family (rolled back on failure), the
/// manifest as installed.
fn install_locked(
    ctx: &Context,
    locked: &Locked,
    input: &Creating,
    draft: Draft,
    keepers: &[(Listener, PortMapping)],
    cache: &std::path::Path,
    after: &mut AfterWrites,
) -> Result<Manifest, Error> {
    let (mut manifest, mut addresses) = (draft.manifest, draft.addresses);
    let mut claims = judge_claims(ctx, input, &manifest)?;
    // What is left of a range split around shared ports, merged again where consecutive.
    manifest.mappings = coalesce(&claims.own, limits::writes_shifted_ranges(ctx.backend()));
    manifest.shares = std::mem::take(&mut claims.shared);
    after.stacked = std::mem::take(&mut claims.stacked);
    manifest.stacked_on = held::stacked_on(&after.stacked);
    if addresses.is_empty() && !manifest.mappings.is_empty() {
        addresses = (input.addresses)()?;
        manifest.addresses = addresses.iter().map(|a| a.addr).collect();
    }
    manifest.rules = plan(ctx, input, &manifest.mappings, &addresses)?;
    if manifest.rules.len() > MAX_RULES {
        // Addresses read only now (above): still nothing written.
        let bound = Bound::Rules {
            mappings: manifest.mappings.len(),
            rules: manifest.rules.len(),
        };
        return Err(limits::too_large(&input.id, bound));
    }
    // Restarted in the namespace whose live members share its rules: the rules stay where
    // they are when they are exactly what it would write now, so those members' port is
    // never cut; otherwise they are written again, and the members stay named.
    let mut adopted = false;
    if let Some(earlier) = claims.restarted.take() {
        manifest.shared_by = earlier.shared_by.clone();
        if earlier.phase == Phase::Installed && earlier.rules == manifest.rules {
            claims.dead.retain(|(m, _)| m.container_id != input.id);
            manifest.phase = Phase::Installed;
            adopted = true;
        } else {
            log::warn!(
                "container {} restarts with other rules than those live \
                 container(s) of its namespace share; they are written again",
                input.id
            );
        }
    }
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|f| manifest.rules.iter().any(|r| r.family == *f))
        .collect();
    let mut check_after = None;
    if !manifest.mappings.is_empty() && !adopted {
        // Each keeper with the own mapping its port is in (one split around shared ports
        // keeps the pieces that remain).
        let keepers: Vec<(Listener, PortMapping)> = keepers
            .iter()
            .filter_map(|(l, m)| {
                let own = manifest.mappings.iter().find(|o| {
                    o.protocol == m.protocol
                        && o.host_ip == m.host_ip
                        && (o.host_ports.start..=o.host_ports.end).contains(&l.port)
                })?;
                Some((l.clone(), own.clone()))
            })
            .collect();
        // Warnings wait for the rules: the legacy nat table is walked as just written.
        match input.refuse_conflicts {
            true => check_forwards(ctx, input, &manifest.mappings, &families, &keepers)?,
            false => check_after = Some(keepers),
        }
    }
    after.generation = forwards::before_writes(&ctx.netfilter, cache);
    after.stale_flows = release_dead(ctx, locked, claims.dead);
    fault::point(fault::CREATE_CLAIMS_RELEASED);

    // The holders learn of this sharer before its manifest says it shares: a crash between
    // the two leaves a name in `shared_by` with no manifest sharing, which means nothing.
    share::store_holders(locked, input, &claims.holders)?;
    held::store_turned(locked, &after.stacked)?;
    locked.store(&manifest)?;
    if adopted {
        return Ok(manifest);
    }
    fault::point(fault::CREATE_WRITTEN_AHEAD);

    // Written exactly as recorded: the transactions are built from the manifest's records.
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
    // A table that could not be written (the filter accept, see `install`) holds none of
    // these rules: the manifest records exactly what was written.
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
    if let Some(keepers) = check_after {
        forwards::carry(&ctx.netfilter, cache, after.generation.take()); // own commits first
        check_forwards(ctx, input, &manifest.mappings, &families, &keepers)?;
    }
    // Now that the new rules are in place: a packet arriving before them would only have
    // made a new entry on the old path.
    after.stale_flows.extend(flows::of_added(
        manifest
            .rules
            .iter()
            .filter_map(|r| Some((r.family, r.rule()?))),
    ));
    Ok(manifest)
}

/// `io.natledger.ip` (bare addresses: no subnet), or the addresses found inside the
/// container's network namespace, with their interfaces' prefixes.
fn container_addresses(ctx: &Context, input: &HookInput) -> Result<Vec<IfAddr>, Error> {
    if let Some(value) = input.annotations.get(IP_ANNOTATION) {
        let bad = |reason: String| Error::BadIpAnnotation {
            value: Echo::from(value.as_str()),
            reason,
        };
        let addrs = value
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<IpAddr>()
                    .map_err(|e| bad(format!("{s:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(ip) = addrs.iter().find(|ip| !is_global_unicast(**ip)) {
            return Err(bad(format!("{ip} is not a global unicast address")));
        }
        return Ok(addrs.into_iter().map(IfAddr::from).collect());
    }
    let pid = input.pid.ok_or_else(|| Error::NoPid(input.id.clone()))?;
    let addrs = ctx.host.container_addresses(pid)?;
    if addrs.is_empty() {
        return Err(Error::NoAddress {
            pid,
            runtime: input.runtime(),
        });
    }
    Ok(addrs)
}

/// The host-port claims other manifests make on this container's mappings.
struct Claims {
    /// Manifests whose rules go first, and why: holders of a clashing port whose container
    /// and sharers are all dead, and an earlier create of this same container.
    dead: Vec<(Manifest, String)>,
    /// The mappings this container holds itself: its own, less the ports it shares.
    own: Vec<PortMapping>,
    /// Mappings this container shares with a live group in its network namespace (pieces
    /// of its mappings, each inside one of the holder's: `share::split_shared`).
    shared: Vec<Shared>,
    /// The holders of `shared`, to record this container in their `shared_by`.
    holders: Vec<Manifest>,
    /// This container's earlier manifest, when live containers of its namespace share its
    /// rules (also in `dead`, unless its rules can be taken over as they are).
    restarted: Option<Manifest>,
    /// Live holders in other network namespaces whose ports this container takes over
    /// ([`Held::Stack`]).
    stacked: Vec<Stacked>,
}

/// Judge host-port claims, changing nothing: a live holder of the same address, port and
/// protocol in another network namespace is stacked on or refuses the start ([`Held`]), judged
/// after sharing (`held::judge_foreign`: ports only shared write nothing to stack); a
/// container in the holder's network namespace (`crate::state::sharing`) asking for ports the
/// holder forwards the same way shares them port by port (`share::split_shared`: a range is cut around them); a holder whose
/// container and sharers are all dead is marked for removal. An earlier manifest of this same
/// container id (a retried create) is replaced the same way.
fn judge_claims(ctx: &Context, input: &Creating, me: &Manifest) -> Result<Claims, Error> {
    let mut others = Vec::new();
    for entry in ctx.ledger.list()? {
        match entry {
            Ok(m) => others.push(m),
            Err(e) => log::warn!("skipping {}", Chain(&e)),
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
        let id = &other.container_id;
        if *id == input.id {
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
            // takes its rules over as they are (see `install_locked`); elsewhere it is
            // refused, like anyone else asking for a held port.
            let sharers = needs.sharers(id);
            if let Some(keeper) = sharers.first() {
                let membership = sharing::membership(ctx.host, me, other, &sharers);
                if membership != Membership::Same {
                    return Err(Error::PortClaimed {
                        mapping: other.mappings.first().cloned().unwrap_or_else(|| {
                            me.mappings.first().expect("create has mappings").clone()
                        }),
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
            continue;
        }
        // Every mapping asked for: a shared one may clash with a holder elsewhere too.
        let clash = me
            .mappings
            .iter()
            .find(|m| other.mappings.iter().any(|o| m.conflicts_with(o)));
        let Some(first) = clash.cloned() else {
            continue;
        };
        if !needs.needed(id) {
            claims
                .dead
                .push((other.clone(), format!("dead holder of {first}")));
            continue;
        }
        let mut members: Vec<&Manifest> = needs.sharers(id);
        if needs.alive(id) {
            members.insert(0, other);
        }
        let keeper = members[0];
        let membership = sharing::membership(ctx.host, me, other, &members);
        if membership != Membership::Same {
            // Not a member: another holder of the port, judged once the shared ports are known.
            foreign.push(held::Foreign {
                holder: other,
                keeper,
                membership,
            });
            continue;
        }
        if !claims
            .own
            .iter()
            .any(|m| other.mappings.iter().any(|o| m.conflicts_with(o)))
        {
            continue; // already shared with another holder of this namespace
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
    }
    held::judge_foreign(input, ctx.backend(), &foreign, &mut claims)?;
    Ok(claims)
}

/// Remove the rules and manifests of the dead claims. Returns the UDP and SCTP flows of the
/// forwards removed.
fn release_dead(ctx: &Context, locked: &Locked, dead: Vec<(Manifest, String)>) -> Vec<Flows> {
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
            log::warn!("{}", Chain(&e));
        }
    }
    flows
}

fn pid_text(pid: Option<i32>) -> String {
    pid.map_or_else(|| "unknown".into(), |p| p.to_string())
}

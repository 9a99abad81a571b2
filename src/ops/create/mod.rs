//! create-runtime: install a container's port forwards and record them, write-ahead. The
//! steps, under the lock ([`create`]): the claims of other manifests judged (`claims.rs`) and
//! the rules planned; the manifest written ahead; the rules installed, then recorded
//! (`install.rs`); what follows the writes, on every way out, written once (`after.rs`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::analysis::forwards;
use crate::fault;
use crate::kernel::host::Listener;
use crate::kernel::netns::is_global_unicast;
use crate::kernel::netns_id::{NetnsId, proc_netns};
use crate::model::echo::Echo;
use crate::model::family::{Family, IfAddr};
use crate::model::oci::{ContainerId, HookInput, IP_ANNOTATION};
use crate::model::portspec::bounds::{Bound, MAX_RULES, check_count, coalesce};
use crate::model::portspec::{PortMapping, check_conflicts, parse_entries};
use crate::state::ledger::{CniAttachment, Locked, Manifest, Phase, SCHEMA};
use crate::state::liveness;
use crate::state::sharing;

use super::{Context, Error};

mod after;
mod checks;
mod claims;
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

use after::AfterWrites;
use checks::{check_forwards, check_listeners, refuse_conflicts};
use claims::{Claims, judge_claims, release_dead};
pub use held::Held;
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
    let mappings = limits::merged(ctx.driver.capabilities(), &input.id, &input.mappings)?;
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
    let draft = draft(ctx, input, mappings, addresses, pid_start_time);
    let cache = ctx.ledger.file(forwards::CACHE_FILE);
    let mut after = AfterWrites::default();
    let result = install_locked(ctx, &locked, input, draft, &keepers, &cache, &mut after);
    let manifest = after::finish(ctx, &cache, after, result)?;
    Ok(Created::Installed {
        rules: manifest.rules.len(),
    })
}

/// The manifest drafted before the lock, and the addresses it records bare, with prefixes.
struct Draft {
    manifest: Manifest,
    addresses: Vec<IfAddr>,
}

/// The manifest of `input`, phase installing, with no rules yet.
fn draft(
    ctx: &Context,
    input: &Creating,
    mappings: Vec<PortMapping>,
    addresses: Vec<IfAddr>,
    pid_start_time: Option<u64>,
) -> Draft {
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
    Draft {
        manifest,
        addresses,
    }
}

/// create-runtime under the lock, step by step: the claims (dead holders, live ones, rules
/// shared in one network namespace) and the rules of the mappings this container holds
/// itself ([`plan_rules`]), an earlier instance's rules taken over ([`adopt`]), other owners'
/// forwards ([`forward_conflicts`]), the manifest written ahead ([`write_ahead`]), the rules
/// per family (rolled back on failure, [`install::install`]), the manifest as installed
/// ([`install::record`]), and what waited for the rules ([`after::recorded`]).
fn install_locked(
    ctx: &Context,
    locked: &Locked,
    input: &Creating,
    draft: Draft,
    keepers: &[(Listener, PortMapping)],
    cache: &Path,
    after: &mut AfterWrites,
) -> Result<Manifest, Error> {
    let (mut manifest, mut claims) = plan_rules(ctx, input, draft, after)?;
    let adopted = adopt(input, &mut manifest, &mut claims);
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|f| manifest.rules.iter().any(|r| r.family == *f))
        .collect();
    let mut check_after = None;
    if !manifest.mappings.is_empty() && !adopted {
        check_after = forward_conflicts(ctx, input, &manifest, &families, keepers)?;
    }
    write_ahead(ctx, locked, input, &manifest, claims, cache, after)?;
    if adopted {
        return Ok(manifest);
    }
    fault::point(fault::CREATE_WRITTEN_AHEAD);
    let skipped = install::install(ctx, locked, &manifest, after)?;
    let manifest = install::record(ctx, locked, manifest, &skipped, after)?;
    after::recorded(ctx, input, &manifest, &families, check_after, cache, after)?;
    Ok(manifest)
}

/// The claims judged ([`judge_claims`]), and from them the manifest's own mappings, shares
/// and stacks; then its rules planned towards its addresses (read again now if none were
/// before and it needs some), refused past [`MAX_RULES`].
fn plan_rules(
    ctx: &Context,
    input: &Creating,
    draft: Draft,
    after: &mut AfterWrites,
) -> Result<(Manifest, Claims), Error> {
    let (mut manifest, mut addresses) = (draft.manifest, draft.addresses);
    let mut claims = judge_claims(ctx, input, &manifest)?;
    // What is left of a range split around shared ports, merged again where consecutive.
    manifest.mappings = coalesce(
        &claims.own,
        limits::writes_shifted_ranges(ctx.driver.capabilities()),
    );
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
    Ok((manifest, claims))
}

/// Restarted in the namespace whose live members share its rules: the rules stay where
/// they are when they are exactly what it would write now, so those members' port is
/// never cut (returns true: nothing is written but the manifest); otherwise they are
/// written again, and the members stay named.
fn adopt(input: &Creating, manifest: &mut Manifest, claims: &mut Claims) -> bool {
    let Some(earlier) = claims.restarted.take() else {
        return false;
    };
    manifest.shared_by = earlier.shared_by.clone();
    if earlier.phase == Phase::Installed && earlier.rules == manifest.rules {
        claims.dead.retain(|(m, _)| m.container_id != input.id);
        manifest.phase = Phase::Installed;
        return true;
    }
    log::warn!(
        "container {} restarts with other rules than those live \
         container(s) of its namespace share; they are written again",
        input.id
    );
    false
}

/// Other owners' forwards of the manifest's ports: refused now, or (returned) the keepers to
/// warn of once the rules are written (the legacy nat table is then walked as just written).
/// Each keeper goes with the own mapping its port is in (one split around shared ports keeps
/// the pieces that remain).
fn forward_conflicts(
    ctx: &Context,
    input: &Creating,
    manifest: &Manifest,
    families: &[Family],
    keepers: &[(Listener, PortMapping)],
) -> Result<Option<Vec<(Listener, PortMapping)>>, Error> {
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
    match input.refuse_conflicts {
        true => check_forwards(ctx, input, &manifest.mappings, families, &keepers).map(|()| None),
        false => Ok(Some(keepers)),
    }
}

/// The manifest written ahead, once the dead claims are released. The holders learn of this
/// sharer before its manifest says it shares: a crash between the two leaves a name in
/// `shared_by` with no manifest sharing, which means nothing.
fn write_ahead(
    ctx: &Context,
    locked: &Locked,
    input: &Creating,
    manifest: &Manifest,
    claims: Claims,
    cache: &Path,
    after: &mut AfterWrites,
) -> Result<(), Error> {
    after.generation = forwards::before_writes(&ctx.netfilter, cache);
    after.stale_flows = release_dead(ctx, locked, claims.dead);
    fault::point(fault::CREATE_CLAIMS_RELEASED);
    share::store_holders(locked, input, &claims.holders)?;
    held::store_turned(locked, &after.stacked)?;
    locked.store(manifest)?;
    Ok(())
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

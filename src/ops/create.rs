//! create-runtime: install a container's port forwards and record them, write-ahead.

use std::net::IpAddr;

use crate::backend::{Backend, BackendError, Native};
use crate::family::Family;
use crate::fault;
use crate::forwards;
use crate::host::{self, Listener};
use crate::iptc::Place;
use crate::layout::{FILTER, TABLES, goes_first, jump_op, jumps, mapping_rules, owned_chains};
use crate::ledger::{Locked, Manifest, Phase, RuleRecord, SCHEMA};
use crate::netns;
use crate::oci::{HookInput, IP_ANNOTATION, PORT_CONFLICT_ANNOTATION, PORT_CONFLICT_ENV};
use crate::portspec::{PortMapping, parse_mappings};
use crate::procfs;
use crate::rule::Rule;
use crate::save::{Batch, Op};

use super::remove::{remove_container, settle};
use super::{Context, Error, flows};
use crate::conntrack::Flows;

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
/// installed (what was applied is rolled back) and the runtime aborts the start.
pub fn create_runtime(ctx: &Context, input: &HookInput) -> Result<Created, Error> {
    let Some(spec) = input.ports() else {
        return Ok(Created::Skipped);
    };
    let mappings = parse_mappings(spec)?;
    let keepers = check_listeners(input, &mappings)?;
    let addresses = container_addresses(input)?;
    let rules = plan(ctx, input, &mappings, &addresses)?;
    let pid_start_time = match input.pid {
        Some(pid) => Some(procfs::start_time(pid).ok_or_else(|| Error::NotRunning {
            id: input.id.clone(),
            pid,
        })?),
        None => None,
    };
    let locked = ctx.ledger.lock()?;
    let manifest = Manifest {
        schema: SCHEMA,
        container_id: input.id.clone(),
        bundle: input.bundle.clone(),
        pid: input.pid,
        pid_start_time,
        boot_id: input.pid.and_then(|_| procfs::boot_id()),
        pid_namespace: input.pid.and_then(|_| procfs::pid_namespace()),
        phase: Phase::Installing,
        mappings,
        addresses,
        rules,
    };
    // Whatever happens once rules may have changed, on every way out: the flows that would
    // stay on an old path are forgotten, the forwards cache follows natledger's own
    // transactions, and the netlink socket is released.
    let cache = ctx.ledger.file(forwards::CACHE_FILE);
    let mut after = AfterWrites::default();
    let result = install_locked(ctx, &locked, input, manifest, &keepers, &cache, &mut after);
    flows::forget(ctx, &after.stale_flows);
    forwards::carry(&ctx.netfilter, &cache, after.generation);
    ctx.netfilter.release_native();
    let manifest = result?;
    allow_loopback_sources(&manifest.mappings, &manifest.addresses);
    Ok(Created::Installed {
        rules: manifest.rules.len(),
    })
}

/// What the way out of [`create_runtime`] settles, gathered on the way in.
#[derive(Default)]
struct AfterWrites {
    /// The UDP and SCTP flows whose conntrack entries go once the rules are in place (or
    /// rolled back): dead holders', and this container's.
    stale_flows: Vec<Flows>,
    /// The iptables-nft generation before natledger wrote.
    generation: Option<forwards::Before>,
}

/// create-runtime under the lock: other owners' forwards, claims, the manifest written
/// ahead, the rules per family (rolled back on failure), the manifest as installed.
fn install_locked(
    ctx: &Context,
    locked: &Locked,
    input: &HookInput,
    mut manifest: Manifest,
    keepers: &[(Listener, PortMapping)],
    cache: &std::path::Path,
    after: &mut AfterWrites,
) -> Result<Manifest, Error> {
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|f| manifest.rules.iter().any(|r| r.family == *f))
        .collect();
    check_forwards(ctx, input, &manifest.mappings, &families, keepers)?;
    after.generation = forwards::before_writes(&ctx.netfilter, cache);
    after.stale_flows = release_claims(ctx, locked, input, &manifest.mappings)?;
    fault::point(fault::CREATE_CLAIMS_RELEASED);

    locked.store(&manifest)?;
    fault::point(fault::CREATE_WRITTEN_AHEAD);

    // Written exactly as recorded: the transactions are built from the manifest's records.
    let mut installed: Vec<Family> = Vec::new();
    let mut skipped: Vec<(Family, &'static str)> = Vec::new();
    for family in Family::ALL {
        let rules: Vec<&RuleRecord> = manifest
            .rules
            .iter()
            .filter(|r| r.family == family)
            .collect();
        if rules.is_empty() {
            continue;
        }
        match install(ctx, family, &rules) {
            Ok(not_written) => skipped.extend(not_written.into_iter().map(|t| (family, t))),
            Err(failed) => {
                // Roll back the families installed before, and this one when one of its
                // tables went in before another failed. The manifest goes unless something
                // could not be removed, in which case it names what may remain.
                if failed.partial {
                    installed.push(family);
                }
                if installed.is_empty() {
                    locked.remove(&input.id)?;
                } else {
                    let mut applied = manifest.clone();
                    applied.rules.retain(|r| installed.contains(&r.family));
                    let removal = remove_container(ctx, locked, &input.id, Some(&applied));
                    after.stale_flows.extend(removal.flows.iter().copied());
                    if let Err(undo) = settle(locked, &input.id, Some(applied), removal) {
                        eprintln!("natledger: rollback incomplete: {undo}");
                    }
                }
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
        .retain(|r| !skipped.iter().any(|(f, t)| r.family == *f && r.table == *t));
    manifest.phase = Phase::Installed;
    locked.store(&manifest)?;
    fault::point(fault::CREATE_RECORDED);
    // Now that the new rules are in place: a packet arriving before them would only have
    // made a new entry on the old path.
    after.stale_flows.extend(flows::of_rules(
        manifest.rules.iter().map(|r| (r.family, r.rule.as_slice())),
    ));
    Ok(manifest)
}

/// Whether the container or the host asked to refuse a start over a conflict
/// (`io.natledger.port-conflict=refuse`, `NATLEDGER_PORT_CONFLICT=refuse`); else a warning.
fn refuse_conflicts(input: &HookInput) -> bool {
    let setting = input
        .annotations
        .get(PORT_CONFLICT_ANNOTATION)
        .cloned()
        .or_else(|| std::env::var(PORT_CONFLICT_ENV).ok());
    setting.as_deref() == Some("refuse")
}

/// Another owner's DNAT or REDIRECT for a mapped host port, in either backend
/// ([`forwards::find`]): natledger's jump comes first in its own backend, so the port's
/// traffic would be split between that owner's destination and this container. Warn naming
/// each rule, or refuse (see [`refuse_conflicts`]) before anything is written. A port keeper
/// listening on a mapped port (`keepers`, from [`check_listeners`]) holds it for such a
/// forward: the same conflict, said with the rule when one is found, else on its own.
fn check_forwards(
    ctx: &Context,
    input: &HookInput,
    mappings: &[PortMapping],
    families: &[Family],
    keepers: &[(Listener, PortMapping)],
) -> Result<(), Error> {
    let refuse = refuse_conflicts(input);
    let (found, unread) = if ctx.netfilter.forwards() {
        let cache = ctx.ledger.file(forwards::CACHE_FILE);
        forwards::find(&ctx.netfilter, &cache, mappings, families)
    } else {
        (Vec::new(), Vec::new())
    };
    if let (true, Some(e)) = (refuse, unread.first()) {
        // Refusing over conflicts means not starting on a guess.
        return Err(Error::ForwardsUnchecked(e.to_string()));
    }
    for e in unread {
        eprintln!("natledger: warning: {e}; other owners' forwards there were not checked");
    }
    for (keeper, mapping) in keepers {
        if found.iter().any(|f| f.mapping == *mapping) {
            continue;
        }
        let who = listener_text(keeper);
        if refuse {
            return Err(Error::PortInUse {
                mapping: mapping.clone(),
                who,
                addr: keeper.addr,
            });
        }
        eprintln!(
            "natledger: warning: {who} holds {} port {}/{} for another owner's forward of it, \
             which {mapping} would take over for this container",
            keeper.addr, keeper.port, keeper.protocol
        );
    }
    for f in found {
        let rule = f.candidate.rule();
        let line = crate::xt::save_line(&rule.chain, &rule.args);
        let via: Vec<&str> = f.candidate.path.iter().map(|s| s.chain.as_str()).collect();
        let place = format!(
            "{} {} nat chain {} (rule {}, reached through {})",
            f.backend,
            f.family,
            rule.chain,
            rule.position,
            via.join(" -> ")
        );
        let held = keepers
            .iter()
            .find(|(_, m)| *m == f.mapping)
            .map(|(k, _)| format!(" ({} holds the port for it)", listener_text(k)))
            .unwrap_or_default();
        let place = format!("{place}{held}");
        if refuse {
            return Err(Error::PortForwarded {
                mapping: f.mapping,
                place,
                line,
            });
        }
        eprintln!(
            "natledger: warning: host port {} is already forwarded by another owner's rule in \
             {place}: {line}; its traffic would be split between that destination and this \
             container",
            f.mapping
        );
    }
    Ok(())
}

/// A local process already listening on a mapped host port loses that traffic to the
/// container (the DNAT comes first): warn, or refuse (see [`refuse_conflicts`]). A port
/// keeper (docker-proxy, kube-proxy, …) listens for another owner's forward of the port:
/// returned, with its mapping, for [`check_forwards`] to judge with that forward.
fn check_listeners(
    input: &HookInput,
    mappings: &[PortMapping],
) -> Result<Vec<(Listener, PortMapping)>, Error> {
    let clash = |l: &Listener, m: &PortMapping| {
        m.protocol == l.protocol
            && (m.host_ports.start..=m.host_ports.end).contains(&l.port)
            && match m.host_destination() {
                Some(ip) => l.addr.is_unspecified() || l.addr == ip || ip.is_unspecified(),
                None => true,
            }
    };
    let listeners = host::listeners_where(&host::Roots::default(), |l| {
        mappings.iter().any(|m| clash(l, m))
    });
    let refuse = refuse_conflicts(input);
    let mut keepers = Vec::new();
    for l in listeners {
        let mapping = mappings
            .iter()
            .find(|m| clash(&l, m))
            .expect("selected above");
        let keeper = l
            .command
            .as_deref()
            .is_some_and(|c| host::PORT_KEEPERS.contains(&c));
        if keeper {
            keepers.push((l, mapping.clone()));
            continue;
        }
        let who = listener_text(&l);
        if refuse {
            return Err(Error::PortInUse {
                mapping: mapping.clone(),
                who,
                addr: l.addr,
            });
        }
        eprintln!(
            "natledger: warning: {who} listens on {} port {}/{}, which {mapping} forwards to \
             the container; that process no longer gets those connections",
            l.addr, l.port, l.protocol
        );
    }
    Ok(keepers)
}

/// `COMMAND (pid N)`, or the socket when its owner is unknown.
fn listener_text(l: &Listener) -> String {
    match (&l.command, l.pid) {
        (Some(c), Some(p)) => format!("{c} (pid {p})"),
        _ => format!("a process (socket inode {})", l.inode),
    }
}

/// `io.natledger.ip`, or the addresses found inside the container's network namespace.
fn container_addresses(input: &HookInput) -> Result<Vec<IpAddr>, Error> {
    if let Some(value) = input.annotations.get(IP_ANNOTATION) {
        let bad = |reason: String| Error::BadIpAnnotation {
            value: value.clone(),
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
        if let Some(ip) = addrs.iter().find(|ip| !netns::is_global_unicast(**ip)) {
            return Err(bad(format!("{ip} is not a global unicast address")));
        }
        return Ok(addrs);
    }
    let pid = input.pid.ok_or_else(|| Error::NoPid(input.id.clone()))?;
    let addrs = netns::container_addresses(pid)?;
    if addrs.is_empty() {
        return Err(Error::NoAddress { pid });
    }
    Ok(addrs)
}

/// The records of every rule to write, for every mapping, each towards the container's first
/// address of the family, in the backend new rules go to.
fn plan(
    ctx: &Context,
    input: &HookInput,
    mappings: &[PortMapping],
    addresses: &[IpAddr],
) -> Result<Vec<RuleRecord>, Error> {
    let address_of = |family: Family| addresses.iter().copied().find(|a| Family::of(*a) == family);
    let mut placed = Vec::new();
    for mapping in mappings {
        let families: Vec<Family> = match mapping.family() {
            Some(family) => {
                if address_of(family).is_none() {
                    return Err(Error::FamilyMismatch {
                        mapping: mapping.clone(),
                        family,
                        have: addresses.to_vec(),
                    });
                }
                vec![family]
            }
            None => Family::ALL
                .into_iter()
                .filter(|f| address_of(*f).is_some())
                .collect(),
        };
        for family in families {
            let container = address_of(family).expect("filtered above");
            placed.extend(
                mapping_rules(&input.id, mapping, container)
                    .into_iter()
                    .map(|p| RuleRecord {
                        backend: ctx.backend,
                        family,
                        table: p.table.into(),
                        chain: p.chain.to_string(),
                        rule: p.rule.to_args(),
                    }),
            );
        }
    }
    Ok(placed)
}

/// Turn on route_localnet towards the container when a mapping answers on 127.0.0.1.
/// A failure only costs the localhost path, so it is a warning.
fn allow_loopback_sources(mappings: &[PortMapping], addresses: &[IpAddr]) {
    let wanted = mappings
        .iter()
        .any(|m| m.reachable_from_loopback() && m.family() != Some(Family::Ipv6));
    let v4 = addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    });
    if let (true, Some(v4)) = (wanted, v4) {
        match netns::enable_route_localnet(v4) {
            Ok(Some(iface)) => eprintln!("natledger: set route_localnet=1 on {iface}"),
            Ok(None) => {}
            Err(e) => eprintln!("natledger: warning: 127.0.0.1 will not reach {v4}: {e}"),
        }
    }
}

/// Enforce host-port claims: a live holder of the same address, port and protocol refuses
/// the start; a dead holder's rules are removed first. An earlier manifest of this same
/// container id (a retried create) is replaced the same way. Returns the UDP and SCTP flows
/// of the forwards removed.
fn release_claims(
    ctx: &Context,
    locked: &Locked,
    input: &HookInput,
    mappings: &[PortMapping],
) -> Result<Vec<Flows>, Error> {
    let mut dead = Vec::new();
    for entry in ctx.ledger.list()? {
        let other = match entry {
            Ok(m) => m,
            Err(e) => {
                eprintln!("natledger: warning: skipping {e}");
                continue;
            }
        };
        let same_container = other.container_id == input.id;
        let clash = mappings
            .iter()
            .find(|m| other.mappings.iter().any(|o| m.conflicts_with(o)));
        let alive = || other.alive();
        if same_container {
            // Ids are unique per runtime, not per host: a live container with this id and
            // another pid belongs to someone else (another runtime or namespace).
            if other.pid != input.pid && alive() {
                return Err(Error::IdInUse {
                    id: input.id.clone(),
                    pid: pid_text(other.pid),
                });
            }
            dead.push((other, "an earlier create of the same container".to_string()));
        } else if let Some(mapping) = clash {
            if alive() {
                return Err(Error::PortClaimed {
                    mapping: mapping.clone(),
                    holder: other.container_id,
                    pid: pid_text(other.pid),
                });
            }
            dead.push((other, format!("dead holder of {mapping}")));
        }
    }
    let mut flows = Vec::new();
    for (manifest, why) in dead {
        let id = manifest.container_id.clone();
        let removal = remove_container(ctx, locked, &id, Some(&manifest));
        flows.extend(removal.flows.iter().copied());
        eprintln!(
            "natledger: removed {} rule(s) of container {id} ({why})",
            removal.removed
        );
        if let Err(e) = settle(locked, &id, Some(manifest), removal) {
            // The new rules go first in the chain, so leftovers cannot shadow them.
            eprintln!("natledger: warning: {e}");
        }
    }
    Ok(flows)
}

fn pid_text(pid: Option<i32>) -> String {
    pid.map_or_else(|| "unknown".into(), |p| p.to_string())
}

/// Why [`install`] failed, and whether one of the family's tables may have been written.
struct InstallError {
    error: BackendError,
    partial: bool,
}

/// Install one family's rules: one transaction per table, filter before nat (the accept is in
/// force before the DNAT is). First try assuming the shared chains and jumps exist: on legacy
/// in-process ([`crate::iptc`], declined unless they do; once a table is left to a process,
/// so are the ones after it, to keep the order), otherwise with one restore process whose
/// transaction per table checks that table's jumps with `-C` (a missing jump fails it
/// atomically; the tables before it stay committed). Then read each table not yet written and
/// create what is missing.
///
/// The filter accept is needed only where FORWARD drops, and the nat rules forward from the
/// node whatever happens to it: a filter table natledger cannot write (an nft `ip filter`
/// table iptables-nft cannot read, a kernel without the filter table) is a warning, and is
/// returned, so that the manifest records exactly what was written.
fn install(
    ctx: &Context,
    family: Family,
    rules: &[&RuleRecord],
) -> Result<Vec<&'static str>, InstallError> {
    let mut partial = false;
    let mut pending: Vec<(&'static str, Vec<Placement>)> = Vec::new();
    for table in TABLES {
        let here: Vec<&RuleRecord> = rules.iter().copied().filter(|r| r.table == table).collect();
        if here.is_empty() {
            continue;
        }
        let placed = placements(&here);
        if ctx.backend == Backend::Legacy
            && pending.is_empty()
            && insert_native(ctx, family, table, &placed)
        {
            partial = true;
            continue;
        }
        pending.push((table, placed));
    }
    let mut skipped = Vec::new();
    if pending.is_empty() {
        return Ok(skipped);
    }
    let fast: Vec<Batch> = pending
        .iter()
        .map(|(table, placed)| {
            let mut batch = Batch::new(table);
            for (chain, jump) in jumps(table) {
                batch.ops.push(Op::Check(chain.to_string(), jump.to_args()));
            }
            push_rules(&mut batch, placed);
            batch
        })
        .collect();
    let first_block = fast[0].render().lines().count();
    match ctx.netfilter.apply_all(ctx.backend, family, &fast) {
        Ok(()) => return Ok(skipped),
        // The first table's transaction failed: nothing was committed.
        Err(BackendError::Failed { line: Some(n), .. }) if n <= first_block => {}
        // The tables before the failed one are committed (they show every rule already).
        Err(_) => partial |= pending.len() > 1,
    }
    for (table, placed) in &pending {
        let written = write_table(ctx, family, table, placed);
        match written {
            Ok(wrote) => partial |= wrote,
            Err(error) if *table == FILTER => {
                eprintln!(
                    "natledger: warning: the {family} forward accept was not written ({error}); \
                     where FORWARD drops, these ports answer only from this host (doctor: \
                     forward-dropped)"
                );
                skipped.push(FILTER);
            }
            Err(error) => return Err(InstallError { error, partial }),
        }
    }
    Ok(skipped)
}

/// Read `table` and write what is missing of `placed`, its chains and jumps included; whether
/// anything was written (a table showing every rule already was committed before).
fn write_table(
    ctx: &Context,
    family: Family,
    table: &'static str,
    placed: &[Placement],
) -> Result<bool, BackendError> {
    let dump = ctx
        .netfilter
        .read(ctx.backend, family, table)?
        .unwrap_or_default();
    if all_present(&dump, placed) {
        return Ok(false);
    }
    let mut full = Batch::new(table);
    for chain in owned_chains(table) {
        if !dump.has_chain(chain) {
            full.ops.push(Op::DeclareChain(chain.to_string()));
        }
    }
    for (chain, jump) in jumps(table) {
        let present = dump
            .rules_in(chain)
            .any(|r| Rule::parse_args(&r.args).is_ok_and(|r| r == jump));
        if !present {
            full.ops.push(jump_op(&dump, chain, jump.to_args()));
        }
    }
    push_rules(&mut full, placed);
    ctx.netfilter.apply(ctx.backend, family, &full)?;
    Ok(true)
}

/// On legacy, insert one table's rules in-process; whether that was done.
fn insert_native(ctx: &Context, family: Family, table: &'static str, placed: &[Placement]) -> bool {
    let parsed: Option<Vec<(&str, Rule, Place)>> = placed
        .iter()
        .map(|(chain, args, place)| Some((*chain, Rule::parse_args(args).ok()?, *place)))
        .collect();
    let Some(parsed) = parsed else {
        return false;
    };
    match ctx
        .netfilter
        .insert_legacy(family, table, &parsed, &jumps(table))
    {
        Ok(Native::Done(_)) => true,
        Ok(Native::Declined | Native::Off) => false,
        // Nothing was written; the restore reports what is really wrong.
        Err(e) => {
            eprintln!(
                "natledger: {e}; using {}-legacy-restore",
                family.tool_stem()
            );
            false
        }
    }
}

/// Whether every rule of `placed` is in the dump (as many times as placed).
fn all_present(dump: &crate::save::Table, placed: &[Placement]) -> bool {
    placed.iter().all(|(chain, args, _)| {
        let wanted = placed
            .iter()
            .filter(|(c, a, _)| c == chain && a == args)
            .count();
        dump.rules_in(chain).filter(|r| r.args == *args).count() >= wanted
    })
}

type Placement<'a> = (&'a str, &'a [String], Place);

/// Where each rule goes: DNAT rules to the top of their chain (newest container first, in
/// mapping order, so they are inserted in reverse), masquerade rules appended.
fn placements<'a>(rules: &[&'a RuleRecord]) -> Vec<Placement<'a>> {
    let first = rules.iter().rev().filter(|r| goes_first(&r.chain));
    let last = rules.iter().filter(|r| !goes_first(&r.chain));
    first
        .map(|r| (r.chain.as_str(), r.rule.as_slice(), Place::First))
        .chain(last.map(|r| (r.chain.as_str(), r.rule.as_slice(), Place::Last)))
        .collect()
}

fn push_rules(batch: &mut Batch, placed: &[Placement]) {
    for (chain, args, place) in placed {
        let (chain, args) = (chain.to_string(), args.to_vec());
        batch.ops.push(match place {
            Place::First => Op::InsertFirst(chain, args),
            Place::Last => Op::Append(chain, args),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Invocation, Outcome, Runner};
    use crate::ledger::Ledger;
    use std::cell::RefCell;

    /// A scripted runner: answers each call with the next outcome and records the call.
    struct Script {
        answers: RefCell<Vec<Outcome>>,
        calls: RefCell<Vec<Invocation>>,
    }

    impl Script {
        fn new(answers: Vec<Outcome>) -> Self {
            Script {
                answers: RefCell::new(answers.into_iter().rev().collect()),
                calls: RefCell::new(Vec::new()),
            }
        }
    }

    impl Runner for Script {
        fn run(&self, inv: &Invocation) -> std::io::Result<Outcome> {
            self.calls.borrow_mut().push(inv.clone());
            Ok(self
                .answers
                .borrow_mut()
                .pop()
                .expect("no more scripted answers"))
        }
    }

    fn ok(stdout: &str) -> Outcome {
        Outcome {
            code: Some(0),
            stdout: stdout.into(),
            stderr: Vec::new(),
        }
    }

    fn fail() -> Outcome {
        Outcome {
            code: Some(1),
            stdout: Vec::new(),
            stderr: b"iptables-restore: line 2 failed".to_vec(),
        }
    }

    fn input(dir: &std::path::Path) -> HookInput {
        HookInput {
            id: "c1".parse().unwrap(),
            pid: None,
            bundle: Some(dir.into()),
            annotations: [
                ("io.natledger.ports".to_string(), "8080:80".to_string()),
                ("io.natledger.ip".to_string(), "10.77.0.2".to_string()),
            ]
            .into(),
        }
    }

    fn stdin_of(inv: &Invocation) -> String {
        String::from_utf8(inv.stdin.clone().unwrap()).unwrap()
    }

    #[test]
    fn with_the_shared_chains_present_create_is_one_restore() {
        let dir = tempfile::tempdir().unwrap();
        let script = Script::new(vec![ok("")]);
        let ctx = Context::new(
            Ledger::new(dir.path()),
            crate::backend::Backend::Nft,
            &script,
        );
        let created = create_runtime(&ctx, &input(dir.path())).unwrap();
        assert_eq!(created, Created::Installed { rules: 4 });
        let calls = script.calls.borrow();
        assert_eq!(calls.len(), 1);
        assert!(calls[0].program.ends_with("iptables-nft-restore"));
        let batch = stdin_of(&calls[0]);
        // Filter first: the accept is in force before the DNAT.
        let (filter, nat) = batch.split_once("*nat").unwrap();
        assert!(filter.starts_with("*filter\n"));
        assert!(filter.contains("-C FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD"));
        assert!(filter.contains("-A NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6"));
        assert!(nat.contains("-C PREROUTING -m addrtype --dst-type LOCAL"));
        assert!(nat.contains("-I NATLEDGER-HOSTPORTS 1 -p tcp"));
        let manifest = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
        assert_eq!(manifest.phase, Phase::Installed);
        assert_eq!(manifest.rules.len(), 4);
        assert_eq!(manifest.rules[0].table, "filter");
    }

    #[test]
    fn without_them_create_reads_and_creates_only_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let dump = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
                    :NATLEDGER-MASQ - [0:0]\n\
                    -A POSTROUTING -m comment --comment natledger -j NATLEDGER-MASQ\nCOMMIT\n";
        // Docker's FORWARD: natledger's jump goes after DOCKER-USER, the isolation jump and the
        // rest.
        let filter = "*filter\n:FORWARD DROP [0:0]\n:DOCKER-USER - [0:0]\n\
                      :DOCKER-ISOLATION-STAGE-1 - [0:0]\n:DOCKER - [0:0]\n\
                      -A FORWARD -j DOCKER-USER\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
                      -A FORWARD -o docker0 -j DOCKER\nCOMMIT\n";
        let script = Script::new(vec![fail(), ok(filter), ok(""), ok(dump), ok("")]);
        let ctx = Context::new(
            Ledger::new(dir.path()),
            crate::backend::Backend::Nft,
            &script,
        );
        create_runtime(&ctx, &input(dir.path())).unwrap();
        let calls = script.calls.borrow();
        assert_eq!(calls.len(), 5);
        assert_eq!(calls[1].args, ["-t", "filter"]);
        let batch = stdin_of(&calls[2]);
        assert!(batch.contains(":NATLEDGER-FORWARD - [0:0]"));
        assert!(batch.contains("-A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD"));
        assert_eq!(calls[3].args, ["-t", "nat"]);
        let batch = stdin_of(&calls[4]);
        assert!(batch.contains(":NATLEDGER-HOSTPORTS - [0:0]"));
        assert!(
            !batch.contains(":NATLEDGER-MASQ"),
            "an existing chain is never redeclared"
        );
        assert!(batch.contains("-I PREROUTING 1"));
        assert!(batch.contains("-I OUTPUT 1"));
        assert!(
            !batch.contains("-I POSTROUTING"),
            "an existing jump is not duplicated"
        );
    }

    #[test]
    fn a_failed_install_leaves_no_manifest() {
        let dir = tempfile::tempdir().unwrap();
        // The fast transaction fails, then reading the tables fails (the filter table only
        // costs its accept, the nat table the start): nothing was applied, so the rollback
        // starts no process and only drops the manifest.
        let script = Script::new(vec![fail(), fail(), fail()]);
        let ctx = Context::new(
            Ledger::new(dir.path()),
            crate::backend::Backend::Nft,
            &script,
        );
        let err = create_runtime(&ctx, &input(dir.path())).unwrap_err();
        assert!(
            err.to_string().contains("iptables-nft-save -t nat failed"),
            "{err}"
        );
        assert!(!ctx.ledger.has_manifest(&"c1".parse().unwrap()));
        assert_eq!(script.calls.borrow().len(), 3);
    }

    #[test]
    fn a_filter_table_that_cannot_be_written_costs_only_the_accept() {
        let dir = tempfile::tempdir().unwrap();
        let nat = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n";
        let script = Script::new(vec![fail(), fail(), ok(nat), ok("")]);
        let ctx = Context::new(
            Ledger::new(dir.path()),
            crate::backend::Backend::Nft,
            &script,
        );
        let created = create_runtime(&ctx, &input(dir.path())).unwrap();
        assert_eq!(created, Created::Installed { rules: 3 });
        let manifest = ctx.ledger.load(&"c1".parse().unwrap()).unwrap().unwrap();
        assert!(
            manifest.rules.iter().all(|r| r.table == "nat"),
            "{manifest:?}"
        );
        assert_eq!(manifest.phase, Phase::Installed);
    }

    #[test]
    fn no_annotation_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let script = Script::new(vec![]);
        let ctx = Context::new(
            Ledger::new(dir.path()),
            crate::backend::Backend::Nft,
            &script,
        );
        let mut plain = input(dir.path());
        plain.annotations.clear();
        assert_eq!(create_runtime(&ctx, &plain).unwrap(), Created::Skipped);
        assert!(script.calls.borrow().is_empty());
        assert!(!dir.path().join("containers").exists());
    }

    #[test]
    fn tags_name_the_container() {
        assert_eq!(crate::layout::tag(&"abc".parse().unwrap()), "natledger:abc");
    }
}

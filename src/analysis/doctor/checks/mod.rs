//! The checks. Each turns rulesets (and, live, host evidence) into findings; this module
//! holds what they share (the walks of every table's hooks, host facts, how rules and
//! packets are put in words), each check is a file of its own.

mod dead_targets;
mod forward;
mod listeners;
mod localhost;
mod natledger_state;
mod regenerated;
mod shadowed;
mod split_backends;
mod words;
mod xtables_lock;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use super::evidence::{self, Listener, Reservation, Roots, RuntimeContainer};
use super::{DoctorOptions, Finding, NotFollowed, RuleRef, Ruleset};
use crate::analysis::iptables::paths::{self, Step};
use crate::backend::{Backend, Detected};
use crate::kernel::machine;
use crate::model::anyrule::{Cond, Match, Target, parse_rule};
use crate::model::family::Family;
use crate::model::layout::{Owner, is_owned_chain, owner};
use crate::model::oci::ContainerId;
use crate::state::ledger::Manifest;
use crate::state::liveness::Batched;
use crate::state::sharing::Needs;

/// The built-in chains each table's packets to a host port go through, in hook order.
const NAT_HOOKS: [&str; 2] = ["PREROUTING", "OUTPUT"];
const FILTER_HOOKS: [&str; 3] = ["INPUT", "FORWARD", "OUTPUT"];

/// Facts about the live host.
pub(crate) struct Host {
    listeners: Vec<Listener>,
    reservations: Vec<Reservation>,
    cni_present: bool,
    containers: Vec<RuntimeContainer>,
    /// Whether any runtime state directory exists (absence from it means something).
    runtime_state: bool,
    manifests: Vec<Manifest>,
    /// Whose rules are in force, judged once through the host seam.
    liveness: Liveness,
    /// Why the ledger could not be read (a state directory natledger refuses): its rules are
    /// then not judged against manifests.
    ledger_error: Option<String>,
    /// Where route_localnet is on.
    route_localnet: evidence::RouteLocalnet,
    roots: Roots,
    /// natledger's own nftables tables (`crate::kernel::nftables::own`), per family: read for the
    /// natledger-state check only (no other owner writes there, and the other checks walk
    /// iptables dumps).
    own: Vec<Ruleset>,
}

impl Host {
    /// The host's facts; the manifests' containers judged through `machine`.
    pub(crate) fn gather(opts: &DoctorOptions, machine: &dyn machine::Host) -> Host {
        let (manifests, ledger_error) = match opts.ledger.list() {
            Ok(all) => (all.into_iter().flatten().collect(), None),
            Err(e) => (Vec::new(), Some(crate::causes::text(&e))),
        };
        Host {
            liveness: Liveness::judge(machine, &manifests),
            listeners: evidence::listeners(&opts.roots),
            reservations: evidence::cni_reservations(&opts.roots),
            cni_present: evidence::cni_networks_present(&opts.roots),
            containers: evidence::runtime_containers(&opts.roots),
            runtime_state: evidence::runtime_state_present(&opts.roots),
            manifests,
            ledger_error,
            route_localnet: evidence::route_localnet(&opts.roots),
            roots: opts.roots.clone(),
            own: own_tables(opts),
        }
    }
}

impl Host {
    /// Listening sockets (for the native checks).
    pub(crate) fn listeners(&self) -> &[Listener] {
        &self.listeners
    }

    pub(crate) fn roots(&self) -> &Roots {
        &self.roots
    }
}

#[cfg(test)]
impl Host {
    /// A host with only `manifests`, judged through `machine`, and no other evidence.
    pub(crate) fn of_manifests(manifests: Vec<Manifest>, machine: &dyn machine::Host) -> Host {
        Host {
            listeners: Vec::new(),
            reservations: Vec::new(),
            cni_present: false,
            containers: Vec::new(),
            runtime_state: false,
            liveness: Liveness::judge(machine, &manifests),
            manifests,
            ledger_error: None,
            route_localnet: evidence::RouteLocalnet::default(),
            roots: Roots::default(),
            own: Vec::new(),
        }
    }
}

/// Whose rules are in force (`sharing::Needs`), judged once when doctor gathers its inputs,
/// through the host seam: the checks ask this, never the machine.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    alive: HashSet<ContainerId>,
    /// Per container, the live containers sharing its rules (none listed: nobody).
    sharers: HashMap<ContainerId, Vec<ContainerId>>,
}

impl Liveness {
    pub(crate) fn judge(machine: &dyn machine::Host, manifests: &[Manifest]) -> Liveness {
        let batched = Batched::new(machine, manifests.iter().map(Manifest::recorded));
        let needs = Needs::judge(&batched, manifests);
        let ids = || manifests.iter().map(|m| &m.container_id);
        Liveness {
            alive: ids().filter(|id| needs.alive(id)).cloned().collect(),
            sharers: ids()
                .map(|id| {
                    let sharers = needs.sharers(id).into_iter();
                    (
                        id.clone(),
                        sharers.map(|s| s.container_id.clone()).collect(),
                    )
                })
                .filter(|(_, sharers): &(_, Vec<_>)| !sharers.is_empty())
                .collect(),
        }
    }

    /// Whether container `id`'s own process (or namespace) lives.
    pub(crate) fn alive(&self, id: &ContainerId) -> bool {
        self.alive.contains(id)
    }

    /// The live containers that share `id`'s rules.
    pub(crate) fn sharers(&self, id: &ContainerId) -> &[ContainerId] {
        self.sharers.get(id).map_or(&[], Vec::as_slice)
    }

    /// Whether `id`'s rules must be in force: it lives, or a live container shares them.
    pub(crate) fn needed(&self, id: &ContainerId) -> bool {
        self.alive(id) || !self.sharers(id).is_empty()
    }
}

/// natledger's own nftables tables that exist (an unreadable one is left out: the other checks
/// still run, and the missing-rule check then names its rules as missing).
fn own_tables(opts: &DoctorOptions) -> Vec<Ruleset> {
    Family::ALL
        .into_iter()
        .filter_map(|family| {
            let tables = Backend::OwnNftables
                .driver()
                .read_all(&opts.netfilter, family)
                .ok()?;
            (!tables.is_empty()).then(|| Ruleset {
                backend: Backend::OwnNftables,
                family,
                source: "live".into(),
                tables,
            })
        })
        .collect()
}

/// The walks of every ruleset, and the findings so far.
pub(crate) struct Checks<'a> {
    rulesets: &'a [Ruleset],
    host: Option<&'a Host>,
    host_backend: Detected,
    walks: Vec<Walked<'a>>,
    findings: Vec<Finding>,
    not_followed: Vec<NotFollowed>,
    /// Shared by every walk of the run.
    budget: paths::Budget,
}

/// One hook of one table of one ruleset, walked. Its steps and shadows are only reachable
/// through `walk`, as references into it (never indices another walk could misread).
struct Walked<'a> {
    set: &'a Ruleset,
    table: &'static str,
    hook: &'static str,
    walk: paths::Walk<'a>,
}

impl<'a> Checks<'a> {
    pub(crate) fn new(
        rulesets: &'a [Ruleset],
        host: Option<&'a Host>,
        host_backend: Detected,
        limits: paths::Limits,
    ) -> Self {
        let budget = paths::Budget::new(limits);
        let mut walks = Vec::new();
        let mut not_followed = Vec::new();
        for set in rulesets {
            for (table, hooks) in [("nat", &NAT_HOOKS[..]), ("filter", &FILTER_HOOKS[..])] {
                let Some(t) = set.table(table) else { continue };
                let parsed = paths::parse_table(t);
                for hook in hooks {
                    let walk = paths::Walk::within(
                        t,
                        &parsed,
                        hook,
                        |s| shadowed::interesting(table, s),
                        &budget,
                    );
                    let w = Walked {
                        set,
                        table,
                        hook,
                        walk,
                    };
                    not_followed.extend(w.not_followed());
                    walks.push(w);
                }
            }
        }
        Checks {
            rulesets,
            host,
            host_backend,
            walks,
            findings: Vec::new(),
            not_followed,
            budget,
        }
    }

    pub(crate) fn finish(self) -> (Vec<Finding>, Vec<NotFollowed>) {
        (self.findings, self.not_followed)
    }
}

impl Walked<'_> {
    /// Where this walk was cut short, for the report.
    fn not_followed(&self) -> impl Iterator<Item = NotFollowed> + '_ {
        self.walk.cuts().iter().map(|cut| NotFollowed {
            hook: self.hook,
            rule: RuleRef::new(
                self.set,
                self.table,
                &cut.rule.chain,
                cut.position,
                &cut.rule.args,
            ),
            reason: cut.reason,
        })
    }
}

impl RuleRef {
    fn new(set: &Ruleset, table: &str, chain: &str, position: usize, args: &[String]) -> Self {
        RuleRef {
            backend: set.backend,
            family: set.family,
            table: table.to_string(),
            chain: chain.to_string(),
            position,
            line: line(chain, args),
            hooks: Vec::new(),
            nft: None,
        }
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The address of a DNAT `--to-destination` (`10.0.0.2:80`, `[fd00::2]:80`, `10.0.0.2`,
/// `10.0.0.2-10.0.0.4:80`: the first).
pub(crate) fn dnat_address(to: &str) -> Option<IpAddr> {
    if let Some(rest) = to.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    if let Ok(ip) = to.parse() {
        return Some(ip);
    }
    let host = to.split(':').next()?;
    host.split('-').next()?.parse().ok()
}

fn comment(args: &[String]) -> Option<&str> {
    crate::model::layout::comment_and_target(args).0
}

/// The lowest destination port a rule's path requires (all its port conditions together)
/// and its protocol.
fn port_of(cond: &Match) -> (Option<u16>, Option<String>) {
    let port = paths::port_set(cond).and_then(|r| r.first().map(|(lo, _)| *lo));
    let proto = cond.conds.iter().find_map(|c| match c {
        Cond::Protocol {
            negated: false,
            proto,
        } => Some(proto.clone()),
        _ => None,
    });
    (port, proto)
}

fn line(chain: &str, args: &[String]) -> String {
    crate::model::save::rule_line(chain, args)
        .in_finding()
        .to_string()
}

fn rule_ref(w: &Walked, step: &Step) -> RuleRef {
    RuleRef::new(
        w.set,
        w.table,
        &step.rule.chain,
        step.position,
        &step.rule.args,
    )
}

/// The command line tool of a ruleset's backend and family: `ip6tables-legacy`.
fn tool(set: &Ruleset) -> String {
    format!("{}-{}", set.family.tool_stem(), set.backend.suffix())
}

/// `OP CHAIN ARGS` as words a POSIX shell passes on unchanged, for the commands doctor
/// prints: a rule's arguments come from other programs' dumps (comments above all), and
/// `$`, backquotes, `;` or a glob in one must not run or expand when an operator pastes the
/// fix.
fn shell_rule(op: &str, chain: &str, args: &[String]) -> String {
    let mut out = format!("{op} {}", shell_word(chain));
    for a in args {
        out.push(' ');
        out.push_str(&shell_word(a));
    }
    out
}

/// One word for a POSIX shell: as is when it holds only characters no shell treats
/// specially, else in single quotes (a `'` inside as `'\''`).
fn shell_word(word: &str) -> std::borrow::Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:,=+@%^".contains(c);
    if word == "!" || (!word.is_empty() && word.chars().all(plain)) {
        word.into()
    } else {
        format!("'{}'", word.replace('\'', "'\\''")).into()
    }
}

/// The command deleting the rule `-A CHAIN ARGS` of `table`, in `set`'s backend and family.
fn delete_line(set: &Ruleset, table: &str, chain: &str, args: &[String]) -> String {
    format!("{} -t {table} {}", tool(set), shell_rule("-D", chain, args))
}

/// The command deleting this rule, for the backend and family it is in.
fn delete_command(w: &Walked, step: &Step) -> String {
    delete_line(w.set, w.table, &step.rule.chain, &step.rule.args)
}

/// How to remove a rule that takes traffic it should not: natledger's own through sweep; a
/// rule in another owner's per-container chain by removing that container's chain whole;
/// any other by deleting it, and for an owner that writes its rules again (kube-proxy,
/// dockerd) with the lasting fix in that owner's terms ([`regenerated::lasting`]).
fn fix_for(w: &Walked, step: &Step) -> String {
    match owner(&step.rule.chain, &step.rule.args) {
        Owner::Container(_) => "natledger sweep".into(),
        _ => container_chain_fix(w.set, w.table, &step.rule.chain)
            .unwrap_or_else(|| delete_fix(w, step)),
    }
}

/// The command deleting this rule, and the lasting fix when its owner writes it again.
fn delete_fix(w: &Walked, step: &Step) -> String {
    regenerated::lasting(
        &step.rule.chain,
        &step.rule.args,
        &step.cond,
        delete_command(w, step),
    )
}

/// Chains other owners make for port forwards, reached from their hostport chain by jumps
/// whose comment names the container (`dnat name: NET id: CID`): CNI portmap's
/// `CNI-DN-<hash of network and container id>`, one per container (one jump per protocol and
/// 15 ports, from `CNI-HOSTPORT-DNAT`), and netavark's `NETAVARK-DN-<hash of the network>`,
/// one per network and so shared by every container on it (from `NETAVARK-HOSTPORT-DNAT`).
const PER_CONTAINER_CHAINS: [&str; 2] = ["CNI-DN-", "NETAVARK-DN-"];

/// For a rule in a chain of [`PER_CONTAINER_CHAINS`] that holds one container's forwards
/// only: the commands removing them whole, one per line: delete every jump into the chain
/// (that alone stops all its ports), then flush and delete the chain. `None` for any other
/// chain, one nothing jumps to, or one whose jumps name more than one container (netavark's
/// chain of a network with other containers on it: removing it would cut their ports too,
/// so only the rule itself is deleted).
fn container_chain_fix(set: &Ruleset, table: &str, chain: &str) -> Option<String> {
    if !PER_CONTAINER_CHAINS.iter().any(|p| chain.starts_with(p)) {
        return None;
    }
    let rules = &set.table(table)?.rules;
    let into: Vec<&crate::model::save::SavedRule> = rules
        .iter()
        .filter(|r| {
            let (_, target) = parse_rule(&r.args);
            matches!(target, Target::Jump(to) | Target::Goto(to) if to == chain)
        })
        .collect();
    let containers: BTreeSet<Option<&str>> = into
        .iter()
        .map(|r| comment(&r.args).and_then(jump_container))
        .collect();
    let one_container = match containers.len() {
        1 => chain.starts_with("CNI-DN-") || containers.first() != Some(&None),
        _ => false,
    };
    if !one_container {
        return None;
    }
    let jumps: Vec<String> = into
        .iter()
        .map(|r| delete_line(set, table, &r.chain, &r.args))
        .collect();
    let tool = tool(set);
    let mut commands = jumps;
    let chain = shell_word(chain);
    commands.push(format!("{tool} -t {table} -F {chain}"));
    commands.push(format!("{tool} -t {table} -X {chain}"));
    Some(commands.join("\n"))
}

/// The container a port-forward jump's comment names: `CID` of CNI portmap's
/// `dnat name: "NET" id: "CID"` and netavark's `dnat name: NET id: CID`.
fn jump_container(comment: &str) -> Option<&str> {
    let id = comment.rsplit_once(" id: ")?.1.trim_matches('"');
    (!id.is_empty()).then_some(id)
}

/// Who owns a rule, by chain name (for built-in chains, by where it jumps).
fn owner_of(chain: &str, args: &[String]) -> &'static str {
    let named = |c: &str| -> Option<&'static str> {
        if c.starts_with("KUBE-") {
            Some("KUBE")
        } else if c.starts_with("CNI-") {
            Some("CNI")
        } else if c.starts_with("DOCKER") {
            Some("DOCKER")
        } else if c.starts_with("NETAVARK") {
            Some("NETAVARK")
        } else if c.starts_with("AZURE-NPM") {
            Some("AZURE-NPM")
        } else if is_owned_chain(c) {
            Some("NATLEDGER")
        } else {
            None
        }
    };
    named(chain)
        .or_else(|| {
            crate::model::layout::comment_and_target(args)
                .1
                .and_then(named)
        })
        .unwrap_or("other")
}

#[cfg(test)]
mod shell_tests {
    use super::*;

    #[test]
    fn shell_words_are_quoted_unless_plain() {
        assert_eq!(shell_word("10.0.0.2:80"), "10.0.0.2:80");
        assert_eq!(shell_word("!"), "!");
        assert_eq!(shell_word("[fd00::2]:80"), "'[fd00::2]:80'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's $x"), r"'it'\''s $x'");
        assert_eq!(
            shell_rule("-D", "X", &["--comment".into(), "a;b".into()]),
            "-D X --comment 'a;b'"
        );
    }
}

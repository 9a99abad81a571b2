//! The five checks. Each turns rulesets (and, live, host evidence) into findings.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use super::evidence::{self, Listener, Reservation, Roots, RuntimeContainer};
use super::paths::{self, Step};
use super::{DoctorOptions, Finding, Kind, RuleRef, Ruleset, Severity};
use crate::backend::Backend;
use crate::family::Family;
use crate::layout::{Owner, is_owned_chain, owner};
use crate::ledger::{Manifest, RuleRecord};
use crate::matchset::{Cond, Match, PortSet, Target, parse_rule};
use crate::rule::IpNet;

/// The built-in chains each table's packets to a host port go through, in hook order.
const NAT_HOOKS: [&str; 2] = ["PREROUTING", "OUTPUT"];
const FILTER_HOOKS: [&str; 3] = ["INPUT", "FORWARD", "OUTPUT"];

/// Processes that listen on a port on purpose while a rule forwards it (to reserve it, or to
/// proxy what the rule cannot): their listeners are not hijacked.
const PORT_KEEPERS: &[&str] = &[
    "kube-proxy",
    "docker-proxy",
    "rootlessport",
    "conmon",
    "slirp4netns",
    "pasta",
];

/// Facts about the live host.
pub struct Host {
    listeners: Vec<Listener>,
    reservations: Vec<Reservation>,
    cni_present: bool,
    containers: Vec<RuntimeContainer>,
    /// Whether any runtime state directory exists (absence from it means something).
    runtime_state: bool,
    manifests: Vec<Manifest>,
    roots: Roots,
}

impl Host {
    pub fn gather(opts: &DoctorOptions) -> Host {
        let manifests = opts
            .ledger
            .list()
            .map(|all| all.into_iter().flatten().collect())
            .unwrap_or_default();
        Host {
            listeners: evidence::listeners(&opts.roots),
            reservations: evidence::cni_reservations(&opts.roots),
            cni_present: evidence::cni_networks_present(&opts.roots),
            containers: evidence::runtime_containers(&opts.roots),
            runtime_state: evidence::runtime_state_present(&opts.roots),
            manifests,
            roots: opts.roots.clone(),
        }
    }
}

/// The walks of every ruleset, and the findings so far.
pub struct Checks<'a> {
    rulesets: &'a [Ruleset],
    host: Option<&'a Host>,
    host_backend: Backend,
    walks: Vec<Walked<'a>>,
    findings: Vec<Finding>,
    complete: bool,
}

/// One hook of one table of one ruleset, walked.
struct Walked<'a> {
    set: &'a Ruleset,
    table: &'static str,
    hook: &'static str,
    steps: Vec<Step<'a>>,
    /// Indices of steps that never match, with the step that shadows them.
    shadowed: HashMap<usize, usize>,
}

impl<'a> Checks<'a> {
    pub fn new(rulesets: &'a [Ruleset], host: Option<&'a Host>, host_backend: Backend) -> Self {
        let mut walks = Vec::new();
        let mut complete = true;
        for set in rulesets {
            for (table, hooks) in [("nat", &NAT_HOOKS[..]), ("filter", &FILTER_HOOKS[..])] {
                let Some(t) = set.table(table) else { continue };
                let parsed = paths::parse_table(t);
                for hook in hooks {
                    let (steps, whole) = paths::walk(t, &parsed, hook);
                    complete &= whole;
                    let shadowed = paths::shadows(&steps, |s| interesting(table, s))
                        .into_iter()
                        .map(|s| (s.shadowed, s.by))
                        .collect();
                    walks.push(Walked {
                        set,
                        table,
                        hook,
                        steps,
                        shadowed,
                    });
                }
            }
        }
        Checks {
            rulesets,
            host,
            host_backend,
            walks,
            findings: Vec::new(),
            complete,
        }
    }

    pub fn finish(self) -> (Vec<Finding>, bool) {
        (self.findings, self.complete)
    }

    /// Check 1: Rules that never match because an earlier one takes their packets: one finding per
    /// earlier rule, naming every rule it shadows (a duplicate is a note, anything else an
    /// error).
    pub fn shadowed(&mut self) {
        type Key<'k> = (Backend, Family, &'k str, &'k str, usize, bool);
        let mut groups: BTreeMap<Key, (usize, usize, Vec<usize>)> = BTreeMap::new();
        let mut seen = HashSet::new();
        for (wi, w) in self.walks.iter().enumerate() {
            let mut pairs: Vec<(usize, usize)> = w.shadowed.iter().map(|(b, a)| (*b, *a)).collect();
            pairs.sort_unstable();
            for (b, a) in pairs {
                let (sa, sb) = (&w.steps[a], &w.steps[b]);
                let at = (
                    w.set.backend,
                    w.set.family,
                    w.table,
                    sb.rule.chain.as_str(),
                    sb.position,
                );
                if !seen.insert(at) {
                    continue;
                }
                let duplicate = sa.target == sb.target;
                let key = (
                    w.set.backend,
                    w.set.family,
                    w.table,
                    sa.rule.chain.as_str(),
                    sa.position,
                    duplicate,
                );
                groups.entry(key).or_insert((wi, a, Vec::new())).2.push(b);
            }
        }
        for ((.., duplicate), (wi, a, shadowed)) in groups {
            let w = &self.walks[wi];
            let sa = &w.steps[a];
            let first = &w.steps[shadowed[0]];
            let (port, protocol) = port_of(&first.cond);
            let named: Vec<String> = shadowed
                .iter()
                .take(5)
                .map(|&b| {
                    let sb = &w.steps[b];
                    format!(
                        "rule {} of {} ({})",
                        sb.position,
                        sb.rule.chain,
                        target_text(&sb.target)
                    )
                })
                .collect();
            let more = match shadowed.len() {
                n if n > 5 => format!(" and {} more", n - 5),
                _ => String::new(),
            };
            let later = if shadowed.len() == 1 {
                format!("{} never matches", named[0])
            } else {
                format!(
                    "{} later rules never match: {}{more}",
                    shadowed.len(),
                    named.join(", ")
                )
            };
            let summary = if duplicate {
                format!(
                    "{later}: {} duplicate {} rule {} of {} ({}).",
                    if shadowed.len() == 1 {
                        "it is a"
                    } else {
                        "they"
                    },
                    w.table,
                    sa.position,
                    sa.rule.chain,
                    target_text(&sa.target)
                )
            } else {
                format!(
                    "For {}, {} rule {} of {} ({}) takes every packet first, so {later}.",
                    packets(&first.cond),
                    w.table,
                    sa.position,
                    sa.rule.chain,
                    target_text(&sa.target)
                )
            };
            let mut rules = vec![rule_ref(w, sa)];
            rules.extend(shadowed.iter().map(|&b| rule_ref(w, &w.steps[b])));
            self.findings.push(Finding {
                severity: if duplicate {
                    Severity::Info
                } else {
                    Severity::Error
                },
                kind: Kind::Shadowed,
                port,
                protocol,
                summary,
                rules,
                evidence: Vec::new(),
                fix: Some(if duplicate {
                    delete_command(w, first)
                } else {
                    fix_for(w, sa)
                }),
            });
        }
    }

    /// Check 2: DNAT rules whose destination no live container or local route holds.
    pub fn dead_targets(&mut self) {
        let Some(host) = self.host else { return };
        let mut seen = HashSet::new();
        for w in self.walks.iter().filter(|w| w.table == "nat") {
            // The comments of the rules jumping to each chain: portmap and netavark put the
            // container id on the jump into the per-container chain, not on its DNAT.
            let mut jumped_from: HashMap<&str, Vec<&str>> = HashMap::new();
            for rule in w.set.table("nat").map_or(&[][..], |t| &t.rules) {
                if let (Some(c), Some(to)) = crate::layout::comment_and_target(&rule.args) {
                    jumped_from.entry(to).or_default().push(c);
                }
            }
            for (i, step) in w.steps.iter().enumerate() {
                let Target::Dnat { to } = &step.target else {
                    continue;
                };
                let key = (w.set.backend, w.set.family, &step.rule.chain, step.position);
                if !seen.insert(key) {
                    continue;
                }
                let Some(addr) = dnat_address(to) else {
                    continue;
                };
                let mut comments: Vec<&str> = comment(&step.rule.args).into_iter().collect();
                comments.extend(
                    jumped_from
                        .get(step.rule.chain.as_str())
                        .into_iter()
                        .flatten(),
                );
                let Some(evidence) = judge_target(host, step, &comments, addr) else {
                    continue;
                };
                let first = !w.shadowed.contains_key(&i);
                let (port, protocol) = port_of(&step.cond);
                let summary = if first {
                    format!(
                        "{} goes to {addr}, which nothing holds any more: that traffic is lost.",
                        packets(&step.cond)
                    )
                } else {
                    format!(
                        "A leftover DNAT to {addr}, which nothing holds any more (an earlier rule takes its packets)."
                    )
                };
                self.findings.push(Finding {
                    severity: if first {
                        Severity::Error
                    } else {
                        Severity::Warning
                    },
                    kind: Kind::DeadTarget,
                    port,
                    protocol,
                    summary,
                    rules: vec![rule_ref(w, step)],
                    evidence,
                    fix: Some(fix_for(w, step)),
                });
            }
        }
    }

    /// Check 3: Local listeners whose traffic a rule redirects (nat) or rejects (filter INPUT).
    pub fn hijacked_listeners(&mut self) {
        let Some(host) = self.host else { return };
        let mut seen = HashSet::new();
        for l in &host.listeners {
            if l.command
                .as_deref()
                .is_some_and(|c| PORT_KEEPERS.contains(&c))
            {
                continue;
            }
            let family = Family::of(l.addr);
            let packets = listener_packets(l);
            // A socket on [::] also receives IPv4 (unless IPV6_V6ONLY, which procfs hides).
            let dual_stack = family == Family::Ipv6 && l.addr.is_unspecified();
            for w in self
                .walks
                .iter()
                .filter(|w| w.set.family == family || dual_stack)
            {
                let loopback = l.addr.is_loopback();
                let relevant = match (w.table, w.hook) {
                    ("nat", "PREROUTING") | ("filter", "INPUT") => !loopback,
                    ("nat", "OUTPUT") => true,
                    _ => false,
                };
                if !relevant {
                    continue;
                }
                let takers = takers(w, &packets, l.port);
                let Some(step) = takers.first().copied() else {
                    continue;
                };
                let hijacks = hijacking(w.table, step);
                let key = (
                    l.port,
                    l.protocol,
                    w.set.backend,
                    w.table,
                    &step.rule.chain,
                    step.position,
                );
                if !hijacks || !seen.insert(key) {
                    continue;
                }
                // All of it, when a run of hijacking rules ends in one that takes everything
                // left (kube-proxy's random split over endpoints).
                let all = takers
                    .iter()
                    .take_while(|s| hijacking(w.table, s))
                    .any(|s| s.cond.covers(&packets));
                let who = match (&l.command, l.pid) {
                    (Some(c), Some(p)) => format!("{c} (pid {p})"),
                    _ => "a process".to_string(),
                };
                let verb = if w.table == "nat" { "sends" } else { "rejects" };
                let summary = format!(
                    "{who} listens on {}, but {} rule {} of {} {verb} {} of that traffic ({}).",
                    socket_text(l),
                    w.table,
                    step.position,
                    step.rule.chain,
                    if all { "all" } else { "some" },
                    target_text(&step.target),
                );
                self.findings.push(Finding {
                    severity: if all {
                        Severity::Error
                    } else {
                        Severity::Warning
                    },
                    kind: Kind::HijackedListener,
                    port: Some(l.port),
                    protocol: Some(l.protocol.to_string()),
                    summary,
                    rules: vec![rule_ref(w, step)],
                    evidence: vec![format!("listening socket inode {}", l.inode)],
                    fix: Some(delete_command(w, step)),
                });
            }
        }
    }

    /// Check 4: Rules in both backends: the kernel runs both, whatever `iptables` points to.
    pub fn split_backends(&mut self) {
        type Seen = (usize, BTreeSet<String>);
        let mut owners: BTreeMap<&'static str, BTreeMap<Backend, Seen>> = BTreeMap::new();
        for set in self.rulesets {
            for table in &set.tables {
                for rule in &table.rules {
                    let owner = owner_of(&rule.chain, &rule.args);
                    let entry = owners
                        .entry(owner)
                        .or_default()
                        .entry(set.backend)
                        .or_default();
                    entry.0 += 1;
                    // A few chains are enough to point at; the count says how much there is.
                    if entry.1.len() < 12 {
                        entry
                            .1
                            .insert(format!("{}/{} {}", set.family, table.name, rule.chain));
                    }
                }
            }
        }
        for (owner, by_backend) in owners {
            if by_backend.len() < 2 {
                continue;
            }
            let other = if self.host_backend == Backend::Legacy {
                Backend::Nft
            } else {
                Backend::Legacy
            };
            let (n_host, _) = by_backend
                .get(&self.host_backend)
                .cloned()
                .unwrap_or_default();
            let (n_other, chains) = by_backend.get(&other).cloned().unwrap_or_default();
            let summary = if self.host.is_some() {
                format!(
                    "{owner} has rules in both backends ({n_host} in iptables-{}, which \
                     `iptables` uses, and {n_other} in iptables-{other}); the kernel runs both, \
                     so the {other} ones stay active.",
                    self.host_backend,
                )
            } else {
                // Dumps: which backend their host's `iptables` used is unknown.
                format!(
                    "{owner} has rules in both backends ({n_host} in iptables-{} and {n_other} \
                     in iptables-{other}); the kernel runs both, so the ones left in the \
                     backend no longer in use stay active.",
                    self.host_backend,
                )
            };
            let fix = format!(
                "iptables-{other}-save | grep -n -- '{}'   # then remove what is stale there: iptables-{other} -t TABLE -F CHAIN; iptables-{other} -t TABLE -X CHAIN",
                owner_pattern(owner)
            );
            self.findings.push(Finding {
                severity: Severity::Warning,
                kind: Kind::SplitBackends,
                port: None,
                protocol: None,
                summary,
                rules: Vec::new(),
                evidence: chains
                    .into_iter()
                    .take(12)
                    .map(|c| format!("iptables-{other}: {c}"))
                    .collect(),
                fix: Some(fix),
            });
        }
    }

    /// Check 5: natledger's own state: dead manifests, orphaned rules, live containers' missing rules.
    pub fn natledger_state(&mut self) {
        let Some(host) = self.host else { return };
        let (alive, dead): (Vec<&Manifest>, Vec<&Manifest>) =
            host.manifests.iter().partition(|m| m.alive());
        let known: HashSet<&str> = host
            .manifests
            .iter()
            .map(|m| m.container_id.as_str())
            .collect();
        for m in dead {
            let summary = format!(
                "Container {} (pid {}) is dead, but its manifest and {} rule(s) remain.",
                m.container_id,
                m.pid.map_or("-".into(), |p| p.to_string()),
                m.rules.len()
            );
            let finding = manifest_finding(m, Severity::Warning, summary, Vec::new());
            self.findings.push(Finding {
                fix: Some("natledger sweep".into()),
                ..finding
            });
        }
        for set in self.rulesets {
            let Some(nat) = set.table("nat") else {
                continue;
            };
            let mut position: HashMap<&str, usize> = HashMap::new();
            for rule in &nat.rules {
                let n = position.entry(&rule.chain).or_default();
                *n += 1;
                let Owner::Container(id) = owner(&rule.chain, &rule.args) else {
                    continue;
                };
                if known.contains(id) {
                    continue;
                }
                let (port, protocol) = port_of(&parse_rule(&rule.args).0);
                self.findings.push(Finding {
                    severity: Severity::Warning,
                    kind: Kind::NatledgerState,
                    port,
                    protocol,
                    summary: format!(
                        "A natledger rule of container {id}, which has no manifest (an orphan)."
                    ),
                    rules: vec![RuleRef::new(set, "nat", &rule.chain, *n, &rule.args)],
                    evidence: vec!["natledger manifests".into()],
                    fix: Some("natledger sweep".into()),
                });
            }
        }
        for m in alive {
            let present = |r: &RuleRecord| {
                self.rulesets
                    .iter()
                    .find(|s| s.backend == r.backend && s.family == r.family)
                    .and_then(|s| s.table(&r.table))
                    .is_some_and(|t| {
                        t.rules
                            .iter()
                            .any(|s| s.chain == r.chain && s.args == r.rule)
                    })
            };
            let missing: Vec<RuleRef> = m
                .rules
                .iter()
                .filter(|r| !present(r))
                .map(|r| RuleRef {
                    backend: r.backend,
                    family: r.family,
                    table: r.table.clone(),
                    chain: r.chain.clone(),
                    position: 0,
                    line: line(&r.chain, &r.rule),
                })
                .collect();
            if missing.is_empty() {
                continue;
            }
            let summary = format!(
                "Live container {} is missing {} of its {} recorded rule(s): its ports do not \
                 forward.",
                m.container_id,
                missing.len(),
                m.rules.len()
            );
            let finding = manifest_finding(m, Severity::Error, summary, missing);
            self.findings.push(Finding {
                fix: Some(format!(
                    "restart container {} (its createRuntime hook writes the rules again)",
                    m.container_id
                )),
                ..finding
            });
        }
    }
}

/// A finding about one natledger container, on the port of its first mapping.
fn manifest_finding(
    m: &Manifest,
    severity: Severity,
    summary: String,
    rules: Vec<RuleRef>,
) -> Finding {
    Finding {
        severity,
        kind: Kind::NatledgerState,
        port: m.mappings.first().map(|p| p.host_ports.start),
        protocol: m.mappings.first().map(|p| p.protocol.to_string()),
        summary,
        rules,
        evidence: vec!["natledger manifest".into()],
        fix: None,
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
        }
    }
}

/// Rules whose being shadowed matters: port forwards in nat, port-specific verdicts in filter.
fn interesting(table: &str, step: &Step) -> bool {
    match table {
        "nat" => matches!(step.target, Target::Dnat { .. } | Target::Redirect { .. }),
        _ => {
            matches!(step.target, Target::Accept | Target::Drop | Target::Reject)
                && step
                    .cond
                    .conds
                    .iter()
                    .any(|c| matches!(c, Cond::DPorts { negated: false, .. }))
        }
    }
}

/// The steps on a walk that would take some of a listener's packets and name its port, in
/// order.
fn takers<'w>(w: &'w Walked, packets: &Match, port: u16) -> Vec<&'w Step<'w>> {
    w.steps
        .iter()
        .filter(|s| {
            (s.target.is_terminal() || s.target == Target::Return)
                && names_port(&s.cond, port)
                && !s.cond.and(packets).is_empty()
        })
        .collect()
}

/// Whether a rule taking a listener's packets keeps them from it.
fn hijacking(table: &str, step: &Step) -> bool {
    matches!(
        (table, &step.target),
        ("nat", Target::Dnat { .. } | Target::Redirect { .. })
            | ("filter", Target::Drop | Target::Reject)
    )
}

fn names_port(cond: &Match, port: u16) -> bool {
    cond.conds.iter().any(|c| match c {
        Cond::DPorts {
            negated: false,
            ports,
        } => ports.0.iter().any(|(lo, hi)| (*lo..=*hi).contains(&port)),
        _ => false,
    })
}

/// The packets that open connections to a listener: its protocol and port, to a local
/// address (its own, unless it listens on every address), conntrack state NEW (so a rule
/// limited to new connections, as kube-proxy's are, is seen to take them all).
fn listener_packets(l: &Listener) -> Match {
    let mut conds = vec![
        Cond::Protocol {
            negated: false,
            proto: l.protocol.to_string(),
        },
        Cond::DPorts {
            negated: false,
            ports: PortSet(vec![(l.port, l.port)]),
        },
        Cond::DstType {
            negated: false,
            types: vec!["LOCAL".into()],
        },
    ];
    let (new, _) = parse_rule(&["-m", "conntrack", "--ctstate", "NEW"].map(String::from));
    conds.extend(new.conds);
    if !l.addr.is_unspecified() {
        conds.push(Cond::Dst {
            negated: false,
            net: IpNet::host(l.addr),
        });
    }
    Match { conds }
}

fn socket_text(l: &Listener) -> String {
    match l.addr {
        IpAddr::V6(a) => format!("[{a}]:{}/{}", l.port, l.protocol),
        IpAddr::V4(a) => format!("{a}:{}/{}", l.port, l.protocol),
    }
}

/// Whether a DNAT's destination is dead, and the evidence; `None` when nothing conclusive.
fn judge_target(host: &Host, step: &Step, comments: &[&str], addr: IpAddr) -> Option<Vec<String>> {
    // natledger's own rules: its manifests are authoritative.
    if let Owner::Container(id) = owner(&step.rule.chain, &step.rule.args) {
        return match host
            .manifests
            .iter()
            .find(|m| m.container_id.as_str() == id)
        {
            Some(m) if m.alive() => None,
            Some(m) => Some(vec![format!(
                "natledger manifest: container {id} (pid {}) is dead",
                m.pid.map_or("-".into(), |p| p.to_string())
            )]),
            None => Some(vec![format!("natledger: no manifest for container {id}")]),
        };
    }
    let mut evidence = Vec::new();
    // Container ids in the comments (the rule's and its jumps'), against the runtimes' state.
    let mut ids: Vec<String> = comments
        .iter()
        .flat_map(|c| evidence::comment_container_ids(c))
        .collect();
    ids.dedup();
    {
        for id in ids {
            match evidence::container_id_alive(&id, &host.containers) {
                Some(true) => return None,
                Some(false) => evidence.push(format!(
                    "runtime state: container {} is not running",
                    short(&id)
                )),
                None if host.runtime_state && id.len() >= 12 => {
                    evidence.push(format!(
                        "runtime state: no running container has the id {}",
                        short(&id)
                    ));
                }
                None => {}
            }
        }
    }
    // CNI IPAM: a reservation names the holder; none, where the network keeps them, says dead.
    if host.cni_present {
        match host.reservations.iter().find(|r| r.addr == addr) {
            Some(r) => match evidence::container_id_alive(&r.container_id, &host.containers) {
                Some(true) => return None,
                Some(false) => evidence.push(format!(
                    "CNI IPAM ({}): {addr} is reserved by container {}, which is not running",
                    r.network,
                    short(&r.container_id)
                )),
                None => return None,
            },
            None if host.reservations.iter().any(|r| same_subnet(r.addr, addr)) => {
                evidence.push(format!(
                    "CNI IPAM: no reservation for {addr} in its network"
                ));
            }
            None => {}
        }
    }
    // Routes: with no route to it, nothing local holds the address.
    let routed =
        evidence::has_route(&host.roots, addr) || evidence::is_local_address(&host.roots, addr);
    if !routed {
        evidence.push(format!("routes: no route to {addr} except the default one"));
    }
    (!evidence.is_empty()).then_some(evidence)
}

fn same_subnet(a: IpAddr, b: IpAddr) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => a.octets()[..3] == b.octets()[..3],
        (IpAddr::V6(a), IpAddr::V6(b)) => a.segments()[..4] == b.segments()[..4],
        _ => false,
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The address of a DNAT `--to-destination` (`10.0.0.2:80`, `[fd00::2]:80`, `10.0.0.2`,
/// `10.0.0.2-10.0.0.4:80`: the first).
pub fn dnat_address(to: &str) -> Option<IpAddr> {
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
    crate::layout::comment_and_target(args).0
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

/// The packets a rule matches, in words: "tcp packets to port 6667 for a local address".
fn packets(cond: &Match) -> String {
    let mut proto = "packets".to_string();
    let mut parts = Vec::new();
    // Every positive port condition on the path, as the one set they leave.
    if let Some(ranges) = paths::port_set(cond) {
        parts.push(format!("to port {}", ports_text(&PortSet(ranges))));
    }
    for c in &cond.conds {
        match c {
            Cond::Protocol {
                negated: false,
                proto: p,
            } => proto = format!("{p} packets"),
            Cond::DPorts {
                negated: true,
                ports,
            } => parts.push(format!("not to port {}", ports_text(ports))),
            Cond::Dst { negated, net } => {
                parts.push(format!("{}to {net}", if *negated { "not " } else { "" }))
            }
            Cond::Src { negated, net } => {
                parts.push(format!("{}from {net}", if *negated { "not " } else { "" }))
            }
            Cond::DstType { negated, types } => parts.push(format!(
                "{}for a {} address",
                if *negated { "not " } else { "" },
                types.join("/").to_lowercase()
            )),
            Cond::InIface { negated, name } => parts.push(format!(
                "{}in on {name}",
                if *negated { "not " } else { "" }
            )),
            _ => {}
        }
    }
    if parts.is_empty() {
        proto
    } else {
        format!("{proto} {}", parts.join(" "))
    }
}

fn ports_text(ports: &PortSet) -> String {
    ports
        .0
        .iter()
        .map(|(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn target_text(target: &Target) -> String {
    match target {
        Target::Dnat { to } => format!("DNAT to {to}"),
        Target::Redirect { to_ports: Some(p) } => format!("REDIRECT to port {p}"),
        Target::Redirect { to_ports: None } => "REDIRECT".into(),
        Target::Accept => "ACCEPT".into(),
        Target::Drop => "DROP".into(),
        Target::Reject => "REJECT".into(),
        Target::Return => "RETURN".into(),
        Target::Masquerade => "MASQUERADE".into(),
        Target::Snat { to } => format!("SNAT to {to}"),
        Target::Jump(c) | Target::Goto(c) => format!("jump to {c}"),
        Target::Other(t) => t.clone(),
        Target::None => "no target".into(),
    }
}

fn line(chain: &str, args: &[String]) -> String {
    let mut out = format!("-A {chain}");
    for a in args {
        out.push(' ');
        if a.is_empty() || a.contains(char::is_whitespace) || a.contains('"') {
            out.push('"');
            out.push_str(&a.replace('\\', "\\\\").replace('"', "\\\""));
            out.push('"');
        } else {
            out.push_str(a);
        }
    }
    out
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

/// The command deleting this rule, for the backend and family it is in.
fn delete_command(w: &Walked, step: &Step) -> String {
    let tool = format!("{}-{}", w.set.family.tool_stem(), w.set.backend.suffix());
    let rule = line(&step.rule.chain, &step.rule.args);
    format!("{tool} -t {} -D{}", w.table, &rule[2..])
}

/// How to remove a rule that takes traffic it should not: natledger's own through sweep.
fn fix_for(w: &Walked, step: &Step) -> String {
    match owner(&step.rule.chain, &step.rule.args) {
        Owner::Container(_) => "natledger sweep".into(),
        _ => delete_command(w, step),
    }
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
        .or_else(|| crate::layout::comment_and_target(args).1.and_then(named))
        .unwrap_or("other")
}

fn owner_pattern(owner: &str) -> String {
    match owner {
        "KUBE" => "KUBE-".into(),
        "CNI" => "CNI-".into(),
        "NATLEDGER" => "NATLEDGER-".into(),
        "other" => "-A ".into(),
        o => o.to_string(),
    }
}

//! The checks. Each turns rulesets (and, live, host evidence) into findings; this module
//! holds what they share (the walks of every table's hooks, host facts, how rules and
//! packets are put in words), each check is a file of its own.

mod dead_targets;
mod forward;
mod listeners;
mod natledger_state;
mod shadowed;
mod split_backends;
mod xtables_lock;

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

/// One hook of one table of one ruleset, walked. Its steps and shadows are only reachable
/// through `walk`, as references into it (never indices another walk could misread).
struct Walked<'a> {
    set: &'a Ruleset,
    table: &'static str,
    hook: &'static str,
    walk: paths::Walk<'a>,
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
                    let walk =
                        paths::Walk::new(t, &parsed, hook, |s| shadowed::interesting(table, s));
                    complete &= walk.complete();
                    walks.push(Walked {
                        set,
                        table,
                        hook,
                        walk,
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
        }
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

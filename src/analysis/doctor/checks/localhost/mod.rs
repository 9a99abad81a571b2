//! Check 8 (live only): this host's 127.0.0.0/8 open to its neighbours. With
//! `net.ipv4.conf.IFACE.route_localnet=1` (or `all`=1) the kernel routes a packet that comes
//! in on IFACE addressed to 127.0.0.1 to the host's localhost services, unless filter INPUT
//! drops it (kube-proxy's CVE-2020-8558). For each such interface, the first packet of a new
//! connection (tcp and udp, any port, conntrack NEW and not DNATed) is followed through filter
//! INPUT of every IPv4 backend with [`packet::fate`] (the kernel runs both: a drop in either
//! is a drop), once from a neighbour's own (non-loopback) source and once from a forged
//! 127.0.0.0/8 source, which route_localnet lets in too and kube-proxy's guard lets pass.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::analysis::doctor::checks::{Checks, Host, delete_line, line, shell_rule, tool};
use crate::analysis::doctor::evidence;
use crate::analysis::doctor::{Finding, Kind, RuleRef, Ruleset, Severity};
use crate::analysis::iptables::packet::{self, Addresses, Conntrack, Fate, Packet};
use crate::analysis::iptables::paths;
use crate::backend::Backend;
use crate::kernel::host::RouteLocalnet;
use crate::model::anyrule::{Match, Target, parse_rule};
use crate::model::family::Family;
use crate::model::layout::{INPUT_CHAIN, LOOPBACK_INTERFACE};
use crate::model::save::{Dump, SavedRule};

/// 127.0.0.1, where localhost services listen.
const LOCALHOST: [u8; 4] = [127, 0, 0, 1];

/// What filter INPUT of every IPv4 backend does with one packet.
enum Verdict<'a> {
    /// A backend certainly drops it, by this rule (`None`: its DROP policy).
    Dropped(RuleAt<'a>),
    /// Every backend lets it in; the rules that accept it (policies are not listed).
    Reaches(Vec<RuleAt<'a>>),
    /// No backend certainly drops it, and this rule decides on what is not known.
    Unknown(RuleAt<'a>),
}

/// A rule (or, `None`, a chain's policy) of one backend's filter table.
#[derive(Clone, Copy)]
struct RuleAt<'a> {
    set: &'a Ruleset,
    table: &'a Dump,
    rule: Option<&'a SavedRule>,
}

impl RuleAt<'_> {
    fn rule_ref(&self) -> Option<RuleRef> {
        let rule = self.rule?;
        let position = self
            .table
            .rules_in(&rule.chain)
            .position(|r| std::ptr::eq(r, rule))
            .map_or(0, |i| i + 1);
        Some(RuleRef::new(
            self.set,
            "filter",
            &rule.chain,
            position,
            &rule.args,
        ))
    }
}

/// A ruleset's filter table, parsed.
type Filter<'a> = (&'a Ruleset, &'a Dump, Vec<(Match, Target)>);

impl Checks<'_> {
    /// Check 8: interfaces with route_localnet on whose packets to 127.0.0.1 filter INPUT lets
    /// in. Live only: the sysctls are the host's.
    pub(crate) fn localhost_exposed(&mut self) {
        let Some(host) = self.host else { return };
        let likely = |iface: &str| likely_setter(host, iface);
        // natledger's own nftables table too: its guard is a drop, and a drop in any base
        // chain of the hook is final (no other owner's accept can bypass it there).
        let rulesets: Vec<&Ruleset> = self.rulesets.iter().chain(&host.own).collect();
        let found = exposures(
            &rulesets,
            &host.route_localnet,
            self.host_backend.backend,
            &likely,
        );
        self.findings.extend(found);
    }
}

/// The findings for the interfaces `open` lists, given the rulesets read; `likely` names
/// who probably turned route_localnet on for an interface (or `all`), if anyone can tell.
pub(super) fn exposures(
    rulesets: &[&Ruleset],
    open: &RouteLocalnet,
    host_backend: Backend,
    likely: &dyn Fn(&str) -> Option<String>,
) -> Vec<Finding> {
    let filters: Vec<Filter> = rulesets
        .iter()
        .copied()
        .filter(|s| s.family == Family::Ipv4)
        .filter_map(|set| {
            let t = set.table("filter")?;
            Some((set, t, paths::parse_table(t)))
        })
        .collect();
    // Interfaces with the same outcome (the same rules) make one finding.
    let mut groups: BTreeMap<String, (Finding, Vec<String>)> = BTreeMap::new();
    for iface in &open.interfaces {
        let Some((key, finding)) = judge(&filters, iface, host_backend) else {
            continue;
        };
        groups
            .entry(key)
            .or_insert_with(|| (finding, Vec::new()))
            .1
            .push(iface.clone());
    }
    groups
        .into_values()
        .map(|(finding, ifaces)| finish(finding, &ifaces, open, likely))
        .collect()
}

/// The first packet of a new connection from a neighbour on `iface` to 127.0.0.1, any port.
fn probe(iface: &str, protocol: u8, src: Addresses) -> Packet {
    let localhost = Addresses::Exactly(IpAddr::from(LOCALHOST));
    Packet {
        protocol: Some(protocol),
        src,
        dst: localhost.clone(),
        dst_local: Some(true),
        in_iface: Some(iface.to_string()),
        conntrack: Some(Conntrack {
            states: vec!["NEW"],
            unsure: Vec::new(),
            orig_dst: localhost,
            orig_dst_ports: None,
            repl_src: Some(IpAddr::from(LOCALHOST)),
            repl_src_ports: None,
            original: true,
        }),
        ..Packet::unknown(Family::Ipv4)
    }
}

/// What filter INPUT of every backend in `filters` does with `packet`.
fn verdict<'a>(filters: &'a [Filter<'a>], packet: &Packet) -> Verdict<'a> {
    let mut accepted = Vec::new();
    let mut unknown = None;
    for (set, table, parsed) in filters {
        let at = |rule| RuleAt { set, table, rule };
        match packet::fate(table, parsed, "INPUT", packet) {
            Fate::Dropped(by) => return Verdict::Dropped(at(by)),
            Fate::Accepted(by) => accepted.push(at(by)),
            Fate::Unknown(by) => unknown = unknown.or(Some(at(Some(by)))),
        }
    }
    match unknown {
        Some(at) => Verdict::Unknown(at),
        None => Verdict::Reaches(accepted),
    }
}

/// The neighbours' packets on `iface`, tcp then udp: the worse of the two (reaches, then
/// unknown), and its protocol.
fn worst<'a>(
    filters: &'a [Filter<'a>],
    iface: &str,
    src: &Addresses,
) -> (Verdict<'a>, &'static str) {
    let [tcp, udp] = [(6, "tcp"), (17, "udp")]
        .map(|(n, name)| (verdict(filters, &probe(iface, n, src.clone())), name));
    let rank = |v: &Verdict| match v {
        Verdict::Reaches(_) => 2,
        Verdict::Unknown(_) => 1,
        Verdict::Dropped(_) => 0,
    };
    if rank(&udp.0) > rank(&tcp.0) {
        udp
    } else {
        tcp
    }
}

/// The finding for one interface (its summary still to be completed by [`finish`]) and the
/// key of its outcome, or `None` when every packet from a neighbour is dropped.
fn judge(filters: &[Filter], iface: &str, host_backend: Backend) -> Option<(String, Finding)> {
    let loopback = Family::Ipv4
        .routable_loopback()
        .expect("IPv4 has a routable loopback");
    let neighbour = Addresses::Outside(vec![loopback]);
    let forged = Addresses::Exactly(IpAddr::from(LOCALHOST));
    let finding = |severity, summary: String, rules: Vec<RuleRef>, fix| Finding {
        severity,
        kind: Kind::LocalhostExposed,
        port: None,
        protocol: None,
        summary,
        rules,
        evidence: Vec::new(),
        fix,
    };
    let key = |what: &str, rules: &[RuleRef]| {
        let lines: Vec<String> = rules
            .iter()
            .map(|r| format!("{} {}", r.backend, r.line))
            .collect();
        format!("{what}\n{}", lines.join("\n"))
    };
    match worst(filters, iface, &neighbour) {
        (Verdict::Reaches(by), proto) => {
            let rules: Vec<RuleRef> = by.iter().filter_map(RuleAt::rule_ref).collect();
            let (summary, fix) = reaches(filters, &by, proto, host_backend);
            Some((
                key("reaches", &rules),
                finding(Severity::Error, summary, rules, Some(fix)),
            ))
        }
        (Verdict::Unknown(at), proto) => {
            let rules: Vec<RuleRef> = at.rule_ref().into_iter().collect();
            let summary = format!(
                "No filter INPUT rule certainly drops {proto} packets that neighbours on \
                 IFACES address to 127.0.0.1: the rule listed decides on what doctor cannot \
                 know, so they may reach this host's localhost services."
            );
            Some((
                key("unknown", &rules),
                finding(
                    Severity::Warning,
                    summary,
                    rules,
                    Some(guard_fix(filters, host_backend)),
                ),
            ))
        }
        (Verdict::Dropped(dropper), _) => {
            let (Verdict::Dropped(_), _) = worst(filters, iface, &forged) else {
                let rules: Vec<RuleRef> = dropper.rule_ref().into_iter().collect();
                let summary = "filter INPUT drops what neighbours on IFACES address to \
                     127.0.0.1 from their own addresses, but not from a forged 127.0.0.0/8 \
                     source (kube-proxy's guard matches `! -s 127.0.0.0/8`), which \
                     route_localnet lets in too: a neighbour's one-way udp datagrams (and tcp \
                     SYNs, whose answers go to this host's own localhost) reach this host's \
                     localhost services."
                    .to_string();
                return Some((
                    key("forged", &rules),
                    finding(
                        Severity::Warning,
                        summary,
                        rules,
                        Some(guard_fix(filters, host_backend)),
                    ),
                ));
            };
            None
        }
    }
}

/// The summary and fix when every backend lets the neighbours' packets in, by `by`.
fn reaches(
    filters: &[Filter],
    by: &[RuleAt],
    proto: &str,
    host_backend: Backend,
) -> (String, String) {
    let guarded: Vec<&Ruleset> = filters
        .iter()
        .filter(|(_, t, _)| has_guard_jump(t))
        .map(|(s, _, _)| *s)
        .collect();
    let exposed = format!(
        "Neighbours on IFACES can reach this host's services bound to 127.0.0.1 ({proto} \
         packets they address to 127.0.0.1 reach filter INPUT and no backend drops them)."
    );
    // Another owner's accept above natledger's jump: natledger's guard never sees them.
    let above: Vec<&RuleAt> = by
        .iter()
        .filter(|at| at.rule.is_some() && guarded.iter().any(|s| std::ptr::eq(*s, at.set)))
        .collect();
    if let Some(first) = above.first() {
        let rule = first.rule.expect("filtered on a rule");
        let accept = line(&rule.chain, &rule.args);
        let summary = format!(
            "{exposed} natledger's guard is in place in {} but the rule `{accept}` accepts \
             these packets before filter INPUT jumps to {INPUT_CHAIN}.",
            first.set.backend
        );
        let mut fix: Vec<String> = above
            .iter()
            .flat_map(|at| {
                let rule = at.rule.expect("filtered on a rule");
                let mut commands = vec![delete_line(at.set, "filter", &rule.chain, &rule.args)];
                if rule.chain == "INPUT" {
                    // Appended, it comes after the guard's jump (always first).
                    let again = shell_rule("-A", &rule.chain, &rule.args);
                    commands.push(format!("{} -t filter {again}", tool(at.set)));
                }
                commands
            })
            .collect();
        fix.insert(
            0,
            "let natledger's guard decide first: move the accept below the jump (or narrow \
             it so that it does not take packets to 127.0.0.0/8), for example"
                .into(),
        );
        fix.push(route_localnet_off());
        return (summary, fix.join("\n"));
    }
    (
        format!("{exposed} There is no guard."),
        guard_fix(filters, host_backend),
    )
}

/// Whether filter INPUT jumps to natledger's guard chain.
fn has_guard_jump(table: &Dump) -> bool {
    table
        .rules_in("INPUT")
        .any(|r| matches!(parse_rule(&r.args).1, Target::Jump(to) if to == INPUT_CHAIN))
}

/// Close it: natledger's guard (its next create writes it), or kube-proxy's rule fixed to
/// match the interface, by hand (in every IPv4 backend with a filter table, else in the
/// one the host's `iptables` uses); or route_localnet off.
fn guard_fix(filters: &[Filter], host_backend: Backend) -> String {
    let loopback = Family::Ipv4
        .routable_loopback()
        .expect("IPv4 has a routable loopback");
    let rule = crate::model::rule::Rule {
        comment: None,
        ..crate::model::layout::guard(loopback)
    };
    let args = rule.to_args();
    let mut tools: Vec<String> = filters
        .iter()
        .filter(|(s, _, _)| s.backend.is_iptables())
        .map(|(s, _, _)| tool(s))
        .collect();
    if tools.is_empty() {
        tools.push(format!("iptables-{}", host_backend.suffix()));
    }
    let mut fix = vec![format!(
        "natledger's next create writes its guard (filter INPUT jumps first to {INPUT_CHAIN}, \
         which drops packets to 127.0.0.0/8 that did not arrive on {LOOPBACK_INTERFACE} \
         unless they are part of an established or DNATed flow); without natledger, insert the \
         same rule at the top of INPUT:"
    )];
    fix.extend(
        tools
            .iter()
            .map(|t| format!("{t} -t filter {}", shell_rule("-I", "INPUT", &args))),
    );
    fix.push(route_localnet_off());
    fix.join("\n")
}

fn route_localnet_off() -> String {
    "or, if nothing on IFACES needs it, turn route_localnet off:".into()
}

/// The summary and fix of a finding with its interfaces and who likely set route_localnet.
fn finish(
    mut finding: Finding,
    ifaces: &[String],
    open: &RouteLocalnet,
    likely: &dyn Fn(&str) -> Option<String>,
) -> Finding {
    let names = if open.all {
        "every interface (net.ipv4.conf.all.route_localnet is 1)".to_string()
    } else {
        ifaces.join(", ")
    };
    finding.summary = finding.summary.replace("IFACES", &names);
    let sysctls: Vec<String> = if open.all {
        std::iter::once("all")
            .chain(ifaces.iter().map(String::as_str))
            .map(|i| format!("sysctl -w net.ipv4.conf.{i}.route_localnet=0"))
            .collect()
    } else {
        ifaces
            .iter()
            .map(|i| format!("sysctl -w net.ipv4.conf.{i}.route_localnet=0"))
            .collect()
    };
    finding.fix = finding.fix.map(|f| {
        let mut lines = vec![f.replace("IFACES", &names)];
        lines.extend(sysctls);
        lines.join("\n")
    });
    let mut evidence: Vec<String> = Vec::new();
    if open.all {
        evidence.push("net.ipv4.conf.all.route_localnet is 1".into());
        if let Some(who) = likely("all") {
            evidence.push(format!("all: {who}"));
        }
    }
    for i in ifaces {
        if !open.all {
            evidence.push(format!("net.ipv4.conf.{i}.route_localnet is 1"));
        }
        if let Some(who) = likely(i) {
            evidence.push(format!("{i}: {who}"));
        }
    }
    evidence.push(
        "filter INPUT of every IPv4 backend walked for the first packet of a new tcp and udp \
         connection to 127.0.0.1, from the neighbour's own address and from a forged \
         127.0.0.0/8 one"
            .into(),
    );
    finding.evidence = evidence;
    finding
}

/// Who probably turned route_localnet on for `iface` (`all` for the global switch), from
/// what is known of the host; `None` when nothing tells.
fn likely_setter(host: &Host, iface: &str) -> Option<String> {
    let natledger = host.manifests.iter().any(|m| {
        m.addresses
            .iter()
            .any(|a| evidence::route_to(&host.roots, *a).is_some_and(|r| r.interface == iface))
    });
    if natledger {
        return Some(
            "likely natledger, for its 127.0.0.1 path (a container it forwards to is behind \
             this interface)"
                .into(),
        );
    }
    if iface == "all" {
        return Some(
            "likely kube-proxy (in iptables mode it sets it for NodePorts on localhost)".into(),
        );
    }
    if iface == "docker0" || iface.starts_with("br-") {
        return Some(
            "likely Docker (it sets it on its bridges when its userland proxy is off)".into(),
        );
    }
    if iface == "cni0" || iface.starts_with("cni-") || iface.starts_with("podman") {
        return Some(
            "likely CNI portmap (it sets it on the bridge towards a container with a host port)"
                .into(),
        );
    }
    None
}

#[cfg(test)]
mod tests;

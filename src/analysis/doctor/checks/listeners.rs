//! Check 3: local listeners whose traffic a rule takes away.

use std::collections::HashSet;
use std::net::IpAddr;

use super::words::target_text;
use super::{Checks, Walked, delete_fix, rule_ref};
use crate::analysis::doctor::evidence::{self, Listener};
use crate::analysis::doctor::{Finding, Kind, Severity};
use crate::analysis::iptables::paths::Step;
use crate::model::anyrule::{Cond, Match, PortSet, Target, parse_rule};
use crate::model::family::Family;
use crate::model::rule::IpNet;

impl Checks<'_> {
    /// Check 3: Local listeners whose traffic a rule redirects (nat) or rejects (filter INPUT).
    pub(crate) fn hijacked_listeners(&mut self) {
        let Some(host) = self.host else { return };
        let mut seen = HashSet::new();
        for l in &host.listeners {
            if l.command
                .as_deref()
                .is_some_and(|c| evidence::PORT_KEEPERS.contains(&c))
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
                let key = (
                    l.port,
                    l.protocol,
                    w.set.backend,
                    w.table,
                    &step.rule.chain,
                    step.position,
                );
                if !hijacking(w.table, step) || !seen.insert(key) {
                    continue;
                }
                self.findings.push(hijack_finding(w, l, &takers, &packets));
            }
        }
    }
}

/// The finding of a listener `l` whose packets the first of `takers` (on walk `w`) sends
/// elsewhere or rejects: all of them when a run of hijacking rules ends in one that takes
/// everything left (kube-proxy's random split over endpoints), else some.
fn hijack_finding(w: &Walked, l: &Listener, takers: &[&Step], packets: &Match) -> Finding {
    let step = takers[0];
    let all = takers
        .iter()
        .take_while(|s| hijacking(w.table, s))
        .any(|s| s.cond.covers(packets));
    let who = match (&l.command, l.pid) {
        (Some(c), Some(p)) => format!("{c} (pid {p})"),
        _ => "a process".to_string(),
    };
    let (verb, away) = if w.table == "nat" {
        ("sends", " elsewhere")
    } else {
        ("rejects", "")
    };
    let summary = format!(
        "{who} listens on {}, but {} rule {} of {} {verb} {} of that traffic{away} ({}).",
        socket_text(l),
        w.table,
        step.position,
        step.rule.chain,
        if all { "all" } else { "some" },
        target_text(&step.target),
    );
    Finding {
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
        fix: Some(delete_fix(w, step)),
    }
}

/// The steps on a walk that would take some of a listener's packets and name its port, in
/// order (steps of merged invocations left out: their conditions overstate their packets).
fn takers<'w>(w: &'w Walked, packets: &Match, port: u16) -> Vec<&'w Step<'w>> {
    w.walk
        .steps()
        .iter()
        .filter(|s| {
            s.exact()
                && (s.target.is_terminal() || s.target == Target::Return)
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

//! Check 6: DNATs whose forwarded packets the filter FORWARD path drops. Docker sets the
//! FORWARD policy to DROP on every host it runs on (hardened hosts do the same): a port
//! forwarded there without its own accept answers from the node and times out from anywhere
//! else. Each nat PREROUTING DNAT of any owner is followed, as the first packet of a new
//! connection to its target, through filter FORWARD of both backends of its family (the
//! kernel runs both: a drop in either is a drop) with [`packet::fate`]; a drop is reported
//! only when every way the packet can go ends dropped.

use std::net::IpAddr;

use super::{Checks, Walked, dnat_address, port_of, rule_ref, shadowed};
use crate::analysis::doctor::evidence;
use crate::analysis::doctor::{Finding, Kind, RuleRef, Ruleset, Severity};
use crate::analysis::iptables::packet::{self, Addresses, Conntrack, Fate, Packet};
use crate::analysis::iptables::paths::{self, Step};
use crate::backend::Backend;
use crate::model::anyrule::{Cond, Match, Target};
use crate::model::layout::{Owner, owner};
use crate::model::portspec::PortRange;
use crate::model::save::{Dump, SavedRule};

/// A ruleset's filter table, parsed.
type Filter<'a> = (&'a Ruleset, &'a Dump, Vec<(Match, Target)>);

impl Checks<'_> {
    pub(crate) fn forward_drops(&mut self) {
        let filters: Vec<Filter> = self
            .rulesets
            .iter()
            .filter_map(|set| {
                let t = set.table("filter")?;
                Some((set, t, paths::parse_table(t)))
            })
            .collect();
        // natledger's own nftables tables too (live): their DNATs are forwarded through the
        // same FORWARD, and that backend writes no accept of its own.
        let own: Vec<Walked> = self
            .host
            .map_or(&[][..], |h| &h.own[..])
            .iter()
            .filter_map(|set| {
                let t = set.table("nat")?;
                let parsed = paths::parse_table(t);
                let walk = paths::Walk::within(
                    t,
                    &parsed,
                    "PREROUTING",
                    |s| shadowed::interesting("nat", s),
                    &self.budget,
                );
                Some(Walked {
                    set,
                    table: "nat",
                    hook: "PREROUTING",
                    walk,
                })
            })
            .collect();
        for w in &own {
            self.not_followed.extend(w.not_followed());
        }
        let mut found = Vec::new();
        for w in self
            .walks
            .iter()
            .chain(&own)
            .filter(|w| w.table == "nat" && w.hook == "PREROUTING")
        {
            for (step, shadowed_by) in w.walk.reached() {
                let Target::Dnat { to } = &step.target else {
                    continue;
                };
                if shadowed_by.is_some() {
                    continue;
                }
                let Some(forwarded) = self.forwarded(w, step, to) else {
                    continue;
                };
                for (set, filter, parsed) in &filters {
                    if set.family != w.set.family {
                        continue;
                    }
                    // The first packet out, then the first reply back: a connection needs both.
                    let reply = reply_to(&forwarded);
                    let dropped =
                        [(&forwarded, false), (&reply, true)]
                            .into_iter()
                            .find_map(|(p, back)| {
                                match packet::fate(filter, parsed, "FORWARD", p) {
                                    Fate::Dropped(by) => Some((by, back)),
                                    _ => None,
                                }
                            });
                    if let Some((by, back)) = dropped {
                        found.push(self.finding(w, step, &forwarded, set, filter, (by, back)));
                    }
                }
            }
        }
        self.findings.extend(found);
    }

    /// The first packet of a new connection a DNAT forwards, as far as it is known; `None` when
    /// the DNAT does not forward (its target is this host) or its target is not one address.
    fn forwarded(&self, w: &Walked, step: &Step, to: &str) -> Option<Packet> {
        let addr = dnat_address(to).filter(|a| to_one_address(to, *a))?;
        // To this host: INPUT, not FORWARD.
        if addr.is_loopback() {
            return None;
        }
        // Where the packet comes in: the DNAT's own `-i` on its path, else (a live host) the
        // default route's interface, the way clients of other networks arrive; the finding
        // says which.
        let named_in = step.cond.conds.iter().find_map(|c| match c {
            Cond::InIface {
                negated: false,
                name,
            } if !name.ends_with('+') => Some(name.clone()),
            _ => None,
        });
        let (in_iface, out_iface) = match self.host {
            Some(host) if evidence::is_local_address(&host.roots, addr) => return None,
            Some(host) => (
                named_in.or_else(|| evidence::default_interface(&host.roots, addr.is_ipv6())),
                evidence::route_to(&host.roots, addr).map(|r| r.interface),
            ),
            None => (named_in, None),
        };
        let orig_ports = paths::port_set(&step.cond)
            .filter(|r| r.len() == 1)
            .map(|r| PortRange {
                start: r[0].0,
                end: r[0].1,
            });
        let to_ports = dnat_ports(to).or(orig_ports);
        let protocol = step.cond.conds.iter().find_map(|c| match c {
            Cond::Protocol {
                negated: false,
                proto,
            } => crate::analysis::iptables::matchset::proto_number(proto),
            _ => None,
        });
        Some(Packet {
            family: w.set.family,
            protocol,
            src: Addresses::Unknown,
            dst: Addresses::Exactly(addr),
            sport: None,
            dports: to_ports,
            dst_local: Some(false),
            in_iface,
            out_iface,
            conntrack: Some(Conntrack {
                states: vec!["NEW", "DNAT"],
                unsure: vec!["SNAT"],
                orig_dst: Addresses::Unknown,
                orig_dst_ports: orig_ports,
                repl_src: Some(addr),
                repl_src_ports: to_ports,
                original: true,
            }),
        })
    }

    fn finding(
        &self,
        w: &Walked,
        step: &Step,
        forwarded: &Packet,
        set: &Ruleset,
        filter: &Dump,
        (by, reply): (Option<&SavedRule>, bool),
    ) -> Finding {
        let (port, protocol) = port_of(&step.cond);
        let Addresses::Exactly(addr) = forwarded.dst else {
            unreachable!("forwarded packets have one address");
        };
        // The dropping rule, if it is one (a policy is not a rule: the summary names it).
        let dropper = by.map(|rule| {
            let position = filter
                .rules_in(&rule.chain)
                .position(|r| std::ptr::eq(r, rule))
                .map_or(0, |i| i + 1);
            RuleRef::new(set, "filter", &rule.chain, position, &rule.args)
        });
        let summary = dropped_summary(forwarded, addr, set, by.is_some(), reply);
        let evidence = dropped_evidence(step, forwarded, addr, set);
        let proto = protocol.clone().unwrap_or_else(|| "tcp".into());
        let fix = dropped_fix(w, step, set, forwarded, (addr, &proto), by.is_some());
        // From a dump alone, the target might be an address of that host (then nothing is
        // forwarded): a warning, not an error.
        let (severity, summary) = match self.host {
            Some(_) => (Severity::Error, summary),
            None => (
                Severity::Warning,
                format!(
                    "{} unless {addr} is an address of the dumped host itself.",
                    summary.trim_end_matches('.')
                ),
            ),
        };
        Finding {
            severity,
            kind: Kind::ForwardDropped,
            port,
            protocol,
            summary,
            rules: std::iter::once(rule_ref(w, step)).chain(dropper).collect(),
            evidence,
            fix: Some(fix),
        }
    }
}

/// The summary of a forward dropped in `set`'s filter FORWARD (`by_rule`: by a rule, else
/// by the policy; `reply`: the replies, else the packets).
fn dropped_summary(
    forwarded: &Packet,
    addr: IpAddr,
    set: &Ruleset,
    by_rule: bool,
    reply: bool,
) -> String {
    let target = match forwarded.dports {
        Some(p) if addr.is_ipv6() => format!("[{addr}]:{p}"),
        Some(p) => format!("{addr}:{p}"),
        None => addr.to_string(),
    };
    let how = if by_rule { "a rule" } else { "the DROP policy" };
    format!(
        "{} this DNAT forwards to {target} are dropped by {how} of {} {} filter \
         FORWARD: the port answers on this host but not from other hosts.",
        if reply {
            "The replies to connections"
        } else {
            "Packets"
        },
        set.backend,
        set.family
    )
}

/// What the walk assumed of the forwarded packet: the chain walked, and its interfaces.
fn dropped_evidence(step: &Step, forwarded: &Packet, addr: IpAddr, set: &Ruleset) -> Vec<String> {
    let mut evidence = vec![format!(
        "filter FORWARD of {}/{} walked for the first packet of a new connection",
        set.backend, set.family
    )];
    let named_in = step.cond.conds.iter().any(|c| {
        matches!(c, Cond::InIface { negated: false, name } if Some(name) == forwarded.in_iface.as_ref())
    });
    match &forwarded.in_iface {
        Some(i) if named_in => evidence.push(format!("arriving on {i} (the DNAT's -i)")),
        Some(i) => evidence.push(format!(
            "arriving on {i} (the default route's interface, as clients of other networks do)"
        )),
        None => {}
    }
    if let Some(o) = &forwarded.out_iface {
        evidence.push(format!("leaving on {o} (the route to {addr})"));
    }
    evidence
}

/// The fix for a dropped forward, by whose the DNAT is: an accept of the connections it made
/// for another owner's; for natledger's, what keeps or restores its own accept.
fn dropped_fix(
    w: &Walked,
    step: &Step,
    set: &Ruleset,
    forwarded: &Packet,
    (addr, proto): (IpAddr, &str),
    by_rule: bool,
) -> String {
    let tool = format!("{}-{}", set.family.tool_stem(), set.backend.suffix());
    // Both directions: the connections this DNAT made, by their reply source.
    let accept = {
        let port = forwarded
            .dports
            .map(|p| format!(" --ctreplsrcport {}", p.to_string().replace('-', ":")))
            .unwrap_or_default();
        format!(
            "{tool} -I FORWARD -m conntrack --ctstate DNAT --ctproto {proto} --ctreplsrc \
             {addr}{port} -j ACCEPT"
        )
    };
    match owner(&step.rule.chain, &step.rule.args) {
        // The nftables backend writes no accept: one in its own table could not override
        // this drop (each table's forward chain decides for itself).
        Owner::Container(id) if w.set.backend == Backend::OwnNftables => format!(
            "natledger's nftables backend writes no forward accept (one in its own table \
             cannot override a drop in another): accept the connections its DNAT made \
             where they are dropped ({accept}; on a Docker host, in DOCKER-USER), or \
             write container {id}'s rules with the iptables backend this host uses \
             (--backend {})",
            set.backend
        ),
        // An explicit rule drops them before natledger's accept is reached (the accept's
        // jump goes after the rules FORWARD had): the operator's choice to revisit.
        Owner::Container(_) if by_rule => format!(
            "the rule above drops them before natledger's accept is reached; if these \
             clients should reach the port, let that rule pass them ({tool} -I FORWARD \
             before it)"
        ),
        Owner::Container(id) if set.backend == w.set.backend => format!(
            "restart container {id}: its createRuntime hook writes natledger's accept again"
        ),
        Owner::Container(_) => format!(
            "natledger accepts these packets in {}, where its DNAT is; the kernel also runs \
             {} FORWARD: keep the host on one iptables backend, or accept them there too",
            w.set.backend, set.backend
        ),
        _ => accept,
    }
}

/// The first reply of the connection `forwarded` opens: from the DNAT's target back to the
/// client, in on the interface it went out of, conntrack ESTABLISHED in the reply direction.
fn reply_to(forwarded: &Packet) -> Packet {
    let Addresses::Exactly(addr) = forwarded.dst else {
        unreachable!("forwarded packets have one address");
    };
    let mut ct = forwarded
        .conntrack
        .clone()
        .expect("forwarded packets have conntrack facts");
    ct.states = vec!["ESTABLISHED", "DNAT"];
    ct.original = false;
    Packet {
        src: Addresses::Exactly(addr),
        dst: Addresses::Except(addr),
        sport: forwarded.dports.filter(|p| p.is_single()).map(|p| p.start),
        dports: None,
        dst_local: None,
        in_iface: forwarded.out_iface.clone(),
        out_iface: forwarded.in_iface.clone(),
        conntrack: Some(ct),
        ..forwarded.clone()
    }
}

/// Whether `--to-destination` names exactly the one address `addr` (not a range).
fn to_one_address(to: &str, addr: IpAddr) -> bool {
    let host = match to.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None if to.parse::<IpAddr>().is_ok() => to,
        None => to.split(':').next().unwrap_or(""),
    };
    host.parse::<IpAddr>().ok() == Some(addr)
}

/// The port(s) of `--to-destination` (`ADDR:80`, `ADDR:80-82`, `ADDR:80-82/9000`), if any.
fn dnat_ports(to: &str) -> Option<PortRange> {
    let ports = match to.strip_prefix('[') {
        Some(rest) => rest.split_once("]:")?.1,
        None if to.parse::<IpAddr>().is_ok() => return None,
        None => to.split_once(':')?.1,
    };
    let ports = ports.split('/').next()?;
    PortRange::parse_with(ports, '-').ok()
}

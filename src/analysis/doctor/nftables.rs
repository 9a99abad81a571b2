//! Doctor over native nf_tables rulesets of any owner (kube-proxy's nftables mode, netavark,
//! firewalld, Docker 29, CNI portmap's nftables backend, natledger's own tables): the
//! ruleset read live over netlink in doctor's network namespace
//! ([`crate::kernel::nftables::ruleset::read`]) or from `--from nftables:FILE`
//! ([`crate::model::ruleset::parse_dump`]: `nft list ruleset` text or `nft -j` JSON), checked
//! by [`crate::analysis::nftables::check`] with the host's facts, and each
//! [`NftFinding`] put in doctor's terms: the same kinds (a rejected listener is a
//! hijacked one), a [`RuleRef`] naming the table, chain, handle or map element and owner, the
//! fix in nft's own syntax with the lasting fix as a `#` line.
//!
//! The tables iptables-nft writes (`ip`/`ip6` `filter`, `nat`, `mangle`, `raw`, `security`)
//! are left out of the native view whenever an iptables-nft ruleset of that family is read
//! too: doctor's iptables checks judge them, and no finding is made twice.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;

use super::checks::Host;
use super::{
    DoctorError, DoctorOptions, ElementRef, Finding, Kind, NftPlace, RuleRef, Ruleset, Severity,
};
use crate::analysis::nftables::{self, HostFacts, NftFinding, NftKind, Owner, Place};
use crate::backend::Backend;
use crate::model::family::Family;
use crate::model::ruleset::{self as nft, Key, Stmt, TableFamily, Value, render};

/// The table names iptables-nft writes.
const XTABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];

/// One native ruleset and where it came from.
#[derive(Debug)]
pub(crate) struct NftRuleset {
    /// `live`, or the file's path.
    pub(crate) source: String,
    pub(crate) ruleset: nft::Ruleset,
}

impl NftRuleset {
    /// A saved ruleset, either format.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<NftRuleset, DoctorError> {
        let ruleset = nft::parse_dump(text).map_err(|source| DoctorError::ParseNft {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(NftRuleset {
            source: path.display().to_string(),
            ruleset,
        })
    }

    pub(crate) fn rule_count(&self) -> usize {
        let tables = self.ruleset.tables.iter();
        tables.flat_map(|t| &t.chains).map(|c| c.rules.len()).sum()
    }

    /// Without the tables of iptables-nft's families among `iptables` (see the file-top
    /// comment).
    pub(crate) fn without_iptables_tables(mut self, iptables: &[Ruleset]) -> NftRuleset {
        let read: HashSet<Family> = iptables
            .iter()
            .filter(|r| r.backend == Backend::IptablesNft)
            .map(|r| r.family)
            .collect();
        self.ruleset.tables.retain(|t| {
            let family = match t.family {
                TableFamily::Ip => Family::Ipv4,
                TableFamily::Ip6 => Family::Ipv6,
                _ => return true,
            };
            !(read.contains(&family) && XTABLES.contains(&t.name.as_str()))
        });
        self
    }
}

/// The live ruleset of doctor's network namespace; `None` (with a warning) when nf_tables
/// cannot be read: the iptables checks still run.
pub(crate) fn read_live(opts: &DoctorOptions) -> Option<NftRuleset> {
    match opts
        .netfilter
        .with_nft(crate::kernel::nftables::ruleset::read)
    {
        Ok((ruleset, _generation)) => Some(NftRuleset {
            source: "live".into(),
            ruleset,
        }),
        Err(e) => {
            log::warn!(
                "native nftables tables not read: {}",
                crate::causes::text(&e)
            );
            None
        }
    }
}

/// Every native finding of `sets`, in doctor's terms. `host` (live only) gives the
/// listeners and the host's addresses; the iptables rulesets give the forwards the
/// split-backends check weighs.
pub(crate) fn findings(
    sets: &[NftRuleset],
    host: Option<&Host>,
    iptables: &[Ruleset],
) -> Vec<Finding> {
    let facts = facts(host, iptables);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for set in sets {
        let checked = nftables::check(&set.ruleset, &facts);
        out.extend(checked.cut.as_ref().map(|c| cut_short(&set.source, c)));
        for f in checked.findings {
            if natledgers_own(&set.ruleset, &f) {
                continue;
            }
            let finding = finding(&set.ruleset, f);
            // An inet table's rule may be found once per family: say it once.
            let key = serde_json::to_string(&finding).unwrap_or_default();
            if seen.insert(key) {
                out.push(finding);
            }
        }
    }
    out
}

/// A finding among natledger's own rules alone (a held port's stacked DNATs, one in front
/// of the other by design): the natledger-state and stacking checks judge those against the
/// ledger. Another owner's rule in front of natledger's, or natledger's in front of
/// another's, is still a finding.
fn natledgers_own(rs: &nft::Ruleset, f: &NftFinding) -> bool {
    let ours = |p: &Place| {
        rs.tables
            .iter()
            .find(|t| t.family == p.family && t.name == p.table)
            .is_some_and(|t| Owner::of(t) == Owner::Natledger)
    };
    ours(&f.place) && f.other.as_ref().is_none_or(ours)
}

fn facts(host: Option<&Host>, iptables: &[Ruleset]) -> HostFacts {
    let Some(host) = host else {
        return HostFacts {
            iptables_forwards: foreign_forwards(iptables),
            ..HostFacts::default()
        };
    };
    HostFacts {
        listeners: host.listeners().to_vec(),
        locals: crate::kernel::host::local_addresses(host.roots()),
        live: None,
        iptables_forwards: foreign_forwards(iptables),
    }
}

/// The DNATs and redirects of host ports in the iptables rulesets' nat tables, for the
/// native split-backends check.
fn foreign_forwards(iptables: &[Ruleset]) -> Vec<nftables::ForeignForward> {
    use crate::model::anyrule::{Cond, Target, parse_rule};
    let mut out = Vec::new();
    for set in iptables {
        let Some(nat) = set.table("nat") else {
            continue;
        };
        for (i, rule) in nat.rules.iter().enumerate() {
            let (cond, target) = parse_rule(&rule.args);
            if !matches!(target, Target::Dnat { .. } | Target::Redirect { .. }) {
                continue;
            }
            let protocol = cond.conds.iter().find_map(|c| match c {
                Cond::Protocol {
                    negated: false,
                    proto,
                } => proto.parse::<crate::model::portspec::Protocol>().ok(),
                _ => None,
            });
            let ports = cond.conds.iter().find_map(|c| match c {
                Cond::DPorts {
                    negated: false,
                    ports,
                } => Some(ports.0.clone()),
                _ => None,
            });
            let (Some(protocol), Some(ports)) = (protocol, ports) else {
                continue;
            };
            let position = nat.rules[..=i]
                .iter()
                .filter(|r| r.chain == rule.chain)
                .count();
            let place = format!(
                "{}/{} nat {} rule {position}",
                set.backend, set.family, rule.chain
            );
            for (lo, hi) in ports {
                for port in (lo..=hi).take(1024) {
                    out.push(nftables::ForeignForward {
                        protocol,
                        port,
                        place: place.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The budget stopped the native checks short: a warning naming the tables left
/// unexamined, never a silent clean bill.
fn cut_short(source: &str, cut: &nftables::Cut) -> Finding {
    let tables = if cut.tables.is_empty() {
        "native tables".to_string()
    } else {
        let names: Vec<String> = cut
            .tables
            .iter()
            .map(|(family, name)| format!("native table {} {name}", family.word()))
            .collect();
        names.join(", ")
    };
    Finding {
        severity: Severity::Warning,
        kind: Kind::NatledgerState,
        port: None,
        protocol: None,
        summary: format!(
            "{tables} ({source}): too large to analyse fully, {} of {} ports examined.",
            cut.examined, cut.ports
        ),
        rules: Vec::new(),
        evidence: vec![format!(
            "doctor stops its native checks after {} rule evaluations ({} spent), so that it \
             always finishes in bounded time and memory; the ports not examined may hold \
             problems this run does not report, and no shadow is claimed.",
            nftables::BUDGET,
            cut.evaluations
        )],
        fix: None,
    }
}

/// `f` as doctor's finding.
fn finding(rs: &nft::Ruleset, f: NftFinding) -> Finding {
    let kind = match f.kind {
        NftKind::Shadowed => Kind::Shadowed,
        NftKind::DeadTarget => Kind::DeadTarget,
        NftKind::HijackedListener | NftKind::RejectedListener => Kind::HijackedListener,
        NftKind::ForwardDropped => Kind::ForwardDropped,
        NftKind::SplitBackends => Kind::SplitBackends,
    };
    let severity = match f.severity {
        nftables::Severity::Error => Severity::Error,
        nftables::Severity::Warning => Severity::Warning,
        nftables::Severity::Info => Severity::Info,
    };
    let mut rules = vec![rule_ref(rs, &f.place)];
    rules.extend(f.other.as_ref().map(|p| rule_ref(rs, p)));
    let mut fix = f.fix.join("\n");
    if let Some(forget) = pinned_flows(&f) {
        fix.push('\n');
        fix.push_str(&forget);
    }
    if let Some(lasting) = &f.lasting_fix {
        fix.push_str(&format!("\n# {lasting}"));
    }
    Finding {
        severity,
        kind,
        port: Some(f.port),
        protocol: Some(f.protocol.as_str().to_string()),
        summary: f.summary,
        rules,
        evidence: (!f.explanation.is_empty())
            .then_some(f.explanation)
            .into_iter()
            .collect(),
        fix: (!fix.trim().is_empty()).then_some(fix),
    }
}

/// For a finding about a DNAT of a UDP or SCTP port (a shadowed or dead one, a listener's
/// port taken): the command forgetting the port's conntrack entries, without which a
/// client that keeps sending from one source port stays pinned to the old target however
/// the rules change (each datagram refreshes its entry). A rejected port has none: a
/// rejected packet's entry is never confirmed.
fn pinned_flows(f: &NftFinding) -> Option<String> {
    use crate::model::portspec::Protocol;
    let dnat = matches!(
        f.kind,
        NftKind::Shadowed | NftKind::DeadTarget | NftKind::HijackedListener
    );
    let proto = match f.protocol {
        Protocol::Tcp => return None,
        p => p.as_str(),
    };
    (dnat && !f.fix.is_empty())
        .then(|| format!("conntrack -D -p {proto} --orig-port-dst {}", f.port))
}

/// Where `place` is, with its rule's line as `nft` prints it.
fn rule_ref(rs: &nft::Ruleset, place: &Place) -> RuleRef {
    let table = rs
        .tables
        .iter()
        .find(|t| t.family == place.family && t.name == place.table);
    let rule = table
        .and_then(|t| t.chain(&place.chain))
        .and_then(|c| match place.handle {
            Some(h) => c.rules.iter().find(|r| r.handle == Some(h)),
            None => c.rules.get(place.position),
        });
    let line = rule.map(render::rule).unwrap_or_default();
    RuleRef {
        backend: Backend::OwnNftables,
        family: family_of(place.family, rule.map_or(&[][..], |r| &r.stmts)),
        table: place.table.clone(),
        chain: place.chain.clone(),
        position: place.position + 1,
        line,
        hooks: Vec::new(),
        nft: Some(NftPlace {
            table_family: place.family.word(),
            handle: place.handle.or_else(|| rule.and_then(|r| r.handle)),
            element: place.element.as_ref().map(|e| ElementRef {
                set: e.set.clone(),
                key: render::element_key(&e.key),
            }),
            owner: table.and_then(|t| owner_word(Owner::of(t))),
        }),
    }
}

/// The family of the packets a rule judges: its table's, or for an `inet` table IPv6 when
/// the rule names an IPv6 field or address, else IPv4.
fn family_of(table: TableFamily, stmts: &[Stmt]) -> Family {
    match table {
        TableFamily::Ip6 => return Family::Ipv6,
        TableFamily::Inet => {}
        _ => return Family::Ipv4,
    }
    let v6_value = |v: &Value| match v {
        Value::Addr(a) | Value::Prefix(a, _) | Value::AddrRange(a, _) => {
            matches!(a, IpAddr::V6(_))
        }
        _ => false,
    };
    let v6 = stmts.iter().any(|s| match s {
        Stmt::Match(m) => {
            m.key
                .iter()
                .any(|k| matches!(k, Key::Saddr { v4: false } | Key::Daddr { v4: false }))
                || matches!(&m.right, nft::Operand::Values(vs) if vs.iter().any(v6_value))
        }
        Stmt::Nat(n) => n.v4 == Some(false),
        _ => false,
    });
    if v6 { Family::Ipv6 } else { Family::Ipv4 }
}

/// The owner as the JSON names it.
fn owner_word(owner: Owner) -> Option<&'static str> {
    Some(match owner {
        Owner::KubeProxy => "kube-proxy",
        Owner::Netavark => "netavark",
        Owner::Firewalld => "firewalld",
        Owner::Docker => "docker",
        Owner::Portmap => "portmap",
        Owner::Natledger => "natledger",
        Owner::Unknown => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALE: &str = include_str!("../../../tests/fixtures/nftables/netavark_stale.nft");

    fn native(text: &str) -> NftRuleset {
        NftRuleset::parse(Path::new("dump"), text).unwrap()
    }

    fn iptables(backend: Backend, family: Family) -> Ruleset {
        Ruleset {
            backend,
            family,
            source: "dump".into(),
            tables: Vec::new(),
        }
    }

    /// A dead container's netavark DNAT before the live one's, from a dump: each protocol's
    /// shadow in doctor's terms, its rules in nft's words with the table family and owner,
    /// the fix deleting the stale rule (by position: no handles in this dump), and for UDP
    /// the pinned flows forgotten after it.
    #[test]
    fn a_stale_netavark_dnat_is_a_shadow_in_doctors_terms() {
        let found = findings(&[native(STALE)], None, &[]);
        let shadows: Vec<&Finding> = found.iter().filter(|f| f.kind == Kind::Shadowed).collect();
        assert_eq!(shadows.len(), 2, "{found:#?}");
        for (f, proto) in shadows.iter().zip(["tcp", "udp"]) {
            assert_eq!(
                (f.severity, f.port, f.protocol.as_deref()),
                (Severity::Error, Some(8080), Some(proto))
            );
            let lines: Vec<&str> = f.rules.iter().map(|r| r.line.as_str()).collect();
            assert_eq!(
                lines,
                [
                    format!("{proto} dport 8080 dnat ip to 10.77.0.3:80"),
                    format!("{proto} dport 8080 dnat ip to 10.77.0.2:80"),
                ]
            );
            for r in &f.rules {
                let nft = r.nft.as_ref().unwrap();
                assert_eq!(
                    (
                        r.backend,
                        r.family,
                        r.table.as_str(),
                        nft.table_family,
                        nft.owner
                    ),
                    (
                        Backend::OwnNftables,
                        Family::Ipv4,
                        "netavark",
                        "inet",
                        Some("netavark")
                    )
                );
                assert_eq!(r.chain, "nv_2f259bab_10_77_0_0_nm24_dnat");
            }
            let fix = f.fix.as_deref().unwrap();
            assert_eq!(
                fix.contains("conntrack -D -p udp --orig-port-dst 8080"),
                proto == "udp",
                "{fix}"
            );
            assert!(fix.contains("\n# netavark writes its rules back"), "{fix}");
        }
    }

    /// The element a kube-proxy verdict map decided on is named by its set and key as nft
    /// writes it, and the JSON carries it beside the handle-less place.
    #[test]
    fn a_map_element_is_named_by_set_and_key() {
        let rs = native(
            "table ip kube-proxy {
               map no-endpoint-nodeports {
                 type inet_proto . inet_service : verdict
                 elements = { tcp . 30080 : goto reject-chain }
               }
               chain filter-input {
                 type filter hook input priority 0; policy accept;
                 meta l4proto . th dport vmap @no-endpoint-nodeports
               }
               chain reject-chain {
                 reject
               }
             }",
        );
        let place = Place {
            family: TableFamily::Ip,
            table: "kube-proxy".into(),
            chain: "filter-input".into(),
            handle: None,
            position: 0,
            element: Some(nftables::ElementRef {
                set: "no-endpoint-nodeports".into(),
                key: Value::Concat(vec![Value::Proto(6), Value::Int(30080)]),
            }),
        };
        let r = rule_ref(&rs.ruleset, &place);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["element"]["set"], "no-endpoint-nodeports");
        assert_eq!(json["element"]["key"], "tcp . 30080");
        assert_eq!(json["owner"], "kube-proxy");
        assert_eq!(json["table_family"], "ip");
        assert_eq!(json["position"], 1);
        assert!(json.get("handle").is_none(), "{json}");
        assert_eq!(
            json["line"],
            "meta l4proto . th dport vmap @no-endpoint-nodeports"
        );
        // An iptables rule's place has none of the native fields.
        let plain = RuleRef { nft: None, ..r };
        let json = serde_json::to_value(&plain).unwrap();
        for k in ["table_family", "handle", "element", "owner"] {
            assert!(json.get(k).is_none(), "{json}");
        }
    }

    /// iptables-nft's own tables leave the native view only when an iptables-nft ruleset of
    /// their family is read too.
    #[test]
    fn iptables_nft_tables_are_judged_once() {
        let text = "table ip nat {\n chain PREROUTING {\n  type nat hook prerouting priority -100; policy accept;\n }\n}\n\
                    table ip6 nat {\n chain PREROUTING {\n  type nat hook prerouting priority -100; policy accept;\n }\n}\n\
                    table inet filter {\n chain input {\n  type filter hook input priority 0; policy accept;\n }\n}\n";
        let names = |n: NftRuleset| -> Vec<String> {
            n.ruleset
                .tables
                .iter()
                .map(|t| format!("{} {}", t.family.word(), t.name))
                .collect()
        };
        let kept =
            native(text).without_iptables_tables(&[iptables(Backend::IptablesNft, Family::Ipv4)]);
        assert_eq!(names(kept), ["ip6 nat", "inet filter"]);
        let kept = native(text)
            .without_iptables_tables(&[iptables(Backend::IptablesLegacy, Family::Ipv4)]);
        assert_eq!(names(kept), ["ip nat", "ip6 nat", "inet filter"]);
    }

    #[test]
    fn an_inet_rule_is_judged_in_the_family_it_names() {
        let rs = native(
            "table inet t {\n chain c {\n  ip6 daddr fd00::1 tcp dport 80 dnat ip6 to [fd00::2]:80\n  tcp dport 81 accept\n }\n}\n",
        );
        let rules = &rs.ruleset.tables[0].chains[0].rules;
        assert_eq!(family_of(TableFamily::Inet, &rules[0].stmts), Family::Ipv6);
        assert_eq!(family_of(TableFamily::Inet, &rules[1].stmts), Family::Ipv4);
        assert_eq!(family_of(TableFamily::Ip6, &rules[1].stmts), Family::Ipv6);
    }

    /// The iptables side's DNATs of a port, for the native split-backends check.
    #[test]
    fn iptables_forwards_are_read_from_the_nat_tables() {
        let dump = "*nat\n:PREROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n\
                    -A PREROUTING -j DOCKER\n\
                    -A DOCKER -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80\n\
                    COMMIT\n";
        let set = Ruleset {
            tables: crate::model::save::parse_dump(dump).unwrap(),
            ..iptables(Backend::IptablesLegacy, Family::Ipv4)
        };
        let found = foreign_forwards(&[set]);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].port, found[0].protocol.as_str()), (8080, "tcp"));
        assert_eq!(found[0].place, "legacy/ipv4 nat DOCKER rule 1");
    }

    /// A ruleset the budget cut short is a warning naming its tables, never a clean bill.
    #[test]
    fn a_ruleset_cut_short_is_a_natledger_state_warning() {
        let cut = nftables::Cut {
            examined: 3,
            ports: 10,
            tables: vec![(TableFamily::Ip, "kube-proxy".into())],
            evaluations: nftables::BUDGET,
        };
        let f = cut_short("ruleset.nft", &cut);
        assert_eq!(
            (f.kind, f.severity),
            (Kind::NatledgerState, Severity::Warning)
        );
        assert_eq!(
            f.summary,
            "native table ip kube-proxy (ruleset.nft): too large to analyse fully, 3 of 10 \
             ports examined."
        );
    }
}

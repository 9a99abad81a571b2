//! `fate` on rulesets shaped as their owners write them, the checks' findings (and none on
//! healthy rulesets), and the randomised soundness of shadow claims (`soundness.rs`).

mod build;
mod kernel_read;
mod listed;
mod soundness;

use std::net::IpAddr;

use build::*;

use super::*;
use crate::analysis::verdict::Tri;
use crate::model::ruleset::Element;
use crate::model::ruleset::*;

const NODE: &str = "192.168.0.2";

fn probe(daddr: &str, port: u16, path: Path) -> Probe {
    let daddr = ip(daddr);
    Probe {
        v4: daddr.is_ipv4(),
        saddr: match path {
            Path::Local => Some(daddr),
            Path::Outside => Some(ip("203.0.113.9")),
        },
        daddr,
        proto: 6,
        sport: 40000,
        dport: port,
        iif: Some("eth0".into()),
        oif: Some("cni0".into()),
        path,
        locals: vec![ip(NODE)].into(),
    }
}

fn rs(tables: Vec<NftTable>) -> Ruleset {
    Ruleset { tables }
}

fn listener(port: u16) -> Listener {
    Listener {
        protocol: Protocol::Tcp,
        addr: ip("0.0.0.0"),
        port,
        inode: 1,
        pid: Some(42),
        command: Some("server".into()),
    }
}

fn host(listeners: Vec<Listener>, live: &[&str]) -> HostFacts {
    HostFacts {
        listeners,
        locals: vec![ip(NODE)],
        live: Some(live.iter().map(|a| ip(a)).collect()),
        iptables_forwards: Vec::new(),
    }
}

/// Every finding of the checks, which must not have reached their budget.
fn check(rs: &Ruleset, host: &HostFacts) -> Vec<NftFinding> {
    let checked = super::check(rs, host);
    assert_eq!(checked.cut, None);
    checked.findings
}

fn kinds(found: &[NftFinding]) -> Vec<(NftKind, u16)> {
    found.iter().map(|f| (f.kind, f.port)).collect()
}

#[test]
fn a_nodeport_without_endpoints_is_rejected_through_its_map_element() {
    let rs = rs(vec![kube_proxy(NODE)]);
    for path in [Path::Outside, Path::Local] {
        let f = fate(&rs, &probe(NODE, 30080, path));
        assert_eq!(f.outcomes.len(), 1, "{f:#?}");
        let o = &f.outcomes[0];
        assert!(o.sure);
        let End::Dropped { place, reject, .. } = &o.end else {
            panic!("{o:?}")
        };
        assert!(reject);
        assert_eq!(place.chain, "reject-chain");
        let element = o.via.iter().find_map(|p| p.element.clone()).unwrap();
        assert_eq!(element.set, "no-endpoint-nodeports");
        assert_eq!(element.key, proto_port(6, 30080));
    }
    // Another port of the node is delivered; 30080 of another address is not kube-proxy's.
    let f = fate(&rs, &probe(NODE, 30082, Path::Outside));
    assert_eq!(f.all(|o| o.end == End::Delivered), Tri::Yes);
    let mut other = probe("192.168.0.3", 30080, Path::Outside);
    other.locals = vec![ip(NODE), ip("192.168.0.3")].into();
    assert_eq!(fate(&rs, &other).all(|o| o.end == End::Delivered), Tri::Yes);
}

#[test]
fn a_nodeport_is_dnated_to_its_endpoint_and_forwarded() {
    let rs = rs(vec![kube_proxy(NODE)]);
    let f = fate(&rs, &probe(NODE, 30081, Path::Outside));
    assert_eq!(f.outcomes.len(), 1, "{f:#?}");
    let o = &f.outcomes[0];
    assert_eq!(o.end, End::Forwarded);
    let d = o.dnat.as_ref().unwrap();
    assert_eq!((d.to, d.port), (ip("10.180.0.1"), 80));
    assert_eq!(
        d.place.chain,
        "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    );
    assert_eq!(d.place.handle, Some(2));
    // From this host too (output's nat), then out.
    let f = fate(&rs, &probe(NODE, 30081, Path::Local));
    assert_eq!(
        f.all(|o| o.dnat.is_some() && o.end == End::Forwarded),
        Tri::Yes
    );
}

#[test]
fn kube_proxy_takes_listeners_ports_and_says_which_element() {
    let rs = rs(vec![kube_proxy(NODE)]);
    let found = check(
        &rs,
        &host(vec![listener(30080), listener(30081)], &["10.180.0.1"]),
    );
    assert_eq!(
        kinds(&found),
        [
            (NftKind::RejectedListener, 30080),
            (NftKind::HijackedListener, 30081)
        ],
        "{found:#?}"
    );
    let rejected = &found[0];
    assert_eq!(rejected.severity, Severity::Error);
    assert_eq!(rejected.owner, Owner::KubeProxy);
    assert_eq!(
        rejected.fix,
        ["nft delete element ip kube-proxy no-endpoint-nodeports { tcp . 30080 }"]
    );
    assert!(rejected.lasting_fix.as_deref().unwrap().contains("Service"));
    let hijacked = &found[1];
    assert_eq!(hijacked.severity, Severity::Error);
    assert_eq!(
        hijacked.fix,
        ["nft delete element ip kube-proxy service-nodeports { tcp . 30081 }"]
    );
    assert!(
        hijacked.summary.contains("10.180.0.1:80"),
        "{}",
        hijacked.summary
    );
}

#[test]
fn healthy_rulesets_have_no_findings() {
    let found = check(
        &rs(vec![kube_proxy(NODE)]),
        &host(vec![listener(22)], &["10.180.0.1"]),
    );
    assert!(found.is_empty(), "{found:#?}");
    let found = check(
        &rs(vec![netavark("10.88.0.2", "10.88.0.2")]),
        &host(vec![listener(22)], &["10.88.0.2"]),
    );
    // Two rules to the same live container: the second never sees a packet, but only the
    // shadow is said, no dead target.
    assert!(
        found.iter().all(|f| f.kind == NftKind::Shadowed),
        "{found:#?}"
    );
}

#[test]
fn a_stale_netavark_dnat_shadows_the_live_one_and_is_dead() {
    let rs = rs(vec![netavark("10.88.0.5", "10.88.0.2")]);
    let found = check(&rs, &host(Vec::new(), &["10.88.0.2"]));
    assert_eq!(
        kinds(&found),
        [(NftKind::Shadowed, 8080), (NftKind::DeadTarget, 8080)],
        "{found:#?}"
    );
    let shadow = &found[0];
    assert_eq!(shadow.place.chain, "nv_new_dnat");
    assert_eq!(shadow.other.as_ref().unwrap().chain, "nv_old_dnat");
    assert_eq!(shadow.owner, Owner::Netavark);
    assert_eq!(
        shadow.fix,
        ["nft delete rule inet netavark nv_old_dnat handle 1"]
    );
    let dead = &found[1];
    assert_eq!(dead.place.chain, "nv_old_dnat");
    assert_eq!(dead.severity, Severity::Error);
    // Without the live addresses, nothing is called dead.
    let mut unknown = host(Vec::new(), &[]);
    unknown.live = None;
    assert_eq!(kinds(&check(&rs, &unknown)), [(NftKind::Shadowed, 8080)]);
}

#[test]
fn an_accept_in_one_table_does_not_stop_anothers_drop() {
    let drop = table(
        TableFamily::Inet,
        "filter",
        vec![base(
            "forward",
            ChainKind::Filter,
            Hook::Forward,
            10,
            Policy::Drop,
            vec![rule(vec![
                eq(vec![Key::CtState], vec![Value::Word("established".into())]),
                Stmt::Verdict(Verdict::Accept),
            ])],
        )],
        vec![],
    );
    let rs = rs(vec![netavark("10.88.0.2", "10.88.0.2"), drop]);
    let f = fate(&rs, &probe(NODE, 8080, Path::Outside));
    let Some(End::Dropped {
        place,
        policy,
        hook,
        ..
    }) = f.outcomes.first().map(|o| &o.end)
    else {
        panic!("{f:#?}")
    };
    assert!(policy);
    assert_eq!((*hook, place.table.as_str()), (Hook::Forward, "filter"));
    let found = check(&rs, &host(Vec::new(), &["10.88.0.2"]));
    let dropped: Vec<_> = found
        .iter()
        .filter(|f| f.kind == NftKind::ForwardDropped)
        .collect();
    assert_eq!(dropped.len(), 1, "{found:#?}");
    assert_eq!(dropped[0].severity, Severity::Error);
    assert_eq!(
        dropped[0].fix,
        ["nft insert rule inet filter forward ct status dnat accept"]
    );
}

#[test]
fn equal_priorities_run_in_either_order_and_numgen_takes_every_branch() {
    let one = |name: &str, to: &str| {
        table(
            TableFamily::Ip,
            name,
            vec![base(
                "pre",
                ChainKind::Nat,
                Hook::Prerouting,
                -100,
                Policy::Accept,
                vec![rule(vec![tcp_dport(8080), dnat(to, 80)])],
            )],
            vec![],
        )
    };
    let rs = rs(vec![one("a", "10.0.0.2"), one("b", "10.0.0.3")]);
    let f = fate(&rs, &probe(NODE, 8080, Path::Outside));
    let mut to: Vec<IpAddr> = f
        .outcomes
        .iter()
        .filter_map(|o| o.dnat.as_ref().map(|d| d.to))
        .collect();
    to.sort();
    assert_eq!(to, [ip("10.0.0.2"), ip("10.0.0.3")]);
    // Neither is claimed shadowed: each may win.
    let found = check(&rs, &host(Vec::new(), &["10.0.0.2", "10.0.0.3"]));
    assert!(found.is_empty(), "{found:#?}");
    // A lower priority runs first and its DNAT is the connection's.
    let mut rs = rs;
    rs.tables[1].chains[0].base.as_mut().unwrap().priority = -150;
    let f = fate(&rs, &probe(NODE, 8080, Path::Outside));
    assert_eq!(
        f.all(|o| o.dnat.as_ref().unwrap().to == ip("10.0.0.3")),
        Tri::Yes
    );
    let found = check(&rs, &host(Vec::new(), &["10.0.0.2", "10.0.0.3"]));
    assert_eq!(kinds(&found), [(NftKind::Shadowed, 8080)], "{found:#?}");
    assert_eq!(found[0].place.table, "a");

    // numgen random mod 2 over two endpoints: both, and nothing else.
    let mut kp = kube_proxy(NODE);
    let service = kp
        .chains
        .iter_mut()
        .find(|c| c.name.starts_with("service-42"))
        .unwrap();
    service.rules[0].stmts[0] = Stmt::Vmap {
        key: vec![Key::Numgen { modulus: 2 }],
        map: SetRef::Inline(
            [
                (0, "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"),
                (1, "ep2"),
            ]
            .into_iter()
            .map(|(k, to)| Element {
                key: Value::Int(k),
                data: Some(ElementData::Verdict(Verdict::Goto(to.into()))),
                comment: None,
            })
            .collect(),
        ),
    };
    kp.chains
        .push(chain("ep2", vec![rule(vec![dnat("10.180.0.2", 80)])]));
    let rs = Ruleset { tables: vec![kp] };
    let f = fate(&rs, &probe(NODE, 30081, Path::Outside));
    let mut to: Vec<IpAddr> = f
        .outcomes
        .iter()
        .map(|o| o.dnat.as_ref().unwrap().to)
        .collect();
    to.sort();
    let vias: Vec<_> = f.outcomes.iter().map(|o| (o.via.len(), &o.end)).collect();
    assert_eq!(to, [ip("10.180.0.1"), ip("10.180.0.2")], "{vias:?}");
    let found = check(&rs, &host(vec![listener(30081)], &["10.180.0.1"]));
    // Half of it to a dead endpoint: a warning; the listener loses all of it.
    let dead: Vec<_> = found
        .iter()
        .filter(|f| f.kind == NftKind::DeadTarget)
        .collect();
    assert_eq!(dead.len(), 1, "{found:#?}");
    assert_eq!(dead[0].severity, Severity::Warning);
}

#[test]
fn what_is_not_modelled_may_go_either_way() {
    let t = table(
        TableFamily::Ip,
        "t",
        vec![base(
            "in",
            ChainKind::Filter,
            Hook::Input,
            0,
            Policy::Accept,
            vec![
                rule(vec![
                    Stmt::Other("limit rate 10/second".into()),
                    tcp_dport(22),
                    Stmt::Verdict(Verdict::Drop),
                ]),
                rule(vec![
                    eq(vec![Key::Mark], vec![Value::Int(1)]),
                    tcp_dport(22),
                    Stmt::Reject,
                ]),
            ],
        )],
        vec![],
    );
    let f = fate(&rs(vec![t]), &probe(NODE, 22, Path::Outside));
    assert_eq!(f.all(|o| o.end == End::Delivered), Tri::Maybe, "{f:#?}");
    assert!(f.outcomes.iter().any(|o| matches!(o.end, End::Unknown(_))));
    assert!(f.outcomes.iter().all(|o| !o.sure));
    // A rule for another port or family is not met at all.
    let f = fate(&rs(vec![]), &probe(NODE, 22, Path::Outside));
    assert_eq!(f.outcomes.len(), 1);
    assert!(f.outcomes[0].sure);
}

#[test]
fn forwards_of_names_other_owners_not_natledgers_own() {
    let mut own = netavark("10.88.0.7", "10.88.0.7");
    own.family = TableFamily::Ip;
    own.name = "natledger".into();
    let rs = rs(vec![netavark("10.88.0.5", "10.88.0.2"), own]);
    let found = forwards_of(&rs, Protocol::Tcp, 8080, &[ip(NODE)]);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].owner, Owner::Netavark);
    assert_eq!((found[0].to, found[0].to_port), (ip("10.88.0.5"), 80));
    assert!(found[0].certain);
    assert!(forwards_of(&rs, Protocol::Udp, 8080, &[ip(NODE)]).is_empty());
    // iptables-nft's nat table is the iptables walk's.
    let mut xt = netavark("10.88.0.8", "10.88.0.8");
    xt.family = TableFamily::Ip;
    xt.name = "nat".into();
    let only_xt = Ruleset { tables: vec![xt] };
    assert!(forwards_of(&only_xt, Protocol::Tcp, 8080, &[ip(NODE)]).is_empty());
    assert!(check(&only_xt, &host(vec![listener(8080)], &[])).is_empty());
    assert!(forwards_of(&rs, Protocol::Tcp, 8081, &[ip(NODE)]).is_empty());
}

#[test]
fn split_backends_names_both() {
    let rs = rs(vec![netavark("10.88.0.2", "10.88.0.2")]);
    let mut h = host(Vec::new(), &["10.88.0.2"]);
    h.iptables_forwards.push(ForeignForward {
        protocol: Protocol::Tcp,
        port: 8080,
        place: "iptables-nft nat DOCKER rule 1".into(),
    });
    let found = check(&rs, &h);
    let split: Vec<_> = found
        .iter()
        .filter(|f| f.kind == NftKind::SplitBackends)
        .collect();
    assert_eq!(split.len(), 1, "{found:#?}");
    assert!(split[0].summary.contains("iptables-nft nat DOCKER rule 1"));
}

/// kube-proxy with `services` NodePort Services (one endpoint each) and `cluster` more
/// ClusterIP-only elements.
fn big_kube_proxy(services: u64, cluster: u64) -> Ruleset {
    let mut kp = kube_proxy(NODE);
    let template: Vec<Chain> = kp
        .chains
        .iter()
        .filter(|c| c.name.contains("42NWR3ZC") || c.name.contains("5OJB2KTY"))
        .cloned()
        .collect();
    for i in 0..services {
        let endpoint = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        let rename = |s: &str| {
            s.replace("42NWR3ZC", &format!("S{i}"))
                .replace("5OJB2KTY", &format!("E{i}"))
        };
        for c in &template {
            let mut c = c.clone();
            c.name = rename(&c.name);
            for r in &mut c.rules {
                for s in &mut r.stmts {
                    match s {
                        Stmt::Verdict(Verdict::Goto(to)) => *to = rename(to),
                        Stmt::Vmap {
                            map: SetRef::Inline(es),
                            ..
                        } => {
                            for e in es {
                                if let Some(ElementData::Verdict(Verdict::Goto(to))) = &mut e.data {
                                    *to = rename(to);
                                }
                            }
                        }
                        Stmt::Nat(n) => n.addr = Some(NatAddr::Fixed(Value::Addr(ip(&endpoint)))),
                        _ => {}
                    }
                }
            }
            kp.chains.push(c);
        }
        let nodeports = kp
            .sets
            .iter_mut()
            .find(|s| s.name == "service-nodeports")
            .unwrap();
        nodeports.elements.push(Element {
            key: proto_port(6, 31000 + i),
            data: Some(ElementData::Verdict(Verdict::Goto(format!(
                "external-S{i}-ns1/svc1/tcp/p80"
            )))),
            comment: None,
        });
    }
    let ips = kp
        .sets
        .iter_mut()
        .find(|s| s.name == "service-ips")
        .unwrap();
    for i in 0..cluster {
        ips.elements.push(Element {
            key: Value::Concat(vec![
                Value::Addr(IpAddr::from([172, 30, (i / 256) as u8, (i % 256) as u8])),
                Value::Proto(6),
                Value::Int(80 + i % 7),
            ]),
            data: Some(ElementData::Verdict(Verdict::Goto(
                "service-42NWR3ZC-ns1/svc1/tcp/p80".into(),
            ))),
            comment: None,
        });
    }
    Ruleset { tables: vec![kp] }
}

#[test]
fn a_20000_element_kube_proxy_ruleset_is_checked_in_bounded_time() {
    let rs = big_kube_proxy(1_000, 19_000);
    let started = std::time::Instant::now();
    let found = check(&rs, &host(vec![listener(30080), listener(31007)], &[]));
    let took = started.elapsed();
    assert!(
        found
            .iter()
            .any(|f| f.kind == NftKind::HijackedListener && f.port == 31007)
    );
    assert!(
        found
            .iter()
            .any(|f| f.kind == NftKind::RejectedListener && f.port == 30080)
    );
    // 1.3 s in a debug build (sets indexed by exact key, chains by name, hook orders once).
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

#[test]
fn a_ruleset_past_the_budget_is_reported_cut_short_never_clean() {
    // From a dump: no host addresses, so every ClusterIP is a destination (kube-proxy's
    // `cluster-ips-check`: `ip daddr @cluster-ips reject`).
    let mut rs = big_kube_proxy(200, 3_000);
    let kp = &mut rs.tables[0];
    let ips: Vec<String> = (0..3_000u32)
        .map(|i| format!("172.30.{}.{}", i / 256, i % 256))
        .collect();
    let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
    kp.sets.push(addr_set("cluster-ips", &ips));
    kp.chains.push(chain(
        "cluster-ips-check",
        vec![rule(vec![
            in_set(vec![Key::Daddr { v4: true }], "cluster-ips"),
            Stmt::Reject,
        ])],
    ));
    let output = kp.chains.iter_mut().find(|c| c.name == "filter-output");
    output
        .unwrap()
        .rules
        .push(rule(vec![jump("cluster-ips-check")]));
    let dump = HostFacts::default();
    let started = std::time::Instant::now();
    let checked = check_within(&rs, &dump, 5_000);
    let took = started.elapsed();
    let cut = checked.cut.expect("cut short");
    assert_eq!(cut.tables, [(TableFamily::Ip, "kube-proxy".to_string())]);
    assert!(cut.examined < cut.ports, "{cut:?}");
    // One walk may overshoot the budget, never more.
    assert!(cut.evaluations < 5_000 + 200_000, "{cut:?}");
    assert!(!checked.findings.iter().any(|f| f.kind == NftKind::Shadowed));
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    // Within the budget, the same ruleset is examined whole: each ClusterIP probed with its
    // own port only, one of them standing for all at every other port.
    let started = std::time::Instant::now();
    let whole = super::check(&rs, &dump);
    assert_eq!(whole.cut, None);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn nat_chains_run_where_the_nat_core_hooks_in() {
    // A nat chain at priority 0 still runs at -100, before a filter chain at -90, which so
    // sees the DNATed destination.
    let nat = table(
        TableFamily::Ip,
        "n",
        vec![base(
            "pre",
            ChainKind::Nat,
            Hook::Prerouting,
            0,
            Policy::Accept,
            vec![rule(vec![tcp_dport(8080), dnat("10.0.0.2", 80)])],
        )],
        vec![],
    );
    let filter = table(
        TableFamily::Ip,
        "f",
        vec![base(
            "pre",
            ChainKind::Filter,
            Hook::Prerouting,
            -90,
            Policy::Accept,
            vec![rule(vec![
                eq(
                    vec![Key::Daddr { v4: true }],
                    vec![Value::Addr(ip("10.0.0.2"))],
                ),
                Stmt::Verdict(Verdict::Drop),
            ])],
        )],
        vec![],
    );
    let f = fate(&rs(vec![nat, filter]), &probe(NODE, 8080, Path::Outside));
    assert_eq!(
        f.all(|o| matches!(&o.end, End::Dropped { place, .. } if place.table == "f")),
        Tri::Yes,
        "{f:#?}"
    );
}

//! Rulesets built in code: a small builder in nft's shapes.

use std::net::IpAddr;

use crate::model::ruleset::*;

pub(super) fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

pub(super) fn table(
    family: TableFamily,
    name: &str,
    chains: Vec<Chain>,
    sets: Vec<Set>,
) -> NftTable {
    NftTable {
        family,
        name: name.into(),
        handle: None,
        comment: None,
        chains,
        sets,
    }
}

pub(super) fn base(
    name: &str,
    kind: ChainKind,
    hook: Hook,
    priority: i32,
    policy: Policy,
    rules: Vec<Rule>,
) -> Chain {
    Chain {
        name: name.into(),
        handle: None,
        base: Some(Base {
            kind,
            hook,
            priority,
            policy,
        }),
        rules: number(rules),
    }
}

pub(super) fn chain(name: &str, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.into(),
        handle: None,
        base: None,
        rules: number(rules),
    }
}

/// Handles as the kernel gives them: unique in the table; here from 1 per chain, offset by
/// the chain's length so tests can name them.
fn number(mut rules: Vec<Rule>) -> Vec<Rule> {
    for (i, r) in rules.iter_mut().enumerate() {
        r.handle.get_or_insert(i as u64 + 1);
    }
    rules
}

pub(super) fn rule(stmts: Vec<Stmt>) -> Rule {
    Rule {
        handle: None,
        comment: None,
        stmts,
    }
}

pub(super) fn eq(key: Vec<Key>, values: Vec<Value>) -> Stmt {
    Stmt::Match(Match {
        key,
        op: Op::Eq,
        right: Operand::Values(values),
    })
}

pub(super) fn in_set(key: Vec<Key>, set: &str) -> Stmt {
    Stmt::Match(Match {
        key,
        op: Op::Eq,
        right: Operand::Set(set.into()),
    })
}

pub(super) fn tcp_dport(p: u64) -> Stmt {
    eq(vec![Key::Dport(Some(6))], vec![Value::Int(p)])
}

pub(super) fn ct_new() -> Stmt {
    eq(vec![Key::CtState], vec![Value::Word("new".into())])
}

pub(super) fn jump(to: &str) -> Stmt {
    Stmt::Verdict(Verdict::Jump(to.into()))
}

pub(super) fn goto(to: &str) -> Stmt {
    Stmt::Verdict(Verdict::Goto(to.into()))
}

pub(super) fn vmap(key: Vec<Key>, set: &str) -> Stmt {
    Stmt::Vmap {
        key,
        map: SetRef::Named(set.into()),
    }
}

pub(super) fn dnat(to: &str, port: u16) -> Stmt {
    Stmt::Nat(Nat {
        kind: NatKind::Dnat,
        v4: None,
        addr: Some(NatAddr::Fixed(Value::Addr(ip(to)))),
        port: Some(NatPort::Fixed(port)),
    })
}

pub(super) fn proto_port(proto: u8, port: u64) -> Value {
    Value::Concat(vec![Value::Proto(proto), Value::Int(port)])
}

pub(super) fn vmap_set(name: &str, key: &[&str], elements: Vec<(Value, Verdict)>) -> Set {
    Set {
        name: name.into(),
        handle: None,
        key: key.iter().map(|s| s.to_string()).collect(),
        data: Some(SetData::Verdict),
        interval: false,
        comment: None,
        elements: elements
            .into_iter()
            .map(|(key, v)| Element {
                key,
                data: Some(ElementData::Verdict(v)),
                comment: None,
            })
            .collect(),
    }
}

pub(super) fn addr_set(name: &str, addrs: &[&str]) -> Set {
    Set {
        name: name.into(),
        handle: None,
        key: vec!["ipv4_addr".into()],
        data: None,
        interval: false,
        comment: None,
        elements: addrs
            .iter()
            .map(|a| Element {
                key: Value::Addr(ip(a)),
                data: None,
                comment: None,
            })
            .collect(),
    }
}

/// kube-proxy's nftables mode as its proxier tests expect it, cut to what decides a
/// NodePort: 30080 a Service without endpoints, 30081 one with endpoint 10.180.0.1:80.
pub(super) fn kube_proxy(node: &str) -> NftTable {
    use ChainKind::{Filter, Nat};
    use Policy::Accept;
    let l4 = || vec![Key::L4Proto, Key::Dport(None)];
    let mut t = table(
        TableFamily::Ip,
        "kube-proxy",
        vec![
            base(
                "filter-input",
                Filter,
                Hook::Input,
                -110,
                Accept,
                vec![rule(vec![ct_new(), jump("nodeport-endpoints-check")])],
            ),
            base(
                "filter-output",
                Filter,
                Hook::Output,
                -110,
                Accept,
                vec![rule(vec![ct_new(), jump("service-endpoints-check")])],
            ),
            base(
                "nat-prerouting",
                Nat,
                Hook::Prerouting,
                -100,
                Accept,
                vec![rule(vec![jump("services")])],
            ),
            base(
                "nat-output",
                Nat,
                Hook::Output,
                -100,
                Accept,
                vec![rule(vec![jump("services")])],
            ),
            chain(
                "nodeport-endpoints-check",
                vec![rule(vec![
                    in_set(vec![Key::Daddr { v4: true }], "nodeport-ips"),
                    vmap(l4(), "no-endpoint-nodeports"),
                ])],
            ),
            chain(
                "service-endpoints-check",
                vec![rule(vec![vmap(
                    vec![Key::Daddr { v4: true }, Key::L4Proto, Key::Dport(None)],
                    "no-endpoint-services",
                )])],
            ),
            chain(
                "services",
                vec![
                    rule(vec![vmap(
                        vec![Key::Daddr { v4: true }, Key::L4Proto, Key::Dport(None)],
                        "service-ips",
                    )]),
                    rule(vec![
                        in_set(vec![Key::Daddr { v4: true }], "nodeport-ips"),
                        vmap(l4(), "service-nodeports"),
                    ]),
                ],
            ),
            chain("reject-chain", vec![rule(vec![Stmt::Reject])]),
            chain(
                "mark-for-masquerade",
                vec![rule(vec![Stmt::Effect(
                    "meta mark set meta mark | 0x4000".into(),
                )])],
            ),
            chain(
                "external-42NWR3ZC-ns1/svc1/tcp/p80",
                vec![
                    rule(vec![jump("mark-for-masquerade")]),
                    rule(vec![goto("service-42NWR3ZC-ns1/svc1/tcp/p80")]),
                ],
            ),
            chain(
                "service-42NWR3ZC-ns1/svc1/tcp/p80",
                vec![rule(vec![Stmt::Vmap {
                    key: vec![Key::Numgen { modulus: 1 }],
                    map: SetRef::Inline(vec![Element {
                        key: Value::Int(0),
                        data: Some(ElementData::Verdict(Verdict::Goto(
                            "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80".into(),
                        ))),
                        comment: None,
                    }]),
                }])],
            ),
            chain(
                "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80",
                vec![
                    rule(vec![
                        eq(
                            vec![Key::Saddr { v4: true }],
                            vec![Value::Addr(ip("10.180.0.1"))],
                        ),
                        jump("mark-for-masquerade"),
                    ]),
                    rule(vec![
                        eq(vec![Key::L4Proto], vec![Value::Proto(6)]),
                        dnat("10.180.0.1", 80),
                    ]),
                ],
            ),
        ],
        vec![
            addr_set("nodeport-ips", &[node]),
            vmap_set(
                "no-endpoint-nodeports",
                &["inet_proto", "inet_service"],
                vec![(proto_port(6, 30080), Verdict::Goto("reject-chain".into()))],
            ),
            vmap_set(
                "no-endpoint-services",
                &["ipv4_addr", "inet_proto", "inet_service"],
                vec![],
            ),
            vmap_set(
                "service-ips",
                &["ipv4_addr", "inet_proto", "inet_service"],
                vec![(
                    Value::Concat(vec![
                        Value::Addr(ip("172.30.0.41")),
                        Value::Proto(6),
                        Value::Int(80),
                    ]),
                    Verdict::Goto("service-42NWR3ZC-ns1/svc1/tcp/p80".into()),
                )],
            ),
            vmap_set(
                "service-nodeports",
                &["inet_proto", "inet_service"],
                vec![(
                    proto_port(6, 30081),
                    Verdict::Goto("external-42NWR3ZC-ns1/svc1/tcp/p80".into()),
                )],
            ),
        ],
    );
    t.comment = Some("rules for kube-proxy".into());
    t
}

/// netavark's `inet netavark` with one DNAT per container, `first` before `second`, both
/// for host port 8080.
pub(super) fn netavark(first: &str, second: &str) -> NftTable {
    use ChainKind::{Filter, Nat};
    use Policy::Accept;
    let dnat_chain =
        |name: &str, to: &str| chain(name, vec![rule(vec![tcp_dport(8080), dnat(to, 80)])]);
    table(
        TableFamily::Inet,
        "netavark",
        vec![
            base(
                "PREROUTING",
                Nat,
                Hook::Prerouting,
                -100,
                Accept,
                vec![rule(vec![
                    eq(vec![Key::FibDaddrType], vec![Value::Word("local".into())]),
                    jump("NETAVARK-HOSTPORT-DNAT"),
                ])],
            ),
            base(
                "OUTPUT",
                Nat,
                Hook::Output,
                -100,
                Accept,
                vec![rule(vec![
                    eq(vec![Key::FibDaddrType], vec![Value::Word("local".into())]),
                    jump("NETAVARK-HOSTPORT-DNAT"),
                ])],
            ),
            base(
                "FORWARD",
                Filter,
                Hook::Forward,
                0,
                Accept,
                vec![rule(vec![
                    eq(vec![Key::CtStatus], vec![Value::Word("dnat".into())]),
                    Stmt::Verdict(Verdict::Accept),
                ])],
            ),
            chain(
                "NETAVARK-HOSTPORT-DNAT",
                vec![
                    rule(vec![tcp_dport(8080), jump("nv_old_dnat")]),
                    rule(vec![tcp_dport(8080), jump("nv_new_dnat")]),
                ],
            ),
            dnat_chain("nv_old_dnat", first),
            dnat_chain("nv_new_dnat", second),
        ],
        vec![],
    )
}

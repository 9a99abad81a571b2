//! Decoding captured kernel messages: `captured.hex` is what a 6.18 kernel dumped for
//! tests/fixtures/nftables-shapes/captured.nft (kube-proxy's and netavark's shapes), one
//! message a line (type, then the payload from `nfgenmsg` on), in the order `read_once` asks.

use super::*;
use crate::model::ruleset::{
    Base, ChainKind, Element, ElementData, Hook, Key, Match, Nat, NatAddr, NatKind, NatPort, Op,
    Operand, Policy, Rule, SetData, SetRef, Stmt, Value, Verdict,
};

const CAPTURED: &str = include_str!("captured.hex");

fn messages() -> Vec<(u16, Vec<u8>)> {
    CAPTURED
        .lines()
        .map(|line| {
            let (kind, hex) = line.split_once(' ').unwrap();
            let kind = u16::from_str_radix(kind.trim_start_matches("0x"), 16).unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (kind, bytes)
        })
        .collect()
}

/// The captured messages put together as `read_once` does.
fn built() -> Ruleset {
    let mut b = Builder::default();
    let mut sets = Vec::new();
    let mut elements: HashMap<(u8, String), Vec<RawElement>> = HashMap::new();
    let all = messages();
    for (kind, payload) in &all {
        let (af, body) = (payload[0], &payload[4..]);
        match kind & 0xff {
            0 => b.table(af, body).unwrap(),
            9 => sets.push((af, dump::set(body).unwrap())),
            _ => {}
        }
    }
    for (kind, payload) in &all {
        let (af, body) = (payload[0], &payload[4..]);
        if kind & 0xff == 12 {
            let name = netlink::attr(body, 2).and_then(netlink::str_of).unwrap();
            let (_, (_, info)) = sets
                .iter()
                .find(|(a, (_, i))| *a == af && i.set.name == name)
                .unwrap();
            let raw = elements.entry((af, name.to_string())).or_default();
            dump::elements(info, body, raw).unwrap();
        }
    }
    for (af, (table, info)) in sets {
        let raw = elements
            .remove(&(af, info.set.name.clone()))
            .unwrap_or_default();
        b.set(dump::family_of(af).unwrap(), &table, info, raw);
    }
    for (kind, payload) in &all {
        let (af, body) = (payload[0], &payload[4..]);
        match kind & 0xff {
            3 => b.chain(af, body).unwrap(),
            6 => b.rule(af, body).unwrap(),
            _ => {}
        }
    }
    b.ruleset
}

fn addr(s: &str) -> Value {
    Value::Addr(s.parse().unwrap())
}

fn is(key: Key, op: Op, values: Vec<Value>) -> Stmt {
    Stmt::Match(Match {
        key: vec![key],
        op,
        right: Operand::Values(values),
    })
}

fn goto(chain: &str) -> Option<ElementData> {
    Some(ElementData::Verdict(Verdict::Goto(chain.into())))
}

fn rule(handle: u64, comment: Option<&str>, stmts: Vec<Stmt>) -> Rule {
    Rule {
        handle: Some(handle),
        comment: comment.map(str::to_string),
        stmts,
    }
}

fn dnat(v4: Option<bool>, to: &str, port: Option<NatPort>) -> Stmt {
    Stmt::Nat(Nat {
        kind: NatKind::Dnat,
        v4,
        addr: Some(NatAddr::Fixed(addr(to))),
        port,
    })
}

#[test]
fn kube_proxy_tables_maps_and_rules() {
    let ruleset = built();
    let kp = &ruleset.tables[0];
    assert_eq!(
        (kp.family, kp.name.as_str()),
        (TableFamily::Ip, "kube-proxy")
    );
    assert_eq!(kp.comment.as_deref(), Some("rules for kube-proxy"));
    // The anonymous numgen map is folded into its rule, not a set of the table.
    assert_eq!(kp.sets.len(), 1);
    let nep = &kp.sets[0];
    assert_eq!(nep.name, "no-endpoint-nodeports");
    assert_eq!(nep.key, ["inet_proto", "inet_service"]);
    assert_eq!(nep.data, Some(SetData::Verdict));
    assert_eq!(nep.comment.as_deref(), Some("vmap to drop or reject"));
    assert_eq!(
        nep.elements,
        [Element {
            key: Value::Concat(vec![Value::Proto(6), Value::Int(30080)]),
            data: goto("reject-chain"),
            comment: Some("ns2/svc2:p80".into()),
        }]
    );
    let input = kp.chain("filter-input").unwrap();
    assert_eq!(
        input.base,
        Some(Base {
            kind: ChainKind::Filter,
            hook: Hook::Input,
            priority: -110,
            policy: Policy::Accept,
        })
    );
    let check = kp.chain("nodeport-endpoints-check").unwrap();
    assert_eq!(check.base, None);
    assert_eq!(
        check.rules,
        [rule(
            check.rules[0].handle.unwrap(),
            Some("hi"),
            vec![
                is(Key::FibDaddrType, Op::Eq, vec![Value::Word("local".into())]),
                is(
                    Key::Daddr { v4: true },
                    Op::Ne,
                    vec![Value::Prefix("127.0.0.0".parse().unwrap(), 8)]
                ),
                Stmt::Vmap {
                    key: vec![Key::L4Proto, Key::Dport(None)],
                    map: SetRef::Named("no-endpoint-nodeports".into()),
                },
            ]
        )]
    );
    assert_eq!(
        kp.chain("reject-chain").unwrap().rules[0].stmts,
        [Stmt::Reject]
    );
    let service = &kp.chain("service-X").unwrap().rules[0];
    let Stmt::Vmap {
        key,
        map: SetRef::Inline(elements),
    } = &service.stmts[0]
    else {
        panic!("{service:?}");
    };
    assert_eq!(key, &[Key::Numgen { modulus: 2 }]);
    let mut arms: Vec<_> = elements.iter().map(|e| (&e.key, &e.data)).collect();
    arms.sort_by_key(|(k, _)| format!("{k:?}"));
    assert_eq!(
        arms,
        [
            (&Value::Int(0), &goto("endpoint-A")),
            (&Value::Int(1), &goto("endpoint-B"))
        ]
    );
    assert_eq!(
        kp.chain("endpoint-B").unwrap().rules[0].stmts,
        [
            is(Key::L4Proto, Op::Eq, vec![Value::Proto(6)]),
            dnat(None, "10.180.0.2", Some(NatPort::Fixed(80))),
        ]
    );
}

#[test]
fn netavark_inet_intervals_maps_and_nat() {
    let ruleset = built();
    let na = &ruleset.tables[1];
    assert_eq!(
        (na.family, na.name.as_str()),
        (TableFamily::Inet, "netavark")
    );
    let ports = na.set("ports").unwrap();
    assert!(ports.interval);
    let keys: Vec<_> = ports.elements.iter().map(|e| e.key.clone()).collect();
    assert_eq!(keys, [Value::IntRange(1000, 2000), Value::Int(8080)]);
    let hostports = na.set("hostports").unwrap();
    assert_eq!(
        hostports.data,
        Some(SetData::Typed(vec![
            "ipv4_addr".into(),
            "inet_service".into()
        ]))
    );
    assert_eq!(
        hostports.elements[0].data,
        Some(ElementData::Value(Value::Concat(vec![
            addr("10.88.0.2"),
            Value::Int(80)
        ])))
    );
    let chain = na.chain("NETAVARK-HOSTPORT-DNAT").unwrap();
    assert_eq!(
        chain.base.as_ref().map(|b| (b.kind, b.hook, b.priority)),
        Some((ChainKind::Nat, Hook::Prerouting, -100))
    );
    let stmts: Vec<_> = chain.rules.iter().map(|r| r.stmts.clone()).collect();
    let words = |w: &[&str]| w.iter().map(|w| Value::Word(w.to_string())).collect();
    assert_eq!(
        stmts,
        [
            vec![
                is(Key::CtState, Op::Eq, words(&["established", "related"])),
                Stmt::Verdict(Verdict::Accept),
            ],
            vec![
                is(
                    Key::Daddr { v4: true },
                    Op::Eq,
                    vec![Value::Prefix("10.0.0.0".parse().unwrap(), 12)]
                ),
                Stmt::Match(Match {
                    key: vec![Key::Dport(Some(17))],
                    op: Op::Eq,
                    right: Operand::Set("ports".into()),
                }),
                Stmt::Effect("counter".into()),
                dnat(Some(true), "10.88.0.3", None),
            ],
            vec![Stmt::Nat(Nat {
                kind: NatKind::Dnat,
                v4: Some(true),
                addr: Some(NatAddr::Map {
                    key: vec![Key::Daddr { v4: true }, Key::Dport(Some(6))],
                    map: SetRef::Named("hostports".into()),
                }),
                port: Some(NatPort::FromMap),
            })],
            vec![
                is(
                    Key::Saddr { v4: false },
                    Op::Ne,
                    vec![Value::Prefix("fd00::".parse().unwrap(), 8)]
                ),
                is(Key::Iifname, Op::Eq, words(&["eth*"])),
                is(Key::Dport(Some(6)), Op::Eq, vec![Value::IntRange(1, 1023)]),
                Stmt::Verdict(Verdict::Drop),
            ],
        ]
    );
}

#[test]
fn an_unknown_expression_leaves_registers_unknown() {
    let sets = HashMap::new();
    let expr = |name: &str, attrs: &[(u16, u32)]| {
        let mut data = Vec::new();
        for (k, v) in attrs {
            netlink::put_attr(&mut data, *k, &v.to_be_bytes());
        }
        let mut e = Vec::new();
        netlink::put_str(&mut e, 1, name);
        netlink::put_attr(&mut e, 2, &data);
        e
    };
    let mut cmp = expr("cmp", &[(1, 1), (2, 0)]);
    let mut value = Vec::new();
    netlink::put_attr(&mut value, 1, &[10, 0, 0, 1]);
    let mut nested = Vec::new();
    netlink::put_attr(&mut nested, 3, &value);
    // Re-frame the cmp's data with its value.
    cmp.clear();
    let mut data = Vec::new();
    netlink::put_attr(&mut data, 1, &1u32.to_be_bytes());
    netlink::put_attr(&mut data, 2, &0u32.to_be_bytes());
    data.extend(&nested);
    netlink::put_str(&mut cmp, 1, "cmp");
    netlink::put_attr(&mut cmp, 2, &data);
    let list = |exprs: &[Vec<u8>]| {
        let mut l = Vec::new();
        for e in exprs {
            netlink::put_attr(&mut l, 1, e);
        }
        l
    };
    let daddr = expr("payload", &[(1, 1), (2, 1), (3, 16), (4, 4)]);
    let plain = list(&[daddr.clone(), cmp.clone()]);
    assert_eq!(
        expr::decode(TableFamily::Ip, &sets, &plain),
        [is(Key::Daddr { v4: true }, Op::Eq, vec![addr("10.0.0.1")])]
    );
    let clobbered = list(&[daddr, expr("osf", &[(1, 1)]), cmp]);
    assert_eq!(
        expr::decode(TableFamily::Ip, &sets, &clobbered),
        [Stmt::Other("osf".into()), Stmt::Other("cmp".into())]
    );
    // A network header field in an inet table without `meta nfproto`: not an address.
    let bare = list(&[expr("payload", &[(1, 1), (2, 1), (3, 16), (4, 4)])]);
    assert!(expr::decode(TableFamily::Inet, &sets, &bare).is_empty());
}

/// A set of two integer fields (`typeof meta mark . ct mark`): the kernel tells no field
/// lengths for a concatenation that is not an interval, and the types do not either.
#[test]
fn a_key_of_unknown_field_lengths_is_opaque() {
    let mut body = Vec::new();
    netlink::put_str(&mut body, 1, "t");
    netlink::put_str(&mut body, 2, "marks");
    let ty = types::INTEGER << 6 | types::INTEGER;
    for (kind, value) in [(3u16, 0u32), (4, ty), (5, 8)] {
        netlink::put_attr(&mut body, kind, &value.to_be_bytes());
    }
    let (_, info) = dump::set(&body).unwrap();
    assert!(info.opaque);
    assert_eq!(info.set.key, ["integer", "integer"]);
    let mut elements = Vec::new();
    let mut key = Vec::new();
    netlink::put_attr(&mut key, 1, &[0, 0, 0, 1, 0, 0, 0, 2]);
    let mut elem = Vec::new();
    netlink::put_attr(&mut elem, 1, &key);
    let mut list = Vec::new();
    netlink::put_attr(&mut list, 1, &elem);
    let mut message = Vec::new();
    netlink::put_attr(&mut message, 3, &list);
    dump::elements(&info, &message, &mut elements).unwrap();
    assert_eq!(
        dump::assemble(&info, elements)[0].key,
        Value::Int(0x1_0000_0002)
    );
    // `meta mark . ct mark @marks`: the lookup's key may match anything.
    let mut sets = HashMap::new();
    sets.insert("marks".to_string(), info);
    let mut lookup = Vec::new();
    netlink::put_str(&mut lookup, 1, "marks");
    netlink::put_attr(&mut lookup, 2, &8u32.to_be_bytes());
    let mut meta = Vec::new();
    netlink::put_attr(&mut meta, 1, &8u32.to_be_bytes());
    netlink::put_attr(&mut meta, 2, &3u32.to_be_bytes());
    let expr = |name: &str, data: &[u8]| {
        let mut e = Vec::new();
        netlink::put_str(&mut e, 1, name);
        netlink::put_attr(&mut e, 2, data);
        e
    };
    let mut exprs = Vec::new();
    netlink::put_attr(&mut exprs, 1, &expr("meta", &meta));
    netlink::put_attr(&mut exprs, 1, &expr("lookup", &lookup));
    assert_eq!(
        expr::decode(TableFamily::Ip, &sets, &exprs),
        [Stmt::Match(Match {
            key: vec![Key::Other("the key of @marks".into())],
            op: Op::Eq,
            right: Operand::Set("marks".into()),
        })]
    );
}

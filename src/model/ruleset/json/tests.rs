use super::*;
use crate::model::ruleset::{ChainKind, Hook, Policy};

const SAMPLE: &str = include_str!("../../../../tests/fixtures/nftables-dumps/sample.json");

fn table<'a>(r: &'a Ruleset, name: &str) -> &'a NftTable {
    r.tables.iter().find(|t| t.name == name).unwrap()
}

#[test]
fn kube_proxy_shapes_read_into_the_model() {
    let r = parse_json(SAMPLE).unwrap();
    let kp = table(&r, "kube-proxy");
    assert_eq!((kp.family, kp.handle), (TableFamily::Ip, Some(13)));

    let vmap = kp.set("no-endpoint-nodeports").unwrap();
    assert_eq!(vmap.key, ["inet_proto", "inet_service"]);
    assert_eq!(vmap.data, Some(SetData::Verdict));
    assert_eq!(
        vmap.elements,
        [Element {
            key: Value::Concat(vec![Value::Proto(6), Value::Int(30080)]),
            data: Some(ElementData::Verdict(Verdict::Goto("reject-chain".into()))),
            comment: Some("ns/svc:p80".into()),
        }]
    );
    let iset = kp.set("iset").unwrap();
    assert!(iset.interval);
    assert_eq!(
        iset.elements[0].key,
        Value::Prefix("10.0.0.0".parse().unwrap(), 8)
    );
    assert_eq!(
        iset.elements[1].key,
        Value::AddrRange(
            "192.168.1.1".parse().unwrap(),
            "192.168.1.9".parse().unwrap()
        )
    );

    let input = kp.chain("filter-input").unwrap();
    let base = input.base.as_ref().unwrap();
    assert_eq!(
        (base.kind, base.hook, base.priority, base.policy),
        (ChainKind::Filter, Hook::Input, -10, Policy::Accept)
    );
    // ct state established,related accept
    assert_eq!(
        input.rules[1].stmts,
        [
            Stmt::Match(Match {
                key: vec![Key::CtState],
                op: Op::Eq,
                right: Operand::Values(vec![
                    Value::Word("established".into()),
                    Value::Word("related".into())
                ]),
            }),
            Stmt::Verdict(Verdict::Accept)
        ]
    );
    // meta l4proto . th dport vmap @no-endpoint-nodeports
    assert_eq!(
        input.rules[2].stmts,
        [Stmt::Vmap {
            key: vec![Key::L4Proto, Key::Dport(None)],
            map: SetRef::Named("no-endpoint-nodeports".into()),
        }]
    );
    // fib daddr type local ip daddr != 127.0.0.0/8 jump firewall comment "x y"
    let fib = &input.rules[3];
    assert_eq!(fib.comment.as_deref(), Some("x y"));
    assert_eq!(
        fib.stmts[0],
        Stmt::Match(Match {
            key: vec![Key::FibDaddrType],
            op: Op::Eq,
            right: Operand::Values(vec![Value::Word("local".into())]),
        })
    );
    assert!(matches!(&fib.stmts[1], Stmt::Match(m) if m.op == Op::Ne));
    // meta mark & 0x4000 == 0: a field the model does not name, in canonical words.
    assert!(matches!(&input.rules[4].stmts[0],
        Stmt::Match(m) if m.key == [Key::Other("meta mark & 16384".into())]));
    assert_eq!(input.rules[5].stmts, [Stmt::Effect("meta mark set".into())]);
    assert_eq!(input.rules[7].stmts[0], Stmt::Other("limit".into()));
    assert_eq!(input.rules[11].stmts[1], Stmt::Reject);

    let svc1 = kp.chain("svc1").unwrap();
    assert_eq!(
        svc1.rules[0].stmts[2],
        Stmt::Nat(Nat {
            kind: NatKind::Dnat,
            v4: None,
            addr: Some(NatAddr::Fixed(Value::Addr("10.0.0.2".parse().unwrap()))),
            port: Some(NatPort::Fixed(80)),
        })
    );
    // dnat ip to ip daddr . tcp dport map @snatm: the port comes from the map's data.
    assert!(matches!(
        &svc1.rules[4].stmts[0],
        Stmt::Nat(Nat {
            v4: Some(true),
            addr: Some(NatAddr::Map { .. }),
            port: Some(NatPort::FromMap),
            ..
        })
    ));

    let pre = kp.chain("nat-prerouting").unwrap();
    assert!(matches!(&pre.rules[1].stmts[0],
        Stmt::Vmap { key, map: SetRef::Inline(e) } if key == &[Key::Numgen { modulus: 2 }] && e.len() == 2));

    let nat6 = table(&r, "nat6").chain("pre").unwrap();
    assert_eq!(nat6.base.as_ref().unwrap().priority, -95);
    assert!(matches!(
        &nat6.rules[0].stmts[2],
        Stmt::Nat(Nat {
            v4: Some(false),
            port: Some(NatPort::Fixed(8080)),
            ..
        })
    ));
    let bridge = table(&r, "b").chain("f").unwrap();
    assert_eq!(bridge.base.as_ref().unwrap().policy, Policy::Drop);
}

#[test]
fn priority_words_of_newer_nft() {
    let dump = r#"{"nftables": [{"table": {"family": "bridge", "name": "t"}},
        {"chain": {"family": "bridge", "table": "t", "name": "c", "type": "filter",
                   "hook": "prerouting", "prio": "dstnat + 5", "policy": "drop"}},
        {"table": {"family": "inet", "name": "u"}},
        {"chain": {"family": "inet", "table": "u", "name": "c", "type": "nat",
                   "hook": "postrouting", "prio": "srcnat"}}]}"#;
    let r = parse_json(dump).unwrap();
    assert_eq!(r.tables[0].chains[0].base.as_ref().unwrap().priority, -295);
    assert_eq!(r.tables[1].chains[0].base.as_ref().unwrap().priority, 100);
}

#[test]
fn numgen_offset_folds_into_the_values() {
    let dump = r#"{"nftables": [{"table": {"family": "ip", "name": "t"}},
        {"chain": {"family": "ip", "table": "t", "name": "c"}},
        {"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"vmap": {
            "key": {"numgen": {"mode": "inc", "mod": 2, "offset": 5}},
            "data": {"set": [[5, {"goto": {"target": "a"}}], [6, {"drop": null}]]}}}]}}]}"#;
    let r = parse_json(dump).unwrap();
    let Stmt::Vmap {
        key,
        map: SetRef::Inline(e),
    } = &r.tables[0].chains[0].rules[0].stmts[0]
    else {
        panic!()
    };
    assert_eq!(key, &[Key::Numgen { modulus: 2 }]);
    assert_eq!(
        (e[0].key.clone(), e[1].key.clone()),
        (Value::Int(0), Value::Int(1))
    );
}

#[test]
fn errors_name_the_object_and_what_was_expected() {
    let err =
        parse_json(r#"{"nftables": [{"metainfo": {}}, {"table": {"name": "t"}}]}"#).unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSON object 1 (table): expected \"family\" a string"
    );
    let err =
        parse_json(r#"{"nftables": [{"chain": {"family": "ip", "table": "x", "name": "c"}}]}"#)
            .unwrap_err();
    assert!(
        err.to_string().contains("table \"x\" listed before"),
        "{err}"
    );
    assert!(matches!(parse_json("{"), Err(DumpError::Json(_))));
    assert!(matches!(parse_json("{}"), Err(DumpError::Shape(_))));
    // Objects natledger does not model are skipped.
    let r = parse_json(r#"{"nftables": [{"flowtable": {"name": "f"}}, {"counter": {}}]}"#).unwrap();
    assert!(r.tables.is_empty());
}

/// iptables-nft's tables in a native dump: nft's JSON shows its xtables matches and targets
/// as opaque `xt` objects (the text shows nft's translation): may match, may decide anything.
#[test]
fn iptables_nft_xt_expressions_are_other() {
    let dump = r#"{"nftables": [{"table": {"family": "ip", "name": "nat", "handle": 28}},
        {"chain": {"family": "ip", "table": "nat", "name": "PREROUTING", "handle": 1,
                   "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
        {"rule": {"family": "ip", "table": "nat", "chain": "PREROUTING", "handle": 2, "expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                       "right": 80}},
            {"xt": {"type": "match", "name": "comment"}},
            {"counter": {"packets": 0, "bytes": 0}},
            {"xt": {"type": "target", "name": "DNAT"}}]}}]}"#;
    let r = parse_json(dump).unwrap();
    let stmts = &r.tables[0].chains[0].rules[0].stmts;
    assert_eq!(stmts[1], Stmt::Other("xt".into()));
    assert_eq!(stmts[2], Stmt::Effect("counter".into()));
    assert_eq!(stmts[3], Stmt::Other("xt".into()));
}

use super::*;
use crate::model::ruleset::{parse_json, parse_text};

const SAMPLE: &str = include_str!("../../../tests/fixtures/nftables-dumps/sample.json");

#[test]
fn fix_commands_in_nfts_syntax() {
    assert_eq!(
        delete_rule(TableFamily::Inet, "netavark", "NETAVARK-HOSTPORT-DNAT", 12),
        "nft delete rule inet netavark NETAVARK-HOSTPORT-DNAT handle 12"
    );
    let key = Value::Concat(vec![Value::Proto(6), Value::Int(30080)]);
    assert_eq!(
        delete_element(TableFamily::Ip, "kube-proxy", "no-endpoint-nodeports", &key),
        "nft delete element ip kube-proxy no-endpoint-nodeports { tcp . 30080 }"
    );
    // A name a shell would split or expand is quoted.
    assert_eq!(
        delete_rule(TableFamily::Ip, "t", "a b$(x)", 1),
        "nft delete rule ip t 'a b$(x)' handle 1"
    );
    let key = Value::Word("veth*".into());
    assert_eq!(
        delete_element(TableFamily::Ip, "t", "s", &key),
        "nft delete element ip t s '{ \"veth*\" }'"
    );
}

#[test]
fn values_as_nft_writes_them() {
    let a = |s: &str| s.parse().unwrap();
    assert_eq!(value(&Value::Prefix(a("10.0.0.0"), 8)), "10.0.0.0/8");
    assert_eq!(value(&Value::IntRange(30000, 32767)), "30000-32767");
    assert_eq!(value(&Value::Proto(132)), "sctp");
    assert_eq!(value(&Value::Proto(250)), "250");
    assert_eq!(
        element_key(&Value::Concat(vec![
            Value::Addr(a("172.30.0.41")),
            Value::Proto(17),
            Value::Int(53)
        ])),
        "172.30.0.41 . udp . 53"
    );
}

/// Every rule of the sample rendered and read back as text is the same rule.
#[test]
fn rendered_rules_read_back_the_same() {
    let r = parse_json(SAMPLE).unwrap();
    for t in &r.tables {
        let mut text = format!("table {} {} {{\n", t.family.word(), t.name);
        for chain in &t.chains {
            text.push_str(&format!("chain {} {{\n", chain.name));
            for rule in &chain.rules {
                text.push_str(&super::rule(rule));
                text.push('\n');
            }
            text.push_str("}\n");
        }
        text.push_str("}\n");
        let back = parse_text(&text).unwrap();
        for (chain, back) in t.chains.iter().zip(&back.tables[0].chains) {
            for (rule, back) in chain.rules.iter().zip(&back.rules) {
                let mut expected = rule.clone();
                expected.handle = None;
                // A map named elsewhere cannot say here where the port comes from.
                let mut back = back.clone();
                for (s, e) in back.stmts.iter_mut().zip(&expected.stmts) {
                    if let (Stmt::Nat(b), Stmt::Nat(e)) = (s, e) {
                        b.port = e.port.clone();
                    }
                }
                assert_eq!(back, expected, "{}", super::rule(rule));
            }
        }
    }
}

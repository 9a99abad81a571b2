use super::*;
use crate::model::ruleset::parse_json;

const SAMPLE_TEXT: &str = include_str!("../../../../tests/fixtures/nftables-dumps/sample.nft.txt");
const SAMPLE_JSON: &str = include_str!("../../../../tests/fixtures/nftables-dumps/sample.json");

/// nft 1.0.6's JSON has no table comments; everything else must agree.
fn without_table_comments(mut r: Ruleset) -> Ruleset {
    for t in &mut r.tables {
        t.comment = None;
    }
    r
}

#[test]
fn text_and_json_of_one_ruleset_read_the_same() {
    let text = without_table_comments(parse_text(SAMPLE_TEXT).unwrap());
    let json = without_table_comments(parse_json(SAMPLE_JSON).unwrap());
    for (t, j) in text.tables.iter().zip(&json.tables) {
        assert_eq!(t.sets, j.sets, "sets of {}", t.name);
        for (tc, jc) in t.chains.iter().zip(&j.chains) {
            for (tr, jr) in tc.rules.iter().zip(&jc.rules) {
                assert_eq!(tr, jr, "chain {}", tc.name);
            }
            assert_eq!(tc, jc);
        }
    }
    assert_eq!(text, json);
}

const LITERAL: &str = r#"
# saved with `nft list ruleset` (no handles)
table bridge br {
	chain pre {
		type filter hook prerouting priority dstnat; policy accept;
	}
}
table inet fw {
	flowtable ft {
		hook ingress priority filter
		devices = { lo }
	}
	ct helper ftp { type "ftp" protocol tcp; l3proto inet; }
	counter hits { packets 0 bytes 0 }
	set allowed {
		typeof ip saddr . tcp dport
		flags interval
		elements = { 10.0.0.0/8 . 22,
			     192.168.1.1-192.168.1.9 . 80-90 comment "lan web" }
	}
	map fwd {
		type ipv4_addr . inet_service : ipv4_addr . inet_service
		elements = { 192.168.0.2 . 8080 : 10.0.0.2 . 80 }
	}
	chain input {
		type filter hook input priority filter - 10; policy drop;
		ip saddr . tcp dport @allowed accept
		meta l4proto tcp flow add @ft
		tcp dport 53 queue num 2 bypass
		iifname { "veth*", "eth0" } udp dport { 53, 5353 } accept
		jhash ip saddr mod 2 seed 0xfeed 0 drop
	}
	chain pre {
		type nat hook prerouting priority dstnat + 5; policy accept;
		dnat ip to ip daddr . tcp dport map @fwd
		dnat ip addr . port to 172.16.30.2 . 80
		redirect to :8080-8090
	}
}
"#;

#[test]
fn a_literal_dump_reads_its_blocks_and_skips_what_it_does_not_model() {
    use crate::model::ruleset::{
        ElementData, Hook, Key, NatAddr, NatPort, Policy, SetData, Stmt, Value,
    };
    let r = parse_text(LITERAL).unwrap();
    let br = &r.tables[0].chains[0];
    let base = br.base.as_ref().unwrap();
    assert_eq!(
        (base.hook, base.priority),
        (Hook::Prerouting, -300),
        "bridge dstnat"
    );
    let fw = &r.tables[1];
    assert_eq!(
        fw.chains.len(),
        2,
        "flowtable, ct helper and counter skipped"
    );
    let allowed = fw.set("allowed").unwrap();
    assert_eq!(allowed.key, ["ipv4_addr", "inet_service"]);
    assert!(allowed.interval);
    let ip = |s: &str| s.parse().unwrap();
    assert_eq!(
        allowed.elements[1].key,
        Value::Concat(vec![
            Value::AddrRange(ip("192.168.1.1"), ip("192.168.1.9")),
            Value::IntRange(80, 90)
        ])
    );
    assert_eq!(allowed.elements[1].comment.as_deref(), Some("lan web"));
    let fwd = fw.set("fwd").unwrap();
    assert_eq!(
        fwd.data,
        Some(SetData::Typed(vec![
            "ipv4_addr".into(),
            "inet_service".into()
        ]))
    );
    assert_eq!(
        fwd.elements[0].data,
        Some(ElementData::Value(Value::Concat(vec![
            Value::Addr(ip("10.0.0.2")),
            Value::Int(80)
        ])))
    );

    let input = fw.chain("input").unwrap();
    let base = input.base.as_ref().unwrap();
    assert_eq!((base.priority, base.policy), (-10, Policy::Drop));
    assert!(input.rules.iter().all(|r| r.handle.is_none()));
    assert_eq!(input.rules[1].stmts[1], Stmt::Other("flow".into()));
    assert_eq!(input.rules[2].stmts[1], Stmt::Other("queue".into()));
    let Stmt::Match(m) = &input.rules[3].stmts[0] else {
        panic!()
    };
    assert_eq!(m.key, [Key::Iifname]);
    assert!(matches!(&input.rules[4].stmts[0], Stmt::Other(w) if w == "jhash"));
    assert!(matches!(
        input.rules[4].stmts.last(),
        Some(Stmt::Verdict(_))
    ));

    let pre = fw.chain("pre").unwrap();
    assert_eq!(pre.base.as_ref().unwrap().priority, -95);
    let nat = |i: usize| match &pre.rules[i].stmts[0] {
        Stmt::Nat(n) => n.clone(),
        other => panic!("{other:?}"),
    };
    assert!(matches!(nat(0).addr, Some(NatAddr::Map { .. })));
    assert_eq!(nat(0).port, Some(NatPort::FromMap));
    assert_eq!(
        nat(1).addr,
        Some(NatAddr::Fixed(Value::Addr(ip("172.16.30.2"))))
    );
    assert_eq!(nat(1).port, Some(NatPort::Fixed(80)));
    assert_eq!(nat(2).port, Some(NatPort::Range(8080, 8090)));
}

#[test]
fn a_malformed_dump_is_an_error_naming_its_line() {
    let err = |dump: &str| parse_text(dump).unwrap_err().to_string();
    assert_eq!(
        err("table ip t {\n\tchain c {\n\t\taccept\n"),
        "line 3: expected '}' closing the chain"
    );
    assert_eq!(err("table ipx t {\n}\n"), "line 1: unknown family \"ipx\"");
    assert_eq!(
        err("table ip t {\n\tchain c {\n\t\ttype nat hook input priority sideways;\n\t}\n}\n"),
        "line 3: unknown priority \"sideways\""
    );
    assert_eq!(
        err("table ip t {\n\tcomment \"open\n}\n"),
        "line 2: unterminated quoted string"
    );
    assert_eq!(
        err(
            "table ip t {\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 1.2.3.4 5.6.7.8 }\n\t}\n}\n"
        ),
        "line 4: expected ',' or '}' after an element"
    );
    // Not a ruleset at all.
    assert!(err("{ \"nftables\"").starts_with("line 1"));
    // An empty ruleset is one.
    assert_eq!(parse_text("").unwrap(), Ruleset::default());
}

/// iptables-nft's tables as `nft list ruleset` prints them (its xtables matches translated,
/// its warning lines on stderr pasted in as comments).
#[test]
fn iptables_nft_tables_in_a_text_dump_read() {
    let dump = "table ip filter { # handle 29\n\tchain INPUT { # handle 1\n\
        \t\ttype filter hook input priority filter; policy accept;\n\
        \t\tmeta l4proto udp udp dport { 53, 5353 } fib daddr type local counter packets 0 bytes 0 reject # handle 3\n\
        \t}\n}\n# Warning: table ip filter is managed by iptables-nft, do not touch!\n";
    let r = parse_text(dump).unwrap();
    let rule = &r.tables[0].chains[0].rules[0];
    assert_eq!(rule.handle, Some(3));
    assert_eq!(rule.stmts.len(), 5);
    assert_eq!(rule.stmts[4], crate::model::ruleset::Stmt::Reject);
}

//! Saved native nftables rulesets (`--from nftables:FILE`) read the same whichever format nft
//! saved them in. Each owner-shaped ruleset (kube-proxy's nftables mode as its proxier tests
//! expect it, netavark's nftables driver, firewalld's default zone, CNI portmap's nftables
//! backend, Docker 29's nftables firewall, statements the model does not follow, and one of
//! every statement shape the readers know; tests/fixtures/nftables-dumps/) is loaded with
//! `nft -f` into a namespace of its own; `nft -a list ruleset` and `nft -j list ruleset` of it
//! parse to the same `Ruleset`, and plain `nft list ruleset` to the same less its handles.
//! The fix commands `render` prints (`nft delete element …`, `nft delete rule … handle N`),
//! run by a shell in the namespace, delete exactly that element or rule; every rule the model
//! holds whole, rendered and added back with `nft add rule`, reads back as the same rule.

use natledger::model::ruleset::{
    ElementData, Ruleset, Stmt, TableFamily, Value, Verdict, parse_json, parse_text, render,
};

use crate::common::*;

const FIXTURES: [&str; 7] = [
    "kube-proxy",
    "netavark",
    "firewalld",
    "portmap",
    "docker",
    "effects",
    "sample",
];

fn fixture(name: &str) -> String {
    let file = if name == "sample" {
        "sample.nft.txt".to_string()
    } else {
        format!("{name}.nft")
    };
    let path = format!(
        "{}/tests/fixtures/nftables-dumps/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn nft(ns: &str, args: &[&str], stdin: Option<&[u8]>) -> String {
    let out = run_in(ns, "nft", args, stdin);
    assert_ok(&out, &format!("nft {}", args.join(" ")));
    String::from_utf8(out.stdout).unwrap()
}

/// Both dumps of the namespace's ruleset, parsed; they must agree (nft 1.0.6's JSON has no
/// table comments: compared without them).
fn both(ns: &str) -> Ruleset {
    let text = parse_text(&nft(ns, &["-a", "list", "ruleset"], None)).unwrap();
    let json = parse_json(&nft(ns, &["-j", "list", "ruleset"], None)).unwrap();
    let strip = |mut r: Ruleset| {
        r.tables.iter_mut().for_each(|t| t.comment = None);
        r
    };
    let (text_plain, json_plain) = (strip(text.clone()), strip(json));
    for (t, j) in text_plain.tables.iter().zip(&json_plain.tables) {
        assert_eq!(t.sets, j.sets, "sets of {} {}", t.family.word(), t.name);
        for (tc, jc) in t.chains.iter().zip(&j.chains) {
            for (tr, jr) in tc.rules.iter().zip(&jc.rules) {
                assert_eq!(tr, jr, "{} {}: text and JSON", t.name, tc.name);
            }
        }
    }
    assert_eq!(text_plain, json_plain);
    // Saved without `-a`: the same, less every handle.
    let mut unhandled = text.clone();
    for t in &mut unhandled.tables {
        t.handle = None;
        for c in &mut t.chains {
            c.handle = None;
            c.rules.iter_mut().for_each(|r| r.handle = None);
        }
        t.sets.iter_mut().for_each(|s| s.handle = None);
    }
    let plain = parse_text(&nft(ns, &["list", "ruleset"], None)).unwrap();
    assert_eq!(plain, unhandled, "`nft list ruleset` without handles");
    text
}

fn load(ns: &str, name: &str) -> Ruleset {
    nft(ns, &["flush", "ruleset"], None);
    nft(ns, &["-f", "-"], Some(fixture(name).as_bytes()));
    both(ns)
}

#[test]
fn each_owners_ruleset_reads_the_same_from_text_and_json() {
    let topo = Topology::new();
    let ns = topo.node();
    for name in FIXTURES {
        let r = load(ns, name);
        let rules: usize = r
            .tables
            .iter()
            .flat_map(|t| &t.chains)
            .map(|c| c.rules.len())
            .sum();
        assert!(rules > 5, "{name}: {rules} rules read");
        assert!(
            r.tables
                .iter()
                .flat_map(|t| &t.chains)
                .flat_map(|c| &c.rules)
                .all(|r| r.handle.is_some())
        );
    }
    // What decides seed 004 in nftables mode is read as data, with its comment.
    let r = load(ns, "kube-proxy");
    let kp = r
        .tables
        .iter()
        .find(|t| t.name == "kube-proxy" && t.family == TableFamily::Ip)
        .unwrap();
    let e = &kp.set("no-endpoint-nodeports").unwrap().elements[0];
    assert_eq!(
        e.key,
        Value::Concat(vec![Value::Proto(6), Value::Int(30080)])
    );
    assert_eq!(
        e.data,
        Some(ElementData::Verdict(Verdict::Goto("reject-chain".into())))
    );
    assert_eq!(e.comment.as_deref(), Some("ns2/svc2:p80"));
    // firewalld's input ends in a reject; its reverse-path fib lookup is not modelled (may match).
    let r = load(ns, "firewalld");
    let fw = &r.tables[0];
    assert_eq!(
        fw.chain("filter_INPUT")
            .unwrap()
            .rules
            .last()
            .unwrap()
            .stmts,
        [Stmt::Reject]
    );
    let rpf = &fw.chain("filter_PREROUTING").unwrap().rules[1].stmts[1];
    assert!(
        matches!(rpf, Stmt::Match(m) if m.key == [natledger::model::ruleset::Key::Other("fib saddr . mark . iif oif".into())]),
        "{rpf:?}"
    );
}

#[test]
fn printed_fixes_delete_exactly_their_element_or_rule() {
    let topo = Topology::new();
    let ns = topo.node();
    let before = load(ns, "kube-proxy");
    let key = Value::Concat(vec![Value::Proto(6), Value::Int(30080)]);
    let fix = render::delete_element(TableFamily::Ip, "kube-proxy", "no-endpoint-nodeports", &key);
    assert_eq!(
        fix,
        "nft delete element ip kube-proxy no-endpoint-nodeports { tcp . 30080 }"
    );
    assert_ok(&run_in(ns, "sh", &["-c", &fix], None), &fix);
    let mut expected = before.clone();
    let kp = expected
        .tables
        .iter_mut()
        .find(|t| t.name == "kube-proxy" && t.family == TableFamily::Ip)
        .unwrap();
    kp.sets
        .iter_mut()
        .find(|s| s.name == "no-endpoint-nodeports")
        .unwrap()
        .elements
        .clear();
    assert_eq!(both(ns), expected, "only the element is gone");

    // netavark's stale DNAT of 8080 (the dead container's, before the live one's).
    let before = load(ns, "netavark");
    let chain = "nv_2f259bab_10_88_0_0_nm16_dnat";
    let stale = &before.tables[0].chain(chain).unwrap().rules[2];
    assert_eq!(
        render::rule(stale),
        "tcp dport 8080 dnat ip to 10.88.0.92:80"
    );
    let fix = render::delete_rule(TableFamily::Inet, "netavark", chain, stale.handle.unwrap());
    assert_ok(&run_in(ns, "sh", &["-c", &fix], None), &fix);
    let mut expected = before.clone();
    expected.tables[0]
        .chains
        .iter_mut()
        .find(|c| c.name == chain)
        .unwrap()
        .rules
        .remove(2);
    assert_eq!(both(ns), expected, "only the rule is gone");
}

/// A rule whose every statement the model holds whole (matches, verdicts, vmaps, NAT, reject,
/// counter) renders to nft syntax that nft accepts and that reads back as the same rule.
#[test]
fn rendered_rules_are_accepted_by_nft_and_mean_the_same() {
    let topo = Topology::new();
    let ns = topo.node();
    let mut checked = 0;
    for name in FIXTURES {
        let r = load(ns, name);
        for t in &r.tables {
            for c in &t.chains {
                for rule in &c.rules {
                    let whole = rule.stmts.iter().all(|s| match s {
                        Stmt::Other(_) => false,
                        Stmt::Effect(e) => e == "counter",
                        _ => true,
                    });
                    if !whole {
                        continue;
                    }
                    let text = render::rule(rule);
                    let args = ["add", "rule", t.family.word(), &t.name, &c.name];
                    let line = format!("{} {}\n", args.join(" "), text);
                    let out = run_in(ns, "nft", &["-f", "-"], Some(line.as_bytes()));
                    assert_ok(&out, &line);
                    let after = both(ns);
                    let added = after
                        .tables
                        .iter()
                        .find(|x| x.name == t.name && x.family == t.family)
                        .unwrap();
                    let mut back = added.chain(&c.name).unwrap().rules.last().unwrap().clone();
                    back.handle = rule.handle;
                    assert_eq!(back, implied_protocol_elided(rule), "{name}: {line}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 40, "{checked} rules rendered and read back");
}

/// The rule as nft lists it once written from `render::rule`: `meta l4proto icmp` right before
/// a match on an `icmp` field is a dependency nft leaves out of its listing (the field implies
/// it), where `ip protocol icmp` (which the model reads as the same key) was listed.
fn implied_protocol_elided(
    rule: &natledger::model::ruleset::Rule,
) -> natledger::model::ruleset::Rule {
    use natledger::model::ruleset::{Key, Operand};
    let mut out = rule.clone();
    let implied = |i: usize| {
        let Some(Stmt::Match(m)) = rule.stmts.get(i) else {
            return false;
        };
        let Operand::Values(v) = &m.right else {
            return false;
        };
        let [Value::Proto(p)] = v.as_slice() else {
            return false;
        };
        let name = render::value(&Value::Proto(*p));
        m.key == [Key::L4Proto]
            && matches!(rule.stmts.get(i + 1), Some(Stmt::Match(n))
                if matches!(n.key.as_slice(), [Key::Other(w)] if w.starts_with(&format!("{name} "))))
    };
    let mut i = 0;
    out.stmts.retain(|_| {
        i += 1;
        !implied(i - 1)
    });
    out
}

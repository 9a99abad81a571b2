use super::*;

fn rule(chain: &str, args: &str) -> OwnRule {
    OwnRule {
        chain: chain.into(),
        handle: 1,
        args: args.split_whitespace().map(String::from).collect(),
    }
}

fn chain(name: &str, hook: Option<u32>) -> OwnChain {
    OwnChain {
        name: name.into(),
        hook,
        policy: hook.map(|_| 1),
    }
}

/// The logical tables split one nf_tables table the way `*-save -t` shows iptables: base
/// chains by their type, natledger's chains by name, another chain by who jumps to it.
#[test]
fn logical_tables_split_the_chains_as_iptables_shows_them() {
    let table = OwnTable {
        family: Family::Ipv4,
        chains: vec![
            chain("NATLEDGER-HOSTPORTS", None),
            chain("INPUT", Some(1)),
            chain("PREROUTING", Some(0)),
            chain("NATLEDGER-INPUT", None),
            chain("NATLEDGER-OLD", None),
        ],
        rules: vec![
            rule("INPUT", "-m comment --comment natledger -j NATLEDGER-OLD"),
            rule("NATLEDGER-HOSTPORTS", "-m nft --natledger-opaque"),
        ],
        objects: 5,
    };
    let nat = table.logical(NAT);
    let names: Vec<&str> = nat.chains.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["PREROUTING", "NATLEDGER-HOSTPORTS"]);
    assert_eq!(nat.chains[0].1, "ACCEPT");
    assert_eq!(nat.chains[1].1, "-");
    assert_eq!(nat.rules.len(), 1);
    let filter = table.logical(FILTER);
    let names: Vec<&str> = filter.chains.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["INPUT", "NATLEDGER-INPUT", "NATLEDGER-OLD"]);
}

/// A rule natledger would not write is shown with its comment, so `layout::owner` still
/// reads whose it claims to be, but no natledger rule equals it.
#[test]
fn an_undecodable_rule_is_opaque_but_keeps_its_comment() {
    let shown = shown(None, Some("natledger:c1".into()), None);
    assert!(crate::model::rule::Rule::parse_args(&shown).is_err());
    assert_eq!(
        layout::owner("NATLEDGER-HOSTPORTS", &shown),
        layout::Owner::Container("c1")
    );
}

/// An undecodable rule that jumps or goes to a chain still shows the chain: it holds the
/// chain in place (sweep blocks it instead of planning a deletion the kernel refuses).
#[test]
fn an_undecodable_rule_shows_the_chain_it_references() {
    let jump = shown(None, None, Some((false, "NATLEDGER-HOSTPORTS".into())));
    assert!(crate::model::rule::Rule::parse_args(&jump).is_err());
    assert_eq!(
        layout::comment_and_target(&jump),
        (None, Some("NATLEDGER-HOSTPORTS"))
    );
    let goto = shown(None, None, Some((true, "NATLEDGER-MASQ".into())));
    assert_eq!(goto[goto.len() - 2..], ["-g", "NATLEDGER-MASQ"]);
}

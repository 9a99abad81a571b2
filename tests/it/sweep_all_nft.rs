//! `sweep --all` on iptables-nft leaves the host's nf_tables as they were before natledger
//! (`nft list ruleset` compared whole), in a private network namespace:
//!
//! `sweep_all_leaves_iptables_nft_as_before_natledger`:
//! - on a namespace without any table, a create makes iptables-nft create `ip`/`ip6` `filter`
//!   and `nat`; `sweep --all` removes natledger's chains and then those tables, left holding
//!   only empty accepting built-in chains;
//! - a FORWARD policy drop, another
//!   owner's chain, another owner's rule in a built-in chain, a set beside an operator's empty
//!   accepting chain: each such table stays with all of it (the ruleset equals the one before
//!   but for the empty accepting built-in chains iptables-nft added there for natledger, which
//!   decide nothing and are left with the table).

use crate::common::*;

fn ruleset(node: &Node) -> String {
    let out = run_in(node.topo.node(), "nft", &["list", "ruleset"], None);
    assert_ok(&out, "nft list ruleset");
    String::from_utf8(out.stdout).unwrap()
}

fn run(node: &Node, argv: &[&str]) {
    let out = run_in(node.topo.node(), argv[0], &argv[1..], None);
    assert_ok(&out, &argv.join(" "));
}

/// create-runtime and `sweep --all` of a container forwarding 8080 (IPv4 and IPv6).
fn create_and_sweep_all(node: &mut Node) {
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("c1", Some(pid), &[("io.natledger.ports", "8080:80")]);
    let dump = node.dump();
    assert!(dump.contains("natledger:c1"), "{dump}");
    let out = node.sweep(&["--all"]);
    assert_ok(&out, "sweep --all");
    assert!(!node.dump().contains("NATLEDGER"));
}

#[test]
fn sweep_all_leaves_iptables_nft_as_before_natledger() {
    let mut node = Node::new(Backend::IptablesNft);
    let before = ruleset(&node);
    assert!(!before.contains("table ip filter"), "{before}");
    create_and_sweep_all(&mut node);
    assert_eq!(ruleset(&node), before);
    drop(node);
    // Tables with other owners' things stay, with all of them.
    let mut node = Node::new(Backend::IptablesNft);
    run(&node, &["iptables-nft", "-P", "FORWARD", "DROP"]);
    run(&node, &["iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"]);
    run(
        &node,
        &[
            "ip6tables-nft",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "--dport",
            "9",
            "-j",
            "ACCEPT",
        ],
    );
    // An empty accepting built-in chain beside another owner's set.
    run(
        &node,
        &[
            "nft",
            "add table ip6 filter; add chain ip6 filter INPUT { type filter hook input priority 0; policy accept; }; add set ip6 filter allowed { type ipv6_addr; }",
        ],
    );
    let before = ruleset(&node);
    create_and_sweep_all(&mut node);
    let after = ruleset(&node);
    assert_eq!(
        without_empty_accepting_chains(&after),
        without_empty_accepting_chains(&before),
        "{after}"
    );
    for table in ["ip filter", "ip nat", "ip6 nat", "ip6 filter"] {
        assert!(
            after.contains(&format!("table {table} {{")),
            "{table}: {after}"
        );
    }
    let ip6_filter = run_in(
        node.topo.node(),
        "nft",
        &["list", "table", "ip6", "filter"],
        None,
    );
    assert!(String::from_utf8_lossy(&ip6_filter.stdout).contains("chain INPUT"));
}

/// `nft list ruleset` without its empty base chains of policy accept, and without blank lines.
fn without_empty_accepting_chains(ruleset: &str) -> String {
    let lines: Vec<&str> = ruleset.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let empty_accepting = lines[i].starts_with("\tchain ")
            && lines
                .get(i + 1)
                .is_some_and(|l| l.starts_with("\t\ttype ") && l.ends_with("policy accept;"))
            && lines.get(i + 2) == Some(&"\t}");
        if empty_accepting {
            i += 3;
        } else {
            kept.push(lines[i]);
            i += 1;
        }
    }
    kept.join("\n")
}

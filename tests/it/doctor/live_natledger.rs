//! `natledger doctor` live: natledger's own state (dead manifests, missing rules, orphans)
//! in private network namespaces.

use crate::common::*;

/// natledger's own state: a live container's rules are fine; once its process dies the
/// manifest is dead (a warning, fixed by `natledger sweep`); after sweep, nothing.
#[test]
fn live_natledger_dead_manifest() {
    let mut node = Node::new(Backend::IptablesNft);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("gone", Some(pid), &[("io.natledger.ports", "8082:80")]);
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    kill_pid(pid);
    let d = live(&node, &[]);
    let state = d.of_kind("natledger-state");
    assert_eq!(state.len(), 1, "{}", d.show());
    let f = state[0];
    assert_eq!(f["severity"], "warning");
    let summary = text(f, "summary");
    assert!(
        summary.contains("gone")
            && summary.contains(&format!("pid {pid}"))
            && summary.contains("dead"),
        "{summary}"
    );
    assert_eq!(text(f, "fix"), "natledger sweep");
    assert_eq!(f["port"], 8082);
    // Its DNATs (IPv4 and IPv6) now lead nowhere: dead targets, judged by the manifest.
    let dead = d.of_kind("dead-target");
    let families: Vec<String> = dead
        .iter()
        .map(|f| text(&f["rules"][0], "family"))
        .collect();
    assert_eq!(families, ["ipv4", "ipv6"], "{}", d.show());
    for f in dead {
        assert!(
            text(f, "evidence").contains("natledger manifest"),
            "{}",
            d.show()
        );
        assert_eq!(text(f, "fix"), "natledger sweep");
        assert_eq!(f["port"], 8082);
    }
    assert_eq!(d.findings().len(), 3, "{}", d.show());
    assert_eq!(d.code, 2, "{}", d.show());
    assert_ok(&node.sweep(&[]), "sweep");
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
}

/// A rule deleted by hand from a live container: its ports do not forward (an error).
#[test]
fn live_natledger_missing_rule() {
    let mut node = Node::new(Backend::IptablesNft);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("live", Some(pid), &[("io.natledger.ports", "8083:80")]);
    let nat = save(node.topo.node(), Backend::IptablesNft, Family::V4);
    let dnat = nat
        .lines()
        .find(|l| {
            l.starts_with("-A NATLEDGER-HOSTPORTS")
                && l.contains("natledger:live")
                && l.contains("DNAT")
        })
        .unwrap_or_else(|| panic!("no DNAT of live:\n{nat}"));
    let mut args: Vec<String> = vec!["-t".into(), "nat".into(), "-D".into()];
    args.extend(natledger::model::save::tokenize(&dnat[3..]).unwrap());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_in(node.topo.node(), "iptables-nft", &args, None);
    assert_ok(&out, "iptables-nft -D");
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let state = d.of_kind("natledger-state");
    assert_eq!(state.len(), 1, "{}", d.show());
    let f = state[0];
    assert_eq!(f["severity"], "error");
    assert!(
        text(f, "summary").contains("live") && text(f, "summary").contains("missing 1 of"),
        "{f}"
    );
    assert_eq!(f["rules"].as_array().unwrap().len(), 1, "{f}");
    assert_eq!(f["rules"][0]["chain"], "NATLEDGER-HOSTPORTS");
    assert!(
        line_of(f, 0).contains("natledger:live") && line_of(f, 0).contains("DNAT"),
        "{f}"
    );
    assert_eq!(f["port"], 8083);
    assert_eq!(d.findings().len(), 1, "{}", d.show());
}

/// Rules tagged for a container natledger has no manifest of: orphans (warnings). An orphan
/// DNAT is also a dead target.
#[test]
fn live_natledger_orphan_rules() {
    let node = Node::new(Backend::IptablesNft);
    node.warm_up();
    load_rules(
        node.topo.node(),
        Backend::IptablesNft,
        Family::V4,
        "*nat\n-A NATLEDGER-MASQ -s 10.77.0.9/32 -d 10.77.0.9/32 -p tcp -m tcp --dport 80 -m comment --comment natledger:ghost -j MASQUERADE\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 1, "{}", d.show());
    let state = d.of_kind("natledger-state");
    assert_eq!(state.len(), 1, "{}", d.show());
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    let f = state[0];
    assert_eq!(f["severity"], "warning");
    assert!(
        text(f, "summary").contains("ghost") && text(f, "summary").contains("orphan"),
        "{f}"
    );
    assert_eq!(places(f), [("NATLEDGER-MASQ".into(), 1)]);
    assert_eq!(text(f, "fix"), "natledger sweep");

    load_rules(
        node.topo.node(),
        Backend::IptablesNft,
        Family::V4,
        "*nat\n-I NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 7777 -m comment --comment natledger:ghost -j DNAT --to-destination 10.77.0.9:80\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    assert_eq!(d.of_kind("natledger-state").len(), 2, "{}", d.show());
    let dead = d.of_kind("dead-target");
    assert_eq!(dead.len(), 1, "{}", d.show());
    assert!(
        text(dead[0], "evidence").contains("no manifest for container ghost"),
        "{}",
        d.show()
    );
}

//! Adversarial review of the nftables backend: ways natledger could lose track of its own
//! rules or fail on what others do to its table.

mod common;

use common::*;

fn nft(node: &Node, args: &[&str], stdin: Option<&str>) -> String {
    let out = run_in(node.topo.node(), "nft", args, stdin.map(str::as_bytes));
    assert_ok(&out, &format!("nft {}", args.join(" ")));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `nft list ruleset > f; nft flush ruleset; nft -f f` (a boot-time restore): natledger's
/// rules come back with new handles, encoded by nft from its own text. poststop must still
/// find and delete exactly them.
#[test]
fn poststop_after_a_ruleset_reload_removes_the_rules() {
    let node = Node::new(Backend::Nftables);
    node.warm_up();
    let before = node.dump();
    let ip = ("io.natledger.ip", "10.77.0.2,fd77::2");
    node.create("c1", None, &[("io.natledger.ports", "8080:80,9000-9002:9000-9002/udp,127.0.0.1:7070:70"), ip]);
    let saved = nft(&node, &["list", "ruleset"], None);
    nft(&node, &["flush", "ruleset"], None);
    nft(&node, &["-f", "-"], Some(&saved));
    let reloaded = nft(&node, &["list", "ruleset"], None);
    assert_eq!(saved, reloaded, "the reload gives the same text");
    let out = node.poststop("c1");
    assert_ok(&out, "poststop c1");
    assert_eq!(node.dump(), before, "c1's rules are gone after the reload:\n{}", stderr(&out));
    let out = node.sweep(&["--all"]);
    assert_ok(&out, "sweep --all after reload");
}

/// Another owner's rule in natledger's table that jumps to a natledger chain in a form
/// natledger does not decode (a counter): sweep --all must not plan a chain deletion the
/// kernel refuses, every time.
#[test]
fn sweep_all_with_an_opaque_foreign_jump_into_a_natledger_chain() {
    let node = Node::new(Backend::Nftables);
    node.warm_up();
    nft(&node, &["add", "chain", "ip", "natledger", "theirs"], None);
    nft(&node, &["add", "rule", "ip", "natledger", "theirs", "counter", "jump", "NATLEDGER-HOSTPORTS"], None);
    // The chain is blocked (reported, as on iptables), not deleted; the kernel refuses
    // nothing (EBUSY before: the whole transaction failed, every time).
    for pass in 0..2 {
        let out = node.sweep(&["--all"]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(!text.contains("busy"), "pass {pass}: {text}");
        assert!(text.contains("chain NATLEDGER-HOSTPORTS stays"), "pass {pass}: {text}");
    }
    let after = nft(&node, &["list", "table", "ip", "natledger"], None);
    assert!(after.contains("counter packets 0 bytes 0 jump NATLEDGER-HOSTPORTS"), "{after}");
    assert!(!after.contains("NATLEDGER-MASQ"), "the rest went:\n{after}");
    assert!(!after.contains("NATLEDGER-INPUT"), "the rest went:\n{after}");
}

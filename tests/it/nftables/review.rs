//! Adversarial review of the nftables backend: ways natledger could lose track of its own
//! rules or fail on what others do to its table.

use crate::common::*;

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
    let node = Node::new(Backend::OwnNftables);
    node.warm_up();
    let before = node.dump();
    let ip = ("io.natledger.ip", "10.77.0.2,fd77::2");
    node.create(
        "c1",
        None,
        &[
            (
                "io.natledger.ports",
                "8080:80,9000-9002:9000-9002/udp,127.0.0.1:7070:70",
            ),
            ip,
        ],
    );
    let saved = nft(&node, &["list", "ruleset"], None);
    nft(&node, &["flush", "ruleset"], None);
    nft(&node, &["-f", "-"], Some(&saved));
    let reloaded = nft(&node, &["list", "ruleset"], None);
    assert_eq!(saved, reloaded, "the reload gives the same text");
    let out = node.poststop("c1");
    assert_ok(&out, "poststop c1");
    assert_eq!(
        node.dump(),
        before,
        "c1's rules are gone after the reload:\n{}",
        stderr(&out)
    );
    let out = node.sweep(&["--all"]);
    assert_ok(&out, "sweep --all after reload");
}

/// Another owner's rule in natledger's table that jumps to a natledger chain in a form
/// natledger does not decode (a counter): sweep --all must not plan a chain deletion the
/// kernel refuses, every time.
#[test]
fn sweep_all_with_an_opaque_foreign_jump_into_a_natledger_chain() {
    let node = Node::new(Backend::OwnNftables);
    node.warm_up();
    nft(&node, &["add", "chain", "ip", "natledger", "theirs"], None);
    nft(
        &node,
        &[
            "add",
            "rule",
            "ip",
            "natledger",
            "theirs",
            "counter",
            "jump",
            "NATLEDGER-HOSTPORTS",
        ],
        None,
    );
    // The chain is blocked (reported, as on iptables), not deleted; the kernel refuses
    // nothing (EBUSY before: the whole transaction failed, every time).
    for pass in 0..2 {
        let out = node.sweep(&["--all"]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(!text.contains("busy"), "pass {pass}: {text}");
        assert!(
            text.contains("chain NATLEDGER-HOSTPORTS stays"),
            "pass {pass}: {text}"
        );
    }
    let after = nft(&node, &["list", "table", "ip", "natledger"], None);
    assert!(
        after.contains("counter packets 0 bytes 0 jump NATLEDGER-HOSTPORTS"),
        "{after}"
    );
    assert!(!after.contains("NATLEDGER-MASQ"), "the rest went:\n{after}");
    assert!(
        !after.contains("NATLEDGER-INPUT"),
        "the rest went:\n{after}"
    );
}

/// What others may have done to natledger's table before a poststop: each case must end
/// with the poststop succeeding, the manifest gone and nothing of c1 left.
#[test]
fn poststop_when_the_table_is_gone_or_partly_gone() {
    let cases: [(&str, &[&[&str]]); 4] = [
        (
            "ipv4 table deleted",
            &[&["delete", "table", "ip", "natledger"]],
        ),
        (
            "PREROUTING base chain deleted",
            &[
                &["flush", "chain", "ip", "natledger", "PREROUTING"],
                &["delete", "chain", "ip", "natledger", "PREROUTING"],
            ],
        ),
        (
            "c1's dnat rules flushed",
            &[&["flush", "chain", "ip", "natledger", "NATLEDGER-HOSTPORTS"]],
        ),
        ("whole ruleset flushed", &[&["flush", "ruleset"]]),
    ];
    for (what, commands) in cases {
        let node = Node::new(Backend::OwnNftables);
        let ip = ("io.natledger.ip", "10.77.0.2,fd77::2");
        node.create(
            "c1",
            None,
            &[("io.natledger.ports", "8080:80,127.0.0.1:7070:70"), ip],
        );
        for args in commands {
            nft(&node, args, None);
        }
        let out = node.poststop("c1");
        assert_ok(&out, &format!("{what}: poststop"));
        assert!(!node.manifest_exists("c1"), "{what}: manifest stays");
        let left = nft(&node, &["list", "ruleset"], None);
        assert!(!left.contains("natledger:c1"), "{what}:\n{left}");
        // The next create works and restores what it needs.
        node.create("c2", None, &[("io.natledger.ports", "8081:80"), ip]);
        let now = nft(&node, &["list", "table", "ip", "natledger"], None);
        assert!(now.contains("jump NATLEDGER-HOSTPORTS"), "{what}:\n{now}");
        let out = node.sweep(&["--all"]);
        assert_ok(&out, &format!("{what}: sweep --all"));
        let left = nft(&node, &["list", "ruleset"], None);
        assert!(
            !left.contains("natledger"),
            "{what}: sweep --all left:\n{left}"
        );
    }
}

/// Someone else commits into natledger's table between natledger's read and its commit
/// (here: adds a chain of their own while natledger plans to delete its last chain, which
/// deletes the table, recursively in the kernel). The commit must not go through on the
/// stale read: the batch carries the generation it was planned at, the kernel refuses it,
/// and the foreign chain stays; planned again, the table stays (it is not empty).
#[test]
fn a_commit_planned_before_someone_else_changed_the_table_is_refused() {
    use natledger::kernel::netlink::Socket;
    use natledger::kernel::nftables::Session;
    use natledger::model::save::{Batch, Op};

    let node = Node::new(Backend::OwnNftables);
    let ns = node.topo.node().to_string();
    nft(
        &node,
        &["-f", "-"],
        Some(
            "table ip natledger {\n chain PREROUTING { type nat hook prerouting priority -110; }\n \
         chain NATLEDGER-HOSTPORTS { }\n}\n",
        ),
    );
    let (first, second) = in_netns(&ns, || {
        let f = natledger::model::family::Family::Ipv4;
        let mut sock = Socket::netfilter().unwrap();
        let mut session = Session::new(&mut sock);
        let mut batch = Batch::new("nat");
        batch
            .ops
            .push(Op::DeleteChain("NATLEDGER-HOSTPORTS".into()));
        let batches = [batch];
        let planned = session.plan_own(f, &batches).unwrap();
        // Someone else, between the read and the commit.
        let out = run_in(
            &ns,
            "nft",
            &["add", "chain", "ip", "natledger", "theirs"],
            None,
        );
        assert_ok(&out, "nft add chain");
        let first = session.commit_own(&planned).map_err(|e| e.to_string());
        let second = session.apply_own(f, &batches).map_err(|e| e.to_string());
        (first, second)
    });
    let after = nft(&node, &["list", "ruleset"], None);
    assert!(
        after.contains("chain theirs"),
        "the foreign chain was deleted:\n{after}"
    );
    assert!(first.is_err(), "the stale plan was committed: {first:?}");
    assert!(second.is_ok(), "{second:?}");
    assert!(!after.contains("NATLEDGER-HOSTPORTS"), "{after}");
}

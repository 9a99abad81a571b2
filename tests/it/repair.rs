//! `natledger sweep --repair` on every backend, with real TCP from the outside namespace and
//! full dumps: after a ruleset restored without `--noflush` (foreign rules kept, as firewalld
//! and netfilter-persistent do), `nft flush ruleset` (foreign rules loaded again), one of
//! natledger's chains flushed, or one rule deleted, the repair puts back exactly what the
//! live containers' manifests record (their DNATs newest first) with the chains and jumps,
//! the ports answer again and the dump equals the one before the wipe; a dead container's
//! rules are never put back (they and its manifest go, as sweep removes them); foreign rules
//! are untouched. CNI attachments and sharing groups alike: a live attachment's rules and a
//! dead sandbox's that a live member of its pod shares come back, a dead attachment's (its
//! namespace deleted without DEL) never. A stack of two attachments on one host port comes
//! back in its order, the newer serving, though the older's manifest was written last, after
//! a flushed chain and after the newer's DNAT alone is deleted. The time a repair takes at
//! scale, by hand and by `watch`, is `benches/repair.rs`'s.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(2);
/// A wiped port does not answer: quickly told.
const GONE: Duration = Duration::from_millis(500);

/// Other owners' iptables rules, in the tables natledger writes.
fn foreign(family: Family) -> String {
    let (to, from) = match family {
        Family::V4 => ("10.1.1.1:80", "10.99.0.0/16"),
        Family::V6 => ("[fd01::1]:80", "fd99::/64"),
    };
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         -A PREROUTING -p tcp -m tcp --dport 7777 -j DNAT --to-destination {to}\n\
         -A POSTROUTING -s {from} -j MASQUERADE\nCOMMIT\n\
         *filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s {from} -j DROP\nCOMMIT\n"
    )
}

/// Another owner's native table.
const FOREIGN_NFT: &str = "table inet other {\n  chain input {\n    \
    type filter hook input priority 0; policy accept;\n    tcp dport 7777 accept\n  }\n}\n";

#[derive(Clone, Copy, Debug)]
enum Wipe {
    /// `*-restore` without `--noflush` of the tables less natledger's lines; for natledger's
    /// own tables, `nft delete table` of them (a firewall's `flush ruleset` of its own).
    Restore,
    /// `nft flush ruleset`, then the other owners' rules loaded again.
    FlushRuleset,
    /// `NATLEDGER-HOSTPORTS` flushed.
    FlushChain,
    /// The newest container's DNAT deleted.
    DeleteRule,
}

fn load_foreign(node: &Node) {
    let ns = node.topo.node();
    if node.backend.is_iptables() {
        for family in Family::ALL {
            load_rules(ns, node.backend, family, &foreign(family));
        }
    }
    load_nft(ns, FOREIGN_NFT);
}

fn wipe(node: &Node, how: Wipe) {
    let ns = node.topo.node();
    let backend = node.backend;
    match how {
        Wipe::Restore if backend.is_iptables() => {
            for family in Family::ALL {
                let saved = save(ns, backend, family);
                let without: String = saved
                    .lines()
                    .filter(|l| !l.contains("NATLEDGER") && !l.contains("natledger"))
                    .map(|l| format!("{l}\n"))
                    .collect();
                let prog = format!("{}-restore", iptables_tool(backend, family));
                let out = run_in(ns, &prog, &["-w", "30"], Some(without.as_bytes()));
                assert_ok(&out, &prog);
            }
        }
        Wipe::Restore => {
            for family in ["ip", "ip6"] {
                let out = run_in(ns, "nft", &["delete", "table", family, "natledger"], None);
                assert_ok(&out, "nft delete table");
            }
        }
        Wipe::FlushRuleset => {
            let out = run_in(ns, "nft", &["flush", "ruleset"], None);
            assert_ok(&out, "nft flush ruleset");
            // Legacy's tables are not nf_tables': only the native table went.
            match backend {
                Backend::IptablesLegacy => load_nft(ns, FOREIGN_NFT),
                _ => load_foreign(node),
            }
        }
        Wipe::FlushChain if backend.is_iptables() => {
            for family in Family::ALL {
                let tool = iptables_tool(backend, family);
                let args = ["-w", "-t", "nat", "-F", "NATLEDGER-HOSTPORTS"];
                assert_ok(&run_in(ns, tool, &args, None), "flush chain");
            }
        }
        Wipe::FlushChain => {
            for family in ["ip", "ip6"] {
                let args = ["flush", "chain", family, "natledger", "NATLEDGER-HOSTPORTS"];
                assert_ok(&run_in(ns, "nft", &args, None), "nft flush chain");
            }
        }
        Wipe::DeleteRule => {
            let manifest = node.manifest("c4");
            let record = manifest["rules"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["chain"] == "NATLEDGER-HOSTPORTS" && r["family"] == "ipv4")
                .expect("a DNAT record")
                .clone();
            delete_recorded_rule(ns, backend, &record);
        }
    }
}

/// Every wipe, every backend: the live containers' forwards come back exactly, the dead
/// container's rules never.
#[test]
fn repair_puts_back_what_live_containers_lack_and_only_that() {
    both(|backend| {
        let mut node = Node::new(backend);
        load_foreign(&node);
        let (c2, c3, c4) = (
            node.topo.add_container(2),
            node.topo.add_container(3),
            node.topo.add_container(4),
        );
        let _servers = [
            serve_tcp(&c2.ns, c2.sock_v4(80), "c2"),
            serve_tcp(&c2.ns, c2.sock_v6(80), "c2 v6"),
            serve_tcp(&c3.ns, c3.sock_v4(80), "c3"),
            serve_tcp(&c4.ns, c4.sock_v4(80), "c4"),
        ];
        let (p2, p4) = (
            node.topo.spawn_sleeper(&c2.ns),
            node.topo.spawn_sleeper(&c4.ns),
        );
        node.create("c2", Some(p2), &[("io.natledger.ports", "8080:80")]);
        // Created later: its DNATs come first.
        std::thread::sleep(Duration::from_millis(20));
        node.create("c4", Some(p4), &[("io.natledger.ports", "8084:80,8085:80")]);
        let ext = node.topo.ext().to_string();
        let answers = |port: u16, v6: bool| {
            let dst = if v6 {
                sock(NODE_V6, port)
            } else {
                sock(NODE_V4, port)
            };
            tcp_request(&ext, dst, T).ok()
        };
        assert_eq!(answers(8080, false).as_deref(), Some("c2"));
        let before = node.dump();

        for how in [
            Wipe::Restore,
            Wipe::FlushRuleset,
            Wipe::FlushChain,
            Wipe::DeleteRule,
        ] {
            let what = format!("{backend:?} {how:?}");
            // A container that dies with its rules in place.
            let p3 = node.topo.spawn_sleeper(&c3.ns);
            node.create("c3", Some(p3), &[("io.natledger.ports", "8083:80")]);
            assert_eq!(answers(8083, false).as_deref(), Some("c3"), "{what}");
            kill_pid(p3);

            wipe(&node, how);
            if backend != Backend::IptablesLegacy || !matches!(how, Wipe::FlushRuleset) {
                let port = if matches!(how, Wipe::DeleteRule) {
                    8084
                } else {
                    8080
                };
                let gone = tcp_request(&ext, sock(NODE_V4, port), GONE);
                assert!(gone.is_err(), "{what}: still forwarded after the wipe");
            }

            let out = node.sweep(&["--repair"]);
            assert_ok(&out, &format!("{what}: sweep --repair"));
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(text.contains("put back"), "{what}: {text}");
            assert!(!text.contains("natledger:c3 -j"), "{what}: {text}");
            assert_eq!(answers(8080, false).as_deref(), Some("c2"), "{what}");
            assert_eq!(answers(8080, true).as_deref(), Some("c2 v6"), "{what}");
            assert_eq!(answers(8084, false).as_deref(), Some("c4"), "{what}");
            assert_eq!(answers(8085, false).as_deref(), Some("c4"), "{what}");
            assert!(
                answers(8083, false).is_none(),
                "{what}: the dead one's port"
            );
            assert!(!node.manifest_exists("c3"), "{what}");
            assert_eq!(node.dump(), before, "{what}: the tables as before the wipe");

            // Nothing lacking: a second repair changes nothing.
            let again = node.sweep(&["--repair"]);
            assert_ok(&again, &format!("{what}: second repair"));
            let text = String::from_utf8_lossy(&again.stdout).to_string();
            assert!(text.contains("put back 0 rule(s)"), "{what}: {text}");
            assert_eq!(node.dump(), before, "{what}: second repair");
        }
    });
}

/// CNI attachments and a pod's sharing group, every backend: a live attachment's and a dead
/// sandbox's rules that a live member of its pod shares come back; a dead attachment's (its
/// namespace deleted, no DEL) never do, and its manifest goes.
#[test]
fn repair_handles_cni_attachments_and_sharing_groups() {
    const POD: (&str, &str) = ("io.kubernetes.cri.sandbox-id", "pod-1");
    both(|backend| {
        let mut node = Node::new(backend);
        load_foreign(&node);
        let (att, gone, pod) = (
            node.topo.add_container(5),
            node.topo.add_container(6),
            node.topo.add_container(7),
        );
        let _servers = [
            serve_tcp(&att.ns, att.sock_v4(80), "att"),
            serve_tcp(&gone.ns, gone.sock_v4(80), "gone"),
            serve_tcp(&pod.ns, pod.sock_v4(80), "pod"),
        ];
        let ext = node.topo.ext().to_string();
        let answers = |port: u16| tcp_request(&ext, sock(NODE_V4, port), T).ok();
        assert_ok(&cni_add(&node, "testnet", "att", &att, 8090), "ADD att");
        let (sandbox, app) = (
            node.topo.spawn_sleeper(&pod.ns),
            node.topo.spawn_sleeper(&pod.ns),
        );
        let ports = ("io.natledger.ports", "8092:80");
        node.create("sandbox", Some(sandbox), &[ports, POD]);
        node.create("app", Some(app), &[ports, POD]);
        assert_eq!(node.manifest("app")["shares"][0]["holder"], "sandbox");
        let before = node.dump();

        assert_ok(&cni_add(&node, "testnet", "gone", &gone, 8091), "ADD gone");
        assert_eq!(answers(8091).as_deref(), Some("gone"));
        let gone_ns = gone.ns.clone();
        node.topo.delete_ns_now(&gone_ns);
        // The sandbox dies first; the app keeps its rules needed.
        kill_pid(sandbox);

        for how in [Wipe::Restore, Wipe::FlushRuleset] {
            let what = format!("{backend:?} {how:?}");
            wipe(&node, how);
            let out = node.sweep(&["--repair"]);
            assert_ok(&out, &format!("{what}: sweep --repair"));
            assert_eq!(answers(8090).as_deref(), Some("att"), "{what}");
            assert_eq!(answers(8092).as_deref(), Some("pod"), "{what}");
            assert!(answers(8091).is_none(), "{what}");
            let manifests = node.manifests();
            assert!(
                manifests.iter().all(|m| !m.starts_with("gone")),
                "{what}: {manifests:?}"
            );
            assert!(node.manifest_exists("sandbox"), "{what}");
            assert_eq!(node.dump(), before, "{what}: the tables as before");
        }
    });
}

/// A stack (`portConflict` stack, portmap's way): two CNI attachments in two namespaces on
/// one host port, the older's manifest written last (as a joiner's `shared_by` or a re-ADD
/// rewrites it). After `NATLEDGER-HOSTPORTS` is flushed, and after the newer's DNAT alone is
/// deleted, `sweep --repair` puts the newer's back in front of the older's: the newer serves
/// again (not by the files' times), and the tables are as before.
#[test]
fn repair_keeps_a_stacks_order_whatever_the_manifests_times() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (old, new) = (node.topo.add_container(2), node.topo.add_container(3));
        let _servers = [
            serve_tcp(&old.ns, old.sock_v4(80), "old"),
            serve_tcp(&new.ns, new.sock_v4(80), "new"),
        ];
        let ext = node.topo.ext().to_string();
        let answers = || tcp_request(&ext, sock(NODE_V4, 8080), T).ok();
        assert_ok(&cni_add(&node, "testnet", "old", &old, 8080), "ADD old");
        assert_ok(&cni_add(&node, "testnet", "new", &new, 8080), "ADD new");
        assert_eq!(
            node.manifest("new+eth0")["stacked_on"],
            serde_json::json!(["old+eth0"]),
            "{backend:?}"
        );
        assert_eq!(answers().as_deref(), Some("new"), "{backend:?}");
        let before = node.dump();
        let path = node.state_dir().join("containers/old+eth0.json");
        let later = std::time::SystemTime::now() + Duration::from_secs(60);
        let file = std::fs::File::options().append(true).open(&path).unwrap();
        file.set_modified(later).unwrap();

        let what = format!("{backend:?}: chain flushed");
        wipe(&node, Wipe::FlushChain);
        let gone = tcp_request(&ext, sock(NODE_V4, 8080), GONE);
        assert!(gone.is_err(), "{what}: still forwarded after the wipe");
        assert_ok(
            &node.sweep(&["--repair"]),
            &format!("{what}: sweep --repair"),
        );
        assert_eq!(answers().as_deref(), Some("new"), "{what}");
        assert_eq!(node.dump(), before, "{what}: the tables as before");

        let what = format!("{backend:?}: the newer's DNAT deleted");
        let manifest = node.manifest("new+eth0");
        let record = manifest["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["chain"] == "NATLEDGER-HOSTPORTS"
                    && r["family"] == "ipv4"
                    && r["rule"].as_array().unwrap().iter().any(|a| a == "DNAT")
            })
            .expect("a DNAT record")
            .clone();
        delete_recorded_rule(node.topo.node(), backend, &record);
        assert_eq!(
            answers().as_deref(),
            Some("old"),
            "{what}: the older's behind it"
        );
        assert_ok(
            &node.sweep(&["--repair"]),
            &format!("{what}: sweep --repair"),
        );
        assert_eq!(answers().as_deref(), Some("new"), "{what}");
        assert_eq!(node.dump(), before, "{what}: the tables as before");
    });
}

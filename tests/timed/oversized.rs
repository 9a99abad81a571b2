//! Manifests too large to read whole (over natledger's 64 MiB read cap; an older release
//! wrote them for tens of thousands of mappings; issue 22, item 2), with the real binary in
//! private network namespaces, full dumps before and after, TCP to the containers:
//!
//! - `sweep_removes_a_dead_container_whose_manifest_is_too_large_to_read`: a dead container's
//!   manifest over the 64 MiB read cap is judged from its liveness fields; sweep removes its
//!   tagged rules and the manifest and says so; a live one's stay; a corrupt manifest's rules
//!   stay, named, until `sweep --all`; the large manifests are read before the lock, so a
//!   create meanwhile waits at most a few seconds (printed);
//! - `poststop_removes_the_many_rules_of_a_container_whose_manifest_is_too_large`: a stopped
//!   container's manifest over the read cap, and 55,000 more DNATs tagged for it (as an older
//!   release wrote): poststop removes them by their tag, the chain rewritten (flushed, the
//!   rules that stay appended again), within seconds (printed), every backend; the dumps
//!   return to what they were without it, foreign rules in natledger's chain and elsewhere
//!   untouched, another container's port still forwarding;
//! - `cni_del_removes_the_many_rules_of_an_attachment_whose_manifest_is_too_large`: the same
//!   through a CNI DEL on iptables-nft (timed, printed);
//! - `a_stale_poststop_of_a_container_whose_manifest_is_too_large_changes_nothing`: such a
//!   manifest read for its liveness fields: an earlier instance's poststop (its state names
//!   another pid while the recorded process runs) changes nothing; the container's own
//!   poststop then removes its rules and manifest.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(3);
const CID: &str = "b0a1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1";

/// Rewrite container `id`'s manifest with its rule records repeated until the file is past
/// natledger's 64 MiB read cap (as an older release wrote for 65,535 mappings).
fn inflate(node: &Node, id: &str) -> u64 {
    let mut manifest = node.manifest(id);
    let rules = serde_json::to_string(&manifest["rules"]).unwrap();
    let records = &rules[1..rules.len() - 1];
    let copies = (65 << 20) / records.len() + 1;
    manifest["rules"] = "@RULES@".into();
    let big = format!("[{}]", vec![records; copies].join(","));
    let text = serde_json::to_string(&manifest)
        .unwrap()
        .replace("\"@RULES@\"", &big);
    let path = node
        .state_dir()
        .join("containers")
        .join(format!("{id}.json"));
    std::fs::write(&path, text).unwrap();
    std::fs::metadata(&path).unwrap().len()
}

#[test]
fn sweep_removes_a_dead_container_whose_manifest_is_too_large_to_read() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let mut node = Node::new(backend);
        let (c2, c3, c4, c5) = (
            node.topo.add_container(2),
            node.topo.add_container(3),
            node.topo.add_container(4),
            node.topo.add_container(5),
        );
        let _s5 = serve_tcp(&c5.ns, c5.sock_v4(80), "other");
        let pid5 = node.topo.spawn_sleeper(&c5.ns);
        let _s2 = serve_tcp(&c2.ns, c2.sock_v4(80), "dead");
        let _s3 = serve_tcp(&c3.ns, c3.sock_v4(80), "live");
        let _s4 = serve_tcp(&c4.ns, c4.sock_v4(80), "broken");
        let (pid2, pid3, pid4) = (
            node.topo.spawn_sleeper(&c2.ns),
            node.topo.spawn_sleeper(&c3.ns),
            node.topo.spawn_sleeper(&c4.ns),
        );
        node.warm_up();
        node.create("live", Some(pid3), &[("io.natledger.ports", "9090:80")]);
        node.create("broken", Some(pid4), &[("io.natledger.ports", "7070:80")]);
        let without_dead = node.dump();
        node.create("dead", Some(pid2), &[("io.natledger.ports", "8080:80")]);
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("dead")
        );
        let dead_size = inflate(&node, "dead");
        let live_size = inflate(&node, "live");
        // A manifest cut short: nothing says whether its container lives.
        let broken = node.state_dir().join("containers").join("broken.json");
        let text = std::fs::read(&broken).unwrap();
        std::fs::write(&broken, &text[..text.len() / 2]).unwrap();
        kill_pid(pid2);
        kill_pid(pid4);
        let before = node.dump();
        assert!(before.contains("natledger:dead"));

        // Another container starts while the sweep reads the large manifests.
        let (out, took, other) = std::thread::scope(|s| {
            let sweep = s.spawn(|| {
                let start = Instant::now();
                let out = node.sweep(&["--json"]);
                (out, start.elapsed())
            });
            std::thread::sleep(Duration::from_millis(500));
            let bundle = node.bundle("other", &[("io.natledger.ports", "6060:80")]);
            let start = Instant::now();
            let created = node.hook("create-runtime", "other", Some(pid5), &bundle);
            let other = start.elapsed();
            assert_ok(&created, "create during the sweep");
            let (out, took) = sweep.join().unwrap();
            (out, took, other)
        });
        let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
        println!(
            "{backend:?}: sweep with manifests of {dead_size} and {live_size} bytes: {:.2} s; \
             a create meanwhile {:.2} s",
            took.as_secs_f64(),
            other.as_secs_f64()
        );
        assert!(
            other < Duration::from_secs(5),
            "{backend:?}: the create waited {other:?}"
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 6060), T).ok().as_deref(),
            Some("other")
        );
        assert_ok(&node.poststop("other"), "poststop");
        assert!(
            !out.status.success(),
            "the corrupt manifest is an error: {report}"
        );
        let containers = report["containers"].as_array().unwrap();
        let find = |id: &str| {
            containers
                .iter()
                .find(|c| c["id"] == id)
                .unwrap_or_else(|| panic!("{id} in {report}"))
        };
        let dead = find("dead");
        assert_eq!(dead["state"], "dead", "{dead}");
        assert_eq!(dead["manifest"], "removed", "{dead}");
        assert_eq!(dead["manifest_too_large"], dead_size, "{dead}");
        assert_eq!(
            dead["rules_removed"],
            if backend.is_iptables() { 7 } else { 5 }
        );
        let live = find("live");
        assert_eq!(live["state"], "alive", "{live}");
        assert_eq!(live["manifest_too_large"], live_size, "{live}");
        assert_eq!(find("broken")["state"], "unreadable");
        let errors = report["errors"].to_string();
        assert!(
            errors.contains("the rules tagged natledger:broken are kept"),
            "{errors}"
        );
        assert_eq!(
            node.dump(),
            without_dead,
            "{backend:?}: exactly the dead container's rules went"
        );
        assert!(!node.manifest_exists("dead"));
        assert!(node.manifest_exists("live") && node.manifest_exists("broken"));
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 9090), T).ok().as_deref(),
            Some("live")
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 7070), T).ok().as_deref(),
            Some("broken")
        );

        // The text report says how the dead one was judged.
        let out = node.sweep(&[]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("container dead"), "{text}");
        assert!(text.contains("natledger:broken are kept"), "{text}");

        let out = node.sweep(&["--all"]);
        assert_ok(&out, "sweep --all");
        let after = node.dump();
        assert!(!after.contains("natledger:"), "{backend:?}: {after}");
        assert!(node.manifests().is_empty());
    });
}

/// How many copies of a container's DNAT, tagged for it, [`many_tagged`] adds.
const MANY: u16 = 55_000;

/// Add [`MANY`] rules tagged for `id` to natledger's DNAT chain (the container's own DNAT for
/// port `port`, on other ports) with the backend's own tool, as an older release wrote for
/// that many mappings.
fn many_tagged(node: &Node, id: &str, port: u16) {
    let ns = node.topo.node();
    let (lines, tool, args, head, tail) = if node.backend.is_iptables() {
        let tool = format!("iptables-{}-save", node.backend.name());
        let out = run_in(ns, &tool, &["-t", "nat"], None);
        assert_ok(&out, &tool);
        let restore = format!("iptables-{}-restore", node.backend.name());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (text, restore, vec!["--noflush"], "*nat\n", "COMMIT\n")
    } else {
        let out = run_in(
            ns,
            "nft",
            &["list", "chain", "ip", "natledger", "NATLEDGER-HOSTPORTS"],
            None,
        );
        assert_ok(&out, "nft list chain");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (text, "nft".to_string(), vec!["-f", "-"], "", "")
    };
    let (dport, tag, prefix) = if node.backend.is_iptables() {
        ("--dport", format!("--comment \"natledger:{id}\""), "")
    } else {
        let prefix = "add rule ip natledger NATLEDGER-HOSTPORTS ";
        ("dport", format!("comment \"natledger:{id}\""), prefix)
    };
    let ours = format!("{dport} {port} ");
    let line = lines
        .lines()
        .map(str::trim)
        .find(|l| l.contains(&ours) && l.contains(&tag) && l.to_lowercase().contains("dnat"))
        .unwrap_or_else(|| panic!("the DNAT of {id} in\n{lines}"));
    let mut text = String::from(head);
    for p in 10_000..10_000 + MANY {
        text.push_str(prefix);
        text.push_str(&line.replace(&ours, &format!("{dport} {p} ")));
        text.push('\n');
    }
    text.push_str(tail);
    let out = run_in(ns, &tool, &args, Some(text.as_bytes()));
    assert_ok(&out, &tool);
}

#[test]
fn poststop_removes_the_many_rules_of_a_container_whose_manifest_is_too_large() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    for backend in Backend::ALL {
        let mut node = Node::new(backend);
        let (c2, c3) = (node.topo.add_container(2), node.topo.add_container(3));
        let _s2 = serve_tcp(&c2.ns, c2.sock_v4(80), "big");
        let _s3 = serve_tcp(&c3.ns, c3.sock_v4(80), "other");
        let (pid2, pid3) = (
            node.topo.spawn_sleeper(&c2.ns),
            node.topo.spawn_sleeper(&c3.ns),
        );
        node.warm_up();
        node.create("other", Some(pid3), &[("io.natledger.ports", "9090:80")]);
        // Foreign rules, in natledger's chain and in another table.
        let ns = node.topo.node();
        let out = if backend.is_iptables() {
            let foreign = "*nat\n-A NATLEDGER-MASQ -p tcp -m tcp --dport 5 -m comment \
                           --comment someone-else -j RETURN\n-A PREROUTING -p tcp -m tcp \
                           --dport 6 -j RETURN\nCOMMIT\n";
            let tool = format!("iptables-{}-restore", backend.name());
            run_in(ns, &tool, &["--noflush"], Some(foreign.as_bytes()))
        } else {
            let foreign = "add rule ip natledger NATLEDGER-MASQ tcp dport 5 return\n\
                           add table ip other\nadd chain ip other c\n\
                           add rule ip other c tcp dport 6 return\n";
            run_in(ns, "nft", &["-f", "-"], Some(foreign.as_bytes()))
        };
        assert_ok(&out, "foreign rules");
        let without_big = node.dump();
        node.create("big", Some(pid2), &[("io.natledger.ports", "8080:80")]);
        many_tagged(&node, "big", 8080);
        let size = inflate(&node, "big");
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 10_001), T).ok().as_deref(),
            Some("big")
        );
        kill_pid(pid2);
        let before = node.dump();
        let tagged = before.matches("\"natledger:big\"").count();
        assert!(tagged > usize::from(MANY), "{tagged}");

        let start = Instant::now();
        let out = node.poststop("big");
        let took = start.elapsed();
        println!(
            "{backend:?}: poststop of {tagged} tagged rules, manifest {size} B: {:.2} s",
            took.as_secs_f64()
        );
        assert_ok(&out, "poststop");
        assert_eq!(
            node.dump(),
            without_big,
            "{backend:?}: exactly the big container's rules went, the foreign ones stay"
        );
        assert!(!node.manifest_exists("big"));
        // Rule by rule (each `-D` or handle looked up from the chain's top) this took 14 s on
        // iptables-nft and 19 s on nftables; the chain rewritten, 5-7 s (a debug build, the
        // manifest's streaming read included).
        let bound = if backend.is_iptables() { 12 } else { 20 };
        assert!(
            took < Duration::from_secs(bound),
            "{backend:?}: the poststop took {took:?}"
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 9090), T).ok().as_deref(),
            Some("other")
        );
        assert_ok(&node.poststop("other"), "poststop");
    }
}

#[test]
fn a_stale_poststop_of_a_container_whose_manifest_is_too_large_changes_nothing() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let mut node = Node::new(Backend::IptablesNft);
    let c2 = node.topo.add_container(2);
    let _s2 = serve_tcp(&c2.ns, c2.sock_v4(80), "big");
    let (pid, earlier) = (
        node.topo.spawn_sleeper(&c2.ns),
        node.topo.spawn_sleeper(&c2.ns),
    );
    node.warm_up();
    node.create("big", Some(pid), &[("io.natledger.ports", "8080:80")]);
    let size = inflate(&node, "big");
    let before = node.dump();
    // An earlier instance's poststop: its state names another pid, the recorded one runs.
    let bundle = node.bundle("big", &[("io.natledger.ports", "8080:80")]);
    let out = node.hook("poststop", "big", Some(earlier), &bundle);
    assert_ok(&out, "a stale poststop");
    assert!(
        stderr(&out).contains("is an earlier instance's"),
        "{}",
        stderr(&out)
    );
    assert_eq!(node.dump(), before, "its rules stay");
    assert_eq!(manifest_size(&node, "big"), size);
    let ext = node.topo.ext().to_string();
    assert_eq!(
        tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
        Some("big")
    );
    // The container's own poststop, once its process is gone, removes them.
    kill_pid(pid);
    assert_ok(
        &node.hook("poststop", "big", Some(pid), &bundle),
        "poststop",
    );
    assert!(!node.dump().contains("natledger:big"));
    assert!(!node.manifest_exists("big"));
}

#[test]
fn cni_del_removes_the_many_rules_of_an_attachment_whose_manifest_is_too_large() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let mut node = Node::new(Backend::IptablesNft);
    let c2 = node.topo.add_container(2);
    let _s2 = serve_tcp(&c2.ns, c2.sock_v4(80), "big");
    node.warm_up();
    let before = node.dump();
    let config = bounds_config(&node, &c2, port_mappings(|_| 80, [8080].into_iter(), None));
    let (out, _) = cni_timed(&node, "ADD", CID, &c2, &config, 60);
    assert_ok(&out, "ADD");
    let id = format!("{CID}+eth0");
    many_tagged(&node, &id, 8080);
    let size = inflate(&node, &id);
    let tagged = node.dump().matches(&format!("\"natledger:{id}\"")).count();
    assert!(tagged > usize::from(MANY), "{tagged}");
    let (out, took) = cni_timed(&node, "DEL", CID, &c2, &config, 120);
    println!(
        "Nft: CNI DEL of {tagged} tagged rules, manifest {size} B: {:.2} s",
        took.as_secs_f64()
    );
    assert_ok(&out, "DEL");
    assert_eq!(node.dump(), before, "the tables restored");
    assert!(node.manifests().is_empty());
    assert!(took < Duration::from_secs(12), "the DEL took {took:?}");
}

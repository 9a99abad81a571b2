//! `natledger watch`'s back-off is per container: while a hostile loop deletes one
//! container's DNAT every 50 ms (watch backs off for that container, its log says so), another
//! container's DNAT deleted once comes back within 2 s, proven with real TCP from the outside
//! namespace; once the loop stops, the held container's forward comes back too and the dump is
//! the one before. On both iptables backends (a single rule of natledger's own tables is not
//! deleted by hand here).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::*;
use crate::watch::{Watch, metric, wait_until};

/// `-D` of container `id`'s IPv4 DNAT, as `*-save` shows it (its comment has no space).
fn delete_dnat_argv(node: &Node, id: &str) -> Vec<String> {
    let tag = format!("natledger:{id}");
    let line = save(node.topo.node(), node.backend, Family::V4)
        .lines()
        .find(|l| l.starts_with("-A NATLEDGER-HOSTPORTS") && l.contains(&tag) && l.contains("DNAT"))
        .unwrap_or_else(|| panic!("no DNAT of {id}"))
        .to_string();
    let mut argv = vec![
        iptables_tool(node.backend, Family::V4).to_string(),
        "-w".into(),
        "-t".into(),
        "nat".into(),
    ];
    // `*-save` quotes the comment; as an argument it goes unquoted.
    let line = line.replacen("-A", "-D", 1).replace('"', "");
    argv.extend(line.split_whitespace().map(String::from));
    argv
}

#[test]
fn a_deleter_of_one_containers_rule_holds_only_that_containers_repairs() {
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let (c2, c3) = (node.topo.add_container(2), node.topo.add_container(3));
        let _servers = [
            serve_tcp(&c2.ns, c2.sock_v4(80), "c2"),
            serve_tcp(&c3.ns, c3.sock_v4(80), "c3"),
        ];
        let (p2, p3) = (
            node.topo.spawn_sleeper(&c2.ns),
            node.topo.spawn_sleeper(&c3.ns),
        );
        node.create("c2", Some(p2), &[("io.natledger.ports", "8080:80")]);
        node.create("c3", Some(p3), &[("io.natledger.ports", "8081:80")]);
        let ext = node.topo.ext().to_string();
        let answers = |port: u16, who: &str, timeout: Duration| {
            tcp_request(&ext, sock(NODE_V4, port), timeout).is_ok_and(|r| r == who)
        };
        assert!(answers(8080, "c2", Duration::from_secs(2)));
        assert!(answers(8081, "c3", Duration::from_secs(2)));
        let before = node.dump();

        let metrics = node.dir.path().join("watch.prom");
        let watch = Watch::start(&node, &metrics);
        let started = wait_until(Duration::from_secs(10), || {
            metric(&metrics, "natledger_watch_reconciles_total") >= 1.0
        });
        assert!(
            started.is_some(),
            "{backend:?}: no reconcile:\n{}",
            watch.log()
        );

        // c2's DNAT deleted every 50 ms until watch holds c2's repairs.
        let delete_c2 = delete_dnat_argv(&node, "c2");
        let argv: Vec<&str> = delete_c2.iter().map(String::as_str).collect();
        assert_ok(
            &run_in(node.topo.node(), argv[0], &argv[1..], None),
            &format!("delete c2's DNAT: {argv:?}"),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let hostile = {
            let (stop, ns) = (stop.clone(), node.topo.node().to_string());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let argv: Vec<&str> = delete_c2.iter().map(String::as_str).collect();
                    let _ = run_in(&ns, argv[0], &argv[1..], None);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let held = wait_until(Duration::from_secs(10), || {
            watch.log().contains("the rules of container c2")
        });
        assert!(held.is_some(), "{backend:?}: c2 not held:\n{}", watch.log());
        // Deeper into c2's back-off, c3's DNAT goes once: back within 2 s all the same.
        std::thread::sleep(Duration::from_secs(2));
        let argv = delete_dnat_argv(&node, "c3");
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert_ok(
            &run_in(node.topo.node(), argv[0], &argv[1..], None),
            "delete c3's DNAT",
        );
        let back = wait_until(Duration::from_secs(2), || {
            answers(8081, "c3", Duration::from_millis(150))
        });
        stop.store(true, Ordering::Relaxed);
        hostile.join().unwrap();
        assert!(
            back.is_some(),
            "{backend:?}: c3 not repaired within 2 s while c2 was held:\n{}",
            watch.log()
        );
        eprintln!(
            "{backend:?}: c3 back {:?} after its deletion",
            back.unwrap()
        );
        assert!(
            !watch.log().contains("the rules of container c3"),
            "{backend:?}: c3 was held:\n{}",
            watch.log()
        );
        assert!(metric(&metrics, "natledger_watch_backoffs_total") >= 1.0);

        // The loop stopped: c2's hold ends (30 s at most), or SIGHUP ends it at once.
        watch.signal(libc::SIGHUP);
        let same = wait_until(Duration::from_secs(3), || node.dump() == before);
        assert!(
            same.is_some(),
            "{backend:?}: the dump differs:\n{}",
            node.dump()
        );
        assert!(answers(8080, "c2", Duration::from_secs(2)));
    });
}

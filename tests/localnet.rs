//! The route_localnet hole (kube-proxy's CVE-2020-8558) and natledger's guard against it.
//!
//! natledger sets `route_localnet=1` on the bridge towards a container with a mapping on
//! 127.0.0.1 (the node's own connections to 127.0.0.1:hostPort leave with a loopback
//! source). With it on, and nothing else, a neighbour on that bridge can address packets to
//! 127.0.0.1 through the node's bridge address and reach the node's services bound to
//! localhost. The attacker here is an ordinary namespace on the bridge: without raw
//! sockets, it drops its own 127.0.0.0/8, turns route_localnet on for its own eth0 (so its
//! kernel sends and accepts loopback addresses there) and routes 127.0.0.0/8 via the node.
//! Then a plain UDP send and TCP connect go to the node's localhost.
//!
//! Proven on both backends: before natledger the packets are martians; with natledger's
//! guard they are dropped; with the guard taken away (a host written by an older
//! natledger, shared chains but no guard) they reach the node's UDP server and complete a
//! TCP handshake, and doctor reports br0 open (localhost-exposed); the next create puts the
//! guard back. Meanwhile the 127.0.0.1:hostPort →
//! container path works (TCP, UDP, a UDP client that keeps sending), and `sweep --all`
//! leaves every table as it was before natledger.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(3);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The 127.0.0.1:8080 → container path, TCP and UDP.
fn localhost_path_works(node: &str, backend: Backend, what: &str) {
    let dst = sock(LOCALHOST, 8080);
    assert_eq!(
        tcp_request(node, dst, T).ok().as_deref(),
        Some("c2 tcp"),
        "{backend:?} {what}: 127.0.0.1 tcp"
    );
    assert_eq!(
        udp_request(node, dst, T).ok().as_deref(),
        Some("c2 udp"),
        "{backend:?} {what}: 127.0.0.1 udp"
    );
}

/// Take the guard away as a host written before it existed looks: the INPUT jump and the
/// guard's chain gone, every other shared chain and jump in place.
fn unguard(node: &str, backend: Backend) {
    let tool = iptables_tool(backend, Family::V4);
    for args in [
        &[
            "-t",
            "filter",
            "-D",
            "INPUT",
            "-m",
            "comment",
            "--comment",
            "natledger",
            "-j",
            "NATLEDGER-INPUT",
        ][..],
        &["-t", "filter", "-F", "NATLEDGER-INPUT"],
        &["-t", "filter", "-X", "NATLEDGER-INPUT"],
    ] {
        let out = run_in(node, tool, args, None);
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// doctor on the live node names nothing of the guard (natledger's own shared rules are
/// neither foreign nor a finding), and reports br0 open to the neighbours exactly when
/// `exposed` (its localhost-exposed check, `tests/doctor_localhost.rs`).
fn doctor_on_localhost(node: &Node, what: &str, exposed: bool) {
    let doc = live(node, &[]);
    let about: Vec<&serde_json::Value> = doc
        .findings()
        .iter()
        .filter(|f| f["kind"] != "localhost-exposed")
        .filter(|f| {
            let text = f.to_string();
            text.contains("NATLEDGER-INPUT") || text.contains("127.0.0.0/8 ! -i lo")
        })
        .collect();
    assert!(about.is_empty(), "{what}: {}", doc.show());
    let found = doc.of_kind("localhost-exposed");
    assert_eq!(found.len(), usize::from(exposed), "{what}: {}", doc.show());
    if exposed {
        assert!(
            text(found[0], "summary").starts_with("Neighbours on br0 can reach"),
            "{what}: {}",
            doc.show()
        );
    }
}

#[test]
fn localhost_is_closed_to_neighbours_and_open_to_the_node() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let attacker = node.topo.add_container(3).ns;
        let host = node.topo.node().to_string();
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp"),
            serve_udp(&c.ns, c.sock_v4(80), "c2 udp"),
        ];
        let pid = node.topo.spawn_sleeper(&c.ns);
        let secrets = Secrets::bind(&host);
        arm(&attacker);
        let pristine = node.dump();

        // Before natledger: martians, as the kernel drops them with route_localnet=0.
        assert_eq!(route_localnet(&host, "br0"), "0");
        assert_eq!(
            secrets.attack(&attacker, "before"),
            (false, false),
            "{backend:?}: the kernel lets 127.0.0.1 in from the bridge without natledger"
        );

        let created = node.create(
            "c2",
            Some(pid),
            &[("io.natledger.ports", "8080:80,8080:80/udp")],
        );
        assert_ok(&created, "create c2");
        assert_eq!(
            route_localnet(&host, "br0"),
            "1",
            "{backend:?}: route_localnet"
        );
        assert_eq!(
            secrets.attack(&attacker, "guarded"),
            (false, false),
            "{backend:?}: with route_localnet=1 a neighbour reaches the node's localhost \
             (UDP, TCP)"
        );
        localhost_path_works(&host, backend, "guarded");
        doctor_on_localhost(&node, "guarded", false);
        // A client that keeps sending from 127.0.0.1: its replies come back through the
        // guard as ESTABLISHED.
        let client = UdpClient::start(&host, sock(LOCALHOST, 40123), sock(LOCALHOST, 8080));
        let t0 = Instant::now();
        assert!(
            client.wait_for("c2 udp", t0, T).is_some(),
            "{backend:?}: the UDP client gets no reply through the guard"
        );

        // A host written before the guard: the hole is there.
        unguard(&host, backend);
        assert_eq!(
            secrets.attack(&attacker, "unguarded"),
            (true, true),
            "{backend:?}: without the guard the neighbour must reach localhost (or this test \
             proves nothing)"
        );
        // list, sweep and doctor take a host without the guard as it is.
        assert_ok(
            &node.natledger(&["list"], "", &[]),
            "list without the guard",
        );
        assert_ok(&node.sweep(&[]), "sweep without the guard");
        doctor_on_localhost(&node, "unguarded", true);
        // The next create puts the guard back (the shared footprint is checked on create).
        let d = node.topo.add_container(4);
        let d_pid = node.topo.spawn_sleeper(&d.ns);
        assert_ok(
            &node.create("c4", Some(d_pid), &[("io.natledger.ports", "8081:81")]),
            "create c4",
        );
        assert_eq!(
            secrets.attack(&attacker, "upgraded"),
            (false, false),
            "{backend:?}: the next create does not put the guard back"
        );
        let t1 = Instant::now();
        assert!(
            client.wait_for("c2 udp", t1, T).is_some(),
            "{backend:?}: the UDP client stopped getting replies"
        );
        client.stop();
        localhost_path_works(&host, backend, "upgraded");
        let listed = node.natledger(&["list"], "", &[]);
        assert_ok(&listed, "list");
        doctor_on_localhost(&node, "upgraded", false);

        // Removed only by `sweep --all`: poststop and a sweep keep it.
        assert_ok(&node.poststop("c2"), "poststop c2");
        assert_ok(&node.poststop("c4"), "poststop c4");
        assert_ok(&node.sweep(&[]), "sweep");
        assert!(
            node.dump()
                .contains("-A NATLEDGER-INPUT -d 127.0.0.0/8 ! -i lo"),
            "{backend:?}: poststop or sweep removed the guard:\n{}",
            node.dump()
        );
        assert_eq!(secrets.attack(&attacker, "stopped"), (false, false));
        assert_ok(&node.sweep(&["--all"]), "sweep --all");
        assert_eq!(
            node.dump(),
            pristine,
            "{backend:?}: sweep --all leaves the tables as before natledger"
        );
    });
}

//! doctor's localhost-exposed check on a live node, proven with packets: with
//! `route_localnet=1` on the node's bridge, a neighbour on it (an ordinary namespace, no raw
//! sockets, `common::arm`) reaches the node's services bound to 127.0.0.1 exactly when doctor
//! says so. Without any guard: reported and reached; with natledger's guard (written by a
//! create): silent and dropped; with another owner's `-I INPUT -i br0 -j ACCEPT` above the
//! guard's jump: reported, naming that rule, and reached again (iptables backends; on
//! nftables the guard is a drop in natledger's own table, which no other table's accept
//! bypasses: still closed, doctor silent). All three backends. Every sysctl and rule is set
//! inside the test's own namespaces.

use crate::common::*;

fn iptables(node: &str, backend: Backend, args: &[&str]) {
    let tool = iptables_tool(backend, Family::V4);
    let out = run_in(node, tool, args, None);
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn doctor_reports_localhost_open_exactly_when_a_neighbour_reaches_it() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let attacker = node.topo.add_container(3).ns;
        let host = node.topo.node().to_string();
        let secrets = Secrets::bind(&host);
        arm(&attacker);

        // Nothing open yet: nothing to report, and the kernel drops the martians.
        let doc = live(&node, &[]);
        assert!(
            doc.of_kind("localhost-exposed").is_empty(),
            "{}",
            doc.show()
        );
        assert!(
            !secrets.attack_udp(&attacker, "closed"),
            "{backend:?}: closed"
        );

        // route_localnet on br0 and no guard anywhere: open, and doctor says so.
        set_route_localnet(&host, "br0", true);
        let doc = live(&node, &[]);
        let found = doc.of_kind("localhost-exposed");
        assert_eq!(found.len(), 1, "{backend:?}: {}", doc.show());
        let f = found[0];
        assert_eq!(f["severity"], "error", "{}", doc.show());
        let summary = text(f, "summary");
        assert!(
            summary
                .starts_with("Neighbours on br0 can reach this host's services bound to 127.0.0.1")
                && summary.ends_with("There is no guard."),
            "{summary}"
        );
        let fix = text(f, "fix");
        assert!(
            fix.contains("sysctl -w net.ipv4.conf.br0.route_localnet=0")
                && fix.contains("-t filter -I INPUT -d 127.0.0.0/8 ! -i lo -m conntrack"),
            "{fix}"
        );
        assert_eq!(
            secrets.attack(&attacker, "unguarded"),
            (true, true),
            "{backend:?}: doctor reports br0 open but the neighbour does not reach localhost"
        );

        // natledger's guard (any create writes it with the shared chains): closed, silent.
        let pid = node.topo.spawn_sleeper(&c.ns);
        assert_ok(
            &node.create("c2", Some(pid), &[("io.natledger.ports", "8080:80")]),
            "create c2",
        );
        let doc = live(&node, &[]);
        assert!(
            doc.of_kind("localhost-exposed").is_empty(),
            "{backend:?}: {}",
            doc.show()
        );
        assert_eq!(
            secrets.attack(&attacker, "guarded"),
            (false, false),
            "{backend:?}: guarded"
        );

        if backend.is_iptables() {
            another_owners_accept_above_the_guard(&node, &secrets, &attacker);
        } else {
            another_tables_accept_cannot_bypass_the_guard(&node, &secrets, &attacker);
        }
        assert_ok(&node.poststop("c2"), "poststop c2");
        assert_ok(&node.sweep(&["--all"]), "sweep --all");
    });
}

/// iptables: another owner's accept above the guard's jump opens 127.0.0.1 again, and doctor
/// names it; its own fix (the accept moved below the jump) closes it.
fn another_owners_accept_above_the_guard(node: &Node, secrets: &Secrets, attacker: &str) {
    let backend = node.backend;
    let host = node.topo.node().to_string();
    // Another owner's accept above the guard's jump: open again, and named.
    iptables(
        &host,
        backend,
        &["-t", "filter", "-I", "INPUT", "-i", "br0", "-j", "ACCEPT"],
    );
    let doc = live(node, &[]);
    let found = doc.of_kind("localhost-exposed");
    assert_eq!(found.len(), 1, "{backend:?}: {}", doc.show());
    let f = found[0];
    assert_eq!(f["severity"], "error");
    assert_eq!(places(f), [("INPUT".to_string(), 1)], "{}", doc.show());
    assert_eq!(line_of(f, 0), "-A INPUT -i br0 -j ACCEPT");
    assert!(
        text(f, "summary").contains(&format!(
            "natledger's guard is in place in {} but the rule `-A INPUT -i br0 -j ACCEPT` \
             accepts these packets before filter INPUT jumps to NATLEDGER-INPUT.",
            backend.name()
        )),
        "{}",
        doc.show()
    );
    assert!(
        secrets.attack_udp(attacker, "accepted above"),
        "{backend:?}: doctor names the accept above the guard but the neighbour is dropped"
    );

    // Its own fix closes it: the accept moved below the jump.
    iptables(
        &host,
        backend,
        &["-t", "filter", "-D", "INPUT", "-i", "br0", "-j", "ACCEPT"],
    );
    iptables(
        &host,
        backend,
        &["-t", "filter", "-A", "INPUT", "-i", "br0", "-j", "ACCEPT"],
    );
    let doc = live(node, &[]);
    assert!(
        doc.of_kind("localhost-exposed").is_empty(),
        "{}",
        doc.show()
    );
    assert!(!secrets.attack_udp(attacker, "moved"), "{backend:?}: moved");

    iptables(
        &host,
        backend,
        &["-t", "filter", "-D", "INPUT", "-i", "br0", "-j", "ACCEPT"],
    );
}

/// nftables: natledger's guard is a drop in its own base chain, final whatever another table
/// accepts: another owner's `-I INPUT -i br0 -j ACCEPT` (iptables-nft's filter table, as
/// firewalld or Docker write it) leaves 127.0.0.1 closed, and doctor silent.
fn another_tables_accept_cannot_bypass_the_guard(node: &Node, secrets: &Secrets, attacker: &str) {
    let host = node.topo.node();
    let accept = ["-t", "filter", "-I", "INPUT", "-i", "br0", "-j", "ACCEPT"];
    iptables(host, Backend::IptablesNft, &accept);
    let doc = live(node, &[]);
    assert!(
        doc.of_kind("localhost-exposed").is_empty(),
        "nftables, an accept in iptables-nft: {}",
        doc.show()
    );
    assert_eq!(
        secrets.attack(attacker, "accepted in another table"),
        (false, false),
        "nftables: another table's accept bypassed natledger's guard"
    );
    let delete = ["-t", "filter", "-D", "INPUT", "-i", "br0", "-j", "ACCEPT"];
    iptables(host, Backend::IptablesNft, &delete);
}

//! Another owner already forwards the port: create-runtime finds other owners' DNAT and
//! REDIRECT rules for the same host port, protocol and address (Docker's DOCKER chain, CNI
//! portmap, kube-proxy's NodePorts, hand-written), in both backends and both families, and
//! warns naming the rule, or with the refuse policy fails and writes nothing. Real traffic
//! shows what the conflict does, and that a refused start leaves the other owner's port
//! working.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// Docker 20.10's nat rules for `-p 8080:80` to 10.77.0.3 (a container of the test's).
const DOCKER: &str = "*nat\n:DOCKER - [0:0]\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
    -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER\n\
    -A DOCKER -i docker0 -j RETURN\n\
    -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.77.0.3:80\n\
    COMMIT\n";

/// kube-proxy's NodePort 30080/udp, IPv6, through KUBE-SERVICES and KUBE-NODEPORTS.
const KUBE_V6: &str = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
    :KUBE-SVC-X - [0:0]\n:KUBE-SEP-X - [0:0]\n\
    -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
    -A KUBE-SERVICES -d fd96::a/128 -p udp -m udp --dport 53 -j KUBE-SVC-X\n\
    -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
    -A KUBE-NODEPORTS -p udp -m comment --comment \"default/dns\" -m udp --dport 30080 -j KUBE-SVC-X\n\
    -A KUBE-SVC-X -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-X\n\
    -A KUBE-SEP-X -p udp -m udp -j DNAT --to-destination [fd77::3]:53\n\
    COMMIT\n";

/// CNI portmap's hostPort 9000-9001/tcp.
const PORTMAP: &str = "*nat\n:CNI-HOSTPORT-DNAT - [0:0]\n:CNI-DN-0123456789abcdef01234 - [0:0]\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
    -A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"cbr0\\\" id: \\\"abc\\\"\" -m multiport --dports 9000,9001 -j CNI-DN-0123456789abcdef01234\n\
    -A CNI-DN-0123456789abcdef01234 -p tcp -m tcp --dport 9001 -j DNAT --to-destination 10.77.0.3:81\n\
    COMMIT\n";

/// Where Docker's rules go: natledger's own backend, or for its nftables tables (which hold
/// no other owner's rules) iptables-legacy, whose nat chains run after natledger's.
fn same(backend: Backend) -> Backend {
    match backend {
        Backend::OwnNftables => Backend::IptablesLegacy,
        iptables => iptables,
    }
}

fn other(backend: Backend) -> Backend {
    match backend {
        Backend::IptablesLegacy => Backend::IptablesNft,
        Backend::IptablesNft => Backend::IptablesLegacy,
        // natledger's own table: the other owner's forwards are in iptables-nft.
        Backend::OwnNftables => Backend::IptablesNft,
    }
}

fn create_env(node: &Node, id: &str, ports: &str, env: &[(&str, &str)]) -> std::process::Output {
    let bundle = node.bundle(
        id,
        &[
            ("io.natledger.ports", ports),
            ("io.natledger.ip", "10.77.0.2,fd77::2"),
        ],
    );
    node.hook_env("create-runtime", id, None, &bundle, env)
}

#[test]
fn other_owners_forwards_are_named_or_refused() {
    both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        let mine = node.topo.add_container(2);
        let theirs = node.topo.add_container(3);
        let _servers = [
            serve_tcp(&mine.ns, mine.sock_v4(80), "natledger's"),
            serve_tcp(&theirs.ns, theirs.sock_v4(80), "Docker's"),
        ];
        node.warm_up();
        load_rules(&host, same(backend), Family::V4, DOCKER);
        load_rules(&host, other(backend), Family::V6, KUBE_V6);
        load_rules(&host, other(backend), Family::V4, PORTMAP);
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("Docker's")
        );
        let before = node.dump();

        // Refused: nothing written, and Docker's port still answers.
        let refuse = [("NATLEDGER_PORT_CONFLICT", "refuse")];
        let out = create_env(&node, "c1", "8080:80", &refuse);
        assert!(!out.status.success(), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("host port 8080:80/tcp is already forwarded by another owner's rule")
                && err.contains(&format!(
                    "{} ipv4 nat chain DOCKER (rule 2",
                    same(backend).name()
                ))
                && err.contains("-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT"),
            "{err}"
        );
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: a refused start writes nothing"
        );
        assert!(!node.manifest_exists("c1"));
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("Docker's")
        );

        // Warned: the start goes on, and natledger's rule, first in its backend, takes the
        // port from the node: the split the warning is about. Said once the rules are in: on
        // iptables-legacy, of the nat table as natledger swapped it in (no second read).
        let out = create_env(&node, "c1", "8080:80", &[("NATLEDGER_LOG", "debug")]);
        assert_ok(&out, "create with a warning");
        let err = stderr(&out);
        assert_eq!(
            err.contains("candidate(s) read from the table as written"),
            backend == Backend::IptablesLegacy,
            "{err}"
        );
        assert!(
            err.contains("warning: host port 8080:80/tcp is already forwarded"),
            "{err}"
        );
        assert!(err.contains("through PREROUTING -> DOCKER"), "{err}");
        assert_eq!(
            tcp_request(&host, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("natledger's")
        );
        assert_ok(&node.poststop("c1"), "poststop");

        // The other backend, the other family, a multiport path; and ports nobody forwards.
        let out = create_env(&node, "c2", "30080:53/udp,9001:81,9002:82", &refuse);
        let err = stderr(&out);
        assert!(!out.status.success(), "{err}");
        let out = create_env(&node, "c2", "30080:53/udp,9001:81,9002:82", &[]);
        assert_ok(&out, "create c2");
        let err = stderr(&out);
        let other = other(backend).name();
        assert!(
            err.contains(&format!("{other} ipv6 nat chain KUBE-SEP-X (rule 1, reached through PREROUTING -> KUBE-SERVICES -> KUBE-NODEPORTS -> KUBE-SVC-X -> KUBE-SEP-X)")),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "{other} ipv4 nat chain CNI-DN-0123456789abcdef01234 (rule 1"
            )),
            "{err}"
        );
        assert_eq!(err.matches("is already forwarded").count(), 2, "{err}");
        assert_ok(&node.poststop("c2"), "poststop c2");
        let out = create_env(&node, "c3", "8081:80,30081:53/udp", &refuse);
        assert_ok(&out, "no conflict");
        assert!(!stderr(&out).contains("forwarded"), "{}", stderr(&out));
        assert_ok(&node.poststop("c3"), "poststop c3");
    });
}

/// iptables-nft's candidates are kept while the nf_tables generation holds: natledger's own
/// create and poststop keep them valid, anyone else's change makes the next create read the
/// table again, and a rule added meanwhile is found.
#[test]
fn the_nft_cache_holds_until_someone_else_writes() {
    let node = Node::new(Backend::IptablesNft);
    let host = node.topo.node().to_string();
    node.warm_up();
    load_rules(&host, Backend::IptablesNft, Family::V4, DOCKER);
    let trace = [("NATLEDGER_TRACE", "1")];
    let out = create_env(&node, "c1", "8081:80", &trace);
    assert_ok(&out, "c1");
    assert!(
        stderr(&out).contains("nft ipv4: 2 candidate(s) read over netlink"),
        "{}",
        stderr(&out)
    );
    assert_ok(&node.poststop("c1"), "poststop c1");
    let out = create_env(&node, "c2", "8082:80", &trace);
    assert_ok(&out, "c2");
    assert!(
        stderr(&out).contains("nft ipv4: 2 candidate(s) from the cache"),
        "{}",
        stderr(&out)
    );
    // Someone else's change.
    load_rules(
        &host,
        Backend::IptablesNft,
        Family::V4,
        "*nat\n-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8083 -j DNAT --to-destination 10.77.0.3:80\nCOMMIT\n",
    );
    let out = create_env(&node, "c3", "8083:80", &trace);
    assert_ok(&out, "c3");
    let err = stderr(&out);
    assert!(
        err.contains("nft ipv4: 4 candidate(s) read over netlink"),
        "{err}"
    );
    assert!(err.contains("--dport 8083 -j DNAT"), "{err}");
}

//! `natledger doctor` on live firewalls in private network namespaces: a clean host, a
//! shadowed DNAT, a dead target, `--port`. Doctor reads the live tables of the namespace it runs
//! in and the listeners from `/proc/thread-self/net`, so it always runs inside the node
//! namespace. The other finding types live in the `live_*` modules beside this one.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// A clean namespace, then a healthy host with several owners' rules, a live natledger
/// container and an unforwarded listener: no finding.
#[test]
fn live_clean_namespace_has_no_findings() {
    let node = Node::new(Backend::IptablesNft);
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    assert_eq!(d.report["complete"], true);
    // A healthy host with rules of several owners, a live container forwarded by natledger,
    // and a process listening on a port nobody forwards: still nothing.
    let mut node = node;
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "web");
    load_rules(
        node.topo.node(),
        Backend::IptablesNft,
        Family::V4,
        "*nat\n:DOCKER - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
         -A DOCKER -i docker0 -j RETURN\n\
         -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8088 -j DNAT --to-destination 10.77.0.2:80\n\
         COMMIT\n*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n",
    );
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("healthy", Some(pid), &[("io.natledger.ports", "8081:80")]);
    let _sshd = httpd_v4(&node, 2222);
    let d = live(&node, &[]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 0),
        "{}\n{}",
        d.show(),
        node.dump()
    );
    assert!(
        d.report["rules_read"].as_u64().unwrap() >= 5,
        "{}",
        d.show()
    );
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 8081), T)
            .ok()
            .as_deref(),
        Some("web")
    );
}

/// Seed 000 live, both iptables backends: two DNATs for one port; the first (to a container that no
/// longer serves) takes the packets meant for the second.
#[test]
fn live_shadowed_dnat() {
    // Foreign iptables rules and doctor's analysis of iptables dumps: iptables backends only.
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let _old = node.topo.add_container(2);
        let new = node.topo.add_container(3);
        let _server = serve_tcp(&new.ns, new.sock_v4(6667), "live sandbox");
        load_rules(
            node.topo.node(),
            backend,
            Family::V4,
            "*nat\n\
             -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 6667 -j DNAT --to-destination 10.77.0.2:6667\n\
             -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 6667 -j DNAT --to-destination 10.77.0.3:6667\n\
             COMMIT\n",
        );
        // The seed's symptom: the port is closed although the live sandbox serves.
        let reply = tcp_request(node.topo.ext(), sock(NODE_V4, 6667), T);
        assert!(reply.is_err(), "{reply:?}");
        let d = live(&node, &[]);
        assert_eq!(d.code, 2, "{}", d.show());
        let f = d.of_kind("shadowed");
        assert_eq!(f.len(), 1, "{}", d.show());
        let f = f[0];
        assert_eq!(
            places(f),
            [("PREROUTING".into(), 1), ("PREROUTING".into(), 2)]
        );
        assert_eq!(
            (f["severity"].as_str(), f["port"].as_u64()),
            (Some("error"), Some(6667))
        );
        assert_eq!(f["rules"][0]["backend"], backend.name());
        assert!(
            line_of(f, 0).contains("10.77.0.2:6667") && line_of(f, 1).contains("10.77.0.3:6667")
        );
        assert!(
            text(f, "fix")
                .starts_with(&format!("iptables-{} -t nat -D PREROUTING", backend.name()))
        );
        // Only the shadow: both addresses are on the bridge, nothing else is wrong (but in
        // the backend this host's `iptables` does not use, the rules are named as such too).
        let unused = natledger::backend::detect(natledger::kernel::host_root::Lookup(None))
            .to_string()
            != backend.name();
        let split = d.of_kind("split-backends").len();
        assert_eq!(split, usize::from(unused), "{}", d.show());
        assert_eq!(d.findings().len(), 1 + split, "{}", d.show());
        let d = live(&node, &["--port", "6668"]);
        assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    });
}

/// A DNAT to an address with no route in the node namespace is a dead target (with the
/// routes as evidence); one to a live container on the bridge is not.
#[test]
fn live_dead_target() {
    let mut node = Node::new(Backend::IptablesNft);
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "alive");
    load_rules(
        node.topo.node(),
        Backend::IptablesNft,
        Family::V4,
        "*nat\n\
         -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 7001 -j DNAT --to-destination 10.99.0.5:80\n\
         -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 7002 -j DNAT --to-destination 10.77.0.2:80\n\
         COMMIT\n",
    );
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 7002), T)
            .ok()
            .as_deref(),
        Some("alive")
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let dead = d.of_kind("dead-target");
    assert_eq!(dead.len(), 1, "only 10.99.0.5 is dead\n{}", d.show());
    let f = dead[0];
    assert_eq!(
        (f["severity"].as_str(), f["port"].as_u64()),
        (Some("error"), Some(7001))
    );
    assert_eq!(places(f), [("PREROUTING".into(), 1)]);
    assert!(text(f, "summary").contains("10.99.0.5"), "{f}");
    assert!(text(f, "evidence").contains("route"), "{f}");
    assert!(
        text(f, "fix").starts_with("iptables-nft -t nat -D PREROUTING"),
        "{f}"
    );
    assert_eq!(d.findings().len(), 1, "{}", d.show());
}

/// Findings come worst first, and `--port` keeps only that port's.
#[test]
fn live_port_filter_and_worst_first() {
    let mut node = Node::new(Backend::IptablesNft);
    let _c = node.topo.add_container(2);
    load_rules(
        node.topo.node(),
        Backend::IptablesNft,
        Family::V4,
        "*nat\n\
         -A PREROUTING -p tcp -m tcp --dport 7101 -j DNAT --to-destination 10.99.0.5:80\n\
         -A PREROUTING -p udp -m udp --dport 7102 -j DNAT --to-destination 10.77.0.2:80\n\
         -A PREROUTING -p udp -m udp --dport 7102 -j DNAT --to-destination 10.77.0.2:80\n\
         COMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let order: Vec<(String, u64)> = d
        .findings()
        .iter()
        .map(|f| (text(f, "severity"), f["port"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        order,
        [("error".to_string(), 7101), ("info".to_string(), 7102)],
        "{}",
        d.show()
    );
    let d = live(&node, &["--port", "7102"]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 1),
        "a note only\n{}",
        d.show()
    );
    assert_eq!(d.findings()[0]["protocol"], "udp");
}

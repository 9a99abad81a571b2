//! `natledger doctor` on live firewalls in private network namespaces, one test per finding
//! type. Doctor reads the live tables of the namespace it runs in and the listeners from
//! `/proc/thread-self/net`, so it always runs inside the node namespace.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(3);

#[test]
fn live_clean_namespace_has_no_findings() {
    let node = Node::new(Backend::Nft);
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
        Backend::Nft,
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

/// Seed 000 live, both backends: two DNATs for one port; the first (to a container that no
/// longer serves) takes the packets meant for the second.
#[test]
fn live_shadowed_dnat() {
    both(|backend| {
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
        // Only the shadow: both addresses are on the bridge, nothing else is wrong.
        assert_eq!(d.findings().len(), 1, "{}", d.show());
        let d = live(&node, &["--port", "6668"]);
        assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    });
}

/// A DNAT to an address with no route in the node namespace is a dead target (with the
/// routes as evidence); one to a live container on the bridge is not.
#[test]
fn live_dead_target() {
    let mut node = Node::new(Backend::Nft);
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "alive");
    load_rules(
        node.topo.node(),
        Backend::Nft,
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

/// Seed 003 live: kube-proxy's NodePort DNAT in nat PREROUTING/OUTPUT for 30080 while a
/// non-Kubernetes process listens on 30080 (IPv4): its traffic goes to the pod.
#[test]
fn live_seed003_nodeport_hijacks_a_listener() {
    let mut node = Node::new(Backend::Nft);
    let pod = node.topo.add_container(2);
    let _pod = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    load_fixture(
        &node,
        Backend::Nft,
        Family::V4,
        "seed003_kube_nodeport.nft.txt",
    );
    let local = httpd_v4(&node, 30080);
    // The seed's observation: requests to the node port reach the pod, not the process.
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 30080), T)
            .ok()
            .as_deref(),
        Some("pod")
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let f = d.of_kind("hijacked-listener");
    assert_eq!(f.len(), 1, "{}", d.show());
    let f = f[0];
    assert_eq!(
        (
            f["severity"].as_str(),
            f["port"].as_u64(),
            f["protocol"].as_str()
        ),
        (Some("error"), Some(30080), Some("tcp"))
    );
    let summary = text(f, "summary");
    assert!(
        summary.contains(&format!("busybox (pid {})", local.pid())),
        "{summary}"
    );
    assert_eq!(places(f), [("KUBE-SEP-QXDNOBCCLOXLV7LV".into(), 2)]);
    assert!(
        line_of(f, 0).ends_with("-j DNAT --to-destination 10.77.0.2:80"),
        "{f}"
    );
    assert_eq!(
        (
            f["rules"][0]["table"].as_str(),
            f["rules"][0]["backend"].as_str()
        ),
        (Some("nat"), Some("nft"))
    );
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    // With the listener gone, nothing is hijacked.
    drop(local);
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
}

/// Seed 003 with a dual-stack listener (`[::]:30080` without IPV6_V6ONLY: busybox nc, Go's
/// `net.Listen(":port")`, Python 3's http.server): it receives IPv4 too, so the IPv4 NodePort
/// DNAT hijacks it just the same.
#[test]
fn live_seed003_nodeport_hijacks_a_dual_stack_listener() {
    let mut node = Node::new(Backend::Nft);
    let pod = node.topo.add_container(2);
    let _pod = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    load_fixture(
        &node,
        Backend::Nft,
        Family::V4,
        "seed003_kube_nodeport.nft.txt",
    );
    let local = listener(
        node.topo.node(),
        &["busybox", "nc", "-l", "-p", "30080"],
        30080,
    );
    let d = live(&node, &[]);
    let f = d.of_kind("hijacked-listener");
    assert_eq!(f.len(), 1, "{}", d.show());
    assert_eq!(f[0]["severity"], "error", "{}", d.show());
    assert!(
        text(f[0], "summary").contains(&format!("(pid {})", local.pid())),
        "{}",
        d.show()
    );
    assert_eq!(places(f[0]), [("KUBE-SEP-QXDNOBCCLOXLV7LV".into(), 2)]);
}

/// Seed 003 with two endpoints: kube-proxy picks one at random, but every packet is DNATed
/// to one of them, so the listener gets none: all of its traffic is taken (an error).
#[test]
fn live_seed003_two_endpoints_take_all_traffic() {
    let mut node = Node::new(Backend::Nft);
    load_fixture(
        &node,
        Backend::Nft,
        Family::V4,
        "seed003_kube_nodeport_two_endpoints.nft.txt",
    );
    let _a = node.topo.add_container(2);
    let _b = node.topo.add_container(3);
    let _local = httpd_v4(&node, 30081);
    let d = live(&node, &[]);
    let f = d.of_kind("hijacked-listener");
    assert!(!f.is_empty(), "{}", d.show());
    assert!(f.iter().all(|f| f["port"] == 30081), "{}", d.show());
    assert_eq!(
        d.code,
        2,
        "all of 30081's traffic is DNATed away\n{}",
        d.show()
    );
}

/// A node with `fixture` loaded and a busybox httpd listening on `port`, whose connections
/// from outside are refused; doctor's report and its one hijacked-listener finding.
fn refused_listener(fixture: &str, port: u16) -> (Node, Proc, Doc) {
    let node = Node::new(Backend::Nft);
    load_fixture(&node, Backend::Nft, Family::V4, fixture);
    let local = httpd_v4(&node, port);
    let refused = tcp_request(node.topo.ext(), sock(NODE_V4, port), T);
    assert_eq!(
        refused.as_ref().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    let d = live(&node, &[]);
    let f = d.of_kind("hijacked-listener");
    assert_eq!(f.len(), 1, "{}", d.show());
    assert_eq!(
        (f[0]["severity"].as_str(), f[0]["port"].as_u64()),
        (Some("error"), Some(u64::from(port))),
        "every connection is refused\n{}",
        d.show()
    );
    assert!(
        text(f[0], "summary").contains(&format!("busybox (pid {})", local.pid())),
        "{}",
        d.show()
    );
    (node, local, d)
}

/// Seed 004 live: filter INPUT rejects tcp/8080 while a local process listens on 8080:
/// connections are refused although it listens.
#[test]
fn live_seed004_reject_hijacks_a_listener() {
    let (_node, _local, d) = refused_listener("seed004_nodeport_reject.nft.txt", 8080);
    assert_eq!(d.code, 2, "{}", d.show());
    let f = d.of_kind("hijacked-listener")[0];
    assert_eq!(f["rules"][0]["table"], "filter");
    assert_eq!(places(f), [("INPUT".into(), 1)]);
    assert!(line_of(f, 0).contains("--dport 8080 -j REJECT"), "{f}");
    assert!(
        text(f, "fix").starts_with("iptables-nft -t filter -D INPUT"),
        "{f}"
    );
    assert_eq!(d.findings().len(), 1, "{}", d.show());
}

/// Seed 004 as kube-proxy writes it: INPUT `-m conntrack --ctstate NEW` jumps to
/// KUBE-EXTERNAL-SERVICES, which REJECTs the NodePort with no endpoints. Every TCP
/// connection starts NEW, so every connection is refused: an error, as with the plain rule.
#[test]
fn live_seed004_kube_external_services_reject() {
    let (_node, _local, d) = refused_listener("seed004_kube_external_services.nft.txt", 30584);
    let f = d.of_kind("hijacked-listener")[0];
    assert_eq!(places(f), [("KUBE-EXTERNAL-SERVICES".into(), 1)]);
}

/// Split backends: KUBE- rules in both iptables-legacy and iptables-nft of the namespace;
/// AZURE-NPM only in legacy (not split).
#[test]
fn live_split_backends() {
    let node = Node::new(Backend::Nft);
    let kube = "*filter\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n\
        -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n\
        COMMIT\n";
    load_rules(node.topo.node(), Backend::Nft, Family::V4, kube);
    let d = live(&node, &[]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 0),
        "one backend only\n{}",
        d.show()
    );
    load_rules(node.topo.node(), Backend::Legacy, Family::V4, kube);
    load_rules(
        node.topo.node(),
        Backend::Legacy,
        Family::V4,
        "*filter\n:AZURE-NPM - [0:0]\n-A AZURE-NPM -m mark --mark 0x4000 -j DROP\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 1, "{}", d.show());
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 1, "{}", d.show());
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    let f = split[0];
    assert!(text(f, "summary").contains("KUBE"), "{f}");
    let evidence = text(f, "evidence");
    assert!(
        evidence.contains("ipv4/filter KUBE-FIREWALL") && evidence.contains("ipv4/filter INPUT"),
        "{evidence}"
    );
    let sources = d.report["sources"].to_string();
    assert!(
        sources.contains("legacy/ipv4 (live)") && sources.contains("nft/ipv4 (live)"),
        "{sources}"
    );
}

/// natledger's own state: a live container's rules are fine; once its process dies the
/// manifest is dead (a warning, fixed by `natledger sweep`); after sweep, nothing.
#[test]
fn live_natledger_dead_manifest() {
    let mut node = Node::new(Backend::Nft);
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
    let mut node = Node::new(Backend::Nft);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("live", Some(pid), &[("io.natledger.ports", "8083:80")]);
    let nat = save(node.topo.node(), Backend::Nft, Family::V4);
    let dnat = nat
        .lines()
        .find(|l| {
            l.starts_with("-A NATLEDGER-HOSTPORTS")
                && l.contains("natledger:live")
                && l.contains("DNAT")
        })
        .unwrap_or_else(|| panic!("no DNAT of live:\n{nat}"));
    let mut args: Vec<String> = vec!["-t".into(), "nat".into(), "-D".into()];
    args.extend(natledger::save::tokenize(&dnat[3..]).unwrap());
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
    let node = Node::new(Backend::Nft);
    node.warm_up();
    load_rules(
        node.topo.node(),
        Backend::Nft,
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
        Backend::Nft,
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

/// Seed 002 live, in-process with injected evidence roots (the CLI always reads the host's):
/// the node's legacy tables hold the seed's rules, both pod addresses are on the node's pod
/// network, CNI IPAM reserves the live pod's address for its container, which runs (a runc
/// state file with a live pid); nothing reserves the stale pod's. Returns doctor's report.
fn seed002_live_report() -> Doc {
    use natledger::doctor::{self as nl, DoctorOptions, evidence::Roots};
    let mut node = Node::new(Backend::Nft);
    load_fixture(
        &node,
        Backend::Legacy,
        Family::V4,
        "seed002_cni_portmap_stale.legacy.txt",
    );
    let ns = node.topo.node().to_string();
    let pod_pid = node.topo.spawn_sleeper(&ns);
    let out = run_in(
        &ns,
        "ip",
        &["addr", "add", "10.187.2.1/24", "dev", BRIDGE],
        None,
    );
    assert_ok(&out, "ip addr add");
    let live_id = "0961bad27f1a52a28701b7038120b8188e7a78df21f57a08428f021ab3c071e2";
    let tmp = tempfile::tempdir().unwrap();
    let cni = tmp.path().join("cni/networks/cbr0");
    std::fs::create_dir_all(&cni).unwrap();
    std::fs::write(cni.join("10.187.2.34"), format!("{live_id}\neth0")).unwrap();
    std::fs::write(cni.join("last_reserved_ip.0"), "10.187.2.34").unwrap();
    let state = tmp.path().join("run/containerd/runc/k8s.io").join(live_id);
    std::fs::create_dir_all(&state).unwrap();
    let json = format!(r#"{{"id":"{live_id}","init_process_pid":{pod_pid}}}"#);
    std::fs::write(state.join("state.json"), json).unwrap();
    let roots = Roots {
        cni_networks: tmp.path().join("cni/networks"),
        runtime_state: vec![tmp.path().join("run/containerd/runc")],
        ..Roots::default()
    };
    let ledger_dir = tmp.path().join("state");
    let report = in_netns(&ns, move || {
        let runner = natledger::exec::SystemRunner::default();
        let opts = DoctorOptions {
            from: Vec::new(),
            port: None,
            ledger: natledger::ledger::Ledger::new(ledger_dir),
            netfilter: natledger::backend::Netfilter::new(&runner),
            host_backend: natledger::backend::Backend::Nft,
            roots,
        };
        nl::doctor(&opts).map(|r| (r.exit_code(), serde_json::to_value(&r).unwrap()))
    });
    let (code, report) = report.expect("doctor");
    let d = Doc {
        code: code.into(),
        report,
        stdout: String::new(),
        stderr: String::new(),
    };
    d.check_schema();
    d
}

/// Seed 002 live: the stale DNATs are dead targets on CNI IPAM's word; the live ones not.
#[test]
fn live_seed002_cni_ipam_evidence() {
    let d = seed002_live_report();
    assert_eq!(d.code, 2, "{}", d.show());
    assert_eq!(d.of_kind("shadowed").len(), 4, "{}", d.show());
    let dead = d.of_kind("dead-target");
    assert_eq!(
        dead.len(),
        4,
        "the stale pod's four DNATs, not the live pod's\n{}",
        d.show()
    );
    for f in &dead {
        assert_eq!(places(f)[0].0, STALE_DN, "{f}");
        assert_eq!(f["severity"], "error", "{f}");
        let evidence = text(f, "evidence");
        assert!(
            evidence.contains("CNI IPAM") && evidence.contains("10.187.2.36"),
            "{evidence}"
        );
    }
    assert_eq!(d.findings().len(), 8, "{}", d.show());
}

/// Seed 002 live: the stale pod's container id is in the comment of portmap's jump to its
/// CNI-DN chain (not on the DNAT itself); checked against the runtime's state it is not
/// running, which doctor should cite (the issue: "the container ids in rule comments
/// (portmap, ...) checked against running containers").
#[test]
fn live_seed002_portmap_comment_id_is_evidence() {
    let d = seed002_live_report();
    let dead = d.of_kind("dead-target");
    assert!(!dead.is_empty(), "{}", d.show());
    for f in dead {
        let evidence = text(f, "evidence");
        assert!(
            evidence.contains("runtime state") && evidence.contains("fb7cdb0a4f8d"),
            "no runtime evidence for the stale pod's id:\n{evidence}"
        );
    }
}

#[test]
fn live_port_filter_and_worst_first() {
    let mut node = Node::new(Backend::Nft);
    let _c = node.topo.add_container(2);
    load_rules(
        node.topo.node(),
        Backend::Nft,
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

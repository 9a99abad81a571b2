//! The hooks end to end: the real `natledger` binary against real iptables-legacy,
//! iptables-nft and its own nftables tables inside private network namespaces, proven with
//! real TCP and UDP traffic and full dumps (`*-save` and `nft list ruleset`) compared before
//! and after.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// Every path of the issue, TCP and UDP: external client, the node through 127.0.0.1 and
/// through its own address, and the container reaching itself (hairpin); IPv4 and IPv6.
/// Addresses are found inside the container's network namespace (no io.natledger.ip).
#[test]
fn forwards_every_path_and_poststop_restores_the_tables() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp"),
            serve_udp(&c.ns, c.sock_v4(80), "c2 udp"),
            serve_tcp(&c.ns, c.sock_v6(80), "c2 tcp6"),
            serve_udp(&c.ns, c.sock_v6(80), "c2 udp6"),
        ];
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.warm_up();
        let before = node.dump();

        node.create(
            "c2",
            Some(pid),
            &[("io.natledger.ports", "8080:80,8080:80/udp")],
        );
        let ext = node.topo.ext().to_string();
        let host = node.topo.node().to_string();
        let paths: [(&str, &str, SocketAddr); 5] = [
            ("external", &ext, sock(NODE_V4, 8080)),
            ("external v6", &ext, sock(NODE_V6, 8080)),
            ("node localhost", &host, sock(LOCALHOST, 8080)),
            ("node ip", &host, sock(NODE_V4, 8080)),
            ("node ip v6", &host, sock(NODE_V6, 8080)),
        ];
        let hairpin: [(&str, &str, SocketAddr); 2] = [
            ("hairpin", &c.ns, sock(NODE_V4, 8080)),
            ("hairpin v6", &c.ns, sock(NODE_V6, 8080)),
        ];
        for (what, ns, dst) in paths.iter().chain(hairpin.iter()) {
            let v6 = if dst.is_ipv6() { "6" } else { "" };
            let tcp = tcp_request(ns, *dst, T);
            assert_eq!(
                tcp.ok().as_deref(),
                Some(format!("c2 tcp{v6}").as_str()),
                "{backend:?} {what} tcp"
            );
            let udp = udp_request(ns, *dst, T);
            assert_eq!(
                udp.ok().as_deref(),
                Some(format!("c2 udp{v6}").as_str()),
                "{backend:?} {what} udp"
            );
        }

        assert_ok(&node.poststop("c2"), "poststop");
        assert!(!node.manifest_exists("c2"));
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: poststop leaves every table as it was"
        );
        for (what, ns, dst) in &paths {
            assert!(
                tcp_request(ns, *dst, T).is_err(),
                "{backend:?} {what}: still forwarded"
            );
        }
        // Idempotent: a second poststop succeeds and changes nothing.
        assert_ok(&node.poststop("c2"), "second poststop");
        assert_eq!(node.dump(), before);
    });
}

/// Mappings restricted to a host address and port ranges, TCP and UDP, IPv4 and IPv6, answer
/// only where asked; poststop restores the dumps; both backends.
#[test]
fn host_ip_restrictions_and_port_ranges() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _servers: Vec<Server> = (80..=82)
            .flat_map(|p| {
                [
                    serve_tcp(&c.ns, c.sock_v4(p), &p.to_string()),
                    serve_udp(&c.ns, c.sock_v6(p), &format!("{p}/6")),
                ]
            })
            .collect();
        let ext = node.topo.ext().to_string();
        let host = node.topo.node().to_string();
        let ip = ("io.natledger.ip", "10.77.0.2,fd77::2");
        let shifted = "10.78.0.1:8081:80,9000-9002:80-82,[fd78::1]:8082:81/udp";
        // nf_tables' nat has no port offset: a shifted range is refused, cleanly, and an
        // equal range is forwarded instead.
        let (spec, range) = if backend.is_iptables() {
            (shifted, [9000, 9001, 9002])
        } else {
            let before = node.dump();
            let bundle = node.bundle("c2", &[("io.natledger.ports", shifted), ip]);
            let refused = node.hook("create-runtime", "c2", None, &bundle);
            let err = stderr(&refused);
            assert!(!refused.status.success(), "a shifted range was accepted");
            assert!(
                err.contains("host ports 9000-9002 cannot be forwarded to container ports 80-82 with nftables"),
                "{err}"
            );
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            assert!(!node.manifest_exists("c2"));
            assert_eq!(node.dump(), before, "a refused create changes nothing");
            (
                "10.78.0.1:8081:80,80-82:80-82,[fd78::1]:8082:81/udp",
                [80, 81, 82],
            )
        };
        node.create("c2", None, &[("io.natledger.ports", spec), ip]);
        assert_eq!(tcp_request(&ext, sock(NODE_V4, 8081), T).unwrap(), "80");
        assert!(
            tcp_request(&host, sock(LOCALHOST, 8081), T).is_err(),
            "{backend:?}: a mapping bound to 10.78.0.1 must not answer on 127.0.0.1"
        );
        for (host_port, reply) in range.into_iter().zip(["80", "81", "82"]) {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, host_port), T).unwrap(),
                reply,
                "{backend:?} range"
            );
        }
        assert_eq!(udp_request(&ext, sock(NODE_V6, 8082), T).unwrap(), "81/6");
        assert!(
            udp_request(&ext, sock(NODE_V6, 8081), T).is_err(),
            "8081 is IPv4-only"
        );
        assert_ok(&node.poststop("c2"), "poststop");
        assert!(!node.dump().contains("natledger:c2"));
    });
}

/// This kernel has no SCTP sockets: SCTP is proven at the rule level.
#[test]
fn sctp_rules_are_installed_and_removed() {
    both(|backend| {
        let node = Node::new(backend);
        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "7000:7001/sctp"),
                ("io.natledger.ip", "10.77.0.2"),
            ],
        );
        let dump = node.dump();
        let dnat = if backend.is_iptables() {
            "-A NATLEDGER-HOSTPORTS -p sctp -m sctp --dport 7000 -m comment --comment \"natledger:c2\" -j DNAT --to-destination 10.77.0.2:7001"
        } else {
            "sctp dport 7000 dnat to 10.77.0.2:7001 comment \"natledger:c2\""
        };
        assert_eq!(
            chain_rules(&dump, backend, Family::V4, "NATLEDGER-HOSTPORTS"),
            [dnat],
            "{dump}"
        );
        assert_ok(&node.poststop("c2"), "poststop");
        assert!(!node.dump().contains("sctp"));
    });
}

/// A live holder of a host port refuses a second container; once it is dead (killed, no
/// poststop), its rules are removed and the newest container answers.
#[test]
fn newest_container_wins_and_live_claims_are_refused() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let _s2 = serve_tcp(&c2.ns, c2.sock_v4(80), "c2");
        let _s3 = serve_tcp(&c3.ns, c3.sock_v4(80), "c3");
        let ext = node.topo.ext().to_string();
        let pid2 = node.topo.spawn_sleeper(&c2.ns);
        let pid3 = node.topo.spawn_sleeper(&c3.ns);
        let ports = ("io.natledger.ports", "8080:80");
        node.create("c2", Some(pid2), &[ports]);
        assert_eq!(tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap(), "c2");

        let before = node.dump();
        let bundle = node.bundle("c3", &[ports]);
        let refused = node.hook("create-runtime", "c3", Some(pid3), &bundle);
        assert!(!refused.status.success());
        let err = stderr(&refused);
        assert!(err.contains("held by live container c2"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(!node.manifest_exists("c3"));
        assert_eq!(node.dump(), before, "a refused create changes nothing");

        // Same id from another runtime (another live pid): refused, c2's rules untouched.
        let other = ("io.natledger.ports", "8090:80");
        let bundle = node.bundle("c2-other", &[other]);
        let state =
            serde_json::json!({"id": "c2", "status": "creating", "pid": pid3, "bundle": bundle});
        let refused = node.natledger(&["hook", "create-runtime"], &state.to_string(), &[]);
        assert!(
            stderr(&refused).contains("already uses the id c2"),
            "{}",
            stderr(&refused)
        );
        assert_eq!(node.dump(), before);

        kill_pid(pid2); // c2 dies without poststop
        let out = node.create("c3", Some(pid3), &[ports]);
        // IPv4: DNAT, two masquerades (hairpin, 127.0.0.1) and, on iptables, the forward
        // accept; IPv6 the same without the 127.0.0.1 masquerade.
        let removed = if backend.is_iptables() { 7 } else { 5 };
        assert!(
            stderr(&out).contains(&format!("removed {removed} rule(s) of container c2")),
            "{}",
            stderr(&out)
        );
        assert_eq!(tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap(), "c3");
        assert!(!node.manifest_exists("c2"));
        assert!(!node.dump().contains("natledger:c2"));
        assert_ok(&node.poststop("c3"), "poststop");
    });
}

/// poststop deletes only what natledger wrote: rules of other owners that look alike (same
/// port, same target, a comment naming the container, a chain with a similar name) stay.
/// Without a manifest it removes the rules tagged with the container id.
#[test]
fn poststop_never_touches_look_alikes_and_works_without_a_manifest() {
    both(|backend| {
        let node = Node::new(backend);
        node.warm_up();
        let look_alikes = "*nat\n:DOCKER - [0:0]\n:NATLEDGERISH - [0:0]\n\
            -A PREROUTING -p tcp -m tcp --dport 8080 -m comment --comment \"natledger:c2\" -j DNAT --to-destination 10.77.0.2:80\n\
            -A DOCKER -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.77.0.2:80\n\
            -A POSTROUTING -s 10.77.0.2/32 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -j MASQUERADE\n\
            -A NATLEDGERISH -p tcp -m tcp --dport 8080 -m multiport --dports 8080 -m comment --comment \"natledger:c2\" -j DNAT --to-destination 10.77.0.2:80\n\
            COMMIT\n";
        for b in Backend::IPTABLES {
            load_rules(node.topo.node(), b, Family::V4, look_alikes);
        }
        load_nft(node.topo.node(), NFT_LOOK_ALIKES);
        let before = node.dump();
        let annotations = [
            ("io.natledger.ports", "8080:80"),
            ("io.natledger.ip", "10.77.0.2"),
        ];

        node.create("c2", None, &annotations);
        assert_ok(&node.poststop("c2"), "poststop");
        assert_eq!(node.dump(), before, "{backend:?}: look-alikes untouched");

        // Manifest lost (e.g. a state dir wiped): the tags still find natledger's rules.
        node.create("c2", None, &annotations);
        std::fs::remove_file(node.state_dir().join("containers/c2.json")).unwrap();
        assert_ok(&node.poststop("c2"), "poststop without manifest");
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: tagged rules removed without a manifest"
        );

        // A create that never ran: nothing to do, success.
        node.bundle("never", &annotations);
        assert_ok(
            &node.poststop("never"),
            "poststop of a create that never ran",
        );
        assert_eq!(node.dump(), before);
    });
}

/// Rules removed behind natledger's back (half-done teardown by hand) do not fail poststop:
/// the exact delete fails as a whole, natledger reads the table and deletes what is left.
#[test]
fn poststop_copes_with_rules_already_gone() {
    both(|backend| {
        let node = Node::new(backend);
        node.warm_up();
        let before = node.dump();
        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "8080:80"),
                ("io.natledger.ip", "10.77.0.2"),
            ],
        );
        if backend.is_iptables() {
            let masq = "*nat\n-F NATLEDGER-MASQ\nCOMMIT\n";
            load_rules(node.topo.node(), backend, Family::V4, masq);
        } else {
            load_nft(
                node.topo.node(),
                "flush chain ip natledger NATLEDGER-MASQ\n",
            );
        }
        let out = node.poststop("c2");
        assert_ok(&out, "poststop");
        assert_eq!(node.dump(), before);
    });
}

/// Containers without io.natledger.ports cost nothing: no process is started.
#[test]
fn containers_without_the_annotation_start_no_process() {
    let node = Node::new(Backend::IptablesNft);
    let bundle = node.bundle("plain", &[("other", "x")]);
    for (stage, status) in [("create-runtime", "creating"), ("poststop", "stopped")] {
        let state =
            serde_json::json!({"id": "plain", "status": status, "pid": 1, "bundle": bundle});
        let out = node.natledger(&["hook"], &state.to_string(), &[("NATLEDGER_TRACE", "1")]);
        assert_ok(&out, stage);
        // With the trace on, natledger prints every process it starts, and its peak memory.
        let err = stderr(&out);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{stage} ran something: {err}");
        assert!(lines[0].starts_with("natledger: peak rss "), "{err}");
    }
    assert!(!node.manifest_exists("plain"));
}

/// 32 hooks at once, then 32 poststops at once: nothing lost, nothing duplicated, nothing left.
#[test]
fn parallel_hooks_lose_nothing() {
    both(|backend| {
        let node = Node::new(backend);
        node.warm_up();
        let before = node.dump();
        let ids: Vec<String> = (1..=32).map(|i| format!("p{i}")).collect();
        std::thread::scope(|s| {
            for (i, id) in ids.iter().enumerate() {
                let node = &node;
                s.spawn(move || {
                    let ports = format!("{}:80", 10_000 + i);
                    let ip = format!("10.77.1.{}", i + 1);
                    node.create(
                        id,
                        None,
                        &[("io.natledger.ports", &ports), ("io.natledger.ip", &ip)],
                    );
                });
            }
        });
        let dump = node.dump();
        // DNAT, two masquerades and, on iptables, the forward accept.
        let (tagged, dport) = if backend.is_iptables() {
            (4, "--dport")
        } else {
            (3, "tcp dport")
        };
        for (i, id) in ids.iter().enumerate() {
            let tag = format!("\"natledger:{id}\"");
            assert_eq!(dump.matches(&tag).count(), tagged, "{backend:?} {id}");
            assert!(dump.contains(&format!("{dport} {} ", 10_000 + i)));
        }
        let listed = node.natledger(&["list", "--json"], "", &[]);
        let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        assert_eq!(listed.as_array().unwrap().len(), 32);

        std::thread::scope(|s| {
            for id in &ids {
                let node = &node;
                s.spawn(move || assert_ok(&node.poststop(id), id));
            }
        });
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: 32 parallel create+poststop leave nothing"
        );
    });
}

/// Every kind of bad input: one line on stderr naming the problem, non-zero exit, no rule
/// and no manifest left.
#[test]
fn bad_input_is_refused_cleanly() {
    let node = Node::new(Backend::IptablesNft);
    node.warm_up();
    let before = node.dump();
    let pid = std::process::id();
    let state = |id: &str, bundle: &PathBuf| {
        serde_json::json!({"id": id, "status": "creating", "bundle": bundle, "pid": pid})
            .to_string()
    };
    let ip = ("io.natledger.ip", "10.77.0.2");
    let good = node.bundle("good", &[("io.natledger.ports", "80:80"), ip]);
    let mut cases: Vec<(String, String)> = vec![
        ("{\"id\": ".into(), "malformed container state".into()),
        ("[]".into(), "malformed container state".into()),
        (
            state("bad", &node.dir.path().join("nowhere")),
            "nowhere/config.json".into(),
        ),
        (state("../etc", &good), "unsafe container id".into()),
        (state("a/b", &good), "unsafe container id".into()),
        (state("a\u{1}b", &good), "unsafe container id".into()),
    ];
    for (spec, reason) in [
        ("0:80", "outside 1-65535"),
        ("65536:80", "outside 1-65535"),
        ("90-80:80-90", "reversed"),
        ("80-90:80-85", "differ in length"),
        ("80:80x", "not a port"),
        ("80:80 -j ACCEPT", "not a port"),
        ("80:80;reboot", "not a port"),
        ("80:80/icmp", "unknown protocol"),
        ("[fd78::1]:80:80", "needs an ipv6 container address"),
    ] {
        let bundle = node.bundle(
            &format!("bad-{}", cases.len()),
            &[("io.natledger.ports", spec), ip],
        );
        cases.push((state("bad", &bundle), reason.into()));
    }
    let bad_ip = ("io.natledger.ip", "10.0.0.1 -j DROP");
    let bundle = node.bundle("bad-ip", &[("io.natledger.ports", "80:80"), bad_ip]);
    cases.push((state("bad", &bundle), "invalid io.natledger.ip".into()));
    let bundle = node.bundle("bad-pid", &[("io.natledger.ports", "80:80")]);
    let pidless = serde_json::json!({"id": "bad", "status": "creating", "bundle": bundle});
    cases.push((pidless.to_string(), "has no pid".into()));
    let bundle = node.bundle("bad-json", &[]);
    std::fs::write(bundle.join("config.json"), "{not json").unwrap();
    cases.push((state("bad", &bundle), "bad-json/config.json".into()));

    for (input, reason) in cases {
        let out = node.natledger(&["hook", "create-runtime"], &input, &[]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{input}: accepted");
        assert!(
            err.contains(&reason),
            "{input}: expected {reason:?} in {err:?}"
        );
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{input}: one line, got {err:?}"
        );
        assert!(!node.manifest_exists("bad"));
    }
    assert_eq!(node.dump(), before, "no rule left by bad input");
}

/// `list` and `list --json` report a container alive (pid, phase, mappings) while its process
/// runs, and dead once it is gone.
#[test]
fn list_reports_containers_alive_and_dead() {
    let mut node = Node::new(Backend::IptablesLegacy);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("c2", Some(pid), &[("io.natledger.ports", "8080:80/udp")]);
    let list = |json: bool| {
        let args: &[&str] = if json { &["list", "--json"] } else { &["list"] };
        let out = node.natledger(args, "", &[]);
        assert_ok(&out, "list");
        String::from_utf8(out.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    let entry = &v[0];
    assert_eq!(entry["container_id"], "c2");
    assert_eq!(entry["alive"], true);
    assert_eq!(entry["pid"], pid);
    assert_eq!(entry["phase"], "installed");
    assert_eq!(entry["mappings"][0]["protocol"], "udp");
    assert_eq!(
        entry["addresses"],
        serde_json::json!(["10.77.0.2", "fd77::2"])
    );
    assert_eq!(entry["rules"].as_array().unwrap().len(), 7);
    assert_eq!(entry["rules"][0]["backend"], "legacy");
    assert!(list(false).contains("c2  pid"));
    kill_pid(pid);
    let v: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    assert_eq!(v[0]["alive"], false);
    assert_ok(&node.poststop("c2"), "poststop");
}

/// A local process already listening on a host port natledger is about to forward loses those
/// connections: create-runtime names it in a warning, and refuses when the container says so.
#[test]
fn a_local_listener_on_a_mapped_port_is_named_or_refused() {
    let node = Node::new(Backend::IptablesNft);
    let ns = node.topo.node().to_string();
    let _listener = serve_tcp(&ns, sock(Ipv4Addr::UNSPECIFIED, 8080), "local");
    let me = std::process::id().to_string();
    let out = node.create(
        "c2",
        None,
        &[
            ("io.natledger.ports", "8080:80"),
            ("io.natledger.ip", "10.77.0.2"),
        ],
    );
    let err = stderr(&out);
    assert!(
        err.contains("warning:") && err.contains("listens on 0.0.0.0 port 8080/tcp"),
        "{err}"
    );
    assert!(err.contains(&format!("(pid {me})")), "{err}");
    assert_ok(&node.poststop("c2"), "poststop");

    let before = node.dump();
    let bundle = node.bundle(
        "c3",
        &[
            ("io.natledger.ports", "8080:80"),
            ("io.natledger.ip", "10.77.0.3"),
            ("io.natledger.port-conflict", "refuse"),
        ],
    );
    let refused = node.hook("create-runtime", "c3", None, &bundle);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("is in use by"),
        "{}",
        stderr(&refused)
    );
    assert!(!node.manifest_exists("c3"));
    assert_eq!(node.dump(), before);
    // Another port is not affected.
    node.create(
        "c4",
        None,
        &[
            ("io.natledger.ports", "8081:80"),
            ("io.natledger.ip", "10.77.0.4"),
            ("io.natledger.port-conflict", "refuse"),
        ],
    );
}

/// iptables-nft poststop deletes over netlink (no iptables-nft-restore, whose socket release
/// waits an RCU grace period) when the chains hold exactly the manifest's tagged rules, in
/// both families; otherwise, or with NATLEDGER_NO_NETLINK, it goes through
/// iptables-nft-restore. Every way ends with the tables exactly as before.
#[test]
fn nft_poststop_deletes_over_netlink_or_falls_back() {
    let node = Node::new(Backend::IptablesNft);
    node.warm_up();
    let before = node.dump();
    let annotations = [
        ("io.natledger.ports", "8080:80,8081:81/udp"),
        ("io.natledger.ip", "10.77.0.2,fd77::2"),
    ];
    let trace = [("NATLEDGER_TRACE", "1")];
    let poststop = |id: &str, env: &[(&str, &str)]| {
        let bundle = node.bundle(id, &annotations);
        let out = node.hook_env("poststop", id, None, &bundle, env);
        assert_ok(&out, &format!("poststop {id}"));
        stderr(&out)
    };

    node.create("c1", None, &annotations);
    let err = poststop("c1", &trace);
    assert!(
        err.contains("netlink: deleted 8 ipv4 rule(s) tagged natledger:c1"),
        "{err}"
    );
    assert!(
        err.contains("netlink: deleted 6 ipv6 rule(s) tagged natledger:c1"),
        "{err}"
    );
    assert!(!err.contains("exec "), "a process was started: {err}");
    assert_eq!(node.dump(), before, "netlink poststop");

    // A hand-made copy of a tagged rule: the counts differ from the manifest, nothing is
    // deleted over netlink, and iptables-nft-restore removes both copies.
    node.create("c2", None, &annotations);
    let copy = "*nat\n-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 \
                -m comment --comment natledger:c2 -j DNAT --to-destination 10.77.0.2:80\nCOMMIT\n";
    load_rules(node.topo.node(), Backend::IptablesNft, Family::V4, copy);
    let err = poststop("c2", &trace);
    assert!(err.contains("using iptables-nft-restore"), "{err}");
    assert!(err.contains("exec /usr/sbin/iptables-nft-"), "{err}");
    assert_eq!(node.dump(), before, "fallback poststop");

    node.create("c3", None, &annotations);
    let err = poststop(
        "c3",
        &[("NATLEDGER_TRACE", "1"), ("NATLEDGER_NO_NETLINK", "1")],
    );
    assert!(!err.contains("netlink:"), "{err}");
    assert!(
        err.contains("exec /usr/sbin/ip6tables-nft-restore"),
        "{err}"
    );
    assert_eq!(node.dump(), before, "NATLEDGER_NO_NETLINK poststop");
}

/// iptables-legacy in the steady state (natledger's chains and jumps exist): create-runtime
/// and poststop write the table in-process, starting no process, in both families; the
/// tables end exactly as before. The traffic tests above run through the same path.
#[test]
fn legacy_hooks_write_the_table_in_process() {
    let node = Node::new(Backend::IptablesLegacy);
    node.warm_up();
    let before = node.dump();
    let annotations = [
        (
            "io.natledger.ports",
            "8080:80,10.78.0.1:9000-9002:80-82/udp",
        ),
        ("io.natledger.ip", "10.77.0.2,fd77::2"),
    ];
    let trace = [("NATLEDGER_TRACE", "1")];
    let bundle = node.bundle("c1", &annotations);
    let out = node.hook_env("create-runtime", "c1", None, &bundle, &trace);
    assert_ok(&out, "create-runtime");
    let err = stderr(&out);
    assert!(err.contains("iptc: inserted 5 ipv4 nat rule(s)"), "{err}");
    assert!(err.contains("iptc: inserted 2 ipv6 nat rule(s)"), "{err}");
    assert!(
        err.contains("iptc: inserted 2 ipv4 filter rule(s)"),
        "{err}"
    );
    assert!(
        err.contains("iptc: inserted 1 ipv6 filter rule(s)"),
        "{err}"
    );
    assert!(!err.contains("exec "), "a process was started: {err}");
    assert!(
        node.dump()
            .contains("--to-destination 10.77.0.2:80-82/9000")
    );

    let out = node.hook_env("poststop", "c1", None, &bundle, &trace);
    assert_ok(&out, "poststop");
    let err = stderr(&out);
    assert!(err.contains("iptc: deleted 5 ipv4 nat rule(s)"), "{err}");
    assert!(err.contains("iptc: deleted 2 ipv6 nat rule(s)"), "{err}");
    assert!(err.contains("iptc: deleted 2 ipv4 filter rule(s)"), "{err}");
    assert!(err.contains("iptc: deleted 1 ipv6 filter rule(s)"), "{err}");
    assert!(!err.contains("exec "), "a process was started: {err}");
    assert_eq!(node.dump(), before);
}

/// natledger's nftables tables, the first time (no table yet) and in the steady state:
/// create-runtime and poststop write them in-process, starting no process, in both
/// families; the tables end exactly as before.
#[test]
fn nftables_hooks_start_no_process() {
    let node = Node::new(Backend::OwnNftables);
    let pristine = node.dump();
    let annotations = [
        ("io.natledger.ports", "8080:80,9000-9002:9000-9002/udp"),
        ("io.natledger.ip", "10.77.0.2,fd77::2"),
    ];
    let trace = [("NATLEDGER_TRACE", "1")];
    for round in ["first", "steady"] {
        let before = node.dump();
        let bundle = node.bundle("c1", &annotations);
        for stage in ["create-runtime", "poststop"] {
            let out = node.hook_env(stage, "c1", None, &bundle, &trace);
            assert_ok(&out, &format!("{round} {stage}"));
            let err = stderr(&out);
            // With the trace on, natledger prints every process it starts.
            assert!(err.contains("natledger: peak rss "), "{err}");
            assert!(
                !err.contains("exec "),
                "{round} {stage}: a process was started: {err}"
            );
        }
        if round == "first" {
            // The shared chains and jumps stay by design; nothing of c1 does.
            assert!(!node.dump().contains("natledger:c1"));
        } else {
            assert_eq!(node.dump(), before, "{round}: poststop restores the dump");
        }
    }
    assert_ne!(node.dump(), pristine, "the shared chains stay");
    assert_ok(&node.sweep(&["--all"]), "sweep --all");
    assert_eq!(
        node.dump(),
        pristine,
        "sweep --all removes natledger's tables"
    );
}

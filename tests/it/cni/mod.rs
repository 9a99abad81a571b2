//! natledger as a chained CNI plugin, called as runtimes call it: the binary with the
//! `CNI_*` environment and the network configuration on stdin, in a node namespace, for a
//! container namespace bound at /run/netns (as `ip netns` and CNI runtimes do). Real TCP and
//! UDP traffic through the mappings; full `*-save` dumps equal before ADD and after DEL.
//!
//! Submodules: `concurrent` (many CNI calls at once), `conflist` (a conflist with Debian's
//! bridge and host-local run by the libcni-style driver, portmap side by side: SCTP, `hostIP`,
//! STATUS, GC), `crash` (ADD and DEL killed at every fault point), `held` (two attachments on
//! one host port), `lost` (DEL, CHECK and GC without a manifest), `settings` (a bad
//! `NATLEDGER_*` value refuses ADD and never stops DEL), `sweep` (liveness of attachments) and
//! `through_libcni` (held ports, hairpin, lost state and a namespace made again, each through
//! the conflist with portmap as the control).

mod concurrent;
mod conflist;
mod crash;
mod held;
mod lost;
mod settings;
mod sweep;
mod through_libcni;

use std::process::Output;
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(3);
const CID: &str = "5e1f0c3a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";

/// [`cni_call`] for this file's attachment `(CID, eth0)`.
fn cni(node: &Node, command: &str, netns: Option<&str>, config: &Value) -> Output {
    cni_call(node, command, CID, netns, config)
}

fn error_code(out: &Output) -> u64 {
    assert!(!out.status.success(), "expected a failure: {}", stderr(out));
    let error: Value = serde_json::from_slice(&out.stdout).expect("an error object on stdout");
    error["code"].as_u64().expect("a numeric code")
}

/// ADD passes `prevResult` through and records the attachment; TCP, UDP and IPv6 reach the
/// container; DEL without `runtimeConfig`, `prevResult` or `CNI_NETNS` restores the full dumps,
/// twice; both backends.
#[test]
fn add_forwards_tcp_udp_and_ipv6_del_restores_the_tables() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let netns = format!("/run/netns/{}", c.ns);
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp"),
            serve_udp(&c.ns, c.sock_v4(53), "c2 udp"),
            serve_tcp(&c.ns, c.sock_v6(80), "c2 tcp6"),
        ];
        node.warm_up();
        let before = node.dump();
        let state_dir = node.state_dir();
        let config = json!({
            "cniVersion": "1.0.0",
            "name": "testnet",
            "type": "natledger",
            "backend": backend.name(),
            "stateDir": state_dir,
            "runtimeConfig": {"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}
            ]},
            "prevResult": cni_prev_result(&c, &netns)
        });

        let out = cni(&node, "ADD", Some(&netns), &config);
        assert_ok(&out, "ADD");
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(printed, config["prevResult"], "prevResult passed through");
        let id = format!("{CID}+eth0");
        assert!(node.manifest_exists(&id));
        let manifest = node.manifest(&id);
        assert_eq!(manifest["cni"]["network"], "testnet");
        assert_eq!(manifest["cni"]["ifname"], "eth0");
        assert_eq!(manifest["cni"]["container_id"], CID);
        assert_eq!(manifest["cni"]["netns_path"], netns.as_str());
        assert!(manifest["netns"]["ino"].is_u64(), "netns identity recorded");
        assert!(node.dump().contains(&format!("natledger:{id}")));

        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("c2 tcp"),
            "{backend:?} external tcp"
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V6, 8080), T).ok().as_deref(),
            Some("c2 tcp6"),
            "{backend:?} external tcp6"
        );
        assert_eq!(
            udp_request(&ext, sock(NODE_V4, 5353), T).ok().as_deref(),
            Some("c2 udp"),
            "{backend:?} external udp"
        );

        // DEL as a runtime that lost its cache sends it: no runtimeConfig, no prevResult, no
        // netns.
        let bare = json!({
            "cniVersion": "1.0.0", "name": "testnet", "type": "natledger",
            "stateDir": state_dir,
        });
        let out = cni(&node, "DEL", None, &bare);
        assert_ok(&out, "DEL");
        assert!(out.stdout.is_empty(), "DEL prints nothing");
        assert!(!node.manifest_exists(&id));
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: DEL leaves the tables as they were"
        );
        assert!(tcp_request(&ext, sock(NODE_V4, 8080), T).is_err());
        // A second DEL succeeds and changes nothing.
        assert_ok(&cni(&node, "DEL", Some(&netns), &config), "second DEL");
        assert_eq!(node.dump(), before);
    });
}

/// A 0.3.1 conflist (flannel's, older Kubernetes ones) as portmap serves it: ADD with a
/// 0.3.1 result (`ips[].version`), real TCP through it; no CHECK before 0.4.0; DEL as a 0.3.1
/// runtime sends it (no prevResult) restores the tables.
#[test]
fn a_0_3_1_config_is_served_like_portmap_serves_it() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let netns = format!("/run/netns/{}", c.ns);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp");
        node.warm_up();
        let before = node.dump();
        let mut config = json!({
            "cniVersion": "0.3.1",
            "name": "cbr0",
            "type": "natledger",
            "capabilities": {"portMappings": true},
            "backend": backend.name(),
            "stateDir": node.state_dir(),
            "runtimeConfig": {"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}
            ]},
            "prevResult": {
                "cniVersion": "0.3.1",
                "interfaces": [
                    {"name": "cni0", "mac": "0a:58:0a:4d:00:01"},
                    {"name": "eth0", "mac": "0a:58:0a:4d:00:02", "sandbox": netns}
                ],
                "ips": [{"version": "4", "interface": 1,
                         "address": format!("{}/24", c.v4), "gateway": "10.77.0.1"}],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dns": {}
            }
        });
        let out = cni(&node, "ADD", Some(&netns), &config);
        assert_ok(&out, "0.3.1 ADD");
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(printed, config["prevResult"], "prevResult passed through");
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("c2 tcp"),
            "{backend:?} external tcp through a 0.3.1 ADD"
        );
        assert_eq!(error_code(&cni(&node, "CHECK", Some(&netns), &config)), 1);
        config.as_object_mut().unwrap().remove("prevResult");
        assert_ok(&cni(&node, "DEL", Some(&netns), &config), "0.3.1 DEL");
        assert!(node.manifests().is_empty(), "no manifest after DEL");
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: 0.3.1 DEL restores the tables"
        );
        assert!(tcp_request(&ext, sock(NODE_V4, 8080), T).is_err());
    });
}

/// Refused calls (unknown or malformed version, bad port, no prevResult, portmap's
/// `conditionsV4`/`conditionsV6`, `snat: false` and `masqAll: true`, not JSON, missing
/// environment) write no rule and no manifest.
#[test]
fn refused_calls_write_no_rule_and_no_manifest() {
    let mut node = Node::new(Backend::IptablesNft);
    let c = node.topo.add_container(2);
    let netns = format!("/run/netns/{}", c.ns);
    node.warm_up();
    let before = node.dump();
    let good = json!({
        "cniVersion": "1.0.0", "name": "testnet", "type": "natledger",
        "stateDir": node.state_dir(),
        "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]},
        "prevResult": cni_prev_result(&c, &netns)
    });
    let with = |key: &str, value: Value| {
        let mut config = good.clone();
        config[key] = value;
        config
    };
    let cases = [
        ("unknown version", with("cniVersion", json!("0.2.0")), 1),
        ("malformed version", with("cniVersion", json!("one")), 6),
        (
            "bad port",
            with(
                "runtimeConfig",
                json!({"portMappings": [{"hostPort": 0, "containerPort": 80}]}),
            ),
            7,
        ),
        ("no prevResult", with("prevResult", Value::Null), 7),
        (
            "portmap conditions",
            with("conditionsV4", json!(["-s", "10.0.0.0/8"])),
            2,
        ),
        (
            "portmap conditions, IPv6",
            with("conditionsV6", json!(["-s", "fd00::/8"])),
            2,
        ),
        ("portmap snat: false", with("snat", json!(false)), 2),
        ("portmap masqAll: true", with("masqAll", json!(true)), 2),
    ];
    for (what, config, code) in cases {
        let out = cni(&node, "ADD", Some(&netns), &config);
        assert_eq!(error_code(&out), code, "{what}");
    }
    let out = node.natledger(
        &[],
        "{",
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", CID),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", &netns),
            ("CNI_PATH", "/opt/cni/bin"),
        ],
    );
    assert_eq!(error_code(&out), 6, "not JSON");
    let out = node.natledger(
        &[],
        &good.to_string(),
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", &netns),
        ],
    );
    assert_eq!(error_code(&out), 4, "no CNI_CONTAINERID");
    assert!(node.manifests().is_empty(), "no manifest");
    assert_eq!(node.dump(), before, "no rule");
    // VERSION needs nothing else.
    let out = node.natledger(
        &[],
        r#"{"cniVersion":"1.0.0"}"#,
        &[("CNI_COMMAND", "VERSION")],
    );
    assert_ok(&out, "VERSION");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        answer["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
}

/// What libcni's plugins refuse, refused with the error object and code they give: ADD
/// without `CNI_PATH`, a `CNI_NETNS` that is a regular file or another kind of namespace, an
/// empty `CNI_COMMAND` (no argument: a runtime's call), and what natledger cannot read one way:
/// one host port to two container ports, `hostPort` and `HostPort` with two values. No rule,
/// no manifest.
#[test]
fn calls_libcni_would_refuse_are_refused_with_error_objects() {
    let mut node = Node::new(Backend::IptablesNft);
    let c = node.topo.add_container(2);
    let netns = format!("/run/netns/{}", c.ns);
    node.warm_up();
    let before = node.dump();
    let good = cni_config(&node, "testnet", &c, 8080);
    let env = |netns: &str, path: bool| {
        let mut env = vec![
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", CID.to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_NETNS", netns.to_string()),
        ];
        if path {
            env.push(("CNI_PATH", "/opt/cni/bin".to_string()));
        }
        env
    };
    let mappings = |list: Value| {
        let mut config = good.clone();
        config["runtimeConfig"]["portMappings"] = list;
        config
    };
    let two_targets = mappings(json!([
        {"hostPort": 8080, "containerPort": 80},
        {"hostPort": 8080, "containerPort": 81}
    ]));
    let two_values = mappings(json!([{"hostPort": 8080, "HostPort": 8081, "containerPort": 80}]));
    let cases = [
        ("no CNI_PATH", env(&netns, false), &good, 4, "CNI_PATH"),
        (
            "a file as CNI_NETNS",
            env("/etc/passwd", true),
            &good,
            4,
            "CNI_NETNS",
        ),
        (
            "a UTS namespace as CNI_NETNS",
            env("/proc/self/ns/uts", true),
            &good,
            4,
            "not a network namespace",
        ),
        (
            "one host port, two targets",
            env(&netns, true),
            &two_targets,
            7,
            "8080:81/tcp",
        ),
        (
            "hostPort and HostPort",
            env(&netns, true),
            &two_values,
            7,
            "HostPort",
        ),
    ];
    for (what, env, config, code, named) in cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = node.natledger(&[], &config.to_string(), &env);
        assert_eq!(error_code(&out), code, "{what}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(named), "{what}: {text}");
    }
    // An empty CNI_COMMAND, no argument: an error object, not natledger's usage.
    let out = node.natledger(&[], &good.to_string(), &[("CNI_COMMAND", "")]);
    assert_eq!(error_code(&out), 4, "empty CNI_COMMAND");
    assert!(String::from_utf8_lossy(&out.stdout).contains("CNI_COMMAND"));
    assert!(node.manifests().is_empty(), "no manifest");
    assert_eq!(node.dump(), before, "no rule");
    // The same calls, well formed, are served.
    let out = node.natledger(
        &[],
        &good.to_string(),
        &env(&netns, true)
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect::<Vec<_>>(),
    );
    assert_ok(&out, "ADD");
    assert_ok(&cni(&node, "DEL", Some(&netns), &good), "DEL");
    assert_eq!(node.dump(), before);
}

/// GC removes exactly the attachments of its network missing from the valid list: not the
/// valid one, not another network's, not a hook container's; then DEL and poststop restore
/// the tables.
#[test]
fn gc_removes_only_this_networks_stale_attachments() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let _servers = [
            serve_tcp(&c2.ns, c2.sock_v4(80), "c2"),
            serve_tcp(&c3.ns, c3.sock_v4(80), "c3"),
        ];
        node.warm_up();
        let before = node.dump();
        let ns2 = format!("/run/netns/{}", c2.ns);
        let ns3 = format!("/run/netns/{}", c3.ns);
        let (a, b, c) = ("aaaa1", "bbbb2", "cccc3");
        assert_ok(&cni_add(&node, "testnet", a, &c2, 8080), "ADD a");
        assert_ok(&cni_add(&node, "testnet", b, &c3, 8081), "ADD b");
        assert_ok(&cni_add(&node, "othernet", c, &c3, 8082), "ADD c");
        node.create(
            "hookc",
            None,
            &[
                ("io.natledger.ports", "8083:80"),
                ("io.natledger.ip", "10.77.0.3"),
            ],
        );
        let ext = node.topo.ext().to_string();
        for port in [8080, 8081, 8082, 8083] {
            assert!(
                tcp_request(&ext, sock(NODE_V4, port), T).is_ok(),
                "{backend:?} {port} before GC"
            );
        }

        let mut gc = cni_config(&node, "testnet", &c2, 8080);
        let gc = gc.as_object_mut().unwrap();
        gc.remove("runtimeConfig");
        gc.remove("prevResult");
        let without_list = Value::Object(gc.clone());
        gc.insert(
            "cni.dev/valid-attachments".into(),
            json!([{"containerID": a, "ifname": "eth0"}]),
        );
        let gc = Value::Object(gc.clone());
        let run_gc = |config: &Value| {
            node.natledger(
                &[],
                &config.to_string(),
                &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
            )
        };
        assert_eq!(error_code(&run_gc(&without_list)), 7, "GC without the list");
        assert_eq!(node.manifests().len(), 4);
        let out = run_gc(&gc);
        assert_ok(&out, "GC");
        assert!(out.stdout.is_empty());
        assert!(!node.manifest_exists("bbbb2+eth0"));
        for kept in ["aaaa1+eth0", "cccc3+eth0", "hookc"] {
            assert!(node.manifest_exists(kept), "{kept} kept");
        }
        assert!(
            tcp_request(&ext, sock(NODE_V4, 8081), T).is_err(),
            "{backend:?} b's port gone"
        );
        for port in [8080, 8082, 8083] {
            assert!(
                tcp_request(&ext, sock(NODE_V4, port), T).is_ok(),
                "{backend:?} {port} after GC"
            );
        }
        // Again: nothing more to do.
        assert_ok(&run_gc(&gc), "second GC");
        assert_eq!(node.manifests().len(), 3);

        assert_ok(
            &cni_call(
                &node,
                "DEL",
                a,
                Some(&ns2),
                &cni_config(&node, "testnet", &c2, 8080),
            ),
            "DEL a",
        );
        assert_ok(
            &cni_call(
                &node,
                "DEL",
                c,
                Some(&ns3),
                &cni_config(&node, "othernet", &c3, 8082),
            ),
            "DEL c",
        );
        assert_ok(&node.poststop("hookc"), "poststop");
        assert_eq!(node.dump(), before, "{backend:?}: everything removed");
    });
}

/// A CNI attachment and a hook container in one network namespace (podman with CNI and the
/// hook; a pod's sandbox attachment holding a hostPort a container's hook also asks for) are
/// one group, as containers sharing a namespace are: the hook container shares the
/// attachment's 8080 (no new rule); the attachment's DEL keeps the rules while the container
/// lives; the container's poststop, the last member's, removes them.
#[test]
fn a_hook_container_in_an_attachments_namespace_shares_its_port() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let netns = format!("/run/netns/{}", c.ns);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        node.warm_up();
        let before = node.dump();
        let config = cni_config(&node, "testnet", &c, 8080);
        assert_ok(&cni(&node, "ADD", Some(&netns), &config), "ADD");
        let id = format!("{CID}+eth0");
        let added = node.dump();
        assert!(added.contains(&format!("natledger:{id}")));
        let ext = node.topo.ext().to_string();
        let reachable = || tcp_request(&ext, sock(NODE_V4, 8080), T).ok();

        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create("app", Some(pid), &[("io.natledger.ports", "8080:80")]);
        assert_eq!(node.dump(), added, "{backend:?}: shared, no new rule");
        assert_eq!(node.manifest("app")["shares"][0]["holder"], id.as_str());
        assert_eq!(reachable().as_deref(), Some("c2"), "{backend:?} shared");

        // The attachment goes (DEL as a runtime sends it, without prevResult): the hook
        // container still lives in its namespace, so the rules stay.
        let mut del = config.clone();
        del.as_object_mut().unwrap().remove("prevResult");
        assert_ok(&cni(&node, "DEL", Some(&netns), &del), "DEL");
        assert_eq!(node.dump(), added, "{backend:?}: kept for the container");
        assert_eq!(node.manifest(&id)["cni"]["deleted"], true);
        assert_eq!(reachable().as_deref(), Some("c2"), "{backend:?} after DEL");
        assert_ok(&cni(&node, "DEL", Some(&netns), &del), "second DEL");
        assert_eq!(node.dump(), added);

        kill_pid(pid);
        assert_ok(&node.poststop("app"), "poststop");
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: the last member removed them"
        );
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
        assert_eq!(reachable(), None, "{backend:?} gone");
    });
}

/// STATUS: ready on every backend, 50 for an unusable state directory, 1 before CNI 1.1.0.
#[test]
fn status_says_whether_natledger_can_write_here() {
    // Every backend (nftables: ready when a netfilter netlink socket opens, no tool needed),
    // named in the configuration as an operator would.
    for backend in Backend::ALL {
        let node = Node::new(backend);
        let status = |state_dir: &std::path::Path| {
            let config = json!({"cniVersion": "1.1.0", "name": "testnet", "type": "natledger",
                "stateDir": state_dir, "backend": backend.name()});
            node.natledger(&[], &config.to_string(), &[("CNI_COMMAND", "STATUS")])
        };
        let out = status(&node.state_dir());
        assert_ok(&out, &format!("{backend:?} STATUS"));
        assert!(out.stdout.is_empty());
        // A state directory under a regular file cannot be made.
        let file = node.dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(error_code(&status(&file.join("state"))), 50);
    }
    let node = Node::new(Backend::IptablesNft);
    // 1.0.0 has no STATUS.
    let config = json!({"cniVersion": "1.0.0", "name": "testnet", "type": "natledger"});
    let out = node.natledger(&[], &config.to_string(), &[("CNI_COMMAND", "STATUS")]);
    assert_eq!(error_code(&out), 1);
}

/// CHECK passes after ADD, names a recorded rule someone deleted, needs prevResult, and
/// after DEL fails when mappings are asked for.
#[test]
fn check_finds_a_missing_rule() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let netns = format!("/run/netns/{}", c.ns);
        node.warm_up();
        let config = cni_config(&node, "testnet", &c, 8080);
        assert_ok(&cni(&node, "ADD", Some(&netns), &config), "ADD");
        let out = cni(&node, "CHECK", Some(&netns), &config);
        assert_ok(&out, "CHECK after ADD");
        assert!(out.stdout.is_empty());

        let mut no_prev = config.clone();
        no_prev.as_object_mut().unwrap().remove("prevResult");
        assert_eq!(error_code(&cni(&node, "CHECK", Some(&netns), &no_prev)), 7);

        // Someone deletes the IPv4 DNAT.
        let manifest = node.manifest(&format!("{CID}+eth0"));
        let dnat = manifest["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["family"] == "ipv4" && r["chain"] == "NATLEDGER-HOSTPORTS")
            .expect("an ipv4 DNAT record");
        assert_eq!(dnat["backend"], backend.name());
        delete_recorded_rule(node.topo.node(), backend, dnat);
        let out = cni(&node, "CHECK", Some(&netns), &config);
        assert_eq!(error_code(&out), 100);
        let error: Value = serde_json::from_slice(&out.stdout).unwrap();
        let details = error["details"].as_str().unwrap();
        assert!(details.contains("NATLEDGER-HOSTPORTS"), "{details}");
        assert!(details.contains("1 of"), "{details}");

        assert_ok(&cni(&node, "DEL", Some(&netns), &config), "DEL");
        assert_eq!(error_code(&cni(&node, "CHECK", Some(&netns), &config)), 100);
        let mut no_mappings = config.clone();
        no_mappings.as_object_mut().unwrap().remove("runtimeConfig");
        assert_ok(
            &cni(&node, "CHECK", Some(&netns), &no_mappings),
            "CHECK, nothing asked",
        );
    });
}

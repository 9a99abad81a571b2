//! Liveness of CNI attachments: an attachment whose network namespace was deleted without a
//! DEL (seed 002's uninstall), or whose netns path now names another namespace (another
//! inode, or a namespace made again under its name that reuses the inode: told apart by the
//! recorded namespace cookie; a manifest without one is judged by device and inode), is dead;
//! `natledger sweep` removes it, a new ADD on its host port releases it; live attachments and
//! hook containers stay. `list`, `doctor` and `sweep` name attachments by network and ifname.

use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(3);

fn json_of(out: &std::process::Output, what: &str) -> Value {
    assert_ok(out, what);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

/// The entry of `id` in a JSON list of objects keyed by `key`.
fn entry<'a>(all: &'a Value, key: &str, id: &str) -> &'a Value {
    all.as_array()
        .expect("a list")
        .iter()
        .find(|e| e[key] == id)
        .unwrap_or_else(|| panic!("no {id} in {all:#}"))
}

/// Attachments whose netns was deleted without DEL, or whose path names another namespace, are
/// dead in `list`, `doctor` and `sweep` (text, `--json`); sweep removes exactly their rules and
/// manifests while a live attachment and a hook container stay; both backends.
#[test]
fn sweep_removes_attachments_whose_netns_is_gone_or_another_keeps_the_live() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let c4 = node.topo.add_container(4);
        let c5 = node.topo.add_container(5);
        let _servers = [&c2, &c3, &c4, &c5].map(|c| serve_tcp(&c.ns, c.sock_v4(80), &c.ns));
        let hook_pid = node.topo.spawn_sleeper(&c4.ns);
        node.warm_up();
        let before = node.dump();
        assert_ok(&cni_add(&node, "testnet", "live1", &c3, 8081), "ADD live1");
        node.create(
            "hookc",
            Some(hook_pid),
            &[
                ("io.natledger.ports", "8082:80"),
                ("io.natledger.ip", "10.77.0.4"),
            ],
        );
        let live_only = node.dump();
        assert_ok(&cni_add(&node, "testnet", "dead1", &c2, 8080), "ADD dead1");
        assert_ok(&cni_add(&node, "othernet", "dead2", &c5, 8083), "ADD dead2");
        let ext = node.topo.ext().to_string();
        for (port, c) in [(8080, &c2), (8081, &c3), (8082, &c4), (8083, &c5)] {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, port), T).ok().as_deref(),
                Some(c.ns.as_str()),
                "{backend:?} {port} before"
            );
        }
        let list = json_of(&node.natledger(&["list", "--json"], "", &[]), "list");
        assert_eq!(entry(&list, "container_id", "dead1+eth0")["alive"], true);

        // dead1: its namespace deleted, no DEL. dead2: its name now names another namespace.
        node.topo.delete_ns_now(&c2.ns);
        node.topo.delete_ns_now(&c5.ns);
        node.topo.bind_ns_at(&c5.ns, &c3.ns);

        let list = json_of(&node.natledger(&["list", "--json"], "", &[]), "list");
        for (id, alive) in [
            ("dead1+eth0", false),
            ("dead2+eth0", false),
            ("live1+eth0", true),
            ("hookc", true),
        ] {
            assert_eq!(entry(&list, "container_id", id)["alive"], alive, "{id}");
        }
        let dead1 = entry(&list, "container_id", "dead1+eth0");
        assert_eq!(dead1["cni"]["network"], "testnet");
        assert_eq!(dead1["cni"]["ifname"], "eth0");
        assert_eq!(dead1["cni"]["container_id"], "dead1");
        let out = node.natledger(&["list"], "", &[]);
        assert_ok(&out, "list");
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("dead2+eth0  cni net=othernet ifname=eth0 container=dead2  dead"),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("hookc  pid {hook_pid}  alive")),
            "{shown}"
        );

        let d = live(&node, &[]);
        let state = d.of_kind("natledger-state");
        assert_eq!(state.len(), 2, "{}", d.show());
        for (id, net) in [("dead1", "testnet"), ("dead2", "othernet")] {
            assert!(
                state.iter().any(|f| text(f, "summary").contains(&format!(
                    "Container {id}+eth0 (cni net={net} ifname=eth0 container={id}) is dead"
                ))),
                "{}",
                d.show()
            );
        }

        let out = node.sweep(&["--dry-run"]);
        assert_ok(&out, "sweep --dry-run");
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains(
                "dead container dead1+eth0 (cni net=testnet ifname=eth0 container=dead1): \
                 would remove"
            ),
            "{shown}"
        );
        let report = json_of(&node.sweep(&["--json"]), "sweep --json");
        let containers = &report["containers"];
        for id in ["dead1+eth0", "dead2+eth0"] {
            let c = entry(containers, "id", id);
            assert_eq!(
                (&c["state"], &c["manifest"]),
                (&"dead".into(), &"removed".into())
            );
            assert_eq!(c["cni"]["ifname"], "eth0");
        }
        assert_eq!(
            entry(containers, "id", "dead2+eth0")["cni"]["network"],
            "othernet"
        );
        for id in ["live1+eth0", "hookc"] {
            let c = entry(containers, "id", id);
            assert_eq!(
                (&c["state"], &c["manifest"]),
                (&"alive".into(), &"kept".into())
            );
        }
        assert_eq!(report["errors"], Value::Array(Vec::new()));
        assert_eq!(
            node.dump(),
            live_only,
            "{backend:?}: only the dead ones' rules went"
        );
        assert_eq!(node.manifests(), ["hookc.json", "live1+eth0.json"]);
        for (port, c) in [(8081, &c3), (8082, &c4)] {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, port), T).ok().as_deref(),
                Some(c.ns.as_str()),
                "{backend:?} {port} after sweep"
            );
        }
        assert!(tcp_request(&ext, sock(NODE_V4, 8080), T).is_err());
        let d = live(&node, &[]);
        assert!(d.of_kind("natledger-state").is_empty(), "{}", d.show());

        let netns3 = format!("/run/netns/{}", c3.ns);
        let del = cni_config(&node, "testnet", &c3, 8081);
        assert_ok(&cni_call(&node, "DEL", "live1", Some(&netns3), &del), "DEL");
        assert_ok(&node.poststop("hookc"), "poststop");
        assert_eq!(node.dump(), before, "{backend:?}: everything removed");
    });
}

/// ADD of `cid` forwarding `port` to `c`, with `portConflict: "refuse"`.
fn refusing_add(node: &Node, cid: &str, c: &Container, port: u16) -> std::process::Output {
    let mut config = cni_config(node, "testnet", c, port);
    config["portConflict"] = serde_json::json!("refuse");
    let netns = format!("/run/netns/{}", c.ns);
    cni_call(node, "ADD", cid, Some(&netns), &config)
}

/// A second ADD on the host port of a deleted attachment wins, also with `portConflict:
/// "refuse"` (which refuses it while that one lives).
#[test]
fn an_add_on_the_port_of_a_deleted_attachment_wins() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let _servers = [&c2, &c3].map(|c| serve_tcp(&c.ns, c.sock_v4(80), &c.ns));
        node.warm_up();
        let before = node.dump();
        assert_ok(&cni_add(&node, "testnet", "first", &c2, 8080), "ADD first");
        let holding = node.dump();
        // While the first attachment's namespace lives, the port is its.
        let out = refusing_add(&node, "second", &c3, 8080);
        assert!(!out.status.success(), "{backend:?}: second ADD refused");
        let error: Value = serde_json::from_slice(&out.stdout).expect("an error object");
        let msg = format!("{} {}", error["msg"], error["details"]);
        assert!(
            msg.contains("cni net=testnet ifname=eth0 container=first"),
            "{msg}"
        );
        assert!(!node.manifest_exists("second+eth0"));
        assert_eq!(node.dump(), holding);

        node.topo.delete_ns_now(&c2.ns);
        assert_ok(&refusing_add(&node, "second", &c3, 8080), "ADD second");
        assert!(!node.manifest_exists("first+eth0"), "the dead one released");
        assert!(node.manifest_exists("second+eth0"));
        assert!(!node.dump().contains("natledger:first+eth0"));
        let ext = node.topo.ext().to_string();
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some(c3.ns.as_str()),
            "{backend:?}: the newest wins"
        );
        let netns3 = format!("/run/netns/{}", c3.ns);
        let del = cni_config(&node, "testnet", &c3, 8080);
        assert_ok(
            &cni_call(&node, "DEL", "second", Some(&netns3), &del),
            "DEL",
        );
        assert_eq!(node.dump(), before, "{backend:?}: everything removed");
    });
}

/// A live attachment missing a recorded rule: doctor's fix is a new CNI ADD by its runtime
/// (podman restart, a recreated pod) and a CHECK, not a restart of a hook container, and
/// every sentence of it parses (`live` checks the prose).
#[test]
fn doctor_tells_a_live_attachment_missing_rules_to_add_again() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c2 = node.topo.add_container(2);
        node.warm_up();
        assert_ok(&cni_add(&node, "testnet", "gone", &c2, 8080), "ADD");
        let manifest = node.manifest("gone+eth0");
        let dnat = manifest["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["family"] == "ipv4" && r["chain"] == "NATLEDGER-HOSTPORTS")
            .expect("an ipv4 DNAT record");
        assert_eq!(dnat["backend"], backend.name());
        delete_recorded_rule(node.topo.node(), backend, dnat);

        let d = live(&node, &[]);
        let state = d.of_kind("natledger-state");
        let missing = state
            .iter()
            .find(|f| text(f, "summary").contains("is missing 1 of"))
            .unwrap_or_else(|| panic!("{backend:?}: no missing-rules finding\n{}", d.show()));
        let fix = text(missing, "fix");
        for want in [
            "CNI ADD of attachment gone+eth0",
            "podman restart gone",
            "CNI_COMMAND=CHECK",
        ] {
            assert!(fix.contains(want), "{backend:?}: {want:?} in {fix}");
        }
        assert!(!fix.contains("restart container"), "{fix}");
        let netns = format!("/run/netns/{}", c2.ns);
        let del = cni_config(&node, "testnet", &c2, 8080);
        assert_ok(&cni_call(&node, "DEL", "gone", Some(&netns), &del), "DEL");
    });
}

/// `CNI_NETNS`'s namespace `X` deleted without a DEL and made again (`ip netns del X; ip netns
/// add X`), which often gives the new namespace the old one's inode: the attachment ADD
/// recorded with a namespace cookie is dead, and `sweep` removes exactly its rules while a live
/// attachment's TCP and UDP traffic (a client that keeps sending) stays. A manifest without a
/// cookie (an older release's, a kernel before 5.14) is judged by device and inode as before:
/// alive while its path names that inode (the reused one too), dead once the path is gone.
/// Whether the kernel reused the inode this run is printed; every backend.
#[test]
fn a_namespace_made_again_under_its_name_is_another_namespace() {
    use std::os::unix::fs::MetadataExt;
    both(|backend| {
        let mut node = Node::new(backend);
        let x = node.topo.add_container(2);
        let live = node.topo.add_container(3);
        let y = node.topo.add_container(4);
        let x_server = serve_tcp(&x.ns, x.sock_v4(80), &x.ns);
        let _servers = [
            serve_tcp(&live.ns, live.sock_v4(80), &live.ns),
            serve_udp(&live.ns, live.sock_v4(80), &live.ns),
            serve_tcp(&y.ns, y.sock_v4(80), &y.ns),
        ];
        node.warm_up();
        let before = node.dump();
        let mut config = cni_config(&node, "testnet", &live, 8081);
        config["runtimeConfig"]["portMappings"] = serde_json::json!([
            {"hostPort": 8081, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8081, "containerPort": 80, "protocol": "udp"}
        ]);
        let live_path = format!("/run/netns/{}", live.ns);
        assert_ok(
            &cni_call(&node, "ADD", "live", Some(&live_path), &config),
            "ADD live",
        );
        let live_only = node.dump();
        // Older manifests: written without a cookie.
        let forget_cookie = |id: &str| {
            let path = node.state_dir().join(format!("containers/{id}.json"));
            let mut m = node.manifest(id);
            assert!(m["netns"]["cookie"].is_u64(), "{backend:?} {id}: {m:#}");
            m["netns"].as_object_mut().unwrap().remove("cookie");
            let text = serde_json::to_string_pretty(&m).unwrap() + "\n";
            std::fs::write(&path, text).unwrap();
        };
        assert_ok(&cni_add(&node, "testnet", "old", &y, 8083), "ADD old");
        forget_cookie("old+eth0");
        let without_oldx = node.dump();
        assert_ok(&cni_add(&node, "testnet", "oldx", &x, 8082), "ADD oldx");
        forget_cookie("oldx+eth0");
        let without_dead = node.dump();
        assert_ok(&cni_add(&node, "testnet", "dead", &x, 8080), "ADD dead");
        let recorded = node.manifest("dead+eth0")["netns"].clone();
        assert!(recorded["cookie"].is_u64(), "{recorded}");
        let ext = node.topo.ext().to_string();
        for (port, c) in [(8080, &x), (8081, &live), (8082, &x), (8083, &y)] {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, port), T).ok().as_deref(),
                Some(c.ns.as_str()),
                "{backend:?} {port} before"
            );
        }
        let udp = UdpClient::start(&ext, sock(EXT_V4, 40181), sock(NODE_V4, 8081));
        let started = std::time::Instant::now();
        assert!(
            udp.wait_for(&live.ns, started, T).is_some(),
            "{backend:?}: UDP through 8081"
        );

        // X deleted (nothing of it left to hold it) and made again under its name.
        drop(x_server);
        let x_path = format!("/run/netns/{}", x.ns);
        let ino = std::fs::metadata(&x_path).unwrap().ino();
        assert_eq!(recorded["ino"], ino);
        node.topo.delete_ns_now(&x.ns);
        let reused = node.topo.add_ns_reusing(&x.ns, ino, 40);
        println!("{backend:?}: ip netns add reused inode {ino}: {reused}");

        let list = json_of(&node.natledger(&["list", "--json"], "", &[]), "list");
        for (id, alive) in [
            ("dead+eth0", false),
            ("oldx+eth0", reused),
            ("live+eth0", true),
            ("old+eth0", true),
        ] {
            assert_eq!(
                entry(&list, "container_id", id)["alive"],
                alive,
                "{backend:?} {id}"
            );
        }
        let swept = std::time::Instant::now();
        let report = json_of(&node.sweep(&["--json"]), "sweep --json");
        let removed = |id| removed_in(&report, id);
        assert!(removed("dead+eth0"), "{report:#}");
        assert_eq!(removed("oldx+eth0"), !reused, "{report:#}");
        let expected = if reused { &without_dead } else { &without_oldx };
        assert_eq!(
            &node.dump(),
            expected,
            "{backend:?}: exactly the dead attachments' rules went"
        );
        for (port, c) in [(8081, &live), (8083, &y)] {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, port), T).ok().as_deref(),
                Some(c.ns.as_str()),
                "{backend:?} {port} after sweep"
            );
        }
        assert!(tcp_request(&ext, sock(NODE_V4, 8080), T).is_err());
        std::thread::sleep(Duration::from_millis(500));
        let replies = udp.replies_since(swept);
        assert!(
            !replies.is_empty() && replies.iter().all(|r| *r == live.ns),
            "{backend:?}: the live attachment's UDP flow goes on: {replies:?}"
        );
        udp.stop();

        // The manifest without a cookie is dead once its path is gone.
        let oldx = cni_config(&node, "testnet", &x, 8082);
        assert_ok(
            &cni_call(&node, "DEL", "oldx", Some(&x_path), &oldx),
            "DEL oldx",
        );
        node.topo.delete_ns_now(&y.ns);
        let report = json_of(&node.sweep(&["--json"]), "sweep --json");
        assert!(removed_in(&report, "old+eth0"), "{report:#}");
        assert_eq!(
            node.dump(),
            live_only,
            "{backend:?}: only the live one's rules"
        );
        assert_ok(
            &cni_call(&node, "DEL", "live", Some(&live_path), &config),
            "DEL live",
        );
        assert_eq!(node.dump(), before, "{backend:?}: everything removed");
    });
}

fn removed_in(report: &Value, id: &str) -> bool {
    entry(&report["containers"], "id", id)["manifest"] == "removed"
}

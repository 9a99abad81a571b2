//! Held ports through CNI, as portmap serves them: two attachments in two container
//! namespaces ADD the same host ports (TCP 8080, UDP 8053). The newer serves (real TCP from
//! the outside namespace, and a UDP client that keeps sending moves to it at its ADD); `list`
//! shows who serves and who waits, `doctor` reports the stack as information, never a shadow
//! error; a sweep while both live removes nothing. DEL of the newer gives the port back to the
//! older; DEL of the older first, or a sweep of the older once its namespace is gone, leaves
//! the newer serving, its UDP flow's conntrack entry untouched. After both DELs the full `*-save` dumps equal those before the first ADD. With
//! `portConflict: "refuse"` the second ADD fails (code 100, naming the holder) and writes
//! nothing. A third attachment in the newer's namespace shares the newer's rules: it writes
//! nothing, stacks on no one and says nothing of taking the port over. All three backends.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(3);
/// How long after a call the sending UDP client must be on its new path.
const FOLLOW: Duration = Duration::from_secs(1);

/// TCP 8080 → 80 and UDP 8053 → 53 of `c`, `portConflict: "refuse"` when `refuse`.
fn config(node: &Node, c: &Container, refuse: bool) -> Value {
    let mut config = cni_config(node, "testnet", c, 8080);
    config["runtimeConfig"]["portMappings"] = json!([
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 8053, "containerPort": 53, "protocol": "udp"}
    ]);
    if refuse {
        config["portConflict"] = json!("refuse");
    }
    config
}

fn call(node: &Node, command: &str, cid: &str, c: &Container, refuse: bool) -> Output {
    let netns = format!("/run/netns/{}", c.ns);
    cni_call(node, command, cid, Some(&netns), &config(node, c, refuse))
}

/// Two containers, each answering with its name on TCP 80 and UDP 53.
fn two(node: &mut Node) -> (Container, Container, Vec<Server>) {
    let a = node.topo.add_container(2);
    let b = node.topo.add_container(3);
    let servers = vec![
        serve_tcp(&a.ns, a.sock_v4(80), "A"),
        serve_udp(&a.ns, a.sock_v4(53), "A"),
        serve_tcp(&b.ns, b.sock_v4(80), "B"),
        serve_udp(&b.ns, b.sock_v4(53), "B"),
    ];
    (a, b, servers)
}

fn tcp_answer(node: &Node) -> Option<String> {
    tcp_request(node.topo.ext(), sock(NODE_V4, 8080), T).ok()
}

fn follows(client: &UdpClient, want: &str, since: Instant, what: &str) {
    assert!(
        client.wait_for(want, since, FOLLOW).is_some(),
        "{what}: no {want:?} within {FOLLOW:?}: {:?}",
        client.replies_since(since)
    );
}

/// The conntrack ids of the node's UDP entries to original destination port 8053.
fn udp_entry_ids(node: &Node) -> Vec<String> {
    let args = ["-L", "-p", "udp", "--orig-port-dst", "8053", "-o", "id"];
    let out = run_in(node.topo.node(), "conntrack", &args, None);
    let mut ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("id="))
        .map(String::from)
        .collect();
    ids.sort();
    ids
}

/// `list`'s text and `--json`: `b+eth0` serves, `a+eth0` waits behind it.
fn assert_listed_as_stacked(node: &Node, what: &str) {
    let text = node.natledger(&["list"], "", &[]);
    assert_ok(&text, "list");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("b+eth0 ") && l.contains("alive (serves, in front of a+eth0)"))
            && text
                .lines()
                .any(|l| l.starts_with("a+eth0 ") && l.contains("alive (behind b+eth0)")),
        "{what}: list:\n{text}"
    );
    let json = node.natledger(&["list", "--json"], "", &[]);
    assert_ok(&json, "list --json");
    let listed: Value = serde_json::from_slice(&json.stdout).unwrap();
    let entry = |id: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["container_id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{what}: {id} not listed: {listed:#}"))
    };
    assert_eq!(entry("a+eth0")["behind"], json!(["b+eth0"]), "{what}");
    assert_eq!(entry("b+eth0")["in_front_of"], json!(["a+eth0"]), "{what}");
    assert_eq!(entry("b+eth0")["stacked_on"], json!(["a+eth0"]), "{what}");
}

/// `doctor`: on the iptables backends an informational finding per stacked port naming who
/// serves and who waits; on none a shadow error or a dead target.
fn assert_doctor_says_stacked(node: &Node, backend: Backend, what: &str) {
    let d = node.natledger(&["doctor", "--json"], "", &[]);
    let report: Value = serde_json::from_slice(&d.stdout)
        .unwrap_or_else(|e| panic!("{what}: doctor --json ({e}): {}", stderr(&d)));
    let findings = report["findings"].as_array().unwrap();
    let bad: Vec<&Value> = findings
        .iter()
        .filter(|f| {
            (f["kind"] == "shadowed" && f["severity"] != "info") || f["kind"] == "dead-target"
        })
        .collect();
    assert!(bad.is_empty(), "{what}: {bad:#?}");
    if backend.is_iptables() {
        for port in ["8080/tcp", "8053/udp"] {
            let said = format!("Stacked: b+eth0 serves {port}, a+eth0 waits behind it");
            assert!(
                findings.iter().any(|f| f["severity"] == "info"
                    && f["summary"].as_str().unwrap_or("").starts_with(&said)),
                "{what}: no {said:?}: {report:#}"
            );
        }
    }
}

/// a, then b: b serves (TCP, and the sending UDP client moves); list, doctor and a sweep
/// while both live; b's DEL gives the port back to a; a's DEL restores the dumps.
#[test]
fn the_newer_serves_until_its_del_then_the_older_again() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b, _servers) = two(&mut node);
        node.warm_up();
        let before = node.dump();

        assert_ok(&call(&node, "ADD", "a", &a, false), "ADD a");
        assert_eq!(tcp_answer(&node).as_deref(), Some("A"), "{backend:?}");
        let ext = node.topo.ext().to_string();
        let client = UdpClient::start(&ext, sock(EXT_V4, 40053), sock(NODE_V4, 8053));
        follows(&client, "A", Instant::now(), "after ADD a");

        let out = call(&node, "ADD", "b", &b, false);
        let since = Instant::now();
        assert_ok(&out, "ADD b");
        let said = stderr(&out);
        assert!(
            said.contains(
                "host port 8080:80/tcp of a+eth0 now forwarded to b+eth0; a+eth0 gets it back \
                 when b+eth0 goes"
            ),
            "{backend:?}: {said}"
        );
        follows(&client, "B", since, "after ADD b");
        assert_eq!(tcp_answer(&node).as_deref(), Some("B"), "{backend:?}");
        assert_listed_as_stacked(&node, &format!("{backend:?}"));
        assert_doctor_says_stacked(&node, backend, &format!("{backend:?}"));

        // A sweep while both live removes nothing.
        let stacked = node.dump();
        assert_ok(&node.sweep(&[]), "sweep");
        assert_eq!(
            node.dump(),
            stacked,
            "{backend:?}: sweep changed the tables"
        );
        assert_eq!(node.manifests(), ["a+eth0.json", "b+eth0.json"]);

        assert_ok(&call(&node, "DEL", "b", &b, false), "DEL b");
        let since = Instant::now();
        follows(&client, "A", since, "after DEL b");
        assert_eq!(tcp_answer(&node).as_deref(), Some("A"), "{backend:?}");

        assert_ok(&call(&node, "DEL", "a", &a, false), "DEL a");
        client.stop();
        assert_eq!(node.manifests(), Vec::<String>::new());
        assert_eq!(node.dump(), before, "{backend:?}: dumps after both DELs");
    });
}

/// a, then b; a's DEL first: b keeps serving, and its UDP flow's conntrack entry is the same
/// one (a's DEL forgets only the flows a's DNAT took); b's DEL restores the dumps.
#[test]
fn the_older_del_first_leaves_the_newer_serving_and_its_flows() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b, _servers) = two(&mut node);
        node.warm_up();
        let before = node.dump();
        assert_ok(&call(&node, "ADD", "a", &a, false), "ADD a");
        assert_ok(&call(&node, "ADD", "b", &b, false), "ADD b");
        let ext = node.topo.ext().to_string();
        let client = UdpClient::start(&ext, sock(EXT_V4, 40053), sock(NODE_V4, 8053));
        follows(&client, "B", Instant::now(), "after both ADDs");
        let ids = udp_entry_ids(&node);
        assert_eq!(ids.len(), 1, "{backend:?}: one flow");

        assert_ok(&call(&node, "DEL", "a", &a, false), "DEL a");
        let since = Instant::now();
        assert_eq!(tcp_answer(&node).as_deref(), Some("B"), "{backend:?}");
        follows(&client, "B", since, "after DEL a");
        assert_eq!(
            udp_entry_ids(&node),
            ids,
            "{backend:?}: a's DEL forgot b's flow"
        );
        assert_eq!(node.manifests(), ["b+eth0.json"]);

        assert_ok(&call(&node, "DEL", "b", &b, false), "DEL b");
        client.stop();
        assert_eq!(node.manifests(), Vec::<String>::new());
        assert_eq!(node.dump(), before, "{backend:?}: dumps after both DELs");
    });
}

/// a, then b; a's namespace deleted without a DEL: a sweep removes a's rules and manifest
/// only, b keeps serving and its UDP flow's conntrack entry is the same one.
#[test]
fn a_sweep_of_a_dead_older_leaves_the_newer_and_its_flows() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b, _servers) = two(&mut node);
        node.warm_up();
        let before = node.dump();
        assert_ok(&call(&node, "ADD", "a", &a, false), "ADD a");
        assert_ok(&call(&node, "ADD", "b", &b, false), "ADD b");
        let ext = node.topo.ext().to_string();
        let client = UdpClient::start(&ext, sock(EXT_V4, 40053), sock(NODE_V4, 8053));
        follows(&client, "B", Instant::now(), "after both ADDs");
        let ids = udp_entry_ids(&node);

        node.topo.delete_ns_now(&a.ns);
        assert_ok(&node.sweep(&[]), "sweep");
        let since = Instant::now();
        assert_eq!(node.manifests(), ["b+eth0.json"]);
        assert!(!node.dump().contains("natledger:a+eth0"), "{backend:?}");
        assert_eq!(tcp_answer(&node).as_deref(), Some("B"), "{backend:?}");
        follows(&client, "B", since, "after the sweep");
        assert_eq!(
            udp_entry_ids(&node),
            ids,
            "{backend:?}: the sweep forgot b's flow"
        );

        assert_ok(&call(&node, "DEL", "b", &b, false), "DEL b");
        client.stop();
        assert_eq!(node.dump(), before, "{backend:?}: dumps after b's DEL");
    });
}

/// With `portConflict: "refuse"` the second ADD fails with code 100 naming the holder, and
/// leaves no rule and no manifest; its DEL changes nothing.
#[test]
fn with_port_conflict_refuse_the_second_add_fails_and_writes_nothing() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b, _servers) = two(&mut node);
        node.warm_up();
        let before = node.dump();
        assert_ok(&call(&node, "ADD", "a", &a, true), "ADD a");
        let held = node.dump();

        let out = call(&node, "ADD", "b", &b, true);
        assert!(
            !out.status.success(),
            "{backend:?}: the second ADD succeeded"
        );
        let error: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no error object ({e}): {}", stderr(&out)));
        assert_eq!(error["code"], 100, "{error:#}");
        let details = error["details"].as_str().unwrap_or("");
        assert!(
            details.contains("is held by live container a+eth0")
                && details.contains("in another network namespace"),
            "{backend:?}: {error:#}"
        );
        assert_eq!(node.dump(), held, "{backend:?}: the refused ADD wrote");
        assert_eq!(node.manifests(), ["a+eth0.json"]);
        assert_eq!(tcp_answer(&node).as_deref(), Some("A"), "{backend:?}");

        assert_ok(&call(&node, "DEL", "b", &b, true), "DEL b");
        assert_eq!(node.dump(), held, "{backend:?}: the refused one's DEL");
        assert_ok(&call(&node, "DEL", "a", &a, true), "DEL a");
        assert_eq!(node.dump(), before, "{backend:?}");
    });
}

/// a, then b; then j, another attachment in b's namespace asking the same ports: it shares
/// b's rules (nothing written, no `stacked_on`, no "now forwarded"), b keeps serving, and
/// j's DEL changes nothing.
#[test]
fn a_joiner_of_the_newers_namespace_shares_its_place() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b, _servers) = two(&mut node);
        node.warm_up();
        let before = node.dump();
        assert_ok(&call(&node, "ADD", "a", &a, false), "ADD a");
        assert_ok(&call(&node, "ADD", "b", &b, false), "ADD b");
        let stacked = node.dump();

        let out = call(&node, "ADD", "j", &b, false);
        assert_ok(&out, "ADD j");
        let said = stderr(&out);
        assert!(!said.contains("now forwarded"), "{backend:?}: {said}");
        assert_eq!(node.dump(), stacked, "{backend:?}: the joiner wrote");
        let list = node.natledger(&["list", "--json"], "", &[]);
        let listed: Value = serde_json::from_slice(&list.stdout).unwrap();
        let j = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["container_id"] == "j+eth0")
            .unwrap_or_else(|| panic!("{backend:?}: {listed:#}"));
        assert!(j.get("stacked_on").is_none(), "{backend:?}: {j:#}");
        assert_eq!(j["shares"][0]["holder"], "b+eth0", "{backend:?}: {j:#}");
        assert_eq!(tcp_answer(&node).as_deref(), Some("B"), "{backend:?}");

        assert_ok(&call(&node, "DEL", "j", &b, false), "DEL j");
        assert_eq!(node.dump(), stacked, "{backend:?}: the joiner's DEL");
        assert_eq!(tcp_answer(&node).as_deref(), Some("B"), "{backend:?}");
        for (cid, c) in [("b", &b), ("a", &a)] {
            assert_ok(&call(&node, "DEL", cid, c, false), "DEL");
        }
        assert_eq!(node.dump(), before, "{backend:?}: dumps after the DELs");
    });
}

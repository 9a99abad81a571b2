//! `natledger doctor` over other owners' native nftables tables, live in private network
//! namespaces, with each owner's ruleset loaded by `nft -f` from `tests/fixtures/nftables/`
//! (shaped as kube-proxy's nftables mode, netavark, CNI portmap, firewalld and Docker 29 write
//! them), real listeners and real TCP and UDP clients (the UDP ones keep sending from one
//! source port throughout):
//! - seed 004 in nftables mode: kube-proxy's `no-endpoint-nodeports` verdict map rejects a
//!   hostNetwork listener's 30080 (connection refused, no UDP reply); doctor names the map
//!   element and its owner, and running its printed fix lets both clients through;
//! - seed 003 in nftables mode: `service-nodeports` sends the node's 30081 to a pod, so the
//!   local listener gets nothing; doctor's fix gives the port back to it;
//! - seed 000 in nftables mode: netavark's stale DNAT for a dead container's 8080 sits before
//!   the live container's; doctor names both rules by handle, the stale one's deletion restores
//!   the live container's port; CNI portmap's nftables backend likewise for 8081;
//! - `--json`, the text report, and `--from nftables:FILE` of the same ruleset saved as
//!   `nft -a list ruleset` text and as `nft -j list ruleset` JSON agree on what they find,
//!   handles included (plain `nft list ruleset`, without handles, by position);
//! - healthy rulesets of each owner (kube-proxy with endpoints, a clean podman host, firewalld
//!   defaults) serve their clients and give no finding at all; Docker 29 (icc off) no error;
//! - the metrics count native findings under the same kinds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// A fixture under `tests/fixtures/nftables/`.
fn nft_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nftables")
        .join(name)
}

/// A node with the owner's ruleset `name` loaded in its namespace with `nft -f`.
fn node_with(name: &str) -> Node {
    let node = Node::new(Backend::IptablesNft);
    let text = std::fs::read_to_string(nft_fixture(name)).unwrap();
    load_nft(node.topo.node(), &text);
    node
}

/// The node's ruleset saved as `nft list ruleset` (no handles), `nft -a list ruleset` and
/// `nft -j list ruleset` print it.
struct Saved {
    _dir: tempfile::TempDir,
    text: PathBuf,
    handles: PathBuf,
    json: PathBuf,
}

fn save_ruleset(node: &Node) -> Saved {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("ruleset.txt");
    let handles = dir.path().join("ruleset-a.txt");
    let json = dir.path().join("ruleset.json");
    for (args, path) in [
        (&["list", "ruleset"][..], &text),
        (&["-a", "list", "ruleset"][..], &handles),
        (&["-j", "list", "ruleset"][..], &json),
    ] {
        let out = run_in(node.topo.node(), "nft", args, None);
        assert!(out.status.success(), "nft {args:?}: {}", stderr(&out));
        std::fs::write(path, &out.stdout).unwrap();
    }
    Saved {
        _dir: dir,
        text,
        handles,
        json,
    }
}

/// Doctor on the saved ruleset, one format.
fn from_saved(path: &Path) -> Doc {
    let label = format!("nftables:{}", path.display());
    doctor_json(&["--from", &label])
}

/// The findings of `kind` about `port`/`proto`.
fn about<'a>(d: &'a Doc, kind: &str, port: u16, proto: &str) -> Vec<&'a Value> {
    d.of_kind(kind)
        .into_iter()
        .filter(|f| f["port"] == port && f["protocol"] == proto)
        .collect()
}

/// The one finding of `kind` about `port`/`proto`.
fn one<'a>(d: &'a Doc, kind: &str, port: u16, proto: &str) -> &'a Value {
    let found = about(d, kind, port, proto);
    assert_eq!(
        found.len(),
        1,
        "one {kind} for {port}/{proto}\n{}",
        d.show()
    );
    found[0]
}

/// The rules of a finding that name an nftables place (`handle` or `element`).
fn native_rules(f: &Value) -> Vec<&Value> {
    f["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["backend"] == "nftables")
        .collect()
}

/// What a finding says, stripped of what differs between a live read and a dump (the
/// source, the listener evidence a dump has not): kind, port, protocol, and each rule's
/// table, chain, position, line, element and (with `handles`) handle, for comparing reports
/// of one ruleset.
fn gist(d: &Doc, handles: bool) -> Vec<String> {
    let mut out: Vec<String> = d
        .findings()
        .iter()
        .map(|f| {
            let rules: Vec<String> = native_rules(f)
                .iter()
                .map(|r| {
                    format!(
                        "{} {} {} #{} {} {} {}",
                        r["table_family"],
                        r["table"],
                        r["chain"],
                        r["position"],
                        r["line"],
                        r["element"],
                        if handles { &r["handle"] } else { &Value::Null }
                    )
                })
                .collect();
            format!(
                "{} {} {} {}",
                f["kind"],
                f["port"],
                f["protocol"],
                rules.join("; ")
            )
        })
        .collect();
    out.sort();
    out
}

/// Runs in `ns` every command of `fix` that changes the ruleset or conntrack (`nft ...`,
/// `conntrack ...`), as an operator pasting them would; the lasting fixes in an owner's
/// terms (`kubectl ...`) are left out. Returns the commands run.
fn run_fix(ns: &str, fix: &str) -> Vec<String> {
    let mut ran = Vec::new();
    for line in fix.lines().map(str::trim) {
        if !(line.starts_with("nft ") || line.starts_with("conntrack ")) {
            continue;
        }
        let out = run_in(ns, "sh", &["-c", line], None);
        // conntrack -D exits 1 when no entry matched: nothing to forget is fine.
        let ok = out.status.success() || line.starts_with("conntrack ");
        assert!(ok, "fix `{line}` failed: {}", stderr(&out));
        ran.push(line.to_string());
    }
    assert!(!ran.is_empty(), "no command to run in the fix:\n{fix}");
    ran
}

/// `natledger doctor` (text) in the node.
fn live_text(node: &Node, args: &[&str]) -> String {
    let mut all = vec!["doctor"];
    all.extend_from_slice(args);
    let out = node.natledger(&all, "", &[]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A UDP client from `ext` to the node's `port`, sending from one source port throughout.
fn udp_client(node: &Node, port: u16) -> UdpClient {
    UdpClient::start(
        node.topo.ext(),
        sock(EXT_V4, 40000 + port % 20000),
        sock(NODE_V4, port),
    )
}

fn refused(r: std::io::Result<String>) -> bool {
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// Seed 004 in nftables mode: a NodePort without endpoints rejects the node's 30080, TCP and
/// UDP, so a hostNetwork process listening there gets "connection refused"; doctor names
/// kube-proxy's `no-endpoint-nodeports` elements and prints their deletion, which lets both
/// clients through.
#[test]
fn seed004_no_endpoint_nodeport_rejects_a_hostnetwork_listener() {
    let node = node_with("kube_proxy_no_endpoints.nft");
    let ns = node.topo.node().to_string();
    let _tcp = serve_tcp(&ns, sock(std::net::Ipv4Addr::UNSPECIFIED, 30080), "host");
    let _udp = serve_udp(&ns, sock(std::net::Ipv4Addr::UNSPECIFIED, 30080), "host");
    let client = udp_client(&node, 30080);
    // The problem, on real connections: refused, and no datagram answered.
    let r = tcp_request(node.topo.ext(), sock(NODE_V4, 30080), T);
    assert!(refused(r), "TCP to 30080 is rejected");
    std::thread::sleep(Duration::from_secs(1));
    assert!(client.replies().is_empty(), "{:?}", client.replies());

    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let saved = save_ruleset(&node);
    let mut fixes = Vec::new();
    for proto in ["tcp", "udp"] {
        let f = one(&d, "hijacked-listener", 30080, proto);
        assert_eq!(f["severity"], "error", "{f}");
        let rules = native_rules(f);
        let element = rules
            .iter()
            .find(|r| !r["element"].is_null())
            .unwrap_or_else(|| panic!("no element named\n{f}"));
        assert_eq!(
            (
                element["table_family"].as_str(),
                element["table"].as_str(),
                element["owner"].as_str(),
                element["element"]["set"].as_str(),
                element["element"]["key"].as_str(),
            ),
            (
                Some("ip"),
                Some("kube-proxy"),
                Some("kube-proxy"),
                Some("no-endpoint-nodeports"),
                Some(format!("{proto} . 30080").as_str()),
            ),
            "{f}"
        );
        let fix = text(f, "fix");
        assert!(
            fix.contains(&format!(
                "nft delete element ip kube-proxy no-endpoint-nodeports {{ {proto} . 30080 }}"
            )),
            "{fix}"
        );
        fixes.push(fix);
    }
    // The text report says the same: the map element, its owner, the fix.
    let report = live_text(&node, &[]);
    assert!(report.contains("no-endpoint-nodeports"), "{report}");
    assert!(report.contains("kube-proxy"), "{report}");
    assert!(
        report.contains("nft delete element ip kube-proxy no-endpoint-nodeports"),
        "{report}"
    );
    // A dump has no listener to judge against (as for iptables dumps): the same ruleset from
    // either format is read whole and claims nothing about a listener.
    for path in [&saved.text, &saved.handles, &saved.json] {
        let f = from_saved(path);
        assert_eq!(f.code, 0, "{}", f.show());
        assert!(f.of_kind("hijacked-listener").is_empty(), "{}", f.show());
        assert!(
            f.report["rules_read"].as_u64().unwrap() >= 20,
            "{}",
            f.show()
        );
    }
    // The printed fix restores both.
    for fix in &fixes {
        run_fix(&ns, fix);
    }
    let since = Instant::now();
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 30080), T)
            .ok()
            .as_deref(),
        Some("host")
    );
    assert!(
        client.wait_for("host", since, T).is_some(),
        "UDP answered after the fix"
    );
    let d = live(&node, &[]);
    assert!(d.findings().is_empty(), "{}", d.show());
}

/// Seed 003 in nftables mode: kube-proxy's `service-nodeports` sends the node's 30081 (TCP and
/// UDP) to a pod, so the local process listening there gets nothing; doctor names the
/// elements and the Service as the lasting fix, and deleting the elements gives the port
/// back to the listener.
#[test]
fn seed003_service_nodeport_takes_a_local_listeners_port() {
    let mut node = node_with("kube_proxy_nodeport_listener.nft");
    let pod = node.topo.add_container(2);
    let _pod_tcp = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    let _pod_udp = serve_udp(&pod.ns, pod.sock_v4(80), "pod");
    let ns = node.topo.node().to_string();
    let _tcp = serve_tcp(&ns, sock(std::net::Ipv4Addr::UNSPECIFIED, 30081), "host");
    let _udp = serve_udp(&ns, sock(std::net::Ipv4Addr::UNSPECIFIED, 30081), "host");
    let client = udp_client(&node, 30081);
    // The problem: the listener's clients reach the pod.
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 30081), T)
            .ok()
            .as_deref(),
        Some("pod")
    );
    let start = Instant::now();
    assert!(client.wait_for("pod", start, T).is_some());
    assert!(!client.replies().iter().any(|(_, r)| r == "host"));

    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let mut fixes = Vec::new();
    for proto in ["tcp", "udp"] {
        let f = one(&d, "hijacked-listener", 30081, proto);
        let rules = native_rules(f);
        assert!(
            rules.iter().any(|r| r["owner"] == "kube-proxy"
                && r["element"]["set"] == "service-nodeports"
                && r["element"]["key"] == format!("{proto} . 30081")),
            "{f}"
        );
        let fix = text(f, "fix");
        assert!(
            fix.contains(&format!(
                "nft delete element ip kube-proxy service-nodeports {{ {proto} . 30081 }}"
            )),
            "{fix}"
        );
        // kube-proxy writes its maps back: the lasting fix is the Service's.
        assert!(fix.contains("Service") || fix.contains("kubectl"), "{fix}");
        fixes.push(fix);
    }
    for fix in &fixes {
        run_fix(&ns, fix);
    }
    let since = Instant::now();
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 30081), T)
            .ok()
            .as_deref(),
        Some("host")
    );
    assert!(
        client.wait_for("host", since, T).is_some(),
        "the UDP client, still on its first source port, reaches the listener: {:?}",
        client.replies_since(since)
    );
    let d = live(&node, &[]);
    assert!(d.findings().is_empty(), "{}", d.show());
}

/// Seed 000 in nftables mode: netavark's DNAT of 8080 (TCP and UDP) to a container that is
/// gone sits before the live container's in the network's dnat chain; doctor says the live
/// one's never matches, naming both rules by handle and netavark as their owner, alike live
/// and from either saved format; deleting the stale rule by its handle restores the port.
#[test]
fn seed000_netavark_stale_dnat_shadows_the_live_container() {
    let mut node = node_with("netavark_stale.nft");
    let live_ctr = node.topo.add_container(3);
    let _tcp = serve_tcp(&live_ctr.ns, live_ctr.sock_v4(80), "live");
    let _udp = serve_udp(&live_ctr.ns, live_ctr.sock_v4(80), "live");
    let client = udp_client(&node, 8080);
    // The problem: packets go to 10.77.0.2, which nothing holds.
    assert!(tcp_request(node.topo.ext(), sock(NODE_V4, 8080), T).is_err());
    std::thread::sleep(Duration::from_secs(1));
    assert!(client.replies().is_empty(), "{:?}", client.replies());

    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let chain = "nv_2f259bab_10_77_0_0_nm24_dnat";
    let mut fixes = Vec::new();
    for proto in ["tcp", "udp"] {
        let f = one(&d, "shadowed", 8080, proto);
        let rules = native_rules(f);
        assert!(rules.len() >= 2, "the shadowed rule and its shadow\n{f}");
        for r in &rules {
            assert_eq!(
                (
                    r["table_family"].as_str(),
                    r["table"].as_str(),
                    r["owner"].as_str()
                ),
                (Some("inet"), Some("netavark"), Some("netavark")),
                "{f}"
            );
            assert!(r["handle"].is_u64(), "{f}");
        }
        let lines: Vec<&str> = rules.iter().filter_map(|r| r["line"].as_str()).collect();
        assert!(
            lines.iter().any(|l| l.contains("10.77.0.3:80")),
            "the live DNAT is named: {lines:?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("10.77.0.2:80")),
            "the stale DNAT is named: {lines:?}"
        );
        let stale = rules
            .iter()
            .find(|r| r["line"].as_str().unwrap_or("").contains("10.77.0.2:80"))
            .unwrap();
        let fix = text(f, "fix");
        assert!(
            fix.contains(&format!(
                "nft delete rule inet netavark {chain} handle {}",
                stale["handle"]
            )),
            "{fix}"
        );
        fixes.push(fix);
    }
    // The same findings from the ruleset saved in either format.
    let saved = save_ruleset(&node);
    let shadows = |d: &Doc, handles: bool| -> Vec<String> {
        gist(d, handles)
            .into_iter()
            .filter(|g| g.starts_with("\"shadowed\""))
            .collect()
    };
    for (path, handles) in [
        (&saved.handles, true),
        (&saved.json, true),
        (&saved.text, false),
    ] {
        let f = from_saved(path);
        assert_eq!(
            shadows(&f, handles),
            shadows(&d, handles),
            "{}\n{}",
            f.show(),
            d.show()
        );
    }
    let report = live_text(&node, &[]);
    assert!(
        report.contains(chain) && report.contains("handle"),
        "{report}"
    );
    assert!(report.contains("nft delete rule inet netavark"), "{report}");

    for fix in &fixes {
        run_fix(node.topo.node(), fix);
    }
    let since = Instant::now();
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 8080), T)
            .ok()
            .as_deref(),
        Some("live")
    );
    assert!(
        client.wait_for("live", since, T).is_some(),
        "the UDP client, still on its first source port, reaches the live container: {:?}",
        client.replies_since(since)
    );
    let d = live(&node, &[]);
    assert!(d.of_kind("shadowed").is_empty(), "{}", d.show());
}

/// CNI portmap's nftables backend: a dead attachment's DNAT of 8081 before the live one's
/// (portmap appends); doctor names portmap's rules by handle and the fix restores the port.
#[test]
fn portmap_stale_dnat_shadows_the_live_attachment() {
    let mut node = node_with("portmap_stale.nft");
    let c = node.topo.add_container(4);
    let _tcp = serve_tcp(&c.ns, c.sock_v4(80), "live");
    assert!(tcp_request(node.topo.ext(), sock(NODE_V4, 8081), T).is_err());
    let d = live(&node, &["--port", "8081"]);
    let f = one(&d, "shadowed", 8081, "tcp");
    let rules = native_rules(f);
    assert!(
        rules
            .iter()
            .all(|r| r["owner"] == "portmap" && r["table"] == "cni_hostport"),
        "{f}"
    );
    run_fix(node.topo.node(), &text(f, "fix"));
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 8081), T)
            .ok()
            .as_deref(),
        Some("live")
    );
}

/// Healthy rulesets of each owner serve their clients, and doctor finds nothing in them,
/// live or from either saved format.
fn healthy(node: &Node, port: u16, want: &str, udp: bool) {
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, port), T)
            .ok()
            .as_deref(),
        Some(want)
    );
    if udp {
        let client = udp_client(node, port);
        assert!(client.wait_for(want, Instant::now(), T).is_some());
    }
    let d = live(node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    assert!(
        d.report["sources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str().unwrap_or("").starts_with("nftables")),
        "{}",
        d.show()
    );
    let saved = save_ruleset(node);
    for path in [&saved.text, &saved.handles, &saved.json] {
        let f = from_saved(path);
        assert_eq!((f.code, f.findings().len()), (0, 0), "{}", f.show());
    }
}

#[test]
fn healthy_kube_proxy_with_endpoints_has_no_findings() {
    let mut node = node_with("kube_proxy_endpoints.nft");
    let pod = node.topo.add_container(2);
    let _tcp = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    let _udp = serve_udp(&pod.ns, pod.sock_v4(80), "pod");
    healthy(&node, 30080, "pod", true);
}

#[test]
fn healthy_podman_host_has_no_findings() {
    let mut node = node_with("netavark_clean.nft");
    let c = node.topo.add_container(3);
    let _tcp = serve_tcp(&c.ns, c.sock_v4(80), "live");
    let _udp = serve_udp(&c.ns, c.sock_v4(80), "live");
    healthy(&node, 8080, "live", true);
}

#[test]
fn healthy_firewalld_defaults_have_no_findings() {
    let node = node_with("firewalld_defaults.nft");
    let _sshd = serve_tcp(
        node.topo.node(),
        sock(std::net::Ipv4Addr::UNSPECIFIED, 22),
        "ssh",
    );
    healthy(&node, 22, "ssh", false);
}

/// Docker 29 with `icc=false` serves its published port; doctor makes no error of it. (It
/// warns that the per-bridge `ICC` drop may take some forwarded connections: which ones
/// depends on the input interface and `ct original ip daddr`, which a probe from an unknown
/// interface leaves open.)
#[test]
fn healthy_docker29_has_no_errors() {
    let mut node = node_with("docker29.nft");
    let c = node.topo.add_container(6);
    let _tcp = serve_tcp(&c.ns, c.sock_v4(80), "docker");
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 8082), T)
            .ok()
            .as_deref(),
        Some("docker")
    );
    let d = live(&node, &[]);
    assert!(d.code <= 1, "{}", d.show());
    assert!(
        d.findings()
            .iter()
            .all(|f| f["kind"] == "forward-dropped" && f["severity"] == "warning"),
        "{}",
        d.show()
    );
}

/// The metrics carry native findings under the same kinds: the seed 000 ruleset's two
/// shadows (8080/tcp and 8080/udp) from the fixture itself (no handles: by position), and
/// every native rule read.
#[test]
fn metrics_count_native_findings_under_the_same_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("doctor.prom");
    let from = format!("nftables:{}", nft_fixture("netavark_stale.nft").display());
    let d = doctor_json(&["--from", &from, "--metrics-file", metrics.to_str().unwrap()]);
    assert_eq!(d.code, 2, "{}", d.show());
    assert_eq!(d.report["rules_read"], 29, "{}", d.show());
    let text = std::fs::read_to_string(&metrics).unwrap();
    for line in [
        "natledger_doctor_last_findings{kind=\"shadowed\",severity=\"error\"} 2",
        "natledger_doctor_last_findings{kind=\"hijacked-listener\",severity=\"error\"} 0",
        "natledger_doctor_last_rules_read 29",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
}

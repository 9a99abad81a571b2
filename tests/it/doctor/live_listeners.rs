//! `natledger doctor` live: local listeners whose traffic a rule takes (seeds 003 and 004),
//! in private network namespaces.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// Seed 003 live: kube-proxy's NodePort DNAT in nat PREROUTING/OUTPUT for 30080 while a
/// non-Kubernetes process listens on 30080 (IPv4): its traffic goes to the pod.
#[test]
fn live_seed003_nodeport_hijacks_a_listener() {
    let mut node = Node::new(Backend::IptablesNft);
    let pod = node.topo.add_container(2);
    let _pod = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    load_fixture(
        &node,
        Backend::IptablesNft,
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
    let mut node = Node::new(Backend::IptablesNft);
    let pod = node.topo.add_container(2);
    let _pod = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    load_fixture(
        &node,
        Backend::IptablesNft,
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
    let mut node = Node::new(Backend::IptablesNft);
    load_fixture(
        &node,
        Backend::IptablesNft,
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
    let node = Node::new(Backend::IptablesNft);
    load_fixture(&node, Backend::IptablesNft, Family::V4, fixture);
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

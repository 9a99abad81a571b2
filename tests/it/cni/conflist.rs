//! natledger in a conflist run as libcni runs it (`tests/common/libcni.rs`): Debian's bridge
//! and host-local wire a bare namespace, natledger (or portmap, side by side) maps the ports,
//! with real traffic from the `ext` namespace to the node's address and full dumps.
//!
//! - `a_conflist_add_check_del_forwards_and_restores`: ADD (the bridge's result as
//!   `prevResult`), TCP and UDP over IPv4 and IPv6, CHECK, DEL with the cached result: the
//!   dumps as before ADD; every backend.
//! - `portmap_serves_the_same_conflist`: the list with `type: portmap` instead forwards the
//!   same (the driver runs portmap as it runs natledger); portmap 1.1.1's CHECK of a
//!   dual-stack attachment fails where natledger's passes.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::json;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// The container's IPv4 and IPv6 addresses in an ADD result.
fn v4_v6(result: &serde_json::Value) -> (IpAddr, IpAddr) {
    let ips = container_ips(result);
    let v4 = *ips.iter().find(|ip| ip.is_ipv4()).expect("an IPv4 address");
    let v6 = *ips.iter().find(|ip| ip.is_ipv6()).expect("an IPv6 address");
    (v4, v6)
}

#[test]
fn a_conflist_add_check_del_forwards_and_restores() {
    both(|backend| {
        let mut node = Node::new(backend);
        let pod = node.topo.add_sandbox(2);
        let _servers = [
            serve_tcp(&pod, sock([0, 0, 0, 0], 80), "pod tcp"),
            serve_udp(&pod, sock([0, 0, 0, 0], 53), "pod udp"),
            serve_tcp(&pod, sock(std::net::Ipv6Addr::UNSPECIFIED, 80), "pod tcp6"),
        ];
        node.warm_up();
        let before = node.dump();
        let net = Conflist::bridge(&node, "net1", 1).with_plugin("natledger", json!({}));
        let ports = [PortMap::tcp(8080, 80), PortMap::udp(5353, 53)];
        let result = net
            .add("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} ADD: {e}"));
        let (v4, v6) = v4_v6(&result);
        assert!(v4.to_string().starts_with("10.79.1."), "{result}");
        assert!(v6.to_string().starts_with("fd79:1::"), "{result}");
        assert_eq!(
            net.cached("pod2"),
            Some(result.clone()),
            "the result cached"
        );
        let id = format!("pod2+{IFNAME}");
        assert_eq!(node.manifest(&id)["cni"]["network"], "net1");

        let ext = node.topo.ext().to_string();
        let dump = || node.dump();
        let tcp = tcp_request(&ext, sock(NODE_V4, 8080), T);
        assert_eq!(
            tcp.as_deref().ok(),
            Some("pod tcp"),
            "{backend:?} {tcp:?}\n{}",
            dump()
        );
        let tcp6 = tcp_request(&ext, sock(NODE_V6, 8080), T);
        assert_eq!(
            tcp6.as_deref().ok(),
            Some("pod tcp6"),
            "{backend:?} {tcp6:?}"
        );
        let udp = udp_request(&ext, sock(NODE_V4, 5353), T);
        assert_eq!(udp.as_deref().ok(), Some("pod udp"), "{backend:?} {udp:?}");

        net.check("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} CHECK: {e}"));
        net.del("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} DEL: {e}"));
        assert_eq!(net.cached("pod2"), None, "the cache dropped");
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
        assert_eq!(node.dump(), before, "{backend:?}: DEL restores the tables");
        assert!(tcp_request(&ext, sock(NODE_V4, 8080), T).is_err());
        // A second DEL, as runtimes repeat it, succeeds.
        net.del("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} second DEL: {e}"));
        assert_eq!(node.dump(), before);
    });
}

#[test]
fn portmap_serves_the_same_conflist() {
    let mut node = Node::new(Backend::Nft);
    let pod = node.topo.add_sandbox(2);
    let _server = serve_tcp(&pod, sock([0, 0, 0, 0], 80), "pod tcp");
    let net = Conflist::bridge(&node, "net1", 1).with_plugin("portmap", json!({}));
    let ports = [PortMap::tcp(8080, 80)];
    net.add("pod2", &pod, &ports)
        .unwrap_or_else(|e| panic!("portmap ADD: {e}"));
    let ext = node.topo.ext().to_string();
    let tcp = tcp_request(&ext, sock(NODE_V4, 8080), T);
    assert_eq!(
        tcp.as_deref().ok(),
        Some("pod tcp"),
        "{tcp:?}\n{}",
        node.dump()
    );
    // portmap 1.1.1's CHECK of a dual-stack attachment looks for its IPv4 rules in the
    // IPv6 table and fails; natledger's passes (the test above).
    let check = net
        .check("pod2", &pod, &ports)
        .expect_err("portmap's CHECK fails");
    assert!(
        check.message().contains("could not check ipv6 dnat"),
        "{check}"
    );
    net.del("pod2", &pod, &ports)
        .unwrap_or_else(|e| panic!("portmap DEL: {e}"));
    assert!(tcp_request(&ext, sock(NODE_V4, 8080), T).is_err());
}

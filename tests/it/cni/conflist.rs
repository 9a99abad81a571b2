//! natledger in a conflist run as libcni runs it (`tests/common/libcni.rs`): Debian's bridge
//! and host-local wire a bare namespace, natledger (or portmap, side by side) maps the ports,
//! with real traffic from the `ext` namespace to the node's address and full dumps.
//!
//! - `a_conflist_add_check_del_forwards_and_restores`: ADD (the bridge's result as
//!   `prevResult`), TCP and UDP over IPv4 and IPv6, CHECK, DEL with the cached result: the
//!   dumps as before ADD; every backend.
//! - `portmap_serves_the_same_conflist`: the list with `type: portmap` instead forwards the
//!   same, `hostIP` included (the driver runs portmap as it runs natledger); portmap 1.1.1's
//!   CHECK of a dual-stack attachment fails where natledger's passes.
//! - `an_sctp_mapping_is_written_checked_and_removed`: an SCTP mapping's DNATs are in both
//!   families' tables, CHECK passes, DEL restores the dumps; every backend. At the rule level
//!   only where the kernel makes no SCTP socket (this machine's: it says so on stderr).
//! - `a_host_ip_mapping_answers_on_that_address_only`: `hostIP` mappings (one IPv4, one IPv6)
//!   answer on that node address, not on the node's other address (where an unrestricted
//!   mapping answers) nor in the other family.
//! - `status_answers_50_when_natledger_cannot_write`: STATUS through a 1.1.0 list is ready on
//!   every backend; 50 for a state directory that cannot be made, and on the iptables
//!   backends with the tools not installed (an empty /usr/sbin), naming the tool; natledger's
//!   own tables need none; below 1.1.0 libcni asks nothing. GC at 1.1.0 reaches natledger.
//! - `gc_deletes_the_cached_attachments_missing_from_the_valid_list`: libcni's GC at 1.0.0
//!   (Debian's plugins), a DEL through the cache of each attachment not listed: its port
//!   goes, the listed one answers.
//! - `the_lists_version_is_the_highest_debians_plugins_accept`: libcni's validation (VERSION)
//!   passes at `PLUGINS_VERSION`, the bridge refuses 1.1.0, natledger accepts it.

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
    let mut node = Node::new(Backend::IptablesNft);
    let pod = node.topo.add_sandbox(2);
    let _server = serve_tcp(&pod, sock([0, 0, 0, 0], 80), "pod tcp");
    let net = Conflist::bridge(&node, "net1", 1).with_plugin("portmap", json!({}));
    let ports = [PortMap::tcp(8080, 80), PortMap::tcp(8081, 80).on(NODE_V4)];
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
    // portmap's `hostIP` as natledger's (`a_host_ip_mapping_answers_on_that_address_only`).
    let answer = |ip: std::net::Ipv4Addr| tcp_request(&ext, sock(ip, 8081), T).ok();
    assert_eq!(answer(NODE_V4).as_deref(), Some("pod tcp"));
    assert_eq!(answer(BRIDGE_V4), None);
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

/// Whether this kernel makes SCTP sockets (in the namespace `ns`).
fn sctp_sockets(ns: &str) -> Result<(), std::io::Error> {
    in_netns(ns, || {
        // SAFETY: socket(2) with constant arguments; the descriptor is closed at once.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a descriptor this closure just opened.
        unsafe { libc::close(fd) };
        Ok(())
    })
}

#[test]
fn an_sctp_mapping_is_written_checked_and_removed() {
    both(|backend| {
        let mut node = Node::new(backend);
        let pod = node.topo.add_sandbox(2);
        node.warm_up();
        let before = node.dump();
        let net = Conflist::bridge(&node, "net1", 1).with_plugin("natledger", json!({}));
        let ports = [PortMap::sctp(9132, 132)];
        let result = net
            .add("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} SCTP ADD: {e}"));
        let (v4, v6) = v4_v6(&result);
        let added = node.dump();
        for (family, to) in [
            (Family::V4, format!("{v4}:132")),
            (Family::V6, format!("[{v6}]:132")),
        ] {
            let chain = if backend.is_iptables() {
                chain_rules(&added, backend, family, "NATLEDGER-HOSTPORTS")
            } else {
                nft_chain_rules(&added, family, "NATLEDGER-HOSTPORTS")
            };
            let dnat = chain
                .iter()
                .find(|r| r.contains("9132") && r.contains(&to))
                .unwrap_or_else(|| panic!("{backend:?} {family:?}: no DNAT to {to}: {chain:?}"));
            assert!(dnat.contains("sctp"), "{backend:?}: {dnat}");
        }
        net.check("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} SCTP CHECK: {e}"));
        net.del("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} SCTP DEL: {e}"));
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: SCTP DEL restores the tables"
        );
        if let Err(e) = sctp_sockets(&pod) {
            eprintln!("SCTP proven at the rule level only: this kernel makes no SCTP socket ({e})");
        }
    });
}

#[test]
fn a_host_ip_mapping_answers_on_that_address_only() {
    both(|backend| {
        let mut node = Node::new(backend);
        let pod = node.topo.add_sandbox(2);
        let _servers = [
            serve_tcp(&pod, sock([0, 0, 0, 0], 80), "pod tcp"),
            serve_tcp(&pod, sock(std::net::Ipv6Addr::UNSPECIFIED, 80), "pod tcp6"),
        ];
        node.warm_up();
        let before = node.dump();
        let net = Conflist::bridge(&node, "net1", 1).with_plugin("natledger", json!({}));
        let ports = [
            PortMap::tcp(8081, 80).on(NODE_V4),
            PortMap::tcp(8082, 80).on(NODE_V6),
            PortMap::tcp(8083, 80),
        ];
        net.add("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} ADD: {e}"));
        let ext = node.topo.ext().to_string();
        let answer = |ip: IpAddr, port| tcp_request(&ext, sock(ip, port), T).ok();
        assert_eq!(
            answer(NODE_V4.into(), 8081).as_deref(),
            Some("pod tcp"),
            "{backend:?}"
        );
        assert_eq!(
            answer(NODE_V6.into(), 8082).as_deref(),
            Some("pod tcp6"),
            "{backend:?}"
        );
        // Unrestricted, the node's other address (its br0, routed from ext) answers too ...
        assert_eq!(
            answer(BRIDGE_V4.into(), 8083).as_deref(),
            Some("pod tcp"),
            "{backend:?}"
        );
        // ... restricted, neither it nor the other family does.
        for (ip, port) in [
            (IpAddr::from(BRIDGE_V4), 8081),
            (NODE_V6.into(), 8081),
            (BRIDGE_V6.into(), 8082),
            (NODE_V4.into(), 8082),
        ] {
            assert_eq!(answer(ip, port), None, "{backend:?}: {ip} port {port}");
        }
        net.check("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} CHECK: {e}"));
        net.del("pod2", &pod, &ports)
            .unwrap_or_else(|e| panic!("{backend:?} DEL: {e}"));
        assert_eq!(node.dump(), before, "{backend:?}: DEL restores the tables");
    });
}

#[test]
fn status_answers_50_when_natledger_cannot_write() {
    for backend in Backend::ALL {
        let node = Node::new(backend);
        // Debian's plugins stop at 1.0.0, where libcni sends no STATUS: natledger alone.
        let net = Conflist::new(&node, "statusnet", "1.1.0").with_plugin("natledger", json!({}));
        net.status()
            .unwrap_or_else(|e| panic!("{backend:?} STATUS: {e}"));
        net.gc(&[])
            .unwrap_or_else(|e| panic!("{backend:?} GC: {e:?}"));
        // A state directory under a regular file cannot be made, so not locked.
        let file = node.dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let blocked = Conflist::new(&node, "statusnet", "1.1.0")
            .with_plugin("natledger", json!({"stateDir": file.join("state")}));
        let e = blocked.status().expect_err("an unusable state directory");
        assert_eq!(e.code(), Some(50), "{backend:?}: {e}");
        assert!(
            e.message().contains("natledger cannot write rules here"),
            "{e}"
        );
        assert!(e.message().contains(&file.display().to_string()), "{e}");
        // The iptables tools not installed (an empty /usr/sbin, where Debian has them): the
        // iptables backends cannot restore; natledger's own tables need no tool.
        let toolless = net.clone().with_hidden("natledger", "/usr/sbin");
        let status = toolless.status();
        if backend.is_iptables() {
            let e = status.expect_err("no restore tool");
            assert_eq!(e.code(), Some(50), "{backend:?}: {e}");
            let tool = format!("iptables-{}-restore", backend.name());
            assert!(e.message().contains(&tool), "{backend:?}: {e}");
        } else {
            status.unwrap_or_else(|e| panic!("{backend:?} STATUS without tools: {e}"));
        }
        // Below 1.1.0 libcni sends no STATUS, whatever the plugins could say.
        let old = Conflist::new(&node, "statusnet", PLUGINS_VERSION)
            .with_plugin("natledger", json!({"stateDir": file.join("state")}));
        assert!(old.status().is_ok(), "{backend:?}");
    }
}

#[test]
fn gc_deletes_the_cached_attachments_missing_from_the_valid_list() {
    both(|backend| {
        let mut node = Node::new(backend);
        let pod2 = node.topo.add_sandbox(2);
        let pod3 = node.topo.add_sandbox(3);
        let _servers = [
            serve_tcp(&pod2, sock([0, 0, 0, 0], 80), "pod2"),
            serve_tcp(&pod3, sock([0, 0, 0, 0], 80), "pod3"),
        ];
        node.warm_up();
        let before = node.dump();
        let net = Conflist::bridge(&node, "net1", 1).with_plugin("natledger", json!({}));
        let (ports2, ports3) = ([PortMap::tcp(8080, 80)], [PortMap::tcp(8081, 80)]);
        for (id, pod, ports) in [("pod2", &pod2, &ports2), ("pod3", &pod3, &ports3)] {
            net.add(id, pod, ports)
                .unwrap_or_else(|e| panic!("{backend:?} ADD {id}: {e}"));
        }
        let ext = node.topo.ext().to_string();
        let answer = |port| tcp_request(&ext, sock(NODE_V4, port), T).ok();
        assert_eq!(answer(8081).as_deref(), Some("pod3"), "{backend:?}");
        net.gc(&["pod2"])
            .unwrap_or_else(|e| panic!("{backend:?} GC: {e:?}"));
        assert_eq!(net.cached("pod3"), None, "{backend:?}: pod3 deleted");
        assert_eq!(
            node.manifests(),
            [format!("pod2+{IFNAME}.json")],
            "{backend:?}"
        );
        assert_eq!(answer(8081), None, "{backend:?}: pod3's port gone");
        assert_eq!(
            answer(8080).as_deref(),
            Some("pod2"),
            "{backend:?}: pod2 kept"
        );
        net.gc(&["pod2"])
            .unwrap_or_else(|e| panic!("{backend:?} second GC: {e:?}"));
        net.del("pod2", &pod2, &ports2)
            .unwrap_or_else(|e| panic!("{backend:?} DEL: {e}"));
        assert_eq!(node.dump(), before, "{backend:?}: every rule gone");
    });
}

#[test]
fn the_lists_version_is_the_highest_debians_plugins_accept() {
    let node = Node::new(Backend::OwnNftables);
    let list = |version: &str| {
        let mut net = Conflist::bridge(&node, "net1", 1).with_plugin("natledger", json!({}));
        net.cni_version = version.into();
        net
    };
    list(PLUGINS_VERSION)
        .validate()
        .unwrap_or_else(|e| panic!("{PLUGINS_VERSION}: {e}"));
    let e = list("1.1.0")
        .validate()
        .expect_err("bridge 1.1.1 stops at 1.0.0");
    assert!(e.message().contains("\"bridge\""), "{e}");
    let alone = Conflist::new(&node, "net1", "1.1.0").with_plugin("natledger", json!({}));
    alone
        .validate()
        .unwrap_or_else(|e| panic!("natledger at 1.1.0: {e}"));
}

//! Issue 24's items proven through libcni's real call sequence (`tests/common/libcni.rs`):
//! Debian's bridge + host-local wire bare sandboxes, natledger maps the ports, on every
//! backend, with real traffic from the `ext` namespace (or from a sandbox) and full dumps;
//! the same conflist with `type: portmap` (1.1.1, on the `iptables` it finds: iptables-nft)
//! in the same test as the control, what it does asserted side by side.
//!
//! - `held_port_the_newest_serves_and_the_oldest_gets_it_back`: two sandboxes ADD the same
//!   host ports (TCP 8080, UDP 8053); the newer serves and a UDP client that keeps sending
//!   moves to it at its ADD; the newer's DEL gives the port (TCP and the flow) back to the
//!   older; the older's DEL leaves the dumps as after a clean ADD and DEL.
//!   portmap accepts the second ADD too, but the older keeps serving (TCP and the flow) until
//!   its DEL; then the newer serves TCP, while the client's UDP flow, still pinned to the
//!   gone older (portmap forgets no flow at DEL), goes unanswered.
//! - `held_port_refused_with_port_conflict_refuse_and_the_runtimes_del_keeps_the_holder`:
//!   with `portConflict: "refuse"` the second ADD fails in natledger (code 100, naming the
//!   holder), nothing cached or written; the runtime's DEL after the failed ADD leaves the
//!   holder's rules and its TCP answering.
//! - `held_port_given_back_by_the_newers_del_without_state_or_sweep`: the newer's DEL through
//!   the conflist after natledger's state directory was lost, and a sweep once the newer's
//!   namespace is gone without a DEL, each give the port (TCP and the sending client's UDP
//!   flow) back to the older; its DEL restores the dumps.
//! - `hairpin_between_sandboxes_with_br_netfilter_off`: `bridge-nf-call-iptables=0` and
//!   `-ip6tables=0` set in the node, bridge `hairpinMode: true`: sandbox B reaches A through
//!   the node's address and A's host port, TCP over IPv4 and IPv6 and a UDP client that keeps
//!   sending (natledger's manifest records the masquerade of the bridge's subnets, without
//!   which these time out); both DELs restore the dumps. portmap reaches it too.
//! - `lost_state_check_passes_and_del_removes_every_rule`: ADD, natledger's whole state
//!   directory deleted; CHECK through the conflist passes and writes nothing, DEL removes
//!   every rule (dumps as before ADD), TCP is refused, the UDP client goes unanswered, a second
//!   DEL succeeds. portmap (no state of its own) removes its DNAT chain at the DEL, which
//!   libcni sends with the cached `runtimeConfig`.
//! - `a_sandbox_namespace_made_again_is_swept_as_dead`: ADD, the sandbox's namespace deleted
//!   without a DEL (a crashed runtime) and made again under its name (its nsfs inode reused
//!   when the kernel gives it back; the recorded cookie tells them apart either way):
//!   `natledger sweep` removes exactly its rules; a second, live attachment keeps serving
//!   TCP and its UDP flow; its DEL restores the dumps.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use natledger::kernel::named_netns;
use serde_json::json;

use crate::common::*;

const T: Duration = Duration::from_secs(3);
/// How long after a call a sending UDP client must be on its new path.
const FOLLOW: Duration = Duration::from_secs(1);

/// TCP 8080 → 80 and UDP 8053 → 53.
const PORTS: [PortMap; 2] = [
    PortMap {
        host_port: 8080,
        container_port: 80,
        protocol: "tcp",
        host_ip: None,
    },
    PortMap {
        host_port: 8053,
        container_port: 53,
        protocol: "udp",
        host_ip: None,
    },
];

/// The conflist on `node`: bridge + host-local, then the port mapper `mapper`.
fn conflist<'n>(node: &'n Node, mapper: &str) -> Conflist<'n> {
    Conflist::bridge(node, "net1", 1).with_plugin(mapper, json!({}))
}

/// Servers in sandbox `ns` answering `name` on TCP 80 (IPv4 and IPv6) and UDP 53 and 80.
fn serve(ns: &str, name: &str) -> Vec<Server> {
    let any4 = IpAddr::from(Ipv4Addr::UNSPECIFIED);
    let any6 = IpAddr::from(Ipv6Addr::UNSPECIFIED);
    vec![
        serve_tcp(ns, sock(any4, 80), name),
        serve_tcp(ns, sock(any6, 80), name),
        serve_udp(ns, sock(any4, 53), name),
        serve_udp(ns, sock(any4, 80), name),
    ]
}

fn add(net: &Conflist, id: &str, ns: &str, ports: &[PortMap]) -> serde_json::Value {
    net.add(id, ns, ports)
        .unwrap_or_else(|e| panic!("ADD {id} ({}): {e}", net.name))
}

fn del(net: &Conflist, id: &str, ns: &str, ports: &[PortMap]) {
    net.del(id, ns, ports)
        .unwrap_or_else(|e| panic!("DEL {id} ({}): {e}", net.name));
}

/// The TCP answer through `port` of the node's IPv4 address, from `ext`.
fn tcp_answer(node: &Node, port: u16) -> Option<String> {
    tcp_request(node.topo.ext(), sock(NODE_V4, port), T).ok()
}

fn follows(client: &UdpClient, want: &str, since: Instant, what: &str) {
    assert!(
        client.wait_for(want, since, FOLLOW).is_some(),
        "{what}: no {want:?} within {FOLLOW:?}: {:?}",
        client.replies_since(since)
    );
}

/// No reply at all to the sending client for half a second from now.
fn unanswered(client: &UdpClient, what: &str) {
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        client.replies_since(t).is_empty(),
        "{what}: the UDP client still gets replies"
    );
}

/// The lines of portmap's per-container DNAT chains (`CNI-DN-<hash>`) in a dump.
fn portmap_dnat_lines(dump: &str) -> Vec<&str> {
    dump.lines().filter(|l| l.contains("CNI-DN-")).collect()
}

/// The names of portmap's per-container DNAT chains in a dump.
fn portmap_dnat_chains(dump: &str) -> std::collections::BTreeSet<&str> {
    (dump.split(|c: char| c.is_whitespace() || c == ':'))
        .filter(|w| w.starts_with("CNI-DN-"))
        .collect()
}

#[test]
fn held_port_the_newest_serves_and_the_oldest_gets_it_back() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b) = (node.topo.add_sandbox(2), node.topo.add_sandbox(3));
        let _servers = [serve(&a, "A"), serve(&b, "B")];
        node.warm_up();
        let before = node.dump();
        let net = conflist(&node, "natledger");
        // A clean ADD and DEL through the conflist leaves what natledger's warm-up left.
        add(&net, "clean", &a, &PORTS);
        del(&net, "clean", &a, &PORTS);
        assert_eq!(node.dump(), before, "{backend:?}: a clean ADD and DEL");
        add(&net, "a", &a, &PORTS);
        assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("A"), "{backend:?}");
        let ext = node.topo.ext().to_string();
        let client = UdpClient::start(&ext, sock(EXT_V4, 40053), sock(NODE_V4, 8053));
        follows(&client, "A", Instant::now(), &format!("{backend:?} ADD a"));

        // The second ADD of the held ports succeeds, as portmap's does.
        add(&net, "b", &b, &PORTS);
        let since = Instant::now();
        follows(&client, "B", since, &format!("{backend:?} ADD b"));
        assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("B"), "{backend:?}");
        let stacked = node.dump();
        for id in ["a+eth0", "b+eth0"] {
            assert!(
                stacked.contains(&format!("natledger:{id}")),
                "{backend:?}: {id}'s rules\n{stacked}"
            );
        }
        assert_eq!(node.manifests(), ["a+eth0.json", "b+eth0.json"]);

        del(&net, "b", &b, &PORTS);
        let since = Instant::now();
        follows(&client, "A", since, &format!("{backend:?} DEL b"));
        assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("A"), "{backend:?}");
        assert!(!node.dump().contains("natledger:b+eth0"), "{backend:?}");

        del(&net, "a", &a, &PORTS);
        unanswered(&client, &format!("{backend:?} DEL a"));
        client.stop();
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
        assert_eq!(node.dump(), before, "{backend:?}: dumps after both DELs");
        assert_eq!(tcp_answer(&node, 8080), None, "{backend:?}");
    });

    // The control: portmap accepts the second ADD; the older keeps the port until its DEL.
    let mut node = Node::new(Backend::IptablesNft);
    let (a, b) = (node.topo.add_sandbox(2), node.topo.add_sandbox(3));
    let _servers = [serve(&a, "A"), serve(&b, "B")];
    let net = conflist(&node, "portmap");
    add(&net, "a", &a, &PORTS);
    let ext = node.topo.ext().to_string();
    let client = UdpClient::start(&ext, sock(EXT_V4, 40053), sock(NODE_V4, 8053));
    follows(&client, "A", Instant::now(), "portmap ADD a");
    add(&net, "b", &b, &PORTS);
    let since = Instant::now();
    assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("A"), "portmap");
    std::thread::sleep(FOLLOW);
    let replies = client.replies_since(since);
    assert!(
        !replies.is_empty() && replies.iter().all(|r| r == "A"),
        "portmap: the flow stays with the older: {replies:?}"
    );
    let chains = node.dump();
    assert_eq!(portmap_dnat_chains(&chains).len(), 2, "portmap: {chains}");
    del(&net, "a", &a, &PORTS);
    assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("B"), "portmap");
    // portmap forgets no flow at DEL (containernetworking/plugins#1190): the sending client's
    // conntrack entry still points at the older, gone, and it gets no reply.
    unanswered(&client, "portmap DEL a");
    del(&net, "b", &b, &PORTS);
    client.stop();
    assert_eq!(tcp_answer(&node, 8080), None, "portmap");
    assert!(portmap_dnat_lines(&node.dump()).is_empty(), "portmap");
}

#[test]
fn held_port_refused_with_port_conflict_refuse_and_the_runtimes_del_keeps_the_holder() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b) = (node.topo.add_sandbox(2), node.topo.add_sandbox(3));
        let _servers = [serve(&a, "A"), serve(&b, "B")];
        node.warm_up();
        let before = node.dump();
        let net = Conflist::bridge(&node, "net1", 1)
            .with_plugin("natledger", json!({"portConflict": "refuse"}));
        add(&net, "a", &a, &PORTS);
        let held = node.dump();
        let e = net.add("b", &b, &PORTS).expect_err("the refused ADD");
        assert_eq!(
            (e.plugin.as_str(), e.code()),
            ("natledger", Some(100)),
            "{e}"
        );
        assert!(
            e.message().contains("is held by live container a+eth0"),
            "{e}"
        );
        assert_eq!(
            net.cached("b"),
            None,
            "{backend:?}: a failed ADD caches nothing"
        );
        assert_eq!(node.dump(), held, "{backend:?}: the refused ADD wrote");
        // The runtime's DEL after the failed ADD (no cached result) keeps the holder's rules.
        del(&net, "b", &b, &PORTS);
        assert_eq!(node.dump(), held, "{backend:?}: the refused one's DEL");
        assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("A"), "{backend:?}");
        del(&net, "a", &a, &PORTS);
        assert_eq!(node.dump(), before, "{backend:?}: dumps after both DELs");
    });
}

/// a, then b on the held ports: b serves and the sending client's flow is on b.
fn stacked(node: &Node, a: &str, b: &str) -> UdpClient {
    let net = conflist(node, "natledger");
    add(&net, "a", a, &PORTS);
    let client = UdpClient::start(node.topo.ext(), sock(EXT_V4, 40055), sock(NODE_V4, 8053));
    add(&net, "b", b, &PORTS);
    follows(&client, "B", Instant::now(), "after ADD b");
    assert_eq!(tcp_answer(node, 8080).as_deref(), Some("B"));
    client
}

/// The older, a, serves TCP again and the sending client's flow is back on it.
fn back_to_a(node: &Node, client: &UdpClient, what: &str) {
    let since = Instant::now();
    assert_eq!(tcp_answer(node, 8080).as_deref(), Some("A"), "{what}");
    follows(client, "A", since, what);
}

#[test]
fn held_port_given_back_by_the_newers_del_without_state_or_sweep() {
    both(|backend| {
        let mut node = Node::new(backend);
        let (a, b) = (node.topo.add_sandbox(2), node.topo.add_sandbox(3));
        let _servers = serve(&a, "A");
        let b_servers = serve(&b, "B");
        node.warm_up();
        let before = node.dump();
        // The state directory lost, then b's DEL through the conflist.
        let client = stacked(&node, &a, &b);
        std::fs::remove_dir_all(node.state_dir()).expect("delete the state directory");
        del(&conflist(&node, "natledger"), "b", &b, &PORTS);
        back_to_a(
            &node,
            &client,
            &format!("{backend:?}: b's DEL without state"),
        );
        del(&conflist(&node, "natledger"), "a", &a, &PORTS);
        client.stop();
        assert_eq!(node.dump(), before, "{backend:?}: dumps after both DELs");

        // b's namespace gone without a DEL, then a sweep.
        let client = stacked(&node, &a, &b);
        drop(b_servers);
        node.topo.delete_ns_now(&b);
        assert_ok(&node.sweep(&[]), &format!("{backend:?} sweep"));
        back_to_a(&node, &client, &format!("{backend:?}: the sweep of b"));
        assert_eq!(node.manifests(), ["a+eth0.json"], "{backend:?}");
        del(&conflist(&node, "natledger"), "a", &a, &PORTS);
        client.stop();
        assert_eq!(node.dump(), before, "{backend:?}: dumps after a's DEL");
    });
}

/// br_netfilter's calls into iptables and ip6tables for bridged packets off in the node.
fn br_netfilter_off(node: &Node) {
    let off = [
        ("net/bridge/bridge-nf-call-iptables", "0"),
        ("net/bridge/bridge-nf-call-ip6tables", "0"),
    ];
    named_netns::set_sysctls(node.topo.node(), &off)
        .expect("br_netfilter sysctls (is the br_netfilter module loaded?)");
    for (key, _) in off {
        let value = run_in(
            node.topo.node(),
            "cat",
            &[&format!("/proc/sys/{key}")],
            None,
        );
        assert_eq!(String::from_utf8_lossy(&value.stdout).trim(), "0", "{key}");
    }
}

/// Sandbox `b` reaches the one behind host port 8080 (answering `want`) through the node's
/// addresses: TCP over IPv4 and IPv6, and a UDP client that keeps sending.
fn hairpin_reaches(b: &str, want: &str, what: &str) {
    for host in [IpAddr::from(NODE_V4), NODE_V6.into()] {
        let tcp = tcp_request(b, sock(host, 8080), T);
        assert_eq!(
            tcp.as_deref().ok(),
            Some(want),
            "{what}: tcp to {host}: {tcp:?}"
        );
    }
    let client = UdpClient::start(b, sock(Ipv4Addr::UNSPECIFIED, 41080), sock(NODE_V4, 8080));
    let since = Instant::now();
    assert!(
        client.wait_for(want, since, T).is_some(),
        "{what}: udp: {:?}",
        client.replies_since(since)
    );
    let later = Instant::now();
    assert!(
        client.wait_for(want, later, T).is_some(),
        "{what}: the udp flow keeps answering"
    );
    client.stop();
}

/// `a+eth0`'s manifest records masquerades from the subnets of the bridge's result (the
/// rules without which B's connections time out with br_netfilter off).
fn assert_masquerades_the_bridges_subnets(node: &Node, what: &str) {
    let manifest = node.manifest("a+eth0");
    let masq: Vec<String> = (manifest["rules"].as_array().unwrap().iter())
        .filter(|r| r["chain"] == "NATLEDGER-MASQ")
        .map(|r| r["rule"].to_string())
        .collect();
    for subnet in ["10.79.1.0/24", "fd79:1::/64"] {
        assert!(
            masq.iter().any(|r| r.contains(&format!("\"{subnet}\""))),
            "{what}: no masquerade from {subnet}: {masq:?}"
        );
    }
}

/// TCP and UDP 8080 → 80.
const HAIRPIN_PORTS: [PortMap; 2] = [
    PortMap {
        host_port: 8080,
        container_port: 80,
        protocol: "tcp",
        host_ip: None,
    },
    PortMap {
        host_port: 8080,
        container_port: 80,
        protocol: "udp",
        host_ip: None,
    },
];

#[test]
fn hairpin_between_sandboxes_with_br_netfilter_off() {
    both(|backend| {
        let what = format!("{backend:?}");
        let mut node = Node::new(backend);
        br_netfilter_off(&node);
        let (a, b) = (node.topo.add_sandbox(2), node.topo.add_sandbox(3));
        let _servers = serve(&a, "A");
        node.warm_up();
        let before = node.dump();
        let net = conflist(&node, "natledger");
        add(&net, "a", &a, &HAIRPIN_PORTS);
        assert_masquerades_the_bridges_subnets(&node, &what);
        add(&net, "b", &b, &[]);
        hairpin_reaches(&b, "A", &what);
        del(&net, "b", &b, &[]);
        del(&net, "a", &a, &HAIRPIN_PORTS);
        assert_eq!(node.dump(), before, "{what}: dumps after both DELs");
    });

    // The control: portmap's hairpin masquerade reaches it too.
    let mut node = Node::new(Backend::IptablesNft);
    br_netfilter_off(&node);
    let (a, b) = (node.topo.add_sandbox(2), node.topo.add_sandbox(3));
    let _servers = serve(&a, "A");
    let net = conflist(&node, "portmap");
    add(&net, "a", &a, &HAIRPIN_PORTS);
    add(&net, "b", &b, &[]);
    hairpin_reaches(&b, "A", "portmap");
    del(&net, "b", &b, &[]);
    del(&net, "a", &a, &HAIRPIN_PORTS);
}

#[test]
fn lost_state_check_passes_and_del_removes_every_rule() {
    both(|backend| {
        let mut node = Node::new(backend);
        let pod = node.topo.add_sandbox(2);
        let _servers = serve(&pod, "pod");
        node.warm_up();
        let before = node.dump();
        let net = conflist(&node, "natledger");
        add(&net, "pod2", &pod, &PORTS);
        assert_eq!(
            tcp_answer(&node, 8080).as_deref(),
            Some("pod"),
            "{backend:?}"
        );
        let ext = node.topo.ext().to_string();
        let client = UdpClient::start(&ext, sock(EXT_V4, 40054), sock(NODE_V4, 8053));
        follows(&client, "pod", Instant::now(), &format!("{backend:?} ADD"));
        let added = node.dump();
        assert!(added.contains("natledger:pod2+eth0"), "{added}");

        std::fs::remove_dir_all(node.state_dir()).expect("delete the state directory");
        net.check("pod2", &pod, &PORTS)
            .unwrap_or_else(|e| panic!("{backend:?} CHECK without state: {e}"));
        assert_eq!(node.dump(), added, "{backend:?}: CHECK wrote");

        del(&net, "pod2", &pod, &PORTS);
        assert_eq!(node.dump(), before, "{backend:?}: DEL without state");
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
        let refused = tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "{backend:?}");
        unanswered(&client, &format!("{backend:?} DEL"));
        client.stop();
        // A runtime repeats DEL: it succeeds and changes nothing.
        del(&net, "pod2", &pod, &PORTS);
        assert_eq!(node.dump(), before, "{backend:?}: second DEL");
    });

    // The control: portmap keeps no state; its DEL, with the cached runtimeConfig, recomputes
    // its chain's name and removes it.
    let mut node = Node::new(Backend::IptablesNft);
    let pod = node.topo.add_sandbox(2);
    let _servers = serve(&pod, "pod");
    let net = conflist(&node, "portmap");
    add(&net, "pod2", &pod, &PORTS);
    assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("pod"), "portmap");
    assert!(!portmap_dnat_lines(&node.dump()).is_empty(), "portmap");
    del(&net, "pod2", &pod, &PORTS);
    assert!(portmap_dnat_lines(&node.dump()).is_empty(), "portmap");
    let refused = tcp_request(node.topo.ext(), sock(NODE_V4, 8080), T).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "portmap");
    del(&net, "pod2", &pod, &PORTS);
}

#[test]
fn a_sandbox_namespace_made_again_is_swept_as_dead() {
    use std::os::unix::fs::MetadataExt;
    both(|backend| {
        let mut node = Node::new(backend);
        let (x, live) = (node.topo.add_sandbox(2), node.topo.add_sandbox(3));
        let x_servers = serve(&x, "X");
        let _servers = serve(&live, "live");
        node.warm_up();
        let before = node.dump();
        let live_ports = [PortMap::tcp(8081, 80), PortMap::udp(8081, 53)];
        add(&conflist(&node, "natledger"), "live", &live, &live_ports);
        let live_only = node.dump();
        add(&conflist(&node, "natledger"), "x", &x, &PORTS);
        assert!(node.manifest("x+eth0")["netns"]["cookie"].is_u64());
        assert_eq!(tcp_answer(&node, 8080).as_deref(), Some("X"), "{backend:?}");
        assert_eq!(
            tcp_answer(&node, 8081).as_deref(),
            Some("live"),
            "{backend:?}"
        );
        let ext = node.topo.ext().to_string();
        let client = UdpClient::start(&ext, sock(EXT_V4, 40081), sock(NODE_V4, 8081));
        follows(&client, "live", Instant::now(), &format!("{backend:?} ADD"));

        // X's namespace deleted without a DEL (nothing of it left to hold it) and made again.
        drop(x_servers);
        let x_path = format!("/run/netns/{x}");
        let ino = std::fs::metadata(&x_path).unwrap().ino();
        node.topo.delete_ns_now(&x);
        let reused = node.topo.add_ns_reusing(&x, ino, 20);
        println!("{backend:?}: the namespace made again reused inode {ino}: {reused}");

        assert_ok(&node.sweep(&[]), &format!("{backend:?} sweep"));
        let swept = Instant::now();
        assert_eq!(node.dump(), live_only, "{backend:?}: x's rules, only they");
        assert_eq!(node.manifests(), ["live+eth0.json"], "{backend:?}");
        assert_eq!(tcp_answer(&node, 8080), None, "{backend:?}");
        assert_eq!(
            tcp_answer(&node, 8081).as_deref(),
            Some("live"),
            "{backend:?}"
        );
        follows(&client, "live", swept, &format!("{backend:?} sweep"));
        let replies = client.replies_since(swept);
        assert!(replies.iter().all(|r| r == "live"), "{replies:?}");
        client.stop();

        del(&conflist(&node, "natledger"), "live", &live, &live_ports);
        assert_eq!(node.dump(), before, "{backend:?}: dumps after the live DEL");
    });
}

//! Hairpin between containers (issue 24): container B on container A's bridge reaches A
//! through the node's `hostIP:hostPort`, TCP and UDP (a client that keeps sending), IPv4 and
//! IPv6, on every backend, with br_netfilter off (the bridged reply never meets the node's
//! conntrack, so only the masquerade of B's subnet makes it come back through the node) and
//! on; through the CNI plugin (`prevResult` with /24 and /64) and through the hooks (the
//! prefixes of the container's interfaces). A's server answers with the source it saw:
//! through the host port the node's bridge address (masqueraded), directly B's own (never
//! masqueraded: the rule takes only DNATed connections). Full dumps equal before the create
//! and after the removal.
//!
//! Without the subnet rule (the previous release's `-s A/32` masquerade, which
//! `io.natledger.ip`'s bare addresses still get), B's TCP connect and UDP exchange through
//! the host port time out with br_netfilter off: A answers B straight over the bridge, from
//! its own address, which B never asked.
//!
//! - `between_containers_through_cni`: CNI ADD/DEL on every backend, br_netfilter off and on.
//! - `between_containers_through_the_hooks`: create-runtime/poststop, the same.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use natledger::kernel::named_netns;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(3);
const HOST_PORT: u16 = 8080;
const CID: &str = "4a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";

/// Servers in a namespace that answer each TCP connection and UDP datagram on port 80 with
/// the address they came from; stopped on drop.
struct WhoServers {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl WhoServers {
    fn start(ns: &str, addrs: &[IpAddr]) -> WhoServers {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for addr in addrs {
            let at = SocketAddr::new(*addr, 80);
            let (tcp, udp) = in_netns(ns, || {
                (
                    TcpListener::bind(at).expect("bind tcp"),
                    UdpSocket::bind(at).expect("bind udp"),
                )
            });
            tcp.set_nonblocking(true).unwrap();
            udp.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let flag = stop.clone();
            threads.push(thread::spawn(move || {
                while !flag.load(Ordering::SeqCst) {
                    match tcp.accept() {
                        Ok((mut s, peer)) => {
                            let _ = s.set_nonblocking(false);
                            let _ = s.write_all(peer.ip().to_string().as_bytes());
                            let _ = s.shutdown(std::net::Shutdown::Write);
                            let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
                            let _ = s.read(&mut [0u8; 64]);
                        }
                        Err(_) => thread::sleep(Duration::from_millis(10)),
                    }
                }
            }));
            let flag = stop.clone();
            threads.push(thread::spawn(move || {
                let mut buf = [0u8; 64];
                while !flag.load(Ordering::SeqCst) {
                    if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(peer.ip().to_string().as_bytes(), peer);
                    }
                }
            }));
        }
        WhoServers { stop, threads }
    }
}

impl Drop for WhoServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// br_netfilter's calls into iptables and ip6tables for bridged packets, in the node.
fn br_netfilter(node: &Node, on: bool) {
    let v = if on { "1" } else { "0" };
    named_netns::set_sysctls(
        node.topo.node(),
        &[
            ("net/bridge/bridge-nf-call-iptables", v),
            ("net/bridge/bridge-nf-call-ip6tables", v),
        ],
    )
    .expect("br_netfilter sysctls (is the br_netfilter module loaded?)");
}

/// Two containers on the node's bridge (A = c2 serving, B = c3 the client), A's servers
/// answering with the source they see, br_netfilter as asked, natledger's shared rules in
/// place.
fn setup(backend: Backend, br: bool) -> (Node, Container, Container, WhoServers) {
    let mut node = Node::new(backend);
    let a = node.topo.add_container(2);
    let b = node.topo.add_container(3);
    br_netfilter(&node, br);
    let servers = WhoServers::start(&a.ns, &[a.v4.into(), a.v6.into()]);
    node.warm_up();
    (node, a, b, servers)
}

/// B reaches A through the node's host port (A sees the node's bridge address), TCP and a
/// UDP client that keeps sending, both families; and directly, A seeing B's own address.
fn b_reaches_a(a: &Container, b: &Container, what: &str) {
    let paths: [(IpAddr, IpAddr, IpAddr, IpAddr); 2] = [
        (NODE_V4.into(), BRIDGE_V4.into(), a.v4.into(), b.v4.into()),
        (NODE_V6.into(), BRIDGE_V6.into(), a.v6.into(), b.v6.into()),
    ];
    for (i, (host, bridge, a_addr, b_addr)) in paths.into_iter().enumerate() {
        let via_port = sock(host, HOST_PORT);
        assert_eq!(
            tcp_request(&b.ns, via_port, T).ok(),
            Some(bridge.to_string()),
            "{what}: B to A over tcp through {via_port}"
        );
        let client = UdpClient::start(&b.ns, sock(b_addr, 41000 + i as u16), via_port);
        let since = Instant::now();
        let first = client.wait_for(&bridge.to_string(), since, T);
        assert!(
            first.is_some(),
            "{what}: B to A over udp through {via_port}"
        );
        // Still answered a moment later: the flow stays on its path.
        let later = Instant::now();
        assert!(
            client.wait_for(&bridge.to_string(), later, T).is_some(),
            "{what}: udp through {via_port} keeps answering"
        );
        client.stop();
        // Directly (no host port): never masqueraded, with br_netfilter on too.
        let direct = sock(a_addr, 80);
        assert_eq!(
            tcp_request(&b.ns, direct, T).ok(),
            Some(b_addr.to_string()),
            "{what}: B to A directly over tcp keeps B's address"
        );
        assert_eq!(
            udp_request(&b.ns, direct, T).ok(),
            Some(b_addr.to_string()),
            "{what}: B to A directly over udp keeps B's address"
        );
    }
}

/// The hairpin masquerades recorded: from A's subnets, DNATed connections only.
fn assert_subnet_rules(node: &Node, id: &str, what: &str) {
    let manifest = node.manifest(id);
    let masq: Vec<String> = manifest["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["chain"] == "NATLEDGER-MASQ")
        .map(|r| {
            let tokens = r["rule"].as_array().unwrap().iter();
            tokens
                .map(|t| t.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    for subnet in ["10.77.0.0/24", "fd77::/64"] {
        assert!(
            masq.iter()
                .any(|r| r.contains(&format!("-s {subnet} ")) && r.contains("--ctstate DNAT")),
            "{what}: no DNATed-only masquerade from {subnet}: {masq:?}"
        );
    }
}

#[test]
fn between_containers_through_cni() {
    both(|backend| {
        for br in [false, true] {
            let what = format!("{backend:?} cni br_netfilter={br}");
            let (node, a, b, _servers) = setup(backend, br);
            let before = node.dump();
            let netns = format!("/run/netns/{}", a.ns);
            let config = json!({
                "cniVersion": "1.0.0", "name": "hairpin", "type": "natledger",
                "backend": backend.name(), "stateDir": node.state_dir(),
                "runtimeConfig": {"portMappings": [
                    {"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"},
                    {"hostPort": HOST_PORT, "containerPort": 80, "protocol": "udp"}
                ]},
                "prevResult": cni_prev_result(&a, &netns)
            });
            let out = cni_call(&node, "ADD", CID, Some(&netns), &config);
            assert_ok(&out, &format!("{what}: ADD"));
            let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(printed, config["prevResult"]);
            assert_subnet_rules(&node, &format!("{CID}+eth0"), &what);
            b_reaches_a(&a, &b, &what);
            assert_ok(
                &cni_call(&node, "DEL", CID, Some(&netns), &config),
                &format!("{what}: DEL"),
            );
            assert_eq!(node.dump(), before, "{what}: dumps after DEL");
        }
    });
}

#[test]
fn between_containers_through_the_hooks() {
    both(|backend| {
        for br in [false, true] {
            let what = format!("{backend:?} hooks br_netfilter={br}");
            let (mut node, a, b, _servers) = setup(backend, br);
            let pid = node.topo.spawn_sleeper(&a.ns);
            let before = node.dump();
            node.create(
                "a",
                Some(pid),
                &[("io.natledger.ports", "8080:80,8080:80/udp")],
            );
            assert_subnet_rules(&node, "a", &what);
            b_reaches_a(&a, &b, &what);
            assert_ok(&node.poststop("a"), &format!("{what}: poststop"));
            assert_eq!(node.dump(), before, "{what}: dumps after poststop");
        }
    });
}

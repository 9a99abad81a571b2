//! The route_localnet hole (kube-proxy's CVE-2020-8558) and natledger's guard against it.
//!
//! natledger sets `route_localnet=1` on the bridge towards a container with a mapping on
//! 127.0.0.1 (the node's own connections to 127.0.0.1:hostPort leave with a loopback
//! source). With it on, and nothing else, a neighbour on that bridge can address packets to
//! 127.0.0.1 through the node's bridge address and reach the node's services bound to
//! localhost. The attacker here is an ordinary namespace on the bridge: without raw
//! sockets, it drops its own 127.0.0.0/8, turns route_localnet on for its own eth0 (so its
//! kernel sends and accepts loopback addresses there) and routes 127.0.0.0/8 via the node.
//! Then a plain UDP send and TCP connect go to the node's localhost.
//!
//! Proven on every backend (iptables-legacy, iptables-nft, natledger's nftables tables): before natledger the packets are martians; with natledger's
//! guard they are dropped; with the guard taken away (a host written by an older
//! natledger, shared chains but no guard) they reach the node's UDP server and complete a
//! TCP handshake, and doctor reports br0 open (localhost-exposed); the next create puts the
//! guard back. Meanwhile the 127.0.0.1:hostPort →
//! container path works (TCP, UDP, a UDP client that keeps sending), and `sweep --all`
//! leaves every table as it was before natledger.

use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use crate::common::*;

const T: Duration = Duration::from_secs(3);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The 127.0.0.1:8080 → container path, TCP and UDP.
fn localhost_path_works(node: &str, backend: Backend, what: &str) {
    let dst = sock(LOCALHOST, 8080);
    assert_eq!(
        tcp_request(node, dst, T).ok().as_deref(),
        Some("c2 tcp"),
        "{backend:?} {what}: 127.0.0.1 tcp"
    );
    assert_eq!(
        udp_request(node, dst, T).ok().as_deref(),
        Some("c2 udp"),
        "{backend:?} {what}: 127.0.0.1 udp"
    );
}

/// Take the guard away as a host written before it existed looks: the INPUT jump and the
/// guard's chain gone, every other shared chain and jump in place. On natledger's nftables
/// table: its INPUT base chain (which holds only the jump) and the guard's chain.
fn unguard(node: &str, backend: Backend) {
    if !backend.is_iptables() {
        load_nft(
            node,
            "delete chain ip natledger INPUT\ndelete chain ip natledger NATLEDGER-INPUT\n",
        );
        return;
    }
    let tool = iptables_tool(backend, Family::V4);
    for args in [
        &[
            "-t",
            "filter",
            "-D",
            "INPUT",
            "-m",
            "comment",
            "--comment",
            "natledger",
            "-j",
            "NATLEDGER-INPUT",
        ][..],
        &["-t", "filter", "-F", "NATLEDGER-INPUT"],
        &["-t", "filter", "-X", "NATLEDGER-INPUT"],
    ] {
        let out = run_in(node, tool, args, None);
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// doctor on the live node names nothing of the guard (natledger's own shared rules are
/// neither foreign nor a finding), and reports br0 open to the neighbours exactly when
/// `exposed` (its localhost-exposed check, `tests/it/doctor/localhost.rs`).
fn doctor_on_localhost(node: &Node, what: &str, exposed: bool) {
    let doc = live(node, &[]);
    let about: Vec<&serde_json::Value> = doc
        .findings()
        .iter()
        .filter(|f| f["kind"] != "localhost-exposed")
        .filter(|f| {
            let text = f.to_string();
            text.contains("NATLEDGER-INPUT") || text.contains("127.0.0.0/8 ! -i lo")
        })
        .collect();
    assert!(about.is_empty(), "{what}: {}", doc.show());
    let found = doc.of_kind("localhost-exposed");
    assert_eq!(found.len(), usize::from(exposed), "{what}: {}", doc.show());
    if exposed {
        assert!(
            text(found[0], "summary").starts_with("Neighbours on br0 can reach"),
            "{what}: {}",
            doc.show()
        );
    }
}

#[test]
fn localhost_is_closed_to_neighbours_and_open_to_the_node() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let attacker = node.topo.add_container(3).ns;
        let host = node.topo.node().to_string();
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp"),
            serve_udp(&c.ns, c.sock_v4(80), "c2 udp"),
        ];
        let pid = node.topo.spawn_sleeper(&c.ns);
        let secrets = Secrets::bind(&host);
        arm(&attacker);
        let pristine = node.dump();

        // Before natledger: martians, as the kernel drops them with route_localnet=0.
        assert_eq!(route_localnet(&host, "br0"), "0");
        assert_eq!(
            secrets.attack(&attacker, "before"),
            (false, false),
            "{backend:?}: the kernel lets 127.0.0.1 in from the bridge without natledger"
        );

        let created = node.create(
            "c2",
            Some(pid),
            &[("io.natledger.ports", "8080:80,8080:80/udp")],
        );
        assert_ok(&created, "create c2");
        assert_eq!(
            route_localnet(&host, "br0"),
            "1",
            "{backend:?}: route_localnet"
        );
        assert_eq!(
            secrets.attack(&attacker, "guarded"),
            (false, false),
            "{backend:?}: with route_localnet=1 a neighbour reaches the node's localhost \
             (UDP, TCP)"
        );
        localhost_path_works(&host, backend, "guarded");
        doctor_on_localhost(&node, "guarded", false);
        // A client that keeps sending from 127.0.0.1: its replies come back through the
        // guard as ESTABLISHED.
        let client = UdpClient::start(&host, sock(LOCALHOST, 40123), sock(LOCALHOST, 8080));
        let t0 = Instant::now();
        assert!(
            client.wait_for("c2 udp", t0, T).is_some(),
            "{backend:?}: the UDP client gets no reply through the guard"
        );

        // A host written before the guard: the hole is there.
        unguard(&host, backend);
        assert_eq!(
            secrets.attack(&attacker, "unguarded"),
            (true, true),
            "{backend:?}: without the guard the neighbour must reach localhost (or this test \
             proves nothing)"
        );
        // list, sweep and doctor take a host without the guard as it is.
        assert_ok(
            &node.natledger(&["list"], "", &[]),
            "list without the guard",
        );
        assert_ok(&node.sweep(&[]), "sweep without the guard");
        doctor_on_localhost(&node, "unguarded", true);
        // The next create puts the guard back (the shared footprint is checked on create).
        let d = node.topo.add_container(4);
        let d_pid = node.topo.spawn_sleeper(&d.ns);
        assert_ok(
            &node.create("c4", Some(d_pid), &[("io.natledger.ports", "8081:81")]),
            "create c4",
        );
        assert_eq!(
            secrets.attack(&attacker, "upgraded"),
            (false, false),
            "{backend:?}: the next create does not put the guard back"
        );
        let t1 = Instant::now();
        assert!(
            client.wait_for("c2 udp", t1, T).is_some(),
            "{backend:?}: the UDP client stopped getting replies"
        );
        client.stop();
        localhost_path_works(&host, backend, "upgraded");
        let listed = node.natledger(&["list"], "", &[]);
        assert_ok(&listed, "list");
        doctor_on_localhost(&node, "upgraded", false);

        // Removed only by `sweep --all`: poststop and a sweep keep it.
        assert_ok(&node.poststop("c2"), "poststop c2");
        assert_ok(&node.poststop("c4"), "poststop c4");
        assert_ok(&node.sweep(&[]), "sweep");
        let guard = if backend.is_iptables() {
            "-A NATLEDGER-INPUT -d 127.0.0.0/8 ! -i lo"
        } else {
            "ip daddr 127.0.0.0/8 iifname != \"lo\" ct status ! dnat drop"
        };
        let dump = node.dump();
        assert!(
            chain_rules(&dump, backend, Family::V4, "NATLEDGER-INPUT")
                .iter()
                .any(|l| l.starts_with(guard)),
            "{backend:?}: poststop or sweep removed the guard:\n{dump}"
        );
        assert_eq!(secrets.attack(&attacker, "stopped"), (false, false));
        assert_ok(&node.sweep(&["--all"]), "sweep --all");
        assert_eq!(
            node.dump(),
            pristine,
            "{backend:?}: sweep --all leaves the tables as before natledger"
        );
    });
}

/// The node's own UDP flow over `lo`, 127.0.0.5:40500 → 127.0.0.1:5354, answered once (so
/// conntrack has it as ESTABLISHED): what a neighbour's forged packets pretend to belong to.
struct LocalFlow {
    server: UdpSocket,
    client: UdpSocket,
}

const FLOW_CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(127, 0, 0, 5), 40500);
const FLOW_SERVER: (Ipv4Addr, u16) = (LOCALHOST, 5354);

impl LocalFlow {
    fn start(node: &str) -> LocalFlow {
        let (server, client) = in_netns(node, || {
            let server = UdpSocket::bind(FLOW_SERVER).unwrap();
            let client = UdpSocket::bind(FLOW_CLIENT).unwrap();
            client.connect(FLOW_SERVER).unwrap();
            (server, client)
        });
        client.send(b"hello").unwrap();
        let mut buf = [0u8; 64];
        server.set_read_timeout(Some(T)).unwrap();
        let (_, from) = server.recv_from(&mut buf).unwrap();
        server.send_to(b"welcome", from).unwrap();
        client.set_read_timeout(Some(T)).unwrap();
        client.recv(&mut buf).unwrap();
        LocalFlow { server, client }
    }

    /// Whether a datagram forged by `attacker` as the client's reached the server, and
    /// whether an ICMP port unreachable forged about the client's datagrams reached the
    /// client (its next receive fails with ECONNREFUSED).
    fn attack(&self, attacker: &Container) -> (bool, bool) {
        let data = udp_packet(FLOW_CLIENT, FLOW_SERVER, b"forged");
        let mut icmp = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&data[..28]);
        let sum = checksum(&icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let error = ip_packet(1, attacker.v4, FLOW_CLIENT.0, &icmp);
        in_netns(&attacker.ns, || {
            raw_send(&data, FLOW_SERVER.0);
            raw_send(&error, FLOW_CLIENT.0);
        });
        let mut buf = [0u8; 64];
        self.server
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let data_in =
            matches!(self.server.recv_from(&mut buf), Ok((n, _)) if &buf[..n] == b"forged");
        self.client
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let error_in = matches!(
            self.client.recv(&mut buf),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
        );
        (data_in, error_in)
    }
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ip_packet(protocol: u8, src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let len = (20 + payload.len()) as u16;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 64, protocol, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let sum = checksum(&p);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// A UDP datagram (no checksum, as IPv4 allows) in its IPv4 header.
fn udp_packet(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), data: &[u8]) -> Vec<u8> {
    let mut udp = Vec::new();
    udp.extend_from_slice(&src.1.to_be_bytes());
    udp.extend_from_slice(&dst.1.to_be_bytes());
    udp.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(data);
    ip_packet(17, src.0, dst.0, &udp)
}

/// Send a whole IPv4 packet as it is (`IPPROTO_RAW`) towards `dst`.
fn raw_send(packet: &[u8], dst: Ipv4Addr) {
    // SAFETY: plain socket calls on a descriptor this function owns and closes; the address
    // is a sockaddr_in on the stack, the buffer a live slice.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        assert!(fd >= 0, "raw socket: {}", io::Error::last_os_error());
        let mut to: libc::sockaddr_in = std::mem::zeroed();
        to.sin_family = libc::AF_INET as libc::sa_family_t;
        to.sin_addr.s_addr = u32::from_ne_bytes(dst.octets());
        let sent = libc::sendto(
            fd,
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        let err = io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(sent, packet.len() as isize, "raw send: {err}");
    }
}

/// conntrack does not tell the node's flows over `lo` from packets forged on the bridge with
/// their tuple: ESTABLISHED and RELATED say nothing about where a packet came from. A
/// neighbour that forges a datagram of the node's own 127.0.0.5 → 127.0.0.1 flow, or an
/// ICMP error about it (from its own, unspoofed address), must not get it through the guard:
/// only the packets of DNATed connections (the 127.0.0.1 → container path) have business
/// arriving for 127.0.0.0/8 on another interface than `lo`.
#[test]
fn forged_packets_of_the_nodes_own_loopback_flows_are_dropped() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let attacker = node.topo.add_container(3);
        let host = node.topo.node().to_string();
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "c2 tcp"),
            serve_udp(&c.ns, c.sock_v4(80), "c2 udp"),
        ];
        let pid = node.topo.spawn_sleeper(&c.ns);
        arm(&attacker.ns);
        assert_ok(
            &node.create(
                "c2",
                Some(pid),
                &[("io.natledger.ports", "8080:80,8080:80/udp")],
            ),
            "create c2",
        );
        assert_eq!(route_localnet(&host, "br0"), "1");
        // Started once conntrack tracks the node's namespace (natledger's nat rules load it).
        let flow = LocalFlow::start(&host);
        assert_eq!(
            flow.attack(&attacker),
            (false, false),
            "{backend:?}: a forged datagram (ESTABLISHED) or ICMP error (RELATED) of the \
             node's own loopback flow gets through the guard"
        );
        localhost_path_works(&host, backend, "guarded");
        let client = UdpClient::start(&host, sock(LOCALHOST, 40124), sock(LOCALHOST, 8080));
        assert!(
            client.wait_for("c2 udp", Instant::now(), T).is_some(),
            "{backend:?}: the UDP client gets no reply through the guard"
        );
        client.stop();
        // The forged packets are well formed: without the guard they arrive.
        unguard(&host, backend);
        assert_eq!(
            flow.attack(&attacker),
            (true, true),
            "{backend:?}: without the guard the forged packets must arrive (or this test \
             proves nothing)"
        );
        assert_ok(&node.sweep(&["--all"]), "sweep --all");
    });
}

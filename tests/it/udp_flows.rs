//! A running UDP flow follows the newest holder of its host port: the hooks forget the
//! conntrack entries that would keep it on the old path, after their rules are in place.
//! Clients that send every 100 ms from one source port, IPv4 and IPv6, both backends; the
//! other flows' entries (another UDP port, a TCP connection) are shown untouched by their
//! conntrack ids.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::common::*;

/// How long after a hook the client must be on the new path.
const FOLLOW: Duration = Duration::from_secs(1);
const T: Duration = Duration::from_secs(3);

/// The conntrack ids of `ns`'s entries of `proto` to original destination port `port`.
fn entry_ids(ns: &str, proto: &str, port: u16) -> Vec<String> {
    let mut ids = Vec::new();
    for family in ["ipv4", "ipv6"] {
        let port = port.to_string();
        let args = [
            "-L",
            "-f",
            family,
            "-p",
            proto,
            "--orig-port-dst",
            &port,
            "-o",
            "id",
        ];
        let out = run_in(ns, "conntrack", &args, None);
        ids.extend(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|w| w.strip_prefix("id="))
                .map(String::from),
        );
    }
    ids.sort();
    ids
}

/// A TCP connection from `ns` to `dst`, held open, that echoes what it is sent; the server
/// side runs in `server_ns` on `listen`.
struct Held {
    client: TcpStream,
}

impl Held {
    fn open(server_ns: &str, listen: SocketAddr, ns: &str, dst: SocketAddr) -> Held {
        let server = in_netns(server_ns, move || TcpListener::bind(listen).unwrap());
        std::thread::spawn(move || {
            if let Ok((mut conn, _)) = server.accept() {
                let mut buf = [0u8; 64];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let client = in_netns(ns, move || TcpStream::connect_timeout(&dst, T).unwrap());
        client.set_read_timeout(Some(T)).unwrap();
        Held { client }
    }

    fn echo(&mut self, what: &str) -> String {
        self.client.write_all(what.as_bytes()).unwrap();
        let mut buf = [0u8; 64];
        let n = self.client.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// The replies since `since`, and whether `want` came within [`FOLLOW`].
fn follows(clients: &[&UdpClient], want: &str, since: Instant) -> Result<(), String> {
    for c in clients {
        if c.wait_for(want, since, FOLLOW).is_none() {
            return Err(format!(
                "no {want:?} within {FOLLOW:?}: {:?}",
                c.replies_since(since)
            ));
        }
    }
    Ok(())
}

/// `c` (its namespace's name as its id) takes udp host port 8053.
fn holder(node: &Node, c: &Container, pid: u32) {
    let ip = format!("{},{}", c.v4, c.v6);
    let annotations = [
        ("io.natledger.ports", "8053:53/udp"),
        ("io.natledger.ip", &ip),
    ];
    node.create(&c.ns, Some(pid), &annotations);
}

#[test]
fn a_sending_udp_client_follows_the_port_to_each_new_holder() {
    both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        let [a, b, c, d] = [2, 3, 4, 5].map(|n| node.topo.add_container(n));
        let mut servers = Vec::new();
        for (ctr, name) in [(&a, "A"), (&b, "B"), (&c, "C"), (&d, "D")] {
            servers.push(serve_udp(&ctr.ns, ctr.sock_v4(53), name));
            servers.push(serve_udp(&ctr.ns, ctr.sock_v6(53), name));
        }
        node.warm_up();
        let ip = |c: &Container| format!("{},{}", c.v4, c.v6);

        // D: another UDP port and a TCP connection, which nothing below may disturb.
        node.create(
            &d.ns,
            None,
            &[
                ("io.natledger.ports", "8054:53/udp,8080:80"),
                ("io.natledger.ip", &ip(&d)),
            ],
        );
        let other = UdpClient::start(&ext, sock(EXT_V4, 40054), sock(NODE_V4, 8054));
        let mut tcp = Held::open(&d.ns, d.sock_v4(80), &ext, sock(NODE_V4, 8080));
        assert_eq!(tcp.echo("before"), "before");

        // A holds 8053; the clients send every 100 ms from fixed ports.
        let pid_a = node.topo.spawn_sleeper(&a.ns);
        holder(&node, &a, pid_a);
        let v4 = UdpClient::start(&ext, sock(EXT_V4, 40053), sock(NODE_V4, 8053));
        let v6 = UdpClient::start(&ext, sock(EXT_V6, 40053), sock(NODE_V6, 8053));
        let clients = [&v4, &v6];
        follows(&clients, "A", Instant::now()).unwrap();
        follows(&[&other], "D", Instant::now()).unwrap();
        let other_ids = entry_ids(&host, "udp", 8054);
        let tcp_ids = entry_ids(&host, "tcp", 8080);
        assert_eq!((other_ids.len(), tcp_ids.len()), (1, 1), "{backend:?}");

        // (a) A dies without poststop (its server still answers: only conntrack would keep
        // the clients there); B takes the port.
        kill_pid(pid_a);
        let pid_b = node.topo.spawn_sleeper(&b.ns);
        holder(&node, &b, pid_b);
        let since = Instant::now();
        follows(&clients, "B", since).unwrap_or_else(|e| panic!("{backend:?} (a): {e}"));

        // (b) B's poststop, then C's create.
        kill_pid(pid_b);
        assert_ok(&node.poststop(&b.ns), "poststop b");
        let pid_c = node.topo.spawn_sleeper(&c.ns);
        holder(&node, &c, pid_c);
        let since = Instant::now();
        follows(&clients, "C", since).unwrap_or_else(|e| panic!("{backend:?} (b): {e}"));

        // (c) A process on the node listens on the port; C's poststop hands the flows to it.
        let _node_servers = [
            serve_udp(&host, sock(NODE_V4, 8053), "node"),
            serve_udp(&host, sock(NODE_V6, 8053), "node"),
        ];
        let recent = v4.replies_since(Instant::now() - Duration::from_millis(300));
        assert_eq!(recent.last().map(String::as_str), Some("C"), "{backend:?}");
        kill_pid(pid_c);
        assert_ok(&node.poststop(&c.ns), "poststop c");
        let since = Instant::now();
        follows(&clients, "node", since).unwrap_or_else(|e| panic!("{backend:?} (c): {e}"));

        // The other flows were never touched: the same conntrack entries, still answering.
        assert_eq!(entry_ids(&host, "udp", 8054), other_ids, "{backend:?}");
        assert_eq!(entry_ids(&host, "tcp", 8080), tcp_ids, "{backend:?}");
        follows(&[&other], "D", Instant::now()).unwrap();
        assert_eq!(tcp.echo("after"), "after");
        assert_ok(&node.poststop(&d.ns), "poststop d");
        drop(servers);
    });
}

/// sweep removes a dead container's forward and forgets its flows: a client that kept
/// sending to the dead container reaches the node's own listener once the sweep is done.
#[test]
fn sweep_hands_a_dead_containers_flows_to_what_is_left() {
    both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        let e = node.topo.add_container(2);
        let _servers = [
            serve_udp(&e.ns, e.sock_v4(53), "E"),
            serve_udp(&e.ns, e.sock_v6(53), "E"),
        ];
        let pid = node.topo.spawn_sleeper(&e.ns);
        holder(&node, &e, pid);
        let v4 = UdpClient::start(&ext, sock(EXT_V4, 40053), sock(NODE_V4, 8053));
        let v6 = UdpClient::start(&ext, sock(EXT_V6, 40053), sock(NODE_V6, 8053));
        follows(&[&v4, &v6], "E", Instant::now()).unwrap();
        let _node_servers = [
            serve_udp(&host, sock(NODE_V4, 8053), "node"),
            serve_udp(&host, sock(NODE_V6, 8053), "node"),
        ];
        kill_pid(pid);
        assert_ok(&node.sweep(&[]), "sweep");
        let since = Instant::now();
        follows(&[&v4, &v6], "node", since).unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        assert!(!node.dump().contains("natledger:"));
    });
}

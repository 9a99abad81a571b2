//! Hosts whose filter FORWARD policy is DROP (Docker sets it on every host it runs on, and
//! hardened hosts do the same): natledger's accept lets through exactly the connections its
//! DNAT made, after the rules already in FORWARD (Docker's `DOCKER-USER`, an operator's
//! drops), and nothing else. Real TCP and UDP, IPv4 and IPv6, both iptables backends, full
//! dumps before and after. natledger's nftables backend writes no forward accept (an accept in
//! its own table cannot override another table's drop): there the host's FORWARD policy
//! decides, the node's own paths answer, and the host's own `--ctstate DNAT` accept opens
//! exactly natledger's forwards.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);
/// How long a dropped connection attempt is given before it counts as dropped.
const DROPPED: Duration = Duration::from_millis(800);

/// Docker 20.10's FORWARD as it is before any container: policy DROP, the user's chain first.
const DOCKER_FILTER: &str = "*filter\n:FORWARD DROP [0:0]\n:DOCKER-USER - [0:0]\n\
    :DOCKER-ISOLATION-STAGE-1 - [0:0]\n\
    -A FORWARD -j DOCKER-USER\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
    -A DOCKER-USER -j RETURN\n-A DOCKER-ISOLATION-STAGE-1 -j RETURN\nCOMMIT\n";

fn filter_rules(ns: &str, backend: Backend, family: Family, text: &str) {
    load_rules(ns, backend, family, text);
}

#[test]
fn a_drop_policy_lets_natledgers_forwards_through_and_nothing_else() {
    // natledger's forward accept exists only in the iptables backends.
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        for family in [Family::V4, Family::V6] {
            filter_rules(&host, backend, family, DOCKER_FILTER);
        }
        let c = node.topo.add_container(2);
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "tcp"),
            serve_udp(&c.ns, c.sock_v4(81), "udp"),
            serve_tcp(&c.ns, c.sock_v6(80), "tcp6"),
            serve_udp(&c.ns, c.sock_v6(81), "udp6"),
        ];
        // Before natledger: the policy drops what is forwarded to the container.
        assert!(tcp_request(&ext, c.sock_v4(80), DROPPED).is_err());
        node.warm_up();
        let before = node.dump();

        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "8080:80,8081:81/udp"),
                ("io.natledger.ip", "10.77.0.2,fd77::2"),
            ],
        );
        let dump = node.dump();
        // The jump sits after Docker's two jumps, in both families.
        for family in Family::ALL {
            let forward = chain_rules(&dump, backend, family, "FORWARD");
            assert_eq!(
                forward,
                [
                    "-A FORWARD -j DOCKER-USER",
                    "-A FORWARD -j DOCKER-ISOLATION-STAGE-1",
                    "-A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD",
                ],
                "{backend:?} {family:?}:\n{dump}"
            );
        }

        let through: [(&str, &str, SocketAddr, &str); 6] = [
            ("external tcp", &ext, sock(NODE_V4, 8080), "tcp"),
            ("external udp", &ext, sock(NODE_V4, 8081), "udp"),
            ("external tcp6", &ext, sock(NODE_V6, 8080), "tcp6"),
            ("external udp6", &ext, sock(NODE_V6, 8081), "udp6"),
            ("hairpin tcp", &c.ns, sock(NODE_V4, 8080), "tcp"),
            ("hairpin tcp6", &c.ns, sock(NODE_V6, 8080), "tcp6"),
        ];
        let reaches = |(what, ns, dst, reply): &(&str, &str, SocketAddr, &str)| {
            let got = if what.contains("udp") {
                udp_request(ns, *dst, T)
            } else {
                tcp_request(ns, *dst, T)
            };
            assert_eq!(got.ok().as_deref(), Some(*reply), "{backend:?} {what}");
        };
        through.iter().for_each(reaches);

        // Nothing natledger did not DNAT: straight to the container's address and ports, from
        // outside, stays dropped.
        for dst in [c.sock_v4(80), c.sock_v6(80)] {
            assert!(
                tcp_request(&ext, dst, DROPPED).is_err(),
                "{backend:?}: {dst} reached without a DNAT"
            );
        }
        assert!(udp_request(&ext, c.sock_v4(81), DROPPED).is_err());

        // DOCKER-USER keeps its meaning: the operator's drop there applies to natledger's port.
        let block = "*filter\n-I DOCKER-USER 1 -s 10.78.0.2/32 -j DROP\nCOMMIT\n";
        filter_rules(&host, backend, Family::V4, block);
        assert!(
            tcp_request(&ext, sock(NODE_V4, 8080), DROPPED).is_err(),
            "{backend:?}: DOCKER-USER's drop was bypassed"
        );
        let unblock = "*filter\n-D DOCKER-USER -s 10.78.0.2/32 -j DROP\nCOMMIT\n";
        filter_rules(&host, backend, Family::V4, unblock);
        reaches(&through[0]);

        assert_ok(&node.poststop("c2"), "poststop");
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: poststop leaves both tables as they were"
        );
        assert!(tcp_request(&ext, sock(NODE_V4, 8080), DROPPED).is_err());
    });
}

/// With the FORWARD policy ACCEPT (no Docker), natledger's rules change nothing for other
/// traffic: forwarding to the container's own address still works, and so do the forwards.
#[test]
fn an_accept_policy_is_left_as_it_is() {
    both(|backend| {
        let mut node = Node::new(backend);
        let ext = node.topo.ext().to_string();
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "tcp");
        node.warm_up();
        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "8080:80"),
                ("io.natledger.ip", "10.77.0.2"),
            ],
        );
        assert_eq!(
            tcp_request(&ext, c.sock_v4(80), T).ok().as_deref(),
            Some("tcp")
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("tcp")
        );
        let dump = node.dump();
        if backend.is_iptables() {
            assert!(dump.contains(":FORWARD ACCEPT"), "{backend:?}:\n{dump}");
        } else {
            // No forward chain of natledger's, no filter table touched, no filter record.
            assert!(!dump.contains("FORWARD"), "{backend:?}:\n{dump}");
            let rules = node.manifest("c2")["rules"].clone();
            let tables: Vec<&str> = rules
                .as_array()
                .expect("rules")
                .iter()
                .map(|r| r["table"].as_str().unwrap_or("?"))
                .collect();
            assert!(
                !tables.is_empty() && tables.iter().all(|t| *t == "nat"),
                "{backend:?}: {rules}"
            );
        }
        assert_ok(&node.poststop("c2"), "poststop");
    });
}

/// natledger on nftables beside a FORWARD policy DROP (Docker's, written with either iptables
/// tool): natledger adds no forward rule anywhere, so the forwarded paths (external, hairpin)
/// stay dropped as the host's firewall says, while the node's own paths (127.0.0.1 and its
/// addresses, which are not forwarded) answer. The accept the host's firewall needs, `-m
/// conntrack --ctstate DNAT -j ACCEPT` in DOCKER-USER, opens natledger's forwards and nothing
/// else. Its removal and the poststop leave every table, `nft list ruleset` included, as it was.
#[test]
fn on_nftables_a_drop_policy_decides_and_a_dnat_accept_opens_the_forwards() {
    for firewall in Backend::IPTABLES {
        let mut node = Node::new(Backend::OwnNftables);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        for family in Family::ALL {
            filter_rules(&host, firewall, family, DOCKER_FILTER);
        }
        let c = node.topo.add_container(2);
        let _servers = [
            serve_tcp(&c.ns, c.sock_v4(80), "tcp"),
            serve_udp(&c.ns, c.sock_v4(81), "udp"),
            serve_tcp(&c.ns, c.sock_v6(80), "tcp6"),
            serve_udp(&c.ns, c.sock_v6(81), "udp6"),
        ];
        node.warm_up();
        let before = node.dump();
        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "8080:80,8081:81/udp"),
                ("io.natledger.ip", "10.77.0.2,fd77::2"),
            ],
        );
        let dump = node.dump();
        for family in Family::ALL {
            assert_eq!(
                chain_rules(&dump, firewall, family, "FORWARD"),
                [
                    "-A FORWARD -j DOCKER-USER",
                    "-A FORWARD -j DOCKER-ISOLATION-STAGE-1",
                ],
                "{firewall:?} {family:?}: Docker's FORWARD as it was:\n{dump}"
            );
        }
        let nft = dump.split("## nftables\n").nth(1).unwrap_or("");
        assert!(!nft.contains("FORWARD"), "{firewall:?}:\n{dump}");
        // doctor names the drop of natledger's nftables DNAT and what to do about it.
        let d = node.natledger(&["doctor", "--json"], "", &[]);
        let report: serde_json::Value = serde_json::from_slice(&d.stdout).unwrap();
        let fixes: Vec<&str> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "forward-dropped" && f["rules"][0]["backend"] == "nftables")
            .filter_map(|f| f["fix"].as_str())
            .collect();
        assert!(
            fixes.len() >= 2 && fixes.iter().all(|f| f.contains("writes no forward accept")),
            "{firewall:?}: {report:#}"
        );

        let request = |ns: &str, dst: SocketAddr, reply: &str, timeout| {
            if reply.starts_with("udp") {
                udp_request(ns, dst, timeout)
            } else {
                tcp_request(ns, dst, timeout)
            }
        };
        let node_local: [(&str, SocketAddr, &str); 4] = [
            (
                "node localhost tcp",
                sock(std::net::Ipv4Addr::LOCALHOST, 8080),
                "tcp",
            ),
            ("node ip tcp", sock(NODE_V4, 8080), "tcp"),
            ("node ip udp", sock(NODE_V4, 8081), "udp"),
            ("node ip tcp6", sock(NODE_V6, 8080), "tcp6"),
        ];
        for (what, dst, reply) in node_local {
            let got = request(&host, dst, reply, T);
            assert_eq!(got.ok().as_deref(), Some(reply), "{firewall:?} {what}");
        }
        let forwarded: [(&str, &str, SocketAddr, &str); 6] = [
            ("external tcp", &ext, sock(NODE_V4, 8080), "tcp"),
            ("external udp", &ext, sock(NODE_V4, 8081), "udp"),
            ("external tcp6", &ext, sock(NODE_V6, 8080), "tcp6"),
            ("external udp6", &ext, sock(NODE_V6, 8081), "udp6"),
            ("hairpin tcp", &c.ns, sock(NODE_V4, 8080), "tcp"),
            ("hairpin tcp6", &c.ns, sock(NODE_V6, 8080), "tcp6"),
        ];
        for (what, ns, dst, reply) in &forwarded {
            assert!(
                request(ns, *dst, reply, DROPPED).is_err(),
                "{firewall:?} {what}: through Docker's DROP policy without an accept"
            );
        }

        // The host's own accept of DNATed connections, where Docker says to put it.
        let open = "*filter\n-I DOCKER-USER 1 -m conntrack --ctstate DNAT -j ACCEPT\nCOMMIT\n";
        let close = "*filter\n-D DOCKER-USER -m conntrack --ctstate DNAT -j ACCEPT\nCOMMIT\n";
        for family in Family::ALL {
            filter_rules(&host, firewall, family, open);
        }
        for (what, ns, dst, reply) in &forwarded {
            let got = request(ns, *dst, reply, T);
            assert_eq!(got.ok().as_deref(), Some(*reply), "{firewall:?} {what}");
        }
        for dst in [c.sock_v4(80), c.sock_v6(80)] {
            assert!(
                tcp_request(&ext, dst, DROPPED).is_err(),
                "{firewall:?}: {dst} reached without a DNAT"
            );
        }
        for family in Family::ALL {
            filter_rules(&host, firewall, family, close);
        }

        assert_ok(&node.poststop("c2"), "poststop");
        assert_eq!(
            node.dump(),
            before,
            "{firewall:?}: poststop leaves every table as it was"
        );
        assert!(request(&host, sock(NODE_V4, 8080), "tcp", DROPPED).is_err());
    }
}

/// The ICMP errors of a forwarded connection pass too (conntrack gives them the connection
/// they are about): the container's reply to a client that has gone comes back as "port
/// unreachable" through the DROP policy, and the container's connected socket sees
/// ECONNREFUSED, as path-MTU discovery's "packet too big" would reach it. IPv4 and IPv6.
#[test]
fn icmp_errors_about_a_forwarded_connection_pass() {
    use std::net::UdpSocket;
    // Through natledger's forward accept, which exists only in the iptables backends.
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        for family in [Family::V4, Family::V6] {
            filter_rules(&host, backend, family, DOCKER_FILTER);
        }
        let c = node.topo.add_container(2);
        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "8081:81/udp"),
                ("io.natledger.ip", "10.77.0.2,fd77::2"),
            ],
        );
        for (listen, dst) in [
            (c.sock_v4(81), sock(NODE_V4, 8081)),
            (c.sock_v6(81), sock(NODE_V6, 8081)),
        ] {
            let server = in_netns(&c.ns, move || UdpSocket::bind(listen).unwrap());
            server.set_read_timeout(Some(T)).unwrap();
            // The client sends once and goes away.
            in_netns(&ext, move || {
                let client =
                    UdpSocket::bind(if dst.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).unwrap();
                client.send_to(b"hello", dst).unwrap();
            });
            let mut buf = [0u8; 64];
            let (_, peer) = server
                .recv_from(&mut buf)
                .expect("the datagram came through");
            server.connect(peer).unwrap();
            server.send(b"reply").unwrap();
            // The "port unreachable" for the reply arrives asynchronously on the connected
            // socket: the next operation reports it.
            std::thread::sleep(Duration::from_millis(300));
            let refused = server
                .send(b"again")
                .err()
                .or_else(|| server.recv(&mut buf).err());
            assert_eq!(
                refused.map(|e| e.kind()),
                Some(std::io::ErrorKind::ConnectionRefused),
                "{backend:?} {dst}: the ICMP error did not reach the container"
            );
        }
        assert_ok(&node.poststop("c2"), "poststop");
    });
}

/// A hardened host without Docker: the operator's own drop of a client (above natledger's
/// jump, since it was there first) still blocks that client from natledger's port, and a
/// final catch-all REJECT (RHEL's) stays below the jump, so the port answers.
#[test]
fn an_operators_forward_rules_keep_deciding() {
    // Where natledger's forward accept sits among FORWARD's rules: iptables backends only.
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        let hardened = "*filter\n:FORWARD ACCEPT [0:0]\n\
            -A FORWARD -s 10.78.0.99/32 -j DROP\n\
            -A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
            -A FORWARD -j REJECT --reject-with icmp-host-prohibited\nCOMMIT\n";
        filter_rules(&host, backend, Family::V4, hardened);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "tcp");
        assert!(tcp_request(&ext, sock(NODE_V4, 8080), DROPPED).is_err());
        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "8080:80"),
                ("io.natledger.ip", "10.77.0.2"),
            ],
        );
        let dump = node.dump();
        let forward = chain_rules(&dump, backend, Family::V4, "FORWARD");
        assert_eq!(
            forward,
            [
                "-A FORWARD -s 10.78.0.99/32 -j DROP",
                "-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD",
                "-A FORWARD -j REJECT --reject-with icmp-host-prohibited",
            ],
            "{backend:?}:\n{dump}"
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("tcp")
        );
        // The blocked client, from the same namespace with the blocked address.
        run_in(
            &ext,
            "ip",
            &["addr", "add", "10.78.0.99/24", "dev", "eth0"],
            None,
        );
        let blocked = in_netns(&ext, || {
            let sock = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Inet,
                nix::sys::socket::SockType::Stream,
                nix::sys::socket::SockFlag::empty(),
                None,
            )
            .unwrap();
            let from = nix::sys::socket::SockaddrIn::new(10, 78, 0, 99, 0);
            nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &from).unwrap();
            let stream = std::net::TcpStream::from(sock);
            stream.set_nonblocking(true).unwrap();
            let to = nix::sys::socket::SockaddrIn::new(10, 78, 0, 1, 8080);
            let _ = nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &to);
            std::thread::sleep(DROPPED);
            stream.peer_addr().is_ok()
        });
        assert!(!blocked, "{backend:?}: the operator's drop was bypassed");
        assert_ok(&node.poststop("c2"), "poststop");
    });
}

//! `natledger::kernel::conntrack` against the real kernel: real UDP and TCP flows between the test's
//! own network namespaces, the conntrack table read before and after with the independent
//! `conntrack -L` (conntrack-tools), and a long-lived UDP client that follows a moved port
//! only once its entry is forgotten. Every test runs again on each dump path `forget` can
//! be forced onto ([`every_test_passes_on_every_dump_path`]); the kernel's filter rules that
//! `forget` relies on, and its cost, are in tests/it/conntrack_kernel.rs.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use natledger::kernel::conntrack::{self, Flows};
use natledger::kernel::netlink::Socket;
use natledger::model::family::Family as AddrFamily;
use natledger::model::portspec::Protocol;

const T: Duration = Duration::from_secs(3);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// A DNAT rule of another port in each family: what makes a namespace track connections.
/// The kernel registers conntrack in a namespace only once a rule needs it (a NAT target, a
/// conntrack match); nat chains without such a rule are not enough.
fn track_connections(ns: &str) {
    let rule = |to: &str| {
        format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n\
             -A PREROUTING -p udp -m udp --dport 9 -j DNAT --to-destination {to}:9\nCOMMIT\n"
        )
    };
    load_rules(ns, Backend::IptablesNft, Family::V4, &rule("10.77.0.9"));
    load_rules(ns, Backend::IptablesNft, Family::V6, &rule("[fd77::9]"));
}

/// The original tuple of one entry as `conntrack -L` prints it, and its zones.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Tuple {
    proto: String,
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    /// `zone=N`, `zone-orig=N`, `zone-reply=N` as printed; empty in the default zone.
    zone: String,
}

fn tuple(proto: &str, src: SocketAddr, dst: SocketAddr) -> Tuple {
    Tuple {
        proto: proto.to_string(),
        src: src.ip(),
        dst: dst.ip(),
        sport: src.port(),
        dport: dst.port(),
        zone: String::new(),
    }
}

/// Every UDP, TCP and SCTP entry of `ns`, both families, by `conntrack -L` (the first
/// `src= dst= sport= dport=` of a line is the original tuple).
fn table(ns: &str) -> BTreeSet<Tuple> {
    let mut found = BTreeSet::new();
    for family in ["ipv4", "ipv6"] {
        for proto in ["udp", "tcp", "sctp"] {
            let out = run_in(ns, "conntrack", &["-L", "-f", family, "-p", proto], None);
            assert!(
                out.status.success(),
                "conntrack -L in {ns} (is conntrack-tools installed?): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let field = |key: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(key))
                        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                };
                let zones: Vec<&str> = line
                    .split_whitespace()
                    .filter(|w| w.starts_with("zone"))
                    .collect();
                found.insert(Tuple {
                    proto: proto.to_string(),
                    src: field("src=").parse().unwrap(),
                    dst: field("dst=").parse().unwrap(),
                    sport: field("sport=").parse().unwrap(),
                    dport: field("dport=").parse().unwrap(),
                    zone: zones.join(" "),
                });
            }
        }
    }
    found
}

/// From `ns`, one UDP exchange from the fixed address `src` to `dst` (resent on the same
/// socket, so one conntrack entry, until a reply comes).
fn udp_from(ns: &str, src: SocketAddr, dst: SocketAddr) -> String {
    in_netns(ns, || {
        let sock = UdpSocket::bind(src).unwrap_or_else(|e| panic!("bind {src} in {ns}: {e}"));
        sock.connect(dst).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let deadline = Instant::now() + T;
        let mut buf = [0u8; 512];
        while Instant::now() < deadline {
            sock.send(b"ping").unwrap();
            if let Ok(n) = sock.recv(&mut buf) {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
        }
        panic!("no UDP reply from {dst} to {src} in {ns}");
    })
}

/// From `ns`, one TCP connection from the fixed address `src` to `dst`; the reply.
fn tcp_from(ns: &str, src: SocketAddr, dst: SocketAddr) -> String {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage, sockopt};
    use std::io::Read;
    in_netns(ns, || {
        let fd = socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::setsockopt(&fd, sockopt::ReuseAddr, &true).unwrap();
        socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(src)).unwrap();
        socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst))
            .unwrap_or_else(|e| panic!("connect {src} -> {dst} in {ns}: {e}"));
        let mut stream = std::net::TcpStream::from(fd);
        stream.set_read_timeout(Some(T)).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    })
}

/// `forget` on a thread inside `ns`, with a netfilter socket opened there.
fn forget_in(ns: &str, flows: &[Flows]) -> usize {
    // The dump path this process was started for (`every_test_passes_on_every_dump_path`).
    let dump = natledger::entry::settings::Settings::from_env(&|name| std::env::var_os(name))
        .unwrap()
        .conntrack_dump;
    in_netns(ns, || {
        let mut sock = Socket::netfilter().expect("netfilter socket");
        conntrack::forget(&mut sock, flows, dump).unwrap_or_else(|e| panic!("forget in {ns}: {e}"))
    })
}

fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// Exactly the local-destination entries of the asked protocol, family and ports go; flows
/// of other ports, TCP, a flow forwarded through the node, the other family, and an
/// identical flow in another namespace stay. With a host address, only its entries go.
#[test]
fn forgets_exactly_the_local_flows_of_the_mapping() {
    let mut topo = Topology::new();
    let other = Topology::new();
    let (node, ext) = (topo.node().to_string(), topo.ext().to_string());
    let (node2, ext2) = (other.node().to_string(), other.ext().to_string());
    let c = topo.add_container(2);
    track_connections(&node);
    track_connections(&node2);
    let _servers = [
        // One per address: an unbound socket would answer from another source address.
        serve_udp(&node, sa(NODE_V4, 5353), "node 5353"),
        serve_udp(&node, sa(BRIDGE_V4, 5353), "node 5353"),
        serve_udp(&node, sa(LOCALHOST, 5353), "node 5353"),
        serve_udp(&node, sa(NODE_V4, 5354), "node 5354"),
        serve_tcp(&node, sa(Ipv4Addr::UNSPECIFIED, 5353), "node tcp"),
        serve_udp(&node, sa(NODE_V6, 5353), "node v6"),
        serve_udp(&c.ns, c.sock_v4(5353), "c2"),
        serve_udp(&node2, sa(NODE_V4, 5353), "node2"),
    ];
    let client = |port| sa(EXT_V4, port);
    // (namespace, source, destination, reply): the UDP flows.
    let node_ip = (&ext, client(41001), sa(NODE_V4, 5353), "node 5353");
    let bridge_ip = (&ext, client(41002), sa(BRIDGE_V4, 5353), "node 5353");
    let loopback = (
        &node,
        sa(LOCALHOST, 41003),
        sa(LOCALHOST, 5353),
        "node 5353",
    );
    let other_port = (&ext, client(41004), sa(NODE_V4, 5354), "node 5354");
    let forwarded = (&ext, client(41006), c.sock_v4(5353), "c2");
    let v6 = (&ext, sa(EXT_V6, 41007), sa(NODE_V6, 5353), "node v6");
    let elsewhere = (&ext2, client(41001), sa(NODE_V4, 5353), "node2");
    let send = |flows: &[(&String, SocketAddr, SocketAddr, &str)]| {
        for (ns, src, dst, reply) in flows {
            assert_eq!(udp_from(ns, *src, *dst), *reply, "{src} -> {dst}");
        }
    };
    send(&[
        node_ip, bridge_ip, loopback, other_port, forwarded, v6, elsewhere,
    ]);
    let tcp_src = client(41005);
    assert_eq!(tcp_from(&ext, tcp_src, sa(NODE_V4, 5353)), "node tcp");

    let entry = |(_, src, dst, _): (&String, SocketAddr, SocketAddr, &str)| tuple("udp", src, dst);
    let before = table(&node);
    let before2 = table(&node2);
    for flow in [node_ip, bridge_ip, loopback, other_port, forwarded, v6] {
        assert!(
            before.contains(&entry(flow)),
            "{flow:?} tracked: {before:#?}"
        );
    }
    assert!(before.contains(&tuple("tcp", tcp_src, sa(NODE_V4, 5353))));
    assert!(before2.contains(&entry(elsewhere)), "{before2:#?}");

    // IPv4, any local address: the node's two addresses and the loopback flow.
    let udp5353 = udp_flows((5353, 5353), AddrFamily::Ipv4, None);
    assert_eq!(forget_in(&node, &[udp5353]), 3);
    let gone: BTreeSet<Tuple> = [node_ip, bridge_ip, loopback].map(entry).into();
    let expected: BTreeSet<Tuple> = before.difference(&gone).cloned().collect();
    assert_eq!(
        table(&node),
        expected,
        "exactly the local 5353/udp entries go"
    );
    assert_eq!(table(&node2), before2, "another namespace is never touched");
    // Nothing left to forget: a second run deletes nothing.
    assert_eq!(forget_in(&node, &[udp5353]), 0);

    // The other family on its own.
    assert_eq!(
        forget_in(&node, &[udp_flows((5353, 5353), AddrFamily::Ipv6, None)]),
        1
    );
    let mut expected = expected;
    assert!(expected.remove(&entry(v6)));
    assert_eq!(table(&node), expected);

    // An explicit host address: only its entries, not the node's other local addresses.
    send(&[node_ip, bridge_ip, loopback]);
    let before = table(&node);
    let bridge_only = udp_flows((5353, 5353), AddrFamily::Ipv4, Some(BRIDGE_V4.into()));
    assert_eq!(forget_in(&node, &[bridge_only]), 1);
    let mut expected = before.clone();
    assert!(expected.remove(&entry(bridge_ip)));
    assert_eq!(
        table(&node),
        expected,
        "only the bridge address's entry goes"
    );

    // A range covering both ports, in one call with the IPv6 flows (one dump for all).
    send(&[v6]);
    let before = table(&node);
    let flows = [
        udp_flows((5353, 5354), AddrFamily::Ipv4, None),
        udp_flows((5353, 5353), AddrFamily::Ipv6, None),
    ];
    assert_eq!(forget_in(&node, &flows), 4);
    let gone: BTreeSet<Tuple> = [node_ip, loopback, other_port, v6].map(entry).into();
    let expected: BTreeSet<Tuple> = before.difference(&gone).cloned().collect();
    assert_eq!(table(&node), expected);
    assert!(expected.contains(&entry(forwarded)));
    assert!(expected.contains(&tuple("tcp", tcp_src, sa(NODE_V4, 5353))));
    assert_eq!(table(&node2), before2);
}

/// Entries that traffic cannot make here (this kernel has no SCTP sockets; zones need a CT
/// target), inserted with `conntrack -I`: deletion names each one's zone as the kernel
/// dumped it: zone 7 for both directions (`CTA_ZONE`), zone 8 for the original direction
/// alone (the tuple's own `CTA_TUPLE_ZONE`), zone 9 for the reply direction alone (found
/// by the original tuple in the default zone). The same tuple in zones 0 and 7 is two
/// entries; both go. SCTP goes only when SCTP is asked for.
#[test]
fn entries_in_zones_and_sctp_entries_are_forgotten_exactly() {
    let topo = Topology::new();
    let node = topo.node().to_string();
    let insert = |what: &str| {
        let mut args = vec!["-I", "-t", "100"];
        args.extend(what.split_whitespace());
        let out = run_in(&node, "conntrack", &args, None);
        assert_ok(&out, &format!("conntrack -I {what}"));
    };
    let sctp = "-p sctp --state ESTABLISHED --orig-vtag 1 --reply-vtag 2";
    insert("-p udp -s 10.78.0.2 -d 10.78.0.1 --sport 41001 --dport 5353");
    insert("-p udp -s 10.78.0.2 -d 10.78.0.1 --sport 41001 --dport 5353 -w 7");
    insert("-p udp -s 10.78.0.2 -d 10.78.0.1 --sport 41002 --dport 5353 --orig-zone 8");
    insert("-p udp -s 10.78.0.2 -d 10.78.0.1 --sport 41003 --dport 5353 --reply-zone 9");
    insert("-p udp -s 10.78.0.2 -d 10.77.0.2 --sport 41004 --dport 5353 -w 7");
    insert(&format!(
        "{sctp} -s 10.78.0.2 -d 10.78.0.1 --sport 41005 --dport 5353"
    ));
    insert(&format!(
        "{sctp} -s 10.78.0.2 -d 10.77.0.2 --sport 41006 --dport 5353"
    ));
    insert(&format!(
        "{sctp} -s 10.78.0.2 -d 10.78.0.1 --sport 41007 --dport 5354"
    ));
    // The namespace's addresses come from the harness: 10.78.0.1 is the node's.
    let before = table(&node);
    assert_eq!(before.len(), 8, "{before:#?}");
    let key = |proto: &str, dst: Ipv4Addr, sport: u16, zone: &str| Tuple {
        zone: zone.to_string(),
        ..tuple(proto, sa(EXT_V4, sport), sa(dst, 5353))
    };

    assert_eq!(
        forget_in(&node, &[udp_flows((5353, 5353), AddrFamily::Ipv4, None)]),
        4
    );
    let gone = [
        key("udp", NODE_V4, 41001, ""),
        key("udp", NODE_V4, 41001, "zone=7"),
        key("udp", NODE_V4, 41002, "zone-orig=8"),
        key("udp", NODE_V4, 41003, "zone-reply=9"),
    ];
    let mut expected = before.clone();
    for entry in &gone {
        assert!(expected.remove(entry), "{entry:?} was there: {before:#?}");
    }
    assert_eq!(table(&node), expected);

    let sctp5353 = Flows {
        protocol: Protocol::Sctp,
        ..udp_flows((5353, 5353), AddrFamily::Ipv4, None)
    };
    assert_eq!(forget_in(&node, &[sctp5353]), 1);
    assert!(expected.remove(&key("sctp", NODE_V4, 41005, "")));
    assert_eq!(table(&node), expected);
    assert_eq!(expected.len(), 3, "forwarded and other-port entries stay");
}

/// What a client sees: a UDP client that keeps sending from one source port stays on the
/// old container after the DNAT rule moved, for as long as it keeps sending; once its entry
/// is forgotten, its next datagram takes the new rule.
#[test]
fn a_long_lived_udp_client_follows_the_moved_port_once_forgotten() {
    both(|backend| {
        let mut topo = Topology::new();
        let a = topo.add_container(2);
        let b = topo.add_container(3);
        let _servers = [
            serve_udp(&a.ns, a.sock_v4(5300), "A"),
            serve_udp(&b.ns, b.sock_v4(5300), "B"),
        ];
        let node = topo.node().to_string();
        let dnat_to = |to: Ipv4Addr| {
            if !backend.is_iptables() {
                // The same DNAT in a native nftables table, replaced in one transaction.
                load_nft(
                    &node,
                    &format!(
                        "table ip moved {{\n chain PREROUTING {{\n \
                         type nat hook prerouting priority dstnat;\n }}\n}}\n\
                         flush chain ip moved PREROUTING\n\
                         add rule ip moved PREROUTING fib daddr type local udp dport 5300 \
                         dnat to {to}:5300\n"
                    ),
                );
                return;
            }
            let rules = format!(
                "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                 :POSTROUTING ACCEPT [0:0]\n\
                 -A PREROUTING -p udp -m addrtype --dst-type LOCAL -m udp --dport 5300 \
                 -j DNAT --to-destination {to}:5300\nCOMMIT\n"
            );
            let restore = format!("{}-restore", iptables_tool(backend, Family::V4));
            let out = run_in(&node, &restore, &["-w", "30"], Some(rules.as_bytes()));
            assert_ok(&out, &restore);
        };
        dnat_to(a.v4);

        let client = UdpClient::start(topo.ext(), sa(EXT_V4, 41100), sa(NODE_V4, 5300));
        assert!(
            client.wait_for("A", Instant::now(), T).is_some(),
            "{backend:?}: the client reaches A: {:?}",
            client.replies()
        );

        dnat_to(b.v4);
        let moved = Instant::now();
        thread::sleep(Duration::from_secs(2));
        let since: Vec<String> = client.replies_since(moved);
        assert!(
            since.len() >= 10 && since.iter().all(|r| r == "A"),
            "{backend:?}: without forgetting, the client still reaches only A: {since:?}"
        );

        let forgotten = forget_in(&node, &[udp_flows((5300, 5300), AddrFamily::Ipv4, None)]);
        assert_eq!(forgotten, 1, "{backend:?}: the client's one entry");
        let at = Instant::now();
        let reached = client.wait_for("B", at, Duration::from_secs(1));
        assert!(
            reached.is_some_and(|when| when < at + Duration::from_secs(1)),
            "{backend:?}: after forget the client reaches B within 1 s: {:?}",
            client.replies_since(at)
        );
        thread::sleep(Duration::from_millis(300));
        let after = client.replies_since(reached.unwrap());
        assert!(
            after.iter().all(|r| r == "B"),
            "{backend:?}: and stays there: {after:?}"
        );
        eprintln!(
            "{backend:?}: first reply from B {:?} after forget",
            reached.unwrap() - at
        );
        client.stop();
    });
}

/// `table_is_empty` reads the calling thread's namespace: true where nothing was tracked
/// (conntrack on, no flow yet), false once a flow exists there, and still true in the
/// client's namespace, which tracks nothing.
#[test]
fn table_is_empty_is_per_namespace() {
    let topo = Topology::new();
    let (node, ext) = (topo.node().to_string(), topo.ext().to_string());
    assert!(
        in_netns(&node, conntrack::table_is_empty),
        "fresh namespace"
    );
    track_connections(&node);
    assert!(in_netns(&node, conntrack::table_is_empty), "no flow yet");
    let _server = serve_udp(&node, sa(NODE_V4, 5353), "node");
    assert_eq!(udp_from(&ext, sa(EXT_V4, 41200), sa(NODE_V4, 5353)), "node");
    assert!(!in_netns(&node, conntrack::table_is_empty), "a flow exists");
    assert!(
        in_netns(&ext, conntrack::table_is_empty),
        "ext tracks nothing"
    );
    assert_eq!(
        forget_in(&node, &[udp_flows((5353, 5353), AddrFamily::Ipv4, None)]),
        1
    );
    assert!(in_netns(&node, conntrack::table_is_empty), "forgotten");
}

/// A busy node: thousands of TCP entries (half of them to the flows' very port on a local
/// address), other UDP entries, and a few UDP entries of the flows in both families, to
/// each kind of local address. Only those few go. With both families and this many
/// entries, `forget` chooses one filtered dump per family.
#[test]
fn among_many_tcp_entries_only_the_matching_udp_ones_go() {
    let topo = Topology::new();
    let node = topo.node().to_string();
    let busy = (conntrack::FILTER_BOTH_FAMILIES_FROM as u32 + 1_000) / 2;
    let mut lines = entry_lines(0..busy, "tcp", "10.78.0.1", 443);
    lines += &entry_lines(0..busy, "tcp", "10.78.0.1", 5353);
    lines += &entry_lines(0..500, "udp", "10.78.0.1", 5354);
    let udp_line = |src: &str, dst: &str, sport: u16| {
        format!("-I -t 600 -p udp -s {src} -d {dst} --sport {sport} --dport 5353\n")
    };
    let matching = [
        ("10.78.0.2", "10.78.0.1", 41001),
        ("10.78.0.2", "10.77.0.1", 41002),
        ("127.0.0.1", "127.0.0.1", 41003),
        ("fd78::2", "fd78::1", 41004),
        ("::1", "::1", 41005),
    ];
    let others = [
        // Forwarded through the node: not local.
        ("10.78.0.2", "10.77.0.2", 41006),
        ("fd78::2", "fd77::2", 41007),
        // TCP to the same port, both families.
        ("fd78::2", "fd78::1", 41008),
    ];
    for (src, dst, sport) in matching.iter().chain(&others[..2]) {
        lines += &udp_line(src, dst, *sport);
    }
    let (src, dst, sport) = others[2];
    lines += &format!(
        "-I -t 600 -p tcp --state ESTABLISHED -s {src} -d {dst} --sport {sport} --dport 5353\n"
    );
    load_entries(&node, &lines);

    let before = table(&node);
    assert_eq!(before.len(), 2 * busy as usize + 500 + 8);
    let flows = [
        udp_flows((5353, 5353), AddrFamily::Ipv4, None),
        udp_flows((5353, 5353), AddrFamily::Ipv6, None),
    ];
    assert_eq!(forget_in(&node, &flows), matching.len());
    let mut expected = before.clone();
    for (src, dst, sport) in matching {
        let src = sa(src.parse::<IpAddr>().unwrap(), sport);
        let gone = tuple("udp", src, sa(dst.parse::<IpAddr>().unwrap(), 5353));
        assert!(expected.remove(&gone), "{gone:?} was there");
    }
    assert_eq!(table(&node), expected, "only the matching UDP entries go");
}

/// Every other test of this file, again, in a child process for each dump path `forget`
/// can be forced onto ([`conntrack::DUMP_ENV`]): always one filtered dump per family, always
/// one unfiltered dump, and filtered requests that the kernel refuses (so the fallback to
/// the unfiltered dump runs). Run here without the variable, they take `forget`'s own
/// choice.
#[test]
fn every_test_passes_on_every_dump_path() {
    const ME: &str = "every_test_passes_on_every_dump_path";
    if std::env::var_os(conntrack::DUMP_ENV).is_some() {
        return;
    }
    for path in ["filtered", "unfiltered", "refused"] {
        let out = Command::new(std::env::current_exe().unwrap())
            .env(conntrack::DUMP_ENV, path)
            .args(["conntrack::", "--test-threads=1", "--skip", ME])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("test result: ok."),
            "{}={path}: {stdout}\n{}",
            conntrack::DUMP_ENV,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "{path}: {}",
            stdout
                .lines()
                .find(|l| l.starts_with("test result"))
                .unwrap()
        );
    }
}

//! The route_localnet hole (CVE-2020-8558) from a neighbour's side: an ordinary namespace on
//! the node's bridge that sends to the node's 127.0.0.1, and the node's services bound to
//! localhost that it tries to reach (`tests/it/localnet.rs`, `tests/it/doctor/localhost.rs`).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::{in_netns, run_in};

const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// The node's services bound to 127.0.0.1 only.
pub const SECRET_UDP: u16 = 5353;
pub const SECRET_TCP: u16 = 6000;

/// What the attacker's packets reach on the node's localhost.
pub struct Secrets {
    udp: UdpSocket,
    _tcp: TcpListener,
}

impl Secrets {
    pub fn bind(node: &str) -> Secrets {
        in_netns(node, || Secrets {
            udp: UdpSocket::bind((LOCALHOST, SECRET_UDP)).unwrap(),
            _tcp: TcpListener::bind((LOCALHOST, SECRET_TCP)).unwrap(),
        })
    }

    /// Send a few datagrams from `attacker` and whether any reached the node's localhost
    /// server; and whether a TCP connect from `attacker` completed its handshake.
    pub fn attack(&self, attacker: &str, round: &str) -> (bool, bool) {
        (self.attack_udp(attacker, round), self.attack_tcp(attacker))
    }

    /// Whether a datagram the attacker sends to 127.0.0.1 reaches the node's server.
    pub fn attack_udp(&self, attacker: &str, round: &str) -> bool {
        let payload = format!("attack {round}");
        let sent = payload.clone();
        let send = in_netns(attacker, move || -> io::Result<()> {
            let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            for _ in 0..3 {
                sock.send_to(sent.as_bytes(), (LOCALHOST, SECRET_UDP))?;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        });
        send.unwrap_or_else(|e| panic!("the attacker's send failed locally: {e}"));
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut udp = false;
        let mut buf = [0u8; 64];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            self.udp
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.udp.recv_from(&mut buf) {
                Ok((n, _)) if buf[..n] == *payload.as_bytes() => udp = true,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        udp
    }

    /// Whether a TCP connect from the attacker to 127.0.0.1 completes its handshake.
    pub fn attack_tcp(&self, attacker: &str) -> bool {
        let dst = SocketAddr::from((LOCALHOST, SECRET_TCP));
        in_netns(attacker, move || {
            TcpStream::connect_timeout(&dst, Duration::from_secs(2)).is_ok()
        })
    }
}

/// Make `ns` (a container of the topology, on the node's br0 as 10.77.0.N) send to
/// 127.0.0.0/8 through the node, without raw sockets: drop its own 127.0.0.0/8, turn
/// route_localnet on for its own eth0 (so its kernel sends and accepts loopback addresses
/// there) and route 127.0.0.0/8 via the node.
pub fn arm(ns: &str) {
    for argv in [
        &["ip", "addr", "del", "127.0.0.1/8", "dev", "lo"][..],
        &["sysctl", "-qw", "net.ipv4.conf.eth0.route_localnet=1"],
        &[
            "ip",
            "route",
            "add",
            "127.0.0.0/8",
            "via",
            "10.77.0.1",
            "dev",
            "eth0",
        ],
    ] {
        let out = run_in(ns, argv[0], &argv[1..], None);
        assert!(
            out.status.success(),
            "{argv:?} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `net.ipv4.conf.IFACE.route_localnet` in `ns`.
pub fn route_localnet(ns: &str, iface: &str) -> String {
    let path = format!("/proc/sys/net/ipv4/conf/{iface}/route_localnet");
    let out = run_in(ns, "cat", &[&path], None);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Set `net.ipv4.conf.IFACE.route_localnet` in `ns` (a namespace the test created).
pub fn set_route_localnet(ns: &str, iface: &str, on: bool) {
    let setting = format!(
        "net.ipv4.conf.{iface}.route_localnet={}",
        if on { 1 } else { 0 }
    );
    let out = run_in(ns, "sysctl", &["-qw", &setting], None);
    assert!(
        out.status.success(),
        "sysctl {setting} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

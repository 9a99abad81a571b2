//! Randomised checks: token soup never panics, and what `covers` and `is_empty` claim holds
//! on a grid of packets.

use std::net::IpAddr;

use super::*;
use crate::analysis::iptables::matchset::imply::{Val, effective, iface_subset, parts};

/// Token soup never panics; parsing is deterministic, coverage reflexive, and a
/// conjunction is covered by each side.
#[test]
fn token_soup() {
    const WORDS: &[&str] = &[
        "!",
        "-p",
        "tcp",
        "udp",
        "all",
        "-s",
        "-d",
        "10.0.0.0/8",
        "::/0",
        "0.0.0.0/0",
        "-i",
        "-o",
        "eth+",
        "+",
        "",
        "-f",
        "-m",
        "--match",
        "multiport",
        "addrtype",
        "comment",
        "mark",
        "--dport",
        "--sport",
        "--dports",
        "80",
        "1:2",
        "3,4:",
        ":",
        ",",
        "--dst-type",
        "--src-type",
        "LOCAL",
        "UNICAST,BROADCAST",
        "--comment",
        "-j",
        "-g",
        "--jump",
        "DNAT",
        "--to-destination",
        "-1",
        "X",
        "--limit-iface-in",
        "65536",
        "-",
        "--",
    ];
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut previous = Match::default();
    for _ in 0..20_000 {
        let len = next(12);
        let args: Vec<String> = (0..len)
            .map(|_| WORDS[next(WORDS.len())].to_string())
            .collect();
        let (mat, target) = parse_rule(&args);
        assert_eq!(parse_rule(&args), (mat.clone(), target.clone()), "{args:?}");
        assert!(mat.covers(&mat), "{args:?}");
        let both = mat.and(&previous);
        assert!(mat.covers(&both) && previous.covers(&both), "{args:?}");
        let _ = (
            target.is_terminal(),
            mat.is_empty(),
            both.is_empty(),
            mat.covers(&previous),
        );
        previous = mat;
    }
}

/// Soundness against a packet model (IPv4): whenever `covers` or `is_empty` says yes,
/// no packet of a grid contradicts it. Packets without ports are non-first fragments.
#[test]
fn sound_on_a_packet_grid() {
    const PIECES: &[&str] = &[
        "-p tcp",
        "! -p udp",
        "-p 17",
        "-s 10.0.0.0/8",
        "! -s 10.0.0.1/32",
        "-d 10.0.0.1/32",
        "! -d 11.0.0.0/8",
        "-i eth+",
        "! -i eth0",
        "-i wlan0",
        "! -i e+",
        "-m tcp --dport 80:90",
        "-m tcp ! --dport 80",
        "-m multiport --dports 80,443",
        "-m multiport ! --dports 85,443",
        "-m udp --sport 53",
        "-m addrtype --dst-type LOCAL",
        "-m addrtype ! --dst-type LOCAL",
        "-m addrtype --dst-type BROADCAST,LOCAL",
        "-m addrtype ! --dst-type UNICAST,BROADCAST",
    ];
    struct Packet {
        proto: u8,
        src: IpAddr,
        dst: IpAddr,
        iface: &'static str,
        ports: Option<(u16, u16)>,
        dst_type: &'static str,
    }
    let holds = |c: &Cond, p: &Packet| {
        let (_, negated, val) = parts(c);
        let ports = |field: u8, set: &PortSet| {
            let port = p.ports.map(|(s, d)| if field == 5 { d } else { s });
            port.is_some_and(|port| {
                effective(negated, set)
                    .0
                    .iter()
                    .any(|(a, b)| (*a..=*b).contains(&port))
            })
        };
        let hit = match (c, val) {
            (Cond::DPorts { .. }, Val::Ports(set)) => return ports(5, set),
            (Cond::SPorts { .. }, Val::Ports(set)) => return ports(6, set),
            (_, Val::Proto(x)) => proto_number(x) == Some(p.proto),
            (Cond::Src { .. }, Val::Net(n)) => net_contains(n, &IpNet::host(p.src)),
            (_, Val::Net(n)) => net_contains(n, &IpNet::host(p.dst)),
            (_, Val::Iface(name)) => iface_subset(p.iface, name),
            (_, Val::Types(types)) => types.iter().any(|t| t == p.dst_type),
            _ => unreachable!("no other conditions are generated: {c:?}"),
        };
        hit != negated
    };
    let addrs: Vec<IpAddr> = ["10.0.0.1", "10.0.0.2", "11.0.0.1", "192.168.1.1"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let mut grid = Vec::new();
    for proto in [6, 17, 1] {
        for (&src, &dst) in addrs
            .iter()
            .zip(addrs.iter().rev())
            .chain(addrs.iter().zip(&addrs))
        {
            for iface in ["eth0", "eth1", "wlan0", "docker0"] {
                for ports in [
                    None,
                    Some((53, 80)),
                    Some((1000, 85)),
                    Some((53, 443)),
                    Some((2, 8080)),
                ] {
                    let ports = ports.filter(|_| proto != 1);
                    for dst_type in ["LOCAL", "UNICAST", "BROADCAST"] {
                        grid.push(Packet {
                            proto,
                            src,
                            dst,
                            iface,
                            ports,
                            dst_type,
                        });
                    }
                }
            }
        }
    }
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    let mut random_rule = || {
        let line: Vec<&str> = (0..next(4)).map(|_| PIECES[next(PIECES.len())]).collect();
        m(&line.join(" "))
    };
    let (mut covered, mut empty) = (0, 0);
    for _ in 0..2_000 {
        let (a, b) = (random_rule(), random_rule());
        let matches = |x: &Match, p: &Packet| x.conds.iter().all(|c| holds(c, p));
        if a.covers(&b) {
            covered += 1;
            let counter = grid.iter().find(|p| matches(&b, p) && !matches(&a, p));
            assert!(counter.is_none(), "{a:?} claimed to cover {b:?}");
        }
        let both = a.and(&b);
        if both.is_empty() {
            empty += 1;
            assert!(
                !grid.iter().any(|p| matches(&both, p)),
                "{both:?} claimed empty"
            );
        }
    }
    assert!(
        covered > 300 && empty > 100,
        "the grid checked too little: {covered} {empty}"
    );
}

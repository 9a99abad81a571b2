//! natledger encodes its rules as the `nft` tool does (issue 15): the same rules written by
//! natledger (node A, create-runtime hooks) and by `nft -f` from their nft syntax (node B,
//! the syntax built here by hand per mapping, not with natledger's code) give the kernel the
//! same expressions and the same user data (the comment), compared as `nft --debug=netlink
//! list table` prints them, per chain and in order; `nft list table` prints both alike (chain
//! types, hooks, priorities, policies), `nft -j list ruleset` parses A's rules, and both
//! rulesets forward real TCP and UDP traffic.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// One mapping as written in `io.natledger.ports`, and what the nft syntax needs of it.
struct Mapping {
    spec: &'static str,
    proto: &'static str,
    host_ip: Option<IpAddr>,
    host: (u16, u16),
    ctr: (u16, u16),
}

const fn m(
    spec: &'static str,
    proto: &'static str,
    host_ip: Option<IpAddr>,
    host: (u16, u16),
    ctr: (u16, u16),
) -> Mapping {
    Mapping {
        spec,
        proto,
        host_ip,
        host,
        ctr,
    }
}

const NODE_BRIDGE_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));
const NODE_BRIDGE_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1));

/// c1's mappings: TCP, UDP, SCTP, single ports, ranges, a host IP of each family.
const C1: [Mapping; 6] = [
    m("8080:80", "tcp", None, (8080, 8080), (80, 80)),
    m("8080:80/udp", "udp", None, (8080, 8080), (80, 80)),
    m(
        "9000-9002:9000-9002/sctp",
        "sctp",
        None,
        (9000, 9002),
        (9000, 9002),
    ),
    m(
        "5000-5001:5000-5001",
        "tcp",
        None,
        (5000, 5001),
        (5000, 5001),
    ),
    m(
        "10.77.0.1:7070:70",
        "tcp",
        Some(NODE_BRIDGE_V4),
        (7070, 7070),
        (70, 70),
    ),
    m(
        "[fd77::1]:7171:71/udp",
        "udp",
        Some(NODE_BRIDGE_V6),
        (7171, 7171),
        (71, 71),
    ),
];
/// c3's, created after c1: its rules come first.
const C3: [Mapping; 1] = [m("6060:60/udp", "udp", None, (6060, 6060), (60, 60))];

fn ports((a, b): (u16, u16)) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// The nft family keyword of an address ("ip" / "ip6").
fn kw(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "ip" } else { "ip6" }
}

/// A container's NATLEDGER-HOSTPORTS and NATLEDGER-MASQ rules in nft syntax, in `ctr`'s family.
fn container_rules(id: &str, ctr: IpAddr, mappings: &[Mapping]) -> (Vec<String>, Vec<String>) {
    let comment = format!("comment \"natledger:{id}\"");
    let fam = kw(ctr);
    let (mut dnat, mut masq) = (Vec::new(), Vec::new());
    for mp in mappings {
        if mp.host_ip.is_some_and(|h| h.is_ipv4() != ctr.is_ipv4()) {
            continue;
        }
        let daddr = mp
            .host_ip
            .map(|h| format!("{fam} daddr {h} "))
            .unwrap_or_default();
        let to = match (mp.ctr.0 == mp.ctr.1, ctr) {
            (true, IpAddr::V4(a)) => format!("{a}:{}", mp.ctr.0),
            (true, IpAddr::V6(a)) => format!("[{a}]:{}", mp.ctr.0),
            (false, a) => a.to_string(),
        };
        let (proto, host, cports) = (mp.proto, ports(mp.host), ports(mp.ctr));
        dnat.push(format!(
            "{daddr}{proto} dport {host} dnat to {to} {comment}"
        ));
        masq.push(format!(
            "{fam} saddr {ctr} {fam} daddr {ctr} {proto} dport {cports} masquerade {comment}"
        ));
        if ctr.is_ipv4() && mp.host_ip.is_none() {
            masq.push(format!(
                "ip saddr 127.0.0.0/8 ip daddr {ctr} {proto} dport {cports} masquerade {comment}"
            ));
        }
    }
    (dnat, masq)
}

/// natledger's table of one family in nft syntax: the shared chains and rules (the guard in
/// IPv4), the containers' DNATs newest first, chains in the order natledger creates them.
fn table_text(c1: IpAddr, c3: IpAddr) -> String {
    let fam = kw(c1);
    let (d1, m1) = container_rules("c1", c1, &C1);
    let (d3, m3) = container_rules("c3", c3, &C3);
    let chain = |name: &str, head: &str, rules: &[String]| {
        let mut s = format!("  chain {name} {{\n");
        if !head.is_empty() {
            s.push_str(&format!("    {head}\n"));
        }
        for r in rules {
            s.push_str(&format!("    {r}\n"));
        }
        s + "  }\n"
    };
    let shared = |r: &str| vec![format!("{r} comment \"natledger\"")];
    let mut s = format!("table {fam} natledger {{\n");
    if fam == "ip" {
        s += &chain(
            "NATLEDGER-INPUT",
            "",
            &[
                shared("ip daddr 127.0.0.0/8 iifname != \"lo\" ct status ! dnat drop"),
                shared("ip daddr 127.0.0.0/8 iifname != \"lo\" ct state invalid,untracked drop"),
            ]
            .concat(),
        );
        s += &chain(
            "INPUT",
            "type filter hook input priority filter - 10; policy accept;",
            &shared("jump NATLEDGER-INPUT"),
        );
    }
    s += &chain("NATLEDGER-HOSTPORTS", "", &[d3, d1].concat());
    // Masquerades are appended (their order does not matter: each matches its own container).
    s += &chain("NATLEDGER-MASQ", "", &[m1, m3].concat());
    let to_hostports = shared("fib daddr type local jump NATLEDGER-HOSTPORTS");
    s += &chain(
        "PREROUTING",
        "type nat hook prerouting priority dstnat - 10; policy accept;",
        &to_hostports,
    );
    s += &chain(
        "OUTPUT",
        "type nat hook output priority -110; policy accept;",
        &to_hostports,
    );
    s += &chain(
        "POSTROUTING",
        "type nat hook postrouting priority srcnat - 10; policy accept;",
        &shared("jump NATLEDGER-MASQ"),
    );
    s + "}\n"
}

fn nft(ns: &str, args: &[&str], stdin: Option<&str>) -> String {
    let out = run_in(ns, "nft", args, stdin.map(str::as_bytes));
    assert_ok(&out, &format!("nft {args:?} in {ns}"));
    String::from_utf8(out.stdout).expect("nft prints UTF-8")
}

/// `nft --debug=netlink list table FAMILY natledger`'s expression blocks, per chain in order:
/// each rule's expressions and user data, without its handle and position.
fn expressions(ns: &str, family: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let text = nft(
        ns,
        &["--debug=netlink", "list", "table", family, "natledger"],
        None,
    );
    let head = format!("{family} natledger ");
    let mut chains: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    let mut current: Option<&mut Vec<String>> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(&head) {
            let chain = rest.split_whitespace().next().unwrap_or("").to_string();
            let rules = chains.entry(chain).or_default();
            rules.push(Vec::new());
            current = rules.last_mut();
        } else if line.starts_with("  ") {
            if let Some(rule) = current.as_mut() {
                rule.push(line.trim().to_string());
            }
        } else {
            current = None;
        }
    }
    chains
}

/// Node with c1 (10.77.0.2) serving TCP and UDP on 80 and c3 (10.77.0.3) on UDP 60.
fn containers(node: &mut Node) -> Vec<Server> {
    let c1 = node.topo.add_container(2);
    let c3 = node.topo.add_container(3);
    vec![
        serve_tcp(&c1.ns, c1.sock_v4(80), "c1 tcp"),
        serve_udp(&c1.ns, c1.sock_v4(80), "c1 udp"),
        serve_tcp(&c1.ns, c1.sock_v6(80), "c1 tcp6"),
        serve_udp(&c1.ns, c1.sock_v6(71), "c1 udp6 71"),
        serve_udp(&c3.ns, c3.sock_v4(60), "c3 udp"),
    ]
}

/// The paths through the mappings, and what answers them.
fn traffic(node: &Node, what: &str) {
    let ext = node.topo.ext();
    let checks: [(SocketAddr, bool, &str); 5] = [
        (sock(NODE_V4, 8080), true, "c1 tcp"),
        (sock(NODE_V4, 8080), false, "c1 udp"),
        (sock(NODE_V6, 8080), true, "c1 tcp6"),
        (sock(NODE_V4, 6060), false, "c3 udp"),
        (sock(NODE_V6, 6060), false, ""),
    ];
    for (dst, tcp, want) in checks {
        let got = if tcp {
            tcp_request(ext, dst, T).ok()
        } else {
            udp_request(ext, dst, T).ok()
        };
        let want = (!want.is_empty()).then(|| want.to_string());
        assert_eq!(
            got,
            want,
            "{what}: {} {dst}",
            if tcp { "tcp" } else { "udp" }
        );
    }
    // The IPv6 host IP mapping: the node's bridge address, from outside.
    assert_eq!(
        udp_request(ext, sock(NODE_BRIDGE_V6, 7171), T)
            .ok()
            .as_deref(),
        Some("c1 udp6 71"),
        "{what}: udp [fd77::1]:7171"
    );
}

#[test]
fn natledgers_rules_are_encoded_as_nft_encodes_them() {
    let mut a = Node::new(Backend::OwnNftables);
    let mut b = Node::new(Backend::OwnNftables);
    let _servers = [containers(&mut a), containers(&mut b)];
    let (a_ns, b_ns) = (a.topo.node().to_string(), b.topo.node().to_string());
    let pristine = a.dump();

    let spec = |ms: &[Mapping]| ms.iter().map(|m| m.spec).collect::<Vec<_>>().join(",");
    let (c1_ports, c3_ports) = (spec(&C1), spec(&C3));
    a.create(
        "c1",
        None,
        &[
            ("io.natledger.ports", &c1_ports),
            ("io.natledger.ip", "10.77.0.2,fd77::2"),
        ],
    );
    a.create(
        "c3",
        None,
        &[
            ("io.natledger.ports", &c3_ports),
            ("io.natledger.ip", "10.77.0.3,fd77::3"),
        ],
    );
    let c1 = [IpAddr::from([10, 77, 0, 2]), "fd77::2".parse().unwrap()];
    let c3 = [IpAddr::from([10, 77, 0, 3]), "fd77::3".parse().unwrap()];
    let text = table_text(c1[0], c3[0]) + &table_text(c1[1], c3[1]);
    nft(&b_ns, &["-f", "-"], Some(&text));

    for family in ["ip", "ip6"] {
        let (ea, eb) = (expressions(&a_ns, family), expressions(&b_ns, family));
        assert!(
            ea["NATLEDGER-HOSTPORTS"].len() >= 5,
            "{family}: too few rules in A: {ea:#?}"
        );
        for chain in ea.keys().chain(eb.keys()) {
            let (ra, rb) = (&ea.get(chain), &eb.get(chain));
            let n = ra.map_or(0, Vec::len).max(rb.map_or(0, Vec::len));
            for i in 0..n {
                let (x, y) = (ra.and_then(|r| r.get(i)), rb.and_then(|r| r.get(i)));
                assert_eq!(
                    x, y,
                    "{family} {chain} rule {i}: natledger's expressions (left) differ from \
                     nft's (right); nft syntax written:\n{text}"
                );
            }
        }
        assert_eq!(ea, eb);
        let list = ["list", "table", family, "natledger"];
        assert_eq!(nft(&a_ns, &list, None), nft(&b_ns, &list, None), "{family}");
    }

    // nft's JSON reads every rule of natledger's, with its comment, and no xtables match.
    let json: serde_json::Value =
        serde_json::from_str(&nft(&a_ns, &["-j", "list", "ruleset"], None))
            .expect("nft -j list ruleset parses");
    let rules: Vec<&serde_json::Value> = json["nftables"]
        .as_array()
        .expect("nftables array")
        .iter()
        .filter_map(|o| o.get("rule"))
        .collect();
    let tagged = |id: &str| {
        rules
            .iter()
            .filter(|r| r["comment"] == format!("natledger:{id}"))
            .count()
    };
    // c1: 5 + 5 DNAT (IPv4 + IPv6), masquerades 5 + 4 (127.0.0.0/8 for the 4 mappings
    // without a host IP) + 5; c3: 2 DNAT, 3 masquerades.
    assert_eq!(tagged("c1"), 5 + 5 + 9 + 5, "{json:#}");
    assert_eq!(tagged("c3"), 2 + 3, "{json:#}");
    assert!(!json.to_string().contains("\"xt\""), "{json:#}");

    // Both rulesets forward.
    traffic(&a, "natledger's rules");
    traffic(&b, "nft -f's rules");

    for id in ["c3", "c1"] {
        assert_ok(&a.poststop(id), "poststop");
    }
    assert_ok(&a.sweep(&["--all"]), "sweep --all");
    assert_eq!(a.dump(), pristine, "sweep --all");
}

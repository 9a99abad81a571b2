//! Coverage, emptiness and conjunction, table driven.

use super::*;

#[test]
fn identical_random_or_counting_conditions_imply_nothing() {
    let sampled = "-p tcp -m statistic --mode random --probability 0.5 -j X";
    assert!(!m(sampled).covers(&m(sampled)));
    let limited = "-p tcp -m limit --limit 5/sec -j X";
    assert!(!m(limited).covers(&m(limited)));
    let marked = "-p tcp -m mark --mark 0x1 -j X";
    assert!(m(marked).covers(&m(marked)));
}

/// (A, B, A covers B)
const COVERS: &[(&str, &str, bool)] = &[
    // ports: single, range, multiport, negated
    ("-p tcp -m tcp --dport 80", "-p tcp -m tcp --dport 80", true),
    (
        "-p tcp -m tcp --dport 80:90",
        "-p tcp -m tcp --dport 85",
        true,
    ),
    (
        "-p tcp -m tcp --dport 85",
        "-p tcp -m tcp --dport 80:90",
        false,
    ),
    (
        "-p tcp -m multiport --dports 80,443",
        "-p tcp -m tcp --dport 443",
        true,
    ),
    (
        "-p tcp -m multiport --dports 80,443",
        "-p tcp -m multiport --dports 443,80",
        true,
    ),
    (
        "-p tcp -m multiport --dports 80,443",
        "-p tcp -m multiport --dports 80,8080",
        false,
    ),
    (
        "-p tcp -m multiport --dports 1:100,200",
        "-p tcp -m multiport --dports 5,50:60,200",
        true,
    ),
    (
        "-p tcp -m tcp ! --dport 80",
        "-p tcp -m tcp --dport 443",
        true,
    ),
    (
        "-p tcp -m tcp ! --dport 80",
        "-p tcp -m tcp --dport 80",
        false,
    ),
    (
        "-p tcp -m tcp ! --dport 80",
        "-p tcp -m multiport ! --dports 80,81",
        true,
    ),
    (
        "-p tcp -m multiport ! --dports 80,81",
        "-p tcp -m tcp ! --dport 80",
        false,
    ),
    ("-p tcp -m tcp --dport 0:65535", "-p tcp", false), // fragments have no ports
    ("-p tcp", "-p tcp -m tcp --dport 80", true),
    (
        "-p tcp -m tcp --sport 1024:65535",
        "-p tcp -m tcp --dport 1024",
        false,
    ),
    (
        "-p tcp -m tcp --dport 80",
        "-p udp -m udp --dport 80",
        false,
    ),
    (
        "-p tcp --dport 8080",
        "! -i docker0 -p tcp -m tcp --dport 8080",
        true,
    ),
    (
        "! -i docker0 -p tcp -m tcp --dport 8080",
        "-p tcp -m tcp --dport 8080",
        false,
    ),
    // addresses and prefixes
    ("-s 10.0.0.0/8", "-s 10.1.2.0/24", true),
    ("-s 10.1.2.0/24", "-s 10.0.0.0/8", false),
    ("-d 10.0.0.1/32", "-d 10.0.0.1", true),
    ("-d 10.0.0.1/32", "-d 10.0.0.2/32", false),
    ("! -d 10.0.0.1/32", "-d 10.0.0.2/32", true),
    ("! -d 10.0.0.0/8", "-d 10.9.0.0/16", false),
    ("! -s 10.0.0.0/16", "! -s 10.0.0.0/8", true),
    ("! -s 10.0.0.0/8", "! -s 10.0.0.0/16", false),
    ("-s 10.0.0.0/8", "! -s 11.0.0.0/8", false),
    ("-s 0.0.0.0/0", "-p tcp", true),
    ("-s ::/0", "-p tcp", true),
    ("-s 10.0.0.0/8", "-d 10.0.0.1/32", false),
    ("-s 2001:db8::/32", "-s 2001:db8:1::/48", true),
    ("-s 2001:db8:1::/48", "-s 2001:db8::/32", false),
    ("! -s 2001:db8::/32", "-s 2001:db9::1/128", true),
    ("-s ::/96", "-s 0.0.0.1/32", false), // families never imply each other
    ("! -s ::ffff:0:0/96", "-s 10.0.0.1/32", false),
    // interfaces
    ("-i eth+", "-i eth0", true),
    ("-i eth+", "-i eth1+", true),
    ("-i eth+", "-i eth+", true),
    ("-i eth1+", "-i eth+", false),
    ("-i eth0", "-i eth+", false),
    ("-i eth0", "-i eth0", true),
    ("-i eth0", "-i eth1", false),
    ("! -i eth+", "-i wlan0", true),
    ("! -i eth+", "-i eth0", false),
    ("! -i eth+", "-i e+", false),
    ("! -i eth0", "! -i eth+", true),
    ("! -i eth+", "! -i eth0", false),
    ("! -i docker0", "-i eth0", true),
    ("-o +", "-p tcp", true),
    ("-i eth0", "-o eth0", false),
    // address types
    (
        "-m addrtype --dst-type LOCAL",
        "-m addrtype --dst-type LOCAL",
        true,
    ),
    (
        "-m addrtype --dst-type LOCAL,ANYCAST",
        "-m addrtype --dst-type LOCAL",
        true,
    ),
    (
        "-m addrtype --dst-type LOCAL,UNICAST",
        "-m addrtype --dst-type LOCAL",
        false,
    ), // not in IPv6
    (
        "-m addrtype --dst-type BROADCAST,LOCAL",
        "-m addrtype --dst-type LOCAL",
        true,
    ),
    (
        "-m addrtype --dst-type LOCAL",
        "-m addrtype --dst-type LOCAL,ANYCAST",
        false,
    ),
    (
        "-m addrtype --dst-type LOCAL",
        "-m addrtype --src-type LOCAL",
        false,
    ),
    (
        "-m addrtype ! --dst-type LOCAL",
        "-m addrtype ! --dst-type LOCAL,ANYCAST",
        true,
    ),
    (
        "-m addrtype ! --dst-type LOCAL",
        "-m addrtype --dst-type BROADCAST",
        true,
    ),
    (
        "-m addrtype ! --dst-type LOCAL",
        "-m addrtype --dst-type UNICAST",
        false,
    ), // IPv6 overlap
    (
        "-m addrtype ! --dst-type LOCAL",
        "-m addrtype --dst-type LOCAL",
        false,
    ),
    ("-m addrtype --dst-type LOCAL", "-d 10.0.0.1/32", false),
    // protocols
    ("! -p udp", "-p tcp", true),
    ("! -p udp", "-p 6", true),
    ("-p tcp", "-p 6", true),
    ("! -p tcp", "-p 6", false),
    ("! -p udp", "-p foo", false),
    ("! -p udp", "! -p udp", true),
    ("-p tcp", "! -p udp", false),
    ("-p ipv6-icmp", "-p icmpv6", true),
    // comments ignored, marks are conditions, the MARK target is not
    (
        "-m comment --comment a -p tcp",
        "-p tcp -m comment --comment b",
        true,
    ),
    (
        "-p tcp -j MARK --set-xmark 0x1/0x1",
        "-p tcp -j ACCEPT",
        true,
    ),
    ("-m mark --mark 0x1 -p tcp", "-p tcp", false),
    ("-p tcp", "-m mark --mark 0x1 -p tcp", true),
    ("-m mark --mark 0x1", "-m mark --mark 0x1 -p tcp", true),
    ("-m mark --mark 0x1", "-m mark --mark 0x2", false),
    ("-m mark ! --mark 0x1", "-m mark --mark 0x2", false),
    (
        "-m conntrack --ctstate NEW",
        "-m conntrack --ctstate NEW,RELATED",
        false,
    ),
    (
        "-m limit --limit 5/min",
        "-m limit --limit 5/min --limit-burst 10",
        false,
    ),
    ("-f", "-f", true),
    ("-f", "! -f", false),
    // an empty match is covered by anything
    ("-p udp", "-p tcp -p udp", true),
    ("-d 10.0.0.1/32", "-d 10.0.0.2/32 -d 10.0.0.3/32", true),
    // rules from the seeds and peers
    (
        "-A PREROUTING -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.0.0.5:6667",
        "-A PREROUTING -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.0.0.9:6667",
        true,
    ),
    (
        r#"-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"cbr0\" id: \"fb7c\"" -m multiport --dports 443,9001,80,9002 -j CNI-DN-b24a"#,
        r#"-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"cbr0\" id: \"0961\"" -m multiport --dports 443,9001,80 -j CNI-DN-f239"#,
        true,
    ),
    (
        "-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/svc:http\" -m tcp --dport 30080 -j KUBE-EXT-ABC",
        "-A NATLEDGER-HOSTPORTS -d 10.1.2.3/32 -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -m comment --comment natledger:abc -j DNAT --to-destination 10.88.0.2:80",
        true,
    ),
    (
        "-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80",
        "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m addrtype --dst-type LOCAL -j DNAT --to-destination 10.88.0.2:80",
        false,
    ),
];

#[test]
fn covers() {
    for (a, b, want) in COVERS {
        assert_eq!(m(a).covers(&m(b)), *want, "{a:?} covers {b:?}");
    }
}

/// (rule, certainly matches nothing)
const EMPTY: &[(&str, bool)] = &[
    ("", false),
    ("-p tcp -p udp", true),
    ("-p tcp -p 6", false),
    ("-p tcp ! -p 6", true),
    ("-p tcp -p foo", false),
    ("-d 10.0.0.1/32 -d 10.0.0.2/32", true),
    ("-d 10.0.0.0/8 -d 10.0.0.2/32", false),
    ("-d 10.0.0.0/8 ! -d 10.0.0.0/7", true),
    ("! -d 0.0.0.0/0", true),
    ("-s 10.0.0.1/32 -s ::1/128", false),
    ("-p tcp -m tcp --dport 80 -m multiport --dports 81,82", true),
    (
        "-p tcp -m multiport --dports 1,2 -m multiport --dports 2,3 -m multiport --dports 1,3",
        true,
    ),
    (
        "-p tcp -m tcp --dport 80 -m multiport --dports 80,82",
        false,
    ),
    ("-p tcp -m tcp --dport 80 -m tcp ! --dport 80", true),
    ("-p tcp -m tcp ! --dport 0:65535", true),
    ("-p tcp -m tcp --dport 80 -m tcp --sport 80", false),
    ("-i eth0 -i eth1", true),
    ("-i eth0 ! -i eth+", true),
    ("-i eth+ -i eth0", false),
    ("! -o +", true),
    (
        "-m addrtype --dst-type LOCAL -m addrtype ! --dst-type LOCAL",
        true,
    ),
    (
        "-m addrtype --dst-type LOCAL -m addrtype ! --dst-type LOCAL,ANYCAST",
        true,
    ),
    (
        "-m addrtype --dst-type LOCAL -m addrtype --dst-type UNICAST",
        false,
    ),
    (
        "-m addrtype --dst-type LOCAL -m addrtype --dst-type BROADCAST",
        true,
    ),
    ("-m mark --mark 0x1 -m mark --mark 0x2", false),
    ("-m mark --mark 0x1 -m mark ! --mark 0x1", false),
];

#[test]
fn is_empty() {
    for (line, want) in EMPTY {
        assert_eq!(m(line).is_empty(), *want, "{line:?}");
    }
}

#[test]
fn conjunction_of_jump_and_rule() {
    let jump = m("-A PREROUTING -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS");
    let rule = m("-A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-EXT-ABC");
    let path = jump.and(&rule);
    assert_eq!(show(&path), "dst-type LOCAL | proto tcp | dports 30080");
    assert_eq!(path.and(&path), path);
    assert!(jump.covers(&path) && rule.covers(&path));
    assert!(!path.covers(&rule), "the jump's condition is missing");
    assert!(path.covers(&m(
        "-p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -d 10.0.0.1/32"
    )));
    assert!(path.and(&m("-p udp")).is_empty());
    assert!(!path.and(&m("-p tcp -m tcp --dport 30000:31000")).is_empty());
    assert!(
        path.and(&m("-p tcp -m tcp ! --dport 30000:31000"))
            .is_empty()
    );
}

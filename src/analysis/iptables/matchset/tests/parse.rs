//! Parsing: the conditions and the target of rules as `*-save` prints them.

use super::*;
use crate::model::anyrule::parse_ports;

/// (saved rule, its conditions in short)
const PARSED: &[(&str, &str)] = &[
    (
        r#"-A KUBE-NODEPORTS -p tcp -m comment --comment "default/svc:http" -m tcp --dport 30080 -j KUBE-EXT-ABC"#,
        "proto tcp | dports 30080",
    ),
    (
        r#"-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"cbr0\" id: \"fb7c\"" -m multiport --dports 443,9001,80 -j CNI-DN-b24a"#,
        "proto tcp | dports 80,443,9001",
    ),
    (
        "-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80",
        "!in docker0 | proto tcp | dports 8080",
    ),
    (
        "-A NATLEDGER-HOSTPORTS -d 10.1.2.3/32 -p udp -m udp --dport 5353 -m addrtype --dst-type LOCAL -m comment --comment natledger:abc -j DNAT --to-destination 10.88.0.2:53",
        "dst 10.1.2.3/32 | proto udp | dports 5353 | dst-type LOCAL",
    ),
    (
        "-A PREROUTING -m addrtype --dst-type LOCAL -j NATLEDGER-HOSTPORTS",
        "dst-type LOCAL",
    ),
    (
        "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
        "src 172.17.0.0/16 | !out docker0",
    ),
    (
        "-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER",
        "!dst 127.0.0.0/8 | dst-type LOCAL",
    ),
    ("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000", ""),
    (
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "other[-m mark ! --mark 0x4000/0x4000]",
    ),
    (
        "-p tcp -m tcp ! --dport 80 -m multiport ! --sports 1,2:4,8000:8010 -p all",
        "proto tcp | !dports 80 | !sports 1:4,8000:8010",
    ),
    (
        "-p tcp --dport 22 -m addrtype ! --src-type LOCAL,unicast",
        "proto tcp | dports 22 | !src-type LOCAL,UNICAST",
    ),
    (
        "-s 2001:db8::/32 -i eth+ -p 47 -m sctp --sport 1:",
        "src 2001:db8::/32 | in eth+ | proto 47 | sports 1:65535",
    ),
    (
        "--source 10.0.0.1 --protocol TCP --match tcp --destination-port :1023",
        "src 10.0.0.1/32 | proto tcp | dports 0:1023",
    ),
    (
        "-s ! 10.0.0.0/8 -d ::1/128",
        "!src 10.0.0.0/8 | dst ::1/128",
    ),
    // not modelled: whole modules, or single options of the port modules
    (
        "-m conntrack --ctstate NEW",
        "other[-m conntrack --ctstate NEW]",
    ),
    (
        "-m conntrack ! --ctstate NEW,RELATED --ctdir REPLY",
        "other[-m conntrack ! --ctstate NEW,RELATED --ctdir REPLY]",
    ),
    ("-m mark --mark 0x1", "other[-m mark --mark 0x1]"),
    (
        "-m set --match-set KUBE-X dst,dst -m set ! --match-set Y src",
        "other[-m set --match-set KUBE-X dst,dst] | other[-m set ! --match-set Y src]",
    ),
    (
        "-m statistic --mode random --probability 0.5",
        "other[-m statistic --mode random --probability 0.5]",
    ),
    (
        "-m physdev --physdev-is-bridged -f ! -f",
        "other[-m physdev --physdev-is-bridged] | other[-f] | other[! -f]",
    ),
    (
        "-p icmp -m icmp --icmp-type 8",
        "proto icmp | other[-m icmp --icmp-type 8]",
    ),
    (
        "-m addrtype --dst-type LOCAL --limit-iface-in",
        "other[-m addrtype --dst-type LOCAL --limit-iface-in]",
    ),
    (
        "-m addrtype --dst-type BOGUS",
        "other[-m addrtype --dst-type BOGUS]",
    ),
    (
        "-p tcp -m tcp --dport 22 --tcp-flags FIN,SYN SYN",
        "proto tcp | dports 22 | other[-m tcp --tcp-flags FIN,SYN SYN]",
    ),
    (
        "-p tcp -m tcp --dport 90:80 -m multiport --ports 80",
        "proto tcp | other[-m tcp --dport 90:80] | other[-m multiport --ports 80]",
    ),
    (
        "-s example.com ! -p all -p 0",
        "other[-s example.com] | other[! -p all]",
    ),
    (
        "-m comment --comment \"a b\" --bogus",
        "other[-m comment --comment \"a b\" --bogus]",
    ),
    ("--weird 1 -2 -i", "other[--weird 1 -2] | other[-i]"),
    (
        "-p udp --dport 53 --dports 1",
        "proto udp | dports 53 | other[--dports 1]",
    ),
    (
        "-m string --algo bm --string -s -j DROP",
        "other[-m string --algo bm --string -s]",
    ),
    ("-m comment --comment -p -j LOG --log-prefix -p", ""),
];

#[test]
fn parses_conditions() {
    for (line, want) in PARSED {
        assert_eq!(show(&m(line)), *want, "{line}");
    }
}

#[test]
fn parses_targets() {
    let cases: &[(&str, Target, bool)] = &[
        ("-p tcp", Target::None, false),
        ("-j ACCEPT", Target::Accept, true),
        ("-j DROP", Target::Drop, true),
        ("-j RETURN", Target::Return, false),
        (
            "-j REJECT --reject-with icmp-port-unreachable",
            Target::Reject,
            true,
        ),
        (
            "-j DNAT --to-destination 10.0.0.2:80",
            Target::Dnat {
                to: "10.0.0.2:80".into(),
            },
            true,
        ),
        (
            "-j REDIRECT --to-ports 8080",
            Target::Redirect {
                to_ports: Some("8080".into()),
            },
            true,
        ),
        ("-j REDIRECT", Target::Redirect { to_ports: None }, true),
        ("-j MASQUERADE --random-fully", Target::Masquerade, true),
        (
            "--jump SNAT --to-source 1.2.3.4",
            Target::Snat {
                to: "1.2.3.4".into(),
            },
            true,
        ),
        (
            "-j MARK --set-xmark 0x4000/0x4000",
            Target::Other("MARK".into()),
            false,
        ),
        (
            "-j LOG --log-prefix \"x: \"",
            Target::Other("LOG".into()),
            false,
        ),
        ("-j CT --notrack", Target::Other("CT".into()), false),
        (
            "-j KUBE-SVC-XYZ",
            Target::Jump("KUBE-SVC-XYZ".into()),
            false,
        ),
        ("-g KUBE-SEP-1", Target::Goto("KUBE-SEP-1".into()), false),
        ("-j", Target::Other(String::new()), false),
        ("-j DROP -j LOG", Target::Other("DROP".into()), false),
        (
            "-m string --string -j --algo bm -j DROP",
            Target::Drop,
            true,
        ),
    ];
    for (line, target, terminal) in cases {
        let (mat, got) = rule(line);
        assert_eq!((&got, got.is_terminal()), (target, *terminal), "{line}");
        assert!(
            mat.conds.len() <= 1,
            "{line}: target options are no conditions"
        );
    }
}

#[test]
fn port_sets() {
    let set = |r: &[(u16, u16)]| PortSet::new(r.to_vec());
    assert_eq!(
        set(&[(5, 9), (1, 3), (4, 4), (20, 30), (25, 26), (9, 1)]).0,
        [(1, 9), (20, 30)]
    );
    assert_eq!(set(&[(0, 9), (65530, 65535)]).complement().0, [(10, 65529)]);
    assert_eq!(set(&[]).complement().0, [(0, 65535)]);
    assert!(set(&[(0, 65535)]).complement().is_empty());
    assert_eq!(
        set(&[(1, 10), (20, 30)]).intersection(&set(&[(5, 25)])).0,
        [(5, 10), (20, 25)]
    );
    assert!(set(&[(80, 80)]).is_subset(&set(&[(1, 100)])));
    assert!(!set(&[(80, 443)]).is_subset(&set(&[(1, 100), (200, 500)])));
    assert!(PortSet(vec![(443, 443), (80, 80)]).is_subset(&set(&[(80, 80), (443, 443)])));
    assert_eq!(parse_ports("1,2", false), None);
    assert_eq!(parse_ports("1,x", true), None);
}

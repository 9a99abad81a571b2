//! Tests of the match-subset logic (matchset.rs): coverage, emptiness and parsing, table
//! driven, plus randomised soundness checks.

mod stateful {
    use super::super::*;

    fn m(line: &str) -> Match {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        parse_rule(&args).0
    }

    #[test]
    fn identical_random_or_counting_conditions_imply_nothing() {
        let sampled = "-p tcp -m statistic --mode random --probability 0.5 -j X";
        assert!(!m(sampled).covers(&m(sampled)));
        let limited = "-p tcp -m limit --limit 5/sec -j X";
        assert!(!m(limited).covers(&m(limited)));
        let marked = "-p tcp -m mark --mark 0x1 -j X";
        assert!(m(marked).covers(&m(marked)));
    }
}

mod cases {
    use super::super::*;

    /// A rule as printed (with or without `-A CHAIN`).
    fn rule(line: &str) -> (Match, Target) {
        let mut tokens = crate::save::tokenize(line).expect("test line tokenizes");
        if tokens.first().map(String::as_str) == Some("-A") {
            tokens.drain(..2.min(tokens.len()));
        }
        parse_rule(&tokens)
    }

    fn m(line: &str) -> Match {
        rule(line).0
    }

    /// Conditions in short: `!in docker0 | proto tcp | dports 80,90:99 | other[-f]`.
    fn show(mat: &Match) -> String {
        let one = |c: &Cond| {
            let ports = |p: &PortSet| {
                let r: Vec<String> =
                    p.0.iter()
                        .map(|(a, b)| {
                            if a == b {
                                format!("{a}")
                            } else {
                                format!("{a}:{b}")
                            }
                        })
                        .collect();
                r.join(",")
            };
            let (negated, text) = match c {
                Cond::Protocol { negated, proto } => (*negated, format!("proto {proto}")),
                Cond::Src { negated, net } => (*negated, format!("src {net}")),
                Cond::Dst { negated, net } => (*negated, format!("dst {net}")),
                Cond::InIface { negated, name } => (*negated, format!("in {name}")),
                Cond::OutIface { negated, name } => (*negated, format!("out {name}")),
                Cond::DPorts { negated, ports: p } => (*negated, format!("dports {}", ports(p))),
                Cond::SPorts { negated, ports: p } => (*negated, format!("sports {}", ports(p))),
                Cond::DstType { negated, types } => {
                    (*negated, format!("dst-type {}", types.join(",")))
                }
                Cond::SrcType { negated, types } => {
                    (*negated, format!("src-type {}", types.join(",")))
                }
                Cond::Other(x) => (false, format!("other[{x}]")),
            };
            format!("{}{text}", if negated { "!" } else { "" })
        };
        mat.conds.iter().map(one).collect::<Vec<_>>().join(" | ")
    }

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
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
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
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
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
}

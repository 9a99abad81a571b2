use super::*;

fn dnat_rule() -> Rule {
    Rule {
        destination: Some("10.9.0.1".parse().unwrap()),
        protocol: Some(Protocol::Tcp),
        dports: Some(PortRange {
            start: 8000,
            end: 8010,
        }),
        comment: Some("natledger:abc".into()),
        ..Rule::unconditional(Target::Dnat(DnatTo {
            addr: "10.1.0.2".parse().unwrap(),
            ports: PortRange { start: 80, end: 90 },
            base: Some(8000),
        }))
    }
}

#[test]
fn renders_in_save_order() {
    assert_eq!(
        dnat_rule().to_args().join(" "),
        "-d 10.9.0.1/32 -p tcp -m tcp --dport 8000:8010 -m comment --comment natledger:abc \
             -j DNAT --to-destination 10.1.0.2:80-90/8000"
    );
    let v6 = Rule {
        source: Some("fd00::2".parse().unwrap()),
        destination: Some("fd00::2/128".parse().unwrap()),
        protocol: Some(Protocol::Udp),
        dports: Some(PortRange::single(53)),
        dst_local: true,
        ..Rule::unconditional(Target::Masquerade)
    };
    assert_eq!(
        v6.to_args().join(" "),
        "-s fd00::2/128 -d fd00::2/128 -p udp -m udp --dport 53 -m addrtype --dst-type LOCAL \
             -j MASQUERADE"
    );
}

#[test]
fn parse_is_the_inverse_of_render() {
    let jump = Rule {
        dst_local: true,
        comment: Some("natledger".into()),
        ..Rule::unconditional(Target::Jump("NATLEDGER-HOSTPORTS".into()))
    };
    let v6 = Rule {
        target: Target::Dnat(DnatTo {
            addr: "fd00::2".parse().unwrap(),
            ports: PortRange::single(80),
            base: None,
        }),
        protocol: Some(Protocol::Sctp),
        ..dnat_rule()
    };
    for rule in [dnat_rule(), jump, v6, accept_rule()] {
        assert_eq!(Rule::parse_args(&rule.to_args()).unwrap(), rule);
    }
}

fn accept_rule() -> Rule {
    Rule {
        dnatted: Some(Dnatted {
            protocol: Protocol::Udp,
            orig_dst: Some("10.78.0.1".parse().unwrap()),
            repl_src: "10.77.0.2".parse().unwrap(),
            orig_dst_ports: PortRange {
                start: 9000,
                end: 9002,
            },
            repl_src_ports: PortRange { start: 80, end: 82 },
        }),
        comment: Some("natledger:abc".into()),
        ..Rule::unconditional(Target::Accept)
    }
}

#[test]
fn the_filter_rule_renders_as_both_backends_print_it() {
    // Verbatim from iptables-legacy-save and iptables-nft-save 1.8.9.
    assert_eq!(
        accept_rule().to_args().join(" "),
        "-m conntrack --ctstate DNAT --ctproto 17 --ctorigdst 10.78.0.1 --ctreplsrc 10.77.0.2 \
             --ctorigdstport 9000:9002 --ctreplsrcport 80:82 -m comment --comment natledger:abc \
             -j ACCEPT"
    );
    // Half a conntrack match, another state, or a network is not natledger's.
    for args in [
        "-m conntrack --ctstate DNAT --ctproto 17 --ctorigdstport 53 -j ACCEPT",
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-m conntrack --ctstate DNAT --ctproto 17 --ctreplsrc 10.77.0.0/24 \
             --ctorigdstport 53 --ctreplsrcport 53 -j ACCEPT",
        "-m conntrack --ctstate DNAT --ctreplsrc 10.77.0.2 --ctorigdstport 53 \
             --ctreplsrcport 53 -j ACCEPT",
        "-m conntrack --ctstate DNAT --ctproto 1 --ctreplsrc 10.77.0.2 --ctorigdstport 53 \
             --ctreplsrcport 53 -j ACCEPT",
    ] {
        let tokens: Vec<&str> = args.split_whitespace().collect();
        assert!(Rule::parse_args(&tokens).is_err(), "{args}");
    }
}

#[test]
fn parses_save_lines_written_by_both_backends() {
    // Verbatim from iptables-legacy-save and iptables-nft-save 1.8.9 (tokenized).
    let line = [
        "-d",
        "fd00::1/128",
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        "8000:8002",
        "-m",
        "comment",
        "--comment",
        "natledger abc",
        "-j",
        "DNAT",
        "--to-destination",
        "[fd00::2]:80-82/8000",
    ];
    let rule = Rule::parse_args(&line).unwrap();
    assert_eq!(rule.to_args(), line);
}

#[test]
fn foreign_options_are_unsupported_not_misread() {
    for args in [
        &["!", "-s", "10.0.0.0/8", "-j", "MASQUERADE"][..],
        &["-i", "eth0", "-j", "MASQUERADE"],
        &[
            "-p",
            "tcp",
            "-m",
            "multiport",
            "--dports",
            "80,443",
            "-j",
            "DNAT",
        ],
        &["-m", "mark", "--mark", "0x2000", "-j", "MASQUERADE"],
        &["-j", "REDIRECT", "--to-ports", "80"],
        &[
            "-m",
            "addrtype",
            "--dst-type",
            "LOCAL",
            "-j",
            "DOCKER",
            "--foo",
        ],
        &["-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", "DOCKER"],
    ] {
        assert!(
            matches!(Rule::parse_args(args), Err(RuleParseError::Unsupported(_))),
            "{args:?}"
        );
    }
    assert_eq!(
        Rule::parse_args(&["-s", "10.0.0.0/8"]),
        Err(RuleParseError::NoTarget)
    );
}

#[test]
fn chain_names() {
    assert!(is_user_chain_name("NATLEDGER-HOSTPORTS"));
    assert!(!is_user_chain_name("ACCEPT"));
    assert!(!is_user_chain_name("A-VERY-LONG-CHAIN-NAME-OVER-28"));
    assert!(!is_user_chain_name("-X"));
}

#[test]
fn the_localhost_guard_renders_as_both_backends_print_it() {
    // Verbatim from iptables-legacy-save and iptables-nft-save 1.8.9.
    let line = "-d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate DNAT \
                -m comment --comment natledger -j DROP";
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let guard = Rule::parse_args(&tokens).unwrap();
    assert_eq!(guard.not_in_interface.as_deref(), Some("lo"));
    assert!(guard.not_dnatted);
    assert_eq!(guard.target, Target::Drop);
    assert_eq!(guard.to_args().join(" "), line);
    // Options may come in any order, as iptables accepts them.
    let reordered = [
        "!",
        "-i",
        "lo",
        "-d",
        "127.0.0.0/8",
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "DNAT",
        "-j",
        "DROP",
    ];
    assert_eq!(
        Rule::parse_args(&reordered).unwrap(),
        Rule {
            comment: None,
            ..guard
        }
    );
}

#[test]
fn only_the_guards_negations_are_natledgers() {
    for args in [
        // kube-proxy's guard: a source, not an interface.
        "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT \
         -j DROP",
        "-d 127.0.0.0/8 -i lo -j DROP",
        "-d 127.0.0.0/8 ! -o lo -j DROP",
        "-d 127.0.0.0/8 ! -i eth+ -j DROP",
        "-d 127.0.0.0/8 ! -i lo ! -i eth0 -j DROP",
        "-m conntrack ! --ctstate RELATED,ESTABLISHED -j DROP",
        // The first guard's states (forgeable: see `layout::guard`), no longer natledger's.
        "-d 127.0.0.0/8 ! -i lo -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        "-m conntrack --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        "! -d 127.0.0.0/8 -j DROP",
        // The guard's states beside natledger's accept match: two matches it never writes.
        "-m conntrack ! --ctstate DNAT -m conntrack --ctstate DNAT \
         --ctproto 17 --ctreplsrc 10.77.0.2 --ctorigdstport 53 --ctreplsrcport 53 -j DROP",
        "-d 127.0.0.0/8 !",
    ] {
        let tokens: Vec<&str> = args.split_whitespace().collect();
        assert!(Rule::parse_args(&tokens).is_err(), "{args}");
    }
    assert!(is_interface_name("lo"));
    assert!(is_interface_name("br-0123456789ab"));
    assert!(!is_interface_name("br-0123456789abc"));
    assert!(!is_interface_name("eth+"));
    assert!(!is_interface_name(""));
}

/// The nftables guard's second rule: rendered and parsed back; never with another conntrack
/// match.
#[test]
fn the_untracked_guard_round_trips_and_stands_alone() {
    // What `layout::guard_untracked` writes.
    let rule = Rule {
        destination: Some("127.0.0.0/8".parse().unwrap()),
        not_in_interface: Some("lo".into()),
        untracked: true,
        comment: Some("natledger".into()),
        ..Rule::unconditional(Target::Drop)
    };
    let line = "-d 127.0.0.0/8 ! -i lo -m conntrack --ctstate INVALID,UNTRACKED \
                -m comment --comment natledger -j DROP";
    assert_eq!(rule.to_args().join(" "), line);
    let tokens: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(Rule::parse_args(&tokens).unwrap(), rule);
    for both in [
        "-m conntrack ! --ctstate DNAT -m conntrack --ctstate INVALID,UNTRACKED -j DROP",
        "-m conntrack --ctstate INVALID,UNTRACKED --ctstate INVALID,UNTRACKED -j DROP",
        "-m conntrack --ctstate INVALID -j DROP",
    ] {
        let tokens: Vec<&str> = both.split_whitespace().collect();
        assert!(Rule::parse_args(&tokens).is_err(), "{both}");
    }
}

/// The hairpin masquerade for a known subnet: `-p`/`--dport` and the conntrack match
/// together, as iptables-legacy-save and iptables-nft-save 1.8.9 print it; only a
/// MASQUERADE has both.
#[test]
fn the_subnet_masquerade_round_trips() {
    let line = "-s 10.77.0.0/24 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -m conntrack --ctstate DNAT \
                --ctproto 6 --ctorigdst 10.78.0.1 --ctreplsrc 10.77.0.2 --ctorigdstport 8080 \
                --ctreplsrcport 80 -m comment --comment natledger:x -j MASQUERADE";
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let rule = Rule::parse_args(&tokens).unwrap();
    assert_eq!(rule.source, Some("10.77.0.0/24".parse().unwrap()));
    assert_eq!(rule.protocol, Some(Protocol::Tcp));
    assert_eq!(
        rule.dnatted.unwrap().orig_dst_ports,
        PortRange::single(8080)
    );
    assert_eq!(rule.to_args().join(" "), line);
    let accept = line.replace("MASQUERADE", "ACCEPT");
    let tokens: Vec<&str> = accept.split_whitespace().collect();
    assert!(Rule::parse_args(&tokens).is_err(), "{accept}");
}

//! doctor's `forward-dropped` check: a DNAT of any owner whose forwarded packets filter
//! FORWARD drops (Docker's DROP policy, a hardened host's), with the rule or policy that drops
//! them; proven on saved dumps and live, where the connection really times out.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);
const DROPPED: Duration = Duration::from_millis(800);

/// A hardened host: FORWARD DROP, replies and ICMP accepted; a hand-written forward of 9090,
/// natledger's forward of 8080 with its accept, and natledger's 8082 without its accept.
const HARDENED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    :NATLEDGER-HOSTPORTS - [0:0]\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS\n\
    -A PREROUTING -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.88.0.5:80\n\
    -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:80\n\
    -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8082 -m comment --comment natledger:c9 -j DNAT --to-destination 10.77.0.9:80\n\
    COMMIT\n\
    *filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    :NATLEDGER-FORWARD - [0:0]\n\
    -A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
    -A FORWARD -p icmp -j ACCEPT\n\
    -A FORWARD -m comment --comment natledger -j NATLEDGER-FORWARD\n\
    -A NATLEDGER-FORWARD -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc 10.77.0.2 --ctorigdstport 8080 --ctreplsrcport 80 -m comment --comment natledger:c1 -j ACCEPT\n\
    COMMIT\n";

fn dropped_ports(d: &Doc) -> Vec<u64> {
    let mut ports: Vec<u64> = d
        .of_kind("forward-dropped")
        .iter()
        .map(|f| f["port"].as_u64().unwrap())
        .collect();
    ports.sort();
    ports
}

#[test]
fn a_hardened_hosts_dump_names_the_forwards_it_drops() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("iptables.txt");
    std::fs::write(&dump, HARDENED).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    // From a dump alone a target might be the dumped host's own address: warnings.
    assert_eq!(d.code, 1, "{}", d.show());
    assert_eq!(dropped_ports(&d), [8082, 9090], "{}", d.show());
    for f in d.of_kind("forward-dropped") {
        let summary = text(f, "summary");
        assert!(
            summary.contains("dropped by the DROP policy of legacy ipv4 filter FORWARD")
                && summary.contains("is an address of the dumped host itself"),
            "{f}"
        );
        assert_eq!(f["rules"].as_array().unwrap().len(), 1, "{f}");
    }
    let hand = d
        .of_kind("forward-dropped")
        .into_iter()
        .find(|f| f["port"] == 9090)
        .unwrap();
    assert_eq!(
        text(hand, "fix"),
        "iptables-legacy -I FORWARD -m conntrack --ctstate DNAT --ctproto tcp --ctreplsrc \
         10.88.0.5 --ctreplsrcport 80 -j ACCEPT"
    );
    let ours = d
        .of_kind("forward-dropped")
        .into_iter()
        .find(|f| f["port"] == 8082)
        .unwrap();
    assert!(
        text(ours, "fix").starts_with("restart container c9"),
        "{ours}"
    );

    // A rule that drops: named, with its position.
    let rejecting = HARDENED.replace(
        "-A FORWARD -p icmp -j ACCEPT\n",
        "-A FORWARD -p icmp -j ACCEPT\n-A FORWARD -d 10.88.0.0/16 -j REJECT\n",
    );
    std::fs::write(&dump, rejecting).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    let hand = d
        .of_kind("forward-dropped")
        .into_iter()
        .find(|f| f["port"] == 9090)
        .unwrap()
        .clone();
    assert_eq!(places(&hand)[1], ("FORWARD".into(), 3), "{hand}");
    assert_eq!(line_of(&hand, 1), "-A FORWARD -d 10.88.0.0/16 -j REJECT");

    // Only the way in accepted: the replies are dropped, which breaks the connection too.
    let one_way = HARDENED
        .replace(
            "-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n",
            "",
        )
        .replace(
            "-A FORWARD -p icmp -j ACCEPT\n",
            "-A FORWARD -d 10.88.0.5/32 -p tcp -m tcp --dport 80 -j ACCEPT\n",
        );
    std::fs::write(&dump, one_way).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    let hand = d
        .of_kind("forward-dropped")
        .into_iter()
        .find(|f| f["port"] == 9090)
        .unwrap()
        .clone();
    assert!(
        text(&hand, "summary").starts_with("The replies to connections this DNAT forwards"),
        "{hand}"
    );

    // A queue hands the packet to a program, whose verdict no dump shows; a DNAT to this
    // host's loopback goes to INPUT, not FORWARD: no claims.
    let queued = HARDENED.replace(
        "-A FORWARD -p icmp -j ACCEPT\n",
        "-A FORWARD -j NFQUEUE --queue-num 0\n",
    );
    std::fs::write(&dump, queued).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    assert_eq!(dropped_ports(&d), Vec::<u64>::new(), "{}", d.show());
    let local = HARDENED.replace("10.88.0.5:80", "127.0.0.1:8080");
    std::fs::write(&dump, local).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    assert_eq!(dropped_ports(&d), [8082], "{}", d.show());

    // An accept doctor cannot rule out (the interface the packets come in on is unknown in a
    // dump) is no claim.
    let maybe = HARDENED.replace(
        "-A FORWARD -p icmp -j ACCEPT\n",
        "-A FORWARD -i ens+ -j ACCEPT\n",
    );
    std::fs::write(&dump, maybe).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    assert_eq!(dropped_ports(&d), Vec::<u64>::new(), "{}", d.show());

    // A DNAT that names its interface is judged on it: an accept of that interface lets its
    // packets through, an accept of another does not.
    let named = |accepted: &str| {
        HARDENED
            .replace(
                "-A PREROUTING -p tcp -m tcp --dport 9090",
                "-A PREROUTING -i eth1 -p tcp -m tcp --dport 9090",
            )
            .replace(
                "-A FORWARD -p icmp -j ACCEPT\n",
                &format!("-A FORWARD -i {accepted} -j ACCEPT\n"),
            )
    };
    // (8082's DNAT names none: an accept of any one interface might be its, so no claim.)
    std::fs::write(&dump, named("eth1")).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    assert_eq!(dropped_ports(&d), Vec::<u64>::new(), "{}", d.show());
    std::fs::write(&dump, named("eth2")).unwrap();
    let d = doctor_json(&["--from", &format!("legacy:{}", dump.display())]);
    assert_eq!(dropped_ports(&d), [9090], "{}", d.show());
}

/// Live, on a Docker-like host (FORWARD DROP, DOCKER-USER and isolation jumps): another
/// owner's DNAT without an accept is reported and really times out from outside; natledger's
/// container is not reported and answers. Both iptables backends.
#[test]
fn live_a_drop_policy_breaks_a_foreign_forward() {
    // An iptables FORWARD DROP that natledger's iptables accept passes, and doctor's analysis
    // of iptables dumps: the iptables backends only (on nftables the drop decides, by design:
    // tests/it/forward.rs).
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let ext = node.topo.ext().to_string();
        // Packets from other hosts come in on the default route's interface.
        run_in(
            &host,
            "ip",
            &["route", "add", "default", "via", "10.78.0.2"],
            None,
        );
        let docker = "*filter\n:FORWARD DROP [0:0]\n:DOCKER-USER - [0:0]\n\
            :DOCKER-ISOLATION-STAGE-1 - [0:0]\n:DOCKER - [0:0]\n\
            -A FORWARD -j DOCKER-USER\n-A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
            -A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
            -A FORWARD -o docker0 -j DOCKER\n-A FORWARD -i docker0 ! -o docker0 -j ACCEPT\n\
            -A DOCKER-USER -j RETURN\n-A DOCKER-ISOLATION-STAGE-1 -j RETURN\nCOMMIT\n";
        load_rules(&host, backend, Family::V4, docker);
        let c2 = node.topo.add_container(2);
        let c3 = node.topo.add_container(3);
        let _servers = [
            serve_tcp(&c2.ns, c2.sock_v4(80), "natledger's"),
            serve_tcp(&c3.ns, c3.sock_v4(80), "hand-written"),
        ];
        let hand = "*nat\n-A PREROUTING -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.77.0.3:80\nCOMMIT\n";
        load_rules(&host, backend, Family::V4, hand);
        node.create(
            "c2",
            None,
            &[
                ("io.natledger.ports", "8080:80"),
                ("io.natledger.ip", "10.77.0.2"),
            ],
        );
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
            Some("natledger's")
        );
        assert!(tcp_request(&ext, sock(NODE_V4, 9090), DROPPED).is_err());

        let d = live(&node, &[]);
        assert_eq!(dropped_ports(&d), [9090], "{backend:?}\n{}", d.show());
        let f = d.of_kind("forward-dropped")[0];
        let evidence = text(f, "evidence");
        assert!(
            evidence.contains("arriving on veth-ext") && evidence.contains("leaving on br0"),
            "{evidence}"
        );
        assert_eq!(
            line_of(f, 0),
            "-A PREROUTING -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.77.0.3:80"
        );

        // The fix doctor prints makes it answer, and the finding goes.
        let fix = text(f, "fix");
        let args: Vec<&str> = fix.split_whitespace().collect();
        let out = run_in(&host, args[0], &args[1..], None);
        assert!(out.status.success(), "{fix}");
        assert_eq!(
            tcp_request(&ext, sock(NODE_V4, 9090), T).ok().as_deref(),
            Some("hand-written")
        );
        let d = live(&node, &[]);
        assert_eq!(dropped_ports(&d), Vec::<u64>::new(), "{}", d.show());
        assert_ok(&node.poststop("c2"), "poststop");
    });
}

/// A host split between backends: natledger writes legacy (its DNAT and its accept), but
/// iptables-nft's FORWARD policy is DROP. The kernel runs both, so the packets are dropped:
/// doctor says so, and says why.
#[test]
fn live_a_drop_in_the_other_backend_is_reported() {
    let mut node = Node::new(Backend::IptablesLegacy);
    let host = node.topo.node().to_string();
    let ext = node.topo.ext().to_string();
    run_in(
        &host,
        "ip",
        &["route", "add", "default", "via", "10.78.0.2"],
        None,
    );
    load_rules(
        &host,
        Backend::IptablesNft,
        Family::V4,
        "*filter\n:FORWARD DROP [0:0]\nCOMMIT\n",
    );
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
    node.create(
        "c2",
        None,
        &[
            ("io.natledger.ports", "8080:80"),
            ("io.natledger.ip", "10.77.0.2"),
        ],
    );
    assert!(tcp_request(&ext, sock(NODE_V4, 8080), DROPPED).is_err());
    let d = live(&node, &[]);
    assert_eq!(dropped_ports(&d), [8080], "{}", d.show());
    let f = d.of_kind("forward-dropped")[0];
    assert!(
        text(f, "summary").contains("nft ipv4 filter FORWARD"),
        "{f}"
    );
    assert_eq!(f["rules"][0]["backend"], "legacy");
    assert!(
        text(f, "fix").contains("keep the host on one iptables backend"),
        "{f}"
    );
    assert_ok(&node.poststop("c2"), "poststop");
}

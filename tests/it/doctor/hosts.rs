//! doctor on hosts as they usually look: an owner's leftovers only in the backend the host no
//! longer uses (seed 001), and a stale CNI portmap container whose one jump is the fix (seed
//! 002). From dumps, and live in private namespaces where the printed fix is run and the
//! connection checked.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);
/// Long enough for a dropped SYN to be told from a refused one.
const DROPPED: Duration = Duration::from_millis(1500);

/// Seed 001 as it usually looks: AZURE-NPM's jump and chains and a FORWARD policy DROP only
/// in iptables-legacy, everything else in iptables-nft (with kubelet's hint chains, so nft is
/// the backend in use). Split-backends used to need one owner in both and said nothing.
#[test]
fn seed001_usual_leftovers_only_in_the_unused_backend() {
    let legacy = from("legacy", "seed001_usual.legacy.txt");
    let nft = from("nft", "seed001_usual.nft.txt");
    let d = doctor_json(&["--from", &legacy, &nft]);
    assert_eq!(d.code, 1, "{}", d.show());
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 2, "AZURE-NPM and the policy\n{}", d.show());
    let npm = split
        .iter()
        .find(|f| text(f, "summary").starts_with("AZURE-NPM has 9 rule(s)"))
        .unwrap_or_else(|| panic!("{}", d.show()));
    let summary = text(npm, "summary");
    assert!(
        summary.contains("iptables-legacy") && summary.contains("it uses iptables-nft"),
        "{summary}"
    );
    assert!(summary.contains("1 of them can drop packets"), "{summary}");
    assert!(
        text(npm, "evidence").contains("only the nft dump holds kubelet's hint chain"),
        "{npm}"
    );
    assert_eq!(
        places(npm),
        [("FORWARD".into(), 1), ("AZURE-NPM-INGRESS".into(), 2)]
    );
    let fix = text(npm, "fix");
    let lines: Vec<&str> = fix.lines().collect();
    assert_eq!(
        lines[0],
        "iptables-legacy -t filter -D FORWARD -m conntrack --ctstate NEW -j AZURE-NPM"
    );
    // Four chains: flushed, then deleted.
    assert_eq!(lines.len(), 1 + 4 + 4, "{fix}");
    assert!(
        lines[1..5].iter().all(|l| l.contains(" -F AZURE-NPM")),
        "{fix}"
    );
    assert!(
        lines[5..].iter().all(|l| l.contains(" -X AZURE-NPM")),
        "{fix}"
    );
    let policy = split
        .iter()
        .find(|f| text(f, "summary").starts_with("The policy of FORWARD"))
        .unwrap_or_else(|| panic!("{}", d.show()));
    assert_eq!(
        text(policy, "fix"),
        "iptables-legacy -t filter -P FORWARD ACCEPT"
    );
    // Without kubelet's hints, the backend with more rules is taken to be in use, and the
    // finding says so.
    let bare = tempfile::NamedTempFile::new().unwrap();
    let text_nft = std::fs::read_to_string(fixture("seed001_usual.nft.txt")).unwrap();
    std::fs::write(
        bare.path(),
        text_nft
            .lines()
            .filter(|l| !l.contains("KUBE-IPTABLES-HINT") && !l.contains("KUBE-KUBELET-CANARY"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let d = doctor_json(&["--from", &legacy, &format!("nft:{}", bare.path().display())]);
    let f = d.of_kind("split-backends");
    assert_eq!(f.len(), 2, "{}", d.show());
    assert!(
        text(f[0], "evidence").contains("the backend with more rules"),
        "{}",
        d.show()
    );
}

/// The same live: the node's iptables-nft forwards 8088 to a container; iptables-legacy
/// (the backend `iptables` does not use here) holds only AZURE-NPM's leftover jump and a
/// chain dropping tcp/80 to the pod. The kernel runs both: the connection is dropped.
/// doctor names the leftovers in legacy with the commands; run in the namespace, they make the
/// connection work, and legacy is left empty.
#[test]
fn live_leftovers_in_the_unused_backend_drop_and_the_fix_works() {
    let active = match natledger::backend::detect(natledger::kernel::host_root::Lookup(None)) {
        natledger::backend::Backend::IptablesLegacy => Backend::IptablesLegacy,
        // `detect` names the host's iptables backend, never natledger's own tables.
        _ => Backend::IptablesNft,
    };
    let unused = match active {
        Backend::IptablesLegacy => Backend::IptablesNft,
        _ => Backend::IptablesLegacy,
    };
    let mut node = Node::new(active);
    let host = node.topo.node().to_string();
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "pod");
    load_rules(
        &host,
        active,
        Family::V4,
        "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n\
         *nat\n:KUBE-SERVICES - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A KUBE-SERVICES -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 8088 -j DNAT --to-destination 10.77.0.2:80\n\
         COMMIT\n",
    );
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 8088), T)
            .ok()
            .as_deref(),
        Some("pod")
    );
    load_rules(
        &host,
        unused,
        Family::V4,
        "*filter\n:AZURE-NPM - [0:0]\n:AZURE-NPM-INGRESS - [0:0]\n\
         -A FORWARD -m conntrack --ctstate NEW -j AZURE-NPM\n\
         -A AZURE-NPM -j AZURE-NPM-INGRESS\n\
         -A AZURE-NPM-INGRESS -p tcp -m tcp --dport 80 -m comment --comment DROP-ALL -j DROP\n\
         COMMIT\n",
    );
    // A drop in the unused backend still drops.
    assert!(tcp_request(node.topo.ext(), sock(NODE_V4, 8088), DROPPED).is_err());
    let d = live(&node, &[]);
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 1, "{}", d.show());
    let f = split[0];
    assert_eq!(f["severity"], "warning");
    let summary = text(f, "summary");
    assert!(
        summary.starts_with("AZURE-NPM has 3 rule(s)")
            && summary.contains(&format!("iptables-{}", unused.name()))
            && summary.contains("1 of them can drop packets"),
        "{summary}"
    );
    // How the backend in use was decided: as `--backend auto` does, from the symlink.
    let evidence = text(f, "evidence");
    assert!(
        evidence.contains(&format!("backend in use: iptables-{}", active.name()))
            && evidence.contains("iptables leads to"),
        "{evidence}"
    );
    // Run what doctor prints, in the namespace.
    let fix = text(f, "fix");
    assert_eq!(fix.lines().count(), 5, "{fix}");
    for command in fix.lines() {
        assert!(
            command.starts_with(&format!("iptables-{} -t filter ", unused.name())),
            "{fix}"
        );
        assert_ok(&run_in(&host, "sh", &["-c", command], None), command);
    }
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 8088), T)
            .ok()
            .as_deref(),
        Some("pod")
    );
    let d = live(&node, &[]);
    assert!(d.of_kind("split-backends").is_empty(), "{}", d.show());
    let dump = node.dump();
    assert!(!dump.contains("AZURE-NPM"), "{dump}");
}

/// A portmap-shaped ruleset: a stale container's CNI-DN chain (jumped first) DNATs 8443 and
/// 8444 to an address nothing holds; the live container's chain comes after. doctor's fix
/// for the stale one removes its jumps and its chain, not its DNATs one by one; run, the
/// live container answers on both ports and its chain is untouched.
#[test]
fn live_stale_portmap_container_fix_is_its_jump() {
    // Foreign iptables rules and doctor's analysis of iptables dumps: iptables backends only.
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let host = node.topo.node().to_string();
        let c = node.topo.add_container(2);
        let _s1 = serve_tcp(&c.ns, c.sock_v4(80), "live pod 80");
        let _s2 = serve_tcp(&c.ns, c.sock_v4(81), "live pod 81");
        let stale = "CNI-DN-0000000000000000000aa";
        let live_dn = "CNI-DN-0000000000000000000bb";
        let rules = format!(
            "*nat\n:CNI-HOSTPORT-DNAT - [0:0]\n:{stale} - [0:0]\n:{live_dn} - [0:0]\n\
             -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
             -A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"cbr0\\\" id: \\\"0123456789abcdef\\\"\" -m multiport --dports 8443,8444 -j {stale}\n\
             -A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"cbr0\\\" id: \\\"fedcba9876543210\\\"\" -m multiport --dports 8443,8444 -j {live_dn}\n\
             -A {stale} -p tcp -m tcp --dport 8443 -j DNAT --to-destination 10.77.0.99:80\n\
             -A {stale} -p tcp -m tcp --dport 8444 -j DNAT --to-destination 10.77.0.99:81\n\
             -A {live_dn} -p tcp -m tcp --dport 8443 -j DNAT --to-destination 10.77.0.2:80\n\
             -A {live_dn} -p tcp -m tcp --dport 8444 -j DNAT --to-destination 10.77.0.2:81\n\
             COMMIT\n"
        );
        load_rules(&host, backend, Family::V4, &rules);
        for port in [8443, 8444] {
            assert!(tcp_request(node.topo.ext(), sock(NODE_V4, port), DROPPED).is_err());
        }
        let d = live(&node, &[]);
        let shadowed = d.of_kind("shadowed");
        assert_eq!(shadowed.len(), 2, "{}", d.show());
        let fixes: Vec<String> = shadowed.iter().map(|f| text(f, "fix")).collect();
        // One fix for the container, whichever port's finding it is printed under.
        assert_eq!(fixes[0], fixes[1]);
        let lines: Vec<&str> = fixes[0].lines().collect();
        let tool = format!("iptables-{}", backend.name());
        assert_eq!(lines.len(), 3, "{}", fixes[0]);
        assert!(
            lines[0].starts_with(&format!("{tool} -t nat -D CNI-HOSTPORT-DNAT -p tcp"))
                && lines[0].ends_with(&format!("--dports 8443,8444 -j {stale}")),
            "{}",
            fixes[0]
        );
        assert_eq!(lines[1], format!("{tool} -t nat -F {stale}"));
        assert_eq!(lines[2], format!("{tool} -t nat -X {stale}"));
        for command in &lines {
            assert_ok(&run_in(&host, "sh", &["-c", command], None), command);
        }
        for (port, reply) in [(8443, "live pod 80"), (8444, "live pod 81")] {
            assert_eq!(
                tcp_request(node.topo.ext(), sock(NODE_V4, port), T)
                    .ok()
                    .as_deref(),
                Some(reply)
            );
        }
        let dump = node.dump();
        assert!(!dump.contains(stale) && dump.contains(live_dn), "{dump}");
        let d = live(&node, &[]);
        assert!(d.of_kind("shadowed").is_empty(), "{}", d.show());
    });
}

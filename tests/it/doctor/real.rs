//! `natledger doctor` on real rulesets written by others (`tests/fixtures/doctor/`, each file
//! names its source in its header): Docker's golden iptables files, kube-proxy's own test
//! expectation, dumps pasted in issue threads. For each, the exact set of findings expected,
//! with the reason; one finding confirmed with packets in namespaces. Also the fixes for rules
//! of owners that write them again (kube-proxy, dockerd).

use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(3);

/// `(kind, port)` of every finding, sorted.
fn kinds(d: &Doc) -> Vec<(String, Option<u64>)> {
    let mut k: Vec<(String, Option<u64>)> = d
        .findings()
        .iter()
        .map(|f| (f["kind"].as_str().unwrap().to_string(), f["port"].as_u64()))
        .collect();
    k.sort();
    k
}

fn run(label: &str, name: &str) -> Doc {
    doctor_json(&["--from", &from(label, name)])
}

/// Docker's golden files (moby/moby b985e231, `iptabler/testdata/TestIptabler`) are what a
/// correct Docker host holds, so none may give a finding. Reasons per file:
/// - userland proxy (`hairpin=false`): one DNAT `! -i br-dummy` for 8080, reached from
///   PREROUTING and from OUTPUT (not for 127.0.0.0/8); filter DOCKER accepts its forwarded
///   packets (`-d 192.168.0.2 --dport 80 ! -i br-dummy -o br-dummy`) before the
///   `! -i br-dummy -o br-dummy DROP`: nothing shadowed, nothing dropped.
/// - hairpin (no userland proxy): the DNAT has no `! -i`, so containers on the bridge are
///   DNATed too; `-i br-dummy` is accepted by DOCKER-FORWARD (icc on).
/// - icc off, bound to 127.0.0.1, WSL2 mirrored: the DNAT is for `-d 127.0.0.1` only (from
///   OUTPUT; raw PREROUTING drops 127.0.0.1:8080 from outside but `loopback0`, which is
///   Docker's intent), and `-i br-dummy -o br-dummy DROP` is icc=false doing its job for
///   container-to-container traffic, which no DNAT of this file forwards from outside.
/// - routed gateway mode: DNAT and a filter ACCEPT for the port and ICMP; no shadow.
/// - internal network: no DNAT at all; DOCKER-INTERNAL drops traffic leaving the subnet.
/// - IPv6: the same as the userland-proxy file in ip6tables (`[fd49:…::1]:80`).
/// - cleaned: what is left after the network is deleted (the shared chains and jumps).
#[test]
fn docker_golden_files_are_clean() {
    for (name, family, rules) in [
        ("docker_golden_userland_proxy.nft.txt", "ipv4", 14),
        ("docker_golden_hairpin.nft.txt", "ipv4", 16),
        ("docker_golden_icc_off_localhost.nft.txt", "ipv4", 19),
        ("docker_golden_routed.nft.txt", "ipv4", 13),
        ("docker_golden_internal.nft.txt", "ipv4", 9),
        ("docker_golden_ipv6.nft.txt", "ipv6", 14),
        ("docker_golden_cleaned.nft.txt", "ipv4", 6),
    ] {
        let d = run("nft", name);
        assert_eq!((d.code, kinds(&d)), (0, vec![]), "{name}\n{}", d.show());
        assert_eq!(d.report["rules_read"], rules, "{name}\n{}", d.show());
        assert_eq!(d.report["complete"], true, "{name}");
        assert!(
            d.report["sources"]
                .to_string()
                .contains(&format!("nft/{family}")),
            "{name}: {}",
            d.report["sources"]
        );
    }
}

/// kube-proxy's own expectation (TestOverallIPTablesRules), with the jumps kube-proxy installs
/// from the built-in chains: six Services of every type. No finding:
/// - every DNAT is in a `KUBE-SEP-*` chain reached through its Service's chain; two Services
///   (ns3, ns5) DNAT to the same endpoint 10.180.0.3:80 but for different Service addresses
///   and node ports, so neither takes the other's packets;
/// - svc5's `-m recent --rcheck` jump and the plain jump after it reach the same KUBE-SEP:
///   `recent` is opaque, so the plain one is not claimed shadowed (it is not);
/// - KUBE-NODEPORTS's `-d 127.0.0.0/8 --dport 3001` jump and the plain 3001 jump lead to the
///   same chain (jumps, not port forwards);
/// - filter KUBE-EXTERNAL-SERVICES drops svc2's external traffic that has no local endpoint,
///   i.e. packets that were not DNATed (filter sees the DNATed address), by design;
/// - KUBE-PROXY-FIREWALL drops what svc5's source ranges leave out, by design.
#[test]
fn kube_proxy_overall_rules_are_clean() {
    let d = run("nft", "kube_proxy_overall.nft.txt");
    assert_eq!((d.code, kinds(&d)), (0, vec![]), "{}", d.show());
    assert_eq!(d.report["rules_read"], 79, "{}", d.show());
    assert_eq!(d.report["complete"], true);
}

/// moby/moby#32048: the removed container's DNAT (.17) ahead of the live one's (.23) for
/// 18968. Expected: exactly one error, `shadowed` for 18968/tcp, rule 1 of DOCKER over rule 2,
/// with the counters as evidence (5322 packets against 0), and a fix deleting rule 1 that
/// says what dockerd does and how to find the container publishing the port.
#[test]
fn moby32048_stale_dnat_is_shadowing_the_live_one() {
    let d = run("legacy", "moby32048_stale_docker_dnat.legacy.txt");
    assert_eq!(
        (d.code, kinds(&d)),
        (2, vec![("shadowed".into(), Some(18968))]),
        "{}",
        d.show()
    );
    let f = &d.findings()[0];
    assert_eq!(places(f), [("DOCKER".into(), 1), ("DOCKER".into(), 2)]);
    assert_eq!(
        (f["severity"].as_str(), f["protocol"].as_str()),
        (Some("error"), Some("tcp"))
    );
    assert!(line_of(f, 0).ends_with("172.17.0.17:18968"), "{f}");
    assert!(line_of(f, 1).ends_with("172.17.0.23:18968"), "{f}");
    let evidence = f["evidence"].to_string();
    assert!(evidence.contains("has matched 5322 packets"), "{evidence}");
    let fix: Vec<String> = text(f, "fix").lines().map(str::to_string).collect();
    assert_eq!(fix.len(), 2, "{fix:?}");
    assert!(
        fix[0].starts_with("iptables-legacy -t nat -D DOCKER ")
            && fix[0].ends_with("172.17.0.17:18968"),
        "{fix:?}"
    );
    assert!(
        fix[1].starts_with("# dockerd writes its chains again"),
        "{fix:?}"
    );
    assert!(
        fix[1].ends_with("docker ps --filter publish=18968/tcp"),
        "{fix:?}"
    );
}

/// moby/moby#15151: a crashed container's DNAT for 1336 left ahead of its recreation's.
/// Expected: exactly one `shadowed` error for 1336 (no counters in that paste, so no counter
/// evidence); the MASQUERADE leftovers in POSTROUTING are harmless and not reported.
#[test]
fn moby15151_crashed_container_dnat_is_shadowing() {
    let d = run("legacy", "moby15151_crashed_container_dnat.legacy.txt");
    assert_eq!(
        (d.code, kinds(&d)),
        (2, vec![("shadowed".into(), Some(1336))]),
        "{}",
        d.show()
    );
    let f = &d.findings()[0];
    assert_eq!(places(f), [("DOCKER".into(), 1), ("DOCKER".into(), 2)]);
    assert!(
        f.get("evidence")
            .is_none_or(|e| e.as_array().is_some_and(Vec::is_empty)),
        "{f}"
    );
    assert!(
        text(f, "fix").contains("docker ps --filter publish=1336/tcp"),
        "{f}"
    );
}

/// Fixes for rules of owners that write them again. kube-proxy's KUBE-SEP DNAT shadowing a
/// rule: deleting it lasts until kube-proxy's next sync, so the fix names the Service (from
/// kube-proxy's comment) and how to look at it. A rule in CNI portmap's per-container chain is
/// never written again: its fix stays the commands alone.
#[test]
fn fixes_for_regenerated_rules_name_the_lasting_fix() {
    let d = run("legacy", "kube_services_both_hooks.legacy.txt");
    let kube: Vec<&Value> = d
        .of_kind("shadowed")
        .into_iter()
        .filter(|f| {
            f["rules"][0]["chain"]
                .as_str()
                .is_some_and(|c| c.starts_with("KUBE-"))
        })
        .collect();
    assert!(!kube.is_empty(), "{}", d.show());
    for f in kube {
        let fix: Vec<String> = text(f, "fix").lines().map(str::to_string).collect();
        assert_eq!(fix.len(), 2, "{fix:?}");
        assert!(
            fix[0].starts_with("iptables-legacy -t nat -D KUBE-SEP-"),
            "{fix:?}"
        );
        assert!(
            fix[1].starts_with("# kube-proxy writes this rule again at its next sync")
                && fix[1].ends_with(
                    "Service default/azure-vote-front: kubectl -n default get service azure-vote-front -o wide"
                ),
            "{fix:?}"
        );
    }
    // Docker's DOCKER chain: the container publishing the port.
    let d = run("legacy", "many_shadows.legacy.txt");
    let docker: Vec<&Value> = d
        .of_kind("shadowed")
        .into_iter()
        .filter(|f| f["rules"][0]["chain"] == "DOCKER")
        .collect();
    assert!(!docker.is_empty(), "{}", d.show());
    for f in docker {
        let port = f["port"].as_u64().unwrap();
        assert!(
            text(f, "fix").ends_with(&format!("docker ps --filter publish={port}/tcp")),
            "{f}"
        );
    }
    // CNI portmap's per-container chain: no note, deleting lasts.
    let d = run("legacy", "seed002_cni_portmap_stale.legacy.txt");
    assert!(!d.findings().is_empty(), "{}", d.show());
    for f in d.findings() {
        assert!(!text(f, "fix").contains('#'), "{f}");
    }
}

/// moby/moby#32048 with packets, both iptables backends: its nat rules loaded into a namespace (the
/// bridge and addresses renamed to the test topology's: docker0 → br0, .17 → 10.77.0.2, .23 →
/// 10.77.0.3), both containers serving. Every connection to 18968 from outside reaches the
/// stale container, as doctor says (rule 2 never matches: its counter stays 0 after traffic);
/// after the first line of doctor's fix, the live one answers and doctor finds nothing.
#[test]
fn live_moby32048_shadow_confirmed_with_packets() {
    // Foreign iptables rules and doctor's analysis of iptables dumps: iptables backends only.
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let old = node.topo.add_container(2);
        let new = node.topo.add_container(3);
        let _old = serve_tcp(&old.ns, old.sock_v4(18968), "stale");
        let _new = serve_tcp(&new.ns, new.sock_v4(18968), "live");
        let text = std::fs::read_to_string(fixture("moby32048_stale_docker_dnat.legacy.txt"))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            // `iptables-restore` without `-c` takes no counters.
            .map(|l| match l.strip_prefix('[') {
                Some(rest) => rest.split_once("] ").unwrap().1.to_string(),
                None => l.to_string(),
            })
            .map(|l| {
                l.replace("docker0", BRIDGE)
                    .replace("172.17.0.17", "10.77.0.2")
                    .replace("172.17.0.23", "10.77.0.3")
                    .replace("172.17.0.0/16", "10.77.0.0/24")
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        load_rules(node.topo.node(), backend, Family::V4, &text);
        for _ in 0..3 {
            let reply = tcp_request(node.topo.ext(), sock(NODE_V4, 18968), T);
            assert_eq!(reply.ok().as_deref(), Some("stale"));
        }
        let d = live(&node, &[]);
        let f = d.of_kind("shadowed");
        assert_eq!(f.len(), 1, "{}", d.show());
        assert_eq!(places(f[0]), [("DOCKER".into(), 1), ("DOCKER".into(), 2)]);
        assert_eq!(f[0]["port"], 18968);
        // The counters agree: rule 1 counted the connections, rule 2 none.
        let counted = save_counters(&node, backend);
        let dnat = |to: &str| -> u64 {
            let l = counted
                .lines()
                .find(|l| l.contains("-A DOCKER") && l.contains(to))
                .unwrap_or_else(|| panic!("{to} not in\n{counted}"));
            l[1..].split(':').next().unwrap().parse().unwrap()
        };
        assert!(dnat("10.77.0.2:18968") >= 3, "{counted}");
        assert_eq!(dnat("10.77.0.3:18968"), 0, "{counted}");
        // Doctor's fix, its command line (the note after it is a shell comment).
        let fix = crate::common::text(f[0], "fix");
        let command = fix.lines().next().unwrap();
        let argv: Vec<&str> = command.split_whitespace().collect();
        assert!(argv[0].starts_with("iptables-"), "{command}");
        let out = run_in(node.topo.node(), argv[0], &argv[1..], None);
        assert!(out.status.success(), "{command}: {out:?}");
        let reply = tcp_request(node.topo.ext(), sock(NODE_V4, 18968), T);
        assert_eq!(reply.ok().as_deref(), Some("live"));
        let d = live(&node, &[]);
        assert!(d.of_kind("shadowed").is_empty(), "{}", d.show());
    });
}

/// `*-save -c` of the node's nat table.
fn save_counters(node: &Node, backend: Backend) -> String {
    let prog = format!("iptables-{}-save", backend.name());
    let out = run_in(node.topo.node(), &prog, &["-c", "-t", "nat"], None);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

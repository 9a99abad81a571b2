//! `natledger doctor` on saved dumps modelling each failure report of `seeds/` (`--from`): a
//! clean host, each seed, `--port`, IPv6, failure modes. Each test names the rule pair or the
//! chains it expects. These need neither root nor namespaces.

use crate::common::*;
use serde_json::Value;

#[test]
fn clean_host_dump_has_no_findings() {
    let d = doctor_json(&["--from", &from("nft", "clean_host.nft.txt")]);
    assert_eq!(d.code, 0, "{}", d.show());
    assert!(d.findings().is_empty(), "{}", d.show());
    assert_eq!(d.report["rules_read"], 68);
    assert_eq!(d.report["complete"], true);
    let sources = d.report["sources"].to_string();
    assert!(
        sources.contains("nft/ipv4") && sources.contains("clean_host.nft.txt"),
        "{sources}"
    );
    // The same host with its legacy tables empty (an empty dump): still clean.
    let empty = tempfile::NamedTempFile::new().unwrap();
    let d = doctor_json(&[
        "--from",
        &from("nft", "clean_host.nft.txt"),
        &format!("legacy:{}", empty.path().display()),
    ]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    // And as text: nothing but the closing summary line(s).
    let d = doctor(&["--from", &from("nft", "clean_host.nft.txt")]);
    assert_eq!(d.code, 0);
    assert!(
        d.stdout
            .starts_with("0 error(s), 0 warning(s), 0 note(s); 68 rules read"),
        "{}",
        d.stdout
    );
}

/// Seed 000: 25 deploys appended a DNAT for port 6667 to PREROUTING and OUTPUT; the first
/// points at a dead sandbox, the last at the live one. Rule #1 takes the packets of all the
/// others, in both chains.
#[test]
fn seed000_first_stale_dnat_shadows_the_live_one() {
    let d = doctor_json(&["--from", &from("nft", "seed000_stale_sandbox_dnat.nft.txt")]);
    assert_eq!(d.code, 2, "{}", d.show());
    let shadowed = d.of_kind("shadowed");
    // One finding per chain: rule #1 takes the packets of the 24 rules after it.
    assert_eq!(shadowed.len(), 2, "one finding per chain\n{}", d.show());
    assert_eq!(shadowed.len(), d.findings().len(), "{}", d.show());
    for chain in ["PREROUTING", "OUTPUT"] {
        let live = shadowed
            .iter()
            .find(|f| places(f)[0] == (chain.into(), 1))
            .unwrap_or_else(|| panic!("{chain} #1 shadowing the rest not reported\n{}", d.show()));
        assert_eq!(live["severity"], "error");
        assert_eq!(
            (live["port"].as_u64(), live["protocol"].as_str()),
            (Some(6667), Some("tcp"))
        );
        assert!(
            line_of(live, 0).contains("--to-destination 10.8.32.126:3000"),
            "{live}"
        );
        // The live rule, the last one, is among those that never match.
        assert!(
            line_of(live, 24).contains("--to-destination 10.8.36.41:3000"),
            "{live}"
        );
        assert_eq!(live["rules"][0]["table"], "nat");
        assert_eq!(
            (
                live["rules"][0]["backend"].as_str(),
                live["rules"][0]["family"].as_str()
            ),
            (Some("nft"), Some("ipv4"))
        );
        // The fix removes the stale rule that takes the packets, in the right backend.
        let fix = text(live, "fix");
        assert!(
            fix.starts_with(&format!("iptables-nft -t nat -D {chain} ")),
            "{fix}"
        );
        assert!(fix.contains("10.8.32.126:3000"), "{fix}");
        // Every other rule of the chain is reported as taken by #1.
        let shadowed_positions: Vec<u64> = places(live)[1..].iter().map(|(_, p)| *p).collect();
        assert_eq!(
            shadowed_positions,
            (2..=25).collect::<Vec<u64>>(),
            "{chain}"
        );
    }
    // POSTROUTING's MASQUERADE rules for the same addresses are not forwards: never shadowed.
    assert!(
        !d.findings().iter().any(|f| d_chain_is(f, "POSTROUTING")),
        "{}",
        d.show()
    );
}

fn d_chain_is(f: &Value, chain: &str) -> bool {
    places(f).iter().any(|(c, _)| c == chain)
}

/// Seed 001: Azure NPM's legacy chains and rules stayed when it moved to nft; the nft dump
/// has AZURE-NPM and KUBE- rules and kubelet's hint chains, so nft is the backend in use and
/// AZURE-NPM's legacy rules are named (KUBE- has none there).
#[test]
fn seed001_leftover_legacy_azure_npm_is_split_backends() {
    let legacy = from("legacy", "seed001_azure_npm.legacy.txt");
    let nft = from("nft", "seed001_azure_npm.nft.txt");
    let d = doctor_json(&["--from", &legacy, &nft]);
    assert_eq!(d.code, 1, "warnings only\n{}", d.show());
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 1, "only AZURE-NPM is in legacy\n{}", d.show());
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    let f = split[0];
    assert_eq!(f["severity"], "warning");
    let summary = text(f, "summary");
    assert!(
        summary.contains("AZURE-NPM")
            && !summary.contains("KUBE")
            && summary.contains("2 of them can drop packets"),
        "{summary}"
    );
    // The evidence says how the backend in use was decided and names AZURE-NPM's legacy
    // chains; the rules are the FORWARD jump and the two reachable DROPs.
    let evidence = text(f, "evidence");
    assert!(
        evidence.contains("backend in use: iptables-nft")
            && evidence.contains("KUBE-IPTABLES-HINT"),
        "{evidence}"
    );
    for chain in [
        "AZURE-NPM",
        "AZURE-NPM-INGRESS",
        "AZURE-NPM-EGRESS-2697641196",
    ] {
        assert!(evidence.contains(chain), "{chain} missing from\n{evidence}");
    }
    assert_eq!(
        places(f),
        [
            ("FORWARD".into(), 1),
            ("AZURE-NPM-EGRESS".into(), 2),
            ("AZURE-NPM-INGRESS".into(), 2)
        ]
    );
    let fix = text(f, "fix");
    assert!(
        fix.starts_with(
            "iptables-legacy -t filter -D FORWARD -m conntrack --ctstate NEW -j AZURE-NPM\n"
        ),
        "{fix}"
    );
    assert!(
        fix.lines()
            .all(|l| l.starts_with("iptables-legacy -t filter ")),
        "{fix}"
    );
    assert!(f.get("port").is_none(), "{f}");
    // Either dump alone is consistent.
    for one in [&legacy, &nft] {
        let d = doctor_json(&["--from", one]);
        assert_eq!((d.code, d.findings().len()), (0, 0), "{one}\n{}", d.show());
    }
}

/// Seed 002: CNI portmap's jumps for a stale pod come first in CNI-HOSTPORT-DNAT; through
/// the jumps (multiport 443,9001,80 and 10001), its CNI-DN chain's DNAT to the dead pod IP
/// takes every packet meant for the live pod's DNAT, port by port.
#[test]
fn seed002_stale_portmap_chain_shadows_the_live_pod() {
    let d = doctor_json(&[
        "--from",
        &from("legacy", "seed002_cni_portmap_stale.legacy.txt"),
    ]);
    assert_eq!(d.code, 2, "{}", d.show());
    let shadowed = d.of_kind("shadowed");
    assert_eq!(shadowed.len(), 4, "one per forwarded port\n{}", d.show());
    assert_eq!(d.findings().len(), 4, "{}", d.show());
    // Position of each port's DNAT in its CNI-DN chain (8 SETMARK rules come first).
    for (port, position) in [(443u16, 9u64), (9001, 10), (80, 11), (10001, 12)] {
        let f = shadowed
            .iter()
            .find(|f| places(f) == [(STALE_DN.into(), position), (LIVE_DN.into(), position)])
            .unwrap_or_else(|| {
                panic!(
                    "port {port}: stale DNAT shadowing live not reported\n{}",
                    d.show()
                )
            });
        assert_eq!(f["severity"], "error", "{f}");
        assert_eq!(f["protocol"], "tcp");
        assert!(
            line_of(f, 0).ends_with(&format!(
                "--dport {port} -j DNAT --to-destination 10.187.2.36:{port}"
            )),
            "{f}"
        );
        assert!(
            line_of(f, 1).ends_with(&format!(
                "--dport {port} -j DNAT --to-destination 10.187.2.34:{port}"
            )),
            "{f}"
        );
        assert_eq!(f["rules"][0]["backend"], "legacy");
        // One fix for every port: the stale pod's two jumps (one per multiport group of
        // portmap's), then its chain; nothing of the live pod's.
        let fix = text(f, "fix");
        let commands: Vec<&str> = fix.lines().collect();
        assert_eq!(commands.len(), 4, "{fix}");
        for (command, ports) in commands[..2].iter().zip(["443,9001,80", "10001"]) {
            assert!(
                command.starts_with("iptables-legacy -t nat -D CNI-HOSTPORT-DNAT -p tcp ")
                    && command.contains(&format!("--dports {ports} -j {STALE_DN}"))
                    && command.contains("fb7cdb0a4f8d"),
                "{fix}"
            );
        }
        assert_eq!(
            commands[2..],
            [
                format!("iptables-legacy -t nat -F {STALE_DN}"),
                format!("iptables-legacy -t nat -X {STALE_DN}")
            ]
        );
        assert!(!fix.contains(LIVE_DN), "{fix}");
    }
}

/// Seed 002 again: each finding must carry the port it breaks, so that grouping by port and
/// `--port 443` find the 443 forward. The DNAT for 443 runs behind a multiport jump
/// (443,9001,80), and the port must be that of the rule, not the jump's lowest.
#[test]
fn seed002_findings_carry_the_port_they_break() {
    let file = from("legacy", "seed002_cni_portmap_stale.legacy.txt");
    let d = doctor_json(&["--from", &file]);
    let mut ports: Vec<u64> = d
        .of_kind("shadowed")
        .iter()
        .filter_map(|f| f["port"].as_u64())
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, [80, 443, 9001, 10001], "{}", d.show());
    for port in ["443", "9001"] {
        let d = doctor_json(&["--port", port, "--from", &file]);
        assert_eq!(
            d.code,
            2,
            "--port {port} must report the shadowed {port} forward\n{}",
            d.show()
        );
        assert_eq!(d.findings().len(), 1, "{}", d.show());
    }
}

/// Seed 003 from a dump alone: a NodePort's DNAT with one endpoint hijacks nothing until a
/// local process listens (see the live test); the dump itself is consistent.
#[test]
fn seed003_dump_alone_has_no_listener_evidence() {
    for name in [
        "seed003_kube_nodeport.nft.txt",
        "seed003_kube_nodeport_two_endpoints.nft.txt",
    ] {
        let d = doctor_json(&["--from", &from("nft", name)]);
        assert_eq!((d.code, d.findings().len()), (0, 0), "{name}\n{}", d.show());
    }
}

/// Seed 004 from a dump alone: a REJECT for a port is no finding without a listener.
#[test]
fn seed004_dump_alone_has_no_listener_evidence() {
    for name in [
        "seed004_nodeport_reject.nft.txt",
        "seed004_kube_external_services.nft.txt",
    ] {
        let d = doctor_json(&["--from", &from("nft", name)]);
        assert_eq!((d.code, d.findings().len()), (0, 0), "{name}\n{}", d.show());
    }
}

/// (port, protocol, severity, rule places) of a finding.
type Seen = (u64, String, String, Vec<(String, u64)>);

/// Several broken ports in one dump; `--port N` keeps only port N's findings, and the exit
/// status follows what is kept.
#[test]
fn port_option_filters_findings() {
    let file = from("legacy", "many_shadows.legacy.txt");
    let d = doctor_json(&["--from", &file]);
    assert_eq!(d.code, 2, "{}", d.show());
    let mut seen: Vec<Seen> = d
        .findings()
        .iter()
        .map(|f| {
            assert_eq!(f["kind"], "shadowed", "{f}");
            (
                f["port"].as_u64().unwrap(),
                text(f, "protocol"),
                text(f, "severity"),
                places(f),
            )
        })
        .collect();
    seen.sort();
    let p = |c: &str, n: u64| (c.to_string(), n);
    let want = vec![
        (
            3306,
            "tcp".into(),
            "error".into(),
            vec![p("INPUT", 1), p("INPUT", 2)],
        ),
        (
            5353,
            "udp".into(),
            "error".into(),
            vec![p("PREROUTING", 5), p("PREROUTING", 6)],
        ),
        // One finding for one cause: rule 2 takes the packets of rules 3 and 4.
        (
            6667,
            "tcp".into(),
            "error".into(),
            vec![p("PREROUTING", 2), p("PREROUTING", 3), p("PREROUTING", 4)],
        ),
        (
            8080,
            "tcp".into(),
            "error".into(),
            vec![p("DOCKER", 2), p("DOCKER", 3)],
        ),
        // An exact duplicate sends the packets to the same place: a note.
        (
            9000,
            "tcp".into(),
            "info".into(),
            vec![p("DOCKER", 4), p("DOCKER", 5)],
        ),
    ];
    assert_eq!(seen, want, "{}", d.show());
    let filter = d.findings().iter().find(|f| f["port"] == 3306).unwrap();
    assert_eq!(filter["rules"][0]["table"], "filter");
    // Worst first.
    let severities: Vec<String> = d.findings().iter().map(|f| text(f, "severity")).collect();
    assert_eq!(
        severities.last().map(String::as_str),
        Some("info"),
        "{severities:?}"
    );

    for (port, count, code) in [
        ("6667", 1, 2),
        ("5353", 1, 2),
        ("3306", 1, 2),
        ("9000", 1, 0),
        ("7000", 0, 0),
        ("1", 0, 0),
    ] {
        let d = doctor_json(&["--port", port, "--from", &file]);
        assert_eq!(
            (d.code, d.findings().len()),
            (code, count),
            "--port {port}\n{}",
            d.show()
        );
        assert!(
            d.findings()
                .iter()
                .all(|f| f["port"].as_u64() == port.parse().ok()),
            "{}",
            d.show()
        );
    }
    // As text, one heading per port, worst port first; the note-only port comes last.
    let d = doctor(&["--from", &file]);
    let headings: Vec<&str> = d
        .stdout
        .lines()
        .filter(|l| l.starts_with("port "))
        .collect();
    assert_eq!(headings.len(), 5, "{}", d.stdout);
    assert_eq!(headings.last(), Some(&"port 9000/tcp"), "{}", d.stdout);
}

/// IPv6: an ip6tables-nft-save dump of netavark's chains, where a leftover DNAT for an old
/// container address shadows the new one. The family comes from the label, the dump's
/// header, or its addresses.
#[test]
fn ipv6_dump_stale_dnat_is_shadowed() {
    let name = "ipv6_netavark_stale.nft.txt";
    let headless = tempfile::NamedTempFile::new().unwrap();
    let body: String = std::fs::read_to_string(fixture(name))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(headless.path(), body).unwrap();
    let headless = format!("nft:{}", headless.path().display());
    for arg in [from("nft/ipv6", name), from("nft", name), headless] {
        let d = doctor_json(&["--from", &arg]);
        assert_eq!(d.code, 2, "{arg}\n{}", d.show());
        assert_eq!(d.findings().len(), 1, "{arg}\n{}", d.show());
        let f = &d.findings()[0];
        assert_eq!(
            (f["kind"].as_str(), f["severity"].as_str()),
            (Some("shadowed"), Some("error"))
        );
        assert_eq!(
            places(f),
            [
                ("NETAVARK-DN-1D8721804F16F".into(), 3),
                ("NETAVARK-DN-7A6B3C51E0F22".into(), 3)
            ]
        );
        assert_eq!(f["port"], 8443);
        assert!(
            line_of(f, 0).contains("[fd00:88::17]:443")
                && line_of(f, 1).contains("[fd00:88::2a]:443"),
            "{f}"
        );
        assert_eq!(f["rules"][0]["family"], "ipv6", "{arg}");
        // The fix removes the stale container's jump, then its chain: every port at once.
        let fix: Vec<String> = text(f, "fix").lines().map(str::to_string).collect();
        assert_eq!(fix.len(), 3, "{f}");
        assert!(
            fix[0].starts_with("ip6tables-nft -t nat -D NETAVARK-HOSTPORT-DNAT ")
                && fix[0].ends_with("-j NETAVARK-DN-1D8721804F16F")
                && fix[0].contains("3f2a8e6c1d0b"),
            "{f}"
        );
        assert_eq!(
            fix[1..],
            [
                "ip6tables-nft -t nat -F NETAVARK-DN-1D8721804F16F",
                "ip6tables-nft -t nat -X NETAVARK-DN-1D8721804F16F"
            ]
        );
        assert!(
            d.report["sources"][0]
                .as_str()
                .unwrap()
                .starts_with("nft/ipv6"),
            "{}",
            d.show()
        );
    }
}

/// Two families of one host at once: the IPv4 and the IPv6 dump are analysed side by side.
#[test]
fn both_families_at_once() {
    let d = doctor_json(&[
        "--from",
        &from("nft", "clean_host.nft.txt"),
        &from("nft/ipv6", "ipv6_netavark_stale.nft.txt"),
    ]);
    assert_eq!((d.code, d.findings().len()), (2, 1), "{}", d.show());
    assert_eq!(d.report["rules_read"], 68 + 13);
    assert_eq!(d.report["sources"].as_array().unwrap().len(), 2);
}

/// The text report is for people: grouped by port under a heading, every line within 80
/// columns (a single token longer than a line may overflow), a closing summary.
#[test]
fn text_report_fits_80_columns() {
    let cases = [
        vec![from("nft", "seed000_stale_sandbox_dnat.nft.txt")],
        vec![
            from("legacy", "seed001_azure_npm.legacy.txt"),
            from("nft", "seed001_azure_npm.nft.txt"),
        ],
        vec![from("legacy", "seed002_cni_portmap_stale.legacy.txt")],
        vec![from("legacy", "many_shadows.legacy.txt")],
        vec![from("nft", "ipv6_netavark_stale.nft.txt")],
    ];
    for files in cases {
        let mut args = vec!["--from"];
        args.extend(files.iter().map(String::as_str));
        let d = doctor(&args);
        assert!(d.code == 1 || d.code == 2, "{files:?}: {}", d.show());
        for line in d.stdout.lines() {
            let one_token = line.split_whitespace().count() == 1;
            assert!(
                line.len() <= 80 || one_token,
                "{} columns: {line:?}\n{}",
                line.len(),
                d.stdout
            );
        }
        let first = d.stdout.lines().next().unwrap_or_default();
        assert!(first.starts_with("port ") || first == "host", "{first:?}");
        assert!(d.stdout.contains(" error(s), "), "{}", d.stdout);
    }
    let d = doctor(&["--from", &from("nft", "seed000_stale_sandbox_dnat.nft.txt")]);
    assert!(
        d.stdout.starts_with("port 6667/tcp\n  ERROR shadowed\n"),
        "{}",
        d.stdout
    );
    assert!(
        d.stdout
            .contains("2 error(s), 0 warning(s), 0 note(s); 78 rules read"),
        "{}",
        d.stdout
    );
}

/// Doctor failing is exit 3 with a message, never a report: unreadable or unparsable dumps,
/// and a malformed `--from` label (which must not look like "errors found", 2).
#[test]
fn doctor_failures_exit_3() {
    let d = doctor(&["--from", "legacy:/nonexistent/dump.txt"]);
    assert_eq!(d.code, 3, "{}", d.show());
    assert!(d.stderr.contains("/nonexistent/dump.txt"), "{}", d.stderr);
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        bad.path(),
        "*nat\n:PREROUTING ACCEPT [0:0]\nthis is not a rule\nCOMMIT\n",
    )
    .unwrap();
    let d = doctor(&["--json", "--from", &format!("nft:{}", bad.path().display())]);
    assert_eq!(d.code, 3, "{}", d.show());
    assert!(
        d.stdout.is_empty() && d.stderr.contains("line 3"),
        "{}",
        d.show()
    );
    for label in [
        "iptables:x.txt",
        "nft/ipv5:x.txt",
        &fixture("clean_host.nft.txt").display().to_string(),
    ] {
        let d = doctor(&["--from", label]);
        assert_eq!(
            d.code,
            3,
            "--from {label}: a usage error is doctor failing\n{}",
            d.show()
        );
    }
}

/// When unsure, no shadow: packets arriving on docker0 RETURN from DOCKER before its DNAT
/// and reach the later PREROUTING DNAT, which does match them. Claiming it shadowed (and
/// printing a command deleting Docker's working rule) is wrong.
#[test]
fn return_before_a_dnat_is_no_shadow() {
    let d = doctor_json(&["--from", &from("legacy", "return_detour.legacy.txt")]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
}

/// A stale DNAT for 443 in PREROUTING takes every packet that portmap's multiport jump
/// (80,443) would bring to the pod's DNAT for 443: a shadow to report.
#[test]
fn shadow_through_a_multiport_jump_is_found() {
    let d = doctor_json(&[
        "--from",
        &from("legacy", "multiport_jump_lookup.legacy.txt"),
    ]);
    assert_eq!(d.code, 2, "{}", d.show());
    let f = d.of_kind("shadowed");
    assert_eq!(f.len(), 1, "{}", d.show());
    assert_eq!(
        places(f[0]),
        [
            ("PREROUTING".into(), 1),
            ("CNI-DN-0c5b7e3f9a1d2c4e6f8a0".into(), 2)
        ]
    );
    assert_eq!(f[0]["port"], 443);
}

/// kube-proxy's shape: KUBE-SERVICES is reached from PREROUTING and OUTPUT, and its NodePort
/// DNAT shadows a DNAT a deploy script appended to each. Each walk's shadow is its own: the
/// PREROUTING rule on the PREROUTING walk, the OUTPUT rule on the OUTPUT walk (the OUTPUT
/// walk is longer; reading its position in the PREROUTING walk panicked, or, when in range,
/// named an unrelated udp ACCEPT and missed the OUTPUT DNAT).
#[test]
fn a_chain_reached_from_two_hooks_shadows_on_each() {
    let name = "kube_services_both_hooks.legacy.txt";
    // As dumped, and with two udp ACCEPTs after the PREROUTING DNAT (so that the OUTPUT
    // DNAT's position on its walk is a udp ACCEPT's on the PREROUTING walk).
    let variant = tempfile::NamedTempFile::new().unwrap();
    let dnat = "-A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 30080 \
                -j DNAT --to-destination 10.77.0.9:80\n";
    let dump = std::fs::read_to_string(fixture(name)).unwrap();
    assert!(dump.contains(dnat));
    let accepts = "-A PREROUTING -d 10.0.0.10/32 -p udp -m udp --dport 53 -j ACCEPT\n\
                   -A PREROUTING -d 10.0.0.11/32 -p udp -m udp --dport 53 -j ACCEPT\n";
    std::fs::write(
        variant.path(),
        dump.replace(dnat, &format!("{dnat}{accepts}")),
    )
    .unwrap();
    for arg in [
        from("legacy", name),
        format!("legacy:{}", variant.path().display()),
    ] {
        let d = doctor_json(&["--from", &arg]);
        assert_eq!(d.code, 2, "{arg}\n{}", d.show());
        let f = d.of_kind("shadowed");
        assert_eq!((f.len(), d.findings().len()), (1, 1), "{arg}\n{}", d.show());
        assert_eq!(
            places(f[0]),
            [
                ("KUBE-SEP-QXDNOBCCLOXLV7LV".into(), 2),
                ("PREROUTING".into(), 2),
                ("OUTPUT".into(), 4)
            ],
            "{arg}\n{}",
            d.show()
        );
        assert_eq!(f[0]["rules"][1]["hooks"], serde_json::json!(["PREROUTING"]));
        assert_eq!(f[0]["rules"][2]["hooks"], serde_json::json!(["OUTPUT"]));
        assert_eq!(
            (f[0]["port"].as_u64(), f[0]["protocol"].as_str()),
            (Some(30080), Some("tcp"))
        );
        let summary = text(f[0], "summary");
        assert!(!summary.contains("ACCEPT"), "{summary}");
    }
}

//! `natledger doctor` end to end: the real binary on saved dumps modelling each failure
//! report of `seeds/` (`--from`), and on live firewalls in private network namespaces, one
//! test per finding type. Each test names the rule pair, the process or the chains it expects.
//!
//! Fixture tests need neither root nor namespaces; live tests do (see `common`). Doctor reads
//! the live tables of the namespace it runs in and the listeners from
//! `/proc/thread-self/net`, so it always runs inside the node namespace.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------------------------------------
// Running doctor and reading its report

/// A fixture under `tests/fixtures/doctor/`.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
}

/// `LABEL:tests/fixtures/doctor/NAME`.
fn from(label: &str, name: &str) -> String {
    format!("{label}:{}", fixture(name).display())
}

/// What one doctor run gave.
struct Doc {
    code: i32,
    report: Value,
    stdout: String,
    stderr: String,
}

impl Doc {
    fn of(out: Output, json: bool) -> Doc {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let code = out.status.code().unwrap_or(-1);
        let report = if json && code != 3 {
            serde_json::from_str(&stdout).unwrap_or_else(|e| {
                panic!("doctor --json printed no JSON ({e}); exit {code}\n{stdout}\n{stderr}")
            })
        } else {
            Value::Null
        };
        let doc = Doc {
            code,
            report,
            stdout,
            stderr,
        };
        if json && code != 3 {
            doc.check_schema();
        }
        doc
    }

    fn findings(&self) -> &[Value] {
        self.report["findings"]
            .as_array()
            .map_or(&[], Vec::as_slice)
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.findings()
            .iter()
            .filter(|f| f["kind"] == kind)
            .collect()
    }

    /// Everything, for assertion messages.
    fn show(&self) -> String {
        let report = serde_json::to_string_pretty(&self.report).unwrap_or_default();
        let text = if self.report.is_null() {
            &self.stdout
        } else {
            &report
        };
        format!("exit {}\n{text}\nstderr: {}", self.code, self.stderr)
    }

    /// The exit status matches the worst severity, and the report has the documented shape:
    /// `{sources, rules_read, complete, findings: [{severity, kind, port?, protocol?, summary,
    /// rules: [{backend, family, table, chain, position, line}], evidence?, fix?}]}`.
    fn check_schema(&self) {
        let r = &self.report;
        let keys = |v: &Value| -> Vec<String> {
            v.as_object()
                .unwrap_or_else(|| panic!("not an object: {v}"))
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(
            keys(r),
            ["sources", "rules_read", "complete", "findings"],
            "{}",
            self.show()
        );
        assert!(
            r["sources"]
                .as_array()
                .is_some_and(|s| s.iter().all(Value::is_string))
        );
        assert!(
            r["rules_read"].is_u64() && r["complete"].is_boolean(),
            "{}",
            self.show()
        );
        let mut worst = 0;
        for f in self.findings() {
            let allowed = [
                "severity", "kind", "port", "protocol", "summary", "rules", "evidence", "fix",
            ];
            for k in keys(f) {
                assert!(allowed.contains(&k.as_str()), "unknown key {k} in {f}");
            }
            let severity = f["severity"].as_str().unwrap_or_default();
            worst = worst.max(match severity {
                "info" => 0,
                "warning" => 1,
                "error" => 2,
                other => panic!("severity {other:?} in {f}"),
            });
            let kinds = [
                "shadowed",
                "dead-target",
                "hijacked-listener",
                "split-backends",
                "natledger-state",
            ];
            assert!(
                kinds.contains(&f["kind"].as_str().unwrap_or_default()),
                "{f}"
            );
            assert!(
                f.get("port")
                    .is_none_or(|p| p.as_u64().is_some_and(|p| p <= 65535))
            );
            assert!(f.get("protocol").is_none_or(Value::is_string), "{f}");
            assert!(f["summary"].as_str().is_some_and(|s| !s.is_empty()), "{f}");
            assert!(
                f.get("evidence")
                    .is_none_or(|e| e.as_array().is_some_and(|e| !e.is_empty()))
            );
            assert!(f.get("fix").is_none_or(Value::is_string), "{f}");
            for rule in f["rules"]
                .as_array()
                .unwrap_or_else(|| panic!("no rules: {f}"))
            {
                assert_eq!(
                    keys(rule),
                    ["backend", "family", "table", "chain", "position", "line"]
                );
                assert!(["legacy", "nft"].contains(&rule["backend"].as_str().unwrap_or("")));
                assert!(["ipv4", "ipv6"].contains(&rule["family"].as_str().unwrap_or("")));
                assert!(rule["position"].is_u64(), "{rule}");
                let line = rule["line"].as_str().unwrap_or_default();
                let chain = rule["chain"].as_str().unwrap_or_default();
                assert!(line.starts_with(&format!("-A {chain} ")), "{rule}");
            }
        }
        assert_eq!(
            self.code,
            worst,
            "exit status vs worst severity\n{}",
            self.show()
        );
    }
}

/// `natledger doctor ARGS` on this host, with an empty state directory of its own. Only
/// for `--from`: nothing live is read.
fn doctor(args: &[&str]) -> Doc {
    let state = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .env("NATLEDGER_STATE_DIR", state.path())
        .arg("doctor")
        .args(args)
        .output()
        .expect("run natledger");
    Doc::of(out, args.contains(&"--json"))
}

fn doctor_json(args: &[&str]) -> Doc {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    doctor(&all)
}

/// `natledger doctor --json ARGS` inside the node namespace.
fn live(node: &Node, args: &[&str]) -> Doc {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    Doc::of(node.natledger(&all, "", &[]), true)
}

/// `(chain, position)` of each rule of a finding.
fn places(f: &Value) -> Vec<(String, u64)> {
    f["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["chain"].as_str().unwrap().to_string(),
                r["position"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn line_of(f: &Value, i: usize) -> &str {
    f["rules"][i]["line"].as_str().unwrap_or_default()
}

fn text(f: &Value, key: &str) -> String {
    match &f[key] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|v| v.as_str().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures (--from): one per seed, a clean host, --port, IPv6, failure modes

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
/// has AZURE-NPM and KUBE- rules. Only AZURE-NPM is split across backends.
#[test]
fn seed001_leftover_legacy_azure_npm_is_split_backends() {
    let legacy = from("legacy", "seed001_azure_npm.legacy.txt");
    let nft = from("nft", "seed001_azure_npm.nft.txt");
    let d = doctor_json(&["--from", &legacy, &nft]);
    assert_eq!(d.code, 1, "warnings only\n{}", d.show());
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 1, "only AZURE-NPM is in both\n{}", d.show());
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    let f = split[0];
    assert_eq!(f["severity"], "warning");
    let summary = text(f, "summary");
    assert!(
        summary.contains("AZURE-NPM") && !summary.contains("KUBE"),
        "{summary}"
    );
    // The evidence names the chains holding rules in the other backend (AZURE-NPM's own and
    // the built-in chain jumping to it); the fix is printed for that backend.
    let evidence = text(f, "evidence");
    let other = if evidence.contains("iptables-legacy") {
        "legacy"
    } else {
        "nft"
    };
    for chain in [
        "filter AZURE-NPM",
        "filter AZURE-NPM-INGRESS",
        "filter FORWARD",
    ] {
        assert!(evidence.contains(chain), "{chain} missing from\n{evidence}");
    }
    assert!(!evidence.contains("KUBE-"), "{evidence}");
    assert!(text(f, "fix").contains(&format!("iptables-{other}")), "{f}");
    assert!(f.get("port").is_none(), "{f}");
    // Either dump alone is consistent.
    for one in [&legacy, &nft] {
        let d = doctor_json(&["--from", one]);
        assert_eq!((d.code, d.findings().len()), (0, 0), "{one}\n{}", d.show());
    }
}

const STALE_DN: &str = "CNI-DN-b24a4eb3a38dc5843c23a";
const LIVE_DN: &str = "CNI-DN-f2390ee4e08c581b1ea73";

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
        assert!(
            text(f, "fix").starts_with(&format!("iptables-legacy -t nat -D {STALE_DN} ")),
            "{f}"
        );
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
        assert!(
            text(f, "fix").starts_with("ip6tables-nft -t nat -D NETAVARK-DN-1D8721804F16F "),
            "{f}"
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

// ---------------------------------------------------------------------------------------------
// Live: private network namespaces

/// A process this test started; killed (by its pid) and reaped when dropped.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `argv` in `ns` and wait until it listens on TCP `port` (its own socket tables).
fn listener(ns: &str, argv: &[&str], port: u16) -> Proc {
    let child = Proc(spawn_in(ns, argv));
    let pid = child.pid();
    let needle = format!(":{port:04X} ");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listening = ["tcp", "tcp6"].iter().any(|f| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.get(1)
                        .is_some_and(|a| format!("{a} ").ends_with(&needle))
                        && cols.get(3) == Some(&"0A")
                })
        });
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if listening && comm.trim() != "ip" {
            return child;
        }
        assert!(
            Instant::now() < deadline,
            "{argv:?} did not listen on {port} in {ns}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An IPv4-only listener (`0.0.0.0:PORT`), like seed 003's `SimpleHTTPServer`.
fn httpd_v4(node: &Node, port: u16) -> Proc {
    let home = node.dir.path().display().to_string();
    let addr = format!("0.0.0.0:{port}");
    listener(
        node.topo.node(),
        &["busybox", "httpd", "-f", "-p", &addr, "-h", &home],
        port,
    )
}

fn load_fixture(node: &Node, backend: Backend, family: Family, name: &str) {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    load_rules(node.topo.node(), backend, family, &text);
}

#[test]
fn live_clean_namespace_has_no_findings() {
    let node = Node::new(Backend::Nft);
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    assert_eq!(d.report["complete"], true);
    // A healthy host with rules of several owners, a live container forwarded by natledger,
    // and a process listening on a port nobody forwards: still nothing.
    let mut node = node;
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "web");
    load_rules(
        node.topo.node(),
        Backend::Nft,
        Family::V4,
        "*nat\n:DOCKER - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
         -A DOCKER -i docker0 -j RETURN\n\
         -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8088 -j DNAT --to-destination 10.77.0.2:80\n\
         COMMIT\n*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n",
    );
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("healthy", Some(pid), &[("io.natledger.ports", "8081:80")]);
    let _sshd = httpd_v4(&node, 2222);
    let d = live(&node, &[]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 0),
        "{}\n{}",
        d.show(),
        node.dump()
    );
    assert!(
        d.report["rules_read"].as_u64().unwrap() >= 5,
        "{}",
        d.show()
    );
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 8081), T)
            .ok()
            .as_deref(),
        Some("web")
    );
}

/// Seed 000 live, both backends: two DNATs for one port; the first (to a container that no
/// longer serves) takes the packets meant for the second.
#[test]
fn live_shadowed_dnat() {
    both(|backend| {
        let mut node = Node::new(backend);
        let _old = node.topo.add_container(2);
        let new = node.topo.add_container(3);
        let _server = serve_tcp(&new.ns, new.sock_v4(6667), "live sandbox");
        load_rules(
            node.topo.node(),
            backend,
            Family::V4,
            "*nat\n\
             -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 6667 -j DNAT --to-destination 10.77.0.2:6667\n\
             -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 6667 -j DNAT --to-destination 10.77.0.3:6667\n\
             COMMIT\n",
        );
        // The seed's symptom: the port is closed although the live sandbox serves.
        let reply = tcp_request(node.topo.ext(), sock(NODE_V4, 6667), T);
        assert!(reply.is_err(), "{reply:?}");
        let d = live(&node, &[]);
        assert_eq!(d.code, 2, "{}", d.show());
        let f = d.of_kind("shadowed");
        assert_eq!(f.len(), 1, "{}", d.show());
        let f = f[0];
        assert_eq!(
            places(f),
            [("PREROUTING".into(), 1), ("PREROUTING".into(), 2)]
        );
        assert_eq!(
            (f["severity"].as_str(), f["port"].as_u64()),
            (Some("error"), Some(6667))
        );
        assert_eq!(f["rules"][0]["backend"], backend.name());
        assert!(
            line_of(f, 0).contains("10.77.0.2:6667") && line_of(f, 1).contains("10.77.0.3:6667")
        );
        assert!(
            text(f, "fix")
                .starts_with(&format!("iptables-{} -t nat -D PREROUTING", backend.name()))
        );
        // Only the shadow: both addresses are on the bridge, nothing else is wrong.
        assert_eq!(d.findings().len(), 1, "{}", d.show());
        let d = live(&node, &["--port", "6668"]);
        assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    });
}

/// A DNAT to an address with no route in the node namespace is a dead target (with the
/// routes as evidence); one to a live container on the bridge is not.
#[test]
fn live_dead_target() {
    let mut node = Node::new(Backend::Nft);
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "alive");
    load_rules(
        node.topo.node(),
        Backend::Nft,
        Family::V4,
        "*nat\n\
         -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 7001 -j DNAT --to-destination 10.99.0.5:80\n\
         -A PREROUTING -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 7002 -j DNAT --to-destination 10.77.0.2:80\n\
         COMMIT\n",
    );
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 7002), T)
            .ok()
            .as_deref(),
        Some("alive")
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let dead = d.of_kind("dead-target");
    assert_eq!(dead.len(), 1, "only 10.99.0.5 is dead\n{}", d.show());
    let f = dead[0];
    assert_eq!(
        (f["severity"].as_str(), f["port"].as_u64()),
        (Some("error"), Some(7001))
    );
    assert_eq!(places(f), [("PREROUTING".into(), 1)]);
    assert!(text(f, "summary").contains("10.99.0.5"), "{f}");
    assert!(text(f, "evidence").contains("route"), "{f}");
    assert!(
        text(f, "fix").starts_with("iptables-nft -t nat -D PREROUTING"),
        "{f}"
    );
    assert_eq!(d.findings().len(), 1, "{}", d.show());
}

/// Seed 003 live: kube-proxy's NodePort DNAT in nat PREROUTING/OUTPUT for 30080 while a
/// non-Kubernetes process listens on 30080 (IPv4): its traffic goes to the pod.
#[test]
fn live_seed003_nodeport_hijacks_a_listener() {
    let mut node = Node::new(Backend::Nft);
    let pod = node.topo.add_container(2);
    let _pod = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    load_fixture(
        &node,
        Backend::Nft,
        Family::V4,
        "seed003_kube_nodeport.nft.txt",
    );
    let local = httpd_v4(&node, 30080);
    // The seed's observation: requests to the node port reach the pod, not the process.
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, 30080), T)
            .ok()
            .as_deref(),
        Some("pod")
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let f = d.of_kind("hijacked-listener");
    assert_eq!(f.len(), 1, "{}", d.show());
    let f = f[0];
    assert_eq!(
        (
            f["severity"].as_str(),
            f["port"].as_u64(),
            f["protocol"].as_str()
        ),
        (Some("error"), Some(30080), Some("tcp"))
    );
    let summary = text(f, "summary");
    assert!(
        summary.contains(&format!("busybox (pid {})", local.pid())),
        "{summary}"
    );
    assert_eq!(places(f), [("KUBE-SEP-QXDNOBCCLOXLV7LV".into(), 2)]);
    assert!(
        line_of(f, 0).ends_with("-j DNAT --to-destination 10.77.0.2:80"),
        "{f}"
    );
    assert_eq!(
        (
            f["rules"][0]["table"].as_str(),
            f["rules"][0]["backend"].as_str()
        ),
        (Some("nat"), Some("nft"))
    );
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    // With the listener gone, nothing is hijacked.
    drop(local);
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
}

/// Seed 003 with a dual-stack listener (`[::]:30080` without IPV6_V6ONLY: busybox nc, Go's
/// `net.Listen(":port")`, Python 3's http.server): it receives IPv4 too, so the IPv4 NodePort
/// DNAT hijacks it just the same.
#[test]
fn live_seed003_nodeport_hijacks_a_dual_stack_listener() {
    let mut node = Node::new(Backend::Nft);
    let pod = node.topo.add_container(2);
    let _pod = serve_tcp(&pod.ns, pod.sock_v4(80), "pod");
    load_fixture(
        &node,
        Backend::Nft,
        Family::V4,
        "seed003_kube_nodeport.nft.txt",
    );
    let local = listener(
        node.topo.node(),
        &["busybox", "nc", "-l", "-p", "30080"],
        30080,
    );
    let d = live(&node, &[]);
    let f = d.of_kind("hijacked-listener");
    assert_eq!(f.len(), 1, "{}", d.show());
    assert_eq!(f[0]["severity"], "error", "{}", d.show());
    assert!(
        text(f[0], "summary").contains(&format!("(pid {})", local.pid())),
        "{}",
        d.show()
    );
    assert_eq!(places(f[0]), [("KUBE-SEP-QXDNOBCCLOXLV7LV".into(), 2)]);
}

/// Seed 003 with two endpoints: kube-proxy picks one at random, but every packet is DNATed
/// to one of them, so the listener gets none: all of its traffic is taken (an error).
#[test]
fn live_seed003_two_endpoints_take_all_traffic() {
    let mut node = Node::new(Backend::Nft);
    load_fixture(
        &node,
        Backend::Nft,
        Family::V4,
        "seed003_kube_nodeport_two_endpoints.nft.txt",
    );
    let _a = node.topo.add_container(2);
    let _b = node.topo.add_container(3);
    let _local = httpd_v4(&node, 30081);
    let d = live(&node, &[]);
    let f = d.of_kind("hijacked-listener");
    assert!(!f.is_empty(), "{}", d.show());
    assert!(f.iter().all(|f| f["port"] == 30081), "{}", d.show());
    assert_eq!(
        d.code,
        2,
        "all of 30081's traffic is DNATed away\n{}",
        d.show()
    );
}

/// A node with `fixture` loaded and a busybox httpd listening on `port`, whose connections
/// from outside are refused; doctor's report and its one hijacked-listener finding.
fn refused_listener(fixture: &str, port: u16) -> (Node, Proc, Doc) {
    let node = Node::new(Backend::Nft);
    load_fixture(&node, Backend::Nft, Family::V4, fixture);
    let local = httpd_v4(&node, port);
    let refused = tcp_request(node.topo.ext(), sock(NODE_V4, port), T);
    assert_eq!(
        refused.as_ref().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    let d = live(&node, &[]);
    let f = d.of_kind("hijacked-listener");
    assert_eq!(f.len(), 1, "{}", d.show());
    assert_eq!(
        (f[0]["severity"].as_str(), f[0]["port"].as_u64()),
        (Some("error"), Some(u64::from(port))),
        "every connection is refused\n{}",
        d.show()
    );
    assert!(
        text(f[0], "summary").contains(&format!("busybox (pid {})", local.pid())),
        "{}",
        d.show()
    );
    (node, local, d)
}

/// Seed 004 live: filter INPUT rejects tcp/8080 while a local process listens on 8080:
/// connections are refused although it listens.
#[test]
fn live_seed004_reject_hijacks_a_listener() {
    let (_node, _local, d) = refused_listener("seed004_nodeport_reject.nft.txt", 8080);
    assert_eq!(d.code, 2, "{}", d.show());
    let f = d.of_kind("hijacked-listener")[0];
    assert_eq!(f["rules"][0]["table"], "filter");
    assert_eq!(places(f), [("INPUT".into(), 1)]);
    assert!(line_of(f, 0).contains("--dport 8080 -j REJECT"), "{f}");
    assert!(
        text(f, "fix").starts_with("iptables-nft -t filter -D INPUT"),
        "{f}"
    );
    assert_eq!(d.findings().len(), 1, "{}", d.show());
}

/// Seed 004 as kube-proxy writes it: INPUT `-m conntrack --ctstate NEW` jumps to
/// KUBE-EXTERNAL-SERVICES, which REJECTs the NodePort with no endpoints. Every TCP
/// connection starts NEW, so every connection is refused: an error, as with the plain rule.
#[test]
fn live_seed004_kube_external_services_reject() {
    let (_node, _local, d) = refused_listener("seed004_kube_external_services.nft.txt", 30584);
    let f = d.of_kind("hijacked-listener")[0];
    assert_eq!(places(f), [("KUBE-EXTERNAL-SERVICES".into(), 1)]);
}

/// Split backends: KUBE- rules in both iptables-legacy and iptables-nft of the namespace;
/// AZURE-NPM only in legacy (not split).
#[test]
fn live_split_backends() {
    let node = Node::new(Backend::Nft);
    let kube = "*filter\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n\
        -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n\
        COMMIT\n";
    load_rules(node.topo.node(), Backend::Nft, Family::V4, kube);
    let d = live(&node, &[]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 0),
        "one backend only\n{}",
        d.show()
    );
    load_rules(node.topo.node(), Backend::Legacy, Family::V4, kube);
    load_rules(
        node.topo.node(),
        Backend::Legacy,
        Family::V4,
        "*filter\n:AZURE-NPM - [0:0]\n-A AZURE-NPM -m mark --mark 0x4000 -j DROP\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 1, "{}", d.show());
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 1, "{}", d.show());
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    let f = split[0];
    assert!(text(f, "summary").contains("KUBE"), "{f}");
    let evidence = text(f, "evidence");
    assert!(
        evidence.contains("ipv4/filter KUBE-FIREWALL") && evidence.contains("ipv4/filter INPUT"),
        "{evidence}"
    );
    let sources = d.report["sources"].to_string();
    assert!(
        sources.contains("legacy/ipv4 (live)") && sources.contains("nft/ipv4 (live)"),
        "{sources}"
    );
}

/// natledger's own state: a live container's rules are fine; once its process dies the
/// manifest is dead (a warning, fixed by `natledger sweep`); after sweep, nothing.
#[test]
fn live_natledger_dead_manifest() {
    let mut node = Node::new(Backend::Nft);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("gone", Some(pid), &[("io.natledger.ports", "8082:80")]);
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
    kill_pid(pid);
    let d = live(&node, &[]);
    let state = d.of_kind("natledger-state");
    assert_eq!(state.len(), 1, "{}", d.show());
    let f = state[0];
    assert_eq!(f["severity"], "warning");
    let summary = text(f, "summary");
    assert!(
        summary.contains("gone")
            && summary.contains(&format!("pid {pid}"))
            && summary.contains("dead"),
        "{summary}"
    );
    assert_eq!(text(f, "fix"), "natledger sweep");
    assert_eq!(f["port"], 8082);
    // Its DNATs (IPv4 and IPv6) now lead nowhere: dead targets, judged by the manifest.
    let dead = d.of_kind("dead-target");
    let families: Vec<String> = dead
        .iter()
        .map(|f| text(&f["rules"][0], "family"))
        .collect();
    assert_eq!(families, ["ipv4", "ipv6"], "{}", d.show());
    for f in dead {
        assert!(
            text(f, "evidence").contains("natledger manifest"),
            "{}",
            d.show()
        );
        assert_eq!(text(f, "fix"), "natledger sweep");
        assert_eq!(f["port"], 8082);
    }
    assert_eq!(d.findings().len(), 3, "{}", d.show());
    assert_eq!(d.code, 2, "{}", d.show());
    assert_ok(&node.sweep(&[]), "sweep");
    let d = live(&node, &[]);
    assert_eq!((d.code, d.findings().len()), (0, 0), "{}", d.show());
}

/// A rule deleted by hand from a live container: its ports do not forward (an error).
#[test]
fn live_natledger_missing_rule() {
    let mut node = Node::new(Backend::Nft);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("live", Some(pid), &[("io.natledger.ports", "8083:80")]);
    let nat = save(node.topo.node(), Backend::Nft, Family::V4);
    let dnat = nat
        .lines()
        .find(|l| {
            l.starts_with("-A NATLEDGER-HOSTPORTS")
                && l.contains("natledger:live")
                && l.contains("DNAT")
        })
        .unwrap_or_else(|| panic!("no DNAT of live:\n{nat}"));
    let mut args: Vec<String> = vec!["-t".into(), "nat".into(), "-D".into()];
    args.extend(natledger::save::tokenize(&dnat[3..]).unwrap());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_in(node.topo.node(), "iptables-nft", &args, None);
    assert_ok(&out, "iptables-nft -D");
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let state = d.of_kind("natledger-state");
    assert_eq!(state.len(), 1, "{}", d.show());
    let f = state[0];
    assert_eq!(f["severity"], "error");
    assert!(
        text(f, "summary").contains("live") && text(f, "summary").contains("missing 1 of"),
        "{f}"
    );
    assert_eq!(f["rules"].as_array().unwrap().len(), 1, "{f}");
    assert_eq!(f["rules"][0]["chain"], "NATLEDGER-HOSTPORTS");
    assert!(
        line_of(f, 0).contains("natledger:live") && line_of(f, 0).contains("DNAT"),
        "{f}"
    );
    assert_eq!(f["port"], 8083);
    assert_eq!(d.findings().len(), 1, "{}", d.show());
}

/// Rules tagged for a container natledger has no manifest of: orphans (warnings). An orphan
/// DNAT is also a dead target.
#[test]
fn live_natledger_orphan_rules() {
    let node = Node::new(Backend::Nft);
    node.warm_up();
    load_rules(
        node.topo.node(),
        Backend::Nft,
        Family::V4,
        "*nat\n-A NATLEDGER-MASQ -s 10.77.0.9/32 -d 10.77.0.9/32 -p tcp -m tcp --dport 80 -m comment --comment natledger:ghost -j MASQUERADE\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 1, "{}", d.show());
    let state = d.of_kind("natledger-state");
    assert_eq!(state.len(), 1, "{}", d.show());
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    let f = state[0];
    assert_eq!(f["severity"], "warning");
    assert!(
        text(f, "summary").contains("ghost") && text(f, "summary").contains("orphan"),
        "{f}"
    );
    assert_eq!(places(f), [("NATLEDGER-MASQ".into(), 1)]);
    assert_eq!(text(f, "fix"), "natledger sweep");

    load_rules(
        node.topo.node(),
        Backend::Nft,
        Family::V4,
        "*nat\n-I NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 7777 -m comment --comment natledger:ghost -j DNAT --to-destination 10.77.0.9:80\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    assert_eq!(d.of_kind("natledger-state").len(), 2, "{}", d.show());
    let dead = d.of_kind("dead-target");
    assert_eq!(dead.len(), 1, "{}", d.show());
    assert!(
        text(dead[0], "evidence").contains("no manifest for container ghost"),
        "{}",
        d.show()
    );
}

/// Seed 002 live, in-process with injected evidence roots (the CLI always reads the host's):
/// the node's legacy tables hold the seed's rules, both pod addresses are on the node's pod
/// network, CNI IPAM reserves the live pod's address for its container, which runs (a runc
/// state file with a live pid); nothing reserves the stale pod's. Returns doctor's report.
fn seed002_live_report() -> Doc {
    use natledger::doctor::{self as nl, DoctorOptions, evidence::Roots};
    let mut node = Node::new(Backend::Nft);
    load_fixture(
        &node,
        Backend::Legacy,
        Family::V4,
        "seed002_cni_portmap_stale.legacy.txt",
    );
    let ns = node.topo.node().to_string();
    let pod_pid = node.topo.spawn_sleeper(&ns);
    let out = run_in(
        &ns,
        "ip",
        &["addr", "add", "10.187.2.1/24", "dev", BRIDGE],
        None,
    );
    assert_ok(&out, "ip addr add");
    let live_id = "0961bad27f1a52a28701b7038120b8188e7a78df21f57a08428f021ab3c071e2";
    let tmp = tempfile::tempdir().unwrap();
    let cni = tmp.path().join("cni/networks/cbr0");
    std::fs::create_dir_all(&cni).unwrap();
    std::fs::write(cni.join("10.187.2.34"), format!("{live_id}\neth0")).unwrap();
    std::fs::write(cni.join("last_reserved_ip.0"), "10.187.2.34").unwrap();
    let state = tmp.path().join("run/containerd/runc/k8s.io").join(live_id);
    std::fs::create_dir_all(&state).unwrap();
    let json = format!(r#"{{"id":"{live_id}","init_process_pid":{pod_pid}}}"#);
    std::fs::write(state.join("state.json"), json).unwrap();
    let roots = Roots {
        cni_networks: tmp.path().join("cni/networks"),
        runtime_state: vec![tmp.path().join("run/containerd/runc")],
        ..Roots::default()
    };
    let ledger_dir = tmp.path().join("state");
    let report = in_netns(&ns, move || {
        let runner = natledger::exec::SystemRunner::default();
        let opts = DoctorOptions {
            from: Vec::new(),
            port: None,
            ledger: natledger::ledger::Ledger::new(ledger_dir),
            netfilter: natledger::backend::Netfilter::new(&runner),
            host_backend: natledger::backend::Backend::Nft,
            roots,
        };
        nl::doctor(&opts).map(|r| (r.exit_code(), serde_json::to_value(&r).unwrap()))
    });
    let (code, report) = report.expect("doctor");
    let d = Doc {
        code: code.into(),
        report,
        stdout: String::new(),
        stderr: String::new(),
    };
    d.check_schema();
    d
}

/// Seed 002 live: the stale DNATs are dead targets on CNI IPAM's word; the live ones not.
#[test]
fn live_seed002_cni_ipam_evidence() {
    let d = seed002_live_report();
    assert_eq!(d.code, 2, "{}", d.show());
    assert_eq!(d.of_kind("shadowed").len(), 4, "{}", d.show());
    let dead = d.of_kind("dead-target");
    assert_eq!(
        dead.len(),
        4,
        "the stale pod's four DNATs, not the live pod's\n{}",
        d.show()
    );
    for f in &dead {
        assert_eq!(places(f)[0].0, STALE_DN, "{f}");
        assert_eq!(f["severity"], "error", "{f}");
        let evidence = text(f, "evidence");
        assert!(
            evidence.contains("CNI IPAM") && evidence.contains("10.187.2.36"),
            "{evidence}"
        );
    }
    assert_eq!(d.findings().len(), 8, "{}", d.show());
}

/// Seed 002 live: the stale pod's container id is in the comment of portmap's jump to its
/// CNI-DN chain (not on the DNAT itself); checked against the runtime's state it is not
/// running, which doctor should cite (the issue: "the container ids in rule comments
/// (portmap, ...) checked against running containers").
#[test]
fn live_seed002_portmap_comment_id_is_evidence() {
    let d = seed002_live_report();
    let dead = d.of_kind("dead-target");
    assert!(!dead.is_empty(), "{}", d.show());
    for f in dead {
        let evidence = text(f, "evidence");
        assert!(
            evidence.contains("runtime state") && evidence.contains("fb7cdb0a4f8d"),
            "no runtime evidence for the stale pod's id:\n{evidence}"
        );
    }
}

#[test]
fn live_port_filter_and_worst_first() {
    let mut node = Node::new(Backend::Nft);
    let _c = node.topo.add_container(2);
    load_rules(
        node.topo.node(),
        Backend::Nft,
        Family::V4,
        "*nat\n\
         -A PREROUTING -p tcp -m tcp --dport 7101 -j DNAT --to-destination 10.99.0.5:80\n\
         -A PREROUTING -p udp -m udp --dport 7102 -j DNAT --to-destination 10.77.0.2:80\n\
         -A PREROUTING -p udp -m udp --dport 7102 -j DNAT --to-destination 10.77.0.2:80\n\
         COMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 2, "{}", d.show());
    let order: Vec<(String, u64)> = d
        .findings()
        .iter()
        .map(|f| (text(f, "severity"), f["port"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        order,
        [("error".to_string(), 7101), ("info".to_string(), 7102)],
        "{}",
        d.show()
    );
    let d = live(&node, &["--port", "7102"]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 1),
        "a note only\n{}",
        d.show()
    );
    assert_eq!(d.findings()[0]["protocol"], "udp");
}

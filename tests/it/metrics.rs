//! `--metrics-file`: the files `sweep` and `doctor` write, parsed with the Prometheus
//! text-format parser of prometheus_client (`tests/prometheus/parse.py`; scripts/test.sh
//! installs it), hold the values of the same run's `--json` report. A real sweep of a dead
//! container's rules in the test's namespaces, all three backends.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::*;
use natledger::entry::metrics::{Exposition, write};
use serde_json::Value;

/// A parsed file: family name → (type, help, samples as (labels, value)).
type Families = BTreeMap<String, (String, String, Vec<(BTreeMap<String, String>, f64)>)>;

fn parse(path: &Path) -> Families {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/prometheus/parse.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(path)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "prometheus_client could not parse {} (scripts/test.sh installs it): {}\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(path).unwrap_or_default()
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut families = Families::new();
    for f in parsed.as_array().unwrap() {
        let samples = f["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                assert_eq!(s["name"], f["name"], "a sample outside its family");
                let labels = s["labels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect();
                (labels, s["value"].as_f64().unwrap())
            })
            .collect();
        let name = f["name"].as_str().unwrap().to_string();
        let entry = (
            f["type"].as_str().unwrap().to_string(),
            f["help"].as_str().unwrap().to_string(),
            samples,
        );
        assert!(families.insert(name, entry).is_none(), "a family twice");
    }
    families
}

/// The value of the one sample of `name` with exactly these labels.
fn value(families: &Families, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (_, _, samples) = families.get(name)?;
    let found: Vec<f64> = samples
        .iter()
        .filter(|(l, _)| *l == want)
        .map(|(_, v)| *v)
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?} twice");
    found.first().copied()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Every family is a documented gauge.
fn check_documented(families: &Families) {
    assert!(!families.is_empty());
    for (name, (kind, help, _)) in families {
        assert_eq!(kind, "gauge", "{name}");
        assert!(!help.is_empty(), "{name} has no HELP");
    }
}

fn tables(report: &Value) -> &Vec<Value> {
    report["tables"].as_array().unwrap()
}

/// The file's values are the JSON report's.
fn check_sweep(families: &Families, report: &Value, before: f64, after: f64) {
    check_documented(families);
    let one = |name: &str| value(families, name, &[]).unwrap_or_else(|| panic!("no {name}"));
    let ts = one("natledger_sweep_last_run_timestamp_seconds");
    assert!(before <= ts && ts <= after, "{before} <= {ts} <= {after}");
    assert_eq!(
        one("natledger_sweep_last_duration_seconds"),
        report["duration_seconds"].as_f64().unwrap()
    );
    assert_eq!(
        one("natledger_sweep_last_errors"),
        report["errors"].as_array().unwrap().len() as f64
    );
    let manifests = report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["manifest"] == "removed")
        .count();
    assert_eq!(
        one("natledger_sweep_last_manifests_removed"),
        manifests as f64
    );
    for state in ["alive", "dead", "unreadable"] {
        let n = report["containers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["state"] == state)
            .count();
        let got = value(
            families,
            "natledger_sweep_last_containers",
            &[("state", state)],
        );
        assert_eq!(got, Some(n as f64), "containers {state}");
    }
    for backend in ["legacy", "nft", "nftables"] {
        for family in ["ipv4", "ipv6"] {
            let here: Vec<&Value> = tables(report)
                .iter()
                .filter(|t| t["backend"] == backend && t["family"] == family)
                .collect();
            assert_eq!(here.len(), 2, "nat and filter of {backend}/{family}");
            let removed: Vec<&Value> = here
                .iter()
                .flat_map(|t| t["rules_removed"].as_array().unwrap())
                .collect();
            for reason in [
                "dead-container",
                "orphan",
                "duplicate-jump",
                "stale-chain",
                "uninstall",
            ] {
                let n = removed.iter().filter(|r| r["reason"] == reason).count();
                let labels = [("reason", reason), ("backend", backend), ("family", family)];
                let got = value(families, "natledger_sweep_last_rules_removed", &labels);
                assert_eq!(got, Some(n as f64), "{labels:?}");
            }
            let owned: Option<u64> = here.iter().map(|t| t["rules_owned_after"].as_u64()).sum();
            let labels = [("backend", backend), ("family", family)];
            let got = value(families, "natledger_sweep_last_rules_owned", &labels);
            assert_eq!(got, owned.map(|n| n as f64), "{labels:?}");
        }
    }
    // Nothing else: reasons × places, three states, one sample per gauge.
    let samples: usize = families.values().map(|(_, _, s)| s.len()).sum();
    assert_eq!(samples, 4 + 30 + 3 + 6, "{families:#?}");
}

fn sweep_with_metrics(node: &Node, file: &Path, args: &[&str]) -> (Value, Families) {
    let mut argv = vec!["--json", "--metrics-file", file.to_str().unwrap()];
    argv.extend_from_slice(args);
    let before = unix_now();
    let out = node.sweep(&argv);
    let after = unix_now();
    assert_ok(&out, &format!("sweep {argv:?}"));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let families = parse(file);
    check_sweep(&families, &report, before, after);
    (report, families)
}

/// A dead container's rules swept, with a live container beside it; then `sweep --all`, whose
/// uninstall counts per backend and family are the rules the first sweep said it left.
/// doctor, run while the dead container's manifest is there, counts its findings the same
/// as its JSON.
#[test]
fn sweep_and_doctor_metrics_equal_their_json_reports() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        node.warm_up();
        let live = node.topo.spawn_sleeper(&c.ns);
        node.create("live", Some(live), &[("io.natledger.ports", "8080:80")]);
        let node_ns = node.topo.node().to_string();
        let dead = node.topo.spawn_sleeper(&node_ns);
        let ip = ("io.natledger.ip", "10.77.0.9,fd77::9");
        node.create(
            "dead",
            Some(dead),
            &[("io.natledger.ports", "9090:90,9091:91/udp"), ip],
        );
        kill_pid(dead);
        let dir = node.dir.path().join("node-exporter");
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("natledger.prom");

        // doctor: the dead container's manifest is a finding.
        let doctor_file = dir.join("doctor.prom");
        let before = unix_now();
        let out = node.natledger(
            &[
                "doctor",
                "--json",
                "--metrics-file",
                doctor_file.to_str().unwrap(),
            ],
            "",
            &[],
        );
        let after = unix_now();
        assert!(
            matches!(out.status.code(), Some(0..=2)),
            "doctor: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let families = parse(&doctor_file);
        check_documented(&families);
        let findings = report["findings"].as_array().unwrap();
        assert!(!findings.is_empty(), "{backend:?}: {report:#}");
        let (_, _, samples) = &families["natledger_doctor_last_findings"];
        assert_eq!(samples.len(), 8 * 3);
        for (labels, got) in samples {
            let n = findings
                .iter()
                .filter(|f| f["kind"] == labels["kind"] && f["severity"] == labels["severity"])
                .count();
            assert_eq!(*got, n as f64, "{labels:?}");
        }
        assert_eq!(
            samples.iter().map(|(_, v)| v).sum::<f64>(),
            findings.len() as f64
        );
        let one = |name: &str| value(&families, name, &[]).unwrap();
        assert_eq!(
            one("natledger_doctor_last_rules_read"),
            report["rules_read"].as_f64().unwrap()
        );
        assert_eq!(
            one("natledger_doctor_last_complete"),
            if report["complete"] == true { 1.0 } else { 0.0 }
        );
        assert_eq!(
            one("natledger_doctor_last_duration_seconds"),
            report["duration_seconds"].as_f64().unwrap()
        );
        let ts = one("natledger_doctor_last_run_timestamp_seconds");
        assert!(before <= ts && ts <= after);

        // The sweep removes the dead container's rules.
        let (report, families) = sweep_with_metrics(&node, &file, &[]);
        let removed: f64 = families["natledger_sweep_last_rules_removed"]
            .2
            .iter()
            .filter(|(l, _)| l["reason"] == "dead-container" && l["backend"] == backend.name())
            .map(|(_, v)| v)
            .sum();
        let per_mapping = if backend.is_iptables() { 7.0 } else { 5.0 };
        assert_eq!(removed, 2.0 * per_mapping, "{report:#}");
        assert_eq!(
            value(&families, "natledger_sweep_last_manifests_removed", &[]),
            Some(1.0)
        );
        let alive = [("state", "alive")];
        let containers = "natledger_sweep_last_containers";
        assert_eq!(value(&families, containers, &alive), Some(1.0));
        assert!(!node.manifest_exists("dead") && node.manifest_exists("live"));
        // Only this backend holds natledger's rules.
        let owned = &families["natledger_sweep_last_rules_owned"].2;
        for (labels, n) in owned {
            assert_eq!(*n > 0.0, labels["backend"] == backend.name(), "{owned:?}");
        }

        // --all removes exactly what the sweep said was left.
        let (_, all) = sweep_with_metrics(&node, &file, &["--all"]);
        for (labels, n) in owned {
            let uninstalled = value(
                &all,
                "natledger_sweep_last_rules_removed",
                &[
                    ("reason", "uninstall"),
                    ("backend", &labels["backend"]),
                    ("family", &labels["family"]),
                ],
            );
            assert_eq!(uninstalled, Some(*n), "{labels:?}");
        }
        assert!(
            all["natledger_sweep_last_rules_owned"]
                .2
                .iter()
                .all(|(_, n)| *n == 0.0)
        );
        // Replaced whole: no temp file beside it.
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["doctor.prom", "natledger.prom"]);
        kill_pid(live);
    });
}

/// No textfile directory (no node_exporter here): the sweep does its work and succeeds, says
/// so once on stderr, and creates nothing.
#[test]
fn a_missing_metrics_directory_is_a_warning_and_creates_nothing() {
    let node = Node::new(Backend::IptablesNft);
    let missing = node.dir.path().join("no-such-dir");
    let file = missing.join("natledger.prom");
    let out = node.sweep(&["--metrics-file", file.to_str().unwrap()]);
    assert_ok(&out, "sweep");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: metrics not written") && stderr.contains("no-such-dir"),
        "{stderr}"
    );
    assert!(!missing.exists());
    // A dry run changes nothing, the metrics file included: refused together.
    let out = node.sweep(&["--dry-run", "--metrics-file", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
}

/// Label values with every character the format escapes, written by the library and read back
/// by prometheus_client: the same values.
#[test]
fn escaped_label_values_parse_back_to_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.prom");
    let values = [
        "plain",
        "back\\slash",
        "quote\"d",
        "new\nline",
        "all \\\"\n three",
        "ünïcode, {braces}=,",
        "",
    ];
    let mut e = Exposition::new();
    let family = e.gauge(
        "natledger_test_escapes",
        "Help with \\ and \"quotes\".\nNext.",
    );
    for (i, v) in values.iter().enumerate() {
        family.sample(&[("value", v), ("i", &i.to_string())], i as f64 + 0.5);
    }
    write(&path, &e.render()).unwrap();
    let families = parse(&path);
    let (kind, help, samples) = &families["natledger_test_escapes"];
    assert_eq!(kind, "gauge");
    assert_eq!(help, "Help with \\ and \"quotes\".\nNext.");
    assert_eq!(samples.len(), values.len());
    for (i, v) in values.iter().enumerate() {
        let (labels, value) = &samples[i];
        assert_eq!(labels["value"], *v);
        assert_eq!(*value, i as f64 + 0.5);
    }
}

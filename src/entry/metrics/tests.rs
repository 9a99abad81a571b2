use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::backend::Backend;
use crate::model::family::Family as IpFamily;
use crate::ops::sweep::{Reason, Removed, SweepOptions, SweepReport, TableReport, TableState};

#[test]
fn label_values_escape_backslash_quote_and_newline_only() {
    assert_eq!(escape_label_value(r#"a\b"c"#), r#"a\\b\"c"#);
    assert_eq!(escape_label_value("x\ny"), r"x\ny");
    assert_eq!(
        escape_label_value("tab\there ünïcode {}=,"),
        "tab\there ünïcode {}=,"
    );
    assert_eq!(escape_help("a \"b\" c\\d\ne"), "a \"b\" c\\\\d\\ne");
}

#[test]
fn values_are_spelled_as_the_format_says() {
    assert_eq!(format_value(0.0), "0");
    assert_eq!(format_value(42.0), "42");
    assert_eq!(format_value(-3.0), "-3");
    assert_eq!(format_value(0.25), "0.25");
    assert_eq!(format_value(1.7e9 + 0.5), "1700000000.5");
    assert_eq!(format_value(f64::NAN), "NaN");
    assert_eq!(format_value(f64::INFINITY), "+Inf");
    assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
}

#[test]
fn an_exposition_renders_help_type_and_samples_in_order() {
    let mut e = Exposition::new();
    e.gauge("natledger_test_things", "Things, \"quoted\".\nTwo lines.")
        .sample(&[("kind", "a\"b"), ("where", "c\\d\ne")], 2.0)
        .sample(&[("kind", "plain"), ("where", "")], 0.5);
    e.counter("natledger_test_events_total", "Events.")
        .sample(&[], 7.0);
    e.gauge("natledger_test_empty", "No sample.");
    assert_eq!(
        e.render(),
        "# HELP natledger_test_things Things, \"quoted\".\\nTwo lines.\n\
         # TYPE natledger_test_things gauge\n\
         natledger_test_things{kind=\"a\\\"b\",where=\"c\\\\d\\ne\"} 2\n\
         natledger_test_things{kind=\"plain\",where=\"\"} 0.5\n\
         # HELP natledger_test_events_total Events.\n\
         # TYPE natledger_test_events_total counter\n\
         natledger_test_events_total 7\n\
         # HELP natledger_test_empty No sample.\n\
         # TYPE natledger_test_empty gauge\n"
    );
}

#[test]
#[should_panic(expected = "twice")]
fn a_family_name_is_used_once() {
    let mut e = Exposition::new();
    e.gauge("natledger_x", "x");
    e.gauge("natledger_x", "x");
}

#[test]
fn names_follow_the_conventions() {
    assert!(valid_metric_name("natledger_a:b_1"));
    assert!(
        !valid_metric_name("1natledger") && !valid_metric_name("a-b") && !valid_metric_name("")
    );
    assert!(valid_label_name("reason") && !valid_label_name("__name") && !valid_label_name("a-b"));
    // With --repair: every series a sweep can write.
    let report = SweepReport::new(&SweepOptions {
        repair: true,
        ..SweepOptions::default()
    });
    let doctor = crate::analysis::doctor::Report {
        sources: Vec::new(),
        rules_read: 0,
        complete: true,
        findings: Vec::new(),
        not_followed: Vec::new(),
        duration_seconds: 0.0,
    };
    let sweep = super::sweep(&report, UNIX_EPOCH);
    let doctor = super::doctor(&doctor, UNIX_EPOCH);
    for (command, e) in [("sweep", sweep), ("doctor", doctor)] {
        for name in e.names() {
            // One run per file: gauges of the last run, in base units.
            assert!(
                name.starts_with(&format!("natledger_{command}_last_")),
                "{name}"
            );
            assert!(!name.ends_with("_total"), "{name}");
            for unit in ["_ms", "_milliseconds", "_minutes", "_bytes_kb"] {
                assert!(!name.contains(unit), "{name}");
            }
        }
        for f in &e.families {
            assert_eq!(f.kind, Type::Gauge, "{}", f.name);
            let seconds = f.name.contains("duration") || f.name.contains("timestamp");
            assert_eq!(seconds, f.name.ends_with("_seconds"), "{}", f.name);
        }
    }
}

fn removed(reason: Reason) -> Removed {
    Removed {
        chain: "NATLEDGER-HOSTPORTS".into(),
        rule: vec!["-j".into(), "ACCEPT".into()],
        reason,
        container: None,
    }
}

#[test]
fn sweep_series_count_removals_per_reason_and_owned_rules_per_backend() {
    let mut report = SweepReport::new(&SweepOptions::default());
    report.duration_seconds = 0.125;
    report.errors.push("one".into());
    let (v4, v6) = (IpFamily::Ipv4, IpFamily::Ipv6);
    let mut nat = TableReport::new(Backend::IptablesNft, v4, "nat").with_state(TableState::Swept);
    nat.rules_removed = vec![
        removed(Reason::DeadContainer),
        removed(Reason::DeadContainer),
        removed(Reason::Orphan),
    ];
    nat.rules_owned_after = Some(4);
    let mut filter = TableReport::new(Backend::IptablesNft, v4, "filter");
    filter.rules_removed = vec![removed(Reason::DeadContainer)];
    filter.rules_owned_after = Some(3);
    let absent =
        TableReport::new(Backend::IptablesLegacy, v6, "nat").with_state(TableState::Absent);
    let failed = TableReport::new(Backend::OwnNftables, v4, "nat").failed("no".into());
    let fine = TableReport::new(Backend::OwnNftables, v4, "filter").with_state(TableState::Absent);
    report.tables = vec![nat, filter, absent, failed, fine];
    let text = super::sweep(&report, UNIX_EPOCH + Duration::from_millis(1_500)).render();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    for expected in [
        "natledger_sweep_last_run_timestamp_seconds 1.5",
        "natledger_sweep_last_duration_seconds 0.125",
        "natledger_sweep_last_errors 1",
        "natledger_sweep_last_rules_removed{reason=\"dead-container\",backend=\"nft\",family=\"ipv4\"} 3",
        "natledger_sweep_last_rules_removed{reason=\"orphan\",backend=\"nft\",family=\"ipv4\"} 1",
        "natledger_sweep_last_rules_removed{reason=\"stale-chain\",backend=\"nft\",family=\"ipv4\"} 0",
        "natledger_sweep_last_rules_removed{reason=\"uninstall\",backend=\"legacy\",family=\"ipv6\"} 0",
        "natledger_sweep_last_manifests_removed 0",
        "natledger_sweep_last_containers{state=\"alive\"} 0",
        "natledger_sweep_last_containers{state=\"unreadable\"} 0",
        "natledger_sweep_last_rules_owned{backend=\"nft\",family=\"ipv4\"} 7",
        "natledger_sweep_last_rules_owned{backend=\"legacy\",family=\"ipv6\"} 0",
    ] {
        assert!(lines.contains(&expected), "{expected}\n{text}");
    }
    // Three places, five reasons each.
    let per_reason = lines
        .iter()
        .filter(|l| l.contains("rules_removed{"))
        .count();
    assert_eq!(per_reason, 15, "{text}");
    // The nftables/ipv4 nat table failed: how many rules it holds is not known.
    assert!(!text.contains("rules_owned{backend=\"nftables\""), "{text}");
}

#[test]
fn doctor_series_count_every_kind_and_severity() {
    let finding = |kind, severity| crate::analysis::doctor::Finding {
        severity,
        kind,
        port: None,
        protocol: None,
        summary: String::new(),
        rules: Vec::new(),
        evidence: Vec::new(),
        fix: None,
    };
    use crate::analysis::doctor::{Kind, Severity};
    let report = crate::analysis::doctor::Report {
        sources: Vec::new(),
        rules_read: 12,
        complete: false,
        findings: vec![
            finding(Kind::DeadTarget, Severity::Error),
            finding(Kind::DeadTarget, Severity::Error),
            finding(Kind::Shadowed, Severity::Warning),
        ],
        not_followed: Vec::new(),
        duration_seconds: 2.0,
    };
    let text = super::doctor(&report, UNIX_EPOCH).render();
    for expected in [
        "natledger_doctor_last_findings{kind=\"dead-target\",severity=\"error\"} 2\n",
        "natledger_doctor_last_findings{kind=\"shadowed\",severity=\"warning\"} 1\n",
        "natledger_doctor_last_findings{kind=\"localhost-exposed\",severity=\"info\"} 0\n",
        "natledger_doctor_last_rules_read 12\n",
        "natledger_doctor_last_complete 0\n",
        "natledger_doctor_last_duration_seconds 2\n",
    ] {
        assert!(text.contains(expected), "{expected}\n{text}");
    }
    let findings = text
        .lines()
        .filter(|l| l.starts_with("natledger_doctor_last_findings{"));
    assert_eq!(findings.count(), Kind::ALL.len() * Severity::ALL.len());
}

#[test]
fn the_file_is_replaced_whole_and_no_temp_file_stays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("natledger.prom");
    std::fs::write(&path, "old\n").unwrap();
    assert_eq!(write(&path, "new\n").unwrap(), Written::Replaced);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["natledger.prom"]);
}

#[test]
fn a_missing_directory_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("node-exporter");
    let path = missing.join("natledger.prom");
    assert_eq!(
        write(&path, "x\n").unwrap(),
        Written::NoDirectory(missing.clone())
    );
    assert!(!missing.exists());
    // A directory natledger cannot write in is an error that names the path.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let err = write(&file.join("x.prom"), "x\n").unwrap_err();
    assert!(err.to_string().contains("a-file"), "{err}");
}

/// `--repair`: what was put back, per backend, family and table; a sweep without it writes
/// no such series.
#[test]
fn a_repair_reports_the_rules_put_back_per_table() {
    use crate::ops::sweep::Restored;
    let opts = SweepOptions {
        repair: true,
        ..SweepOptions::default()
    };
    let mut report = SweepReport::new(&opts);
    let mut nat = TableReport::new(Backend::IptablesLegacy, IpFamily::Ipv6, "nat");
    nat.rules_restored = vec![
        Restored {
            chain: "NATLEDGER-HOSTPORTS".into(),
            rule: vec!["-j".into(), "ACCEPT".into()],
            container: Some("c1".parse().unwrap()),
        };
        2
    ];
    report.tables = vec![
        nat,
        TableReport::new(Backend::IptablesNft, IpFamily::Ipv4, "filter"),
    ];
    let text = super::sweep(&report, UNIX_EPOCH).render();
    for expected in [
        "natledger_sweep_last_rules_restored{backend=\"legacy\",family=\"ipv6\",table=\"nat\"} 2",
        "natledger_sweep_last_rules_restored{backend=\"nft\",family=\"ipv4\",table=\"filter\"} 0",
    ] {
        assert!(text.lines().any(|l| l == expected), "{expected}\n{text}");
    }
    report.repair = false;
    let text = super::sweep(&report, UNIX_EPOCH).render();
    assert!(!text.contains("restored"), "{text}");
}

//! The manifest format, the lock, and the state directory.

use super::*;

/// The manifest format is an interface (README, sweep of older versions): pin it.
const MANIFEST_V1: &str = r#"{
  "schema": 1,
  "container_id": "c0ffee",
  "bundle": "/var/lib/ctr/c0ffee",
  "pid": 4242,
  "pid_start_time": 123456,
  "boot_id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
  "pid_namespace": 4026531836,
  "phase": "installed",
  "mappings": [
    {
      "host_ports": {
        "start": 8080,
        "end": 8080
      },
      "container_ports": {
        "start": 80,
        "end": 80
      },
      "protocol": "tcp"
    }
  ],
  "addresses": [
    "10.77.0.2"
  ],
  "rules": [
    {
      "backend": "nft",
      "family": "ipv4",
      "table": "nat",
      "chain": "NATLEDGER-HOSTPORTS",
      "rule": [
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        "8080",
        "-m",
        "comment",
        "--comment",
        "natledger:c0ffee",
        "-j",
        "DNAT",
        "--to-destination",
        "10.77.0.2:80"
      ]
    }
  ]
}
"#;

fn sample() -> Manifest {
    Manifest {
        schema: SCHEMA,
        container_id: "c0ffee".parse().unwrap(),
        bundle: Some("/var/lib/ctr/c0ffee".into()),
        pid: Some(4242),
        pid_start_time: Some(123456),
        boot_id: Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into()),
        pid_namespace: Some(4026531836),
        phase: Phase::Installed,
        mappings: crate::portspec::parse_mappings("8080:80").unwrap(),
        addresses: vec!["10.77.0.2".parse().unwrap()],
        rules: vec![RuleRecord {
            backend: Backend::Nft,
            family: Family::Ipv4,
            table: "nat".into(),
            chain: "NATLEDGER-HOSTPORTS".into(),
            rule: "-p tcp -m tcp --dport 8080 -m comment --comment natledger:c0ffee -j DNAT \
                       --to-destination 10.77.0.2:80"
                .split_whitespace()
                .map(String::from)
                .collect(),
        }],
        netns: None,
        pod: None,
        shares: Vec::new(),
        shared_by: Vec::new(),
    }
}

#[test]
fn manifest_format_is_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path());
    let locked = ledger.lock().unwrap();
    locked.store(&sample()).unwrap();
    let path = ledger.manifest_path(&"c0ffee".parse().unwrap());
    assert_eq!(fs::read_to_string(&path).unwrap(), MANIFEST_V1);
    let read: Manifest = serde_json::from_str(MANIFEST_V1).unwrap();
    assert_eq!(read, sample());
    // Manifests written before the boot id was recorded still read.
    let older: String = MANIFEST_V1
        .lines()
        .filter(|l| !l.contains("boot_id") && !l.contains("pid_namespace"))
        .collect();
    let read: Manifest = serde_json::from_str(&older).unwrap();
    assert_eq!((read.boot_id, read.pid_namespace), (None, None));
}

#[test]
fn a_child_keeps_the_lock_after_its_parent_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path());
    let locked = ledger.lock().unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("0.5")
        .spawn()
        .unwrap();
    drop(locked);
    let other = File::open(dir.path().join("lock")).unwrap();
    assert!(
        other.try_lock_exclusive().is_err(),
        "the child still holds it"
    );
    child.wait().unwrap();
    assert!(other.try_lock_exclusive().is_ok());
}

#[test]
fn store_list_remove() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path());
    assert!(ledger.list().unwrap().is_empty());
    let locked = ledger.lock().unwrap();
    locked.store(&sample()).unwrap();
    let id: ContainerId = "c0ffee".parse().unwrap();
    assert!(ledger.has_manifest(&id));
    assert_eq!(ledger.load(&id).unwrap().unwrap(), sample());
    fs::write(ledger.containers().join("broken.json"), "{").unwrap();
    fs::write(ledger.containers().join(".x.tmp"), "{").unwrap();
    let all = ledger.list().unwrap();
    assert_eq!(all.len(), 2);
    assert!(matches!(all[0], Err(LedgerError::Corrupt { .. })));
    let scan = ledger.scan().unwrap();
    assert_eq!(scan.temps, [ledger.containers().join(".x.tmp")]);
    assert_eq!(scan.manifests[0].id, Some("broken".parse().unwrap()));
    assert!(locked.remove_files(&scan.temps).is_empty());
    assert!(ledger.scan().unwrap().temps.is_empty());
    assert_eq!(locked.remove_files(&["/etc/passwd".into()]).len(), 1);
    locked.remove(&id).unwrap();
    locked.remove(&id).unwrap();
    assert!(ledger.load(&id).unwrap().is_none());
}

#[test]
fn a_newer_schema_is_refused_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path());
    drop(ledger.lock().unwrap());
    fs::write(ledger.containers().join("x.json"), r#"{"schema": 2}"#).unwrap();
    let err = ledger.load(&"x".parse().unwrap()).unwrap_err();
    assert!(err.to_string().contains("schema 2"), "{err}");
}

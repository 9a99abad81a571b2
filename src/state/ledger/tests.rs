//! The manifest format, the lock, and the state directory.

use super::*;
use crate::model::backend_name::Backend;
use crate::model::family::Family;
use std::os::unix::fs::OpenOptionsExt;

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

pub(crate) fn sample() -> Manifest {
    Manifest {
        schema: SCHEMA,
        container_id: "c0ffee".parse().unwrap(),
        bundle: Some("/var/lib/ctr/c0ffee".into()),
        pid: Some(4242),
        pid_start_time: Some(123456),
        boot_id: Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into()),
        pid_namespace: Some(4026531836),
        phase: Phase::Installed,
        mappings: crate::model::portspec::parse_mappings("8080:80").unwrap(),
        addresses: vec!["10.77.0.2".parse().unwrap()],
        rules: vec![RuleRecord::parse(
            Backend::IptablesNft,
            Family::Ipv4,
            "nat",
            "NATLEDGER-HOSTPORTS",
            "-p tcp -m tcp --dport 8080 -m comment --comment natledger:c0ffee -j DNAT \
                       --to-destination 10.77.0.2:80"
                .split_whitespace()
                .map(String::from)
                .collect(),
        )],
        netns: None,
        pod: None,
        shares: Vec::new(),
        shared_by: Vec::new(),
        stacked_on: Vec::new(),
        cni: None,
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

/// Run `f` on a thread and give up on it after 5 s: a hang is a failure, not a stuck test.
fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("blocked for 5 s")
}

/// A symlink planted where the temp file goes is replaced, never written through.
#[test]
fn a_planted_temp_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path().join("state"));
    let locked = ledger.lock().unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, "root's file\n").unwrap();
    std::os::unix::fs::symlink(&victim, ledger.containers().join(".c0ffee.tmp")).unwrap();
    locked.store(&sample()).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "root's file\n");
    assert_eq!(
        ledger.load(&"c0ffee".parse().unwrap()).unwrap(),
        Some(sample())
    );
    // A planted manifest link is not read either.
    let id: ContainerId = "linked".parse().unwrap();
    std::os::unix::fs::symlink(&victim, ledger.manifest_path(&id)).unwrap();
    let e = crate::causes::text(&ledger.load(&id).unwrap_err());
    assert!(e.contains("symlink"), "{e}");
}

/// A lock file that is a symlink to a FIFO (or a FIFO) is refused at once, not waited on.
#[test]
fn a_fifo_lock_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    drop(Ledger::new(&state).lock().unwrap());
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    fs::remove_file(state.join("lock")).unwrap();
    std::os::unix::fs::symlink(&fifo, state.join("lock")).unwrap();
    let s = state.clone();
    let e = within_5s(move || crate::causes::text(&Ledger::new(s).lock().map(drop).unwrap_err()));
    assert!(e.contains("symlink") && e.contains("lock"), "{e}");
    fs::remove_file(state.join("lock")).unwrap();
    nix::unistd::mkfifo(
        &state.join("lock"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    // A reader, so that the open itself succeeds and only the file type is wrong.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(state.join("lock"))
        .unwrap();
    let s = state.clone();
    let e = within_5s(move || crate::causes::text(&Ledger::new(s).lock().map(drop).unwrap_err()));
    assert!(e.contains("not a regular file (a FIFO)"), "{e}");
}

/// The state directory is created 0700; one another user owns, or that group or others can
/// write, is refused naming the path, the owner and the mode (sshd's StrictModes).
#[test]
fn an_unsafe_state_directory_is_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ledger = Ledger::new(&state);
    drop(ledger.lock().unwrap());
    for d in [&state, &ledger.containers()] {
        assert_eq!(
            fs::metadata(d).unwrap().mode() & 0o7777,
            0o700,
            "{}",
            d.display()
        );
    }
    let chmod = |d: &Path, m| fs::set_permissions(d, fs::Permissions::from_mode(m)).unwrap();
    for (d, mode) in [(&state, 0o777), (&ledger.containers(), 0o770)] {
        chmod(d, mode);
        let e = crate::causes::text(&ledger.lock().map(drop).unwrap_err());
        let shown = format!("{mode:04o}");
        assert!(
            e.contains(&d.display().to_string()) && e.contains(&shown),
            "{e}"
        );
        assert!(ledger.list().is_err());
        chmod(d, 0o700);
    }
    std::os::unix::fs::chown(&state, Some(65534), None).unwrap();
    let e = crate::causes::text(&ledger.lock().map(drop).unwrap_err());
    assert!(e.contains("uid 65534") && e.contains("another user"), "{e}");
    assert!(ledger.load(&"x".parse().unwrap()).is_err());
    // The directory natledger would create its state directory in is checked too.
    let open = dir.path().join("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let e = Ledger::new(open.join("state"))
        .lock()
        .map(drop)
        .unwrap_err();
    assert!(crate::causes::text(&e).contains("0777"), "{e}");
    assert!(!open.join("state").exists());
}

/// A manifest whose container_id is not its file name's is not acted on as that container's.
#[test]
fn a_manifest_under_another_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path());
    drop(ledger.lock().unwrap());
    let id: ContainerId = "intruder".parse().unwrap();
    fs::write(ledger.manifest_path(&id), MANIFEST_V1).unwrap();
    let e = ledger.load(&id).unwrap_err();
    assert!(matches!(e, LedgerError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains("c0ffee"), "{e}");
}

/// A state directory that is itself root's and 0700, under a directory someone else owns or
/// can write (or reached through a symlink kept in one): refused, naming that directory,
/// since its writer can rename the state directory away and plant its own. The same state
/// directory under safe parents is used.
#[test]
fn a_state_directory_under_an_unsafe_parent_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let chmod = |p: &std::path::Path, m| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    let parent = root.path().join("parent");
    let state = parent.join("natledger");
    std::fs::create_dir_all(&state).unwrap();
    chmod(&state, 0o700);
    Ledger::new(&state).lock().expect("safe parents");
    let refused = |ledger: Ledger, what: &str, culprit: &std::path::Path| {
        let e = ledger
            .lock()
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        let text = e.to_string();
        assert!(
            text.contains(&format!("under {}", culprit.display())),
            "{what}: {text}"
        );
    };
    std::os::unix::fs::chown(&parent, Some(65534), None).unwrap();
    refused(Ledger::new(&state), "a parent owned by uid 65534", &parent);
    std::os::unix::fs::chown(&parent, Some(0), None).unwrap();
    chmod(&parent, 0o777);
    refused(Ledger::new(&state), "a parent writable by all", &parent);
    chmod(&parent, 0o755);
    // A symlink to the safe parent, kept in a directory others can write.
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    std::os::unix::fs::symlink(&parent, open.join("link")).unwrap();
    refused(
        Ledger::new(open.join("link").join("natledger")),
        "a symlink in a directory writable by all",
        &open,
    );
    // The same symlink in a safe directory: followed and used.
    chmod(&open, 0o755);
    Ledger::new(open.join("link").join("natledger"))
        .lock()
        .expect("a symlink in a safe directory");
}

/// A state directory an older release created 0755 is used (not refused: every hook would
/// fail after an upgrade) and brought to 0700 with its containers directory.
#[test]
fn a_state_directory_from_an_older_release_is_tightened_to_0700() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("natledger");
    let containers = state.join("containers");
    std::fs::create_dir_all(&containers).unwrap();
    for d in [&state, &containers] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    drop(
        Ledger::new(&state)
            .lock()
            .expect("an older release's 0755 state directory"),
    );
    for d in [&state, &containers] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    assert_eq!(
        fs::read_to_string(state.join(owner::MARKER)).unwrap(),
        owner::MARKER_TEXT
    );
}

/// A directory that is not natledger's (files of another program, or an older release's
/// names holding another program's JSON) is refused by every entry, nothing changed in it;
/// an empty one is adopted without a chmod; a marked one is used whatever else is in it.
#[test]
fn only_a_directory_natledger_made_is_used() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let mode = |d: &Path| fs::metadata(d).unwrap().permissions().mode() & 0o7777;
    let chmod = |d: &Path, m| fs::set_permissions(d, fs::Permissions::from_mode(m)).unwrap();
    let etc = root.path().join("etc");
    fs::create_dir_all(etc.join("containers")).unwrap();
    fs::write(etc.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
    fs::write(etc.join("containers/policy.json"), r#"{"default": []}"#).unwrap();
    let looks_older = root.path().join("looks-older");
    fs::create_dir_all(looks_older.join("containers")).unwrap();
    fs::write(
        looks_older.join("containers/policy.json"),
        r#"{"default": []}"#,
    )
    .unwrap();
    for (dir, why) in [
        (&etc, "it holds \"passwd\""),
        (
            &looks_older,
            "containers/\"policy.json\" is not a natledger manifest",
        ),
    ] {
        chmod(dir, 0o755);
        let ledger = Ledger::new(dir);
        for e in [
            ledger.lock().map(drop).unwrap_err(),
            ledger.list().map(drop).unwrap_err(),
            ledger
                .load(&"policy".parse().unwrap())
                .map(drop)
                .unwrap_err(),
        ] {
            assert!(matches!(e, LedgerError::NotOurs { .. }), "{e}");
            let text = e.to_string();
            assert!(text.contains(&format!("refusing state directory {}", dir.display())));
            assert!(text.contains(why), "{text}");
        }
        // `policy.json` is there: the caller goes on to the lock, which refuses.
        assert!(ledger.has_manifest(&"policy".parse().unwrap()));
        assert_eq!(mode(dir), 0o755);
        assert!(!dir.join("lock").exists() && !dir.join(owner::MARKER).exists());
    }
    // Empty: adopted as it is.
    let empty = root.path().join("empty");
    fs::create_dir(&empty).unwrap();
    chmod(&empty, 0o755);
    let ledger = Ledger::new(&empty);
    assert!(ledger.list().unwrap().is_empty());
    assert!(!ledger.has_manifest(&"c1".parse().unwrap()));
    drop(ledger.lock().unwrap());
    assert_eq!(mode(&empty), 0o755);
    assert_eq!(mode(&empty.join("containers")), 0o700);
    assert!(empty.join(owner::MARKER).exists());
    // Marked: natledger's, whatever an operator left beside its files.
    fs::write(empty.join("notes"), "x").unwrap();
    drop(ledger.lock().unwrap());
    assert_eq!(mode(&empty), 0o755);
    // A marker that is not natledger's text is not natledger's.
    fs::write(empty.join(owner::MARKER), "other\n").unwrap();
    let e = ledger.lock().map(drop).unwrap_err();
    assert!(e.to_string().contains("not natledger's marker"), "{e}");
}

/// A CNI attachment's manifest (ledger id `cid+eth0`, no pid) whose namespace was `netns` at
/// `netns_path`.
pub(crate) fn cni_sample(cid: &str, netns_path: &Path, netns: Option<NetnsId>) -> Manifest {
    Manifest {
        container_id: format!("{cid}+eth0").parse().unwrap(),
        bundle: None,
        pid: None,
        pid_start_time: None,
        pid_namespace: None,
        boot_id: Some(crate::kernel::machine::fake::BOOT_ID.into()),
        netns,
        cni: Some(CniAttachment {
            container_id: cid.to_string(),
            ifname: "eth0".to_string(),
            network: "podman".to_string(),
            netns_path: Some(netns_path.to_path_buf()),
            deleted: false,
        }),
        ..sample()
    }
}

#[test]
fn an_attachment_is_shown_by_network_ifname_and_container() {
    use crate::kernel::machine::fake::{FakeHost, netns};
    let net = Path::new("/run/netns/cni-1");
    let host = FakeHost::default().with_namespace("/run/netns/cni-1", netns(1));
    let m = cni_sample("abc", net, Some(netns(1)));
    assert_eq!(m.origin(), "cni net=podman ifname=eth0 container=abc");
    assert_eq!(sample().origin(), "pid 4242");
    let odd = CniAttachment {
        ifname: "e th0".to_string(),
        ..m.cni.clone().unwrap()
    };
    assert_eq!(
        odd.to_string(),
        r#"cni net=podman ifname="e th0" container=abc"#,
        "a value that is not one plain word is quoted"
    );
    // Its liveness is its namespace's: alive while the path names the recorded one, dead
    // once it is gone or names another; no identity recorded: cannot judge.
    assert!(m.alive(&host));
    assert!(!cni_sample("abc", net, Some(netns(2))).alive(&host));
    let gone = Path::new("/run/netns/natledger-gone");
    assert!(!cni_sample("abc", gone, m.netns).alive(&host));
    assert!(cni_sample("abc", gone, None).alive(&host));
    let earlier_boot = Manifest {
        boot_id: Some("another-boot".into()),
        ..m.clone()
    };
    assert!(
        !earlier_boot.alive(&host),
        "a namespace seen in another boot"
    );
}

/// A hook container's manifest without a pid (an older release accepted such a create) is
/// dead: nothing could ever show it gone. A CNI attachment has no pid and is judged by its
/// namespace; one whose namespace could not be recorded still cannot be judged.
#[test]
fn a_container_without_a_pid_is_dead_but_an_attachment_is_judged_by_its_namespace() {
    use crate::kernel::machine::fake::{FakeHost, netns};
    let host = FakeHost::default().with_namespace("/run/netns/cni-1", netns(1));
    for pid in [None, Some(0), Some(-1)] {
        let pidless = Manifest {
            pid,
            pid_start_time: None,
            netns: None,
            ..sample()
        };
        assert!(!pidless.alive(&host), "pid {pid:?}");
    }
    let net = Path::new("/run/netns/cni-1");
    assert!(cni_sample("abc", net, Some(netns(1))).alive(&host));
    assert!(cni_sample("abc", net, None).alive(&host));
}

/// Manifests an earlier release wrote (`tests/fixtures/manifests`, one per backend, and an
/// older layout's) are loaded, and stored again byte for byte.
#[test]
fn release_manifests_are_stored_again_byte_for_byte() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut fixtures: Vec<PathBuf> = fs::read_dir(root.join("manifests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    fixtures.push(root.join("state-dir-older/containers/c1.json"));
    assert!(fixtures.len() >= 4, "{fixtures:?}");
    for fixture in fixtures {
        let bytes = fs::read(&fixture).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path());
        let locked = ledger.lock().unwrap();
        let id: ContainerId = fixture
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let path = ledger.manifest_path(&id);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, &bytes).unwrap();
        let manifest = ledger.load(&id).unwrap().expect("the fixture loads");
        assert!(!manifest.rules.is_empty(), "{}", fixture.display());
        let text = manifest.rules.iter().find(|r| r.rule().is_none());
        assert!(text.is_none(), "{}: {text:?} not typed", fixture.display());
        fs::remove_file(&path).unwrap();
        locked.store(&manifest).unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            String::from_utf8(bytes).unwrap(),
            "{}",
            fixture.display()
        );
    }
}

/// A record that is not one natledger writes (edited by hand: another table, a rule it does
/// not parse as its own) loads as its text, is stored again as read, and has no typed rule.
#[test]
fn a_record_natledger_does_not_write_is_kept_as_text() {
    let record = |table: &str, args: &str| {
        let json = serde_json::json!({"backend": "nft", "family": "ipv4", "table": table,
            "chain": "NATLEDGER-HOSTPORTS", "rule": args.split_whitespace().collect::<Vec<_>>()});
        let read: RuleRecord = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(serde_json::to_value(&read).unwrap(), json);
        read
    };
    let dnat = "-p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT \
                --to-destination 10.77.0.2:80";
    assert_eq!(
        record("nat", dnat).table(),
        Some(crate::model::table::Table::Nat)
    );
    for (table, args) in [("mangle", dnat), ("nat", "-m bogus -j DNAT"), ("nat", "")] {
        let text = record(table, args);
        assert_eq!((text.table(), text.rule()), (None, None), "{args}");
        assert_eq!(text.table_name(), table);
        assert_eq!(text.args().join(" "), args);
    }
}

/// A namespace cookie is stored inside `netns`, beside its device and inode, and read back
/// by both readers (the manifest, and the summary of one past the cap); a `netns` without
/// one (an older manifest, a kernel before 5.14) stays without.
#[test]
fn a_namespace_cookie_is_stored_beside_device_and_inode() {
    use crate::kernel::machine::fake::{netns, netns_cookie};
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::new(dir.path());
    let locked = ledger.lock().unwrap();
    let net = Path::new("/run/netns/cni-1");
    for (recorded, json) in [
        (
            netns_cookie(1, 4097),
            r#""netns": {"dev": 4, "ino": 1, "cookie": 4097}"#,
        ),
        (netns(1), r#""netns": {"dev": 4, "ino": 1}"#),
    ] {
        let m = cni_sample("abc", net, Some(recorded));
        locked.store(&m).unwrap();
        let path = ledger.manifest_path(&m.container_id);
        let stored = fs::read_to_string(&path).unwrap();
        let flat: String = stored.split_whitespace().collect::<Vec<_>>().join(" ");
        let flat = flat.replace("{ ", "{").replace(" }", "}");
        assert!(flat.contains(json), "{stored}");
        let loaded = ledger.load(&m.container_id).unwrap().unwrap();
        assert_eq!(loaded.netns, Some(recorded));
        assert_eq!(summarize(&path).unwrap().manifest.netns, Some(recorded));
    }
}

//! install-cni's uninstall (what is switched back, when the binary is kept), its lock, and a
//! crash during an upgrade, over temp dirs.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;

/// Install then uninstall: the original bytes again, the backup, marker and binary gone.
#[test]
fn uninstall_restores_the_original_bytes() {
    let host = host();
    let text =
        "{\"plugins\":[{\"type\":\"port\\u006dap\"}],\"name\":\"x\",\"cniVersion\":\"1.0.0\"}";
    let escaped = host.write("10-escaped.conflist", text);
    let plain = host.write("20-containerd-net.conflist", CONTAINERD);
    let start = host.files();
    host.run(false);
    assert_eq!(
        fs::read_to_string(&escaped).unwrap(),
        text.replace("\"port\\u006dap\"", "\"natledger\"")
    );
    let report = host.run(true);
    assert_eq!(
        conflist_done(&report, &plain),
        Conflist::SwitchedBack { count: 1 }
    );
    assert_eq!(*binary_done(&report), Binary::Removed);
    assert_eq!(host.files(), start);
    // Again: nothing to do.
    let again = host.run(true);
    assert!(!again.changed(), "{again:?}");
    assert_eq!(conflist_done(&again, &plain), Conflist::NoNatledger);
    assert_eq!(*binary_done(&again), Binary::Absent);
}

/// Edits made since the install are kept: only the type goes back.
#[test]
fn uninstall_keeps_edits_made_since() {
    let host = host();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    host.run(false);
    let edited = fs::read_to_string(&path)
        .unwrap()
        .replace("10.88.0.0/16", "10.77.0.0/16");
    fs::write(&path, &edited).unwrap();
    host.run(true);
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        CONTAINERD.replace("10.88.0.0/16", "10.77.0.0/16")
    );
    assert!(!backup(&path).exists());
}

/// natledger put in a conflist by hand (no backup) is the operator's: uninstall leaves it; a
/// backup of a file switched back by someone else since goes.
#[test]
fn uninstall_switches_back_only_what_install_switched() {
    let host = host();
    let by_hand = CONTAINERD.replace("portmap", "natledger");
    let path = host.write("10-hand.conflist", &by_hand);
    let report = host.run(true);
    assert_eq!(conflist_done(&report, &path), Conflist::NotSwitchedHere);
    assert_eq!(fs::read_to_string(&path).unwrap(), by_hand);

    let host = self::host();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    host.run(false);
    fs::write(&path, CONTAINERD).unwrap();
    let report = host.run(true);
    assert_eq!(conflist_done(&report, &path), Conflist::StaleBackup);
    assert!(!backup(&path).exists());
    assert_eq!(fs::read_to_string(&path).unwrap(), CONTAINERD);
}

/// While the ledger records CNI attachments, uninstall switches back but keeps the binary
/// (their rules are removed by `natledger sweep` once they are gone) and says so; a later
/// uninstall removes it.
#[test]
fn uninstall_keeps_the_binary_while_attachments_are_recorded() {
    let host = host();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    host.run(false);
    let ledger = Ledger::new(&host.state);
    let manifest =
        crate::state::ledger::tests::cni_sample("pod1", Path::new("/run/netns/cni-1"), None);
    ledger.lock().unwrap().store(&manifest).unwrap();
    let report = host.run(true);
    assert_eq!(fs::read_to_string(&path).unwrap(), CONTAINERD);
    let Binary::Kept(why) = binary_done(&report) else {
        panic!("{report:?}")
    };
    assert!(
        why.contains("1 CNI attachment") && why.contains("natledger sweep"),
        "{why}"
    );
    assert!(report.lines.iter().any(|l| l.warning()));
    assert!(host.bin.join("natledger").exists());
    ledger
        .lock()
        .unwrap()
        .remove(&manifest.container_id)
        .unwrap();
    assert_eq!(*binary_done(&host.run(true)), Binary::Removed);
    assert!(!host.bin.join("natledger").exists());
    assert!(!host.bin.join(binary::MARKER).exists());
}

/// A conflist still naming natledger after the switch back (its backup gone, set by hand, a
/// link to one) keeps install-cni's binary: removing it would fail every ADD through it.
#[test]
fn uninstall_keeps_the_binary_while_a_conflist_still_names_it() {
    let host = host();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    host.run(false);
    fs::remove_file(backup(&path)).unwrap();
    let report = host.run(true);
    assert_eq!(conflist_done(&report, &path), Conflist::NotSwitchedHere);
    let Binary::Kept(why) = binary_done(&report) else {
        panic!("{report:?}")
    };
    assert!(why.contains(&path.display().to_string()), "{why}");
    assert!(host.bin.join("natledger").exists());
    // Switched back by the operator: the next uninstall removes it.
    fs::write(&path, CONTAINERD).unwrap();
    assert_eq!(*binary_done(&host.run(true)), Binary::Removed);

    // A symlinked conflist whose target (outside the conf dir) names natledger.
    let host = self::host();
    host.run(false);
    let target = host._dir.path().join("elsewhere.conflist");
    fs::write(&target, CONTAINERD.replace("portmap", "natledger")).unwrap();
    symlink(&target, host.conf("10-link.conflist")).unwrap();
    assert!(matches!(binary_done(&host.run(true)), Binary::Kept(_)));
    assert!(host.bin.join("natledger").exists());
}

/// Install makes the state directory; an uninstall that finds none (not the node's) keeps the
/// binary and says how to go on; once it is there (empty), the binary goes.
#[test]
fn uninstall_keeps_the_binary_when_the_state_directory_is_missing() {
    let host = host();
    host.run(false);
    assert!(host.state.is_dir());
    fs::remove_dir_all(&host.state).unwrap();
    let report = host.run(true);
    let Binary::Kept(why) = binary_done(&report) else {
        panic!("{report:?}")
    };
    assert!(
        why.contains("does not exist") && why.contains("mkdir"),
        "{why}"
    );
    assert!(host.bin.join("natledger").exists());
    fs::create_dir_all(&host.state).unwrap();
    assert_eq!(*binary_done(&host.run(true)), Binary::Removed);
}

/// A second run waits for the first one's lock (in the bin dir, never a plugin name) before it
/// writes anything.
#[test]
fn a_run_waits_for_another_runs_lock() {
    use fs2::FileExt;
    let host = host();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    let held = binary::lock(&host.bin).unwrap();
    let lock = host.bin.join(binary::LOCK);
    assert!(fs::File::open(&lock).unwrap().try_lock_exclusive().is_err());
    std::thread::scope(|scope| {
        let other = scope.spawn(|| host.run(false));
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!other.is_finished());
        assert!(!host.bin.join(binary::PLUGIN).exists());
        assert_eq!(fs::read_to_string(&path).unwrap(), CONTAINERD);
        drop(held);
        let report = other.join().unwrap();
        assert_eq!(*binary_done(&report), Binary::Installed);
    });
    assert!(fs::File::open(&lock).unwrap().try_lock_exclusive().is_ok());
}

/// A crash during an upgrade after the marker was written and before the rename leaves the old
/// binary claimed: the next run replaces it (and later uninstall removes it).
#[test]
fn a_crash_before_the_upgrades_rename_leaves_the_old_binary_claimed() {
    let host = host();
    host.run(false);
    fs::write(&host.exe, b"\x7fELF natledger build 2").unwrap();
    binary::stage_only(&host.bin, &host.exe).unwrap();
    let plugin = host.bin.join(binary::PLUGIN);
    assert_eq!(fs::read(&plugin).unwrap(), b"\x7fELF natledger build 1");
    assert_eq!(*binary_done(&host.run(false)), Binary::Installed);
    assert_eq!(fs::read(&plugin).unwrap(), b"\x7fELF natledger build 2");
    assert_eq!(*binary_done(&host.run(true)), Binary::Removed);
    assert!(!host.bin.join(binary::MARKER).exists());
    let leftovers: Vec<_> = fs::read_dir(&host.bin)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != binary::LOCK)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A state directory install cannot make (the DaemonSet's init container mounts none and has a
/// read-only root) does not fail the install: the first ADD makes it.
#[test]
fn an_install_that_cannot_make_the_state_directory_still_installs() {
    let host = host();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    let blocked = host._dir.path().join("a-file");
    fs::write(&blocked, b"").unwrap();
    let opts = Options {
        bin_dir: host.bin.clone(),
        conf_dir: host.conf.clone(),
        uninstall: false,
        source: host.exe.clone(),
    };
    let report = run(&opts, &Ledger::new(blocked.join("natledger"))).unwrap();
    assert_eq!(*binary_done(&report), Binary::Installed);
    assert_eq!(
        conflist_done(&report, &path),
        Conflist::Switched { count: 1 }
    );
}

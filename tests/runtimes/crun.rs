//! natledger with the real crun, used directly: bundles made by `crun spec`, a busybox httpd
//! container, the test's own network hook before natledger's hooks, and `natledger inject`
//! putting them into `config.json` (the host and bundles: tests/common/runc.rs).
//!
//! Debian 12's crun (1.8.1) refuses a hybrid cgroup host ("cgroups in hybrid mode not
//! supported"). Every crun command here therefore runs in a private mount namespace whose
//! `/sys/fs/cgroup` is a cgroup2 mount, with `--cgroup-manager=disabled` ([`CRUN_SH`]); the
//! mount namespace dies with the command. Only the node's network namespace is entered
//! (`nsenter --net`), so every rule lands in the node and the machine's own tables are never
//! touched. crun's state lives in a temporary `--root`, and a guard deletes every container a
//! test created.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use crate::common::*;

/// The mounts at `/sys/fs/cgroup` itself in this process's (the host's) mount namespace, as
/// "fstype source" (crun's cgroup2 mount must never show up here).
fn cgroup_mounts() -> Vec<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mountinfo
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == Some("/sys/fs/cgroup"))
        .filter_map(|l| l.split_once(" - ").map(|(_, fs)| fs.to_string()))
        .collect()
}

/// After container `id`'s delete: [`Host::assert_restored`] and [`Host::assert_closed`], no
/// process names the test's directory, and no mount is left, neither below the directory
/// nor at the host's `/sys/fs/cgroup` (`cgroups`: those mounts when the test began).
fn assert_nothing_left(host: &Host, cgroups: &[String], id: &str, what: &str) {
    let backend = host.node.backend;
    host.assert_restored(id, what);
    host.assert_closed(what);
    let dir = host.node.dir.path();
    let left = processes_naming(&dir.to_string_lossy());
    assert!(left.is_empty(), "{backend:?}: processes left: {left:#?}");
    let mounts = mounts_under(dir);
    assert!(mounts.is_empty(), "{backend:?}: mounts left: {mounts:?}");
    assert_eq!(
        cgroup_mounts(),
        cgroups,
        "{backend:?}: the host's mounts at /sys/fs/cgroup are as they were"
    );
}

/// After container `c` stopped (`why`) but before its delete: the node's dump is still
/// `running` (poststop runs at delete), and its manifest is there.
fn assert_kept(c: &Running, running: &str, why: &str) {
    let backend = c.host.node.backend;
    assert_eq!(
        c.host.node.dump(),
        running,
        "{backend:?}: {why} leaves the rules (poststop runs at delete)"
    );
    assert!(
        c.host.node.manifest_exists(&c.id),
        "{backend:?}: the manifest stays until delete after {why}"
    );
}

/// crun create (createRuntime: the manifest and the DNAT to the container's address are
/// there before the process starts) → crun start → the container's httpd answers on the
/// host port from the node (127.0.0.1, the node's IPv4 and IPv6 addresses) and from the
/// external client; crun kill → the container is stopped but its rules stay, the whole dump
/// unchanged, as does the manifest; crun delete (poststop) → every table in every backend
/// and both families is exactly as before, no manifest, the port closed, nothing left.
#[test]
fn crun_container_is_forwarded_and_its_rules_go_at_delete_not_at_kill() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let cgroups = cgroup_mounts();
        let host = Host::with(Runtime::Crun, backend);
        let bundle = host.bundle("web", 2);
        let started = Instant::now();
        let c = host.create("web", &bundle);
        assert_eq!(c.status(), "created", "{backend:?}");
        assert!(
            host.node.manifest_exists(&c.id),
            "{backend:?}: manifest at create"
        );
        host.assert_dnat(&c.id, 2, "at create");

        c.start();
        assert_eq!(c.status(), "running", "{backend:?}");
        host.assert_answers(2);
        eprintln!(
            "{backend:?}: crun create + start to every path answering: {:?}",
            started.elapsed()
        );

        let running = host.node.dump();
        c.kill();
        assert_kept(&c, &running, "crun kill");

        let id = c.id.clone();
        c.delete();
        assert_nothing_left(&host, &cgroups, &id, "crun delete (poststop)");
        eprintln!("{backend:?}: whole cycle {:?}", started.elapsed());
    });
}

/// A container whose process exits by itself (httpd in the background, the shell waiting
/// for `/www/stop`, which the test writes into the bundle's rootfs): once crun says it is
/// stopped its rules and manifest are still all there; `crun delete` removes them.
#[test]
fn crun_container_that_exits_keeps_its_rules_until_delete() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    both(|backend| {
        let cgroups = cgroup_mounts();
        let host = Host::with(Runtime::Crun, backend);
        let bundle = host.bundle("exits", 3);
        let path = bundle.join("config.json");
        let mut config = read_json(&path);
        config["process"]["args"] = json!([
            "/bin/sh",
            "-c",
            "httpd -p 80 -h /www && while [ ! -e /www/stop ]; do sleep 1; done"
        ]);
        write_json(&path, &config);
        let c = host.create("exits", &bundle);
        c.start();
        host.assert_answers(3);
        let running = host.node.dump();

        set_stop(&bundle);
        c.wait_stopped("/www/stop appeared");
        assert_kept(&c, &running, "the container's exit");

        let id = c.id.clone();
        c.delete();
        assert_nothing_left(&host, &cgroups, &id, "crun delete (poststop) after an exit");
    });
}

/// Writes `www/stop` into the bundle's rootfs: the container sees it as `/www/stop`.
fn set_stop(bundle: &Path) {
    let stop = bundle.join("rootfs/www/stop");
    std::fs::write(&stop, "").unwrap_or_else(|e| panic!("cannot write {}: {e}", stop.display()));
}

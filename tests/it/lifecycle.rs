//! A container's life at its edges, on all three backends (iptables-legacy, iptables-nft and
//! natledger's nftables tables), with full dumps (`*-save` and `nft list ruleset`):
//!
//! - `a_create_without_a_usable_pid_is_refused`: a createRuntime state whose pid is missing,
//!   0, -1 or a process that is gone is refused with one line saying so; no rule, no
//!   manifest; a real container then takes the port and answers.
//! - `a_pidless_manifest_of_an_older_release_is_dead`: a hook container's manifest with no
//!   pid and no CNI namespace (as a release that accepted such a create wrote it) is `dead` in
//!   `list`, sweep removes exactly its rules (full dumps), and the port is free again.
//! - `a_stale_poststop_keeps_the_live_instance`: c1 dies without poststop, c1 is created
//!   again (another container namespace) and answers; a poststop for c1 without a pid, and one
//!   naming the old pid, exit 0 with one warning naming c1 and the live pid, change nothing
//!   (dumps, manifest, traffic to the new instance); sweep keeps it; once its process is gone
//!   its poststop removes everything (dump as before).
//! - `a_poststop_while_the_process_is_still_exiting_removes`: as crun's and youki's
//!   `delete --force` do, the container's process is killed while its poststop (naming no
//!   pid) already runs (here 300 ms in): the poststop waits for it to be gone (at most a
//!   second) and removes everything (dump as before), with no warning.
//! - `enospc_by_inodes_at_every_step`, `enospc_by_size_at_every_step`: the state directory on
//!   a small tmpfs mounted over the node's temp dir, filled to leave 0, 1, 2, … inodes or 0,
//!   P, 2P+ pages (P: the pages of the manifest of 300 mappings) before a create: each
//!   failed create leaves no rule (dumps) and no file of the container in the state
//!   directory (not even a temp file), and the create succeeds once there is room.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(3);
const PORTS: &str = "io.natledger.ports";
const IP: &str = "io.natledger.ip";

fn creating(id: &str, bundle: &Path) -> serde_json::Value {
    serde_json::json!({"ociVersion": "1.0.2", "id": id, "status": "creating", "bundle": bundle})
}

fn stopped(id: &str, bundle: &Path) -> serde_json::Value {
    serde_json::json!({"ociVersion": "1.0.2", "id": id, "status": "stopped", "bundle": bundle})
}

#[test]
fn a_create_without_a_usable_pid_is_refused() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        node.warm_up();
        let before = node.dump();
        let bundle = node.bundle("squat", &[(PORTS, "8080:80"), (IP, "10.77.0.9")]);
        let node_ns = node.topo.node().to_string();
        let gone = node.topo.spawn_sleeper(&node_ns);
        kill_pid(gone);
        let cases: Vec<(Option<i64>, String)> = vec![
            (None, "has no pid".into()),
            (Some(0), "pid 0".into()),
            (Some(-1), "pid -1".into()),
            (Some(gone.into()), format!("pid {gone}")),
        ];
        for (pid, reason) in &cases {
            let mut state = creating("squat", &bundle);
            if let Some(pid) = pid {
                state["pid"] = (*pid).into();
            }
            let out = node.hook_state("create-runtime", &state);
            let err = stderr(&out);
            assert!(
                !out.status.success(),
                "{backend:?} pid {pid:?} accepted: {err}"
            );
            assert!(
                err.contains("squat") && err.contains(reason.as_str()),
                "{backend:?} pid {pid:?}: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
            assert!(node.manifests().is_empty(), "{:?}", node.manifests());
            assert_eq!(
                node.dump(),
                before,
                "{backend:?} pid {pid:?}: a rule was written"
            );
        }
        // The port is free: a container with a process takes it and answers.
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create("c2", Some(pid), &[(PORTS, "8080:80")]);
        let ext = node.topo.ext().to_string();
        assert_eq!(tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap(), "c2");
        kill_pid(pid);
        assert_ok(&node.poststop("c2"), "poststop");
        assert_eq!(node.dump(), before);
    });
}

#[test]
fn a_pidless_manifest_of_an_older_release_is_dead() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        node.warm_up();
        let before = node.dump();
        node.create("old", None, &[(PORTS, "8080:80"), (IP, "10.77.0.9")]);
        // As a release that accepted a create without a pid wrote it.
        let path = node.state_dir().join("containers/old.json");
        let mut manifest = node.manifest("old");
        let fields = manifest.as_object_mut().unwrap();
        fields.insert("pid".into(), serde_json::Value::Null);
        fields.insert("pid_start_time".into(), serde_json::Value::Null);
        for gone in ["netns", "pid_namespace", "boot_id"] {
            fields.remove(gone);
        }
        std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
        assert!(node.dump().contains("natledger:old"));

        let out = node.natledger(&["list", "--json"], "", &[]);
        assert_ok(&out, "list");
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(listed[0]["container_id"], "old");
        assert_eq!(listed[0]["alive"], false, "{backend:?}: {listed:#}");

        let out = node.sweep(&[]);
        assert_ok(&out, "sweep");
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: sweep left the pid-less rules"
        );
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create("c2", Some(pid), &[(PORTS, "8080:80")]);
        let ext = node.topo.ext().to_string();
        assert_eq!(tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap(), "c2");
        kill_pid(pid);
        assert_ok(&node.poststop("c2"), "poststop");
        assert_eq!(node.dump(), before);
    });
}

#[test]
fn a_stale_poststop_keeps_the_live_instance() {
    both(|backend| {
        let mut node = Node::new(backend);
        let old = node.topo.add_container(2);
        let new = node.topo.add_container(3);
        let _servers = [
            serve_tcp(&old.ns, old.sock_v4(80), "old"),
            serve_tcp(&new.ns, new.sock_v4(80), "new"),
            serve_udp(&new.ns, new.sock_v6(80), "new/6"),
        ];
        node.warm_up();
        let before = node.dump();
        let ext = node.topo.ext().to_string();
        let ports = [(PORTS, "8080:80,8080:80/udp")];

        let pid1 = node.topo.spawn_sleeper(&old.ns);
        node.create("c1", Some(pid1), &ports);
        assert_eq!(tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap(), "old");
        kill_pid(pid1); // dies without poststop
        let pid2 = node.topo.spawn_sleeper(&new.ns);
        node.create("c1", Some(pid2), &ports);
        let answers = |what: &str| {
            let tcp = tcp_request(&ext, sock(NODE_V4, 8080), T);
            assert_eq!(
                tcp.as_deref().ok(),
                Some("new"),
                "{backend:?} {what}: {tcp:?}"
            );
            let udp = udp_request(&ext, sock(NODE_V6, 8080), T);
            assert_eq!(
                udp.as_deref().ok(),
                Some("new/6"),
                "{backend:?} {what}: {udp:?}"
            );
        };
        answers("the new instance");
        let live = node.dump();
        let manifest = node.manifest("c1");

        let bundle = node.dir.path().join("bundles/c1");
        let mut naming_old = stopped("c1", &bundle);
        naming_old["pid"] = pid1.into();
        for (what, state) in [
            ("no pid", stopped("c1", &bundle)),
            ("the old pid", naming_old),
        ] {
            let out = node.hook_state("poststop", &state);
            assert_ok(&out, &format!("stale poststop, {what}"));
            let err = stderr(&out);
            assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
            assert!(
                err.contains("warning")
                    && err.contains("container c1")
                    && err.contains(&format!("pid {pid2}")),
                "{backend:?} {what}: {err}"
            );
            assert_eq!(
                node.dump(),
                live,
                "{backend:?} {what}: the live rules changed"
            );
            assert_eq!(node.manifest("c1"), manifest, "{what}");
            answers(&format!("after a stale poststop with {what}"));
        }
        assert_ok(&node.sweep(&[]), "sweep");
        assert_eq!(node.dump(), live, "{backend:?}: sweep");
        answers("after sweep");

        kill_pid(pid2);
        let out = node.hook_state("poststop", &stopped("c1", &bundle));
        assert_ok(&out, "poststop after the process is gone");
        assert_eq!(node.dump(), before, "{backend:?}");
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
    });
}

#[test]
fn a_poststop_while_the_process_is_still_exiting_removes() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c");
        node.warm_up();
        let before = node.dump();
        let ext = node.topo.ext().to_string();
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create("c1", Some(pid), &[(PORTS, "8080:80")]);
        assert_eq!(tcp_request(&ext, sock(NODE_V4, 8080), T).unwrap(), "c");
        let bundle = node.dir.path().join("bundles/c1");
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            kill_pid(pid);
        });
        let out = node.hook_state("poststop", &stopped("c1", &bundle));
        killer.join().unwrap();
        assert_ok(&out, "poststop while the process exits");
        let err = stderr(&out);
        assert!(!err.contains("warning"), "{backend:?}: {err}");
        assert_eq!(node.dump(), before, "{backend:?}: the rules stayed");
        assert!(node.manifests().is_empty(), "{:?}", node.manifests());
    });
}

/// A tmpfs mounted over a directory (unmounted on drop).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, options: &str) -> Tmpfs {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "natledger-test"])
            .arg(at)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {out:?}");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

const PAGE: u64 = 4096;

/// Fills the file system at `dir` (files under `dir/fill`) until nothing is left of what
/// `inodes` says (inodes, else pages), then gives `free` of them back.
fn fill_leaving(dir: &Path, inodes: bool, free: u64) {
    let fill = dir.join("fill");
    let _ = std::fs::remove_dir_all(&fill);
    std::fs::create_dir(&fill).unwrap();
    if inodes {
        let mut made = Vec::new();
        for i in 0.. {
            let path = fill.join(i.to_string());
            match File::create(&path) {
                Ok(_) => made.push(path),
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("{e}"),
            }
        }
        for path in made.iter().rev().take(free as usize) {
            std::fs::remove_file(path).unwrap();
        }
    } else {
        let path = fill.join("pages");
        let mut file = File::create(&path).unwrap();
        let page = [0u8; PAGE as usize];
        loop {
            match file.write(&page) {
                Ok(n) if n == page.len() => {}
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let len = file.metadata().unwrap().len() / PAGE * PAGE;
        assert!(
            len >= free * PAGE,
            "the filler is too small to give {free} pages back"
        );
        file.set_len(len - free * PAGE).unwrap();
    }
}

/// Creates of `spec` with the state directory filled to leave each of `free` (inodes or
/// pages) in turn: every failure leaves no rule (dumps) and no file of the container in the
/// state directory, not even a temp file; one of them succeeds (and its poststop restores the
/// dumps). At least two steps fail: the manifest written ahead, and its update once the rules
/// are in.
fn creates_when_full(node: &Node, inodes: bool, spec: &str, free: &[u64]) {
    let before = node.dump();
    let annotations = [(PORTS, spec), (IP, "10.77.0.9")];
    let bundle = node.bundle("c1", &annotations);
    let (mut failed, mut succeeded) = (0, false);
    for left in free {
        fill_leaving(node.dir.path(), inodes, *left);
        let unit = if inodes { "inodes" } else { "pages" };
        let what = format!("{:?}, {left} {unit} left", node.backend);
        let out = node.hook("create-runtime", "c1", None, &bundle);
        let err = stderr(&out);
        if out.status.success() {
            assert!(node.dump().contains("natledger:c1"), "{what}");
            assert_eq!(node.manifest("c1")["phase"], "installed", "{what}");
            assert_ok(&node.poststop("c1"), &format!("{what}: poststop"));
            assert_eq!(node.dump(), before, "{what}: poststop");
            succeeded = true;
            break;
        }
        failed += 1;
        assert!(err.contains("No space left on device"), "{what}: {err}");
        let files = node.manifests();
        assert!(files.is_empty(), "{what}: left {files:?}: {err}");
        assert_eq!(node.dump(), before, "{what}: left rules: {err}");
    }
    assert!(
        failed >= 2 && succeeded,
        "failed {failed} time(s), succeeded: {succeeded}"
    );
    std::fs::remove_dir_all(node.dir.path().join("fill")).unwrap();
}

#[test]
fn enospc_by_inodes_at_every_step() {
    both(|backend| {
        let node = Node::new(backend);
        let _fs = Tmpfs::mount(node.dir.path(), "size=8m,nr_inodes=64,mode=0700");
        node.warm_up();
        // Room for nothing; for the manifest written ahead but not its temp file; for both.
        creates_when_full(&node, true, "8080:80", &[0, 1, 2, 3]);
    });
}

#[test]
fn enospc_by_size_at_every_step() {
    both(|backend| {
        let node = Node::new(backend);
        let _fs = Tmpfs::mount(node.dir.path(), "size=4m,nr_inodes=4096,mode=0700");
        node.warm_up();
        // 300 mappings: measure the manifest's pages with room to spare.
        let spec: Vec<String> = (0..300).map(|i| format!("{}:{}", 20000 + i, 80)).collect();
        let spec = spec.join(",");
        let before = node.dump();
        node.create("c1", None, &[(PORTS, &spec), (IP, "10.77.0.9")]);
        let bytes = std::fs::metadata(node.state_dir().join("containers/c1.json"))
            .unwrap()
            .len();
        assert_ok(&node.poststop("c1"), "poststop");
        assert_eq!(node.dump(), before);
        let pages = bytes.div_ceil(PAGE);
        // Room for nothing; for the manifest written ahead but not its update; for both.
        creates_when_full(&node, false, &spec, &[0, pages, 2 * pages + 16]);
    });
}

//! The state directory is natledger's only when natledger made it: the real binary in private
//! network namespaces, every backend, full dumps (`*-save`, `nft list ruleset`) and a
//! recursive listing of the directory (mode, owner, times, contents of every entry) compared
//! before and after.
//!
//! - `a_decoy_directory_is_refused_by_every_way_in`: a directory made to look like `/etc`
//!   (0755, files, a `containers/` of foreign JSON and a manifest-shaped file) given through
//!   `--state-dir`, `NATLEDGER_STATE_DIR` and a CNI config's `stateDir`: every hook, sweep
//!   (`--all`, `--dry-run`), `list`, doctor and CNI command refuses it naming the path and
//!   why (CNI DEL succeeds, saying so: nothing can be recorded there); nothing in it changes (not even a time), no rule is written, no foreign file is
//!   read as a manifest;
//! - `an_older_releases_directory_is_adopted`: a state directory written by the previous
//!   release (`tests/fixtures/state-dir-older`, made 0755 as releases before 0700 did): `list`
//!   reads it without changing it, the next create brings it to 0700, marks it and keeps its
//!   manifest byte for byte;
//! - `a_new_directory_is_marked_and_an_empty_one_adopted_as_it_is`: a state directory natledger
//!   creates is 0700 and marked; an empty existing one (an operator's `mkdir`, 0755) is
//!   marked and used, its mode unchanged, `containers/` 0700; create and poststop restore the
//!   dumps.
//! - `a_mistyped_state_directory_takes_no_forwards`: a live container's rules and real
//!   traffic; `sweep` (plain, `--dry-run`, `--repair`) with a `--state-dir` that does not
//!   exist changes no rule, creates nothing and warns why; `watch` with it waits, creates
//!   nothing and ends on SIGTERM with status 0; an existing empty directory keeps the rules
//!   too; `sweep --boot` with the missing directory removes them, creating nothing.
//! - `first_uses_at_once_all_succeed`: 12 CNI STATUS calls at once (each takes the lock) on a
//!   new directory and on an older release's, 10 rounds each: every one succeeds (one that
//!   read no marker and then listed the marker another had just written was refused as
//!   foreign).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const CID: &str = "0d5e1f0c3a9b8d7e6f5a4b3c2d1e0f9a";

/// Every entry under `dir` (itself included): type, mode, owner, modification and change
/// times, and a file's contents. Any chmod, any file created or removed (even one removed
/// again: the directory's times move) shows.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut all = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mut line = format!(
            "{:o} uid {} mtime {}.{} ctime {}.{}",
            meta.mode(),
            meta.uid(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec()
        );
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        } else if meta.is_file() {
            line.push_str(&format!(" {:?}", std::fs::read(&path).unwrap()));
        }
        all.insert(path.strip_prefix(dir).unwrap().to_path_buf(), line);
    }
    all
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory like `/etc`: 0755, files, a 0755 `containers/` holding another program's
/// JSON and a file shaped like a manifest of a dead container.
fn decoy(root: &Path) -> PathBuf {
    let etc = root.join("etc");
    let containers = etc.join("containers");
    std::fs::create_dir_all(&containers).unwrap();
    std::fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(etc.join("hostname"), "node\n").unwrap();
    std::fs::write(
        containers.join("policy.json"),
        r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
    )
    .unwrap();
    std::fs::write(
        containers.join("registries.conf"),
        "unqualified-search-registries = []\n",
    )
    .unwrap();
    let manifest = json!({
        "schema": 1, "container_id": "victim", "bundle": null, "pid": 999999,
        "pid_start_time": 1, "phase": "installed", "mappings": [], "addresses": [], "rules": []
    });
    std::fs::write(containers.join("victim.json"), manifest.to_string()).unwrap();
    for d in [&etc, &containers] {
        chmod(d, 0o755);
    }
    etc
}

/// What a refusal of `dir` says: the path and why.
fn assert_refused(out: &Output, dir: &Path, what: &str) {
    // Doctor's text report wraps lines: compared with whitespace collapsed.
    let text = format!(
        "{} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .split_whitespace()
    .collect::<Vec<_>>()
    .join(" ");
    assert!(!out.status.success(), "{what}: accepted: {text}");
    let named = format!("refusing state directory {}", dir.display());
    assert!(text.contains(&named), "{what}: {text}");
    assert!(
        text.contains("it holds \\\"") || text.contains("it holds \""),
        "{what}: says why: {text}"
    );
    assert!(
        !text.contains("victim"),
        "{what}: read a foreign file: {text}"
    );
}

#[test]
fn a_decoy_directory_is_refused_by_every_way_in() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let pid = node.topo.spawn_sleeper(&c.ns).to_string();
        node.warm_up();
        let decoy = decoy(node.dir.path());
        let before = snapshot(&decoy);
        let dump = node.dump();
        let shown = decoy.display().to_string();
        let bundle = node.bundle("c1", &[("io.natledger.ports", "8080:80")]);
        let state = |status: &str| {
            json!({"ociVersion": "1.0.2", "id": "c1", "status": status,
                   "bundle": bundle, "pid": pid.parse::<u32>().unwrap()})
            .to_string()
        };
        let commands: [(&[&str], String); 9] = [
            (&["hook", "create-runtime"], state("creating")),
            (&["hook", "poststop"], state("stopped")),
            (&["sweep"], String::new()),
            (&["sweep", "--dry-run"], String::new()),
            (&["sweep", "--all"], String::new()),
            (&["list"], String::new()),
            (&["list", "--json"], String::new()),
            (&["doctor"], String::new()),
            (&["doctor", "--json"], String::new()),
        ];
        for (args, stdin) in &commands {
            // --state-dir, over the environment's (the fixture's own directory).
            let mut argv = vec!["--state-dir", shown.as_str()];
            argv.extend_from_slice(args);
            let out = node.natledger(&argv, stdin, &[]);
            assert_refused(&out, &decoy, &format!("{backend:?} --state-dir {args:?}"));
            // NATLEDGER_STATE_DIR.
            let out = node.natledger(args, stdin, &[("NATLEDGER_STATE_DIR", &shown)]);
            assert_refused(&out, &decoy, &format!("{backend:?} env {args:?}"));
        }
        let netns = format!("/run/netns/{}", c.ns);
        let mut config = cni_config(&node, "testnet", &c, 8080);
        config["stateDir"] = json!(decoy);
        let mut gc = config.clone();
        gc["cni.dev/valid-attachments"] = json!([]);
        for (command, config) in [
            ("ADD", &config),
            ("CHECK", &config),
            ("GC", &gc),
            ("STATUS", &config),
        ] {
            let out = cni_call(&node, command, CID, Some(&netns), config);
            assert_refused(&out, &decoy, &format!("{backend:?} CNI {command}"));
            let error: Value = serde_json::from_slice(&out.stdout).expect("an error object");
            let code = if command == "STATUS" { 50 } else { 100 };
            assert_eq!(error["code"], code, "{backend:?} CNI {command}: {error}");
        }
        // DEL succeeds (nothing can be recorded in a refused directory, and a failed DEL
        // would stop the conflist's), saying why on stderr.
        let out = cni_call(&node, "DEL", CID, Some(&netns), &config);
        assert_ok(&out, &format!("{backend:?} CNI DEL"));
        let said = stderr(&out);
        assert!(
            said.contains(&format!("refusing state directory {shown}")),
            "{said}"
        );
        assert_eq!(snapshot(&decoy), before, "{backend:?}: the decoy changed");
        assert_eq!(node.dump(), dump, "{backend:?}: rules changed");
    });
}

#[test]
fn an_older_releases_directory_is_adopted() {
    let mut node = Node::new(Backend::IptablesNft);
    let c = node.topo.add_container(2);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.warm_up();
    let state = node.dir.path().join("older");
    let shown = state.display().to_string();
    let env = [("NATLEDGER_STATE_DIR", shown.as_str())];
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-dir-older");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&fixture)
        .arg(&state)
        .status()
        .unwrap();
    assert!(copied.success());
    let containers = state.join("containers");
    for d in [&state, &containers] {
        chmod(d, 0o755);
    }
    let older = std::fs::read(containers.join("c1.json")).unwrap();
    let before = snapshot(&state);
    // Read as it is: not adopted by a command that only reads.
    let out = node.natledger(&["list", "--json"], "", &env);
    assert_ok(&out, "list");
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed[0]["container_id"], "c1", "{listed}");
    assert_eq!(snapshot(&state), before, "list changed the directory");
    // The next create adopts it.
    let dump = node.dump();
    let bundle = node.bundle("c2", &[("io.natledger.ports", "8081:80")]);
    let out = node.hook_env("create-runtime", "c2", Some(pid), &bundle, &env);
    assert_ok(&out, "create in the older release's directory");
    for d in [&state, &containers] {
        let mode = std::fs::metadata(d).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    assert_eq!(
        std::fs::read_to_string(state.join("natledger-state")).unwrap(),
        "natledger state directory, layout 1\n"
    );
    assert_eq!(std::fs::read(containers.join("c1.json")).unwrap(), older);
    let mut names: Vec<String> = std::fs::read_dir(&containers)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["c1.json", "c2.json"]);
    let out = node.hook_env("poststop", "c2", None, &bundle, &env);
    assert_ok(&out, "poststop");
    assert_eq!(node.dump(), dump);
}

#[test]
fn a_new_directory_is_marked_and_an_empty_one_adopted_as_it_is() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.warm_up();
        let state = node.state_dir();
        let marker = state.join("natledger-state");
        let text = "natledger state directory, layout 1\n";
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), text);
        assert_eq!(std::fs::metadata(&state).unwrap().mode() & 0o7777, 0o700);
        // An operator's mkdir: empty, 0755.
        let empty = node.dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        chmod(&empty, 0o755);
        let dump = node.dump();
        let shown = empty.display().to_string();
        let env = [("NATLEDGER_STATE_DIR", shown.as_str())];
        let bundle = node.bundle("c1", &[("io.natledger.ports", "8080:80")]);
        let out = node.hook_env("create-runtime", "c1", Some(pid), &bundle, &env);
        assert_ok(&out, "create in an empty directory");
        assert_eq!(std::fs::metadata(&empty).unwrap().mode() & 0o7777, 0o755);
        let containers = empty.join("containers");
        assert_eq!(
            std::fs::metadata(&containers).unwrap().mode() & 0o7777,
            0o700
        );
        assert_eq!(
            std::fs::read_to_string(empty.join("natledger-state")).unwrap(),
            text
        );
        assert!(containers.join("c1.json").exists());
        let out = node.hook_env("poststop", "c1", None, &bundle, &env);
        assert_ok(&out, "poststop");
        assert_eq!(node.dump(), dump);
        assert_eq!(std::fs::metadata(&empty).unwrap().mode() & 0o7777, 0o755);
    });
}

#[test]
fn first_uses_at_once_all_succeed() {
    let mut node = Node::new(Backend::OwnNftables);
    let c = node.topo.add_container(2);
    let node = &node;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-dir-older");
    for older in [false, true] {
        for round in 0..10 {
            let state = node.dir.path().join(format!("race-{older}-{round}"));
            if older {
                let copied = std::process::Command::new("cp")
                    .arg("-a")
                    .arg(&fixture)
                    .arg(&state)
                    .status()
                    .unwrap();
                assert!(copied.success());
                for d in [state.clone(), state.join("containers")] {
                    chmod(&d, 0o755);
                }
            }
            let mut config = cni_config(node, "testnet", &c, 8080);
            config["stateDir"] = json!(state);
            let outs: Vec<Output> = std::thread::scope(|s| {
                let calls: Vec<_> = (0..12)
                    .map(|_| s.spawn(|| cni_call(node, "STATUS", CID, None, &config)))
                    .collect();
                calls.into_iter().map(|t| t.join().unwrap()).collect()
            });
            for out in &outs {
                assert_ok(
                    out,
                    &format!("STATUS at once (older: {older}, round {round})"),
                );
            }
            assert!(state.join("natledger-state").exists());
        }
    }
}

#[test]
fn a_mistyped_state_directory_takes_no_forwards() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        let pid = node.topo.spawn_sleeper(&c.ns);
        assert_ok(
            &node.create("c2", Some(pid), &[("io.natledger.ports", "8080:80")]),
            "create",
        );
        let ext = node.topo.ext().to_string();
        let answers = || {
            tcp_request(&ext, sock(NODE_V4, 8080), Duration::from_secs(2)).is_ok_and(|r| r == "c2")
        };
        assert!(answers(), "{backend:?}: no answer before");
        let dump = node.dump();
        assert!(dump.contains("natledger:c2"), "{dump}");
        let typo = node.dir.path().join("typo");
        let shown = typo.display().to_string();
        for extra in [&[][..], &["--dry-run"], &["--repair"]] {
            let mut argv = vec!["--state-dir", shown.as_str(), "sweep"];
            argv.extend_from_slice(extra);
            let out = node.natledger(&argv, "", &[]);
            assert_ok(&out, &format!("{backend:?} sweep {extra:?}"));
            let said = stderr(&out);
            assert!(
                said.contains(&format!("state directory {shown} does not exist"))
                    && said.contains("sweep --boot"),
                "{backend:?} {extra:?}: {said}"
            );
            assert!(!typo.exists(), "{backend:?} {extra:?}: created {shown}");
            assert_eq!(node.dump(), dump, "{backend:?} {extra:?}: rules changed");
        }
        assert!(answers(), "{backend:?}: no answer after the typo'd sweep");

        // watch waits for the directory, touching nothing; SIGTERM ends it with status 0.
        let log = node.dir.path().join("watch-typo.log");
        let mut watch = Command::new("ip")
            .args(["netns", "exec", node.topo.node(), "env"])
            .arg(format!("NATLEDGER_BACKEND={}", node.backend.name()))
            .args([BIN, "--state-dir", shown.as_str(), "watch"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start natledger watch");
        std::thread::sleep(Duration::from_secs(2));
        assert!(!typo.exists(), "{backend:?}: watch created {shown}");
        assert_eq!(node.dump(), dump, "{backend:?}: watch changed rules");
        // SAFETY: a plain kill(2) of the child this test started (not yet waited for).
        assert_eq!(unsafe { libc::kill(watch.id() as i32, libc::SIGTERM) }, 0);
        let status = watch.wait().unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(status.success(), "{backend:?}: watch {status}: {text}");
        assert!(
            text.contains(&format!("waiting for state directory {shown}")),
            "{text}"
        );
        assert_eq!(
            text.matches("waiting for state directory").count(),
            1,
            "{text}"
        );

        // An existing directory with no manifest: the rules stay too.
        let empty = node.dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let out = node.natledger(&["--state-dir", empty.to_str().unwrap(), "sweep"], "", &[]);
        assert_ok(&out, &format!("{backend:?} sweep of an empty directory"));
        assert!(
            stderr(&out).contains("holds no manifest"),
            "{}",
            stderr(&out)
        );
        assert_eq!(
            node.dump(),
            dump,
            "{backend:?}: an empty ledger's sweep changed rules"
        );

        // The boot: every tagged rule no manifest claims goes, the directory is not made.
        let out = node.natledger(
            &["--state-dir", &shown, "sweep", "--boot", "--json"],
            "",
            &[],
        );
        assert_ok(&out, &format!("{backend:?} sweep --boot"));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(report["orphans"].as_u64().unwrap() > 0, "{report:#}");
        assert!(!typo.exists(), "{backend:?}: sweep --boot created {shown}");
        assert!(!node.dump().contains("natledger:c2"), "{}", node.dump());
    });
}

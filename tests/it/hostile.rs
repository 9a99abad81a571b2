//! Hostile or broken state and bundles: the real binary in private network namespaces, every
//! backend, full dumps (`*-save`, `nft list ruleset`) compared before and after, real TCP to
//! the live container.
//!
//! - a manifest edited to record another container's rule, an untagged rule in natledger's
//!   chain, a rule or a shared jump in a built-in chain: poststop leaves them all;
//! - a manifest under another container's name: poststop acts on neither;
//! - a FIFO, a device or a symlink loop as `config.json`: hooks, inject and the wrapper refuse
//!   it at once (a loop named as one, not as a symlink in the state directory);
//! - a megabyte of id, annotation or status: refused on one readable line;
//! - a state directory others can write: refused, naming the path, owner and mode.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

const T: Duration = Duration::from_secs(3);

/// `natledger ARGS` in the node namespace as [`Node::natledger`] runs it, but killed after
/// 10 s (exit 124: it hung) and with at most 1 GiB of address space (so an unbounded read
/// ends in a failed allocation, not in the machine's memory).
fn bounded(node: &Node, args: &[&str], stdin: &str) -> Output {
    let state_dir = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
    let backend = format!("NATLEDGER_BACKEND={}", node.backend.name());
    let mut argv = vec![
        "10",
        "prlimit",
        "--as=1073741824",
        "env",
        &state_dir,
        &backend,
        BIN,
    ];
    argv.extend_from_slice(args);
    run_in(node.topo.node(), "timeout", &argv, Some(stdin.as_bytes()))
}

/// The state of container `id`, whose process is this test's (an OCI runtime always sends a
/// pid to createRuntime).
fn hook_state(id: &str, status: &str, bundle: &Path) -> String {
    let pid = std::process::id();
    json!({"ociVersion": "1.0.2", "id": id, "status": status, "bundle": bundle, "pid": pid})
        .to_string()
}

/// The `-A CHAIN ARGS` line of a dump as a manifest record of `backend`, IPv4.
fn record(backend: Backend, table: &str, line: &str) -> Value {
    let mut tokens = line.split_whitespace().map(|t| t.trim_matches('"'));
    assert_eq!(tokens.next(), Some("-A"), "{line}");
    let chain = tokens.next().unwrap();
    let rule: Vec<&str> = tokens.collect();
    json!({"backend": backend.name(), "family": "ipv4", "table": table, "chain": chain,
           "rule": rule})
}

fn write_manifest(node: &Node, file_id: &str, manifest: &Value) {
    let path = node
        .state_dir()
        .join("containers")
        .join(format!("{file_id}.json"));
    std::fs::write(path, serde_json::to_vec_pretty(manifest).unwrap()).unwrap();
}

/// poststop acts only on records tagged for its own container in natledger's chains. A
/// manifest edited to record the live container's DNAT and accept, an untagged DNAT in
/// NATLEDGER-HOSTPORTS, a DNAT in PREROUTING and the shared PREROUTING jump leaves every one
/// of them (the dump equals the one before the container was created) and the live
/// container's port keeps answering. A copy of the live container's manifest under another
/// name removes nothing either, and stays.
#[test]
fn poststop_deletes_only_its_own_tagged_rules() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "live");
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.warm_up();
        let ip = ("io.natledger.ip", "10.77.0.2");
        node.create("live", Some(pid), &[("io.natledger.ports", "8080:80"), ip]);
        if backend.is_iptables() {
            let foreign = "*nat\n\
                -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 7777 -j DNAT --to-destination 10.77.0.2:80\n\
                -A PREROUTING -p tcp -m tcp --dport 7778 -j DNAT --to-destination 10.77.0.2:80\n\
                COMMIT\n";
            load_rules(node.topo.node(), backend, Family::V4, foreign);
        } else {
            // The same two rules in natledger's own table (its PREROUTING is a base chain).
            let foreign = "add rule ip natledger NATLEDGER-HOSTPORTS tcp dport 7777 dnat to 10.77.0.2:80\n\
                add rule ip natledger PREROUTING tcp dport 7778 dnat to 10.77.0.2:80\n";
            load_nft(node.topo.node(), foreign);
        }
        let before = node.dump();
        let ext = node.topo.ext().to_string();
        let answers = |what: &str| {
            assert_eq!(
                tcp_request(&ext, sock(NODE_V4, 8080), T).ok().as_deref(),
                Some("live"),
                "{backend:?}: the live container's port after {what}"
            );
        };
        answers("create");

        node.create("tamper", None, &[("io.natledger.ports", "9090:80"), ip]);
        let mut manifest = node.manifest("tamper");
        let dump = node.dump();
        let pick = |chain: &str, needle: &str| -> String {
            chain_rules(&dump, backend, Family::V4, chain)
                .into_iter()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no {needle} in {chain}:\n{dump}"))
                .to_string()
        };
        let planted = if backend.is_iptables() {
            [
                ("nat", pick("NATLEDGER-HOSTPORTS", "natledger:live")),
                ("filter", pick("NATLEDGER-FORWARD", "natledger:live")),
                ("nat", pick("NATLEDGER-HOSTPORTS", "--dport 7777")),
                ("nat", pick("PREROUTING", "--dport 7778")),
                ("nat", pick("PREROUTING", "NATLEDGER-HOSTPORTS")),
            ]
        } else {
            // Manifests of the nftables backend record iptables-style arguments: the live
            // container's own records (a DNAT, a masquerade: no forward accept here), and the
            // foreign rules and the shared jump as natledger reads them back.
            for needle in [
                "dport 7777 dnat",
                "dport 7778 dnat",
                "jump NATLEDGER-HOSTPORTS",
            ] {
                pick(
                    if needle.contains("7777") {
                        "NATLEDGER-HOSTPORTS"
                    } else {
                        "PREROUTING"
                    },
                    needle,
                );
            }
            let live = node.manifest("live");
            let own = |chain: &str| -> String {
                let r = live["rules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["chain"] == chain && r["family"] == "ipv4")
                    .unwrap_or_else(|| panic!("no {chain} record in {live:#}"));
                let args: Vec<&str> = r["rule"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap())
                    .collect();
                format!("-A {chain} {}", args.join(" "))
            };
            [
                ("nat", own("NATLEDGER-HOSTPORTS")),
                ("nat", own("NATLEDGER-MASQ")),
                ("nat", "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 7777 -j DNAT --to-destination 10.77.0.2:80".to_string()),
                ("nat", "-A PREROUTING -p tcp -m tcp --dport 7778 -j DNAT --to-destination 10.77.0.2:80".to_string()),
                ("nat", "-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS".to_string()),
            ]
        };
        let rules = manifest["rules"].as_array_mut().unwrap();
        for (table, line) in &planted {
            rules.push(record(backend, table, line));
        }
        write_manifest(&node, "tamper", &manifest);
        let out = node.poststop("tamper");
        assert_ok(&out, "poststop of the tampered manifest");
        let err = stderr(&out);
        assert_eq!(
            err.matches("it is left alone").count(),
            planted.len(),
            "{backend:?}: each foreign record named: {err}"
        );
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: only tamper's own rules went"
        );
        answers("the tampered poststop");

        // The live container's manifest copied under another name.
        write_manifest(&node, "copy", &node.manifest("live"));
        let out = node.poststop("copy");
        assert_ok(&out, "poststop of a copied manifest");
        assert!(
            stderr(&out).contains("records container live"),
            "{}",
            stderr(&out)
        );
        assert_eq!(node.dump(), before, "{backend:?}: a copy deletes nothing");
        assert!(node.manifest_exists("copy"), "left for the operator");
        answers("the copy's poststop");
    });
}

/// A FIFO as `config.json` (or a link to `/dev/zero`) hangs nothing and exhausts nothing:
/// create-runtime, a manifest-less poststop, `inject` and the wrapper refuse it at once. A
/// symlink loop there is refused as a loop (the bundle's problem).
#[test]
fn a_config_that_is_not_a_regular_file_is_refused_at_once() {
    let node = Node::new(Backend::IptablesNft);
    let fifo_bundle = node.dir.path().join("fifo");
    std::fs::create_dir_all(&fifo_bundle).unwrap();
    nix::unistd::mkfifo(
        &fifo_bundle.join("config.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let zero_bundle = node.dir.path().join("zero");
    std::fs::create_dir_all(&zero_bundle).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero_bundle.join("config.json")).unwrap();
    // A symlink loop: the bundle's problem, not a symlink in natledger's state directory.
    let loop_bundle = node.dir.path().join("loop");
    std::fs::create_dir_all(&loop_bundle).unwrap();
    std::os::unix::fs::symlink("config.json", loop_bundle.join("config.json")).unwrap();
    for (bundle, kind) in [
        (&fifo_bundle, "FIFO"),
        (&zero_bundle, "character device"),
        (&loop_bundle, "a symlink loop"),
    ] {
        for (stage, status) in [("create-runtime", "creating"), ("poststop", "stopped")] {
            let out = bounded(&node, &["hook", stage], &hook_state("c", status, bundle));
            let err = stderr(&out);
            assert_ne!(out.status.code(), Some(124), "{stage} on a {kind} hung");
            assert!(err.contains(kind), "{stage} on a {kind}: {err}");
            assert!(
                !err.contains("state directory"),
                "{stage} on a {kind}: {err}"
            );
            if stage == "create-runtime" {
                assert!(!out.status.success(), "{stage} on a {kind}");
            }
        }
        let b = bundle.to_str().unwrap();
        let out = bounded(&node, &["inject", b], "");
        assert_eq!(out.status.code(), Some(1), "inject on a {kind}: {out:?}");
        assert!(stderr(&out).contains(kind), "{}", stderr(&out));
        if bundle == &loop_bundle {
            // The wrapper leaves a config.json it cannot reach to the runtime, which reports
            // the bundle's problem itself (as a missing one).
            continue;
        }
        // The wrapper, as dockerd runs it: fails the start (the runtime, `true`, never runs).
        let wrapper = node.dir.path().join("natledger-runtime");
        if !wrapper.exists() {
            std::os::unix::fs::symlink(BIN, &wrapper).unwrap();
        }
        let out = run_in(
            node.topo.node(),
            "timeout",
            &[
                "10",
                "prlimit",
                "--as=1073741824",
                wrapper.to_str().unwrap(),
                "--natledger-runtime",
                "/bin/true",
                "create",
                "--bundle",
                b,
                "c",
            ],
            None,
        );
        assert_eq!(out.status.code(), Some(1), "wrapper on a {kind}: {out:?}");
        assert!(stderr(&out).contains(kind), "{}", stderr(&out));
    }
    assert!(node.manifests().is_empty());
}

/// A megabyte of container id, annotation or status is refused on one line a person can
/// read: the input is cut, its size given.
#[test]
fn a_megabyte_of_input_is_refused_on_one_short_line() {
    let node = Node::new(Backend::IptablesNft);
    let huge = "x".repeat(1_000_000);
    let ip = ("io.natledger.ip", "10.77.0.2");
    let good = node.bundle("good", &[("io.natledger.ports", "80:80"), ip]);
    let mut cases: Vec<(String, &str)> = vec![
        (hook_state(&huge, "creating", &good), "unsafe container id"),
        (
            json!({"id": "c", "status": huge, "bundle": good}).to_string(),
            "unknown container status",
        ),
        (
            json!({"id": "c", "status": "creating", "bundle": good, "pid": huge}).to_string(),
            "malformed container state",
        ),
    ];
    let ports = format!("80:{huge}");
    let range = format!("{huge}:80");
    let bundles: Vec<(PathBuf, &str)> = vec![
        (
            node.bundle("b1", &[("io.natledger.ports", &ports), ip]),
            "invalid port mapping",
        ),
        (
            node.bundle("b2", &[("io.natledger.ports", &range), ip]),
            "invalid port mapping",
        ),
        (
            node.bundle(
                "b4",
                &[("io.natledger.ports", "80:80"), ("io.natledger.ip", &huge)],
            ),
            "invalid io.natledger.ip",
        ),
    ];
    for (bundle, reason) in &bundles {
        cases.push((hook_state("c", "creating", bundle), reason));
    }
    for (input, reason) in cases {
        let out = bounded(&node, &["hook"], &input);
        let err = stderr(&out);
        assert!(!out.status.success(), "{reason}: accepted");
        assert!(err.contains(reason), "expected {reason:?} in {err:.300}");
        assert_eq!(err.trim_end().lines().count(), 1, "{reason}: {err:.300}");
        assert!(
            err.len() < 1024 && err.contains("bytes)"),
            "{reason}: {} bytes: {err:.1100}",
            err.len()
        );
    }
}

/// A state directory another user owns, or that group or others can write, is refused by
/// every command that uses it, naming the path, the owner and the mode; nothing is written.
#[test]
fn an_unsafe_state_directory_is_refused() {
    let node = Node::new(Backend::IptablesNft);
    let before = node.dump();
    let state = node.state_dir();
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bundle = node.bundle(
        "c",
        &[
            ("io.natledger.ports", "8080:80"),
            ("io.natledger.ip", "10.77.0.2"),
        ],
    );
    let shown = state.display().to_string();
    for (args, input) in [
        (&["hook"][..], hook_state("c", "creating", &bundle)),
        (&["hook"][..], hook_state("c", "stopped", &bundle)),
        (&["sweep"][..], String::new()),
    ] {
        let out = bounded(&node, args, &input);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains(&shown) && err.contains("mode 0777") && err.contains("uid 0"),
            "{args:?}: {err}"
        );
    }
    assert!(!state.join("containers").exists());
    assert_eq!(node.dump(), before);
}

/// A process holding its own `IPPROTO_RAW` socket (libiptc's way into the legacy tables)
/// without the xtables lock is named by doctor, per family; one holding the lock is not. The
/// lock is a file of the test's (`XTABLES_LOCKFILE`), so the host's is never held.
#[test]
fn doctor_names_a_raw_socket_holder_without_the_xtables_lock() {
    let node = Node::new(Backend::IptablesNft);
    let lock = node.dir.path().join("xtables.lock");
    std::fs::write(&lock, "").unwrap();
    let holder = |name: &str, family: &str, locked: bool| {
        let ready = node.dir.path().join(name);
        let script = format!(
            "import fcntl, socket, time\n\
             s = socket.socket(socket.{family}, socket.SOCK_RAW, socket.IPPROTO_RAW)\n\
             f = open({lock:?}, 'r')\n\
             if {locked}: fcntl.flock(f, fcntl.LOCK_EX)\n\
             open({ready:?}, 'w').close()\n\
             time.sleep(60)\n",
            lock = lock.display().to_string(),
            ready = ready.display().to_string(),
            locked = if locked { "True" } else { "False" },
        );
        let child = spawn_in(node.topo.node(), &["python3", "-c", &script]);
        (child, ready)
    };
    let mut procs = vec![
        holder("v4", "AF_INET", false),
        holder("v6", "AF_INET6", false),
        holder("locked", "AF_INET", true),
    ];
    for (_, ready) in &procs {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{ready:?} never ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let lock_env = lock.display().to_string();
    let out = node.natledger(
        &["doctor", "--json"],
        "",
        &[("XTABLES_LOCKFILE", &lock_env)],
    );
    for (child, _) in &mut procs {
        // Our own children, by pid.
        let _ = child.kill();
        let _ = child.wait();
    }
    let doc = Doc::of(out, true);
    let found = doc.of_kind("unlocked-legacy-writer");
    let pids: Vec<String> = procs.iter().map(|(c, _)| c.id().to_string()).collect();
    let named = |pid: &str| {
        found.iter().any(|f| {
            f["summary"]
                .as_str()
                .unwrap()
                .contains(&format!("Process {pid} "))
        })
    };
    assert_eq!(found.len(), 2, "{}", doc.show());
    assert!(named(&pids[0]) && named(&pids[1]), "{}", doc.show());
    assert!(!named(&pids[2]), "the lock holder: {}", doc.show());
    assert!(
        found
            .iter()
            .any(|f| f["evidence"][0].as_str().unwrap().contains("/raw6 ")),
        "{}",
        doc.show()
    );
    assert_eq!(doc.code, 1, "warnings: {}", doc.show());
}

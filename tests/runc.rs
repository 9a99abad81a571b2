//! natledger with the real runc: bundles made by `runc spec`, a busybox httpd container, a
//! network hook of the test's own (in the role of a CNI plugin) that runs before natledger's
//! hooks, and `natledger inject` putting natledger's hooks into `config.json`. runc runs with
//! only the network namespace entered (`nsenter --net`): the Topology's node namespace is the
//! "host", so every rule lands there and the machine's own tables are never touched. runc's
//! state lives in a temporary `--root`, and a guard deletes every container a test started.

mod common;

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;

/// The host port every test container publishes (to the container's port 80).
const HOST_PORT: u16 = 8080;
const PORTS: &str = "8080:80";
/// How long a freshly started container may take to answer.
const START: Duration = Duration::from_secs(5);
const T: Duration = Duration::from_secs(3);

/// runc createRuntime hook (runs in the runtime's namespaces, i.e. the node's network
/// namespace, with the container's state on stdin): a veth pair `vr<N>` / `eth0` whose `eth0`
/// goes into the container's network namespace with 10.77.0.N/24 and fd77::N/64, default
/// routes via the node's bridge addresses, and the host end on br0 with hairpin on. N is the
/// hook's first argument. runc gives hooks only the environment in config.json (none here).
const NET_HOOK: &str = r#"#!/bin/sh
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
n=$1
state=$(cat)
pid=$(printf '%s' "$state" | sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p')
if [ -z "$pid" ]; then
    echo "net-hook: no pid in the state: $state" >&2
    exit 1
fi
ip link add "vr$n" type veth peer name eth0 netns "$pid"
ip link set "vr$n" master br0
ip link set "vr$n" type bridge_slave hairpin on
ip link set "vr$n" up
nsenter --net="/proc/$pid/ns/net" sh -euc "
    echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
    ip link set lo up
    ip addr add 10.77.0.$n/24 dev eth0
    ip addr add fd77::$n/64 dev eth0 nodad
    ip link set eth0 up
    ip route add default via 10.77.0.1
    ip -6 route add default via fd77::1
"
"#;

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

fn write_json(path: &Path, value: &Value) {
    let text = serde_json::to_string_pretty(value).expect("serialize config.json");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// `natledger inject ARGS...`; inject only edits a file, so no namespace is needed.
fn inject(args: &[&str]) -> Output {
    output(Command::new(BIN).arg("inject").args(args))
}

/// A bundle directory with a busybox rootfs whose index.html reads `index`, and the
/// `config.json` of `runc spec` edited to run busybox httpd in a new network namespace,
/// not on a terminal, with `hooks.createRuntime` = [the network hook with argument `n`].
/// `edit` finishes the config (annotations, process.env, ...). natledger is not in it yet.
fn make_bundle(bundle: &Path, net_hook: &Path, n: u8, index: &str, edit: impl FnOnce(&mut Value)) {
    let rootfs = bundle.join("rootfs");
    busybox_rootfs(&rootfs);
    set_index_html(&rootfs, index);
    let out = output(Command::new("runc").arg("spec").current_dir(bundle));
    assert_ok(&out, "runc spec");
    let path = bundle.join("config.json");
    let mut config = read_json(&path);
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!(HTTPD_ARGS);
    let namespaces = config["linux"]["namespaces"]
        .as_array()
        .expect("runc spec: linux.namespaces");
    assert!(
        namespaces
            .iter()
            .any(|ns| ns["type"] == "network" && ns.get("path").is_none()),
        "runc spec makes a new network namespace: {namespaces:?}"
    );
    config["hooks"] = json!({
        "createRuntime": [{"path": net_hook, "args": ["net-hook", n.to_string()]}],
    });
    edit(&mut config);
    write_json(&path, &config);
}

/// A runc host: a [`Node`] (topology, natledger state dir, backend under test), a runc
/// `--root` and the network hook, all in the node's temp dir.
struct Host {
    node: Node,
    root: PathBuf,
    net_hook: PathBuf,
    /// The node's dump once natledger's shared chains exist (they stay by design): what every
    /// test must come back to.
    before: String,
}

impl Host {
    fn new(backend: Backend) -> Host {
        let node = Node::new(backend);
        let root = node.dir.path().join("runc-root");
        let net_hook = node.dir.path().join("net-hook");
        std::fs::create_dir_all(&root).expect("runc root");
        std::fs::write(&net_hook, NET_HOOK).expect("write the network hook");
        std::fs::set_permissions(
            &net_hook,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod the network hook");
        node.warm_up();
        Host {
            before: node.dump(),
            node,
            root,
            net_hook,
        }
    }

    /// Waits until container N answers on the host port on every one of [`paths`].
    fn assert_answers(&self, n: u8) {
        for (what, ns, dst) in &paths(self) {
            http_wait(ns, *dst, &body(n), START)
                .unwrap_or_else(|e| panic!("{:?} {what}: {e}", self.node.backend));
        }
    }

    /// After container `id`'s delete: no manifest, and every table of both backends and both
    /// families exactly as [`Host::before`].
    fn assert_restored(&self, id: &str, what: &str) {
        let backend = self.node.backend;
        assert!(
            !self.node.manifest_exists(id),
            "{backend:?}: {id}'s manifest left"
        );
        assert_eq!(
            self.node.dump(),
            self.before,
            "{backend:?}: {what} leaves every table as it was"
        );
    }

    /// runc's container id for `name`: unique across concurrent tests (cgroups are global).
    fn id(&self, name: &str) -> String {
        format!("{}-{name}", self.node.topo.prefix())
    }

    /// `nsenter --net=NODE runc --root ROOT ARGS...`, output captured (never for a command
    /// that leaves a container holding stdio).
    fn runc(&self, args: &[&str]) -> Output {
        output(
            nsenter_net(self.node.topo.node(), "runc")
                .arg("--root")
                .arg(&self.root)
                .args(args),
        )
    }

    /// A bundle for container `name` at address N = `n`, serving "container N", publishing
    /// [`PORTS`] through the annotation, with natledger injected.
    fn bundle(&self, name: &str, n: u8) -> PathBuf {
        let bundle = self.bundle_dir(name);
        make_bundle(&bundle, &self.net_hook, n, &body(n), |c| {
            c["annotations"] = json!({"io.natledger.ports": PORTS});
        });
        let out = inject(&[
            bundle.to_str().expect("utf-8 bundle"),
            "--hook-env",
            &format!("NATLEDGER_STATE_DIR={}", self.node.state_dir().display()),
            "--hook-env",
            &format!("NATLEDGER_BACKEND={}", self.node.backend.name()),
        ]);
        assert_ok(&out, "natledger inject");
        bundle
    }

    fn bundle_dir(&self, name: &str) -> PathBuf {
        let dir = self.node.dir.path().join("runc-bundles").join(name);
        std::fs::create_dir_all(&dir).expect("bundle dir");
        dir
    }

    /// Starts container `name` from `bundle` with `ARGV run -d`, where ARGV is
    /// `runc --root ROOT` or a wrapper around it; the container's stdio goes to a log file.
    fn start_with(&self, name: &str, bundle: &Path, argv: &[&str]) -> Running<'_> {
        let id = self.id(name);
        let log_path = self.node.dir.path().join(format!("{name}.log"));
        let log = File::create(&log_path).expect("container log");
        let status = nsenter_net(self.node.topo.node(), argv[0])
            .args(&argv[1..])
            .args(["run", "-d", "--bundle"])
            .arg(bundle)
            .arg(&id)
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .status()
            .unwrap_or_else(|e| panic!("cannot run nsenter {argv:?}: {e}"));
        // From here on the guard deletes whatever runc may have left.
        let running = Running {
            host: self,
            id,
            deleted: false,
        };
        assert!(
            status.success(),
            "{argv:?} run -d {} failed ({status}): {}",
            running.id,
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        running
    }

    fn start(&self, name: &str, bundle: &Path) -> Running<'_> {
        let root = self.root.to_str().expect("utf-8 root");
        self.start_with(name, bundle, &["runc", "--root", root])
    }

    /// Every container rule in the node's dump (they carry "natledger:<id>"), each as
    /// "<backend> <family>: <rule>".
    fn rule_lines(&self) -> Vec<String> {
        container_rules(&self.node.dump())
            .into_iter()
            .map(|(set, rule)| format!("{set}: {rule}"))
            .collect()
    }
}

/// What container N serves.
fn body(n: u8) -> String {
    format!("container {n}\n")
}

/// A container runc knows about; dropping it runs `runc delete -f` (poststop included)
/// unless [`Running::delete`] already did.
struct Running<'a> {
    host: &'a Host,
    id: String,
    deleted: bool,
}

impl Running<'_> {
    fn state(&self) -> Value {
        let out = self.host.runc(&["state", &self.id]);
        assert_ok(&out, &format!("runc state {}", self.id));
        serde_json::from_slice(&out.stdout).expect("runc state prints JSON")
    }

    /// `runc kill ID KILL`, then waits until runc reports the container stopped. Its
    /// rules stay until [`Running::delete`] runs poststop.
    fn kill(&self) {
        assert_ok(
            &self.host.runc(&["kill", &self.id, "KILL"]),
            &format!("runc kill {}", self.id),
        );
        assert!(
            poll(T, || self.state()["status"] == "stopped"),
            "{} not stopped {T:?} after SIGKILL: {}",
            self.id,
            self.state()
        );
    }

    /// `runc delete ID` (which runs the poststop hooks); the container must be stopped.
    fn delete(mut self) {
        let out = self.host.runc(&["delete", &self.id]);
        self.deleted = true;
        assert_ok(&out, &format!("runc delete {}", self.id));
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let out = self.host.runc(&["delete", "-f", &self.id]);
        if !out.status.success() {
            eprintln!(
                "warning: runc delete -f {} failed ({}): {}",
                self.id,
                out.status,
                stderr(&out).trim()
            );
        }
    }
}

/// The paths from outside the container to the host port: the external client to the node
/// address (IPv4 and IPv6), and the node itself through 127.0.0.1 and its own addresses.
fn paths(host: &Host) -> Vec<(&'static str, String, SocketAddr)> {
    let ext = host.node.topo.ext().to_string();
    let node = host.node.topo.node().to_string();
    vec![
        ("external", ext.clone(), sock(NODE_V4, HOST_PORT)),
        ("external v6", ext, sock(NODE_V6, HOST_PORT)),
        (
            "node localhost",
            node.clone(),
            sock(Ipv4Addr::LOCALHOST, HOST_PORT),
        ),
        ("node ip", node.clone(), sock(NODE_V4, HOST_PORT)),
        ("node ip v6", node, sock(NODE_V6, HOST_PORT)),
    ]
}

/// runc run -d → the container's httpd answers on the host port on every path; runc kill +
/// runc delete (poststop) → every table in both backends and both families is exactly as it
/// was, the manifest is gone and the port is closed.
#[test]
fn runc_container_is_forwarded_and_delete_restores_the_tables() {
    both(|backend| {
        let host = Host::new(backend);

        let bundle = host.bundle("web", 2);
        let started = Instant::now();
        let c = host.start("web", &bundle);
        let pid = c.state()["pid"]
            .as_u64()
            .expect("pid of a running container");
        assert!(pid > 1, "{backend:?}: pid {pid}");
        host.assert_answers(2);
        eprintln!(
            "{backend:?}: runc run -d to every path answering: {:?}",
            started.elapsed()
        );
        assert!(host.node.manifest_exists(&c.id), "{backend:?}: manifest");
        let rules = host.rule_lines();
        assert!(
            rules
                .iter()
                .any(|l| l.contains(&c.id) && l.contains("10.77.0.2")),
            "{backend:?}: a DNAT rule to 10.77.0.2 tagged {}:\n{}",
            c.id,
            rules.join("\n")
        );

        let id = c.id.clone();
        c.kill();
        c.delete();
        host.assert_restored(&id, "runc delete (poststop)");
        for (what, ns, dst) in &paths(&host) {
            assert!(
                http_get(ns, *dst, T).is_err(),
                "{backend:?} {what}: still answering after delete"
            );
        }
        let list = host.runc(&["list", "-q"]);
        assert_ok(&list, "runc list");
        assert_eq!(
            String::from_utf8_lossy(&list.stdout).trim(),
            "",
            "{backend:?}"
        );
    });
}

/// Twenty container generations on one host port, each at a new address (10.77.0.10 to
/// .29), in the order a restart produces: the old container dies (SIGKILL; its poststop has
/// not run, so its rule is still there, pointing at a dead address), the new one starts and
/// must answer at once, then the old one's poststop runs and must not disturb the new one.
/// After the last delete the tables are exactly as before the first start.
#[test]
fn twenty_restarts_on_one_port_newest_answers_nothing_accumulates() {
    both(|backend| {
        let host = Host::new(backend);
        let ext = host.node.topo.ext().to_string();
        let node = host.node.topo.node().to_string();
        let started = Instant::now();

        let mut previous: Option<Running> = None;
        for n in 10..30u8 {
            let cycle = Instant::now();
            let name = format!("gen{n}");
            let bundle = host.bundle(&name, n);
            if let Some(old) = &previous {
                old.kill();
                let rules = host.rule_lines();
                assert!(
                    rules.iter().any(|l| l.contains(&old.id)),
                    "{backend:?}: {}'s rules stay until its poststop:\n{}",
                    old.id,
                    rules.join("\n")
                );
            }
            let c = host.start(&name, &bundle);
            http_wait(&ext, sock(NODE_V4, HOST_PORT), &body(n), START).unwrap_or_else(|e| {
                panic!(
                    "{backend:?} generation {n}, the previous one dead but not deleted: {e}\n{}",
                    host.rule_lines().join("\n")
                )
            });
            if let Some(old) = previous.take() {
                let old_id = old.id.clone();
                old.delete();
                let rules = host.rule_lines();
                assert!(
                    !rules.iter().any(|l| l.contains(&old_id)),
                    "{backend:?}: {old_id}'s rules stay after its delete:\n{}",
                    rules.join("\n")
                );
            }
            for dst in [sock(NODE_V4, HOST_PORT), sock(NODE_V6, HOST_PORT)] {
                assert_eq!(
                    http_get(&ext, dst, T).ok(),
                    Some(body(n)),
                    "{backend:?} generation {n}: external {dst} after the old one's delete"
                );
            }
            assert_eq!(
                http_get(&node, sock(Ipv4Addr::LOCALHOST, HOST_PORT), T).ok(),
                Some(body(n)),
                "{backend:?} generation {n}: node localhost"
            );
            eprintln!("{backend:?} generation {n}: {:?}", cycle.elapsed());
            previous = Some(c);
        }
        let last = previous.take().expect("twenty generations");
        let last_id = last.id.clone();
        last.kill();
        last.delete();
        eprintln!("{backend:?}: twenty generations in {:?}", started.elapsed());
        host.assert_restored(&last_id, "twenty generations");
    });
}

/// The wrapper runtime in front of runc, with a bundle that asks for ports only through
/// `process.env` (as `docker run -e NATLEDGER_PORTS=... -e NATLEDGER_IP=...` leaves them):
/// `natledger runtime --natledger-runtime RUNC --natledger-hook-env ... --root R run -d`
/// copies them into the annotations, injects the hooks after the network hook and runs runc.
/// Every other command goes through a `natledger-runtime` symlink (finding runc by itself)
/// unchanged, exit status included; its delete restores the tables.
#[test]
fn wrapper_runtime_injects_from_process_env_and_passes_the_rest_through() {
    both(|backend| {
        let host = Host::new(backend);
        let node = host.node.topo.node();
        let bundle = host.bundle_dir("wrapped");
        let ips = "10.77.0.3,fd77::3";
        make_bundle(&bundle, &host.net_hook, 3, &body(3), |c| {
            let env = c["process"]["env"]
                .as_array_mut()
                .expect("runc spec: process.env");
            env.push(json!(format!("NATLEDGER_PORTS={PORTS}")));
            env.push(json!(format!("NATLEDGER_IP={ips}")));
        });
        let hook_env = [
            format!("NATLEDGER_STATE_DIR={}", host.node.state_dir().display()),
            format!("NATLEDGER_BACKEND={}", backend.name()),
        ];
        let root = host.root.to_str().expect("utf-8 root");
        let c = host.start_with(
            "wrapped",
            &bundle,
            &[
                BIN,
                "runtime",
                "--natledger-runtime",
                "/usr/sbin/runc",
                "--natledger-hook-env",
                &hook_env[0],
                "--natledger-hook-env",
                &hook_env[1],
                "--root",
                root,
            ],
        );
        let config = read_json(&bundle.join("config.json"));
        assert_eq!(
            config["annotations"]["io.natledger.ports"], PORTS,
            "{backend:?}"
        );
        assert_eq!(config["annotations"]["io.natledger.ip"], ips, "{backend:?}");
        let env: Vec<&str> = hook_env.iter().map(String::as_str).collect();
        assert_eq!(
            config["hooks"]["createRuntime"],
            json!([
                {"path": host.net_hook, "args": ["net-hook", "3"]},
                hook_entry(BIN, "create-runtime", &env),
            ]),
            "{backend:?}: natledger after the network hook"
        );
        assert_eq!(
            config["hooks"]["poststop"],
            json!([hook_entry(BIN, "poststop", &env)]),
            "{backend:?}"
        );
        host.assert_answers(3);

        let wrapper = host.node.dir.path().join("natledger-runtime");
        std::os::unix::fs::symlink(BIN, &wrapper).expect("natledger-runtime symlink");
        let through = |args: &[&str]| {
            output(
                nsenter_net(node, &wrapper)
                    .env_remove("NATLEDGER_RUNTIME")
                    .args(["--root", root])
                    .args(args),
            )
        };
        let state = through(&["state", &c.id]);
        assert_ok(&state, "natledger-runtime state");
        let state: Value = serde_json::from_slice(&state.stdout).expect("state JSON");
        assert_eq!(state["id"], c.id.as_str(), "{backend:?}");
        assert_eq!(state["status"], "running", "{backend:?}");
        let missing = host.id("missing");
        assert_eq!(
            through(&["state", &missing]).status.code(),
            host.runc(&["state", &missing]).status.code(),
            "{backend:?}: runc's exit status comes through"
        );
        assert_ok(&through(&["kill", &c.id, "KILL"]), "natledger-runtime kill");
        assert!(
            poll(T, || c.state()["status"] == "stopped"),
            "{backend:?}: stopped"
        );
        let mut c = c;
        let deleted = through(&["delete", &c.id]);
        c.deleted = deleted.status.success();
        assert_ok(&deleted, "natledger-runtime delete");
        host.assert_restored(&c.id, "delete through the wrapper");
    });
}

// ---------------------------------------------------------------------------
// natledger inject
// ---------------------------------------------------------------------------

/// A bundle as a runtime's caller leaves it: `runc spec` plus the network hook, an existing
/// poststop hook and a field natledger knows nothing about.
fn plain_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).expect("bundle dir");
    make_bundle(
        &bundle,
        Path::new("/usr/local/bin/net-hook"),
        7,
        "7\n",
        |c| {
            c["annotations"] = json!({"io.natledger.ports": PORTS, "org.example": "kept"});
            c["hooks"]["poststop"] =
                json!([{"path": "/usr/local/bin/cleanup", "args": ["cleanup"]}]);
            c["x-vendor"] = json!({"z": 1, "a": [true, null]});
        },
    );
    bundle
}

fn hook_entry(path: &str, stage: &str, env: &[&str]) -> Value {
    json!({"path": path, "args": ["natledger", "hook", stage], "env": env, "timeout": 10})
}

/// `value` serialized without `hooks`: equal strings mean every other field is kept, with
/// its key order.
fn without_hooks(value: &Value) -> String {
    let mut value = value.clone();
    value
        .as_object_mut()
        .expect("config.json is an object")
        .shift_remove("hooks");
    value.to_string()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read bundle dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// inject appends natledger after the hooks already there (the network hook stays first),
/// keeps every other field and its key order, leaves no temporary file behind, and a second
/// run leaves the file byte for byte as the first did.
#[test]
fn inject_appends_after_existing_hooks_keeps_the_rest_and_is_idempotent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = plain_bundle(dir.path());
    let config = bundle.join("config.json");
    let original = read_json(&config);
    let files = names(&bundle);
    let b = bundle.to_str().expect("utf-8");
    let env = ["NATLEDGER_STATE_DIR=/run/x", "NATLEDGER_BACKEND=nft"];
    let args = [b, "--hook-env", env[0], "--hook-env", env[1]];

    assert_ok(&inject(&args), "natledger inject");
    let first = std::fs::read(&config).expect("read config.json");
    let injected = read_json(&config);
    // createRuntime: the network hook first; poststop: the existing cleanup hook first.
    for (stage, arg) in [
        ("createRuntime", "create-runtime"),
        ("poststop", "poststop"),
    ] {
        assert_eq!(
            injected["hooks"][stage],
            json!([original["hooks"][stage][0], hook_entry(BIN, arg, &env)]),
            "{stage}: the hook already there first, natledger after it"
        );
    }
    assert_eq!(
        without_hooks(&injected),
        without_hooks(&original),
        "every other field kept, in its order"
    );
    assert_eq!(
        names(&bundle),
        files,
        "no temporary file left in the bundle"
    );

    assert_ok(&inject(&args), "second natledger inject");
    assert_eq!(
        std::fs::read(&config).expect("read config.json"),
        first,
        "a second inject leaves config.json byte for byte as it was"
    );
}

/// A config.json straight from `runc spec` has no `hooks`: inject adds them at the end,
/// natledger's entries alone, and keeps everything else.
#[test]
fn inject_adds_hooks_to_a_config_without_any() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = output(Command::new("runc").arg("spec").current_dir(dir.path()));
    assert_ok(&out, "runc spec");
    let config = dir.path().join("config.json");
    let original = read_json(&config);
    assert!(original.get("hooks").is_none(), "runc spec: {original}");
    let env = ["NATLEDGER_BACKEND=legacy"];
    let out = inject(&[dir.path().to_str().expect("utf-8"), "--hook-env", env[0]]);
    assert_ok(&out, "natledger inject");
    let injected = read_json(&config);
    assert_eq!(
        injected["hooks"],
        json!({
            "createRuntime": [hook_entry(BIN, "create-runtime", &env)],
            "poststop": [hook_entry(BIN, "poststop", &env)],
        })
    );
    assert_eq!(without_hooks(&injected), without_hooks(&original));
}

/// An existing natledger entry (same path and args) is replaced where it stands, never
/// duplicated: a later inject with other hook environment and `--binary` only updates it.
#[test]
fn inject_replaces_its_own_entries_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = plain_bundle(dir.path());
    let config = bundle.join("config.json");
    let b = bundle.to_str().expect("utf-8");
    let binary = "/opt/natledger/bin/natledger";

    let out = inject(&[
        b,
        "--binary",
        binary,
        "--hook-env",
        "NATLEDGER_BACKEND=legacy",
    ]);
    assert_ok(&out, "inject --binary");
    let net_hook = read_json(&config)["hooks"]["createRuntime"][0].clone();
    let out = inject(&[b, "--binary", binary, "--hook-env", "NATLEDGER_BACKEND=nft"]);
    assert_ok(&out, "inject --binary again");
    let hooks = read_json(&config)["hooks"].clone();
    let env = ["NATLEDGER_BACKEND=nft"];
    assert_eq!(
        hooks["createRuntime"],
        json!([net_hook, hook_entry(binary, "create-runtime", &env)]),
        "createRuntime"
    );
    assert_eq!(
        hooks["poststop"].as_array().map(Vec::len),
        Some(2),
        "poststop: {}",
        hooks["poststop"]
    );
    assert_eq!(hooks["poststop"][1], hook_entry(binary, "poststop", &env));
}

/// A config.json that is not an OCI config is refused (exit status 1) and left untouched.
#[test]
fn inject_refuses_a_malformed_config_and_leaves_it_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).expect("bundle dir");
    let config = bundle.join("config.json");
    let b = bundle.to_str().expect("utf-8");
    let cases = [
        (
            "truncated JSON",
            r#"{"ociVersion": "1.0.2", "process": {"args": ["#,
        ),
        ("not an object", r#"["ociVersion", "1.0.2"]"#),
        (
            "hooks not an object",
            r#"{"ociVersion": "1.0.2", "hooks": "none"}"#,
        ),
        (
            "createRuntime not a list",
            r#"{"ociVersion": "1.0.2", "hooks": {"createRuntime": {"path": "/x"}}}"#,
        ),
        ("empty file", ""),
    ];
    for (what, text) in cases {
        std::fs::write(&config, text).expect("write config.json");
        let out = inject(&[b, "--hook-env", "NATLEDGER_BACKEND=nft"]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{what}: exit status 1 expected; stderr: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).trim().is_empty(), "{what}: says why");
        assert_eq!(
            std::fs::read_to_string(&config).expect("read config.json"),
            text,
            "{what}: config.json unchanged"
        );
        assert_eq!(
            names(&bundle),
            ["config.json"],
            "{what}: no temporary file left"
        );
    }
}

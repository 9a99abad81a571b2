//! runc or crun used directly in a [`Node`]'s network namespace: bundles made by the runtime's
//! own `spec`, a busybox httpd container, a network hook of the test's own (in the role of a
//! CNI plugin) that runs before natledger's hooks, and `natledger inject` putting natledger's
//! hooks into `config.json`. The runtime runs with only the network namespace entered
//! (`nsenter --net`): the node namespace is the "host", so every rule lands there and the
//! machine's own tables are never touched. The runtime's state lives in a temporary `--root`,
//! and a guard deletes every container a test created.
//!
//! ```text
//! Runtime::{Runc, Crun}          which runtime; crun runs in a private mount namespace
//! make_bundle(rt, dir, hook, n)  busybox rootfs + `RT spec` running httpd, the network hook
//! Host::new / Host::with         a Node, the runtime's --root and the network hook
//! host.bundle(name, n)           make_bundle + the ports annotation + `natledger inject`
//! host.start / host.create       `run -d` / `create`: a Running guard (`delete -f`)
//! paths(host)                    external v4/v6, node localhost, node ip v4/v6
//! ```

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
/// The host port every test container publishes (to the container's port 80).
pub const HOST_PORT: u16 = 8080;
pub const PORTS: &str = "8080:80";
/// How long a freshly started container may take to answer.
pub const START: Duration = Duration::from_secs(5);
pub const T: Duration = Duration::from_secs(3);

/// The OCI runtime a [`Host`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    Runc,
    /// Debian 12's crun (1.8.1) refuses a hybrid cgroup host ("cgroups in hybrid mode not
    /// supported"), so every crun command runs in a private mount namespace whose
    /// `/sys/fs/cgroup` is a cgroup2 mount, with `--cgroup-manager=disabled` ([`CRUN_SH`]);
    /// the mount namespace dies with the command.
    Crun,
}

/// What runs every crun command (`sh -c CRUN_SH crun ARGS...`, inside `unshare --mount
/// --propagation private`): a cgroup2-only `/sys/fs/cgroup` in the private mount namespace,
/// then crun without a cgroup manager.
pub const CRUN_SH: &str =
    "mount -t cgroup2 none /sys/fs/cgroup && exec crun --cgroup-manager=disabled \"$@\"";

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Crun => "crun",
        }
    }

    /// The command line before `--root ROOT ARGS...`.
    pub fn argv(self) -> &'static [&'static str] {
        match self {
            Runtime::Runc => &["runc"],
            Runtime::Crun => &[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                CRUN_SH,
                "crun",
            ],
        }
    }
}

/// createRuntime hook (runs in the runtime's namespaces, i.e. the node's network namespace,
/// with the container's state on stdin): a veth pair `vr<N>` / `eth0` whose `eth0` goes into
/// the container's network namespace with 10.77.0.N/24 and fd77::N/64, default routes via the
/// node's bridge addresses, and the host end on br0 with hairpin on. N is the hook's first
/// argument. The runtime gives hooks only the environment in config.json (none here).
pub const NET_HOOK: &str = r#"#!/bin/sh
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

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

pub fn write_json(path: &Path, value: &Value) {
    let text = serde_json::to_string_pretty(value).expect("serialize config.json");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// `natledger inject ARGS...`; inject only edits a file, so no namespace is needed.
pub fn inject(args: &[&str]) -> Output {
    output(Command::new(BIN).arg("inject").args(args))
}

/// A bundle directory with a busybox rootfs whose index.html reads `index`, and the
/// `config.json` of `RUNTIME spec` edited to run busybox httpd in a new network namespace,
/// not on a terminal, with `hooks.createRuntime` = [the network hook with argument `n`].
/// `edit` finishes the config (annotations, process.env, ...). natledger is not in it yet.
pub fn make_bundle(
    runtime: Runtime,
    bundle: &Path,
    net_hook: &Path,
    n: u8,
    index: &str,
    edit: impl FnOnce(&mut Value),
) {
    let spec = runtime.name();
    let rootfs = bundle.join("rootfs");
    busybox_rootfs(&rootfs);
    set_index_html(&rootfs, index);
    let out = output(Command::new(spec).arg("spec").current_dir(bundle));
    assert_ok(&out, &format!("{spec} spec"));
    let path = bundle.join("config.json");
    let mut config = read_json(&path);
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!(HTTPD_ARGS);
    let namespaces = config["linux"]["namespaces"]
        .as_array()
        .unwrap_or_else(|| panic!("{spec} spec: linux.namespaces"));
    assert!(
        namespaces
            .iter()
            .any(|ns| ns["type"] == "network" && ns.get("path").is_none()),
        "{spec} spec makes a new network namespace: {namespaces:?}"
    );
    config["hooks"] = json!({
        "createRuntime": [{"path": net_hook, "args": ["net-hook", n.to_string()]}],
    });
    edit(&mut config);
    write_json(&path, &config);
}

/// A runtime host: a [`Node`] (topology, natledger state dir, backend under test), the
/// runtime's `--root` and the network hook, all in the node's temp dir.
pub struct Host {
    pub runtime: Runtime,
    pub node: Node,
    pub root: PathBuf,
    pub net_hook: PathBuf,
    /// The node's dump once natledger's shared chains exist (they stay by design): what every
    /// test must come back to.
    pub before: String,
}

impl Host {
    /// A runc host.
    pub fn new(backend: Backend) -> Host {
        Host::with(Runtime::Runc, backend)
    }

    pub fn with(runtime: Runtime, backend: Backend) -> Host {
        let node = Node::new(backend);
        let root = node.dir.path().join(format!("{}-root", runtime.name()));
        let net_hook = node.dir.path().join("net-hook");
        std::fs::create_dir_all(&root).expect("runtime root");
        std::fs::write(&net_hook, NET_HOOK).expect("write the network hook");
        std::fs::set_permissions(
            &net_hook,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod the network hook");
        node.warm_up();
        Host {
            before: node.dump(),
            runtime,
            node,
            root,
            net_hook,
        }
    }

    /// Waits until container N answers on the host port on every one of [`paths`].
    pub fn assert_answers(&self, n: u8) {
        for (what, ns, dst) in &paths(self) {
            http_wait(ns, *dst, &body(n), START)
                .unwrap_or_else(|e| panic!("{:?} {what}: {e}", self.node.backend));
        }
    }

    /// After container `id`'s delete: no manifest, and every table of every backend and both
    /// families exactly as [`Host::before`].
    pub fn assert_restored(&self, id: &str, what: &str) {
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

    /// After the last delete: the host port closed on every one of [`paths`], and the
    /// runtime lists no container.
    pub fn assert_closed(&self, what: &str) {
        let backend = self.node.backend;
        for (path, ns, dst) in &paths(self) {
            assert!(
                http_get(ns, *dst, T).is_err(),
                "{backend:?} {path}: still answering after {what}"
            );
        }
        let list = self.run(&["list", "-q"]);
        assert_ok(&list, &format!("{} list", self.runtime.name()));
        assert_eq!(
            String::from_utf8_lossy(&list.stdout).trim(),
            "",
            "{backend:?}: {} list after {what}",
            self.runtime.name()
        );
    }

    /// The runtime's container id for `name`: unique across concurrent tests (cgroups are
    /// global).
    pub fn id(&self, name: &str) -> String {
        format!("{}-{name}", self.node.topo.prefix())
    }

    /// `nsenter --net=NODE RUNTIME --root ROOT ARGS...`.
    pub fn command(&self, args: &[&str]) -> Command {
        let argv = self.runtime.argv();
        let mut cmd = nsenter_net(self.node.topo.node(), argv[0]);
        cmd.args(&argv[1..])
            .arg("--root")
            .arg(&self.root)
            .args(args);
        cmd
    }

    /// [`Host::command`], output captured (never for a command that leaves a container
    /// holding stdio).
    pub fn run(&self, args: &[&str]) -> Output {
        output(&mut self.command(args))
    }

    /// A bundle for container `name` at address N = `n`, serving "container N", publishing
    /// [`PORTS`] through the annotation, with natledger injected.
    pub fn bundle(&self, name: &str, n: u8) -> PathBuf {
        let bundle = self.bundle_dir(name);
        make_bundle(self.runtime, &bundle, &self.net_hook, n, &body(n), |c| {
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

    pub fn bundle_dir(&self, name: &str) -> PathBuf {
        let dir = self
            .node
            .dir
            .path()
            .join(format!("{}-bundles", self.runtime.name()))
            .join(name);
        std::fs::create_dir_all(&dir).expect("bundle dir");
        dir
    }

    /// Runs `cmd --bundle BUNDLE ID` for container `name` (`run -d` or `create`); the
    /// container's stdio goes to a log file, since it keeps it.
    fn launch(&self, name: &str, bundle: &Path, mut cmd: Command) -> Running<'_> {
        let id = self.id(name);
        let log_path = self.node.dir.path().join(format!("{name}.log"));
        let log = File::create(&log_path).expect("container log");
        let status = cmd
            .arg("--bundle")
            .arg(bundle)
            .arg(&id)
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        // From here on the guard deletes whatever the runtime may have left.
        let running = Running {
            host: self,
            id,
            deleted: false,
        };
        assert!(
            status.success(),
            "{cmd:?} failed ({status}): {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        running
    }

    /// Starts container `name` from `bundle` with `ARGV run -d`, where ARGV is
    /// `runc --root ROOT` or a wrapper around it.
    pub fn start_with(&self, name: &str, bundle: &Path, argv: &[&str]) -> Running<'_> {
        let mut cmd = nsenter_net(self.node.topo.node(), argv[0]);
        cmd.args(&argv[1..]).args(["run", "-d"]);
        self.launch(name, bundle, cmd)
    }

    /// `RUNTIME run -d`: container `name` runs.
    pub fn start(&self, name: &str, bundle: &Path) -> Running<'_> {
        self.launch(name, bundle, self.command(&["run", "-d"]))
    }

    /// `RUNTIME create` (createRuntime runs here): container `name` is created, its process
    /// waits for [`Running::start`].
    pub fn create(&self, name: &str, bundle: &Path) -> Running<'_> {
        self.launch(name, bundle, self.command(&["create"]))
    }

    /// Among the container rules, one tagged with container `id` to 10.77.0.N (`n`), the
    /// container's address; `when` says at which step.
    pub fn assert_dnat(&self, id: &str, n: u8, when: &str) {
        let address = format!("10.77.0.{n}");
        let rules = self.rule_lines();
        assert!(
            rules.iter().any(|l| l.contains(id) && l.contains(&address)),
            "{:?} {when}: a DNAT rule to {address} tagged {id}:\n{}",
            self.node.backend,
            rules.join("\n")
        );
    }

    /// Every container rule in the node's dump (they carry "natledger:<id>"), each as
    /// "<backend> <family>: <rule>".
    pub fn rule_lines(&self) -> Vec<String> {
        container_rules(&self.node.dump())
            .into_iter()
            .map(|(set, rule)| format!("{set}: {rule}"))
            .collect()
    }
}

/// What container N serves.
pub fn body(n: u8) -> String {
    format!("container {n}\n")
}

/// A container the runtime knows about (created or running); dropping it runs `RUNTIME
/// delete -f` (poststop included) unless [`Running::delete`] already did.
pub struct Running<'a> {
    pub host: &'a Host,
    pub id: String,
    pub deleted: bool,
}

impl Running<'_> {
    /// `RUNTIME CMD ID ARGS...`, which must succeed.
    fn ok(&self, cmd: &str, args: &[&str]) -> Output {
        let out = self.host.run(&[&[cmd, self.id.as_str()], args].concat());
        let what = format!("{} {cmd} {}", self.host.runtime.name(), self.id);
        assert_ok(&out, &what);
        out
    }

    pub fn state(&self) -> Value {
        let out = self.ok("state", &[]);
        serde_json::from_slice(&out.stdout).expect("state prints JSON")
    }

    pub fn status(&self) -> String {
        self.state()["status"].as_str().unwrap_or("?").to_string()
    }

    /// `RUNTIME start ID`: the created container's process runs.
    pub fn start(&self) {
        self.ok("start", &[]);
    }

    /// Waits until the runtime reports the container stopped.
    pub fn wait_stopped(&self, why: &str) {
        assert!(
            poll(T, || self.status() == "stopped"),
            "{} not stopped {T:?} after {why}: {}",
            self.id,
            self.state()
        );
    }

    /// `RUNTIME kill ID KILL`, then waits until the runtime reports the container stopped.
    /// Its rules stay until [`Running::delete`] runs poststop.
    pub fn kill(&self) {
        self.ok("kill", &["KILL"]);
        self.wait_stopped("SIGKILL");
    }

    /// `RUNTIME delete ID` (which runs the poststop hooks); the container must be stopped.
    pub fn delete(mut self) {
        self.deleted = true;
        self.ok("delete", &[]);
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let out = self.host.run(&["delete", "-f", &self.id]);
        if !out.status.success() {
            eprintln!(
                "warning: {} delete -f {} failed ({}): {}",
                self.host.runtime.name(),
                self.id,
                out.status,
                stderr(&out).trim()
            );
        }
    }
}

/// The paths from outside the container to the host port: the external client to the node
/// address (IPv4 and IPv6), and the node itself through 127.0.0.1 and its own addresses.
pub fn paths(host: &Host) -> Vec<(&'static str, String, SocketAddr)> {
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

/// natledger's hook entry as `natledger inject` writes it.
pub fn hook_entry(path: &str, stage: &str, env: &[&str]) -> Value {
    json!({"path": path, "args": ["natledger", "hook", stage], "env": env, "timeout": 10})
}

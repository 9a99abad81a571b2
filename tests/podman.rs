//! podman end to end: natledger registered through the repo's hooks.d file, with podman 4.3,
//! runc and podman's own bridge network (CNI: Debian 12's podman comes without netavark), all
//! inside a node namespace and isolated in a temporary directory (storage, run root, locks,
//! network configuration, IPAM, hooks, cgroup parent).
//! Proven with HTTP through the host port to busybox httpd in the container, and with full
//! firewall dumps.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::*;

const IMAGE: &str = "localhost/natledger-busybox:latest";
/// podman's network inside the node namespace, away from the topology's 10.77/10.78 networks.
const NETWORK: &str = "natledger-test";
const BRIDGE_NAME: &str = "nlt-podman0";
const SUBNET: &str = "10.89.0.0/24";
const GATEWAY: &str = "10.89.0.1";
const T: Duration = Duration::from_secs(10);

/// podman with every piece of state under `own.dir`, run in network namespace `ns`.
struct Podman {
    ns: String,
    own: Owned,
}

impl Podman {
    /// Writes podman's configuration, the hook wrapper and the hooks.d file under
    /// `node.dir/podman`. New rules go to `node.backend`, manifests to `node.state_dir()`.
    fn new(node: &Node) -> Podman {
        let own = Owned::new(node.dir.path(), "podman");
        for sub in ["hooks", "net", "ipam", "tmp", "copy-tmp"] {
            std::fs::create_dir_all(own.dir.join(sub)).unwrap();
        }
        let podman = Podman {
            ns: node.topo.node().to_string(),
            own,
        };
        podman.write_config();
        podman.write_hook(node);
        podman
    }

    fn write_config(&self) {
        // lock_type "file" keeps the locks in the tmp dir (the default shm segment is shared
        // with the machine's podman); hooks_dir also reaches `podman container cleanup`, which
        // conmon starts with CONTAINERS_CONF but without --hooks-dir.
        let containers_conf = format!(
            r#"[network]
network_backend = "cni"
network_config_dir = "{net}"
cni_plugin_dirs = ["/usr/lib/cni", "/usr/libexec/cni", "/opt/cni/bin"]
default_network = "{NETWORK}"
default_subnet = "{SUBNET}"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
hooks_dir = ["{hooks}"]
image_copy_tmp_dir = "{copy_tmp}"
lock_type = "file"
num_locks = 64
runtime = "runc"
tmp_dir = "{tmp}"
"#,
            net = self.own.path("net"),
            hooks = self.own.path("hooks"),
            copy_tmp = self.own.path("copy-tmp"),
            tmp = self.own.path("tmp"),
        );
        std::fs::write(self.own.dir.join("containers.conf"), containers_conf).unwrap();
        let storage_conf = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            self.own.path("root"),
            self.own.path("runroot")
        );
        std::fs::write(self.own.dir.join("storage.conf"), storage_conf).unwrap();
        // Like Debian's 87-podman-bridge.conflist, with IPAM state kept here.
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "bridge", "bridge": BRIDGE_NAME, "isGateway": true, "ipMasq": true,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local", "dataDir": self.own.path("ipam"),
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
                {"type": "firewall"},
                {"type": "tuning"},
            ],
        });
        std::fs::write(
            self.own.dir.join("net").join(format!("{NETWORK}.conflist")),
            serde_json::to_string_pretty(&conflist).unwrap(),
        )
        .unwrap();
    }

    /// The repo's hooks.d file with `hook.path` pointing at a wrapper script that names the
    /// state directory and backend: podman runs poststop with an empty environment. Nothing
    /// else is set (no PATH), as in production.
    fn write_hook(&self, node: &Node) {
        let wrapper = self.own.dir.join("natledger-hook");
        let script = format!(
            "#!/bin/sh\nexec /usr/bin/env NATLEDGER_STATE_DIR='{}' NATLEDGER_BACKEND={} '{}' \"$@\" 2>>'{}'\n",
            node.state_dir().display(),
            node.backend.name(),
            BIN,
            self.own.path("hook.log"),
        );
        std::fs::write(&wrapper, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

        let shipped = format!("{}/hooks/natledger.json", env!("CARGO_MANIFEST_DIR"));
        let mut hook: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&shipped).unwrap()).unwrap();
        hook["hook"]["path"] = wrapper.display().to_string().into();
        std::fs::write(
            self.own.dir.join("hooks").join("natledger.json"),
            serde_json::to_string_pretty(&hook).unwrap(),
        )
        .unwrap();
    }

    /// `podman ARGS` in the node namespace, with this instance's configuration.
    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = nsenter_net(&self.ns, "podman");
        cmd.args(["--root", &self.own.path("root")])
            .args(["--runroot", &self.own.path("runroot")])
            .args(["--tmpdir", &self.own.path("tmp")])
            .args(["--storage-driver", "vfs"])
            .args(["--runtime", "runc"])
            .args(["--cgroup-manager", "cgroupfs"])
            .args(["--hooks-dir", &self.own.path("hooks")])
            .args(args)
            .env("CONTAINERS_CONF", self.own.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.own.dir.join("storage.conf"))
            .env("TMPDIR", self.own.dir.join("copy-tmp"));
        output(&mut cmd)
    }

    /// [`Podman::run`], asserting success; returns stdout, trimmed.
    fn ok(&self, args: &[&str]) -> String {
        let context = format!("--- hook log\n{}", self.hook_log());
        stdout_of(
            &self.run(args),
            &format!("podman {}", args.join(" ")),
            &context,
        )
    }

    /// `podman run -d` of httpd with these extra options; returns the container id.
    fn start(&mut self, name: &str, options: &[&str]) -> String {
        let fixed = [
            "--name",
            name,
            "--network",
            NETWORK,
            "--cgroup-parent",
            &self.own.cgroup_parent,
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
        ];
        let id = container_id(
            self.ok(&httpd_run_args(&[&fixed, options].concat(), IMAGE)),
            "podman",
        );
        self.own.ids.push(id.clone());
        id
    }

    fn hook_log(&self) -> String {
        std::fs::read_to_string(self.own.dir.join("hook.log")).unwrap_or_default()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- natledger hook log\n{}", self.hook_log());
        }
        let out = self.run(&["rm", "--all", "--force", "--time", "0"]);
        if !out.status.success() {
            eprintln!("warning: podman rm --all failed: {}", show(&out));
        }
        let left = self.own.reap(T);
        if !left.is_empty() {
            eprintln!("warning: podman left behind (now cleaned up): {left:#?}");
        }
    }
}

fn container_ip(podman: &Podman, id: &str) -> String {
    podman.ok(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        id,
    ])
}

/// `podman run --annotation io.natledger.ports=8080:80` on podman's bridge: createRuntime
/// installs the forward to the address CNI gave the container (found in its network
/// namespace), busybox httpd answers on the host port from the node (127.0.0.1 and the node's
/// address) and from an external client; `podman rm -f` runs poststop, which removes every
/// rule and the manifest. A container without the annotation never starts the hook.
#[test]
fn podman_hooks_d_forwards_the_port_and_rm_removes_it() {
    both(|backend| {
        let started = Instant::now();
        let node = Node::new(backend);
        let mut podman = Podman::new(&node);
        let tarball = image_tarball(node.dir.path());
        podman.ok(&["import", &tarball.display().to_string(), IMAGE]);
        let what = format!("podman, {backend:?}");

        let t = Instant::now();
        let id = podman.start("web", &["--annotation", "io.natledger.ports=8080:80"]);
        let run_time = t.elapsed();
        let ip = container_ip(&podman, &id);
        assert!(
            ip.starts_with("10.89.0."),
            "{what}: container address {ip:?} is not on podman's network {SUBNET}"
        );

        // The forward is in the backend under test, pointing at CNI's address.
        assert_forward(&node.dump(), backend, &id, 8080, &format!("{ip}:80"));
        assert!(node.manifest_exists(&id), "{what}: no manifest");

        // Real HTTP through the host port.
        let host = node.topo.node();
        let ext = node.topo.ext();
        let paths = [
            (
                "node 127.0.0.1",
                host,
                sock(std::net::Ipv4Addr::LOCALHOST, 8080),
            ),
            ("node address", host, sock(NODE_V4, 8080)),
            ("external client", ext, sock(NODE_V4, 8080)),
        ];
        for (path, ns, dst) in paths {
            if let Err(e) = http_wait(ns, dst, INDEX_HTML, T) {
                panic!("{what}, {path}: {e}\n{}", node.dump());
            }
        }

        // No annotation: the hooks.d `when` clause keeps natledger out entirely.
        let plain = podman.start("plain", &[]);
        assert!(
            !node.manifest_exists(&plain),
            "{what}: hook ran for a plain container"
        );
        let dump = node.dump();
        assert!(
            container_rules(&dump)
                .iter()
                .all(|(_, l)| !l.contains(&plain)),
            "{what}: rules for a plain container:\n{dump}"
        );
        podman.ok(&["rm", "--force", "--time", "0", &plain]);

        let t = Instant::now();
        podman.ok(&["rm", "--force", "--time", "0", &id]);
        let rm_time = t.elapsed();
        assert_removed(&node, &id, T);
        for (path, ns, dst) in paths {
            assert!(
                http_get(ns, dst, Duration::from_secs(1)).is_err(),
                "{what}, {path}: still answered after podman rm"
            );
        }
        let ps = podman.ok(&["ps", "--all", "--quiet"]);
        assert!(ps.is_empty(), "{what}: containers left: {ps}");
        podman.own.assert_clean(T);
        let hook_log = podman.hook_log();
        assert!(
            !hook_log.contains("error"),
            "{what}: the hook reported errors:\n{hook_log}"
        );
        eprintln!(
            "{what}: podman run {run_time:?}, podman rm {rm_time:?}, whole test {:?}",
            started.elapsed()
        );
    });
}

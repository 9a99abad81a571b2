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
        // default_ulimits: podman's own default (nofile 1048576) is above this machine's hard
        // limit; `podman pod create` has no --ulimit for the infra container.
        let containers_conf = format!(
            r#"[containers]
default_ulimits = ["nofile=10000:10000", "nproc=1000:1000"]

[network]
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

    /// `podman pod create` on podman's network, its infra container running busybox's sleep
    /// (Debian's podman comes without catatonit for its own pause image); returns the pod's and the infra
    /// container's ids.
    fn create_pod(&mut self, name: &str) -> (String, String) {
        let pod = self.ok(&[
            "pod",
            "create",
            "--name",
            name,
            "--network",
            NETWORK,
            "--cgroup-parent",
            &self.own.cgroup_parent,
            "--infra-image",
            IMAGE,
            // podman 4.3 splits it at spaces: no shell script. Stopped with --time 0.
            "--infra-command",
            "/bin/sleep 2147483647",
        ]);
        let infra = self.ok(&["pod", "inspect", "--format", "{{.InfraContainerID}}", &pod]);
        self.own.ids.push(pod.clone());
        self.own.ids.push(infra.clone());
        (pod, infra)
    }

    /// `podman run -d --pod POD --annotation io.natledger.ports=PORTS IMAGE COMMAND...`, as a
    /// user gives every container of the pod the annotation; returns the container id.
    fn run_in_pod(&mut self, name: &str, pod: &str, ports: &str, command: &[&str]) -> String {
        let annotation = format!("io.natledger.ports={ports}");
        let mut args = vec![
            "run",
            "-d",
            "--name",
            name,
            "--pod",
            pod,
            "--annotation",
            &annotation,
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=1000:1000",
            IMAGE,
        ];
        args.extend_from_slice(command);
        let id = container_id(self.ok(&args), "podman");
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
        let out = self.run(&["pod", "rm", "--all", "--force", "--time", "0"]);
        if !out.status.success() {
            eprintln!("warning: podman pod rm --all failed: {}", show(&out));
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

/// Asserts that busybox httpd answers on `port` from the node (127.0.0.1 and its address) and
/// from the external client.
fn assert_answers(node: &Node, port: u16, what: &str) {
    let paths = [
        (node.topo.node(), sock(std::net::Ipv4Addr::LOCALHOST, port)),
        (node.topo.node(), sock(NODE_V4, port)),
        (node.topo.ext(), sock(NODE_V4, port)),
    ];
    for (ns, dst) in paths {
        if let Err(e) = http_wait(ns, dst, INDEX_HTML, T) {
            panic!("{what}: {e}\n{}", node.dump());
        }
    }
}

/// Asserts that `dump` holds exactly one DNAT of `port`: `holder`'s, to `dest`, and no rule
/// of any other container.
fn assert_one_dnat(dump: &str, backend: Backend, holder: &str, port: u16, dest: &str, what: &str) {
    assert_eq!(
        dnats(dump, port).len(),
        1,
        "{what}: DNATs of {port}:\n{dump}"
    );
    assert_forward(dump, backend, holder, port, dest);
}

/// A podman pod whose containers all carry `--annotation io.natledger.ports=8080:80`, as a user
/// annotates every container of a pod: the first (httpd) installs the forward to the pod's
/// address; a sidecar in the pod starts too and shares it (its manifest says so, no rules of
/// its own, one DNAT); the port answers from the node and an external client. The sidecar's
/// removal changes nothing. With another sidecar running, the holder's stop keeps the rules
/// and its manifest; a new web server in the pod shares the kept rules and the port answers
/// again. `podman pod rm -f` leaves the tables exactly as before the pod, and no manifest.
#[test]
fn podman_pod_containers_share_one_forward_until_the_last_goes() {
    both(|backend| {
        let started = Instant::now();
        let what = format!("podman pod, {backend:?}");
        let node = Node::new(backend);
        node.warm_up();
        let mut podman = Podman::new(&node);
        let tarball = image_tarball(node.dir.path());
        podman.ok(&["import", &tarball.display().to_string(), IMAGE]);
        // CNI's own chains come with the network's first container and stay after it.
        let warm = podman.start("warm", &[]);
        podman.ok(&["rm", "--force", "--time", "0", &warm]);
        let before = node.dump();

        let t = Instant::now();
        let (pod, infra) = podman.create_pod("webpod");
        let web = podman.run_in_pod("web", &pod, "8080:80", &HTTPD_ARGS);
        let sidecar = podman.run_in_pod("sidecar", &pod, "8080:80", &WAIT_FOR_TERM);
        let start_time = t.elapsed();
        let dest = format!("{}:80", container_ip(&podman, &infra));
        let with_pod = node.dump();
        assert_one_dnat(&with_pod, backend, &web, 8080, &dest, &what);
        let mut expected = vec![format!("{web}.json"), format!("{sidecar}.json")];
        expected.sort();
        assert_eq!(node.manifests(), expected, "{what}: manifests");
        let mapping = serde_json::json!([{"host_ports": {"start": 8080, "end": 8080},
            "container_ports": {"start": 80, "end": 80}, "protocol": "tcp"}]);
        assert_eq!(
            node.manifest(&sidecar)["shares"],
            serde_json::json!([{"holder": web, "mappings": mapping}]),
            "{what}: the sidecar shares the web server's mapping"
        );
        assert_eq!(
            node.manifest(&web)["shared_by"],
            serde_json::json!([sidecar])
        );
        assert_answers(&node, 8080, &what);

        podman.ok(&["rm", "--force", "--time", "0", &sidecar]);
        assert!(
            !node.manifest_exists(&sidecar),
            "{what}: sidecar's manifest"
        );
        assert_eq!(node.dump(), with_pod, "{what}: the sidecar's removal");
        assert_answers(&node, 8080, &format!("{what}, sidecar removed"));

        // The holder stops while another member lives: its rules and manifest stay.
        let sidecar = podman.run_in_pod("sidecar2", &pod, "8080:80", &WAIT_FOR_TERM);
        assert_eq!(node.dump(), with_pod, "{what}: a second sidecar");
        podman.ok(&["stop", "--time", "0", &web]);
        let kept = format!("of container {web}: live container(s) {sidecar} in its network");
        assert!(
            poll(T, || podman.hook_log().contains(&kept)),
            "{what}: no `{kept}` in the hook log:\n{}",
            podman.hook_log()
        );
        assert_eq!(node.dump(), with_pod, "{what}: the holder's stop");
        assert!(node.manifest_exists(&web), "{what}: the holder's manifest");
        // A new web server in the pod shares the kept rules: the port answers again.
        let web2 = podman.run_in_pod("web2", &pod, "8080:80", &HTTPD_ARGS);
        assert_eq!(
            node.manifest(&web2)["shares"],
            serde_json::json!([{"holder": web, "mappings": mapping}]),
            "{what}: the new web server shares the stopped holder's mapping"
        );
        assert_eq!(node.dump(), with_pod, "{what}: the new web server");
        assert_answers(
            &node,
            8080,
            &format!("{what}, holder stopped, web2 serving"),
        );

        let t = Instant::now();
        podman.ok(&["pod", "rm", "--force", "--time", "0", &pod]);
        let rm_time = t.elapsed();
        let gone = poll(T, || node.manifests().is_empty() && node.dump() == before);
        assert!(gone, "{what}: manifests left: {:?}", node.manifests());
        assert_eq!(
            node.dump(),
            before,
            "{what}: the tables after podman pod rm"
        );
        let got = http_get(node.topo.ext(), sock(NODE_V4, 8080), Duration::from_secs(1));
        assert!(got.is_err(), "{what}: still answers: {got:?}");
        let ps = podman.ok(&["ps", "--all", "--quiet"]);
        assert!(ps.is_empty(), "{what}: containers left: {ps}");
        podman.own.assert_clean(T);
        let hook_log = podman.hook_log();
        assert!(
            !hook_log.contains("error"),
            "{what}: the hook reported errors:\n{hook_log}"
        );
        eprintln!(
            "{what}: pod + two containers {start_time:?}, podman pod rm {rm_time:?}, whole test {:?}",
            started.elapsed()
        );
    });
}

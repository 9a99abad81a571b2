//! podman 4.3 (Debian 12's: the CNI network backend, no netavark) in a node namespace, with
//! every piece of its state (storage, run root, locks, network configuration, IPAM, hooks,
//! cgroup parent) under a test-private directory. What differs between the suites that use
//! it (natledger as an OCI hook, natledger as a chained CNI plugin) is a [`PodmanConfig`].

use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};

use super::{
    BIN, Node, Owned, container_id, httpd_run_args, image_tarball, kill_pid, nsenter_net, output,
    poll, processes_naming, show, stdout_of,
};

/// The busybox image the suites import into podman's storage.
pub const PODMAN_IMAGE: &str = "localhost/natledger-busybox:latest";
const T: Duration = Duration::from_secs(10);
/// Every container's limits: podman's default nofile (1048576) is above this machine's hard
/// limit.
const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=10000:10000",
    "--ulimit",
    "nproc=1000:1000",
];

/// Where podman finds its CNI plugins.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PluginDir {
    /// The machine's directories (`/usr/lib/cni`, `/usr/libexec/cni`, `/opt/cni/bin`).
    System,
    /// A test-private directory: the machine's plugins linked from `/usr/lib/cni`, and
    /// `natledger` a link to the binary under test (what the install script makes).
    Private,
}

/// How one suite's podman is set up: its CNI network (the conflist is bridge + host-local,
/// then `chain`), where its plugins are, and whether natledger runs as an OCI hook.
pub struct PodmanConfig {
    pub network: &'static str,
    pub bridge: &'static str,
    pub subnet: &'static str,
    pub gateway: &'static str,
    /// The conflist's `cniVersion`.
    pub cni_version: &'static str,
    /// The bridge plugin's `ipMasq` (false: it writes no iptables rule).
    pub ip_masq: bool,
    /// The plugins after bridge, in order.
    pub chain: Vec<Value>,
    pub plugin_dir: PluginDir,
    /// natledger registered through the repo's hooks.d file (with a wrapper naming the node's
    /// state directory and backend: podman runs poststop with an empty environment).
    pub hook: bool,
}

/// podman with every piece of state under `own.dir`, run in network namespace `ns`.
pub struct Podman {
    pub ns: String,
    pub own: Owned,
    config: PodmanConfig,
    /// The named network namespaces (`/run/netns/cni-…`) of the containers `start` ran:
    /// podman removes one when it cleans its container up, which a container killed with its
    /// conmon, or a test failing before `rm`, never gets. Drop deletes those left.
    netns: Vec<std::path::PathBuf>,
}

impl Podman {
    /// Writes podman's configuration under `node.dir/podman` (and the plugin directory and
    /// the hook, as `config` asks). New rules go to `node.backend`, manifests to
    /// `node.state_dir()`.
    pub fn new(node: &Node, config: PodmanConfig) -> Podman {
        let own = Owned::new(node.dir.path(), "podman");
        for sub in ["hooks", "net", "ipam", "tmp", "copy-tmp", "cni-bin"] {
            std::fs::create_dir_all(own.dir.join(sub)).unwrap();
        }
        let podman = Podman {
            ns: node.topo.node().to_string(),
            own,
            config,
            netns: Vec::new(),
        };
        if podman.config.plugin_dir == PluginDir::Private {
            podman.install_plugins();
        }
        podman.write_config();
        if podman.config.hook {
            podman.write_hook(node);
        }
        podman
    }

    /// The test's CNI plugin directory ([`PluginDir::Private`]).
    fn install_plugins(&self) {
        let bin = self.own.dir.join("cni-bin");
        for entry in
            std::fs::read_dir("/usr/lib/cni").expect("/usr/lib/cni (containernetworking-plugins)")
        {
            let entry = entry.unwrap();
            std::os::unix::fs::symlink(entry.path(), bin.join(entry.file_name())).unwrap();
        }
        std::os::unix::fs::symlink(BIN, bin.join("natledger")).unwrap();
    }

    fn write_config(&self) {
        let c = &self.config;
        let plugin_dirs = match c.plugin_dir {
            PluginDir::System => r#""/usr/lib/cni", "/usr/libexec/cni", "/opt/cni/bin""#.into(),
            PluginDir::Private => format!("\"{}\"", self.own.path("cni-bin")),
        };
        // hooks_dir also reaches `podman container cleanup`, which conmon starts with
        // CONTAINERS_CONF but without --hooks-dir.
        let hooks_dir = if c.hook {
            format!("hooks_dir = [\"{}\"]\n", self.own.path("hooks"))
        } else {
            String::new()
        };
        // lock_type "file" keeps the locks in the tmp dir (the default shm segment is shared
        // with the machine's podman).
        // default_ulimits: podman's own default (nofile 1048576) is above this machine's hard
        // limit; `podman pod create` has no --ulimit for the infra container.
        let containers_conf = format!(
            r#"[containers]
default_ulimits = ["nofile=10000:10000", "nproc=1000:1000"]

[network]
network_backend = "cni"
network_config_dir = "{net}"
cni_plugin_dirs = [{plugin_dirs}]
default_network = "{network}"
default_subnet = "{subnet}"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
{hooks_dir}image_copy_tmp_dir = "{copy_tmp}"
lock_type = "file"
num_locks = 64
runtime = "runc"
tmp_dir = "{tmp}"
"#,
            net = self.own.path("net"),
            network = c.network,
            subnet = c.subnet,
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
        let bridge = json!({
            "type": "bridge", "bridge": c.bridge, "isGateway": true, "ipMasq": c.ip_masq,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local", "dataDir": self.own.path("ipam"),
                "routes": [{"dst": "0.0.0.0/0"}],
                "ranges": [[{"subnet": c.subnet, "gateway": c.gateway}]],
            },
        });
        let plugins: Vec<Value> = std::iter::once(bridge).chain(c.chain.clone()).collect();
        let conflist = json!({"cniVersion": c.cni_version, "name": c.network, "plugins": plugins});
        std::fs::write(
            self.own
                .dir
                .join("net")
                .join(format!("{}.conflist", c.network)),
            serde_json::to_string_pretty(&conflist).unwrap(),
        )
        .unwrap();
    }

    /// The repo's hooks.d file with `hook.path` pointing at a wrapper script that names the
    /// state directory and backend. Nothing else is set (no PATH), as in production.
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
        let mut hook: Value =
            serde_json::from_str(&std::fs::read_to_string(&shipped).unwrap()).unwrap();
        hook["hook"]["path"] = wrapper.display().to_string().into();
        std::fs::write(
            self.own.dir.join("hooks").join("natledger.json"),
            serde_json::to_string_pretty(&hook).unwrap(),
        )
        .unwrap();
    }

    /// `podman ARGS` in the node namespace, with this instance's configuration.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut cmd = nsenter_net(&self.ns, "podman");
        cmd.args(["--root", &self.own.path("root")])
            .args(["--runroot", &self.own.path("runroot")])
            .args(["--tmpdir", &self.own.path("tmp")])
            .args(["--storage-driver", "vfs"])
            .args(["--runtime", "runc"])
            .args(["--cgroup-manager", "cgroupfs"]);
        if self.config.hook {
            cmd.args(["--hooks-dir", &self.own.path("hooks")]);
        }
        cmd.args(args)
            .env("CONTAINERS_CONF", self.own.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.own.dir.join("storage.conf"))
            .env("TMPDIR", self.own.dir.join("copy-tmp"));
        output(&mut cmd)
    }

    /// [`Podman::run`], asserting success (naming the hook's log when there is a hook);
    /// returns stdout, trimmed.
    pub fn ok(&self, args: &[&str]) -> String {
        let context = if self.config.hook {
            format!("--- hook log\n{}", self.hook_log())
        } else {
            String::new()
        };
        stdout_of(
            &self.run(args),
            &format!("podman {}", args.join(" ")),
            &context,
        )
    }

    /// Imports the busybox image as [`PODMAN_IMAGE`].
    pub fn import_image(&self, node: &Node) {
        let tarball = image_tarball(node.dir.path());
        self.ok(&["import", &tarball.display().to_string(), PODMAN_IMAGE]);
    }

    /// `podman run -d` of httpd on the network with these extra options; returns the
    /// container id.
    pub fn start(&mut self, name: &str, options: &[&str]) -> String {
        let fixed = [
            "--name",
            name,
            "--network",
            self.config.network,
            "--cgroup-parent",
            &self.own.cgroup_parent,
        ];
        let id = container_id(
            self.ok(&httpd_run_args(
                &[&fixed[..], &ULIMITS, options].concat(),
                PODMAN_IMAGE,
            )),
            "podman",
        );
        self.own.ids.push(id.clone());
        let key = self.ok(&[
            "inspect",
            "--format",
            "{{.NetworkSettings.SandboxKey}}",
            &id,
        ]);
        if key.starts_with("/run/netns/") {
            self.netns.push(key.into());
        }
        id
    }

    /// `podman pod create` on the network, its infra container running busybox's sleep
    /// (Debian's podman comes without catatonit for its own pause image); returns the pod's
    /// and the infra container's ids.
    pub fn create_pod(&mut self, name: &str) -> (String, String) {
        let pod = self.ok(&[
            "pod",
            "create",
            "--name",
            name,
            "--network",
            self.config.network,
            "--cgroup-parent",
            &self.own.cgroup_parent,
            "--infra-image",
            PODMAN_IMAGE,
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
    pub fn run_in_pod(&mut self, name: &str, pod: &str, ports: &str, command: &[&str]) -> String {
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
        ];
        args.extend_from_slice(&ULIMITS);
        args.push(PODMAN_IMAGE);
        args.extend_from_slice(command);
        let id = container_id(self.ok(&args), "podman");
        self.own.ids.push(id.clone());
        id
    }

    /// The address podman's network gave container `id`.
    pub fn ip(&self, id: &str) -> String {
        self.ok(&[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            id,
        ])
    }

    /// SIGKILLs conmon first (so that it cannot start `podman container cleanup`, which would
    /// run DEL), then the container's process: the container dies and no DEL runs.
    pub fn kill_with_conmon(&self, id: &str) {
        let pids = self.ok(&[
            "inspect",
            "--format",
            "{{.State.ConmonPid}} {{.State.Pid}}",
            id,
        ]);
        let pids: Vec<u32> = pids
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(pids.len(), 2, "conmon and container pids of {id}: {pids:?}");
        for pid in pids {
            kill_pid(pid);
        }
        let dead = poll(T, || processes_naming(id).is_empty());
        assert!(dead, "{id}: processes left: {:?}", processes_naming(id));
    }

    /// `podman rm --force --time 0 ID`, asserting success.
    pub fn rm(&self, id: &str) {
        self.ok(&["rm", "--force", "--time", "0", id]);
    }

    /// What the hook wrapper wrote to stderr (empty without a hook).
    pub fn hook_log(&self) -> String {
        std::fs::read_to_string(self.own.dir.join("hook.log")).unwrap_or_default()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        if self.config.hook && std::thread::panicking() {
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
        let mut left = self.own.reap(T);
        for path in self.netns.iter().filter(|p| p.exists()) {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            left.push(format!("network namespace {name}"));
            let out = std::process::Command::new("ip")
                .args(["netns", "del", name.as_ref()])
                .output();
            if !out.is_ok_and(|o| o.status.success()) {
                eprintln!("warning: cannot delete network namespace {name}");
            }
        }
        if !left.is_empty() {
            eprintln!("warning: podman left behind (now cleaned up): {left:#?}");
        }
    }
}

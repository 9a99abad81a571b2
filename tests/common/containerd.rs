//! containerd (Debian's 1.6) serving the CRI in a node namespace, every piece of its state in
//! a temporary directory, natledger registered exactly as README.md's containerd snippet
//! says, and driven through `tests/cri/cri.py` (a CRI v1 client over gRPC; Debian has no
//! crictl).
//!
//! ```text
//! DIR/config.toml         version 2: root, state, sockets, CNI and the sandbox image here;
//!                         then the README's snippet, its BinaryName pointed at DIR's wrapper
//! DIR/natledger-runtime   the wrapper, with the test's state directory and backend
//! DIR/cni/                a bridge (cri0, POD_SUBNET) + host-local conflist, IPAM data in DIR;
//!                         with [`CniChain::Natledger`], natledger chained after bridge
//! DIR/cni-bin/            ([`CniChain::Natledger`], [`CniChain::Portmap`]) /usr/lib/cni's
//!                         plugins linked, and (Natledger) `natledger` a link to the binary
//!                         under test
//! DIR/containerd.sock     the CRI (and containerd's own API, for `ctr images import`)
//! ```
//!
//! Outside DIR, only what containerd and the CNI plugins always use: the pods' network
//! namespaces (`/var/run/netns/cni-…`), libcni's result cache (`/var/lib/cni/results`), runc's
//! root (`/run/containerd/runc/k8s.io/<id>`) and the shims' sockets (`/run/containerd/s`). Each
//! is named by a pod or container id this fixture records, and dropping it removes what is left.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

/// The pod sandbox ("pause") image: a shell that waits, and exits on SIGTERM or SIGINT.
pub const PAUSE_IMAGE: &str = "localhost/natledger-pause:test";
/// The image app containers run (busybox, [`super::busybox_rootfs`]; no entrypoint used).
pub const BUSYBOX_IMAGE: &str = "localhost/natledger-busybox:test";
/// The pods' subnet (on bridge `cri0` in the node namespace): not the topology's 10.77/10.78.
pub const POD_SUBNET: &str = "10.79.0.0/24";
/// A process that waits until SIGTERM or SIGINT and then exits 0 (as PID 1 too).
pub const WAIT_FOR_TERM: [&str; 3] = [
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; sleep 2147483647 & wait",
];
/// The BinaryName README.md's snippet names; the test puts its own wrapper's path there.
pub const README_BINARY: &str = "/usr/local/bin/natledger-runtime";

const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
const CRI_PY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cri/cri.py");
const SNIPPET_BEGIN: &str = "<!-- containerd-config:begin -->";
const SNIPPET_END: &str = "<!-- containerd-config:end -->";
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const T: Duration = Duration::from_secs(10);

/// The body of the ```toml block between README.md's containerd-config markers.
pub fn readme_containerd_snippet() -> String {
    let readme = std::fs::read_to_string(README).unwrap();
    let (_, rest) = readme
        .split_once(SNIPPET_BEGIN)
        .unwrap_or_else(|| panic!("README.md has no {SNIPPET_BEGIN}"));
    let (marked, _) = rest
        .split_once(SNIPPET_END)
        .unwrap_or_else(|| panic!("README.md has no {SNIPPET_END}"));
    let body = marked
        .trim()
        .strip_prefix("```toml\n")
        .and_then(|b| b.strip_suffix("```"))
        .unwrap_or_else(|| panic!("the marked README text is not one ```toml block:\n{marked}"));
    body.to_string()
}

/// Which annotations containerd copies into the specs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Annotations {
    /// README.md's snippet as it is: `pod_annotations`, the pod's into every spec of the pod.
    Pod,
    /// The snippet with `pod_annotations` replaced by `container_annotations` (README.md's
    /// alternative): each container's own, into its spec only.
    Container,
}

/// What containerd's CNI conflist chains after the bridge plugin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CniChain {
    /// bridge + host-local only (the CRI's port mappings reach no plugin).
    Bridge,
    /// bridge + host-local + `natledger` with `capabilities: {portMappings: true}` and its
    /// `stateDir` and `backend` the node's: RunPodSandbox's `port_mappings` reach natledger
    /// as `runtimeConfig.portMappings` (kubelet's hostPort path).
    Natledger,
    /// bridge + host-local + `portmap` (what a cluster's network installs) with natledger's
    /// `stateDir` and `backend` the node's as extra keys portmap ignores, and a plugin
    /// directory without `natledger`: what the DaemonSet's `install-cni` switches over
    /// (it changes only `type`, so natledger then finds the node's keys).
    Portmap,
}

/// How [`Containerd::start_with`] configures containerd.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub annotations: Annotations,
    pub cni: CniChain,
}

/// The network name of the fixture's conflist (`name`, what natledger records).
pub const CNI_NETWORK: &str = "natledger-cri";

/// Serialises this process's containerd fixtures: they share runc's root and the shims'
/// socket directory under /run/containerd, which the last one removes when it made them.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// containerd with the CRI plugin in a node namespace (see the module docs).
pub struct Containerd {
    pub own: Owned,
    child: Option<Child>,
    /// Pods made and not yet removed, with their network namespace (for the Drop).
    pods: Vec<(String, Option<PathBuf>)>,
    /// Every pod and container id ever made here (runc state and CNI cache are named by them).
    all_ids: Vec<String>,
    /// Whether /run/containerd existed before (if not, its empty directories go at the end).
    had_run_containerd: bool,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

impl Containerd {
    /// Starts containerd in `node`'s namespace with natledger's hooks writing to
    /// `node.state_dir()` and `node.backend`, waits until the CRI answers, and imports
    /// [`PAUSE_IMAGE`] and [`BUSYBOX_IMAGE`].
    pub fn start(node: &Node, annotations: Annotations) -> Containerd {
        Containerd::start_with(
            node,
            Config {
                annotations,
                cni: CniChain::Bridge,
            },
        )
    }

    /// [`Containerd::start`] with the CNI chain chosen too.
    pub fn start_with(node: &Node, config: Config) -> Containerd {
        let one_at_a_time = lock(&ONE_AT_A_TIME);
        let own = Owned::new(node.dir.path(), "containerd");
        let had_run_containerd = Path::new("/run/containerd").exists();
        write_wrapper(node, &own.dir);
        let bin_dir = write_cni(node, &own.dir, config.cni);
        std::fs::write(
            own.dir.join("config.toml"),
            config_toml(&own.dir, &bin_dir, config.annotations),
        )
        .unwrap();
        let log = File::create(own.dir.join("containerd.log")).unwrap();
        let mut cmd = nsenter_net(node.topo.node(), "containerd");
        cmd.arg("--config")
            .arg(own.dir.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // nsenter execs containerd (no fork for a network namespace): the child is containerd.
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let mut containerd = Containerd {
            own,
            child: Some(child),
            pods: Vec::new(),
            all_ids: Vec::new(),
            had_run_containerd,
            _one_at_a_time: one_at_a_time,
        };
        containerd.wait_started();
        containerd.import_images();
        containerd
    }

    /// Both images in one archive, imported into the CRI's namespace `k8s.io`.
    fn import_images(&self) {
        let scratch = self.own.dir.join("image");
        let archive = self.own.dir.join("images.tar");
        let images = [
            OciImage {
                name: PAUSE_IMAGE,
                entrypoint: &WAIT_FOR_TERM,
            },
            OciImage {
                name: BUSYBOX_IMAGE,
                entrypoint: &["/bin/sh"],
            },
        ];
        oci_archive(&archive, &scratch, &images);
        self.import(&archive);
        for image in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
            let status = self.cri_ok(&["image-status", image]);
            assert!(
                status.contains(image),
                "the CRI does not see {image}: {status}"
            );
        }
    }

    /// `ctr images import` of an OCI archive into the CRI's namespace `k8s.io` (unpacked
    /// for its snapshotter); returns ctr's stdout.
    pub fn import(&self, archive: &Path) -> String {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io", "images", "import"])
            .args(["--snapshotter", "overlayfs"])
            .arg(archive);
        stdout_of(&output(&mut cmd), "ctr images import", &self.log())
    }

    /// The CNI configuration directory containerd reads (its `conf_dir`).
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.own.dir.join("cni")
    }

    /// The private CNI plugin directory ([`CniChain::Natledger`], [`CniChain::Portmap`]).
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.own.dir.join("cni-bin")
    }

    pub fn socket(&self) -> PathBuf {
        self.own.dir.join("containerd.sock")
    }

    /// `python3 tests/cri/cri.py --socket … ARGS` (a client needs no namespace).
    pub fn cri(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("python3");
        cmd.arg(CRI_PY)
            .arg("--socket")
            .arg(self.socket())
            .arg("--stubs")
            .arg(self.own.dir.join("cri-stubs"))
            .args(args);
        output(&mut cmd)
    }

    /// [`Containerd::cri`], asserting success; returns stdout, trimmed.
    pub fn cri_ok(&self, args: &[&str]) -> String {
        stdout_of(&self.cri(args), &format!("cri.py {}", args.join(" ")), "")
    }

    /// [`Containerd::cri`]: stdout trimmed, or the client's stderr (the runtime's message).
    pub fn cri_result(&self, args: &[&str]) -> Result<String, String> {
        let out = self.cri(args);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Writes a CRI message as JSON under DIR/specs; returns its path.
    fn spec_file(&self, name: &str, message: &Value) -> String {
        let dir = self.own.dir.join("specs");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(message).unwrap()).unwrap();
        path.display().to_string()
    }

    /// A PodSandboxConfig named `name` with these annotations, its cgroups under the
    /// fixture's parent and its logs in DIR.
    pub fn pod_config(&self, name: &str, annotations: &[(&str, &str)]) -> Value {
        let annotations: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        serde_json::json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "namespace": "natledger-test"},
            "hostname": name,
            "log_directory": self.own.path(&format!("logs/{name}")),
            "annotations": annotations,
            "linux": {"cgroup_parent": self.own.cgroup_parent},
        })
    }

    /// RunPodSandbox; the pod's id, or the runtime's message.
    pub fn run_pod(&mut self, config: &Value) -> Result<String, String> {
        let name = config["metadata"]["name"].as_str().unwrap_or("pod");
        let file = self.spec_file(&format!("pod-{name}"), config);
        let id = self.cri_result(&["run-pod", &file])?;
        let netns = self.pod_netns(&id);
        self.pods.push((id.clone(), netns));
        self.all_ids.push(id.clone());
        self.own.ids.push(id.clone());
        Ok(id)
    }

    /// PodSandboxStatus (verbose) as JSON.
    pub fn pod_status(&self, pod: &str) -> Value {
        serde_json::from_str(&self.cri_ok(&["pod-status", pod])).unwrap()
    }

    /// The pod's IPv4 address (CNI's).
    pub fn pod_ip(&self, pod: &str) -> String {
        let status = self.pod_status(pod);
        status["status"]["network"]["ip"]
            .as_str()
            .unwrap_or_else(|| panic!("pod {pod} has no IP: {status:#}"))
            .to_string()
    }

    /// The network namespace file containerd made for the pod (from its verbose status).
    pub fn pod_netns(&self, pod: &str) -> Option<PathBuf> {
        let status = self.pod_status(pod);
        let info: Value = serde_json::from_str(status["info"]["info"].as_str()?).ok()?;
        info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()?
            .iter()
            .find(|ns| ns["type"] == "network")
            .and_then(|ns| ns["path"].as_str())
            .map(PathBuf::from)
    }

    /// CreateContainer in `pod` (made from `pod_config`); the container's id or the message.
    pub fn create(
        &mut self,
        pod: &str,
        pod_config: &Value,
        config: &Value,
    ) -> Result<String, String> {
        let name = config["metadata"]["name"].as_str().unwrap_or("container");
        let pod_file = self.spec_file(&format!("pod-of-{name}"), pod_config);
        let file = self.spec_file(&format!("container-{name}"), config);
        let id = self.cri_result(&["create", pod, &file, &pod_file])?;
        self.all_ids.push(id.clone());
        self.own.ids.push(id.clone());
        Ok(id)
    }

    /// StopPodSandbox then RemovePodSandbox.
    pub fn remove_pod(&mut self, pod: &str) -> Result<(), String> {
        self.cri_result(&["stop-pod", pod])?;
        self.cri_result(&["rm-pod", pod])?;
        self.pods.retain(|(id, _)| id != pod);
        Ok(())
    }

    /// What this fixture made that is still there outside its directory: pods' network
    /// namespaces, CNI cache entries and runc state naming its ids.
    pub fn left_outside(&self) -> Vec<PathBuf> {
        let mut left: Vec<PathBuf> = self
            .pods
            .iter()
            .filter_map(|(_, netns)| netns.clone())
            .filter(|p| p.exists())
            .collect();
        let named = |dir: &str| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
                .unwrap_or_default()
        };
        for path in named("/var/lib/cni/results")
            .into_iter()
            .chain(named("/run/containerd/runc/k8s.io"))
        {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if self.all_ids.iter().any(|id| name.contains(id.as_str())) {
                left.push(path);
            }
        }
        left
    }

    /// SIGTERM, then wait (SIGKILL after [`STOP_TIMEOUT`]). The shims stay (containerd's
    /// design); [`Owned::reap`] ends them.
    pub fn stop(&mut self) -> Result<Duration, String> {
        let Some(mut child) = self.child.take() else {
            return Err("containerd was not running".into());
        };
        let started = Instant::now();
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        while started.elapsed() < STOP_TIMEOUT {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(started.elapsed()),
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(format!("waiting for containerd: {e}")),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!("containerd ignored SIGTERM for {STOP_TIMEOUT:?}"))
    }

    /// Removes what [`Containerd::left_outside`] finds (a network namespace is unmounted
    /// first), and /run/containerd's directories if they are empty and were not there before.
    fn remove_outside(&self) -> Vec<String> {
        let mut removed = Vec::new();
        for path in self.left_outside() {
            removed.push(path.display().to_string());
            if let Ok(c) = std::ffi::CString::new(path.display().to_string()) {
                // SAFETY: a valid NUL-terminated path; a path that is no mount point just fails.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
        if !self.had_run_containerd {
            // Only empty directories go (remove_dir fails otherwise): someone else's stay.
            for dir in ["runc/k8s.io", "runc", "s", ""] {
                let _ = std::fs::remove_dir(Path::new("/run/containerd").join(dir));
            }
        }
        removed
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            // Through the CRI first, so that poststop runs and the network is torn down.
            for (pod, _) in self.pods.clone() {
                if let Err(e) = self.remove_pod(&pod) {
                    eprintln!("warning: removing pod {pod}: {e}");
                }
            }
            if let Err(e) = self.stop() {
                eprintln!("warning: {e}");
            }
        }
        if std::thread::panicking() {
            eprintln!("--- containerd log\n{}", self.log());
        }
        let mut left = self.own.reap(T);
        left.extend(self.remove_outside());
        if !left.is_empty() {
            eprintln!("warning: containerd left behind (now cleaned up): {left:#?}");
        }
    }
}

/// DIR/natledger-runtime: containerd's runc options take a binary but no arguments, so the
/// hooks' state directory and backend (the test's, not the host's /run/natledger and
/// iptables) are given by this script, which execs the test binary's `natledger runtime`.
fn write_wrapper(node: &Node, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("natledger-runtime");
    let script = format!(
        "#!/bin/sh\nexec {BIN} runtime \
         --natledger-hook-env NATLEDGER_STATE_DIR={} \
         --natledger-hook-env NATLEDGER_BACKEND={} \"$@\"\n",
        node.state_dir().display(),
        node.backend.name()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// DIR/cni/10-natledger-cri.conflist: Debian's bridge (gateway cri0, no masquerade: CNI then
/// writes no firewall rule, so natledger's are the only ones) and host-local IPAM, with its
/// allocations in DIR; for [`CniChain::Natledger`], natledger after bridge, found in
/// DIR/cni-bin. Returns the plugin directory containerd is to use.
fn write_cni(node: &Node, dir: &Path, chain: CniChain) -> PathBuf {
    let mut plugins = vec![serde_json::json!(
        {"type": "bridge", "bridge": "cri0", "isGateway": true, "ipMasq": false,
         "hairpinMode": true,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                  "routes": [{"dst": "0.0.0.0/0"}],
                  "dataDir": dir.join("cni-ipam")}}
    )];
    let bin_dir = match chain {
        CniChain::Bridge => PathBuf::from("/usr/lib/cni"),
        CniChain::Natledger => {
            plugins.push(serde_json::json!({
                "type": "natledger", "capabilities": {"portMappings": true},
                "stateDir": node.state_dir(), "backend": node.backend.name(),
            }));
            link_plugins(&dir.join("cni-bin"), true)
        }
        CniChain::Portmap => {
            plugins.push(serde_json::json!({
                "type": "portmap", "capabilities": {"portMappings": true},
                "stateDir": node.state_dir(), "backend": node.backend.name(),
            }));
            link_plugins(&dir.join("cni-bin"), false)
        }
    };
    plugins.push(serde_json::json!({"type": "loopback"}));
    let conflist = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": plugins,
    });
    let conf_dir = dir.join("cni");
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::write(
        conf_dir.join("10-natledger-cri.conflist"),
        serde_json::to_string_pretty(&conflist).unwrap(),
    )
    .unwrap();
    bin_dir
}

/// `bin`: Debian's plugins linked from /usr/lib/cni, and with `natledger`, a link of that
/// name to the binary under test (what the install script makes).
fn link_plugins(bin: &Path, natledger: bool) -> PathBuf {
    std::fs::create_dir_all(bin).unwrap();
    for entry in
        std::fs::read_dir("/usr/lib/cni").expect("/usr/lib/cni (containernetworking-plugins)")
    {
        let entry = entry.unwrap();
        std::os::unix::fs::symlink(entry.path(), bin.join(entry.file_name())).unwrap();
    }
    if natledger {
        std::os::unix::fs::symlink(BIN, bin.join("natledger")).unwrap();
    }
    bin.to_path_buf()
}

/// config.toml: everything in DIR, then README.md's snippet with [`README_BINARY`] replaced
/// by DIR/natledger-runtime (the only change made to it for [`Annotations::Pod`]).
fn config_toml(dir: &Path, bin_dir: &Path, annotations: Annotations) -> String {
    let mut snippet = readme_containerd_snippet();
    if annotations == Annotations::Container {
        assert_eq!(snippet.matches("pod_annotations =").count(), 1, "{snippet}");
        snippet = snippet.replace("pod_annotations =", "container_annotations =");
    }
    assert_eq!(
        snippet.matches(README_BINARY).count(),
        1,
        "the README snippet names {README_BINARY} once:\n{snippet}"
    );
    let wrapper = dir.join("natledger-runtime").display().to_string();
    let d = dir.display();
    let bin_dir = bin_dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
plugin_dir = "{d}/plugins"

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Without CAP_SYS_RESOURCE (this machine) a container's oom_score_adj may not go below ours.
  restrict_oom_score_adj = true

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{bin_dir}"
  conf_dir = "{d}/cni"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"

# README.md's snippet:
{}"#,
        snippet.replace(README_BINARY, &wrapper)
    )
}

impl Daemon for Containerd {
    const NAME: &'static str = "containerd's CRI";

    fn child(&mut self) -> &mut Option<Child> {
        &mut self.child
    }

    fn answers(&self) -> bool {
        self.socket().exists() && self.cri(&["version"]).status.success()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.own.dir.join("containerd.log")).unwrap_or_default()
    }
}

//! dockerd (Debian's 20.10, with the containerd it starts itself) running in a node
//! namespace with every piece of its state in a temporary directory, and natledger registered
//! as its runtime `natledger` (a `natledger-runtime` symlink) in its daemon.json.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use super::*;

pub const IMAGE: &str = "natledger-busybox:latest";
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const T: Duration = Duration::from_secs(10);

/// How dockerd runs.
#[derive(Clone, Debug, Default)]
pub struct DockerdOptions {
    /// Docker's own firewall: its default bridge docker0, its nat and filter chains and the
    /// FORWARD policy DROP, written with the node's backend (a PATH directory of `iptables`
    /// links; beside natledger's nftables backend, iptables-nft: [`firewall_backend`]). Off:
    /// `--iptables=false --bridge=none`.
    pub iptables: bool,
}

/// Debian's docker.io client, matching the 20.10 daemon (PATH may hold a newer one first).
pub fn docker_cli() -> &'static str {
    if Path::new("/usr/bin/docker").exists() {
        "/usr/bin/docker"
    } else {
        "docker"
    }
}

/// The iptables backend Docker's own firewall writes with beside natledger on `backend`: the
/// same one, and iptables-nft beside natledger's nftables tables (Docker 20.10 has only
/// iptables; on an nftables host, as Debian 12's, that is iptables-nft).
pub fn firewall_backend(backend: Backend) -> Backend {
    if backend.is_iptables() {
        backend
    } else {
        Backend::IptablesNft
    }
}

/// `dir/natledger-runtime -> the test natledger binary`.
pub fn wrapper_symlink(dir: &Path) -> PathBuf {
    let link = dir.join("natledger-runtime");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    link
}

/// dockerd running in network namespace `ns` with all of its state under `dir`: data root,
/// exec root (and with it the containerd dockerd starts, its sockets and state), socket,
/// pid file, daemon.json, trust key, client configuration and logs.
pub struct Dockerd {
    pub own: Owned,
    child: Option<Child>,
}

impl Dockerd {
    /// Starts dockerd with the runtime `natledger` (hooks writing manifests to
    /// `node.state_dir()` and rules to `node.backend`) and waits until it answers.
    pub fn start(node: &Node, opts: &DockerdOptions) -> Dockerd {
        let own = Owned::new(node.dir.path(), "docker");
        let dir = own.dir.clone();
        let link = wrapper_symlink(&dir);
        let config = serde_json::json!({
            // Else dockerd 20.10 writes /etc/docker/key.json.
            "deprecated-key-path": dir.join("key.json"),
            "runtimes": {"natledger": {
                "path": link,
                "runtimeArgs": [
                    "--natledger-hook-env",
                    format!("NATLEDGER_STATE_DIR={}", node.state_dir().display()),
                    "--natledger-hook-env",
                    format!("NATLEDGER_BACKEND={}", node.backend.name()),
                ],
            }},
        });
        std::fs::write(
            dir.join("daemon.json"),
            serde_json::to_string_pretty(&config).unwrap(),
        )
        .unwrap();
        let log = File::create(dir.join("dockerd.log")).unwrap();
        let mut cmd = nsenter_net(node.topo.node(), "dockerd");
        if opts.iptables {
            // Docker runs `iptables` from PATH: links to the node's backend come first.
            let tools = dir.join("iptables-bin");
            std::fs::create_dir_all(&tools).unwrap();
            for (name, family) in [("iptables", Family::V4), ("ip6tables", Family::V6)] {
                let real = iptables_tool(firewall_backend(node.backend), family);
                for suffix in ["", "-save", "-restore"] {
                    let link = tools.join(format!("{name}{suffix}"));
                    let target = format!("/usr/sbin/{real}{suffix}");
                    std::os::unix::fs::symlink(target, link).unwrap();
                }
            }
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{path}", tools.display()))
                .args(["--iptables=true", "--ip6tables=false"]);
        } else {
            cmd.args(["--iptables=false", "--ip6tables=false", "--bridge=none"]);
        }
        cmd.arg("--config-file")
            .arg(dir.join("daemon.json"))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("-H")
            .arg(format!("unix://{}", dir.join("docker.sock").display()))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .args(["--cgroup-parent", &own.cgroup_parent])
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // nsenter execs dockerd (no fork for a network namespace): the child is dockerd.
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let mut dockerd = Dockerd {
            own,
            child: Some(child),
        };
        dockerd.wait_started();
        dockerd
    }

    /// `docker -H unix://DIR/docker.sock ARGS` (the client needs no namespace).
    pub fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(docker_cli());
        cmd.arg("-H")
            .arg(format!(
                "unix://{}",
                self.own.dir.join("docker.sock").display()
            ))
            .args(args)
            .env("DOCKER_CONFIG", self.own.dir.join("client"));
        output(&mut cmd)
    }

    /// [`Dockerd::run`], asserting success; returns stdout, trimmed.
    pub fn ok(&self, args: &[&str]) -> String {
        stdout_of(&self.run(args), &format!("docker {}", args.join(" ")), "")
    }

    /// `docker run -d --runtime natledger --network none` of httpd with these extra options;
    /// returns the container id.
    pub fn start_container(&mut self, options: &[&str]) -> String {
        let fixed = ["--runtime", "natledger", "--network", "none"];
        let id = container_id(
            self.ok(&httpd_run_args(&[&fixed, options].concat(), IMAGE)),
            "docker",
        );
        self.own.ids.push(id.clone());
        id
    }

    /// The bundle's config.json as the runtime saw it (containerd keeps the bundle in its
    /// state directory while the task exists).
    pub fn bundle_config(&self, id: &str) -> serde_json::Value {
        let path = self
            .own
            .dir
            .join("exec/containerd/daemon/io.containerd.runtime.v2.task/moby")
            .join(id)
            .join("config.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    /// SIGTERM, then wait (SIGKILL after [`STOP_TIMEOUT`]). Returns how it went.
    pub fn stop(&mut self) -> Result<Duration, String> {
        let Some(mut child) = self.child.take() else {
            return Err("dockerd was not running".into());
        };
        let started = Instant::now();
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        while started.elapsed() < STOP_TIMEOUT {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(started.elapsed()),
                Ok(Some(status)) => return Err(format!("dockerd exited with {status}")),
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(format!("waiting for dockerd: {e}")),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!("dockerd ignored SIGTERM for {STOP_TIMEOUT:?}"))
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            if !self.own.ids.is_empty() {
                let mut args = vec!["rm", "--force"];
                args.extend(self.own.ids.iter().map(String::as_str));
                let _ = self.run(&args);
            }
            if let Err(e) = self.stop() {
                eprintln!("warning: {e}");
            }
        }
        if std::thread::panicking() {
            eprintln!("--- dockerd log\n{}", self.log());
        }
        let left = self.own.reap(T);
        if !left.is_empty() {
            eprintln!("warning: dockerd left behind (now cleaned up): {left:#?}");
        }
    }
}

/// Hooks natledger put in a bundle's config.json for one stage.
pub fn natledger_hooks<'a>(
    config: &'a serde_json::Value,
    stage: &str,
) -> Vec<&'a serde_json::Value> {
    config["hooks"][stage]
        .as_array()
        .map(|hooks| {
            hooks
                .iter()
                .filter(|h| h["args"].get(0).and_then(|a| a.as_str()) == Some("natledger"))
                .collect()
        })
        .unwrap_or_default()
}

impl Daemon for Dockerd {
    const NAME: &'static str = "dockerd";

    fn child(&mut self) -> &mut Option<Child> {
        &mut self.child
    }

    fn answers(&self) -> bool {
        self.own.dir.join("docker.sock").exists() && self.run(&["version"]).status.success()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.own.dir.join("dockerd.log")).unwrap_or_default()
    }
}

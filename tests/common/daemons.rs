//! Real container engines (podman, dockerd) on a [`super::Topology`]'s node namespace: running
//! them with only the network namespace entered, and checking afterwards that they left no
//! process and no mount behind.
//!
//! Every engine a test starts keeps all of its state under one temporary directory, so "the
//! processes and mounts of this test" are exactly those that name that directory.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{Backend, Node, kill_pid};

/// `nsenter --net=/var/run/netns/NS PROGRAM`: only the network namespace is entered (`ip
/// netns exec` would also remount /sys, hiding the cgroup mounts runc needs). stdin is
/// /dev/null; add arguments and environment, then run it with [`output`].
pub fn nsenter_net(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{ns}"))
        .arg("--")
        .arg(program)
        .stdin(Stdio::null());
    cmd
}

/// How long one engine command ([`output`]) may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion, capturing stdout and stderr. Panics if it cannot start, or kills
/// it and panics if it takes longer than [`COMMAND_TIMEOUT`].
pub fn output(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let collect = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = collect(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = collect(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{cmd:?} did not finish within {COMMAND_TIMEOUT:?} ({other:?}); killed");
            }
        }
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// `status`, stdout and stderr of `out`, for failure messages.
pub fn show(out: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The trimmed stdout of `out`; panics naming `what`, with the whole output and `context`,
/// unless it succeeded.
pub fn stdout_of(out: &Output, what: &str, context: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{context}",
        show(out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Arguments of `podman run` / `docker run` for a detached busybox httpd
/// ([`super::HTTPD_ARGS`]): `run -d OPTIONS... IMAGE httpd...`.
pub fn httpd_run_args<'a>(options: &[&'a str], image: &'a str) -> Vec<&'a str> {
    let mut args = vec!["run", "-d"];
    args.extend_from_slice(options);
    args.push(image);
    args.extend_from_slice(&super::HTTPD_ARGS);
    args
}

/// The container id `run -d` printed; panics unless it is one (64 hex digits).
pub fn container_id(stdout: String, engine: &str) -> String {
    assert!(
        stdout.len() == 64 && stdout.bytes().all(|b| b.is_ascii_hexdigit()),
        "{engine} run printed no container id: {stdout:?}"
    );
    stdout
}

/// The lines of a [`super::dump_all`] dump that belong to some container's rules (comment
/// `natledger:<id>`; natledger's shared chains and jumps are not counted), each with the
/// heading of its table set ("legacy ipv4", ...; in the nftables section "nftables ipv4" /
/// "nftables ipv6" for natledger's `ip` / `ip6` table, "nftables" for any other table).
pub fn container_rules(dump: &str) -> Vec<(&str, &str)> {
    let mut heading = "";
    let mut found = Vec::new();
    for line in dump.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            heading = h;
        } else if heading.starts_with("nftables") && line.starts_with("table ") {
            heading = match line {
                "table ip natledger {" => "nftables ipv4",
                "table ip6 natledger {" => "nftables ipv6",
                _ => "nftables",
            };
        } else if line.contains("natledger:") {
            found.push((heading, line.trim()));
        }
    }
    found
}

/// Whether a [`super::dump_all`] line is a DNAT rule: `-j DNAT` in an iptables section,
/// `dnat to` (natledger's form, `dnat ip to` in an `inet` table) in the nftables one.
pub fn is_dnat(line: &str) -> bool {
    line.contains("-j DNAT") || line.contains(" dnat to ") || line.contains(" dnat ip")
}

/// The DNAT rules of `host_port` in a [`super::dump_all`] dump, any owner, every backend and
/// family (`--dport N ` in `*-save`, `dport N ` in `nft list ruleset`).
pub fn dnats(dump: &str, host_port: u16) -> Vec<&str> {
    let port = format!("dport {host_port} ");
    dump.lines()
        .filter(|l| l.contains(&port) && is_dnat(l))
        .collect()
}

/// natledger's tcp DNAT of `host_port` to `dest` for container `id` as `backend`'s dump shows
/// it (a substring of the line).
pub fn dnat_rule(backend: Backend, id: &str, host_port: u16, dest: &str) -> String {
    if backend.is_iptables() {
        format!(
            "--dport {host_port} -m comment --comment \"natledger:{id}\" -j DNAT \
             --to-destination {dest}"
        )
    } else {
        format!("tcp dport {host_port} dnat to {dest} comment \"natledger:{id}\"")
    }
}

/// Asserts that `dump` forwards `host_port` to `dest` for container `id`, in `backend`'s IPv4
/// tables, and holds no rule of any other container nor any elsewhere.
pub fn assert_forward(dump: &str, backend: Backend, id: &str, host_port: u16, dest: &str) {
    let rules = container_rules(dump);
    let heading = format!("{} ipv4", backend.name());
    let dnat = dnat_rule(backend, id, host_port, dest);
    assert!(
        rules
            .iter()
            .any(|(h, l)| *h == heading && l.contains(&dnat)),
        "{backend:?}: no `{dnat}` in {heading}:\n{dump}"
    );
    assert!(
        rules.iter().all(|(h, l)| *h == heading && l.contains(id)),
        "{backend:?}: rules outside {heading} or of another container than {id}: {rules:#?}"
    );
}

/// Asserts that within `timeout` no container rule is left in `node`'s tables and container
/// `id` has no manifest any more (poststop ran).
pub fn assert_removed(node: &Node, id: &str, timeout: Duration) {
    let gone = poll(timeout, || {
        container_rules(&node.dump()).is_empty() && !node.manifest_exists(id)
    });
    let dump = node.dump();
    assert!(
        gone,
        "{:?}: left after removing {id}: rules {:#?}, manifest {}\n{dump}",
        node.backend,
        container_rules(&dump),
        node.manifest_exists(id)
    );
}

/// Calls `ready` every 50 ms until it returns true or `timeout` passes; returns the last answer.
pub fn poll(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// How long a daemon may take to answer ([`Daemon::wait_started`]).
pub const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(60);

/// A daemon a test started (dockerd, containerd), which its `Drop` stops.
pub trait Daemon {
    const NAME: &'static str;
    /// The daemon's process; `None` once it has exited.
    fn child(&mut self) -> &mut Option<std::process::Child>;
    /// Whether it answers requests yet.
    fn answers(&self) -> bool;
    fn log(&self) -> String;

    /// Waits until the daemon answers, polling every 100 ms. Panics with its log if it exits
    /// first or does not answer within [`DAEMON_START_TIMEOUT`] (it is still running then,
    /// for `Drop` to stop).
    fn wait_started(&mut self) {
        let deadline = Instant::now() + DAEMON_START_TIMEOUT;
        loop {
            let child = self.child();
            if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                *child = None;
                panic!(
                    "{} exited while starting ({status}):\n{}",
                    Self::NAME,
                    self.log()
                );
            }
            if self.answers() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer within {DAEMON_START_TIMEOUT:?}:\n{}",
                Self::NAME,
                self.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Processes (pid, command line) whose command line names `needle` (e.g. a test's own
/// temporary directory), or whose cgroup path does (e.g. a container id); this process excepted.
pub fn processes_naming(needle: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(u32, String)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            (cmdline.contains(needle) || cgroup.contains(needle))
                .then(|| (pid, cmdline.trim().to_string()))
        })
        .collect();
    found.sort();
    found
}

/// Mount points at or below `dir` in this mount namespace, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| *m == prefix || m.starts_with(&format!("{prefix}/")))
        .map(str::to_string)
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.len()));
    found
}

/// What a test's container engine owns: its temporary directory (all of its state), its
/// cgroup parent, and the containers it started. Every process naming the directory or
/// running in one of the containers' cgroups is the test's own.
pub struct Owned {
    pub dir: PathBuf,
    /// `/natledger-test-<dir>`, for `--cgroup-parent`: the cgroups the engine makes go here.
    pub cgroup_parent: String,
    pub ids: Vec<String>,
}

impl Owned {
    /// `dir` (created) for engine `engine` of a test whose temporary directory is `test_dir`.
    pub fn new(test_dir: &Path, engine: &str) -> Owned {
        let dir = test_dir.join(engine);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let unique = test_dir
            .file_name()
            .map(|n| n.to_string_lossy().trim_start_matches('.').to_string())
            .unwrap_or_default();
        Owned {
            dir,
            cgroup_parent: format!("/natledger-test-{unique}-{engine}"),
            ids: Vec::new(),
        }
    }

    /// `dir/sub` as a string, for command lines and configuration files.
    pub fn path(&self, sub: &str) -> String {
        self.dir.join(sub).display().to_string()
    }

    /// The engine's and its containers' processes (pid, command line).
    pub fn processes(&self) -> Vec<(u32, String)> {
        let dir = self.dir.to_string_lossy();
        let mut found: Vec<(u32, String)> = std::iter::once(dir.as_ref())
            .chain(self.ids.iter().map(String::as_str))
            .flat_map(processes_naming)
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// The cgroup directories of [`Owned::cgroup_parent`] that exist, in every hierarchy.
    pub fn cgroups(&self) -> Vec<PathBuf> {
        let relative = self.cgroup_parent.trim_start_matches('/');
        let root = Path::new("/sys/fs/cgroup");
        let hierarchies = std::fs::read_dir(root)
            .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_else(|_| Vec::new());
        // Canonical and deduplicated: v1 hierarchies may be reached twice (cpu -> cpu,cpuacct).
        let mut found: Vec<PathBuf> = std::iter::once(root.to_path_buf())
            .chain(hierarchies)
            .filter_map(|h| h.join(relative).canonicalize().ok())
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// Asserts that within `timeout` no process of the engine is left, and that no mount
    /// below its directory and no cgroup of its parent is left either.
    pub fn assert_clean(&self, timeout: Duration) {
        let quiet = poll(timeout, || self.processes().is_empty());
        assert!(quiet, "processes still running: {:#?}", self.processes());
        let mounts = mounts_under(&self.dir);
        assert!(
            mounts.is_empty(),
            "mounts left under {}: {mounts:?}",
            self.dir.display()
        );
        self.remove_cgroups();
        let cgroups = self.cgroups();
        assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    }

    /// Removes the (empty) cgroups under the parent, deepest first.
    fn remove_cgroups(&self) {
        fn remove(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&entry.path());
                    }
                }
            }
            if let Err(e) = std::fs::remove_dir(dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                eprintln!("warning: cannot remove cgroup {}: {e}", dir.display());
            }
        }
        for cgroup in self.cgroups() {
            remove(&cgroup);
        }
    }

    /// Last resort after the engine is stopped: waits up to `grace` for its processes to
    /// exit, SIGKILLs those left (the test started them all), detaches the mounts below its
    /// directory and removes its cgroups. Returns what had to be cleaned up, empty if
    /// nothing was left but the cgroups.
    pub fn reap(&self, grace: Duration) -> Vec<String> {
        poll(grace, || self.processes().is_empty());
        let mut left = Vec::new();
        for (pid, cmdline) in self.processes() {
            left.push(format!("process {pid}: {cmdline}"));
            kill_pid(pid);
        }
        for mount in mounts_under(&self.dir) {
            left.push(format!("mount {mount}"));
            if let Ok(path) = std::ffi::CString::new(mount.clone()) {
                // SAFETY: a valid NUL-terminated path; MNT_DETACH has no other precondition.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
        self.remove_cgroups();
        left
    }
}

/// The busybox tarball ([`super::busybox_tarball`]) at `dir/busybox.tar`, for `podman import` /
/// `docker import`.
pub fn image_tarball(dir: &Path) -> PathBuf {
    let path = dir.join("busybox.tar");
    super::busybox_tarball(&path);
    path
}

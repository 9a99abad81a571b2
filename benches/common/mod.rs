//! What the benchmarks share: a private network namespace (natledger's `kernel::named_netns`),
//! running tools, foreign rules.

#![allow(dead_code)] // each bench uses a subset

pub mod cni;
pub mod nft;
pub mod path;
pub mod setup;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

pub use natledger::kernel::named_netns::NamedNetns;

pub const BIN: &str = env!("CARGO_BIN_EXE_natledger");

/// A network namespace of the bench's own, its loopback up, deleted when dropped: natledger's
/// harness `kernel::named_netns` (which `selftest` and the integration tests use too).
pub fn netns(name: String) -> NamedNetns {
    NamedNetns::create(name.clone()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Run this bench again as the child for one case (`BENCH_CASE=spec`, which the bench's
/// `main` hands to its case function): each case in a fresh process, so nothing (allocator
/// high-water mark, namespaces, caches) carries over. Its stderr is shown as it comes; a
/// failed case stops the bench. Returns the child's stdout, the case's table rows.
pub fn run_case(spec: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .env("BENCH_CASE", spec)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "case {spec} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An environment setting, or its default.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// A numeric environment setting, or its default.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn run(program: &str, args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.unwrap_or_default())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Enter the namespace for this whole (single-threaded) process, so children start in it.
pub fn enter(ns: &NamedNetns) {
    ns.enter().unwrap_or_else(|e| panic!("{e}"));
}

/// Load `n` foreign nat rules with `backend`'s restore (none for 0).
pub fn load_foreign(backend: &str, n: usize) {
    if n > 0 {
        let tool = format!("/usr/sbin/iptables-{backend}-restore");
        run(&tool, &["--noflush"], Some(foreign_rules(n).as_bytes()));
    }
}

pub fn foreign_rules(n: usize) -> String {
    let mut s = String::from("*nat\n:KUBE-FAKE - [0:0]\n-A PREROUTING -j KUBE-FAKE\n");
    for i in 0..n {
        let (addr, port) = foreign_service(i);
        s += &format!(
            "-A KUBE-FAKE -d {addr}/32 -p tcp -m tcp --dport {port} -m comment --comment \"svc{i}\" -j DNAT --to-destination 10.200.0.1:80\n"
        );
    }
    s + "COMMIT\n"
}

/// The address and TCP port the `i`th foreign rule matches (each rule its own service).
pub fn foreign_service(i: usize) -> (String, usize) {
    let addr = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    (addr, 1000 + i % 50000)
}

pub fn run_cmd(mut cmd: Command, stdin: &[u8]) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

/// Durations of one operation pair (create, remove) over the runs.
#[derive(Default)]
pub struct Samples {
    pub create: Vec<Duration>,
    pub remove: Vec<Duration>,
    pub total: Vec<Duration>,
}

impl Samples {
    pub fn push(&mut self, c: Duration, d: Duration) {
        self.create.push(c);
        self.remove.push(d);
        self.total.push(c + d);
    }
}

/// The nat table of IPv4 on `backend`, as `iptables-<backend>-save -t nat` prints it.
pub fn nat_dump(backend: &str) -> String {
    let out = run(
        &format!("/usr/sbin/iptables-{backend}-save"),
        &["-t", "nat"],
        None,
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The containers' processes, by container id, while they run.
static CONTAINERS: std::sync::Mutex<Vec<(String, std::process::Child)>> =
    std::sync::Mutex::new(Vec::new());

/// The OCI state a runtime sends a hook of container `id` at `stage`: at create-runtime with
/// the pid of a process started for it (a runtime always sends the container's), at poststop
/// without, that process ended first (outside any timing), as after a container's exit.
pub fn hook_state(id: &str, stage: &str, bundle: &std::path::Path) -> String {
    let mut running = CONTAINERS.lock().unwrap_or_else(|e| e.into_inner());
    let at = running.iter().position(|(c, _)| c == id);
    let (status, pid) = if stage == "create-runtime" {
        let pid = match at {
            Some(i) => running[i].1.id(),
            None => {
                let child = Command::new("sleep").arg("100000").spawn().expect("sleep");
                let pid = child.id();
                running.push((id.to_string(), child));
                pid
            }
        };
        ("creating", format!(r#","pid":{pid}"#))
    } else {
        if let Some(i) = at {
            let (_, mut child) = running.swap_remove(i);
            let _ = child.kill();
            let _ = child.wait();
        }
        ("stopped", String::new())
    };
    format!(
        r#"{{"ociVersion":"1.0.2","id":"{id}","status":"{status}","bundle":"{}"{pid}}}"#,
        bundle.display()
    )
}

/// End every container process [`hook_state`] started and still runs (a bench that leaves
/// its containers alive, without their poststop).
pub fn end_containers() {
    let mut running = CONTAINERS.lock().unwrap_or_else(|e| e.into_inner());
    for (_, mut child) in running.drain(..) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// One container's natledger hooks (the binary, state dir, bundle, backend), and the floor for
/// the same rules: shared by the hook, peers and versus benchmarks.
pub struct Case<'a> {
    /// The natledger to run: [`BIN`], this build's, unless a bench compares another.
    pub bin: &'a str,
    pub backend: &'a str,
    pub state: &'a std::path::Path,
    pub bundle: &'a std::path::Path,
}

impl Case<'_> {
    /// Runs one hook stage; with `trace`, also counts the processes natledger started (from
    /// `NATLEDGER_TRACE`), else 0.
    pub fn hook_counted(&self, stage: &str, trace: bool) -> (Duration, usize) {
        let state = hook_state("bench", stage, self.bundle);
        let mut cmd = Command::new(self.bin);
        cmd.args([
            "--state-dir",
            self.state.to_str().unwrap(),
            "--backend",
            self.backend,
        ]);
        cmd.args(["hook", stage]);
        if trace {
            cmd.env("NATLEDGER_TRACE", "1");
        }
        let start = std::time::Instant::now();
        let out = run_cmd(cmd, state.as_bytes());
        let took = start.elapsed();
        let n = if trace {
            String::from_utf8_lossy(&out.stderr)
                .matches("exec ")
                .count()
        } else {
            0
        };
        (took, n)
    }

    /// The rules natledger wrote, from its manifest, as restore input (insert, delete): one
    /// transaction per table, as natledger writes them (filter then nat, removed the other
    /// way round).
    pub fn floor_batches(&self) -> (String, String) {
        let text = std::fs::read_to_string(self.state.join("containers/bench.json")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut add = String::new();
        let mut del = String::new();
        for table in ["filter", "nat"] {
            let (mut a, mut d) = (format!("*{table}\n"), format!("*{table}\n"));
            for r in manifest["rules"].as_array().unwrap() {
                if r["table"] != table {
                    continue;
                }
                let chain = r["chain"].as_str().unwrap();
                let args: Vec<String> = r["rule"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect();
                let args = args.join(" ");
                let verb = if chain == "NATLEDGER-HOSTPORTS" {
                    "-I"
                } else {
                    "-A"
                };
                a += &format!("{verb} {chain} {args}\n");
                d += &format!("-D {chain} {args}\n");
            }
            add += &(a + "COMMIT\n");
            del = d + "COMMIT\n" + &del;
        }
        (add, del)
    }

    /// Two transactions of someone else that change nothing in the end (a chain made, a chain
    /// deleted): what moves the nf_tables generation on a busy host.
    pub fn someone_else_writes(&self) {
        someone_else_writes(self.backend);
    }

    /// The floor for natledger's rules as they are now (call after a create): on the
    /// iptables backends [`Case::floor_batches`] through bare restores, on nftables
    /// [`nft::NftFloor`].
    pub fn floor(&self) -> Floor<'_> {
        if self.backend == "nftables" {
            Floor::Nft(nft::NftFloor::new("bench"))
        } else {
            let (add, del) = self.floor_batches();
            Floor::Restore(self, add, del)
        }
    }

    /// One bare `iptables-<backend>-restore --noflush` of `batch`.
    pub fn restore(&self, batch: &str) -> Duration {
        let tool = format!("/usr/sbin/iptables-{}-restore", self.backend);
        let mut cmd = Command::new(tool);
        cmd.arg("--noflush");
        let start = std::time::Instant::now();
        run_cmd(cmd, batch.as_bytes());
        start.elapsed()
    }
}

/// The floor: one bare operation adding natledger's rules, one deleting them.
pub enum Floor<'a> {
    /// `iptables-<backend>-restore --noflush` of the add and the delete batch.
    Restore(&'a Case<'a>, String, String),
    Nft(nft::NftFloor),
}

impl Floor<'_> {
    pub fn add(&self) -> Duration {
        match self {
            Floor::Restore(case, add, _) => case.restore(add),
            Floor::Nft(f) => f.add(),
        }
    }

    pub fn remove(&self) -> Duration {
        match self {
            Floor::Restore(case, _, del) => case.restore(del),
            Floor::Nft(f) => f.remove(),
        }
    }
}

/// Two transactions of someone else on `backend` that change nothing in the end (a chain
/// made, a chain deleted): what moves the nf_tables generation on a busy host.
pub fn someone_else_writes(backend: &str) {
    if backend == "nftables" {
        return nft::someone_else_writes();
    }
    let tool = format!("/usr/sbin/iptables-{backend}-restore");
    for batch in [
        "*nat\n:BENCH-OTHER - [0:0]\nCOMMIT\n",
        "*nat\n-X BENCH-OTHER\nCOMMIT\n",
    ] {
        run(&tool, &["--noflush"], Some(batch.as_bytes()));
    }
}

/// A bundle whose config.json asks natledger for 8080->80 to 10.77.0.2, in `dir`.
pub fn bench_bundle(dir: &std::path::Path) -> std::path::PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion":"1.0.2","annotations":{"io.natledger.ports":"8080:80","io.natledger.ip":"10.77.0.2"}}"#,
    )
    .unwrap();
    bundle
}

/// A directory on its own tmpfs, for natledger's state: on a normal host /run is a tmpfs,
/// where the manifest fsyncs cost nothing, while this VM's /run is ext4 (~1 ms per fsync).
/// The mount lives in a private mount namespace of this bench child process; call before
/// starting any thread. Unmounted (and the directory removed) on drop.
pub struct TmpfsDir(Option<tempfile::TempDir>);

impl TmpfsDir {
    pub fn new() -> TmpfsDir {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .expect("a private mount namespace");
        run("mount", &["--make-rprivate", "/"], None);
        let dir = tempfile::tempdir_in("/run").unwrap();
        let path = dir.path().to_str().unwrap();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=256m,mode=0700",
                "natledger-bench",
                path,
            ],
            None,
        );
        TmpfsDir(Some(dir))
    }

    pub fn path(&self) -> &std::path::Path {
        self.0.as_ref().unwrap().path()
    }
}

impl Drop for TmpfsDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = Command::new("umount").arg(dir.path()).status();
            drop(dir);
        }
    }
}

/// Wait until the kernel has finished freeing what earlier nf_tables transactions in this
/// network namespace deleted: releasing a netfilter netlink socket flushes that work (see
/// `natledger::kernel::nftables`). Called, untimed, before every timed operation of every tool, so
/// that each measures one operation on an idle host rather than the tail of the previous
/// tool's cleanup.
pub fn settle() {
    let mut sock =
        natledger::kernel::netlink::Socket::netfilter().expect("netfilter netlink socket");
    let _ = natledger::kernel::nftables::Session::new(&mut sock).rules(
        natledger::model::family::Family::Ipv4,
        "nat",
        "PREROUTING",
    );
    drop(sock);
}

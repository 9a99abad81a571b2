//! The `natledger` binary on a [`Topology`]'s node namespace: the [`Node`] fixture and the
//! small helpers for checking what the binary printed.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Backend, Topology, dump_all, run_in};

pub const BIN: &str = env!("CARGO_BIN_EXE_natledger");

/// A node with natledger on it: state and bundle directories, and the backend under test.
pub struct Node {
    pub topo: Topology,
    pub backend: Backend,
    pub dir: tempfile::TempDir,
    /// The pid each container was created with, sent again in its poststop's state as a
    /// runtime that names the stopped process does (a poststop without a pid whose recorded
    /// process still runs is a stale message and changes nothing).
    pids: Mutex<HashMap<String, u32>>,
    /// Processes standing in for containers created with no pid of their own.
    stand_ins: StandIns,
}

/// Stand-in container processes (`sleep` in a network namespace of its own each, so that
/// no two of them share a port as containers of one namespace would), killed on drop.
#[derive(Default)]
struct StandIns(Mutex<HashMap<String, Child>>);

impl Drop for StandIns {
    fn drop(&mut self) {
        let children = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        for child in children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Node {
    pub fn new(backend: Backend) -> Node {
        Node {
            topo: Topology::new(),
            backend,
            dir: tempfile::tempdir_in("/run").expect("tempdir in /run"),
            pids: Mutex::default(),
            stand_ins: StandIns::default(),
        }
    }

    /// The process standing in for container `id` (one per id, kept until the node drops):
    /// an OCI runtime always gives createRuntime the container's pid.
    pub fn stand_in(&self, id: &str) -> u32 {
        let mut stand_ins = self.stand_ins.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = stand_ins.get(id) {
            return child.id();
        }
        let mut child = Command::new("unshare")
            .args(["--net", "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn unshare --net sleep");
        let pid = child.id();
        // Once it is `sleep`, it is in its own namespace.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "sleep")
        {
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("stand-in for {id} did not start");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stand_ins.insert(id.to_string(), child);
        pid
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Write `BUNDLE/config.json` with these annotations.
    pub fn bundle(&self, id: &str, annotations: &[(&str, &str)]) -> PathBuf {
        let bundle = self.dir.path().join("bundles").join(id);
        std::fs::create_dir_all(&bundle).unwrap();
        let annotations: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        let config = serde_json::json!({"ociVersion": "1.0.2", "annotations": annotations});
        std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        bundle
    }

    pub fn natledger(&self, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
        let state_dir = self.state_dir();
        let mut argv = vec![
            "env".to_string(),
            format!("NATLEDGER_STATE_DIR={}", state_dir.display()),
            format!("NATLEDGER_BACKEND={}", self.backend.name()),
        ];
        argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        argv.push(BIN.to_string());
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        run_in(
            self.topo.node(),
            argv[0],
            &argv[1..],
            Some(stdin.as_bytes()),
        )
    }

    /// A hook for container `id`. Without a pid, create-runtime gets its stand-in's
    /// ([`Node::stand_in`]) and poststop the pid `id` was last created with, if any.
    pub fn hook(&self, stage: &str, id: &str, pid: Option<u32>, bundle: &PathBuf) -> Output {
        self.hook_env(stage, id, pid, bundle, &[])
    }

    /// [`Node::hook`] with extra environment (e.g. `NATLEDGER_FAULT`).
    pub fn hook_env(
        &self,
        stage: &str,
        id: &str,
        pid: Option<u32>,
        bundle: &PathBuf,
        env: &[(&str, &str)],
    ) -> Output {
        let creating = stage == "create-runtime";
        let status = if creating { "creating" } else { "stopped" };
        let mut pids = self.pids.lock().unwrap_or_else(|e| e.into_inner());
        let pid = match pid {
            Some(pid) => Some(pid),
            None if creating => Some(self.stand_in(id)),
            None => pids.get(id).copied(),
        };
        if let (true, Some(pid)) = (creating, pid) {
            pids.insert(id.to_string(), pid);
        }
        drop(pids);
        let mut state = serde_json::json!({
            "ociVersion": "1.0.2", "id": id, "status": status, "bundle": bundle,
        });
        if let Some(pid) = pid {
            state["pid"] = pid.into();
        }
        self.natledger(&["hook", stage], &state.to_string(), env)
    }

    /// A hook run with exactly this state on stdin (no pid added or remembered).
    pub fn hook_state(&self, stage: &str, state: &serde_json::Value) -> Output {
        self.natledger(&["hook", stage], &state.to_string(), &[])
    }

    /// create-runtime for a container with these annotations; asserts success.
    pub fn create(&self, id: &str, pid: Option<u32>, annotations: &[(&str, &str)]) -> Output {
        let bundle = self.bundle(id, annotations);
        let out = self.hook("create-runtime", id, pid, &bundle);
        assert_ok(&out, &format!("create-runtime {id}"));
        out
    }

    pub fn poststop(&self, id: &str) -> Output {
        let bundle = self.dir.path().join("bundles").join(id);
        self.hook("poststop", id, None, &bundle)
    }

    /// `natledger sweep ARGS...` in the node namespace.
    pub fn sweep(&self, args: &[&str]) -> Output {
        let mut argv = vec!["sweep"];
        argv.extend_from_slice(args);
        self.natledger(&argv, "", &[])
    }

    pub fn dump(&self) -> String {
        dump_all(self.topo.node())
    }

    pub fn manifest_exists(&self, id: &str) -> bool {
        self.state_dir()
            .join("containers")
            .join(format!("{id}.json"))
            .exists()
    }

    /// The manifests in the state directory (file names, sorted).
    pub fn manifests(&self) -> Vec<String> {
        let dir = self.state_dir().join("containers");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Container `id`'s manifest as JSON; panics if there is none.
    pub fn manifest(&self, id: &str) -> serde_json::Value {
        let path = self
            .state_dir()
            .join("containers")
            .join(format!("{id}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).expect("a manifest is JSON")
    }

    /// Bring natledger's shared chains and jumps into being (they stay by design), so that a
    /// later create + poststop must leave the dump byte-for-byte as it was.
    pub fn warm_up(&self) {
        // Other owners' look-alikes already loaded (natledger's chain names in foreign
        // chains or tables) are not natledger's.
        let named = |dump: &str| dump.lines().filter(|l| l.contains("NATLEDGER-")).count();
        let foreign = named(&self.dump());
        let ip = ("io.natledger.ip", "10.77.9.9,fd77::9:9");
        self.create("warmup", None, &[("io.natledger.ports", "1:1"), ip]);
        assert_ok(&self.poststop("warmup"), "warm-up poststop");
        let dump = self.dump();
        let ours = named(&dump) - foreign;
        // iptables, per family: three chain declarations (two nat, one filter) and four
        // jumps; IPv4 also the localhost guard's chain, its INPUT jump and the guard.
        // nftables, per family: two nat chains and three jumps (no forward accept); IPv4
        // also the guard's chain and its INPUT jump (the guard's line names no chain).
        let expected = if self.backend.is_iptables() { 17 } else { 12 };
        assert_eq!(
            ours, expected,
            "only the shared chains and jumps stay:\n{dump}"
        );
    }
}

/// Run a test once per backend: iptables-legacy, iptables-nft and natledger's own nftables
/// tables.
pub fn both(test: impl Fn(Backend)) {
    for backend in Backend::ALL {
        test(backend);
    }
}

/// Run a test once per iptables backend: for what only iptables has (another owner's
/// iptables rules beside natledger's, a FORWARD policy natledger's accept must pass, doctor's
/// analysis of iptables dumps).
pub fn iptables_both(test: impl Fn(Backend)) {
    for backend in Backend::IPTABLES {
        test(backend);
    }
}

pub fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

pub fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

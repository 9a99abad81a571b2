//! The [`Topology`] drawn in the docs of `common`: node, ext and container namespaces, and
//! sleepers that stand in for container processes. The namespaces are natledger's own
//! `kernel::named_netns::NamedNetns` (the harness `selftest` and the benches build theirs
//! with), wired by its veth, address and route calls; waiting for IPv6 and bridge ports to
//! settle is the tests' own.

use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use natledger::kernel::named_netns::{NamedNetns, NamedNetnsError};

use super::{ip, lock, require_tools};

/// Node address facing the external client ("node IP").
pub const NODE_V4: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
/// Node IPv6 address facing the external client.
pub const NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 1);
/// External client address (in the `ext` namespace).
pub const EXT_V4: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
/// External client IPv6 address.
pub const EXT_V6: Ipv6Addr = Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 2);
/// Node address on the container bridge (containers' default gateway).
pub const BRIDGE_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// Node IPv6 address on the container bridge.
pub const BRIDGE_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);
/// Name of the container bridge in the node namespace.
pub const BRIDGE: &str = "br0";
/// Name of the node-side veth towards `ext`.
pub const NODE_EXT_VETH: &str = "veth-ext";

/// Fixed bridge MAC so it does not change as ports are added.
const BRIDGE_MAC: &str = "02:4e:4c:00:00:01";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

static NEXT_TOPOLOGY: AtomicU32 = AtomicU32::new(0);
/// Children spawned by [`Topology::spawn_sleeper`], so that [`kill_pid`] and
/// the Topology's Drop agree on who reaps them.
static SLEEPERS: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// Kill and reap a sleeper this harness spawned; false if `pid` is not (or no longer) one.
fn kill_sleeper(pid: u32) -> bool {
    let child = {
        let mut sleepers = lock(&SLEEPERS);
        sleepers
            .iter()
            .position(|c| c.id() == pid)
            .map(|i| sleepers.swap_remove(i))
    };
    match child {
        Some(mut child) => {
            let _ = child.kill();
            let _ = child.wait();
            true
        }
        None => false,
    }
}

/// SIGKILLs `pid` and reaps it if it is a child of this process.
pub fn kill_pid(pid: u32) {
    assert!(
        pid > 1 && pid <= i32::MAX as u32 && pid != std::process::id(),
        "kill_pid: refusing to signal pid {pid}"
    );
    if kill_sleeper(pid) {
        return;
    }
    // SAFETY: plain syscalls on a positive pid; a null status pointer is allowed.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
        // ECHILD (returned at once) if it is not our child.
        libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
    }
}

fn wait_until(what: &str, mut ready: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if ready()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out after {READY_TIMEOUT:?} waiting for {what}"
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until no IPv6 address on `dev` in `ns` is tentative (and fails on DAD failure).
fn wait_ipv6_settled(ns: &str, dev: &str) -> Result<(), String> {
    wait_until(&format!("IPv6 DAD on {dev} in {ns}"), || {
        let failed = ip(&["-n", ns, "-6", "addr", "show", "dev", dev, "dadfailed"])?;
        if !failed.trim().is_empty() {
            return Err(format!("IPv6 DAD failed on {dev} in {ns}: {failed}"));
        }
        Ok(
            ip(&["-n", ns, "-6", "addr", "show", "dev", dev, "tentative"])?
                .trim()
                .is_empty(),
        )
    })
}

/// Sysctls applied to every namespace before any link is created in it, so
/// that link-local addresses are not tentative either.
const NO_DAD: &[(&str, &str)] = &[
    ("net/ipv6/conf/all/accept_dad", "0"),
    ("net/ipv6/conf/default/accept_dad", "0"),
];

/// A harness error as one line: the error and its causes.
fn text(e: NamedNetnsError) -> String {
    natledger::causes::text(&e)
}

/// Deletes a namespace now; a failure is a warning.
fn delete_ns(ns: NamedNetns) {
    let name = ns.name().to_string();
    if let Err(e) = ns.delete() {
        eprintln!("warning: cannot delete network namespace {name}: {e}");
    }
}

/// A set of network namespaces (node, ext, containers). Dropping it kills the
/// sleepers it spawned and deletes every namespace.
pub struct Topology {
    prefix: String,
    node: String,
    ext: String,
    /// In creation order; deleted in reverse.
    namespaces: Vec<NamedNetns>,
    containers: Vec<u8>,
    sleepers: Vec<u32>,
}

/// A container namespace attached to the node's bridge.
#[derive(Clone, Debug, PartialEq)]
pub struct Container {
    pub ns: String,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

impl Container {
    /// `v4:port`
    pub fn sock_v4(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.v4.into(), port)
    }

    /// `[v6]:port`
    pub fn sock_v6(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.v6.into(), port)
    }
}

impl Topology {
    /// Creates the node and ext namespaces (see the docs of `common`). Panics with a
    /// clear message on failure, after deleting whatever was created.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Topology {
        require_tools();
        let counter = NEXT_TOPOLOGY.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("nlt-{}-{}", std::process::id(), counter);
        let mut topo = Topology {
            node: format!("{prefix}-node"),
            ext: format!("{prefix}-ext"),
            prefix,
            namespaces: Vec::new(),
            containers: Vec::new(),
            sleepers: Vec::new(),
        };
        if let Err(e) = topo.setup() {
            let prefix = topo.prefix.clone();
            drop(topo);
            panic!("Topology::new ({prefix}): setup failed (namespaces deleted): {e}");
        }
        topo
    }

    /// `ip netns add NS` (deleted with the topology), `sysctls` written, `lo` up.
    fn create_ns(&mut self, ns: &str, sysctls: &[(&str, &str)]) -> Result<(), String> {
        self.namespaces.push(NamedNetns::add(ns).map_err(text)?);
        let made = self.ns(ns);
        made.set_sysctls(sysctls).map_err(text)?;
        made.link_up("lo", &[]).map_err(text)
    }

    /// The namespace of this topology named `ns`.
    fn ns(&self, ns: &str) -> &NamedNetns {
        self.namespaces
            .iter()
            .find(|x| x.name() == ns)
            .unwrap_or_else(|| panic!("{ns}: not a namespace of this topology"))
    }

    fn setup(&mut self) -> Result<(), String> {
        let mut node_sysctls = vec![
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
        ];
        node_sysctls.extend_from_slice(NO_DAD);
        self.create_ns(&self.node.clone(), &node_sysctls)?;
        self.create_ns(&self.ext.clone(), NO_DAD)?;
        let (node, ext) = (self.ns(&self.node), self.ns(&self.ext));

        // Container bridge. STP off, no forward delay, no multicast snooping
        // (IPv6 ND uses multicast), fixed MAC.
        node.ip(&[
            "link",
            "add",
            BRIDGE,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
            "mcast_snooping",
            "0",
        ])
        .map_err(text)?;
        node.ip(&["link", "set", BRIDGE, "address", BRIDGE_MAC])
            .map_err(text)?;
        node.link_up(BRIDGE, &["10.77.0.1/24", "fd77::1/64"])
            .map_err(text)?;

        // node <-> ext
        node.veth_to(NODE_EXT_VETH, ext, "eth0").map_err(text)?;
        node.link_up(NODE_EXT_VETH, &["10.78.0.1/24", "fd78::1/64"])
            .map_err(text)?;
        ext.link_up("eth0", &["10.78.0.2/24", "fd78::2/64"])
            .map_err(text)?;
        wait_ipv6_settled(node.name(), NODE_EXT_VETH)?;
        wait_ipv6_settled(ext.name(), "eth0")?;
        ext.default_routes(&["10.78.0.1", "fd78::1"])
            .map_err(text)?;
        Ok(())
    }

    /// Node namespace name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// External client namespace name.
    pub fn ext(&self) -> &str {
        &self.ext
    }

    /// Common prefix of all namespace names ("nlt-<pid>-<counter>").
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The names of all namespaces owned by this topology, in creation order.
    pub fn namespaces(&self) -> Vec<String> {
        self.namespaces
            .iter()
            .map(|ns| ns.name().to_string())
            .collect()
    }

    /// Creates namespace "<prefix>-c<n>" attached to the node bridge through
    /// veth "vc<n>" (hairpin on), with 10.77.0.<n>/24 and fd77::<n>/64 and
    /// default routes via the node. `n` must be in 2..=254 and unused.
    pub fn add_container(&mut self, n: u8) -> Container {
        assert!(
            (2..=254).contains(&n),
            "add_container({n}): n must be in 2..=254 (10.77.0.1 is the node)"
        );
        assert!(
            !self.containers.contains(&n),
            "add_container({n}): container {n} already exists in {}",
            self.prefix
        );
        let ns = format!("{}-c{n}", self.prefix);
        match self.setup_container(n, &ns) {
            Ok(c) => {
                self.containers.push(n);
                c
            }
            Err(e) => {
                if let Some(i) = self.namespaces.iter().position(|x| x.name() == ns) {
                    delete_ns(self.namespaces.remove(i));
                }
                panic!("add_container({n}) in {}: {e}", self.prefix);
            }
        }
    }

    fn setup_container(&mut self, n: u8, ns: &str) -> Result<Container, String> {
        self.create_ns(ns, NO_DAD)?;
        let (node, ctr) = (self.ns(&self.node), self.ns(ns));
        let veth = format!("vc{n}");
        let v4 = Ipv4Addr::new(10, 77, 0, n);
        let v6 = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, n.into());

        node.veth_to(&veth, ctr, "eth0").map_err(text)?;
        node.ip(&["link", "set", &veth, "master", BRIDGE])
            .map_err(text)?;
        node.ip(&[
            "link",
            "set",
            &veth,
            "type",
            "bridge_slave",
            "hairpin",
            "on",
        ])
        .map_err(text)?;
        ctr.link_up("eth0", &[&format!("{v4}/24"), &format!("{v6}/64")])
            .map_err(text)?;
        node.link_up(&veth, &[]).map_err(text)?;

        let node = node.name();
        wait_until(&format!("bridge port {veth} forwarding"), || {
            Ok(ip(&["-n", node, "-d", "link", "show", "dev", &veth])?.contains("state forwarding"))
        })?;
        wait_ipv6_settled(node, BRIDGE)?;
        wait_ipv6_settled(ns, "eth0")?;
        ctr.default_routes(&["10.77.0.1", "fd77::1"])
            .map_err(text)?;
        Ok(Container {
            ns: ns.to_string(),
            v4,
            v6,
        })
    }

    /// Creates namespace "<prefix>-s<n>" with only `lo` up (no IPv6 DAD): a pod sandbox for a
    /// CNI runtime to wire ([`super::Conflist`]); its name is returned.
    pub fn add_sandbox(&mut self, n: u8) -> String {
        let ns = format!("{}-s{n}", self.prefix);
        if let Err(e) = self.create_ns(&ns, NO_DAD) {
            panic!("add_sandbox({n}) in {}: {e}", self.prefix);
        }
        ns
    }

    /// Delete a container's namespace now (`ip netns del`: its `/run/netns` bind mount
    /// unmounted and removed), as a runtime that dies half-way leaves it: no CNI DEL ran.
    pub fn delete_ns_now(&mut self, ns: &str) {
        let i = self
            .namespaces
            .iter()
            .position(|x| x.name() == ns)
            .unwrap_or_else(|| panic!("delete_ns_now({ns}): not a namespace of this topology"));
        delete_ns(self.namespaces.remove(i));
        assert!(
            !std::path::Path::new(&format!("/run/netns/{ns}")).exists(),
            "delete_ns_now({ns}): /run/netns/{ns} still there"
        );
    }

    /// Bind `other`'s namespace at `/run/netns/NS` (NS deleted before): the name now names
    /// another namespace, as a reused name does. Deleted with the topology.
    pub fn bind_ns_at(&mut self, ns: &str, other: &str) {
        let path = format!("/run/netns/{ns}");
        std::fs::File::create(&path).unwrap_or_else(|e| panic!("create {path}: {e}"));
        self.namespaces.push(NamedNetns::adopt(ns));
        let out = Command::new("mount")
            .args(["--bind", &format!("/run/netns/{other}"), &path])
            .output()
            .unwrap_or_else(|e| panic!("mount: {e}"));
        assert!(
            out.status.success(),
            "mount --bind {other} at {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Make a new, bare namespace named NS (deleted before), trying to give it the nsfs inode
    /// `ino` its deleted namespace had, as `ip netns del NS; ip netns add NS` often does once
    /// the old one is freed. The kernel hands out the lowest free inode: a try that gets
    /// another keeps that one (bound at `NS-f<k>`) so that the next try takes the next free
    /// inode, until `ino` is freed and taken. Every namespace made is deleted with the
    /// topology. Whether NS got `ino`.
    pub fn add_ns_reusing(&mut self, ns: &str, ino: u64, tries: usize) -> bool {
        use std::os::unix::fs::MetadataExt;
        let path = format!("/run/netns/{ns}");
        for k in 0..tries {
            let bare = NamedNetns::add(ns).unwrap_or_else(|e| panic!("add_ns_reusing({ns}): {e}"));
            self.namespaces.push(bare);
            let got = std::fs::metadata(&path)
                .unwrap_or_else(|e| panic!("stat {path}: {e}"))
                .ino();
            if got == ino || k + 1 == tries {
                return got == ino;
            }
            let filler = format!("{ns}-f{k}");
            self.bind_ns_at(&filler, ns);
            self.delete_ns_now(ns);
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Spawns `ip netns exec NS sleep 600` and returns its pid once it is the
    /// `sleep` process (i.e. inside the namespace). Killed when the topology drops.
    pub fn spawn_sleeper(&mut self, ns: &str) -> u32 {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn_sleeper({ns}): cannot start ip: {e}"));
        let pid = child.id();
        let comm = format!("/proc/{pid}/comm");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!(
                    "spawn_sleeper({ns}): exited early ({status}): {}",
                    err.trim()
                );
            }
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "sleep") {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("spawn_sleeper({ns}): pid {pid} did not exec sleep in time");
            }
            thread::sleep(Duration::from_millis(5));
        }
        lock(&SLEEPERS).push(child);
        self.sleepers.push(pid);
        pid
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for pid in self.sleepers.drain(..) {
            // Not registered any more: kill_pid() already took care of it.
            kill_sleeper(pid);
        }
        while let Some(ns) = self.namespaces.pop() {
            if let Ok(pids) = ip(&["netns", "pids", ns.name()])
                && !pids.trim().is_empty()
            {
                eprintln!(
                    "warning: processes still running in {} (not spawned by the harness): {}",
                    ns.name(),
                    pids.split_whitespace().collect::<Vec<_>>().join(" ")
                );
            }
            delete_ns(ns);
        }
    }
}

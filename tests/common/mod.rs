//! Shared integration-test harness for natledger.
//!
//! Everything happens inside network namespaces created (and deleted) here:
//! the root namespace's links and firewall are never touched, and traffic only
//! goes to addresses that live inside those namespaces.
//!
//! Layout of one [`Topology`]:
//!
//! ```text
//!   <prefix>-ext                 <prefix>-node                         <prefix>-c<n>
//!   eth0 10.78.0.2/24  <--veth-->  veth-ext 10.78.0.1/24 (NODE_V4)
//!        fd78::2/64                         fd78::1/64   (NODE_V6)
//!                                  br0 10.77.0.1/24, fd77::1/64
//!                                    `- vc<n> (hairpin on) <--veth-->  eth0 10.77.0.<n>/24
//!                                                                           fd77::<n>/64
//! ```
//!
//! Namespace entering (`setns`) only ever happens in dedicated threads, since
//! it changes the namespace of the calling thread only.

// This module is compiled into several test binaries, each of which uses a
// different subset of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    self, AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, sockopt,
};

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
/// Servers stop by themselves after this long.
pub const SERVER_LIFETIME: Duration = Duration::from_secs(300);

const NETNS_DIR: &str = "/var/run/netns";
/// Fixed bridge MAC so it does not change as ports are added.
const BRIDGE_MAC: &str = "02:4e:4c:00:00:01";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

static NEXT_TOPOLOGY: AtomicU32 = AtomicU32::new(0);
/// Serialises `ip netns add/del` within this process (the first `add` also
/// sets up the /run/netns mount, which is racy).
static NETNS_LOCK: Mutex<()> = Mutex::new(());
/// Children spawned by [`Topology::spawn_sleeper`], so that [`kill_pid`] and
/// the Topology's Drop agree on who reaps them.
static SLEEPERS: Mutex<Vec<Child>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------
// Tools and commands
// ---------------------------------------------------------------------------

const REQUIRED_TOOLS: &[&str] = &[
    "ip",
    "sleep",
    "iptables-legacy",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "ip6tables-legacy",
    "ip6tables-legacy-save",
    "ip6tables-legacy-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
];

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Panics (tests must fail, not skip) unless we run as root and every tool the
/// harness needs is on `PATH`.
pub fn require_tools() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "natledger integration tests must run as root (network namespaces, iptables); euid is {euid}"
    );
    let missing: Vec<&str> = REQUIRED_TOOLS
        .iter()
        .copied()
        .filter(|t| find_in_path(t).is_none())
        .collect();
    if !missing.is_empty() {
        panic!(
            "required tool(s) missing from PATH: {}. Install iproute2 and iptables (both the \
             legacy and nft variants). PATH={:?}",
            missing.join(", "),
            std::env::var_os("PATH").unwrap_or_default()
        );
    }
}

/// Runs `program args`, feeding `stdin` if given; stdout/stderr are captured. Uses
/// natledger's own process seam, so tests and the product run commands the same way.
fn run_raw<S: AsRef<OsStr>>(program: &str, args: &[S], stdin: Option<&[u8]>) -> io::Result<Output> {
    use natledger::exec::{Invocation, Runner, SystemRunner};
    use std::os::unix::process::ExitStatusExt;
    let out = SystemRunner::default().run(&Invocation {
        program: program.into(),
        args: args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect(),
        stdin: stdin.map(<[u8]>::to_vec),
    })?;
    // Rebuild the wait status: exit code in bits 8-15; killed by a signal otherwise.
    let status =
        std::process::ExitStatus::from_raw(out.code.map_or(libc::SIGKILL, |c| (c & 0xff) << 8));
    Ok(Output {
        status,
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

fn describe(program: &str, args: &[&str]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Runs a command and returns its stdout, or a descriptive error.
fn check(program: &str, args: &[&str]) -> Result<String, String> {
    let out = run_raw(program, args, None)
        .map_err(|e| format!("cannot run `{}`: {e}", describe(program, args)))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed ({}): {}",
            describe(program, args),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, String> {
    check("ip", args)
}

/// `ip netns exec NS program args...`, with optional stdin; output captured.
/// Panics only if `ip` itself cannot be started.
pub fn run_in(ns: &str, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut full: Vec<&str> = vec!["netns", "exec", ns, program];
    full.extend_from_slice(args);
    run_raw("ip", &full, stdin)
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", describe("ip", &full)))
}

/// Spawns `ip netns exec NS argv...` (ip execs, so the child's pid becomes the
/// program's pid once it has entered the namespace). stdin is /dev/null,
/// stdout/stderr are inherited. The caller owns the child and must kill it.
pub fn spawn_in(ns: &str, argv: &[&str]) -> Child {
    assert!(!argv.is_empty(), "spawn_in({ns}): empty argv");
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(argv)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn_in({ns}, {argv:?}): cannot start ip: {e}"))
}

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

// ---------------------------------------------------------------------------
// Namespaces
// ---------------------------------------------------------------------------

fn netns_path(ns: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(ns)
}

/// Moves the *calling thread* into the named network namespace. Only call this
/// from a thread dedicated to that namespace.
fn enter_netns(ns: &str) -> io::Result<()> {
    let path = netns_path(ns);
    let file = File::open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("setns({}): {e}", path.display()),
        )
    })
}

/// Runs `f` on a fresh thread that has entered network namespace `ns`, and
/// returns its result (panics in `f` propagate; panics if `ns` can't be entered).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    thread::scope(|s| {
        let handle = s.spawn(|| {
            enter_netns(ns).unwrap_or_else(|e| panic!("in_netns({ns}): {e}"));
            f()
        });
        handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

fn try_in_netns<T: Send>(ns: &str, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    thread::scope(|s| {
        let handle = s.spawn(|| {
            enter_netns(ns)?;
            f()
        });
        handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Names of all named network namespaces (`ip netns list`).
pub fn list_netns() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_else(|e| panic!("{e}"))
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Writes sysctls (paths relative to /proc/sys) inside namespace `ns`.
fn set_sysctls(ns: &str, settings: &[(&str, &str)]) -> Result<(), String> {
    in_netns(ns, || {
        for (key, value) in settings {
            let path = format!("/proc/sys/{key}");
            std::fs::write(&path, value)
                .map_err(|e| format!("sysctl {path}={value} in {ns}: {e}"))?;
        }
        Ok(())
    })
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

// ---------------------------------------------------------------------------
// Topology
// ---------------------------------------------------------------------------

/// A set of network namespaces (node, ext, containers). Dropping it kills the
/// sleepers it spawned and deletes every namespace.
pub struct Topology {
    prefix: String,
    node: String,
    ext: String,
    /// In creation order; deleted in reverse.
    namespaces: Vec<String>,
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
    /// Creates the node and ext namespaces (see the module docs). Panics with a
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

    fn create_ns(&mut self, ns: &str) -> Result<(), String> {
        {
            let _guard = lock(&NETNS_LOCK);
            ip(&["netns", "add", ns])?;
        }
        self.namespaces.push(ns.to_string());
        Ok(())
    }

    fn setup(&mut self) -> Result<(), String> {
        let node = self.node.clone();
        let ext = self.ext.clone();
        self.create_ns(&node)?;
        self.create_ns(&ext)?;

        let mut node_sysctls = vec![
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
        ];
        node_sysctls.extend_from_slice(NO_DAD);
        set_sysctls(&node, &node_sysctls)?;
        set_sysctls(&ext, NO_DAD)?;

        let n = node.as_str();
        let x = ext.as_str();
        ip(&["-n", n, "link", "set", "lo", "up"])?;
        ip(&["-n", x, "link", "set", "lo", "up"])?;

        // Container bridge. STP off, no forward delay, no multicast snooping
        // (IPv6 ND uses multicast), fixed MAC.
        ip(&[
            "-n",
            n,
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
        ])?;
        ip(&["-n", n, "link", "set", BRIDGE, "address", BRIDGE_MAC])?;
        ip(&["-n", n, "addr", "add", "10.77.0.1/24", "dev", BRIDGE])?;
        ip(&["-n", n, "addr", "add", "fd77::1/64", "dev", BRIDGE, "nodad"])?;
        ip(&["-n", n, "link", "set", BRIDGE, "up"])?;

        // node <-> ext
        ip(&[
            "-n",
            n,
            "link",
            "add",
            NODE_EXT_VETH,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            x,
        ])?;
        ip(&["-n", n, "addr", "add", "10.78.0.1/24", "dev", NODE_EXT_VETH])?;
        ip(&[
            "-n",
            n,
            "addr",
            "add",
            "fd78::1/64",
            "dev",
            NODE_EXT_VETH,
            "nodad",
        ])?;
        ip(&["-n", x, "addr", "add", "10.78.0.2/24", "dev", "eth0"])?;
        ip(&["-n", x, "addr", "add", "fd78::2/64", "dev", "eth0", "nodad"])?;
        ip(&["-n", n, "link", "set", NODE_EXT_VETH, "up"])?;
        ip(&["-n", x, "link", "set", "eth0", "up"])?;
        wait_ipv6_settled(n, NODE_EXT_VETH)?;
        wait_ipv6_settled(x, "eth0")?;
        ip(&["-n", x, "route", "add", "default", "via", "10.78.0.1"])?;
        ip(&["-n", x, "-6", "route", "add", "default", "via", "fd78::1"])?;
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

    /// All namespaces owned by this topology, in creation order.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
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
                if let Some(i) = self.namespaces.iter().position(|x| *x == ns) {
                    self.namespaces.remove(i);
                    delete_ns(&ns);
                }
                panic!("add_container({n}) in {}: {e}", self.prefix);
            }
        }
    }

    fn setup_container(&mut self, n: u8, ns: &str) -> Result<Container, String> {
        self.create_ns(ns)?;
        set_sysctls(ns, NO_DAD)?;
        let node = self.node.clone();
        let node = node.as_str();
        let veth = format!("vc{n}");
        let v4 = Ipv4Addr::new(10, 77, 0, n);
        let v6 = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, n.into());
        let v4_cidr = format!("{v4}/24");
        let v6_cidr = format!("{v6}/64");

        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n", node, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])?;
        ip(&["-n", node, "link", "set", &veth, "master", BRIDGE])?;
        ip(&[
            "-n",
            node,
            "link",
            "set",
            &veth,
            "type",
            "bridge_slave",
            "hairpin",
            "on",
        ])?;
        ip(&["-n", ns, "addr", "add", &v4_cidr, "dev", "eth0"])?;
        ip(&["-n", ns, "addr", "add", &v6_cidr, "dev", "eth0", "nodad"])?;
        ip(&["-n", node, "link", "set", &veth, "up"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;

        wait_until(&format!("bridge port {veth} forwarding"), || {
            Ok(ip(&["-n", node, "-d", "link", "show", "dev", &veth])?.contains("state forwarding"))
        })?;
        wait_ipv6_settled(node, BRIDGE)?;
        wait_ipv6_settled(ns, "eth0")?;
        ip(&["-n", ns, "route", "add", "default", "via", "10.77.0.1"])?;
        ip(&["-n", ns, "-6", "route", "add", "default", "via", "fd77::1"])?;
        Ok(Container {
            ns: ns.to_string(),
            v4,
            v6,
        })
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

fn delete_ns(ns: &str) {
    let _guard = lock(&NETNS_LOCK);
    if let Err(e) = ip(&["netns", "del", ns]) {
        eprintln!("warning: cannot delete network namespace {ns}: {e}");
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for pid in self.sleepers.drain(..) {
            // Not registered any more: kill_pid() already took care of it.
            kill_sleeper(pid);
        }
        for ns in self.namespaces.iter().rev() {
            if let Ok(pids) = ip(&["netns", "pids", ns])
                && !pids.trim().is_empty()
            {
                eprintln!(
                    "warning: processes still running in {ns} (not spawned by the harness): {}",
                    pids.split_whitespace().collect::<Vec<_>>().join(" ")
                );
            }
            delete_ns(ns);
        }
        self.namespaces.clear();
    }
}

// ---------------------------------------------------------------------------
// Servers and clients
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Proto {
    Tcp,
    Udp,
}

/// A TCP or UDP reply server running in a namespace. Dropping it stops it
/// (within ~100 ms) and joins its thread; it also stops by itself after
/// [`SERVER_LIFETIME`].
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Server {
    /// The bound address (with the real port if 0 was requested).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and waits for it (same as dropping it).
    pub fn stop(self) {}
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.handle.take()
            && handle.join().is_err()
        {
            eprintln!("warning: server thread for {} panicked", self.addr);
        }
    }
}

/// Creates a bound (and for TCP listening) socket. IPv6 sockets are V6ONLY so
/// that `0.0.0.0:p` and `[::]:p` servers can coexist.
fn bind_socket(addr: SocketAddr, proto: Proto) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let ty = match proto {
        Proto::Tcp => SockType::Stream,
        Proto::Udp => SockType::Datagram,
    };
    let fd = socket::socket(family, ty, SockFlag::SOCK_CLOEXEC, None)?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        socket::setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    if let Proto::Tcp = proto {
        socket::listen(&fd, Backlog::new(128)?)?;
    }
    Ok(fd)
}

fn answer_tcp(mut stream: TcpStream, reply: &[u8]) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(reply).is_err() {
        return;
    }
    let _ = stream.shutdown(Shutdown::Write);
    // Drain whatever the client sent so that closing does not turn into a RST
    // that could destroy the reply in flight.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let until = Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn tcp_loop(listener: TcpListener, reply: &[u8], stop: &AtomicBool, deadline: Instant) {
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("serve_tcp: set_nonblocking: {e}");
        return;
    }
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => answer_tcp(stream, reply),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    eprintln!("serve_tcp: accept: {e}");
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn udp_loop(sock: UdpSocket, reply: &[u8], stop: &AtomicBool, deadline: Instant) {
    if let Err(e) = sock.set_read_timeout(Some(Duration::from_millis(100))) {
        eprintln!("serve_udp: set_read_timeout: {e}");
        return;
    }
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        match sock.recv_from(&mut buf) {
            Ok((_, peer)) => {
                if let Err(e) = sock.send_to(reply, peer) {
                    eprintln!("serve_udp: send_to {peer}: {e}");
                }
            }
            Err(e) if is_timeout(&e) => {}
            // e.g. ECONNREFUSED left over from an earlier reply's ICMP error.
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A socket read that timed out (or was interrupted): try again.
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn spawn_server(ns: &str, addr: SocketAddr, reply: &str, proto: Proto) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<io::Result<SocketAddr>>();
    let thread_ns = ns.to_string();
    let thread_stop = Arc::clone(&stop);
    let reply = reply.as_bytes().to_vec();
    let handle = thread::Builder::new()
        .name(format!("{proto:?}-server-{ns}-{addr}"))
        .spawn(move || {
            let deadline = Instant::now() + SERVER_LIFETIME;
            let fd = match enter_netns(&thread_ns).and_then(|()| bind_socket(addr, proto)) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            match proto {
                Proto::Tcp => {
                    let listener = TcpListener::from(fd);
                    let _ = tx.send(listener.local_addr());
                    tcp_loop(listener, &reply, &thread_stop, deadline);
                }
                Proto::Udp => {
                    let sock = UdpSocket::from(fd);
                    let _ = tx.send(sock.local_addr());
                    udp_loop(sock, &reply, &thread_stop, deadline);
                }
            }
        })
        .unwrap_or_else(|e| panic!("cannot spawn server thread: {e}"));
    let what = match proto {
        Proto::Tcp => "serve_tcp",
        Proto::Udp => "serve_udp",
    };
    match rx.recv() {
        Ok(Ok(bound)) => Server {
            addr: bound,
            stop,
            handle: Some(handle),
        },
        Ok(Err(e)) => {
            let _ = handle.join();
            panic!("{what}({ns}, {addr}): {e}");
        }
        Err(_) => {
            let _ = handle.join();
            panic!("{what}({ns}, {addr}): server thread died during setup");
        }
    }
}

/// TCP server in `ns` on `addr` answering every connection with `reply`, then
/// closing. Listening when this returns.
pub fn serve_tcp(ns: &str, addr: SocketAddr, reply: &str) -> Server {
    spawn_server(ns, addr, reply, Proto::Tcp)
}

/// UDP server in `ns` on `addr` answering every datagram with `reply`. Bound
/// when this returns.
pub fn serve_udp(ns: &str, addr: SocketAddr, reply: &str) -> Server {
    spawn_server(ns, addr, reply, Proto::Udp)
}

fn nonzero(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

/// From namespace `ns`: connects to `dst` and reads until EOF. `timeout`
/// bounds the connect and each read.
pub fn tcp_request(ns: &str, dst: SocketAddr, timeout: Duration) -> io::Result<String> {
    try_in_netns(ns, move || {
        let deadline = Instant::now() + timeout;
        let mut stream = TcpStream::connect_timeout(&dst, nonzero(timeout))?;
        stream.set_read_timeout(Some(nonzero(
            deadline.saturating_duration_since(Instant::now()),
        )))?;
        let mut out = String::new();
        stream.read_to_string(&mut out)?;
        Ok(out)
    })
}

/// From namespace `ns`: sends "ping" to `dst` and returns the first reply.
/// Resends (from a fresh socket, hence a fresh source port and conntrack
/// entry) a few times within `timeout`; returns `TimedOut` if nothing came
/// back, or the socket error at once (e.g. `ConnectionRefused` on an ICMP
/// port-unreachable).
pub fn udp_request(ns: &str, dst: SocketAddr, timeout: Duration) -> io::Result<String> {
    try_in_netns(ns, move || {
        let deadline = Instant::now() + timeout;
        let attempt = (timeout / 5).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let local: SocketAddr = if dst.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let mut buf = vec![0u8; 65536];
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no UDP reply from {dst} within {timeout:?}"),
                ));
            }
            let sock = UdpSocket::bind(local)?;
            sock.connect(dst)?;
            sock.send(b"ping")?;
            sock.set_read_timeout(Some(nonzero(attempt.min(deadline - now))))?;
            match sock.recv(&mut buf) {
                Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
    })
}

// ---------------------------------------------------------------------------
// Firewall dumps
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Backend {
    Legacy,
    Nft,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Family {
    V4,
    V6,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Legacy, Backend::Nft];

    /// "legacy" / "nft"
    pub fn name(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
        }
    }
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// "ipv4" / "ipv6"
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

/// The iptables binary for a pair, e.g. "ip6tables-nft"; append "-save" /
/// "-restore" for the others.
pub fn iptables_tool(backend: Backend, family: Family) -> &'static str {
    match (backend, family) {
        (Backend::Legacy, Family::V4) => "iptables-legacy",
        (Backend::Legacy, Family::V6) => "ip6tables-legacy",
        (Backend::Nft, Family::V4) => "iptables-nft",
        (Backend::Nft, Family::V6) => "ip6tables-nft",
    }
}

/// Raw `*-save` output (all tables) in `ns`. Panics if the tool fails.
pub fn save(ns: &str, backend: Backend, family: Family) -> String {
    let prog = format!("{}-save", iptables_tool(backend, family));
    let out = run_in(ns, &prog, &[], None);
    assert!(
        out.status.success(),
        "{prog} in {ns} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8(out.stdout)
        .unwrap_or_else(|e| panic!("{prog} in {ns}: non-UTF-8 output: {e}"))
}

/// Replaces a leading "[packets:bytes]" with "[0:0]".
fn zero_leading_counters(s: &str) -> Option<String> {
    let rest = s.strip_prefix('[')?;
    let end = rest.find(']')?;
    let (p, b) = rest[..end].split_once(':')?;
    if p.is_empty()
        || b.is_empty()
        || !p.bytes().all(|c| c.is_ascii_digit())
        || !b.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    Some(format!("[0:0]{}", &rest[end + 1..]))
}

/// Normalizes `*-save` output: drops comments and blank lines, zeroes
/// counters, and drops table blocks made only of built-in chains with policy
/// ACCEPT (no rules, no user chains), so an absent table equals an empty one.
pub fn normalized(dump: &str) -> String {
    let mut out = String::new();
    // Current table block and whether it carries any information.
    let mut block: Option<(Vec<String>, bool)> = None;
    for line in dump.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('*') {
            if let Some((lines, _)) = block.take() {
                // Unterminated block: keep it verbatim.
                lines.iter().for_each(|l| {
                    out.push_str(l);
                    out.push('\n');
                });
            }
            block = Some((vec![line.to_string()], false));
            continue;
        }
        let Some((lines, interesting)) = block.as_mut() else {
            out.push_str(&zero_leading_counters(line).unwrap_or_else(|| line.to_string()));
            out.push('\n');
            continue;
        };
        if line == "COMMIT" {
            lines.push(line.to_string());
            let (lines, interesting) = block.take().expect("block is open");
            if interesting {
                lines.iter().for_each(|l| {
                    out.push_str(l);
                    out.push('\n');
                });
            }
            continue;
        }
        if let Some(chain) = line.strip_prefix(':') {
            let mut parts = chain.split_whitespace();
            let name = parts.next().unwrap_or("");
            let policy = parts.next().unwrap_or("");
            // "-" marks a user chain; DROP etc. is a non-default policy.
            if policy != "ACCEPT" {
                *interesting = true;
            }
            lines.push(format!(":{name} {policy} [0:0]"));
        } else {
            *interesting = true;
            lines.push(zero_leading_counters(line).unwrap_or_else(|| line.to_string()));
        }
    }
    if let Some((lines, _)) = block {
        lines.iter().for_each(|l| {
            out.push_str(l);
            out.push('\n');
        });
    }
    out
}

/// Normalized dumps of all four (backend, family) pairs in `ns`, each headed
/// by "## <legacy|nft> <ipv4|ipv6>".
pub fn dump_all(ns: &str) -> String {
    let mut out = String::new();
    for backend in Backend::ALL {
        for family in Family::ALL {
            out.push_str(&format!("## {} {}\n", backend.name(), family.name()));
            out.push_str(&normalized(&save(ns, backend, family)));
        }
    }
    out
}

/// Pipes `restore_text` into `*-restore --noflush` in `ns` (waiting for the
/// xtables lock, which legacy shares across all namespaces). Panics with
/// stderr on failure.
pub fn load_rules(ns: &str, backend: Backend, family: Family, restore_text: &str) {
    let prog = format!("{}-restore", iptables_tool(backend, family));
    let out = run_in(
        ns,
        &prog,
        &["--noflush", "-w", "30"],
        Some(restore_text.as_bytes()),
    );
    assert!(
        out.status.success(),
        "{prog} --noflush in {ns} failed ({}): {}\ninput:\n{restore_text}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

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

mod cni;
mod conntrack;
mod containerd;
mod daemons;
mod dockerd;
mod doctor;
mod dumps;
mod kube;
mod libcni;
mod localnet;
mod netns;
mod node;
mod ociimage;
mod podman;
mod rootfs;
mod runc;
mod suite;
mod timed;
mod topology;
mod traffic;

// The public API, flat: `use common::*;`. Each test binary uses a different subset of it.
#[allow(unused_imports)]
pub use {
    cni::*, conntrack::*, containerd::*, daemons::*, dockerd::*, doctor::*, dumps::*, kube::*,
    libcni::*, localnet::*, netns::*, node::*, ociimage::*, podman::*, rootfs::*, runc::*,
    suite::*, timed::*, topology::*, traffic::*,
};

use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

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
    use natledger::kernel::exec::{Invocation, Runner, SystemRunner};
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

//! What the benchmarks share: a private network namespace, running tools, foreign rules.

#![allow(dead_code)] // each bench uses a subset

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_natledger");

pub struct Netns(pub String);

impl Netns {
    pub fn new(name: String) -> Netns {
        run("ip", &["netns", "add", &name], None);
        run("ip", &["-n", &name, "link", "set", "lo", "up"], None);
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
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
pub fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
}

pub fn foreign_rules(n: usize) -> String {
    let mut s = String::from("*nat\n:KUBE-FAKE - [0:0]\n-A PREROUTING -j KUBE-FAKE\n");
    for i in 0..n {
        s += &format!(
            "-A KUBE-FAKE -d 10.{}.{}.{}/32 -p tcp -m tcp --dport {} -m comment --comment \"svc{i}\" -j DNAT --to-destination 10.200.0.1:80\n",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255,
            1000 + i % 50000
        );
    }
    s + "COMMIT\n"
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

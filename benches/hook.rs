//! Benchmark: one create-runtime + one poststop for one TCP mapping, beside the floor (one bare
//! `iptables-restore --noflush` inserting the same rules, one deleting them), on both backends,
//! with an empty nat table and with 10,000 foreign rules. Prints medians and process counts.
//!
//! Run as root: `cargo bench --bench hook` (env BENCH_RUNS, default 30). Everything happens in
//! a private network namespace that is deleted at the end.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::*;

struct Case<'a> {
    backend: &'a str,
    state: &'a Path,
    bundle: &'a Path,
}

impl Case<'_> {
    fn hook(&self, stage: &str, trace: bool) -> Duration {
        let state = format!(
            r#"{{"ociVersion":"1.0.2","id":"bench","status":"{}","bundle":"{}"}}"#,
            if stage == "create-runtime" {
                "creating"
            } else {
                "stopped"
            },
            self.bundle.display()
        );
        let mut cmd = Command::new(BIN);
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
        let start = Instant::now();
        let out = run_cmd(cmd, state.as_bytes());
        let took = start.elapsed();
        if trace {
            let n = String::from_utf8_lossy(&out.stderr)
                .matches("exec ")
                .count();
            println!("    {stage}: {n} process(es)");
        }
        took
    }

    /// The rules natledger wrote, from its manifest, as restore batches (insert, delete).
    fn floor_batches(&self) -> (String, String) {
        let text = std::fs::read_to_string(self.state.join("containers/bench.json")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (mut add, mut del) = (String::from("*nat\n"), String::from("*nat\n"));
        for r in manifest["rules"].as_array().unwrap() {
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
            add += &format!("{verb} {chain} {args}\n");
            del += &format!("-D {chain} {args}\n");
        }
        (add + "COMMIT\n", del + "COMMIT\n")
    }

    fn restore(&self, batch: &str) -> Duration {
        let tool = format!("/usr/sbin/iptables-{}-restore", self.backend);
        let mut cmd = Command::new(tool);
        cmd.arg("--noflush");
        let start = Instant::now();
        run_cmd(cmd, batch.as_bytes());
        start.elapsed()
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; nothing to run then.
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let work = tempfile::tempdir().unwrap();
    let bundle: PathBuf = work.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion":"1.0.2","annotations":{"io.natledger.ports":"8080:80","io.natledger.ip":"10.77.0.2"}}"#,
    )
    .unwrap();
    println!(
        "natledger create+poststop vs floor (restore add + restore del), one tcp mapping, IPv4, {runs} runs, median ms"
    );
    println!(
        "{:<7} {:>8} {:>10} {:>10} {:>10}",
        "backend", "foreign", "natledger", "floor", "ratio"
    );
    for backend in ["legacy", "nft"] {
        for foreign in [0usize, 10_000] {
            // A child process per case, so each enters a fresh namespace.
            let out = Command::new(std::env::current_exe().unwrap())
                .env(
                    "BENCH_CASE",
                    format!("{backend}:{foreign}:{runs}:{}", bundle.display()),
                )
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            assert!(out.status.success(), "case {backend} {foreign} failed");
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
    }
}

/// The per-case child: BENCH_CASE=backend:foreign:runs:bundle.
fn case_main(spec: &str) {
    let mut parts = spec.splitn(4, ':');
    let backend = parts.next().unwrap();
    let foreign: usize = parts.next().unwrap().parse().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    let bundle = PathBuf::from(parts.next().unwrap());
    let ns = Netns::new(format!(
        "nlbench-{}-{backend}-{foreign}",
        std::process::id()
    ));
    enter(&ns.0);
    if foreign > 0 {
        let tool = format!("/usr/sbin/iptables-{backend}-restore");
        run(
            &tool,
            &["--noflush"],
            Some(foreign_rules(foreign).as_bytes()),
        );
    }
    // The state dir lives on tmpfs, as /run/natledger does in production.
    let state = tempfile::tempdir_in("/run").unwrap();
    let case = Case {
        backend,
        state: state.path(),
        bundle: &bundle,
    };
    // Warm up: the first create makes the shared chains and jumps, which stay.
    case.hook("create-runtime", false);
    let (add, del) = case.floor_batches();
    case.hook("poststop", false);
    let mut ours = Vec::new();
    let mut floor = Vec::new();
    for _ in 0..runs {
        ours.push(case.hook("create-runtime", false) + case.hook("poststop", false));
        floor.push(case.restore(&add) + case.restore(&del));
    }
    let (n, f) = (median(ours), median(floor));
    case.hook("create-runtime", true);
    case.hook("poststop", true);
    println!(
        "{backend:<7} {foreign:>8} {n:>10.2} {f:>10.2} {:>9.2}x",
        n / f
    );
}

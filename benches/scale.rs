//! Benchmark: create-runtime and poststop of one container with 1, 100, 1,000 and 4,000 TCP
//! mappings (3 nat rules and 1 filter rule each, IPv4), on both backends, with natledger's
//! chains already there (a warm-up container made them). Prints the median wall time of each
//! hook, the processes poststop started, and on iptables-legacy the longest in-process table
//! edit (`iptc`, from natledger's trace): the xtables lock is held for at most that long
//! (from the read of the table to the counters' restore), the bound other iptables users
//! wait. Checks after every poststop that none of the container's rules is left.
//!
//! Run as root: `cargo bench --bench scale` (env BENCH_RUNS, default 5; BENCH_MAPPINGS, a
//! comma list, default 1,100,1000: natledger records at most 1,024 mappings per container
//! once consecutive ports are merged, and these are scattered). Everything happens in private network namespaces,
//! the state directory on its own tmpfs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;

use common::*;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs: usize = env_or("BENCH_RUNS", "5").parse().unwrap();
    let sizes: Vec<usize> = env_or("BENCH_MAPPINGS", "1,100,1000")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    println!(
        "natledger create-runtime and poststop of one container with N tcp mappings (IPv4, 4 \
         rules each), {runs} runs, median ms"
    );
    println!(
        "{:<7} {:>8} {:>7} {:>10} {:>11} {:>10} {:>16}",
        "backend", "mappings", "rules", "create ms", "poststop ms", "processes", "xtables lock ms"
    );
    for backend in ["legacy", "nft"] {
        for n in &sizes {
            print!("{}", run_case(&format!("{backend}:{n}:{runs}")));
        }
    }
}

/// A bundle asking for `n` tcp mappings, 20000.. -> 80, to 10.77.0.2.
fn bundle(dir: &Path, name: &str, n: usize) -> std::path::PathBuf {
    let bundle = dir.join(name);
    std::fs::create_dir(&bundle).unwrap();
    let ports: Vec<String> = (0..n).map(|i| format!("{}:80", 20000 + i)).collect();
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "annotations": {"io.natledger.ports": ports.join(","), "io.natledger.ip": "10.77.0.2"},
    });
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    bundle
}

/// One hook with `NATLEDGER_TRACE`: its time, the processes it started, and the longest
/// in-process iptables-legacy table edit it traced, in ms.
fn traced(case: &Case, stage: &str) -> (Duration, usize, f64) {
    let state = hook_state("bench", stage, case.bundle);
    let mut cmd = Command::new(BIN);
    cmd.args(["--state-dir", case.state.to_str().unwrap()]);
    cmd.args(["--backend", case.backend, "hook", stage]);
    cmd.env("NATLEDGER_TRACE", "1");
    settle();
    let start = std::time::Instant::now();
    let out = run_cmd(cmd, state.as_bytes());
    let took = start.elapsed();
    let trace = String::from_utf8_lossy(&out.stderr);
    let processes = trace.matches("natledger: exec ").count();
    // "natledger: iptc: deleted 12000 ipv4 nat rule(s) in 41.8 ms"
    let longest = trace
        .lines()
        .filter(|l| l.starts_with("natledger: iptc: "))
        .filter_map(|l| l.rsplit(" in ").next()?.strip_suffix(" ms")?.parse().ok())
        .fold(0.0, f64::max);
    (took, processes, longest)
}

/// The per-case child: BENCH_CASE=backend:mappings:runs.
fn case_main(spec: &str) {
    let mut parts = spec.split(':');
    let backend = parts.next().unwrap();
    let n: usize = parts.next().unwrap().parse().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    let ns = netns(format!("nlscale-{}-{backend}-{n}", std::process::id()));
    enter(&ns);
    let state = TmpfsDir::new();
    let work = tempfile::tempdir().unwrap();
    let save = format!("/usr/sbin/iptables-{backend}-save");
    // Warm up: the first container makes the shared chains and jumps, which stay.
    let warm = bundle(work.path(), "warm", 1);
    let warm = Case {
        bin: BIN,
        backend,
        state: state.path(),
        bundle: &warm,
    };
    warm.hook_counted("create-runtime", false);
    warm.hook_counted("poststop", false);

    let big = bundle(work.path(), "big", n);
    let case = Case {
        bin: BIN,
        backend,
        state: state.path(),
        bundle: &big,
    };
    let (mut creates, mut removes) = (Vec::new(), Vec::new());
    let (mut processes, mut locked) = (0, 0.0f64);
    for _ in 0..runs {
        creates.push(traced(&case, "create-runtime").0);
        let (took, p, l) = traced(&case, "poststop");
        removes.push(took);
        processes = processes.max(p);
        locked = locked.max(l);
        let left = String::from_utf8_lossy(&run(&save, &[], None).stdout).to_string();
        assert!(
            !left.contains("natledger:bench"),
            "a rule survived poststop"
        );
    }
    let lock = if backend == "legacy" {
        format!("{locked:.1}")
    } else {
        "-".to_string()
    };
    println!(
        "{backend:<7} {n:>8} {:>7} {:>10.1} {:>11.1} {processes:>10} {lock:>16}",
        4 * n,
        median(creates),
        median(removes),
    );
}

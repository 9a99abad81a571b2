//! Benchmark: one create-runtime + one poststop for one TCP mapping, beside the floor (one bare
//! `iptables-restore --noflush` inserting the same rules, one deleting them), on both backends,
//! with an empty nat table and with 10,000 foreign rules. Prints medians and process counts.
//!
//! Run as root: `cargo bench --bench hook` (env BENCH_RUNS, default 30; BENCH_CASES picks cases). Everything happens in
//! a private network namespace that is deleted at the end.

use std::path::PathBuf;
use std::time::Duration;

mod common;

use common::*;

/// Runs one stage; with `trace`, prints how many processes natledger started.
fn hook(case: &Case, stage: &str, trace: bool) -> Duration {
    let (took, n) = case.hook_counted(stage, trace);
    if trace {
        println!("    {stage}: {n} process(es)");
    }
    took
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
    let bundle: PathBuf = bench_bundle(work.path());
    println!(
        "natledger create+poststop vs floor (restore add + restore del), one tcp mapping, IPv4, {runs} runs, median ms"
    );
    println!(
        "{:<7} {:>8} {:>10} {:>10} {:>10}",
        "backend", "foreign", "natledger", "floor", "ratio"
    );
    // BENCH_CASES=legacy:0,nft:10000 runs only those cases (default: all four).
    let only = env_or("BENCH_CASES", "");
    for backend in ["legacy", "nft"] {
        for foreign in [0usize, 10_000] {
            let name = format!("{backend}:{foreign}");
            if !only.is_empty() && !only.split(',').any(|c| c == name) {
                continue;
            }
            // A child process per case, so each enters a fresh namespace.
            print!(
                "{}",
                run_case(&format!("{backend}:{foreign}:{runs}:{}", bundle.display()))
            );
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
    let ns = netns(format!(
        "nlbench-{}-{backend}-{foreign}",
        std::process::id()
    ));
    enter(&ns);
    load_foreign(backend, foreign);
    // The state dir lives on tmpfs, as /run/natledger does in production.
    let state = TmpfsDir::new();
    let case = Case {
        bin: BIN,
        backend,
        state: state.path(),
        bundle: &bundle,
    };
    // Warm up: the first create makes the shared chains and jumps, which stay.
    hook(&case, "create-runtime", false);
    let (add, del) = case.floor_batches();
    hook(&case, "poststop", false);
    let mut ours = Vec::new();
    let mut floor = Vec::new();
    for _ in 0..runs {
        ours.push(hook(&case, "create-runtime", false) + hook(&case, "poststop", false));
        floor.push(case.restore(&add) + case.restore(&del));
    }
    let (n, f) = (median(ours), median(floor));
    hook(&case, "create-runtime", true);
    hook(&case, "poststop", true);
    println!(
        "{backend:<7} {foreign:>8} {n:>10.2} {f:>10.2} {:>9.2}x",
        n / f
    );
}

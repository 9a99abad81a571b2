//! Benchmark: 64 containers created and then removed by concurrent hooks (wall time, and the
//! natledger rules left afterwards: must be zero), and the peak memory of one hook run
//! (create-runtime and poststop, the hook process's own maximum resident set size, as it
//! reports it with NATLEDGER_TRACE), per setup (`common::setup::SETUPS`: each backend; on
//! nftables the foreign rules in another owner's native table, and in iptables-nft's nat
//! table), in a private network namespace with 10,000 foreign rules. Appends CSV rows to
//! BENCH_CSV if set.
//!
//! Run as root: `cargo bench --bench load`.

use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

mod common;

use common::setup::{Setup, selected};
use common::*;

const CONTAINERS: usize = 64;
const FOREIGN: usize = 10_000;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(backend) = std::env::var("BENCH_CASE") {
        return case_main(&backend);
    }
    println!(
        "natledger under load: {CONTAINERS} containers by concurrent hooks, {FOREIGN} foreign rules"
    );
    println!(
        "{:<15} {:>12} {:>12} {:>10} {:>16} {:>16}",
        "backend", "create ms", "remove ms", "rules left", "create peak KiB", "poststop peak KiB"
    );
    for setup in selected() {
        print!("{}", run_case(setup.label));
    }
}

/// Run one hook to completion: the natledger command and the state it reads on stdin.
/// Returns its own peak resident set size in KiB (as it reports it with NATLEDGER_TRACE).
fn run_hook(state: &Path, backend: &str, id: &str, stage: &str, bundle: &Path) -> u64 {
    let stdin = hook_state(id, stage, bundle);
    let mut cmd = Command::new(BIN);
    cmd.args(["--state-dir", state.to_str().unwrap(), "--backend", backend])
        .args(["hook", stage])
        .env("NATLEDGER_TRACE", "1");
    let out = run_cmd(cmd, stdin.as_bytes());
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| {
            l.strip_prefix("natledger: peak rss ")?
                .strip_suffix(" KiB")?
                .parse()
                .ok()
        })
        .expect("natledger reports its peak rss with NATLEDGER_TRACE")
}

fn case_main(label: &str) {
    let setup = Setup::named(label);
    let backend = setup.backend;
    let ns = netns(format!("nlload-{}-{label}", std::process::id()));
    enter(&ns);
    setup.load_foreign(FOREIGN);
    let work = TmpfsDir::new();
    let state = work.path().join("state");
    let bundles: Vec<_> = (0..CONTAINERS)
        .map(|i| {
            let dir = work.path().join(format!("b{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let config = format!(
                r#"{{"ociVersion":"1.0.2","annotations":{{"io.natledger.ports":"{}:80","io.natledger.ip":"10.77.{}.{}"}}}}"#,
                20000 + i,
                i / 200,
                i % 200 + 2
            );
            std::fs::File::create(dir.join("config.json"))
                .unwrap()
                .write_all(config.as_bytes())
                .unwrap();
            dir
        })
        .collect();

    // Peak memory of one hook run of each kind, the hook process alone.
    let create_peak = run_hook(&state, backend, "probe", "create-runtime", &bundles[0]);
    let poststop_peak = run_hook(&state, backend, "probe", "poststop", &bundles[0]);

    let timed = |stage: &str| {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (i, bundle) in bundles.iter().enumerate() {
                let state = &state;
                s.spawn(move || {
                    run_hook(state, backend, &format!("c{i}"), stage, bundle);
                });
            }
        });
        start.elapsed().as_secs_f64() * 1000.0
    };
    let create = timed("create-runtime");
    let remove = timed("poststop");
    let left = setup
        .nat_dump()
        .lines()
        .filter(|l| l.contains("natledger:"))
        .count();
    println!(
        "{label:<15} {create:>12.1} {remove:>12.1} {left:>10} {create_peak:>16} {poststop_peak:>16}"
    );
    if let Ok(csv) = std::env::var("BENCH_CSV") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(csv)
            .unwrap();
        let _ = writeln!(
            f,
            "natledger-64-concurrent,{label},{FOREIGN},create,{create:.2},"
        );
        let _ = writeln!(
            f,
            "natledger-64-concurrent,{label},{FOREIGN},remove,{remove:.2},"
        );
        let _ = writeln!(
            f,
            "natledger-peak-kib,{label},{FOREIGN},create,{create_peak},"
        );
        let _ = writeln!(
            f,
            "natledger-peak-kib,{label},{FOREIGN},remove,{poststop_peak},"
        );
    }
    assert_eq!(left, 0, "natledger rules left after 64 poststops");
}

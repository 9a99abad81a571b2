//! Benchmark: `natledger sweep` after N containers died without poststop (3 TCP mappings
//! each, IPv4: 9 rules per container), with 10,000 foreign nat rules, on both backends.
//! Prints the median wall time, the processes the sweep started, and checks after each run
//! that every dead rule is gone and every foreign rule stayed.
//!
//! Run as root: `cargo bench --bench sweep` (env BENCH_RUNS, default 5; BENCH_DEAD, a comma
//! list, default 10,100,1000; BENCH_VERBOSE=1 prints each process the sweep ran and its
//! time). Everything happens in private network namespaces.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use natledger::backend::Backend;
use natledger::model::family::Family;
use natledger::model::layout::{TABLES, mapping_rules, owned_chains, shared_rules};
use natledger::model::portspec::parse_mappings;
use natledger::model::save::{Batch, Op};
use natledger::state::ledger::{Ledger, Manifest, Phase, RuleRecord, SCHEMA};

mod common;

use common::*;

const FOREIGN: usize = 10_000;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs: usize = env_or("BENCH_RUNS", "5").parse().unwrap();
    let deads: Vec<usize> = env_or("BENCH_DEAD", "10,100,1000")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    println!(
        "natledger sweep: N dead containers x 3 tcp mappings (9 rules each), {FOREIGN} foreign \
         rules, {runs} runs, median ms"
    );
    println!(
        "{:<7} {:>6} {:>8} {:>10} {:>10}",
        "backend", "dead", "rules", "sweep ms", "processes"
    );
    for backend in ["legacy", "nft"] {
        for dead in &deads {
            print!("{}", run_case(&format!("{backend}:{dead}:{runs}")));
        }
    }
}

/// The per-case child: BENCH_CASE=backend:dead:runs.
fn case_main(spec: &str) {
    let mut parts = spec.split(':');
    let backend_name = parts.next().unwrap();
    let dead: usize = parts.next().unwrap().parse().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    let backend = match backend_name {
        "legacy" => Backend::IptablesLegacy,
        _ => Backend::IptablesNft,
    };
    let ns = netns(format!(
        "nlsweep-{}-{backend_name}-{dead}",
        std::process::id()
    ));
    enter(&ns);
    let restore = format!("/usr/sbin/iptables-{backend_name}-restore");
    let save = format!("/usr/sbin/iptables-{backend_name}-save");
    run(
        &restore,
        &["--noflush"],
        Some(foreign_rules(FOREIGN).as_bytes()),
    );
    let foreign_before = foreign_lines(&save);

    let tmpfs = TmpfsDir::new();
    let mut times = Vec::new();
    let mut processes = 0;
    for run_no in 0..runs {
        let state = tempfile::tempdir_in(tmpfs.path()).unwrap();
        let rules = dead_containers(state.path(), backend, dead, run_no == 0);
        let text: String = rules.iter().map(Batch::render).collect();
        run(&restore, &["--noflush"], Some(text.as_bytes()));
        let mut cmd = Command::new(BIN);
        cmd.args(["--state-dir", state.path().to_str().unwrap(), "sweep"]);
        cmd.env("NATLEDGER_TRACE", "1");
        let start = Instant::now();
        let out = run_cmd(cmd, b"");
        times.push(start.elapsed());
        let trace = String::from_utf8_lossy(&out.stderr);
        processes = trace.matches("natledger: exec ").count();
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            eprint!("{trace}");
        }
        let after = String::from_utf8_lossy(&run(&save, &[], None).stdout).to_string();
        assert!(!after.contains("natledger:"), "a dead rule survived");
        assert_eq!(
            foreign_lines(&save),
            foreign_before,
            "foreign rules changed"
        );
        assert_eq!(
            std::fs::read_dir(state.path().join("containers"))
                .unwrap()
                .count(),
            0
        );
    }
    println!(
        "{backend_name:<7} {dead:>6} {:>8} {:>10.1} {processes:>10}",
        dead * 9,
        median(times)
    );
}

fn foreign_lines(save: &str) -> Vec<String> {
    String::from_utf8_lossy(&run(save, &["-t", "nat"], None).stdout)
        .lines()
        .filter(|l| l.contains("KUBE-FAKE"))
        .map(String::from)
        .collect()
}

/// Write `n` manifests of dead containers (pids that do not exist) and return the batches
/// (filter, nat) that install their rules, as create-runtime would have; the `first` time
/// with natledger's chains and jumps too (a sweep leaves those).
fn dead_containers(state: &Path, backend: Backend, n: usize, first: bool) -> Vec<Batch> {
    let ledger = Ledger::new(state);
    let locked = ledger.lock().unwrap();
    let mut batches: Vec<Batch> = TABLES.iter().map(|t| Batch::new(t)).collect();
    for batch in batches.iter_mut().filter(|_| first) {
        for chain in owned_chains(backend, batch.table, Family::Ipv4) {
            batch.ops.push(Op::DeclareChain(chain.to_string()));
        }
        for (chain, jump) in shared_rules(backend, batch.table, Family::Ipv4) {
            batch
                .ops
                .push(Op::InsertFirst(chain.to_string(), jump.to_args()));
        }
    }
    for i in 0..n {
        let id = format!("dead{i}").parse().unwrap();
        let addr = std::net::IpAddr::from([10, 77, (i / 250) as u8, (i % 250 + 2) as u8]);
        let base = 20000 + 3 * i;
        let spec = format!("{base}:80,{}:81,{}:82", base + 1, base + 2);
        let mappings = parse_mappings(&spec).unwrap();
        let rules: Vec<RuleRecord> = mappings
            .iter()
            .flat_map(|m| mapping_rules(backend, &id, m, addr))
            .map(|p| RuleRecord::new(backend, Family::Ipv4, p.table, p.chain, p.rule))
            .collect();
        for r in &rules {
            let batch = batches
                .iter_mut()
                .find(|b| b.table == r.table_name())
                .unwrap();
            batch
                .ops
                .push(Op::Append(r.chain.clone(), r.args().into_owned()));
        }
        locked
            .store(&Manifest {
                schema: SCHEMA,
                container_id: id,
                bundle: None,
                pid: Some(i32::MAX - i as i32),
                pid_start_time: Some(1),
                boot_id: None,
                pid_namespace: None,
                phase: Phase::Installed,
                mappings,
                addresses: vec![addr],
                rules,
                netns: None,
                pod: None,
                shares: Vec::new(),
                shared_by: Vec::new(),
                stacked_on: Vec::new(),
                cni: None,
            })
            .unwrap();
    }
    batches
}

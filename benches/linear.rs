//! Benchmark: removal at scale, per backend (iptables-legacy, iptables-nft, natledger's own
//! nftables tables), the cases issue 22 found quadratic:
//! - `sweep`: N manifests (default 5,000), one in BENCH_DEAD_EVERY dead (default 2: every
//!   other one; live and dead interleaved in every chain), one TCP mapping each (IPv4); the sweep's wall time (the ledger lock is
//!   held for about that long), the processes it started, and the wall time of a
//!   create-runtime of another container started 20 ms into the sweep (it waits on the
//!   lock). Checked after each run: no dead rule left, every live rule kept, the concurrent
//!   create's rules present, no dead manifest left.
//! - `poststop`: one container with M mappings (default 20,000), its manifest and rules
//!   written directly (as create-runtime would have); poststop's wall time and processes.
//!   Checked after each run: none of its rules is left.
//!
//! Run as root: `cargo bench --bench linear` (env BENCH_RUNS, default 3; BENCH_MANIFESTS,
//! default 5000; BENCH_MAPPINGS, default 20000; BENCH_BACKENDS, default
//! legacy,nft,nftables; BENCH_PARTS, default sweep,poststop; BENCH_DEAD_EVERY, default 2;
//! BENCH_VERBOSE=1 prints natledger's trace). Everything happens in private
//! network namespaces, the state directory on its own tmpfs.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use natledger::backend::{Backend, Netfilter, Plan};
use natledger::kernel::exec::SystemRunner;
use natledger::model::family::Family;
use natledger::model::layout::{TABLES, mapping_rules, owned_chains, shared_rules};
use natledger::model::portspec::parse_mappings;
use natledger::model::save::{Batch, Op};
use natledger::state::ledger::{Ledger, Manifest, Phase, RuleRecord, SCHEMA};

mod common;

use common::*;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs = env_usize("BENCH_RUNS", 3);
    let manifests = env_usize("BENCH_MANIFESTS", 5000);
    let mappings = env_usize("BENCH_MAPPINGS", 20000);
    let backends = env_or("BENCH_BACKENDS", "legacy,nft,nftables");
    let parts = env_or("BENCH_PARTS", "sweep,poststop");
    let every = env_usize("BENCH_DEAD_EVERY", 2);
    if parts.contains("sweep") {
        println!(
            "natledger sweep of {manifests} manifests, one in {every} dead (1 tcp mapping each, \
             IPv4), {runs} runs, median ms; a create started 20 ms into the sweep"
        );
        println!(
            "{:<8} {:>9} {:>7} {:>10} {:>10} {:>17}",
            "backend", "manifests", "rules", "sweep ms", "processes", "concurrent create"
        );
        for backend in backends.split(',') {
            print!(
                "{}",
                run_case(&format!("sweep:{backend}:{manifests}:{runs}"))
            );
        }
    }
    if parts.contains("poststop") {
        println!(
            "natledger poststop of one container with {mappings} tcp mappings (IPv4), {runs} \
             runs, median ms"
        );
        println!(
            "{:<8} {:>9} {:>7} {:>12} {:>10}",
            "backend", "mappings", "rules", "poststop ms", "processes"
        );
        for backend in backends.split(',') {
            print!(
                "{}",
                run_case(&format!("poststop:{backend}:{mappings}:{runs}"))
            );
        }
    }
}

fn backend_of(name: &str) -> Backend {
    match name {
        "legacy" => Backend::IptablesLegacy,
        "nft" => Backend::IptablesNft,
        "nftables" => Backend::OwnNftables,
        other => panic!("no backend {other}"),
    }
}

/// The per-case child: BENCH_CASE=part:backend:n:runs.
fn case_main(spec: &str) {
    let mut parts = spec.split(':');
    let part = parts.next().unwrap().to_string();
    let name = parts.next().unwrap().to_string();
    let n: usize = parts.next().unwrap().parse().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    let ns = netns(format!("nllin-{}-{part}-{name}", std::process::id()));
    enter(&ns);
    let tmpfs = TmpfsDir::new();
    match part.as_str() {
        "sweep" => sweep_case(&name, n, runs, tmpfs.path()),
        _ => poststop_case(&name, n, runs, tmpfs.path()),
    }
}

/// The records of container `id` with `n` tcp mappings from `port`, to `addr`.
fn records(backend: Backend, id: &str, port: usize, n: usize, addr: [u8; 4]) -> Vec<RuleRecord> {
    let spec: Vec<String> = (0..n).map(|i| format!("{}:80", port + i)).collect();
    let mappings = parse_mappings(&spec.join(",")).unwrap();
    let id = id.parse().unwrap();
    mappings
        .iter()
        .flat_map(|m| mapping_rules(backend, &id, m, std::net::IpAddr::from(addr)))
        .map(|p| RuleRecord::new(backend, Family::Ipv4, p.table, p.chain, p.rule))
        .collect()
}

/// The manifest of `id` with `rules`; alive when `pid` is this process (its start time).
fn manifest(id: &str, pid: i32, rules: Vec<RuleRecord>, spec: &str) -> Manifest {
    Manifest {
        schema: SCHEMA,
        container_id: id.parse().unwrap(),
        bundle: None,
        pid: Some(pid),
        pid_start_time: natledger::kernel::procfs::start_time(pid).or(Some(1)),
        boot_id: None,
        pid_namespace: None,
        phase: Phase::Installed,
        mappings: parse_mappings(spec).unwrap(),
        addresses: Vec::new(),
        rules,
        netns: None,
        pod: None,
        shares: Vec::new(),
        shared_by: Vec::new(),
        stacked_on: Vec::new(),
        cni: None,
    }
}

/// Install `records` (and, the `first` time, natledger's chains and shared rules) as
/// create-runtime would have: restore on the iptables backends, natledger's own batch on
/// nftables.
fn install(backend: Backend, records: &[RuleRecord], first: bool) {
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
    for r in records {
        let batch = batches
            .iter_mut()
            .find(|b| b.table == r.table_name())
            .unwrap();
        batch
            .ops
            .push(Op::Append(r.chain.clone(), r.args().into_owned()));
    }
    if backend == Backend::OwnNftables {
        let runner = SystemRunner::default();
        let nf = Netfilter::new(&runner);
        for batch in &batches {
            (backend.driver())
                .apply_plan(&nf, Family::Ipv4, &Plan::batch(batch))
                .unwrap();
        }
    } else {
        let text: String = batches.iter().map(Batch::render).collect();
        let restore = format!("/usr/sbin/iptables-{backend}-restore");
        run(&restore, &["--noflush"], Some(text.as_bytes()));
    }
}

/// Every rule of natledger's (tagged lines) in IPv4, as the backend prints it.
fn tagged_lines(backend: Backend) -> Vec<String> {
    let text = if backend == Backend::OwnNftables {
        nft::own_tables()
    } else {
        let save = format!("/usr/sbin/iptables-{backend}-save");
        String::from_utf8_lossy(&run(&save, &[], None).stdout).into_owned()
    };
    text.lines()
        .filter(|l| l.contains("natledger:"))
        .map(|l| l.trim().to_string())
        .collect()
}

/// `natledger hook STAGE` on `backend` with the state directory `state`.
fn hook(state: &Path, backend: &str, stage: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["--state-dir", state.to_str().unwrap(), "--backend", backend]);
    cmd.args(["hook", stage]);
    cmd
}

fn sweep_case(name: &str, n: usize, runs: usize, tmpfs: &Path) {
    let backend = backend_of(name);
    let me = std::process::id() as i32;
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("late");
    std::fs::create_dir(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion":"1.0.2","annotations":{"io.natledger.ports":"19999:80","io.natledger.ip":"10.76.0.2"}}"#,
    )
    .unwrap();
    let every = env_usize("BENCH_DEAD_EVERY", 2);
    let (mut sweeps, mut creates) = (Vec::new(), Vec::new());
    let (mut processes, mut rules) = (0, 0);
    for run_no in 0..runs {
        let state = tempfile::tempdir_in(tmpfs).unwrap();
        let ledger = Ledger::new(state.path());
        let mut all = Vec::new();
        let mut dead = 0;
        {
            let locked = ledger.lock().unwrap();
            for i in 0..n {
                let alive = !i.is_multiple_of(every);
                let id = format!("c{i}");
                let port = 20000 + i;
                let addr = [10, 77, (i / 250) as u8, (i % 250 + 2) as u8];
                let recs = records(backend, &id, port, 1, addr);
                // A dead container's pid: one no process has.
                let pid = if alive { me } else { i32::MAX - i as i32 };
                locked
                    .store(&manifest(&id, pid, recs.clone(), &format!("{port}:80")))
                    .unwrap();
                if !alive {
                    dead += recs.len();
                }
                all.extend(recs);
            }
        }
        rules = all.len();
        install(backend, &all, run_no == 0);
        settle();
        let mut cmd = Command::new(BIN);
        cmd.args(["--state-dir", state.path().to_str().unwrap(), "sweep"]);
        cmd.env("NATLEDGER_TRACE", "1");
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let start = Instant::now();
        let child = cmd.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let create_state = format!(
            r#"{{"ociVersion":"1.0.2","id":"late","status":"creating","pid":{me},"bundle":"{}"}}"#,
            bundle.display()
        );
        let create_start = Instant::now();
        run_cmd(
            hook(state.path(), name, "create-runtime"),
            create_state.as_bytes(),
        );
        creates.push(create_start.elapsed());
        let out = child.wait_with_output().unwrap();
        let took = start.elapsed();
        assert!(
            out.status.success(),
            "sweep: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        sweeps.push(took);
        let trace = String::from_utf8_lossy(&out.stderr);
        processes = trace.matches("natledger: exec ").count();
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            eprint!("{trace}");
        }
        let after = tagged_lines(backend);
        for line in &after {
            let id = line
                .split("natledger:")
                .nth(1)
                .unwrap()
                .split(['"', ' '])
                .next()
                .unwrap();
            let i: usize = id.trim_start_matches('c').parse().unwrap_or(0);
            assert!(
                id == "late" || !i.is_multiple_of(every),
                "a dead container's rule survived: {line}"
            );
        }
        let late = after
            .iter()
            .filter(|l| l.contains("natledger:late"))
            .count();
        assert!(late > 0, "the concurrent create's rules are missing");
        assert_eq!(after.len() - late, rules - dead, "live rules changed");
        let manifests = std::fs::read_dir(state.path().join("containers"))
            .unwrap()
            .count();
        assert_eq!(manifests, n - n.div_ceil(every) + 1, "manifests left");
        // Back to only natledger's chains and jumps for the next run.
        let stop = format!(
            r#"{{"ociVersion":"1.0.2","id":"late","status":"stopped","bundle":"{}"}}"#,
            bundle.display()
        );
        run_cmd(hook(state.path(), name, "poststop"), stop.as_bytes());
        for entry in std::fs::read_dir(state.path().join("containers")).unwrap() {
            let path = entry.unwrap().path();
            let mut m: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            m["pid"] = serde_json::json!(i32::MAX);
            std::fs::write(&path, m.to_string()).unwrap();
        }
        let mut cmd = Command::new(BIN);
        cmd.args(["--state-dir", state.path().to_str().unwrap(), "sweep"]);
        run_cmd(cmd, b"");
        assert!(tagged_lines(backend).is_empty(), "rules left after the run");
    }
    println!(
        "{name:<8} {n:>9} {rules:>7} {:>10.1} {processes:>10} {:>17.1}",
        median(sweeps),
        median(creates)
    );
}

fn poststop_case(name: &str, n: usize, runs: usize, tmpfs: &Path) {
    let backend = backend_of(name);
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("big");
    std::fs::create_dir(&bundle).unwrap();
    let (mut times, mut processes, mut rules) = (Vec::new(), 0, 0);
    for run_no in 0..runs {
        let state = tempfile::tempdir_in(tmpfs).unwrap();
        let ledger = Ledger::new(state.path());
        let recs = records(backend, "big", 20000, n, [10, 77, 0, 2]);
        rules = recs.len();
        {
            let locked = ledger.lock().unwrap();
            let spec = format!("20000-{}:80-{}", 20000 + n - 1, 80 + n - 1);
            locked
                .store(&manifest("big", i32::MAX, recs.clone(), &spec))
                .unwrap();
        }
        install(backend, &recs, run_no == 0);
        settle();
        let stop = format!(
            r#"{{"ociVersion":"1.0.2","id":"big","status":"stopped","bundle":"{}"}}"#,
            bundle.display()
        );
        let mut cmd = hook(state.path(), name, "poststop");
        cmd.env("NATLEDGER_TRACE", "1");
        let start = Instant::now();
        let out = run_cmd(cmd, stop.as_bytes());
        times.push(start.elapsed());
        let trace = String::from_utf8_lossy(&out.stderr);
        processes = trace.matches("natledger: exec ").count();
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            eprint!("{trace}");
        }
        assert!(tagged_lines(backend).is_empty(), "a rule survived poststop");
    }
    println!(
        "{name:<8} {n:>9} {rules:>7} {:>12.1} {processes:>10}",
        median(times)
    );
}

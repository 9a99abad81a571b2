//! Benchmark: is this build slower than another? `BENCH_BASELINE=/path/to/natledger` against
//! this build's natledger (`common::BIN`), on each backend (legacy, nft, nftables), each case
//! in a fresh private network namespace of its own child process, with one state directory on
//! tmpfs that both binaries share (as after an upgrade in place: a sweep removes the rules of
//! no one, so two ledgers cannot share a namespace):
//! - `hook`: create-runtime and poststop of one container with one TCP mapping, through the
//!   hook command line as `benches/hook.rs` runs it (create and poststop timed apart);
//! - `cni`: ADD and DEL of one attachment, natledger chained after a `prevResult` as
//!   `benches/cni.rs` runs it (each ADD after someone else's change);
//! - `sweep`: a `sweep` removing 50 dead containers' rules beside 50 live ones (all made by
//!   create-runtime: the live ones once, by the two binaries alternately; the dead ones
//!   before each run by the binary about to sweep, their processes then ended);
//! - `repair`: a `sweep --repair` putting back 50 live containers' DNATs after their chain
//!   (`NATLEDGER-HOSTPORTS`) was flushed.
//!
//! Every measurement alternates the two binaries run by run (baseline, new, baseline, new,
//! …), each operation on a settled kernel (`common::settle`), so drift hits both alike.
//! Prints, per backend and operation, both medians, the difference in ms and %, the processes
//! each binary started (its `NATLEDGER_TRACE`), and a verdict: `ok` when new <= baseline +
//! max(3%, 0.1 ms), else `SLOWER` (`PROCS` when only the process counts differ). Checks
//! after every sweep and repair that natledger's rules are exactly those of the live
//! containers.
//!
//! Run as root: `BENCH_BASELINE=/path/to/natledger cargo bench --bench versus` (env
//! BENCH_RUNS, default 30, for hook and cni; BENCH_SWEEP_RUNS, default 10, for sweep and
//! repair; BENCH_CASES, a comma list of `backend:part` such as `nft:hook,legacy:sweep`,
//! default all; BENCH_VERBOSE=1 prints the traces of the counting runs and each
//! operation's samples, sorted). Without
//! BENCH_BASELINE it says so and does nothing.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::cni::{Attachment, Chained};
use common::*;

const BACKENDS: [&str; 3] = ["legacy", "nft", "nftables"];
const PARTS: [&str; 4] = ["hook", "cni", "sweep", "repair"];
/// Live and dead containers in the sweep, live ones in the repair.
const CONTAINERS: usize = 50;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; nothing to run then.
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let Ok(baseline) = std::env::var("BENCH_BASELINE") else {
        println!(
            "versus: set BENCH_BASELINE=/path/to/another/natledger to compare this build with it"
        );
        return;
    };
    assert!(
        Path::new(&baseline).is_file(),
        "BENCH_BASELINE: no file {baseline}"
    );
    let runs = env_usize("BENCH_RUNS", 30);
    let sweep_runs = env_usize("BENCH_SWEEP_RUNS", 10);
    let only = env_or("BENCH_CASES", "");
    let started = Instant::now();
    let mut rows = Vec::new();
    for backend in BACKENDS {
        for part in PARTS {
            let name = format!("{backend}:{part}");
            if !only.is_empty() && !only.split(',').any(|c| c.trim() == name) {
                continue;
            }
            let n = if part == "hook" || part == "cni" {
                runs
            } else {
                sweep_runs
            };
            eprintln!(
                "versus: {name}, {n} runs each ({:.0} s so far)",
                started.elapsed().as_secs_f64()
            );
            let out = run_case(&format!("{part}:{backend}:{n}:{baseline}"));
            for line in out.lines() {
                match line.strip_prefix("ROW ") {
                    Some(row) => rows.push(Row::parse(row)),
                    None => println!("{line}"),
                }
            }
        }
    }
    println!(
        "natledger {} (new) against {baseline} (baseline): median ms, the binaries alternating \
         run by run ({runs} runs for hook and cni, {sweep_runs} for sweep and repair); \
         processes each started (create/poststop, ADD/DEL, sweep)",
        BIN
    );
    println!(
        "{:<8} {:<15} {:>9} {:>9} {:>8} {:>7} {:>10} {:>10} {:>7}",
        "backend",
        "operation",
        "baseline",
        "new",
        "diff ms",
        "diff %",
        "procs base",
        "procs new",
        "verdict"
    );
    for row in &rows {
        row.print();
    }
    println!("({:.0} s in all)", started.elapsed().as_secs_f64());
}

/// One line of the table: both binaries' medians and process counts for one operation.
struct Row {
    backend: String,
    op: String,
    base: f64,
    new: f64,
    procs_base: String,
    procs_new: String,
}

impl Row {
    /// `backend,op,base,new,procs_base,procs_new`, as a case prints it after `ROW `.
    fn parse(line: &str) -> Row {
        let f: Vec<&str> = line.split(',').collect();
        Row {
            backend: f[0].into(),
            op: f[1].into(),
            base: f[2].parse().unwrap(),
            new: f[3].parse().unwrap(),
            procs_base: f[4].into(),
            procs_new: f[5].into(),
        }
    }

    fn print(&self) {
        let diff = self.new - self.base;
        let pct = diff / self.base * 100.0;
        let ok = self.new <= self.base + (self.base * 0.03).max(0.1);
        let procs_ok = self.procs_base == self.procs_new;
        let verdict = match (ok, procs_ok) {
            (true, true) => "ok",
            (false, _) => "SLOWER",
            (true, false) => "PROCS",
        };
        println!(
            "{:<8} {:<15} {:>9.2} {:>9.2} {:>+8.2} {:>+6.1}% {:>10} {:>10} {:>7}",
            self.backend,
            self.op,
            self.base,
            self.new,
            diff,
            pct,
            self.procs_base,
            self.procs_new,
            verdict
        );
    }
}

/// Prints one table row for the parent.
fn row(backend: &str, op: &str, v: [Vec<Duration>; 2], procs: [String; 2]) {
    let [base, new] = v;
    let [pb, pn] = procs;
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        for (who, v) in [("baseline", &base), ("new", &new)] {
            let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
            ms.sort_by(f64::total_cmp);
            let ms: Vec<String> = ms.iter().map(|t| format!("{t:.1}")).collect();
            eprintln!("{backend} {op} {who}: {}", ms.join(" "));
        }
    }
    println!(
        "ROW {backend},{op},{:.3},{:.3},{pb},{pn}",
        median(base),
        median(new)
    );
}

/// The per-case child: BENCH_CASE=part:backend:runs:baseline.
fn case_main(spec: &str) {
    let mut parts = spec.splitn(4, ':');
    let part = parts.next().unwrap();
    let backend = parts.next().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    let baseline = parts.next().unwrap();
    // The tmpfs first: it unshares the mount namespace, before any thread.
    let tmpfs = TmpfsDir::new();
    let work = tempfile::tempdir().unwrap();
    let tag = format!("{}-{backend}-{part}", std::process::id());
    let node = netns(format!("nlvs-{tag}"));
    enter(&node);
    let bins = [baseline, BIN];
    let state = tmpfs.path();
    let _containers = Containers;
    match part {
        "hook" => hook_case(backend, runs, bins, state, work.path()),
        "cni" => cni_case(backend, runs, bins, state, &tag),
        "sweep" => sweep_case(backend, runs, bins, state, work.path()),
        "repair" => repair_case(backend, runs, bins, state, work.path()),
        other => panic!("no part {other}"),
    }
}

/// The processes `out`'s run started, from its `NATLEDGER_TRACE` on stderr.
/// With BENCH_VERBOSE=1, the trace is shown.
fn started(out: &std::process::Output) -> usize {
    let trace = String::from_utf8_lossy(&out.stderr);
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprint!("{trace}");
    }
    trace.matches("exec ").count()
}

fn hook_case(backend: &str, runs: usize, bins: [&str; 2], state: &Path, work: &Path) {
    let bundle = bench_bundle(work);
    let cases = bins.map(|bin| Case {
        bin,
        backend,
        state,
        bundle: &bundle,
    });
    // Warm up: each binary's first create makes the shared chains and jumps, which stay.
    for case in &cases {
        case.hook_counted("create-runtime", false);
        case.hook_counted("poststop", false);
    }
    let (mut creates, mut poststops) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..runs {
        for (i, case) in cases.iter().enumerate() {
            settle();
            creates[i].push(case.hook_counted("create-runtime", false).0);
            settle();
            poststops[i].push(case.hook_counted("poststop", false).0);
        }
    }
    let procs = cases.each_ref().map(|case| {
        let (_, c) = case.hook_counted("create-runtime", true);
        let (_, p) = case.hook_counted("poststop", true);
        (c, p)
    });
    assert!(
        !ours_name(backend, "natledger:bench"),
        "{backend}: a poststop left rules behind"
    );
    row(backend, "create", creates, procs.map(|p| p.0.to_string()));
    row(
        backend,
        "poststop",
        poststops,
        procs.map(|p| p.1.to_string()),
    );
}

fn cni_case(backend: &str, runs: usize, bins: [&str; 2], state: &Path, tag: &str) {
    let ctr = netns(format!("nlvs-ctr-{tag}"));
    let at = Attachment::wire(&ctr, "nlb-vs0");
    let plugins = bins.map(|bin| Chained::natledger_at(bin, &at, state, backend));
    let call = |plugin: &Chained, verb: &str, trace: bool| {
        let mut cmd = plugin.cmd(verb);
        if trace {
            cmd.env("NATLEDGER_TRACE", "1");
        }
        let start = Instant::now();
        let out = run_cmd(cmd, plugin.config.as_bytes());
        (start.elapsed(), started(&out))
    };
    // Warm up each binary once; ADD must have written the mapping.
    for plugin in &plugins {
        call(plugin, "ADD", false);
        assert!(
            ours_name(backend, "10.77.0.2:80"),
            "{backend}: ADD wrote no DNAT"
        );
        call(plugin, "DEL", false);
    }
    let (mut adds, mut dels) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..runs {
        for (i, plugin) in plugins.iter().enumerate() {
            // Each ADD cold, after someone else's change, as `benches/cni.rs` measures it.
            someone_else_writes(backend);
            settle();
            adds[i].push(call(plugin, "ADD", false).0);
            settle();
            dels[i].push(call(plugin, "DEL", false).0);
        }
    }
    let procs = plugins
        .each_ref()
        .map(|p| (call(p, "ADD", true).1, call(p, "DEL", true).1));
    assert!(
        !ours_name(backend, "10.77.0.2:80"),
        "{backend}: a DEL left its rules behind"
    );
    row(backend, "cni ADD", adds, procs.map(|p| p.0.to_string()));
    row(backend, "cni DEL", dels, procs.map(|p| p.1.to_string()));
    // The attachment and the container namespace go before the node namespace.
    drop(plugins);
    drop(at);
    drop(ctr);
}

/// Containers made by create-runtime in one ledger: `l{i}` live, `d{i}` dead once made.
struct Fleet<'a> {
    backend: &'a str,
    state: &'a Path,
    work: &'a Path,
}

impl Fleet<'_> {
    /// Container `id` by create-runtime from `bin`: one tcp mapping `port`->80 to
    /// 10.77.`addr[0]`.`addr[1]`, its own running process.
    fn create(&self, bin: &str, id: &str, port: usize, addr: [usize; 2]) {
        let bundle = self.work.join(id);
        if !bundle.exists() {
            std::fs::create_dir(&bundle).unwrap();
            let config = serde_json::json!({
                "ociVersion": "1.0.2",
                "annotations": {
                    "io.natledger.ports": format!("{port}:80"),
                    "io.natledger.ip": format!("10.77.{}.{}", addr[0], addr[1]),
                },
            });
            std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        }
        let stdin = hook_state(id, "create-runtime", &bundle);
        let mut cmd = Command::new(bin);
        cmd.args(["--state-dir", self.state.to_str().unwrap()]);
        cmd.args(["--backend", self.backend, "hook", "create-runtime"]);
        run_cmd(cmd, stdin.as_bytes());
    }

    /// The live containers, the two binaries making every other one.
    fn live(&self, bins: [&str; 2]) {
        for i in 0..CONTAINERS {
            self.create(bins[i % 2], &format!("l{i}"), 20000 + i, [0, i + 2]);
        }
    }

    /// The dead containers, made by `bin`, their processes then ended without a poststop.
    fn dead(&self, bin: &str) {
        for i in 0..CONTAINERS {
            self.create(bin, &format!("d{i}"), 21000 + i, [1, i + 2]);
        }
        for i in 0..CONTAINERS {
            let id = format!("d{i}");
            hook_state(&id, "poststop", &self.work.join(&id));
        }
    }
}

/// `natledger ARGS` from `bin` with the ledger in `state`, traced; its time and the processes
/// it started.
fn natledger(bin: &str, state: &Path, args: &[&str]) -> (Duration, usize) {
    let mut cmd = Command::new(bin);
    cmd.args(["--state-dir", state.to_str().unwrap()]);
    cmd.args(args);
    cmd.env("NATLEDGER_TRACE", "1");
    let start = Instant::now();
    let out = run_cmd(cmd, b"");
    (start.elapsed(), started(&out))
}

fn sweep_case(backend: &str, runs: usize, bins: [&str; 2], state: &Path, work: &Path) {
    let fleet = Fleet {
        backend,
        state,
        work,
    };
    fleet.live(bins);
    let live = ours(backend);
    let mut sweeps = [Vec::new(), Vec::new()];
    let mut procs = [0, 0];
    for _ in 0..runs {
        for (i, bin) in bins.iter().enumerate() {
            fleet.dead(bin);
            assert_ne!(ours(backend), live, "{backend}: no dead rules to sweep");
            settle();
            let (took, n) = natledger(bin, state, &["sweep"]);
            sweeps[i].push(took);
            procs[i] = n;
            assert_eq!(
                ours(backend),
                live,
                "{backend}: not only the live rules left"
            );
        }
    }
    row(backend, "sweep 50+50", sweeps, procs.map(|n| n.to_string()));
}

fn repair_case(backend: &str, runs: usize, bins: [&str; 2], state: &Path, work: &Path) {
    let fleet = Fleet {
        backend,
        state,
        work,
    };
    fleet.live(bins);
    let live = ours(backend);
    let (mut repairs, mut procs) = ([Vec::new(), Vec::new()], [0, 0]);
    for _ in 0..runs {
        for (i, bin) in bins.iter().enumerate() {
            flush_dnats(backend);
            assert_ne!(ours(backend), live, "{backend}: the flush took no DNAT");
            settle();
            let (took, n) = natledger(bin, state, &["sweep", "--repair"]);
            repairs[i].push(took);
            procs[i] = n;
            assert_eq!(ours(backend), live, "{backend}: not as before the flush");
        }
    }
    row(backend, "repair 50", repairs, procs.map(|n| n.to_string()));
}

/// Flushes natledger's DNAT chain (`NATLEDGER-HOSTPORTS`, IPv4).
fn flush_dnats(backend: &str) {
    if backend == "nftables" {
        let args = ["flush", "chain", "ip", "natledger", "NATLEDGER-HOSTPORTS"];
        run("/usr/sbin/nft", &args, None);
    } else {
        let tool = format!("/usr/sbin/iptables-{backend}-restore");
        let batch = "*nat\n-F NATLEDGER-HOSTPORTS\nCOMMIT\n";
        run(&tool, &["--noflush"], Some(batch.as_bytes()));
    }
}

/// natledger's rules and chains (every line naming it), IPv4, as the tools print them, sorted
/// (a repair may put the DNATs back in another order).
fn ours(backend: &str) -> Vec<String> {
    let text = if backend == "nftables" {
        nft::own_tables()
    } else {
        let save = format!("/usr/sbin/iptables-{backend}-save");
        let mut text = String::new();
        for table in ["nat", "filter"] {
            text += &String::from_utf8_lossy(&run(&save, &["-t", table], None).stdout);
        }
        text
    };
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.to_lowercase().contains("natledger"))
        .map(|l| l.trim().to_string())
        .collect();
    lines.sort();
    lines
}

/// Whether any of natledger's rules names `what`.
fn ours_name(backend: &str, what: &str) -> bool {
    ours(backend).iter().any(|l| l.contains(what))
}

/// Ends the containers' processes however the case ends.
struct Containers;

impl Drop for Containers {
    fn drop(&mut self) {
        end_containers();
    }
}

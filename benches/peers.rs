//! Benchmark: natledger beside the peers a user would otherwise pick, for one TCP host-port
//! mapping 8080->80, per setup (`common::setup::SETUPS`, or those named in BENCH_SETUPS: the iptables backends with an empty
//! nat table and with 10,000 foreign rules; the nftables backend with 0 and 50,000 foreign rules
//! in another owner's native table, and with 10,000 in iptables-nft's nat table; the peers on
//! iptables-nft there):
//! - natledger: create-runtime + poststop hooks;
//! - CNI portmap (`/usr/lib/cni/portmap`): ADD + DEL;
//! - netavark 1.4 (iptables firewall driver): setup + teardown of a bridge network (its times
//!   include the bridge, veth and addresses it creates, not only the firewall);
//! - the floor: one bare `iptables-<backend>-restore --noflush` inserting natledger's rules, one
//!   deleting them (on nftables: one `nft -f` adding them, one deleting them by handle).
//!
//! - exec (on nftables): `natledger --version` twice, the cost of the two hook processes
//!   before any work, through the same spawn as the hooks.
//!
//! Plus a curve of natledger and the floor against foreign rules (env BENCH_CURVE, default
//! 0,1000,10000,50000). Medians over BENCH_RUNS runs (default 20; curve points with 50,000 or
//! more foreign rules use BENCH_RUNS_LARGE, default 5). Process counts come from a separate
//! counting run: natledger's own trace, and for the peers PATH wrappers around iptables* that
//! log each call. "processes" counts the tool itself plus every process it started.
//!
//! Prints a table and writes a CSV (tool,backend,foreign,op,median_ms,processes) to BENCH_CSV
//! (default target/bench-peers.csv). Run as root: `cargo bench --bench peers`. Needs
//! `apt-get install netavark containernetworking-plugins`. Everything happens in private network
//! namespaces, deleted at the end; peers pick the backend through a PATH of symlinks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::cni::{Attachment, Chained, PORTMAP};
use common::path::PathDirs;
use common::setup::{Setup, selected};
use common::*;

const NETAVARK_CANDIDATES: [&str; 2] = ["/usr/lib/podman/netavark", "/usr/libexec/podman/netavark"];
const TOOLS: [&str; 7] = [
    "natledger",
    "natledger-b2b",
    "natledger-cold",
    "exec",
    "floor",
    "portmap",
    "netavark",
];

fn netavark_bin() -> Option<&'static str> {
    NETAVARK_CANDIDATES
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// One result row, as the child prints it and the CSV holds it.
#[derive(Clone)]
struct Row {
    tool: String,
    backend: String,
    foreign: usize,
    op: String,
    median_ms: f64,
    processes: usize,
    runs: usize,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; nothing to run then.
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs = env_usize("BENCH_RUNS", 20);
    let runs_large = env_usize("BENCH_RUNS_LARGE", 5);
    let curve: Vec<usize> = std::env::var("BENCH_CURVE")
        .unwrap_or_else(|_| "0,1000,10000,50000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let csv_path = std::env::var("BENCH_CSV").unwrap_or_else(|_| "target/bench-peers.csv".into());

    let mut peers: Vec<&str> = Vec::new();
    if Path::new(PORTMAP).exists() {
        peers.push("portmap");
    } else {
        eprintln!(
            "peers: {PORTMAP} missing (apt-get install containernetworking-plugins): skipped"
        );
    }
    if netavark_bin().is_some() {
        peers.push("netavark");
    } else {
        eprintln!("peers: netavark missing (apt-get install netavark): skipped");
    }

    let work = tempfile::tempdir().unwrap();
    let bundle = bench_bundle(work.path());
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    for setup in selected() {
        let backend = setup.label;
        let mut all: Vec<usize> = setup.loads.iter().chain(curve.iter()).copied().collect();
        all.sort();
        all.dedup();
        for &foreign in &all {
            let mut tools = vec!["natledger", "floor"];
            if setup.loads.contains(&foreign) {
                tools.extend(&peers);
            }
            let n = if foreign >= 50_000 && setup.costly_foreign() {
                runs.min(runs_large)
            } else {
                runs
            };
            eprintln!(
                "peers: {backend} {foreign} foreign rules, {} , {n} runs ({:.0} s so far)",
                tools.join(","),
                started.elapsed().as_secs_f64()
            );
            // A child process per case, so each enters fresh namespaces.
            let out = run_case(&format!(
                "{backend}:{foreign}:{n}:{}:{}",
                tools.join(","),
                bundle.display()
            ));
            for line in out.lines() {
                let Some(rest) = line.strip_prefix("ROW ") else {
                    println!("{line}");
                    continue;
                };
                let f: Vec<&str> = rest.split(',').collect();
                rows.push(Row {
                    tool: f[0].into(),
                    backend: f[1].into(),
                    foreign: f[2].parse().unwrap(),
                    op: f[3].into(),
                    median_ms: f[4].parse().unwrap(),
                    processes: f[5].parse().unwrap(),
                    runs: f[6].parse().unwrap(),
                });
            }
        }
    }

    let get = |tool: &str, backend: &str, foreign: usize, op: &str| {
        rows.iter()
            .find(|r| r.tool == tool && r.backend == backend && r.foreign == foreign && r.op == op)
            .cloned()
    };

    println!();
    println!(
        "One tcp mapping 8080->80, IPv4: median ms over {runs} runs; processes = the tool + what it started (create/remove)"
    );
    println!(
        "{:<15} {:>7} {:<13} {:>9} {:>9} {:>9} {:>11} {:>12}",
        "backend", "foreign", "tool", "create", "remove", "total", "processes", "x natledger"
    );
    for setup in selected() {
        let backend = setup.label;
        for &foreign in setup.loads {
            let ours = get("natledger", backend, foreign, "total").map(|r| r.median_ms);
            for tool in TOOLS {
                let (Some(c), Some(d), Some(t)) = (
                    get(tool, backend, foreign, "create"),
                    get(tool, backend, foreign, "remove"),
                    get(tool, backend, foreign, "total"),
                ) else {
                    continue;
                };
                let ratio = ours.map_or(String::from("-"), |o| format!("{:.2}x", t.median_ms / o));
                println!(
                    "{backend:<15} {foreign:>7} {tool:<13} {:>9.2} {:>9.2} {:>9.2} {:>11} {ratio:>12}",
                    c.median_ms,
                    d.median_ms,
                    t.median_ms,
                    format!("{}/{}", c.processes, d.processes)
                );
            }
        }
    }
    if !peers.contains(&"netavark") || !peers.contains(&"portmap") {
        println!("(missing peers skipped: see stderr)");
    }
    println!("netavark's times include creating/removing its bridge, veth and addresses.");
    println!(
        "nftables: natledger's own tables, foreign rules in another owner's native table \
         (table ip foreign); nftables-iptnft: the same, foreign rules in iptables-nft's ip nat; \
         the peers use iptables-nft there."
    );
    println!(
        "Each timed operation starts once the kernel has finished freeing what the previous one \
         deleted; natledger-b2b runs create and poststop back to back, so on nft a create pays \
         the rest of the RCU grace period its predecessor's poststop left to a detached process."
    );

    println!();
    println!(
        "Curve: natledger create+remove vs the floor, median ms (total); cold = after someone \
         else's change"
    );
    println!(
        "{:<15} {:>7} {:>5} {:>10} {:>9} {:>7} {:>9} {:>7}",
        "backend", "foreign", "runs", "natledger", "floor", "ratio", "cold", "ratio"
    );
    for setup in selected() {
        let backend = setup.label;
        for &foreign in &curve {
            let (Some(n), Some(f), Some(cold)) = (
                get("natledger", backend, foreign, "total"),
                get("floor", backend, foreign, "total"),
                get("natledger-cold", backend, foreign, "total"),
            ) else {
                continue;
            };
            println!(
                "{backend:<15} {foreign:>7} {:>5} {:>10.2} {:>9.2} {:>6.2}x {:>9.2} {:>6.2}x",
                n.runs,
                n.median_ms,
                f.median_ms,
                n.median_ms / f.median_ms,
                cold.median_ms,
                cold.median_ms / f.median_ms
            );
        }
    }
    if curve.iter().any(|&f| f >= 50_000) && runs_large < runs {
        println!(
            "(points with 50,000+ foreign rules in iptables use {} runs, BENCH_RUNS_LARGE, to keep the run short)",
            runs.min(runs_large)
        );
    }

    // Deduplicate: the curve and the loads share points measured once.
    let mut seen = BTreeMap::new();
    let mut csv = String::from("tool,backend,foreign,op,median_ms,processes\n");
    for r in &rows {
        if seen
            .insert(
                (r.tool.clone(), r.backend.clone(), r.foreign, r.op.clone()),
                (),
            )
            .is_none()
        {
            csv += &format!(
                "{},{},{},{},{:.3},{}\n",
                r.tool, r.backend, r.foreign, r.op, r.median_ms, r.processes
            );
        }
    }
    if let Some(dir) = Path::new(&csv_path).parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&csv_path, csv).unwrap();
    println!();
    println!(
        "CSV: {csv_path} ({:.0} s in all)",
        started.elapsed().as_secs_f64()
    );
}

/// One `natledger --version`, spawned as the hooks are: a hook process's cost before any work.
fn bare_exec() -> Duration {
    let mut cmd = Command::new(BIN);
    cmd.arg("--version");
    let start = Instant::now();
    run_cmd(cmd, b"");
    start.elapsed()
}

/// netavark setup/teardown of a bridge network `bench` (10.88.0.0/24 on nlb-br0).
struct Netavark {
    bin: &'static str,
    netns: String,
    config: tempfile::TempDir,
    options: String,
}

impl Netavark {
    fn new(ctr: &NamedNetns) -> Netavark {
        let options = r#"{"container_id":"6e61746c65646765726265656e636800000000000000000000000000000000aa","container_name":"bench","networks":{"bench":{"interface_name":"eth0","static_ips":["10.88.0.2"]}},"network_info":{"bench":{"name":"bench","id":"6e61746c65646765726265656e636800000000000000000000000000000000bb","driver":"bridge","network_interface":"nlb-br0","subnets":[{"subnet":"10.88.0.0/24","gateway":"10.88.0.1"}],"ipv6_enabled":false,"internal":false,"dns_enabled":false,"ipam_options":{"driver":"host-local"}}},"port_mappings":[{"host_ip":"","container_port":80,"host_port":8080,"range":1,"protocol":"tcp"}]}"#;
        Netavark {
            bin: netavark_bin().unwrap(),
            netns: format!("/var/run/netns/{}", ctr.name()),
            config: tempfile::tempdir().unwrap(),
            options: options.into(),
        }
    }

    fn cmd(&self, verb: &str) -> Command {
        let mut cmd = Command::new(self.bin);
        cmd.env("NETAVARK_FW", "iptables")
            .arg("--config")
            .arg(self.config.path())
            .args([verb, &self.netns]);
        cmd
    }
}

/// The per-case child: BENCH_CASE=setup:foreign:runs:tool,tool:bundle.
fn case_main(spec: &str) {
    let mut parts = spec.splitn(5, ':');
    let setup = Setup::named(parts.next().unwrap());
    let backend = setup.label;
    let foreign: usize = parts.next().unwrap().parse().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    let tools: Vec<&str> = parts.next().unwrap().split(',').collect();
    let bundle = PathBuf::from(parts.next().unwrap());
    let tag = format!("{}-{backend}-{foreign}", std::process::id());
    let node = netns(format!("nlpeers-{tag}"));
    enter(&node);
    setup.load_foreign(foreign);
    let dirs = PathDirs::new(setup.iptables);
    let has = |t: &str| tools.contains(&t);

    // The state dir lives on tmpfs, as /run/natledger does in production.
    let state = TmpfsDir::new();
    let case = Case {
        bin: BIN,
        backend: setup.backend,
        state: state.path(),
        bundle: &bundle,
    };
    // Warm up each tool once: first runs create shared chains and jumps, which stay.
    case.hook_counted("create-runtime", false);
    let floor = case.floor();
    case.hook_counted("poststop", false);

    let pm_ns = has("portmap").then(|| netns(format!("nlpeers-pm-{tag}")));
    let pm_at = pm_ns.as_ref().map(|ns| Attachment::wire(ns, "nlb-pm0"));
    let pm = pm_at.as_ref().map(Chained::portmap);
    if let Some(pm) = &pm {
        dirs.timed(pm.cmd("ADD"), pm.config.as_bytes());
        dirs.timed(pm.cmd("DEL"), pm.config.as_bytes());
    }
    let nv_ns = has("netavark").then(|| netns(format!("nlpeers-nv-{tag}")));
    let nv = nv_ns.as_ref().map(Netavark::new);
    if let Some(nv) = &nv {
        dirs.timed(nv.cmd("setup"), nv.options.as_bytes());
        dirs.timed(nv.cmd("teardown"), nv.options.as_bytes());
    }

    // Every timed operation starts on a settled kernel (see `settle`); the back-to-back
    // series shows what natledger costs when a create follows a poststop at once.
    let settled = |op: &mut dyn FnMut() -> Duration| {
        settle();
        op()
    };
    let mut samples: BTreeMap<&str, Samples> = BTreeMap::new();
    // natledger alone: nobody else writes between its operations (its iptables-nft cache of
    // other owners' forwards holds, see `natledger::analysis::forwards`).
    for _ in 0..runs {
        let c = settled(&mut || case.hook_counted("create-runtime", false).0);
        let d = settled(&mut || case.hook_counted("poststop", false).0);
        samples.entry("natledger").or_default().push(c, d);
    }
    // After someone else's change: each create reads the other owners' rules again.
    for _ in 0..runs {
        case.someone_else_writes();
        let c = settled(&mut || case.hook_counted("create-runtime", false).0);
        let d = settled(&mut || case.hook_counted("poststop", false).0);
        samples.entry("natledger-cold").or_default().push(c, d);
    }
    if setup.backend == "nftables" {
        for _ in 0..runs {
            let c = settled(&mut bare_exec);
            let d = settled(&mut bare_exec);
            samples.entry("exec").or_default().push(c, d);
        }
    }
    for _ in 0..runs {
        let c = settled(&mut || floor.add());
        let d = settled(&mut || floor.remove());
        samples.entry("floor").or_default().push(c, d);
        if let Some(pm) = &pm {
            let c = settled(&mut || dirs.timed(pm.cmd("ADD"), pm.config.as_bytes()));
            let d = settled(&mut || dirs.timed(pm.cmd("DEL"), pm.config.as_bytes()));
            samples.entry("portmap").or_default().push(c, d);
        }
        if let Some(nv) = &nv {
            let c = settled(&mut || dirs.timed(nv.cmd("setup"), nv.options.as_bytes()));
            let d = settled(&mut || dirs.timed(nv.cmd("teardown"), nv.options.as_bytes()));
            samples.entry("netavark").or_default().push(c, d);
        }
    }
    settle();
    for _ in 0..runs {
        let (c, _) = case.hook_counted("create-runtime", false);
        let (d, _) = case.hook_counted("poststop", false);
        samples.entry("natledger-b2b").or_default().push(c, d);
    }

    // Each tool must have removed what it added (beyond its shared, permanent chains).
    let dump = setup.nat_dump();
    for (what, needle) in [
        ("natledger", "10.77.0.2:80"),
        ("portmap", "CNI-DN-"),
        ("netavark", "NETAVARK-DN-"),
    ] {
        if dump.contains(needle) {
            eprintln!("peers: {backend} {foreign}: {what} left rules behind ({needle})");
        }
    }

    // The counting run, apart from the timed ones.
    let mut procs: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let (_, c) = case.hook_counted("create-runtime", true);
    let (_, d) = case.hook_counted("poststop", true);
    procs.insert("natledger", (1 + c, 1 + d));
    procs.insert("natledger-b2b", (1 + c, 1 + d));
    procs.insert("natledger-cold", (1 + c, 1 + d));
    procs.insert("floor", (1, 1));
    procs.insert("exec", (1, 1));
    if let Some(pm) = &pm {
        let c = dirs.count(pm.cmd("ADD"), pm.config.as_bytes());
        assert!(
            setup.nat_dump().contains("CNI-DN-"),
            "portmap ADD wrote no rules in {backend}"
        );
        let d = dirs.count(pm.cmd("DEL"), pm.config.as_bytes());
        procs.insert("portmap", (c, d));
    }
    if let Some(nv) = &nv {
        let c = dirs.count(nv.cmd("setup"), nv.options.as_bytes());
        assert!(
            setup.nat_dump().contains("NETAVARK-DN-"),
            "netavark setup wrote no rules in {backend}"
        );
        let d = dirs.count(nv.cmd("teardown"), nv.options.as_bytes());
        procs.insert("netavark", (c, d));
    }

    for (tool, s) in samples {
        let (pc, pd) = procs[tool];
        for (op, v, p) in [
            ("create", s.create, pc),
            ("remove", s.remove, pd),
            ("total", s.total, pc + pd),
        ] {
            println!(
                "ROW {tool},{backend},{foreign},{op},{:.3},{p},{runs}",
                median(v)
            );
        }
    }
    // Container namespaces go before the node namespace (drop order is reverse of creation).
    drop(nv);
    drop(nv_ns);
    drop(pm);
    drop(pm_at);
    drop(pm_ns);
}

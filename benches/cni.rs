//! Benchmark: natledger as a chained CNI plugin against CNI portmap (`/usr/lib/cni/portmap`),
//! ADD + DEL of one TCP host-port mapping 8080->80, through the same invocation (the binary,
//! the `CNI_*` environment, one chained network configuration whose `prevResult` names the
//! container's address: `common::cni`), on both iptables backends, with an empty nat table
//! and with 10,000 foreign rules (env BENCH_FOREIGN, default 0,10000).
//!
//! natledger picks its backend by the configuration's `backend` key and keeps its ledger on a
//! tmpfs (`stateDir`), as /run is in production; portmap picks its backend through a PATH of
//! symlinks. Medians over BENCH_RUNS runs (default 20), each operation on a settled kernel
//! (`common::settle`), each plugin in a series of its own; natledger's ADDs are cold (each
//! after someone else's change, so its iptables-nft forwards cache never holds). Process counts come from a separate counting run: natledger's own trace,
//! portmap's through PATH wrappers that log each `iptables*` call; "processes" counts the
//! plugin itself plus every process it started. Run as root: `cargo bench --bench cni`.
//! Everything happens in private network namespaces, deleted at the end.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

mod common;

use common::cni::{Attachment, Chained, PORTMAP};
use common::path::PathDirs;
use common::*;

const TOOLS: [&str; 2] = ["natledger", "portmap"];

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; nothing to run then.
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    if !Path::new(PORTMAP).exists() {
        eprintln!("cni: {PORTMAP} missing (apt-get install containernetworking-plugins)");
        std::process::exit(1);
    }
    let runs = env_usize("BENCH_RUNS", 20);
    let loads: Vec<usize> = env_or("BENCH_FOREIGN", "0,10000")
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let started = Instant::now();
    // (tool, backend, foreign, op) -> (median ms, processes)
    let mut rows: BTreeMap<(String, String, usize, String), (f64, usize)> = BTreeMap::new();
    for backend in ["legacy", "nft"] {
        for &foreign in &loads {
            eprintln!(
                "cni: {backend} {foreign} foreign rules, {runs} runs ({:.0} s so far)",
                started.elapsed().as_secs_f64()
            );
            let out = run_case(&format!("{backend}:{foreign}:{runs}"));
            for line in out.lines() {
                let Some(rest) = line.strip_prefix("ROW ") else {
                    println!("{line}");
                    continue;
                };
                let f: Vec<&str> = rest.split(',').collect();
                rows.insert(
                    (f[0].into(), f[1].into(), f[2].parse().unwrap(), f[3].into()),
                    (f[4].parse().unwrap(), f[5].parse().unwrap()),
                );
            }
        }
    }

    let get = |tool: &str, backend: &str, foreign: usize, op: &str| {
        rows.get(&(tool.into(), backend.into(), foreign, op.into()))
            .copied()
    };
    println!();
    println!(
        "CNI ADD + DEL of one tcp mapping 8080->80, IPv4, same invocation: median ms over {runs} \
         runs; processes = the plugin + what it started (ADD/DEL)"
    );
    println!(
        "{:<7} {:>7} {:<10} {:>9} {:>9} {:>9} {:>10} {:>12}",
        "backend", "foreign", "plugin", "ADD", "DEL", "total", "processes", "x natledger"
    );
    for backend in ["legacy", "nft"] {
        for &foreign in &loads {
            let ours = get("natledger", backend, foreign, "total").map(|r| r.0);
            for tool in TOOLS {
                let (Some(a), Some(d), Some(t)) = (
                    get(tool, backend, foreign, "add"),
                    get(tool, backend, foreign, "del"),
                    get(tool, backend, foreign, "total"),
                ) else {
                    continue;
                };
                let ratio = ours.map_or(String::from("-"), |o| format!("{:.2}x", t.0 / o));
                println!(
                    "{backend:<7} {foreign:>7} {tool:<10} {:>9.2} {:>9.2} {:>9.2} {:>10} {ratio:>12}",
                    a.0,
                    d.0,
                    t.0,
                    format!("{}/{}", a.1, d.1)
                );
            }
        }
    }
    println!();
    println!("({:.0} s in all)", started.elapsed().as_secs_f64());
}

/// The per-case child: BENCH_CASE=backend:foreign:runs.
fn case_main(spec: &str) {
    let mut parts = spec.splitn(3, ':');
    let backend = parts.next().unwrap();
    let foreign: usize = parts.next().unwrap().parse().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    // The tmpfs first: it unshares the mount namespace, before any thread.
    let state = TmpfsDir::new();
    let tag = format!("{}-{backend}-{foreign}", std::process::id());
    let node = netns(format!("nlcni-{tag}"));
    enter(&node);
    load_foreign(backend, foreign);
    let dirs = PathDirs::new(backend);
    let ctr = netns(format!("nlcni-ctr-{tag}"));
    let at = Attachment::wire(&ctr, "nlb-cni0");
    let plugins = [
        ("natledger", Chained::natledger(&at, state.path(), backend)),
        ("portmap", Chained::portmap(&at)),
    ];

    // Warm up each plugin once: first runs create shared chains and jumps, which stay. ADD
    // must have written the mapping.
    for (name, plugin) in &plugins {
        dirs.timed(plugin.cmd("ADD"), plugin.config.as_bytes());
        assert!(
            nat_dump(backend).contains("10.77.0.2:80"),
            "{name} ADD wrote no DNAT in {backend}"
        );
        dirs.timed(plugin.cmd("DEL"), plugin.config.as_bytes());
    }

    // Every timed operation starts on a settled kernel (see `settle`); each plugin runs its own
    // series, as in the peers bench. Interleaved, each ADD followed the other plugin's DEL by a
    // millisecond, and on nft with 10,000 foreign rules the kernel work portmap's 20 processes
    // leave behind (which `settle` does not wait for) cost natledger's next ADD 20-60 ms more
    // than after a quiet second: a cost of the bench's order, not of either plugin. natledger's
    // ADD is measured cold: someone else's change comes before each one, so it reads the other
    // owners' forwards again (its iptables-nft cache does not hold), as portmap's run used to
    // force.
    let mut samples: BTreeMap<&str, Samples> = BTreeMap::new();
    for (name, plugin) in &plugins {
        for _ in 0..runs {
            if *name == "natledger" {
                someone_else_writes(backend);
            }
            settle();
            let a = dirs.timed(plugin.cmd("ADD"), plugin.config.as_bytes());
            settle();
            let d = dirs.timed(plugin.cmd("DEL"), plugin.config.as_bytes());
            samples.entry(name).or_default().push(a, d);
        }
    }
    // Each plugin removed what it added (beyond its shared, permanent chains).
    let dump = nat_dump(backend);
    assert!(
        !dump.contains("10.77.0.2:80") && !dump.contains("CNI-DN-"),
        "{backend} {foreign}: a plugin left its rules behind:\n{dump}"
    );

    // The counting run, apart from the timed ones: natledger traces each process it starts,
    // portmap's iptables calls go through the logging PATH.
    let mut procs: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let (_, natledger) = &plugins[0];
    let traced = |verb: &str| {
        let mut cmd = natledger.cmd(verb);
        cmd.env("NATLEDGER_TRACE", "1");
        let out = run_cmd(cmd, natledger.config.as_bytes());
        1 + String::from_utf8_lossy(&out.stderr)
            .matches("exec ")
            .count()
    };
    procs.insert("natledger", (traced("ADD"), traced("DEL")));
    let (_, portmap) = &plugins[1];
    let a = dirs.count(portmap.cmd("ADD"), portmap.config.as_bytes());
    let d = dirs.count(portmap.cmd("DEL"), portmap.config.as_bytes());
    procs.insert("portmap", (a, d));

    for (tool, s) in samples {
        let (pa, pd) = procs[tool];
        for (op, v, p) in [
            ("add", s.create, pa),
            ("del", s.remove, pd),
            ("total", s.total, pa + pd),
        ] {
            println!("ROW {tool},{backend},{foreign},{op},{:.3},{p}", median(v));
        }
    }
    // The attachment and the container namespace go before the node namespace.
    drop(plugins);
    drop(at);
    drop(ctr);
}

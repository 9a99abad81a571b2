//! Benchmark (issue 25): putting back a wiped ruleset, per backend (legacy, nft, and
//! nftables: natledger's own tables), with 1, 100 and 1,000 live containers (one TCP mapping
//! each, IPv4 and IPv6; each its own running process, as a runtime sends at create-runtime),
//! created by the hooks. The wipe is what firewalld's and netfilter-persistent's reloads do: a
//! restore without `--noflush` of the nat and filter tables less natledger's rules (IPv4,
//! then IPv6); on nftables, `nft -f` of `flush ruleset` and the other owners' tables (one
//! transaction, as nftables.service reloads). Prints, per backend and size:
//! - `repair ms`: one `natledger sweep --repair` after the wipe, median of BENCH_RUNS;
//! - `watch ms`: with `natledger watch` running (started afresh for each run, so no back-off
//!   carries over; the wipe comes past its 200 ms gap after its first reconcile), from the
//!   start of the wipe (watch may start on its IPv4 restore) until every DNAT of natledger's is
//!   back in both families, polled every millisecond in-process (legacy: the nat table's blob;
//!   nf_tables: a netlink dump of `NATLEDGER-HOSTPORTS`), median of BENCH_RUNS; `wipe ms`, the
//!   wipe's own restores, is part of it;
//! - at 100 containers, watch's CPU while idle: utime+stime (and its reaped children's) from
//!   `/proc/<pid>/stat` over BENCH_IDLE_SECS, as % of one CPU, and the reconciles it ran then
//!   (the 60 s backstop falls inside a 60 s window).
//!
//! After every repair, natledger's rules (its lines of `*-save -t nat` and `-t filter`, or
//! `nft list table ip|ip6 natledger`) must equal those before the wipe, and a wipe must have
//! taken every DNAT.
//!
//! Run as root: `cargo bench --bench repair` (env BENCH_RUNS, default 5; BENCH_CONTAINERS, a
//! comma list, default 1,100,1000; BENCH_IDLE_SECS, default 60, 0 skips; BENCH_FOREIGN, other
//! owners' nat rules kept by the wipe, default 0; BENCH_SETUPS, of legacy,nft,nftables).
//! Everything happens in private network namespaces, the state directory on its own tmpfs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use natledger::kernel::iptc;
use natledger::kernel::netlink::Socket;
use natledger::kernel::nftables::Session;
use natledger::model::family::Family;

mod common;

use common::*;

const BACKENDS: [&str; 3] = ["legacy", "nft", "nftables"];
/// A repair, by watch or by hand, slower than this is a failure.
const PATIENCE: Duration = Duration::from_secs(60);

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs = env_usize("BENCH_RUNS", 5);
    let sizes = env_or("BENCH_CONTAINERS", "1,100,1000").replace(',', ";");
    let idle = env_usize("BENCH_IDLE_SECS", 60);
    let foreign = env_usize("BENCH_FOREIGN", 0);
    let backends = env_or("BENCH_SETUPS", &BACKENDS.join(","));
    println!(
        "natledger after a wipe: N live containers x 1 tcp mapping (IPv4 and IPv6), {foreign} \
         foreign nat rules, {runs} runs, median ms; watch idle over {idle} s at 100 containers"
    );
    println!(
        "{:<8} {:>10} {:>6} {:>10} {:>8} {:>9} {:>11} {:>10}",
        "backend",
        "containers",
        "rules",
        "repair ms",
        "wipe ms",
        "watch ms",
        "idle CPU %",
        "reconciles"
    );
    for backend in backends.split(',').map(str::trim) {
        assert!(
            BACKENDS.contains(&backend),
            "BENCH_SETUPS: {backend} is none of {BACKENDS:?}"
        );
        print!(
            "{}",
            run_case(&format!("{backend}:{sizes}:{runs}:{idle}:{foreign}"))
        );
    }
}

/// The per-case child: BENCH_CASE=backend:sizes(;-separated):runs:idle:foreign.
fn case_main(spec: &str) {
    let parts: Vec<&str> = spec.split(':').collect();
    let [backend, sizes, runs, idle, foreign] = parts[..] else {
        panic!("BENCH_CASE {spec}")
    };
    let sizes: Vec<usize> = sizes.split(';').map(|n| n.parse().unwrap()).collect();
    let (runs, idle, foreign): (usize, u64, usize) = (
        runs.parse().unwrap(),
        idle.parse().unwrap(),
        foreign.parse().unwrap(),
    );
    let ns = netns(format!("nlrepair-{}-{backend}", std::process::id()));
    enter(&ns);
    let state = TmpfsDir::new();
    let work = tempfile::tempdir().unwrap();
    let node = Node {
        backend,
        state: state.path(),
        work: work.path(),
        foreign,
    };
    if backend == "nftables" {
        nft::load_foreign_table(foreign);
    } else {
        load_foreign(backend, foreign);
    }

    let _containers = Containers;
    let mut created = 0;
    for n in sizes {
        while created < n {
            node.create(created);
            created += 1;
        }
        let before = node.ours();
        let dnats = node.dnats();
        assert_eq!(dnats, [n, n], "{backend}: the DNATs of {n} containers");
        let wipe = node.wipe_input();

        // (a) sweep --repair after a wipe.
        let (mut repairs, mut rules) = (Vec::new(), 0);
        for _ in 0..runs {
            node.wipe(&wipe);
            assert_eq!(node.dnats(), [0, 0], "{backend}: a DNAT survived the wipe");
            settle();
            let start = Instant::now();
            let out = node.natledger(&["sweep", "--repair", "--json"]);
            repairs.push(start.elapsed());
            rules = restored(&out.stdout);
            assert_eq!(node.ours(), before, "{backend} {n}: not as before the wipe");
        }

        // (b) watch running: from the start of the wipe to every DNAT back.
        let (mut watched, mut wipes) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let watch = Watch::start(&node);
            std::thread::sleep(Duration::from_millis(300));
            settle();
            let start = Instant::now();
            node.wipe(&wipe);
            wipes.push(start.elapsed());
            let mut sock = Socket::netfilter().expect("netfilter netlink socket");
            while node.dnats_on(&mut sock) != dnats {
                assert!(
                    start.elapsed() < PATIENCE,
                    "{backend} {n}: watch put nothing back: {}",
                    watch.log()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            watched.push(start.elapsed());
            drop(sock);
            // Every table is back when its last DNAT is (filter goes before nat), unless a
            // reconcile came between the two families' restores: the next one is 200 ms on.
            let settled = Instant::now();
            while node.ours() != before {
                assert!(
                    settled.elapsed() < Duration::from_secs(5),
                    "{backend} {n}: watch left the tables other than before: {}",
                    watch.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            watch.stop();
        }

        // (c) watch idle, at 100 containers.
        let (cpu, reconciles) = if n == 100 && idle > 0 {
            let (cpu, reconciles) = Watch::start(&node).idle(Duration::from_secs(idle));
            (format!("{cpu:.3}"), reconciles.to_string())
        } else {
            ("-".to_string(), "-".to_string())
        };
        println!(
            "{backend:<8} {n:>10} {rules:>6} {:>10.1} {:>8.1} {:>9.1} {cpu:>11} {reconciles:>10}",
            median(repairs),
            median(wipes),
            median(watched),
        );
    }
}

/// The case's namespace, as natledger and the wipes see it.
struct Node<'a> {
    backend: &'a str,
    state: &'a Path,
    /// Bundles, watch's log and metrics file.
    work: &'a Path,
    foreign: usize,
}

impl Node<'_> {
    fn natledger(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(BIN);
        cmd.args(["--state-dir", self.state.to_str().unwrap()]);
        cmd.args(args);
        run_cmd(cmd, b"")
    }

    /// Container `i`: `20000+i`->80 to 10.77.0.2 and fd77::2, by create-runtime with a live
    /// pid of its own.
    fn create(&self, i: usize) {
        let id = format!("c{i}");
        let bundle = self.work.join(&id);
        std::fs::create_dir(&bundle).unwrap();
        let config = serde_json::json!({
            "ociVersion": "1.0.2",
            "annotations": {
                "io.natledger.ports": format!("{}:80", 20000 + i),
                "io.natledger.ip": "10.77.0.2,fd77::2",
            },
        });
        std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        let stdin = hook_state(&id, "create-runtime", &bundle);
        let mut cmd = Command::new(BIN);
        cmd.args(["--state-dir", self.state.to_str().unwrap()]);
        cmd.args(["--backend", self.backend, "hook", "create-runtime"]);
        run_cmd(cmd, stdin.as_bytes());
    }

    /// The iptables tools of `family` on this backend.
    fn tool(&self, family: Family, what: &str) -> String {
        let base = match family {
            Family::Ipv4 => "iptables",
            Family::Ipv6 => "ip6tables",
        };
        format!("/usr/sbin/{base}-{}-{what}", self.backend)
    }

    /// natledger's rules and chains as the tools print them.
    fn ours(&self) -> String {
        if self.backend == "nftables" {
            return nft::own_tables();
        }
        let mut lines = String::new();
        for family in Family::ALL {
            for table in ["nat", "filter"] {
                let out = run(&self.tool(family, "save"), &["-t", table], None);
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    if line.to_lowercase().contains("natledger") {
                        lines += line;
                        lines.push('\n');
                    }
                }
            }
        }
        lines
    }

    /// What a wipe loads: per family, the nat and filter tables less natledger's lines (the
    /// other owners' rules kept); on nftables, the other owners' tables after `flush ruleset`.
    fn wipe_input(&self) -> Vec<(String, String)> {
        if self.backend == "nftables" {
            let mut text = String::from("flush ruleset\n");
            if self.foreign > 0 {
                text += &nft::foreign_table(self.foreign);
            }
            return vec![("/usr/sbin/nft".to_string(), text)];
        }
        Family::ALL
            .iter()
            .map(|&family| {
                let mut text = String::new();
                for table in ["nat", "filter"] {
                    let out = run(&self.tool(family, "save"), &["-t", table], None);
                    for line in String::from_utf8_lossy(&out.stdout).lines() {
                        if !line.to_lowercase().contains("natledger") {
                            text += line;
                            text.push('\n');
                        }
                    }
                }
                (self.tool(family, "restore"), text)
            })
            .collect()
    }

    /// The wipe: each restore (without `--noflush`) or `nft -f`, back to back.
    fn wipe(&self, input: &[(String, String)]) {
        for (tool, text) in input {
            let args: &[&str] = if tool.ends_with("nft") {
                &["-f", "-"]
            } else {
                &["-w", "30"]
            };
            run(tool, args, Some(text.as_bytes()));
        }
    }

    fn dnats(&self) -> [usize; 2] {
        let mut sock = Socket::netfilter().expect("netfilter netlink socket");
        self.dnats_on(&mut sock)
    }

    /// The rules of `NATLEDGER-HOSTPORTS` (natledger's DNATs), IPv4 and IPv6: one cheap read
    /// each, in this process.
    fn dnats_on(&self, sock: &mut Socket) -> [usize; 2] {
        Family::ALL.map(|family| match self.backend {
            "legacy" => {
                let blob = iptc::read(family, "nat").expect("the legacy nat table");
                blob.chain("NATLEDGER-HOSTPORTS")
                    .map_or(0, |span| blob.rules(span).count())
            }
            backend => {
                let table = if backend == "nft" { "nat" } else { "natledger" };
                Session::new(sock)
                    .rules(family, table, "NATLEDGER-HOSTPORTS")
                    .expect("NATLEDGER-HOSTPORTS over netlink")
                    .len()
            }
        })
    }
}

/// The rules a `sweep --repair --json` report says it put back.
fn restored(report: &[u8]) -> usize {
    let report: serde_json::Value = serde_json::from_slice(report).unwrap();
    report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["rules_restored"].as_array().map_or(0, Vec::len))
        .sum()
}

/// `natledger watch` in the case's namespace, its log and metrics in the work directory.
struct Watch {
    child: Child,
    log: PathBuf,
    metrics: PathBuf,
}

impl Watch {
    /// Started, and past its first reconcile (its metrics file written).
    fn start(node: &Node) -> Watch {
        let (log, metrics) = (node.work.join("watch.log"), node.work.join("watch.prom"));
        let _ = std::fs::remove_file(&metrics);
        let child = Command::new(BIN)
            .args(["--state-dir", node.state.to_str().unwrap(), "watch"])
            .arg("--metrics-file")
            .arg(&metrics)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("natledger watch");
        let watch = Watch {
            child,
            log,
            metrics,
        };
        let start = Instant::now();
        while !watch.metrics.exists() {
            assert!(
                start.elapsed() < PATIENCE,
                "watch never reconciled: {}",
                watch.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        watch
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its CPU over `secs` from one second after its start, as % of one CPU, and the
    /// reconciles it ran meanwhile; then stopped.
    fn idle(self, secs: Duration) -> (f64, u64) {
        std::thread::sleep(Duration::from_secs(1));
        let (ticks, reconciles) = (self.ticks(), self.reconciles());
        std::thread::sleep(secs);
        let (ticks, reconciles) = (self.ticks() - ticks, self.reconciles() - reconciles);
        self.stop();
        // SAFETY: sysconf reads a constant of the system.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let cpu = ticks as f64 / per_second / secs.as_secs_f64() * 100.0;
        (cpu, reconciles)
    }

    /// utime + stime + cutime + cstime, in clock ticks.
    fn ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 1..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // Fields 14 to 17 of proc(5); `fields[0]` is field 3, the state.
        fields[11..15]
            .iter()
            .map(|f| f.parse::<u64>().unwrap())
            .sum()
    }

    /// `natledger_watch_reconciles_total` from its metrics file.
    fn reconciles(&self) -> u64 {
        let text = std::fs::read_to_string(&self.metrics).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("natledger_watch_reconciles_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("natledger_watch_reconciles_total") as u64
    }

    /// SIGTERM; it must end with status 0.
    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "watch: {status}: {}", self.log());
    }
}

impl Drop for Watch {
    /// A failed case does not leave it running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Ends the containers' processes however the case ends.
struct Containers;

impl Drop for Containers {
    fn drop(&mut self) {
        end_containers();
    }
}

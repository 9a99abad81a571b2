//! Benchmark: `natledger doctor --from legacy:FILE` on kube-proxy-scale dumps.
//!
//! Generates an `iptables-save` dump as kube-proxy (iptables mode) writes it for N ClusterIP
//! services with two endpoints each (a KUBE-SERVICES rule, a KUBE-SVC chain of 3 rules, two
//! KUBE-SEP chains of 2 rules: 8 nat rules per service), every tenth service also a NodePort
//! (KUBE-NODEPORTS + a KUBE-EXT chain), every hundredth without endpoints (a filter REJECT
//! instead), plus a few stale CNI hostport duplicates so that there is something to find.
//! Service ports are drawn from a few common ones (80, 443, 8080, ...), as on real clusters.
//!
//! Prints, per size: rules read, findings, the median wall time of the release binary over
//! BENCH_RUNS runs (default 5), and, measured once in-process: the whole analysis
//! (`doctor::doctor`), of which parsing the dump and parsing each rule's conditions.
//!
//! Then branching ladders (`PREROUTING` → 30 chains each jumping N ways to the next, every
//! jump on a mark of its own, a stale DNAT above the live one at the bottom; a filter FORWARD
//! ladder of the same shape): per ladder, rules, whether the walk was complete, whether the
//! bottom shadow was found, the wall time and the maximum resident set size of one run
//! (`/usr/bin/time`).
//!
//! `cargo bench --bench doctor` (env BENCH_SERVICES, a comma list, default 1000,6000,10000;
//! BENCH_PORTS=unique gives every service its own port; BENCH_LADDERS, a comma list of
//! CHAINSxWAYS, default 30x4,30x8,31x16,31x64, empty for none; BENCH_DUMP_DIR=DIR keeps the
//! dumps there, for profiling). Needs no root: no live system is read.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use std::path::Path;

use natledger::analysis::doctor::evidence::Roots;
use natledger::analysis::doctor::{self, DoctorOptions, DumpFile};
use natledger::backend::{Backend, Netfilter};
use natledger::model::anyrule::parse_rule;

const BIN: &str = env!("CARGO_BIN_EXE_natledger");

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = env_or("BENCH_RUNS", "5").parse().unwrap();
    let sizes: Vec<usize> = env_or("BENCH_SERVICES", "1000,6000,10000")
        .split(',')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    let unique_ports = env_or("BENCH_PORTS", "common") == "unique";
    let dir = tempfile::tempdir().unwrap();
    println!(
        "natledger doctor --from legacy:FILE, kube-proxy dumps ({} service ports), {runs} runs, median",
        if unique_ports { "unique" } else { "common" }
    );
    println!(
        "{:>8} {:>8} {:>9} {:>9} {:>10} | {:>11} {:>9} {:>9}",
        "services",
        "rules",
        "findings",
        "complete",
        "doctor ms",
        "in-proc ms",
        "dump ms",
        "conds ms"
    );
    for services in sizes {
        let dump = kube_dump(services, unique_ports);
        let keep = std::env::var_os("BENCH_DUMP_DIR").map(std::path::PathBuf::from);
        let path = keep
            .unwrap_or_else(|| dir.path().to_path_buf())
            .join(format!("kube-{services}.txt"));
        std::fs::write(&path, &dump).unwrap();
        let arg = format!("legacy:{}", path.display());
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..runs {
            let start = Instant::now();
            let out = Command::new(BIN)
                .env("NATLEDGER_STATE_DIR", dir.path().join("state"))
                .args(["doctor", "--json", "--from", &arg])
                .output()
                .expect("run natledger");
            times.push(start.elapsed());
            let code = out.status.code();
            assert!(
                matches!(code, Some(0..=2)),
                "doctor failed ({code:?}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            last = Some(out.stdout);
        }
        let report: serde_json::Value = serde_json::from_slice(&last.unwrap()).unwrap();
        let findings = report["findings"].as_array().map_or(0, Vec::len);
        let (analysis, parse, conds) = breakdown(&path, &dump);
        println!(
            "{:>8} {:>8} {:>9} {:>9} {:>10.1} | {:>11.1} {:>9.1} {:>9.1}",
            services,
            report["rules_read"].as_u64().unwrap_or(0),
            findings,
            report["complete"],
            ms(median(times)),
            ms(analysis),
            ms(parse),
            ms(conds),
        );
    }
    ladders(dir.path());
}

/// The branching ladders of BENCH_LADDERS, one run each: figures per ladder.
fn ladders(dir: &Path) {
    let list = env_or("BENCH_LADDERS", "30x4,30x8,31x16,31x64");
    let shapes: Vec<(usize, usize)> = list
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let (c, w) = s.trim().split_once('x').expect("CHAINSxWAYS");
            (c.parse().unwrap(), w.parse().unwrap())
        })
        .collect();
    if shapes.is_empty() {
        return;
    }
    println!("\nnatledger doctor --from legacy:FILE, branching ladders (a mark per jump), one run");
    println!(
        "{:>8} {:>6} {:>7} {:>9} {:>6} {:>5} {:>9} {:>8}",
        "ladder", "rules", "paths", "complete", "found", "exit", "wall s", "max MiB"
    );
    for (chains, ways) in shapes {
        let path = std::env::var_os("BENCH_DUMP_DIR")
            .map_or_else(|| dir.to_path_buf(), std::path::PathBuf::from)
            .join(format!("ladder-{chains}x{ways}.txt"));
        std::fs::write(&path, ladder_dump(chains, ways)).unwrap();
        let arg = format!("legacy:{}", path.display());
        let start = Instant::now();
        let out = Command::new("/usr/bin/time")
            .args(["-f", "%M", BIN, "doctor", "--json", "--from", &arg])
            .env("NATLEDGER_STATE_DIR", dir.join("state"))
            .output()
            .expect("run /usr/bin/time natledger");
        let wall = start.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let kib: f64 = stderr
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(f64::NAN);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let bottom = format!("L{}", chains - 1);
        let found = report["findings"].as_array().is_some_and(|fs| {
            fs.iter().any(|f| {
                f["kind"] == "shadowed"
                    && f["rules"][0]["chain"] == bottom.as_str()
                    && f["rules"][1]["chain"] == bottom.as_str()
            })
        });
        let paths = (ways as f64).powi(chains as i32 - 1);
        println!(
            "{:>8} {:>6} {:>7.0e} {:>9} {:>6} {:>5} {:>9.2} {:>8.1}",
            format!("{chains}x{ways}"),
            report["rules_read"].as_u64().unwrap_or(0),
            paths,
            report["complete"],
            found,
            out.status.code().map_or("signal".into(), |c| c.to_string()),
            wall.as_secs_f64(),
            kib / 1024.0,
        );
    }
}

/// A nat ladder of `chains` chains each jumping `ways` ways to the next on a mark of its own,
/// entered by port 6667, a stale DNAT above the live one at the bottom; a filter FORWARD
/// ladder of the same shape.
fn ladder_dump(chains: usize, ways: usize) -> String {
    let mut nat = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    let mut filter = String::from("*filter\n:FORWARD ACCEPT [0:0]\n");
    for i in 0..chains {
        let _ = writeln!(nat, ":L{i} - [0:0]");
        let _ = writeln!(filter, ":F{i} - [0:0]");
    }
    nat += "-A PREROUTING -p tcp -m tcp --dport 6667 -j L0\n";
    filter += "-A FORWARD -m mark --mark 0x1234/0xffff -j F0\n";
    for i in 0..chains - 1 {
        for k in 0..ways {
            let m = 0x10000 + i * ways + k;
            let _ = writeln!(nat, "-A L{i} -m mark ! --mark {m:#x}/{m:#x} -j L{}", i + 1);
            let _ = writeln!(
                filter,
                "-A F{i} -m mark ! --mark {m:#x}/{m:#x} -j F{}",
                i + 1
            );
        }
    }
    let last = chains - 1;
    let _ = writeln!(
        nat,
        "-A L{last} -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.77.0.2:6667\n\
         -A L{last} -p tcp -m tcp --dport 6667 -j DNAT --to-destination 10.77.0.3:6667\nCOMMIT"
    );
    let _ = writeln!(filter, "-A F{last} -p udp -j DROP\nCOMMIT");
    format!("{nat}{filter}")
}

/// In-process, through the library: the whole analysis (`doctor::doctor` on the saved
/// file: read, parse, walk, every check), and of it the two parsing stages (the dump into
/// rules, each rule's arguments into conditions), to show where the time goes.
fn breakdown(path: &Path, dump: &str) -> (Duration, Duration, Duration) {
    let start = Instant::now();
    let tables = natledger::model::save::parse_dump(dump).unwrap();
    let parse = start.elapsed();
    let start = Instant::now();
    for table in &tables {
        for rule in &table.rules {
            std::hint::black_box(parse_rule(&rule.args));
        }
    }
    let conds = start.elapsed();
    let runner = natledger::kernel::exec::SystemRunner::default();
    let state = tempfile::tempdir().unwrap();
    let opts = DoctorOptions {
        from: vec![DumpFile {
            backend: Backend::IptablesLegacy,
            family: None,
            path: path.to_path_buf(),
        }],
        port: None,
        ledger: natledger::state::ledger::Ledger::new(state.path()),
        netfilter: Netfilter::new(&runner),
        host_backend: natledger::backend::Detected {
            backend: Backend::IptablesNft,
            how: "the benchmark's choice".into(),
        },
        roots: Roots::default(),
    };
    let start = Instant::now();
    std::hint::black_box(doctor::doctor(&opts).unwrap());
    (start.elapsed(), parse, conds)
}

/// A kube-proxy style hash: 16 characters of [A-Z2-7].
fn hash(kind: u64, i: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut x =
        (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ kind.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..16)
        .map(|_| {
            x = x.rotate_left(5).wrapping_mul(0x2545_F491_4F6C_DD1D);
            ALPHABET[(x >> 59) as usize] as char
        })
        .collect()
}

fn kube_dump(services: usize, unique_ports: bool) -> String {
    const PORTS: [(u16, &str); 8] = [
        (80, "tcp"),
        (443, "tcp"),
        (8080, "tcp"),
        (53, "udp"),
        (9090, "tcp"),
        (3000, "tcp"),
        (5432, "tcp"),
        (6379, "tcp"),
    ];
    let mut chains = String::new();
    let mut nat = String::new();
    let mut filter = String::new();
    let mut services_rules = String::new();
    let mut nodeports = String::new();
    for i in 0..services {
        let n = i as u64;
        let (port, proto) = if unique_ports {
            (10_000 + (i % 50_000) as u16, "tcp")
        } else {
            PORTS[i % PORTS.len()]
        };
        let cip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        let name = format!("ns{}/svc-{i}:p{port}", i % 40);
        if i % 100 == 99 {
            // No endpoints: kube-proxy rejects in filter instead.
            let _ = writeln!(
                filter,
                "-A KUBE-SERVICES -d {cip}/32 -p {proto} -m comment --comment \"{name} has no endpoints\" -m {proto} --dport {port} -j REJECT --reject-with icmp-port-unreachable"
            );
            continue;
        }
        let svc = format!("KUBE-SVC-{}", hash(1, n));
        let _ = writeln!(chains, ":{svc} - [0:0]");
        let _ = writeln!(
            services_rules,
            "-A KUBE-SERVICES -d {cip}/32 -p {proto} -m comment --comment \"{name} cluster IP\" -m {proto} --dport {port} -j {svc}"
        );
        let _ = writeln!(
            nat,
            "-A {svc} ! -s 10.244.0.0/16 -d {cip}/32 -p {proto} -m comment --comment \"{name} cluster IP\" -m {proto} --dport {port} -j KUBE-MARK-MASQ"
        );
        for e in 0..2u64 {
            let sep = format!("KUBE-SEP-{}", hash(2 + e, n));
            let k = 2 * i + e as usize;
            let ep = format!("10.244.{}.{}", k / 250, k % 250 + 2);
            let _ = writeln!(chains, ":{sep} - [0:0]");
            let statistic = if e == 0 {
                " -m statistic --mode random --probability 0.50000000000"
            } else {
                ""
            };
            let _ = writeln!(
                nat,
                "-A {svc} -m comment --comment \"{name} -> {ep}:8080\"{statistic} -j {sep}"
            );
            let _ = writeln!(
                nat,
                "-A {sep} -s {ep}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                nat,
                "-A {sep} -p {proto} -m comment --comment \"{name}\" -m {proto} -j DNAT --to-destination {ep}:8080"
            );
        }
        if i % 10 == 0 {
            let ext = format!("KUBE-EXT-{}", hash(1, n));
            let node_port = 30_000 + (i / 10) as u16 % 2_768;
            let _ = writeln!(chains, ":{ext} - [0:0]");
            let _ = writeln!(
                nodeports,
                "-A KUBE-NODEPORTS -p {proto} -m comment --comment \"{name}\" -m {proto} --dport {node_port} -j {ext}"
            );
            let _ = writeln!(
                nat,
                "-A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(nat, "-A {ext} -j {svc}");
        }
    }
    // Stale CNI hostport forwards: for ten host ports, an old pod's DNAT before the new one's.
    let mut cni = String::new();
    for p in 0..10u16 {
        for (age, host) in [("old", 200), ("new", 201)] {
            let chain = format!(
                "CNI-DN-{age}{p:02}{}",
                &hash(9, p.into())[..10].to_lowercase()
            );
            let _ = writeln!(chains, ":{chain} - [0:0]");
            let _ = writeln!(
                cni,
                "-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"cbr0\\\" id: \\\"{age}{p}\\\"\" -m multiport --dports {} -j {chain}",
                20_000 + p
            );
            let _ = writeln!(
                nat,
                "-A {chain} -p tcp -m tcp --dport {} -j DNAT --to-destination 10.244.250.{}:80",
                20_000 + p,
                host - 190 + 10 * (p % 5)
            );
        }
    }
    format!(
        "# Generated by iptables-save v1.8.9 (legacy) (natledger doctor bench)\n\
         *nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         :CNI-HOSTPORT-DNAT - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-SERVICES - [0:0]\n\
         {chains}\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A PREROUTING -m comment --comment \"kube hostport portals\" -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kube hostport portals\" -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         {services_rules}\
         -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         {nodeports}{cni}{nat}COMMIT\n\
         *filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         {filter}COMMIT\n"
    )
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

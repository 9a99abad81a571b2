//! Benchmark: what the steps issue 11 added cost inside one create-runtime + poststop, as
//! natledger's own trace (`NATLEDGER_TRACE`) times them, per backend, with 0 and 10,000
//! foreign nat rules:
//! - the check for other owners' forwards (both backends, IPv4): iptables-nft with its cache
//!   valid (nobody else wrote since natledger's last change) and cold (after someone else's
//!   transaction); iptables-legacy reads its table each time;
//! - the filter accept: on iptables-legacy the in-process insert and delete of the filter
//!   table; on iptables-nft, where it shares one restore process with the nat rules, the floor
//!   with and without the filter transaction;
//! - the conntrack step of a UDP mapping, with 0 (then nothing is read), 1,000 and 10,000
//!   conntrack entries in the namespace; a TCP mapping never has one. A foreign DNAT rule of
//!   another port makes the namespace track connections between the hooks too, as other
//!   owners' NAT rules do on a real host (the kernel tracks only once a rule needs it), and
//!   each run refreshes the same N entries.
//!
//! Medians over BENCH_RUNS runs (default 20). Root: `cargo bench --bench steps`.

use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;

mod common;

use common::*;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20usize);
    println!(
        "Steps of one create-runtime + poststop, IPv4, median ms over {runs} runs (NATLEDGER_TRACE)"
    );
    println!(
        "{:<7} {:>7} {:>14} {:>14} {:>14} {:>10} {:>10} {:>10} {:>9}",
        "backend",
        "foreign",
        "forwards warm",
        "forwards cold",
        "filter c+r",
        "ct 0",
        "ct 1k",
        "ct 10k",
        "ct tcp"
    );
    for backend in ["legacy", "nft"] {
        for foreign in [0usize, 10_000] {
            print!("{}", run_case(&format!("{backend}:{foreign}:{runs}")));
        }
    }
    println!(
        "forwards: the check for other owners' forwards (both backends' nat tables) per create; \
         filter c+r: the filter table's part of create + remove (legacy: its in-process edits; \
         nft: floor with it minus floor without it); ct N: the conntrack step of a udp mapping's \
         create + remove with N entries in the namespace (one dump of the kernel's table each); \
         ct tcp: the same for a tcp mapping (none)."
    );
}

/// A bundle asking for `spec` to 10.77.0.2, in `dir/name`.
fn bundle(dir: &Path, name: &str, spec: &str) -> std::path::PathBuf {
    let b = dir.join(name);
    std::fs::create_dir(&b).unwrap();
    std::fs::write(
        b.join("config.json"),
        format!(
            r#"{{"ociVersion":"1.0.2","annotations":{{"io.natledger.ports":"{spec}","io.natledger.ip":"10.77.0.2"}}}}"#
        ),
    )
    .unwrap();
    b
}

/// Run one stage with the trace on; its stderr.
fn traced(state: &Path, backend: &str, bundle: &Path, stage: &str) -> String {
    let input = hook_state("bench", stage, bundle);
    let mut cmd = Command::new(BIN);
    cmd.args(["--state-dir", state.to_str().unwrap(), "--backend", backend])
        .args(["hook", stage])
        .env("NATLEDGER_TRACE", "1");
    String::from_utf8_lossy(&run_cmd(cmd, input.as_bytes()).stderr).into_owned()
}

/// The sum of the "in X ms" times of the trace lines containing every word of `what`.
fn ms(trace: &str, what: &[&str]) -> f64 {
    trace
        .lines()
        .filter(|l| what.iter().all(|w| l.contains(w)))
        .filter_map(|l| {
            l.rsplit_once(" in ")?
                .1
                .strip_suffix(" ms")?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

fn med(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Make `n` UDP conntrack entries in this namespace, the same ones on every call: one
/// datagram each from 127.0.0.1:19999 to 127.0.0.1's ports 20000.. (nothing listens; each
/// entry waits 30 s unreplied, and a datagram of a present entry refreshes it).
fn udp_entries(n: usize) {
    let sock = UdpSocket::bind("127.0.0.1:19999").unwrap();
    for i in 0..n {
        let _ = sock.send_to(b"x", ("127.0.0.1", 20_000 + (i % 40_000) as u16));
    }
}

fn case_main(spec: &str) {
    let mut parts = spec.split(':');
    let backend = parts.next().unwrap();
    let foreign: usize = parts.next().unwrap().parse().unwrap();
    let runs: usize = parts.next().unwrap().parse().unwrap();
    let ns = netns(format!(
        "nlsteps-{}-{backend}-{foreign}",
        std::process::id()
    ));
    enter(&ns);
    load_foreign(backend, foreign);
    let work = tempfile::tempdir().unwrap();
    let tcp = bundle(work.path(), "tcp", "8080:80");
    let udp = bundle(work.path(), "udp", "8053:53/udp");
    let state = TmpfsDir::new();
    let case = Case {
        bin: BIN,
        backend,
        state: state.path(),
        bundle: &tcp,
    };
    traced(state.path(), backend, &tcp, "create-runtime");
    let (add, del) = case.floor_batches();
    traced(state.path(), backend, &tcp, "poststop");
    let nat_only = |batch: &str| {
        let at = batch.find("*nat").unwrap();
        let end = batch[at..].find("COMMIT\n").unwrap() + at + "COMMIT\n".len();
        batch[at..end].to_string()
    };
    let (add_nat, del_nat) = (nat_only(&add), nat_only(&del));

    let (mut warm, mut cold, mut filter) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        settle();
        let c = traced(state.path(), backend, &tcp, "create-runtime");
        warm.push(ms(&c, &["forwards:"]));
        settle();
        let d = traced(state.path(), backend, &tcp, "poststop");
        if backend == "legacy" {
            filter.push(ms(&c, &["iptc:", "filter"]) + ms(&d, &["iptc:", "filter"]));
        }
    }
    for _ in 0..runs {
        case.someone_else_writes();
        settle();
        let c = traced(state.path(), backend, &tcp, "create-runtime");
        cold.push(ms(&c, &["forwards:"]));
        settle();
        traced(state.path(), backend, &tcp, "poststop");
    }
    if backend == "nft" {
        for _ in 0..runs {
            settle();
            let both = case.restore(&add);
            settle();
            let both = both + case.restore(&del);
            settle();
            let nat = case.restore(&add_nat);
            settle();
            let nat = nat + case.restore(&del_nat);
            filter.push((both.as_secs_f64() - nat.as_secs_f64()) * 1000.0);
        }
    }
    case.restore(
        "*nat\n-A OUTPUT -p udp -m udp --dport 9 -j DNAT --to-destination 127.0.0.1:19\nCOMMIT\n",
    );
    let conntrack = |bundle: &Path, entries: usize| {
        let mut v = Vec::new();
        for _ in 0..runs {
            udp_entries(entries);
            settle();
            let c = traced(state.path(), backend, bundle, "create-runtime");
            settle();
            let d = traced(state.path(), backend, bundle, "poststop");
            v.push(ms(&c, &["conntrack:"]) + ms(&d, &["conntrack:"]));
        }
        med(v)
    };
    let ct0 = conntrack(&udp, 0);
    let ct1k = conntrack(&udp, 1_000);
    let ct10k = conntrack(&udp, 10_000);
    let cttcp = conntrack(&tcp, 10_000);
    println!(
        "{backend:<7} {foreign:>7} {:>14.2} {:>14.2} {:>14.2} {:>10.2} {:>10.2} {:>10.2} {:>9.2}",
        med(warm),
        med(cold),
        med(filter),
        ct0,
        ct1k,
        ct10k,
        cttcp
    );
}

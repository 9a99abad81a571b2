//! Benchmark: what judging CNI attachments by their network namespace costs, with the
//! namespace cookie (`SO_NETNS_COOKIE`, recorded by ADD since it exists) and without (device
//! and inode only: older manifests, kernels before 5.14, and every manifest before the cookie).
//!
//! N live attachments (default 1,000), each in a named namespace of its own, one TCP mapping
//! each (IPv4, iptables-legacy, 3 rules per attachment, installed): the median wall time of
//! `natledger sweep` over the same attachments recorded with their cookies and without, run
//! alternately, and in this process the cost per namespace of a `stat` of its path, of the
//! cookie read on the process's one reader thread (`kernel::netns_cookie`), and of a thread
//! per read (what the reader saves). Every sweep must keep every attachment.
//!
//! Run as root: `cargo bench --bench liveness` (env BENCH_RUNS, default 5; BENCH_ATTACHMENTS,
//! default 1000). Everything happens in private network namespaces.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use natledger::backend::Backend;
use natledger::kernel::machine::{Host, Machine};
use natledger::kernel::netns::in_namespace;
use natledger::kernel::netns_cookie::cookie_here;
use natledger::kernel::netns_id::NetnsId;
use natledger::model::family::Family;
use natledger::model::layout::{TABLES, mapping_rules, owned_chains, shared_rules};
use natledger::model::portspec::parse_mappings;
use natledger::model::save::{Batch, Op};
use natledger::state::ledger::{CniAttachment, Ledger, Manifest, Phase, RuleRecord, SCHEMA};

mod common;

use common::*;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_CASE") {
        return case_main(&spec);
    }
    let runs = env_usize("BENCH_RUNS", 5);
    let n = env_usize("BENCH_ATTACHMENTS", 1000);
    print!("{}", run_case(&format!("{n}:{runs}")));
}

/// The child: BENCH_CASE=attachments:runs.
fn case_main(spec: &str) {
    let (n, runs) = spec.split_once(':').unwrap();
    let (n, runs): (usize, usize) = (n.parse().unwrap(), runs.parse().unwrap());
    let tmpfs = TmpfsDir::new();
    let node = netns(format!("nlcookie-{}-node", std::process::id()));
    enter(&node);
    let attachments: Vec<NamedNetns> = (0..n)
        .map(|i| netns(format!("nlcookie-{}-{i}", std::process::id())))
        .collect();
    let paths: Vec<PathBuf> = attachments
        .iter()
        .map(|ns| natledger::kernel::named_netns::path(ns.name()))
        .collect();

    // The first cookie read of the process starts the reader thread: what create-runtime and
    // ADD pay to record one.
    let (start, cpu) = (Instant::now(), cpu_time(libc::RUSAGE_SELF));
    Machine::default().netns_with_cookie(&paths[0]).unwrap();
    let first = (start.elapsed(), cpu_time(libc::RUSAGE_SELF) - cpu);

    // The median of `runs` rounds over every namespace, per namespace: wall and CPU time
    // (this process's, every thread's: the cookie reader's too).
    let per_namespace = |read: &dyn Fn(&[&Path])| {
        let all: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let (wall, cpu): (Vec<Duration>, Vec<Duration>) = (0..runs)
            .map(|_| {
                let (start, cpu) = (Instant::now(), cpu_time(libc::RUSAGE_SELF));
                read(&all);
                let cpu = cpu_time(libc::RUSAGE_SELF) - cpu;
                (start.elapsed() / n as u32, cpu / n as u32)
            })
            .unzip();
        (median(wall) * 1000.0, median(cpu) * 1000.0)
    };
    let each = |read: fn(&Path)| move |all: &[&Path]| all.iter().for_each(|p| read(p));
    let rows = [
        (
            "stat of the path (device and inode)",
            per_namespace(&each(|p| {
                Machine::default().netns_at(p).unwrap();
            })),
        ),
        (
            "cookie, the reader thread, one by one",
            per_namespace(&each(|p| {
                Machine::default().netns_with_cookie(p).unwrap();
            })),
        ),
        (
            "cookie, the reader thread, all at once",
            per_namespace(&|all| {
                let read = Machine::default().netns_with_cookies(all);
                assert!(read.iter().all(|r| r.is_ok()));
            }),
        ),
        (
            "cookie, a thread per namespace",
            per_namespace(&each(|p| {
                in_namespace(p, cookie_here).unwrap().unwrap();
            })),
        ),
    ];
    println!("per namespace, {n} namespaces, median of {runs} rounds, microseconds:");
    println!("  {:<40} {:>7} {:>7}", "", "wall", "cpu");
    for (what, (wall, cpu)) in rows {
        println!("  {what:<40} {wall:>7.1} {cpu:>7.1}");
    }
    println!(
        "  {:<40} {:>7.1} {:>7.1}",
        "the process's first (starts the thread)",
        first.0.as_secs_f64() * 1e6,
        first.1.as_secs_f64() * 1e6
    );

    let with = tempfile::tempdir_in(tmpfs.path()).unwrap();
    let without = tempfile::tempdir_in(tmpfs.path()).unwrap();
    let ids: Vec<NetnsId> = paths
        .iter()
        .map(|p| Machine::default().netns_with_cookie(p).unwrap())
        .collect();
    assert!(ids.iter().all(|id| id.cookie.is_some()), "no cookies here");
    let batches = live_attachments(with.path(), &paths, &ids);
    let stripped: Vec<NetnsId> = ids
        .iter()
        .map(|id| NetnsId {
            cookie: None,
            ..*id
        })
        .collect();
    live_attachments(without.path(), &paths, &stripped);
    let text: String = batches.iter().map(Batch::render).collect();
    run(
        "/usr/sbin/iptables-legacy-restore",
        &["--noflush"],
        Some(text.as_bytes()),
    );

    let (mut t_with, mut t_without) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        t_without.push(sweep(without.path(), n));
        t_with.push(sweep(with.path(), n));
    }
    println!("natledger sweep over {n} live attachments (legacy, {runs} runs), median ms:");
    println!("  {:<40} {:>7} {:>7}", "", "wall", "cpu");
    for (what, times) in [
        ("recorded without a cookie (before)", t_without),
        ("recorded with a cookie", t_with),
    ] {
        let (wall, cpu): (Vec<Duration>, Vec<Duration>) = times.into_iter().unzip();
        println!("  {what:<40} {:>7.1} {:>7.1}", median(wall), median(cpu));
    }
    if Path::new(STRACE).exists() {
        println!("natledger sweep's setns calls and threads started (strace):");
        for (what, state) in [("without a cookie", &without), ("with a cookie", &with)] {
            let (setns, threads) = traced(state.path());
            println!("  {what:<17} setns {setns:>6}, clones (threads, processes) {threads:>3}");
        }
    }
}

const STRACE: &str = "/usr/bin/strace";

/// One sweep of `state` under strace: its `setns` calls and the threads it started.
fn traced(state: &Path) -> (usize, usize) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(STRACE)
        .args(["-f", "-c", "-e", "trace=setns,clone,clone3", "-o"])
        .arg(log.path())
        .arg(BIN)
        .args(["--state-dir", state.to_str().unwrap(), "sweep"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary = std::fs::read_to_string(log.path()).unwrap();
    // `strace -c` rows: % time, seconds, usecs/call, calls, [errors,] syscall.
    let calls = |name: &str| -> usize {
        summary
            .lines()
            .filter(|l| l.split_whitespace().last() == Some(name))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse::<usize>().ok())
            .sum()
    };
    (calls("setns"), calls("clone3") + calls("clone"))
}

/// The CPU time (user and system) of `who` so far: `RUSAGE_SELF`, or `RUSAGE_CHILDREN` (those
/// waited for).
fn cpu_time(who: libc::c_int) -> Duration {
    let usage = nix::sys::resource::getrusage(match who {
        libc::RUSAGE_SELF => nix::sys::resource::UsageWho::RUSAGE_SELF,
        _ => nix::sys::resource::UsageWho::RUSAGE_CHILDREN,
    })
    .unwrap();
    let time = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    time(usage.user_time()) + time(usage.system_time())
}

/// One `natledger sweep` of the state directory `state`, which must keep all `n`: its wall
/// and CPU time.
fn sweep(state: &Path, n: usize) -> (Duration, Duration) {
    let mut cmd = Command::new(BIN);
    cmd.args(["--state-dir", state.to_str().unwrap(), "sweep", "--json"]);
    let (start, cpu) = (Instant::now(), cpu_time(libc::RUSAGE_CHILDREN));
    let out = run_cmd(cmd, b"");
    let took = (start.elapsed(), cpu_time(libc::RUSAGE_CHILDREN) - cpu);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kept = report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "alive" && c["manifest"] == "kept")
        .count();
    assert_eq!(kept, n, "every attachment lives: {report:#}");
    took
}

/// Manifests of live CNI attachments, one per namespace path, recorded as `ids`; the
/// batches (filter, nat) that install their rules with natledger's chains and jumps.
fn live_attachments(state: &Path, paths: &[PathBuf], ids: &[NetnsId]) -> Vec<Batch> {
    let backend = Backend::IptablesLegacy;
    let ledger = Ledger::new(state);
    let locked = ledger.lock().unwrap();
    let mut batches: Vec<Batch> = TABLES.iter().map(|t| Batch::new(t)).collect();
    for batch in batches.iter_mut() {
        for chain in owned_chains(backend, batch.table, Family::Ipv4) {
            batch.ops.push(Op::DeclareChain(chain.to_string()));
        }
        for (chain, jump) in shared_rules(backend, batch.table, Family::Ipv4) {
            batch
                .ops
                .push(Op::InsertFirst(chain.to_string(), jump.to_args()));
        }
    }
    for (i, (path, id)) in paths.iter().zip(ids).enumerate() {
        let cid = format!("c{i}");
        let ledger_id = format!("{cid}+eth0").parse().unwrap();
        let addr = std::net::IpAddr::from([10, 77, (i / 250) as u8, (i % 250 + 2) as u8]);
        let mappings = parse_mappings(&format!("{}:80", 20000 + i)).unwrap();
        let rules: Vec<RuleRecord> = mappings
            .iter()
            .flat_map(|m| mapping_rules(backend, &ledger_id, m, addr))
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
                container_id: ledger_id,
                bundle: None,
                pid: None,
                pid_start_time: None,
                boot_id: None,
                pid_namespace: None,
                phase: Phase::Installed,
                mappings,
                addresses: vec![addr],
                rules,
                netns: Some(*id),
                pod: None,
                shares: Vec::new(),
                shared_by: Vec::new(),
                stacked_on: Vec::new(),
                cni: Some(CniAttachment {
                    container_id: cid,
                    ifname: "eth0".into(),
                    network: "bench".into(),
                    netns_path: Some(path.clone()),
                    deleted: false,
                }),
            })
            .unwrap();
    }
    batches
}

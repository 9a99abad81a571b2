//! `natledger watch` in the node namespace on every backend (the test starts it and ends it
//! by pid): another owner's nf_tables commits wake no reconcile; a wipe of natledger's rules (a ruleset restored without `--noflush` on the
//! iptables backends, its own tables deleted on nftables) is put back within 2 s, proven with
//! real TCP from the outside namespace, and the dump is then the one before the wipe; a
//! hostile loop flushing natledger's DNAT chain every 50 ms makes watch back off (its log
//! says so, its metrics count it, in its file and served over HTTP as Prometheus' parser
//! reads them) while its CPU, children included, stays under 5%; idle it
//! uses under 1%; SIGHUP repairs at once; SIGTERM ends it with status 0 within a second.
//! Without a system bus (its address a path that does not exist) watch says so once and
//! runs as above.
//! Then the review's findings: a legacy restore that swaps same-shaped rules is repaired
//! within a second; another owner's chain churning in iptables-nft's `ip nat` wakes no
//! reconcile; a failing reconcile backs off; SIGTERM never waits for the ledger lock; idle
//! `/metrics` clients never stall the loop.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

/// Where watch serves its counters, in the node namespace.
const ADDRESS: &str = "127.0.0.1:19655";

/// watch, ended by pid: SIGTERM by the test, SIGKILL on drop if it is still running.
pub(crate) struct Watch {
    pub(crate) child: Child,
    log: std::path::PathBuf,
}

impl Watch {
    /// With no system bus (a path in the node's directory): never the machine's.
    pub(crate) fn start(node: &Node, metrics: &std::path::Path) -> Watch {
        let none = node.dir.path().join("no-bus");
        let env = [format!(
            "DBUS_SYSTEM_BUS_ADDRESS=unix:path={}",
            none.display()
        )];
        Watch::start_with(node, metrics, &env, &[])
    }

    /// With more variables (`NAME=VALUE`) and arguments.
    pub(crate) fn start_with(
        node: &Node,
        metrics: &std::path::Path,
        env: &[String],
        args: &[&str],
    ) -> Watch {
        let log = node.dir.path().join("watch.log");
        let file = std::fs::File::create(&log).unwrap();
        let state = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
        let backend = format!("NATLEDGER_BACKEND={}", node.backend.name());
        let metrics = metrics.to_str().unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", node.topo.node(), "env", &state, &backend])
            .args(env)
            .arg(BIN)
            .args(["watch", "--metrics-file", metrics])
            .args(["--metrics-address", ADDRESS])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start natledger watch");
        Watch { child, log }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub(crate) fn log(&self) -> String {
        let mut text = String::new();
        let _ = std::fs::File::open(&self.log).and_then(|mut f| f.read_to_string(&mut text));
        text
    }

    pub(crate) fn signal(&self, signal: libc::c_int) {
        // SAFETY: a plain kill(2) of the child this test started (not yet waited for).
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    /// Clock ticks of CPU it and the children it waited for used.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let fields: Vec<u64> = stat[stat.rfind(')').unwrap() + 2..]
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // utime, stime, cutime, cstime: fields 14-17, the 12th-15th after the state.
        fields[11..15].iter().sum()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The share of a CPU watch (and its children) used over `period`.
pub(crate) fn cpu_share(watch: &Watch, period: Duration) -> f64 {
    let (ticks, t0) = (watch.cpu_ticks(), Instant::now());
    std::thread::sleep(period);
    let used = (watch.cpu_ticks() - ticks) as f64;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    used / hz / t0.elapsed().as_secs_f64()
}

pub(crate) fn wait_until(limit: Duration, mut ok: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub(crate) fn metric(path: &std::path::Path, name: &str) -> f64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// natledger's rules gone as a firewall reload leaves them.
pub(crate) fn wipe(node: &Node) {
    let ns = node.topo.node();
    if !node.backend.is_iptables() {
        for family in ["ip", "ip6"] {
            let out = run_in(ns, "nft", &["delete", "table", family, "natledger"], None);
            assert_ok(&out, "nft delete table");
        }
        return;
    }
    for family in Family::ALL {
        let without: String = save(ns, node.backend, family)
            .lines()
            .filter(|l| !l.contains("NATLEDGER") && !l.contains("natledger"))
            .map(|l| format!("{l}\n"))
            .collect();
        let prog = format!("{}-restore", iptables_tool(node.backend, family));
        assert_ok(
            &run_in(ns, &prog, &["-w", "30"], Some(without.as_bytes())),
            &prog,
        );
    }
}

/// The command that flushes natledger's IPv4 DNAT chain.
fn flush_argv(backend: Backend) -> Vec<&'static str> {
    match backend {
        Backend::OwnNftables => vec![
            "nft",
            "flush",
            "chain",
            "ip",
            "natledger",
            "NATLEDGER-HOSTPORTS",
        ],
        _ => vec![
            iptables_tool(backend, Family::V4),
            "-w",
            "-t",
            "nat",
            "-F",
            "NATLEDGER-HOSTPORTS",
        ],
    }
}

#[test]
fn watch_repairs_a_wipe_within_two_seconds_and_backs_off_a_hostile_deleter() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create("c2", Some(pid), &[("io.natledger.ports", "8080:80")]);
        let ext = node.topo.ext().to_string();
        let answers = |timeout: Duration| {
            tcp_request(&ext, sock(NODE_V4, 8080), timeout).is_ok_and(|r| r == "c2")
        };
        assert!(answers(Duration::from_secs(2)));
        let before = node.dump();

        let metrics = node.dir.path().join("watch.prom");
        let watch = Watch::start(&node, &metrics);
        let started = wait_until(Duration::from_secs(10), || {
            metric(&metrics, "natledger_watch_reconciles_total") >= 1.0
        });
        assert!(
            started.is_some(),
            "{backend:?}: no reconcile:\n{}",
            watch.log()
        );

        // Idle: about nothing.
        std::thread::sleep(Duration::from_millis(300));
        let share = cpu_share(&watch, Duration::from_secs(3));
        eprintln!(
            "{backend:?}: idle watch used {:.2}% of a CPU",
            share * 100.0
        );
        assert!(share < 0.01, "{backend:?}: idle at {:.1}%", share * 100.0);

        // Another owner's nf_tables table changing wakes no reconcile.
        let ns = node.topo.node().to_string();
        let runs = metric(&metrics, "natledger_watch_reconciles_total");
        load_nft(
            &ns,
            "table inet other {\n chain input {\n type filter hook input priority 0;\n }\n}\n",
        );
        for port in 7000..7010 {
            let rule = format!("add rule inet other input tcp dport {port} accept\n");
            load_nft(&ns, &rule);
        }
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(
            metric(&metrics, "natledger_watch_reconciles_total"),
            runs,
            "{backend:?}: another owner's commits woke a reconcile:\n{}",
            watch.log()
        );
        load_nft(&ns, "delete table inet other\n");

        // A wipe: back within 2 s, then exactly as before.
        wipe(&node);
        let back = wait_until(Duration::from_secs(2), || {
            answers(Duration::from_millis(150))
        });
        assert!(
            back.is_some(),
            "{backend:?}: not repaired in 2 s:\n{}",
            watch.log()
        );
        eprintln!("{backend:?}: repaired {:?} after the wipe", back.unwrap());
        let same = wait_until(Duration::from_secs(2), || node.dump() == before);
        assert!(
            same.is_some(),
            "{backend:?}: the dump differs:\n{}",
            node.dump()
        );
        assert!(watch.log().contains("put back"), "{}", watch.log());

        // The same counters over HTTP, as Prometheus' own parser reads them.
        let url = format!("http://{ADDRESS}/metrics");
        let got = run_in(node.topo.node(), "curl", &["-sSf", &url], None);
        assert_ok(&got, "curl /metrics");
        let served = node.dir.path().join("served.prom");
        std::fs::write(&served, &got.stdout).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/prometheus/parse.py");
        let parsed = Command::new("python3")
            .arg(script)
            .arg(&served)
            .output()
            .unwrap();
        assert_ok(&parsed, "prometheus_client parses /metrics");
        let text = String::from_utf8_lossy(&parsed.stdout);
        assert!(text.contains("natledger_watch_repairs"), "{text}");
        assert!(metric(&served, "natledger_watch_rules_restored_total") >= 1.0);

        // A hostile deleter every 50 ms for 6 s: watch backs off, at a low CPU.
        let stop = Arc::new(AtomicBool::new(false));
        let hostile = {
            let (stop, ns) = (stop.clone(), node.topo.node().to_string());
            let argv = flush_argv(backend);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = run_in(&ns, argv[0], &argv[1..], None);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let share = cpu_share(&watch, Duration::from_secs(6));
        stop.store(true, Ordering::Relaxed);
        hostile.join().unwrap();
        eprintln!(
            "{backend:?}: watch used {:.1}% of a CPU under the deleter",
            share * 100.0
        );
        let log = watch.log();
        assert!(log.contains("backing off"), "{backend:?}:\n{log}");
        // No system bus: said once, retried quietly, nothing else changed.
        let said = log
            .matches("not listening for firewalld's Reloaded signal")
            .count();
        assert_eq!(said, 1, "{backend:?}:\n{log}");
        assert!(
            share < 0.05,
            "{backend:?}: {:.1}% of a CPU\n{log}",
            share * 100.0
        );
        assert!(metric(&metrics, "natledger_watch_backoffs_total") >= 1.0);
        assert!(metric(&metrics, "natledger_watch_repairs_total") >= 2.0);

        // SIGHUP: repaired at once, the hold notwithstanding.
        std::thread::sleep(Duration::from_millis(200));
        watch.signal(libc::SIGHUP);
        let back = wait_until(Duration::from_secs(1), || {
            answers(Duration::from_millis(150))
        });
        assert!(
            back.is_some(),
            "{backend:?}: SIGHUP did not repair:\n{}",
            watch.log()
        );
        let same = wait_until(Duration::from_secs(2), || node.dump() == before);
        assert!(
            same.is_some(),
            "{backend:?}: the dump differs:\n{}",
            node.dump()
        );

        // SIGTERM: status 0 within a second.
        let mut watch = watch;
        watch.signal(libc::SIGTERM);
        let mut status = None;
        let gone = wait_until(Duration::from_secs(1), || {
            status = watch.child.try_wait().unwrap();
            status.is_some()
        });
        assert!(
            gone.is_some(),
            "{backend:?}: still running 1 s after SIGTERM"
        );
        assert!(
            status.unwrap().success(),
            "{backend:?}: {status:?}\n{}",
            watch.log()
        );
    });
}

/// A restore of a ruleset saved while another container held the port: same size, same entry
/// count, another DNAT. Seen by the content of natledger's chains, not the backstop.
#[test]
fn a_legacy_restore_that_swaps_same_shaped_rules_is_repaired_within_a_second() {
    let backend = Backend::IptablesLegacy;
    let mut node = Node::new(backend);
    let ns = node.topo.node().to_string();
    let c5 = node.topo.add_container(5);
    let _s5 = serve_tcp(&c5.ns, c5.sock_v4(80), "c5");
    let p5 = node.topo.spawn_sleeper(&c5.ns);
    node.create("c5", Some(p5), &[("io.natledger.ports", "6060:80")]);
    let saved: Vec<(Family, String)> = Family::ALL
        .into_iter()
        .map(|f| (f, save(&ns, backend, f)))
        .collect();
    assert_ok(&node.poststop("c5"), "poststop c5");
    kill_pid(p5);
    let c6 = node.topo.add_container(6);
    let _s6 = serve_tcp(&c6.ns, c6.sock_v4(80), "c6");
    let p6 = node.topo.spawn_sleeper(&c6.ns);
    node.create("c6", Some(p6), &[("io.natledger.ports", "6060:80")]);
    let ext = node.topo.ext().to_string();
    let answers = |timeout: Duration| {
        tcp_request(&ext, sock(NODE_V4, 6060), timeout).is_ok_and(|r| r == "c6")
    };
    assert!(answers(Duration::from_secs(2)));
    let before = node.dump();

    let metrics = node.dir.path().join("watch.prom");
    let watch = Watch::start(&node, &metrics);
    let started = wait_until(Duration::from_secs(10), || {
        metric(&metrics, "natledger_watch_reconciles_total") >= 1.0
    });
    assert!(started.is_some(), "no reconcile:\n{}", watch.log());
    for (family, text) in &saved {
        let prog = format!("{}-restore", iptables_tool(backend, *family));
        assert_ok(
            &run_in(&ns, &prog, &["-w", "30"], Some(text.as_bytes())),
            &prog,
        );
    }
    let back = wait_until(Duration::from_secs(2), || {
        answers(Duration::from_millis(150))
    });
    assert!(
        back.is_some(),
        "port 6060 not back to c6 in 2 s:\n{}",
        watch.log()
    );
    eprintln!("swap repaired {:?} after the restore", back.unwrap());
    assert!(back.unwrap() < Duration::from_millis(1500), "{:?}", back);
    let same = wait_until(Duration::from_secs(2), || node.dump() == before);
    assert!(same.is_some(), "the dump differs:\n{}", node.dump());
}

/// kube-proxy's resyncs, as a loop: rules added to and flushed from its own chain in
/// iptables-nft's `ip nat`, 14 commits a second. Not natledger's chains nor the built-in
/// chains it jumps from: no reconcile, about no CPU.
#[test]
fn another_owners_chain_in_the_shared_nat_table_wakes_no_reconcile() {
    let backend = Backend::IptablesNft;
    let mut node = Node::new(backend);
    let ns = node.topo.node().to_string();
    let c = node.topo.add_container(7);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("c7", Some(pid), &[("io.natledger.ports", "7070:80")]);
    load_nft(&ns, "add chain ip nat KUBE-X\n");
    let metrics = node.dir.path().join("watch.prom");
    let watch = Watch::start(&node, &metrics);
    let started = wait_until(Duration::from_secs(10), || {
        metric(&metrics, "natledger_watch_reconciles_total") >= 1.0
    });
    assert!(started.is_some(), "no reconcile:\n{}", watch.log());
    std::thread::sleep(Duration::from_millis(300));
    let runs = metric(&metrics, "natledger_watch_reconciles_total");
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, ns) = (stop.clone(), ns.clone());
        std::thread::spawn(move || {
            let mut commits = 0;
            while !stop.load(Ordering::Relaxed) {
                load_nft(&ns, "add rule ip nat KUBE-X counter\n");
                load_nft(&ns, "flush chain ip nat KUBE-X\n");
                commits += 2;
                std::thread::sleep(Duration::from_millis(70));
            }
            commits
        })
    };
    let share = cpu_share(&watch, Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let commits = churn.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let woke = metric(&metrics, "natledger_watch_reconciles_total") - runs;
    eprintln!(
        "{commits} commits to KUBE-X: {woke} reconciles, {:.2}% of a CPU",
        share * 100.0
    );
    assert!(commits >= 20, "{commits}");
    assert_eq!(woke, 0.0, "{}", watch.log());
    assert!(share < 0.01, "{:.2}% of a CPU", share * 100.0);
}

/// A reconcile that fails (a state directory refused: its marker is not natledger's) is tried
/// again 0.5 s, 1 s, 2 s … later, logged once each time, not twice a second.
#[test]
fn a_failing_reconcile_backs_off() {
    let mut node = Node::new(Backend::IptablesLegacy);
    let c = node.topo.add_container(8);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("c8", Some(pid), &[("io.natledger.ports", "8088:80")]);
    let marker = node.state_dir().join("natledger-state");
    std::fs::write(&marker, "another program's file\n").unwrap();
    let metrics = node.dir.path().join("watch.prom");
    let watch = Watch::start(&node, &metrics);
    std::thread::sleep(Duration::from_millis(3200));
    let log = watch.log();
    let failures = log.matches("reconcile failed").count();
    eprintln!("{failures} failures logged in 3.2 s");
    assert!(log.contains("refusing state directory"), "{log}");
    assert!(log.contains("trying again in 1000 ms"), "{log}");
    // At 0, 0.5, 1.5 s (and 3.5 s): not 7.
    assert!((2..=4).contains(&failures), "{failures}:\n{log}");
}

/// A hook holding the ledger lock keeps no signal waiting: SIGHUP
/// then SIGTERM, and watch has ended within a second.
#[test]
fn sigterm_never_waits_for_the_ledger_lock() {
    let mut node = Node::new(Backend::IptablesLegacy);
    let c = node.topo.add_container(9);
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("c9", Some(pid), &[("io.natledger.ports", "9099:80")]);
    let metrics = node.dir.path().join("watch.prom");
    let mut watch = Watch::start(&node, &metrics);
    let started = wait_until(Duration::from_secs(10), || {
        metric(&metrics, "natledger_watch_reconciles_total") >= 1.0
    });
    assert!(started.is_some(), "no reconcile:\n{}", watch.log());
    let lock = node.state_dir().join("lock");
    // Held by the test itself, as a hook holds it (flock(2) on its own open file).
    let holder = std::fs::File::open(&lock).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
    std::thread::sleep(Duration::from_millis(300));
    watch.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    watch.signal(libc::SIGTERM);
    let mut status = None;
    let gone = wait_until(Duration::from_secs(3), || {
        status = watch.child.try_wait().unwrap();
        status.is_some()
    });
    drop(holder);
    assert!(gone.is_some(), "still running 3 s after SIGTERM");
    eprintln!("ended {:?} after SIGTERM, the lock held", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(status.unwrap().success(), "{status:?}\n{}", watch.log());
}

/// Clients that connect to `/metrics` and send nothing (20 every 50 ms) hold only the
/// serving thread: a wipe is still put back within 2 s, SIGTERM still ends watch within a
/// second.
#[test]
fn idle_metrics_clients_never_stall_the_loop() {
    let backend = Backend::IptablesLegacy;
    let mut node = Node::new(backend);
    let c = node.topo.add_container(4);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "c4");
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("c4", Some(pid), &[("io.natledger.ports", "4040:80")]);
    let ext = node.topo.ext().to_string();
    let answers = |timeout: Duration| {
        tcp_request(&ext, sock(NODE_V4, 4040), timeout).is_ok_and(|r| r == "c4")
    };
    assert!(answers(Duration::from_secs(2)));
    let metrics = node.dir.path().join("watch.prom");
    let mut watch = Watch::start(&node, &metrics);
    let started = wait_until(Duration::from_secs(10), || {
        metric(&metrics, "natledger_watch_reconciles_total") >= 1.0
    });
    assert!(started.is_some(), "no reconcile:\n{}", watch.log());
    let (host, port) = ADDRESS.split_once(':').unwrap();
    let script = format!(
        "import socket, time\n\
         end = time.time() + 6; keep = []\n\
         while time.time() < end:\n\
         \x20   for _ in range(20):\n\
         \x20       try: keep.append(socket.create_connection(('{host}', {port}), timeout=0.2))\n\
         \x20       except OSError: pass\n\
         \x20   keep = keep[-300:]\n\
         \x20   time.sleep(0.05)\n"
    );
    let mut flood = Command::new("ip")
        .args(["netns", "exec", node.topo.node(), "python3", "-c", &script])
        .spawn()
        .expect("python3");
    std::thread::sleep(Duration::from_millis(800));
    wipe(&node);
    let back = wait_until(Duration::from_secs(2), || {
        answers(Duration::from_millis(150))
    });
    let t0 = Instant::now();
    watch.signal(libc::SIGTERM);
    let gone = wait_until(Duration::from_secs(3), || {
        watch.child.try_wait().unwrap().is_some()
    });
    let ended = t0.elapsed();
    let _ = flood.kill();
    let _ = flood.wait();
    assert!(back.is_some(), "not repaired in 2 s:\n{}", watch.log());
    assert!(gone.is_some(), "still running 3 s after SIGTERM");
    eprintln!(
        "repaired {:?} after the wipe, ended {ended:?} after SIGTERM",
        back.unwrap()
    );
    assert!(ended < Duration::from_secs(1), "{ended:?}");
}

//! The alerts and what they read: `promtool check rules` and `promtool test rules` pass on
//! deploy/prometheus (every alert fires where it should and not where it should not); a real
//! `natledger watch --doctor-period 1` in a node namespace (both iptables backends, the test
//! starts and ends it by pid) with a live container's forward serves `/metrics` that `promtool
//! check metrics` accepts, every doctor kind and severity a series, and `/healthz` 200; a
//! stale foreign DNAT put in front of the forward (the port closed to real TCP) shows up in
//! `natledger_doctor_findings{kind="shadowed"}` and the log once, and goes from both when it is
//! deleted (the port answers again); SIGTERM while a doctor run is under way ends watch with
//! status 0 within a second. While the state directory does not exist, `/healthz` is 200 and
//! `/metrics` answers without doctor's series (no run); once it exists, doctor runs. With 14,000 kube-proxy-like rules in the legacy nat table (a
//! doctor run of seconds in a debug build), a wipe made while doctor runs is still put back
//! within 2 s, for new TCP connections and for a UDP client that kept sending through it:
//! doctor never holds a repair up.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::watch::{Watch, metric, wait_until, wipe};

const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus");
/// Where watch serves, in the node namespace (`crate::watch`'s).
const ADDRESS: &str = "127.0.0.1:19655";

fn promtool(args: &[&str], dir: &str, stdin: Option<&[u8]>) -> std::process::Output {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test.sh installs it)");
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

#[test]
fn the_alert_rules_check_and_their_unit_tests_pass() {
    let out = promtool(&["check", "rules", "natledger-rules.yaml"], RULES, None);
    assert_ok(&out, "promtool check rules");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("SUCCESS: 10 rules found"), "{said}");
    let out = promtool(&["test", "rules", "natledger-rules.test.yaml"], RULES, None);
    assert_ok(&out, "promtool test rules");
    // Each alert has a test of its own that expects it to fire.
    let rules = std::fs::read_to_string(Path::new(RULES).join("natledger-rules.yaml")).unwrap();
    let tests =
        std::fs::read_to_string(Path::new(RULES).join("natledger-rules.test.yaml")).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        let fires = tests
            .split("alertname: ")
            .skip(1)
            .any(|t| t.starts_with(alert) && t.contains("exp_labels"));
        assert!(fires, "{alert}: no test expects it to fire");
    }
}

/// `GET path` in the node namespace: (status line, body).
fn get(node: &Node, path: &str) -> (String, String) {
    let url = format!("http://{ADDRESS}{path}");
    let out = run_in(
        node.topo.node(),
        "curl",
        &["-sS", "-m", "2", "-w", "\n%{http_code}", &url],
        None,
    );
    assert_ok(&out, "curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.to_string(), body.to_string())
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// How many samples of `natledger_doctor_findings{kind=KIND,...}` are above 0.
fn shadowed(path: &Path) -> f64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("natledger_doctor_findings{kind=\"shadowed\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn watch_exports_doctor_findings_as_they_come_and_go_and_serves_healthz() {
    iptables_both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
        let pid = node.topo.spawn_sleeper(&c.ns);
        node.create("c2", Some(pid), &[("io.natledger.ports", "8080:80")]);
        let ext = node.topo.ext().to_string();
        let answers = |timeout: Duration| {
            tcp_request(&ext, sock(NODE_V4, 8080), timeout).is_ok_and(|r| r == "c2")
        };
        assert!(answers(Duration::from_secs(2)), "{backend:?}");

        let metrics = node.dir.path().join("watch.prom");
        let none = node.dir.path().join("no-bus");
        let env = [format!(
            "DBUS_SYSTEM_BUS_ADDRESS=unix:path={}",
            none.display()
        )];
        let mut watch = Watch::start_with(&node, &metrics, &env, &["--doctor-period", "1"]);
        let ran = wait_until(Duration::from_secs(15), || {
            metric(&metrics, "natledger_doctor_runs_total") >= 1.0
        });
        assert!(
            ran.is_some(),
            "{backend:?}: no doctor run:\n{}",
            watch.log()
        );

        // Clean: every kind and severity is a series; the served text passes promtool's lint.
        let (code, body) = get(&node, "/metrics");
        assert_eq!(code, "200", "{body}");
        let kinds = body
            .lines()
            .filter(|l| l.starts_with("natledger_doctor_findings{"))
            .count();
        assert_eq!(kinds, 8 * 3, "{backend:?}:\n{body}");
        for series in [
            "natledger_doctor_findings{kind=\"shadowed\",severity=\"error\"}",
            "natledger_doctor_findings{kind=\"dead-target\",severity=\"error\"}",
            "natledger_doctor_failed",
        ] {
            assert_eq!(sample(&body, series), Some(0.0), "{series}:\n{body}");
        }
        assert_eq!(sample(&body, "natledger_doctor_period_seconds"), Some(1.0));
        assert!(sample(&body, "natledger_doctor_last_success_timestamp_seconds").is_some());
        let lint = promtool(&["check", "metrics"], RULES, Some(body.as_bytes()));
        assert_ok(&lint, "promtool check metrics");
        let (code, health) = get(&node, "/healthz");
        assert_eq!(code, "200", "{health}");
        assert!(health.starts_with("ok: the watch loop ticked"), "{health}");
        let (code, _) = get(&node, "/nothing");
        assert_eq!(code, "404");

        // A stale foreign DNAT in front of natledger's jump: the port goes to no one.
        let stale = [
            "-t",
            "nat",
            "PREROUTING",
            "-p",
            "tcp",
            "-m",
            "addrtype",
            "--dst-type",
            "LOCAL",
            "-m",
            "tcp",
            "--dport",
            "8080",
            "-j",
            "DNAT",
            "--to-destination",
            "10.77.0.9:80",
        ];
        let tool = iptables_tool(backend, Family::V4);
        let edit = |op: &str| {
            let mut args = vec!["-w"];
            args.extend(stale);
            args.insert(3, op);
            if op == "-I" {
                args.insert(5, "1");
            }
            assert_ok(&run_in(node.topo.node(), tool, &args, None), tool);
        };
        edit("-I");
        assert!(!answers(Duration::from_millis(500)), "{backend:?}");
        let t0 = Instant::now();
        let found = wait_until(Duration::from_secs(10), || shadowed(&metrics) >= 1.0);
        assert!(
            found.is_some(),
            "{backend:?}: no shadowed finding:\n{}\n{}",
            std::fs::read_to_string(&metrics).unwrap_or_default(),
            watch.log()
        );
        eprintln!(
            "{backend:?}: the shadow in the metrics {:?} after",
            t0.elapsed()
        );
        let (_, body) = get(&node, "/metrics");
        assert!(
            body.lines().any(
                |l| l.starts_with("natledger_doctor_findings{kind=\"shadowed\"")
                    && !l.ends_with(" 0")
            ),
            "{body}"
        );
        // A few more runs: the finding is logged once.
        let runs = metric(&metrics, "natledger_doctor_runs_total");
        wait_until(Duration::from_secs(10), || {
            metric(&metrics, "natledger_doctor_runs_total") >= runs + 2.0
        });
        let log = watch.log();
        let said = log
            .lines()
            .filter(|l| l.contains("doctor: found:") && l.contains("shadowed port 8080"))
            .count();
        assert_eq!(said, 1, "{backend:?}:\n{log}");

        // Fixed: the finding goes, the port answers again.
        edit("-D");
        let gone = wait_until(Duration::from_secs(10), || shadowed(&metrics) == 0.0);
        assert!(gone.is_some(), "{backend:?}:\n{}", watch.log());
        assert!(answers(Duration::from_secs(2)), "{backend:?}");
        let log = watch.log();
        assert!(
            log.contains("doctor: no longer found:") && log.contains("port 8080"),
            "{backend:?}:\n{log}"
        );

        // SIGTERM while a run is under way (the doctor thread out of its sleep): status 0
        // within a second.
        let under_way = wait_until(Duration::from_secs(10), || doctor_running(&watch));
        let t0 = Instant::now();
        watch.signal(libc::SIGTERM);
        let mut status = None;
        let ended = wait_until(Duration::from_secs(2), || {
            status = watch.child.try_wait().unwrap();
            status.is_some()
        });
        let took = t0.elapsed();
        assert!(ended.is_some(), "{backend:?}: still running after SIGTERM");
        assert!(
            status.unwrap().success(),
            "{backend:?}: {status:?}\n{}",
            watch.log()
        );
        eprintln!(
            "{backend:?}: SIGTERM {} a doctor run: ended in {took:?}",
            if under_way.is_some() {
                "during"
            } else {
                "(not caught) near"
            }
        );
        assert!(took < Duration::from_secs(1), "{took:?}");
    });
}

/// Whether watch's doctor thread is in a run: not in its sleep between runs
/// (`clock_nanosleep`, 230 on x86_64; `nanosleep`, 35), read from `/proc/PID/task/*/syscall`.
fn doctor_running(watch: &Watch) -> bool {
    let pid = watch.child.id();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "doctor" {
            continue;
        }
        let syscall = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
        let nr = syscall.split_whitespace().next().unwrap_or("");
        return !matches!(nr, "230" | "35" | "");
    }
    false
}

/// kube-proxy's shape: `services` services of two endpoints each (7 rules a service).
fn kube_proxy(services: usize) -> String {
    let mut chains = String::from("*nat\n:KUBE-SERVICES - [0:0]\n");
    let mut rules = String::from(
        "-A PREROUTING -m comment --comment kube -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment kube -j KUBE-SERVICES\n",
    );
    for i in 0..services {
        let (a, b) = (i / 250, i % 250 + 1);
        chains +=
            &format!(":KUBE-SVC-{i} - [0:0]\n:KUBE-SEP-{i}A - [0:0]\n:KUBE-SEP-{i}B - [0:0]\n");
        rules += &format!(
            "-A KUBE-SERVICES -d 10.96.{a}.{b}/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-{i}\n\
             -A KUBE-SVC-{i} -m statistic --mode random --probability 0.5 -j KUBE-SEP-{i}A\n\
             -A KUBE-SVC-{i} -j KUBE-SEP-{i}B\n"
        );
        for (sep, net) in [("A", 244), ("B", 245)] {
            rules += &format!(
                "-A KUBE-SEP-{i}{sep} -s 10.{net}.{a}.{b}/32 -j MARK --set-xmark 0x4000/0x4000\n\
                 -A KUBE-SEP-{i}{sep} -p tcp -m tcp -j DNAT --to-destination 10.{net}.{a}.{b}:8080\n"
            );
        }
    }
    chains + &rules + "COMMIT\n"
}

#[test]
fn a_wipe_during_a_long_doctor_run_is_repaired_within_two_seconds() {
    let backend = Backend::IptablesLegacy;
    let mut node = Node::new(backend);
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
    let _udp = serve_udp(&c.ns, c.sock_v4(81), "c2 udp");
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create(
        "c2",
        Some(pid),
        &[("io.natledger.ports", "8080:80,8081:81/udp")],
    );
    load_rules(node.topo.node(), backend, Family::V4, &kube_proxy(2000));
    let ext = node.topo.ext().to_string();
    let answers = |timeout: Duration| {
        tcp_request(&ext, sock(NODE_V4, 8080), timeout).is_ok_and(|r| r == "c2")
    };
    assert!(answers(Duration::from_secs(2)));
    // A client that keeps sending, from one source port, through the wipe.
    let client = UdpClient::start(&ext, sock(EXT_V4, 41081), sock(NODE_V4, 8081));
    let replies = client.wait_for("c2 udp", Instant::now(), Duration::from_secs(2));
    assert!(replies.is_some(), "no UDP reply before the wipe");
    let metrics = node.dir.path().join("watch.prom");
    let none = node.dir.path().join("no-bus");
    let env = [format!(
        "DBUS_SYSTEM_BUS_ADDRESS=unix:path={}",
        none.display()
    )];
    let watch = Watch::start_with(&node, &metrics, &env, &["--doctor-period", "1"]);
    let ran = wait_until(Duration::from_secs(60), || {
        metric(&metrics, "natledger_doctor_runs_total") >= 1.0
    });
    assert!(ran.is_some(), "no doctor run:\n{}", watch.log());
    let took = metric(&metrics, "natledger_doctor_last_success_duration_seconds");
    eprintln!("a doctor run over {} rules: {took:.2} s", 14_002);
    let under_way = wait_until(Duration::from_secs(10), || doctor_running(&watch));
    assert!(under_way.is_some(), "no doctor run seen under way");
    let t0 = Instant::now();
    wipe(&node);
    let wiped = t0.elapsed();
    let t1 = Instant::now();
    let back = wait_until(Duration::from_secs(5), || {
        answers(Duration::from_millis(150))
    });
    // The repair came during the run (a run lasts seconds here), not after it.
    let overlapped = doctor_running(&watch);
    let back = back.unwrap_or_else(|| panic!("not repaired in 5 s:\n{}", watch.log()));
    assert!(
        overlapped,
        "the doctor run ended before the repair: nothing proven"
    );
    let udp = client.wait_for("c2 udp", t1 + back, Duration::from_secs(2));
    client.stop();
    eprintln!("wiped in {wiped:?}, answering again {back:?} after the wipe ended");
    assert!(back < Duration::from_secs(2), "{back:?}");
    let udp = udp.expect("the UDP client's replies did not come back");
    eprintln!("UDP replies again {:?} after the wipe ended", udp - t1);
    assert!(udp - t1 < Duration::from_secs(3), "{:?}", udp - t1);
}

#[test]
fn healthz_answers_while_the_state_directory_is_awaited_and_doctor_waits_for_it() {
    let node = Node::new(Backend::IptablesNft);
    let dir = node.dir.path().join("later");
    let metrics = node.dir.path().join("watch.prom");
    let env = [
        format!(
            "DBUS_SYSTEM_BUS_ADDRESS=unix:path={}",
            node.dir.path().join("no-bus").display()
        ),
        format!("NATLEDGER_STATE_DIR={}", dir.display()),
    ];
    let mut watch = Watch::start_with(&node, &metrics, &env, &["--doctor-period", "1"]);
    let waiting = wait_until(Duration::from_secs(10), || {
        watch.log().contains("waiting for state directory")
    });
    assert!(waiting.is_some(), "{}", watch.log());
    let (code, health) = get(&node, "/healthz");
    assert_eq!(code, "200", "{health}");
    std::thread::sleep(Duration::from_millis(1500));
    let (code, body) = get(&node, "/metrics");
    assert_eq!(code, "200");
    assert_eq!(
        sample(&body, "natledger_watch_reconciles_total"),
        Some(0.0),
        "{body}"
    );
    assert!(
        !body.contains("natledger_doctor"),
        "doctor ran without a ledger:\n{body}"
    );
    assert!(!dir.exists(), "watch created the state directory");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let ran = wait_until(Duration::from_secs(15), || {
        metric(&metrics, "natledger_doctor_runs_total") >= 1.0
    });
    assert!(ran.is_some(), "no doctor run:\n{}", watch.log());
    let (_, body) = get(&node, "/metrics");
    assert_eq!(
        sample(&body, "natledger_doctor_failed"),
        Some(0.0),
        "{body}\n{}",
        watch.log()
    );
    watch.signal(libc::SIGTERM);
    let status = watch.child.wait().unwrap();
    assert!(status.success(), "{status}\n{}", watch.log());
}

//! `natledger watch` and firewalld's D-Bus `Reloaded` signal, on a private `dbus-daemon` the
//! test starts (a system-like bus in a temporary directory, allowing everything) and ends by
//! pid: on iptables-legacy with watch's table comparison made rare (a hidden option), a wipe
//! that no other trigger sees soon is put back within 500 ms of the signal (`dbus-send`),
//! proven with real TCP from the outside namespace; when the bus goes away watch says so once
//! and goes on, then subscribes again when it is back and repairs on the next signal; SIGTERM
//! still ends it with status 0. Subscribed and idle, it uses under 1% of a CPU.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::watch::{Watch, cpu_share, metric, wait_until, wipe};

/// A private bus, killed (by pid) on drop.
struct Bus {
    child: Child,
    socket: PathBuf,
}

impl Bus {
    fn start(dir: &Path) -> Bus {
        std::fs::create_dir_all(dir).unwrap();
        let socket = dir.join("bus.sock");
        let config = dir.join("bus.conf");
        std::fs::write(
            &config,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="signal"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
  </policy>
</busconfig>
"#,
                socket.display()
            ),
        )
        .unwrap();
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dbus-daemon");
        if wait_until(Duration::from_secs(10), || socket.exists()).is_none() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dbus-daemon made no socket at {}", socket.display());
        }
        Bus { child, socket }
    }

    fn address(&self) -> String {
        format!("unix:path={}", self.socket.display())
    }

    /// firewalld's signal after a reload, as firewalld's object sends it.
    fn reloaded(&self) {
        let out = Command::new("dbus-send")
            .arg(format!("--bus={}", self.address()))
            .args([
                "--type=signal",
                "/org/fedoraproject/FirewallD1",
                "org.fedoraproject.FirewallD1.Reloaded",
            ])
            .output()
            .unwrap();
        assert_ok(&out, "dbus-send");
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The line of a subscription made (the other line says "not listening …: why").
const LISTENING: &str = "listening for firewalld's Reloaded signal on ";
const NOT_LISTENING: &str = "not listening for firewalld's Reloaded signal";

#[test]
fn firewallds_reloaded_signal_repairs_at_once_and_a_lost_bus_is_tried_again() {
    let mut node = Node::new(Backend::IptablesLegacy);
    let bus = Bus::start(&node.dir.path().join("bus"));
    let c = node.topo.add_container(2);
    let _server = serve_tcp(&c.ns, c.sock_v4(80), "c2");
    let pid = node.topo.spawn_sleeper(&c.ns);
    node.create("c2", Some(pid), &[("io.natledger.ports", "8080:80")]);
    assert!(answers(&node, Duration::from_secs(2)));
    let before = node.dump();

    let metrics = node.dir.path().join("watch.prom");
    let env = [format!("DBUS_SYSTEM_BUS_ADDRESS={}", bus.address())];
    let args = ["--legacy-every-ms", "600000", "--period", "600"];
    let mut watch = Watch::start_with(&node, &metrics, &env, &args);
    let ready = wait_until(Duration::from_secs(10), || {
        metric(&metrics, "natledger_watch_reconciles_total") >= 1.0
            && watch.log().contains(LISTENING)
    });
    assert!(ready.is_some(), "watch not ready:\n{}", watch.log());
    // Subscribed and idle: about nothing.
    let share = cpu_share(&watch, Duration::from_secs(2));
    eprintln!("idle, subscribed: {:.2}% of a CPU", share * 100.0);
    assert!(share < 0.01, "idle at {:.1}%", share * 100.0);

    repaired_on_signal(&node, &watch, &bus, &metrics, &before, "first signal");
    assert!(
        watch.log().contains("firewalld reloaded"),
        "{}",
        watch.log()
    );

    // The bus goes: said once, watch goes on (its retries fail quietly), then subscribes
    // again when a bus is back at the address.
    let dir = bus.socket.parent().unwrap().to_path_buf();
    bus.stop();
    let said = wait_until(Duration::from_secs(2), || {
        watch.log().contains(NOT_LISTENING)
    });
    assert!(said.is_some(), "the drop was not said:\n{}", watch.log());
    std::thread::sleep(Duration::from_millis(1500));
    let log = watch.log();
    assert_eq!(log.matches(NOT_LISTENING).count(), 1, "{log}");
    assert!(
        watch.child.try_wait().unwrap().is_none(),
        "watch ended:\n{log}"
    );
    let listening = log.matches(LISTENING).count();
    let bus = Bus::start(&dir);
    let again = wait_until(Duration::from_secs(5), || {
        watch.log().matches(LISTENING).count() > listening
    });
    assert!(again.is_some(), "not subscribed again:\n{}", watch.log());
    repaired_on_signal(
        &node,
        &watch,
        &bus,
        &metrics,
        &before,
        "after the bus came back",
    );

    // SIGTERM: status 0 within a second.
    // SAFETY: a plain kill(2) of the child this test started (not yet waited for).
    assert_eq!(
        unsafe { libc::kill(watch.child.id() as i32, libc::SIGTERM) },
        0
    );
    let mut status = None;
    let gone = wait_until(Duration::from_secs(1), || {
        status = watch.child.try_wait().unwrap();
        status.is_some()
    });
    assert!(gone.is_some(), "still running 1 s after SIGTERM");
    assert!(status.unwrap().success(), "{status:?}\n{}", watch.log());
    bus.stop();
}

fn answers(node: &Node, timeout: Duration) -> bool {
    tcp_request(node.topo.ext(), sock(NODE_V4, 8080), timeout).is_ok_and(|r| r == "c2")
}

/// A wipe no other trigger sees for minutes (still broken a moment later), put back within
/// 500 ms of the signal, and the dump then the one before.
fn repaired_on_signal(
    node: &Node,
    watch: &Watch,
    bus: &Bus,
    metrics: &Path,
    before: &str,
    what: &str,
) {
    wipe(node);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !answers(node, Duration::from_millis(300)),
        "{what}: repaired without the signal:\n{}",
        watch.log()
    );
    let runs = metric(metrics, "natledger_watch_reconciles_total");
    let sent = Instant::now();
    bus.reloaded();
    let back = wait_until(Duration::from_secs(2), || {
        answers(node, Duration::from_millis(100))
    });
    let took = back.map(|_| sent.elapsed());
    eprintln!("{what}: answering {took:?} after the signal was sent");
    assert!(
        took.is_some_and(|t| t < Duration::from_millis(500)),
        "{what}: not repaired within 500 ms of the signal ({took:?}):\n{}",
        watch.log()
    );
    let counted = wait_until(Duration::from_secs(2), || {
        metric(metrics, "natledger_watch_reconciles_total") > runs
    });
    assert!(counted.is_some(), "{what}: no reconcile counted");
    let same = wait_until(Duration::from_secs(2), || node.dump() == before);
    assert!(same.is_some(), "{what}: the dump differs:\n{}", node.dump());
}

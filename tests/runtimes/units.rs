//! The systemd units under packaging/systemd: `systemd-analyze verify` accepts them, and they
//! are ordered as the README says.

use std::process::Command;

const UNITS: [&str; 5] = [
    "natledger-boot.service",
    "natledger-runtime@.service",
    "natledger-sweep.service",
    "natledger-sweep.timer",
    "natledger-watch.service",
];
/// The long-running service; the others are oneshots.
const WATCH: &str = "natledger-watch.service";
const BIN: &str = "/usr/local/bin/natledger";
/// Debian's prometheus-node-exporter textfile collector directory, and natledger's file in it.
const METRICS: &str = "/var/lib/prometheus/node-exporter/natledger.prom";

fn text(unit: &str) -> String {
    let path = format!("{}/packaging/systemd/{unit}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The words of every `key=` line of a unit, in order.
fn values(unit: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}=");
    text(unit)
        .lines()
        .filter_map(|line| line.trim().strip_prefix(&prefix).map(str::to_string))
        .flat_map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect()
}

/// `systemd-analyze verify` accepts every unit, with no warning naming natledger.
#[test]
fn systemd_analyze_verify_accepts_every_unit() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    // verify checks that commands exist: point them at the binary under test. The template
    // is verified through an instance, which verify loads from the template file beside it.
    let dir = tempfile::tempdir().unwrap();
    for unit in UNITS {
        let text = text(unit).replace(BIN, env!("CARGO_BIN_EXE_natledger"));
        std::fs::write(dir.path().join(unit), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(UNITS.map(|u| dir.path().join(u.replace("@.", "@docker."))))
        .output()
        .expect("systemd-analyze (Debian package systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Other units on the host (docker.service, say) may draw warnings; ours must not.
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("natledger")).collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

/// The boot sweep (`--boot`) runs after every firewall restore and before every runtime,
/// writing its metrics.
#[test]
fn boot_sweep_runs_after_the_firewall_restore_and_before_every_runtime() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let unit = "natledger-boot.service";
    let after = values(unit, "After");
    for restore in [
        "netfilter-persistent.service",
        "iptables.service",
        "ip6tables.service",
        "nftables.service",
        "firewalld.service",
    ] {
        assert!(after.iter().any(|u| u == restore), "After= lacks {restore}");
    }
    let before = values(unit, "Before");
    for runtime in [
        "docker.service",
        "containerd.service",
        "crio.service",
        "podman.service",
        "kubelet.service",
    ] {
        assert!(
            before.iter().any(|u| u == runtime),
            "Before= lacks {runtime}"
        );
    }
    // --boot: the tmpfs state directory is not made yet, and every tagged rule goes.
    assert_eq!(
        values(unit, "ExecStart"),
        [BIN, "sweep", "--boot", "--metrics-file", METRICS]
    );
    assert_eq!(values(unit, "WantedBy"), ["multi-user.target"]);
}

/// `natledger-runtime@X` is part of X, stopped after it, and sweeps (`--wait 20`) then.
#[test]
fn runtime_unit_sweeps_once_its_runtime_is_down() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let unit = "natledger-runtime@.service";
    // Started with the runtime, stopped with it, and (ordered before it) stopped after it.
    assert_eq!(values(unit, "WantedBy"), ["%i.service"]);
    assert_eq!(values(unit, "PartOf"), ["%i.service"]);
    assert_eq!(values(unit, "Before"), ["%i.service"]);
    assert_eq!(values(unit, "RemainAfterExit"), ["yes"]);
    assert!(values(unit, "ExecStart").is_empty());
    assert_eq!(values(unit, "ExecStop"), [BIN, "sweep", "--wait", "20"]);
}

/// The timer sweeps 10 minutes after boot and every 15 minutes, writing metrics.
#[test]
fn timer_sweeps_periodically() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    assert_eq!(
        values("natledger-sweep.service", "ExecStart"),
        [BIN, "sweep", "--metrics-file", METRICS]
    );
    let timer = "natledger-sweep.timer";
    assert_eq!(values(timer, "OnBootSec"), ["10min"]);
    assert_eq!(values(timer, "OnUnitActiveSec"), ["15min"]);
    assert_eq!(values(timer, "WantedBy"), ["timers.target"]);
}

/// The sandbox leaves the metrics directory writable: `ProtectSystem=full` makes /usr, /boot,
/// /efi and /etc read-only, not /var (`strict` would need a `ReadWritePaths=`).
#[test]
fn the_sweeps_can_write_their_metrics() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    for unit in ["natledger-boot.service", "natledger-sweep.service"] {
        assert_eq!(values(unit, "ProtectSystem"), ["full"], "{unit}");
        assert!(METRICS.starts_with("/var/"));
    }
}

/// Every service is a oneshot with a timeout and only CAP_NET_ADMIN and CAP_NET_RAW.
#[test]
fn every_service_is_a_bounded_oneshot_with_the_capabilities_iptables_needs() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    for unit in UNITS
        .iter()
        .filter(|u| u.ends_with(".service") && **u != WATCH)
    {
        assert_eq!(values(unit, "Type"), ["oneshot"], "{unit}");
        let caps = values(unit, "CapabilityBoundingSet");
        assert_eq!(caps, ["CAP_NET_ADMIN", "CAP_NET_RAW"], "{unit}");
        let timeouts = [
            values(unit, "TimeoutStartSec"),
            values(unit, "TimeoutStopSec"),
        ];
        assert!(timeouts.iter().any(|t| !t.is_empty()), "{unit}: no timeout");
    }
}

/// watch runs after the firewall's restore and the boot sweep, before every runtime; SIGHUP
/// on reload; restarted on failure; the sweeps' sandbox and capabilities.
#[test]
fn watch_runs_after_the_firewall_and_before_every_runtime() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let after = values(WATCH, "After");
    for unit in [
        "netfilter-persistent.service",
        "iptables.service",
        "ip6tables.service",
        "nftables.service",
        "firewalld.service",
        "natledger-boot.service",
    ] {
        assert!(after.iter().any(|u| u == unit), "After= lacks {unit}");
    }
    let before = values(WATCH, "Before");
    for runtime in [
        "docker.service",
        "containerd.service",
        "crio.service",
        "kubelet.service",
    ] {
        assert!(
            before.iter().any(|u| u == runtime),
            "Before= lacks {runtime}"
        );
    }
    let metrics = METRICS.replace("natledger.prom", "natledger-watch.prom");
    assert_eq!(
        values(WATCH, "ExecStart"),
        [BIN, "watch", "--metrics-file", metrics.as_str()]
    );
    assert_eq!(
        values(WATCH, "ExecReload"),
        ["/bin/kill", "-HUP", "$MAINPID"]
    );
    assert_eq!(values(WATCH, "Type"), ["exec"]);
    assert_eq!(values(WATCH, "Restart"), ["on-failure"]);
    assert_eq!(
        values(WATCH, "CapabilityBoundingSet"),
        ["CAP_NET_ADMIN", "CAP_NET_RAW"]
    );
    assert_eq!(values(WATCH, "ProtectSystem"), ["full"]);
    assert_eq!(values(WATCH, "WantedBy"), ["multi-user.target"]);
}

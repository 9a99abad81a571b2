//! PATH directories that pick an iptables backend for tools natledger is compared with (CNI
//! portmap, netavark), which run `iptables*` by name: one of symlinks, and one of wrappers that
//! log each call, to count the processes a tool starts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::run_cmd;

const IPT_TOOLS: [&str; 6] = [
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
];

/// `plain` holds symlinks to the backend's binaries, `counting` holds wrappers that log each
/// call to `log` and exec the real binary; both end with the usual system directories.
pub struct PathDirs {
    _dir: tempfile::TempDir,
    pub plain: String,
    pub counting: String,
    log: PathBuf,
}

impl PathDirs {
    pub fn new(backend: &str) -> PathDirs {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        let counting = dir.path().join("counting");
        let log = dir.path().join("calls.log");
        std::fs::create_dir(&plain).unwrap();
        std::fs::create_dir(&counting).unwrap();
        for tool in IPT_TOOLS {
            // iptables-save -> /usr/sbin/iptables-legacy-save, ip6tables -> ip6tables-legacy...
            let real = match tool.split_once('-') {
                Some((base, rest)) => format!("/usr/sbin/{base}-{backend}-{rest}"),
                None => format!("/usr/sbin/{tool}-{backend}"),
            };
            assert!(Path::new(&real).exists(), "{real} missing");
            std::os::unix::fs::symlink(&real, plain.join(tool)).unwrap();
            let wrapper = counting.join(tool);
            std::fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\necho \"{tool} $*\" >> '{}'\nexec '{real}' \"$@\"\n",
                    log.display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let tail = ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        PathDirs {
            plain: format!("{}{tail}", plain.display()),
            counting: format!("{}{tail}", counting.display()),
            log,
            _dir: dir,
        }
    }

    /// Runs `cmd` with the counting PATH; returns 1 (the tool) + the iptables* calls it made.
    pub fn count(&self, mut cmd: Command, stdin: &[u8]) -> usize {
        let _ = std::fs::remove_file(&self.log);
        cmd.env("PATH", &self.counting);
        run_cmd(cmd, stdin);
        1 + std::fs::read_to_string(&self.log)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Runs `cmd` with the plain PATH; returns how long it took.
    pub fn timed(&self, mut cmd: Command, stdin: &[u8]) -> Duration {
        cmd.env("PATH", &self.plain);
        let start = Instant::now();
        run_cmd(cmd, stdin);
        start.elapsed()
    }
}

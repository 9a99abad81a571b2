//! The Debian package (scripts/build-deb.sh), installed with `dpkg -i` into a throwaway root:
//! a private mount and network namespace in which /usr, /etc, /var and /opt are overlays whose
//! upper layers sit on a tmpfs, and /run is a tmpfs. The host's files, dpkg database, systemd
//! (no /run/systemd there: a `systemctl` in /usr/local/sbin stands for a running systemd, logs
//! each call and does enable/disable with `systemctl --root=/`, on files only) and firewall are
//! never touched. In it: install, `natledger selftest`, a live container's rules, remove (the
//! rules stay and are named), purge (they go); at each step the files, enabled units, CNI
//! links, state and rules are checked, and after purge nothing is left but dpkg's own records.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const OVERLAID: [&str; 4] = ["usr", "etc", "var", "opt"];
const UNITS: [&str; 5] = [
    "natledger-boot.service",
    "natledger-runtime@.service",
    "natledger-sweep.service",
    "natledger-sweep.timer",
    "natledger-watch.service",
];
/// The enable symlinks units.sh makes (docker, containerd and crio instances).
const ENABLED: [&str; 5] = [
    "multi-user.target.wants/natledger-boot.service",
    "timers.target.wants/natledger-sweep.timer",
    "docker.service.wants/natledger-runtime@docker.service",
    "containerd.service.wants/natledger-runtime@containerd.service",
    "crio.service.wants/natledger-runtime@crio.service",
];

/// Sets up the throwaway root, then holds the namespaces open.
const SETUP: &str = r#"
set -eu
scratch=$1
mount -t tmpfs tmpfs "$scratch"
for d in usr etc var opt; do
  mkdir "$scratch/$d.up" "$scratch/$d.work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$scratch/$d.up,workdir=$scratch/$d.work" "/$d"
done
mount -t tmpfs -o mode=0755 tmpfs /run
ip link set lo up
echo ready
exec sleep 3600
"#;

/// A `systemctl` for a running systemd that is not the host's: logs the call; enable and
/// disable act on the unit files (`--root=/`, inside the overlays); is-active says only
/// docker.service runs; everything else succeeds doing nothing.
const FAKE_SYSTEMCTL: &str = r#"#!/bin/sh
echo "$*" >> /run/systemctl.log
case $1 in
enable | disable)
  verb=$1; shift
  [ "$1" = --now ] && shift
  exec /usr/bin/systemctl --root=/ --quiet "$verb" "$@" ;;
is-active) [ "$3" = docker.service ] ;;
*) exit 0 ;;
esac
"#;

struct Root {
    holder: Child,
    scratch: tempfile::TempDir,
}

impl Root {
    fn new() -> Root {
        let scratch = tempfile::tempdir().unwrap();
        let mut holder = Command::new("unshare")
            .args([
                "--mount",
                "--net",
                "--propagation",
                "private",
                "--fork",
                "--kill-child",
            ])
            .args(["bash", "-c", SETUP, "setup"])
            .arg(scratch.path())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "namespace setup failed");
        Root { holder, scratch }
    }

    /// The path of `path` as seen inside the throwaway root.
    fn path(&self, path: &str) -> PathBuf {
        // unshare --fork: the holder's child (sleep) is in the namespaces.
        let child = std::fs::read_to_string(format!(
            "/proc/{}/task/{}/children",
            self.holder.id(),
            self.holder.id()
        ))
        .unwrap();
        let pid = child.split_whitespace().next().expect("namespace process");
        PathBuf::from(format!("/proc/{pid}/root{path}"))
    }

    fn run(&self, script: &str) -> Output {
        let ns = self.path("");
        let pid = ns
            .components()
            .nth(2)
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        Command::new("nsenter")
            .args(["-t", pid, "-m", "-n", "--"])
            .args([
                "env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ])
            .args(["bash", "-c", script])
            .output()
            .expect("nsenter")
    }

    fn ok(&self, script: &str) -> String {
        let out = self.run(script);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{script}: {}\n{text}", out.status);
        text
    }

    /// Every path the throwaway root changed (its overlays' upper layers), under `/`.
    fn changed(&self) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        for dir in OVERLAID {
            let upper = self
                .path(&self.scratch.path().to_string_lossy())
                .join(format!("{dir}.up"));
            walk(&upper, &format!("/{dir}"), &mut found);
        }
        found
    }

    fn exists(&self, path: &str) -> bool {
        std::fs::symlink_metadata(self.path(path)).is_ok()
    }

    /// Every rule dump of the namespace: both iptables backends, both families, nftables;
    /// without the `*-save` comment lines, which carry the time of the dump (two dumps a
    /// second apart must compare equal).
    fn rules(&self) -> String {
        self.ok(
            "for t in iptables-legacy ip6tables-legacy iptables-nft ip6tables-nft; do \
             $t-save; done; nft list ruleset",
        )
        .lines()
        .filter(|l| !l.starts_with("# Generated by") && !l.starts_with("# Completed on"))
        .map(|l| format!("{l}\n"))
        .collect()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // The container's sleeper, by the pid this test recorded; then the holder (unshare
        // --kill-child takes its child, and the namespaces, with it).
        if let Ok(pid) = std::fs::read_to_string(self.path("/run/ctr.pid"))
            && let Ok(pid) = pid.trim().parse::<i32>()
        {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

fn walk(dir: &Path, shown: &str, found: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let entry = entry.unwrap();
        let name = format!("{shown}/{}", entry.file_name().to_string_lossy());
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        if meta.is_dir() {
            walk(&entry.path(), &name, found);
        } else {
            found.insert(name);
        }
    }
}

fn build() -> String {
    let out = Command::new(format!("{REPO}/scripts/build-deb.sh"))
        .env("NATLEDGER_BINARY", env!("CARGO_BIN_EXE_natledger"))
        .output()
        .expect("scripts/build-deb.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "build-deb.sh: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout.lines().last().expect("the .deb's path").to_string()
}

/// The package's files (the man pages and completions only once natledger-docs is built).
fn installed_files() -> Vec<String> {
    let mut files: Vec<String> = [
        "/usr/bin/natledger",
        "/usr/bin/natledger-runtime",
        "/usr/share/containers/oci/hooks.d/natledger.json",
        "/usr/share/doc/natledger/README.md",
        "/usr/share/doc/natledger/copyright",
        "/usr/share/doc/natledger/changelog.Debian.gz",
        "/usr/lib/natledger/cni-link.sh",
        "/usr/lib/natledger/units.sh",
    ]
    .map(String::from)
    .into();
    files.extend(UNITS.map(|u| format!("/lib/systemd/system/{u}")));
    files
}

#[test]
fn install_selftest_remove_purge_in_a_throwaway_root() {
    let _suite = crate::one_suite_at_a_time(module_path!());
    let deb = build();
    let root = Root::new();
    // A running systemd (stood in for) and both CNI plugin directories.
    std::fs::write(root.path("/usr/local/sbin/systemctl"), FAKE_SYSTEMCTL).unwrap();
    root.ok("chmod 0755 /usr/local/sbin/systemctl; mkdir -p /run/systemd/system /usr/lib/cni /opt/cni/bin");
    let before = root.changed();
    let rules_before = root.rules();

    // Install.
    root.ok(&format!("dpkg -i {deb}"));
    for file in installed_files() {
        assert!(root.exists(&file), "installed: {file}");
    }
    assert_eq!(
        std::fs::read_link(root.path("/usr/bin/natledger-runtime")).unwrap(),
        Path::new("natledger")
    );
    for cni in ["/usr/lib/cni/natledger", "/opt/cni/bin/natledger"] {
        assert_eq!(
            std::fs::read_link(root.path(cni)).unwrap(),
            Path::new("/usr/bin/natledger"),
            "{cni}"
        );
    }
    let hook =
        std::fs::read_to_string(root.path("/usr/share/containers/oci/hooks.d/natledger.json"))
            .unwrap();
    assert!(hook.contains("\"/usr/bin/natledger\""), "{hook}");
    for unit in UNITS {
        let text =
            std::fs::read_to_string(root.path(&format!("/lib/systemd/system/{unit}"))).unwrap();
        assert!(!text.contains("/usr/local"), "{unit}: {text}");
    }
    for link in ENABLED {
        assert!(
            root.exists(&format!("/etc/systemd/system/{link}")),
            "enabled: {link}"
        );
    }
    let log = std::fs::read_to_string(root.path("/run/systemctl.log")).unwrap();
    for call in [
        "daemon-reload",
        "start natledger-sweep.timer",
        "start natledger-runtime@docker.service",
    ] {
        assert!(log.lines().any(|l| l == call), "systemctl {call}: {log}");
    }
    assert!(!log.contains("start natledger-runtime@crio"), "{log}");
    root.ok("test \"$(stat -c %a /run/natledger)\" = 700");
    root.ok("/usr/bin/natledger --version");

    // The installed binary proves itself (in namespaces of its own, inside this one).
    let selftest = root.ok("/usr/bin/natledger selftest");
    assert_eq!(
        root.rules(),
        rules_before,
        "selftest left rules: {selftest}"
    );

    // A live container (a process in a network namespace of its own, a veth to it) with a
    // forward, as the hook installs it.
    root.ok(
        "set -e; unshare -n sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /run/ctr.pid; sleep 0.2
         pid=$(cat /run/ctr.pid)
         ip link add veth-ctr type veth peer name eth0 netns /proc/$pid/ns/net
         ip addr add 10.77.0.1/24 dev veth-ctr; ip link set veth-ctr up
         nsenter -t $pid -n sh -c 'ip addr add 10.77.0.2/24 dev eth0; ip link set eth0 up; ip link set lo up'
         mkdir -p /run/bundle
         echo '{\"ociVersion\":\"1.0.2\",\"annotations\":{\"io.natledger.ports\":\"18080:80\"}}' > /run/bundle/config.json
         echo \"{\\\"ociVersion\\\":\\\"1.0.2\\\",\\\"id\\\":\\\"pkgtest\\\",\\\"status\\\":\\\"created\\\",\\\"pid\\\":$pid,\\\"bundle\\\":\\\"/run/bundle\\\"}\" |
           /usr/bin/natledger hook create-runtime",
    );
    let live = root.rules();
    assert!(live.contains("natledger:pkgtest"), "{live}");

    // Remove: the hooks, units and links go; the live container's rules stay and are named.
    let removed = root.ok("dpkg -r natledger");
    assert!(
        removed.contains("pkgtest"),
        "remove names what remains: {removed}"
    );
    assert!(removed.contains("dpkg --purge natledger"), "{removed}");
    for file in installed_files() {
        assert!(!root.exists(&file), "removed: {file}");
    }
    for gone in ["/usr/lib/cni/natledger", "/opt/cni/bin/natledger"] {
        assert!(!root.exists(gone), "{gone}");
    }
    for link in ENABLED {
        assert!(
            !root.exists(&format!("/etc/systemd/system/{link}")),
            "still enabled: {link}"
        );
    }
    let log = std::fs::read_to_string(root.path("/run/systemctl.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.starts_with("disable --now natledger-boot.service")),
        "{log}"
    );
    assert_eq!(root.rules(), live, "remove kept the live container's rules");
    assert!(root.exists("/run/natledger"));
    assert!(root.exists("/var/lib/natledger/natledger"));
    root.ok("dpkg -s natledger | grep -qx 'Status: deinstall ok config-files'");

    // Purge: every natledger rule goes, then the state and the kept binary.
    root.ok("dpkg --purge natledger");
    let after = root.rules();
    assert!(!after.contains("natledger"), "{after}");
    assert!(!root.exists("/run/natledger"));
    assert!(!root.exists("/var/lib/natledger"));
    assert!(!root.run("dpkg -s natledger").status.success());
    // What the throwaway root still holds that it did not before: dpkg's own records only,
    // and man-db's index, which its dpkg trigger rebuilds for any package with man pages.
    let left: Vec<String> = root
        .changed()
        .difference(&before)
        .filter(|p| {
            !p.starts_with("/var/lib/dpkg/")
                && !p.starts_with("/var/cache/man/")
                && p.as_str() != "/var/log/dpkg.log"
        })
        .cloned()
        .collect();
    assert!(left.is_empty(), "left after purge: {left:#?}");
}

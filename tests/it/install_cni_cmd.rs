//! `natledger install-cni`, the real binary, against temp dirs shaped like a node's:
//! containerd's (`/opt/cni/bin` with the reference plugins, `10-containerd-net.conflist` with
//! bridge and portmap) and a CRI-O host's (`/usr/libexec/cni`; CRI-O's own bridge conflist,
//! which chains no portmap, podman's `87-podman-bridge.conflist`, which does, and a
//! single-plugin loopback `.conf`). Proves: the binary lands as `natledger`, byte-identical and
//! runnable; only portmap's `type` changes, the original kept as a backup libcni does not load;
//! a second run changes nothing and says so; `--uninstall` gives back every original byte and
//! removes what it installed, but keeps the binary while the state directory records CNI
//! attachments or when the state directory is missing (not the node's); a conflist libcni could not load either is warned about by name, never
//! rewritten, and the run still exits 0. No
//! namespace, no firewall.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;

/// containerd's `10-containerd-net.conflist` (its `script/setup/install-cni`).
const CONTAINERD_NET: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "containerd-net",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "promiscMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [
          [{
            "subnet": "10.88.0.0/16"
          }],
          [{
            "subnet": "2001:4860:4860::/64"
          }]
        ],
        "routes": [
          { "dst": "0.0.0.0/0" },
          { "dst": "::/0" }
        ]
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}
"#;

/// CRI-O's `11-crio-ipv4-bridge.conflist`: CRI-O maps host ports itself, no portmap.
const CRIO_BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "crio",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "routes": [
            { "dst": "0.0.0.0/0" }
        ],
        "ranges": [
            [{ "subnet": "10.85.0.0/16" }]
        ]
      }
    }
  ]
}
"#;

/// podman's CNI network on the same host.
const PODMAN_BRIDGE: &str = r#"{
   "cniVersion": "0.4.0",
   "name": "podman",
   "plugins": [
      {
         "type": "bridge",
         "bridge": "cni-podman0",
         "isGateway": true,
         "ipMasq": true,
         "hairpinMode": true,
         "ipam": {
            "type": "host-local",
            "routes": [{ "dst": "0.0.0.0/0" }],
            "ranges": [[{ "subnet": "10.88.0.0/16", "gateway": "10.88.0.1" }]]
         }
      },
      {
         "type": "portmap",
         "capabilities": {
            "portMappings": true
         }
      },
      {
         "type": "firewall"
      },
      {
         "type": "tuning"
      }
   ]
}
"#;

const LOOPBACK: &str =
    "{\n    \"cniVersion\": \"0.3.1\",\n    \"name\": \"lo\",\n    \"type\": \"loopback\"\n}\n";

struct Root {
    dir: tempfile::TempDir,
    bin: PathBuf,
    conf: PathBuf,
}

impl Root {
    fn new(bin: &str, files: &[(&str, &str)]) -> Root {
        let dir = tempfile::tempdir().unwrap();
        let (bin, conf) = (dir.path().join(bin), dir.path().join("etc/cni/net.d"));
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&conf).unwrap();
        for plugin in ["bridge", "host-local", "portmap", "loopback"] {
            std::fs::write(bin.join(plugin), format!("#!/bin/sh\n# {plugin}\n")).unwrap();
        }
        for (name, text) in files {
            std::fs::write(conf.join(name), text).unwrap();
        }
        Root { dir, bin, conf }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("run/natledger")
    }

    fn run(&self, extra: &[&str]) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.arg("--state-dir").arg(self.state()).arg("install-cni");
        cmd.arg("--bin-dir")
            .arg(&self.bin)
            .arg("--conf-dir")
            .arg(&self.conf);
        cmd.args(extra).env_remove("NATLEDGER_HOST_ROOT");
        cmd.output().unwrap()
    }

    /// Every file under the root with its bytes, but the state directory's (install makes it;
    /// it is natledger's own, not the node's CNI configuration) and install-cni's lock file.
    fn tree(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, found: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.ends_with("run") || path.ends_with(".natledger.install-cni.lock") {
                    continue;
                }
                if path.is_dir() {
                    walk(&path, found);
                } else {
                    found.insert(path.clone(), std::fs::read(&path).unwrap());
                }
            }
        }
        let mut found = BTreeMap::new();
        walk(self.dir.path(), &mut found);
        found
    }

    fn conf(&self, name: &str) -> PathBuf {
        self.conf.join(name)
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The switched text: `"type": "portmap"` (as spelt in `text`) now natledger's.
fn switched(text: &str, spelt: &str) -> String {
    assert_eq!(text.matches(spelt).count(), 1);
    text.replace(spelt, &spelt.replace("portmap", "natledger"))
}

#[test]
fn containerd_node_install_again_and_uninstall() {
    let root = Root::new(
        "opt/cni/bin",
        &[("10-containerd-net.conflist", CONTAINERD_NET)],
    );
    let start = root.tree();
    let conflist = root.conf("10-containerd-net.conflist");
    let plugin = root.bin.join("natledger");

    let out = root.run(&[]);
    assert_ok(&out, "install-cni");
    assert_eq!(
        stdout(&out),
        format!(
            "{}: installed\n{}: portmap switched to natledger (1 plugin), original kept as \
             {}.natledger-backup\n",
            plugin.display(),
            conflist.display(),
            conflist.display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(&conflist).unwrap(),
        switched(CONTAINERD_NET, r#""type": "portmap""#)
    );
    let backup = PathBuf::from(format!("{}.natledger-backup", conflist.display()));
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), CONTAINERD_NET);
    assert_eq!(std::fs::read(&plugin).unwrap(), std::fs::read(BIN).unwrap());
    let version = Command::new(&plugin).arg("--version").output().unwrap();
    assert_ok(&version, "the installed plugin runs");
    // The other plugins are as they were.
    for name in ["bridge", "host-local", "portmap", "loopback"] {
        let path = root.bin.join(name);
        assert_eq!(root.tree()[&path], start[&path]);
    }

    // Again: nothing written, and it says so.
    let installed = root.tree();
    let out = root.run(&[]);
    assert_ok(&out, "install-cni again");
    assert!(
        stdout(&out).ends_with("install-cni: nothing to change\n"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("already natledger, unchanged"));
    assert_eq!(root.tree(), installed);

    // Uninstall: every original byte back, nothing of install-cni's left.
    let out = root.run(&["--uninstall"]);
    assert_ok(&out, "install-cni --uninstall");
    assert_eq!(
        stdout(&out),
        format!(
            "{}: natledger switched back to portmap (1 plugin), backup removed\n{}: removed\n",
            conflist.display(),
            plugin.display()
        )
    );
    assert_eq!(root.tree(), start);
    let out = root.run(&["--uninstall"]);
    assert_ok(&out, "install-cni --uninstall again");
    assert!(stdout(&out).ends_with("install-cni: nothing to change\n"));
}

#[test]
fn crio_node_only_the_chain_with_portmap_switches() {
    let root = Root::new(
        "usr/libexec/cni",
        &[
            ("11-crio-ipv4-bridge.conflist", CRIO_BRIDGE),
            ("87-podman-bridge.conflist", PODMAN_BRIDGE),
            ("99-loopback.conf", LOOPBACK),
        ],
    );
    let start = root.tree();
    let out = root.run(&[]);
    assert_ok(&out, "install-cni");
    let said = stdout(&out);
    for (name, what) in [
        (
            "11-crio-ipv4-bridge.conflist",
            "no portmap plugin, unchanged",
        ),
        (
            "87-podman-bridge.conflist",
            "portmap switched to natledger (1 plugin)",
        ),
        ("99-loopback.conf", "one plugin, not a chain, unchanged"),
    ] {
        let line = format!("{}: {what}", root.conf(name).display());
        assert!(said.contains(&line), "{line} in:\n{said}");
    }
    assert_eq!(said.lines().count(), 4, "{said}");
    let podman = root.conf("87-podman-bridge.conflist");
    assert_eq!(
        std::fs::read_to_string(&podman).unwrap(),
        switched(PODMAN_BRIDGE, r#""type": "portmap""#)
    );
    for name in ["11-crio-ipv4-bridge.conflist", "99-loopback.conf"] {
        assert_eq!(root.tree()[&root.conf(name)], start[&root.conf(name)]);
    }

    // A pod of that network is recorded: uninstall switches back but keeps the binary and
    // says what to run.
    let containers = root.state().join("containers");
    std::fs::create_dir_all(&containers).unwrap();
    std::fs::write(
        root.state().join("natledger-state"),
        "natledger state directory, layout 1\n",
    )
    .unwrap();
    let manifest = serde_json::json!({
        "schema": 1, "container_id": "abc+eth0", "phase": "installed",
        "mappings": [], "addresses": [], "rules": [],
        "cni": {"container_id": "abc", "ifname": "eth0", "network": "podman",
                "netns_path": "/run/netns/cni-1"}
    });
    std::fs::write(containers.join("abc+eth0.json"), manifest.to_string()).unwrap();
    let out = root.run(&["--uninstall"]);
    assert_ok(&out, "install-cni --uninstall with an attachment recorded");
    assert_eq!(std::fs::read_to_string(&podman).unwrap(), PODMAN_BRIDGE);
    assert!(root.bin.join("natledger").exists());
    let warned = stderr(&out);
    assert!(
        warned.contains("natledger: kept: ")
            && warned.contains("records 1 CNI attachment")
            && warned.contains("natledger sweep"),
        "{warned}"
    );
    std::fs::remove_file(containers.join("abc+eth0.json")).unwrap();
    assert_ok(
        &root.run(&["--uninstall"]),
        "install-cni --uninstall, none recorded",
    );
    assert!(!root.bin.join("natledger").exists());
}

/// A file libcni could not load either (trailing garbage, a BOM, two `type` keys, over
/// 1 MiB) is warned about by name and left unchanged; it breaks no pod natledger could fix, so
/// the run (a DaemonSet's init container) still succeeds.
#[test]
fn a_malformed_conflist_is_warned_about_by_name_never_rewritten_and_exits_0() {
    let broken = "{\"cniVersion\": \"1.0.0\", \"plugins\": [{\"type\": \"portmap\"},]}\n";
    let refused_option = CONTAINERD_NET.replace(
        r#""capabilities": {"portMappings": true}"#,
        r#""capabilities": {"portMappings": true}, "masqAll": true"#,
    );
    let bom = format!("\u{feff}{CONTAINERD_NET}");
    let garbage = format!("{CONTAINERD_NET}}}");
    let two_types =
        r#"{"cniVersion":"1.0.0","name":"t","plugins":[{"type":"bridge","type":"macvlan"}]}"#;
    let huge = format!(
        "{{\"cniVersion\":\"1.0.0\",\"name\":\"h\",\"x\":\"{}\",\"plugins\":[{{\"type\":\"bridge\"}}]}}",
        "a".repeat(1 << 20)
    );
    let root = Root::new(
        "opt/cni/bin",
        &[
            ("05-broken.conflist", broken),
            ("06-bom.conflist", &bom),
            ("07-garbage.conflist", &garbage),
            ("08-two-types.conflist", two_types),
            ("09-huge.conflist", &huge),
            ("10-containerd-net.conflist", CONTAINERD_NET),
            ("20-masq.conflist", &refused_option),
        ],
    );
    let out = root.run(&[]);
    assert_ok(&out, "install-cni with unreadable conflists");
    let said = stderr(&out);
    let broken_path = root.conf("05-broken.conflist");
    assert!(
        said.contains(&format!(
            "natledger: warning: {}: refused, left unchanged: not valid JSON",
            broken_path.display()
        )),
        "{said}"
    );
    for name in [
        "06-bom.conflist",
        "07-garbage.conflist",
        "08-two-types.conflist",
    ] {
        let line = format!(
            "natledger: warning: {}: refused, left unchanged",
            root.conf(name).display()
        );
        assert!(said.contains(&line), "{line} in:\n{said}");
    }
    assert!(said.contains(&format!(
        "natledger: warning: {}: larger than",
        root.conf("09-huge.conflist").display()
    )));
    assert!(said.contains(&format!(
        "natledger: warning: {}: left on portmap",
        root.conf("20-masq.conflist").display()
    )));
    assert!(said.contains("masqAll"), "{said}");
    assert!(!said.contains("error"), "{said}");
    for (name, text) in [
        ("06-bom.conflist", bom.as_str()),
        ("07-garbage.conflist", &garbage),
        ("08-two-types.conflist", two_types),
        ("09-huge.conflist", &huge),
    ] {
        assert_eq!(std::fs::read_to_string(root.conf(name)).unwrap(), text);
    }
    assert_eq!(std::fs::read_to_string(&broken_path).unwrap(), broken);
    assert_eq!(
        std::fs::read_to_string(root.conf("20-masq.conflist")).unwrap(),
        refused_option
    );
    // The good one was still switched.
    assert!(
        std::fs::read_to_string(root.conf("10-containerd-net.conflist"))
            .unwrap()
            .contains(r#""type": "natledger""#)
    );
    let names: Vec<String> = std::fs::read_dir(&root.conf)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 8, "one backup, no temp file: {names:?}");
}

/// `--uninstall` run without the node's state directory (a Job without `/run/natledger`
/// mounted) cannot tell whether pods still need the plugin: it switches back but keeps the
/// binary and says why and what to run; with the directory there, it removes it.
#[test]
fn uninstall_without_the_state_directory_keeps_the_binary() {
    let root = Root::new(
        "opt/cni/bin",
        &[("10-containerd-net.conflist", CONTAINERD_NET)],
    );
    assert_ok(&root.run(&[]), "install-cni");
    assert!(
        root.state().join("natledger-state").exists(),
        "install makes it"
    );
    std::fs::remove_dir_all(root.state()).unwrap();
    let out = root.run(&["--uninstall"]);
    assert_ok(&out, "install-cni --uninstall without the state dir");
    assert_eq!(
        std::fs::read_to_string(root.conf("10-containerd-net.conflist")).unwrap(),
        CONTAINERD_NET
    );
    assert!(root.bin.join("natledger").exists());
    let warned = stderr(&out);
    assert!(
        warned.contains(&format!(
            "natledger: kept: the state directory {} does not exist",
            root.state().display()
        )) && warned.contains("mkdir"),
        "{warned}"
    );
    std::fs::create_dir_all(root.state()).unwrap();
    assert_ok(&root.run(&["--uninstall"]), "install-cni --uninstall again");
    assert!(!root.bin.join("natledger").exists());
}

//! install-cni over temp dirs: the conflist edit (only the type's bytes change, the backup,
//! a second run, what is refused or left alone: a file it cannot read, two portmaps, Multus
//! delegates), and which binary is ever replaced. The uninstall, the lock and a crash during an
//! upgrade: `tests/uninstall.rs`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;

mod uninstall;

/// containerd's `10-containerd-net.conflist`, as its install script writes it.
const CONTAINERD: &str = r#"{
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
          }]
        ],
        "routes": [
          { "dst": "0.0.0.0/0" }
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

struct Host {
    _dir: tempfile::TempDir,
    bin: PathBuf,
    conf: PathBuf,
    state: PathBuf,
    exe: PathBuf,
}

fn host() -> Host {
    let dir = tempfile::tempdir().unwrap();
    let at = |p: &str| dir.path().join(p);
    let (bin, conf) = (at("opt/cni/bin"), at("etc/cni/net.d"));
    fs::create_dir_all(&bin).unwrap();
    fs::create_dir_all(&conf).unwrap();
    let exe = at("natledger-build");
    fs::write(&exe, b"\x7fELF natledger build 1").unwrap();
    Host {
        bin,
        conf,
        state: at("run/natledger"),
        exe,
        _dir: dir,
    }
}

impl Host {
    fn run(&self, uninstall: bool) -> Report {
        let opts = Options {
            bin_dir: self.bin.clone(),
            conf_dir: self.conf.clone(),
            uninstall,
            source: self.exe.clone(),
        };
        run(&opts, &Ledger::new(&self.state)).unwrap()
    }

    fn conf(&self, name: &str) -> PathBuf {
        self.conf.join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        fs::write(self.conf(name), text).unwrap();
        self.conf(name)
    }

    /// Every file of the conf dir, and the bin dir's, with their bytes.
    fn files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        for dir in [&self.conf, &self.bin] {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.ends_with(binary::LOCK) {
                    continue;
                }
                let bytes = fs::read(&path).unwrap_or_default();
                files.push((path, bytes));
            }
        }
        files.sort();
        files
    }
}

fn conflist_done(report: &Report, path: &Path) -> Conflist {
    report
        .lines
        .iter()
        .find_map(|line| match line {
            Done::Conflist(p, done) if p == path => Some(done.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no line for {}: {report:?}", path.display()))
}

fn binary_done(report: &Report) -> &Binary {
    report
        .lines
        .iter()
        .find_map(|line| match line {
            Done::Binary(_, done) => Some(done),
            _ => None,
        })
        .expect("a line for the binary")
}

#[test]
fn only_the_type_changes_and_the_original_is_kept_before() {
    let host = host();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    let report = host.run(false);
    assert_eq!(*binary_done(&report), Binary::Installed);
    assert_eq!(
        conflist_done(&report, &path),
        Conflist::Switched { count: 1 }
    );
    assert!(report.changed() && report.refused.is_empty());
    let want = CONTAINERD.replace(r#""type": "portmap""#, r#""type": "natledger""#);
    assert_eq!(fs::read_to_string(&path).unwrap(), want);
    assert_eq!(fs::read_to_string(backup(&path)).unwrap(), CONTAINERD);
    let plugin = host.bin.join("natledger");
    assert_eq!(fs::read(&plugin).unwrap(), fs::read(&host.exe).unwrap());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&plugin).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    // No temp file left, and the backup's name is none libcni loads.
    assert_eq!(conflists(&host.conf).unwrap(), std::slice::from_ref(&path));
    let names: Vec<String> = host
        .files()
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("tmp")), "{names:?}");

    // Again: nothing written, and the report says so.
    let before = host.files();
    let again = host.run(false);
    assert!(!again.changed(), "{again:?}");
    assert_eq!(*binary_done(&again), Binary::Unchanged);
    assert_eq!(conflist_done(&again, &path), Conflist::AlreadyNatledger);
    assert_eq!(host.files(), before);
}

/// Whatever the formatting (compact, escapes, number spellings, odd key order, a `type` key
/// that is not first), every byte but the type's stays.
#[test]
fn every_other_byte_stays_whatever_the_formatting() {
    let host = host();
    let text = "{\"plugins\":[{\"z\":1.0e2,\"name\":\"\\u00e9\",\"type\":\"flannel\",\"delegate\":{\"type\":\"portmap\"}},\n\t{ \"capabilities\" : { \"portMappings\" : true } , \"type\" :\"portmap\" ,\"backend\":\"iptables\"}],\"name\":\"cbr0\",\"cniVersion\":\"0.3.1\"}";
    let path = host.write("10-flannel.conflist", text);
    host.run(false);
    let want = text.replace("\"type\" :\"portmap\"", "\"type\" :\"natledger\"");
    assert_ne!(want, text);
    assert_eq!(fs::read_to_string(&path).unwrap(), want);
}

#[test]
fn a_conf_with_a_plugins_list_is_a_chain_and_others_are_left_alone() {
    let host = host();
    let listed = host.write("20-crio.conf", CONTAINERD);
    let single = host.write(
        "30-one.conf",
        r#"{"cniVersion":"0.4.0","name":"one","type":"bridge"}"#,
    );
    let none = host.write(
        "40-none.conflist",
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"tuning"}]}"#,
    );
    let ignored = host.write("50-x.conflist.disabled", CONTAINERD);
    let report = host.run(false);
    assert_eq!(
        conflist_done(&report, &listed),
        Conflist::Switched { count: 1 }
    );
    assert_eq!(conflist_done(&report, &single), Conflist::NotAList);
    assert_eq!(conflist_done(&report, &none), Conflist::NoPortmap);
    assert!(!backup(&none).exists() && !backup(&single).exists());
    assert_eq!(fs::read_to_string(&ignored).unwrap(), CONTAINERD);
    assert_eq!(report.lines.len(), 4, "{report:?}");
}

/// A portmap natledger would refuse stays portmap, with a warning line naming the file and
/// why; nothing is written for it.
#[test]
fn a_portmap_natledger_refuses_is_left_on_portmap() {
    for (option, word) in [
        (r#""snat": false"#, "snat"),
        (r#""masqAll": true"#, "masqAll"),
        (r#""conditionsV4": ["-s", "10.0.0.0/8"]"#, "conditionsV4"),
        (r#""conditionsV6": ["-s", "fd00::/8"]"#, "conditionsV6"),
        (r#""snat": "no""#, "expected a boolean"),
    ] {
        let host = host();
        let text = CONTAINERD.replace(
            r#""capabilities": {"portMappings": true}"#,
            &format!(r#""capabilities": {{"portMappings": true}}, {option}"#),
        );
        let path = host.write("10-containerd-net.conflist", &text);
        let report = host.run(false);
        let done = conflist_done(&report, &path);
        assert!(
            matches!(&done, Conflist::Refused { plugin: 1, why } if why.contains(word)),
            "{option}: {done:?}"
        );
        let line = report.lines.iter().find(|l| l.warning()).unwrap();
        assert!(
            line.to_string()
                .starts_with(&format!("{}: left on portmap", path.display()))
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
        assert!(!backup(&path).exists());
    }
}

/// A file libcni could not load either is refused by name and never rewritten; the others are
/// still switched.
#[test]
fn malformed_files_are_refused_by_name_never_rewritten() {
    let host = host();
    let good = host.write("10-containerd-net.conflist", CONTAINERD);
    let cases = [
        (
            "20-a.conflist",
            "{\"plugins\": [{\"type\": \"portmap\"}",
            "not valid JSON",
        ),
        (
            "21-b.conflist",
            r#"{"plugins": {"type": "portmap"}}"#,
            "plugins is not a list",
        ),
        (
            "22-c.conflist",
            r#"{"plugins": ["portmap"]}"#,
            "plugin 0: not a JSON object",
        ),
        (
            "23-d.conflist",
            r#"{"plugins": [{"type": "portmap", "type": "bridge"}]}"#,
            "plugin 0: two type keys",
        ),
        ("24-e.conflist", r#"{"type": "portmap"}"#, "no plugins list"),
        (
            "25-f.json",
            r#"{"plugins": [{"type": 7}]}"#,
            "plugin 0: type is not a string",
        ),
        ("26-g.conflist", r#"["portmap"]"#, "not a JSON object"),
    ];
    for (name, text, _) in &cases {
        host.write(name, text);
    }
    fs::write(host.conf("27-h.conflist"), b"{\"plugins\": [\xff]}").unwrap();
    let report = host.run(false);
    assert_eq!(
        conflist_done(&report, &good),
        Conflist::Switched { count: 1 }
    );
    let refused: Vec<String> = report
        .refused
        .iter()
        .map(|e| crate::causes::text(e))
        .collect();
    assert_eq!(refused.len(), cases.len() + 1, "{refused:?}");
    for ((name, text, why), line) in cases.iter().zip(&refused) {
        let path = host.conf(name);
        assert!(
            line.starts_with(&format!(
                "{}: refused, left unchanged: {why}",
                path.display()
            )),
            "{line}"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), *text);
        assert!(!backup(&path).exists());
    }
    assert!(
        refused[cases.len()].contains("27-h.conflist: refused"),
        "{refused:?}"
    );
}

#[test]
fn a_symlinked_conflist_and_one_chaining_both_are_left_alone() {
    let host = host();
    let target = host._dir.path().join("elsewhere.conflist");
    fs::write(&target, CONTAINERD).unwrap();
    let link = host.conf("10-link.conflist");
    symlink(&target, &link).unwrap();
    let both = CONTAINERD.replace(
        r#""capabilities""#,
        r#""x": 1}, {"type": "natledger", "capabilities""#,
    );
    let both_path = host.write("20-both.conflist", &both);
    let report = host.run(false);
    assert_eq!(conflist_done(&report, &link), Conflist::Link);
    assert_eq!(conflist_done(&report, &both_path), Conflist::Both);
    assert_eq!(fs::read_to_string(&target).unwrap(), CONTAINERD);
    assert_eq!(fs::read_to_string(&both_path).unwrap(), both);
}

/// An operator's own file or link at BIN_DIR/natledger is never replaced nor removed; the
/// conflists still switch (a natledger is there).
#[test]
fn an_operators_binary_or_link_is_never_replaced_or_removed() {
    let host = host();
    let plugin = host.bin.join("natledger");
    symlink("/usr/bin/natledger", &plugin).unwrap();
    let path = host.write("10-containerd-net.conflist", CONTAINERD);
    let report = host.run(false);
    assert_eq!(*binary_done(&report), Binary::NotOurs("a link"));
    assert_eq!(
        conflist_done(&report, &path),
        Conflist::Switched { count: 1 }
    );
    let report = host.run(true);
    assert_eq!(*binary_done(&report), Binary::NotOurs("a link"));
    assert_eq!(
        fs::read_link(&plugin).unwrap(),
        PathBuf::from("/usr/bin/natledger")
    );

    let host = self::host();
    let plugin = host.bin.join("natledger");
    fs::write(&plugin, b"an operator's build").unwrap();
    let report = host.run(false);
    assert!(matches!(binary_done(&report), Binary::NotOurs(_)));
    host.run(true);
    assert_eq!(fs::read(&plugin).unwrap(), b"an operator's build");
    // The same bytes as this binary, not written by install-cni: unchanged, and kept.
    fs::copy(&host.exe, &plugin).unwrap();
    assert_eq!(*binary_done(&host.run(false)), Binary::Unchanged);
    assert!(matches!(binary_done(&host.run(true)), Binary::NotOurs(_)));
    assert!(plugin.exists());
}

/// A newer build replaces the file install-cni wrote; one changed by someone since is theirs.
#[test]
fn install_cni_replaces_its_own_binary_only() {
    let host = host();
    host.run(false);
    fs::write(&host.exe, b"\x7fELF natledger build 2").unwrap();
    assert_eq!(*binary_done(&host.run(false)), Binary::Installed);
    let plugin = host.bin.join("natledger");
    assert_eq!(fs::read(&plugin).unwrap(), b"\x7fELF natledger build 2");
    fs::write(&plugin, b"patched by hand").unwrap();
    assert!(matches!(binary_done(&host.run(false)), Binary::NotOurs(_)));
    assert!(matches!(binary_done(&host.run(true)), Binary::NotOurs(_)));
    assert_eq!(fs::read(&plugin).unwrap(), b"patched by hand");
}

#[test]
fn a_missing_directory_is_an_error_naming_it() {
    let host = host();
    let opts = Options {
        bin_dir: host.bin.join("missing"),
        conf_dir: host.conf.clone(),
        uninstall: false,
        source: host.exe.clone(),
    };
    let e = run(&opts, &Ledger::new(&host.state)).unwrap_err();
    assert!(
        e.to_string()
            .contains(&host.bin.join("missing").display().to_string()),
        "{e}"
    );
    let opts = Options {
        bin_dir: host.bin.clone(),
        conf_dir: host.conf.join("missing"),
        ..opts
    };
    let e = run(&opts, &Ledger::new(&host.state)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("read directory {}", host.conf.join("missing").display())
    );
}

/// A list whose cniVersion natledger does not implement (absent is 0.1.0, as libcni and the
/// plugins read it) stays on portmap: switched, every ADD through it would fail.
#[test]
fn a_cni_version_natledger_does_not_implement_is_left_on_portmap() {
    let host = host();
    let old = host.write(
        "10-old.conflist",
        &CONTAINERD.replace("\"1.0.0\"", "\"0.2.0\""),
    );
    let none = host.write(
        "20-none.conflist",
        &CONTAINERD.replace("\"cniVersion\": \"1.0.0\",", ""),
    );
    let newer = host.write(
        "30-newer.conflist",
        &CONTAINERD.replace("\"1.0.0\"", "\"1.2.0\""),
    );
    let fine = host.write(
        "40-fine.conflist",
        &CONTAINERD.replace("\"1.0.0\"", "\"0.3.1\""),
    );
    let report = host.run(false);
    for path in [&old, &none, &newer] {
        let Conflist::Refused { plugin: 1, why } = conflist_done(&report, path) else {
            panic!("{}: {report:?}", path.display())
        };
        assert!(why.contains("natledger supports"), "{why}");
        assert!(fs::read_to_string(path).unwrap().contains("portmap"));
        assert!(!backup(path).exists());
    }
    assert_eq!(
        conflist_done(&report, &fine),
        Conflist::Switched { count: 1 }
    );
}

/// Two portmap plugins in one chain stay portmap (natledger twice for one attachment would
/// collide in the ledger), with a warning; a Multus configuration whose delegates chain portmap
/// is said to be one, not "one plugin".
#[test]
fn two_portmaps_and_multus_delegates_are_left_alone_and_said() {
    let host = host();
    let two = CONTAINERD.replace(
        r#""capabilities": {"portMappings": true}"#,
        r#""capabilities": {"portMappings": true}}, {"type": "portmap""#,
    );
    let two_path = host.write("10-two.conflist", &two);
    let multus = r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus",
        "delegates":[{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[
        {"type":"calico"},{"type":"portmap","capabilities":{"portMappings":true}}]}],
        "kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig"}"#;
    let multus_path = host.write("00-multus.conf", multus);
    let report = host.run(false);
    assert_eq!(
        conflist_done(&report, &two_path),
        Conflist::Several { count: 2 }
    );
    assert_eq!(
        conflist_done(&report, &multus_path),
        Conflist::Delegates { portmap: true }
    );
    for line in report
        .lines
        .iter()
        .filter(|l| matches!(l, Done::Conflist(..)))
    {
        assert!(line.warning(), "{line}");
    }
    let said: Vec<String> = report.lines.iter().map(ToString::to_string).collect();
    assert!(
        said.iter().any(|l| l.contains(
            "Multus configuration, its delegates (one chains \
             portmap) are not switched"
        )),
        "{said:?}"
    );
    assert!(said.iter().any(|l| l.contains("2 portmap")), "{said:?}");
    assert_eq!(fs::read_to_string(&two_path).unwrap(), two);
    assert_eq!(fs::read_to_string(&multus_path).unwrap(), multus);
    assert!(!backup(&two_path).exists() && !backup(&multus_path).exists());
    // A Multus file whose delegates chain no portmap: said, no warning.
    let host = self::host();
    let path = host.write("00-multus.conf", &multus.replace("portmap", "tuning"));
    let report = host.run(false);
    assert_eq!(
        conflist_done(&report, &path),
        Conflist::Delegates { portmap: false }
    );
}

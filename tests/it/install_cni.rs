//! scripts/cni-link.sh, as install.sh and uninstall.sh run it, under a temporary ROOT: the
//! `natledger` link goes into each CNI plugin directory that exists and nowhere else, a second
//! install changes nothing, remove takes out only its own link, and an operator's own file or
//! link at that name is left alone. No namespace, no firewall.

use std::path::{Path, PathBuf};
use std::process::Output;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cni-link.sh");
const BINARY: &str = "/usr/local/bin/natledger";
const DIRS: [&str; 2] = ["usr/lib/cni", "opt/cni/bin"];

fn run(root: &Path, action: &str) -> Output {
    let out = std::process::Command::new("bash")
        .args([SCRIPT, action, BINARY])
        .env("ROOT", root)
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "cni-link.sh {action}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every entry under `root` (relative path, and the link target for links), sorted.
fn tree(root: &Path) -> Vec<(PathBuf, Option<PathBuf>)> {
    fn walk(root: &Path, dir: &Path, found: &mut Vec<(PathBuf, Option<PathBuf>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let target = meta
                .file_type()
                .is_symlink()
                .then(|| std::fs::read_link(&path).unwrap());
            found.push((path.strip_prefix(root).unwrap().to_path_buf(), target));
            if meta.is_dir() {
                walk(root, &path, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(root, root, &mut found);
    found.sort();
    found
}

fn root_with(dirs: &[&str]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for dir in dirs {
        std::fs::create_dir_all(root.path().join(dir)).unwrap();
        std::fs::write(root.path().join(dir).join("portmap"), "plugin").unwrap();
    }
    root
}

/// The link goes into each existing CNI directory and nowhere else, a second install changes
/// nothing, and remove takes out only its own link.
#[test]
fn links_into_each_existing_cni_dir_idempotently_and_removes_only_its_link() {
    for present in [&DIRS[..], &DIRS[..1], &DIRS[1..], &[][..]] {
        let root = root_with(present);
        let before = tree(root.path());
        run(root.path(), "install");
        for dir in DIRS {
            let link = root.path().join(dir).join("natledger");
            if present.contains(&dir) {
                assert_eq!(
                    std::fs::read_link(&link).ok(),
                    Some(PathBuf::from(BINARY)),
                    "{dir} of {present:?}"
                );
            } else {
                assert!(!root.path().join(dir).exists(), "{dir} made: {present:?}");
            }
        }
        let installed = tree(root.path());
        assert_eq!(
            installed.len(),
            before.len() + present.len(),
            "{present:?}: {installed:#?}"
        );
        run(root.path(), "install");
        assert_eq!(
            tree(root.path()),
            installed,
            "a second install: {present:?}"
        );
        run(root.path(), "remove");
        assert_eq!(tree(root.path()), before, "remove: {present:?}");
        run(root.path(), "remove");
        assert_eq!(tree(root.path()), before, "a second remove: {present:?}");
    }
}

/// An operator's own file or link named `natledger` in a CNI directory is left alone by install
/// and remove.
#[test]
fn an_operators_own_natledger_plugin_is_left_alone() {
    let root = root_with(&DIRS);
    let copy = root.path().join(DIRS[0]).join("natledger");
    std::fs::write(&copy, "an operator's copy").unwrap();
    std::os::unix::fs::symlink(
        "/opt/natledger/bin/natledger",
        root.path().join(DIRS[1]).join("natledger"),
    )
    .unwrap();
    let before = tree(root.path());
    for action in ["install", "remove"] {
        let out = run(root.path(), action);
        assert_eq!(tree(root.path()), before, "{action}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.matches("left alone").count(),
            2,
            "{action}: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&copy).unwrap(),
        "an operator's copy"
    );
}

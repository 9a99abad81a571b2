//! Manifests written by an earlier release (`tests/fixtures/manifests/`, one per backend:
//! IPv4 and IPv6, a single port, a udp range, shifted on iptables) are still this release's
//! format and are removed exactly:
//!
//! - `a_release_manifest_is_removed_exactly`: per backend, on a warmed-up node, this release
//!   creates the same container (same id, ports and addresses) and records exactly the
//!   fixture's rules; its manifest is then replaced by the fixture's bytes (whose process is
//!   long gone), and a poststop naming no pid removes every rule (full dump as before) and
//!   the manifest.
//! - `generate` (ignored): writes the fixtures with the binary in `NATLEDGER_FIXTURE_BIN`
//!   (a release build), in a fresh namespace per backend.
//!
//! That the library reads each fixture and stores it again byte for byte is a unit test
//! (`ledger::tests`).

use std::path::PathBuf;

use crate::common::*;

/// A udp range too: shifted on iptables, the same ports on nftables (its nat has no offset).
fn ports(backend: Backend) -> (&'static str, &'static str) {
    match backend {
        Backend::OwnNftables => ("io.natledger.ports", "8080:80,9000-9002:9000-9002/udp"),
        _ => ("io.natledger.ports", "8080:80,9000-9002:7000-7002/udp"),
    }
}
const IP: (&str, &str) = ("io.natledger.ip", "10.77.0.9,fd77::9");

fn fixture(backend: Backend) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/manifests")
        .join(format!("{}.json", id(backend)))
}

fn id(backend: Backend) -> String {
    format!("release-{}", backend.name())
}

#[test]
#[ignore = "writes tests/fixtures/manifests with NATLEDGER_FIXTURE_BIN"]
fn generate() {
    let bin = std::env::var("NATLEDGER_FIXTURE_BIN").expect("NATLEDGER_FIXTURE_BIN");
    both(|backend| {
        let node = Node::new(backend);
        node.warm_up();
        let id = id(backend);
        let bundle = node.bundle(&id, &[ports(backend), IP]);
        let pid = node.stand_in(&id);
        let state = serde_json::json!({
            "ociVersion": "1.0.2", "id": id, "status": "creating", "bundle": bundle, "pid": pid,
        });
        let run = |stage: &str, state: &serde_json::Value| {
            let state_dir = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
            let backend = format!("NATLEDGER_BACKEND={}", backend.name());
            let argv = [state_dir.as_str(), &backend, &bin, "hook", stage];
            run_in(
                node.topo.node(),
                "env",
                &argv,
                Some(state.to_string().as_bytes()),
            )
        };
        assert_ok(&run("create-runtime", &state), "release create-runtime");
        let written = node
            .state_dir()
            .join("containers")
            .join(format!("{id}.json"));
        let path = fixture(backend);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(&written, &path).unwrap();
        let mut stopped = state.clone();
        stopped["status"] = "stopped".into();
        assert_ok(&run("poststop", &stopped), "release poststop");
    });
}

#[test]
fn a_release_manifest_is_removed_exactly() {
    both(|backend| {
        let node = Node::new(backend);
        node.warm_up();
        let before = node.dump();
        let id = id(backend);
        let bytes = std::fs::read(fixture(backend)).unwrap();
        let release: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        node.create(&id, None, &[ports(backend), IP]);
        assert_eq!(
            node.manifest(&id)["rules"],
            release["rules"],
            "{backend:?}: this release records the release's rules"
        );
        let path = node
            .state_dir()
            .join("containers")
            .join(format!("{id}.json"));
        std::fs::write(&path, &bytes).unwrap();
        let bundle = node.dir.path().join("bundles").join(&id);
        let stopped = serde_json::json!({
            "ociVersion": "1.0.2", "id": id, "status": "stopped", "bundle": bundle,
        });
        let out = node.hook_state("poststop", &stopped);
        assert_ok(&out, "poststop of the release's manifest");
        assert_eq!(stderr(&out), "", "{backend:?}: no warning");
        assert!(!node.manifest_exists(&id), "{backend:?}: manifest removed");
        assert_eq!(
            node.dump(),
            before,
            "{backend:?}: exactly its rules removed"
        );
    });
}

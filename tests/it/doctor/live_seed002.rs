//! `natledger doctor` live on seed 002 (a stale CNI portmap chain), in-process with
//! injected evidence roots, in a private network namespace.

use crate::common::*;

/// Seed 002 live, in-process with injected evidence roots (the CLI always reads the host's):
/// the node's legacy tables hold the seed's rules, both pod addresses are on the node's pod
/// network, CNI IPAM reserves the live pod's address for its container, which runs (a runc
/// state file with a live pid); nothing reserves the stale pod's. Returns doctor's report.
fn seed002_live_report() -> Doc {
    use natledger::analysis::doctor::{self as nl, DoctorOptions, evidence::Roots};
    let mut node = Node::new(Backend::IptablesNft);
    load_fixture(
        &node,
        Backend::IptablesLegacy,
        Family::V4,
        "seed002_cni_portmap_stale.legacy.txt",
    );
    let ns = node.topo.node().to_string();
    let pod_pid = node.topo.spawn_sleeper(&ns);
    let out = run_in(
        &ns,
        "ip",
        &["addr", "add", "10.187.2.1/24", "dev", BRIDGE],
        None,
    );
    assert_ok(&out, "ip addr add");
    let live_id = "0961bad27f1a52a28701b7038120b8188e7a78df21f57a08428f021ab3c071e2";
    let tmp = tempfile::tempdir().unwrap();
    let cni = tmp.path().join("cni/networks/cbr0");
    std::fs::create_dir_all(&cni).unwrap();
    std::fs::write(cni.join("10.187.2.34"), format!("{live_id}\neth0")).unwrap();
    std::fs::write(cni.join("last_reserved_ip.0"), "10.187.2.34").unwrap();
    let state = tmp.path().join("run/containerd/runc/k8s.io").join(live_id);
    std::fs::create_dir_all(&state).unwrap();
    let json = format!(r#"{{"id":"{live_id}","init_process_pid":{pod_pid}}}"#);
    std::fs::write(state.join("state.json"), json).unwrap();
    let roots = Roots {
        cni_networks: tmp.path().join("cni/networks"),
        runtime_state: vec![tmp.path().join("run/containerd/runc")],
        ..Roots::default()
    };
    let ledger_dir = tmp.path().join("state");
    let report = in_netns(&ns, move || {
        let runner = natledger::kernel::exec::SystemRunner::default();
        let opts = DoctorOptions {
            from: Vec::new(),
            port: None,
            ledger: natledger::state::ledger::Ledger::new(ledger_dir),
            netfilter: natledger::backend::Netfilter::new(&runner),
            host_backend: natledger::backend::Detected {
                backend: natledger::backend::Backend::IptablesLegacy,
                how: "seed 002's host uses iptables-legacy".into(),
            },
            roots,
        };
        nl::doctor(&opts).map(|r| (r.exit_code(), serde_json::to_value(&r).unwrap()))
    });
    let (code, report) = report.expect("doctor");
    let d = Doc {
        code: code.into(),
        report,
        stdout: String::new(),
        stderr: String::new(),
    };
    d.check_schema();
    d
}

/// Seed 002 live: the stale DNATs are dead targets on CNI IPAM's word; the live ones not.
#[test]
fn live_seed002_cni_ipam_evidence() {
    let d = seed002_live_report();
    assert_eq!(d.code, 2, "{}", d.show());
    assert_eq!(d.of_kind("shadowed").len(), 4, "{}", d.show());
    let dead = d.of_kind("dead-target");
    assert_eq!(
        dead.len(),
        4,
        "the stale pod's four DNATs, not the live pod's\n{}",
        d.show()
    );
    for f in &dead {
        assert_eq!(places(f)[0].0, STALE_DN, "{f}");
        assert_eq!(f["severity"], "error", "{f}");
        let evidence = text(f, "evidence");
        assert!(
            evidence.contains("CNI IPAM") && evidence.contains("10.187.2.36"),
            "{evidence}"
        );
    }
    assert_eq!(d.findings().len(), 8, "{}", d.show());
}

/// Seed 002 live: the stale pod's container id is in the comment of portmap's jump to its
/// CNI-DN chain (not on the DNAT itself); checked against the runtime's state it is not
/// running, which doctor should cite (the issue: "the container ids in rule comments
/// (portmap, ...) checked against running containers").
#[test]
fn live_seed002_portmap_comment_id_is_evidence() {
    let d = seed002_live_report();
    let dead = d.of_kind("dead-target");
    assert!(!dead.is_empty(), "{}", d.show());
    for f in dead {
        let evidence = text(f, "evidence");
        assert!(
            evidence.contains("runtime state") && evidence.contains("fb7cdb0a4f8d"),
            "no runtime evidence for the stale pod's id:\n{evidence}"
        );
    }
}

//! `natledger selftest` on this machine: every check passes, and it leaves nothing behind: no
//! namespace, no state directory, and the machine's own tables (read, never written, by this
//! test) are as they were. Its report: the backend line first, then nine checks per backend (the
//! port from the node's addresses, 127.0.0.1 and outside, the localhost guard, poststop, `sweep
//! --all`), FORWARD policy DROP passed by the iptables backends only.

use std::process::Command;

use crate::common::*;

/// Normalized full dumps of the root namespace's tables, both iptables backends, and its
/// `nft list ruleset` (natledger's own tables included). `*-save` without `-t` never creates
/// a table.
fn host_dumps() -> String {
    let nft = Command::new("nft")
        .args(["list", "ruleset"])
        .output()
        .expect("nft");
    let iptables: String = [
        "iptables-legacy-save",
        "ip6tables-legacy-save",
        "iptables-nft-save",
        "ip6tables-nft-save",
    ]
    .iter()
    .map(|tool| {
        let out = Command::new(tool).output().expect("iptables tools");
        normalized(&String::from_utf8_lossy(&out.stdout))
    })
    .collect();
    iptables + &String::from_utf8_lossy(&nft.stdout)
}

fn leftovers() -> Vec<String> {
    let mut found = list_netns();
    found.extend(
        std::fs::read_dir("/run")
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned()),
    );
    found.retain(|n| n.starts_with("natledger-selftest"));
    found
}

#[test]
fn selftest_passes_and_leaves_nothing() {
    require_tools();
    let host = host_dumps();
    let out = Command::new(BIN).arg("selftest").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_ok(&out, &format!("selftest\n{text}"));
    let lines: Vec<&str> = text.lines().collect();
    // The active backend and why, the namespaces, then nine checks per backend.
    assert_eq!(lines.len(), 2 + 3 * 9, "{text}");
    assert!(lines.iter().all(|l| l.starts_with("ok ")), "{text}");
    assert!(lines[0].starts_with("ok    backend: "), "{text}");
    for backend in ["legacy", "nft", "nftables"] {
        let tag = format!(" {backend}: ");
        let mine: Vec<&&str> = lines.iter().filter(|l| l.contains(&tag)).collect();
        assert_eq!(mine.len(), 9, "{backend}\n{text}");
        for what in [
            "127.0.0.1:18080",
            "[fd53::1]:18080",
            "from outside to 10.253.1.1:18080",
            "from outside to [fd54::1]:18080",
            "localhost guard: filter INPUT jumps first to NATLEDGER-INPUT",
            "poststop: the nat and filter tables are as they were",
            "sweep --all: natledger's chains and jumps removed",
        ] {
            assert!(
                mine.iter().any(|l| l.contains(what)),
                "{backend}: {what}\n{text}"
            );
        }
        // The iptables backends pass a FORWARD policy DROP with their forward accept;
        // nftables writes none (an accept cannot override another table's drop).
        let through_drop = mine
            .iter()
            .filter(|l| l.contains("through FORWARD policy DROP"))
            .count();
        let expected = if backend == "nftables" { 0 } else { 2 };
        assert_eq!(through_drop, expected, "{backend}\n{text}");
    }
    assert_eq!(leftovers(), Vec::<String>::new());
    assert_eq!(host_dumps(), host, "the host's tables are untouched");
}

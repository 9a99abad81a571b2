//! `natledger selftest` on this machine: every check passes, and it leaves nothing behind: no
//! namespace, no state directory, and the machine's own tables (read, never written, by this
//! test) are as they were.

mod common;

use std::process::Command;

use common::*;

/// Normalized full dumps of the root namespace's tables, both backends. `*-save` without
/// `-t` never creates a table.
fn host_dumps() -> String {
    [
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
    .collect()
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
    assert_eq!(lines.len(), 19, "{text}");
    assert!(lines.iter().all(|l| l.starts_with("ok ")), "{text}");
    for backend in ["legacy", "nft"] {
        for what in [
            "127.0.0.1:18080",
            "[fd53::1]:18080",
            "from outside to 10.253.1.1:18080",
            "from outside to [fd54::1]:18080",
            "through FORWARD policy DROP",
            "localhost guard: filter INPUT jumps first to NATLEDGER-INPUT",
            "poststop: the nat and filter tables are as they were",
        ] {
            let tag = format!("{backend}: ");
            assert!(
                lines.iter().any(|l| l.contains(&tag) && l.contains(what)),
                "{backend}: {what}\n{text}"
            );
        }
    }
    assert_eq!(leftovers(), Vec::<String>::new());
    assert_eq!(host_dumps(), host, "the host's tables are untouched");
}

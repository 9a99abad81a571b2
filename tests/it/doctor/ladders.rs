//! `natledger doctor` live on branching ladders, under a 1 GiB address-space limit
//! (`prlimit --as`): chains each jumping several ways to the next, legal in both iptables
//! backends, are billions of paths to the last chain. Doctor must exit normally with its
//! findings, or say where it did not follow, never abort.
//!
//! Each ladder is entered from nat PREROUTING by packets to port 6667 only; every jump is
//! conditioned on a mark of its own not being set (`-m mark ! --mark`), which the kernel
//! decides (a packet without marks takes the first way, down to the bottom) and doctor
//! cannot (each way may be taken). At the bottom, a stale DNAT to a container that no longer
//! serves sits above the live one. A filter FORWARD ladder of the same shape, entered only
//! by a mark no packet here has, makes the forward check follow it too.
//!
//! - `ladders_in_iptables_legacy_under_1gib`: 30 chains x 4 ways, 30 x 8, 31 x 16 (the
//!   deepest doctor follows).
//! - `ladders_in_iptables_nft_under_1gib`: 15 chains (nf_tables' jump limit) x 4, 8, 16.
//!
//!   Both: before, the port answers nothing (the stale DNAT takes it); doctor (complete)
//!   names the stale DNAT shadowing the live one in the bottom chain, and leaves the full
//!   dump as it was; its fix, run, makes the port answer from the live container.
//! - `a_ladder_deeper_than_doctor_follows_is_named`: 40 chains x 2 in iptables-legacy:
//!   doctor exits normally, not complete, and names the jumps it did not follow
//!   (`not_followed`, JSON and text) and claims nothing about the chains below.
//! - `long_conditions_on_many_paths_under_1gib` (a `--from` dump, no namespace): 1024
//!   PREROUTING jumps, each with one long legal match (`-m bpf` of 64 instructions, then
//!   `-m string --hex-string` of 128 bytes), into 1024 chains that each RETURN on a mark and
//!   jump to one chain of 2100 MARK rules, walked again from each: some 2 million steps, each
//!   on a path carrying the long match. Doctor exits normally, claims nothing, and if it
//!   stops, says where (`too-many-steps`).

use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(3);
const PORT: u16 = 6667;

/// PREROUTING → L0 for port 6667, `chains` chains each jumping `ways` ways to the next, the
/// stale DNAT (to `stale`) above the live one (to `live`) in the last; a filter FORWARD ladder
/// of the same shape entered by mark 0x1234 only.
fn ladder(chains: usize, ways: usize, stale: &str, live: &str) -> String {
    let mut nat = String::from("*nat\n");
    let mut filter = String::from("*filter\n");
    for i in 0..chains {
        nat += &format!(":L{i} - [0:0]\n");
        filter += &format!(":F{i} - [0:0]\n");
    }
    nat += &format!("-A PREROUTING -p tcp -m tcp --dport {PORT} -j L0\n");
    filter += "-A FORWARD -m mark --mark 0x1234/0xffff -j F0\n";
    for i in 0..chains - 1 {
        for k in 0..ways {
            let m = 0x10000 + i * ways + k;
            nat += &format!("-A L{i} -m mark ! --mark {m:#x}/{m:#x} -j L{}\n", i + 1);
            filter += &format!("-A F{i} -m mark ! --mark {m:#x}/{m:#x} -j F{}\n", i + 1);
        }
    }
    let last = chains - 1;
    nat += &format!(
        "-A L{last} -p tcp -m tcp --dport {PORT} -j DNAT --to-destination {stale}:{PORT}\n\
         -A L{last} -p tcp -m tcp --dport {PORT} -j DNAT --to-destination {live}:{PORT}\n\
         COMMIT\n"
    );
    filter += &format!("-A F{last} -p udp -j DROP\nCOMMIT\n");
    format!("{nat}{filter}")
}

/// `natledger doctor ARGS` in the node namespace under a 1 GiB address-space limit (and a
/// timeout far above what it takes).
fn limited(node: &Node, args: &[&str]) -> std::process::Output {
    let state_dir = format!("NATLEDGER_STATE_DIR={}", node.state_dir().display());
    let backend = format!("NATLEDGER_BACKEND={}", node.backend.name());
    let mut argv = vec![
        "300",
        "prlimit",
        "--as=1073741824",
        "env",
        &state_dir,
        &backend,
        BIN,
        "doctor",
    ];
    argv.extend_from_slice(args);
    run_in(node.topo.node(), "timeout", &argv, None)
}

fn limited_json(node: &Node) -> Doc {
    let out = limited(node, &["--json"]);
    assert!(
        out.status.code().is_some(),
        "doctor killed by a signal ({}): {}",
        out.status,
        stderr(&out)
    );
    Doc::of(out, true)
}

/// The ladder of `chains` x `ways` in `backend`: the port dead, doctor's finding, the dump
/// unchanged, the fix run, the port alive.
fn ladder_case(backend: Backend, chains: usize, ways: usize) {
    let case = format!("{backend:?}: {chains} chains x {ways} ways");
    let mut node = Node::new(backend);
    let stale = node.topo.add_container(2);
    let live = node.topo.add_container(3);
    let _server = serve_tcp(&live.ns, live.sock_v4(PORT), "live");
    let rules = ladder(chains, ways, &stale.v4.to_string(), &live.v4.to_string());
    load_rules(node.topo.node(), backend, Family::V4, &rules);
    let reply = tcp_request(node.topo.ext(), sock(NODE_V4, PORT), T);
    assert!(reply.is_err(), "{case}: {reply:?}");
    let before = node.dump();

    let d = limited_json(&node);
    assert_eq!(node.dump(), before, "{case}: doctor changed the rules");
    assert_eq!(d.report["complete"], true, "{case}\n{}", d.show());
    let shadowed = d.of_kind("shadowed");
    assert_eq!(shadowed.len(), 1, "{case}\n{}", d.show());
    let f = shadowed[0];
    let bottom = format!("L{}", chains - 1);
    assert_eq!(
        places(f),
        [(bottom.clone(), 1), (bottom, 2)],
        "{case}\n{}",
        d.show()
    );
    assert_eq!(f["port"].as_u64(), Some(u64::from(PORT)), "{case}");
    assert!(
        line_of(f, 0).contains(&format!("{}:{PORT}", stale.v4)),
        "{case}\n{}",
        d.show()
    );
    assert_eq!(d.code, 2, "{case}\n{}", d.show());

    // The fix doctor prints, run: the live container answers.
    let fix = text(f, "fix");
    let out = run_in(node.topo.node(), "sh", &["-c", &fix], None);
    assert_ok(&out, &format!("{case}: {fix}"));
    assert_eq!(
        tcp_request(node.topo.ext(), sock(NODE_V4, PORT), T)
            .ok()
            .as_deref(),
        Some("live"),
        "{case}"
    );
}

#[test]
fn ladders_in_iptables_legacy_under_1gib() {
    for (chains, ways) in [(30, 4), (30, 8), (31, 16)] {
        ladder_case(Backend::IptablesLegacy, chains, ways);
    }
}

#[test]
fn ladders_in_iptables_nft_under_1gib() {
    for (chains, ways) in [(15, 4), (15, 8), (15, 16)] {
        ladder_case(Backend::IptablesNft, chains, ways);
    }
}

#[test]
fn a_ladder_deeper_than_doctor_follows_is_named() {
    let mut node = Node::new(Backend::IptablesLegacy);
    let stale = node.topo.add_container(2);
    let live = node.topo.add_container(3);
    let _server = serve_tcp(&live.ns, live.sock_v4(PORT), "live");
    let rules = ladder(40, 2, &stale.v4.to_string(), &live.v4.to_string());
    load_rules(
        node.topo.node(),
        Backend::IptablesLegacy,
        Family::V4,
        &rules,
    );
    let before = node.dump();

    let d = limited_json(&node);
    assert_eq!(node.dump(), before);
    assert_eq!(d.report["complete"], false, "{}", d.show());
    // PREROUTING and L0..L30 are 32 chains deep: L30's jumps are not followed, in nat
    // PREROUTING (and filter FORWARD's F30 likewise).
    let cut: Vec<(String, String, String, u64, String)> = d.report["not_followed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&n["hook"]),
                s(&n["rule"]["table"]),
                s(&n["rule"]["chain"]),
                n["rule"]["position"].as_u64().unwrap_or_default(),
                s(&n["reason"]),
            )
        })
        .collect();
    let at = |hook: &str, table: &str, chain: &str, position| {
        (
            hook.to_string(),
            table.to_string(),
            chain.to_string(),
            position,
            "too-deep".to_string(),
        )
    };
    assert_eq!(
        cut,
        [
            at("PREROUTING", "nat", "L30", 1),
            at("PREROUTING", "nat", "L30", 2),
            at("FORWARD", "filter", "F30", 1),
            at("FORWARD", "filter", "F30", 2),
        ],
        "{}",
        d.show()
    );
    // Nothing is claimed about what lies below (the shadow there is not seen).
    assert!(d.of_kind("shadowed").is_empty(), "{}", d.show());

    let out = limited(&node, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(walk cut short: see below)")
            && text.contains("not followed past legacy/ipv4 nat L30 #1 (from PREROUTING)"),
        "{text}"
    );
}

/// The review's ruleset (issue 22): every path condition holds one long match text.
fn long_conditions(long_match: &str) -> String {
    let (k, r) = (1024, 2100);
    let mut out = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:B - [0:0]\n");
    for i in 0..k {
        out += &format!(":M{i} - [0:0]\n");
    }
    for i in 0..k {
        out += &format!("-A PREROUTING {long_match} -j M{i}\n");
    }
    for i in 0..k {
        out += &format!("-A M{i} -m mark --mark 0x1/0x1 -j RETURN\n-A M{i} -j B\n");
    }
    for j in 0..r {
        out += &format!("-A B -j MARK --set-xmark {:#x}/0xffffffff\n", j + 2);
    }
    out + "COMMIT\n"
}

#[test]
fn long_conditions_on_many_paths_under_1gib() {
    let bpf = ["48 0 0 9", "21 0 1 6", "6 0 0 1", "6 0 0 0"]
        .repeat(16)
        .join(",");
    let hex = "41".repeat(128);
    for long_match in [
        format!("-m bpf --bytecode \"64,{bpf}\""),
        format!("-m string --hex-string \"|{hex}|\" --algo bm --to 65535"),
    ] {
        let case = &long_match[..16];
        let mut dump = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut dump, long_conditions(&long_match).as_bytes()).unwrap();
        let state = tempfile::tempdir().unwrap();
        let from = format!("legacy:{}", dump.path().display());
        let out = std::process::Command::new("timeout")
            .args(["300", "prlimit", "--as=1073741824", BIN, "doctor", "--json"])
            .arg("--state-dir")
            .arg(state.path())
            .args(["--from", &from])
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0..=2)),
            "{case}: doctor did not exit normally ({}): {}",
            out.status,
            stderr(&out)
        );
        let d = Doc::of(out, true);
        assert_eq!(d.report["rules_read"], 1024 + 2048 + 2100, "{case}");
        // No rule here takes another's packets: nothing is claimed.
        assert!(d.findings().is_empty(), "{case}\n{}", d.show());
        let cut = d.report["not_followed"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if d.report["complete"] == false {
            assert!(
                !cut.is_empty() && cut.iter().all(|n| n["reason"] == "too-many-steps"),
                "{case}\n{}",
                d.show()
            );
        } else {
            assert!(cut.is_empty(), "{case}\n{}", d.show());
        }
    }
}

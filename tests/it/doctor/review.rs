//! Defects found by the adversarial review of doctor (issue 13), each with the dump that
//! shows it.

use crate::common::*;

fn fixes(d: &Doc) -> Vec<String> {
    d.findings()
        .iter()
        .filter_map(|f| f["fix"].as_str().map(String::from))
        .collect()
}

/// netavark's `NETAVARK-DN-<hash>` is per network, not per container: every container on the
/// network jumps into the same chain. The fix for a gone container's DNAT there must not
/// delete the live container's jumps or the chain they lead to (its 8080 and 9090 would go
/// dead); only the stale rule itself.
#[test]
fn netavark_shared_network_chain_is_not_removed_whole() {
    let d = doctor_json(&["--from", &from("nft", "netavark_shared_network.nft.txt")]);
    assert_eq!(d.code, 2, "{}", d.show());
    let fixes = fixes(&d);
    assert_eq!(fixes.len(), 1, "{}", d.show());
    let fix = &fixes[0];
    assert!(
        !fix.contains("a91c7e3b") && !fix.contains(" -X ") && !fix.contains(" -F "),
        "the fix cuts the live container's forwards:\n{fix}"
    );
    assert!(
        fix.starts_with(
            "iptables-nft -t nat -D NETAVARK-DN-1D8721804F16F -p tcp -m tcp --dport 8080 -j \
             DNAT --to-destination 10.88.0.7:80"
        ),
        "{fix}"
    );
}

/// A fix is pasted into a shell by root: a comment written by another program (`$HOME`,
/// backquotes, `;`, quotes) must reach iptables as one word, unexpanded. Each printed
/// command is run by `sh` with `printf` in place of iptables: the words it would get are
/// exactly the rule's.
#[test]
fn fix_commands_survive_the_shell() {
    let d = doctor_json(&["--from", &from("legacy", "comment_shell_chars.legacy.txt")]);
    assert_eq!(d.code, 2, "{}", d.show());
    let fixes = fixes(&d);
    assert_eq!(fixes.len(), 1, "{}", d.show());
    let command = fixes[0].lines().next().unwrap();
    let tool = "iptables-legacy ";
    assert!(command.starts_with(tool), "{command}");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("printf '%s\\n' {}", &command[tool.len()..]))
        .env("HOME", "/expanded")
        .output()
        .unwrap();
    let words: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let expected = [
        "-t",
        "nat",
        "-D",
        "MYFW",
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        "8080",
        "-m",
        "comment",
        "--comment",
        "'old $HOME app' `id`",
        "-j",
        "DNAT",
        "--to-destination",
        "10.0.0.2:80",
    ];
    assert_eq!(words, expected, "{command}");
}

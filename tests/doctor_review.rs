//! Defects found by the adversarial review of doctor (issue 13), each with the dump that
//! shows it.

mod common;

use common::*;

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

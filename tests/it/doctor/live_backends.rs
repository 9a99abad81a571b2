//! `natledger doctor` live: rules in both iptables backends of a private network namespace.

use crate::common::*;

/// Rules in the backend the host's `iptables` does not use (legacy on this machine, whose
/// `iptables` leads to nft; the other way round elsewhere): KUBE- rules in both, reached from
/// INPUT and dropping (a warning naming KUBE's rules in both); AZURE-NPM only there, in a
/// chain nothing jumps to (a note: clutter that acts on no packet).
#[test]
fn live_split_backends() {
    let (active, unused) =
        match natledger::backend::detect(natledger::kernel::host_root::Lookup(None)) {
            natledger::backend::Backend::IptablesLegacy => {
                (Backend::IptablesLegacy, Backend::IptablesNft)
            }
            // `detect` names the host's iptables backend, never natledger's own tables.
            _ => (Backend::IptablesNft, Backend::IptablesLegacy),
        };
    let node = Node::new(active);
    let kube = "*filter\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n\
        -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n\
        COMMIT\n";
    load_rules(node.topo.node(), active, Family::V4, kube);
    let d = live(&node, &[]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 0),
        "one backend only\n{}",
        d.show()
    );
    load_rules(node.topo.node(), unused, Family::V4, kube);
    load_rules(
        node.topo.node(),
        unused,
        Family::V4,
        "*filter\n:AZURE-NPM - [0:0]\n-A AZURE-NPM -m mark --mark 0x4000 -j DROP\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 1, "{}", d.show());
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 2, "{}", d.show());
    assert_eq!(d.findings().len(), 2, "{}", d.show());
    let kube = split
        .iter()
        .find(|f| text(f, "summary").contains("KUBE"))
        .unwrap();
    assert_eq!(kube["severity"], "warning");
    assert!(
        text(kube, "summary").contains(&format!("2 rule(s) in iptables-{} too", active.name())),
        "{kube}"
    );
    assert_eq!(
        places(kube),
        [("INPUT".into(), 1), ("KUBE-FIREWALL".into(), 1)]
    );
    assert!(text(kube, "evidence").contains("KUBE-FIREWALL"), "{kube}");
    let npm = split
        .iter()
        .find(|f| text(f, "summary").starts_with("AZURE-NPM"))
        .unwrap();
    assert_eq!(npm["severity"], "info", "{npm}");
    let sources = d.report["sources"].to_string();
    assert!(
        sources.contains("legacy/ipv4 (live)") && sources.contains("nft/ipv4 (live)"),
        "{sources}"
    );
}

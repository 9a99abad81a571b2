//! `natledger doctor` live: rules in both iptables backends of a private network namespace.

mod common;

use common::*;

/// Split backends: KUBE- rules in both iptables-legacy and iptables-nft of the namespace;
/// AZURE-NPM only in legacy (not split).
#[test]
fn live_split_backends() {
    let node = Node::new(Backend::Nft);
    let kube = "*filter\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n\
        -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n\
        COMMIT\n";
    load_rules(node.topo.node(), Backend::Nft, Family::V4, kube);
    let d = live(&node, &[]);
    assert_eq!(
        (d.code, d.findings().len()),
        (0, 0),
        "one backend only\n{}",
        d.show()
    );
    load_rules(node.topo.node(), Backend::Legacy, Family::V4, kube);
    load_rules(
        node.topo.node(),
        Backend::Legacy,
        Family::V4,
        "*filter\n:AZURE-NPM - [0:0]\n-A AZURE-NPM -m mark --mark 0x4000 -j DROP\nCOMMIT\n",
    );
    let d = live(&node, &[]);
    assert_eq!(d.code, 1, "{}", d.show());
    let split = d.of_kind("split-backends");
    assert_eq!(split.len(), 1, "{}", d.show());
    assert_eq!(d.findings().len(), 1, "{}", d.show());
    let f = split[0];
    assert!(text(f, "summary").contains("KUBE"), "{f}");
    let evidence = text(f, "evidence");
    assert!(
        evidence.contains("ipv4/filter KUBE-FIREWALL") && evidence.contains("ipv4/filter INPUT"),
        "{evidence}"
    );
    let sources = d.report["sources"].to_string();
    assert!(
        sources.contains("legacy/ipv4 (live)") && sources.contains("nft/ipv4 (live)"),
        "{sources}"
    );
}

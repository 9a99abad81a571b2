//! What identifies an attachment: the container's addresses read from `prevResult`, and
//! the ledger id of `(CNI_CONTAINERID, CNI_IFNAME)`.

use std::net::IpAddr;

use serde_json::{Value, json};

use super::super::*;
use super::{ID, config_0_3_1, prev_result};

fn addresses(prev: Value, ifname: &str) -> Vec<IpAddr> {
    let found = result::container_addresses(&prev, ifname).unwrap();
    found.into_iter().map(|a| a.addr).collect()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

/// The prefix goes with the address: the hairpin masquerade's subnet (`IfAddr::subnet`).
#[test]
fn container_addresses_keep_their_prefixes() {
    let found = result::container_addresses(&prev_result(), "eth0").unwrap();
    let subnets: Vec<String> = found
        .iter()
        .map(|a| a.subnet().unwrap().to_string())
        .collect();
    assert_eq!(subnets, ["10.88.0.0/16", "fd00::/64"]);
}

#[test]
fn container_addresses_follow_the_interface_index() {
    // The host side (cni0, index 0) is skipped; both families of eth0 are taken.
    assert_eq!(
        addresses(prev_result(), "eth0"),
        ips(&["10.88.0.7", "fd00::7"])
    );
    // Another attachment's interface name: only entries naming it count.
    assert_eq!(addresses(prev_result(), "net1"), ips(&[]));
    // Without an index, or an index past the list: taken (as portmap).
    let prev = json!({"ips": [
        {"address": "fd00::9/64"},
        {"address": "10.1.0.5/24", "interface": 7},
        {"address": "10.1.0.6/24"}
    ]});
    assert_eq!(addresses(prev, "eth0"), ips(&["10.1.0.5", "fd00::9"]));
    // The right name without a sandbox is a host interface.
    let prev = json!({
        "interfaces": [{"name": "eth0"}, {"name": "eth0", "sandbox": "/proc/1/ns/net"}],
        "ips": [
            {"address": "192.168.1.2/24", "interface": 0},
            {"address": "10.2.0.2/24", "interface": 1}
        ]
    });
    assert_eq!(addresses(prev, "eth0"), ips(&["10.2.0.2"]));
    // 0.4.0's result (ips carry "version") reads the same.
    let prev = json!({"cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
        "ips": [{"version": "4", "address": "10.3.0.2/16", "interface": 0}]});
    assert_eq!(addresses(prev, "eth0"), ips(&["10.3.0.2"]));
    // 0.3.1's (flannel's bridge): the container's entries by index, both families.
    assert_eq!(
        addresses(config_0_3_1()["prevResult"].clone(), "eth0"),
        ips(&["10.244.0.5", "fd44::5"])
    );
    assert_eq!(addresses(json!({}), "eth0"), ips(&[]));
}

#[test]
fn malformed_addresses_are_refused() {
    for bad in [
        "10.0.0.1",
        "10.0.0.1/33",
        "fd00::1/129",
        "10.0.0.1/+8",
        "x/8",
        "10.0.0.1/",
    ] {
        let prev = json!({"ips": [{"address": bad}]});
        let e = result::container_addresses(&prev, "eth0").unwrap_err();
        assert_eq!(e.code, Code::Decode, "{bad}");
    }
}

#[test]
fn ledger_ids_are_safe_unique_and_reversible() {
    let cases = [
        (ID, "eth0", format!("{ID}+eth0")),
        ("abc", "net1", "abc+net1".to_string()),
        ("a.b_c-d", "eth0.100", "a.b_c-d+eth0.100".to_string()),
        ("abc", "e+th", "abc+e+2Bth".to_string()),
        ("abc", "é@", "abc++C3+A9+40".to_string()),
    ];
    for (container_id, ifname, expected) in cases {
        let att = Attachment {
            container_id: container_id.into(),
            ifname: ifname.into(),
        };
        let id = att.ledger_id().unwrap();
        assert_eq!(id.as_str(), expected);
        assert_eq!(Attachment::from_ledger_id(&id), Some(att));
    }
    // Two attachments that a plain join would confuse stay apart.
    let a = Attachment {
        container_id: "a".into(),
        ifname: "b+c".into(),
    };
    let b = Attachment {
        container_id: "a".into(),
        ifname: "b+2Bc".into(),
    };
    assert_ne!(a.ledger_id().unwrap(), b.ledger_id().unwrap());
    // Too long for a manifest name: refused, code 4.
    let long = Attachment {
        container_id: "a".repeat(120),
        ifname: "eth0123456".into(),
    };
    assert_eq!(long.ledger_id().unwrap_err().code, Code::InvalidEnv);
    // Not an attachment's id.
    assert_eq!(Attachment::from_ledger_id(&"plain".parse().unwrap()), None);
    assert_eq!(Attachment::from_ledger_id(&"a+b+4".parse().unwrap()), None);
}

#[test]
fn every_ifname_the_environment_accepts_has_a_ledger_id() {
    // Any byte Linux allows in a name (not '/', ':' or whitespace), at the longest.
    for b in 0x21u8..0x7f {
        let c = char::from(b);
        if c == '/' || c == ':' {
            continue;
        }
        let ifname: String = std::iter::repeat_n(c, 15).collect();
        assert_eq!(env::ifname_problem(&ifname), None);
        let att = Attachment {
            container_id: ID.into(),
            ifname,
        };
        let id = att.ledger_id().unwrap();
        assert_eq!(Attachment::from_ledger_id(&id), Some(att));
    }
}

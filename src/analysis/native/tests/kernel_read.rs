//! Cases where the kernel's answer (seen with real connections in a namespace) was wider
//! than fate's: each dump is `nft list ruleset` as nft 1.0.6 printed it.

use super::*;

fn local_probe(port: u16) -> Probe {
    Probe {
        iif: None,
        oif: None,
        ..probe(NODE, port, Path::Local)
    }
}

/// The output hook has no input device: the kernel reads `iifname` as "", so `!=` matches
/// and the connection is dropped (it timed out in the namespace).
#[test]
fn iifname_in_output_is_empty_and_a_not_equal_matches() {
    let dump = "table inet t1 {\n\tchain out {\n\t\ttype filter hook output priority filter; policy accept;\n\t\tiifname != \"eth9\" tcp dport 8080 drop\n\t}\n}\n";
    let rs = parse_text(dump).unwrap();
    let f = fate(&rs, &local_probe(8080));
    assert!(!f.outcomes.is_empty());
    assert_eq!(
        f.all(|o| matches!(
            o.end,
            End::Dropped {
                hook: Hook::Output,
                ..
            }
        )),
        Tri::Yes,
        "{f:?}"
    );
    let dump = dump.replace("!= \"eth9\"", "\"eth9\"");
    let f = fate(&parse_text(&dump).unwrap(), &local_probe(8080));
    assert_eq!(f.all(|o| o.end == End::Delivered), Tri::Yes, "{f:?}");
}

/// `redirect to :9090` sends 8080 to this host's 9090 (the listener on 9090 answered).
#[test]
fn a_redirect_to_a_port_changes_the_port() {
    let dump = "table ip n1 {\n\tchain pre {\n\t\ttype nat hook prerouting priority -190; policy accept;\n\t\ttcp dport 8080 redirect to :9090\n\t}\n}\n";
    let f = fate(
        &parse_text(dump).unwrap(),
        &probe(NODE, 8080, Path::Outside),
    );
    let ports: Vec<_> = f
        .outcomes
        .iter()
        .map(|o| o.dnat.as_ref().map(|d| (d.redirect, d.port)))
        .collect();
    assert_eq!(ports, vec![Some((true, 9090))], "{f:?}");
}

/// A map feeding a DNAT's address, the port after it: `map { ... }:9090`.
#[test]
fn a_nat_maps_port_after_the_map_is_read_from_text() {
    let dump = "table inet k {\n\tchain pre {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tfib daddr type local tcp dport 8080 dnat ip to numgen inc mod 2 map { 0 : 192.168.0.2, 1 : 10.99.0.5 }:9090\n\t}\n}\n";
    let f = fate(
        &parse_text(dump).unwrap(),
        &probe(NODE, 8080, Path::Outside),
    );
    assert_eq!(f.outcomes.len(), 2, "{f:?}");
    assert!(
        f.outcomes
            .iter()
            .all(|o| o.dnat.as_ref().is_some_and(|d| d.port == 9090)),
        "{f:?}"
    );
}

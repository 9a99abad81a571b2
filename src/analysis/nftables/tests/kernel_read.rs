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

/// A DNAT to the packet's own destination changes nothing: the kernel does not set `ct
/// status dnat` (the connection was delivered), the other does.
#[test]
fn ct_status_dnat_only_when_the_destination_changed() {
    let dump = |to: &str| {
        format!(
            "table inet a {{\n\tchain pre {{\n\t\ttype filter hook prerouting priority filter; policy accept;\n\t\ttcp dport 8080 ct status dnat drop\n\t}}\n}}\ntable ip n {{\n\tchain pre {{\n\t\ttype nat hook prerouting priority srcnat; policy accept;\n\t\ttcp dport 8080 dnat to {to}\n\t}}\n}}\n"
        )
    };
    let p = probe(NODE, 8080, Path::Outside);
    let same = fate(&parse_text(&dump(&format!("{NODE}:8080"))).unwrap(), &p);
    assert_eq!(same.all(|o| o.end == End::Delivered), Tri::Yes, "{same:?}");
    let moved = fate(&parse_text(&dump("10.88.0.2:8080")).unwrap(), &p);
    assert_eq!(
        moved.all(|o| matches!(o.end, End::Dropped { .. })),
        Tri::Yes,
        "{moved:?}"
    );
}

/// A drop of a port range takes a listener inside it (its connections timed out): the
/// rule names the listener's port though not as an end of the range.
#[test]
fn a_drop_of_a_port_range_rejects_a_listener_inside_it() {
    let dump = "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\ttcp dport 8000-8100 drop\n\t}\n}\n";
    let found = check(&parse_text(dump).unwrap(), &host(vec![listener(8080)], &[]));
    assert!(
        found
            .iter()
            .any(|f| f.kind == NftKind::RejectedListener && f.port == 8080),
        "{found:?}"
    );
    assert!(check(&parse_text(dump).unwrap(), &host(vec![listener(9090)], &[])).is_empty());
}

/// firewalld's forward-port to another local port (`redirect to :9090`) takes a listener's
/// connections on 8080 away from it: hijacked (its port read as 8080 before).
#[test]
fn a_redirect_to_another_port_hijacks_the_listener() {
    let dump = "table ip n1 {\n\tchain pre {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\ttcp dport 8080 redirect to :9090\n\t}\n}\n";
    let found = check(&parse_text(dump).unwrap(), &host(vec![listener(8080)], &[]));
    assert!(
        found
            .iter()
            .any(|f| f.kind == NftKind::HijackedListener && f.port == 8080),
        "{found:?}"
    );
}

/// A DNAT without a destination match behind one of `fib daddr type local` still takes the
/// connections the host forwards (a client's to a routed 10.99.1.5:8080 were answered by
/// its target): not shadowed, and its shadow is not to be deleted.
#[test]
fn a_dnat_that_takes_forwarded_packets_is_not_shadowed() {
    let dump = "table ip n {\n\tchain pre {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tfib daddr type local tcp dport 8080 dnat to 10.99.0.1:9090\n\t\ttcp dport 8080 dnat to 10.99.0.1:9191\n\t}\n}\n";
    let found = check(&parse_text(dump).unwrap(), &host(vec![], &[]));
    assert!(
        !found.iter().any(|f| f.kind == NftKind::Shadowed),
        "{found:?}"
    );
    // Restricted to this host's address, the second one is shadowed.
    let dump = dump.replace(
        "\t\ttcp dport 8080 dnat to 10.99.0.1:9191",
        &format!("\t\tip daddr {NODE} tcp dport 8080 dnat to 10.99.0.1:9191"),
    );
    let found = check(&parse_text(&dump).unwrap(), &host(vec![], &[]));
    assert!(
        found.iter().any(|f| f.kind == NftKind::Shadowed),
        "{found:?}"
    );
}

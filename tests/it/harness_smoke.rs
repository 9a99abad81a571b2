//! Smoke test of the integration-test harness itself (no natledger binary needed): a
//! topology's namespaces, addresses, forwarding and traffic, the dumps' normalisation, cleanup
//! after a failed setup, and two topologies at once.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(5);

fn assert_gone(names: &[String]) {
    let left = list_netns();
    for name in names {
        assert!(
            !left.contains(name),
            "namespace {name} still exists: {left:?}"
        );
    }
}

/// A topology's namespaces, addresses, forwarding, servers and clients, and dumps work as the
/// harness says.
#[test]
fn topology_traffic_and_dumps() {
    require_tools();
    let mut topo = Topology::new();
    let c2 = topo.add_container(2);
    let c3 = topo.add_container(3);
    assert_eq!(c2.ns, format!("{}-c2", topo.prefix()));
    assert_eq!(c2.v4.to_string(), "10.77.0.2");
    assert_eq!(c3.v6.to_string(), "fd77::3");
    let names = topo.namespaces().to_vec();
    assert_eq!(names.len(), 4);

    // Node forwarding is on.
    let fwd = run_in(topo.node(), "cat", &["/proc/sys/net/ipv4/ip_forward"], None);
    assert_eq!(String::from_utf8_lossy(&fwd.stdout).trim(), "1");

    {
        let v4 = c2.sock_v4(80);
        let v6 = c2.sock_v6(80);
        let _tcp4 = serve_tcp(&c2.ns, v4, "tcp4 hello");
        let _udp4 = serve_udp(&c2.ns, v4, "udp4 hello");
        let _tcp6 = serve_tcp(&c2.ns, v6, "tcp6 hello");
        let udp6 = serve_udp(&c2.ns, v6, "udp6 hello");
        assert_eq!(udp6.addr(), v6);

        for from in [topo.node(), topo.ext(), c3.ns.as_str()] {
            assert_eq!(
                tcp_request(from, v4, T).unwrap(),
                "tcp4 hello",
                "from {from}"
            );
            assert_eq!(
                udp_request(from, v4, T).unwrap(),
                "udp4 hello",
                "from {from}"
            );
            assert_eq!(
                tcp_request(from, v6, T).unwrap(),
                "tcp6 hello",
                "from {from}"
            );
            assert_eq!(
                udp_request(from, v6, T).unwrap(),
                "udp6 hello",
                "from {from}"
            );
        }

        // Nothing listens on port 81: refused quickly, not a timeout.
        let err = tcp_request(topo.ext(), c2.sock_v4(81), T).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        let err = udp_request(topo.ext(), c2.sock_v6(81), T).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");

        // The node's own addresses are reachable from ext (port closed).
        let node_v4: SocketAddr = (NODE_V4, 9).into();
        let err = tcp_request(topo.ext(), node_v4, T).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    }

    // Sleepers live in the namespace they were started in.
    let pid = topo.spawn_sleeper(&c3.ns);
    let proc_ns = std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap();
    let named = std::fs::metadata(format!("/var/run/netns/{}", c3.ns)).unwrap();
    assert_eq!((proc_ns.dev(), proc_ns.ino()), (named.dev(), named.ino()));
    let node = topo.node().to_string();
    let killed = topo.spawn_sleeper(&node);
    kill_pid(killed);
    assert!(!std::path::Path::new(&format!("/proc/{killed}")).exists());

    // Firewall dumps: an untouched namespace dumps as nothing.
    let empty = dump_all(&c3.ns);
    assert_eq!(
        empty,
        "## legacy ipv4\n## legacy ipv6\n## nft ipv4\n## nft ipv6\n## nftables\n"
    );
    let rules = "*nat\n:FOREIGN - [0:0]\n-A PREROUTING -p tcp --dport 9999 -j FOREIGN\nCOMMIT\n";
    load_rules(topo.node(), Backend::IptablesLegacy, Family::V4, rules);
    load_rules(topo.node(), Backend::IptablesNft, Family::V4, rules);
    load_rules(topo.node(), Backend::IptablesNft, Family::V6, rules);
    // A native table named as natledger's: the nftables section shows it as nft prints it,
    // without iptables-nft's tables (shown by the *-save sections).
    let native = "table ip natledger {\n\
        \tchain NATLEDGER-HOSTPORTS {\n\
        \t\ttcp dport 9999 dnat to 10.77.0.2:80 comment \"natledger:x\"\n\
        \t}\n\
        }\n";
    load_nft(topo.node(), native);
    let dump = dump_all(topo.node());
    let expected_nat = "*nat\n\
        :PREROUTING ACCEPT [0:0]\n\
        :INPUT ACCEPT [0:0]\n\
        :OUTPUT ACCEPT [0:0]\n\
        :POSTROUTING ACCEPT [0:0]\n\
        :FOREIGN - [0:0]\n\
        -A PREROUTING -p tcp -m tcp --dport 9999 -j FOREIGN\n\
        COMMIT\n";
    assert_eq!(
        dump,
        format!(
            "## legacy ipv4\n{expected_nat}## legacy ipv6\n## nft ipv4\n{expected_nat}## nft ipv6\n{expected_nat}## nftables\n{native}"
        ),
        "dump:\n{dump}"
    );
    assert_eq!(
        chain_rules(
            &dump,
            Backend::OwnNftables,
            Family::V4,
            "NATLEDGER-HOSTPORTS"
        ),
        ["tcp dport 9999 dnat to 10.77.0.2:80 comment \"natledger:x\""]
    );
    assert!(
        chain_rules(
            &dump,
            Backend::OwnNftables,
            Family::V6,
            "NATLEDGER-HOSTPORTS"
        )
        .is_empty()
    );
    // Listing with the legacy tool instantiates an empty filter table: still "empty".
    let out = run_in(topo.node(), "iptables-legacy", &["-w", "-L", "-n"], None);
    assert!(out.status.success());
    let raw = save(topo.node(), Backend::IptablesLegacy, Family::V4);
    assert!(raw.contains("*filter"), "{raw}");
    assert_eq!(normalized(&raw), expected_nat);

    drop(topo);
    assert_gone(&names);
}

/// `normalized` drops iptables-save's headers, counters and empty built-in tables, and keeps
/// the rest.
#[test]
fn normalization() {
    let empty = "# Generated by iptables-save v1.8.9\n*filter\n:INPUT ACCEPT [5:300]\n\
                 :FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [7:420]\nCOMMIT\n# Completed\n";
    assert_eq!(normalized(empty), "");
    assert_eq!(normalized(""), "");
    let drop_policy = "*filter\n:INPUT ACCEPT [1:2]\n:FORWARD DROP [3:4]\nCOMMIT\n";
    assert_eq!(
        normalized(drop_policy),
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\nCOMMIT\n"
    );
    let counted = "*nat\n:PREROUTING ACCEPT [9:9]\n[12:345] -A PREROUTING -j RETURN\nCOMMIT\n";
    assert_eq!(
        normalized(counted),
        "*nat\n:PREROUTING ACCEPT [0:0]\n[0:0] -A PREROUTING -j RETURN\nCOMMIT\n"
    );
    let user_chain_only = "*mangle\n:PREROUTING ACCEPT [0:0]\n:X - [0:0]\nCOMMIT\n";
    assert_eq!(normalized(user_chain_only), user_chain_only);
}

/// A topology whose setup panics deletes every namespace it made.
#[test]
fn failed_setup_cleans_up() {
    let names = std::sync::Mutex::new(Vec::new());
    let result = catch_unwind(AssertUnwindSafe(|| {
        let mut topo = Topology::new();
        topo.add_container(2);
        names.lock().unwrap().extend(topo.namespaces().to_vec());
        topo.add_container(2); // duplicate: panics
    }));
    assert!(result.is_err());
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 3);
    assert_gone(&names);
}

/// Two topologies at once use the same addresses, each server visible only in its own.
#[test]
fn parallel_topologies_are_isolated() {
    let a = Topology::new();
    let b = Topology::new();
    assert_ne!(a.node(), b.node());
    // Same addresses in both, but each server is only visible in its topology.
    let mut a = a;
    let mut b = b;
    let ca = a.add_container(5);
    let cb = b.add_container(5);
    let _sa = serve_tcp(&ca.ns, ca.sock_v4(80), "a");
    let _sb = serve_tcp(&cb.ns, cb.sock_v4(80), "b");
    assert_eq!(tcp_request(a.ext(), ca.sock_v4(80), T).unwrap(), "a");
    assert_eq!(tcp_request(b.ext(), cb.sock_v4(80), T).unwrap(), "b");
}

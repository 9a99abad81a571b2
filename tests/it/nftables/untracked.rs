//! The localhost guard against packets conntrack does not track, every backend.
//!
//! nf_tables' `ct status` has no value for a packet without a conntrack entry, so on the
//! nftables backend the guard's `ct status ! dnat drop` does not match it; iptables'
//! `! --ctstate DNAT` does. The nftables guard therefore has a second rule, `ct state
//! invalid,untracked drop` (`layout::guard_untracked`). Here the node exempts the
//! neighbour's packets to 127.0.0.0/8 from conntrack with a `notrack` rule (as a host's raw
//! table may), and the neighbour sends UDP and connects TCP to the node's 127.0.0.1 services
//! with route_localnet on: dropped on every backend; on nftables, without the second rule,
//! they get through (so the test proves the rule is needed), and the next create puts it
//! back.

use crate::common::*;

/// Exempts packets from br0 to 127.0.0.0/8 from conntrack (a raw-priority `notrack`).
const NOTRACK: &str = "table ip notrack-test {\n\
    chain pre {\n\
        type filter hook prerouting priority raw; policy accept;\n\
        iifname \"br0\" ip daddr 127.0.0.0/8 notrack\n\
    }\n\
}\n";

fn nft(ns: &str, args: &[&str]) -> String {
    let out = run_in(ns, "nft", args, None);
    assert_ok(&out, &format!("nft {args:?}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn untracked_packets_to_localhost_are_dropped_on_every_backend() {
    both(|backend| {
        let mut node = Node::new(backend);
        let c = node.topo.add_container(2);
        let attacker = node.topo.add_container(3).ns;
        let host = node.topo.node().to_string();
        let pid = node.topo.spawn_sleeper(&c.ns);
        let secrets = Secrets::bind(&host);
        arm(&attacker);
        let pristine = node.dump();
        load_nft(&host, NOTRACK);
        assert_eq!(
            secrets.attack(&attacker, "before"),
            (false, false),
            "{backend:?}: route_localnet=0 drops them as martians"
        );

        node.create("c2", Some(pid), &[("io.natledger.ports", "8080:80")]);
        assert_eq!(route_localnet(&host, "br0"), "1");
        assert_eq!(
            secrets.attack(&attacker, "guarded"),
            (false, false),
            "{backend:?}: an untracked packet to 127.0.0.1 passes the guard:\n{}",
            node.dump()
        );

        if backend == Backend::OwnNftables {
            let listed = nft(
                &host,
                &["-a", "list", "chain", "ip", "natledger", "NATLEDGER-INPUT"],
            );
            let handle = listed
                .lines()
                .find(|l| l.contains("ct state invalid,untracked drop"))
                .and_then(|l| l.rsplit("# handle ").next())
                .unwrap_or_else(|| panic!("no second guard rule:\n{listed}"))
                .trim()
                .to_string();
            nft(
                &host,
                &[
                    "delete",
                    "rule",
                    "ip",
                    "natledger",
                    "NATLEDGER-INPUT",
                    "handle",
                    &handle,
                ],
            );
            assert_eq!(
                secrets.attack(&attacker, "first rule only"),
                (true, true),
                "with `ct status ! dnat` alone the untracked packets must get through (or this \
                 test proves nothing)"
            );
            // The next create checks the shared rules and writes the missing one.
            let d = node.topo.add_container(4);
            let d_pid = node.topo.spawn_sleeper(&d.ns);
            node.create("c4", Some(d_pid), &[("io.natledger.ports", "8081:81")]);
            assert_eq!(secrets.attack(&attacker, "restored"), (false, false));
            assert_ok(&node.poststop("c4"), "poststop c4");
        }

        assert_ok(&node.poststop("c2"), "poststop c2");
        assert_ok(&node.sweep(&["--all"]), "sweep --all");
        nft(&host, &["delete", "table", "ip", "notrack-test"]);
        assert_eq!(node.dump(), pristine, "{backend:?}: sweep --all");
    });
}

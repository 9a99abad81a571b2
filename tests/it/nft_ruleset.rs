//! The nf_tables ruleset reader (`kernel::nftables::ruleset::read`) against the real kernel.

use natledger::kernel::named_netns::NamedNetns;
use natledger::kernel::netlink::{self, Socket};
use natledger::kernel::nftables::{Session, ruleset};

use crate::common::{in_netns, load_nft};

#[test]
fn scratch() {
    let ns = NamedNetns::create(format!("nlt-{}-rs", std::process::id())).unwrap();
    load_nft(ns.name(), &std::fs::read_to_string("/tmp/kp.nft").unwrap());
    let (rs, generation) = in_netns(ns.name(), || {
        let mut sock = Socket::netfilter().unwrap();
        ruleset::read(&mut Session::new(&mut sock)).unwrap()
    });
    println!("{generation} {rs:#?}");
}

/// The ruleset whose messages `src/kernel/nftables/ruleset/captured.hex` holds (the unit tests
/// decode them): regenerate with `cargo test --test it nft_ruleset::capture -- --ignored
/// --nocapture` and the lines starting with `0xa0`.
const CAPTURED: &str = r#"
table ip kube-proxy {
	comment "rules for kube-proxy"
	map no-endpoint-nodeports {
		type inet_proto . inet_service : verdict
		comment "vmap to drop or reject"
		elements = { tcp . 30080 comment "ns2/svc2:p80" : goto reject-chain }
	}
	chain reject-chain {
		reject
	}
	chain filter-input {
		type filter hook input priority -110; policy accept;
		ct state new jump nodeport-endpoints-check
	}
	chain nodeport-endpoints-check {
		fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports comment "hi"
	}
	chain service-X {
		numgen random mod 2 vmap { 0 : goto endpoint-A, 1 : goto endpoint-B }
	}
	chain endpoint-A {
		meta l4proto tcp dnat to 10.180.0.1:80
	}
	chain endpoint-B {
		meta l4proto tcp dnat to 10.180.0.2:80
	}
}
table inet netavark {
	set ports {
		type inet_service
		flags interval
		elements = { 1000-2000, 8080 }
	}
	map hostports {
		type ipv4_addr . inet_service : ipv4_addr . inet_service
		elements = { 0.0.0.0 . 8080 : 10.88.0.2 . 80 }
	}
	chain NETAVARK-HOSTPORT-DNAT {
		type nat hook prerouting priority dstnat; policy accept;
		ct state established,related accept
		ip daddr 10.0.0.0/12 udp dport @ports counter dnat ip to 10.88.0.3
		dnat ip to ip daddr . tcp dport map @hostports
		ip6 saddr != { fd00::/8 } iifname "eth*" tcp dport 1-1023 drop
	}
}
"#;

#[test]
#[ignore]
fn capture() {
    let ns = NamedNetns::create(format!("nlt-{}-cap", std::process::id())).unwrap();
    load_nft(ns.name(), CAPTURED);
    in_netns(ns.name(), || {
        let sock = Socket::netfilter().unwrap();
        let req = |get: u16, family: u8, attrs: &[(u16, &str)], seq: u32| {
            let mut m = Vec::new();
            let s = netlink::begin(&mut m, (10 << 8) | get, 0x301, seq);
            m.extend([family, 0, 0, 0]);
            for (k, v) in attrs {
                netlink::put_str(&mut m, *k, v);
            }
            netlink::finish(&mut m, s);
            m
        };
        let mut reqs = vec![req(1, 0, &[], 1), req(10, 0, &[], 2)];
        for (family, table, set) in [
            (2, "kube-proxy", "no-endpoint-nodeports"),
            (2, "kube-proxy", "__map0"),
            (1, "netavark", "ports"),
            (1, "netavark", "hostports"),
        ] {
            reqs.push(req(
                13,
                family,
                &[(1, table), (2, set)],
                reqs.len() as u32 + 1,
            ));
        }
        reqs.push(req(4, 0, &[], reqs.len() as u32 + 1));
        reqs.push(req(7, 0, &[], reqs.len() as u32 + 1));
        for (i, r) in reqs.iter().enumerate() {
            sock.dump(i as u32 + 1, r, |m| {
                let hex: String = m.payload.iter().map(|b| format!("{b:02x}")).collect();
                println!("{:#x} {hex}", m.kind);
                Ok(())
            })
            .unwrap();
        }
    });
}

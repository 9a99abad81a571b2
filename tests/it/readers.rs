//! The in-process readers against the real kernel: realistic rulesets of other owners
//! (Docker 20.10, kube-proxy, CNI portmap, netavark 1.4, hand-written rules, natledger's
//! own, its hairpin masquerade with the conntrack match included) are loaded with `iptables-legacy-restore` and `iptables-nft-restore` in a private
//! namespace, read back natively chain by chain, and compared token for token with
//! `*-save` of the same namespace. Deliberately unsupported shapes must come back opaque,
//! never narrower.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::Instant;

use crate::common::{Backend, Family as TestFamily, Topology, in_netns, load_rules, save};
use natledger::kernel::iptc::{self, render};
use natledger::kernel::netlink::Socket;
use natledger::kernel::nftables::Session;
use natledger::kernel::xt::OPAQUE;
use natledger::model::anyrule::{Cond, parse_rule};
use natledger::model::family::Family;
use natledger::model::save::parse_dump;

/// Counts heap bytes while `COUNTING` is on, for the memory figure of the benchmark (off,
/// the timings are not the counter's).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static CURRENT: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            let size = layout.size() as isize;
            let now = CURRENT.fetch_add(size, Ordering::Relaxed) + size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        if COUNTING.load(Ordering::Relaxed) {
            CURRENT.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The heap peak (bytes above the start) while `f` runs, every thread counted (tests running
/// meanwhile too: run alone for a clean figure). For `nft_ruleset`'s big read.
pub(crate) fn peak_while<T>(f: impl FnOnce() -> T) -> usize {
    CURRENT.store(0, Ordering::Relaxed);
    PEAK.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    let kept = f();
    COUNTING.store(false, Ordering::Relaxed);
    drop(kept);
    PEAK.load(Ordering::Relaxed).max(0) as usize
}

pub(crate) const V4_NAT: &str = r#"*nat
:DOCKER - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-ERIFXISQEP7F7OF4 - [0:0]
:KUBE-EXT-ERIFXISQEP7F7OF4 - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
:KUBE-SEP-ZXMNUKOKXUTL2MK2 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:CNI-DN-8c3b5a1f4e2d7c6b9a0e1 - [0:0]
:NETAVARK-HOSTPORT-DNAT - [0:0]
:NETAVARK-HOSTPORT-SETMARK - [0:0]
:NETAVARK-HOSTPORT-MASQ - [0:0]
:NETAVARK-1D8721804F16F - [0:0]
:NETAVARK-DN-1D8721804F16F - [0:0]
:HAND - [0:0]
:HANDGOTO - [0:0]
:HANDPOST - [0:0]
:NATLEDGER-HOSTPORTS - [0:0]
:NATLEDGER-MASQ - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A PREROUTING -m addrtype --dst-type LOCAL -j NETAVARK-HOSTPORT-DNAT
-A PREROUTING -j HAND
-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment natledger -j NATLEDGER-MASQ
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A POSTROUTING -s 172.17.0.2/32 -d 172.17.0.2/32 -p tcp -m tcp --dport 80 -j MASQUERADE
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A POSTROUTING -j NETAVARK-HOSTPORT-MASQ
-A POSTROUTING -s 10.88.0.0/16 -j NETAVARK-1D8721804F16F
-A POSTROUTING -j HANDPOST
-A DOCKER -i docker0 -j RETURN
-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80
-A DOCKER ! -i docker0 -p udp -m udp --dport 5353 -j DNAT --to-destination 172.17.0.3:53
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j KUBE-EXT-ERIFXISQEP7F7OF4
-A KUBE-EXT-ERIFXISQEP7F7OF4 -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-ERIFXISQEP7F7OF4 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SVC-ERIFXISQEP7F7OF4 ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-ERIFXISQEP7F7OF4 -m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-IT2ZTR26TO4XFPTO
-A KUBE-SVC-ERIFXISQEP7F7OF4 -m comment --comment "default/web:http -> 10.244.2.7:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-ZXMNUKOKXUTL2MK2
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.1.5/32 -m comment --comment default/web:http -j KUBE-MARK-MASQ
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p tcp -m comment --comment default/web:http -m tcp -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SEP-ZXMNUKOKXUTL2MK2 -s 10.244.2.7/32 -m comment --comment default/web:http -j KUBE-MARK-MASQ
-A KUBE-SEP-ZXMNUKOKXUTL2MK2 -p tcp -m comment --comment default/web:http -m tcp -j DNAT --to-destination 10.244.2.7:8080
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"cbr0\" id: \"4a5c0e2f\"" -m multiport --dports 8080,8443 -j CNI-DN-8c3b5a1f4e2d7c6b9a0e1
-A CNI-DN-8c3b5a1f4e2d7c6b9a0e1 -s 10.88.0.0/16 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-8c3b5a1f4e2d7c6b9a0e1 -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-8c3b5a1f4e2d7c6b9a0e1 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.88.0.5:80
-A CNI-DN-8c3b5a1f4e2d7c6b9a0e1 -s 10.88.0.0/16 -p tcp -m tcp --dport 8443 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-8c3b5a1f4e2d7c6b9a0e1 -p tcp -m tcp --dport 8443 -j DNAT --to-destination 10.88.0.5:443
-A NETAVARK-1D8721804F16F -d 10.88.0.0/16 -j ACCEPT
-A NETAVARK-1D8721804F16F ! -d 224.0.0.0/4 -j MASQUERADE
-A NETAVARK-HOSTPORT-MASQ -m comment --comment "netavark portfw masq mark" -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A NETAVARK-HOSTPORT-SETMARK -j MARK --set-xmark 0x2000/0x2000
-A NETAVARK-HOSTPORT-DNAT -p tcp -m tcp --dport 8081 -m comment --comment "dnat name: podman id: 6e7a1c" -j NETAVARK-DN-1D8721804F16F
-A NETAVARK-DN-1D8721804F16F -s 10.88.0.0/16 -p tcp -m tcp --dport 8081 -j NETAVARK-HOSTPORT-SETMARK
-A NETAVARK-DN-1D8721804F16F -s 127.0.0.1/32 -p tcp -m tcp --dport 8081 -j NETAVARK-HOSTPORT-SETMARK
-A NETAVARK-DN-1D8721804F16F -p tcp -m tcp --dport 8081 -j DNAT --to-destination 10.88.0.2:80
-A HAND -d 10.0.0.5/32 -j DNAT --to-destination 10.1.1.1
-A HAND -i eth+ -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 3128
-A HAND -p tcp -m tcp --dport 3000:3010 -j REDIRECT --to-ports 4000-4010
-A HAND ! -p udp -j RETURN
-A HAND ! -i lo -p udp -m udp --sport 53 --dport 1000:2000 -j DNAT --to-destination 10.1.1.2-10.1.1.9:5000-5010 --random --persistent
-A HAND -p tcp -m tcp ! --dport 22 -g HANDGOTO
-A HAND -s 192.168.0.0/255.255.0.255 -j RETURN
-A HAND -s 10.16.0.0/12 -d 10.1.2.128/25 -j RETURN
-A HAND -p tcp -m tcp --sport 1 --dport 2 -j RETURN
-A HAND -p tcp -m tcp ! --sport 1 ! --dport 2 -j RETURN
-A HAND -p tcp -m tcp --sport 1:9 ! --dport 2 -j RETURN
-A HAND -p tcp -m tcp --dport 0:1000 -j RETURN
-A HAND -p tcp -m tcp ! --dport 0:1000 -j RETURN
-A HAND -p tcp -m tcp --dport 1000:65535 -j RETURN
-A HAND -p udp -m udp ! --dport 7000:7100 -j RETURN
-A HAND -p sctp -m sctp --sport 10 --dport 5000:5001 -j RETURN
-A HAND -p tcp -m multiport ! --dports 1:100,200,300:400 -j RETURN
-A HAND -p tcp -m multiport --sports 1,2 -j RETURN
-A HAND -p udp -m multiport --ports 7 -j RETURN
-A HAND -m addrtype ! --src-type LOCAL,MULTICAST --dst-type UNICAST --limit-iface-in -j RETURN
-A HAND -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
-A HAND -m conntrack ! --ctstate NEW --ctorigdst 10.0.0.0/8 --ctorigdstport 80 --ctreplsrc 10.1.1.1 ! --ctreplsrcport 8000:8080 --ctdir REPLY -j RETURN
-A HAND -m conntrack --ctstatus ASSURED,CONFIRMED --ctproto 6 --ctexpire 10:20 -j RETURN
-A HAND -m state --state INVALID,UNTRACKED -j RETURN
-A HAND -m mark --mark 0x1 -j RETURN
-A HAND -m statistic --mode nth --every 3 --packet 1 -j RETURN
-A HAND -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -j RETURN
-A HAND -p tcp -m tcp ! --tcp-flags SYN,ACK ACK -j RETURN
-A HAND -f -j RETURN
-A HAND ! -f -p 47 -j RETURN
-A HAND -p icmp -m icmp --icmp-type 8 -j RETURN
-A HAND -p icmp -m icmp ! --icmp-type 3/1 -j RETURN
-A HAND -m comment --comment "say \"hi\" it's \\ ok" -j RETURN
-A HAND -p tcp -m tcp --dport 8000 -m string --algo bm --string "x y" -j RETURN
-A HAND -m hashlimit --hashlimit-upto 5/sec --hashlimit-name natledgertest -j RETURN
-A HAND -j LOG --log-prefix "nat: " --log-level 6 --log-uid
-A HAND -d 10.9.0.0/16 -j NETMAP --to 10.2.0.0/16
-A HANDGOTO -p tcp -m tcp --dport 25 -j DNAT --to-destination :2525
-A HANDPOST -s 10.1.0.0/16 -o eth0 -p udp -j SNAT --to-source 192.0.2.1-192.0.2.5:1024-2048 --random-fully
-A HANDPOST -o eth+ -p tcp -j MASQUERADE --to-ports 1024-2048 --random
-A HANDPOST -p udp -j MASQUERADE --to-ports 5000
-A NATLEDGER-HOSTPORTS -d 10.78.0.1/32 -p udp -m udp --dport 9000:9002 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:80-82/9000
-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:80
-A NATLEDGER-MASQ -s 127.0.0.0/8 -d 10.77.0.2/32 -p tcp -m tcp --dport 80 -m comment --comment natledger:c1 -j MASQUERADE
-A NATLEDGER-MASQ -s 10.77.0.0/24 -d 10.77.0.2/32 -p udp -m udp --dport 80:82 -m conntrack --ctstate DNAT --ctproto 17 --ctorigdst 10.78.0.1 --ctreplsrc 10.77.0.2 --ctorigdstport 9000:9002 --ctreplsrcport 80:82 -m comment --comment natledger:c1 -j MASQUERADE
COMMIT
"#;

const V4_FILTER: &str = r#"*filter
:DOCKER - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
:DOCKER-ISOLATION-STAGE-2 - [0:0]
:DOCKER-USER - [0:0]
:HANDF - [0:0]
-P FORWARD DROP
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A FORWARD -i docker0 -o docker0 -j ACCEPT
-A FORWARD -j HANDF
-A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
-A DOCKER-ISOLATION-STAGE-2 -j RETURN
-A DOCKER-USER -j RETURN
-A HANDF -o eth+ -p tcp -m tcp --dport 22 -j REJECT --reject-with tcp-reset
-A HANDF ! -o veth1234567890a -j REJECT --reject-with icmp-port-unreachable
-A HANDF -i + -j REJECT --reject-with icmp-host-prohibited
-A HANDF ! -i + -j LOG
-A HANDF -m physdev --physdev-in eth0 -j ACCEPT
-A HANDF -p tcp -m tcp --dport 9
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
"#;

pub(crate) const V6_NAT: &str = r#"*nat
:DOCKER - [0:0]
:HAND6 - [0:0]
:NATLEDGER-HOSTPORTS - [0:0]
:NATLEDGER-MASQ - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A PREROUTING -j HAND6
-A OUTPUT ! -d ::1/128 -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s fd00:dead:beef::/64 ! -o docker0 -j MASQUERADE
-A POSTROUTING -o eth0 -j SNAT --to-source 2001:db8::1-2001:db8::9
-A POSTROUTING -p tcp -j MASQUERADE --to-ports 2000-3000
-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00:dead:beef::2]:80
-A HAND6 -d 2001:db8::5/128 -j DNAT --to-destination 2001:db8::1
-A HAND6 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 3128
-A HAND6 -s 2001:db8::/ffff:ffff::ffff -j RETURN
-A HAND6 -s 2001:db8:1::/48 ! -d 2001:db8:2:3::/60 -j RETURN
-A HAND6 -d ::ffff:10.0.0.1/128 -j RETURN
-A HAND6 -d ::10.0.0.1/128 -j RETURN
-A HAND6 -p ipv6-icmp -j RETURN
-A HAND6 -m conntrack --ctorigdst 2001:db8::/32 ! --ctorigsrc 2001:db8::1 -j RETURN
-A HAND6 -p udp -m udp --dport 5000:5010 -j DNAT --to-destination [2001:db8::1]:6000-6010
-A HAND6 -p udp -m udp --dport 5020 -j DNAT --to-destination :6020
-A HAND6 -p tcp -m multiport --dports 80,443 -j DNAT --to-destination [2001:db8::1-2001:db8::3]:8080
-A HAND6 -m string --algo kmp --string y -j RETURN
-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT --to-destination [fd77::2]:80
-A NATLEDGER-MASQ -s fd77::/64 -d fd77::2/128 -p tcp -m tcp --dport 80 -m conntrack --ctstate DNAT --ctproto 6 --ctreplsrc fd77::2 --ctorigdstport 8080 --ctreplsrcport 80 -m comment --comment natledger:c1 -j MASQUERADE
COMMIT
"#;

const V6_FILTER: &str = r#"*filter
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -o eth+ -p tcp -m tcp --dport 25 -j REJECT --reject-with icmp6-adm-prohibited
-A FORWARD -p tcp -m tcp --dport 26 -j REJECT --reject-with tcp-reset
-A FORWARD -p 132 -j REJECT --reject-with icmp6-port-unreachable
-A DOCKER-USER -j RETURN
COMMIT
"#;

/// Rules whose `*-save` line is expected not to decode exactly, per backend: the match or
/// target named must come back opaque.
fn expected_opaque(backend: Backend, line: &str) -> Option<&'static str> {
    let cases: [(&str, &str); 6] = [
        ("-m string", "string"),
        ("-m hashlimit", "hashlimit"),
        ("-m physdev", "physdev"),
        ("-j NETMAP", "NETMAP"),
        // iptables-nft's one compare of both ports: != is "either differs" in the kernel.
        ("! --sport 1 ! --dport 2", "nft:cmp"),
        ("", ""),
    ];
    cases
        .iter()
        .filter(|(needle, _)| !needle.is_empty() && line.contains(needle))
        .filter(|(_, what)| backend == Backend::IptablesNft || !what.starts_with("nft:"))
        .map(|(_, what)| *what)
        .next()
}

const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

pub(crate) struct Native {
    chains: Vec<(String, String)>,
    pub(crate) rules: Vec<(String, Vec<String>)>,
}

pub(crate) fn read_native(
    ns: &str,
    backend: Backend,
    family: Family,
    table: &'static str,
) -> Native {
    in_netns(ns, || match backend {
        Backend::IptablesLegacy => {
            let blob = iptc::read(family, table).unwrap();
            let chains = render::chains(&blob);
            let mut rules = Vec::new();
            for (chain, _) in &chains {
                for args in render::chain_rules(&blob, chain).unwrap() {
                    rules.push((chain.clone(), args));
                }
            }
            Native { chains, rules }
        }
        Backend::OwnNftables => unreachable!("iptables backends only"),
        Backend::IptablesNft => {
            let mut sock = Socket::netfilter().unwrap();
            let mut session = Session::new(&mut sock);
            let chains: Vec<(String, String)> = session
                .chains(family, table)
                .unwrap()
                .into_iter()
                .map(|c| (c.name.clone(), c.policy_text().to_string()))
                .collect();
            let mut rules = Vec::new();
            for (chain, _) in &chains {
                let n = session
                    .each_rule(family, table, chain, None, |_, _, args| {
                        rules.push((chain.clone(), args.to_vec()))
                    })
                    .unwrap();
                assert!(n.is_some(), "{chain} listed but not found");
            }
            Native { chains, rules }
        }
    })
}

pub(crate) fn test_family(family: Family) -> TestFamily {
    match family {
        Family::Ipv4 => TestFamily::V4,
        Family::Ipv6 => TestFamily::V6,
    }
}

/// Load every ruleset, then compare each table's native reading with `*-save`. Returns
/// (exact, opaque) rule counts.
fn compare(backend: Backend) -> (usize, usize) {
    let topo = Topology::new();
    let ns = topo.node().to_string();
    let (mut exact, mut opaque) = (0, 0);
    for family in Family::ALL {
        let sets: &[&str] = match family {
            Family::Ipv4 => &[V4_NAT, V4_FILTER],
            Family::Ipv6 => &[V6_NAT, V6_FILTER],
        };
        for text in sets {
            load_rules(&ns, backend, test_family(family), text);
        }
        let dump = save(&ns, backend, test_family(family));
        let tables = parse_dump(&dump).unwrap();
        for table in ["nat", "filter"] {
            let saved = tables.iter().find(|t| t.name == table).unwrap();
            let native = read_native(&ns, backend, family, table);
            let what = format!("{} {family} {table}", backend.name());
            // iptables-nft creates a table's base chains only when a rule or policy needs
            // them, and iptables-nft-save lists the absent ones as `ACCEPT` all the same.
            let listed: Vec<(String, String)> = saved
                .chains
                .iter()
                .filter(|(c, policy)| {
                    let absent = !native.chains.iter().any(|(n, _)| n == c);
                    let builtin = BUILTIN.contains(&c.as_str()) && policy == "ACCEPT";
                    !(backend == Backend::IptablesNft && absent && builtin)
                })
                .cloned()
                .collect();
            assert_eq!(native.chains, listed, "{what}: chains");
            assert_eq!(native.rules.len(), saved.rules.len(), "{what}: rule count");
            for ((chain, args), want) in native.rules.iter().zip(&saved.rules) {
                assert_eq!(chain, &want.chain, "{what}: rule order");
                let line = format!("-A {chain} {}", want.args.join(" "));
                match expected_opaque(backend, &line) {
                    None => {
                        assert_eq!(args, &want.args, "{what}: {line}");
                        exact += 1;
                    }
                    Some(name) => {
                        opaque += 1;
                        check_opaque(&what, &line, name, args);
                    }
                }
            }
        }
    }
    (exact, opaque)
}

/// An opaque rule: the marker is there, matchset sees an unknown condition, and nothing the
/// rule had is lost (every decoded condition other than the opaque one is in `*-save`).
fn check_opaque(what: &str, line: &str, name: &str, args: &[String]) {
    let decoded = args.join(" ");
    if name.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
        // A target: its name only.
        assert!(
            decoded.ends_with(&format!("-j {name}")),
            "{what}: {line}\n decoded: {decoded}"
        );
        return;
    }
    let marker = format!("-m {name} {OPAQUE}");
    assert!(
        decoded.contains(&marker),
        "{what}: {line}\n decoded: {decoded}"
    );
    let (m, _) = parse_rule(args);
    assert!(
        m.conds.contains(&Cond::Other(marker.as_str().into())),
        "{what}: {decoded}: {:?}",
        m.conds
    );
}

/// Every owner's rules read natively from iptables-legacy equal `iptables-legacy-save` token
/// for token; the unsupported shapes are opaque.
#[test]
fn legacy_rules_of_every_owner_read_as_iptables_legacy_save_prints_them() {
    let (exact, opaque) = compare(Backend::IptablesLegacy);
    eprintln!("legacy: {exact} rules exact, {opaque} opaque");
    assert!(exact >= 130, "{exact}");
    assert_eq!(opaque, 5);
}

/// The same through iptables-nft's nf_tables encoding and `iptables-nft-save`.
#[test]
fn nft_rules_of_every_owner_read_as_iptables_nft_save_prints_them() {
    let (exact, opaque) = compare(Backend::IptablesNft);
    eprintln!("nft: {exact} rules exact, {opaque} opaque");
    assert!(exact >= 130, "{exact}");
    assert_eq!(opaque, 6);
}

/// `cargo test --release --test it -- --ignored --nocapture readers::`: time and heap peak of
/// decoding a 10,000-rule chain on each backend.
#[test]
#[ignore]
fn bench_decoding_a_10000_rule_chain() {
    const RULES: usize = 10_000;
    let topo = Topology::new();
    let ns = topo.node().to_string();
    let mut text = String::from("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    for i in 0..RULES {
        let (a, b) = (i / 250, i % 250 + 1);
        if i % 2 == 0 {
            text += &format!(
                "-A KUBE-SERVICES -d 10.96.{a}.{b}/32 -p tcp -m comment --comment \
                 \"ns{a}/svc{b}:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n"
            );
        } else {
            text += &format!(
                "-A KUBE-SERVICES -d 10.97.{a}.{b}/32 -p tcp -m comment --comment \
                 \"ns{a}/svc{b}:http\" -m tcp --dport 8080 -j DNAT --to-destination \
                 10.244.{a}.{b}:8080\n"
            );
        }
    }
    text += "COMMIT\n";
    for backend in [Backend::IptablesLegacy, Backend::IptablesNft] {
        load_rules(&ns, backend, TestFamily::V4, &text);
        in_netns(&ns, || {
            // Three timed rounds, then one with the heap counted.
            for round in 0..4 {
                let counted = round == 3;
                CURRENT.store(0, Ordering::Relaxed);
                PEAK.store(0, Ordering::Relaxed);
                COUNTING.store(counted, Ordering::Relaxed);
                let started = Instant::now();
                let mut read_part = std::time::Duration::ZERO;
                let mut count = 0;
                let mut tokens = 0;
                match backend {
                    Backend::IptablesLegacy => {
                        let blob = iptc::read(Family::Ipv4, "nat").unwrap();
                        read_part = started.elapsed();
                        let span = blob.chain("KUBE-SERVICES").unwrap();
                        let mut args = Vec::new();
                        for (at, e) in blob.rules(span) {
                            args.clear();
                            render::rule_args(&blob, at, e, &mut args);
                            count += 1;
                            tokens += args.len();
                        }
                    }
                    Backend::OwnNftables => unreachable!("iptables backends only"),
                    Backend::IptablesNft => {
                        let mut sock = Socket::netfilter().unwrap();
                        let mut session = Session::new(&mut sock);
                        session
                            .each_rule(Family::Ipv4, "nat", "KUBE-SERVICES", None, |_, _, args| {
                                count += 1;
                                tokens += args.len();
                            })
                            .unwrap();
                    }
                }
                let took = started.elapsed();
                COUNTING.store(false, Ordering::Relaxed);
                if backend == Backend::IptablesNft && !counted {
                    // The kernel's share: the same dump, nothing decoded.
                    read_part = raw_dump(Family::Ipv4, "nat", "KUBE-SERVICES");
                }
                assert_eq!(count, RULES);
                if counted {
                    let peak = PEAK.load(Ordering::Relaxed) as f64 / (1 << 20) as f64;
                    eprintln!("{}: heap peak {peak:.2} MiB", backend.name());
                } else {
                    let what = match backend {
                        Backend::IptablesLegacy => "IPT_SO_GET_ENTRIES alone",
                        Backend::IptablesNft => "the bare dump, undecoded",
                        Backend::OwnNftables => unreachable!("iptables backends only"),
                    };
                    eprintln!(
                        "{} round {round}: {RULES} rules ({tokens} tokens) in {:.2} ms \
                         ({what}: {:.2} ms)",
                        backend.name(),
                        took.as_secs_f64() * 1e3,
                        read_part.as_secs_f64() * 1e3,
                    );
                }
            }
        });
    }
}

/// A GETRULE dump of one chain with nothing decoded: how long the kernel takes to send it.
fn raw_dump(family: Family, table: &str, chain: &str) -> std::time::Duration {
    use natledger::kernel::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST};
    let sock = Socket::netfilter().unwrap();
    let mut m = Vec::new();
    let start = netlink::begin(&mut m, (10 << 8) | 7, NLM_F_REQUEST | NLM_F_DUMP, 1);
    let af = match family {
        Family::Ipv4 => libc::AF_INET,
        Family::Ipv6 => libc::AF_INET6,
    };
    m.extend([af as u8, 0, 0, 0]);
    netlink::put_str(&mut m, 1, table);
    netlink::put_str(&mut m, 2, chain);
    netlink::finish(&mut m, start);
    let started = Instant::now();
    let mut n = 0;
    sock.dump(1, &m, |_| {
        n += 1;
        Ok(())
    })
    .unwrap();
    assert!(n > 0);
    started.elapsed()
}

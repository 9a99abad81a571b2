use super::*;
use crate::analysis::iptables::nat_walk::{Chains, Kept, MAX_VISITS, Step, walk};
use crate::model::portspec::parse_entry;
use crate::model::save::parse_dump;
use std::collections::HashMap;

const LOCALS: [&str; 3] = ["10.78.0.1/32", "127.0.0.0/8", "fd78::1/128"];

fn locals() -> Vec<IpNet> {
    LOCALS.iter().map(|a| a.parse().unwrap()).collect()
}

fn found(text: &str, spec: &str) -> Vec<String> {
    let table = parse_dump(text).unwrap().remove(0);
    let m = parse_entry(spec).unwrap();
    let packet = probe(Some(&m), Family::Ipv4, &locals());
    let mut t = Saved::new(&table);
    walk(&mut t, &packet)
        .unwrap()
        .iter()
        .map(|c| {
            let r = c.rule();
            format!("{} {}", r.chain, r.position)
        })
        .collect()
}

const HOST: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    :DOCKER - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
    :KUBE-SVC-A - [0:0]\n:KUBE-SEP-A - [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n\
    :CNI-DN-x - [0:0]\n:NATLEDGER-HOSTPORTS - [0:0]\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment natledger -j NATLEDGER-HOSTPORTS\n\
    -A PREROUTING -j KUBE-SERVICES\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
    -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER\n\
    -A DOCKER -i docker0 -j RETURN\n\
    -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80\n\
    -A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-SVC-A\n\
    -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
    -A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-SVC-A\n\
    -A KUBE-SVC-A -m statistic --mode random --probability 0.5 -j KUBE-SEP-A\n\
    -A KUBE-SEP-A -p tcp -j DNAT --to-destination 10.244.0.5:80\n\
    -A CNI-HOSTPORT-DNAT -p udp -m multiport --dports 5353,9000:9010 -j CNI-DN-x\n\
    -A CNI-DN-x -p udp -m udp --dport 9005 -j DNAT --to-destination 10.88.0.2:53\n\
    -A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport 8080 -m comment --comment natledger:c1 -j DNAT --to-destination 10.77.0.2:80\n\
    COMMIT\n";

#[test]
fn finds_each_owners_forward_of_the_port_and_nothing_else() {
    // Docker's, from PREROUTING and from OUTPUT; natledger's own is not another's.
    assert_eq!(found(HOST, "8080:80"), ["DOCKER 2", "DOCKER 2"]);
    // kube-proxy's NodePort, through KUBE-SERVICES, KUBE-NODEPORTS and the endpoints.
    assert_eq!(found(HOST, "30080:80"), ["KUBE-SEP-A 1"]);
    // CNI portmap's, through the multiport jump.
    assert_eq!(found(HOST, "9005:53/udp"), ["CNI-DN-x 1"]);
    // Nothing: another port, another protocol, kube's ClusterIP (not a host address).
    assert!(found(HOST, "8081:80").is_empty());
    assert!(found(HOST, "8080:80/udp").is_empty());
    assert!(found(HOST, "53:53/udp").is_empty());
    // A host address the rule does not name still may be taken; one it excludes is not.
    let hand = "*nat\n:PREROUTING ACCEPT [0:0]\n\
        -A PREROUTING -d 10.78.0.1/32 -p tcp -j DNAT --to-destination 10.1.1.1\n\
        -A PREROUTING -p tcp -j REDIRECT --to-ports 3128\nCOMMIT\n";
    assert_eq!(found(hand, "10.78.0.1:8080:80"), ["PREROUTING 1"]);
    assert_eq!(found(hand, "127.0.0.1:8080:80"), ["PREROUTING 2"]);
    assert_eq!(found(hand, "8080:80"), ["PREROUTING 1", "PREROUTING 2"]);
    // Every 127.0.0.0/8 address is this host's, not only 127.0.0.1.
    let resolver = "*nat\n:OUTPUT ACCEPT [0:0]\n\
        -A OUTPUT -d 127.0.0.53/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.1.1.1\n\
        COMMIT\n";
    assert_eq!(found(resolver, "53:53/udp"), ["OUTPUT 1"]);
    assert!(found(resolver, "127.0.0.1:53:53/udp").is_empty());
}

#[test]
fn candidates_for_any_port_serve_every_port() {
    let table = parse_dump(HOST).unwrap().remove(0);
    let mut t = Saved::new(&table);
    let any = walk(&mut t, &probe(None, Family::Ipv4, &locals())).unwrap();
    for spec in ["8080:80", "30080:80", "9005:53/udp", "8081:80", "53:53/udp"] {
        let m = parse_entry(spec).unwrap();
        let packet = probe(Some(&m), Family::Ipv4, &locals());
        let narrowed = taken(&any, &packet);
        let from_cache: Vec<&Step> = narrowed.iter().map(Candidate::rule).collect();
        let direct = walk(&mut t, &packet).unwrap();
        let direct: Vec<&Step> = direct.iter().map(Candidate::rule).collect();
        assert_eq!(from_cache, direct, "{spec}");
    }
}

#[test]
fn the_cache_carries_over_natledgers_own_transactions_only() {
    let here = Scope::here(&locals());
    let entry = |generation| CacheEntry {
        family: Family::Ipv4,
        generation,
        scope: here.clone(),
        candidates: Some(Vec::new()),
    };
    let mut cache = Cache::default();
    cache.put(entry(7));
    assert!(cache.valid(Family::Ipv4, 7, &here).is_some());
    assert!(cache.valid(Family::Ipv4, 8, &here).is_none());
    // Other addresses, another boot, another network namespace: not valid.
    assert!(
        cache
            .valid(Family::Ipv4, 7, &Scope::here(&locals()[..1]))
            .is_none()
    );
    let rebooted = Scope {
        boot_id: Some("another boot".into()),
        ..here.clone()
    };
    assert!(cache.valid(Family::Ipv4, 7, &rebooted).is_none());
    let elsewhere = Scope {
        netns: here.netns.map(|n| n + 1),
        ..here.clone()
    };
    assert!(cache.valid(Family::Ipv4, 7, &elsewhere).is_none());
    cache.carry(7, 9, 2);
    assert!(cache.valid(Family::Ipv4, 9, &here).is_some());
    // Someone else committed too: dropped.
    cache.carry(9, 12, 2);
    assert!(cache.entries.is_empty());
}

/// A kube-proxy nat table of `services` NodePorts with `endpoints` each, as it writes them.
fn kube_nodeports(services: usize, endpoints: usize) -> String {
    let mut chains = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    let mut rules = String::from(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n",
    );
    for s in 0..services {
        let port = 30000 + s;
        chains.push_str(&format!(":KUBE-EXT-{s} - [0:0]\n:KUBE-SVC-{s} - [0:0]\n"));
        rules.push_str(&format!(
            "-A KUBE-SERVICES -d 10.96.{}.{}/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-{s}\n\
             -A KUBE-NODEPORTS -p tcp -m tcp --dport {port} -j KUBE-EXT-{s}\n\
             -A KUBE-EXT-{s} -j KUBE-MARK-MASQ\n-A KUBE-EXT-{s} -j KUBE-SVC-{s}\n",
            s / 256,
            s % 256
        ));
        for e in 0..endpoints {
            chains.push_str(&format!(":KUBE-SEP-{s}-{e} - [0:0]\n"));
            let left = endpoints - e;
            if left > 1 {
                rules.push_str(&format!(
                    "-A KUBE-SVC-{s} -m statistic --mode random --probability 0.5 -j KUBE-SEP-{s}-{e}\n"
                ));
            } else {
                rules.push_str(&format!("-A KUBE-SVC-{s} -j KUBE-SEP-{s}-{e}\n"));
            }
            rules.push_str(&format!(
                "-A KUBE-SEP-{s}-{e} -s 10.244.{e}.9/32 -j KUBE-MARK-MASQ\n\
                 -A KUBE-SEP-{s}-{e} -p tcp -m tcp -j DNAT --to-destination 10.244.{e}.9:8080\n"
            ));
        }
    }
    rules.push_str("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\nCOMMIT\n");
    chains + &rules
}

#[test]
fn the_whole_nodeport_range_is_walked_within_the_budget() {
    let table = parse_dump(&kube_nodeports(2768, 10)).unwrap().remove(0);
    let mut t = Saved::new(&table);
    // To any port: PREROUTING and OUTPUT each reach every endpoint's DNAT; too many to cache.
    let any = probe(None, Family::Ipv4, &locals());
    let (found, visits) = walk_counted(&mut t, &any, usize::MAX).unwrap();
    assert_eq!(found.len(), 2 * 2768 * 10);
    assert!(visits < MAX_VISITS / 2, "{visits} visits");
    assert!(matches!(
        walk_counted(&mut t, &any, MAX_CACHED),
        Err(WalkError::TooMany)
    ));
    // To one NodePort: only its service's endpoints, about 90 rules looked at.
    let m = parse_entry("30005:80").unwrap();
    let one = probe(Some(&m), Family::Ipv4, &locals());
    let (found, visits) = walk_counted(&mut t, &one, usize::MAX).unwrap();
    assert_eq!(found.len(), 2 * 10);
    assert!(
        found
            .iter()
            .all(|c| c.path.iter().any(|s| s.chain == "KUBE-EXT-5"))
    );
    assert!(visits < 200, "{visits} visits");
}

#[test]
fn chains_that_multiply_the_walk_give_no_answer() {
    // C0 jumps twice to C1, which jumps twice to C2...: 2^24 walks of C24 without a loop.
    let depth = 24;
    let mut text = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for i in 0..=depth {
        text.push_str(&format!(":C{i} - [0:0]\n"));
    }
    text.push_str("-A PREROUTING -j C0\n");
    for i in 0..depth {
        let next = i + 1;
        text.push_str(&format!("-A C{i} -j C{next}\n-A C{i} -j C{next}\n"));
    }
    text.push_str(&format!(
        "-A C{depth} -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.9.0.1:80\nCOMMIT\n"
    ));
    let table = parse_dump(&text).unwrap().remove(0);
    let mut t = Saved::new(&table);
    let cut = walk(&mut t, &probe(None, Family::Ipv4, &locals())).unwrap_err();
    assert!(matches!(cut, WalkError::TooBranched), "{cut}");
}

/// A source that counts how often each chain is read.
struct Counting<'t> {
    inner: Saved<'t>,
    reads: HashMap<String, usize>,
}

impl Chains for Counting<'_> {
    type Error = std::convert::Infallible;

    fn rules(
        &mut self,
        chain: &str,
        keep: &mut dyn FnMut(&[String]) -> bool,
    ) -> Result<Option<Kept>, Self::Error> {
        *self.reads.entry(chain.to_string()).or_default() += 1;
        self.inner.rules(chain, keep)
    }
}

#[test]
fn several_mappings_read_each_chain_once_and_find_what_each_walk_finds() {
    let table = parse_dump(HOST).unwrap().remove(0);
    let specs = ["8080:80", "30080:80", "9005:53/udp", "53:53/udp"];
    let packets: Vec<Packet> = specs
        .iter()
        .map(|s| probe(Some(&parse_entry(s).unwrap()), Family::Ipv4, &locals()))
        .collect();
    let mut counting = Counting {
        inner: Saved::new(&table),
        reads: HashMap::new(),
    };
    let together = walk_each(&mut counting, &packets).unwrap();
    assert!(
        counting.reads.values().all(|&n| n == 1),
        "{:?}",
        counting.reads
    );
    let mut one_by_one = Vec::new();
    for packet in &packets {
        one_by_one.push(walk(&mut Saved::new(&table), packet).unwrap());
    }
    assert_eq!(together, one_by_one);
    assert!(together.iter().any(|c| !c.is_empty()));
}

#[test]
fn each_mapping_gets_the_forwards_it_meets_first() {
    // Port 80 is certainly taken by rule 1; rule 2 takes every other TCP port.
    let text = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.9.0.1:80\n\
        -A PREROUTING -p tcp -j DNAT --to-destination 10.9.0.2:80\n\
        -A PREROUTING -p tcp -m tcp --dport 7000 -j NETMAP --to 10.9.1.0/24\nCOMMIT\n";
    let table = parse_dump(text).unwrap().remove(0);
    let packets: Vec<Packet> = ["80:80", "81:80", "7000:70"]
        .iter()
        .map(|s| probe(Some(&parse_entry(s).unwrap()), Family::Ipv4, &locals()))
        .collect();
    let positions = |lists: &[Vec<Candidate>]| -> Vec<Vec<usize>> {
        lists
            .iter()
            .map(|l| l.iter().map(|c| c.rule().position).collect())
            .collect()
    };
    let direct = walk_each(&mut Saved::new(&table), &packets).unwrap();
    // 80: rule 1 only; 81: rule 2; 7000: rule 2 takes it before the NETMAP is reached.
    assert_eq!(positions(&direct), [vec![1], vec![2], vec![2]]);
    // From the walk to any port, narrowed per packet: the same.
    let any = walk(
        &mut Saved::new(&table),
        &probe(None, Family::Ipv4, &locals()),
    )
    .unwrap();
    let narrowed: Vec<Vec<Candidate>> = packets.iter().map(|p| taken(&any, p)).collect();
    assert_eq!(positions(&narrowed), [vec![1], vec![2], vec![2]]);
    // A NETMAP is a forward too.
    let udp_first = text.replace("-p tcp -j DNAT", "-p udp -j DNAT");
    let table = parse_dump(&udp_first).unwrap().remove(0);
    let found = walk(&mut Saved::new(&table), &packets[2]).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].rule().position, 3);
}

#[test]
fn a_mappings_own_host_address_is_a_destination() {
    let m = parse_entry("10.99.0.5:8080:80").unwrap();
    let nets = destinations(Family::Ipv4, &[&m]);
    assert!(nets.contains(&"10.99.0.5/32".parse().unwrap()), "{nets:?}");
    assert!(nets.contains(&"127.0.0.0/8".parse().unwrap()));
    assert!(
        destinations(Family::Ipv6, &[&m])
            .iter()
            .all(|n| n.addr.is_ipv6())
    );
}

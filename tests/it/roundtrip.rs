//! The rule model against the real backends: a rule rendered by natledger, applied with
//! `*-restore` (or, on nftables, encoded into natledger's own table), read back with
//! `*-save` (or decoded from a netlink dump) and parsed, equals the rule written, on every
//! backend and both families (the hairpin masquerade of a known subnet, with its conntrack
//! match, included). On nftables its IPv6 filter table is never written and reads as
//! none.

use crate::common::{Topology, in_netns};
use natledger::backend::{Backend, Netfilter, Plan, Reading};
use natledger::kernel::exec::SystemRunner;
use natledger::model::family::{Family, IfAddr};
use natledger::model::layout::{TABLES, mapping_rules, owned_chains, shared_rules};
use natledger::model::portspec::parse_entry;
use natledger::model::rule::Rule;
use natledger::model::save::{Batch, Op};

fn at(addr: &str, prefix: Option<u8>) -> IfAddr {
    IfAddr {
        addr: addr.parse().unwrap(),
        prefix,
    }
}

#[test]
fn rendered_rules_read_back_equal() {
    let topo = Topology::new();
    let id = "0123abcd".parse().unwrap();
    let specs = [
        "8080:80",
        "127.0.0.1:8081:81/udp",
        "10.78.0.1:9000-9009:9000-9009/sctp",
        "[fd78::1]:8082:82",
        "[::]:7000-7002:80-82/udp",
    ];
    for backend in Backend::ALL {
        for family in Family::ALL {
            // A bare address, and one with its subnet (the hairpin masquerade's shape).
            let containers = match family {
                Family::Ipv4 => [at("10.77.0.2", None), at("10.77.1.3", Some(24))],
                Family::Ipv6 => [at("fd77::2", None), at("fd77:1::3", Some(64))],
            };
            for table in TABLES {
                let mut written: Vec<(String, Rule)> = shared_rules(backend, table, family)
                    .into_iter()
                    .map(|(c, r)| (c.to_string(), r))
                    .collect();
                for spec in specs {
                    let m = parse_entry(spec).unwrap();
                    if m.family().is_some_and(|f| f != family) {
                        continue;
                    }
                    // nf_tables cannot map a host port range to another container range.
                    let shifted = m.host_ports != m.container_ports && !m.host_ports.is_single();
                    if backend == Backend::OwnNftables && shifted {
                        continue;
                    }
                    for container in containers {
                        written.extend(
                            mapping_rules(backend, &id, &m, container)
                                .into_iter()
                                .filter(|p| p.table == table)
                                .map(|p| (p.chain.to_string(), p.rule)),
                        );
                    }
                }
                let mut batch = Batch::new(table);
                for chain in owned_chains(backend, table, family) {
                    batch.ops.push(Op::DeclareChain(chain.to_string()));
                }
                batch.ops.extend(
                    written
                        .iter()
                        .map(|(c, r)| Op::Append(c.clone(), r.to_args())),
                );
                let read = in_netns(topo.node(), || {
                    let runner = SystemRunner::default();
                    let nf = Netfilter::new(&runner);
                    let driver = backend.driver();
                    driver
                        .apply_plan(&nf, family, &Plan::batch(&batch))
                        .unwrap();
                    driver.read(&nf, family, table, Reading::Ours).unwrap()
                });
                // natledger's nftables backend has nothing for IPv6 filter (no forward
                // accept, the localhost guard is IPv4's): nothing is written there, and it
                // reads as no table at all.
                let nothing =
                    (backend, family, table) == (Backend::OwnNftables, Family::Ipv6, "filter");
                let Some(read) = read else {
                    assert!(nothing, "{backend} {family} {table}: no table read back");
                    assert!(
                        written.is_empty(),
                        "{backend} {family} {table}: {written:?}"
                    );
                    continue;
                };
                assert!(!nothing, "{backend} {family} {table}: a table read back");
                let mut read: Vec<(String, Rule)> = read
                    .rules
                    .iter()
                    .map(|r| (r.chain.clone(), Rule::parse_args(&r.args).unwrap()))
                    .collect();
                // *-save groups rules by chain; within a chain the order must be kept.
                read.sort_by(|a, b| a.0.cmp(&b.0));
                written.sort_by(|a, b| a.0.cmp(&b.0));
                assert_eq!(read, written, "{backend} {family} {table}");
                let at_least = match (table, backend, family) {
                    ("nat", _, _) => 5,
                    // The localhost guard and its jump only.
                    (_, Backend::OwnNftables, _) => 1,
                    _ => 2,
                };
                assert!(
                    written.len() > at_least,
                    "{backend} {family} {table}: rules were generated"
                );
            }
        }
    }
}

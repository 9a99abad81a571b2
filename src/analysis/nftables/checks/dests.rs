//! Where the checks send a packet to a host port when the host's addresses are not known (a
//! dump, or a namespace with only `lo`): the addresses rules compare a destination with,
//! without crossing each with every port.
//!
//! Addresses alike in every comparison but those that pair them with a port (kube-proxy's
//! ClusterIPs: each in `cluster-ips`, each paired with its own port in `service-ips`'
//! `ip daddr . meta l4proto . th dport` elements) form one group. A packet to port `p` of a
//! member not paired with `p` meets exactly what the same packet to any other such member
//! meets, so one of them stands for the group at `p`; the members paired with `p` are probed
//! at `p` themselves (of the protocol paired, when the key names one). A prefix or range an address falls in counts as a comparison of its
//! own, so addresses told apart by one are never in one group. A documentation address of
//! each family stands for the host's own addresses no rule names.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use crate::model::ruleset::{Key, Nat, NatAddr, NftTable, Operand, Ruleset, SetRef, Stmt, Value};

/// The addresses to probe, grouped.
#[derive(Debug, Default)]
pub(crate) struct Dests {
    /// Addresses alike but for the ports paired with them, each group sorted.
    groups: Vec<Vec<IpAddr>>,
    /// The ports paired with an address, with their protocol (`None`: every protocol).
    paired: HashMap<IpAddr, BTreeSet<(Option<u8>, u16)>>,
    /// The addresses paired with a port.
    by_port: HashMap<u16, Vec<(Option<u8>, IpAddr)>>,
}

impl Dests {
    /// Each of `addrs` probed at every port.
    pub(crate) fn each(addrs: &[IpAddr]) -> Dests {
        Dests {
            groups: addrs.iter().map(|a| vec![*a]).collect(),
            ..Dests::default()
        }
    }

    /// Every address of the groups.
    pub(crate) fn all(&self) -> Vec<IpAddr> {
        self.groups.iter().flatten().copied().collect()
    }

    /// The addresses standing for every one of them at `port` of protocol `proto`.
    pub(crate) fn at(&self, proto: u8, port: u16) -> Vec<IpAddr> {
        let hits = |p: &Option<u8>| p.is_none_or(|p| p == proto);
        let mut out: Vec<IpAddr> = self
            .groups
            .iter()
            .filter_map(|g| {
                g.iter()
                    .find(|a| {
                        !self
                            .paired
                            .get(a)
                            .is_some_and(|ps| ps.iter().any(|(p, n)| *n == port && hits(p)))
                    })
                    .copied()
            })
            .collect();
        let paired = self.by_port.get(&port).into_iter().flatten();
        out.extend(paired.filter(|(p, _)| hits(p)).map(|(_, a)| *a));
        out.sort();
        out.dedup();
        out
    }

    /// The destinations of `rs`'s comparisons, grouped, and a documentation address of each
    /// family standing for the host's own.
    pub(crate) fn of(rs: &Ruleset) -> Dests {
        let mut seen = Compared::default();
        for t in &rs.tables {
            for s in t
                .chains
                .iter()
                .flat_map(|c| &c.rules)
                .flat_map(|r| &r.stmts)
            {
                if let Some((key, values)) = compared(t, s) {
                    seen.comparison(key, &values);
                }
            }
        }
        seen.into_dests()
    }
}

/// The key and the values a statement compares packets with: a match's right side (listed
/// or a named set's elements), a verdict map's or nat map's keys.
fn compared<'t>(t: &'t NftTable, s: &'t Stmt) -> Option<(&'t [Key], Vec<&'t Value>)> {
    let elements = |set: &str| t.set(set).map(|s| s.elements.as_slice()).unwrap_or(&[]);
    Some(match s {
        Stmt::Match(m) => (
            &m.key,
            match &m.right {
                Operand::Values(vs) => vs.iter().collect(),
                Operand::Set(name) => elements(name).iter().map(|e| &e.key).collect(),
            },
        ),
        Stmt::Vmap { key, map }
        | Stmt::Nat(Nat {
            addr: Some(NatAddr::Map { key, map }),
            ..
        }) => (
            key,
            match map {
                SetRef::Inline(es) => es.iter().map(|e| &e.key).collect(),
                SetRef::Named(name) => elements(name).iter().map(|e| &e.key).collect(),
            },
        ),
        _ => return None,
    })
}

/// The destination comparisons met so far, each numbered: the comparisons each address
/// meets (`sig`), the ports an address is paired with, the prefixes and ranges compared.
#[derive(Default)]
struct Compared {
    sig: BTreeMap<IpAddr, Vec<usize>>,
    paired: HashMap<IpAddr, BTreeSet<(Option<u8>, u16)>>,
    nets: Vec<(usize, Value)>,
    id: usize,
}

impl Compared {
    /// One comparison of `key` with `values`, if the key holds the destination address.
    fn comparison(&mut self, key: &[Key], values: &[&Value]) {
        let Some(at) = key.iter().position(|k| matches!(k, Key::Daddr { .. })) else {
            return;
        };
        self.id += 1;
        let id = self.id;
        let dport = key.iter().position(|k| matches!(k, Key::Dport(_)));
        let implied = key.iter().find_map(|k| match k {
            Key::Dport(p) => *p,
            _ => None,
        });
        let l4 = key.iter().position(|k| *k == Key::L4Proto);
        for v in values {
            let part = |i: usize| match (key.len(), v) {
                (1, v) => Some(*v),
                (_, Value::Concat(parts)) => parts.get(i),
                _ => None,
            };
            match part(at) {
                Some(Value::Addr(a)) if !a.is_loopback() => match dport.and_then(part) {
                    Some(Value::Int(n)) if u16::try_from(*n).is_ok() => {
                        let proto = implied.or_else(|| l4.and_then(part).and_then(super::proto_of));
                        self.sig.entry(*a).or_default();
                        let to = (proto, *n as u16);
                        self.paired.entry(*a).or_default().insert(to);
                    }
                    _ => self.sig.entry(*a).or_default().push(id),
                },
                Some(n @ (Value::Prefix(..) | Value::AddrRange(..))) => {
                    self.nets.push((id, n.clone()))
                }
                _ => {}
            }
        }
    }

    /// The addresses grouped by the comparisons they meet, and the paired ones by port.
    fn into_dests(self) -> Dests {
        let Compared {
            mut sig,
            paired,
            nets,
            ..
        } = self;
        // Some address of the host no rule names (`fib daddr type local` takes it: kube-proxy's
        // NodePorts), one per family.
        for a in [
            IpAddr::from([192, 0, 2, 1]),
            "2001:db8::1".parse().expect("an address"),
        ] {
            sig.entry(a).or_default();
        }
        let mut groups: BTreeMap<(bool, Vec<usize>), Vec<IpAddr>> = BTreeMap::new();
        for (a, mut ids) in sig {
            ids.extend(nets.iter().filter(|(_, n)| within(a, n)).map(|(id, _)| *id));
            ids.sort_unstable();
            ids.dedup();
            groups.entry((a.is_ipv4(), ids)).or_default().push(a);
        }
        let mut by_port: HashMap<u16, Vec<(Option<u8>, IpAddr)>> = HashMap::new();
        for (a, ports) in &paired {
            for (proto, p) in ports {
                by_port.entry(*p).or_default().push((*proto, *a));
            }
        }
        Dests {
            groups: groups.into_values().collect(),
            paired,
            by_port,
        }
    }
}

/// Whether `a` is in the prefix or range `net`.
fn within(a: IpAddr, net: &Value) -> bool {
    match (a, net) {
        (IpAddr::V4(a), Value::Prefix(IpAddr::V4(n), len)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(*len).min(32))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(*n) & mask
        }
        (IpAddr::V6(a), Value::Prefix(IpAddr::V6(n), len)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(*len).min(128))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(*n) & mask
        }
        (a, Value::AddrRange(lo, hi)) => a.is_ipv4() == lo.is_ipv4() && *lo <= a && a <= *hi,
        // Another family: never equal.
        _ => false,
    }
}

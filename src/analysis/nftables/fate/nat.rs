//! The nat statements and map lookups of a walk: where a DNAT or redirect sends the packet
//! (its address, port, or a map's element), and which elements a lookup may find.

use std::net::IpAddr;

use super::{Flow, Probe, Redirected, RuleFlow, St, Walk};
use crate::analysis::nftables::value::{Field, Lookup, Pkt, lookup};
use crate::analysis::nftables::{ElementRef, Place, is_local};
use crate::analysis::verdict::Tri;
use crate::model::ruleset::{Element, Key};
use crate::model::ruleset::{ElementData, NatAddr, NatKind, NatPort, NftTable, SetRef, Value};

impl Walk<'_> {
    pub(super) fn nat(
        &self,
        table: &NftTable,
        nat: &crate::model::ruleset::Nat,
        st: St,
        at: &dyn Fn(Option<ElementRef>) -> Place,
    ) -> Vec<(St, RuleFlow)> {
        if nat.v4.is_some_and(|v4| v4 != st.pkt.v4) {
            return vec![(st, RuleFlow::Next)];
        }
        let fixed_port = match nat.port {
            Some(NatPort::Fixed(p)) | Some(NatPort::Range(p, _)) => Some(p),
            _ => None,
        };
        let accept = |mut s: St, to: Option<(IpAddr, Option<u16>)>, element: Option<ElementRef>| {
            match nat.kind {
                NatKind::Dnat | NatKind::Redirect => {
                    let redirect = nat.kind == NatKind::Redirect;
                    let (to, port) = match to {
                        Some((a, p)) => (a, p),
                        // `redirect to :PORT`: this host, the statement's port.
                        None if redirect => (s.pkt.daddr_local_or(self.probe), fixed_port),
                        None => return (s, RuleFlow::Verdict(Flow::Unknown(Some(at(element))))),
                    };
                    let port = port.unwrap_or(s.pkt.dport);
                    // The kernel marks a connection DNATed (`ct status dnat`) only when its
                    // destination changed.
                    s.pkt.dnatted |= (to, port) != (s.pkt.daddr, s.pkt.dport);
                    s.pkt.daddr = to;
                    s.pkt.dport = port;
                    s.pkt.daddr_local = redirect || is_local(&self.probe.locals, to);
                    s.dst_done = true;
                    s.dnat = Some(Redirected {
                        place: at(element),
                        to,
                        port,
                        redirect,
                    });
                }
                NatKind::Snat | NatKind::Masquerade => s.src_done = true,
            }
            (s, RuleFlow::Verdict(Flow::Accept))
        };
        match &nat.addr {
            None => vec![accept(st, None, None)],
            Some(NatAddr::Fixed(v)) => match first_addr(v) {
                Some(a) => vec![accept(st, Some((a, fixed_port)), None)],
                None => vec![accept(st, None, None)],
            },
            Some(NatAddr::Map { key, map }) => {
                let Some((missing, hits)) = self.branches(&st, table, key, map) else {
                    return vec![(st, RuleFlow::Verdict(Flow::Unknown(Some(at(None)))))];
                };
                // No element: the nat expression breaks, the rule does not match.
                let mut out: Vec<(St, RuleFlow)> =
                    missing.into_iter().map(|s| (s, RuleFlow::Next)).collect();
                for (s, e, element) in hits {
                    let to = match &e.data {
                        Some(ElementData::Value(Value::Concat(parts))) => {
                            match (parts.first().and_then(first_addr), parts.get(1)) {
                                (Some(a), Some(Value::Int(p))) => Some((a, u16::try_from(*p).ok())),
                                (Some(a), _) => Some((a, fixed_port)),
                                _ => None,
                            }
                        }
                        Some(ElementData::Value(v)) => first_addr(v).map(|a| (a, fixed_port)),
                        _ => None,
                    };
                    out.push(accept(s, to, element));
                }
                out
            }
        }
    }
}

/// A lookup's ways: without an element, and into each element (with its place).
type Branches<'t> = (Option<St>, Vec<(St, &'t Element, Option<ElementRef>)>);

impl Walk<'_> {
    /// The ways a lookup of `key` in `map` goes for `st`: on without an element (when the
    /// key may be in none), and into each element it may find, with the element's place in
    /// a named map; `None`: no such map. Shared by verdict maps and nat maps.
    pub(super) fn branches<'t>(
        &self,
        st: &St,
        table: &'t NftTable,
        key: &[Key],
        map: &'t SetRef,
    ) -> Option<Branches<'t>> {
        let fields: Vec<Field> = key.iter().map(|k| st.pkt.field(k)).collect();
        let (found, set) = self.find(table, map, &fields)?;
        let missing = found.none.then(|| {
            st.clone().guessed(match found.hits.is_empty() {
                true => Tri::Yes,
                false => Tri::Maybe,
            })
        });
        let several = found.hits.len() > 1 || found.none;
        let hits = found
            .hits
            .into_iter()
            .map(|(e, t)| {
                let s = st.clone().guessed(if several { Tri::Maybe } else { t });
                let element = set.clone().map(|set| ElementRef {
                    set,
                    key: e.key.clone(),
                });
                (s, e, element)
            })
            .collect();
        Some((missing, hits))
    }

    /// What a lookup of `fields` in `map` may find (less the element skipped), and the
    /// map's name; `None`: no such map.
    pub(super) fn find<'t>(
        &self,
        table: &'t NftTable,
        map: &'t SetRef,
        fields: &[Field],
    ) -> Option<(Lookup<'t>, Option<String>)> {
        let name = match map {
            SetRef::Inline(elements) => return Some((lookup(fields, elements), None)),
            SetRef::Named(name) => name,
        };
        let skip = self.skip.and_then(|p| {
            p.element
                .as_ref()
                .filter(|e| e.set == *name && p.table == table.name && p.family == table.family)
        });
        let found = match skip {
            None => self.ix.find(table, name, fields)?,
            Some(skip) => lookup(
                fields,
                table
                    .set(name)?
                    .elements
                    .iter()
                    .filter(|e| e.key != skip.key),
            ),
        };
        Some((found, Some(name.clone())))
    }
}

impl Pkt {
    /// Where a redirect sends the packet: its own destination when local, else the first of
    /// this host's addresses (the incoming interface's, in the kernel).
    fn daddr_local_or(&self, probe: &Probe) -> IpAddr {
        if self.daddr_local {
            return self.daddr;
        }
        probe
            .locals
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == self.v4)
            .unwrap_or(if self.v4 {
                IpAddr::from([127, 0, 0, 1])
            } else {
                IpAddr::from(std::net::Ipv6Addr::LOCALHOST)
            })
    }
}

fn first_addr(v: &Value) -> Option<IpAddr> {
    match v {
        Value::Addr(a) | Value::Prefix(a, _) | Value::AddrRange(a, _) => Some(*a),
        _ => None,
    }
}

//! Shadowed forwards: a DNAT or redirect of a host port that no packet the checks send ever
//! meets, which one does meet when an earlier rule or element (its shadow) is taken away.
//! Sound, not complete: claimed only when every packet to every port the ruleset names
//! misses it (unknown sources and interfaces followed both ways), and a concrete packet that
//! its shadow certainly takes would reach it without the shadow.

use std::collections::HashSet;
use std::net::IpAddr;

use super::super::fate::{End, Fate, Probe, dnats_met, fate_without};
use super::super::{NftFinding, NftKind, Place, Severity, is_local, words};
use super::{Ctx, every_class, protocols};
use crate::model::portspec::Protocol;
use crate::model::ruleset::{Key, Operand, Stmt, Value};

impl Ctx<'_> {
    pub(crate) fn shadowed(&self) -> Vec<NftFinding> {
        let mut met: HashSet<Place> = HashSet::new();
        let mut hidden: Vec<(Place, Place, Protocol, u16)> = Vec::new();
        for (_, port) in every_class(self.rs) {
            // Every protocol: a claim about every packet must try them all.
            for protocol in protocols(None) {
                if !self.start(port) {
                    continue;
                }
                for (probe, f) in self.fates(protocol, port) {
                    met.extend(
                        f.outcomes
                            .iter()
                            .filter_map(|o| o.dnat.clone().map(|d| d.place)),
                    );
                    if let Some((t, revealed)) = self.revealed(&probe, &f, port) {
                        hidden.extend(revealed.into_iter().map(|s| (s, t.clone(), protocol, port)));
                    }
                }
                self.finish(port);
            }
        }
        // A shadow needs every packet: none is claimed when the budget cut the walk short.
        if self.spent() {
            return Vec::new();
        }
        // Met by a packet the host forwards (to an address not its own): not shadowed.
        // Looked at only when there is a claim to withdraw: it costs as much again.
        if hidden.iter().any(|(s, ..)| !met.contains(s)) {
            self.met_forwarded(&mut met);
            if self.spent() {
                return Vec::new();
            }
        }
        let mut said = HashSet::new();
        hidden
            .into_iter()
            .filter(|(s, ..)| !met.contains(s))
            .filter(|(s, ..)| said.insert(s.clone()))
            .map(|(s, t, protocol, port)| self.shadow_finding(s, t, protocol, port))
            .collect()
    }

    /// The first of what certainly takes `probe` (on every way `f`, port-specific or the
    /// DNAT itself; the most specific first) whose removal reveals DNATs no way of `f` meets,
    /// with those DNATs.
    fn revealed(&self, probe: &Probe, f: &Fate, port: u16) -> Option<(Place, Vec<Place>)> {
        let first = f.outcomes.first()?;
        let mut takers: Vec<Place> = Vec::new();
        if let Some(d) = &first.dnat {
            takers.push(d.place.clone());
        }
        takers.extend(first.via.iter().rev().cloned());
        if let End::Dropped {
            place,
            policy: false,
            ..
        } = &first.end
        {
            takers.push(place.clone());
        }
        let on_every_way = |t: &Place| {
            f.outcomes.iter().all(|o| {
                o.dnat.as_ref().is_some_and(|d| d.place == *t)
                    || o.via.contains(t)
                    || matches!(&o.end, End::Dropped { place, .. } if place == t)
            })
        };
        let dnat_place = first.dnat.as_ref().map(|d| &d.place);
        for t in takers {
            if !on_every_way(&t) || (Some(&t) != dnat_place && !self.names_port(&t, port)) {
                continue;
            }
            let without = fate_without(&self.ix, probe, Some(&t));
            let revealed: Vec<Place> = without
                .outcomes
                .iter()
                .filter_map(|o| o.dnat.as_ref().map(|d| d.place.clone()))
                .filter(|s| !f.may_dnat_at(s) && *s != t)
                .collect();
            if !revealed.is_empty() {
                return Some((t, revealed));
            }
        }
        None
    }

    /// The DNATs packets the host forwards (to addresses not its own) meet, added to `met`.
    fn met_forwarded(&self, met: &mut HashSet<Place>) {
        let foreign = self.foreign();
        for (_, port) in every_class(self.rs) {
            for protocol in protocols(None) {
                for probe in self.probes(protocol, port, &foreign) {
                    met.extend(dnats_met(&self.ix, &probe));
                }
            }
        }
    }

    /// Destinations that are not this host's, which a DNAT may take forwarded packets to: a
    /// documentation address of each family, and one address of every address, prefix or
    /// range a rule compares a destination with (named sets left out: kube-proxy's hold
    /// every ClusterIP).
    fn foreign(&self) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = vec![
            IpAddr::from([192, 0, 2, 1]),
            IpAddr::from(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        ];
        fn first(v: &Value, out: &mut Vec<IpAddr>) {
            match v {
                Value::Addr(a) | Value::Prefix(a, _) | Value::AddrRange(a, _) => out.push(*a),
                Value::Concat(parts) => parts.iter().for_each(|p| first(p, out)),
                _ => {}
            }
        }
        for t in &self.rs.tables {
            for r in t.chains.iter().flat_map(|c| &c.rules) {
                for s in &r.stmts {
                    if let Stmt::Match(m) = s
                        && m.key.iter().any(|k| matches!(k, Key::Daddr { .. }))
                        && let Operand::Values(vs) = &m.right
                    {
                        vs.iter().for_each(|v| first(v, &mut out));
                    }
                }
            }
        }
        out.retain(|a| !is_local(&self.locals, *a));
        out.sort();
        out.dedup();
        out
    }

    fn shadow_finding(&self, s: Place, t: Place, protocol: Protocol, port: u16) -> NftFinding {
        let owner = self.owner(&s);
        let shadow_owner = self.owner(&t);
        let proto = protocol.as_str();
        NftFinding {
            kind: NftKind::Shadowed,
            severity: Severity::Error,
            protocol,
            port,
            summary: format!(
                "Port {port}/{proto}: {} of {} takes every new connection first, so {} of {} \
                 never sees one.",
                words::place(&t),
                shadow_owner.name(),
                words::place(&s),
                owner.name()
            ),
            explanation: format!(
                "Every packet to {port}/{proto} that {} would forward is taken earlier by {} \
                 (an earlier rule, a chain or table of higher precedence, or a map element). \
                 If the earlier one is stale (a container or Service gone), remove it.",
                words::place(&s),
                words::place(&t)
            ),
            fix: vec![words::fix(&t)],
            lasting_fix: shadow_owner.lasting_fix(proto, port),
            owner,
            place: s,
            other: Some(t),
        }
    }
}

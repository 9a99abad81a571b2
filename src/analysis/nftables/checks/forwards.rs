//! What happens to the connections a native forward takes: to an address nothing live holds
//! (dead-target), dropped in a forward hook chain (forward-dropped), and the same host port
//! forwarded in iptables' tables too (split-backends).

use std::collections::HashSet;

use super::super::fate::{End, Path};
use super::super::{NftFinding, NftKind, Place, Severity, is_local, words};
use super::{Ctx, ports, protocols};
use crate::analysis::verdict::Tri;
use crate::model::portspec::Protocol;

impl Ctx<'_> {
    pub(crate) fn forwards(&self) -> Vec<NftFinding> {
        let mut out = Vec::new();
        let mut seen: HashSet<(NftKind, Place)> = HashSet::new();
        for (proto, port) in ports(self.rs) {
            for protocol in protocols(proto) {
                if !self.start(port) {
                    continue;
                }
                for (probe, f) in self.fates(protocol, port) {
                    for o in &f.outcomes {
                        let Some(d) = &o.dnat else { continue };
                        let remote = !d.redirect && !is_local(&probe.locals, d.to);
                        // Dead target.
                        if let Some(live) = &self.host.live
                            && remote
                            && !live.contains(&d.to)
                            && seen.insert((NftKind::DeadTarget, d.place.clone()))
                        {
                            let all = f.all(|x| x.dnat.as_ref() == Some(d));
                            out.push(self.dead(d.place.clone(), d.to, d.port, protocol, port, all));
                        }
                        // Forward dropped.
                        if let End::Dropped {
                            place,
                            hook: crate::model::ruleset::Hook::Forward,
                            ..
                        } = &o.end
                            && remote
                            && probe.path == Path::Outside
                            && seen.insert((NftKind::ForwardDropped, d.place.clone()))
                        {
                            let all = f.all(|x| {
                                x.dnat.as_ref() == Some(d)
                                    && matches!(&x.end, End::Dropped { place: p, .. } if p == place)
                            });
                            out.push(self.forward_dropped(
                                d.place.clone(),
                                place.clone(),
                                protocol,
                                port,
                                all,
                            ));
                        }
                        // Split backends.
                        if let Some(other) = self
                            .host
                            .iptables_forwards
                            .iter()
                            .find(|x| x.protocol == protocol && x.port == port)
                            && seen.insert((NftKind::SplitBackends, d.place.clone()))
                        {
                            out.push(self.split(d.place.clone(), &other.place, protocol, port));
                        }
                    }
                }
                self.finish(port);
            }
        }
        out
    }

    fn base(
        &self,
        kind: NftKind,
        severity: Severity,
        at: Place,
        protocol: Protocol,
        port: u16,
    ) -> NftFinding {
        let owner = self.owner(&at);
        NftFinding {
            kind,
            severity,
            protocol,
            port,
            fix: vec![words::fix(&at)],
            lasting_fix: owner.lasting_fix(protocol.as_str(), port),
            owner,
            place: at,
            other: None,
            summary: String::new(),
            explanation: String::new(),
        }
    }

    fn dead(
        &self,
        at: Place,
        to: std::net::IpAddr,
        to_port: u16,
        protocol: Protocol,
        port: u16,
        all: Tri,
    ) -> NftFinding {
        let mut f = self.base(
            NftKind::DeadTarget,
            if all == Tri::Yes {
                Severity::Error
            } else {
                Severity::Warning
            },
            at,
            protocol,
            port,
        );
        let proto = protocol.as_str();
        f.summary = format!(
            "Port {port}/{proto}: {} of {} forwards to {to} port {to_port}, which nothing live holds.",
            words::place(&f.place),
            f.owner.name()
        );
        f.explanation = format!(
            "No live container, pod or address of this host has {to}: new connections to \
             {port}/{proto} that this forward takes go nowhere (a container or endpoint gone, \
             its forward left behind)."
        );
        f
    }

    fn forward_dropped(
        &self,
        dnat: Place,
        drop: Place,
        protocol: Protocol,
        port: u16,
        all: Tri,
    ) -> NftFinding {
        let mut f = self.base(
            NftKind::ForwardDropped,
            if all == Tri::Yes {
                Severity::Error
            } else {
                Severity::Warning
            },
            drop,
            protocol,
            port,
        );
        let proto = protocol.as_str();
        let policy = f.place.handle.is_none()
            && f.place.element.is_none()
            && self
                .table(&f.place)
                .and_then(|t| t.chain(&f.place.chain))
                .is_some_and(|c| f.place.position >= c.rules.len());
        f.summary = format!(
            "Port {port}/{proto}: {} forwards new connections, but {} drops {} of them in the \
             forward hook.",
            words::place(&dnat),
            if policy {
                format!(
                    "the policy of {} {} chain {}",
                    f.place.family.word(),
                    f.place.table,
                    f.place.chain
                )
            } else {
                words::place(&f.place)
            },
            if all == Tri::Yes { "all" } else { "some" }
        );
        f.explanation = "A DNATed connection is forwarded; every table's forward chains see it, \
             and an accept in one does not stop another's drop."
            .into();
        if policy {
            f.fix = vec![format!(
                "nft insert rule {} {} {} ct status dnat accept",
                f.place.family.word(),
                f.place.table,
                f.place.chain
            )];
        }
        f.other = Some(dnat);
        f
    }

    fn split(&self, at: Place, iptables: &str, protocol: Protocol, port: u16) -> NftFinding {
        let mut f = self.base(
            NftKind::SplitBackends,
            Severity::Warning,
            at,
            protocol,
            port,
        );
        let proto = protocol.as_str();
        f.summary = format!(
            "Port {port}/{proto} is forwarded both by {} of {} and in iptables ({iptables}).",
            words::place(&f.place),
            f.owner.name()
        );
        f.explanation = "Both run for every packet: the first nat decision (by hook priority) \
             wins, so one of the two forwards never sees a connection, and which one can change \
             when either is re-created."
            .into();
        f
    }
}

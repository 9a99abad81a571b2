//! Local listeners whose new connections a native rule takes: sent elsewhere by a DNAT or
//! redirect (hijacked-listener: kube-proxy's `service-nodeports` element for a port a
//! hostNetwork process listens on), or dropped or rejected (rejected-listener: kube-proxy's
//! `no-endpoint-nodeports` element `tcp . 30080 : goto reject-chain`).

use std::collections::HashSet;
use std::net::IpAddr;

use super::super::fate::{End, Outcome};
use super::super::{NftFinding, NftKind, Place, Severity, words};
use super::Ctx;
use crate::analysis::verdict::Tri;
use crate::model::listener::{Listener, PORT_KEEPERS};

impl Ctx<'_> {
    pub(crate) fn listeners(&self) -> Vec<NftFinding> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for l in &self.host.listeners {
            if l.command
                .as_deref()
                .is_some_and(|c| PORT_KEEPERS.contains(&c))
            {
                continue;
            }
            if !self.start(l.port) {
                continue;
            }
            for (probe, f) in self.fates_to(l.protocol, l.port, &self.reaching(l)) {
                // Hijacked: a DNAT or redirect to anything but this listener.
                let away = |o: &Outcome| {
                    o.dnat.as_ref().is_some_and(|d| {
                        let here = d.redirect || super::super::is_local(&probe.locals, d.to);
                        let mine = here
                            && d.port == l.port
                            && (d.redirect || l.addr.is_unspecified() || d.to == l.addr);
                        !mine
                    })
                };
                for o in f.outcomes.iter().filter(|o| away(o)) {
                    let d = o.dnat.as_ref().expect("filtered");
                    let at = self.specific(o, &d.place, l.port);
                    if !seen.insert((NftKind::HijackedListener, at.clone(), l.port)) {
                        continue;
                    }
                    let all = f.all(|o| away(o) && self.specific(o, &d.place, l.port) == at);
                    let whom = if d.redirect {
                        format!("port {} of this host", d.port)
                    } else {
                        socket(d.to, d.port).to_string()
                    };
                    out.push(self.finding(
                        NftKind::HijackedListener,
                        l,
                        at,
                        Some(d.place.clone()),
                        all,
                        format!("sends {} of them to {whom}", share(all)),
                    ));
                }
                // Rejected: a drop or reject that names this port.
                let dropped_here = |o: &Outcome| match &o.end {
                    End::Dropped { place, .. } => Some(self.specific(o, place, l.port))
                        .filter(|at| self.names_port(at, l.port))
                        .filter(|_| o.dnat.is_none()),
                    _ => None,
                };
                for o in &f.outcomes {
                    let Some(at) = dropped_here(o) else { continue };
                    let End::Dropped { place, reject, .. } = &o.end else {
                        continue;
                    };
                    if !seen.insert((NftKind::RejectedListener, at.clone(), l.port)) {
                        continue;
                    }
                    let all = f.all(|o| dropped_here(o).as_ref() == Some(&at));
                    let verb = if *reject { "rejects" } else { "drops" };
                    out.push(self.finding(
                        NftKind::RejectedListener,
                        l,
                        at,
                        Some(place.clone()),
                        all,
                        format!("{verb} {} of its new connections", share(all)),
                    ));
                }
            }
            self.finish(l.port);
        }
        out
    }

    /// The addresses a connection to listener `l` may be sent to.
    fn reaching(&self, l: &Listener) -> Vec<IpAddr> {
        if !l.addr.is_unspecified() {
            return vec![l.addr];
        }
        let v6 = l.addr.is_ipv6();
        // A socket on [::] also receives IPv4 (unless IPV6_V6ONLY, which procfs hides).
        self.destinations(l.protocol, l.port)
            .into_iter()
            .filter(|a| v6 || a.is_ipv4())
            .collect()
    }

    /// What to name for an outcome decided at `decided`: the map element on the way that
    /// names `port` (kube-proxy's, not its generic reject chain), else `decided` when it
    /// names the port, else the first rule on the way that does, else `decided`.
    pub(crate) fn specific(&self, o: &Outcome, decided: &Place, port: u16) -> Place {
        let names = |p: &&Place| self.names_port(p, port);
        o.via
            .iter()
            .filter(|p| p.element.is_some())
            .find(names)
            .or(Some(decided).filter(names))
            .or_else(|| o.via.iter().find(names))
            .unwrap_or(decided)
            .clone()
    }

    fn finding(
        &self,
        kind: NftKind,
        l: &Listener,
        at: Place,
        by: Option<Place>,
        all: Tri,
        what: String,
    ) -> NftFinding {
        let owner = self.owner(&at);
        let who = match (&l.command, l.pid) {
            (Some(c), Some(p)) => format!("{c} (pid {p})"),
            _ => "a process".to_string(),
        };
        let proto = l.protocol.as_str();
        let summary = format!(
            "{who} listens on {}/{proto}, but {} of {} {what}.",
            socket(l.addr, l.port),
            words::place(&at),
            owner.name(),
        );
        let mut explanation = format!(
            "New connections to port {}/{proto} meet {} before any socket sees them",
            l.port,
            words::place(&at)
        );
        if let Some(by) = by.as_ref().filter(|b| **b != at) {
            explanation += &format!(", decided at {}", words::place(by));
        }
        explanation += ".";
        if all != Tri::Yes {
            explanation += " Only some of them (a source, an interface, a mark decides).";
        }
        NftFinding {
            kind,
            severity: if all == Tri::Yes {
                Severity::Error
            } else {
                Severity::Warning
            },
            protocol: l.protocol,
            port: l.port,
            fix: vec![words::fix(&at)],
            lasting_fix: owner.lasting_fix(proto, l.port),
            owner,
            place: at,
            other: by,
            summary,
            explanation,
        }
    }
}

fn share(all: Tri) -> &'static str {
    if all == Tri::Yes { "all" } else { "some" }
}

fn socket(a: IpAddr, port: u16) -> String {
    match a {
        IpAddr::V4(_) => format!("{a}:{port}"),
        IpAddr::V6(_) => format!("[{a}]:{port}"),
    }
}

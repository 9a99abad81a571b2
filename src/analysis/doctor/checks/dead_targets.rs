//! Check 2: DNAT rules whose destination nothing live holds.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::words::packets;
use super::{Checks, Host, comment, dnat_address, fix_for, port_of, rule_ref, short};
use crate::analysis::doctor::evidence;
use crate::analysis::doctor::{Finding, Kind, Severity};
use crate::analysis::iptables::paths::Step;
use crate::model::anyrule::Target;
use crate::model::layout::{Owner, owner};

impl Checks<'_> {
    /// Check 2: DNAT rules whose destination no live container or local route holds.
    pub(crate) fn dead_targets(&mut self) {
        let Some(host) = self.host else { return };
        let mut seen = HashSet::new();
        for w in self.walks.iter().filter(|w| w.table == "nat") {
            // The comments of the rules jumping to each chain: portmap and netavark put the
            // container id on the jump into the per-container chain, not on its DNAT.
            let mut jumped_from: HashMap<&str, Vec<&str>> = HashMap::new();
            for rule in w.set.table("nat").map_or(&[][..], |t| &t.rules) {
                if let (Some(c), Some(to)) = crate::model::layout::comment_and_target(&rule.args) {
                    jumped_from.entry(to).or_default().push(c);
                }
            }
            for (step, shadowed_by) in w.walk.reached() {
                let Target::Dnat { to } = &step.target else {
                    continue;
                };
                let key = (w.set.backend, w.set.family, &step.rule.chain, step.position);
                if !seen.insert(key) {
                    continue;
                }
                let Some(addr) = dnat_address(to) else {
                    continue;
                };
                let mut comments: Vec<&str> = comment(&step.rule.args).into_iter().collect();
                comments.extend(
                    jumped_from
                        .get(step.rule.chain.as_str())
                        .into_iter()
                        .flatten(),
                );
                let Some(evidence) = judge_target(host, step, &comments, addr) else {
                    continue;
                };
                let first = shadowed_by.is_none();
                let (port, protocol) = port_of(&step.cond);
                let summary = if first {
                    format!(
                        "{} go to {addr}, which nothing holds any more: that traffic is lost.",
                        packets(&step.cond)
                    )
                } else {
                    format!(
                        "A leftover DNAT sends packets to {addr}, which nothing holds any more; an earlier rule takes them first."
                    )
                };
                self.findings.push(Finding {
                    severity: if first {
                        Severity::Error
                    } else {
                        Severity::Warning
                    },
                    kind: Kind::DeadTarget,
                    port,
                    protocol,
                    summary,
                    rules: vec![rule_ref(w, step)],
                    evidence,
                    fix: Some(fix_for(w, step)),
                });
            }
        }
    }
}

/// Whether a DNAT's destination is dead, and the evidence; `None` when nothing conclusive.
fn judge_target(host: &Host, step: &Step, comments: &[&str], addr: IpAddr) -> Option<Vec<String>> {
    // natledger's own rules: its manifests are authoritative.
    if let Owner::Container(id) = owner(&step.rule.chain, &step.rule.args) {
        return match host
            .manifests
            .iter()
            .find(|m| m.container_id.as_str() == id)
        {
            Some(m) if host.liveness.needed(&m.container_id) => None,
            Some(m) => Some(vec![format!(
                "natledger manifest: container {id}{} is dead",
                super::natledger_state::origin(m)
            )]),
            None => Some(vec![format!("natledger: no manifest for container {id}")]),
        };
    }
    let mut evidence = Vec::new();
    // Container ids in the comments (the rule's and its jumps'), against the runtimes' state.
    let mut ids: Vec<String> = comments
        .iter()
        .flat_map(|c| evidence::comment_container_ids(c))
        .collect();
    ids.dedup();
    {
        for id in ids {
            match evidence::container_id_alive(&id, &host.containers) {
                Some(true) => return None,
                Some(false) => evidence.push(format!(
                    "runtime state: container {} is not running",
                    short(&id)
                )),
                None if host.runtime_state && id.len() >= 12 => {
                    evidence.push(format!(
                        "runtime state: no running container has the id {}",
                        short(&id)
                    ));
                }
                None => {}
            }
        }
    }
    // CNI IPAM: a reservation names the holder; none, where the network keeps them, says dead.
    if host.cni_present {
        match host.reservations.iter().find(|r| r.addr == addr) {
            Some(r) => match evidence::container_id_alive(&r.container_id, &host.containers) {
                Some(true) => return None,
                Some(false) => evidence.push(format!(
                    "CNI IPAM ({}): {addr} is reserved by container {}, which is not running",
                    r.network,
                    short(&r.container_id)
                )),
                None => return None,
            },
            None if host.reservations.iter().any(|r| same_subnet(r.addr, addr)) => {
                evidence.push(format!(
                    "CNI IPAM: no reservation for {addr} in its network"
                ));
            }
            None => {}
        }
    }
    // Routes: with no route to it, nothing local holds the address.
    let routed =
        evidence::has_route(&host.roots, addr) || evidence::is_local_address(&host.roots, addr);
    if !routed {
        evidence.push(format!("routes: no route to {addr} except the default one"));
    }
    (!evidence.is_empty()).then_some(evidence)
}

fn same_subnet(a: IpAddr, b: IpAddr) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => a.octets()[..3] == b.octets()[..3],
        (IpAddr::V6(a), IpAddr::V6(b)) => a.segments()[..4] == b.segments()[..4],
        _ => false,
    }
}

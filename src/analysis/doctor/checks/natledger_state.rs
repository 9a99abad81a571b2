//! Check 5: natledger's own state against the rules.

use std::collections::{HashMap, HashSet};

use super::{Checks, Host, line, port_of};
use crate::analysis::doctor::{Finding, Kind, RuleRef, Severity};
use crate::model::anyrule::parse_rule;
use crate::model::layout::TABLES;
use crate::model::layout::{Owner, owner};
use crate::model::oci::ContainerId;
use crate::state::ledger::{Manifest, RuleRecord};

impl Checks<'_> {
    /// Check 5: natledger's own state: dead manifests, orphaned rules, live containers' missing rules.
    pub(crate) fn natledger_state(&mut self) {
        let Some(host) = self.host else { return };
        if let Some(error) = &host.ledger_error {
            self.unreadable_ledger(error);
            return;
        }
        // A dead container's rules are still needed while a live container in its network
        // namespace shares them (`crate::state::sharing`).
        let needs = &host.liveness;
        let (alive, dead): (Vec<&Manifest>, Vec<&Manifest>) = host
            .manifests
            .iter()
            .partition(|m| needs.needed(&m.container_id));
        let known: HashSet<&str> = host
            .manifests
            .iter()
            .map(|m| m.container_id.as_str())
            .collect();
        self.dead_manifests(&dead);
        self.orphaned_rules(host, &known);
        self.lost_holders(host, &alive, &known);
        self.missing_rules(host, &alive);
    }

    /// Without the manifests every natledger rule would look orphaned, and sweep refuses the
    /// same directory: say why instead.
    fn unreadable_ledger(&mut self, error: &str) {
        self.findings.push(Finding {
            severity: Severity::Error,
            kind: Kind::NatledgerState,
            port: None,
            protocol: None,
            summary: format!(
                "natledger's manifests cannot be read, so its rules are not checked: {error}"
            ),
            rules: Vec::new(),
            evidence: vec!["natledger manifests".into()],
            fix: None,
        });
    }

    /// The manifests of containers no longer needed: a sweep removes them and their rules.
    fn dead_manifests(&mut self, dead: &[&Manifest]) {
        for m in dead {
            let summary = format!(
                "Container {}{} is dead, but its manifest and {} rule(s) remain.",
                m.container_id,
                origin(m),
                m.rules.len()
            );
            let finding = manifest_finding(m, Severity::Warning, summary, Vec::new());
            self.findings.push(Finding {
                fix: Some("natledger sweep".into()),
                ..finding
            });
        }
    }

    /// natledger's rules of a container without a manifest (`known`: every manifest's).
    fn orphaned_rules(&mut self, host: &Host, known: &HashSet<&str>) {
        for (set, name) in self
            .rulesets
            .iter()
            .chain(&host.own)
            .flat_map(|set| TABLES.map(|name| (set, name)))
        {
            let Some(table) = set.table(name) else {
                continue;
            };
            let mut position: HashMap<&str, usize> = HashMap::new();
            for rule in &table.rules {
                let n = position.entry(&rule.chain).or_default();
                *n += 1;
                let Owner::Container(id) = owner(&rule.chain, &rule.args) else {
                    continue;
                };
                if known.contains(id) {
                    continue;
                }
                let (port, protocol) = port_of(&parse_rule(&rule.args).0);
                self.findings.push(Finding {
                    severity: Severity::Warning,
                    kind: Kind::NatledgerState,
                    port,
                    protocol,
                    summary: format!(
                        "A natledger rule of container {id}, which has no manifest (an orphan)."
                    ),
                    rules: vec![RuleRef::new(set, name, &rule.chain, *n, &rule.args)],
                    evidence: vec!["natledger manifests".into()],
                    fix: Some("natledger sweep".into()),
                });
            }
        }
    }

    /// Live containers sharing the ports of a holder whose manifest is gone.
    fn lost_holders(&mut self, host: &Host, alive: &[&Manifest], known: &HashSet<&str>) {
        let needs = &host.liveness;
        for m in alive.iter().filter(|m| needs.alive(&m.container_id)) {
            for shared in m
                .shares
                .iter()
                .filter(|s| !known.contains(s.holder.as_str()))
            {
                let mappings: Vec<String> =
                    shared.mappings.iter().map(ToString::to_string).collect();
                let summary = format!(
                    "Live container {} shares {} with container {}, whose manifest is gone: \
                     those ports may not forward.",
                    m.container_id,
                    mappings.join(","),
                    shared.holder
                );
                let finding = manifest_finding(m, Severity::Error, summary, Vec::new());
                self.findings.push(Finding {
                    fix: Some(rewrite_advice(m)),
                    ..finding
                });
            }
        }
    }

    /// Needed containers whose recorded rules are not all in their tables.
    fn missing_rules(&mut self, host: &Host, alive: &[&Manifest]) {
        for m in alive {
            let missing = self.missing_of(host, m);
            if missing.is_empty() {
                continue;
            }
            let (whose, restart) = whose_and_restart(host, m);
            let summary = format!(
                "{whose} is missing {} of its {} recorded rule(s): its ports do not forward.",
                missing.len(),
                m.rules.len()
            );
            let finding = manifest_finding(m, Severity::Error, summary, missing);
            self.findings.push(Finding {
                fix: Some(restart),
                ..finding
            });
        }
    }

    /// The recorded rules of `m` not in its tables (the rulesets read and natledger's own).
    fn missing_of(&self, host: &Host, m: &Manifest) -> Vec<RuleRef> {
        let present = |r: &RuleRecord| {
            self.rulesets
                .iter()
                .chain(&host.own)
                .find(|s| s.backend == r.backend && s.family == r.family)
                .and_then(|s| s.table(r.table_name()))
                .is_some_and(|t| {
                    t.rules
                        .iter()
                        .any(|s| s.chain == r.chain && *s.args == *r.args())
                })
        };
        m.rules
            .iter()
            .filter(|r| !present(r))
            .map(|r| RuleRef {
                backend: r.backend,
                family: r.family,
                table: r.table_name().to_string(),
                chain: r.chain.clone(),
                position: 0,
                line: line(&r.chain, &r.args()),
                hooks: Vec::new(),
                nft: None,
            })
            .collect()
    }
}

/// Who is missing rules, in words, and how to have them written again: a container alone
/// restarts; one whose rules live sharers use waits for its whole network namespace.
fn whose_and_restart(host: &Host, m: &Manifest) -> (String, String) {
    let needs = &host.liveness;
    if needs.sharers(&m.container_id).is_empty() {
        return (
            format!("Live container {}{}", m.container_id, origin(m)),
            rewrite_advice(m),
        );
    }
    let sharers: Vec<&str> = needs
        .sharers(&m.container_id)
        .iter()
        .map(ContainerId::as_str)
        .collect();
    (
        format!(
            "Container {}, whose rules live container(s) {} share,",
            m.container_id,
            sharers.join(", ")
        ),
        format!(
            "stop every container of its network namespace ({}, {}) and start \
             them again: while one lives, a restarted one takes the recorded rules \
             over instead of writing them",
            m.container_id,
            sharers.join(", ")
        ),
    )
}

/// How a live container's or attachment's rules get written again. A hook container's
/// createRuntime hook runs at every start; an attachment's rules are written only by a CNI
/// ADD, which its runtime runs when it recreates the container's or pod's network.
fn rewrite_advice(m: &Manifest) -> String {
    match &m.cni {
        None => format!(
            "restart container {} (its createRuntime hook writes the rules again)",
            m.container_id
        ),
        Some(cni) => format!(
            "have the runtime run the CNI ADD of attachment {} again: podman runs it at \
             `podman restart {}`, Kubernetes when the pod is deleted and created again; then \
             a CNI CHECK (CNI_COMMAND=CHECK with the network's configuration) confirms that \
             the rules are back",
            m.container_id, cni.container_id
        ),
    }
}

/// How a summary names what started a container: ` (pid 1234)`, ` (cni net=podman ifname=eth0
/// container=ID)`, or nothing when neither was recorded.
pub(super) fn origin(m: &Manifest) -> String {
    if m.cni.is_none() && m.pid.is_none() {
        String::new()
    } else {
        format!(" ({})", m.origin())
    }
}

/// A finding about one natledger container, on the port of its first mapping.
fn manifest_finding(
    m: &Manifest,
    severity: Severity,
    summary: String,
    rules: Vec<RuleRef>,
) -> Finding {
    Finding {
        severity,
        kind: Kind::NatledgerState,
        port: m.mappings.first().map(|p| p.host_ports.start),
        protocol: m.mappings.first().map(|p| p.protocol.to_string()),
        summary,
        rules,
        evidence: vec!["natledger manifest".into()],
        fix: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::CniAttachment;

    fn manifest(cni: Option<CniAttachment>) -> Manifest {
        Manifest {
            container_id: "abc+eth0".parse().unwrap(),
            pid: None,
            cni,
            ..crate::state::ledger::tests::sample()
        }
    }

    /// A hook container is restarted; an attachment has no hook: its runtime's ADD writes
    /// its rules, so the advice names the ADD, how runtimes run it, and CHECK.
    #[test]
    fn an_attachment_is_told_to_add_again_a_hook_container_to_restart() {
        let hook = rewrite_advice(&manifest(None));
        assert!(hook.starts_with("restart container abc+eth0"), "{hook}");
        let attachment = rewrite_advice(&manifest(Some(CniAttachment {
            container_id: "abc".into(),
            ifname: "eth0".into(),
            network: "podman".into(),
            netns_path: None,
            deleted: false,
        })));
        for want in [
            "CNI ADD of attachment abc+eth0",
            "`podman restart abc`",
            "Kubernetes",
            "CNI_COMMAND=CHECK",
        ] {
            assert!(attachment.contains(want), "{want}: {attachment}");
        }
        assert!(!attachment.contains("restart container"), "{attachment}");
        assert!(!attachment.contains("createRuntime"), "{attachment}");
    }
}

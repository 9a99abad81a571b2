//! Check 5: natledger's own state against the rules.

use super::*;
use crate::layout::TABLES;
use crate::sharing::Needs;

impl Checks<'_> {
    /// Check 5: natledger's own state: dead manifests, orphaned rules, live containers' missing rules.
    pub fn natledger_state(&mut self) {
        let Some(host) = self.host else { return };
        // A dead container's rules are still needed while a live container in its network
        // namespace shares them (`crate::sharing`).
        let needs = Needs::judge(&host.manifests);
        let (alive, dead): (Vec<&Manifest>, Vec<&Manifest>) = host
            .manifests
            .iter()
            .partition(|m| needs.needed(&m.container_id));
        let known: HashSet<&str> = host
            .manifests
            .iter()
            .map(|m| m.container_id.as_str())
            .collect();
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
        for (set, name) in self
            .rulesets
            .iter()
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
                    fix: Some(format!(
                        "restart container {} (its createRuntime hook writes the rules again)",
                        m.container_id
                    )),
                    ..finding
                });
            }
        }
        for m in alive {
            let present = |r: &RuleRecord| {
                self.rulesets
                    .iter()
                    .find(|s| s.backend == r.backend && s.family == r.family)
                    .and_then(|s| s.table(&r.table))
                    .is_some_and(|t| {
                        t.rules
                            .iter()
                            .any(|s| s.chain == r.chain && s.args == r.rule)
                    })
            };
            let missing: Vec<RuleRef> = m
                .rules
                .iter()
                .filter(|r| !present(r))
                .map(|r| RuleRef {
                    backend: r.backend,
                    family: r.family,
                    table: r.table.clone(),
                    chain: r.chain.clone(),
                    position: 0,
                    line: line(&r.chain, &r.rule),
                    hooks: Vec::new(),
                })
                .collect();
            if missing.is_empty() {
                continue;
            }
            let (whose, restart) = if needs.sharers(&m.container_id).is_empty() {
                (
                    format!("Live container {}{}", m.container_id, origin(m)),
                    format!(
                        "restart container {} (its createRuntime hook writes the rules again)",
                        m.container_id
                    ),
                )
            } else {
                let sharers: Vec<&str> = needs
                    .sharers(&m.container_id)
                    .iter()
                    .map(|s| s.container_id.as_str())
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
            };
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

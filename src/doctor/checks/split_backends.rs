//! Check 4: one owner's rules in both iptables backends.

use super::*;

impl Checks<'_> {
    /// Check 4: Rules in both backends: the kernel runs both, whatever `iptables` points to.
    pub fn split_backends(&mut self) {
        type Seen = (usize, BTreeSet<String>);
        let mut owners: BTreeMap<&'static str, BTreeMap<Backend, Seen>> = BTreeMap::new();
        for set in self.rulesets {
            for table in &set.tables {
                for rule in &table.rules {
                    let owner = owner_of(&rule.chain, &rule.args);
                    let entry = owners
                        .entry(owner)
                        .or_default()
                        .entry(set.backend)
                        .or_default();
                    entry.0 += 1;
                    // A few chains are enough to point at; the count says how much there is.
                    if entry.1.len() < 12 {
                        entry
                            .1
                            .insert(format!("{}/{} {}", set.family, table.name, rule.chain));
                    }
                }
            }
        }
        for (owner, by_backend) in owners {
            if by_backend.len() < 2 {
                continue;
            }
            let other = if self.host_backend == Backend::Legacy {
                Backend::Nft
            } else {
                Backend::Legacy
            };
            let (n_host, _) = by_backend
                .get(&self.host_backend)
                .cloned()
                .unwrap_or_default();
            let (n_other, chains) = by_backend.get(&other).cloned().unwrap_or_default();
            let summary = if self.host.is_some() {
                format!(
                    "{owner} has rules in both backends ({n_host} in iptables-{}, which \
                     `iptables` uses, and {n_other} in iptables-{other}); the kernel runs both, \
                     so the {other} ones stay active.",
                    self.host_backend,
                )
            } else {
                // Dumps: which backend their host's `iptables` used is unknown.
                format!(
                    "{owner} has rules in both backends ({n_host} in iptables-{} and {n_other} \
                     in iptables-{other}); the kernel runs both, so the ones left in the \
                     backend no longer in use stay active.",
                    self.host_backend,
                )
            };
            let fix = format!(
                "iptables-{other}-save | grep -n -- '{}'   # then remove what is stale there: iptables-{other} -t TABLE -F CHAIN; iptables-{other} -t TABLE -X CHAIN",
                owner_pattern(owner)
            );
            self.findings.push(Finding {
                severity: Severity::Warning,
                kind: Kind::SplitBackends,
                port: None,
                protocol: None,
                summary,
                rules: Vec::new(),
                evidence: chains
                    .into_iter()
                    .take(12)
                    .map(|c| format!("iptables-{other}: {c}"))
                    .collect(),
                fix: Some(fix),
            });
        }
    }
}

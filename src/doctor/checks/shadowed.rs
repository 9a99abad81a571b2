//! Check 1: rules that never match because an earlier rule takes their packets.

use super::*;

impl Checks<'_> {
    /// Check 1: Rules that never match because an earlier one takes their packets: one finding per
    /// earlier rule, naming every rule it shadows (a duplicate is a note, anything else an
    /// error).
    pub fn shadowed(&mut self) {
        type Key<'k> = (Backend, Family, &'k str, &'k str, usize, bool);
        let mut groups: BTreeMap<Key, (usize, usize, Vec<usize>)> = BTreeMap::new();
        let mut seen = HashSet::new();
        for (wi, w) in self.walks.iter().enumerate() {
            let mut pairs: Vec<(usize, usize)> = w.shadowed.iter().map(|(b, a)| (*b, *a)).collect();
            pairs.sort_unstable();
            for (b, a) in pairs {
                let (sa, sb) = (&w.steps[a], &w.steps[b]);
                let at = (
                    w.set.backend,
                    w.set.family,
                    w.table,
                    sb.rule.chain.as_str(),
                    sb.position,
                );
                if !seen.insert(at) {
                    continue;
                }
                let duplicate = sa.target == sb.target;
                let key = (
                    w.set.backend,
                    w.set.family,
                    w.table,
                    sa.rule.chain.as_str(),
                    sa.position,
                    duplicate,
                );
                groups.entry(key).or_insert((wi, a, Vec::new())).2.push(b);
            }
        }
        for ((.., duplicate), (wi, a, shadowed)) in groups {
            let w = &self.walks[wi];
            let sa = &w.steps[a];
            let first = &w.steps[shadowed[0]];
            let (port, protocol) = port_of(&first.cond);
            let named: Vec<String> = shadowed
                .iter()
                .take(5)
                .map(|&b| {
                    let sb = &w.steps[b];
                    format!(
                        "rule {} of {} ({})",
                        sb.position,
                        sb.rule.chain,
                        target_text(&sb.target)
                    )
                })
                .collect();
            let more = match shadowed.len() {
                n if n > 5 => format!(" and {} more", n - 5),
                _ => String::new(),
            };
            let later = if shadowed.len() == 1 {
                format!("{} never matches", named[0])
            } else {
                format!(
                    "{} later rules never match: {}{more}",
                    shadowed.len(),
                    named.join(", ")
                )
            };
            let summary = if duplicate {
                format!(
                    "{later}: {} {} rule {} of {} ({}).",
                    if shadowed.len() == 1 {
                        "it duplicates"
                    } else {
                        "they duplicate"
                    },
                    w.table,
                    sa.position,
                    sa.rule.chain,
                    target_text(&sa.target)
                )
            } else {
                format!(
                    "For {}, {} rule {} of {} ({}) takes every packet first, so {later}.",
                    packets(&first.cond),
                    w.table,
                    sa.position,
                    sa.rule.chain,
                    target_text(&sa.target)
                )
            };
            let mut rules = vec![rule_ref(w, sa)];
            rules.extend(shadowed.iter().map(|&b| rule_ref(w, &w.steps[b])));
            self.findings.push(Finding {
                severity: if duplicate {
                    Severity::Info
                } else {
                    Severity::Error
                },
                kind: Kind::Shadowed,
                port,
                protocol,
                summary,
                rules,
                evidence: Vec::new(),
                fix: Some(if duplicate {
                    delete_command(w, first)
                } else {
                    fix_for(w, sa)
                }),
            });
        }
    }
}

/// Rules whose being shadowed matters: port forwards in nat, port-specific verdicts in filter.
pub(super) fn interesting(table: &str, step: &Step) -> bool {
    match table {
        "nat" => matches!(step.target, Target::Dnat { .. } | Target::Redirect { .. }),
        _ => {
            matches!(step.target, Target::Accept | Target::Drop | Target::Reject)
                && step
                    .cond
                    .conds
                    .iter()
                    .any(|c| matches!(c, Cond::DPorts { negated: false, .. }))
        }
    }
}

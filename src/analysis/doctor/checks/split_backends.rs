//! Check 4: rules in the iptables backend the host no longer uses. The kernel runs the
//! tables of both backends for every packet, whatever `iptables` points to: a DROP left in
//! iptables-legacy after a move to iptables-nft still drops (seed 001: Azure NPM's chains and
//! FORWARD jump left in legacy), and `iptables -S` on the host never shows it.
//!
//! Which backend is in use is decided as `--backend auto` does ([`backend::detect`], the
//! `iptables` symlink) on a live host; from dumps, by kubelet's hint chains (as
//! kubernetes-sigs/iptables-wrappers decides) or else by which backend holds more rules, and
//! the finding says how. Every owner with rules in the other backend is named, with its
//! chains, the rules there that can drop or rewrite packets, and the commands removing it
//! from that backend. natledger's own rules are left to the natledger-state check (sweep
//! removes them in both backends).
//!
//! [`backend::detect`]: crate::backend::detect

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::{Checks, delete_line, owner_of, shell_word, tool};
use crate::analysis::doctor::{Finding, Kind, RuleRef, Ruleset, Severity};
use crate::backend::{Backend, Detected};
use crate::model::anyrule::{Target, parse_rule};
use crate::model::layout::is_owned_chain;
use crate::model::save::{Dump, SavedRule};

/// Chains kubelet creates so that containers can tell which backend the host uses.
const HINT_CHAINS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// Rules and chains named in a finding at most (the counts say how many more there are).
const NAMED: usize = 12;

/// One owner's rules in one table of the unused backend.
#[derive(Default)]
struct Leftover<'t> {
    rules: usize,
    /// Its own chains (user chains), in dump order.
    chains: Vec<&'t str>,
    /// Its rules in built-in chains (jumps into its chains, or verdicts of its own).
    in_builtins: Vec<(usize, &'t SavedRule)>,
    /// Rules reached from a built-in chain that drop or rewrite packets, with their position.
    acting: Vec<(usize, &'t SavedRule, Effect)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Effect {
    Drops,
    Rewrites,
}

impl Checks<'_> {
    /// Check 4: rules in the backend the host does not use.
    pub(crate) fn split_backends(&mut self) {
        let backends: BTreeSet<Backend> = self.rulesets.iter().map(|s| s.backend).collect();
        if backends.len() < 2 && self.host.is_none() {
            return;
        }
        let Some(active) = self.active_backend() else {
            self.undecided();
            return;
        };
        let unused = other(active.backend);
        let mut found = Vec::new();
        for set in self.rulesets.iter().filter(|s| s.backend == unused) {
            for table in &set.tables {
                found.extend(self.leftovers(set, table, &active));
            }
            found.extend(drop_policies(set, &active));
        }
        self.findings.extend(found);
    }

    /// The backend in use and how that was decided; `None` when dumps do not tell.
    fn active_backend(&self) -> Option<Detected> {
        if self.host.is_some() {
            return Some(self.host_backend.clone());
        }
        let hinted = |b: Backend| {
            self.rulesets
                .iter()
                .filter(|s| s.backend == b)
                .flat_map(|s| &s.tables)
                .any(|t| HINT_CHAINS.iter().any(|c| t.has_chain(c)))
        };
        let hint = "kubelet's hint chain KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY, as \
                    kubernetes-sigs/iptables-wrappers decides";
        let how = match (
            hinted(Backend::IptablesNft),
            hinted(Backend::IptablesLegacy),
        ) {
            (true, false) => (
                Backend::IptablesNft,
                format!("only the nft dump holds {hint}"),
            ),
            (false, true) => (
                Backend::IptablesLegacy,
                format!("only the legacy dump holds {hint}"),
            ),
            (true, true) => (
                Backend::IptablesNft,
                "both dumps hold kubelet's hint chains, and iptables-wrappers looks at nft first"
                    .to_string(),
            ),
            (false, false) => {
                let count = |b: Backend| -> usize {
                    self.rulesets
                        .iter()
                        .filter(|s| s.backend == b)
                        .map(Ruleset::rule_count)
                        .sum()
                };
                let (nft, legacy) = (count(Backend::IptablesNft), count(Backend::IptablesLegacy));
                let more = match nft.cmp(&legacy) {
                    std::cmp::Ordering::Greater => Backend::IptablesNft,
                    std::cmp::Ordering::Less => Backend::IptablesLegacy,
                    std::cmp::Ordering::Equal => return None,
                };
                (
                    more,
                    format!(
                        "the dumps hold no kubelet hint chain; the nft dump has {nft} rules and \
                         the legacy dump {legacy}, and the backend with more rules is taken \
                         to be the one in use"
                    ),
                )
            }
        };
        Some(Detected {
            backend: how.0,
            how: how.1,
        })
    }

    /// Dumps of both backends that do not tell which one is in use: owners with rules in
    /// both are named, without claiming which side is stale.
    fn undecided(&mut self) {
        let mut owners: BTreeMap<&'static str, BTreeMap<Backend, usize>> = BTreeMap::new();
        for set in self.rulesets {
            for rule in set.tables.iter().flat_map(|t| &t.rules) {
                let owner = owner_of(&rule.chain, &rule.args);
                *owners
                    .entry(owner)
                    .or_default()
                    .entry(set.backend)
                    .or_default() += 1;
            }
        }
        for (owner, counts) in owners {
            if counts.len() < 2 || owner == "NATLEDGER" {
                continue;
            }
            let (legacy, nft) = (
                counts[&Backend::IptablesLegacy],
                counts[&Backend::IptablesNft],
            );
            self.findings.push(Finding {
                severity: Severity::Warning,
                kind: Kind::SplitBackends,
                port: None,
                protocol: None,
                summary: format!(
                    "{} has rules in both backends ({legacy} in iptables-legacy and {nft} in \
                     iptables-nft). The kernel runs both, so the ones left in the backend no \
                     longer in use still act on packets.",
                    owner_name(owner)
                ),
                rules: Vec::new(),
                evidence: vec![
                    "these dumps do not tell which backend the host uses: neither holds \
                     kubelet's hint chain, and both hold as many rules"
                        .into(),
                ],
                fix: None,
            });
        }
    }

    /// One finding per owner with rules in `table` of the unused backend.
    fn leftovers(&self, set: &Ruleset, table: &Dump, active: &Detected) -> Vec<Finding> {
        let reached = reachable(table);
        let builtin = |c: &str| table.chains.iter().any(|(n, p)| n == c && p != "-");
        let mut owners: BTreeMap<&'static str, Leftover> = BTreeMap::new();
        let mut position: HashMap<&str, usize> = HashMap::new();
        for rule in &table.rules {
            let n = position.entry(&rule.chain).or_default();
            *n += 1;
            let owner = owner_of(&rule.chain, &rule.args);
            if owner == "NATLEDGER" {
                continue;
            }
            let entry = owners.entry(owner).or_default();
            entry.rules += 1;
            if builtin(&rule.chain) {
                entry.in_builtins.push((*n, rule));
            }
            let (_, target) = parse_rule(&rule.args);
            let effect = match target {
                Target::Drop | Target::Reject => Some(Effect::Drops),
                Target::Dnat { .. }
                | Target::Snat { .. }
                | Target::Masquerade
                | Target::Redirect { .. } => Some(Effect::Rewrites),
                _ => None,
            };
            if let Some(effect) = effect.filter(|_| reached.contains(rule.chain.as_str())) {
                entry.acting.push((*n, rule, effect));
            }
        }
        for (chain, policy) in &table.chains {
            if policy == "-" && !is_owned_chain(chain) {
                owners
                    .entry(owner_of(chain, &[]))
                    .or_default()
                    .chains
                    .push(chain);
            }
        }
        let mut out = Vec::new();
        for (owner, left) in owners {
            if left.rules == 0 && left.chains.is_empty() {
                continue;
            }
            out.push(self.leftover_finding(set, table, active, owner, &left));
        }
        out
    }

    fn leftover_finding(
        &self,
        set: &Ruleset,
        table: &Dump,
        active: &Detected,
        owner: &str,
        left: &Leftover,
    ) -> Finding {
        let in_use = active.backend;
        let drops = left.acting.iter().filter(|a| a.2 == Effect::Drops).count();
        let rewrites = left.acting.len() - drops;
        let also = self
            .rulesets
            .iter()
            .filter(|s| s.backend == in_use && s.family == set.family)
            .flat_map(|s| s.table(&table.name))
            .flat_map(|t| &t.rules)
            .filter(|r| owner_of(&r.chain, &r.args) == owner)
            .count();
        let acts = effects(drops, rewrites);
        Finding {
            severity: if acts.is_empty() {
                Severity::Info
            } else {
                Severity::Warning
            },
            kind: Kind::SplitBackends,
            port: None,
            protocol: None,
            summary: leftover_summary(set, table, in_use, owner, left, &acts, also),
            rules: leftover_rules(set, table, left),
            evidence: leftover_evidence(set, table, active, left),
            fix: leftover_fix(set, table, left),
        }
    }
}

/// What an owner left in the unused backend, whether it still acts (`acts`, in words), and
/// whether it has `also` rules in the backend in use.
fn leftover_summary(
    set: &Ruleset,
    table: &Dump,
    in_use: Backend,
    owner: &str,
    left: &Leftover,
    acts: &str,
    also: usize,
) -> String {
    let unused = set.backend;
    let what = match (left.rules, left.chains.len()) {
        (0, n) => format!("{n} empty chain(s)"),
        (r, _) => format!("{r} rule(s)"),
    };
    let mut summary = format!(
        "{} has {what} in the {} {} table of iptables-{unused}, the backend this host's \
         `iptables` does not use (it uses iptables-{in_use}), so `iptables` does not show \
         them.",
        owner_name(owner),
        set.family,
        table.name,
    );
    if acts.is_empty() {
        summary.push_str(
            " None of them can drop or rewrite packets from where they are: they are \
             clutter.",
        );
    } else {
        summary.push_str(&format!(
            " The kernel runs both backends for every packet, so they still act: {acts}."
        ));
    }
    if also > 0 {
        summary.push_str(&format!(
            " It has {also} rule(s) in iptables-{in_use} too; if those are the current \
             ones, the iptables-{unused} ones are leftovers."
        ));
    }
    summary
}

/// How the backend in use was decided, and the owner's chains in the unused one.
fn leftover_evidence(
    set: &Ruleset,
    table: &Dump,
    active: &Detected,
    left: &Leftover,
) -> Vec<String> {
    let unused = set.backend;
    let mut evidence = vec![format!(
        "backend in use: iptables-{}, because {}",
        active.backend, active.how
    )];
    if !left.chains.is_empty() {
        let more = left.chains.len().saturating_sub(NAMED);
        evidence.push(format!(
            "its chains in iptables-{unused} {}: {}{}",
            table.name,
            left.chains[..left.chains.len().min(NAMED)].join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    evidence
}

/// The rules named: those in built-in chains, then the acting ones not among them.
fn leftover_rules(set: &Ruleset, table: &Dump, left: &Leftover) -> Vec<RuleRef> {
    let refs = |rules: &[(usize, &SavedRule)]| -> Vec<RuleRef> {
        rules
            .iter()
            .map(|(n, r)| RuleRef::new(set, &table.name, &r.chain, *n, &r.args))
            .collect()
    };
    let mut rules = refs(&left.in_builtins);
    let acting: Vec<(usize, &SavedRule)> = left
        .acting
        .iter()
        .filter(|(_, r, _)| !left.in_builtins.iter().any(|(_, b)| std::ptr::eq(*b, *r)))
        .map(|(n, r, _)| (*n, *r))
        .collect();
    rules.extend(refs(&acting));
    rules.truncate(NAMED * 2);
    rules
}

/// Jumps and rules in built-in chains first (deleting the jumps stops the rest), then the
/// chains' rules and the chains themselves.
fn leftover_fix(set: &Ruleset, table: &Dump, left: &Leftover) -> Option<String> {
    let tool = tool(set);
    let mut fix: Vec<String> = left
        .in_builtins
        .iter()
        .map(|(_, r)| delete_line(set, &table.name, &r.chain, &r.args))
        .collect();
    fix.extend(
        left.chains
            .iter()
            .map(|c| format!("{tool} -t {} -F {}", table.name, shell_word(c))),
    );
    fix.extend(
        left.chains
            .iter()
            .map(|c| format!("{tool} -t {} -X {}", table.name, shell_word(c))),
    );
    (!fix.is_empty()).then(|| fix.join("\n"))
}

/// The filter chains of the unused backend whose policy drops: every packet through that
/// hook that no rule there accepts is dropped, whatever the backend in use decides.
fn drop_policies(set: &Ruleset, active: &Detected) -> Vec<Finding> {
    let Some(filter) = set.table("filter") else {
        return Vec::new();
    };
    let tool = tool(set);
    filter
        .chains
        .iter()
        .filter(|(_, policy)| policy == "DROP")
        .map(|(chain, _)| Finding {
            severity: Severity::Warning,
            kind: Kind::SplitBackends,
            port: None,
            protocol: None,
            summary: format!(
                "The policy of {chain} in {} filter of iptables-{} is DROP, in the backend this \
                 host's `iptables` does not use (it uses iptables-{}). The kernel runs both \
                 backends, so every packet through {chain} that no rule there accepts is \
                 dropped.",
                set.family, set.backend, active.backend
            ),
            rules: Vec::new(),
            evidence: vec![format!(
                "backend in use: iptables-{}, because {}",
                active.backend, active.how
            )],
            fix: Some(format!("{tool} -t filter -P {chain} ACCEPT")),
        })
        .collect()
}

/// The chains of `table` that packets reach: the built-in ones and every chain a reached
/// rule jumps or goes to.
fn reachable(table: &Dump) -> HashSet<&str> {
    let mut reached: HashSet<&str> = table
        .chains
        .iter()
        .filter(|(_, p)| p != "-")
        .map(|(c, _)| c.as_str())
        .collect();
    let mut todo: Vec<&str> = reached.iter().copied().collect();
    while let Some(chain) = todo.pop() {
        for rule in table.rules_in(chain) {
            if let (_, Target::Jump(to) | Target::Goto(to)) = parse_rule(&rule.args)
                && let Some((name, _)) = table.chains.iter().find(|(c, _)| *c == to)
                && reached.insert(name.as_str())
            {
                todo.push(name.as_str());
            }
        }
    }
    reached
}

/// "2 of them can drop packets and 1 can rewrite addresses"; empty for none.
fn effects(drops: usize, rewrites: usize) -> String {
    let one = |n: usize, verb: &str, first: bool| {
        let of = if first { " of them" } else { "" };
        format!("{n}{of} can {verb}")
    };
    match (drops, rewrites) {
        (0, 0) => String::new(),
        (d, 0) => one(d, "drop packets", true),
        (0, r) => one(r, "rewrite addresses", true),
        (d, r) => format!(
            "{} and {}",
            one(d, "drop packets", true),
            one(r, "rewrite addresses", false)
        ),
    }
}

/// How an owner key is put in a sentence.
fn owner_name(owner: &str) -> String {
    match owner {
        "other" => "No known owner".into(),
        "KUBE" => "Kubernetes (KUBE-)".into(),
        "CNI" => "CNI (CNI-)".into(),
        o => o.to_string(),
    }
}

/// The other iptables backend; itself for any other (doctor's rulesets are iptables dumps
/// only).
fn other(backend: Backend) -> Backend {
    if !backend.is_iptables() {
        return backend;
    }
    Backend::iptables()
        .find(|b| *b != backend)
        .unwrap_or(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_in_words() {
        assert_eq!(effects(0, 0), "");
        assert_eq!(effects(2, 0), "2 of them can drop packets");
        assert_eq!(effects(0, 1), "1 of them can rewrite addresses");
        assert_eq!(
            effects(2, 1),
            "2 of them can drop packets and 1 can rewrite addresses"
        );
    }

    #[test]
    fn reachable_follows_jumps_only() {
        let table = &crate::model::save::parse_dump(
            "*filter\n:FORWARD ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n:C - [0:0]\n\
             -A FORWARD -j A\n-A A -g B\n-A C -j DROP\nCOMMIT\n",
        )
        .unwrap()[0];
        let mut r: Vec<&str> = reachable(table).into_iter().collect();
        r.sort_unstable();
        assert_eq!(r, ["A", "B", "FORWARD"]);
    }
}

//! One table's sweep, planned from one dump: which of natledger's rules, jumps and chains
//! go, and the single transaction that removes them. Pure: no process, no file.

use std::collections::HashSet;

use serde::Serialize;

use crate::backend::{Backend, rewrite_pays};
use crate::model::family::Family;
use crate::model::layout::{
    Owner, comment_and_target, is_owned_chain, jump_op, owned_chains, owner,
};
use crate::model::save::{Batch, Dump, Op, SavedRule, rule_line};

/// Who keeps their rules.
#[derive(Debug, Default)]
pub struct Claims {
    /// Containers whose rules stay: alive, or with a manifest that cannot be read.
    pub kept: HashSet<String>,
    /// Dead containers with a manifest (their rules are reported as theirs, not as orphans).
    pub dead: HashSet<String>,
    /// Remove everything natledger owns, chains and jumps included (`sweep --all`).
    pub all: bool,
    /// Rules tagged for a container no manifest knows stay: the ledger records nothing (a
    /// missing, emptied or mistyped state directory), and this is not the boot.
    pub keep_unrecorded: bool,
}

impl Claims {
    /// Whether the rules tagged for container `id` go.
    pub fn goes(&self, id: &str) -> bool {
        let recorded_dead = self.dead.contains(id);
        self.all || (!self.kept.contains(id) && (recorded_dead || !self.keep_unrecorded))
    }
}

/// Why a rule is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// Tagged for a container whose manifest says it is dead.
    DeadContainer,
    /// Tagged for a container no manifest knows (reboot with restored rules, lost state).
    Orphan,
    /// A second copy of a shared jump.
    DuplicateJump,
    /// In, or jumping to, a natledger chain this version no longer uses.
    StaleChain,
    /// `sweep --all`.
    Uninstall,
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Reason::DeadContainer,
        Reason::Orphan,
        Reason::DuplicateJump,
        Reason::StaleChain,
        Reason::Uninstall,
    ];
}

/// A rule the plan removes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub chain: String,
    pub rule: Vec<String>,
    pub reason: Reason,
    /// The container its tag names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

#[derive(Debug)]
pub struct TablePlan {
    pub batch: Batch,
    pub rules: Vec<Removed>,
    pub chains: Vec<String>,
    /// natledger chains that must stay because a rule natledger did not write is in them or
    /// jumps to them (never removed: not ours).
    pub blocked: Vec<String>,
    /// natledger's rules (containers', shared, jumps) left in the table once the batch is
    /// applied.
    pub owned_after: usize,
    /// Rules tagged for containers no manifest knows, left by [`Claims::keep_unrecorded`].
    pub unrecorded_kept: usize,
}

/// Plan the removals in `name` (nat or filter) of one family, as `table` shows it: each rule
/// classified (`classify`), the chains that go judged (`removable_chains`), then the
/// transaction emitted chain by chain, jump by jump (`emit_chains`, `emit_jumps`).
pub fn plan(
    backend: Backend,
    name: crate::model::table::Table,
    table: &Dump,
    family: Family,
    claims: &Claims,
) -> TablePlan {
    let mut out = TablePlan {
        batch: Batch::new(name.as_str()),
        rules: Vec::new(),
        chains: Vec::new(),
        blocked: Vec::new(),
        owned_after: 0,
        unrecorded_kept: 0,
    };
    // Container and shared rules in natledger chains, and what holds each chain in place.
    let owned: Vec<&str> = table
        .chains
        .iter()
        .map(|(c, _)| c.as_str())
        .filter(|c| is_owned_chain(c))
        .collect();
    let mut sorted = classify(table, claims);
    out.unrecorded_kept = sorted.unrecorded_kept;
    let current = owned_chains(backend, name.as_str(), family);
    let removable = removable_chains(&owned, &current, claims, &sorted, &mut out.blocked);
    let shared_reason = if claims.all {
        Reason::Uninstall
    } else {
        Reason::StaleChain
    };
    for (rule, verdict, _) in &mut sorted.verdicts {
        if verdict.is_none() && removable.contains(rule.chain.as_str()) {
            *verdict = Some(removed(rule, shared_reason, None));
        }
    }
    emit_chains(&owned, &sorted.verdicts, &removable, &mut out);
    emit_jumps(table, claims, &removable, &mut out);
    for chain in owned.iter().filter(|c| removable.contains(*c)) {
        out.batch.ops.push(Op::DeleteChain(chain.to_string()));
        out.chains.push(chain.to_string());
    }
    // Every rule removed is natledger's; a duplicated jump put back counts once.
    let owned_before = table
        .rules
        .iter()
        .filter(|r| !matches!(owner(&r.chain, &r.args), Owner::Foreign))
        .count();
    out.owned_after = owned_before.saturating_sub(out.rules.len());
    out
}

/// Per rule in a natledger chain: whether it goes (and why), and whether natledger wrote it.
type Verdict<'t> = (&'t SavedRule, Option<Removed>, bool);

/// A table's rules sorted by owner (`classify`).
struct Classified<'t> {
    /// The rules in natledger chains, each with its verdict.
    verdicts: Vec<Verdict<'t>>,
    /// natledger chains a rule that may stay is in or jumps to.
    held: HashSet<&'t str>,
    /// Rules natledger did not write, each with the natledger chain it is in or jumps to.
    blockers: Vec<(&'t str, &'t SavedRule)>,
    /// Rules tagged for containers no manifest knows, kept ([`Claims::keep_unrecorded`]).
    unrecorded_kept: usize,
}

/// Sort `table`'s rules by owner: a container's goes or stays as `claims` say, another
/// owner's in or into a natledger chain blocks that chain's removal.
fn classify<'t>(table: &'t Dump, claims: &Claims) -> Classified<'t> {
    let mut sorted = Classified {
        verdicts: Vec::new(),
        held: HashSet::new(),
        blockers: Vec::new(),
        unrecorded_kept: 0,
    };
    for rule in &table.rules {
        let target = comment_and_target(&rule.args).1;
        if is_owned_chain(&rule.chain) {
            // A rule in a natledger chain that may stay holds the chain it jumps to.
            let certainly_gone = matches!(owner(&rule.chain, &rule.args),
                Owner::Container(id) if claims.goes(id));
            if let (false, Some(to)) = (certainly_gone, target.filter(|t| is_owned_chain(t))) {
                sorted.held.insert(to);
            }
        }
        match owner(&rule.chain, &rule.args) {
            Owner::Container(id) => {
                let gone = claims.goes(id);
                let unknown = !claims.kept.contains(id) && !claims.dead.contains(id);
                sorted.unrecorded_kept += usize::from(!gone && unknown);
                let reason = if claims.all {
                    Reason::Uninstall
                } else if claims.dead.contains(id) {
                    Reason::DeadContainer
                } else {
                    Reason::Orphan
                };
                if !gone {
                    sorted.held.insert(&rule.chain);
                }
                let removed = gone.then(|| removed(rule, reason, Some(id)));
                sorted.verdicts.push((rule, removed, true));
            }
            Owner::Shared => sorted.verdicts.push((rule, None, true)),
            Owner::Foreign if is_owned_chain(&rule.chain) => {
                sorted.blockers.push((&rule.chain, rule));
                sorted.verdicts.push((rule, None, false));
            }
            Owner::Foreign => {
                if let Some(to) = target.filter(|t| is_owned_chain(t)) {
                    sorted.blockers.push((to, rule));
                }
            }
            Owner::Jump { .. } => {}
        }
    }
    sorted
}

/// Chains that go: all of them with --all, else those of other versions (not in `current`);
/// only when nothing kept is in them and no one else's rule is in or jumps to them (each such
/// rule said in `blocked`). (A chain of this version in the other family, an IPv6
/// `NATLEDGER-INPUT`, is stale too.)
fn removable_chains<'t>(
    owned: &[&'t str],
    current: &[&str],
    claims: &Claims,
    sorted: &Classified<'t>,
    blocked: &mut Vec<String>,
) -> HashSet<&'t str> {
    let wanted_gone = |chain: &str| claims.all || !current.contains(&chain);
    let mut removable: HashSet<&str> = HashSet::new();
    for chain in owned.iter().copied().filter(|c| wanted_gone(c)) {
        let in_the_way: Vec<&SavedRule> = sorted
            .blockers
            .iter()
            .filter(|(c, _)| *c == chain)
            .map(|(_, r)| *r)
            .collect();
        if !in_the_way.is_empty() {
            for rule in in_the_way {
                blocked.push(format!(
                    "chain {chain} stays: a rule natledger did not write is in it or jumps to \
                     it: {}",
                    rule_line(&rule.chain, &rule.args)
                ));
            }
        } else if !sorted.held.contains(chain) {
            removable.insert(chain);
        }
    }
    removable
}

/// Per natledger chain: flush when it goes or when most of it goes, else exact deletes.
/// A chain is rewritten only when every rule kept is natledger's own: `*-save` can print
/// another owner's rule in a form that does not restore to the same rule.
fn emit_chains(
    owned: &[&str],
    verdicts: &[Verdict],
    removable: &HashSet<&str>,
    out: &mut TablePlan,
) {
    for chain in owned {
        let (gone, kept): (Vec<_>, Vec<_>) = verdicts
            .iter()
            .filter(|(r, _, _)| r.chain == *chain)
            .partition(|(_, v, _)| v.is_some());
        if gone.is_empty() {
            continue;
        }
        let only_ours = kept.iter().all(|(_, _, ours)| *ours);
        let rewrite =
            removable.contains(chain) || (only_ours && rewrite_pays(gone.len(), kept.len()));
        if rewrite {
            out.batch.ops.push(Op::Flush(chain.to_string()));
            for (rule, _, _) in &kept {
                out.batch
                    .ops
                    .push(Op::Append(rule.chain.clone(), rule.args.clone()));
            }
        } else {
            for (rule, _, _) in &gone {
                out.batch
                    .ops
                    .push(Op::Delete(rule.chain.clone(), rule.args.clone()));
            }
        }
        out.rules
            .extend(gone.into_iter().filter_map(|(_, v, _)| v.clone()));
    }
}

/// Shared jumps: all with --all, and those into chains that go. A jump present more than
/// once loses every copy and is put back where it belongs (`layout::jump_op`: `-D`
/// removes the first match, which may be the copy in the wrong place).
fn emit_jumps(table: &Dump, claims: &Claims, removable: &HashSet<&str>, out: &mut TablePlan) {
    let mut copies: Vec<(&SavedRule, usize)> = Vec::new();
    for rule in &table.rules {
        let Owner::Jump { to } = owner(&rule.chain, &rule.args) else {
            continue;
        };
        let reason = if claims.all {
            Reason::Uninstall
        } else if removable.contains(to) {
            Reason::StaleChain
        } else {
            match copies.iter_mut().find(|(r, _)| *r == rule) {
                Some((_, n)) => *n += 1,
                None => copies.push((rule, 1)),
            }
            continue;
        };
        out.batch
            .ops
            .push(Op::Delete(rule.chain.clone(), rule.args.clone()));
        out.rules.push(removed(rule, reason, None));
    }
    for (rule, n) in copies.into_iter().filter(|(_, n)| *n > 1) {
        for _ in 0..n {
            out.batch
                .ops
                .push(Op::Delete(rule.chain.clone(), rule.args.clone()));
        }
        // Counted without this jump's copies, which are deleted first.
        let mut without = table.clone();
        without
            .rules
            .retain(|r| !(r.chain == rule.chain && r.args == rule.args));
        out.batch
            .ops
            .push(jump_op(&without, &rule.chain, rule.args.clone()));
        for _ in 1..n {
            out.rules.push(removed(rule, Reason::DuplicateJump, None));
        }
    }
}

fn removed(rule: &SavedRule, reason: Reason, container: Option<&str>) -> Removed {
    Removed {
        chain: rule.chain.clone(),
        rule: rule.args.clone(),
        reason,
        container: container.map(str::to_string),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

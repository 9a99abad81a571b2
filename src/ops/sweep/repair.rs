//! `sweep --repair`: what one table lacks of the live containers' manifests, planned from the
//! same dump as the sweep's removals and appended to the same transaction. Pure: no process,
//! no file.
//!
//! - Only records of manifests whose create completed (`Installed`) and whose container is
//!   kept (alive, or needed by a live member of its network namespace: `sharing::Needs`)
//!   are put back; a dead container's records never are.
//! - Only natledger's own tagged rules into its own chains, and the chains, jumps and guard
//!   they need ([`write::missing_shared`], create's read-and-diff) are written; the shared
//!   ones wherever a live manifest has a rule of the backend and family, as create writes
//!   them.
//! - The table the plan works on is the dump less what the sweep's plan removes, so the
//!   positions are those the transaction meets after the sweep's operations.
//! - Order: create's. The rules still there keep their places; a missing one goes right after
//!   the one that precedes it in create's order, or at the top of its chain when none does.
//!   Create inserts DNATs at the top, so their order is the manifests newest first (newest
//!   wins); it appends the rest, so theirs is oldest first; each manifest's records in order.
//!   Newest is the stack first, then the file's modification time ([`super::order`]).
//! - A missing DNAT of a stack lands on its side of the stack's DNATs still there: behind
//!   those of every container stacked on its own, in front of those of every container its
//!   own is stacked on, wherever the rules of others in between put its neighbour in
//!   create's order.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Serialize;

use crate::backend::{Backend, write};
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout::{Owner, goes_first, owner};
use crate::model::oci::ContainerId;
use crate::model::save::{Dump, Op};
use crate::model::table::Table;
use crate::state::ledger::Manifest;

use super::Removed;
use super::order::Ranked;

/// A rule the repair puts back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Restored {
    pub chain: String,
    pub rule: Vec<String>,
    /// The container whose manifest records it; none for a shared rule (a jump, the guard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerId>,
}

/// What one table lacks, and the operations (after the sweep's) that put it back.
#[derive(Debug, Default)]
pub struct Repair {
    pub ops: Vec<Op>,
    pub rules: Vec<Restored>,
}

/// Plan the repair of `table` of one backend and family, as `dump` shows it once `removed`
/// (the sweep's plan) is gone. `live` are the manifests whose rules must be in force, in
/// create's order ([`super::order::rank`]): the shared rules they need first, then per chain
/// the records the table lacks, each in its place (`restore_chain`).
pub fn repair(
    backend: Backend,
    caps: Capabilities,
    family: Family,
    table: Table,
    dump: &Dump,
    removed: &[Removed],
    ranked: &Ranked,
) -> Repair {
    let live: &[&Manifest] = &ranked.manifests;
    let mut out = Repair::default();
    let wanted = wanted(live, backend, family, table);
    // The shared rules go with any rule of the backend and family (natledger's own tables
    // keep the localhost guard in a filter table no container record is in).
    let needed = live
        .iter()
        .flat_map(|m| &m.rules)
        .any(|r| r.backend == backend && r.family == family);
    if !needed {
        return out;
    }
    let after = after_removals(dump, removed);
    for op in write::missing_shared(caps, family, table, &after) {
        if let Op::InsertFirst(chain, args)
        | Op::InsertAt(chain, _, args)
        | Op::Append(chain, args) = &op
        {
            out.rules.push(Restored {
                chain: chain.clone(),
                rule: args.clone(),
                container: None,
            });
        }
        out.ops.push(op);
    }
    let mut chains: Vec<&str> = Vec::new();
    for (_, _, chain, _) in &wanted {
        if !chains.contains(chain) {
            chains.push(chain);
        }
    }
    for chain in chains {
        restore_chain(ranked, chain, &wanted, &after, &mut out);
    }
    out
}

/// A live record: its manifest's place (newest first), container, chain and rule.
type Wanted<'m> = (usize, &'m ContainerId, &'m str, Vec<String>);

/// The records of `live` in `table` of one backend and family: only a container's own rule
/// in a natledger chain, as it would be read back.
fn wanted<'m>(
    live: &[&'m Manifest],
    backend: Backend,
    family: Family,
    table: Table,
) -> Vec<Wanted<'m>> {
    live.iter()
        .enumerate()
        .flat_map(|(at, m)| {
            let id = &m.container_id;
            m.rules
                .iter()
                .filter(|r| r.backend == backend && r.family == family && r.is_in(table))
                .filter_map(move |r| Some((at, id, r.chain.as_str(), r.rule()?.to_args())))
        })
        .filter(|(_, id, chain, args)| owner(chain, args) == Owner::Container(id.as_str()))
        .collect()
}

/// The table as the sweep's operations leave it: one copy less per rule removed.
fn after_removals(dump: &Dump, removed: &[Removed]) -> Dump {
    let mut gone: HashMap<(&str, &[String]), usize> = HashMap::new();
    for r in removed {
        *gone
            .entry((r.chain.as_str(), r.rule.as_slice()))
            .or_default() += 1;
    }
    let rules = dump
        .rules
        .iter()
        .filter(
            |r| match gone.get_mut(&(r.chain.as_str(), r.args.as_slice())) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    false
                }
                _ => true,
            },
        )
        .cloned()
        .collect();
    Dump {
        name: dump.name.clone(),
        chains: dump.chains.clone(),
        rules,
    }
}

/// Put back what `chain` lacks of `wanted`, in create's order: DNATs inserted at the top
/// (newest manifest first), the rest appended (oldest first); each manifest's records in
/// order. The missing rules are grouped by the gap they go in ([`gaps`]), then inserted in
/// chain order, each at its final place.
fn restore_chain(ranked: &Ranked, chain: &str, wanted: &[Wanted], after: &Dump, out: &mut Repair) {
    let mut order: Vec<&Wanted> = wanted.iter().filter(|(_, _, c, _)| *c == chain).collect();
    if !goes_first(chain) {
        order.sort_by_key(|(at, ..)| std::cmp::Reverse(*at));
    }
    let present: Vec<&[String]> = after.rules_in(chain).map(|r| r.args.as_slice()).collect();
    let groups = gaps(ranked, chain, &order, &present);
    let mut inserted = 0;
    for (gap, group) in groups {
        let (base, count) = (gap + inserted, group.len());
        for (k, (id, args)) in group.into_iter().enumerate() {
            let place = base + k;
            out.ops.push(if place == present.len() + inserted + k {
                Op::Append(chain.to_string(), args.clone())
            } else {
                Op::InsertAt(chain.to_string(), place + 1, args.clone())
            });
            out.rules.push(Restored {
                chain: chain.to_string(),
                rule: args.clone(),
                container: Some(id.clone()),
            });
        }
        inserted += count;
    }
}

/// The missing rules of `order` (a chain's records in create's order), grouped by the gap
/// they go in: before the `present` rule at that position. Each goes after the rule before
/// it in that order that is there (its anchor), or at the top. In a DNAT chain the gap is
/// then kept between the stack's present rules that must precede it and those that must
/// follow it ([`within_stack`]).
fn gaps<'w>(
    ranked: &Ranked,
    chain: &str,
    order: &[&'w Wanted],
    present: &[&[String]],
) -> BTreeMap<usize, Vec<(&'w ContainerId, &'w Vec<String>)>> {
    // Where each rule of the chain is, by its arguments (copies in order).
    let mut at: HashMap<&[String], VecDeque<usize>> = HashMap::new();
    for (i, args) in present.iter().enumerate() {
        at.entry(args).or_default().push_back(i);
    }
    let mut found: Vec<(usize, usize)> = Vec::new();
    let mut missing: Vec<(usize, usize, &ContainerId, &Vec<String>)> = Vec::new();
    let mut anchor = None;
    for (m, id, _, args) in order.iter().copied() {
        match at.get_mut(args.as_slice()).and_then(VecDeque::pop_front) {
            Some(i) => {
                anchor = Some(i);
                found.push((*m, i));
            }
            None => missing.push((anchor.map_or(0, |i| i + 1), *m, id, args)),
        }
    }
    let mut groups: BTreeMap<usize, Vec<(&ContainerId, &Vec<String>)>> = BTreeMap::new();
    for (gap, m, id, args) in missing {
        let gap = match goes_first(chain) {
            true => within_stack(ranked, &found, m, gap),
            false => gap,
        };
        groups.entry(gap).or_default().push((id, args));
    }
    groups
}

/// The gap (before the present rule at that position) a missing DNAT of manifest `m` goes
/// in: `gap` kept behind the present rules (`found`: manifest and position) of every
/// manifest stacked on `m`, and in front of those of every manifest `m` is stacked on. Were
/// the present ones out of the stack's order themselves, in front wins (newest wins).
fn within_stack(ranked: &Ranked, found: &[(usize, usize)], m: usize, gap: usize) -> usize {
    let after = found
        .iter()
        .filter(|(o, _)| ranked.in_front(*o, m))
        .map(|(_, i)| i + 1)
        .max();
    let before = found
        .iter()
        .filter(|(o, _)| ranked.in_front(m, *o))
        .map(|(_, i)| *i)
        .min();
    let gap = after.map_or(gap, |lo| gap.max(lo));
    before.map_or(gap, |hi| gap.min(hi))
}

/// What a repair put back, for its log line: per container (or `shared`) and chain, how
/// many rules.
pub fn describe(rules: &[Restored]) -> String {
    let mut counts: Vec<(String, &str, usize)> = Vec::new();
    for r in rules {
        let whose = r
            .container
            .as_ref()
            .map_or("shared".to_string(), crate::model::layout::tag);
        match counts
            .iter_mut()
            .find(|(w, c, _)| *w == whose && *c == r.chain)
        {
            Some((_, _, n)) => *n += 1,
            None => counts.push((whose, &r.chain, 1)),
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(whose, chain, n)| format!("{whose} in {chain} ({n})"))
        .collect();
    parts.join(", ")
}

#[cfg(test)]
#[path = "repair_tests.rs"]
mod tests;

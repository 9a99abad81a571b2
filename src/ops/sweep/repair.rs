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
//!   A manifest's age is its file's modification time (`sweep::judge`).

use serde::Serialize;

use crate::backend::{Backend, write};
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout::{Owner, goes_first, owner};
use crate::model::save::{Op, Table as Dump};
use crate::model::table::Table;
use crate::state::ledger::Manifest;

use super::Removed;

/// A rule the repair puts back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Restored {
    pub chain: String,
    pub rule: Vec<String>,
    /// The container whose manifest records it; none for a shared rule (a jump, the guard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// What one table lacks, and the operations (after the sweep's) that put it back.
#[derive(Debug, Default)]
pub struct Repair {
    pub ops: Vec<Op>,
    pub rules: Vec<Restored>,
}

/// Plan the repair of `table` of one backend and family, as `dump` shows it once `removed`
/// (the sweep's plan) is gone. `live` are the manifests whose rules must be in force, newest
/// first.
pub fn repair(
    backend: Backend,
    caps: Capabilities,
    family: Family,
    table: Table,
    dump: &Dump,
    removed: &[Removed],
    live: &[&Manifest],
) -> Repair {
    let mut out = Repair::default();
    // Per record: its manifest's place (newest first), container, chain and rule.
    let wanted: Vec<(usize, &str, &str, Vec<String>)> = live
        .iter()
        .enumerate()
        .flat_map(|(at, m)| {
            let id = m.container_id.as_str();
            m.rules
                .iter()
                .filter(|r| r.backend == backend && r.family == family && r.is_in(table))
                .filter_map(move |r| Some((at, id, r.chain.as_str(), r.rule()?.to_args())))
        })
        // Only a container's own rule in a natledger chain, as it would be read back.
        .filter(|(_, id, chain, args)| owner(chain, args) == Owner::Container(id))
        .collect();
    // The shared rules go with any rule of the backend and family (natledger's own tables
    // keep the localhost guard in a filter table no container record is in).
    let needed = live
        .iter()
        .flat_map(|m| &m.rules)
        .any(|r| r.backend == backend && r.family == family);
    if !needed {
        return out;
    }
    let mut after = dump.clone();
    for gone in removed {
        let at = after
            .rules
            .iter()
            .position(|r| r.chain == gone.chain && r.args == gone.rule);
        if let Some(at) = at {
            after.rules.remove(at);
        }
    }

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

    let mut chains: Vec<&str> = wanted.iter().map(|(_, _, c, _)| *c).collect();
    chains.dedup();
    let mut seen = Vec::new();
    chains.retain(|c| {
        let first = !seen.contains(c);
        seen.push(*c);
        first
    });
    for chain in chains {
        // The chain as the transaction will leave it: each rule, and whether a record
        // accounts for it.
        let mut rules: Vec<(&[String], bool)> = after
            .rules_in(chain)
            .map(|r| (r.args.as_slice(), false))
            .collect();
        let mut cursor = 0;
        // Create's order: DNATs inserted at the top (newest manifest first), the rest
        // appended (oldest first); each manifest's records in order.
        let mut order: Vec<&(usize, &str, &str, Vec<String>)> =
            wanted.iter().filter(|(_, _, c, _)| *c == chain).collect();
        if !goes_first(chain) {
            order.sort_by_key(|(at, ..)| std::cmp::Reverse(*at));
        }
        for (_, id, _, args) in order {
            if let Some(i) = rules
                .iter()
                .position(|(a, used)| !used && *a == args.as_slice())
            {
                rules[i].1 = true;
                cursor = i + 1;
                continue;
            }
            let at = cursor;
            out.ops.push(if at == rules.len() {
                Op::Append(chain.to_string(), args.clone())
            } else {
                Op::InsertAt(chain.to_string(), at + 1, args.clone())
            });
            rules.insert(at, (args.as_slice(), true));
            cursor = at + 1;
            out.rules.push(Restored {
                chain: chain.to_string(),
                rule: args.clone(),
                container: Some(id.to_string()),
            });
        }
    }
    out
}

/// What a repair put back, for its log line: per container (or `shared`) and chain, how
/// many rules.
pub fn describe(rules: &[Restored]) -> String {
    let mut counts: Vec<(String, &str, usize)> = Vec::new();
    for r in rules {
        let whose = r
            .container
            .as_ref()
            .map_or("shared".to_string(), |id| format!("natledger:{id}"));
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

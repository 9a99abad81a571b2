//! The process-less deletes tried first: netlink on iptables-nft, libiptc on legacy.

use std::collections::HashMap;

use crate::backend::{Backend, Native, NativeError, Tagged};
use crate::family::Family;
use crate::layout::tag;
use crate::ledger::RuleRecord;
use crate::oci::ContainerId;
use crate::rule::Rule;
use crate::save::{Batch, Op};

use super::super::Context;

/// Delete the recorded rules without a process, on nft every rule of the recorded chains
/// tagged for `id`, when they are as many as recorded, in one transaction across tables
/// ([`crate::nftables`]); on legacy exactly the recorded rules of one table, when all are
/// present ([`crate::iptc`]).
pub(super) fn delete_native(
    ctx: &Context,
    backend: Backend,
    family: Family,
    id: &ContainerId,
    recorded: &[&RuleRecord],
) -> Result<Native, NativeError> {
    match backend {
        Backend::Nft => {
            let mut expected: Vec<(&str, &str, usize)> = Vec::new();
            for r in recorded {
                match expected
                    .iter_mut()
                    .find(|(t, c, _)| *t == r.table_name() && *c == r.chain)
                {
                    Some((_, _, n)) => *n += 1,
                    None => expected.push((r.table_name(), r.chain.as_str(), 1)),
                }
            }
            Ok(ctx
                .netfilter
                .delete_tagged_nft(family, &tag(id), &expected)?)
        }
        // Written in-process anyway: the generic path (one read, one transaction) is it.
        Backend::Nftables => Ok(Native::Off),
        Backend::Legacy => {
            let Some(table) = recorded.first().and_then(|r| r.table()) else {
                return Ok(Native::Declined);
            };
            let Some(rules) = recorded
                .iter()
                .map(|r| Some((r.chain.as_str(), r.rule()?)))
                .collect::<Option<Vec<(&str, &Rule)>>>()
            else {
                return Ok(Native::Declined);
            };
            Ok(ctx
                .netfilter
                .delete_legacy(family, table.as_str(), &rules)?)
        }
    }
}

/// Apply `batch` (deletions, each of a rule tagged for `id` in natledger's chains, found by a
/// read of its table) on iptables-nft over netlink, without a process, when each chain still
/// holds exactly as many rules tagged for `id` as the batch deletes there
/// ([`crate::backend::Netfilter::delete_all_tagged_nft`]): a chain all of whose rules go is
/// flushed by one message, the others lose theirs by handle (which the kernel looks up from
/// the chain's top: D of N rules cost D×N/2 steps, so many go by a rewrite instead,
/// `container::Cut`). `false`: nothing changed, the caller uses the restore.
pub(super) fn delete_found_nft(
    ctx: &Context,
    family: Family,
    id: &ContainerId,
    batch: &Batch,
) -> bool {
    let tag = tag(id);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for op in &batch.ops {
        let Op::Delete(chain, _) = op else {
            return false;
        };
        *counts.entry(chain.as_str()).or_default() += 1;
    }
    let expected: Vec<Tagged> = counts
        .into_iter()
        .map(|(chain, count)| Tagged {
            table: batch.table,
            chain,
            tag: &tag,
            count,
        })
        .collect();
    match ctx.netfilter.delete_all_tagged_nft(family, &expected) {
        Ok(Native::Done(_)) => true,
        Ok(Native::Off | Native::Declined) => false,
        // Nothing was changed; the restore says what is really wrong.
        Err(e) => {
            eprintln!("natledger: {e}; using {}-nft-restore", family.tool_stem());
            false
        }
    }
}

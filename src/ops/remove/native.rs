//! The process-less delete of what a read found, where the backend's driver has one.

use std::collections::HashMap;

use crate::backend::{Backend, Tagged};
use crate::model::family::Family;
use crate::model::layout::tag;
use crate::model::oci::ContainerId;
use crate::model::save::{Batch, Op};

use super::super::Context;

/// Apply `batch` (deletions, each of a rule tagged for `id` in natledger's chains, found by a
/// read of its table) without a process where the driver can ([`crate::backend::Driver::delete_tagged`]), when each chain still
/// holds exactly as many rules tagged for `id` as the batch deletes there
/// ([`crate::backend::Netfilter::delete_all_tagged_nft`]): a chain all of whose rules go is
/// flushed by one message, the others lose theirs by handle (which the kernel looks up from
/// the chain's top: D of N rules cost D×N/2 steps, so many go by a rewrite instead,
/// `container::Cut`). `false`: nothing changed, the caller uses the restore.
pub(super) fn delete_found(
    ctx: &Context,
    backend: Backend,
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
    backend
        .driver()
        .delete_tagged(&ctx.netfilter, family, &expected)
}

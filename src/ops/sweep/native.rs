//! Applying a sweep plan on iptables-nft without a process: its container rules deleted by
//! handle over netlink in one transaction ([`Netfilter::delete_all_tagged_nft`]), linear in
//! the table where `iptables-nft-restore`'s `-D` compares each rule with the chain's rules
//! (5,000 manifests, a third dead: a minute). Anything else (chains, jumps: `sweep --all`,
//! other versions' chains, a duplicated jump) and every refusal go through the restore.
//!
//! [`Netfilter::delete_all_tagged_nft`]: crate::backend::Netfilter::delete_all_tagged_nft

use std::collections::HashMap;

use crate::backend::{Backend, BackendError, Native, Tagged};
use crate::family::Family;

use super::{Context, TablePlan};

/// Apply `plan` to `table` of one backend and family: natively when it is only container
/// rules on iptables-nft and the chains hold exactly the tagged rules it read, else with one
/// `*-restore`.
pub(super) fn apply(
    ctx: &Context,
    backend: Backend,
    family: Family,
    table: &'static str,
    plan: &TablePlan,
) -> Result<(), BackendError> {
    if backend == Backend::Nft && plan.chains.is_empty() {
        let tags: Vec<String> = plan
            .rules
            .iter()
            .filter_map(|r| r.container.as_ref().map(|id| format!("natledger:{id}")))
            .collect();
        // Only containers' rules, each with its tag (a jump or a shared rule has none).
        if tags.len() == plan.rules.len() {
            let mut counts: HashMap<(&str, &str), usize> = HashMap::new();
            for (rule, tag) in plan.rules.iter().zip(&tags) {
                *counts
                    .entry((rule.chain.as_str(), tag.as_str()))
                    .or_default() += 1;
            }
            let expected: Vec<Tagged> = counts
                .into_iter()
                .map(|((chain, tag), count)| Tagged {
                    table,
                    chain,
                    tag,
                    count,
                })
                .collect();
            match ctx.netfilter.delete_all_tagged_nft(family, &expected) {
                Ok(Native::Done(_)) => return Ok(()),
                Ok(Native::Off | Native::Declined) => {}
                // Nothing was changed; the restore below says what is really wrong.
                Err(e) => eprintln!("natledger: {e}; using {}-nft-restore", family.tool_stem()),
            }
        }
    }
    ctx.netfilter.apply(backend, family, &plan.batch)
}

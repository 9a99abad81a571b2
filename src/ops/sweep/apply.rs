//! Applying a sweep plan: one call to the driver ([`crate::backend::Driver::apply_plan`])
//! with the plan's batch and, when it removes only containers' rules, their counts per chain
//! and tag, which a driver may delete without a process (iptables-nft, by handle over
//! netlink, linear in the table). Anything else (chains, jumps: `sweep --all`, other
//! versions' chains, a duplicated jump, a repair) is the batch alone.

use std::collections::HashMap;

use crate::backend::{BackendError, Driver, Plan, Tagged};
use crate::model::family::Family;
use crate::model::save::Batch;

use super::{Context, TablePlan};

/// Apply `plan` to `table` of one driver and family.
pub(super) fn apply(
    ctx: &Context,
    driver: &dyn Driver,
    family: Family,
    table: &'static str,
    plan: &TablePlan,
) -> Result<(), BackendError> {
    let counts = tagged_only(plan);
    let expected: Option<Vec<Tagged>> = counts.as_ref().map(|counts| {
        counts
            .iter()
            .map(|((chain, tag), count)| Tagged {
                table,
                chain,
                tag,
                count: *count,
            })
            .collect()
    });
    let plan = Plan::Batch {
        batch: &plan.batch,
        tagged: expected.as_deref(),
    };
    driver.apply_plan(&ctx.netfilter, family, &plan)
}

/// Apply `batch` (a plan with a repair) to one driver and family as it is.
pub(super) fn apply_batch(
    ctx: &Context,
    driver: &dyn Driver,
    family: Family,
    batch: &Batch,
) -> Result<(), BackendError> {
    driver.apply_plan(&ctx.netfilter, family, &Plan::batch(batch))
}

/// When `plan` removes only containers' rules (no chain, no jump, no shared rule), how many
/// it removes per chain and tag; `None` otherwise.
fn tagged_only(plan: &TablePlan) -> Option<HashMap<(String, String), usize>> {
    if !plan.chains.is_empty() {
        return None;
    }
    let mut counts = HashMap::new();
    for rule in &plan.rules {
        let tag = crate::model::layout::tag(rule.container.as_ref()?);
        *counts.entry((rule.chain.clone(), tag)).or_default() += 1;
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::super::{Claims, plan};
    use super::*;
    use crate::backend::Backend;
    use crate::model::save::parse_dump;

    fn planned(lines: &[&str], kept: &[&str], all: bool) -> TablePlan {
        // Another version's chain only where a line names it.
        let old = if lines.iter().any(|l| l.contains("NATLEDGER-OLD")) {
            ":NATLEDGER-OLD - [0:0]\n"
        } else {
            ""
        };
        let text = format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:NATLEDGER-HOSTPORTS - [0:0]\n{old}{}\nCOMMIT\n",
            lines.join("\n")
        );
        let table = parse_dump(&text).unwrap().remove(0);
        let claims = Claims {
            kept: kept.iter().map(|s| s.to_string()).collect(),
            all,
            ..Claims::default()
        };
        plan(
            Backend::IptablesNft,
            crate::model::table::Table::Nat,
            &table,
            Family::Ipv4,
            &claims,
        )
    }

    fn dnat(id: &str, port: u16) -> String {
        format!(
            "-A NATLEDGER-HOSTPORTS -p tcp -m tcp --dport {port} -m comment --comment \
             natledger:{id} -j DNAT --to-destination 10.77.0.2:80"
        )
    }

    const JUMP: &str = "-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment \
                        natledger -j NATLEDGER-HOSTPORTS";

    /// Interleaved dead and live containers: the deletion goes by tag, each dead container's
    /// count as the plan found it (a rewrite of the chain in the restore batch or not).
    #[test]
    fn only_containers_rules_go_directly_counted_per_chain_and_tag() {
        let mut lines = vec![JUMP.to_string()];
        for i in 0..200u16 {
            let id = if i % 2 == 0 { "dead" } else { "live" };
            lines.push(dnat(&format!("{id}{}", i / 2), 9000 + i));
        }
        lines.push(dnat("dead0", 8999));
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let live: Vec<String> = (0..100).map(|i| format!("live{i}")).collect();
        let live: Vec<&str> = live.iter().map(String::as_str).collect();
        let counts = tagged_only(&planned(&refs, &live, false)).unwrap();
        assert_eq!(counts.len(), 100);
        let count =
            |id: &str| counts[&("NATLEDGER-HOSTPORTS".to_string(), format!("natledger:{id}"))];
        assert_eq!((count("dead0"), count("dead99")), (2, 1));
        assert!(
            !counts
                .keys()
                .any(|(_, tag)| tag.starts_with("natledger:live"))
        );
    }

    /// A jump, a chain or a shared rule among the removals: the restore does it all.
    #[test]
    fn chains_and_jumps_go_through_the_restore() {
        let dead = dnat("dead", 9000);
        // --all: the jump and the chains too.
        assert!(tagged_only(&planned(&[JUMP, &dead], &[], true)).is_none());
        // Another version's chain with a shared rule in it.
        let old = "-A NATLEDGER-OLD -m comment --comment natledger -j ACCEPT";
        assert!(tagged_only(&planned(&[JUMP, old, &dead], &[], false)).is_none());
        // A duplicated jump.
        assert!(tagged_only(&planned(&[JUMP, JUMP, &dead], &[], false)).is_none());
        assert!(tagged_only(&planned(&[JUMP, &dead], &[], false)).is_some());
    }
}

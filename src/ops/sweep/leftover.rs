//! `sweep --all` leaves the host's iptables-nft tables as they were before natledger: a table
//! iptables-nft created for natledger's chains (`ip filter`, `ip nat`, `ip6 …`) goes once it
//! holds nothing but empty, accepting built-in chains ([`crate::kernel::nftables::leftover`]: never a
//! table with anything another owner may have).

use crate::backend::{Driver, Plan};
use crate::model::family::Family;

use super::report::{SweepReport, TableState};

use super::Context;

/// After a complete `sweep --all`: each table natledger's chains were removed from, deleted
/// when only empty accepting built-in chains are left in it, where its driver does that
/// ([`Plan::DropIfEmptied`]: iptables-nft).
pub(super) fn drop_emptied_tables(ctx: &Context, report: &mut SweepReport) {
    if report.tables.iter().any(|t| t.state == TableState::Failed) {
        return;
    }
    for driver in ctx.drivers.iter().copied() {
        let backend = driver.backend();
        let emptied: Vec<_> = report
            .tables
            .iter()
            .filter(|t| t.backend == backend && !t.chains_removed.is_empty())
            .map(|t| (t.family, t.table))
            .collect();
        for (family, table) in emptied {
            drop_if_emptied(ctx, driver, family, table, report);
        }
    }
}

/// Delete `table` of one driver and family if only empty accepting built-in chains are left
/// in it; a failure is the report's error.
fn drop_if_emptied(
    ctx: &Context,
    driver: &dyn Driver,
    family: Family,
    table: &'static str,
    report: &mut SweepReport,
) {
    let plan = Plan::DropIfEmptied { table };
    match driver.apply_plan(&ctx.netfilter, family, &plan) {
        Ok(()) => {}
        Err(e) => {
            // The cause, unless the message already says it.
            let text = crate::causes::text(&e);
            let cause = std::error::Error::source(&e)
                .map(|c| c.to_string())
                .filter(|c| !text.contains(c.as_str()))
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            report.errors.push(format!(
                "{}/{family}/{table}: {text}{cause}",
                driver.backend()
            ));
        }
    }
}

//! `sweep --all` leaves the host's iptables-nft tables as they were before natledger: a table
//! iptables-nft created for natledger's chains (`ip filter`, `ip nat`, `ip6 …`) goes once it
//! holds nothing but empty, accepting built-in chains ([`crate::kernel::nftables::leftover`]: never a
//! table with anything another owner may have).

use crate::backend::Plan;

use super::report::{SweepReport, TableState};

use super::Context;

/// After a complete `sweep --all`: each table natledger's chains were removed from, deleted
/// when only empty accepting built-in chains are left in it, where its driver does that
/// ([`Plan::DropIfEmptied`]: iptables-nft).
pub(super) fn drop_emptied_tables(ctx: &Context, report: &mut SweepReport) {
    if report.tables.iter().any(|t| t.state == TableState::Failed) {
        return;
    }
    let emptied: Vec<_> = report
        .tables
        .iter()
        .filter(|t| !t.chains_removed.is_empty())
        .map(|t| (t.backend, t.family, t.table))
        .collect();
    for (backend, family, table) in emptied {
        let plan = Plan::DropIfEmptied { table };
        match ctx
            .driver_for(backend)
            .apply_plan(&ctx.netfilter, family, &plan)
        {
            Ok(()) => {}
            Err(e) => {
                // The cause, unless the message already says it.
                let text = crate::chain::text(&e);
                let cause = std::error::Error::source(&e)
                    .map(|c| c.to_string())
                    .filter(|c| !text.contains(c.as_str()))
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                report
                    .errors
                    .push(format!("{backend}/{family}/{table}: {text}{cause}"));
            }
        }
    }
}

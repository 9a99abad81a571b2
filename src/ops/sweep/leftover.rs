//! `sweep --all` leaves the host's iptables-nft tables as they were before natledger: a table
//! iptables-nft created for natledger's chains (`ip filter`, `ip nat`, `ip6 …`) goes once it
//! holds nothing but empty, accepting built-in chains ([`crate::nftables::leftover`]: never a
//! table with anything another owner may have).

use super::report::{SweepReport, TableState};
use crate::backend::Backend;
use crate::nftables::leftover::Leftover;

use super::Context;

/// After a complete `sweep --all`: each iptables-nft table natledger's chains were removed
/// from, deleted when only empty accepting built-in chains are left in it.
pub(super) fn drop_emptied_tables(ctx: &Context, report: &mut SweepReport) {
    if report.tables.iter().any(|t| t.state == TableState::Failed) {
        return;
    }
    let emptied: Vec<_> = report
        .tables
        .iter()
        .filter(|t| t.backend == Backend::Nft && !t.chains_removed.is_empty())
        .map(|t| (t.family, t.table))
        .collect();
    for (family, table) in emptied {
        match ctx
            .netfilter
            .with_nft(|s| s.drop_if_leftover(family, table))
        {
            Ok(Leftover::Deleted | Leftover::Kept | Leftover::Absent) => {}
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
                    .push(format!("nft/{family}/{table}: {text}{cause}"));
            }
        }
    }
}

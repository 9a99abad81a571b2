//! iptables-legacy (`ip_tables`): read with `*-legacy-save` (an absent table seen in procfs
//! without a process), written in-process through the table's socket options where the
//! shared chains exist ([`crate::kernel::iptc`]), else with `*-legacy-restore --wait`.

use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::rule::Rule;
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::write::{self, Placement};
use super::{Backend, Driver, Native, NativeError, Netfilter};

/// The iptables-legacy driver.
pub struct IptablesLegacy;

impl Driver for IptablesLegacy {
    fn backend(&self) -> Backend {
        Backend::Legacy
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            forward_accept: true,
            untracked_guard: false,
            shifted_ranges: true,
            tools: true,
            tables_seen_without_tools: true,
            one_transaction: false,
        }
    }

    fn insert_in_process(
        &self,
        nf: &Netfilter,
        family: Family,
        table: Table,
        placed: &[Placement],
    ) -> bool {
        write::insert_legacy(self, nf, family, table, placed)
    }

    /// Exactly the recorded rules of one table, through its socket options
    /// ([`crate::kernel::iptc::delete`]); declined unless every one is found.
    fn delete_recorded_in_table(
        &self,
        nf: &Netfilter,
        family: Family,
        recorded: &[&RuleRecord],
    ) -> Result<Native, NativeError> {
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
        Ok(nf.delete_legacy(family, table.as_str(), &rules)?)
    }
}

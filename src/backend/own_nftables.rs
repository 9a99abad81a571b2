//! natledger's own nf_tables tables ([`crate::kernel::nftables::own`]), read and written in-process
//! over netlink: every create is one transaction, all or nothing.

use crate::kernel::nftables::own::CAPABILITIES;
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::write::{self, InstallError};
use super::{Backend, BackendError, Driver, Netfilter};

/// The driver of natledger's own nftables tables.
pub struct OwnNftables;

impl Driver for OwnNftables {
    fn backend(&self) -> Backend {
        Backend::Nftables
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn install(
        &self,
        nf: &Netfilter,
        family: Family,
        rules: &[&RuleRecord],
    ) -> Result<Vec<Table>, InstallError> {
        install_own(self, nf, family, rules)
            .map(|()| Vec::new())
            .map_err(|error| InstallError {
                error,
                partial: false,
            })
    }
}

/// One read of natledger's table and one nf_tables transaction for
/// every table (`crate::kernel::nftables::own`): the table, its chains and the shared rules (the
/// jumps, the localhost guard) where missing, then the rules. All or nothing, so a failure
/// leaves nothing of this family written. The IPv4 guard is ensured by every IPv4 create, so
/// route_localnet is never on without it.
fn install_own(
    driver: &OwnNftables,
    nf: &Netfilter,
    family: Family,
    rules: &[&RuleRecord],
) -> Result<(), BackendError> {
    let own = nf.read_own_table(family)?;
    let mut batches = Vec::with_capacity(Table::ALL.len());
    for table in Table::ALL {
        let here: Vec<&RuleRecord> = rules.iter().copied().filter(|r| r.is_in(table)).collect();
        let placed = write::placements(&here);
        let dump = own
            .table
            .as_ref()
            .map(|t| t.logical(table.as_str()))
            .unwrap_or_default();
        batches.push(write::missing(driver, family, table, &dump, &placed));
    }
    // Planned against that same read: the ledger lock is held throughout.
    nf.apply_own_to(family, Some(own), &batches)
}

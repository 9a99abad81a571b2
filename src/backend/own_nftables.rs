//! natledger's own nf_tables tables ([`crate::kernel::nftables::own`]), read and written in-process
//! over netlink: every create is one transaction, all or nothing.

use crate::kernel::nftables::own::{CAPABILITIES, OwnRead};
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout;
use crate::model::save::{self, Batch};
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::driver::{Primitives, Reading};
use super::remove::{self, Plan};
use super::write::{self, InstallError};
use super::{Backend, BackendError, Driver, Netfilter};

/// The driver of natledger's own nftables tables.
pub struct OwnNftables;

impl Driver for OwnNftables {
    fn backend(&self) -> Backend {
        Backend::OwnNftables
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Either scope: the table holds natledger's rules only.
    fn read(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &str,
        _scope: Reading,
    ) -> Result<Option<save::Dump>, BackendError> {
        let own = nf.with_nft(|s| s.own_table(family))?;
        Ok(own.map(|t| t.logical(table)))
    }

    fn read_all(&self, nf: &Netfilter, family: Family) -> Result<Vec<save::Dump>, BackendError> {
        let own = nf.with_nft(|s| s.own_table(family))?;
        Ok(own
            .map(|t| layout::TABLES.iter().map(|name| t.logical(name)).collect())
            .unwrap_or_default())
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

    fn apply_plan(&self, nf: &Netfilter, family: Family, plan: &Plan) -> Result<(), BackendError> {
        remove::apply_plan(self, nf, family, plan)
    }
}

impl Primitives for OwnNftables {
    /// The batches as one nf_tables transaction on natledger's own table: all or nothing.
    fn apply_batches(
        &self,
        nf: &Netfilter,
        family: Family,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        nf.forget_legacy_nat(family);
        apply_to(nf, family, None, batches)
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
    let own = nf.with_nft(|s| s.own_read(family))?;
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
    apply_to(nf, family, Some(own), &batches)
}

/// The batches as one nf_tables transaction, planned against `read`, the caller's read of
/// the table under the lock it still holds (`None`: read it now).
fn apply_to(
    nf: &Netfilter,
    family: Family,
    read: Option<OwnRead>,
    batches: &[Batch],
) -> Result<(), BackendError> {
    let start = std::time::Instant::now();
    let applied = nf.with_nft(|s| match read {
        Some(read) => s.apply_own_to(family, read, batches),
        None => s.apply_own(family, batches),
    })?;
    if applied.messages > 0 {
        nf.nft_commits.set(nf.nft_commits.get() + 1);
    }
    if applied.deleted {
        nf.nft_deleted.set(true);
    }
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    log::debug!(
        "nftables: {} message(s) on {family} table natledger in {ms:.1} ms",
        applied.messages
    );
    Ok(())
}

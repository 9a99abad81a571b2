//! The interface every backend implements ([`Driver`]): what it writes beyond the mapping
//! rules ([`Capabilities`], data), how it reads a table and applies batches, how it installs
//! one family's rules, and the process-less paths it has for deleting. The operations ask a driver ([`Backend::driver`]) and never
//! which backend it is; what the backends share (the restore-then-read-and-diff strategy)
//! is in [`super::write`].

use crate::kernel::iptc::Stamp;
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::oci::ContainerId;
use crate::model::save::{self, Batch};
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::write::{self, InstallError, Placement};
use super::{Backend, BackendError, Native, NativeError, Netfilter, Tagged, Tools};

/// One backend.
pub trait Driver: Sync {
    /// The backend it drives (its CLI word, its records' `backend`).
    fn backend(&self) -> Backend;

    /// What it writes beyond the mapping rules, and what it can forward.
    fn capabilities(&self) -> Capabilities;

    /// Its `*-save`/`*-restore` tools, if it has any ([`super::tool`]). None by default.
    /// A backend with tools reads and applies through them ([`Driver::read`] and the rest
    /// default to its [`Tools`]); one without overrides those four.
    fn tools(&self) -> Option<&'static Tools> {
        None
    }

    /// The tools the default reading and applying go through.
    fn tool_driven(&self) -> Result<&'static Tools, BackendError> {
        self.tools().ok_or_else(|| BackendError::NoTool {
            verb: "save or restore".to_string(),
        })
    }

    /// The current `table` (nat, filter) as natledger reads it: the built-in chains, its own
    /// chains and any rule naming one of them (or more); `None` when it does not exist.
    fn read(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &str,
    ) -> Result<Option<save::Table>, BackendError> {
        self.tool_driven()?.read(nf, family, table)
    }

    /// Every rule of `table` (for reading other owners' rules), or `None` when it does not
    /// exist.
    fn read_whole(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &str,
    ) -> Result<Option<save::Table>, BackendError> {
        self.tool_driven()?.read_whole(nf, family, table)
    }

    /// Every table of one family, creating none.
    fn read_all(&self, nf: &Netfilter, family: Family) -> Result<Vec<save::Table>, BackendError> {
        self.tool_driven()?.read_all(nf, family)
    }

    /// Apply batches of different tables, in order; what a failure leaves committed is the
    /// driver's (one transaction per table for the iptables tools, all or nothing for
    /// natledger's own tables).
    fn apply_all(
        &self,
        nf: &Netfilter,
        family: Family,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        self.tool_driven()?.apply_all(nf, family, batches)
    }

    /// Write one family's rules (`rules`, this backend's records) with the chains and shared
    /// rules they need; the tables that could not be written and were skipped (the filter
    /// accept, a warning). By default [`write::install`]: per table, in-process where
    /// [`Driver::insert_in_process`] can, else one restore, then read-and-diff.
    fn install(
        &self,
        nf: &Netfilter,
        family: Family,
        rules: &[&RuleRecord],
    ) -> Result<Vec<Table>, InstallError> {
        write::install(self, nf, family, rules)
    }

    /// Insert one table's rules without a process, assuming the shared chains and rules
    /// exist; whether that was done (nothing was written otherwise). None by default.
    fn insert_in_process(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _table: Table,
        _placed: &[Placement],
    ) -> bool {
        false
    }

    /// Delete a container's recorded rules of one family, every table at once, without a
    /// process: before the per-table removal. [`Native::Off`] by default.
    fn delete_recorded(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _id: &ContainerId,
        _recorded: &[&RuleRecord],
    ) -> Result<Native, NativeError> {
        Ok(Native::Off)
    }

    /// Delete the recorded rules of one table without a process, exactly those, when all are
    /// present. [`Native::Off`] by default.
    fn delete_recorded_in_table(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _recorded: &[&RuleRecord],
    ) -> Result<Native, NativeError> {
        Ok(Native::Off)
    }

    /// Whether natledger's chains of `table` hold a rule tagged `tag`, judged without a
    /// process: `Some(false)` lets a removal without records skip reading the table (a CNI
    /// DEL after natledger's state was lost pays it on every attachment's second DEL).
    /// `None` (by default, or when it cannot tell): read the table.
    fn holds_tagged(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _table: Table,
        _tag: &str,
    ) -> Option<bool> {
        None
    }

    /// Delete every rule tagged as `expected` says from its chain without a process, when
    /// each chain holds exactly that many; whether that was done (nothing changed otherwise:
    /// the caller uses the restore). None by default.
    fn delete_tagged(&self, _nf: &Netfilter, _family: Family, _expected: &[Tagged]) -> bool {
        false
    }

    /// A cheap summary of `table` that changes when natledger's chains or the jumps into
    /// them may have (watch compares it, for a backend that tells no one of its changes);
    /// `known`, when its size and entry count are still the table's, is returned unread.
    /// `None` (by default, or for an absent or unreadable table): changes are told, or
    /// nothing to compare.
    fn stamp(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _table: Table,
        _known: Option<Stamp>,
    ) -> Option<Stamp> {
        None
    }

    /// After `sweep --all` removed natledger's chains from `table`: drop the table when
    /// nothing but empty built-in chains is left of it. Nothing by default.
    fn drop_emptied_table(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _table: &str,
    ) -> Result<(), crate::kernel::nftables::NftError> {
        Ok(())
    }
}

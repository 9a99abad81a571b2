//! The interface every backend implements ([`Driver`]), netavark's shape: what it writes
//! beyond the mapping rules ([`Capabilities`], data), how it reads a table, and the three
//! changes the operations ask of it, each one call per family: [`Driver::install`] (a
//! container's new rules), [`Driver::remove`] (a container's rules), [`Driver::apply_plan`] (a
//! sweep's plan of one table). The operations hold drivers as values (`ops::Context`) and
//! never ask which backend one is. How a driver does each change is its own: the
//! process-less fast paths and its one transaction are its [`Primitives`], a supertrait
//! sealed inside `backend`; the three changes default to the shared strategies built from
//! them ([`super::write`] for install, [`super::remove`] for removal and plans), which a
//! driver overrides only where it does a change another way (natledger's own tables'
//! install: one read and one transaction).

use crate::kernel::iptc::Stamp;
use crate::kernel::nftables::NftError;
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::oci::ContainerId;
use crate::model::save::{self, Batch};
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::iptables::Tools;
use super::remove::{Deleted, Plan};
use super::write::{InstallError, Placement};
use super::{Backend, BackendError, Direct, DirectError, Netfilter, Tagged};

/// What of a table [`Driver::read`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// As natledger reads it: the built-in chains, its own chains and any rule naming one of
    /// them (or more).
    Ours,
    /// Every rule (for reading other owners' rules).
    Whole,
}

/// One backend. Its [`Primitives`] are a sealed supertrait: nameable only inside `backend`,
/// so only `backend` can add a driver, and the three changes default to the shared
/// strategies built from them.
pub trait Driver: Sync + Primitives {
    /// The backend it drives (its CLI word, its records' `backend`).
    fn backend(&self) -> Backend;

    /// What it writes beyond the mapping rules, and what it can forward.
    fn capabilities(&self) -> Capabilities;

    /// The current `table` (nat, filter), as much of it as `scope` says; `None` when it does
    /// not exist. By default with the driver's `*-save` ([`Primitives::tools`]).
    fn read(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &str,
        scope: Reading,
    ) -> Result<Option<save::Dump>, BackendError> {
        tool_driven(self.tools(), "save")?.read(nf, family, table, scope)
    }

    /// Every table of one family, creating none. By default with the driver's `*-save`.
    fn read_all(&self, nf: &Netfilter, family: Family) -> Result<Vec<save::Dump>, BackendError> {
        tool_driven(self.tools(), "save")?.read_all(nf, family)
    }

    /// Write one family's rules (`rules`, this backend's records) with the chains and shared
    /// rules they need; the tables that could not be written and were skipped (the filter
    /// accept, a warning).
    fn install(
        &self,
        nf: &Netfilter,
        family: Family,
        rules: &[&RuleRecord],
    ) -> Result<Vec<Table>, InstallError> {
        super::write::install(self, nf, family, rules)
    }

    /// Delete container `id`'s rules of one family from `tables` (nat first): exactly
    /// `recorded` (this backend's records of the family) where they all are, else what a read
    /// of each table shows recorded or tagged for `id`. A failing nat table keeps the
    /// family's filter rules (the accept of a DNAT that may still be in force).
    fn remove(
        &self,
        nf: &Netfilter,
        family: Family,
        id: &ContainerId,
        tables: &[Table],
        recorded: &[&RuleRecord],
    ) -> Deleted {
        super::remove::remove(self, nf, family, id, tables, recorded)
    }

    /// Apply a sweep's plan of one table (or drop a table `sweep --all` emptied).
    fn apply_plan(&self, nf: &Netfilter, family: Family, plan: &Plan) -> Result<(), BackendError> {
        super::remove::apply_plan(self, nf, family, plan)
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
}

/// What the shared strategies ([`super::write::install`], [`super::remove::remove`],
/// [`super::remove::apply_plan`]) are built from: one transaction through the driver's usual
/// way (`*-restore`, or a netlink batch), and the process-less fast paths a driver may have
/// (each declines by default). Sealed: `pub` in a module private to `backend`, so nothing
/// outside names it.
pub trait Primitives {
    /// The `*-save`/`*-restore` tools of a backend written by iptables-style tools, through
    /// which it reads and applies by default; none by default.
    fn tools(&self) -> Option<&'static Tools> {
        None
    }

    /// Apply batches of different tables, in order; what a failure leaves committed is the
    /// driver's (one transaction per table for the iptables tools, all or nothing for
    /// natledger's own tables). Forgets the kept legacy nat table of `family`. By default one
    /// `*-restore` of the driver's tools.
    fn apply_batches(
        &self,
        nf: &Netfilter,
        family: Family,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        tool_driven(self.tools(), "restore")?.apply_all(nf, family, batches)
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
    /// process: before the per-table removal. [`Direct::Off`] by default.
    fn delete_recorded(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _id: &ContainerId,
        _recorded: &[&RuleRecord],
    ) -> Result<Direct, DirectError> {
        Ok(Direct::Off)
    }

    /// Delete the recorded rules of one table without a process, exactly those, when all are
    /// present. [`Direct::Off`] by default.
    fn delete_recorded_in_table(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _recorded: &[&RuleRecord],
    ) -> Result<Direct, DirectError> {
        Ok(Direct::Off)
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

    /// After `sweep --all` removed natledger's chains from `table`: drop the table when
    /// nothing but empty built-in chains is left of it. Nothing by default.
    fn drop_emptied_table(
        &self,
        _nf: &Netfilter,
        _family: Family,
        _table: &str,
    ) -> Result<(), NftError> {
        Ok(())
    }
}

/// The tools the default reads and transaction go through, or why there are none.
fn tool_driven(tools: Option<&'static Tools>, verb: &str) -> Result<&'static Tools, BackendError> {
    tools.ok_or_else(|| BackendError::NoTool { verb: verb.into() })
}

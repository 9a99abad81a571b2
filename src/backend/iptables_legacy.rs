//! iptables-legacy (`ip_tables`): read with `*-legacy-save` (an absent table seen in procfs
//! without a process), written in-process through the table's socket options where the
//! shared chains exist ([`crate::kernel::iptc`]), else with `*-legacy-restore --wait`.

use crate::causes::Causes;
use crate::kernel::iptc::{self, IptcError, Place};
use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout::{comment_and_target, is_owned_chain, shared_rules};
use crate::model::rule::Rule;
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::driver::Primitives;
use super::iptables::Tools;
use super::write::Placement;
use super::{Backend, Direct, DirectError, Driver, Netfilter, legacy_table_exists};

/// How long iptables-legacy-restore waits for `/run/xtables.lock` held by another program;
/// well inside podman's 10 s hook timeout.
const XTABLES_WAIT_SECS: &str = "5";

/// `ip[6]tables-legacy-save` and `-restore`.
static TOOLS: Tools = Tools {
    word: "legacy",
    restore_args: &["--wait", XTABLES_WAIT_SECS],
    tables_in_procfs: true,
    nf_tables: false,
};

/// The iptables-legacy driver.
pub struct IptablesLegacy;

impl Driver for IptablesLegacy {
    fn backend(&self) -> Backend {
        Backend::IptablesLegacy
    }

    fn capabilities(&self) -> Capabilities {
        TOOLS.capabilities()
    }

    /// Its `IPT_SO_GET_INFO` size and entry count and a digest of natledger's chains and the
    /// jumps into them ([`iptc::stamp`]); an absent table (procfs) is not created by asking.
    fn stamp(
        &self,
        _nf: &Netfilter,
        family: Family,
        table: Table,
        known: Option<iptc::Stamp>,
    ) -> Option<iptc::Stamp> {
        match legacy_table_exists(family, table.as_str()) {
            Ok(true) => iptc::stamp(family, table.as_str(), known).ok(),
            _ => None,
        }
    }
}

impl Primitives for IptablesLegacy {
    fn tools(&self) -> Option<&'static Tools> {
        Some(&TOOLS)
    }

    fn insert_in_process(
        &self,
        nf: &Netfilter,
        family: Family,
        table: Table,
        placed: &[Placement],
    ) -> bool {
        insert(nf, family, table, placed)
    }

    /// Through the table's socket options ([`iptc::read`], no lock): every `NATLEDGER-`
    /// chain's rules; an absent table (procfs) holds none and is not created.
    fn holds_tagged(
        &self,
        nf: &Netfilter,
        family: Family,
        table: Table,
        tag: &str,
    ) -> Option<bool> {
        if !nf.direct() {
            return None;
        }
        if !legacy_table_exists(family, table.as_str()).ok()? {
            return Some(false);
        }
        let blob = iptc::read(family, table.as_str())
            .map_err(|e| log::debug!("{}; reading the table instead", Causes(&e)))
            .ok()?;
        let found = blob
            .user_chains()
            .filter(|c| is_owned_chain(c))
            .filter_map(|c| iptc::render::chain_rules(&blob, c))
            .flatten()
            .any(|args| comment_and_target(&args).0 == Some(tag));
        Some(found)
    }

    /// Exactly the recorded rules of one table, through its socket options
    /// ([`iptc::delete`]); declined unless every one is found.
    fn delete_recorded_in_table(
        &self,
        nf: &Netfilter,
        family: Family,
        recorded: &[&RuleRecord],
    ) -> Result<Direct, DirectError> {
        let Some(table) = recorded.first().and_then(|r| r.table()) else {
            return Ok(Direct::Declined);
        };
        let Some(rules) = recorded
            .iter()
            .map(|r| Some((r.chain.as_str(), r.rule()?)))
            .collect::<Option<Vec<(&str, &Rule)>>>()
        else {
            return Ok(Direct::Declined);
        };
        Ok(self.delete_in_process(nf, family, table.as_str(), &rules)?)
    }
}

impl IptablesLegacy {
    /// Delete exactly these rules from a table without a process ([`iptc::delete`]):
    /// declined unless every one is found; [`Direct::Off`] (nothing looked at, no table
    /// created) when the direct paths are off or the table does not exist.
    pub fn delete_in_process(
        &self,
        nf: &Netfilter,
        family: Family,
        table: &'static str,
        rules: &[(&str, &Rule)],
    ) -> Result<Direct, IptcError> {
        nf.forget_legacy_nat(family);
        in_process(nf, family, table, "deleted", || {
            iptc::delete(nf.xtables_lock(), family, table, rules)
        })
    }
}

/// Insert one table's rules in-process ([`iptc::insert`]), provided the table, the chains and
/// the shared rules exist; whether that was done (nothing was written otherwise).
fn insert(nf: &Netfilter, family: Family, table: Table, placed: &[Placement]) -> bool {
    let rules: Vec<(&str, Rule, Place)> = placed
        .iter()
        .map(|(chain, rule, place)| (*chain, (*rule).clone(), *place))
        .collect();
    let shared = shared_rules(IptablesLegacy.capabilities(), table.as_str(), family);
    nf.forget_legacy_nat(family);
    let mut written = None;
    let done = in_process(nf, family, table.as_str(), "inserted", || {
        let (outcome, blob) =
            iptc::insert_keeping(nf.xtables_lock(), family, table.as_str(), &rules, &shared)?;
        written = blob;
        Ok(outcome)
    });
    if let (Some(blob), Table::Nat) = (written, table) {
        nf.keep_legacy_nat(family, blob);
    }
    match done {
        Ok(Direct::Done(_)) => true,
        Ok(Direct::Declined | Direct::Off) => false,
        // Nothing was written; the restore reports what is really wrong.
        Err(e) => {
            log::info!(
                "{}; using {}-legacy-restore",
                Causes(&e),
                family.tool_stem()
            );
            false
        }
    }
}

/// Run `op` on the table's socket options when the direct paths are on and the table exists
/// (asking the kernel about an absent table would create it).
fn in_process(
    nf: &Netfilter,
    family: Family,
    table: &str,
    verb: &str,
    op: impl FnOnce() -> Result<iptc::Outcome, IptcError>,
) -> Result<Direct, IptcError> {
    if !nf.direct() || !legacy_table_exists(family, table).unwrap_or(false) {
        return Ok(Direct::Off);
    }
    let start = std::time::Instant::now();
    let outcome = op()?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    Ok(match outcome {
        iptc::Outcome::Done(n) => {
            log::debug!("iptc: {verb} {n} {family} {table} rule(s) in {ms:.1} ms");
            Direct::Done(n)
        }
        iptc::Outcome::Declined => {
            log::debug!(
                "iptc: {family} {table} table not as expected; using iptables-legacy-restore"
            );
            Direct::Declined
        }
    })
}
